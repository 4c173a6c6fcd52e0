// The two schedules of runtime.md §4 as data: the exact list of node calls one optimizer step
// issues, in issue order, each naming its micro-batch, layer, node, phase and stream. The
// executor (executor.h) walks the list; tests check the order against the specification; the
// critical-path bound (critical_path.h) replays it with measured durations.
//
//   baseline  for each micro-batch: embedding, every layer's forward nodes, output layer and
//             loss, their backward in reverse (weight gradients right after each dgrad)
//   overlap   (combined 1F1B, PP = 1) forward of micro-batch 0 alone; N-1 combined steps, each
//             the forward of i+1 with the backward of i, layer j paired with layer L-1-j in the
//             ten-step order below; the backward of the last micro-batch alone
//
// Pair order (f = forward micro-batch, b = backward micro-batch):
//    1 b.combine.backward   2 f.pre_dispatch.forward   3 b.mlp.backward   4 f.dispatch.forward
//    5 b.mlp.backward_dw    6 b.dispatch.backward      7 f.mlp.forward    8 f.combine.forward
//    9 b.pre_dispatch.backward                          10 b.pre_dispatch.backward_dw
// Steps 5 and 10 exist only with delay_wgrad_compute (otherwise the weight gradients are part of
// steps 3 and 9); step 10 of the backward's last layer (layer 0) runs after the whole chunk.
// Dense layers have no dispatch/combine nodes: those steps are skipped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace epo::schedule {

enum class NodeKind { kEmbedding, kPreDispatch, kDispatch, kMlp, kCombine, kOutput };
enum class Phase { kForward, kBackward, kBackwardDw };
enum class StreamId { kCompute, kComm };

struct NodeCall {
    int micro_batch = 0;
    int layer = -1;  // -1 for embedding and output
    NodeKind node = NodeKind::kEmbedding;
    Phase phase = Phase::kForward;
    // kBackward of a node whose weight gradients are delayed computes input gradients only.
    bool wgrad_delayed = false;

    bool operator==(const NodeCall&) const = default;
};

// Which stream a node runs on (runtime.md §3): dispatch and combine on the comm stream.
StreamId stream_of(NodeKind node);
const char* node_name(NodeKind node);  // "pre_dispatch", ...
const char* phase_name(Phase phase);   // "forward", "backward", "backward_dw"
// "mb3.layer1.mlp.backward" style names for traces and logs.
std::string call_name(const NodeCall& call);

struct ScheduleShape {
    int num_micro_batches = 1;
    std::vector<bool> moe_layers;  // one entry per layer: true = MoE (has dispatch/combine)
    bool delay_wgrad = false;      // overlap schedule only
};

std::vector<NodeCall> baseline_schedule(const ScheduleShape& shape);
std::vector<NodeCall> overlap_schedule(const ScheduleShape& shape);

}  // namespace epo::schedule
