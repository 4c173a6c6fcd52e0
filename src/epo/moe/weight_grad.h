// Weight-gradient products and how they reach the fp32 main_grad:
//   gradient_accumulation_fusion = true:  main_grad += op(A) op(B), one accumulating GEMM per
//                                         block of gradient rows (oneDNN adds each product to
//                                         main_grad after the full reduction)
//   gradient_accumulation_fusion = false: tmp = op(A) op(B); main_grad += tmp (f32 adds)
// Both are deterministic; they round differently from each other (one vs two roundings per
// element), so a run uses one mode throughout.
#pragma once

#include <cstdint>

#include "epo/kernels/gemm.h"
#include "epo/tensor/tensor.h"

namespace epo::moe {

// With fusion the product is issued in blocks of this many gradient rows (the last block
// shorter): oneDNN's accumulating products on the expert weight-gradient shapes (M = 1536 or
// 2048 gradient rows, K = 512-1024 routed rows, f32 main_grad) run 10-25% faster per block of 512
// rows than as one whole-M call (bench/gemm_bench BM_WgradGemm, docs/numerics.md).
inline constexpr std::int64_t kWeightGradRowBlock = 512;

// grad ([M, N] f32 view into a main_grad) += op(a) op(b). Without fusion the product goes
// through `workspace` (f32, at least M * N elements; unused with fusion), so one workspace
// serves a whole sequence of weight gradients.
void accumulate_weight_grad(const kernels::Matrix& a, const kernels::Matrix& b,
                            const kernels::Matrix& grad, bool trans_a, bool trans_b, bool fusion,
                            const Tensor& workspace);

}  // namespace epo::moe
