// Finite-difference gradient checks for the model's f32 paths.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "epo/tensor/random.h"
#include "epo/tensor/tensor.h"

namespace epo::testing {

// Central differences of `loss` with respect to `num_checks` seeded-random entries of `values`
// (n floats), compared with `analytic` (n floats): |numeric - analytic| <= atol + rtol * |numeric|.
inline void expect_gradient_matches(const std::string& what, float* values, const float* analytic,
                                    int64_t n, const std::function<double()>& loss,
                                    int num_checks = 12, float step = 1e-2f, double rtol = 2e-2,
                                    double atol = 2e-4) {
    for (int c = 0; c < num_checks && c < n; ++c) {
        const int64_t i = static_cast<int64_t>(random_bits(977, static_cast<uint64_t>(c)) %
                                               static_cast<uint64_t>(n));
        const float saved = values[i];
        values[i] = saved + step;
        const double plus = loss();
        values[i] = saved - step;
        const double minus = loss();
        values[i] = saved;
        const double numeric = (plus - minus) / (2.0 * step);
        EXPECT_NEAR(analytic[i], numeric, atol + rtol * std::fabs(numeric))
            << what << " element " << i;
    }
}

// sum_i a[i] * b[i] in double.
inline double dot(const Tensor& a, const Tensor& b) {
    double s = 0;
    for (int64_t i = 0; i < a.numel(); ++i)
        s += double(a.data<float>()[i]) * b.data<float>()[i];
    return s;
}

}  // namespace epo::testing
