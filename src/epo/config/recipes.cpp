#include "epo/config/recipes.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "epo/core/error.h"

namespace epo::config {
namespace {

// What every recipe shares (docs/recipes.md): RMSNorm, SwiGLU, rotary embeddings, no linear
// biases, bf16, parallel sizes 1, EP overlap off, alltoall dispatch. The GPU recipes also carry
// what Megatron-Bridge's pretraining recipes set for a GPU cluster (distributed optimizer with
// overlapped grad-reduce/param-gather, fused gradient accumulation, fused permutation) and the
// reference perf harness's run length (50 iterations, 10 of warm-up).
Config common_base(std::string_view name) {
    Config c;
    c.recipe = std::string(name);
    ModelConfig& m = c.model;
    m.normalization = Normalization::kRMSNorm;
    m.activation_func = ActivationFunc::kSilu;
    m.gated_linear_unit = true;
    m.position_embedding_type = PositionEmbedding::kRope;
    m.add_bias_linear = false;
    m.add_qkv_bias = false;
    m.share_embeddings_and_output_weights = false;
    m.bf16 = true;
    m.expert_tensor_parallel_size = 1;  // experts are not tensor-split, whatever TP is
    m.moe_token_dispatcher_type = DispatcherType::kAlltoall;
    m.moe_router_load_balancing_type = LoadBalancingType::kAuxLoss;
    c.train.lr_decay_style = LrDecayStyle::kCosine;
    c.train.log_interval = 1;
    return c;
}

Config gpu_base(std::string_view name) {
    Config c = common_base(name);
    c.model.gradient_accumulation_fusion = true;
    c.model.moe_permute_fusion = true;
    c.model.seq_length = 4096;
    c.ddp.use_distributed_optimizer = true;
    c.ddp.overlap_grad_reduce = true;
    c.ddp.overlap_param_gather = true;
    c.optimizer.lr = 3e-4;
    c.optimizer.min_lr = 3e-5;
    c.optimizer.weight_decay = 0.1;
    c.optimizer.adam_beta2 = 0.95;
    c.train.micro_batch_size = 1;
    c.train.train_iters = 50;
    c.train.lr_warmup_iters = 10;
    return c;
}

// Qwen3 MoE: softmax router over the top-k logits (= renormalized top-k probabilities),
// aux-loss 1e-3, qk-layernorm, GQA with head dim 128.
Config qwen3_moe(std::string_view name) {
    Config c = gpu_base(name);
    ModelConfig& m = c.model;
    m.kv_channels = 128;
    m.qk_layernorm = true;
    m.vocab_size = 151936;
    m.rotary_base = 1000000.0;
    m.layernorm_epsilon = 1e-6;
    m.num_moe_experts = 128;
    m.moe_router_topk = 8;
    m.moe_router_score_function = ScoreFunction::kSoftmax;
    m.moe_router_pre_softmax = false;
    m.moe_aux_loss_coeff = 1e-3;
    return c;
}

Config qwen3_30b_a3b() {
    Config c = qwen3_moe("qwen3-30b-a3b");
    ModelConfig& m = c.model;
    m.num_layers = 48;
    m.hidden_size = 2048;
    m.num_attention_heads = 32;
    m.num_query_groups = 4;
    m.ffn_hidden_size = 6144;
    m.moe_ffn_hidden_size = 768;
    c.train.global_batch_size = 1024;
    return c;
}

Config qwen3_235b_a22b() {
    Config c = qwen3_moe("qwen3-235b-a22b");
    ModelConfig& m = c.model;
    m.num_layers = 94;
    m.hidden_size = 4096;
    m.num_attention_heads = 64;
    m.num_query_groups = 4;
    m.ffn_hidden_size = 12288;
    m.moe_ffn_hidden_size = 1536;
    c.train.global_batch_size = 2048;
    return c;
}

// DeepSeek-V3: MLA attention, first 3 layers dense, sigmoid router with expert bias and
// group-limited routing, one shared expert (overlapped by default), fp32 router, one MTP layer.
Config deepseek_v3() {
    Config c = gpu_base("deepseek-v3");
    ModelConfig& m = c.model;
    m.num_layers = 61;
    m.hidden_size = 7168;
    m.num_attention_heads = 128;
    m.num_query_groups = 128;
    m.kv_channels = 128;
    m.ffn_hidden_size = 18432;
    m.vocab_size = 129280;
    m.layernorm_epsilon = 1e-6;
    m.init_method_std = 0.006;
    m.multi_latent_attention = true;
    m.qk_layernorm = true;  // MLA's q and kv latent norms (Bridge's DeepSeek-V3 sets it)
    m.q_lora_rank = 1536;
    m.kv_lora_rank = 512;
    m.qk_head_dim = 128;
    m.qk_pos_emb_head_dim = 64;
    m.v_head_dim = 128;
    m.num_moe_experts = 256;
    m.moe_ffn_hidden_size = 2048;
    m.moe_router_topk = 8;
    m.moe_router_score_function = ScoreFunction::kSigmoid;
    m.moe_router_enable_expert_bias = true;
    m.moe_router_bias_update_rate = 1e-3;
    m.moe_router_num_groups = 8;
    m.moe_router_group_topk = 4;
    m.moe_router_topk_scaling_factor = 2.5;
    m.moe_router_load_balancing_type = LoadBalancingType::kSeqAuxLoss;
    m.moe_aux_loss_coeff = 1e-4;
    m.moe_router_dtype = RouterDtype::kFp32;
    m.moe_shared_expert_intermediate_size = 2048;
    m.moe_shared_expert_overlap = true;
    m.mtp_num_layers = 1;
    std::vector<int> freq(m.num_layers, 1);
    std::fill(freq.begin(), freq.begin() + 3, 0);
    m.moe_layer_freq = freq;
    c.train.global_batch_size = 8192;
    return c;
}

Config mixtral_8x7b() {
    Config c = gpu_base("mixtral-8x7b");
    ModelConfig& m = c.model;
    m.num_layers = 32;
    m.hidden_size = 4096;
    m.num_attention_heads = 32;
    m.num_query_groups = 8;
    m.kv_channels = 128;
    m.ffn_hidden_size = 14336;
    m.vocab_size = 32000;
    m.rotary_base = 1000000.0;
    m.num_moe_experts = 8;
    m.moe_ffn_hidden_size = 14336;
    m.moe_router_topk = 2;
    m.moe_router_score_function = ScoreFunction::kSoftmax;
    m.moe_aux_loss_coeff = 1e-2;
    c.train.global_batch_size = 256;
    return c;
}

// Ours: small enough to train on a few CPU ranks; byte-level vocabulary.
Config tiny_moe() {
    Config c = common_base("tiny-moe");
    ModelConfig& m = c.model;
    m.num_layers = 2;
    m.hidden_size = 256;
    m.num_attention_heads = 4;
    m.num_query_groups = 2;
    m.kv_channels = 64;
    m.ffn_hidden_size = 1024;
    m.seq_length = 128;
    m.vocab_size = 256;
    m.num_moe_experts = 8;
    m.moe_ffn_hidden_size = 512;
    m.moe_router_topk = 2;
    m.moe_router_score_function = ScoreFunction::kSoftmax;
    m.moe_router_pre_softmax = false;
    m.moe_aux_loss_coeff = 1e-2;
    m.moe_z_loss_coeff.reset();
    m.gradient_accumulation_fusion = false;
    c.optimizer.lr = 1e-3;
    c.optimizer.min_lr = 1e-4;
    c.train.micro_batch_size = 2;
    c.train.global_batch_size = 8;
    c.train.train_iters = 20;
    c.train.lr_warmup_iters = 2;
    return c;
}

struct RecipeEntry {
    std::string_view name;
    Config (*make)();
};

constexpr RecipeEntry kRecipes[] = {
    {"qwen3-30b-a3b", qwen3_30b_a3b}, {"qwen3-235b-a22b", qwen3_235b_a22b},
    {"deepseek-v3", deepseek_v3},     {"mixtral-8x7b", mixtral_8x7b},
    {"tiny-moe", tiny_moe},
};

}  // namespace

const std::vector<std::string_view>& recipe_names() {
    static const std::vector<std::string_view> names = [] {
        std::vector<std::string_view> out;
        for (const auto& entry : kRecipes) {
            out.push_back(entry.name);
        }
        return out;
    }();
    return names;
}

Config make_recipe(std::string_view name) {
    for (const auto& entry : kRecipes) {
        if (entry.name == name) {
            return entry.make();
        }
    }
    throw Error(ErrorKind::kUsage, fmt::format("unknown recipe '{}'; known recipes: {}", name,
                                               fmt::join(recipe_names(), ", ")));
}

}  // namespace epo::config
