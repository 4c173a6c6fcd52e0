#include "epo/model/embedding.h"

#include "epo/kernels/rows.h"

namespace epo::model {
namespace {

void check_token(int32_t token, int64_t vocab, size_t t) {
    if (token < 0 || token >= vocab) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("token {} at position {} is outside the vocabulary [0, {}); the "
                                "data needs model.vocab_size > {}",
                                token, t, vocab, token));
    }
}

}  // namespace

void embedding_forward(const Param& table, std::span<const int32_t> tokens, const Tensor& x) {
    const int64_t vocab = table.master.dim(0), hidden = table.master.dim(1);
    EPO_CHECK(x.numel() == static_cast<int64_t>(tokens.size()) * hidden, "embedding out {}",
              x.shape().str());
    const size_t es = dtype_size(table.compute.dtype());
    for (size_t t = 0; t < tokens.size(); ++t) {
        check_token(tokens[t], vocab, t);
        kernels::load_row(static_cast<const char*>(table.compute.raw()) + tokens[t] * hidden * es,
                          table.compute.dtype(), x.data<float>() + t * hidden, hidden);
    }
}

void embedding_backward(Param& table, std::span<const int32_t> tokens, const Tensor& dx) {
    const int64_t hidden = table.master.dim(1);
    float* grad = table.main_grad.data<float>();
    for (size_t t = 0; t < tokens.size(); ++t) {
        kernels::add_row(dx.data<float>() + t * hidden, DType::kF32, grad + tokens[t] * hidden,
                         hidden);
    }
}

}  // namespace epo::model
