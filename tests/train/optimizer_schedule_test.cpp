// The optimizer step's issue order (optimizer_schedule.h): squares as each bucket's reduction
// ends, updates after the norm when clipping (at once without), each bucket's gather right after
// its update with overlap_param_gather_with_optimizer_step.
#include "epo/train/optimizer_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace epo::train {
namespace {

using K = OptimizerOpKind;

OptimizerOp op(K kind, int unit = kUnbucketed, bool waits = false) {
    return OptimizerOp{.kind = kind, .unit = unit, .waits_for_reduction = waits};
}

TEST(OptimizerSchedule, ClippedStepGathersEachBucketRightAfterItsUpdate) {
    const std::vector<OptimizerOp> ops = optimizer_ops(OptimizerShape{.num_buckets = 3,
                                                                      .has_unbucketed = true,
                                                                      .buckets_reduced = true,
                                                                      .clip = true,
                                                                      .gather_each_bucket = true});
    const std::vector<OptimizerOp> expected = {
        op(K::kSquares),          op(K::kSquares, 0, true), op(K::kSquares, 1, true),
        op(K::kSquares, 2, true), op(K::kGradNorm),         op(K::kUpdate, 2),
        op(K::kGather, 2),        op(K::kUpdate, 1),        op(K::kGather, 1),
        op(K::kUpdate, 0),        op(K::kGather, 0),        op(K::kUpdate)};
    EXPECT_EQ(ops, expected);
    // Every gather is issued before the optimizer's last update: it runs under optimizer work.
    const auto last_update = std::find_if(
        ops.rbegin(), ops.rend(), [](const OptimizerOp& o) { return o.kind == K::kUpdate; });
    for (auto it = ops.begin(); it != ops.end(); ++it) {
        if (it->kind == K::kGather) {
            EXPECT_LT(it - ops.begin(), ops.rend() - last_update - 1) << op_name(*it);
            EXPECT_EQ(stream_of(*it), schedule::StreamId::kComm);
        }
    }
    EXPECT_EQ(op_name(ops[6]), "bucket2.param_gather");
    EXPECT_EQ(op_name(ops[7]), "optimizer_step.update.bucket1");
    EXPECT_EQ(op_name(ops[0]), "optimizer_step.squares.unbucketed");
}

// With two copies of the word embedding (stages with MTP or tied embeddings) their sum comes
// after the reduction and before any squares, in and out of bucketed overlap.
TEST(OptimizerSchedule, EmbeddingGradsAreSummedAfterTheReductionAndBeforeAnySquares) {
    for (bool bucketed : {false, true}) {
        const std::vector<OptimizerOp> ops = optimizer_ops(OptimizerShape{
            .num_buckets = bucketed ? 2 : 0, .buckets_reduced = bucketed, .embedding_grads = true});
        const auto sum = std::find(ops.begin(), ops.end(), op(K::kEmbeddingGrads));
        ASSERT_NE(sum, ops.end());
        EXPECT_EQ(sum - ops.begin(), bucketed ? 0 : 1);
        if (!bucketed) {
            EXPECT_EQ(ops[0], op(K::kReduce));
        }
        EXPECT_EQ(sum[1], op(K::kSquares));
        EXPECT_EQ(op_name(*sum), "optimizer_step.embedding_grads");
        EXPECT_EQ(stream_of(*sum), schedule::StreamId::kCompute);
    }
    const std::vector<OptimizerOp> none = optimizer_ops(OptimizerShape{});
    EXPECT_EQ(std::count(none.begin(), none.end(), op(K::kEmbeddingGrads)), 0);
}

// Without the flag the updates are the same (any order gives the same bits) and no gather is
// issued: the next forward gathers, or the step ends with all of them (gather_at_end).
TEST(OptimizerSchedule, WithoutTheFlagNoBucketIsGatheredByTheStep) {
    for (bool at_end : {false, true}) {
        const std::vector<OptimizerOp> ops = optimizer_ops(
            OptimizerShape{.num_buckets = 2, .buckets_reduced = true, .gather_at_end = at_end});
        EXPECT_EQ(std::count_if(ops.begin(), ops.end(),
                                [](const OptimizerOp& o) { return o.kind == K::kGather; }),
                  0);
        EXPECT_EQ(ops.back() == op(K::kGatherAll), at_end);
        EXPECT_EQ(ops[3], op(K::kGradNorm));
    }
}

// Without clipping nothing waits for the norm: each unit is updated (and gathered) as soon as its
// squares are taken, in the order the reductions end, and the norm comes last.
TEST(OptimizerSchedule, UnclippedUpdatesFollowTheirReductions) {
    const std::vector<OptimizerOp> ops = optimizer_ops(OptimizerShape{.num_buckets = 2,
                                                                      .has_unbucketed = false,
                                                                      .buckets_reduced = true,
                                                                      .clip = false,
                                                                      .gather_each_bucket = true});
    const std::vector<OptimizerOp> expected = {
        op(K::kSquares, 0, true), op(K::kUpdate, 0), op(K::kGather, 0), op(K::kSquares, 1, true),
        op(K::kUpdate, 1),        op(K::kGather, 1), op(K::kGradNorm)};
    EXPECT_EQ(ops, expected);
}

// Gradients not reduced in the schedule: the step reduces them first, and no squares wait.
TEST(OptimizerSchedule, UnbucketedReductionComesFirst) {
    const std::vector<OptimizerOp> ops = optimizer_ops(OptimizerShape{.gather_at_end = true});
    const std::vector<OptimizerOp> expected = {op(K::kReduce), op(K::kSquares), op(K::kGradNorm),
                                               op(K::kUpdate), op(K::kGatherAll)};
    EXPECT_EQ(ops, expected);
}

}  // namespace
}  // namespace epo::train
