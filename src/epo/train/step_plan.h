// What one optimizer step does, as data, before anything runs: the schedule shape, the node calls
// in issue order (baseline, or the combined-1F1B overlap schedule), and the buckets the
// data-parallel gradient reduction (ddp.overlap_grad_reduce) and the distributed optimizer's
// parameter gather (ddp.overlap_param_gather; with
// optimizer.overlap_param_gather_with_optimizer_step the optimizer step gathers them,
// train/optimizer_schedule.h) fire in. A pure function of the finalized configuration and the model
// shape: no MPI, no model, no memory beyond the plan itself, so a planner can build the plan of any
// recipe on a laptop, and the Trainer runs exactly that plan.
//
// Buckets (grad_buckets.h): like Megatron-Core's DDP buckets, a bucket collects the gradients of
// whole model positions in the order the backward finishes them (the output layer and final
// norm = position L, layers L-1 down to 0, the embedding = -1) until it holds at least
// ddp.bucket_size bytes of fp32 gradient; the last bucket ends at the embedding. Only parameters
// that have a group to reduce over count: dense ones when DP > 1, expert ones when the expert
// data-parallel size (EDP) > 1. One bucket list serves both the gradient reduction and the
// parameter gather, as in the reference.
//
// Every plan comes from the one emitter of schedule/pipeline_schedule.h (PP = 1 is its one-stage
// case), with the model shape's pipeline layout (config/pipeline_layout.h). With PP > 1 the plan
// is that of the shape's stage (shape.pipeline_rank), with every stage's lists kept (stage_calls)
// so that any rank can check a call name of another stage; each stage's buckets collect its own
// positions in backward order, reduced by the last backward unit of each model chunk and gathered
// by micro-batch 0's forward units.
//
// Multi-token prediction: the MTP's transformer layer is the shape's last layer position, and its
// prologue's weights (with the decoder's final norm) are counted there (gpt_model.h params_at).
#pragma once

#include <cstdint>
#include <vector>

#include "epo/config/config.h"
#include "epo/model/gpt_model.h"
#include "epo/schedule/schedule.h"

namespace epo::train {

// The element counts of the parameters at one model position, in GptModel::params_at order.
struct PositionParamSizes {
    std::vector<int64_t> dense, expert;
};
// From the shape alone (what GptModel would allocate; tests/train/step_plan_test.cpp checks the
// two agree). `position` as in GptModel::params_at: -1 .. L.
PositionParamSizes param_sizes_at(const model::GptShape& shape, int position);

struct PlanBucket {
    std::vector<int> positions;  // model positions, descending (backward order)
    int64_t bytes = 0;           // fp32 gradient bytes of the parameters it reduces / gathers
};

struct StepPlan {
    bool overlap = false;  // the combined-1F1B schedule (model.overlap_moe_expert_parallel_comm)
    int dp_size = 1;       // data-parallel size: dense parameters' group
    int edp_size = 1;      // expert data-parallel size: expert parameters' group
    // Gradients reduced bucket by bucket in the last backward (else by the optimizer step).
    bool reduce_in_buckets = false;
    bool distributed_optimizer = false;  // ZeRO-1 over a group of 2 or more
    // Gathers overlapped: in the next step's first forward, or (param_gather_in_optimizer) under
    // the optimizer step.
    bool param_gather_overlap = false;
    // optimizer.overlap_param_gather_with_optimizer_step: each bucket's gather is issued by the
    // optimizer step right after the bucket's update (optimizer_schedule.h); the schedule then
    // holds no gathers.
    bool param_gather_in_optimizer = false;
    schedule::ScheduleShape shape;  // with grad_bucket_ends / param_bucket_ends as used
    std::vector<schedule::NodeCall> calls;
    int num_stages = 1;  // PP
    int num_chunks = 1;  // VPP (1 when unset)
    // PP > 1: every stage's calls, [stage][call]; calls is stage_calls[shape.pipeline_rank].
    std::vector<std::vector<schedule::NodeCall>> stage_calls;
    // Firing order; bucket b closes at buckets[b].positions.back(). Empty when neither bucketed
    // reduction nor overlapped gather is on.
    std::vector<PlanBucket> buckets;
};

// `cfg` finalized, with its topology stated (config::world_size > 0); `shape` the model shape
// (gpt_shape_from_config, with its pipeline fields; the EP rank does not matter). kConfig for a
// topology that leaves no whole data-parallel group, or a pipeline the schedules cannot split.
StepPlan make_step_plan(const config::Config& cfg, const model::GptShape& shape);

}  // namespace epo::train
