// WG001-WG006: each rule in both directions, including the reference suites' cases.
#include <gtest/gtest.h>

#include <functional>

#include "config_test_util.h"
#include "epo/config/validate.h"

namespace epo::config {
namespace {

using testing::delay_wgrad_config;
using testing::has;
using testing::ids;

bool fires(const char* id, const std::function<void(Config&)>& change) {
    Config c = delay_wgrad_config();
    change(c);
    return has(validate(c).errors, id);
}

void graph_attn(Config& c) {
    c.model.cuda_graph_impl = CudaGraphImpl::kTransformerEngine;
    c.model.cuda_graph_modules = {CudaGraphModule::kAttn};
}

TEST(WgradRules, DelayWgradWithEpOverlapPasses) {
    const ValidationReport r = validate(delay_wgrad_config());
    EXPECT_TRUE(r.ok()) << ::testing::PrintToString(ids(r.errors));
    EXPECT_TRUE(r.config.model.delay_wgrad_compute);
    // Also with gradient-accumulation fusion and a distributed optimizer overlapping grad-reduce.
    Config c = delay_wgrad_config();
    c.model.gradient_accumulation_fusion = true;
    c.ddp.use_distributed_optimizer = true;
    c.ddp.overlap_grad_reduce = true;
    const ValidationReport fused = validate(c);
    EXPECT_TRUE(fused.ok()) << ::testing::PrintToString(ids(fused.errors));
    EXPECT_TRUE(fused.config.ddp.overlap_grad_reduce);
    c.env = {"h100", "2.7.1", "2.7.0"};  // a TE stack new enough for both
    EXPECT_TRUE(validate(c).ok());
}

TEST(WgradRules, WG001NeedsEpOverlap) {
    EXPECT_TRUE(fires("WG001",
                      [](Config& c) { c.comm_overlap->overlap_moe_expert_parallel_comm = false; }));
    EXPECT_TRUE(fires("WG001",
                      [](Config& c) { c.comm_overlap->overlap_moe_expert_parallel_comm.reset(); }));
    EXPECT_FALSE(fires("WG001", [](Config&) {}));
    // The model alone asking for EP overlap satisfies the reference's check, but the unset
    // comm_overlap value finalizes it to false: the finalized config delays wgrad without EP
    // overlap, which is an error whichever section it came from.
    Config gotcha = delay_wgrad_config();
    gotcha.comm_overlap->overlap_moe_expert_parallel_comm.reset();
    gotcha.model.overlap_moe_expert_parallel_comm = true;
    const ValidationReport r = validate(gotcha);
    EXPECT_TRUE(has(r.errors, "WG001"));
    EXPECT_EQ(testing::get(r.errors, "WG001").field,
              "comm_overlap.overlap_moe_expert_parallel_comm");
    EXPECT_TRUE(has(r.warnings, "W010"));
    // Without a comm_overlap section the model's own values are final.
    Config model_only = make_recipe("tiny-moe");
    model_only.model.expert_model_parallel_size = 2;
    model_only.comm.gpus_per_node = 2;
    model_only.model.delay_wgrad_compute = true;
    EXPECT_TRUE(has(validate(model_only).errors, "WG001"));
    model_only.model.overlap_moe_expert_parallel_comm = true;
    const ValidationReport both = validate(model_only);
    EXPECT_TRUE(both.ok()) << ::testing::PrintToString(ids(both.errors));
}

TEST(WgradRules, WG002OverlappedGradReduceNeedsTe27) {
    const auto stack = [](const char* te, std::function<void(Config&)> grad_reduce) {
        return [=](Config& c) {
            c.env.torch_version = "2.7.1";
            c.env.te_version = te;
            grad_reduce(c);
        };
    };
    const auto ddp = [](Config& c) { c.ddp.overlap_grad_reduce = true; };
    const auto user = [](Config& c) { c.comm_overlap->overlap_grad_reduce = true; };
    const auto finalized = [](Config& c) {  // DP 2 with a distributed optimizer turns it on
        c.ddp.use_distributed_optimizer = true;
    };
    EXPECT_TRUE(fires("WG002", stack("2.6.0", ddp)));
    EXPECT_TRUE(fires("WG002", stack("2.6.0", user)));
    EXPECT_TRUE(fires("WG002", stack("2.6.0", finalized)));
    EXPECT_FALSE(fires("WG002", stack("2.7.0", ddp)));
    EXPECT_FALSE(fires("WG002", stack("2.6.0", [](Config&) {})));
    EXPECT_FALSE(fires("WG002", ddp));  // our runtime: no version condition
}

TEST(WgradRules, WG003GradientAccumulationFusionNeedsTe27) {
    const auto fusion = [](const char* te, bool on) {
        return [=](Config& c) {
            c.env.te_version = te;
            c.model.gradient_accumulation_fusion = on;
        };
    };
    EXPECT_TRUE(fires("WG003", fusion("2.6.0", true)));
    EXPECT_FALSE(fires("WG003", fusion("2.7.0", true)));
    EXPECT_FALSE(fires("WG003", fusion("2.6.0", false)));
    EXPECT_FALSE(fires("WG003", [](Config& c) { c.model.gradient_accumulation_fusion = true; }));
}

TEST(WgradRules, WG004WgradInsideAGraphNeedsTe212) {
    const auto te = [](const char* version, std::function<void(Config&)> graph) {
        return [=](Config& c) {
            c.env.te_version = version;
            c.model.gradient_accumulation_fusion = true;
            graph(c);
        };
    };
    const auto router_with_shared = [](bool shared_overlap) {
        return [=](Config& c) {
            c.model.cuda_graph_modules = {CudaGraphModule::kMoeRouter};
            c.model.moe_shared_expert_intermediate_size = 512;
            c.model.moe_shared_expert_overlap = shared_overlap;
        };
    };
    EXPECT_TRUE(fires("WG004", te("2.11.0", graph_attn)));
    EXPECT_FALSE(fires("WG004", te("2.12.0", graph_attn)));
    EXPECT_TRUE(fires("WG004", te("2.11.0", router_with_shared(false))));
    EXPECT_FALSE(fires("WG004", te("2.11.0", router_with_shared(true))));
    EXPECT_FALSE(fires("WG004", te("2.11.0", [](Config& c) {  // router graphed, no shared expert
                           c.model.cuda_graph_modules = {CudaGraphModule::kMoeRouter};
                       })));
    EXPECT_FALSE(fires("WG004", graph_attn));  // our runtime: no version condition
}

TEST(WgradRules, WG005GraphedWgradNeedsGradientAccumulationFusion) {
    EXPECT_TRUE(fires("WG005", [](Config& c) {
        graph_attn(c);
        c.model.gradient_accumulation_fusion = false;
    }));
    EXPECT_FALSE(fires("WG005", [](Config& c) {
        graph_attn(c);
        c.model.gradient_accumulation_fusion = true;
    }));
    // Membership is by name only: cuda_graph_impl is not consulted, the legacy scope counts.
    EXPECT_TRUE(fires("WG005", [](Config& c) {
        c.model.cuda_graph_impl = CudaGraphImpl::kNone;
        c.model.cuda_graph_scope =
            CudaGraphScopeValue(std::vector<std::string>{"CudaGraphScope.attn"});
    }));
}

TEST(WgradRules, WG006GraphedAttentionWithoutBiases) {
    EXPECT_TRUE(fires("WG006", [](Config& c) {
        graph_attn(c);
        c.model.gradient_accumulation_fusion = true;
        c.model.add_bias_linear = true;
    }));
    EXPECT_TRUE(fires("WG006", [](Config& c) {
        graph_attn(c);
        c.model.add_qkv_bias = true;
    }));
    Config pass = delay_wgrad_config();  // no bias and fusion on: passes
    graph_attn(pass);
    pass.model.gradient_accumulation_fusion = true;
    const ValidationReport r = validate(pass);
    EXPECT_TRUE(r.ok()) << ::testing::PrintToString(ids(r.errors));
}

TEST(WgradRules, NotCheckedWithoutDelayedWgrad) {
    Config c = testing::ep_overlap_config();
    graph_attn(c);
    c.model.add_bias_linear = true;
    c.model.gradient_accumulation_fusion = false;
    c.env.te_version = "2.0.0";
    for (const auto& id : ids(validate(c).errors)) {
        EXPECT_NE(id.substr(0, 2), "WG") << id;
    }
}

}  // namespace
}  // namespace epo::config
