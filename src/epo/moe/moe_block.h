// One MoE block (router, shared expert, token dispatcher, this rank's experts) split into the
// nodes of the overlap schedule (docs/design.md "A layer is four nodes"), written once against
// the TokenDispatcher interface. The model's MoE layers, the multi-rank MoE tests and the
// benchmarks all run these functions; the plain single-rank layer (moe_layer.h) is the reference
// they are compared with.
//
//   pre_dispatch  shared expert, router, dispatch_preprocess                  (compute stream)
//   dispatch      token_dispatch: counts, then rows and weights                   (comm stream)
//   mlp           dispatch_postprocess, experts, combine_preprocess             (compute stream)
//   combine       token_combine, combine_postprocess (+ shared expert)            (comm stream)
// backward, in reverse:
//   combine       combine_postprocess_backward, token_combine_backward            (comm stream)
//   mlp           combine_preprocess_backward, experts dgrad, dispatch_postprocess_backward
//   dispatch      token_dispatch_backward                                         (comm stream)
//   pre_dispatch  dx = unpermuted row gradients + the router's term (+ the shared expert's)
//   backward_dw   mlp: expert wgrad; pre_dispatch: router and shared-expert wgrad
//
// dx is one pass over the tokens: a token's row gradients are summed and the router's term added
// in its row of dx (f32), instead of three passes over the (T, H) f32 buffer. The bits are those
// of the separate steps in the same order (the reference layer's), which the tests check.
//
// A node reads the block's weights and writes only its MoeBlockState (one per micro-batch), so
// several micro-batches can be between forward and backward through the same weights.
//
// Letters: T tokens of the micro-batch on this rank, H hidden, K top-k.
#pragma once

#include <cstdint>
#include <memory>

#include "epo/comm/communicator.h"
#include "epo/moe/experts.h"
#include "epo/moe/moe_layer.h"
#include "epo/moe/router.h"
#include "epo/moe/token_dispatcher.h"

namespace epo::moe {

// What a node of the block reads: its configuration, weights and dispatcher.
struct MoeBlock {
    const MoeConfig& cfg;
    MoeLayerParams& params;  // router, this rank's experts, shared expert
    const TokenDispatcher& dispatcher;
};

// One micro-batch through one block, from its forward until its last backward.
struct MoeBlockState {
    RouterOutput router;
    std::unique_ptr<DispatchState> dispatch;  // the dispatcher's handle
    ExpertsContext experts;
    ExpertsContext shared;
    Tensor shared_out;  // (T, H) f32, with a shared expert
    Tensor dy;          // (T, H) compute dtype: the output gradient, kept for the shared expert
};

// x (T, H) compute dtype; `num_sequences` sequences of T / num_sequences tokens (seq_aux_loss).
// The state's buffers come from `arena` (the micro-batch's, kept until its backward).
void block_pre_dispatch_forward(const MoeBlock& b, const Tensor& x, std::int64_t num_sequences,
                                MoeBlockState& st, Arena& arena);
void block_dispatch_forward(const MoeBlock& b, const DispatchComms& comms, MoeBlockState& st,
                            Arena& arena);
void block_mlp_forward(const MoeBlock& b, MoeBlockState& st, Arena& arena);
// y (T, H) f32 = the routed experts' weighted sum (+ shared expert).
void block_combine_forward(const MoeBlock& b, const DispatchComms& comms, MoeBlockState& st,
                           const Tensor& y);

// dy (T, H) compute dtype: gradient of the block output (kept in the state until the
// pre_dispatch backward).
void block_combine_backward(const MoeBlock& b, const DispatchComms& comms, const Tensor& dy,
                            MoeBlockState& st, Arena& arena);
void block_mlp_backward(const MoeBlock& b, MoeBlockState& st, Arena& arena);
void block_mlp_backward_dw(const MoeBlock& b, MoeBlockState& st, Arena& scratch);
void block_dispatch_backward(const MoeBlock& b, const DispatchComms& comms, MoeBlockState& st);
// dx (T, H) f32 = gradient of the block input (overwritten). loss_grad_scale multiplies the
// aux/z-loss gradients (1 / number of micro-batches).
void block_pre_dispatch_backward(const MoeBlock& b, float loss_grad_scale, MoeBlockState& st,
                                 const Tensor& dx, Arena& arena, Arena& scratch);
void block_pre_dispatch_backward_dw(const MoeBlock& b, MoeBlockState& st, Arena& scratch);

}  // namespace epo::moe
