// Multi-latent attention (MLA, DeepSeek-V2/V3), as Megatron-Core's MLA self-attention with
// rope_type "rope" (no YaRN scaling): queries and keys/values pass through low-rank latents, and
// only a small positional part of each query and key carries rotary embeddings.
//
//   queries   lora:  cq = x Wqd^T (T, Rq);  qin = qnorm(cq)      "linear_q_down_proj"
//             none:  qin = x (qnorm(x) with qk_layernorm: Megatron fuses a norm into linear_q_proj)
//             q = qin Wq^T                    (T, N Dq)          "linear_q_up_proj" /
//             "linear_q_proj"
//   kv latent ckv_pe = x Wkvd^T               (T, Rkv + Dr)      "linear_kv_down_proj"
//             ckv = columns [0, Rkv), kpe = columns [Rkv, Rkv + Dr)
//             kvin = kvnorm(ckv);  kv = kvin Wkv^T  (T, N (Dn + Dv))  "linear_kv_up_proj"
//   heads     q_h = [q_nope_h (Dn), rope(q_pe_h) (Dr)]
//             k_h = [k_nope_h (Dn), rope(kpe) (Dr)]     the positional key is shared by all heads
//             v_h (Dv)
//   core      P = softmax_causal(q_bh k_bh^T / sqrt(Dn + Dr)),  ctx_bh = P v_bh   (S, Dv)
//   output    out += ctx Wproj^T               (T, H)            "linear_proj"
//
// The norms (RMSNorm; "linear_q_up_proj.layer_norm_weight", "linear_kv_up_proj.layer_norm_weight",
// or "linear_q_proj.layer_norm_weight" without q_lora_rank) exist when qk_layernorm is set, as in
// Megatron's layer spec (the DeepSeek recipes set it); without it the latents feed the up
// projections directly.
//
// Rope: Megatron applies MLA's rope "interleaved": the positional part (Dr) is first reordered to
// its even then its odd elements, then rotated as the non-interleaved rope of model/rope.h (the
// frequency table is built for width Dr). The reordered order is kept (a dot product of two
// equally permuted vectors is unchanged); the backward rotates back and restores the order.
//
// backward, split as the overlap schedule needs it:
//   dgrad: dctx = dout Wproj; per head as attention.h (dq_h, dk_h, dv_h, each head its own k and
//   v);
//          inverse rope on dq's positional parts; dkpe = sum_h dk_pe_h (heads ascending), inverse
//          rope; dkvin = dkv Wkv; kvnorm backward; dqin = dq Wq; qnorm backward;
//          dx = dcq Wqd (lora) or dqin (none) + [dckv, dkpe] Wkvd
//   wgrad: dWproj += dout^T ctx; dWkv += dkv^T kvin; dWkvd += [dckv, dkpe]^T x;
//          dWq += dq^T qin; dWqd += dcq^T x                      (into main_grad)
// The norm weights' gradients land in dgrad (as attention.h's qk-norm), not in wgrad.
// Probabilities are kept in the compute dtype; softmax and every product accumulate in f32.
//
// Letters: T tokens = B sequences x S positions, H hidden, N heads, Rq q_lora_rank, Rkv
// kv_lora_rank, Dn qk_head_dim, Dr qk_pos_emb_head_dim, Dq = Dn + Dr, Dv v_head_dim.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "epo/model/rope.h"
#include "epo/tensor/arena.h"
#include "epo/tensor/param.h"

namespace epo::model {

struct MlaShape {
    int64_t hidden = 0;               // H
    int64_t num_heads = 0;            // N
    int64_t q_lora_rank = 0;          // Rq; 0: queries are not compressed (q_lora_rank null)
    int64_t kv_lora_rank = 0;         // Rkv
    int64_t qk_head_dim = 0;          // Dn
    int64_t qk_pos_emb_head_dim = 0;  // Dr (even)
    int64_t v_head_dim = 0;           // Dv
    int64_t seq_length = 0;           // S
    bool qk_layernorm = false;        // the q and kv latent norms
    float norm_eps = 1e-6f;
};

struct MlaParams {
    Param q_down;   // (Rq, H)          "self_attention.linear_q_down_proj.weight" (lora only)
    Param q_up;     // (N Dq, Rq|H)     "self_attention.linear_q_up_proj.weight", or
                    //                  "self_attention.linear_q_proj.weight" without lora
    Param q_norm;   // (Rq|H) f32       "...linear_q_up_proj.layer_norm_weight" (qk_layernorm)
    Param kv_down;  // (Rkv + Dr, H)    "self_attention.linear_kv_down_proj.weight"
    Param kv_up;    // (N (Dn + Dv), Rkv) "self_attention.linear_kv_up_proj.weight"
    Param kv_norm;  // (Rkv) f32        "...linear_kv_up_proj.layer_norm_weight" (qk_layernorm)
    Param proj;     // (H, N Dv)        "self_attention.linear_proj.weight"
};

// Checks the shape once (positive widths, even Dr); the error names the field and the fix.
void check_mla_shape(const MlaShape& shape);

MlaParams make_mla_params(const MlaShape& shape, DType compute_dtype, const std::string& prefix);

// The trainable parameters, in a fixed order (the optimizer's and the checkpoint's).
void collect_mla_params(const MlaShape& shape, MlaParams& params, std::vector<Param*>& out);

// The element counts of collect_mla_params's parameters, in its order (the step plan's sizes).
std::vector<int64_t> mla_param_sizes(const MlaShape& shape);

// What forward saves for backward and what dgrad saves for wgrad (one per micro-batch and
// layer; tensors live in the arena passed to forward/dgrad).
struct MlaContext {
    Tensor x;         // (T, H) compute dtype: the input (a view the caller keeps alive)
    Tensor cq;        // (T, Rq) compute dtype: q_down's output (lora with qk_layernorm)
    Tensor qin;       // (T, Rq|H) compute dtype: q_up's input (may alias x or cq)
    Tensor q_rstd;    // (T) f32 (qk_layernorm)
    Tensor ckv;       // (T, Rkv) compute dtype: the kv latent before its norm (qk_layernorm)
    Tensor kvin;      // (T, Rkv) compute dtype: kv_up's input
    Tensor kv_rstd;   // (T) f32 (qk_layernorm)
    Tensor q, k;      // (T, N Dq) compute dtype: after rope (k's positional part per head)
    Tensor v;         // (T, N Dv) compute dtype
    Tensor probs;     // (B, N, S, S) compute dtype
    Tensor ctx;       // (T, N Dv) compute dtype
    Tensor dout;      // (T, H) compute dtype, saved by dgrad
    Tensor dq;        // (T, N Dq) compute dtype: gradient of q_up's output
    Tensor dkv;       // (T, N (Dn + Dv)) compute dtype: gradient of kv_up's output
    Tensor dkv_down;  // (T, Rkv + Dr) compute dtype: gradient of kv_down's output
    Tensor dcq;       // (T, Rq) compute dtype: gradient of q_down's output (lora)
};

// Bytes one micro-batch's forward saves and what its dgrad adds for wgrad (the memory estimate's
// formula), c the compute dtype's size:
//   forward  T (c (Rq [lora] + Rq [lora, qk_layernorm] + H [no lora, qk_layernorm]
//               + Rkv + Rkv [qk_layernorm] + 2 N Dq + 2 N Dv) + 4 [per norm]) + c B N S^2
//   dgrad    T c (H + N Dq + N (Dn + Dv) + Rkv + Dr + Rq [lora])
struct MlaSavedBytes {
    int64_t forward = 0;
    int64_t dgrad = 0;
};
MlaSavedBytes mla_saved_bytes(const MlaShape& shape, int64_t num_sequences, int64_t dtype_bytes);

// out_acc (T, H) f32 += mla(x); x (T, H) compute dtype. `rope` is built for width Dr.
void mla_forward(const MlaShape& shape, const MlaParams& params, const RopeTable& rope,
                 const Tensor& x, const Tensor& out_acc, MlaContext& ctx, Arena& saved,
                 Arena& scratch);

// dx (T, H) f32 = input gradient for dout (T, H) f32; the norm weight gradients land here too.
void mla_backward_dgrad(const MlaShape& shape, MlaParams& params, const RopeTable& rope,
                        const Tensor& dout, const Tensor& dx, MlaContext& ctx, Arena& saved,
                        Arena& scratch);

// Weight gradients of the five (four without lora) projections into main_grad.
void mla_backward_wgrad(const MlaShape& shape, MlaParams& params, bool fusion, MlaContext& ctx,
                        Arena& scratch);

}  // namespace epo::model
