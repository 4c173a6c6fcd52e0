// RMSNorm over the last dimension, with a learned scale:
//
//   forward   rstd[t] = 1 / sqrt(mean_j x[t,j]^2 + eps),   y[t,j] = x[t,j] * rstd[t] * w[j]
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

// dx_acc (N, D) f32 += input gradient; weight.main_grad += weight gradient.
// `dw_workspace` is (D) f32 scratch.
void rmsnorm_backward(const Tensor& x, Param& weight, const Tensor& rstd, const Tensor& dy,
                      const Tensor& dx_acc, const Tensor& dw_workspace);

}  // namespace epo::model
