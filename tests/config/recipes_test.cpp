#include "epo/config/recipes.h"

#include <gtest/gtest.h>

#include "config_test_util.h"
#include "epo/config/validate.h"

namespace epo::config {
namespace {

TEST(Recipes, AllFiveAreKnownAndNamed) {
    EXPECT_EQ(recipe_names(),
              (std::vector<std::string_view>{"qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3",
                                             "mixtral-8x7b", "tiny-moe"}));
    for (auto name : recipe_names()) {
        EXPECT_EQ(make_recipe(name).recipe, std::string(name));
    }
    testing::expect_error([] { make_recipe("qwen3"); }, ErrorKind::kUsage,
                          {"unknown recipe 'qwen3'", "qwen3-30b-a3b", "tiny-moe"});
}

// Every recipe: RMSNorm, SwiGLU, rotary, no linear biases, bf16, parallel sizes 1, EP overlap off.
TEST(Recipes, ShareTheCommonArchitecture) {
    for (auto name : recipe_names()) {
        const Config c = make_recipe(name);
        const ModelConfig& m = c.model;
        SCOPED_TRACE(std::string(name));
        EXPECT_EQ(m.normalization, Normalization::kRMSNorm);
        EXPECT_EQ(m.activation_func, ActivationFunc::kSilu);
        EXPECT_TRUE(m.gated_linear_unit);
        EXPECT_EQ(m.position_embedding_type, PositionEmbedding::kRope);
        EXPECT_FALSE(m.add_bias_linear);
        EXPECT_FALSE(m.add_qkv_bias);
        EXPECT_TRUE(m.bf16);
        EXPECT_FALSE(m.fp16);
        EXPECT_EQ(m.tensor_model_parallel_size, 1);
        EXPECT_EQ(m.pipeline_model_parallel_size, 1);
        EXPECT_EQ(m.expert_model_parallel_size, 1);
        EXPECT_EQ(m.expert_tensor_parallel_size, 1);
        EXPECT_EQ(m.context_parallel_size, 1);
        EXPECT_FALSE(m.overlap_moe_expert_parallel_comm);
        EXPECT_FALSE(c.comm_overlap.has_value());
        EXPECT_EQ(m.moe_token_dispatcher_type, DispatcherType::kAlltoall);
        EXPECT_GT(m.seq_length, 0);
    }
}

TEST(Recipes, Qwen3MoeShapes) {
    const ModelConfig a = make_recipe("qwen3-30b-a3b").model;
    EXPECT_EQ(a.num_layers, 48);
    EXPECT_EQ(a.hidden_size, 2048);
    EXPECT_EQ(a.num_attention_heads, 32);
    EXPECT_EQ(a.num_query_groups, 4);
    EXPECT_EQ(a.kv_channels, 128);
    EXPECT_EQ(a.ffn_hidden_size, 6144);
    EXPECT_EQ(a.num_moe_experts, 128);
    EXPECT_EQ(a.moe_router_topk, 8);
    EXPECT_EQ(a.moe_ffn_hidden_size, 768);
    EXPECT_FALSE(a.moe_shared_expert_intermediate_size.has_value());
    EXPECT_EQ(a.moe_router_score_function, ScoreFunction::kSoftmax);
    EXPECT_FALSE(a.moe_router_pre_softmax);  // softmax over the top-k: renormalized
    EXPECT_EQ(a.moe_router_load_balancing_type, LoadBalancingType::kAuxLoss);
    EXPECT_DOUBLE_EQ(a.moe_aux_loss_coeff, 1e-3);
    EXPECT_TRUE(a.qk_layernorm);
    EXPECT_EQ(a.vocab_size, 151936);
    const ModelConfig b = make_recipe("qwen3-235b-a22b").model;
    EXPECT_EQ(b.num_layers, 94);
    EXPECT_EQ(b.hidden_size, 4096);
    EXPECT_EQ(b.num_attention_heads, 64);
    EXPECT_EQ(b.num_query_groups, 4);
    EXPECT_EQ(b.ffn_hidden_size, 12288);
    EXPECT_EQ(b.moe_ffn_hidden_size, 1536);
    EXPECT_EQ(b.num_moe_experts, 128);
    EXPECT_TRUE(b.qk_layernorm);
    EXPECT_EQ(b.vocab_size, 151936);
}

TEST(Recipes, DeepSeekV3) {
    const ModelConfig m = make_recipe("deepseek-v3").model;
    EXPECT_EQ(m.num_layers, 61);
    EXPECT_EQ(m.moe_layer_freq, MoeLayerFreq([] {
                  std::vector<int> v(61, 1);
                  v[0] = v[1] = v[2] = 0;
                  return v;
              }()));
    EXPECT_EQ(m.hidden_size, 7168);
    EXPECT_EQ(m.num_attention_heads, 128);
    EXPECT_TRUE(m.multi_latent_attention);
    EXPECT_EQ(m.q_lora_rank, 1536);
    EXPECT_EQ(m.kv_lora_rank, 512);
    EXPECT_EQ(m.qk_head_dim, 128);
    EXPECT_EQ(m.qk_pos_emb_head_dim, 64);
    EXPECT_EQ(m.v_head_dim, 128);
    EXPECT_EQ(m.ffn_hidden_size, 18432);
    EXPECT_EQ(m.num_moe_experts, 256);
    EXPECT_EQ(m.moe_router_topk, 8);
    EXPECT_EQ(m.moe_ffn_hidden_size, 2048);
    EXPECT_EQ(m.moe_shared_expert_intermediate_size, 2048);
    EXPECT_EQ(m.moe_router_score_function, ScoreFunction::kSigmoid);
    EXPECT_TRUE(m.moe_router_enable_expert_bias);
    EXPECT_DOUBLE_EQ(m.moe_router_bias_update_rate, 1e-3);
    EXPECT_EQ(m.moe_router_num_groups, 8);
    EXPECT_EQ(m.moe_router_group_topk, 4);
    EXPECT_EQ(m.moe_router_topk_scaling_factor, 2.5);
    EXPECT_EQ(m.moe_router_load_balancing_type, LoadBalancingType::kSeqAuxLoss);
    EXPECT_DOUBLE_EQ(m.moe_aux_loss_coeff, 1e-4);
    EXPECT_EQ(m.moe_router_dtype, RouterDtype::kFp32);
    EXPECT_EQ(m.mtp_num_layers, 1);
    EXPECT_TRUE(m.moe_shared_expert_overlap);  // must be turned off for EP overlap
    EXPECT_EQ(m.vocab_size, 129280);
}

TEST(Recipes, Mixtral8x7b) {
    const ModelConfig m = make_recipe("mixtral-8x7b").model;
    EXPECT_EQ(m.num_layers, 32);
    EXPECT_EQ(m.hidden_size, 4096);
    EXPECT_EQ(m.num_attention_heads, 32);
    EXPECT_EQ(m.num_query_groups, 8);
    EXPECT_EQ(m.kv_channels, 128);
    EXPECT_EQ(m.ffn_hidden_size, 14336);
    EXPECT_EQ(m.num_moe_experts, 8);
    EXPECT_EQ(m.moe_router_topk, 2);
    EXPECT_EQ(m.moe_ffn_hidden_size, 14336);
    EXPECT_DOUBLE_EQ(m.moe_aux_loss_coeff, 1e-2);
    EXPECT_EQ(m.vocab_size, 32000);
}

TEST(Recipes, TinyMoe) {
    const Config c = make_recipe("tiny-moe");
    const ModelConfig& m = c.model;
    EXPECT_EQ(m.num_layers, 2);
    EXPECT_EQ(m.hidden_size, 256);
    EXPECT_EQ(m.num_attention_heads, 4);
    EXPECT_EQ(m.num_query_groups, 2);
    EXPECT_EQ(kv_channels(m), 64);
    EXPECT_EQ(m.ffn_hidden_size, 1024);
    EXPECT_EQ(m.num_moe_experts, 8);
    EXPECT_EQ(m.moe_router_topk, 2);
    EXPECT_EQ(m.moe_ffn_hidden_size, 512);
    EXPECT_FALSE(m.moe_shared_expert_intermediate_size.has_value());
    EXPECT_FALSE(m.moe_router_pre_softmax);
    EXPECT_DOUBLE_EQ(m.moe_aux_loss_coeff, 1e-2);
    EXPECT_FALSE(m.moe_z_loss_coeff.has_value());
    EXPECT_FALSE(m.gradient_accumulation_fusion);
    EXPECT_EQ(m.vocab_size, 256);
    EXPECT_FALSE(c.ddp.use_distributed_optimizer);
}

// A recipe as shipped is valid (warnings allowed), for our runtime and for a GPU stack; tiny-moe
// also runs on our runtime as is.
TEST(Recipes, ValidateWithoutErrors) {
    for (auto name : recipe_names()) {
        Config c = make_recipe(name);
        const ValidationReport runtime = validate(c);
        EXPECT_TRUE(runtime.ok()) << name << ": "
                                  << ::testing::PrintToString(testing::ids(runtime.errors));
        c.env = {"h100", "2.7.1", "2.8.0"};
        EXPECT_TRUE(validate(c).ok()) << name;
    }
    const ValidationReport tiny = validate_for_run(make_recipe("tiny-moe"));
    EXPECT_TRUE(tiny.ok()) << ::testing::PrintToString(testing::ids(tiny.errors));
    EXPECT_TRUE(tiny.warnings.empty()) << ::testing::PrintToString(testing::ids(tiny.warnings));
}

}  // namespace
}  // namespace epo::config
