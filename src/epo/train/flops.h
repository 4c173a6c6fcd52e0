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
// V vocabulary, K top-k, g = 3/2 for SwiGLU. Multi-token prediction and MLA are not counted:
// the runtime refuses them (runtime-support checks).
#pragma once

#include <cstdint>

namespace epo::model {
struct GptShape;
}

namespace epo::train {

struct FlopsShape {
    int64_t num_layers = 0;
    int64_t num_moe_layers = 0;  // layers whose MLP is an MoE layer
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
};

// FLOPs of one training step (forward + backward) over `num_samples` sequences.
double model_flops(const FlopsShape& shape, int64_t num_samples);
// The same for the model a GptShape describes: what the Trainer reports and the planner counts.
double model_flops(const model::GptShape& shape, int64_t num_samples);

}  // namespace epo::train
