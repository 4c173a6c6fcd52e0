#include "epo/train/adam.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace epo::train {
namespace {

// Reference: the AdamW formulas written out in double precision.
double reference_adamw(double p, const std::vector<double>& grads, const AdamConfig& c,
                       bool decay) {
    double m = 0, v = 0;
    for (size_t t = 1; t <= grads.size(); ++t) {
        const double g = grads[t - 1];
        m = c.beta1 * m + (1 - c.beta1) * g;
        v = c.beta2 * v + (1 - c.beta2) * g * g;
        const double mhat = m / (1 - std::pow(c.beta1, t));
        const double vhat = v / (1 - std::pow(c.beta2, t));
        if (decay)
            p *= 1 - c.lr * c.weight_decay;
        p -= c.lr * mhat / (std::sqrt(vhat) + c.eps);
    }
    return p;
}

TEST(Adam, MatchesAdamWFormulaOverSeveralSteps) {
    AdamConfig c{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    const std::vector<double> grads = {0.5, -0.25, 1.5, 0.0, -2.0};
    for (bool decay : {false, true}) {
        float p = 0.75f, m = 0, v = 0;
        for (size_t t = 1; t <= grads.size(); ++t) {
            const float g = static_cast<float>(grads[t - 1]);
            adam_step(c, static_cast<int64_t>(t), decay, &p, &g, AdamState{&m, &v}, 1);
        }
        EXPECT_NEAR(p, reference_adamw(0.75, grads, c, decay), 2e-6) << "decay=" << decay;
    }
}

TEST(Adam, FirstStepMovesByLearningRateTimesSign) {
    // With bias correction the first update is lr * g / (|g| + eps) ~ lr * sign(g).
    AdamConfig c{.lr = 1e-3, .weight_decay = 0.0};
    std::vector<float> p = {1.0f, 1.0f}, g = {3.0f, -0.01f}, m(2), v(2);
    adam_step(c, 1, true, p.data(), g.data(), AdamState{m.data(), v.data()}, 2);
    EXPECT_NEAR(p[0], 1.0f - 1e-3f, 1e-6);
    EXPECT_NEAR(p[1], 1.0f + 1e-3f, 1e-6);
}

TEST(Adam, ClipCoefficient) {
    EXPECT_DOUBLE_EQ(clip_coefficient(0.5, 1.0), 1.0);
    EXPECT_NEAR(clip_coefficient(4.0, 1.0), 0.25, 1e-6);
    EXPECT_DOUBLE_EQ(clip_coefficient(100.0, 0.0), 1.0);
}

// The optimizer's fused pass equals scaling the gradient first and then adam_step, bit for bit,
// over a length that exercises the vector body and the tail; the gradient is left zeroed.
TEST(Adam, FusedStepMatchesScaleThenStepAndZeroesTheGradient) {
    const size_t n = 37;
    std::vector<float> w(n), g(n), m(n), v(n);
    for (size_t i = 0; i < n; ++i) {
        w[i] = 0.1f * static_cast<float>(i) - 1.0f;
        g[i] = std::sin(static_cast<float>(i)) * 3.0f;
        m[i] = 0.01f * static_cast<float>(i);
        v[i] = 0.002f * static_cast<float>(i);
    }
    const AdamConfig cfg{.lr = 1e-3, .weight_decay = 0.1};
    for (const float scale : {1.0f, 0.37f}) {
        std::vector<float> w1 = w, g1 = g, m1 = m, v1 = v, w2 = w, g2 = g, m2 = m, v2 = v;
        for (float& x : g1) {
            x *= scale;
        }
        adam_step(cfg, 3, true, w1.data(), g1.data(), AdamState{m1.data(), v1.data()}, n);
        adam_step_and_zero_grad(cfg, 3, true, w2.data(), g2.data(), scale,
                                AdamState{m2.data(), v2.data()}, n);
        EXPECT_EQ(w1, w2);
        EXPECT_EQ(m1, m2);
        EXPECT_EQ(v1, v2);
        EXPECT_EQ(g2, std::vector<float>(n, 0.0f));
    }
}

// Scaling in place and the sum of squares of the scaled values, in one pass.
TEST(Adam, ScaleAndSumSquares) {
    std::vector<float> g(21);
    double expected = 0;
    for (size_t i = 0; i < g.size(); ++i) {
        g[i] = static_cast<float>(i) - 10.0f;
        const float scaled = g[i] * 0.5f;
        expected += static_cast<double>(scaled) * scaled;
    }
    const double got = scale_and_sum_squares(g.data(), g.size(), 0.5f);
    EXPECT_NEAR(got, expected, 1e-12 * expected);
    for (size_t i = 0; i < g.size(); ++i) {
        EXPECT_EQ(g[i], (static_cast<float>(i) - 10.0f) * 0.5f);
    }
    EXPECT_EQ(scale_and_sum_squares(g.data(), 0, 2.0f), 0.0);
}

}  // namespace
}  // namespace epo::train
