#include "epo/config/config.h"

#include <gtest/gtest.h>

#include <set>

#include "config_test_util.h"
#include "epo/config/json_io.h"

namespace epo::config {
namespace {

using testing::ep_overlap_config;

TEST(ConfigKeys, ListsEveryLeafOnceInFieldOrder) {
    const auto& keys = known_keys();
    const std::set<std::string> unique(keys.begin(), keys.end());
    EXPECT_EQ(unique.size(), keys.size());
    EXPECT_EQ(keys.front(), "recipe");
    for (const char* key :
         {"model.hidden_size", "model.moe_flex_dispatcher_backend", "comm_overlap.tp_comm_overlap",
          "comm_overlap.delay_wgrad_compute", "ddp.delay_wgrad_compute", "comm.link.latency_us",
          "comm.gpus_per_node", "comm.timeout_s", "train.lr_decay_style", "dataset.path",
          "checkpoint.save_interval", "logger.trace", "env.te_version"}) {
        EXPECT_TRUE(unique.count(key)) << key;
    }
    // Sections are not keys of their own.
    EXPECT_FALSE(unique.count("model"));
    EXPECT_FALSE(unique.count("comm.link"));
}

TEST(ConfigKeys, ClosestKeyFindsTyposInPathsAndLeaves) {
    EXPECT_EQ(closest_key("model.hiden_size"), "model.hidden_size");
    EXPECT_EQ(closest_key("hidden_size"), "model.hidden_size");
    EXPECT_EQ(closest_key("comm_overlap.overlap_moe_expert_parallel_com"),
              "comm_overlap.overlap_moe_expert_parallel_comm");
    EXPECT_EQ(closest_key("modle.num_layers"), "model.num_layers");
    EXPECT_EQ(closest_key("train.lr_warmup_iter"), "train.lr_warmup_iters");
    EXPECT_FALSE(closest_key("completely.unrelated_thing_xyz").has_value());
    EXPECT_FALSE(closest_key(std::string(1000, 'a')).has_value());
    EXPECT_NE(unknown_key_message("model.hiden_size").find("did you mean 'model.hidden_size'"),
              std::string::npos);
    EXPECT_NE(unknown_key_message("zzzzzz.qqqqqq").find("docs/config.md"), std::string::npos);
}

TEST(ConfigDiff, NamesEveryDifferingKey) {
    Config a = make_recipe("tiny-moe");
    Config b = a;
    EXPECT_TRUE(diff_configs(a, b).empty());
    EXPECT_EQ(a, b);
    b.model.num_layers = 4;
    b.comm.link.latency_us = 5.0;
    b.comm_overlap.emplace();
    const auto diff = diff_configs(a, b);
    EXPECT_NE(a, b);
    ASSERT_EQ(diff.size(), 3u) << ::testing::PrintToString(diff);
    EXPECT_EQ(diff[0], "model.num_layers: 2 vs 4");
    EXPECT_NE(diff[1].find("comm_overlap: null vs {"), std::string::npos) << diff[1];
    EXPECT_EQ(diff[2], "comm.link.latency_us: null vs 5.0");
}

TEST(ConfigDerived, DefaultsFollowMegatron) {
    Config c;
    c.model.hidden_size = 1024;
    c.model.num_attention_heads = 16;
    EXPECT_EQ(ffn_hidden_size(c.model), 4096);
    EXPECT_EQ(moe_ffn_hidden_size(c.model), 4096);
    EXPECT_EQ(num_query_groups(c.model), 16);
    EXPECT_EQ(kv_channels(c.model), 64);
    c.model.tensor_model_parallel_size = 2;
    EXPECT_EQ(expert_tensor_parallel_size(c.model), 2);  // null ETP follows TP
    c.model.expert_tensor_parallel_size = 1;
    EXPECT_EQ(expert_tensor_parallel_size(c.model), 1);
    EXPECT_EQ(virtual_pipeline_size(c.model), 1);
    EXPECT_FALSE(is_moe(c.model));
    c.model.num_moe_experts = 0;
    EXPECT_FALSE(is_moe(c.model));
    c.model.num_moe_experts = 8;
    EXPECT_TRUE(is_moe(c.model));
}

TEST(ConfigDerived, DataParallelSizeAndMicroBatches) {
    Config c = ep_overlap_config();
    c.comm.num_nodes = 2;
    c.comm.gpus_per_node = 8;
    c.model.tensor_model_parallel_size = 2;
    EXPECT_EQ(world_size(c), 16);
    EXPECT_EQ(data_parallel_size(c), 8);
    c.train.micro_batch_size = 2;
    c.train.global_batch_size = 64;
    EXPECT_EQ(num_microbatches(c), 4);
    c.train.global_batch_size.reset();  // null: micro x DP
    EXPECT_EQ(global_batch_size(c), 16);
    c.comm_overlap->data_parallel_size = 2;  // the user's value wins
    EXPECT_EQ(data_parallel_size(c), 2);
    c.model.tensor_model_parallel_size = 0;  // out of range: no division by zero
    c.comm_overlap->data_parallel_size.reset();
    EXPECT_EQ(data_parallel_size(c), 16);
}

TEST(ConfigDerived, MoeLayerPatternFromIntAndList) {
    ModelConfig m;
    m.num_layers = 6;
    m.num_moe_experts = 4;
    m.moe_layer_freq = 2;
    EXPECT_EQ(moe_layer_pattern(m), (std::vector<bool>{true, false, true, false, true, false}));
    m.moe_layer_freq = std::vector<int>{0, 0, 1, 1, 1, 1};
    EXPECT_EQ(moe_layer_pattern(m), (std::vector<bool>{false, false, true, true, true, true}));
    m.num_moe_experts.reset();
    EXPECT_EQ(moe_layer_pattern(m), std::vector<bool>(6, false));
    const Config deepseek = make_recipe("deepseek-v3");
    const auto pattern = moe_layer_pattern(deepseek.model);
    EXPECT_EQ(std::count(pattern.begin(), pattern.end(), false), 3);
    EXPECT_FALSE(pattern[2]);
    EXPECT_TRUE(pattern[3]);
}

TEST(ConfigDerived, GraphedModulesFromModulesAndLegacyScope) {
    ModelConfig m;
    EXPECT_TRUE(graphed_module_names(m).empty());
    m.cuda_graph_modules = {CudaGraphModule::kMoeRouter};
    m.cuda_graph_scope = std::string("CudaGraphScope.attn, mlp,full");
    EXPECT_EQ(graphed_module_names(m), (std::vector<std::string>{"moe_router", "attn", "mlp"}));
    EXPECT_TRUE(is_graphed(m, "attn"));
    EXPECT_FALSE(is_graphed(m, "moe"));
    m.cuda_graph_scope = std::vector<std::string>{"full"};
    EXPECT_EQ(graphed_module_names(m), (std::vector<std::string>{"moe_router"}));
    m.cuda_graph_scope = std::string("");
    EXPECT_EQ(graphed_module_names(m).size(), 1u);
}

TEST(ConfigDerived, LinkModelOffUnlessABandwidthOrLatencyIsPositive) {
    CommConfig comm;
    EXPECT_FALSE(link_model_enabled(comm));
    comm.link.inter_node_gbps = 0.0;
    EXPECT_FALSE(link_model_enabled(comm));
    comm.link.inter_node_gbps = 100.0;
    EXPECT_TRUE(link_model_enabled(comm));
}

TEST(ConfigEnums, SpellingsRoundTrip) {
    EXPECT_EQ(enum_name(DispatcherType::kFlex), "flex");
    EXPECT_EQ(parse_enum<DispatcherType>("alltoall"), DispatcherType::kAlltoall);
    EXPECT_FALSE(parse_enum<DispatcherType>("Alltoall").has_value());
    EXPECT_EQ(enum_name(CudaGraphImpl::kTransformerEngine), "transformer_engine");
    EXPECT_EQ(enum_choices<FlexBackend>(), "deepep or hybridep");
    EXPECT_EQ(parse_enum<Normalization>("RMSNorm"), Normalization::kRMSNorm);
}

TEST(ConfigLimits, DescribeAndContain) {
    EXPECT_EQ(Limits::at_least(1).describe(), "at least 1");
    EXPECT_EQ(Limits::above(0).describe(), "greater than 0");
    EXPECT_EQ(Limits::between(0, 1).describe(), "between 0 and 1");
    EXPECT_TRUE(Limits::above(0).contains(1e-9));
    EXPECT_FALSE(Limits::above(0).contains(0));
    EXPECT_TRUE(Limits::none().contains(-1e300));
}

TEST(ConfigJson, EveryFieldInOrderWithNulls) {
    const auto json = to_json(make_recipe("tiny-moe"));
    EXPECT_EQ(json.begin().key(), "recipe");
    EXPECT_EQ(json["recipe"], "tiny-moe");
    EXPECT_TRUE(json["comm_overlap"].is_null());
    EXPECT_EQ(json["model"]["moe_token_dispatcher_type"], "alltoall");
    EXPECT_TRUE(json["model"]["moe_flex_dispatcher_backend"].is_null());
    EXPECT_EQ(json["model"]["moe_layer_freq"], 1);
    EXPECT_EQ(to_json(make_recipe("deepseek-v3"))["model"]["moe_layer_freq"].size(), 61u);
}

}  // namespace
}  // namespace epo::config
