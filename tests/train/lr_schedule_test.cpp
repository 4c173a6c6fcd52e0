#include "epo/train/lr_schedule.h"

#include <gtest/gtest.h>

namespace epo::train {
namespace {

TEST(LrSchedule, WarmupIsLinearFromZero) {
    LrScheduleConfig c{.max_lr = 1e-3, .min_lr = 1e-5, .warmup_iters = 10, .decay_iters = 100};
    EXPECT_DOUBLE_EQ(learning_rate_at(c, 1), 1e-4);
    EXPECT_DOUBLE_EQ(learning_rate_at(c, 5), 5e-4);
    EXPECT_DOUBLE_EQ(learning_rate_at(c, 10), 1e-3);
}

TEST(LrSchedule, CosineReachesMinAtDecayEndAndHalfwayIsMean) {
    LrScheduleConfig c{.max_lr = 1e-3, .min_lr = 1e-5, .warmup_iters = 10, .decay_iters = 110};
    EXPECT_NEAR(learning_rate_at(c, 60), (1e-3 + 1e-5) / 2, 1e-15);
    EXPECT_NEAR(learning_rate_at(c, 110), 1e-5, 1e-15);
    EXPECT_DOUBLE_EQ(learning_rate_at(c, 500), 1e-5);
    EXPECT_GT(learning_rate_at(c, 30), learning_rate_at(c, 31));
}

TEST(LrSchedule, LinearAndConstant) {
    LrScheduleConfig c{.max_lr = 1.0,
                       .min_lr = 0.0,
                       .warmup_iters = 0,
                       .decay_iters = 4,
                       .decay_style = LrDecayStyle::kLinear};
    EXPECT_DOUBLE_EQ(learning_rate_at(c, 1), 0.75);
    EXPECT_DOUBLE_EQ(learning_rate_at(c, 4), 0.0);
    c.decay_style = LrDecayStyle::kConstant;
    EXPECT_DOUBLE_EQ(learning_rate_at(c, 3), 1.0);
}

}  // namespace
}  // namespace epo::train
