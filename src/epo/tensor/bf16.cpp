// Array conversions fp32 <-> bf16 with run-time dispatch. The AVX-512 versions are compiled with
// __attribute__((target)) so the library itself runs on any x86-64; they are only called after
// the CPU reported the features.
#include "epo/tensor/bf16.h"

#include <immintrin.h>

#include "epo/core/error.h"
#include "epo/kernels/cpu_features.h"
#include "epo/tensor/bf16_simd.h"

// GCC 12 reports its own AVX-512 intrinsics' deliberately undefined temporaries as possibly
// uninitialized; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace epo {
namespace {

void f32_to_bf16_scalar(const float* src, BF16* dst, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
        dst[i] = float_to_bf16(src[i]);
    }
}

void bf16_to_f32_scalar(const BF16* src, float* dst, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
        dst[i] = bf16_to_float(src[i]);
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) void f32_to_bf16_avx512(
    const float* src, BF16* dst, std::size_t n) {
    std::size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                            simd::round_to_bf16(_mm512_loadu_ps(src + i)));
    }
    if (i < n) {
        const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
        _mm256_mask_storeu_epi16(dst + i, m,
                                 simd::round_to_bf16(_mm512_maskz_loadu_ps(m, src + i)));
    }
}

// vcvtneps2bf16 rounds to nearest even and quiets NaNs exactly like float_to_bf16, but treats
// subnormal inputs as zero; those lanes (rare) are redone with the integer rounding.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))) inline __m256i
round16_bf16(__m512 v) {
    const __m256i hw = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
    const __m512i abs_bits =
        _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff));
    const __mmask16 subnormal = _mm512_cmplt_epu32_mask(
        _mm512_sub_epi32(abs_bits, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x007fffff));
    if (subnormal == 0) {
        return hw;
    }
    return _mm256_mask_mov_epi16(hw, subnormal, simd::round_to_bf16(v));
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))) void
f32_to_bf16_avx512bf16(const float* src, BF16* dst, std::size_t n) {
    std::size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                            round16_bf16(_mm512_loadu_ps(src + i)));
    }
    if (i < n) {
        const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
        _mm256_mask_storeu_epi16(dst + i, m, round16_bf16(_mm512_maskz_loadu_ps(m, src + i)));
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) void bf16_to_f32_avx512(
    const BF16* src, float* dst, std::size_t n) {
    std::size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
        _mm512_storeu_si512(dst + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    if (i < n) {
        const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
        const __m256i h = _mm256_maskz_loadu_epi16(m, src + i);
        _mm512_mask_storeu_epi32(dst + i, m, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
}

Bf16Impl resolve(Bf16Impl impl) {
    if (impl == Bf16Impl::kAuto) {
        return bf16_best_impl();
    }
    EPO_CHECK(bf16_impl_supported(impl), "bf16 conversion '{}' is not supported by this CPU",
              bf16_impl_name(impl));
    return impl;
}

}  // namespace

bool bf16_impl_supported(Bf16Impl impl) {
    const kernels::CpuFeatures& cpu = kernels::cpu_features();
    switch (impl) {
        case Bf16Impl::kAuto:
        case Bf16Impl::kScalar:
            return true;
        case Bf16Impl::kAvx512:
            return cpu.avx512_core();
        case Bf16Impl::kAvx512Bf16:
            return cpu.avx512_core() && cpu.avx512_bf16;
    }
    return false;
}

Bf16Impl bf16_best_impl() {
    // Both AVX-512 versions run at memory speed (bench/bf16_bench.cpp); the BF16-instruction one
    // is preferred where present because it needs fewer instructions per vector.
    if (bf16_impl_supported(Bf16Impl::kAvx512Bf16)) {
        return Bf16Impl::kAvx512Bf16;
    }
    if (bf16_impl_supported(Bf16Impl::kAvx512)) {
        return Bf16Impl::kAvx512;
    }
    return Bf16Impl::kScalar;
}

const char* bf16_impl_name(Bf16Impl impl) {
    switch (impl) {
        case Bf16Impl::kAuto:
            return "auto";
        case Bf16Impl::kScalar:
            return "scalar";
        case Bf16Impl::kAvx512:
            return "avx512";
        case Bf16Impl::kAvx512Bf16:
            return "avx512_bf16";
    }
    return "?";
}

void convert_f32_to_bf16(const float* src, BF16* dst, std::size_t n, Bf16Impl impl) {
    switch (resolve(impl)) {
        case Bf16Impl::kAvx512Bf16:
            return f32_to_bf16_avx512bf16(src, dst, n);
        case Bf16Impl::kAvx512:
            return f32_to_bf16_avx512(src, dst, n);
        default:
            return f32_to_bf16_scalar(src, dst, n);
    }
}

void convert_bf16_to_f32(const BF16* src, float* dst, std::size_t n, Bf16Impl impl) {
    switch (resolve(impl)) {
        case Bf16Impl::kAvx512Bf16:
        case Bf16Impl::kAvx512:
            return bf16_to_f32_avx512(src, dst, n);
        default:
            return bf16_to_f32_scalar(src, dst, n);
    }
}

}  // namespace epo
