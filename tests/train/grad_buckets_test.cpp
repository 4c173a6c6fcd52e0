#include "epo/train/grad_buckets.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace epo::train {
namespace {

// Two layers; bytes by position: output 8, layer 1 20, layer 0 20, embedding 8.
int64_t two_layer_bytes(int position) {
    return position == 2 || position == -1 ? 8 : 20;
}

TEST(GradBuckets, ClosesOnceABucketHoldsBucketSizeBytes) {
    using V = std::vector<int>;
    EXPECT_EQ(grad_bucket_ends(2, two_layer_bytes, 1), (V{2, 1, 0, -1}));  // a position each
    EXPECT_EQ(grad_bucket_ends(2, two_layer_bytes, 8), (V{2, 1, 0, -1}));
    EXPECT_EQ(grad_bucket_ends(2, two_layer_bytes, 9), (V{1, 0, -1}));  // 28, 20, 8
    EXPECT_EQ(grad_bucket_ends(2, two_layer_bytes, 28), (V{1, -1}));    // 28, 28
    EXPECT_EQ(grad_bucket_ends(2, two_layer_bytes, 1000), (V{-1}));     // one bucket
    EXPECT_EQ(grad_bucket_ends(0, two_layer_bytes, 8), (V{0, -1}));     // no layers
}

TEST(GradBuckets, RefusesANonPositiveSize) {
    EXPECT_THROW(grad_bucket_ends(2, two_layer_bytes, 0), std::invalid_argument);
}

}  // namespace
}  // namespace epo::train
