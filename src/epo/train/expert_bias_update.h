// The router's expert-bias update after a step (aux-loss-free load balancing, router.h's
// update_expert_bias): each MoE layer's token counts per expert summed over every data-parallel
// rank, in rank order, then the bias nudged towards balance. Not part of the optimizer's AdamW:
// the bias has no gradient. What it deliberately doesn't do: read or touch any gradient.
#pragma once

#include "epo/comm/communicator.h"
#include "epo/model/gpt_model.h"

namespace epo::train {

// For every MoE layer whose router has an expert bias (moe.enable_expert_bias): the step's
// routed counts (GptModel::layer_stats) all-gathered over `dp`, summed, and applied. Collective
// over `dp` once per such layer, in layer order.
void update_expert_biases(model::GptModel& model, comm::Communicator& dp);

}  // namespace epo::train
