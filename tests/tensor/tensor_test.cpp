#include "epo/tensor/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "epo/tensor/arena.h"
#include "epo/tensor/param.h"
#include "epo/tensor/random.h"
#include "tensor/mapping_test_util.h"

namespace epo {
namespace {

TEST(Tensor, ShapeAndViews) {
    Tensor t = Tensor::zeros({4, 3}, DType::kF32);
    EXPECT_EQ(t.numel(), 12);
    EXPECT_EQ(t.nbytes(), 48u);
    EXPECT_EQ(t.shape().str(), "[4, 3]");
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.raw()) % 64, 0u);
    float* p = t.data<float>();
    for (int i = 0; i < 12; ++i) {
        p[i] = static_cast<float>(i);
    }
    Tensor r = t.rows(1, 3);
    EXPECT_EQ(r.shape(), Shape({2, 3}));
    EXPECT_EQ(r.data<float>()[0], 3.0f);
    Tensor v = t.view({2, 6});
    EXPECT_EQ(v.data<float>(), p);
    Tensor c = t.clone();
    c.data<float>()[0] = 42;
    EXPECT_EQ(p[0], 0.0f);
    EXPECT_EQ(t.dim(-1), 3);
}

// Weights, gradients and packed copies are streamed by GEMMs: blocks of 2 MiB and more start on a
// 2 MiB boundary in a mapping that may use transparent huge pages; small ones are 64-byte aligned.
TEST(Tensor, LargeStorageGetsHugePages) {
    constexpr std::uintptr_t kHuge = std::uintptr_t{2} << 20;
    for (std::size_t bytes : {std::size_t{2} << 20, (std::size_t{6} << 20) + 100}) {
        std::shared_ptr<void> s = allocate_storage(bytes);
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(s.get()) % kHuge, 0u) << bytes;
        const int eligible = test::thp_eligible(s.get());
        if (eligible >= 0 && test::thp_enabled()) {
            EXPECT_EQ(eligible, 1) << bytes;
        }
    }
    Tensor big = Tensor::empty({1024, 1024}, DType::kF32);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(big.raw()) % kHuge, 0u);
    std::shared_ptr<void> small = allocate_storage(100);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(small.get()) % 64, 0u);
    EXPECT_NE(allocate_storage(0), nullptr);
}

TEST(Tensor, MisuseIsAnError) {
    Tensor t = Tensor::zeros({2, 2}, DType::kBF16);
    EXPECT_THROW(t.data<float>(), Error);
    EXPECT_THROW(t.rows(1, 3), Error);
    EXPECT_THROW(t.view({3}), Error);
    EXPECT_THROW(Shape({2, -1}), Error);
    EXPECT_FALSE(Tensor().defined());
}

TEST(Arena, AllocationsAreAlignedDistinctAndReused) {
    Arena arena("test", 1 << 20);
    Tensor a = arena.alloc({10}, DType::kF32);
    Tensor b = arena.alloc({0}, DType::kBF16);
    Tensor c = arena.alloc({3, 5}, DType::kI64);
    for (const Tensor* t : {&a, &b, &c}) {
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t->raw()) % 64, 0u);
    }
    EXPECT_NE(a.raw(), b.raw());
    EXPECT_NE(b.raw(), c.raw());
    void* first = a.raw();
    arena.reset();
    EXPECT_EQ(arena.bytes_in_use(), 0u);
    EXPECT_EQ(arena.alloc({10}, DType::kF32).raw(), first);
    EXPECT_EQ(arena.num_maps(), 1);
}

TEST(Arena, GrowsThenMergesSoTheNextCycleDoesNotGrow) {
    Arena arena("grow", 4096);
    for (int cycle = 0; cycle < 3; ++cycle) {
        for (int i = 0; i < 8; ++i) {
            Tensor t = arena.alloc({1 << 19}, DType::kF32);  // 2 MiB each
            t.data<float>()[0] = 1.0f;
        }
        arena.reset();
        EXPECT_EQ(arena.num_chunks(), 1);
    }
    // Cycle 0 grew (and the reset merged); cycles 1 and 2 mapped nothing new.
    const int maps_after_first = arena.num_maps();
    for (int i = 0; i < 8; ++i) {
        arena.alloc({1 << 19}, DType::kF32);
    }
    arena.reset();
    EXPECT_EQ(arena.num_maps(), maps_after_first);
    EXPECT_GE(arena.capacity(), std::size_t{16} << 20);
}

// What stays mapped after a growing cycle is its need plus an eighth, not the sum of the growth
// steps (a doubling growth kept up to twice the need resident: the chunks are pre-faulted).
TEST(Arena, MergedChunkHoldsTheNeedNotTheGrowthSteps) {
    Arena arena("need", 4096);
    const std::size_t mib = std::size_t{1} << 20;
    for (int i = 0; i < 9; ++i) {
        arena.alloc({1 << 19}, DType::kF32);  // 2 MiB each: 18 MiB in all
    }
    EXPECT_LE(arena.capacity(), 18 * mib * 5 / 4 + 2 * mib) << "growth overshoots a quarter";
    arena.reset();
    EXPECT_EQ(arena.num_chunks(), 1);
    EXPECT_GE(arena.capacity(), 18 * mib);
    EXPECT_LE(arena.capacity(), 18 * mib + 18 * mib / 8 + 2 * mib);
    // A cycle asking a little more than the most so far (within the eighth) maps nothing new;
    // a smaller one after it keeps the chunk.
    const int maps = arena.num_maps();
    for (int i = 0; i < 10; ++i) {
        arena.alloc({1 << 19}, DType::kF32);
    }
    arena.reset();
    arena.alloc({1 << 10}, DType::kF32);
    arena.reset();
    EXPECT_EQ(arena.num_maps(), maps);
    EXPECT_GE(arena.capacity(), 20 * mib);
}

TEST(Arena, AllocZerosIsZero) {
    Arena arena;
    Tensor t = arena.alloc({100}, DType::kF32);
    for (int i = 0; i < 100; ++i) {
        t.data<float>()[i] = 5;
    }
    arena.reset();
    Tensor z = arena.alloc_zeros({100}, DType::kF32);
    for (int i = 0; i < 100; ++i) {
        ASSERT_EQ(z.data<float>()[i], 0.0f);
    }
}

TEST(Param, Bf16ComputeCopyFollowsMasterOnRefresh) {
    Param p = make_param("w", {3, 4}, DType::kBF16);
    EXPECT_EQ(p.compute.dtype(), DType::kBF16);
    EXPECT_NE(p.compute.raw(), p.master.raw());
    fill_normal(p.master, 1, 0.0f, 1.0f);
    const auto v0 = p.version;
    refresh_compute(p);
    EXPECT_EQ(p.version, v0 + 1);
    for (int i = 0; i < 12; ++i) {
        EXPECT_EQ(p.compute.data<BF16>()[i].bits, float_to_bf16(p.master.data<float>()[i]).bits);
    }
    p.main_grad.data<float>()[3] = 2;
    zero_grad(p);
    EXPECT_EQ(p.main_grad.data<float>()[3], 0.0f);
}

TEST(Param, Fp32ComputeIsTheMaster) {
    Param p = make_param("w", {5}, DType::kF32);
    EXPECT_EQ(p.compute.raw(), p.master.raw());
    EXPECT_THROW(make_param("x", {2}, DType::kI32), Error);
}

TEST(Random, CounterBasedAndSplittable) {
    Tensor a = Tensor::empty({1000}, DType::kF32);
    Tensor b = Tensor::empty({1000}, DType::kF32);
    fill_normal(a, 9, 0.0f, 1.0f);
    fill_normal(b.rows(0, 400), 9, 0.0f, 1.0f);
    fill_normal(b.rows(400, 1000), 9, 0.0f, 1.0f, 400);
    double sum = 0, sq = 0;
    for (int i = 0; i < 1000; ++i) {
        ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]);
        sum += a.data<float>()[i];
        sq += a.data<float>()[i] * a.data<float>()[i];
    }
    EXPECT_NEAR(sum / 1000, 0.0, 0.1);
    EXPECT_NEAR(sq / 1000, 1.0, 0.15);
    fill_uniform(b, 10, -2.0f, 2.0f);
    for (int i = 0; i < 1000; ++i) {
        ASSERT_GE(b.data<float>()[i], -2.0f);
        ASSERT_LE(b.data<float>()[i], 2.0f);
    }
}

}  // namespace
}  // namespace epo
