// Row kernels on activations of either compute dtype (f32 or bf16), with f32 accumulation:
// the building blocks of the combine (sum of a token's k expert rows), gradient sums and the
// non-fused weight-gradient add. Additions are plain IEEE f32 in a fixed order, so the AVX-512
// and scalar versions give the same bits.
#pragma once

#include <cstdint>

#include "epo/kernels/activation.h"
#include "epo/tensor/tensor.h"

namespace epo::kernels {

// acc[i] = widen(src[i])
void load_row(const void* src, DType src_type, float* acc, std::int64_t n);
// acc[i] += widen(src[i])
void add_row(const void* src, DType src_type, float* acc, std::int64_t n);
// dst[i] = round_to(dst_type, acc[i])
void store_row(const float* acc, void* dst, DType dst_type, std::int64_t n);

// acc[i] += sum_j coeff[j] * widen(rows[j * ld + i]) over j < count (count >= 1): a row of a
// product with a short inner dimension (the router's dlogits [T, E] times its weight [E, H]).
// The sum is p = coeff[0] * r_0; then p = fma(coeff[j], r_j, p) in order; then acc + p: the same
// bits in the AVX-512 and the scalar version.
void add_combination_row(const float* coeff, std::int64_t count, const void* rows, DType rows_type,
                         std::int64_t ld, float* acc, std::int64_t n,
                         KernelImpl impl = KernelImpl::kAuto);

}  // namespace epo::kernels
