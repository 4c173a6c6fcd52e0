#include "epo/moe/dispatch.h"

#include <gtest/gtest.h>

#include <vector>

#include "moe/moe_test_util.h"

namespace epo::moe {
namespace {

using testing::value_at;

MoeConfig config(std::int64_t e, std::int64_t k) {
    MoeConfig c;
    c.hidden_size = 3;
    c.num_experts = e;
    c.topk = k;
    c.ffn_hidden_size = 2;
    return c;
}

struct Routing {
    Tensor index, weight;
};

Routing routing(std::int64_t t, std::int64_t k, const std::vector<int>& idx,
                const std::vector<float>& w) {
    Routing r{Tensor::empty({t, k}, DType::kI32), Tensor::empty({t, k}, DType::kF32)};
    for (std::int64_t i = 0; i < t * k; ++i) {
        r.index.data<std::int32_t>()[i] = idx[static_cast<std::size_t>(i)];
        r.weight.data<float>()[i] = w[static_cast<std::size_t>(i)];
    }
    return r;
}

std::vector<int> ints(const Tensor& t) {
    return std::vector<int>(t.data<std::int32_t>(), t.data<std::int32_t>() + t.numel());
}

TEST(Dispatch, DroplessPlanIsStableInTokenOrder) {
    // 4 tokens, top-2 over 3 experts.
    Routing r = routing(4, 2, {2, 0, 0, 1, 2, 1, 0, 2}, {.6f, .4f, .7f, .3f, .5f, .5f, .9f, .1f});
    Arena arena;
    DispatchPlan p = dispatch_preprocess(config(3, 2), r.index, r.weight, arena);
    EXPECT_EQ(p.tokens_per_expert, (std::vector<std::int64_t>{3, 2, 3}));
    EXPECT_EQ(ints(p.row_token), (std::vector<int>{0, 1, 3, 1, 2, 0, 2, 3}));
    EXPECT_EQ(ints(p.row_slot), (std::vector<int>{1, 2, 6, 3, 5, 0, 4, 7}));
    EXPECT_EQ(p.num_dropped, 0);
    for (std::int64_t r_ = 0; r_ < p.num_rows; ++r_) {
        EXPECT_EQ(p.slot_row.data<std::int32_t>()[p.row_slot.data<std::int32_t>()[r_]], r_);
    }
}

// 6 tokens, top-1, 2 experts, capacity factor 1 -> capacity 3; expert 0 gets 5 tokens.
Routing crowded() {
    return routing(6, 1, {0, 0, 1, 0, 0, 0}, {.2f, .9f, .5f, .4f, .9f, .1f});
}

TEST(Dispatch, CapacityDropsByPosition) {
    MoeConfig c = config(2, 1);
    c.capacity_factor = 1.0;
    c.drop_policy = DropPolicy::kPosition;
    Routing r = crowded();
    Arena arena;
    DispatchPlan p = dispatch_preprocess(c, r.index, r.weight, arena);
    EXPECT_EQ(p.capacity, 3);
    EXPECT_EQ(ints(p.row_token), (std::vector<int>{0, 1, 3, 2}));
    EXPECT_EQ(p.num_dropped, 2);
    EXPECT_EQ(ints(p.slot_row), (std::vector<int>{0, 1, 3, 2, -1, -1}));
}

TEST(Dispatch, CapacityDropsByProbsWithTiesToTheLowerToken) {
    MoeConfig c = config(2, 1);
    c.capacity_factor = 1.0;
    c.drop_policy = DropPolicy::kProbs;
    Routing r = crowded();
    Arena arena;
    DispatchPlan p = dispatch_preprocess(c, r.index, r.weight, arena);
    // Expert 0 candidates: t0 .2, t1 .9, t3 .4, t4 .9, t5 .1 -> keep t1, t4 (tie .9), t3.
    EXPECT_EQ(ints(p.row_token), (std::vector<int>{1, 3, 4, 2}));
    EXPECT_EQ(ints(p.slot_row), (std::vector<int>{-1, 0, 3, 1, 2, -1}));
}

TEST(Dispatch, PaddingRowsAreUnroutedTokensWithWeightZero) {
    MoeConfig c = config(2, 1);
    c.capacity_factor = 1.0;
    c.pad_to_capacity = true;
    Routing r = crowded();
    Arena arena;
    DispatchPlan p = dispatch_preprocess(c, r.index, r.weight, arena);
    EXPECT_EQ(p.tokens_per_expert, (std::vector<std::int64_t>{3, 3}));
    // Expert 1: routed t2, then the lowest unrouted tokens t0, t1 as padding, in token order.
    EXPECT_EQ(ints(p.row_token), (std::vector<int>{1, 3, 4, 0, 1, 2}));
    EXPECT_EQ(ints(p.row_slot), (std::vector<int>{1, 3, 4, -1, -1, 2}));
    Tensor x = testing::random_tensor({6, 3}, DType::kF32, 1);
    ExpertSegments seg = make_expert_segments(p.tokens_per_expert, 4);
    Tensor xp = Tensor::empty({seg.total_rows(), 3}, DType::kF32);
    Tensor pp = Tensor::empty({seg.total_rows()}, DType::kF32);
    permute_forward(p, seg, x, r.weight, xp, pp);
    EXPECT_EQ(pp.data<float>()[4], 0.0f);  // padding row (token 0) of expert 1
    EXPECT_EQ(xp.data<float>()[4 * 3], x.data<float>()[0]);
    EXPECT_EQ(pp.data<float>()[3], 0.0f);  // alignment row
    EXPECT_EQ(xp.data<float>()[3 * 3 + 1], 0.0f);
}

TEST(Dispatch, PaddingBeyondTheTokensIsAConfigError) {
    MoeConfig c = config(2, 1);
    c.capacity_factor = 3.0;  // capacity 9 for 6 tokens
    c.pad_to_capacity = true;
    Routing r = crowded();
    Arena arena;
    try {
        dispatch_preprocess(c, r.index, r.weight, arena);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kConfig);
        EXPECT_NE(std::string(e.what()).find("moe_expert_capacity_factor"), std::string::npos);
    }
}

// combine(permute(x)) with identity experts sums each token's kept rows; the backwards are the
// transposes (checked through <combine(y_perm), dy> = <y_perm, combine^T(dy)>).
TEST(Dispatch, PermuteCombineAndTheirBackwardsAreConsistent) {
    for (bool capacity : {false, true}) {
        MoeConfig c = config(3, 2);
        if (capacity) {
            c.capacity_factor = 0.7;
        }
        Routing r = routing(5, 2, {0, 1, 0, 2, 0, 1, 2, 0, 0, 2},
                            {.5f, .5f, .6f, .4f, .7f, .3f, .8f, .2f, .9f, .1f});
        Arena arena;
        DispatchPlan p = dispatch_preprocess(c, r.index, r.weight, arena);
        ExpertSegments seg = make_expert_segments(p.tokens_per_expert, kExpertRowAlign);
        Tensor x = testing::random_tensor({5, 3}, DType::kF32, 2);
        Tensor xp = Tensor::empty({seg.total_rows(), 3}, DType::kF32);
        Tensor pp = Tensor::empty({seg.total_rows()}, DType::kF32);
        permute_forward(p, seg, x, r.weight, xp, pp);
        Tensor y = Tensor::empty({5, 3}, DType::kF32);
        combine_forward(p, seg, xp, Tensor(), y);
        for (std::int64_t t = 0; t < 5; ++t) {
            int kept = 0;
            for (int q = 0; q < 2; ++q) {
                kept += p.slot_row.data<std::int32_t>()[t * 2 + q] >= 0;
            }
            for (int j = 0; j < 3; ++j) {
                EXPECT_FLOAT_EQ(y.data<float>()[t * 3 + j], kept * x.data<float>()[t * 3 + j]);
            }
        }
        Tensor dy = testing::random_tensor({5, 3}, DType::kF32, 3);
        Tensor dyp = Tensor::empty({seg.total_rows(), 3}, DType::kF32);
        combine_backward(p, seg, dy, dyp);
        EXPECT_NEAR(testing::dot(y, dy), testing::dot(xp, dyp), 1e-5);
        // permute^T: <permute(x), g> = <x, permute_backward(g)>, weights likewise.
        Tensor g = testing::random_tensor({seg.total_rows(), 3}, DType::kF32, 4);
        Tensor gp = testing::random_tensor({seg.total_rows()}, DType::kF32, 5);
        zero_segment_padding(seg, g);
        Tensor dx = Tensor::empty({5, 3}, DType::kF32);
        Tensor dw = Tensor::empty({5, 2}, DType::kF32);
        permute_backward(p, seg, g, gp, dx, dw);
        EXPECT_NEAR(testing::dot(xp, g), testing::dot(x, dx), 1e-5);
        double wsum = 0;
        for (std::int64_t i = 0; i < seg.total_rows(); ++i) {
            wsum += value_at(pp, i) * value_at(gp, i);
        }
        EXPECT_NEAR(wsum, testing::dot(r.weight, dw), 1e-5);
    }
}

TEST(Dispatch, CombineSumsInKOrderThenAddsTheSharedExpert) {
    Routing r = routing(1, 2, {1, 0}, {.5f, .5f});
    Arena arena;
    DispatchPlan p = dispatch_preprocess(config(2, 2), r.index, r.weight, arena);
    ExpertSegments seg = make_expert_segments(p.tokens_per_expert, 1);
    Tensor yp = Tensor::empty({2, 1}, DType::kF32);
    yp.data<float>()[0] = 1.0f;  // expert 0's row (k = 1)
    yp.data<float>()[1] = 1e8f;  // expert 1's row (k = 0)
    Tensor shared = Tensor::empty({1, 1}, DType::kF32);
    shared.data<float>()[0] = -1e8f;
    Tensor y = Tensor::empty({1, 1}, DType::kF32);
    combine_forward(p, seg, yp.view({2, 1}), shared, y);
    // (1e8 + 1) rounds to 1e8 in f32, then + (-1e8) = 0: the fixed order is visible.
    EXPECT_EQ(y.data<float>()[0], 0.0f);
}

TEST(Dispatch, ChunkMovesRoundTripRankEncodedRows) {
    // 3 source ranks x 2 local experts; each row holds (source rank, local expert, index).
    const std::vector<std::int64_t> counts = {2, 0, 1, 3, 0, 4};
    const std::int64_t ranks = 3, local = 2;
    std::vector<std::int64_t> per_expert(2, 0);
    std::int64_t total = 0;
    for (std::int64_t s = 0; s < ranks; ++s) {
        for (std::int64_t l = 0; l < local; ++l) {
            per_expert[l] += counts[s * local + l];
            total += counts[s * local + l];
        }
    }
    Tensor recv = Tensor::empty({total, 3}, DType::kF32);
    std::int64_t row = 0;
    for (std::int64_t s = 0; s < ranks; ++s) {
        for (std::int64_t l = 0; l < local; ++l) {
            for (std::int64_t i = 0; i < counts[s * local + l]; ++i, ++row) {
                float* p = recv.data<float>() + row * 3;
                p[0] = static_cast<float>(s);
                p[1] = static_cast<float>(l);
                p[2] = static_cast<float>(i);
            }
        }
    }
    ExpertSegments seg = make_expert_segments(per_expert, 4);
    ChunkMoves moves = rank_major_to_expert_major(counts, ranks, seg);
    Tensor sorted = Tensor::zeros({seg.total_rows(), 3}, DType::kF32);
    move_chunks(recv, moves, sorted);
    for (std::int64_t l = 0; l < local; ++l) {
        float prev_rank = -1;
        for (std::int64_t j = 0; j < seg.counts[l]; ++j) {
            const float* p = sorted.data<float>() + (seg.offsets[l] + j) * 3;
            EXPECT_EQ(p[1], static_cast<float>(l));
            EXPECT_GE(p[0], prev_rank);  // source ranks in order inside an expert
            prev_rank = p[0];
        }
    }
    Tensor back = Tensor::zeros({total, 3}, DType::kF32);
    move_chunks(sorted, invert(moves), back);
    EXPECT_TRUE(testing::same_bits(back, recv));
    // Counts that do not match the segments are refused.
    const std::vector<std::int64_t> wrong = {2, 0, 1, 3, 0, 5};
    EXPECT_THROW(rank_major_to_expert_major(wrong, ranks, seg), Error);
}

TEST(Dispatch, SegmentsAreAligned) {
    const std::int64_t counts[4] = {0, 1, 32, 33};
    ExpertSegments s = make_expert_segments(counts, 32);
    EXPECT_EQ(s.offsets, (std::vector<std::int64_t>{0, 0, 32, 64, 128}));
    EXPECT_EQ(s.padded_count(3), 64);
    EXPECT_LE(s.total_rows(), max_segment_rows(66, 4, 32));
}

}  // namespace
}  // namespace epo::moe
