// Causal self-attention with grouped-query heads, rotary embeddings and optional qk-layernorm
// (Qwen3 style: RMSNorm over the head dim of every query and key head, before RoPE).
//
//   qkv = x Wqkv^T                      (T, (A + 2G) d)   columns: A query heads, G key heads,
//                                                          G value heads
//   q, k = rope(qk_norm(q)), rope(qk_norm(k))
//   per sequence b and head h (group g = h / (A/G)):
//     P = softmax_causal(q_bh k_bg^T / sqrt(d))           (S, S), masked j > i
//     ctx_bh = P v_bg                                     (S, d)
//   out += ctx Wproj^T                  (T, H)            accumulated into the residual stream
// backward, split as the overlap schedule needs it:
//   dgrad: dctx = dout Wproj; dP = dctx_bh v_bg^T; dS = P * (dP - rowsum(P * dP)) / sqrt(d);
//          dq_bh = dS k_bg; dk_bg += dS^T q_bh; dv_bg += P^T dctx_bh (heads of a group in
//          ascending order); inverse rope; qk-norm backward; dx = dqkv Wqkv
//   wgrad: dWproj += dout^T ctx; dWqkv += dqkv^T x        (into main_grad)
// Attention probabilities are kept in the compute dtype for the backward (as flash-attention
// keeps P for dV); softmax and all products accumulate in f32. With selective recompute of
// core_attn (AttentionShape::recompute_core_attn, Megatron-Core's "core_attn" module) they are
// not kept: the forward writes each head's P to scratch, and dgrad recomputes it from the kept
// q and k with the same products (the forward's bits), saving B A S^2 elements per layer.
//
// Letters: T tokens = B sequences x S positions, H hidden, A heads, G query groups, d head dim.
#pragma once

#include <cstdint>
#include <vector>

#include "epo/model/rope.h"
#include "epo/tensor/arena.h"
#include "epo/tensor/param.h"

namespace epo::model {

struct AttentionShape {
    int64_t hidden = 0;
    int64_t num_heads = 0;   // A
    int64_t num_groups = 0;  // G (num_query_groups)
    int64_t head_dim = 0;    // d (kv_channels)
    int64_t seq_length = 0;  // S
    bool qk_layernorm = false;
    float norm_eps = 1e-6f;
    bool recompute_core_attn = false;  // P not kept: recomputed in dgrad
};

struct AttentionParams {
    Param qkv;     // ((A + 2G) d, H)  "self_attention.linear_qkv.weight"
    Param proj;    // (H, A d)         "self_attention.linear_proj.weight"
    Param q_norm;  // (d), with qk_layernorm
    Param k_norm;  // (d), with qk_layernorm
};

AttentionParams make_attention_params(const AttentionShape& shape, DType compute_dtype,
                                      const std::string& prefix);

// What forward saves for backward and what dgrad saves for wgrad (one per micro-batch and
// layer; tensors live in the arena passed to forward/dgrad).
struct AttentionContext {
    Tensor x;        // (T, H) compute dtype: the input (a view the caller keeps alive until
                     // wgrad; dgrad does not read it, so a recomputed input may be set anew)
    Tensor q_pre;    // (T A, d) f32: queries before qk-norm (qk_layernorm only)
    Tensor k_pre;    // (T G, d) f32
    Tensor q_rstd;   // (T A) f32
    Tensor k_rstd;   // (T G) f32
    Tensor q, k, v;  // (T, A d), (T, G d), (T, G d) compute dtype: after norm and rope
    Tensor probs;    // (B, A, S, S) compute dtype (undefined with recompute_core_attn)
    Tensor ctx;      // (T, A d) compute dtype
    Tensor dout;     // (T, H) compute dtype, saved by dgrad
    Tensor dqkv;     // (T, (A + 2G) d) compute dtype, saved by dgrad
};

// Row-wise causal softmax of scores (S, S) f32 scaled by `scale` (> 0), written to p (S, S) in
// `p_type` (zeros above the diagonal); `row` is scratch of at least S floats. Shared by both
// attention kinds (mla_attention.h).
void causal_softmax(const float* scores, float scale, int64_t S, void* p, DType p_type,
                    std::vector<float>& row);

// out_acc (T, H) f32 += attention(x). `saved` holds the context's tensors, `scratch` temporaries.
void attention_forward(const AttentionShape& shape, const AttentionParams& params,
                       const RopeTable& rope, const Tensor& x, const Tensor& out_acc,
                       AttentionContext& ctx, Arena& saved, Arena& scratch);

// dx (T, H) f32 = input gradient for dout (T, H) f32; qk-norm weight gradients land here too.
void attention_backward_dgrad(const AttentionShape& shape, AttentionParams& params,
                              const RopeTable& rope, const Tensor& dout, const Tensor& dx,
                              AttentionContext& ctx, Arena& saved, Arena& scratch);

// Weight gradients of the two projections into main_grad.
void attention_backward_wgrad(AttentionParams& params, bool fusion, AttentionContext& ctx,
                              Arena& scratch);

}  // namespace epo::model
