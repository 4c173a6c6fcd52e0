#include "epo/train/flops.h"

#include "epo/model/gpt_model.h"

namespace epo::train {

double model_flops(const FlopsShape& s, int64_t num_samples) {
    const double L = static_cast<double>(s.num_layers);
    const double H = static_cast<double>(s.hidden_size);
    const double S = static_cast<double>(s.seq_length);
    const double g = s.swiglu ? 1.5 : 1.0;
    const double moe_fraction = L > 0 ? s.num_moe_layers / L : 0.0;
    const double expansion = 3.0 * 2.0 * 2.0;
    const double mlp =
        expansion * L * H *
        (s.ffn_hidden_size * g * (1.0 - moe_fraction) +
         static_cast<double>(s.moe_ffn_hidden_size) * s.moe_router_topk * g * moe_fraction +
         s.moe_shared_expert_intermediate_size * g * moe_fraction);
    const double query_ratio = static_cast<double>(s.num_attention_heads) * s.kv_channels / H;
    double attention =
        expansion * L * H * H *
        (1.0 + static_cast<double>(s.num_query_groups) / s.num_attention_heads + S / H / 2.0) *
        query_ratio;
    if (s.multi_latent_attention) {
        const double N = static_cast<double>(s.num_attention_heads);
        const double Rq = static_cast<double>(s.q_lora_rank);
        const double Rkv = static_cast<double>(s.kv_lora_rank);
        const double Dn = static_cast<double>(s.qk_head_dim);
        const double Dr = static_cast<double>(s.qk_pos_emb_head_dim);
        const double Dv = static_cast<double>(s.v_head_dim);
        const double Dq = Dn + Dr;
        const double q = s.q_lora_rank > 0 ? Rq * (H + N * Dq + 1.0) : H * N * Dq;
        attention = 6.0 * L *
                    (q + Rkv * (H + N * (Dn + Dv) + 1.0) + H * Dr + N * Dv * H +
                     S * (N * Dq + N * Dv) / 2.0);
    }
    const double D = static_cast<double>(s.mtp_num_layers);
    const double logits = 3.0 * 2.0 * H * static_cast<double>(s.vocab_size) * (1.0 + D);
    const double mtp = 3.0 * 2.0 * D * (3.0 * H + 2.0 * H * H);
    return static_cast<double>(num_samples) * S * (mlp + attention + logits + mtp);
}

double model_flops(const model::GptShape& s, int64_t num_samples) {
    int64_t num_moe_layers = 0;
    for (bool m : s.moe_layers)
        num_moe_layers += m;
    const FlopsShape flops{.num_layers = s.num_layers,
                           .num_moe_layers = num_moe_layers,
                           .mtp_num_layers = s.mtp_num_layers,
                           .hidden_size = s.hidden,
                           .ffn_hidden_size = s.ffn_hidden,
                           .moe_ffn_hidden_size = s.moe.ffn_hidden_size,
                           .moe_shared_expert_intermediate_size = s.moe.shared_expert_size,
                           .moe_router_topk = s.moe.topk,
                           .num_attention_heads = s.attn.num_heads,
                           .num_query_groups = s.attn.num_groups,
                           .kv_channels = s.attn.head_dim,
                           .seq_length = s.seq_length,
                           .vocab_size = s.vocab,
                           .multi_latent_attention = s.multi_latent_attention,
                           .q_lora_rank = s.mla.q_lora_rank,
                           .kv_lora_rank = s.mla.kv_lora_rank,
                           .qk_head_dim = s.mla.qk_head_dim,
                           .qk_pos_emb_head_dim = s.mla.qk_pos_emb_head_dim,
                           .v_head_dim = s.mla.v_head_dim};
    return model_flops(flops, num_samples);
}

}  // namespace epo::train
