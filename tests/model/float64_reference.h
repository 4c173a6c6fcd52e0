// Float64 references for the model's layers: naive loops in double, written from the layers'
// definitions (never from their code), and central differences of a float64 loss for reference
// gradients. Shared by the layer tests that check against a float64 reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "epo/tensor/tensor.h"

namespace epo::testing {

using Vec = std::vector<double>;

// y (rows, out) = x (rows, in) w^T, w (out, in).
inline Vec linear(const Vec& x, const Vec& w, int64_t rows, int64_t in, int64_t out) {
    Vec y(static_cast<size_t>(rows * out), 0.0);
    for (int64_t t = 0; t < rows; ++t)
        for (int64_t o = 0; o < out; ++o) {
            double s = 0;
            for (int64_t i = 0; i < in; ++i)
                s += x[t * in + i] * w[o * in + i];
            y[t * out + o] = s;
        }
    return y;
}

inline Vec rms_norm(const Vec& x, const Vec& w, int64_t rows, int64_t width, double eps) {
    Vec y(x.size());
    for (int64_t t = 0; t < rows; ++t) {
        double ss = 0;
        for (int64_t j = 0; j < width; ++j)
            ss += x[t * width + j] * x[t * width + j];
        const double r = 1.0 / std::sqrt(ss / width + eps);
        for (int64_t j = 0; j < width; ++j)
            y[t * width + j] = x[t * width + j] * r * w[j];
    }
    return y;
}

inline Vec to_vec(const Tensor& t) {
    Vec v(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i)
        v[i] = t.data<float>()[i];
    return v;
}

// Central difference of `loss` in each element of v.
inline Vec numeric_gradient(Vec& v, const std::function<double()>& loss) {
    Vec g(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
        const double saved = v[i], h = 1e-6 * std::max(1.0, std::fabs(saved));
        v[i] = saved + h;
        const double plus = loss();
        v[i] = saved - h;
        const double minus = loss();
        v[i] = saved;
        g[i] = (plus - minus) / (2 * h);
    }
    return g;
}

// max |a - ref| / max |ref|
inline double relative_error(const Vec& a, const Vec& ref) {
    double err = 0, mag = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        err = std::max(err, std::fabs(a[i] - ref[i]));
        mag = std::max(mag, std::fabs(ref[i]));
    }
    return err / std::max(mag, 1e-30);
}

}  // namespace epo::testing
