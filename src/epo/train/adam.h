// AdamW over fp32 master weights (decoupled weight decay, as torch.optim.AdamW and Megatron's
// fused Adam in adam_w_mode compute it), plus global-norm gradient clipping.
//
// For parameter p with gradient g at optimizer step t (from 1):
//   m = b1 m + (1 - b1) g
//   v = b2 v + (1 - b2) g^2
//   p = p (1 - lr wd)
//   p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// Clipping (before the update): if clip > 0 and norm > clip, every gradient is scaled by
// clip / (norm + 1e-6), as Megatron's clip_grad_norm does.
//
// Element-wise only, so results do not depend on how parameters are grouped or ordered.
#pragma once

#include <cstddef>
#include <cstdint>

namespace epo::train {

struct AdamConfig {
    double lr = 3e-4;  // the scheduled learning rate of this step
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double weight_decay = 0.1;
};

struct AdamState {
    float* exp_avg;     // (n) first moment m
    float* exp_avg_sq;  // (n) second moment v
};

// One AdamW update of n elements. `weight_decay` is applied only when `decay` is true (Megatron
// exempts biases and norm weights).
void adam_step(const AdamConfig& config, int64_t step, bool decay, float* master, const float* grad,
               AdamState state, size_t n);

// The optimizer's pass over one parameter, fused: g' = g * grad_scale (only when grad_scale != 1,
// bit for bit the same as scaling g in place first), the AdamW update with g', then g = 0 for the
// next step's accumulation. One read of each array instead of three passes.
void adam_step_and_zero_grad(const AdamConfig& config, int64_t step, bool decay, float* master,
                             float* grad, float grad_scale, AdamState state, size_t n);

// g *= factor (skipped when factor == 1), returning the sum of squares of the scaled values,
// accumulated in double in a fixed order that does not depend on the CPU's vector width (8
// interleaved partial sums, then added in order), so every rank and build gets the same bits.
double scale_and_sum_squares(float* g, size_t n, float factor);

// The factor gradients are multiplied by so that their global norm is at most clip_grad
// (1.0 when no clipping applies). `clip_grad <= 0` disables clipping.
double clip_coefficient(double grad_norm, double clip_grad);

}  // namespace epo::train
