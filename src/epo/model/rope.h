// Rotary position embedding (RoPE), non-interleaved ("rotate half"), as Megatron-Core applies it
// with rotary_percent = 1:
//
//   inv_freq[i] = base^(-2i/d),  angle[p, i] = p * inv_freq[i],  i < d/2, p = position in the
//   sequence; for each head vector x (d) at position p, with c = cos(angle), s = sin(angle):
//     forward   y[i] = x[i] c[i] - x[i + d/2] s[i],   y[i + d/2] = x[i + d/2] c[i] + x[i] s[i]
//     backward  the inverse rotation (s -> -s): the transpose of an orthogonal map.
//
// Letters: T tokens (B sequences of S), N heads, d head dim.
#pragma once

#include <cstdint>
#include <vector>

namespace epo::model {

struct RopeTable {
    int64_t seq_length = 0;
    int64_t head_dim = 0;
    std::vector<float> cos;  // (S, d/2)
    std::vector<float> sin;  // (S, d/2)
};

RopeTable make_rope_table(int64_t seq_length, int64_t head_dim, double base);

// Rotates every head of x in place: x is (T, row_stride) f32 and the heads to rotate are
// `num_heads` consecutive vectors of d starting at column `first_col`. Token t is at position
// t % S. `inverse` applies the backward rotation.
void rope_apply(const RopeTable& table, float* x, int64_t num_tokens, int64_t row_stride,
                int64_t first_col, int64_t num_heads, bool inverse);

}  // namespace epo::model
