#include "epo/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace epo::train {

double learning_rate_at(const LrScheduleConfig& config, int64_t step) {
    if (config.warmup_iters > 0 && step <= config.warmup_iters) {
        return config.max_lr * static_cast<double>(step) / static_cast<double>(config.warmup_iters);
    }
    if (config.decay_style == LrDecayStyle::kConstant) {
        return config.max_lr;
    }
    const int64_t decay_span = config.decay_iters - config.warmup_iters;
    if (decay_span <= 0) {
        return config.max_lr;
    }
    if (step > config.decay_iters) {
        return config.min_lr;
    }
    const double ratio =
        std::clamp(static_cast<double>(step - config.warmup_iters) / decay_span, 0.0, 1.0);
    const double coeff = config.decay_style == LrDecayStyle::kCosine
                             ? 0.5 * (1.0 + std::cos(std::numbers::pi * ratio))
                             : 1.0 - ratio;
    return config.min_lr + (config.max_lr - config.min_lr) * coeff;
}

}  // namespace epo::train
