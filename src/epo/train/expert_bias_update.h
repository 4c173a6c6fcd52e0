// The router's expert-bias update after a step (aux-loss-free load balancing, router.h's
// update_expert_bias): each MoE layer's token counts per expert summed over the ranks that routed
// the step's tokens (under sequence parallelism the TP group's ranks, each its rows, then every
// data-parallel rank, in rank order, as Megatron-Core's all-reduce over TP x CP x DP), then the
// bias nudged towards balance. Not part of the optimizer's AdamW: the bias has no gradient. What
// it deliberately doesn't do: read or touch any gradient.
#pragma once

#include "epo/comm/communicator.h"
#include "epo/model/gpt_model.h"

namespace epo::train {

// For every MoE layer whose router has an expert bias (moe.enable_expert_bias): the step's
// routed counts (GptModel::layer_stats) all-gathered and summed over `tp` when the model runs
// sequence parallel (without it every TP rank routed every token: its counts are the TP group's),
// then over `dp`, and applied. The sums are of integers, so exact: every rank of the TP and DP
// groups applies the same counts and keeps the same bias bits. Collective over `tp` (under
// sequence parallelism) and `dp` once per such layer, in layer order.
void update_expert_biases(model::GptModel& model, comm::Communicator& tp, comm::Communicator& dp);

}  // namespace epo::train
