// Row kernels on activations of either compute dtype (f32 or bf16), with f32 accumulation:
// the building blocks of the combine (sum of a token's k expert rows), gradient sums and the
// non-fused weight-gradient add. Additions are plain IEEE f32 in a fixed order, so the AVX-512
// and scalar versions give the same bits.
#pragma once

#include <cstdint>

#include "epo/tensor/tensor.h"

namespace epo::kernels {

// acc[i] = widen(src[i])
void load_row(const void* src, DType src_type, float* acc, std::int64_t n);
// acc[i] += widen(src[i])
void add_row(const void* src, DType src_type, float* acc, std::int64_t n);
// dst[i] = round_to(dst_type, acc[i])
void store_row(const float* acc, void* dst, DType dst_type, std::int64_t n);

}  // namespace epo::kernels
