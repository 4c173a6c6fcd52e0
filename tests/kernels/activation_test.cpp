#include "epo/kernels/activation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "epo/kernels/cpu_features.h"
#include "epo/kernels/rows.h"
#include "epo/tensor/random.h"

namespace epo::kernels {
namespace {

double load(const Tensor& t, std::int64_t i) {
    return t.dtype() == DType::kBF16 ? bf16_to_float(t.data<BF16>()[i]) : t.data<float>()[i];
}

TEST(Activation, FastExpIsAccurate) {
    double worst = 0;
    for (float x = -87.0f; x < 88.0f; x += 0.0137f) {
        const double want = std::exp(static_cast<double>(x));
        worst = std::max(worst, std::fabs(fast_exp(x) - want) / want);
    }
    EXPECT_LT(worst, 2e-7);
    EXPECT_GT(fast_exp(1000.0f), 1e38f);  // clamped, finite
    EXPECT_GE(fast_exp(-1000.0f), 0.0f);
}

struct Data {
    Tensor h, da, probs;
};

Data make_data(std::int64_t rows, std::int64_t f, DType dt) {
    Data d{Tensor::empty({rows, 2 * f}, dt), Tensor::empty({rows, f}, dt),
           Tensor::empty({rows}, DType::kF32)};
    fill_normal(d.h, 1, 0.0f, 3.0f);
    fill_normal(d.da, 2, 0.0f, 1.0f);
    fill_uniform(d.probs, 3, 0.0f, 1.0f);
    return d;
}

// Against a double-precision evaluation of the formulas.
TEST(Activation, SwigluMatchesTheFormulas) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
        const std::int64_t rows = 5, f = 37;
        Data d = make_data(rows, f, dt);
        Tensor a = Tensor::empty({rows, f}, dt);
        Tensor dh = Tensor::empty({rows, 2 * f}, dt);
        std::vector<float> dp(rows);
        swiglu_forward(as_matrix(d.h), d.probs.data<float>(), as_matrix(a));
        swiglu_backward(as_matrix(d.h), d.probs.data<float>(), as_matrix(d.da), as_matrix(dh),
                        dp.data());
        const double tol = dt == DType::kF32 ? 1e-5 : 1e-2;  // bf16 stores: 2^-8 relative
        for (std::int64_t r = 0; r < rows; ++r) {
            const double p = d.probs.data<float>()[r];
            double dps = 0;
            for (std::int64_t j = 0; j < f; ++j) {
                const double g = load(d.h, r * 2 * f + j), u = load(d.h, r * 2 * f + f + j);
                const double s = 1 / (1 + std::exp(-g)), da = load(d.da, r * f + j);
                const double want_a = p * g * s * u;
                EXPECT_NEAR(load(a, r * f + j), want_a, tol * (std::fabs(want_a) + 1e-3));
                const double want_du = da * p * g * s;
                const double want_dg = da * p * u * s * (1 + g * (1 - s));
                EXPECT_NEAR(load(dh, r * 2 * f + f + j), want_du,
                            tol * (std::fabs(want_du) + 1e-3));
                EXPECT_NEAR(load(dh, r * 2 * f + j), want_dg, tol * (std::fabs(want_dg) + 1e-3));
                dps += da * g * s * u;
            }
            EXPECT_NEAR(dp[r], dps, 1e-4 * (std::fabs(dps) + 1));
        }
    }
}

TEST(Activation, ScalarAndAvx512GiveTheSameBits) {
    if (!cpu_features().avx512_core()) {
        GTEST_SKIP() << "no AVX-512";
    }
    for (DType dt : {DType::kF32, DType::kBF16}) {
        for (std::int64_t f : {1, 16, 37, 768}) {
            const std::int64_t rows = 7;
            Data d = make_data(rows, f, dt);
            Tensor a1 = Tensor::empty({rows, f}, dt), a2 = Tensor::empty({rows, f}, dt);
            Tensor h1 = Tensor::empty({rows, 2 * f}, dt), h2 = Tensor::empty({rows, 2 * f}, dt);
            std::vector<float> p1(rows), p2(rows);
            swiglu_forward(as_matrix(d.h), d.probs.data<float>(), as_matrix(a1),
                           KernelImpl::kScalar);
            swiglu_forward(as_matrix(d.h), d.probs.data<float>(), as_matrix(a2),
                           KernelImpl::kAvx512);
            swiglu_backward(as_matrix(d.h), d.probs.data<float>(), as_matrix(d.da), as_matrix(h1),
                            p1.data(), KernelImpl::kScalar);
            swiglu_backward(as_matrix(d.h), d.probs.data<float>(), as_matrix(d.da), as_matrix(h2),
                            p2.data(), KernelImpl::kAvx512);
            EXPECT_EQ(std::memcmp(a1.raw(), a2.raw(), a1.nbytes()), 0) << dtype_name(dt) << f;
            EXPECT_EQ(std::memcmp(h1.raw(), h2.raw(), h1.nbytes()), 0) << dtype_name(dt) << f;
            EXPECT_EQ(std::memcmp(p1.data(), p2.data(), p1.size() * 4), 0) << dtype_name(dt) << f;
        }
    }
}

TEST(Activation, NullProbsMeansWeightOne) {
    Data d = make_data(3, 8, DType::kF32);
    Tensor a1 = Tensor::empty({3, 8}, DType::kF32), a2 = Tensor::empty({3, 8}, DType::kF32);
    Tensor ones = Tensor::empty({3}, DType::kF32);
    for (int i = 0; i < 3; ++i) {
        ones.data<float>()[i] = 1.0f;
    }
    swiglu_forward(as_matrix(d.h), nullptr, as_matrix(a1));
    swiglu_forward(as_matrix(d.h), ones.data<float>(), as_matrix(a2));
    EXPECT_EQ(std::memcmp(a1.raw(), a2.raw(), a1.nbytes()), 0);
}

TEST(Rows, AddLoadStore) {
    Tensor src = Tensor::empty({37}, DType::kBF16);
    fill_normal(src, 4, 0.0f, 1.0f);
    std::vector<float> acc(37), want(37);
    load_row(src.raw(), DType::kBF16, acc.data(), 37);
    add_row(src.raw(), DType::kBF16, acc.data(), 37);
    for (int i = 0; i < 37; ++i) {
        EXPECT_EQ(acc[i], 2 * bf16_to_float(src.data<BF16>()[i]));
    }
    Tensor out = Tensor::empty({37}, DType::kBF16);
    store_row(acc.data(), out.raw(), DType::kBF16, 37);
    for (int i = 0; i < 37; ++i) {
        EXPECT_EQ(out.data<BF16>()[i].bits, float_to_bf16(acc[i]).bits);
    }
}

// The softmax helpers: scalar and AVX-512 give the same bits at every length (tails included),
// and the values agree with a double-precision reference.
// acc += sum_j c[j] * rows[j]: the router's dx term. Exact for values that need no rounding; the
// documented order otherwise; the same bits in both versions, for f32 and bf16 rows, full and
// partial vectors, one or several rows.
TEST(Rows, AddCombinationRow) {
    const std::int64_t n = 37, ld = 40;
    Tensor w = Tensor::empty({8, ld}, DType::kF32);
    for (std::int64_t i = 0; i < 8 * ld; ++i) {
        w.data<float>()[i] = static_cast<float>(i % 7) - 3.0f;
    }
    const float coeff[8] = {0.5f, -2.0f, 1.0f, 0.25f, 3.0f, -1.0f, 0.125f, 2.0f};
    std::vector<float> acc(n, 1.0f);
    add_combination_row(coeff, 8, w.raw(), DType::kF32, ld, acc.data(), n, KernelImpl::kScalar);
    for (std::int64_t i = 0; i < n; ++i) {
        double want = 1.0;
        for (int j = 0; j < 8; ++j) {
            want += coeff[j] * w.data<float>()[j * ld + i];
        }
        EXPECT_EQ(acc[static_cast<std::size_t>(i)], want) << i;  // small integers and halves
    }
    if (!cpu_features().avx512_core()) {
        GTEST_SKIP() << "no AVX-512 to compare with";
    }
    for (DType dt : {DType::kF32, DType::kBF16}) {
        for (std::int64_t count : {1, 3, 8}) {
            for (std::int64_t len : {16, 37, 2048}) {
                Tensor rows = Tensor::empty({count, len}, dt),
                       c = Tensor::empty({count}, DType::kF32);
                fill_normal(rows, 1, 0.0f, 1.0f);
                fill_normal(c, 2, 0.0f, 1e-3f);
                std::vector<float> a1(static_cast<std::size_t>(len)), a2;
                for (std::size_t i = 0; i < a1.size(); ++i) {
                    a1[i] = std::sin(static_cast<float>(i));
                }
                a2 = a1;
                add_combination_row(c.data<float>(), count, rows.raw(), dt, len, a1.data(), len,
                                    KernelImpl::kScalar);
                add_combination_row(c.data<float>(), count, rows.raw(), dt, len, a2.data(), len,
                                    KernelImpl::kAvx512);
                EXPECT_EQ(std::memcmp(a1.data(), a2.data(), a1.size() * 4), 0)
                    << dtype_name(dt) << " count " << count << " n " << len;
            }
        }
    }
}

TEST(Activation, SoftmaxHelpersScalarAndAvx512Agree) {
    if (!cpu_features().avx512_core()) {
        GTEST_SKIP() << "no AVX-512 on this CPU";
    }
    Tensor x = Tensor::empty({600}, DType::kF32);
    Tensor y = Tensor::empty({600}, DType::kF32);
    fill_normal(x, 11, 0.5f, 4.0f);
    fill_normal(y, 12, 0.0f, 1.0f);
    const float* xs = x.data<float>();
    const float* ys = y.data<float>();
    std::vector<float> out_s(600), out_v(600);
    for (std::int64_t n : {1, 2, 15, 16, 17, 31, 100, 512, 513, 600}) {
        const float mx_s = row_max(xs, n, KernelImpl::kScalar);
        const float mx_v = row_max(xs, n, KernelImpl::kAvx512);
        EXPECT_EQ(mx_s, mx_v) << n;
        EXPECT_EQ(mx_s, *std::max_element(xs, xs + n)) << n;

        const float scale = 0.088f;
        const float shift = mx_s * scale;
        const float sum_s = exp_shifted_sum(xs, scale, shift, out_s.data(), n, KernelImpl::kScalar);
        const float sum_v = exp_shifted_sum(xs, scale, shift, out_v.data(), n, KernelImpl::kAvx512);
        EXPECT_EQ(std::memcmp(&sum_s, &sum_v, 4), 0) << n;
        EXPECT_EQ(std::memcmp(out_s.data(), out_v.data(), 4 * n), 0) << n;
        double want = 0;
        for (std::int64_t j = 0; j < n; ++j) {
            const double e = std::exp(static_cast<double>(xs[j] * scale - shift));
            EXPECT_NEAR(out_s[j], e, 3e-7 * e) << n << " " << j;
            want += e;
        }
        EXPECT_NEAR(sum_s, want, 1e-6 * want) << n;

        const float dot_s = dot16(xs, ys, n, KernelImpl::kScalar);
        const float dot_v = dot16(xs, ys, n, KernelImpl::kAvx512);
        EXPECT_EQ(std::memcmp(&dot_s, &dot_v, 4), 0) << n;
        double dot = 0, mag = 0;
        for (std::int64_t j = 0; j < n; ++j) {
            dot += static_cast<double>(xs[j]) * ys[j];
            mag += std::fabs(static_cast<double>(xs[j]) * ys[j]);
        }
        EXPECT_NEAR(dot_s, dot, 1e-6 * mag) << n;
    }
    // Lanes beyond n are not read into the result: garbage after the row changes nothing.
    std::vector<float> a(40, 1.0f), b(40, 2.0f);
    a[17] = 1e30f;
    EXPECT_EQ(dot16(a.data(), b.data(), 17, KernelImpl::kAvx512), 34.0f);
    EXPECT_EQ(row_max(a.data(), 17, KernelImpl::kAvx512), 1.0f);
}

}  // namespace
}  // namespace epo::kernels
