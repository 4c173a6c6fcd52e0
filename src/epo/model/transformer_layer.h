// One transformer layer split into four nodes (docs/design.md "A layer is four nodes"), each with
// forward, backward (input gradients; weight gradients too unless they are delayed) and
// backward_dw:
//
//   pre_dispatch  n1 = norm(x); h = x + attention(n1); n2 = norm(h);
//                 MoE: the block's pre_dispatch (shared expert, router, dispatch preprocess)
//   (shared_expert with shared-expert overlap: the shared expert, out of pre_dispatch, beside the
//                 dispatch; its backward beside the combine backward)
//   dispatch      MoE block: the token dispatcher's counts and payload            (comm stream)
//   mlp           MoE block: the experts; dense: out = h + mlp(n2)
//   combine       MoE block: the payload back, + shared expert; out = h + moe(n2)  (comm stream)
// backward (reverse):
//   combine       dy(out) -> the block's combine backward
//   mlp           experts dgrad (and wgrad unless delayed); dense: dn2 = mlp dgrad
//   dispatch      the block's dispatch backward
//   pre_dispatch  dn2 = the block's input gradient; dh = dy + norm2^T(dn2);
//                 dx = dh + norm1^T(attention dgrad(dh))
//   backward_dw   mlp: expert (or dense MLP) wgrad; pre_dispatch: attention, router and
//                 shared-expert wgrad
// The MoE parts are the MoE block of moe/moe_block.h, which names the token dispatcher; this
// layer does not.
//
// A node reads the layer's parameters and writes only its own LayerState (one per micro-batch
// and layer), so two micro-batches can run through the same layer on two streams. With chunks
// (s.moe.num_chunks = C > 1) a MoE layer's dispatch, mlp and combine run per chunk
// (NodeArgs::moe_chunk), and two chunks of one micro-batch may run at once (moe_block.h): the
// combine of chunk c writes the rows moe::combine_output_rows gives (all of them in the last
// chunk, none before it) of the layer output. Dense layers have no dispatch/combine nodes.
// Residual stream and its gradient are f32; what feeds a GEMM is the compute dtype.
//
// Selective recompute (Megatron-Core's recompute_modules; docs/runtime.md "Recompute"): what a
// module recomputes is not kept in LayerState::arena (the metered activations) but written to
// the running node's scratch, in the forward for its consumers in the same node and again in
// the backward node that needs it, with the forward's operations, so the bits are the same:
//   layernorm       n1, n2 from x / h and the kept rstd (LayerRecompute::layernorm)
//   core_attn       the attention probabilities from q, k (AttentionShape::recompute_core_attn)
//   mlp             the dense MLP's fc1 output and activation from n2 (LayerRecompute::mlp)
//   moe_act         the experts' activation from their fc1 output (MoeConfig::recompute_moe_act)
//   shared_experts  the shared expert's fc1 output and activation (MoeConfig::...shared_experts)
//
// Letters: T tokens of the micro-batch, H hidden.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "epo/comm/communicator.h"
#include "epo/model/attention.h"
#include "epo/model/mla_attention.h"
#include "epo/moe/moe_block.h"
#include "epo/moe/moe_layer.h"

namespace epo::model {

// The layer's own selective-recompute modules (the attention's and the MoE block's are in
// their shapes, see above).
struct LayerRecompute {
    bool layernorm = false;  // n1, n2 not kept
    bool mlp = false;        // dense MLP: fc1 output and activation not kept
};

struct LayerShape {
    int64_t hidden = 0;
    int64_t tokens = 0;         // T = micro_batch_size * seq_length
    int64_t num_sequences = 1;  // micro_batch_size
    AttentionShape attn;
    // Self-attention is multi-latent attention (mla; attn unused) instead of grouped-query
    // attention (attn); the layer's one selection point is in transformer_layer.cpp.
    bool multi_latent_attention = false;
    MlaShape mla;
    float norm_eps = 1e-6f;
    bool is_moe = false;
    int64_t ffn_hidden = 0;  // dense MLP width
    moe::MoeConfig moe;      // global experts, top-k, ... (MoE layers)
    int64_t num_local_experts = 0;
    bool gradient_accumulation_fusion = false;
    DType compute_dtype = DType::kBF16;
    LayerRecompute recompute;
    // Tensor parallelism (tensor_parallel.h) over tp_size ranks: attn holds this rank's A/n heads
    // and G/n groups, ffn_hidden its F/n columns (the caller divides them). With sequence
    // parallelism `tokens` is this rank's sequence shard (T/n rows of the residual stream), on
    // which the norms, residual and MoE block run; attention and the dense MLP run on all
    // tp_tokens() tokens between a tp_gather of their input and a tp_reduce of their output, on
    // the running stream's tp communicator (NodeArgs::comms->tp), inline in the compute nodes.
    // Not with MLA or the layernorm recompute (the callers refuse them).
    int tp_size = 1;
    bool sequence_parallel = false;
    // Expert tensor parallelism: the experts hold moe.ffn_hidden_size / etp_size of each FFN
    // (the caller checks it divides); the dispatcher moves the ETP group's tokens to them.
    int etp_size = 1;
    int64_t tp_tokens() const { return sequence_parallel ? tokens * tp_size : tokens; }
};

struct LayerParams {
    Param input_norm;                // (H) "input_layernorm.weight"
    AttentionParams attn;            // grouped-query attention
    MlaParams mla;                   // multi-latent attention
    Param pre_mlp_norm;              // (H) "pre_mlp_layernorm.weight"
    moe::SharedExpertWeights dense;  // dense layers: fc1 (2F, H), fc2 (H, F)
    moe::MoeLayerParams moe;         // MoE layers: router, this rank's experts, shared expert
};

// `prefix` like "decoder.layers.3.". Master weights zero; the model initializes them.
LayerParams make_layer_params(const LayerShape& shape, const std::string& prefix);
// Trainable parameters not sharded by expert parallelism / the experts of this rank.
void collect_layer_params(const LayerShape& shape, LayerParams& p, std::vector<Param*>& dense,
                          std::vector<Param*>& expert);

// One micro-batch's activations through one layer, from its forward until its last backward.
struct LayerState {
    Arena arena{"layer activations"};
    size_t reported_bytes = 0;  // arena bytes accounted to the pool (see gpt_model.h)

    Tensor x;      // (T, H) f32 layer input: the model's hand-off tensor, kept for the backward
    Tensor n1;     // (T, H) compute dtype (layernorm recompute: a scratch view inside a node)
    Tensor rstd1;  // (T) f32
    AttentionContext attn;         // grouped-query attention
    MlaContext mla;                // multi-latent attention
    Tensor h;                      // (T, H) f32 residual after attention
    Tensor n2;                     // (T, H) compute dtype (as n1)
    Tensor rstd2;                  // (T) f32
    bool router_reads_n2 = false;  // the router kept a view of n2 (not a widened copy)
    moe::MoeBlockState moe;        // MoE layers
    // dense MLP
    moe::ExpertsContext mlp;
    // Tensor parallelism: n1 / n2 gathered over the TP group, (tp_tokens(), H) compute dtype,
    // the inputs attention / the dense MLP keep for their weight gradients.
    Tensor n1_full, n2_full;
    // backward
    Tensor d_out_c;  // (T, H) compute dtype: the output gradient as GEMM operand (dense with TP:
                     // gathered, (tp_tokens(), H))
    Tensor dn2;      // (T, H) f32 (dense: from the mlp node)
};

// Per-step, per-layer tallies the optimizer step reads (expert-bias updates).
struct LayerStepStats {
    std::vector<int64_t> routed_counts;  // [E] tokens routed to each expert this step
    double aux_loss = 0;                 // summed over micro-batches
    double z_loss = 0;
};

struct NodeArgs {
    const moe::DispatchComms* comms = nullptr;         // the running stream's communicators
    const moe::TokenDispatcher* dispatcher = nullptr;  // MoE layers: the model's dispatcher
    Arena* scratch = nullptr;      // the running stream's scratch (reset per node)
    float loss_grad_scale = 1.0f;  // 1 / number of micro-batches
    // The call's MoE chunk (schedule::NodeCall::moe_chunk): 0..C-1 for a chunked MoE node,
    // -1 for a whole one.
    int moe_chunk = -1;
};

void pre_dispatch_forward(const LayerShape& s, const LayerParams& p, const RopeTable& rope,
                          LayerState& st, LayerStepStats& stats, const NodeArgs& a);
void dispatch_forward(const LayerShape& s, const LayerParams& p, LayerState& st, const NodeArgs& a);
// Dense layers: writes out (T, H) f32 = h + mlp(n2) (nothing when out is undefined: a full
// recompute's last layer). MoE layers: `out` is unused.
void mlp_forward(const LayerShape& s, const LayerParams& p, LayerState& st, const Tensor& out,
                 const NodeArgs& a);
// out (T, H) f32 = h + moe(n2) (+ shared expert); a chunk writes its rows of out; an undefined
// out is not written (the state is, as always).
void combine_forward(const LayerShape& s, const LayerParams& p, LayerState& st, const Tensor& out,
                     const NodeArgs& a);

// Shared-expert overlap (s.moe.shared_expert_overlap): the MoE block's shared expert as a node
// of its own (schedule.h "Shared-expert overlap"), beside the dispatch in the forward and the
// combine backward in the backward; it reads what those read (n2, d_out) and writes only the
// block's shared-expert state (and, backward, the start of dn2), so it may run at the same time.
void shared_expert_forward(const LayerShape& s, const LayerParams& p, LayerState& st,
                           const NodeArgs& a);
// d_out (T, H) f32: gradient of the layer output. The shared expert's dgrad and wgrad.
void shared_expert_backward(const LayerShape& s, LayerParams& p, LayerState& st,
                            const Tensor& d_out, const NodeArgs& a);

// d_out (T, H) f32: gradient of the layer output.
void combine_backward(const LayerShape& s, const LayerParams& p, LayerState& st,
                      const Tensor& d_out, const NodeArgs& a);
void mlp_backward(const LayerShape& s, LayerParams& p, LayerState& st, const Tensor& d_out,
                  bool with_wgrad, const NodeArgs& a);
void mlp_backward_dw(const LayerShape& s, LayerParams& p, LayerState& st, const NodeArgs& a);
void dispatch_backward(const LayerShape& s, const LayerParams& p, LayerState& st,
                       const NodeArgs& a);
// d_x (T, H) f32 = gradient of the layer input.
void pre_dispatch_backward(const LayerShape& s, LayerParams& p, const RopeTable& rope,
                           LayerState& st, const Tensor& d_out, const Tensor& d_x, bool with_wgrad,
                           const NodeArgs& a);
void pre_dispatch_backward_dw(const LayerShape& s, LayerParams& p, LayerState& st,
                              const NodeArgs& a);

}  // namespace epo::model
