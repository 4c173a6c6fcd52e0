// The work of one layer's compute calls for the cost model (cost_model.h has the formulas): the
// forward products, element-wise bytes and TP / CP collectives of a call under Megatron-Core's
// layout (TP, SP, CP, ETP, MLA, MTP), what recompute runs again before its backward, and the
// share of its launches CUDA graphs replace. cost_model.cpp derives the backward and the times.
//
// Letters as in cost_model.h: T tokens of a micro-batch, Tc = T / CP, Ts = Tc / TP with sequence
// parallelism (else Tc), H hidden, R routed rows.
#pragma once

#include <vector>

#include "epo/comm/link_model.h"
#include "epo/plan/cost_model.h"

namespace epo::plan {

// The forward work of a compute node; the backward is derived from it (scale_for_phase).
struct ForwardWork {
    std::vector<Gemm> weight_gemms;  // with a weight: counted again for the weight gradient
    std::vector<Gemm> act_gemms;     // activation x activation (core attention)
    double elementwise_bytes = 0;
    // TP collectives of a (T / CP, H) tensor in the compute dtype: an all-gather or a
    // reduce-scatter each with sequence parallelism; without it a pair is one all-reduce.
    double tp_collectives = 0;
    // Of those, the forward's all-gathers of activations (in the compute dtype in the epo
    // runtime too; its reductions and every backward collective move fp32: tp_reduce_bytes).
    double tp_gathers = 0;
    // The vocabulary-parallel cross-entropy's collectives of per-token figures (the maxima, the
    // sums of exponentials, the label's logit: fp32), bytes this rank sends, forward only.
    double tp_loss_bytes = 0;
    double tp_loss_collectives = 0;
    double cp_bytes = 0;  // CP: the other CP ranks' keys and values this rank receives
};

// Ts: the tokens a rank routes and normalizes.
double sharded_tokens(const PlanModel& m);
// The bytes a micro-batch's routed rows of `row_bytes` move, by link (ETP's gather included).
comm::ByteCounts routed_bytes(const PlanModel& m, double row_bytes);
// The expert load imbalance of a layer (1 for dense layers and whole-model calls).
double imbalance_at(const PlanModel& m, int layer);
// How many equal chunks a MoE layer's dispatch/mlp/combine call is one of (1 for a whole call).
double chunk_share(const PlanModel& m, const schedule::NodeCall& call);

ForwardWork forward_work(const PlanModel& m, const schedule::NodeCall& call);
// The forward work the backward of `call` runs again first (model.recompute_*).
ForwardWork recompute_work(const PlanModel& m, const schedule::NodeCall& call);
// The share of a compute call's launches its CUDA graphs cover.
double graphed_share(const PlanModel& m, const schedule::NodeCall& call);

}  // namespace epo::plan
