// Everything one rank's run needs, resolved once from the finalized configuration and the job's
// shape, before any MPI call or allocation: a pure function, so a refusal happens on every rank
// alike and a tool (epo plan, tests) can resolve any rank of any job on one machine. The Trainer
// takes it and derives nothing of its own; epo train and epo bench check its memory estimate
// before any rank allocates.
//
//   ranks         world size and rank; stages of world / PP consecutive ranks (pipeline
//                 outermost, comm/topology.h's order): the stage and the place inside it
//   model         the model shape of this rank's stage and EP rank, with the pipeline layout
//                 (config/pipeline_layout.h) every part of the run shares
//   step          the step plan (step_plan.h): schedule, group sizes, buckets
//   groups, comm  the process-group layout and the communicators' options
//   optimizer, data, memory (memory_plan.h, this rank's stage), the step's model FLOPs
#pragma once

#include <cstdint>

#include "epo/comm/communicator.h"
#include "epo/comm/topology.h"
#include "epo/config/config.h"
#include "epo/config/memory_estimate.h"
#include "epo/model/gpt_model.h"
#include "epo/train/dataset.h"
#include "epo/train/optimizer.h"
#include "epo/train/step_plan.h"

namespace epo::train {

struct RunPlan {
    config::Config cfg;  // finalized
    int world_size = 1;
    int world_rank = 0;
    int stage = 0;          // pipeline stage (0 without PP)
    int stage_size = 1;     // ranks per stage: world / PP
    int rank_in_stage = 0;  // the data-parallel place (the world rank without PP)
    int64_t num_micro_batches = 1;
    model::GptShape shape;
    StepPlan step;
    comm::ParallelLayout groups;
    comm::CommOptions comm;
    OptimizerConfig optimizer;
    DatasetConfig data;
    config::MemoryEstimate memory;
    double step_flops = 0;  // model FLOPs of one step over all ranks
};

// Raises Error(kConfig) when the configuration's topology is not `world_size` ranks, or the step
// plan cannot be made (make_step_plan's errors).
RunPlan resolve_run(const config::Config& cfg, int world_size, int world_rank);

}  // namespace epo::train
