// The optimizer step of one rank, after every node of the step ran: gradient reduction over the
// data-parallel groups (dense over all ranks, experts over the ranks holding the same experts),
// the global gradient norm, clipping, AdamW on fp32 masters, fresh compute copies and, with the
// distributed optimizer, the gathers of the updated weights. What it deliberately does not do:
// issue nodes, read data, update expert biases (expert_bias_update.h) or reduce losses.
//
// With the distributed optimizer (ddp.use_distributed_optimizer, ZeRO-1 as in Megatron-Core)
// every parameter's elements are split into one shard per rank of its data-parallel group
// (communicator.h's shard_of): gradients are reduce-scattered instead of all-reduced, each rank
// keeps Adam moments and updates masters for its shard only, and the updated compute copies are
// all-gathered: at the end of the optimizer step, or, with ddp.overlap_param_gather, bucket by
// bucket on the comm stream during the next step's first forward (params_pending), or, with
// optimizer.overlap_param_gather_with_optimizer_step, bucket by bucket on the comm stream right
// after each bucket's update, under the rest of the optimizer step (optimizer_schedule.h). The
// sums, the norm and the updates are the same operations on the same values, so the distributed
// optimizer is bit-for-bit the plain one (docs/design.md).
//
// The step comes in pieces (square_grads, finish_grad_norm, update_params) that work on any
// subset of the parameters: element-wise work gives the same bits whatever the grouping, and the
// norm adds its terms in one fixed order whatever order the squares were taken in.
//
// Tensor parallelism (TP > 1): before the data-parallel sum the TP group sums the gradients of
// the dense parameters each TP rank holds whole but computes from its own share of the work
// (GptModel::tp_summed_params: q/k norms, and under sequence parallelism the norms, the router
// and the shared expert), as Megatron-Core's finalize_model_grads does; the experts (ETP 1) are
// whole on their EP rank and need no TP sum.
//
// Global norm, written out (g = gradient / DP after the data-parallel sum):
//   norm^2 = sum over replicated dense params and shards of sum(g^2)     (identical on every rank)
//          + sum over TP ranks t of (sum over t's sharded dense params and shards of sum(g^2))
//          + sum over EP ranks r of (sum over r's expert params and shards of sum(g^2))
// (at TP 1 every dense parameter counts as replicated), each TP rank's and EP rank's total added
// in rank order, as Megatron-Core counts a TP-duplicated parameter once and a sharded one per rank.
// each (parameter, shard) sum taken by scale_and_sum_squares, the terms added in (parameter,
// shard) order and the EP ranks' totals in rank order, so every layout gets the same bits.
// With pipeline parallelism each stage holds some parameters: every (parameter, shard) term is
// put at its place in the whole model's parameter order (norm_slots), the stages' terms are
// gathered over the pipeline group, and the sum runs over the whole model in that order, as at
// PP = 1 (the other stages' places hold exact zeros, which change no bit).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "epo/comm/process_groups.h"
#include "epo/config/config.h"
#include "epo/tensor/param.h"
#include "epo/train/adam.h"
#include "epo/train/lr_schedule.h"

namespace epo::train {

// Sum over the group of one double per rank, added in group-rank order (exact and identical on
// every rank): the norm's expert term here, the step's loss reductions in the Trainer.
double group_sum(comm::Communicator& c, double local);

// The optimizer's settings, translated once from the configuration's sections.
struct OptimizerConfig {
    AdamConfig adam;  // adam.lr is replaced by the scheduled rate each step
    LrScheduleConfig lr;
    double clip_grad = 1.0;  // <= 0: no clipping
    bool use_distributed_optimizer = false;
    bool overlap_param_gather = false;
    // optimizer.overlap_param_gather_with_optimizer_step: each bucket's gather follows its update.
    bool overlap_param_gather_with_optimizer_step = false;
};
OptimizerConfig optimizer_config_from(const config::Config& cfg);

// Parameters, their shards and Adam moments. params[i] with i >= num_dense is an expert
// parameter: its data-parallel group is edp, the others' dp.
struct OptimizerState {
    std::vector<Param*> params;  // dense, then expert
    size_t num_dense = 0;
    // The elements this rank updates: its shard when the optimizer is distributed over a group
    // of 2 or more, else all of them.
    std::vector<comm::ShardRange> shard;
    std::vector<std::vector<float>> exp_avg, exp_avg_sq;  // [param](shard size) Adam m, v
    bool distributed = false;           // distributed optimizer over a group of 2 or more
    bool param_gather_overlap = false;  // gathers run in the next step's first forward
    bool params_pending = false;        // compute copies wait for that gather
    // This step's sums of squares of the averaged gradients (square_grads): [param](group size),
    // entry r for shard r; the distributed optimizer fills only its own shard's entry.
    std::vector<std::vector<double>> grad_squares;
    // The smallest parameter index whose sum of squares is not finite this step (params.size():
    // none).
    size_t first_nonfinite = 0;
    int dp_size = 1;  // the gradients' averaging divisor
    // Pipeline parallelism: params[i]'s index in the whole model's dense (i < num_dense) or
    // expert parameter order, and the sizes of those orders. Empty: one stage holds everything.
    // -1: not in the norm (the last stage's embedding copy, whose gradient equals stage 0's
    // embedding's after sum_embedding_grads: the reference counts a shared weight once).
    std::vector<int> norm_slots;
    int num_model_dense = 0, num_model_expert = 0;
    // Tensor parallelism (set_tensor_parallel; empty at TP 1): the dense parameters whose
    // gradients the TP group sums (ascending addresses), and per parameter index whether every TP
    // rank holds the same values (counted once in the norm) or its own shard (summed over TP).
    std::vector<const Param*> tp_summed;
    std::vector<bool> tp_replicated;

    bool tp_summed_param(const Param* p) const;

    comm::Communicator& group_of(size_t i, comm::ProcessGroups& groups) const {
        return i >= num_dense ? groups.edp : groups.dp;
    }
};

// Shards and zero moments for `dense` then `expert` parameters. `groups` gives each group's size
// and this rank's place in it (no communication).
OptimizerState make_optimizer_state(const std::vector<Param*>& dense,
                                    const std::vector<Param*>& expert,
                                    const comm::ProcessGroups& groups,
                                    const OptimizerConfig& config);

// Tensor parallelism: `summed` and `replicated` are GptModel::tp_summed_params() and
// tp_replicated_params() (dense parameters of `state`). Nothing changes when both are empty.
void set_tensor_parallel(OptimizerState& state, const std::vector<Param*>& summed,
                         const std::vector<Param*>& replicated);

// Sums the gradients of the tp_summed parameters among `dense` over groups.tp (an all-reduce,
// fp32 in group-rank order: the same bits on every TP rank), then sums gradients over the
// data-parallel ranks: dense over dp, experts over edp. One blocking
// collective per parameter, whichever stream runs it, so the sums are the same with and without
// bucketed overlap: an all-reduce, or with the distributed optimizer a reduce-scatter, which sums
// this rank's shard exactly as the all-reduce does.
void reduce_grads(const OptimizerState& state, const std::vector<Param*>& dense,
                  const std::vector<Param*>& expert, comm::ProcessGroups& groups);

// The embedding group's sum, as the reference's _allreduce_word_embedding_grads: the gradient of
// params[i], a copy of the word embedding (model/gpt_model.h GptShape::has_embedding_copies), after
// its data-parallel reduction (this rank's shard of it with the distributed optimizer, which is
// the other copy's rank's shard too: the stages have the same DP layout), summed with the other
// copy's over groups.embedding. A sum of two terms in group-rank order on both ranks, so both
// copies get the same gradient bits and, from the same values and Adam state, the same updates.
void sum_embedding_grads(const OptimizerState& state, size_t i, comm::ProcessGroups& groups);

// Distributed optimizer: the compute copies of `dense` / `expert` gathered from every shard.
void gather_params(const std::vector<Param*>& dense, const std::vector<Param*>& expert,
                   comm::ProcessGroups& groups);

struct OptimizerStepResult {
    double grad_norm = 0;  // before clipping
    double learning_rate = 0;
    // When grad_norm is not finite: this rank's first parameter whose gradient holds a NaN or an
    // Inf ("" when none does), found before the gradients are cleared.
    std::string first_nonfinite_grad;
};

// The optimizer step in pieces, so that each piece can run as soon as its data is ready
// (optimizer_schedule.h orders them): a piece takes the indices into state.params it works on.
//
// Averages the gradients of `params` (g /= DP) and takes the sums of squares of the elements
// this rank reduced, one per (parameter, shard) as the norm formula above adds them; notes a
// parameter whose sum is not finite (first_nonfinite_grad). Reads only gradients already reduced.
void square_grads(OptimizerState& state, const std::vector<size_t>& params,
                  comm::ProcessGroups& groups);
// The global norm (header formula) from the squares of every parameter, which square_grads must
// have taken this step: the distributed optimizer's shards' sums gathered over each group, the
// stages' over the pipeline group, the EP ranks' expert totals added in rank order. Collective.
// `result` gets the norm and, when it is not finite, this rank's first parameter with a NaN or an
// Inf in its gradient.
void finish_grad_norm(OptimizerState& state, comm::ProcessGroups& groups,
                      OptimizerStepResult& result);
// AdamW on the shards of `params` with the gradient scaled by `clip` (clip_coefficient; 1 when no
// clipping applies), the gradients zeroed for the next step, the shards' compute copies refreshed
// (with the distributed optimizer the other shards' copies wait for a gather).
void update_params(OptimizerState& state, const AdamConfig& adam, int64_t step, double clip,
                   const std::vector<size_t>& params);

// Whole masters and compute copies on every rank (a pending gather done first). Collective over
// the groups; a no-op without the distributed optimizer.
void sync_params(OptimizerState& state, const std::vector<Param*>& dense,
                 const std::vector<Param*>& expert, comm::ProcessGroups& groups);

// Whole-tensor Adam moments (the second one when `second`) for a checkpoint: every shard
// gathered. Collective over the groups.
std::vector<std::vector<float>> full_moments(const OptimizerState& state, bool second,
                                             comm::ProcessGroups& groups);

}  // namespace epo::train
