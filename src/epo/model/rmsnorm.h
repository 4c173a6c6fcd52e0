// RMSNorm over the last dimension, with a learned scale:
//
//   forward   rstd[t] = 1 / sqrt(mean_j x[t,j]^2 + eps),   y[t,j] = x[t,j] * rstd[t] * w[j]
//   recompute y[t,j] = x[t,j] * rstd[t] * w[j] from the saved rstd (selective recompute)
//   backward  xhat = x * rstd,  g = dy * w
//             dx[t,j] += rstd[t] * (g[t,j] - xhat[t,j] * mean_j(g[t,j] * xhat[t,j]))
//             dw[j]   += sum_t dy[t,j] * xhat[t,j]         (t ascending, then one add into
//                                                          main_grad per call)
// All arithmetic in f32; x, y and dy may be f32 or bf16 (loaded/stored through kernels/rows.h).
// Used for the layer norms (rows = tokens) and for qk-layernorm (rows = tokens x heads, width =
// head dim).
//
// Letters: N rows, D normalized width.
#pragma once

#include "epo/tensor/param.h"
#include "epo/tensor/tensor.h"

namespace epo::model {

// x (N, D) any float dtype -> y (N, D) any float dtype; rstd (N) f32 saved for backward.
void rmsnorm_forward(const Tensor& x, const Param& weight, float eps, const Tensor& y,
                     const Tensor& rstd);

// y (N, D) = x * rstd * w from the rstd the forward saved: the forward's y bit for bit (the same
// products in the same order). Selective recompute of the norms uses it in the backward.
void rmsnorm_recompute(const Tensor& x, const Param& weight, const Tensor& rstd, const Tensor& y);

// dx_acc (N, D) f32 += input gradient; weight.main_grad += weight gradient.
// `dw_workspace` is (D) f32 scratch.
void rmsnorm_backward(const Tensor& x, Param& weight, const Tensor& rstd, const Tensor& dy,
                      const Tensor& dx_acc, const Tensor& dw_workspace);

}  // namespace epo::model
