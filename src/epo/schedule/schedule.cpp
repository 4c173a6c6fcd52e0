#include "epo/schedule/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "epo/schedule/pipeline_schedule.h"

namespace epo::schedule {

StreamId stream_of(NodeKind node) {
    return node == NodeKind::kDispatch || node == NodeKind::kCombine ||
                   node == NodeKind::kGradReduce || node == NodeKind::kParamGather ||
                   is_pipeline_transfer(node)
               ? StreamId::kComm
               : StreamId::kCompute;
}

const char* node_name(NodeKind node) {
    switch (node) {
        case NodeKind::kEmbedding:
            return "embedding";
        case NodeKind::kPreDispatch:
            return "pre_dispatch";
        case NodeKind::kDispatch:
            return "dispatch";
        case NodeKind::kMlp:
            return "mlp";
        case NodeKind::kCombine:
            return "combine";
        case NodeKind::kOutput:
            return "output";
        case NodeKind::kGradReduce:
            return "grad_reduce";
        case NodeKind::kParamGather:
            return "param_gather";
        case NodeKind::kSendForward:
            return "send_forward";
        case NodeKind::kRecvForward:
            return "recv_forward";
        case NodeKind::kSendBackward:
            return "send_backward";
        case NodeKind::kRecvBackward:
            return "recv_backward";
        case NodeKind::kSharedExpert:
            return "shared_expert";
    }
    return "?";
}

const char* phase_name(Phase phase) {
    switch (phase) {
        case Phase::kForward:
            return "forward";
        case Phase::kBackward:
            return "backward";
        case Phase::kBackwardDw:
            return "backward_dw";
        case Phase::kRecompute:
            return "recompute";
    }
    return "?";
}

std::string call_name(const NodeCall& c) {
    if (c.stage >= 0) {
        NodeCall plain = c;
        plain.stage = plain.chunk = -1;
        return fmt::format("stage{}.chunk{}.{}", c.stage, c.chunk, call_name(plain));
    }
    if (is_pipeline_transfer(c.node)) {
        return fmt::format("mb{}.x{}.{}", c.micro_batch, c.layer, node_name(c.node));
    }
    if (c.node == NodeKind::kGradReduce || c.node == NodeKind::kParamGather) {
        return fmt::format("mb{}.bucket{}.{}", c.micro_batch, c.layer, node_name(c.node));
    }
    if (c.layer < 0) {
        return fmt::format("mb{}.{}.{}", c.micro_batch, node_name(c.node), phase_name(c.phase));
    }
    if (c.moe_chunk >= 0) {
        return fmt::format("mb{}.layer{}.{}.{}.chunk{}", c.micro_batch, c.layer, node_name(c.node),
                           phase_name(c.phase), c.moe_chunk);
    }
    return fmt::format("mb{}.layer{}.{}.{}", c.micro_batch, c.layer, node_name(c.node),
                       phase_name(c.phase));
}

int num_moe_chunks(const std::vector<NodeCall>& calls) {
    int n = 1;
    for (const NodeCall& c : calls)
        n = std::max(n, c.moe_chunk + 1);
    return n;
}

double overlap_speedup_cap(int num_micro_batches, int num_moe_chunks, bool pair_edges) {
    if (pair_edges && num_micro_batches >= 2)
        return 2.0;
    const double nc = static_cast<double>(num_micro_batches) * num_moe_chunks;
    return nc > 0 ? 2.0 * nc / (nc + 1.0) : 0.0;
}

namespace {

// The single-stage schedules are the emitter's P = V = 1 case (pipeline_schedule.h); their calls
// name no stage.
std::vector<NodeCall> one_stage(const ScheduleShape& shape, bool overlap) {
    if (shape.num_moe_chunks < 1) {
        throw std::invalid_argument(fmt::format(
            "num_moe_chunks {} must be at least 1 (1: whole micro-batches)", shape.num_moe_chunks));
    }
    if (shape.num_micro_batches <= 0)
        return {};
    PipelineShape p{.num_micro_batches = shape.num_micro_batches,
                    .moe_layers = shape.moe_layers,
                    .overlap = overlap,
                    .delay_wgrad = overlap && shape.delay_wgrad,
                    .num_moe_chunks = shape.num_moe_chunks,
                    .pair_edges = overlap && shape.pair_edges,
                    .recompute_first = shape.recompute_first,
                    .shared_expert_overlap = shape.shared_expert_overlap};
    if (!shape.grad_bucket_ends.empty())
        p.stage_grad_bucket_ends = {shape.grad_bucket_ends};
    if (!shape.param_bucket_ends.empty())
        p.stage_param_bucket_ends = {shape.param_bucket_ends};
    std::vector<NodeCall> calls = std::move(pipeline_schedules(p)[0]);
    for (NodeCall& c : calls)
        c.stage = c.chunk = -1;
    return calls;
}

}  // namespace

std::vector<NodeCall> baseline_schedule(const ScheduleShape& shape) {
    return one_stage(shape, false);
}

std::vector<NodeCall> overlap_schedule(const ScheduleShape& shape) {
    return one_stage(shape, true);
}

}  // namespace epo::schedule
