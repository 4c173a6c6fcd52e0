#include "epo/model/rope.h"

#include <cmath>

#include "epo/core/error.h"

namespace epo::model {

RopeTable make_rope_table(int64_t seq_length, int64_t head_dim, double base) {
    EPO_CHECK(head_dim % 2 == 0, "rotary embedding needs an even head dim, got {}", head_dim);
    RopeTable t{.seq_length = seq_length, .head_dim = head_dim};
    const int64_t half = head_dim / 2;
    t.cos.resize(static_cast<size_t>(seq_length * half));
    t.sin.resize(t.cos.size());
    for (int64_t p = 0; p < seq_length; ++p) {
        for (int64_t i = 0; i < half; ++i) {
            // Angles in double: positions up to tens of thousands keep full f32 accuracy.
            const double inv_freq = std::pow(base, -2.0 * static_cast<double>(i) / head_dim);
            const double angle = static_cast<double>(p) * inv_freq;
            t.cos[p * half + i] = static_cast<float>(std::cos(angle));
            t.sin[p * half + i] = static_cast<float>(std::sin(angle));
        }
    }
    return t;
}

void rope_apply(const RopeTable& table, float* x, int64_t num_tokens, int64_t row_stride,
                int64_t first_col, int64_t num_heads, bool inverse) {
    const int64_t d = table.head_dim, half = d / 2;
    const float sign = inverse ? -1.0f : 1.0f;
    for (int64_t t = 0; t < num_tokens; ++t) {
        const int64_t p = t % table.seq_length;
        const float* c = table.cos.data() + p * half;
        const float* s = table.sin.data() + p * half;
        for (int64_t h = 0; h < num_heads; ++h) {
            float* v = x + t * row_stride + first_col + h * d;
            for (int64_t i = 0; i < half; ++i) {
                const float a = v[i], b = v[i + half], si = sign * s[i];
                v[i] = a * c[i] - b * si;
                v[i + half] = b * c[i] + a * si;
            }
        }
    }
}

}  // namespace epo::model
