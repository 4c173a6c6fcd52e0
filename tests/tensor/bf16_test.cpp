#include "epo/tensor/bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "epo/tensor/random.h"

namespace epo {
namespace {

std::uint32_t bits_of(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
float from_bits(std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Independent statement of round-to-nearest-even, in double arithmetic over the candidate pair.
std::uint16_t rne_by_distance(float f) {
    const std::uint32_t u = bits_of(f);
    const std::uint32_t lo = u & 0xffff0000u;
    const std::uint32_t hi = lo + 0x10000u;
    const double dl = std::fabs(static_cast<double>(f) - static_cast<double>(from_bits(lo)));
    const double dh = std::fabs(static_cast<double>(from_bits(hi)) - static_cast<double>(f));
    if (dl < dh) {
        return static_cast<std::uint16_t>(lo >> 16);
    }
    if (dh < dl) {
        return static_cast<std::uint16_t>(hi >> 16);
    }
    return static_cast<std::uint16_t>(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

TEST(Bf16, RoundsToNearestEven) {
    EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3f80);
    EXPECT_EQ(float_to_bf16(from_bits(0x3f808000)).bits, 0x3f80);  // tie, even stays
    EXPECT_EQ(float_to_bf16(from_bits(0x3f818000)).bits, 0x3f82);  // tie, odd rounds up
    EXPECT_EQ(float_to_bf16(from_bits(0x3f808001)).bits, 0x3f81);  // above the tie
    EXPECT_EQ(float_to_bf16(from_bits(0xbf818000)).bits, 0xbf82);  // sign symmetric
    for (std::uint32_t u = 0x3f800000; u < 0x3f800000 + 0x40000; u += 7) {
        ASSERT_EQ(float_to_bf16(from_bits(u)).bits, rne_by_distance(from_bits(u))) << std::hex << u;
    }
}

TEST(Bf16, SpecialValues) {
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(float_to_bf16(inf).bits, 0x7f80);
    EXPECT_EQ(float_to_bf16(-inf).bits, 0xff80);
    EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()).bits, 0x7f80);  // overflows
    EXPECT_EQ(float_to_bf16(-0.0f).bits, 0x8000);
    // NaNs stay NaN (a payload only in the low bits must not round into infinity).
    for (std::uint32_t u : {0x7f800001u, 0x7fffffffu, 0xff800001u, 0x7fc00000u, 0x7f80ffffu}) {
        const float back = bf16_to_float(float_to_bf16(from_bits(u)));
        EXPECT_TRUE(std::isnan(back)) << std::hex << u;
        EXPECT_EQ(std::signbit(back), (u >> 31) != 0);
    }
    // Subnormals round like any value (not flushed).
    EXPECT_EQ(float_to_bf16(from_bits(0x00408000)).bits, 0x0040);
    EXPECT_EQ(float_to_bf16(from_bits(0x007fffff)).bits, 0x0080);
    EXPECT_EQ(float_to_bf16(from_bits(0x00018000)).bits, 0x0002);
}

TEST(Bf16, WideningIsExact) {
    for (std::uint32_t h = 0; h < 0x10000; ++h) {
        const BF16 b{static_cast<std::uint16_t>(h)};
        const float f = bf16_to_float(b);
        if (std::isnan(f)) {
            continue;
        }
        ASSERT_EQ(float_to_bf16(f).bits, h);
    }
}

// Every implementation this CPU runs gives the same bits as the scalar definition, on special
// values, on every bf16 neighbourhood boundary and on random bit patterns (any length, so the
// masked tails are covered).
TEST(Bf16, VectorImplementationsMatchScalar) {
    std::vector<float> src;
    for (std::uint32_t u :
         {0u, 0x80000000u, 1u, 0x00008000u, 0x007fffffu, 0x00018000u, 0x00408000u, 0x80408000u,
          0x00800000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x7f800001u, 0x7fa12345u, 0xffc00001u,
          0x3f808000u, 0x3f818000u, 0x3f80ffffu}) {
        src.push_back(from_bits(u));
    }
    for (std::uint64_t i = 0; i < 100000; ++i) {
        src.push_back(from_bits(static_cast<std::uint32_t>(random_bits(7, i))));
    }
    const std::size_t n = src.size() - 3;  // not a multiple of 16
    std::vector<BF16> want(n), got(n);
    convert_f32_to_bf16(src.data(), want.data(), n, Bf16Impl::kScalar);
    std::vector<float> wide_want(n), wide_got(n);
    convert_bf16_to_f32(want.data(), wide_want.data(), n, Bf16Impl::kScalar);
    int tested = 0;
    for (Bf16Impl impl : {Bf16Impl::kAvx512, Bf16Impl::kAvx512Bf16, Bf16Impl::kAuto}) {
        if (!bf16_impl_supported(impl)) {
            continue;
        }
        ++tested;
        convert_f32_to_bf16(src.data(), got.data(), n, impl);
        for (std::size_t i = 0; i < n; ++i) {
            ASSERT_EQ(got[i].bits, want[i].bits)
                << bf16_impl_name(impl) << " input " << std::hex << bits_of(src[i]);
        }
        convert_bf16_to_f32(want.data(), wide_got.data(), n, impl);
        ASSERT_EQ(std::memcmp(wide_got.data(), wide_want.data(), n * 4), 0);
    }
    EXPECT_GE(tested, 1);
}

}  // namespace
}  // namespace epo
