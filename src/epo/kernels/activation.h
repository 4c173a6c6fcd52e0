// The experts' activation: SwiGLU weighted by the routing probability, applied before the second
// projection as in Megatron-Core (Expert(x, p) = W2 (p * silu(W1_gate x) * W1_up x)).
//
//   forward   a[r, f] = ((silu(g) * u) * p[r]),   g = h[r, f], u = h[r, F + f],
//             silu(g) = g * sigmoid(g), sigmoid(g) = 1 / (1 + exp(-g))
//   backward  q = silu(g) * u
//             dprobs[r] = sum_f da[r, f] * q            (16 interleaved partial sums, then a
//                                                        fixed pairwise reduction)
//             du = (da * p) * silu(g)
//             dg = (da * p) * u * sigmoid(g) * (1 + g * (1 - sigmoid(g)))
// probs == nullptr means p = 1 (the shared expert) and no dprobs.
//
// h and dh are [rows, 2F] (gate columns first), a and da are [rows, F]; all of one dtype, f32 or
// bf16 (computed in f32, stored rounded to nearest even). exp() is our own polynomial (relative
// error < 2e-7 after range reduction), evaluated with the same operation sequence in the AVX-512
// and the scalar version (fused multiply-adds exactly where the polynomial has them, std::fma in
// the scalar one; no other fusing), so both give identical bits.
#pragma once

#include "epo/kernels/gemm.h"

namespace epo::kernels {

enum class KernelImpl { kAuto, kScalar, kAvx512 };

void swiglu_forward(const Matrix& h, const float* probs, const Matrix& a,
                    KernelImpl impl = KernelImpl::kAuto);
void swiglu_backward(const Matrix& h, const float* probs, const Matrix& da, const Matrix& dh,
                     float* dprobs, KernelImpl impl = KernelImpl::kAuto);

// The exp() above, exposed for tests (x is clamped to [-87.3, 88.3]).
float fast_exp(float x);

// Softmax building blocks of attention and the LM head, on f32 rows. Sums are kept in 16
// interleaved partial sums (element j in lane j % 16) and then reduced in a fixed pairwise order,
// so the scalar and the AVX-512 versions give the same bits and the result does not depend on
// where a row starts.
//   row_max          max_j x[j], n >= 1 (which value wins over a NaN is unspecified)
//   exp_shifted_sum  out[j] = exp(x[j] * scale - shift) (the exp() above); returns sum_j out[j]
//   dot16            sum_j a[j] * b[j]
float row_max(const float* x, std::int64_t n, KernelImpl impl = KernelImpl::kAuto);
float exp_shifted_sum(const float* x, float scale, float shift, float* out, std::int64_t n,
                      KernelImpl impl = KernelImpl::kAuto);
float dot16(const float* a, const float* b, std::int64_t n, KernelImpl impl = KernelImpl::kAuto);

}  // namespace epo::kernels
