// Seeded random fills for weights and test data. Counter-based: element i of a fill is a pure
// function of (seed, i), so the values do not depend on the thread count, on how a tensor is
// split into pieces (fill with an offset), or on the machine.
#pragma once

#include <cstdint>

#include "epo/tensor/tensor.h"

namespace epo {

// A well-mixed 64-bit hash of (seed, index) (splitmix64 finalizer applied twice).
std::uint64_t random_bits(std::uint64_t seed, std::uint64_t index);

// Normal(mean, stddev) values (Box-Muller on two 32-bit halves of random_bits), in f32 or bf16
// (rounded to nearest even). Element i of `t` uses index first_index + i.
void fill_normal(const Tensor& t, std::uint64_t seed, float mean, float stddev,
                 std::uint64_t first_index = 0);
// Uniform values in [lo, hi).
void fill_uniform(const Tensor& t, std::uint64_t seed, float lo, float hi,
                  std::uint64_t first_index = 0);

}  // namespace epo
