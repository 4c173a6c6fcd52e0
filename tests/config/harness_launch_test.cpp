// The reference harness's launch, precision, recompute and CUDA-graph flags (-ng, -g, -gn, -c,
// -rl, --recompute_modules, --cuda_graph_impl, --cuda_graph_scope), Megatron-LM's flag table and
// --num-layers-per-virtual-pipeline-stage, through apply_harness_overrides / build_config.
#include <gtest/gtest.h>

#include "config_test_util.h"
#include "epo/config/builder.h"
#include "epo/config/harness.h"
#include "epo/config/overrides.h"
#include "epo/config/yaml_io.h"

namespace epo::config {
namespace {

using testing::expect_error;

Config launched(const HarnessOverrides& h) {
    Config c = make_recipe("qwen3-30b-a3b");
    apply_harness_overrides(c, h);
    return c;
}

TEST(HarnessLaunch, GpuFamilySetsTheDeviceAndTheGpusPerNode) {
    HarnessOverrides h;
    h.gpu = "h100";
    h.num_gpus = 16;
    Config c = launched(h);
    EXPECT_EQ(c.env.gpu, "h100");
    EXPECT_EQ(c.comm.gpus_per_node, 8);
    EXPECT_EQ(c.comm.num_nodes, 2);
    h.gpu = "gb200";  // 4 per node: 16 GPUs are 4 nodes
    c = launched(h);
    EXPECT_EQ(c.comm.gpus_per_node, 4);
    EXPECT_EQ(c.comm.num_nodes, 4);
    EXPECT_EQ(default_gpus_per_node("b300"), 8);
    EXPECT_EQ(default_gpus_per_node("gb300"), 4);
    EXPECT_EQ(default_gpus_per_node("a100"), std::nullopt);
}

TEST(HarnessLaunch, GpusPerNodeFlagWinsOverTheFamily) {
    HarnessOverrides h;
    h.gpu = "h100";
    h.num_gpus = 8;
    h.gpus_per_node = 4;
    const Config c = launched(h);
    EXPECT_EQ(c.comm.gpus_per_node, 4);
    EXPECT_EQ(c.comm.num_nodes, 2);
}

TEST(HarnessLaunch, NumGpusBelowOneNodeIsOneNodeOfThem) {
    HarnessOverrides h;
    h.gpu = "h100";
    h.num_gpus = 4;
    const Config c = launched(h);
    EXPECT_EQ(c.comm.gpus_per_node, 4);
    EXPECT_EQ(c.comm.num_nodes, 1);
}

// The reference harness launches ceil(GPUs / per node) full nodes: 12 GPUs on nodes of 8 would
// be 16 ranks, not the 12 asked for.
TEST(HarnessLaunch, NumGpusThatLeavesANodePartFilledIsRefused) {
    HarnessOverrides h;
    h.gpu = "h100";
    h.num_gpus = 12;
    Config c = make_recipe("qwen3-30b-a3b");
    expect_error([&] { apply_harness_overrides(c, h); }, ErrorKind::kUsage,
                 {"-ng/--num_gpus 12", "ceil(12 / 8) = 2 nodes, 16 ranks", "-ng 16"});
    h.num_nodes = 3;
    h.num_gpus = 16;
    expect_error([&] { apply_harness_overrides(c, h); }, ErrorKind::kUsage,
                 {"--num_nodes 3 contradicts"});
}

TEST(HarnessLaunch, NumGpusWithoutAFamilyUsesTheConfigOrAsks) {
    HarnessOverrides h;
    h.num_gpus = 16;
    Config stated = make_recipe("qwen3-30b-a3b");
    stated.comm.gpus_per_node = 4;
    apply_harness_overrides(stated, h);
    EXPECT_EQ(stated.comm.num_nodes, 4);
    Config cpu = make_recipe("tiny-moe");  // env.gpu cpu: no count per node
    expect_error([&] { apply_harness_overrides(cpu, h); }, ErrorKind::kUsage,
                 {"give -gn/--gpus_per_node"});
}

TEST(HarnessLaunch, UnknownGpuIsRefusedWithTheKnownOnes) {
    HarnessOverrides h;
    h.gpu = "vr200";
    Config c = make_recipe("qwen3-30b-a3b");
    expect_error([&] { apply_harness_overrides(c, h); }, ErrorKind::kUsage,
                 {"-g/--gpu 'vr200'", "h100"});
}

TEST(HarnessLaunch, ComputeDtypeBf16SetsBf16) {
    HarnessOverrides h;
    h.compute_dtype = "bf16";
    Config c = make_recipe("tiny-moe");
    c.model.fp16 = true;
    apply_harness_overrides(c, h);
    EXPECT_TRUE(c.model.bf16);
    EXPECT_FALSE(c.model.fp16);
}

// The fp8 recipes set what Bridge's recipe of that name sets; nvfp4 is refused with the reason.
TEST(HarnessLaunch, Fp8ComputeDtypesSetBridgesRecipeAndFp4IsRefused) {
    const struct {
        const char* dtype;
        const char* fp8;
        const char* recipe;
    } cases[] = {{"fp8_cs", "hybrid", "tensorwise"},
                 {"fp8_mx", "e4m3", "mxfp8"},
                 {"fp8_sc", "hybrid", "blockwise"}};
    for (const auto& k : cases) {
        HarnessOverrides h;
        h.compute_dtype = k.dtype;
        Config c = make_recipe("tiny-moe");
        apply_harness_overrides(c, h);
        EXPECT_TRUE(c.model.bf16) << k.dtype;
        EXPECT_EQ(c.model.fp8, k.fp8) << k.dtype;
        EXPECT_EQ(c.model.fp8_recipe, k.recipe) << k.dtype;
    }
    HarnessOverrides h;
    h.compute_dtype = "nvfp4";
    Config c = make_recipe("tiny-moe");
    expect_error([&] { apply_harness_overrides(c, h); }, ErrorKind::kUsage,
                 {"nvfp4", "does not model FP4", "use -c bf16"});
    h.compute_dtype = "fp32";
    expect_error([&] { apply_harness_overrides(c, h); }, ErrorKind::kUsage, {"takes bf16, fp8_cs"});
}

TEST(HarnessLaunch, RecomputeNumLayersIsFullBlockRecompute) {
    HarnessOverrides h;
    h.recompute_num_layers = 2;
    const Config c = launched(h);
    EXPECT_EQ(c.model.recompute_granularity, RecomputeGranularity::kFull);
    EXPECT_EQ(c.model.recompute_method, RecomputeMethod::kBlock);
    EXPECT_EQ(c.model.recompute_num_layers, 2);
}

TEST(HarnessLaunch, RecomputeModulesAreSelectiveRecompute) {
    HarnessOverrides h;
    h.recompute_modules = std::vector<std::string>{"core_attn", "moe_act"};
    const Config c = launched(h);
    EXPECT_EQ(c.model.recompute_granularity, RecomputeGranularity::kSelective);
    EXPECT_EQ(c.model.recompute_modules,
              (std::vector<RecomputeModule>{RecomputeModule::kCoreAttn, RecomputeModule::kMoeAct}));
    h.recompute_modules = std::vector<std::string>{"attention"};
    Config bad = make_recipe("tiny-moe");
    expect_error([&] { apply_harness_overrides(bad, h); }, ErrorKind::kUsage,
                 {"--recompute_modules takes", "core_attn", "'attention'"});
}

TEST(HarnessLaunch, CudaGraphImplAndScope) {
    HarnessOverrides h;
    h.cuda_graph_impl = "transformer_engine";
    h.cuda_graph_scope = std::vector<std::string>{"attn", "moe_router"};
    Config c = launched(h);
    EXPECT_EQ(c.model.cuda_graph_impl, CudaGraphImpl::kTransformerEngine);
    EXPECT_EQ(c.model.cuda_graph_modules,
              (std::vector<CudaGraphModule>{CudaGraphModule::kAttn, CudaGraphModule::kMoeRouter}));
    EXPECT_FALSE(c.model.cuda_graph_scope.has_value());

    h.cuda_graph_impl = "local";
    h.cuda_graph_scope = std::vector<std::string>{"full_iteration"};
    c = launched(h);
    EXPECT_TRUE(c.model.cuda_graph_modules.empty());
    EXPECT_EQ(c.model.cuda_graph_scope, CudaGraphScopeValue(std::string("full_iteration")));
}

TEST(HarnessLaunch, CudaGraphScopesTheReferenceRefusesAreRefused) {
    const auto refused = [](std::optional<std::string> impl, std::vector<std::string> scope,
                            const char* part) {
        HarnessOverrides h;
        h.cuda_graph_impl = std::move(impl);
        h.cuda_graph_scope = std::move(scope);
        Config c = make_recipe("tiny-moe");
        expect_error([&] { apply_harness_overrides(c, h); }, ErrorKind::kUsage, {part});
    };
    refused(std::nullopt, {"attn"}, "needs a CUDA-graph implementation");
    refused("transformer_engine", {"full_iteration"}, "needs --cuda_graph_impl local");
    refused("local", {"full_iteration", "attn"}, "stands alone");
    refused("transformer_engine", {"attention"}, "--cuda_graph_scope takes");
    refused("graphs", {"attn"}, "--cuda_graph_impl takes");
}

// Every Megatron-LM flag is spelled with dashes and names a configuration key that exists (the CLI
// tests apply each one and find the value in the printed configuration).
TEST(HarnessLaunch, EveryMegatronFlagNamesAConfigKey) {
    const std::string yaml = to_yaml(make_recipe("qwen3-30b-a3b"));
    for (const MegatronFlag& m : megatron_flags()) {
        const std::string flag = m.flag;
        const std::string key = m.key;
        EXPECT_EQ(flag.rfind("--", 0), 0u) << flag;
        EXPECT_EQ(flag.find('_'), std::string::npos) << flag;  // Megatron-LM's dashed spelling
        const std::string field = key.substr(key.find('.') + 1);
        EXPECT_NE(yaml.find("\n  " + field + ":"), std::string::npos) << flag << " -> " << key;
        if (m.is_switch) {
            Config c = make_recipe("qwen3-30b-a3b");
            EXPECT_NO_THROW(apply_override(c, parse_override(key + "=true"))) << flag;
        }
    }
}

TEST(HarnessLaunch, LayersPerVirtualStageBecomeTheVirtualPipelineSize) {
    ConfigSources s;
    s.model = "qwen3-30b-a3b";  // 48 layers
    s.overrides = {"model.pipeline_model_parallel_size=4"};
    s.num_layers_per_virtual_pipeline_stage = 3;  // 12 layers per rank, 4 chunks
    EXPECT_EQ(build_config(s).config.model.virtual_pipeline_model_parallel_size, 4);
    s.num_layers_per_virtual_pipeline_stage = 5;
    expect_error([&] { build_config(s); }, ErrorKind::kUsage,
                 {"--num-layers-per-virtual-pipeline-stage 5", "48 layers over PP 4"});
    s.overrides.clear();
    s.num_layers_per_virtual_pipeline_stage = 3;
    expect_error([&] { build_config(s); }, ErrorKind::kUsage, {"needs pipeline parallelism"});
}

}  // namespace
}  // namespace epo::config
