#include "epo/kernels/rows.h"

#include <cmath>
#include <cstring>
#include <type_traits>

#include "epo/kernels/cpu_features.h"
#include "epo/tensor/bf16_simd.h"

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 on its AVX-512 headers
// No implicit a * b + c fusing: GCC would fuse in the AVX-512 code only, and the two versions
// must give the same bits (add_combination_row fuses explicitly, in both).
#pragma GCC optimize("fp-contract=off")

namespace epo::kernels {
namespace {

template <typename T>
EPO_AVX512 void add_row_avx512(const T* src, float* acc, std::int64_t n) {
    for (std::int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = simd::tail_mask(n - i);
        const __m512 v = _mm512_add_ps(simd::load16(acc + i, m), simd::load16(src + i, m));
        simd::store16(acc + i, v, m);
    }
}

template <typename T>
void add_row_scalar(const T* src, float* acc, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<T, BF16>) {
            acc[i] += bf16_to_float(src[i]);
        } else {
            acc[i] += src[i];
        }
    }
}

template <typename T>
float widen(T v) {
    if constexpr (std::is_same_v<T, BF16>) {
        return bf16_to_float(v);
    } else {
        return v;
    }
}

template <typename T>
EPO_AVX512 void add_combination_row_avx512(const float* coeff, std::int64_t count, const T* rows,
                                           std::int64_t ld, float* acc, std::int64_t n) {
    for (std::int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = simd::tail_mask(n - i);
        __m512 p = _mm512_mul_ps(_mm512_set1_ps(coeff[0]), simd::load16(rows + i, m));
        for (std::int64_t j = 1; j < count; ++j) {
            p = _mm512_fmadd_ps(_mm512_set1_ps(coeff[j]), simd::load16(rows + j * ld + i, m), p);
        }
        simd::store16(acc + i, _mm512_add_ps(simd::load16(acc + i, m), p), m);
    }
}

template <typename T>
void add_combination_row_scalar(const float* coeff, std::int64_t count, const T* rows,
                                std::int64_t ld, float* acc, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) {
        float p = coeff[0] * widen(rows[i]);
        for (std::int64_t j = 1; j < count; ++j) {
            p = std::fma(coeff[j], widen(rows[j * ld + i]), p);
        }
        acc[i] = acc[i] + p;
    }
}

bool use_avx512() {
    return cpu_features().avx512_core();
}

}  // namespace

void load_row(const void* src, DType src_type, float* acc, std::int64_t n) {
    if (src_type == DType::kF32) {
        std::memcpy(acc, src, static_cast<std::size_t>(n) * sizeof(float));
    } else {
        EPO_CHECK(src_type == DType::kBF16, "load_row of {}", dtype_name(src_type));
        convert_bf16_to_f32(static_cast<const BF16*>(src), acc, static_cast<std::size_t>(n));
    }
}

void add_row(const void* src, DType src_type, float* acc, std::int64_t n) {
    if (src_type == DType::kF32) {
        const float* s = static_cast<const float*>(src);
        return use_avx512() ? add_row_avx512(s, acc, n) : add_row_scalar(s, acc, n);
    }
    EPO_CHECK(src_type == DType::kBF16, "add_row of {}", dtype_name(src_type));
    const BF16* s = static_cast<const BF16*>(src);
    return use_avx512() ? add_row_avx512(s, acc, n) : add_row_scalar(s, acc, n);
}

void add_combination_row(const float* coeff, std::int64_t count, const void* rows, DType rows_type,
                         std::int64_t ld, float* acc, std::int64_t n, KernelImpl impl) {
    EPO_CHECK(count >= 1 && ld >= n, "add_combination_row of {} rows of {} (ld {})", count, n, ld);
    EPO_CHECK(impl != KernelImpl::kAvx512 || use_avx512(),
              "AVX-512 kernel requested on a CPU without it");
    const bool vec = impl != KernelImpl::kScalar && use_avx512();
    if (rows_type == DType::kF32) {
        const float* r = static_cast<const float*>(rows);
        return vec ? add_combination_row_avx512(coeff, count, r, ld, acc, n)
                   : add_combination_row_scalar(coeff, count, r, ld, acc, n);
    }
    EPO_CHECK(rows_type == DType::kBF16, "add_combination_row of {}", dtype_name(rows_type));
    const BF16* r = static_cast<const BF16*>(rows);
    return vec ? add_combination_row_avx512(coeff, count, r, ld, acc, n)
               : add_combination_row_scalar(coeff, count, r, ld, acc, n);
}

void store_row(const float* acc, void* dst, DType dst_type, std::int64_t n) {
    if (dst_type == DType::kF32) {
        std::memcpy(dst, acc, static_cast<std::size_t>(n) * sizeof(float));
    } else {
        EPO_CHECK(dst_type == DType::kBF16, "store_row to {}", dtype_name(dst_type));
        convert_f32_to_bf16(acc, static_cast<BF16*>(dst), static_cast<std::size_t>(n));
    }
}

}  // namespace epo::kernels
