// The router: gate linear, scores, top-k selection, routing weights and the auxiliary losses,
// with its backward split into input gradients (dgrad) and weight gradients (wgrad).
//
//   logits = x W_r^T                 [T, E] f32 (compute-dtype operands; with router_fp32 the
//                                    input widened to f32 and the fp32 master weight)
//   softmax, pre_softmax=false: choose top-k of the logits; p = softmax over the k chosen logits
//   softmax, pre_softmax=true:  s = softmax(logits); choose top-k of s; p = the chosen s
//   sigmoid: s = sigmoid(logits); choose top-k of s + expert_bias (the bias only chooses);
//            p = chosen s / (sum of chosen s + 1e-20) when K > 1, else the chosen s
//   group-limited (num_groups > 0): a group's score is the sum of its best topk / group_topk
//            selection values; keep the best group_topk groups, choose top-k inside them
//   p *= moe_router_topk_scaling_factor when set
// Top-k order: descending value, ties to the lower expert index; this order is also the k order
// the combine sums in.
//
// Losses, per micro-batch of N tokens (sequence b = tokens [b*L, (b+1)*L), L = N / B):
//   aux_loss     = coeff * E / (K * N^2) * sum_e (sum_t s_aux[t,e]) * c[e]
//   seq_aux_loss = coeff * mean_b [ E / (K * L^2) * sum_e (sum_{t in b} s_aux[t,e]) * c_b[e] ]
//   z_loss       = z_coeff / N * sum_t (logsumexp_e logits[t,e])^2
// (router_forward takes B, the model's micro_batch_size; aux_loss ignores it and pools the
// micro-batch, as the reference does.)
// s_aux = softmax of all logits (softmax router) or sigmoid / (its per-token sum + 1e-20)
// (sigmoid router); c counts the tokens whose plain top-k of s_aux (no bias, no groups, before
// capacity drops) includes e. The gradient flows through s_aux only, scaled by the caller's
// loss_grad_scale (the factor the language-model loss gradient carries).
//
// Sequence parallelism (a `sequence_group` of n ranks given to router_forward): the micro-batch's
// N = n T tokens are split over the group, rank r routing rows [r T, (r + 1) T) of them (the TP
// group's sequence shards, model/tensor_parallel.h). As Megatron-Core's router does over its
// tp_cp group: c (c_b) counts the whole micro-batch's tokens (each rank's counts all-gathered over
// the group and summed in group-rank order: integers, so exact and the same on every rank), N and
// L are the whole micro-batch's, and the sums over t run over this rank's rows only. So each
// rank's aux_loss and z_loss are its share (Megatron-Core's z_coeff / n times the mean over the
// rank's rows is z_coeff / N times their sum) and the shares sum to the micro-batch's losses over
// the group; so do the router weight's gradients, which the TP group sums. Without a group
// (n = 1) N = T. routed_counts stay this rank's (the expert-bias update sums them).

#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "epo/moe/moe_config.h"
#include "epo/tensor/arena.h"
#include "epo/tensor/param.h"

namespace epo::comm {
class Communicator;
}  // namespace epo::comm

namespace epo::moe {

struct RouterParams {
    Param weight;        // [E, H] "router.weight"
    Tensor expert_bias;  // [E] f32 "router.expert_bias" when enabled (updated by
                         // update_expert_bias, not by gradients); undefined otherwise
};

// One micro-batch's routing, kept until its backward (and wgrad) ran. Tensors live in the arena
// given to router_forward.
struct RouterOutput {
    Tensor x;            // [T, H] the input in router_dtype (a view of the caller's input, or
                         // its f32 copy for an fp32 router; kept until wgrad)
    Tensor logits;       // [T, E] f32
    Tensor scores;       // [T, E] f32: softmax of the logits (softmax) or sigmoid (sigmoid)
    Tensor lse;          // [T] f32 logsumexp of the logits (when the z-loss is on)
    Tensor topk_index;   // [T, K] i32, best first
    Tensor topk_prob;    // [T, K] f32 routing weights before the scaling factor
    Tensor topk_weight;  // [T, K] f32 p: the weights the experts apply
    std::vector<std::int64_t> routed_counts;  // [E] tokens routed to each expert (before drops)
    std::vector<std::int64_t> aux_counts;     // [B, E] c_b[e] for the load-balancing loss (over
                                              // the whole micro-batch)
    std::int64_t num_sequences = 1;           // B (of the whole micro-batch)
    std::int64_t total_tokens = 0;            // N: T, or n T over a sequence group
    std::int64_t row_begin = 0;               // this rank's first row among the N
    float aux_loss = 0.0f;                    // aux_loss or seq_aux_loss (0 when off); with a
                                              // sequence group, this rank's share
    float z_loss = 0.0f;                      // ... likewise
    Tensor dlogits;                           // [T, E] f32, from router_backward_dgrad
    Tensor dlogits_c;                         // [T, E] in router_dtype (the GEMM operand)
};

RouterParams make_router_params(const MoeConfig& cfg);

// x [T, H]: this rank's rows of a micro-batch of `num_sequences` sequences. `sequence_group`
// (null or of size 1: the micro-batch is all here) is the group whose ranks hold the other rows
// (above); with the load-balancing loss on, router_forward is collective over it (an all-gather
// of the counts, on the caller's stream's communicator, bounded by its deadline).
RouterOutput router_forward(const MoeConfig& cfg, const RouterParams& params, const Tensor& x,
                            std::int64_t num_sequences, Arena& arena,
                            comm::Communicator* sequence_group = nullptr);

// dlogits from dweight ([T, K] f32, dL/dp; zero for dropped slots) and the loss gradients;
// then dx_acc ([T, H] f32) += dlogits W_r. The two halves below, for callers that fuse the
// second into a pass of their own over the rows of dx.
void router_backward_dgrad(const MoeConfig& cfg, const RouterParams& params, const Tensor& dweight,
                           float loss_grad_scale, RouterOutput& out, const Tensor& dx_acc,
                           Arena& arena);
// out.dlogits and out.dlogits_c from dweight and the loss gradients.
void router_backward_dlogits(const MoeConfig& cfg, const RouterParams& params,
                             const Tensor& dweight, float loss_grad_scale, RouterOutput& out,
                             Arena& arena);
// acc[0, H) += dlogits_c[t] W_r: token t's row of dlogits W_r (kernels::add_combination_row, so
// in a fixed order), added to the row it is given.
void router_dx_add_row(const MoeConfig& cfg, const RouterParams& params, const RouterOutput& out,
                       std::int64_t t, float* acc);

// weight.main_grad += dlogits^T x (straight into main_grad with gradient_accumulation_fusion,
// else into a temporary from `arena` that is then added).
void router_backward_wgrad(const MoeConfig& cfg, RouterParams& params, const RouterOutput& out,
                           Arena& arena);

// The reference's expert-bias rule, run once per optimizer step with the step's token counts
// (summed over micro-batches and data-parallel ranks):
//   expert_bias[e] += rate * sign(mean(tokens_per_expert) - tokens_per_expert[e])
void update_expert_bias(const Tensor& expert_bias, std::span<const std::int64_t> tokens_per_expert,
                        double rate);

// Indices of the k largest of v[0..n), best first, ties to the lower index.
void topk_indices(const float* v, std::int64_t n, std::int64_t k, std::int32_t* out);

}  // namespace epo::moe
