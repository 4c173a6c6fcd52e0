#include "epo/kernels/activation.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "epo/kernels/cpu_features.h"
#include "epo/tensor/bf16_simd.h"

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 on its AVX-512 headers
#pragma GCC diagnostic ignored "-Wuninitialized"        // (_mm512_reduce_max_ps)
// GCC fuses a * b + c into one FMA where the target has it (the AVX-512 functions), which rounds
// once instead of twice; the scalar version cannot, so implicit fusing is off here to keep both
// versions bit-identical (exp() fuses explicitly, in both).
#pragma GCC optimize("fp-contract=off")

namespace epo::kernels {
namespace {

// exp(x) = 2^n * e^r, n = round(x / ln2), r = x - n ln2 (two-part ln2 so n * kLn2Hi is exact),
// e^r by its Taylor polynomial to degree 7 (|r| <= 0.347: truncation error < 6e-9) in Horner
// form with fused multiply-adds (std::fma in the scalar version: one rounding each, the same bits
// as the AVX-512 instruction).
constexpr float kExpLo = -87.3f, kExpHi = 88.3f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kC[8] = {1.0f,      1.0f,       0.5f,       1.0f / 6,
                         1.0f / 24, 1.0f / 120, 1.0f / 720, 1.0f / 5040};

float exp_scalar(float x) {
    x = std::fmin(std::fmax(x, kExpLo), kExpHi);
    const float n = std::nearbyint(x * kLog2e);
    const float r = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, x));
    float p = kC[7];
    for (int i = 6; i >= 0; --i) {
        p = std::fma(p, r, kC[i]);
    }
    const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<int>(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, 4);
    return p * scale;
}

EPO_AVX512 inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpLo)), _mm512_set1_ps(kExpHi));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r =
        _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x));
    __m512 p = _mm512_set1_ps(kC[7]);
#pragma GCC unroll 7
    for (int i = 6; i >= 0; --i) {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC[i]));
    }
    const __m512i bits =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

template <typename T>
float ld(const T* p, std::int64_t i) {
    if constexpr (std::is_same_v<T, BF16>) {
        return bf16_to_float(p[i]);
    } else {
        return p[i];
    }
}

template <typename T>
void st(T* p, std::int64_t i, float v) {
    if constexpr (std::is_same_v<T, BF16>) {
        p[i] = float_to_bf16(v);
    } else {
        p[i] = v;
    }
}

// The fixed reduction of 16 partial sums (the lanes of one AVX-512 register): halves, then
// quarters, ... lane i + 8 into lane i first.
float reduce16(const float* lane) {
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; ++i) {
        s8[i] = lane[i] + lane[i + 8];
    }
    for (int i = 0; i < 4; ++i) {
        s4[i] = s8[i] + s8[i + 4];
    }
    for (int i = 0; i < 2; ++i) {
        s2[i] = s4[i] + s4[i + 2];
    }
    return s2[0] + s2[1];
}

template <typename T>
void forward_scalar(const Matrix& h, const float* probs, const Matrix& a) {
    const std::int64_t f_size = a.cols;
    for (std::int64_t r = 0; r < a.rows; ++r) {
        const T* hr = static_cast<const T*>(h.data) + r * h.ld;
        T* ar = static_cast<T*>(a.data) + r * a.ld;
        const float p = probs ? probs[r] : 1.0f;
        for (std::int64_t f = 0; f < f_size; ++f) {
            const float g = ld(hr, f), u = ld(hr, f_size + f);
            const float s = 1.0f / (1.0f + exp_scalar(-g));
            st(ar, f, ((g * s) * u) * p);
        }
    }
}

template <typename T>
EPO_AVX512 void forward_avx512(const Matrix& h, const float* probs, const Matrix& a) {
    const std::int64_t f_size = a.cols;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (std::int64_t r = 0; r < a.rows; ++r) {
        const T* hr = static_cast<const T*>(h.data) + r * h.ld;
        T* ar = static_cast<T*>(a.data) + r * a.ld;
        const __m512 p = _mm512_set1_ps(probs ? probs[r] : 1.0f);
        for (std::int64_t f = 0; f < f_size; f += 16) {
            const __mmask16 m = simd::tail_mask(f_size - f);
            const __m512 g = simd::load16(hr + f, m);
            const __m512 u = simd::load16(hr + f_size + f, m);
            const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
            const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, e));
            simd::store16(ar + f, _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(g, s), u), p), m);
        }
    }
}

template <typename T>
void backward_scalar(const Matrix& h, const float* probs, const Matrix& da, const Matrix& dh,
                     float* dprobs) {
    const std::int64_t f_size = da.cols;
    for (std::int64_t r = 0; r < da.rows; ++r) {
        const T* hr = static_cast<const T*>(h.data) + r * h.ld;
        const T* dar = static_cast<const T*>(da.data) + r * da.ld;
        T* dhr = static_cast<T*>(dh.data) + r * dh.ld;
        const float p = probs ? probs[r] : 1.0f;
        float lane[16] = {};
        for (std::int64_t f = 0; f < f_size; ++f) {
            const float g = ld(hr, f), u = ld(hr, f_size + f), d = ld(dar, f);
            const float s = 1.0f / (1.0f + exp_scalar(-g));
            const float silu = g * s;
            lane[f % 16] = lane[f % 16] + d * (silu * u);
            const float dq = d * p;
            st(dhr, f_size + f, dq * silu);
            st(dhr, f, ((dq * u) * s) * (1.0f + g * (1.0f - s)));
        }
        if (dprobs) {
            dprobs[r] = reduce16(lane);
        }
    }
}

template <typename T>
EPO_AVX512 void backward_avx512(const Matrix& h, const float* probs, const Matrix& da,
                                const Matrix& dh, float* dprobs) {
    const std::int64_t f_size = da.cols;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (std::int64_t r = 0; r < da.rows; ++r) {
        const T* hr = static_cast<const T*>(h.data) + r * h.ld;
        const T* dar = static_cast<const T*>(da.data) + r * da.ld;
        T* dhr = static_cast<T*>(dh.data) + r * dh.ld;
        const __m512 p = _mm512_set1_ps(probs ? probs[r] : 1.0f);
        __m512 acc = _mm512_setzero_ps();
        for (std::int64_t f = 0; f < f_size; f += 16) {
            const __mmask16 m = simd::tail_mask(f_size - f);
            const __m512 g = simd::load16(hr + f, m);
            const __m512 u = simd::load16(hr + f_size + f, m);
            const __m512 d = simd::load16(dar + f, m);
            const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
            const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, e));
            const __m512 silu = _mm512_mul_ps(g, s);
            acc = _mm512_mask_add_ps(acc, m, acc, _mm512_mul_ps(d, _mm512_mul_ps(silu, u)));
            const __m512 dq = _mm512_mul_ps(d, p);
            simd::store16(dhr + f_size + f, _mm512_mul_ps(dq, silu), m);
            const __m512 dsig = _mm512_add_ps(one, _mm512_mul_ps(g, _mm512_sub_ps(one, s)));
            simd::store16(dhr + f, _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(dq, u), s), dsig), m);
        }
        if (dprobs) {
            alignas(64) float lane[16];
            _mm512_store_ps(lane, acc);
            dprobs[r] = reduce16(lane);
        }
    }
}

bool avx512(KernelImpl impl) {
    if (impl == KernelImpl::kScalar) {
        return false;
    }
    const bool have = cpu_features().avx512_core();
    EPO_CHECK(have || impl == KernelImpl::kAuto, "AVX-512 kernel requested on a CPU without it");
    return have;
}

void check_shapes(const Matrix& h, const Matrix& a, const char* what) {
    EPO_CHECK(h.rows == a.rows && h.cols == 2 * a.cols && h.dtype == a.dtype &&
                  (h.dtype == DType::kF32 || h.dtype == DType::kBF16),
              "{}: h is {}x{} {}, a is {}x{} {} (want [R, 2F] and [R, F] of one dtype)", what,
              h.rows, h.cols, dtype_name(h.dtype), a.rows, a.cols, dtype_name(a.dtype));
}

float row_max_scalar(const float* x, std::int64_t n) {
    float m = x[0];
    for (std::int64_t j = 1; j < n; ++j) {
        m = std::max(m, x[j]);
    }
    return m;
}

EPO_AVX512 float row_max_avx512(const float* x, std::int64_t n) {
    __m512 m = _mm512_set1_ps(x[0]);
    for (std::int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = simd::tail_mask(n - j);
        m = _mm512_mask_max_ps(m, k, m, simd::load16(x + j, k));
    }
    return _mm512_reduce_max_ps(m);
}

float exp_shifted_sum_scalar(const float* x, float scale, float shift, float* out, std::int64_t n) {
    float lane[16] = {};
    for (std::int64_t j = 0; j < n; ++j) {
        out[j] = exp_scalar(x[j] * scale - shift);
        lane[j % 16] = lane[j % 16] + out[j];
    }
    return reduce16(lane);
}

EPO_AVX512 float exp_shifted_sum_avx512(const float* x, float scale, float shift, float* out,
                                        std::int64_t n) {
    const __m512 sc = _mm512_set1_ps(scale), sh = _mm512_set1_ps(shift);
    __m512 acc = _mm512_setzero_ps();
    for (std::int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = simd::tail_mask(n - j);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_mul_ps(simd::load16(x + j, k), sc), sh));
        simd::store16(out + j, e, k);
        acc = _mm512_mask_add_ps(acc, k, acc, e);
    }
    alignas(64) float lane[16];
    _mm512_store_ps(lane, acc);
    return reduce16(lane);
}

float dot16_scalar(const float* a, const float* b, std::int64_t n) {
    float lane[16] = {};
    for (std::int64_t j = 0; j < n; ++j) {
        lane[j % 16] = lane[j % 16] + a[j] * b[j];
    }
    return reduce16(lane);
}

EPO_AVX512 float dot16_avx512(const float* a, const float* b, std::int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    for (std::int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = simd::tail_mask(n - j);
        acc = _mm512_mask_add_ps(acc, k, acc,
                                 _mm512_mul_ps(simd::load16(a + j, k), simd::load16(b + j, k)));
    }
    alignas(64) float lane[16];
    _mm512_store_ps(lane, acc);
    return reduce16(lane);
}

}  // namespace

float fast_exp(float x) {
    return exp_scalar(x);
}

float row_max(const float* x, std::int64_t n, KernelImpl impl) {
    EPO_CHECK(n >= 1, "row_max of an empty row");
    return avx512(impl) ? row_max_avx512(x, n) : row_max_scalar(x, n);
}

float exp_shifted_sum(const float* x, float scale, float shift, float* out, std::int64_t n,
                      KernelImpl impl) {
    return avx512(impl) ? exp_shifted_sum_avx512(x, scale, shift, out, n)
                        : exp_shifted_sum_scalar(x, scale, shift, out, n);
}

float dot16(const float* a, const float* b, std::int64_t n, KernelImpl impl) {
    return avx512(impl) ? dot16_avx512(a, b, n) : dot16_scalar(a, b, n);
}

void swiglu_forward(const Matrix& h, const float* probs, const Matrix& a, KernelImpl impl) {
    check_shapes(h, a, "swiglu_forward");
    const bool vec = avx512(impl);
    if (h.dtype == DType::kBF16) {
        return vec ? forward_avx512<BF16>(h, probs, a) : forward_scalar<BF16>(h, probs, a);
    }
    return vec ? forward_avx512<float>(h, probs, a) : forward_scalar<float>(h, probs, a);
}

void swiglu_backward(const Matrix& h, const float* probs, const Matrix& da, const Matrix& dh,
                     float* dprobs, KernelImpl impl) {
    check_shapes(h, da, "swiglu_backward");
    check_shapes(dh, da, "swiglu_backward");
    const bool vec = avx512(impl);
    if (h.dtype == DType::kBF16) {
        return vec ? backward_avx512<BF16>(h, probs, da, dh, dprobs)
                   : backward_scalar<BF16>(h, probs, da, dh, dprobs);
    }
    return vec ? backward_avx512<float>(h, probs, da, dh, dprobs)
               : backward_scalar<float>(h, probs, da, dh, dprobs);
}

}  // namespace epo::kernels
