#include "epo/train/adam.h"

#include <cmath>

namespace epo::train {

namespace {

struct AdamConstants {
    float b1, b2, step_size, inv_sqrt_bc2, eps, decay_factor;
};

AdamConstants adam_constants(const AdamConfig& config, int64_t step, bool decay) {
    const double bias_correction1 = 1.0 - std::pow(config.beta1, static_cast<double>(step));
    const double bias_correction2 = 1.0 - std::pow(config.beta2, static_cast<double>(step));
    return AdamConstants{
        .b1 = static_cast<float>(config.beta1),
        .b2 = static_cast<float>(config.beta2),
        .step_size = static_cast<float>(config.lr / bias_correction1),
        .inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2)),
        .eps = static_cast<float>(config.eps),
        .decay_factor = decay ? static_cast<float>(1.0 - config.lr * config.weight_decay) : 1.0f,
    };
}

// The element update. This file is compiled with -ffp-contract=off (CMakeLists.txt): every
// clone below rounds each operation separately, so AVX-512, AVX2 and baseline builds agree.
// Each loop is compiled for AVX-512, AVX2 and baseline x86-64, the best picked at load time (an
// ifunc). ThreadSanitizer's runtime crashes resolving ifuncs before it has started, so its
// builds keep the baseline version only (the same results, by the rounding rule above).
#if defined(__SANITIZE_THREAD__)
#define EPO_ADAM_CLONES
#else
#define EPO_ADAM_CLONES [[gnu::target_clones("avx512f", "avx2", "default")]]
#endif

[[gnu::always_inline]] inline void update(const AdamConstants& c, float g, float& m, float& v,
                                          float& w) {
    m = c.b1 * m + (1.0f - c.b1) * g;
    v = c.b2 * v + (1.0f - c.b2) * g * g;
    const float denom = std::sqrt(v) * c.inv_sqrt_bc2 + c.eps;
    w = w * c.decay_factor - c.step_size * (m / denom);
}

EPO_ADAM_CLONES void adam_loop(const AdamConstants& c, float* __restrict master,
                               const float* __restrict grad, float* __restrict m,
                               float* __restrict v, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        update(c, grad[i], m[i], v[i], master[i]);
    }
}

EPO_ADAM_CLONES void adam_scaled_zero_loop(const AdamConstants& c, float* __restrict master,
                                           float* __restrict grad, float scale, float* __restrict m,
                                           float* __restrict v, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        update(c, grad[i] * scale, m[i], v[i], master[i]);
        grad[i] = 0.0f;
    }
}

EPO_ADAM_CLONES void adam_zero_loop(const AdamConstants& c, float* __restrict master,
                                    float* __restrict grad, float* __restrict m,
                                    float* __restrict v, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        update(c, grad[i], m[i], v[i], master[i]);
        grad[i] = 0.0f;
    }
}

constexpr size_t kLanes = 8;

EPO_ADAM_CLONES void scale_squares_loop(float* __restrict g, size_t n, float factor, bool do_scale,
                                        double* __restrict lanes) {
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (size_t k = 0; k < kLanes; ++k) {
            const float x = do_scale ? g[i + k] * factor : g[i + k];
            g[i + k] = x;
            lanes[k] += static_cast<double>(x) * static_cast<double>(x);
        }
    }
    for (size_t k = 0; i < n; ++i, ++k) {
        const float x = do_scale ? g[i] * factor : g[i];
        g[i] = x;
        lanes[k] += static_cast<double>(x) * static_cast<double>(x);
    }
}

}  // namespace

void adam_step(const AdamConfig& config, int64_t step, bool decay, float* master, const float* grad,
               AdamState state, size_t n) {
    adam_loop(adam_constants(config, step, decay), master, grad, state.exp_avg, state.exp_avg_sq,
              n);
}

void adam_step_and_zero_grad(const AdamConfig& config, int64_t step, bool decay, float* master,
                             float* grad, float grad_scale, AdamState state, size_t n) {
    const AdamConstants c = adam_constants(config, step, decay);
    if (grad_scale != 1.0f) {
        adam_scaled_zero_loop(c, master, grad, grad_scale, state.exp_avg, state.exp_avg_sq, n);
    } else {
        adam_zero_loop(c, master, grad, state.exp_avg, state.exp_avg_sq, n);
    }
}

double scale_and_sum_squares(float* g, size_t n, float factor) {
    double lanes[kLanes] = {};
    scale_squares_loop(g, n, factor, factor != 1.0f, lanes);
    double sum = 0;
    for (double lane : lanes) {
        sum += lane;
    }
    return sum;
}

double clip_coefficient(double grad_norm, double clip_grad) {
    if (clip_grad <= 0.0) {
        return 1.0;
    }
    const double coeff = clip_grad / (grad_norm + 1e-6);
    return coeff < 1.0 ? coeff : 1.0;
}

}  // namespace epo::train
