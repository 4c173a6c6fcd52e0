// Every schedule as data, from one emitter (emitter.cpp): for each of P stages the exact list of
// node calls one optimizer step issues, plus the point-to-point transfers that move activations
// x[p] (T, H) f32 forward to the next stage and their gradients dx[p] back. The single-stage
// schedules of schedule.h are the P = V = 1 case.
//
// Layers: stage s's model chunk c holds a contiguous range of layers; by default the L layers are
// cut into P x V blocks of L / (P V) and chunk c of stage s holds block c P + s; an explicit
// layout (PipelineShape::layout, from config/pipeline_layout.h: uneven first / last stages,
// Megatron's layout string) gives each range instead. Ranges are consecutive in (chunk, stage)
// order. The embedding is part of stage 0's chunk 0, the output layer (final norm, output layer,
// loss) of stage P-1's chunk V-1. With V > 1 the chunks form a ring: stage P-1's chunk c feeds
// stage 0's chunk c+1.
//
// Units and steps. A unit is one micro-batch through one model chunk. Per stage, the interleaved
// 1F1B order of units: forward unit k (k = 0 .. M V - 1, M micro-batches) is chunk (k / P) mod V of
// micro-batch (k / (P V)) P + k mod P, backward unit k the same with chunk V-1 - (k / P) mod V.
// Stage s runs W_s forward units alone (warm-up), then M V - W_s steps that are each forward unit
// W_s + i and backward unit i (steady state), then the remaining backward units alone
// (cool-down), with
//   W_s = P - s - 1                           (V = 1)
//   W_s = M V                                 (V > 1, M = P: every forward first)
//   W_s = 2 (P - s - 1) + (V - 1) P           (V > 1 otherwise)
// plus one with `overlap` (the combined step needs a backward that is already possible while the
// forward runs) and one more with `pair_edges`, capped at M V. For P = V = 1: the baseline runs
// each micro-batch's forward and backward in turn, the overlap schedule is combined 1F1B (the
// first forward alone, N - 1 combined steps, the last backward alone).
//
// A step runs in one of three ways (emitter.cpp writes out each order):
//   alone     one unit's forward or backward; a MoE layer's chunks as a pipeline (schedule.h
//             "MoE chunks") with `overlap`, chunk by chunk without
//   combined  (overlap) a forward unit with a backward unit, the layers paired first-with-last in
//             schedule.h's ten-step pair order, so one unit's dispatch / combine runs under the
//             other's compute; uneven chunks pair what they have and run the rest of the longer
//             one in the same order
//   paired    (overlap and pair_edges) two forward units, or two backward units, of the same
//             model chunk run together node by node (schedule.h "Paired edges"): the warm-up's
//             forwards two by two from the first, the cool-down's backwards two by two up to the
//             last; a unit with no partner of its chunk runs alone
// With pair_edges, the loss gradient (the output position's backward) of a stage's next backward
// unit runs as early as its forward allows: in the step before, right before that step's last
// attention backward (schedule.h).
//
// Buckets (stage_grad_bucket_ends, stage_param_bucket_ends): per stage, its own positions in
// backward order. The gradient of a model chunk's parameters is complete at the chunk's last
// backward unit (micro-batch M - 1); those units close the stage's buckets and issue their
// reductions on the comm stream (schedule.h "Gradient reduction"), in every way a step runs.
// Micro-batch 0's forward units gather the parameter buckets (schedule.h "Parameter gather").
//
// Transfers: a unit that needs another stage's output starts with kRecvForward / kRecvBackward and
// the producing unit ends with kSendForward / kSendBackward (layer = the hand-off position p on
// both sides). Why explicit calls and not part of the first / last node of a chunk: they run on
// the comm stream (compute continues while the bytes travel, the reference's overlap_p2p_comm),
// and their order, which must match on the two ends, is visible and testable in the lists. A
// reduction a unit issues goes behind its send, never in front of it.
//
// Deadlock freedom: a transfer is one operation of two ranks, and each rank's streams run their
// calls in list order. The lists are built together, by emitting the stages' steps in one global
// order (tick by tick, each stage its next step once its inputs were sent in an earlier tick) and
// appending a transfer to the sender's and the receiver's lists at the same moment. Every rank's
// list is then a projection of one total order in which each call comes after everything it
// waits for, so the earliest unfinished call can always run: no cycle of waits exists.
#pragma once

#include <vector>

#include "epo/schedule/schedule.h"

namespace epo::schedule {

// Layers [first, end) of one model chunk of one stage.
struct ChunkLayers {
    int first = 0;
    int end = 0;
    bool operator==(const ChunkLayers&) const = default;
};

struct PipelineShape {
    int num_stages = 1;            // P
    int num_chunks = 1;            // V (virtual pipeline size)
    int num_micro_batches = 1;     // M
    std::vector<bool> moe_layers;  // [L] true = MoE (has dispatch / combine)
    bool overlap = false;          // combined steady-state steps
    bool delay_wgrad = false;      // overlap only, as in schedule.h
    int num_moe_chunks = 1;        // C, as ScheduleShape::num_moe_chunks
    bool pair_edges = false;       // overlap only, as ScheduleShape::pair_edges
    // As ScheduleShape::recompute_first ([L], empty: none); a group lies within one model chunk.
    std::vector<int> recompute_first;
    // As ScheduleShape::shared_expert_overlap; refused with `overlap` (the combined and paired
    // steps have no place for it: the reference's rule, EP011).
    bool shared_expert_overlap = false;
    // [stage][chunk] the layers each model chunk holds; empty: the even split.
    std::vector<std::vector<ChunkLayers>> layout;
    // [stage] bucket ends in ScheduleShape's format over the stage's own positions (descending,
    // ending at the stage's lowest position); empty or an empty entry: none on that stage.
    std::vector<std::vector<int>> stage_grad_bucket_ends;
    std::vector<std::vector<int>> stage_param_bucket_ends;
};

// Raises std::invalid_argument naming the value when the shape cannot be scheduled: L not a
// multiple of P V (even split) or a layout that does not cover the layers consecutively, V > 1
// with M not a multiple of P, sizes below 1, bucket ends that are not a stage's positions in
// backward order.
void check_pipeline_shape(const PipelineShape& shape);

// Layers [first, end) of chunk `chunk` on stage `stage`.
ChunkLayers chunk_layers(const PipelineShape& shape, int stage, int chunk);
// Which stage / chunk holds layer l; the embedding (-1) is stage 0 chunk 0, the output position
// (L) stage P-1 chunk V-1.
int stage_of_position(const PipelineShape& shape, int position);
int chunk_of_position(const PipelineShape& shape, int position);
// The positions stage `stage` holds, in backward order (the output position L first on the last
// stage, the embedding -1 last on stage 0): the order its buckets close in.
std::vector<int> stage_positions(const PipelineShape& shape, int stage);

// One (micro-batch, chunk) unit, and a step of a stage: a forward, a backward, or both.
struct PipelineUnit {
    int micro_batch = 0;
    int chunk = 0;
    bool operator==(const PipelineUnit&) const = default;
};
// A stage's step: one forward, one backward, both (combined), or, paired, two forwards or two
// backwards of the same model chunk (`second` the later micro-batch).
struct PipelineStep {
    bool has_forward = false, has_backward = false;
    PipelineUnit forward, backward;
    bool paired = false;
    PipelineUnit second;
};
int num_warmup_units(const PipelineShape& shape, int stage);
std::vector<PipelineStep> stage_steps(const PipelineShape& shape, int stage);

// Every stage's calls, [stage][call], in issue order.
std::vector<std::vector<NodeCall>> pipeline_schedules(const PipelineShape& shape);

// The ideal bubble fraction of the interleaved schedule: (P - 1) / (V M).
double ideal_bubble_fraction(const PipelineShape& shape);

}  // namespace epo::schedule
