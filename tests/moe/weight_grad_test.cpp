#include "epo/moe/weight_grad.h"

#include <gtest/gtest.h>

#include <cmath>

#include "epo/kernels/gemm_reference.h"
#include "epo/tensor/random.h"

namespace epo::moe {
namespace {

using kernels::as_matrix;

// main_grad += op(A) op(B) for gradient row counts below, at and across the row block (the
// remainder block included), with A stored transposed (the layer's dy^T / dh^T) or not, fused
// and through the workspace: the result is the reference product added to the old gradient.
TEST(WeightGrad, AccumulatesEveryRowBlockIntoMainGrad) {
    constexpr std::int64_t k = 96, n = 40;
    for (const std::int64_t m :
         {std::int64_t{7}, kWeightGradRowBlock, 2 * kWeightGradRowBlock + 37}) {
        for (const bool trans_a : {true, false}) {
            for (const bool fusion : {true, false}) {
                SCOPED_TRACE(::testing::Message()
                             << "m=" << m << " trans_a=" << trans_a << " fusion=" << fusion);
                Tensor a = trans_a ? Tensor::empty({k, m}, DType::kBF16)
                                   : Tensor::empty({m, k}, DType::kBF16);
                Tensor b = Tensor::empty({k, n}, DType::kBF16);
                Tensor grad = Tensor::empty({m, n}, DType::kF32);
                fill_normal(a, 1, 0.0f, 1.0f);
                fill_normal(b, 2, 0.0f, 1.0f);
                fill_normal(grad, 3, 0.0f, 1.0f);
                Tensor want = grad.clone();
                kernels::gemm_reference(as_matrix(a), as_matrix(b), as_matrix(want),
                                        {trans_a, false, true});
                Tensor workspace = fusion ? Tensor() : Tensor::empty({m * n}, DType::kF32);
                accumulate_weight_grad(as_matrix(a), as_matrix(b), as_matrix(grad), trans_a, false,
                                       fusion, workspace);
                const float* got = grad.data<float>();
                const float* ref = want.data<float>();
                for (std::int64_t i = 0; i < m * n; ++i) {
                    // bf16 operands are exact in f32 products; only the f32 sum order differs.
                    ASSERT_NEAR(got[i], ref[i], 1e-4f * (1.0f + std::fabs(ref[i]))) << "at " << i;
                }
            }
        }
    }
}

}  // namespace
}  // namespace epo::moe
