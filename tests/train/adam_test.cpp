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

}  // namespace
}  // namespace epo::train
