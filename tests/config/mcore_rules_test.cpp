// Megatron-Core's start-up refusals and Megatron-LM's argument checks (MC001-MC014): each in both
// directions, from tiny-moe on four ranks with EP 4, which passes.
#include <gtest/gtest.h>

#include <functional>

#include "config_test_util.h"
#include "epo/config/validate.h"

namespace epo::config {
namespace {

using testing::get;
using testing::has;
using testing::ids;

Config base() {
    return testing::four_rank_config();
}

ValidationReport check(const std::function<void(Config&)>& change) {
    Config c = base();
    change(c);
    return validate(c);
}

bool error(const char* id, const std::function<void(Config&)>& change) {
    return has(check(change).errors, id);
}

TEST(McoreRules, BasePasses) {
    const ValidationReport r = validate(base());
    EXPECT_TRUE(r.ok()) << ::testing::PrintToString(ids(r.errors));
    EXPECT_TRUE(r.warnings.empty()) << ::testing::PrintToString(ids(r.warnings));
}

// The three layouts of the report: each passes LY002 (world % EP) and LY003 (world % TP x PP x
// CP) but not world % (ETP x EP x PP).
TEST(McoreRules, MC001WorldDivisibleByExpertTensorTimesExpertTimesPipeline) {
    // 8 ranks, EP 4, ETP 1, PP 4: 16 does not divide 8.
    const auto pp4 = [](Config& c) {
        c.comm.gpus_per_node = 8;
        c.model.num_layers = 4;
        c.model.pipeline_model_parallel_size = 4;
        c.model.expert_tensor_parallel_size = 1;
    };
    EXPECT_TRUE(error("MC001", pp4));
    EXPECT_FALSE(has(check(pp4).errors, "LY002"));
    EXPECT_FALSE(has(check(pp4).errors, "LY003"));
    // 8 ranks, EP 4, ETP 4 (TP 1): 16 does not divide 8.
    EXPECT_TRUE(error("MC001", [](Config& c) {
        c.comm.gpus_per_node = 8;
        c.model.expert_tensor_parallel_size = 4;
    }));
    // ETP null follows TP: 12 ranks, TP 2, EP 4, so ETP x EP = 8 does not divide 12.
    EXPECT_TRUE(error("MC001", [](Config& c) {
        c.model.expert_tensor_parallel_size.reset();
        c.comm.gpus_per_node = 12;
        c.model.tensor_model_parallel_size = 2;
        c.model.sequence_parallel = true;
        c.train.global_batch_size = 12;
    }));
    // 16 ranks tile EP 4 x PP 4, and ETP 2 x EP 4 tiles 8.
    EXPECT_FALSE(error("MC001", [&](Config& c) {
        pp4(c);
        c.comm.gpus_per_node = 16;
        c.train.global_batch_size = 16;
    }));
    EXPECT_FALSE(error("MC001", [](Config& c) {
        c.comm.gpus_per_node = 8;
        c.model.expert_tensor_parallel_size = 2;
    }));
    const ValidationReport r = check(pp4);
    const Finding& f = get(r.errors, "MC001");
    EXPECT_EQ(f.field, "model.expert_model_parallel_size");
    EXPECT_EQ(f.value, "4");
    EXPECT_NE(f.message.find("ETP 1 x EP 4 x PP 4 = 16"), std::string::npos) << f.message;
    EXPECT_NE(f.fix.find("multiple of 16"), std::string::npos) << f.fix;
}

TEST(McoreRules, MC001WaitsForTheWorldSize) {
    Config c = base();
    c.comm.gpus_per_node.reset();
    c.model.expert_tensor_parallel_size = 3;
    EXPECT_FALSE(has(validate(c).errors, "MC001"));
}

TEST(McoreRules, MC002VirtualPipelineNeedsPipeline) {
    EXPECT_TRUE(
        error("MC002", [](Config& c) { c.model.virtual_pipeline_model_parallel_size = 2; }));
    EXPECT_FALSE(error("MC002", [](Config& c) {
        c.comm.gpus_per_node = 8;
        c.model.num_layers = 4;
        c.model.pipeline_model_parallel_size = 2;
        c.model.virtual_pipeline_model_parallel_size = 2;
    }));
}

TEST(McoreRules, MC003ExpertParallelNeedsExperts) {
    EXPECT_TRUE(error("MC003", [](Config& c) { c.model.num_moe_experts.reset(); }));
    EXPECT_TRUE(error("MC003", [](Config& c) { c.model.num_moe_experts = 0; }));
    EXPECT_FALSE(error("MC003", [](Config& c) {
        c.model.num_moe_experts.reset();
        c.model.expert_model_parallel_size = 1;
    }));
}

TEST(McoreRules, MC004TopOneSoftmaxNeedsPreSoftmax) {
    const auto top1 = [](Config& c) { c.model.moe_router_topk = 1; };
    EXPECT_TRUE(error("MC004", top1));
    EXPECT_FALSE(error("MC004", [&](Config& c) {
        top1(c);
        c.model.moe_router_pre_softmax = true;
    }));
    EXPECT_FALSE(error("MC004", [&](Config& c) {
        top1(c);
        c.model.moe_router_score_function = ScoreFunction::kSigmoid;
    }));
    EXPECT_FALSE(error("MC004", [&](Config& c) {
        top1(c);
        c.model.moe_router_load_balancing_type = LoadBalancingType::kSinkhorn;
    }));
}

TEST(McoreRules, MC005SharedExpertOverlapNeedsAlltoallOrFlex) {
    const auto shared = [](Config& c) {
        c.model.moe_shared_expert_intermediate_size = 512;
        c.model.moe_shared_expert_overlap = true;
        c.model.moe_token_dispatcher_type = DispatcherType::kAllgather;
    };
    EXPECT_TRUE(error("MC005", shared));
    EXPECT_FALSE(error("MC005", [&](Config& c) {
        shared(c);
        c.model.moe_token_dispatcher_type = DispatcherType::kAlltoall;
    }));
}

TEST(McoreRules, MC006DeepepCannotPadToCapacity) {
    const auto padded = [](Config& c) {
        c.model.moe_token_dispatcher_type = DispatcherType::kFlex;
        c.model.moe_flex_dispatcher_backend = FlexBackend::kDeepep;
        c.model.moe_expert_capacity_factor = 1.0;
        c.model.moe_pad_expert_input_to_capacity = true;
    };
    EXPECT_TRUE(error("MC006", padded));
    EXPECT_FALSE(error("MC006", [&](Config& c) {
        padded(c);
        c.model.moe_flex_dispatcher_backend = FlexBackend::kHybridep;
    }));
}

TEST(McoreRules, MC007SequenceParallelNeedsTensorParallel) {
    EXPECT_TRUE(error("MC007", [](Config& c) { c.model.sequence_parallel = true; }));
    EXPECT_FALSE(error("MC007", [](Config& c) {
        c.comm.gpus_per_node = 8;
        c.model.tensor_model_parallel_size = 2;
        c.model.sequence_parallel = true;
    }));
}

TEST(McoreRules, MC008RecomputeSettingsMatchTheGranularity) {
    const ValidationReport full =
        check([](Config& c) { c.model.recompute_granularity = RecomputeGranularity::kFull; });
    EXPECT_EQ(std::count_if(full.errors.begin(), full.errors.end(),
                            [](const Finding& f) { return f.id == "MC008"; }),
              2);
    EXPECT_FALSE(error("MC008", [](Config& c) {
        c.model.recompute_granularity = RecomputeGranularity::kFull;
        c.model.recompute_method = RecomputeMethod::kUniform;
        c.model.recompute_num_layers = 1;
    }));
    EXPECT_TRUE(error("MC008", [](Config& c) {
        c.model.recompute_granularity = RecomputeGranularity::kSelective;
        c.model.recompute_num_layers = 1;
    }));
    EXPECT_FALSE(error("MC008", [](Config& c) {
        c.model.recompute_granularity = RecomputeGranularity::kSelective;
    }));
    // The layer count is at most the layers per pipeline stage (tiny-moe: 2 layers, PP 1).
    const auto full_with = [](int layers) {
        return [layers](Config& c) {
            c.model.recompute_granularity = RecomputeGranularity::kFull;
            c.model.recompute_method = RecomputeMethod::kBlock;
            c.model.recompute_num_layers = layers;
        };
    };
    EXPECT_FALSE(error("MC008", full_with(2)));
    const Finding f = get(check(full_with(3)).errors, "MC008");
    EXPECT_EQ(f.field, "model.recompute_num_layers");
    EXPECT_EQ(f.value, "3");
    EXPECT_NE(f.fix.find("between 1 and 2"), std::string::npos) << f.fix;
}

TEST(McoreRules, MC010RecomputeModulesTheModelCanRecompute) {
    const auto selective = [](std::vector<RecomputeModule> modules) {
        return [modules](Config& c) {
            c.model.recompute_granularity = RecomputeGranularity::kSelective;
            c.model.recompute_modules = modules;
        };
    };
    using M = RecomputeModule;
    EXPECT_FALSE(error(
        "MC010", selective({M::kCoreAttn, M::kLayernorm, M::kMoeAct, M::kMlp, M::kSharedExperts})));
    // mla_up_proj needs multi-latent attention.
    EXPECT_TRUE(error("MC010", selective({M::kMlaUpProj})));
    EXPECT_FALSE(error("MC010", [&](Config& c) {
        selective({M::kMlaUpProj})(c);
        c.model.multi_latent_attention = true;
    }));
    // shared_experts cannot recompute an overlapped shared expert.
    const auto shared = [&](bool overlap) {
        return [&, overlap](Config& c) {
            selective({M::kSharedExperts})(c);
            c.model.moe_shared_expert_intermediate_size = 64;
            c.model.moe_shared_expert_overlap = overlap;
        };
    };
    EXPECT_TRUE(error("MC010", shared(true)));
    EXPECT_FALSE(error("MC010", shared(false)));
    // fp8's delayed scaling: no moe_act or layernorm recompute.
    for (M m : {M::kMoeAct, M::kLayernorm}) {
        const auto fp8 = [&](std::string recipe) {
            return [&, recipe](Config& c) {
                selective({m})(c);
                c.model.fp8 = "e4m3";
                c.model.fp8_recipe = recipe;
            };
        };
        EXPECT_TRUE(error("MC010", fp8("delayed")));
        EXPECT_FALSE(error("MC010", fp8("tensorwise")));
    }
    const Finding f = get(check(selective({M::kMlaUpProj})).errors, "MC010");
    EXPECT_EQ(f.field, "model.recompute_modules");
    EXPECT_NE(f.message.find("multi_latent_attention"), std::string::npos) << f.message;
}

TEST(McoreRules, MC011WarnsModulesWithoutSelectiveGranularity) {
    const auto modules_only = [](Config& c) {
        c.model.recompute_modules = std::vector<RecomputeModule>{RecomputeModule::kCoreAttn};
    };
    EXPECT_TRUE(has(check(modules_only).warnings, "MC011"));
    EXPECT_FALSE(has(check([&](Config& c) {
                         modules_only(c);
                         c.model.recompute_granularity = RecomputeGranularity::kSelective;
                     }).warnings,
                     "MC011"));
}

TEST(McoreRules, MC009WarnsExpertAndTensorParallelWithoutSequenceParallel) {
    const auto tp2 = [](Config& c) {
        c.comm.gpus_per_node = 8;
        c.model.tensor_model_parallel_size = 2;
    };
    const ValidationReport r = check(tp2);
    EXPECT_TRUE(has(r.warnings, "MC009"));
    EXPECT_FALSE(has(r.errors, "MC009"));
    EXPECT_FALSE(has(check([&](Config& c) {
                         tp2(c);
                         c.model.sequence_parallel = true;
                     }).warnings,
                     "MC009"));
}

// optimizer.overlap_param_gather_with_optimizer_step: Megatron-LM's argument checks. Without the
// distributed optimizer (MC012, from either section) or its overlapped gather (MC013) it is an
// error; without an interleaved pipeline only a warning (MC014): epo runs it in any layout.
TEST(McoreRules, MC012ToMC014ParamGatherWithTheOptimizerStep) {
    const auto flag = [](Config& c) {
        c.comm_overlap.reset();
        c.optimizer.overlap_param_gather_with_optimizer_step = true;
    };
    const auto sharded = [&](Config& c) {
        flag(c);
        c.ddp.use_distributed_optimizer = true;
        c.ddp.overlap_param_gather = true;
    };
    const ValidationReport plain = check(flag);
    ASSERT_TRUE(has(plain.errors, "MC012"));
    EXPECT_EQ(get(plain.errors, "MC012").field,
              "optimizer.overlap_param_gather_with_optimizer_step");
    EXPECT_NE(get(plain.errors, "MC012").fix.find("ddp.use_distributed_optimizer=true"),
              std::string::npos);
    // From comm_overlap, which finalization copies only with the distributed optimizer.
    const ValidationReport from_section = check([](Config& c) {
        c.comm_overlap.emplace();
        c.comm_overlap->tp_comm_overlap = false;
        c.comm_overlap->overlap_param_gather_with_optimizer_step = true;
    });
    ASSERT_TRUE(has(from_section.errors, "MC012"));
    EXPECT_EQ(get(from_section.errors, "MC012").field,
              "comm_overlap.overlap_param_gather_with_optimizer_step");
    EXPECT_TRUE(error("MC013", [&](Config& c) {
        sharded(c);
        c.ddp.overlap_param_gather = false;
    }));
    const ValidationReport ok = check(sharded);
    EXPECT_TRUE(ok.ok()) << ::testing::PrintToString(ids(ok.errors));
    EXPECT_TRUE(has(ok.warnings, "MC014"));
    EXPECT_FALSE(has(check([&](Config& c) {
                         sharded(c);
                         c.comm.gpus_per_node = 8;
                         c.model.pipeline_model_parallel_size = 2;
                         c.model.virtual_pipeline_model_parallel_size = 2;
                     }).warnings,
                     "MC014"));
    EXPECT_FALSE(has(check([](Config&) {}).warnings, "MC014"));
}

}  // namespace
}  // namespace epo::config
