// Learning-rate schedule: linear warm-up, then decay to min_lr (cosine, linear or constant), as
// Megatron's OptimizerParamScheduler computes it for the iteration being run.
//
//   step <= warmup:            lr = max_lr * step / warmup
//   warmup < step <= decay:    r = (step - warmup) / (decay - warmup)
//                              cosine: lr = min_lr + (max_lr - min_lr) * 0.5 * (1 + cos(pi * r))
//                              linear: lr = min_lr + (max_lr - min_lr) * (1 - r)
//                              constant: lr = max_lr
//   step > decay:              lr = min_lr (constant: max_lr)
//
// `step` counts optimizer steps from 1 (the first update uses step 1), as the reference logs it.
#pragma once

#include <cstdint>

namespace epo::train {

enum class LrDecayStyle { kCosine, kLinear, kConstant };

struct LrScheduleConfig {
    double max_lr = 3e-4;
    double min_lr = 0.0;
    int64_t warmup_iters = 0;
    int64_t decay_iters = 0;  // iteration at which min_lr is reached; <= warmup_iters: no decay
    LrDecayStyle decay_style = LrDecayStyle::kCosine;
};

double learning_rate_at(const LrScheduleConfig& config, int64_t step);

}  // namespace epo::train
