// Helpers shared by the MoE tests: random tensors, f32 views, dot products, and the
// finite-difference comparison.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "epo/tensor/random.h"
#include "epo/tensor/tensor.h"

namespace epo::moe::testing {

inline Tensor random_tensor(const Shape& shape, DType dt, std::uint64_t seed, float stddev = 1.0f) {
    Tensor t = Tensor::empty(shape, dt);
    fill_normal(t, seed, 0.0f, stddev);
    return t;
}

inline double value_at(const Tensor& t, std::int64_t i) {
    switch (t.dtype()) {
        case DType::kF32:
            return t.data<float>()[i];
        case DType::kBF16:
            return bf16_to_float(t.data<BF16>()[i]);
        case DType::kI32:
            return t.data<std::int32_t>()[i];
        case DType::kI64:
            return static_cast<double>(t.data<std::int64_t>()[i]);
    }
    return 0;
}

inline Tensor to_f32(const Tensor& t) {
    Tensor out = Tensor::empty(t.shape(), DType::kF32);
    for (std::int64_t i = 0; i < t.numel(); ++i) {
        out.data<float>()[i] = static_cast<float>(value_at(t, i));
    }
    return out;
}

inline Tensor to_dtype(const Tensor& t, DType dt) {
    if (dt == DType::kF32) {
        return to_f32(t);
    }
    Tensor out = Tensor::empty(t.shape(), DType::kBF16);
    for (std::int64_t i = 0; i < t.numel(); ++i) {
        out.data<BF16>()[i] = float_to_bf16(static_cast<float>(value_at(t, i)));
    }
    return out;
}

inline double dot(const Tensor& a, const Tensor& b) {
    EXPECT_EQ(a.numel(), b.numel());
    double s = 0;
    for (std::int64_t i = 0; i < a.numel(); ++i) {
        s += value_at(a, i) * value_at(b, i);
    }
    return s;
}

inline bool same_bits(const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// ||a - b|| / ||b|| over all elements.
inline double relative_error(const Tensor& a, const Tensor& b) {
    double num = 0, den = 0;
    for (std::int64_t i = 0; i < a.numel(); ++i) {
        const double d = value_at(a, i) - value_at(b, i);
        num += d * d;
        den += value_at(b, i) * value_at(b, i);
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

// Central finite differences of `loss` with respect to every element of the f32 tensor `param`
// (after each change `touched()` runs, e.g. to refresh compute copies), compared with
// `analytic`. `skip(i)` may veto an element (a discontinuity such as a routing flip).
// Returns the number of elements checked.
inline int check_gradient(
    const char* what, const Tensor& param, const Tensor& analytic,
    const std::function<double()>& loss, double eps, double atol, double rtol,
    const std::function<void()>& touched = [] {},
    const std::function<bool()>& discontinuous = [] { return false; }) {
    float* p = param.data<float>();
    int checked = 0;
    for (std::int64_t i = 0; i < param.numel(); ++i) {
        const float orig = p[i];
        p[i] = orig + static_cast<float>(eps);
        touched();
        const double lp = loss();
        const bool flip_p = discontinuous();
        p[i] = orig - static_cast<float>(eps);
        touched();
        const double lm = loss();
        const bool flip_m = discontinuous();
        p[i] = orig;
        touched();
        if (flip_p || flip_m) {
            continue;
        }
        const double fd = (lp - lm) / (2 * eps);
        const double an = value_at(analytic, i);
        EXPECT_NEAR(an, fd, atol + rtol * std::fabs(fd)) << what << "[" << i << "]";
        ++checked;
    }
    return checked;
}

}  // namespace epo::moe::testing
