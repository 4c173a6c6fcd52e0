#include "epo/moe/weight_grad.h"

#include "epo/kernels/rows.h"

namespace epo::moe {

void accumulate_weight_grad(const kernels::Matrix& a, const kernels::Matrix& b,
                            const kernels::Matrix& grad, bool trans_a, bool trans_b, bool fusion,
                            const Tensor& workspace) {
    EPO_CHECK(grad.dtype == DType::kF32, "main_grad must be f32, is {}", dtype_name(grad.dtype));
    if (fusion) {
        kernels::gemm(a, b, grad, {trans_a, trans_b, /*accumulate=*/true, false});
        return;
    }
    EPO_CHECK(workspace.dtype() == DType::kF32 && workspace.numel() >= grad.rows * grad.cols,
              "weight-gradient workspace {} {} for a {}x{} gradient", dtype_name(workspace.dtype()),
              workspace.shape().str(), grad.rows, grad.cols);
    const kernels::Matrix tmp{workspace.raw(), DType::kF32, grad.rows, grad.cols, grad.cols};
    kernels::gemm(a, b, tmp, {trans_a, trans_b, false, false});
    const float* t = workspace.data<float>();
    for (std::int64_t i = 0; i < grad.rows; ++i) {
        kernels::add_row(t + i * grad.cols, DType::kF32,
                         static_cast<float*>(grad.data) + i * grad.ld, grad.cols);
    }
}

}  // namespace epo::moe
