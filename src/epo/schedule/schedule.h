// The two schedules (docs/design.md "Schedules") as data: the exact list of node calls one
// optimizer step issues, in issue order, each naming its micro-batch, layer, node, phase and
// stream. The executor (executor.h) walks the list; tests/schedule/schedule_test.cpp checks the
// order written out below; the critical-path bound (critical_path.h) replays it with measured
// durations.
//
//   baseline  for each micro-batch: embedding, every layer's forward nodes, output layer and
//             loss, their backward in reverse (weight gradients right after each dgrad)
//   overlap   (combined 1F1B, PP = 1) forward of micro-batch 0 alone; N-1 combined steps, each
//             the forward of i+1 with the backward of i, layer j paired with layer L-1-j in the
//             ten-step order below; the backward of the last micro-batch alone (with pair_edges:
//             the first two forwards together, N-2 combined steps, the last two backwards
//             together; "Paired edges" below)
//
// Pair order (f = forward micro-batch, b = backward micro-batch):
//    1 b.combine.backward   2 f.pre_dispatch.forward   3 b.mlp.backward   4 f.dispatch.forward
//    5 b.mlp.backward_dw    6 b.dispatch.backward      7 f.mlp.forward    8 f.combine.forward
//    9 b.pre_dispatch.backward                          10 b.pre_dispatch.backward_dw
// Steps 5 and 10 exist only with delay_wgrad_compute (otherwise the weight gradients are part of
// steps 3 and 9); step 10 of the backward's last layer (layer 0) runs after the whole chunk. A
// delayed weight gradient runs off its micro-batch's chain (runs_off_chain): step 6 waits for
// step 3, not 5, so the dispatch backward's all-to-all runs while the expert wgrad computes, and
// the next layer's step 1 waits for step 9, not 10 (the reference runs backward_dw outside its
// nodes' event chain, to the same end).
// Dense layers have no dispatch/combine nodes: those steps are skipped.
//
// Gradient reduction (ddp.overlap_grad_reduce): the data-parallel all-reduce of a bucket of
// gradients is a comm-stream call of the last micro-batch's backward, issued once the backward
// has finished every parameter of the bucket (a gradient is complete only in that last
// backward, which both schedules run alone). It goes behind the comm call that the backward
// issues next, if that comes immediately (so it never delays it), and fills the comm stream's
// gap while the next compute node runs. Nothing of the micro-batch waits for it; the optimizer
// step waits for the whole comm stream. Both schedules issue the same buckets in the same order
// with the same collective, so gradients stay bit-identical.
//
// Parameter gather (distributed optimizer with ddp.overlap_param_gather): the optimizer step
// leaves each rank only its own shard of the updated weights; the next step's first forward
// (micro-batch 0) gathers them bucket by bucket on the comm stream, as the reference's forward
// pre-hooks do. A gather is a prefetch: it waits for nothing of its micro-batch, only for the
// comm stream's earlier calls, and the first forward call of the bucket's lowest position
// (embedding, a layer's pre_dispatch, the output layer) waits for it through the bucket's own
// event. The embedding's bucket (and layer 0's, when that is a different one) is issued first;
// the bucket starting at layer l+1 (or the output layer) is issued right after layer l's
// dispatch, so it fills the comm stream's gap while layer l's experts run (after layer l's
// pre_dispatch for a dense layer, which has no dispatch). With
// optimizer.overlap_param_gather_with_optimizer_step the optimizer step issues the gathers
// instead (train/optimizer_schedule.h) and the schedule holds none (param_bucket_ends empty).
//
// Paired edges (pair_edges, N >= 2): the combined schedule leaves the step's first forward and
// last backward alone, with nothing to hide their communication under. Paired, the first two
// forwards run together, layer by layer (a = micro-batch 0, b = 1; a's dispatch runs under b's
// attention, b's under a's experts, a's combine under b's experts, b's under a's next attention):
//   a.pre_dispatch a.dispatch [gather] b.pre_dispatch b.dispatch a.mlp a.combine b.mlp b.combine
//   ... a.output.forward a.output.backward b.output.forward
// then N - 2 combined steps (forward i + 2 with backward i), then the last two backwards
// together (a = N - 2, b = N - 1):
//   b.output.backward a.combine b.combine a.mlp a.dispatch b.mlp b.dispatch [reduce]
//   a.pre_dispatch b.pre_dispatch
// (each backward, weight gradients included: nothing is delayed there). Paired, the next
// phase's first backward has ended its forward a whole phase earlier, so each phase runs that
// micro-batch's output backward (the loss gradient) itself: the forward pair runs a's between
// a's and b's output forward, a combined step (forward i + 2, backward i) runs i + 1's right
// before step 9 of its last pair (i's last attention backward), and the next phase starts at
// its first combine backward. Both places are waits of the compute stream for a call in
// flight (b's last combine; i's last dispatch), and the next phase's first combine backward is
// queued on the comm stream right behind this phase's last combine, to run under the attention
// backward and output forward that end the phase instead of after them (unpaired there is no
// such micro-batch: the next backward's forward is the one that ends the step). a comes before
// b at every node, so weight gradients still accumulate in micro-batch order (bit-identical to
// the baseline). The forward pair ends with two whole forwards' activations held, and from N = 3 on
// a combined step holds i, i + 1 and i + 2: three micro-batches in flight instead of two (about 2x
// the baseline's peak activations against 1.4-1.5x unpaired). Micro-batch 0 still gathers
// the parameters (b's first use follows a's on the compute stream) and b, the last backward,
// reduces the gradient buckets: behind a MoE layer's two dispatches, not in front of them as
// alone (the pair leaves the comm stream no gap; behind the last layer's dispatches a reduction
// runs under the attention backward and delays no all-to-all).
//
// Full recompute (recompute_first): a recomputed layer's forward keeps only the group's input (the
// hand-off tensor x[first]); right before the backward of a group's last layer, its unit runs the
// forward nodes of the whole group again, layer by layer, as Phase::kRecompute calls (comm nodes
// on the comm stream, MoE chunks as in the unit's forward), and then the layers' backward nodes
// as without recompute. In a combined step the recompute calls come before step 1 of the pair:
// the recompute's dispatch is exposed (its compute stream waits for it), its combine runs while
// step 2 (the forward micro-batch's pre_dispatch) computes. Paired backwards recompute a and b
// layer by layer as paired forwards run. The recompute calls do the forward's arithmetic on the
// same inputs with the same routing (the expert bias changes only at step end), so gradients stay
// bit-identical.
//
// Shared-expert overlap (shared_expert_overlap, baseline schedules only: the reference's rule
// makes it exclusive with EP overlap): a MoE layer's shared expert leaves pre_dispatch and
// becomes a compute-stream call of its own, issued right after the call whose all-to-all it
// hides, as Megatron-Core launches it on its shared-expert stream:
//   forward   pre_dispatch dispatch shared_expert mlp combine
//   backward  combine shared_expert mlp dispatch pre_dispatch
// (with MoE chunks, after chunk 0's dispatch / combine backward; in a full recompute as in the
// forward). It runs beside that call (runs_beside_previous): it needs only what the call needs
// (the norm's output n2; the layer output's gradient), so it computes while the all-to-all is in
// flight, and the mlp after it waits for the all-to-all as before. Its backward computes the
// shared expert's input gradient (into the block's dx, which pre_dispatch's backward completes
// with the same sums in the same order) and its weight gradient: the bits of the run without it.
//
// MoE chunks (num_moe_chunks = C > 1, docs/chunked-overlap.md): a MoE layer's dispatch, mlp
// and combine run once per chunk of the micro-batch (a group of the local experts; the schedule
// does not care what a chunk holds) (NodeCall::moe_chunk = c); the other nodes stay whole
// (moe_chunk = -1). Each (micro-batch, chunk) is its own dependency
// chain; a whole call joins them (it waits for every chunk and every chunk waits for it). Where a
// micro-batch runs alone (the baseline's reference order aside), a layer's chunks are a pipeline:
//   forward   d0 d1 ... d(C-1) | m0 c0 | m1 c1 | ... | m(C-1) c(C-1)   (d dispatch, m mlp,
//   backward  c0 c1 ... c(C-1) | m0 d0 | m1 d1 | ... | m(C-1) d(C-1)    c combine; backwards)
// so every chunk's incoming communication is issued before chunk 0's compute and runs under the
// compute of the chunks before it, and chunk c's outgoing one under the compute after it (an
// outgoing call between two incoming ones would hold the second until a compute ends). The
// baseline runs chunk by chunk (d0 m0 c0 d1 m1 c1 ...: nothing overlaps, the reference order;
// finalization runs a baseline's MoE layers whole, W014, so only the tests list this one);
// the combined step keeps the ten-step pair order with each chunked step expanded into its C
// chunks in order. Every chunk order is ascending, so the weight gradients of a parameter
// accumulate in the same order in both schedules (bit-identical). C = 1 gives exactly the lists
// above (every call whole).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace epo::schedule {

enum class NodeKind {
    kEmbedding,
    kPreDispatch,
    kDispatch,
    kMlp,
    kCombine,
    kOutput,
    kGradReduce,
    kParamGather,
    // Pipeline point-to-point transfers (pipeline_schedule.h), on the comm stream: the
    // activations x[layer] to the next stage / from the previous one, and their gradients
    // dx[layer] back.
    kSendForward,
    kRecvForward,
    kSendBackward,
    kRecvBackward,
    // Shared-expert overlap (ScheduleShape::shared_expert_overlap, "Shared-expert overlap"
    // above): a MoE layer's shared expert as a compute-stream node of its own, right after the
    // dispatch (forward, recompute) and the combine backward (backward).
    kSharedExpert
};
// kRecompute: a forward node run again in the backward of a fully recomputed layer
// (ScheduleShape::recompute_first), to rebuild the activations its forward did not keep.
enum class Phase { kForward, kBackward, kBackwardDw, kRecompute };
enum class StreamId { kCompute, kComm };

struct NodeCall {
    int micro_batch = 0;
    int layer = -1;  // -1 for embedding and output; the bucket number for kGradReduce and
                     // kParamGather
    NodeKind node = NodeKind::kEmbedding;
    Phase phase = Phase::kForward;
    // kBackward of a node whose weight gradients are delayed computes input gradients only.
    bool wgrad_delayed = false;
    // The parameter bucket whose gather this call waits for (the first forward use of the
    // bucket's weights in the step); -1: none.
    int wait_bucket = -1;
    // Pipeline parallelism (pipeline_schedule.h): the stage issuing the call and the model chunk
    // it belongs to; -1 outside a pipeline schedule.
    int stage = -1;
    int chunk = -1;
    // The chunk of the micro-batch a MoE layer's dispatch/mlp/combine runs on, 0..C-1
    // (ScheduleShape::num_moe_chunks); -1: the whole micro-batch (every other call, and every
    // call when C = 1).
    int moe_chunk = -1;

    bool operator==(const NodeCall&) const = default;
};

// Which stream a node runs on (docs/design.md "A layer is four nodes"): dispatch, combine,
// gradient reduction, parameter gather and the pipeline's transfers on the comm stream.
StreamId stream_of(NodeKind node);
// A side branch of its micro-batch (gradient reduction, parameter gather): the micro-batch's
// next call does not wait for it.
inline bool is_side_branch(NodeKind node) {
    return node == NodeKind::kGradReduce || node == NodeKind::kParamGather;
}
// A call off its micro-batch's chain: it waits for the chain like any call, but records nothing on
// it, so the micro-batch's next call does not wait for it. The side branches, and a delayed
// weight gradient (Phase::kBackwardDw): only the weight gradients read its result, and what reads
// them waits for it otherwise (a gradient reduction for its micro-batch's delayed weight
// gradients, executor.h; the optimizer step for the whole compute stream).
inline bool runs_off_chain(const NodeCall& call) {
    return is_side_branch(call.node) || call.phase == Phase::kBackwardDw;
}
// Whether a call waits for its micro-batch's previous call: every call but a parameter gather,
// which is a prefetch.
inline bool waits_for_micro_batch(NodeKind node) {
    return node != NodeKind::kParamGather;
}
// A call that runs beside its micro-batch's previous call (the shared expert beside the
// dispatch or the combine backward): it waits for what that call waits for, not for the call
// itself, and records nothing, so the two run at once on their two streams; the micro-batch's
// next call on its stream follows it in stream order (executor.h).
inline bool runs_beside_previous(NodeKind node) {
    return node == NodeKind::kSharedExpert;
}
inline bool is_pipeline_transfer(NodeKind node) {
    return node == NodeKind::kSendForward || node == NodeKind::kRecvForward ||
           node == NodeKind::kSendBackward || node == NodeKind::kRecvBackward;
}
const char* node_name(NodeKind node);  // "pre_dispatch", ...
const char* phase_name(Phase phase);   // "forward", "backward", "backward_dw", "recompute"
// "mb3.layer1.mlp.backward" style names for traces and logs ("mb3.layer1.mlp.backward.chunk1"
// for a MoE chunk); "mb7.bucket0.grad_reduce" for a gradient bucket's reduction,
// "mb0.bucket3.param_gather" for a parameter bucket's gather. A call of a pipeline schedule
// carries its stage and model chunk in front: "stage1.chunk0.mb3.layer5.mlp.forward".
std::string call_name(const NodeCall& call);

struct ScheduleShape {
    int num_micro_batches = 1;
    std::vector<bool> moe_layers;  // one entry per layer: true = MoE (has dispatch/combine)
    bool delay_wgrad = false;      // overlap schedule only
    // Gradient buckets reduced during the last micro-batch's backward, in firing order: bucket
    // b closes at model position grad_bucket_ends[b], after that position's backward. Positions:
    // L = the output layer and final norm, 0..L-1 the layers, -1 the embedding; the list runs
    // down from L and its last entry is -1. Empty: gradients are reduced by the optimizer step.
    std::vector<int> grad_bucket_ends;
    // Parameter buckets gathered during micro-batch 0's forward (same format; the reference uses
    // the gradient buckets). Empty: no gather in the schedule.
    std::vector<int> param_bucket_ends;
    // C: chunks of each micro-batch in a MoE layer's dispatch/mlp/combine
    // (model.moe_ep_overlap_num_chunks); 1: whole micro-batches.
    int num_moe_chunks = 1;
    // Overlap schedule only: run the first two forwards together and the last two backwards
    // together instead of the first forward and the last backward alone (header; field
    // model.moe_ep_overlap_pair_edges). No effect with one micro-batch.
    bool pair_edges = false;
    // Full recompute (model.recompute_granularity=full, "Full recompute" above): [L] the first
    // layer of the recompute group layer l belongs to, -1 for a layer that keeps its activations;
    // empty: none recomputed. A group is a run of consecutive layers of one model chunk.
    std::vector<int> recompute_first;
    // Baseline only (model.moe_shared_expert_overlap; EP overlap excludes it, rule EP011): every
    // MoE layer's shared expert is a kSharedExpert call ("Shared-expert overlap" above).
    bool shared_expert_overlap = false;
};

// The number of MoE chunks a list of calls uses: 1 + the largest moe_chunk (at least 1).
int num_moe_chunks(const std::vector<NodeCall>& calls);

// The theoretical cap of the overlap schedule's speedup over the baseline for N micro-batches
// and C MoE chunks, at comm = compute with every combined step fully overlapped:
//   cap = 2 N C / (N C + 1)
// A micro-batch's compute P (forward + backward) and communication Q = P take 2P in the
// baseline. The overlap schedule runs N - 1 combined steps of P each (the communication hidden)
// and the unpaired first forward and last backward; there a C-chunk pipeline exposes only its
// fill and drain, Q / C of the communication. Total N P + P / C. C = 1: 2N / (N + 1).
// With pair_edges and N >= 2 every phase pairs two micro-batches: cap 2 (each pair's last
// communication call is exposed, a share that falls with the number of layers).
double overlap_speedup_cap(int num_micro_batches, int num_moe_chunks, bool pair_edges = false);

// Model positions in backward order: the output layer (L), layers L-1 down to 0, embedding (-1).
inline constexpr int kEmbeddingPosition = -1;

std::vector<NodeCall> baseline_schedule(const ScheduleShape& shape);
std::vector<NodeCall> overlap_schedule(const ScheduleShape& shape);

}  // namespace epo::schedule
