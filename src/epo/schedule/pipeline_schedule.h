// Pipeline-parallel schedules (docs/pipeline.md) as data: for each of P stages the exact list of
// node calls one optimizer step issues, like schedule.h's lists for one stage, plus the
// point-to-point transfers that move activations x[p] (T, H) f32 forward to the next stage and
// their gradients dx[p] back.
//
// Layers: the L layers are cut into P x V contiguous blocks of L / (P V); chunk c of stage s holds
// block c P + s. The embedding is part of stage 0's chunk 0, the output layer (final norm, output
// layer, loss) of stage P-1's chunk V-1. With V > 1 the chunks form a ring: stage P-1's chunk c
// feeds stage 0's chunk c+1.
//
// Per stage, the interleaved 1F1B order of (micro-batch, chunk) units: forward unit k (k = 0 ..
// M V - 1, M micro-batches) is chunk (k / P) mod V of micro-batch (k / (P V)) P + k mod P, backward
// unit k the same with chunk V-1 - (k / P) mod V. Stage s runs W_s forward units alone (warm-up),
// then M V - W_s steps that are each forward unit W_s + i and backward unit i (steady state), then
// the remaining backward units alone (cool-down), with
//   W_s = P - s - 1                           (V = 1)
//   W_s = M V                                 (V > 1, M = P: every forward first)
//   W_s = 2 (P - s - 1) + (V - 1) P           (V > 1 otherwise)
// capped at M V, plus one with `overlap` (the combined step needs a backward that is already
// possible while the forward runs). For P = V = 1 the baseline is schedule.h's baseline order and
// the overlap schedule its combined 1F1B.
//
//   baseline  a steady step is the forward unit's calls, then the backward unit's
//   overlap   a steady step merges the two: the chunk's layers paired first-with-last in
//             schedule.h's ten-step pair order, so one unit's dispatch / combine runs under the
//             other's compute
//
// Transfers: a unit that needs another stage's output starts with kRecvForward / kRecvBackward and
// the producing unit ends with kSendForward / kSendBackward (layer = the hand-off position p on
// both sides). Why explicit calls and not part of the first / last node of a chunk: they run on
// the comm stream (compute continues while the bytes travel, the reference's overlap_p2p_comm),
// and their order, which must match on the two ends, is visible and testable in the lists.
//
// Deadlock freedom: a transfer is one operation of two ranks, and each rank's streams run their
// calls in list order. The lists are built together, by emitting the stages' steps in one global
// order (tick by tick, each stage its next step once its inputs were sent in an earlier tick) and
// appending a transfer to the sender's and the receiver's lists at the same moment. Every rank's
// list is then a projection of one total order in which each call comes after everything it
// waits for, so the earliest unfinished call can always run: no cycle of waits exists.
//
// What it deliberately doesn't do: bucketed gradient reduction or parameter gather inside the
// schedule (with P > 1 the optimizer step reduces and gathers), uneven first / last stages.
#pragma once

#include <vector>

#include "epo/schedule/schedule.h"

namespace epo::schedule {

struct PipelineShape {
    int num_stages = 1;            // P
    int num_chunks = 1;            // V (virtual pipeline size)
    int num_micro_batches = 1;     // M
    std::vector<bool> moe_layers;  // [L] true = MoE (has dispatch / combine)
    bool overlap = false;          // merged steady-state steps
    bool delay_wgrad = false;      // overlap only, as in schedule.h
};

// Raises std::invalid_argument naming the value when the shape cannot be scheduled: L not a
// multiple of P V, V > 1 with M not a multiple of P, sizes below 1.
void check_pipeline_shape(const PipelineShape& shape);

// Layers [first, end) of chunk `chunk` on stage `stage`.
struct ChunkLayers {
    int first = 0;
    int end = 0;
};
ChunkLayers chunk_layers(const PipelineShape& shape, int stage, int chunk);
// Which stage / chunk holds layer l; the embedding (-1) is stage 0 chunk 0, the output position
// (L) stage P-1 chunk V-1.
int stage_of_position(const PipelineShape& shape, int position);
int chunk_of_position(const PipelineShape& shape, int position);

// One (micro-batch, chunk) unit, and a step of a stage: a forward, a backward, or both.
struct PipelineUnit {
    int micro_batch = 0;
    int chunk = 0;
    bool operator==(const PipelineUnit&) const = default;
};
struct PipelineStep {
    bool has_forward = false, has_backward = false;
    PipelineUnit forward, backward;
};
int num_warmup_units(const PipelineShape& shape, int stage);
std::vector<PipelineStep> stage_steps(const PipelineShape& shape, int stage);

// Every stage's calls, [stage][call], in issue order.
std::vector<std::vector<NodeCall>> pipeline_schedules(const PipelineShape& shape);

// The ideal bubble fraction of the interleaved schedule: (P - 1) / (V M).
double ideal_bubble_fraction(const PipelineShape& shape);

}  // namespace epo::schedule
