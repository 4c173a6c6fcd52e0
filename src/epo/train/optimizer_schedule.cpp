#include "epo/train/optimizer_schedule.h"

#include <fmt/format.h>

namespace epo::train {

schedule::StreamId stream_of(const OptimizerOp& op) {
    return op.kind == OptimizerOpKind::kGather ? schedule::StreamId::kComm
                                               : schedule::StreamId::kCompute;
}

std::string op_name(const OptimizerOp& op) {
    const std::string unit =
        op.unit == kUnbucketed ? "unbucketed" : fmt::format("bucket{}", op.unit);
    switch (op.kind) {
        case OptimizerOpKind::kReduce:
            return "optimizer_step.reduce";
        case OptimizerOpKind::kEmbeddingGrads:
            return "optimizer_step.embedding_grads";
        case OptimizerOpKind::kSquares:
            return "optimizer_step.squares." + unit;
        case OptimizerOpKind::kGradNorm:
            return "optimizer_step.grad_norm";
        case OptimizerOpKind::kUpdate:
            return "optimizer_step.update." + unit;
        case OptimizerOpKind::kGather:
            return unit + ".param_gather";
        case OptimizerOpKind::kGatherAll:
            return "optimizer_step.param_gather";
    }
    return "optimizer_step";
}

std::vector<OptimizerOp> optimizer_ops(const OptimizerShape& s) {
    std::vector<OptimizerOp> ops;
    const auto update = [&](int unit) {
        ops.push_back({.kind = OptimizerOpKind::kUpdate, .unit = unit});
        if (s.gather_each_bucket && unit != kUnbucketed)
            ops.push_back({.kind = OptimizerOpKind::kGather, .unit = unit});
    };
    if (!s.buckets_reduced)
        ops.push_back({.kind = OptimizerOpKind::kReduce});
    if (s.embedding_grads)
        ops.push_back({.kind = OptimizerOpKind::kEmbeddingGrads});
    // Squares in the order the units become ready: the unbucketed unit when the backward ends,
    // each bucket when its reduction does.
    std::vector<int> ready;
    if (s.has_unbucketed)
        ready.push_back(kUnbucketed);
    for (int b = 0; b < s.num_buckets; ++b)
        ready.push_back(b);
    for (int unit : ready) {
        ops.push_back({.kind = OptimizerOpKind::kSquares,
                       .unit = unit,
                       .waits_for_reduction = s.buckets_reduced && unit != kUnbucketed});
        if (!s.clip)
            update(unit);
    }
    ops.push_back({.kind = OptimizerOpKind::kGradNorm});
    if (s.clip) {
        for (int b = s.num_buckets - 1; b >= 0; --b)
            update(b);
        if (s.has_unbucketed)
            update(kUnbucketed);
    }
    if (s.gather_at_end)
        ops.push_back({.kind = OptimizerOpKind::kGatherAll});
    return ops;
}

}  // namespace epo::train
