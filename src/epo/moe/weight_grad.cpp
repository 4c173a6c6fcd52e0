#include "epo/moe/weight_grad.h"

#include <algorithm>

#include "epo/kernels/rows.h"

namespace epo::moe {

void accumulate_weight_grad(const kernels::Matrix& a, const kernels::Matrix& b,
                            const kernels::Matrix& grad, bool trans_a, bool trans_b, bool fusion,
                            const Tensor& workspace) {
    EPO_CHECK(grad.dtype == DType::kF32, "main_grad must be f32, is {}", dtype_name(grad.dtype));
    if (fusion) {
        // Gradient rows in blocks: each block's products reduce over the same K as a whole-M
        // call, so the split only changes which rows one oneDNN call covers.
        for (std::int64_t r0 = 0; r0 < grad.rows; r0 += kWeightGradRowBlock) {
            const std::int64_t n = std::min(kWeightGradRowBlock, grad.rows - r0);
            kernels::gemm(trans_a ? kernels::sub_cols(a, r0, n) : kernels::sub_rows(a, r0, n), b,
                          kernels::sub_rows(grad, r0, n),
                          {trans_a, trans_b, /*accumulate=*/true, false});
        }
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
