// One MoE block (router, shared expert, token dispatcher, this rank's experts) split into the
// nodes of the overlap schedule (docs/design.md "A layer is four nodes"), written once against
// the TokenDispatcher interface. The model's MoE layers, the multi-rank MoE tests and the
// benchmarks all run these functions; the plain single-rank layer (moe_layer.h) is the reference
// they are compared with.
//
//   pre_dispatch  shared expert, router, dispatch_preprocess                  (compute stream)
//   shared_expert with cfg.shared_expert_overlap: the shared expert, out of pre_dispatch, beside
//                 the dispatch (and its backward beside the combine backward)  (compute stream)
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
// Chunks (cfg.num_chunks = C, docs/chunked-overlap.md): dispatch, mlp and combine (and their
// backwards) run once per chunk c, so chunk c+1's all-to-all can run on the comm stream while
// chunk c's experts compute. Chunk c is group c of each rank's local experts (ExpertGroup,
// token_dispatcher.h). pre_dispatch stays whole: the router's losses and counts are the
// micro-batch's, and the preprocess plans every chunk's send side there (compute stream, before
// any chunk communicates). The micro-batch keeps one dispatcher state; chunk c moves and
// computes only its group's rows, which sit where unchunked they would. So every expert product
// has its unchunked rows, and the sums (the combine's, dx's, each expert's weight gradient) are
// the unchunked ones: C > 1 gives the bits of C = 1. The combine's sum runs in the last chunk's
// combine (the comm stream runs the chunks' combines in order); the combine backward's first
// step in the first chunk's.
//
// Letters: T tokens of the micro-batch on this rank, H hidden, K top-k.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

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

// Rows [begin, end) of the micro-batch's T tokens.
struct TokenRows {
    std::int64_t begin = 0, end = 0;
};
// The rows of the block output that chunk `chunk`'s combine writes (all T in the last chunk,
// none before it), and the rows of the output gradient its combine backward reads (all T in the
// first chunk, none after it).
TokenRows combine_output_rows(const MoeConfig& cfg, std::int64_t num_tokens, int chunk);
TokenRows combine_grad_rows(const MoeConfig& cfg, std::int64_t num_tokens, int chunk);

// One micro-batch through one block, from its forward until its last backward.
struct MoeBlockState {
    RouterOutput router;
    std::unique_ptr<DispatchState> dispatch;  // the dispatcher's handle, shared by the chunks
    std::vector<ExpertsContext> experts;      // [C]: each expert group's context
    int combines_done = 0;                    // forward combines run, in chunk order
    int combine_backwards_done = 0;           // ... and combine backwards
    ExpertsContext shared;
    Tensor shared_out;  // (T, H) f32, with a shared expert
    Tensor dy;          // (T, H) compute dtype: the output gradient, kept for the shared expert
};

// x (T, H) compute dtype; the micro-batch's `num_sequences` sequences (seq_aux_loss). With
// `sequence_group` (sequence parallelism: the TP group, the node's stream's communicator) x is this
// rank's shard of the micro-batch and the router takes its loss statistics over the group
// (router.h). The state's buffers come from `arena` (the micro-batch's, kept until its backward);
// what selective recompute does not keep (cfg.recompute_shared_experts, cfg.recompute_moe_act)
// from `scratch`, the node's, which those settings need.
void block_pre_dispatch_forward(const MoeBlock& b, const Tensor& x, std::int64_t num_sequences,
                                MoeBlockState& st, Arena& arena, Arena* scratch = nullptr,
                                comm::Communicator* sequence_group = nullptr);
// Shared-expert overlap (cfg.shared_expert_overlap; without it pre_dispatch runs the shared
// expert and pre_dispatch's backward its dgrad, backward_dw its wgrad): the shared expert is a
// node of its own on the compute stream, which the schedule issues right after the dispatch
// (forward) and the combine backward (backward), so it computes while their all-to-alls are in
// flight, as Megatron-Core's shared-expert stream does. x (T, H) compute dtype, the block input
// (what pre_dispatch read); its output waits in the state for the combine.
void block_shared_expert_forward(const MoeBlock& b, const Tensor& x, MoeBlockState& st,
                                 Arena& arena);
// dy (T, H) compute dtype: the block output's gradient (the node's own copy); dx (T, H) f32: the
// block's input gradient, which this overwrites with the shared expert's term (the pre_dispatch
// backward adds the routed and router terms to it); then the shared expert's wgrad (`scratch`
// its workspace).
void block_shared_expert_backward(const MoeBlock& b, const Tensor& dy, const Tensor& dx,
                                  MoeBlockState& st, Arena& arena, Arena& scratch);

// The chunked nodes take the chunk `chunk` (0..C-1; 0 with C = 1). Two nodes of different
// chunks may run at once on two threads, allocating from the same `arena` (arena.h: allocation
// is thread-safe).
void block_dispatch_forward(const MoeBlock& b, const DispatchComms& comms, MoeBlockState& st,
                            Arena& arena, int chunk = 0);
void block_mlp_forward(const MoeBlock& b, MoeBlockState& st, Arena& arena, int chunk = 0,
                       Arena* scratch = nullptr);
// y (rows, H) f32 = combine_output_rows' rows of the routed experts' weighted sum (+ shared
// expert); undefined when the chunk writes none.
void block_combine_forward(const MoeBlock& b, const DispatchComms& comms, MoeBlockState& st,
                           const Tensor& y, int chunk = 0);

// dy (T, H) compute dtype: gradient of the block output (kept in the state until the
// pre_dispatch backward); the chunk reads its rows of it.
void block_combine_backward(const MoeBlock& b, const DispatchComms& comms, const Tensor& dy,
                            MoeBlockState& st, Arena& arena, int chunk = 0);
void block_mlp_backward(const MoeBlock& b, MoeBlockState& st, Arena& arena, int chunk = 0);
void block_mlp_backward_dw(const MoeBlock& b, MoeBlockState& st, Arena& scratch, int chunk = 0);
void block_dispatch_backward(const MoeBlock& b, const DispatchComms& comms, MoeBlockState& st,
                             int chunk = 0);
// dx (T, H) f32 = gradient of the block input (overwritten; with shared-expert overlap it holds
// the shared expert's term from block_shared_expert_backward, which this adds to). loss_grad_scale
// multiplies the aux/z-loss gradients (1 / number of micro-batches). A recomputed shared expert's h
// and a are recomputed into `scratch` and stay in st.shared for a wgrad in the same node; the
// caller drops them (drop_recomputed) when the node ends.
void block_pre_dispatch_backward(const MoeBlock& b, float loss_grad_scale, MoeBlockState& st,
                                 const Tensor& dx, Arena& arena, Arena& scratch);
void block_pre_dispatch_backward_dw(const MoeBlock& b, MoeBlockState& st, Arena& scratch);

}  // namespace epo::moe
