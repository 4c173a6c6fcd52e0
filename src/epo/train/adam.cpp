#include "epo/train/adam.h"

#include <cmath>

namespace epo::train {

void adam_step(const AdamConfig& config, int64_t step, bool decay, float* master, const float* grad,
               AdamState state, size_t n) {
    const float b1 = static_cast<float>(config.beta1);
    const float b2 = static_cast<float>(config.beta2);
    const double bias_correction1 = 1.0 - std::pow(config.beta1, static_cast<double>(step));
    const double bias_correction2 = 1.0 - std::pow(config.beta2, static_cast<double>(step));
    const float step_size = static_cast<float>(config.lr / bias_correction1);
    const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
    const float eps = static_cast<float>(config.eps);
    const float decay_factor =
        decay ? static_cast<float>(1.0 - config.lr * config.weight_decay) : 1.0f;
    float* m = state.exp_avg;
    float* v = state.exp_avg_sq;
    for (size_t i = 0; i < n; ++i) {
        const float g = grad[i];
        m[i] = b1 * m[i] + (1.0f - b1) * g;
        v[i] = b2 * v[i] + (1.0f - b2) * g * g;
        const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + eps;
        master[i] = master[i] * decay_factor - step_size * (m[i] / denom);
    }
}

double clip_coefficient(double grad_norm, double clip_grad) {
    if (clip_grad <= 0.0) {
        return 1.0;
    }
    const double coeff = clip_grad / (grad_norm + 1e-6);
    return coeff < 1.0 ? coeff : 1.0;
}

}  // namespace epo::train
