#include "epo/train/flops.h"

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
    const double attention =
        expansion * L * H * H *
        (1.0 + static_cast<double>(s.num_query_groups) / s.num_attention_heads + S / H / 2.0) *
        query_ratio;
    const double logits = 3.0 * 2.0 * H * static_cast<double>(s.vocab_size);
    return static_cast<double>(num_samples) * S * (mlp + attention + logits);
}

}  // namespace epo::train
