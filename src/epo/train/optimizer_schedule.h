// The optimizer step as data: its pieces (optimizer.h) in issue order, each on its stream, with
// what it waits for. A pure function of a few flags, like the step plan: the Trainer issues
// exactly this list, and tests/train/optimizer_schedule_test.cpp checks its order without MPI.
//
// A unit is the parameters of one gradient bucket (step_plan.h: reduced together in the last
// backward, gathered together), or kUnbucketed: the parameters no bucket holds (those without a
// data-parallel group, or every parameter when there are no buckets). The list, for B buckets:
//
//   reduce                 every gradient over its group, when the schedule reduces no bucket
//   embedding_grads        with two copies of the word embedding (stages with MTP or tied
//                          embeddings): their gradients summed over the embedding group, after
//                          every reduction (the schedule's included) and before any squares
//   squares(-1)            the unbucketed unit's sums of squares: ready when the backward ends
//   squares(b), b = 0..B-1 each waits only for its own bucket's reduction (the schedule's
//                          kGradReduce call), so the squares of the buckets reduced first run
//                          while the last buckets' reductions are still on the comm stream
//   grad_norm              the collectives of the global norm; the clip coefficient
//   update(u), gather(b)   AdamW on each unit's shards; with
//   overlap_param_gather_with_optimizer_step
//                          each bucket's all-gather is issued on the comm stream right after its
//                          update, waits only for it, and runs while the optimizer goes on with
//                          the next unit
//   gather_all             the distributed optimizer's gathers of every weight, at the end (neither
//                          overlap_param_gather nor the optimizer-step overlap)
//
// Update order: the buckets in the order the next forward reads them (the embedding's, the last
// to be reduced, first), then the unbucketed unit, so that the gathers the next forward needs
// first start first, and the last gathers run under the largest update that needs none. Without
// clipping (clip_grad = 0) no update needs the norm: each unit's update (and gather) follows its
// squares at once, in reduction order, and the norm comes last.
//
// Why the updates wait for the norm when clipping: Adam's moments are not linear in the
// gradient (v takes its square), so an update made before the clip coefficient is known cannot
// be corrected afterwards without changing bits; only the squares can run early.
#pragma once

#include <string>
#include <vector>

#include "epo/schedule/schedule.h"

namespace epo::train {

inline constexpr int kUnbucketed = -1;

enum class OptimizerOpKind {
    kReduce,
    kEmbeddingGrads,
    kSquares,
    kGradNorm,
    kUpdate,
    kGather,
    kGatherAll
};

struct OptimizerOp {
    OptimizerOpKind kind = OptimizerOpKind::kSquares;
    int unit = kUnbucketed;  // the bucket, or kUnbucketed (kReduce, kGradNorm, kGatherAll: -1)
    // kSquares of a bucket the schedule reduced: waits for that reduction's event.
    bool waits_for_reduction = false;

    bool operator==(const OptimizerOp&) const = default;
};

struct OptimizerShape {
    int num_buckets = 0;              // StepPlan::buckets
    bool has_unbucketed = true;       // some parameter is in no bucket
    bool buckets_reduced = false;     // StepPlan::reduce_in_buckets
    bool clip = true;                 // optimizer.clip_grad > 0
    bool gather_each_bucket = false;  // optimizer.overlap_param_gather_with_optimizer_step
    bool gather_at_end = false;       // distributed, gathers overlapped nowhere
    bool embedding_grads = false;     // this rank holds a copy of a shared word embedding
};

// kGather and kGatherAll run on the comm / compute stream respectively; every other op on compute.
schedule::StreamId stream_of(const OptimizerOp& op);
// "optimizer_step.update.bucket2", "optimizer_step.squares.unbucketed", "optimizer_step.grad_norm"
// for traces; a gather is "bucket2.param_gather" (a parameter gather like the schedule's).
std::string op_name(const OptimizerOp& op);

std::vector<OptimizerOp> optimizer_ops(const OptimizerShape& shape);

}  // namespace epo::train
