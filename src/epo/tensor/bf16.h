// bfloat16: the top 16 bits of an IEEE fp32 number (sign, 8 exponent bits, 7 mantissa bits).
//
// Rounding from fp32 is round-to-nearest-even on the dropped 16 bits, with IEEE semantics for
// every input: subnormals round like any other value (they are not flushed to zero, unlike the
// AVX512-BF16 instruction on its own), overflow rounds to infinity, and a NaN stays a NaN of the
// same sign (quiet bit set, top payload bits kept) instead of rounding into infinity. Widening
// to fp32 is exact.
//
// The array conversions pick an implementation at run time from the CPU's features (AVX512-BF16,
// AVX-512F/BW, or portable scalar code); every implementation gives the same bits, which the
// tests check on special values and random bit patterns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace epo {

struct BF16 {
    std::uint16_t bits = 0;
};

inline BF16 float_to_bf16(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return BF16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};  // quiet NaN, sign kept
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    return BF16{static_cast<std::uint16_t>(u >> 16)};
}

inline float bf16_to_float(BF16 h) {
    const std::uint32_t u = static_cast<std::uint32_t>(h.bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// Which array-conversion implementation runs. kAuto chooses the fastest the CPU supports.
enum class Bf16Impl { kAuto, kScalar, kAvx512, kAvx512Bf16 };

// The implementation kAuto resolves to on this CPU, and whether `impl` can run here.
Bf16Impl bf16_best_impl();
bool bf16_impl_supported(Bf16Impl impl);
const char* bf16_impl_name(Bf16Impl impl);

// dst[i] = round(src[i]) for i < n.
void convert_f32_to_bf16(const float* src, BF16* dst, std::size_t n,
                         Bf16Impl impl = Bf16Impl::kAuto);
// dst[i] = widen(src[i]) for i < n.
void convert_bf16_to_f32(const BF16* src, float* dst, std::size_t n,
                         Bf16Impl impl = Bf16Impl::kAuto);

}  // namespace epo
