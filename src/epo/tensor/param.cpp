#include "epo/tensor/param.h"

#include <utility>

namespace epo {

Param make_param(std::string name, const Shape& shape, DType compute_dtype) {
    if (compute_dtype != DType::kF32 && compute_dtype != DType::kBF16) {
        throw Error(ErrorKind::kInternal,
                    fmt::format("parameter '{}': compute dtype {} is not f32 or bf16", name,
                                dtype_name(compute_dtype)));
    }
    Param p;
    p.name = std::move(name);
    p.master = Tensor::zeros(shape, DType::kF32);
    p.main_grad = Tensor::zeros(shape, DType::kF32);
    p.compute = compute_dtype == DType::kF32 ? p.master : Tensor::zeros(shape, DType::kBF16);
    return p;
}

void refresh_compute(Param& p) {
    if (p.compute.dtype() == DType::kBF16) {
        convert_f32_to_bf16(p.master.data<float>(), p.compute.data<BF16>(),
                            static_cast<std::size_t>(p.master.numel()));
    }
    ++p.version;
}

void refresh_compute_range(Param& p, int64_t begin, int64_t end) {
    if (p.compute.dtype() == DType::kBF16) {
        convert_f32_to_bf16(p.master.data<float>() + begin, p.compute.data<BF16>() + begin,
                            static_cast<std::size_t>(end - begin));
    }
}

void zero_grad(Param& p) {
    p.main_grad.fill_zero();
}

}  // namespace epo
