// The memory one rank of a run needs, from the run's step plan: config/memory_estimate.h's
// formulas applied to what the rank's pipeline stage holds and to what its schedule keeps alive,
// so that a pipeline stage counts its own layers and the micro-batches its call list holds (a
// pipeline's first stage holds more in its warm-up than a one-stage schedule).
//
//   parameters   the stage's positions (param_sizes_at: what GptModel allocates), fp32 master +
//                compute copy, fp32 gradients, packed expert weights
//   optimizer    Adam's moments, divided by the plan's DP (dense) and EDP = world / (ETP EP PP)
//                (experts) when the optimizer is distributed
//   activations  the peak over the stage's call list of the units alive: a (micro-batch, model
//                chunk) unit holds its chunk's layers' activations, the output state if its
//                chunk holds the output position (and the MTP's tensors, model/mtp.h, if it
//                holds the MTP layer), and the two gradient hand-offs, from its first model
//                call to its last (with full recompute, a recomputed group's input and the
//                largest group's activations: config::layers_activation_bytes) (a received
//                activation waiting for its unit's first node, one (T, H) tensor, is left out)
//   scratch, runtime  as config/memory_estimate.h
#pragma once

#include <cstdint>

#include "epo/config/config.h"
#include "epo/config/memory_estimate.h"
#include "epo/model/gpt_model.h"
#include "epo/train/step_plan.h"

namespace epo::train {

// One rank of stage shape.pipeline_rank, running `plan` (make_step_plan(cfg, shape)).
config::MemoryEstimate estimate_stage_memory(const config::Config& cfg, const StepPlan& plan,
                                             const model::GptShape& shape);

// The largest estimate over the stages (a host may run any of them), for the finalized `cfg`
// with its topology stated. Raises Error(kConfig) as make_step_plan does.
config::MemoryEstimate estimate_run_memory(const config::Config& cfg);

}  // namespace epo::train
