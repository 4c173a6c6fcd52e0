#include "epo/config/harness.h"

#include <gtest/gtest.h>

#include "config_test_util.h"
#include "epo/config/builder.h"

namespace epo::config {
namespace {

using testing::expect_error;
using testing::ids;

TEST(Harness, NothingGivenChangesNothing) {
    Config c = make_recipe("deepseek-v3");
    const Config before = c;
    HarnessOverrides h;
    EXPECT_TRUE(apply_harness_overrides(c, h).empty());
    EXPECT_EQ(c, before);
    h.moe_a2a_overlap = false;  // false changes nothing either
    apply_harness_overrides(c, h);
    EXPECT_EQ(c, before);
}

TEST(Harness, A2aOverlapSetsBothAndCreatesTheSection) {
    Config c = make_recipe("deepseek-v3");
    ASSERT_FALSE(c.comm_overlap.has_value());
    HarnessOverrides h;
    h.moe_a2a_overlap = true;
    apply_harness_overrides(c, h);
    ASSERT_TRUE(c.comm_overlap.has_value());
    EXPECT_EQ(c.comm_overlap->overlap_moe_expert_parallel_comm, true);
    EXPECT_EQ(c.comm_overlap->delay_wgrad_compute, true);
    EXPECT_EQ(c.comm_overlap->tp_comm_overlap, false);  // TP 1
    EXPECT_FALSE(c.model.moe_shared_expert_overlap);

    Config tp2 = make_recipe("qwen3-30b-a3b");
    tp2.model.tensor_model_parallel_size = 2;
    apply_harness_overrides(tp2, h);
    EXPECT_EQ(tp2.comm_overlap->tp_comm_overlap, true);

    Config existing = make_recipe("tiny-moe");  // an existing section keeps its other values
    existing.comm_overlap.emplace();
    existing.comm_overlap->bucket_size = 77;
    apply_harness_overrides(existing, h);
    EXPECT_EQ(existing.comm_overlap->bucket_size, 77);
    EXPECT_EQ(existing.comm_overlap->tp_comm_overlap, std::nullopt);
    EXPECT_EQ(existing.comm_overlap->delay_wgrad_compute, true);
}

// The shortcut runs before the parallel sizes: -tp 2 in the same command does not turn on TP
// overlap in the section it creates (TP was still 1), but does set sequence parallelism.
TEST(Harness, A2aShortcutRunsBeforeParallelSizes) {
    Config c = make_recipe("qwen3-30b-a3b");
    HarnessOverrides h;
    h.moe_a2a_overlap = true;
    h.tensor_model_parallel_size = 2;
    apply_harness_overrides(c, h);
    EXPECT_EQ(c.comm_overlap->tp_comm_overlap, false);
    EXPECT_EQ(c.model.tensor_model_parallel_size, 2);
    EXPECT_TRUE(c.model.sequence_parallel);
}

TEST(Harness, ParallelSizesAndSequenceParallel) {
    Config c = make_recipe("qwen3-235b-a22b");
    c.model.sequence_parallel = true;
    HarnessOverrides h;
    h.tensor_model_parallel_size = 1;
    h.pipeline_model_parallel_size = 8;
    h.virtual_pipeline_model_parallel_size = std::optional<int>(4);
    h.expert_model_parallel_size = 32;
    h.expert_tensor_parallel_size = 1;
    h.context_parallel_size = 2;
    h.num_nodes = 32;
    h.gpus_per_node = 8;
    apply_harness_overrides(c, h);
    EXPECT_FALSE(c.model.sequence_parallel);  // -tp 1
    EXPECT_EQ(c.model.pipeline_model_parallel_size, 8);
    EXPECT_EQ(c.model.virtual_pipeline_model_parallel_size, 4);
    EXPECT_EQ(c.model.expert_model_parallel_size, 32);
    EXPECT_EQ(c.model.expert_tensor_parallel_size, 1);
    EXPECT_EQ(c.model.context_parallel_size, 2);
    EXPECT_EQ(world_size(c), 256);
    HarnessOverrides none;
    none.virtual_pipeline_model_parallel_size = std::optional<int>();  // -vp None
    apply_harness_overrides(c, none);
    EXPECT_FALSE(c.model.virtual_pipeline_model_parallel_size.has_value());
}

TEST(Harness, BatchSequenceAndShape) {
    Config c = make_recipe("deepseek-v3");
    HarnessOverrides h;
    h.global_batch_size = 64;
    h.micro_batch_size = 2;
    h.seq_length = 512;
    h.max_steps = 7;
    h.hidden_size = 512;
    h.num_layers = 6;
    h.num_moe_experts = 16;
    apply_harness_overrides(c, h);
    EXPECT_EQ(c.train.global_batch_size, 64);
    EXPECT_EQ(c.train.micro_batch_size, 2);
    EXPECT_EQ(c.model.seq_length, 512);
    EXPECT_EQ(c.train.train_iters, 7);
    EXPECT_EQ(c.model.hidden_size, 512);
    EXPECT_EQ(c.model.num_layers, 6);
    EXPECT_EQ(c.model.num_moe_experts, 16);
    // The first three layers stay dense.
    EXPECT_EQ(c.model.moe_layer_freq, MoeLayerFreq(std::vector<int>{0, 0, 0, 1, 1, 1}));
    HarnessOverrides too_few;
    too_few.num_layers = 2;
    expect_error([&] { apply_harness_overrides(c, too_few); }, ErrorKind::kUsage,
                 {"--num_layers 2", "3 dense layers"});
    too_few.num_layers = kMaxNumLayers + 1;
    expect_error([&] { apply_harness_overrides(c, too_few); }, ErrorKind::kUsage, {"outside"});
    Config every = make_recipe("tiny-moe");  // an integer frequency stays as it is
    HarnessOverrides layers;
    layers.num_layers = 8;
    apply_harness_overrides(every, layers);
    EXPECT_EQ(every.model.moe_layer_freq, MoeLayerFreq(1));
}

TEST(Harness, FlexBackendNoneForcesAlltoall) {
    Config c = make_recipe("tiny-moe");
    c.model.moe_token_dispatcher_type = DispatcherType::kFlex;
    c.model.moe_flex_dispatcher_backend = FlexBackend::kDeepep;
    HarnessOverrides h;
    h.moe_flex_dispatcher_backend = std::optional<std::string>();
    apply_harness_overrides(c, h);
    EXPECT_EQ(c.model.moe_token_dispatcher_type, DispatcherType::kAlltoall);
    EXPECT_FALSE(c.model.moe_flex_dispatcher_backend.has_value());
}

TEST(Harness, FlexBackendRunsTheActivationLastOnTheConfiguredDevice) {
    Config c = make_recipe("deepseek-v3");
    c.env.gpu = "h100";
    HarnessOverrides h;
    h.moe_flex_dispatcher_backend = std::optional<std::string>("deepep");
    h.num_moe_experts = 0;  // applied before the flex step, which then sees a dense model
    EXPECT_EQ(ids(apply_harness_overrides(c, h)), std::vector<std::string>{"W006"});

    Config ok = make_recipe("deepseek-v3");
    ok.env.gpu = "h100";
    h.num_moe_experts = 64;
    EXPECT_TRUE(apply_harness_overrides(ok, h).empty());
    EXPECT_EQ(ok.model.moe_token_dispatcher_type, DispatcherType::kFlex);
    EXPECT_FALSE(ok.model.moe_shared_expert_overlap);

    Config volta = make_recipe("deepseek-v3");
    volta.env.gpu = "v100";
    EXPECT_EQ(ids(apply_harness_overrides(volta, h)), std::vector<std::string>{"W007"});
    EXPECT_EQ(volta.model.moe_token_dispatcher_type, DispatcherType::kAlltoall);

    int calls = 0;
    const DeviceProbe injected = [&] {
        ++calls;
        return DeviceInfo{"x", "NVIDIA X", 9, 0};
    };
    Config probed = make_recipe("deepseek-v3");
    probed.env.gpu = "v100";  // the injected probe replaces the table
    EXPECT_TRUE(apply_harness_overrides(probed, h, injected).empty());
    EXPECT_EQ(calls, 1);
}

TEST(Builder, PrecedenceRecipeYamlHarnessOverrides) {
    ConfigSources s;
    s.config_text =
        "recipe: tiny-moe\n"
        "model:\n"
        "  num_layers: 4\n"
        "  hidden_size: 512\n"
        "  tensor_model_parallel_size: 2\n";
    s.harness.tensor_model_parallel_size = 1;  // beats the YAML
    s.harness.seq_length = 64;
    s.overrides = {"model.seq_length=32", "model.num_layers=6"};  // beat harness and YAML
    const BuiltConfig built = build_config(s);
    EXPECT_EQ(built.config.recipe, "tiny-moe");
    EXPECT_EQ(built.config.model.vocab_size, 256);                // recipe
    EXPECT_EQ(built.config.model.hidden_size, 512);               // YAML over recipe
    EXPECT_EQ(built.config.model.tensor_model_parallel_size, 1);  // harness over YAML
    EXPECT_EQ(built.config.model.seq_length, 32);                 // override over harness
    EXPECT_EQ(built.config.model.num_layers, 6);
}

TEST(Builder, EnvOverridesReachTheFlexActivation) {
    ConfigSources s;
    s.model = "deepseek-v3";
    s.harness.moe_flex_dispatcher_backend = std::optional<std::string>("deepep");
    s.overrides = {"env.gpu=v100"};
    const BuiltConfig built = build_config(s);
    EXPECT_EQ(ids(built.warnings), std::vector<std::string>{"W007"});
    EXPECT_EQ(built.config.model.moe_token_dispatcher_type, DispatcherType::kAlltoall);
    EXPECT_EQ(built.config.env.gpu, "v100");
}

TEST(Builder, UsageErrors) {
    expect_error([] { build_config({}); }, ErrorKind::kUsage, {"give a CONFIG.yaml or --model"});
    ConfigSources conflict;
    conflict.model = "tiny-moe";
    conflict.config_text = "recipe: deepseek-v3\n";
    expect_error([&] { build_config(conflict); }, ErrorKind::kUsage,
                 {"names recipe 'deepseek-v3'", "--model says 'tiny-moe'"});
    ConfigSources same = conflict;
    same.config_text = "recipe: tiny-moe\n";
    EXPECT_EQ(build_config(same).config, make_recipe("tiny-moe"));
    ConfigSources bad_override;
    bad_override.model = "tiny-moe";
    bad_override.overrides = {"model.hidden=1"};
    expect_error([&] { build_config(bad_override); }, ErrorKind::kUsage, {"did you mean"});
    ConfigSources unknown_gpu;
    unknown_gpu.model = "tiny-moe";
    unknown_gpu.overrides = {"env.gpu=tpu"};
    unknown_gpu.harness.moe_flex_dispatcher_backend = std::optional<std::string>("deepep");
    expect_error([&] { build_config(unknown_gpu); }, ErrorKind::kConfig, {"names no known device"});
}

}  // namespace
}  // namespace epo::config
