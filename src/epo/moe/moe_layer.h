// The MoE layer on one rank, plain and unfused: router -> dispatch preprocess -> permute ->
// experts -> combine (+ shared expert), and the backward in the reverse order, split into dgrad
// and wgrad. It is the reference the MoE block (moe_block.h, what the model and the benchmarks
// run) is tested against, and what `epo moe-layer --dump` writes.
//
// The layer is a list of phase calls (router.h, dispatch.h, experts.h); each phase is also
// callable on its own, which is how the expert-parallel runtime inserts its all-to-alls between
// permute and the experts. Weights live in MoeLayerParams (shared by every micro-batch);
// everything a backward needs lives in the MoeContext the caller owns, one per micro-batch in
// flight, so two micro-batches can be between forward and backward through the same weights.
//
//   forward   y = combine(experts(permute(x)), shared(x)),  losses = router aux + z losses
//   backward  dx = permute^T(experts_dgrad(combine^T(dy))) + router_dgrad + shared_dgrad
//             (summed in f32 in that order, then rounded to the activation dtype)
//   wgrad     router, experts and shared-expert weight gradients into main_grad
//
// Letters: T tokens, H hidden, E experts, K top-k, F expert FFN, S shared FFN, Rp padded rows.
#pragma once

#include <cstdint>
#include <vector>

#include "epo/moe/dispatch.h"
#include "epo/moe/experts.h"
#include "epo/moe/moe_config.h"
#include "epo/moe/router.h"

namespace epo::moe {

struct MoeLayerParams {
    RouterParams router;
    ExpertWeights experts;
    SharedExpertWeights shared;  // undefined Params when shared_expert_size == 0
};

MoeLayerParams make_moe_layer_params(const MoeConfig& cfg);
// Every weight's master ~ N(0, init_std) from a counter-based stream of `seed` (one stream per
// weight, independent of the others' sizes); expert bias 0; compute copies refreshed.
void init_moe_layer_params(MoeLayerParams& params, std::uint64_t seed, float init_std);
// The trainable weights, in a fixed order (router, experts fc1, fc2, shared fc1, fc2).
std::vector<Param*> moe_layer_param_list(MoeLayerParams& params);

// Seconds each phase took in the last forward / backward of a context (steady_clock; for
// benchmarks and traces).
struct MoePhaseTimes {
    double shared_fwd = 0, router_fwd = 0, dispatch_fwd = 0, experts_fwd = 0, combine_fwd = 0;
    double combine_bwd = 0, experts_dgrad = 0, permute_bwd = 0, router_dgrad = 0, shared_dgrad = 0;
    double experts_wgrad = 0, router_wgrad = 0, shared_wgrad = 0;

    // Router, dispatch preprocess, permutation and unpermutation (combine), both directions.
    double routing() const {
        return router_fwd + dispatch_fwd + combine_fwd + combine_bwd + permute_bwd + router_dgrad +
               router_wgrad;
    }
    double total() const {
        return routing() + shared_fwd + experts_fwd + experts_dgrad + shared_dgrad + experts_wgrad +
               shared_wgrad;
    }
};

// One micro-batch's state between its forward and its wgrad. Reused across steps: forward resets
// its arena, so a steady-state step allocates nothing new.
struct MoeContext {
    Arena arena{"moe_layer"};
    RouterOutput router;
    DispatchPlan plan;
    ExpertSegments segments;
    Tensor x_perm;      // [Rp, H]
    Tensor probs_perm;  // [Rp] f32
    Tensor y_perm;      // [Rp, H]
    ExpertsContext experts;
    ExpertsContext shared;
    Tensor shared_out;   // [T, H] f32 (when a shared expert is configured)
    Tensor dy_perm;      // [Rp, H]
    Tensor dx_perm;      // [Rp, H]
    Tensor dprobs_perm;  // [Rp] f32
    Tensor dweight;      // [T, K] f32
    Tensor dx_acc;       // [T, H] f32
    MoePhaseTimes times;
};

struct MoeLosses {
    float aux_loss = 0.0f;  // aux_loss or seq_aux_loss (not part of the language-model loss)
    float z_loss = 0.0f;
};

// x, y: [T, H] in the compute dtype. num_sequences: how many sequences the T tokens hold (for
// seq_aux_loss; tokens of sequence b are rows b*T/B .. (b+1)*T/B - 1).
MoeLosses moe_forward(const MoeConfig& cfg, const MoeLayerParams& params, const Tensor& x,
                      std::int64_t num_sequences, MoeContext& ctx, const Tensor& y);

// dy, dx: [T, H] compute dtype. loss_grad_scale multiplies the aux/z-loss gradients (the factor
// the language-model loss gradient carries, e.g. 1 / number of micro-batches).
void moe_backward_dgrad(const MoeConfig& cfg, const MoeLayerParams& params, const Tensor& dy,
                        float loss_grad_scale, MoeContext& ctx, const Tensor& dx);
void moe_backward_wgrad(const MoeConfig& cfg, MoeLayerParams& params, MoeContext& ctx);
// moe_backward_dgrad, then moe_backward_wgrad.
void moe_backward(const MoeConfig& cfg, MoeLayerParams& params, const Tensor& dy,
                  float loss_grad_scale, MoeContext& ctx, const Tensor& dx);

}  // namespace epo::moe
