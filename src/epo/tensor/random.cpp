#include "epo/tensor/random.h"

#include <cmath>

namespace epo {
namespace {

std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

template <typename Fn>
void fill(const Tensor& t, Fn value_of) {
    const std::int64_t n = t.numel();
    if (t.dtype() == DType::kF32) {
        float* p = t.data<float>();
        for (std::int64_t i = 0; i < n; ++i) {
            p[i] = value_of(static_cast<std::uint64_t>(i));
        }
    } else if (t.dtype() == DType::kBF16) {
        BF16* p = t.data<BF16>();
        for (std::int64_t i = 0; i < n; ++i) {
            p[i] = float_to_bf16(value_of(static_cast<std::uint64_t>(i)));
        }
    } else {
        EPO_CHECK(false, "random fill of a {} tensor", dtype_name(t.dtype()));
    }
}

}  // namespace

std::uint64_t random_bits(std::uint64_t seed, std::uint64_t index) {
    return mix(mix(seed + 0x9e3779b97f4a7c15ull) ^ (index * 0xd1b54a32d192ed03ull));
}

void fill_normal(const Tensor& t, std::uint64_t seed, float mean, float stddev,
                 std::uint64_t first_index) {
    // Box-Muller on pairs: global elements 2k and 2k+1 share the draw random_bits(seed, k) and
    // take its cosine and sine branch, so one logarithm serves two values (initializing a real
    // model draws hundreds of millions) and any sub-range still gets the same values as a whole
    // fill (first_index keeps the global position).
    double cached_z = 0;
    std::uint64_t cached_pair = ~std::uint64_t{0};
    fill(t, [&](std::uint64_t i) {
        const std::uint64_t g = first_index + i;
        const std::uint64_t pair = g >> 1;
        if (pair != cached_pair || (g & 1) == 0) {
            const std::uint64_t r = random_bits(seed, pair);
            const double u1 = (static_cast<double>(r >> 32) + 1.0) / 4294967296.0;  // (0, 1]
            const double u2 = static_cast<double>(r & 0xffffffffu) / 4294967296.0;  // [0, 1)
            const double radius = std::sqrt(-2.0 * std::log(u1));
            const double angle = 6.283185307179586 * u2;
            cached_pair = pair;
            cached_z = radius * std::sin(angle);
            if ((g & 1) == 0) {
                return static_cast<float>(mean + stddev * radius * std::cos(angle));
            }
        }
        return static_cast<float>(mean + stddev * cached_z);
    });
}

void fill_uniform(const Tensor& t, std::uint64_t seed, float lo, float hi,
                  std::uint64_t first_index) {
    fill(t, [&](std::uint64_t i) {
        const double u = static_cast<double>(random_bits(seed, first_index + i) >> 11) /
                         9007199254740992.0;  // [0, 1) with 53 bits
        return static_cast<float>(lo + (hi - lo) * u);
    });
}

}  // namespace epo
