// Grouped SwiGLU experts over contiguous per-expert row segments, and the shared expert (the same
// FFN on every token, weight 1).
//
//   h_e = x_e W1_e^T                 [R_e, 2F]  (gate columns 0..F-1, up columns F..2F-1)
//   a_e = p * silu(h_gate) * h_up    [R_e, F]   (kernels/activation.h)
//   y_e = a_e W2_e^T                 [R_e, H]
// backward, split as the overlap schedule needs it:
//   dgrad: da_e = dy_e W2_e; (dh_e, dp) = swiglu_backward; dx_e = dh_e W1_e
//   wgrad: dW2_e += dy_e^T a_e; dW1_e += dh_e^T x_e   (into main_grad; see weight_grad.h)
// Calling dgrad now and wgrad later gives the same bits as the fused backward (which interleaves
// them per expert): wgrad reads only what dgrad saved in the context, and each main_grad slice
// gets exactly one addition per call, in expert order.
//
// Row layout: ExpertSegments with alignment kExpertRowAlign, alignment rows of x and dy zero
// (permute_forward / combine_backward / zero_segment_padding make them so). Products over rows
// (forward, dgrad) use exact counts with oneDNN row tiles; wgrad products reduce over the padded
// length (multiples of 32), so their shapes come from a small bounded set.
//
// Selective recompute (FfnRecompute): with moe_act the forward keeps h but not a, and wgrad
// recomputes a = swiglu(h) before dW2; with mlp / shared_experts it keeps only its input x, and
// the backward recomputes h = x W1^T and a (dgrad, and again in a delayed wgrad). Recomputed
// tensors live in the scratch arena passed in, never in the context's arena, and are computed
// row tile by row tile as the forward computes them, so every bit is the forward's.
//
// Activations are the compute dtype (bf16 or f32); every product accumulates in f32.
// The weights are read through oneDNN-packed copies (ExpertWeights::packed) that are rebuilt
// when a Param's version changes; they are derived data, not state, and only the thread of the
// compute stream may use them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "epo/kernels/gemm.h"
#include "epo/moe/dispatch.h"
#include "epo/tensor/arena.h"
#include "epo/tensor/param.h"

namespace epo::moe {

// oneDNN-blocked copies of expert weights for the forward (W^T) and dgrad (W) products.
struct PackedFfnWeights {
    std::vector<kernels::PackedMatrix> fc1_fwd, fc2_fwd, fc1_dgrad, fc2_dgrad;  // [E] each
    std::uint64_t fc1_version = ~0ull, fc2_version = ~0ull;
};

struct ExpertWeights {
    Param fc1;               // [E, 2F, H] "experts.fc1.weight"
    Param fc2;               // [E, H, F]  "experts.fc2.weight"
    bool use_packed = true;  // read weights through packed copies (+4-10% on this machine)
    std::unique_ptr<PackedFfnWeights> packed = std::make_unique<PackedFfnWeights>();
};

// The shared expert: one FFN of size S on every token (same layout with E = 1).
struct SharedExpertWeights {
    Param fc1;  // [2S, H] "shared.fc1.weight"
    Param fc2;  // [H, S]  "shared.fc2.weight"
};

ExpertWeights make_expert_weights(std::int64_t num_experts, std::int64_t hidden, std::int64_t ffn,
                                  DType compute_dtype);
SharedExpertWeights make_shared_expert_weights(std::int64_t hidden, std::int64_t ffn,
                                               DType compute_dtype);

// What the forward does not keep for the backward (see the header).
enum class FfnRecompute {
    kNone,        // h and a kept
    kActivation,  // moe_act: a recomputed from h in wgrad
    kAll,         // mlp, shared_experts: h and a recomputed from x in the backward
};

// What the forward saved and what dgrad saved for wgrad, per micro-batch.
struct ExpertsContext {
    ExpertSegments segments;
    std::int64_t first_expert = 0;  // segment e is expert first_expert + e of the weights
    Tensor x;      // [Rp, H] input rows (a view: the caller keeps it alive until wgrad)
    Tensor probs;  // [Rp] f32 (undefined for the shared expert)
    Tensor h;      // [Rp, 2F] fc1 output (kAll: undefined outside the backward's node)
    Tensor a;      // [Rp, F] activation (fc2 input; recomputed: undefined outside a node)
    FfnRecompute recompute = FfnRecompute::kNone;
    Tensor dy;  // [Rp, H] output gradient (a view, kept until wgrad)
    Tensor dh;  // [Rp, 2F] fc1 output gradient
    bool dgrad_done = false;
};

// y [Rp, H] (compute dtype or f32) = experts(x, probs) on the segments: segment e is expert
// first_expert + e (the block's expert chunks run a group of the experts at a time).
// `recompute` kActivation puts a in `scratch` (not kept); kAll is for the shared expert only.
void experts_forward(const ExpertWeights& w, const ExpertSegments& segments, const Tensor& x,
                     const Tensor& probs, const Tensor& y, ExpertsContext& ctx, Arena& arena,
                     std::int64_t first_expert = 0, FfnRecompute recompute = FfnRecompute::kNone,
                     Arena* scratch = nullptr);
// dx [Rp, H] (compute dtype or f32), dprobs [Rp] f32.
void experts_backward_dgrad(const ExpertWeights& w, const Tensor& dy, const Tensor& dx,
                            const Tensor& dprobs, ExpertsContext& ctx, Arena& arena);
// `arena` is scratch: the workspace, and a when it is recomputed (moe_act).
void experts_backward_wgrad(ExpertWeights& w, bool fusion, ExpertsContext& ctx, Arena& arena);
// experts_backward_dgrad, then experts_backward_wgrad.
void experts_backward(ExpertWeights& w, bool fusion, const Tensor& dy, const Tensor& dx,
                      const Tensor& dprobs, ExpertsContext& ctx, Arena& arena);

// The shared expert on x [T, H]: y [T, H] f32 (added to the combine in f32). With `recompute`
// kAll (the mlp / shared_experts modules) h and a go to `scratch` and are not kept.
void shared_expert_forward(const SharedExpertWeights& w, const Tensor& x, const Tensor& y,
                           ExpertsContext& ctx, Arena& arena,
                           FfnRecompute recompute = FfnRecompute::kNone, Arena* scratch = nullptr);
// dx_acc [T, H] f32 += the input gradient; dy [T, H] compute dtype. dh goes to `arena` (kept for
// a delayed wgrad); with kAll h and a are recomputed into `scratch` and stay there as views for
// a wgrad in the same node (drop_recomputed() forgets them when the node ends).
void shared_expert_backward_dgrad(const SharedExpertWeights& w, const Tensor& dy,
                                  const Tensor& dx_acc, ExpertsContext& ctx, Arena& arena,
                                  Arena* scratch = nullptr);
// `arena` is scratch: the workspace, and h and a when they are recomputed here.
void shared_expert_backward_wgrad(SharedExpertWeights& w, bool fusion, ExpertsContext& ctx,
                                  Arena& arena);
// Forgets the recomputed tensors' views (their scratch is reset after the node): a later wgrad
// recomputes them.
void drop_recomputed(ExpertsContext& ctx);

}  // namespace epo::moe
