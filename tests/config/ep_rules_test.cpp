// EP001-EP013: each rule in both directions, on the reference suites' passing configuration.
#include <gtest/gtest.h>

#include <functional>

#include "config_test_util.h"
#include "epo/config/harness.h"
#include "epo/config/validate.h"

namespace epo::config {
namespace {

using testing::ep_overlap_config;
using testing::has;
using testing::ids;

ValidationReport check(const std::function<void(Config&)>& change) {
    Config c = ep_overlap_config();
    change(c);
    return validate(c);
}

bool fires(const char* id, const std::function<void(Config&)>& change) {
    return has(check(change).errors, id);
}

TEST(EpRules, BaseConfigPassesAndIsFinalizedOn) {
    const ValidationReport r = validate(ep_overlap_config());
    EXPECT_TRUE(r.ok()) << ::testing::PrintToString(ids(r.errors));
    EXPECT_TRUE(r.warnings.empty()) << ::testing::PrintToString(ids(r.warnings));
    EXPECT_TRUE(r.config.model.overlap_moe_expert_parallel_comm);
}

TEST(EpRules, NotCheckedWithoutEpOverlap) {
    const ValidationReport r = check([](Config& c) {
        c.comm_overlap->overlap_moe_expert_parallel_comm = false;
        c.model.expert_model_parallel_size = 1;
        c.model.moe_token_dispatcher_type = DispatcherType::kAllgather;
        c.model.recompute_granularity = RecomputeGranularity::kFull;
        c.model.mtp_num_layers = 3;
    });
    for (const auto& id : ids(r.errors)) {
        EXPECT_NE(id.substr(0, 2), "EP") << id;
    }
}

TEST(EpRules, EP001NeedsExpertParallelism) {
    EXPECT_TRUE(fires("EP001", [](Config& c) { c.model.expert_model_parallel_size = 1; }));
    EXPECT_FALSE(fires("EP001", [](Config& c) { c.model.expert_model_parallel_size = 2; }));
}

TEST(EpRules, EP002NullOrOneExpertIsAnErrorNotACrash) {
    const ValidationReport dense = check([](Config& c) { c.model.num_moe_experts.reset(); });
    EXPECT_TRUE(has(dense.errors, "EP002"));
    EXPECT_EQ(testing::get(dense.errors, "EP002").value, "null");
    EXPECT_TRUE(fires("EP002", [](Config& c) { c.model.num_moe_experts = 1; }));
    EXPECT_FALSE(fires("EP002", [](Config& c) { c.model.num_moe_experts = 2; }));
}

TEST(EpRules, EP003NeedsAlltoallOrFlex) {
    EXPECT_TRUE(fires("EP003", [](Config& c) {
        c.model.moe_token_dispatcher_type = DispatcherType::kAllgather;
    }));
    EXPECT_FALSE(fires("EP003", [](Config& c) {
        c.model.moe_token_dispatcher_type = DispatcherType::kFlex;
        c.model.moe_flex_dispatcher_backend = FlexBackend::kDeepep;
    }));
}

TEST(EpRules, EP004NeedsBf16OrFp16) {
    EXPECT_TRUE(fires("EP004", [](Config& c) { c.model.bf16 = false; }));
    EXPECT_FALSE(fires("EP004", [](Config& c) {
        c.model.bf16 = false;
        c.model.fp16 = true;
    }));
}

TEST(EpRules, EP005TorchVersionForADeclaredStack) {
    const auto torch = [](const char* version) {
        return [=](Config& c) { c.env.torch_version = version; };
    };
    EXPECT_TRUE(fires("EP005", torch("2.5.1")));
    EXPECT_TRUE(fires("EP005", torch("2.6.0a0+ecf3bae40a")));  // a pre-release of 2.6.0
    EXPECT_FALSE(fires("EP005", torch("2.6.0")));
    EXPECT_FALSE(fires("EP005", torch("2.10.0")));
    EXPECT_FALSE(fires("EP005", torch("2.7.0+cu126")));
    // Our runtime: no version rule, the MPI thread level is checked at start-up instead.
    const ValidationReport runtime = validate(ep_overlap_config());
    EXPECT_FALSE(has(runtime.errors, "EP005"));
    ASSERT_EQ(runtime.notes.size(), 1u);
    EXPECT_NE(runtime.notes[0].find("MPI_THREAD_MULTIPLE"), std::string::npos);
    EXPECT_EQ(runtime.target, "epo runtime");
}

TEST(EpRules, EP006NeedsVirtualPipelineWithPipelineParallelism) {
    const auto pp = [](std::optional<int> vpp) {
        return [=](Config& c) {
            c.model.num_layers = 4;
            c.model.pipeline_model_parallel_size = 2;
            c.model.virtual_pipeline_model_parallel_size = vpp;
        };
    };
    EXPECT_TRUE(fires("EP006", pp(std::nullopt)));
    EXPECT_FALSE(fires("EP006", pp(2)));
}

TEST(EpRules, EP007To010Recompute) {
    // Full recompute runs with EP overlap (Megatron-LM's dev branch, epo); EP007 warns that
    // Megatron-Bridge refuses it, and its method and layer count are allowed.
    const ValidationReport full = check([](Config& c) {
        c.model.recompute_granularity = RecomputeGranularity::kFull;
        c.model.recompute_method = RecomputeMethod::kUniform;
        c.model.recompute_num_layers = 1;
    });
    EXPECT_TRUE(full.ok()) << ::testing::PrintToString(ids(full.errors));
    EXPECT_TRUE(has(full.warnings, "EP007")) << ::testing::PrintToString(ids(full.warnings));
    EXPECT_FALSE(fires("EP007", [](Config& c) {
        c.model.recompute_granularity = RecomputeGranularity::kSelective;
    }));
    EXPECT_TRUE(
        fires("EP008", [](Config& c) { c.model.recompute_method = RecomputeMethod::kUniform; }));
    EXPECT_FALSE(fires("EP008", [](Config& c) { c.model.recompute_method.reset(); }));
    EXPECT_TRUE(fires("EP009", [](Config& c) { c.model.recompute_num_layers = 2; }));
    EXPECT_FALSE(fires("EP009", [](Config& c) { c.model.recompute_num_layers.reset(); }));
    // The reference suites' case: selective recompute of [moe] is rejected.
    EXPECT_TRUE(fires("EP010", [](Config& c) {
        c.model.recompute_granularity = RecomputeGranularity::kSelective;
        c.model.recompute_modules = std::vector<RecomputeModule>{RecomputeModule::kMoe};
    }));
    EXPECT_FALSE(fires("EP010", [](Config& c) {
        c.model.recompute_granularity = RecomputeGranularity::kSelective;
        c.model.recompute_modules = std::vector<RecomputeModule>{RecomputeModule::kCoreAttn};
    }));
}

TEST(EpRules, EP011SharedExpertOverlapMustBeOff) {
    EXPECT_TRUE(fires("EP011", [](Config& c) { c.model.moe_shared_expert_overlap = true; }));
    EXPECT_FALSE(fires("EP011", [](Config& c) { c.model.moe_shared_expert_overlap = false; }));
}

TEST(EpRules, EP012AtMostOneMtpLayer) {
    EXPECT_TRUE(fires("EP012", [](Config& c) { c.model.mtp_num_layers = 2; }));
    for (std::optional<int> ok :
         {std::optional<int>(), std::optional<int>(0), std::optional<int>(1)}) {
        EXPECT_FALSE(fires("EP012", [=](Config& c) { c.model.mtp_num_layers = ok; }));
    }
}

TEST(EpRules, EP013TransformerEngineGraphsOfMoeOrMlp) {
    const auto graphs = [](CudaGraphImpl impl, std::vector<CudaGraphModule> modules,
                           std::optional<CudaGraphScopeValue> legacy = std::nullopt) {
        return [=](Config& c) {
            c.model.cuda_graph_impl = impl;
            c.model.cuda_graph_modules = modules;
            c.model.cuda_graph_scope = legacy;
        };
    };
    using M = CudaGraphModule;
    EXPECT_TRUE(fires("EP013", graphs(CudaGraphImpl::kTransformerEngine, {M::kAttn, M::kMoe})));
    EXPECT_TRUE(fires("EP013", graphs(CudaGraphImpl::kTransformerEngine, {M::kMlp})));
    EXPECT_TRUE(
        fires("EP013", graphs(CudaGraphImpl::kTransformerEngine, {},
                              CudaGraphScopeValue(std::string("attn,CudaGraphScope.moe")))));
    EXPECT_FALSE(fires("EP013", graphs(CudaGraphImpl::kTransformerEngine,
                                       {M::kAttn, M::kMoeRouter, M::kMoePreprocess})));
    EXPECT_FALSE(fires("EP013", graphs(CudaGraphImpl::kLocal, {M::kMoe})));
}

TEST(EpRules, EveryViolationAtOnce) {
    const ValidationReport r = check([](Config& c) {
        c.model.expert_model_parallel_size = 1;
        c.model.moe_token_dispatcher_type = DispatcherType::kAllgather;
        c.model.bf16 = false;
        c.env.torch_version = "2.4.0";
        c.model.recompute_granularity = RecomputeGranularity::kFull;
        c.model.recompute_method = RecomputeMethod::kBlock;
        c.model.recompute_num_layers = 1;
        c.model.recompute_modules = std::vector<RecomputeModule>{RecomputeModule::kMoe};
        c.model.moe_shared_expert_overlap = true;
        c.model.mtp_num_layers = 2;
        c.model.cuda_graph_impl = CudaGraphImpl::kTransformerEngine;
        c.model.cuda_graph_modules = {CudaGraphModule::kMoe};
    });
    for (const char* id :
         {"EP001", "EP003", "EP004", "EP005", "EP010", "EP011", "EP012", "EP013"}) {
        EXPECT_TRUE(has(r.errors, id)) << id;
    }
    // Full recompute runs with EP overlap (EP007 warns that Bridge refuses it), its method and
    // layer count with it (EP008, EP009 are for them without full recompute).
    EXPECT_TRUE(has(r.warnings, "EP007"));
    for (const auto& f : r.errors) {
        EXPECT_FALSE(f.field.empty()) << f.id;
        EXPECT_FALSE(f.message.empty()) << f.id;
        EXPECT_FALSE(f.fix.empty()) << f.id;
    }
}

// DeepSeek's recipe overlaps its shared expert: asking for EP overlap by hand trips EP011, the
// harness shortcut (which turns shared-expert overlap off) does not.
TEST(EpRules, SharedExpertOverlapWithAndWithoutTheShortcut) {
    Config by_hand = make_recipe("deepseek-v3");
    by_hand.comm_overlap.emplace();
    by_hand.comm_overlap->overlap_moe_expert_parallel_comm = true;
    EXPECT_TRUE(has(validate(by_hand).errors, "EP011"));
    Config shortcut = make_recipe("deepseek-v3");
    HarnessOverrides h;
    h.moe_a2a_overlap = true;
    apply_harness_overrides(shortcut, h);
    EXPECT_FALSE(has(validate(shortcut).errors, "EP011"));
}

}  // namespace
}  // namespace epo::config
