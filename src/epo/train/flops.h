// Model FLOPs per the reference formula (Megatron-LM's num_floating_point_operations for a
// transformer): every GEMM counted three times (forward, dgrad, wgrad), 2 FLOPs per
// multiply-add, causal attention counting half of the score matrix.
//
//   flops = B * S * ( 12 * L * H * [ F_dense * g * (L_dense / L)
//                                  + F_moe * K * g * (L_moe / L)
//                                  + F_shared * g * (L_moe / L) ]
//                   + 12 * L * H^2 * (1 + G/A + S/(2H)) * (A * d / H)
//                   + 6 * H * V )
// with B samples, S sequence length, L layers, H hidden, A heads, G query groups, d head dim,
// V vocabulary, K top-k, g = 3/2 for SwiGLU. With multi-latent attention the attention term is
// the reference's MLA count instead (N heads, Rq q_lora_rank, Rkv kv_lora_rank, Dn qk_head_dim,
// Dr qk_pos_emb_head_dim, Dq = Dn + Dr, Dv v_head_dim; the +1 are the latent norms):
//
//   6 * L * ( q + Rkv * (H + N (Dn + Dv) + 1) + H Dr + N Dv H + S (N Dq + N Dv) / 2 )
//   q = Rq * (H + N Dq + 1), or H N Dq without q_lora_rank
//
// Multi-token prediction (the reference's count): the MTP's transformer layers are counted in L
// (and in L_moe when the decoder's last layer is MoE), and each of its D = mtp_num_layers adds
// its norms and projection and one more output layer:
//
//   + B * S * ( 6 * D * (3 H + 2 H^2) + 6 * D * H * V )
#pragma once

#include <cstdint>

namespace epo::model {
struct GptShape;
}

namespace epo::train {

struct FlopsShape {
    int64_t num_layers = 0;      // with the MTP's transformer layers
    int64_t num_moe_layers = 0;  // layers whose MLP is an MoE layer
    int64_t mtp_num_layers = 0;  // D
    int64_t hidden_size = 0;
    int64_t ffn_hidden_size = 0;      // dense MLP
    int64_t moe_ffn_hidden_size = 0;  // one expert
    int64_t moe_shared_expert_intermediate_size = 0;
    int64_t moe_router_topk = 0;
    int64_t num_attention_heads = 0;
    int64_t num_query_groups = 0;
    int64_t kv_channels = 0;
    int64_t seq_length = 0;
    int64_t vocab_size = 0;
    bool swiglu = true;
    bool multi_latent_attention = false;
    int64_t q_lora_rank = 0;  // 0: queries not compressed
    int64_t kv_lora_rank = 0;
    int64_t qk_head_dim = 0;
    int64_t qk_pos_emb_head_dim = 0;
    int64_t v_head_dim = 0;
};

// FLOPs of one training step (forward + backward) over `num_samples` sequences.
double model_flops(const FlopsShape& shape, int64_t num_samples);
// The same for the model a GptShape describes: what the Trainer reports and the planner counts.
double model_flops(const model::GptShape& shape, int64_t num_samples);

}  // namespace epo::train
