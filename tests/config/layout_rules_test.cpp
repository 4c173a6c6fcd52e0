// Layout (LY), MoE sanity (MO), values (VA), env (EN), schedule (TR), dataset (DS) and W013:
// each in both directions, starting from tiny-moe on four ranks, which passes.
#include <gtest/gtest.h>

#include <functional>

#include "config_test_util.h"
#include "epo/config/env.h"
#include "epo/config/overrides.h"
#include "epo/config/validate.h"

namespace epo::config {
namespace {

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

bool fires(const char* id, const std::function<void(Config&)>& change) {
    const ValidationReport r = check(change);
    return has(r.errors, id) || has(r.warnings, id);
}

TEST(LayoutRules, BasePasses) {
    const ValidationReport r = validate(base());
    EXPECT_TRUE(r.ok()) << ::testing::PrintToString(ids(r.errors));
    EXPECT_TRUE(r.warnings.empty()) << ::testing::PrintToString(ids(r.warnings));
}

TEST(LayoutRules, LY001ExpertsDivisibleByEp) {
    EXPECT_TRUE(fires("LY001", [](Config& c) { c.model.num_moe_experts = 6; }));
    EXPECT_FALSE(fires("LY001", [](Config& c) { c.model.num_moe_experts = 12; }));
}

TEST(LayoutRules, LY002WorldDivisibleByEp) {
    EXPECT_TRUE(fires("LY002", [](Config& c) { c.comm.gpus_per_node = 6; }));
    EXPECT_FALSE(fires("LY002", [](Config& c) {
        c.comm.num_nodes = 2;
        c.comm.gpus_per_node = 6;
    }));
}

// A config that states no topology (a Megatron-Bridge file, a recipe) has no world size until
// the launch: the checks that need one wait for it, and validate() says which.
TEST(LayoutRules, WorldChecksWaitForTheLaunchWithoutTopology) {
    Config c = make_recipe("tiny-moe");
    c.model.expert_model_parallel_size = 8;
    c.model.num_moe_experts = 16;
    ASSERT_FALSE(topology_stated(c.comm));
    EXPECT_EQ(world_size(c), 0);
    const ValidationReport r = validate(c);
    EXPECT_TRUE(r.ok()) << ::testing::PrintToString(ids(r.errors));
    ASSERT_EQ(r.notes.size(), 1u);
    for (const char* deferred : {"LY002", "LY003", "LY004", "W011", "W012"}) {
        EXPECT_NE(r.notes[0].find(deferred), std::string::npos) << r.notes[0];
    }
}

TEST(LayoutRules, StatedTopologyKeepsTheWorldChecks) {
    Config c = make_recipe("tiny-moe");
    c.model.expert_model_parallel_size = 2;
    c.comm.num_nodes = 1;
    c.comm.gpus_per_node = 3;
    const ValidationReport r = validate(c);
    EXPECT_TRUE(has(r.errors, "LY002")) << ::testing::PrintToString(ids(r.errors));
    EXPECT_TRUE(r.notes.empty());
}

// Without a world size the micro batch must still divide the global batch, for any DP size.
TEST(LayoutRules, LY004WithoutTopologyChecksTheMicroBatch) {
    Config c = make_recipe("tiny-moe");
    c.train.micro_batch_size = 2;
    c.train.global_batch_size = 5;
    const ValidationReport r = validate(c);
    ASSERT_TRUE(has(r.errors, "LY004"));
    EXPECT_NE(testing::get(r.errors, "LY004").message.find("whatever the data-parallel size"),
              std::string::npos);
    c.train.global_batch_size = 6;
    EXPECT_FALSE(has(validate(c).errors, "LY004"));
}

TEST(LayoutRules, LY003WorldDivisibleByModelParallelism) {
    EXPECT_TRUE(fires("LY003", [](Config& c) {
        c.model.tensor_model_parallel_size = 3;
        c.model.num_attention_heads = 6;
        c.model.num_query_groups = 3;
    }));
    EXPECT_FALSE(fires("LY003", [](Config& c) { c.model.tensor_model_parallel_size = 2; }));
}

TEST(LayoutRules, LY004GlobalBatchDivisibleByMicroTimesDp) {
    EXPECT_TRUE(fires("LY004", [](Config& c) { c.train.global_batch_size = 6; }));  // DP 4
    EXPECT_TRUE(fires("LY004", [](Config& c) { c.train.micro_batch_size = 3; }));
    EXPECT_FALSE(fires("LY004", [](Config& c) { c.train.global_batch_size = 12; }));
    EXPECT_FALSE(fires("LY004", [](Config& c) { c.train.global_batch_size.reset(); }));
}

TEST(LayoutRules, LY005LayersDivisibleByPipelineStages) {
    const auto pp = [](int layers, std::optional<int> vpp) {
        return [=](Config& c) {
            c.model.num_layers = layers;
            c.model.pipeline_model_parallel_size = 2;
            c.model.virtual_pipeline_model_parallel_size = vpp;
        };
    };
    EXPECT_TRUE(fires("LY005", pp(3, std::nullopt)));
    EXPECT_TRUE(fires("LY005", pp(6, 2)));
    EXPECT_FALSE(fires("LY005", pp(8, 2)));
    EXPECT_FALSE(fires("LY005", pp(2, std::nullopt)));
}

TEST(LayoutRules, LY006HeadsDivisibleByQueryGroups) {
    EXPECT_TRUE(fires("LY006", [](Config& c) { c.model.num_query_groups = 3; }));
    EXPECT_FALSE(fires("LY006", [](Config& c) { c.model.num_query_groups = 4; }));
    EXPECT_FALSE(fires("LY006", [](Config& c) { c.model.num_query_groups.reset(); }));
}

TEST(LayoutRules, LY007TensorParallelDividesHeadsAndGroups) {
    EXPECT_TRUE(
        fires("LY007", [](Config& c) { c.model.tensor_model_parallel_size = 4; }));  // 2 groups
    EXPECT_FALSE(fires("LY007", [](Config& c) { c.model.tensor_model_parallel_size = 2; }));
}

TEST(LayoutRules, LY008MoeLayerFreq) {
    EXPECT_TRUE(fires("LY008", [](Config& c) { c.model.moe_layer_freq = 0; }));
    EXPECT_TRUE(fires("LY008", [](Config& c) {
        c.model.moe_layer_freq = std::vector<int>{0, 1, 1};
    }));
    EXPECT_TRUE(fires("LY008", [](Config& c) { c.model.moe_layer_freq = std::vector<int>{0, 2}; }));
    EXPECT_FALSE(fires("LY008", [](Config& c) {
        c.model.moe_layer_freq = std::vector<int>{0, 1};
    }));
    EXPECT_FALSE(fires("LY008", [](Config& c) { c.model.moe_layer_freq = 2; }));
}

TEST(LayoutRules, LY010HeadSizeFromHiddenSize) {
    EXPECT_TRUE(fires("LY010", [](Config& c) {
        c.model.kv_channels.reset();
        c.model.hidden_size = 250;
    }));
    EXPECT_FALSE(fires("LY010", [](Config& c) { c.model.hidden_size = 250; }));  // kv_channels set
}

TEST(LayoutRules, DS001TextNeedsAPath) {
    EXPECT_TRUE(fires("DS001", [](Config& c) { c.dataset.type = DatasetType::kText; }));
    EXPECT_FALSE(fires("DS001", [](Config& c) {
        c.dataset.type = DatasetType::kText;
        c.dataset.path = "corpus.txt";
    }));
}

TEST(MoeRules, MO001TopkWithinExperts) {
    EXPECT_TRUE(fires("MO001", [](Config& c) { c.model.moe_router_topk = 9; }));
    EXPECT_TRUE(fires("MO001", [](Config& c) { c.model.moe_router_topk = 0; }));
    EXPECT_FALSE(fires("MO001", [](Config& c) { c.model.moe_router_topk = 8; }));
}

TEST(MoeRules, MO002GroupsDivideExperts) {
    EXPECT_TRUE(fires("MO002", [](Config& c) { c.model.moe_router_num_groups = 3; }));
    EXPECT_FALSE(fires("MO002", [](Config& c) { c.model.moe_router_num_groups = 4; }));
}

TEST(MoeRules, MO003GroupTopk) {
    EXPECT_TRUE(fires("MO003", [](Config& c) {
        c.model.moe_router_num_groups = 2;
        c.model.moe_router_group_topk = 3;
    }));
    EXPECT_TRUE(fires("MO003", [](Config& c) { c.model.moe_router_group_topk = 1; }));  // no groups
    EXPECT_TRUE(fires("MO003", [](Config& c) {  // top-4 from 1 kept group of 2 experts
        c.model.moe_router_topk = 4;
        c.model.moe_router_num_groups = 4;
        c.model.moe_router_group_topk = 1;
    }));
    EXPECT_FALSE(fires("MO003", [](Config& c) {
        c.model.moe_router_num_groups = 4;
        c.model.moe_router_group_topk = 2;
    }));
}

TEST(MoeRules, MO004PaddingNeedsCapacity) {
    EXPECT_TRUE(fires("MO004", [](Config& c) { c.model.moe_pad_expert_input_to_capacity = true; }));
    EXPECT_FALSE(fires("MO004", [](Config& c) {
        c.model.moe_pad_expert_input_to_capacity = true;
        c.model.moe_expert_capacity_factor = 1.25;
    }));
}

TEST(MoeRules, MO005CapacityNeedsACompatibleLoadBalancer) {
    const auto capacity = [](LoadBalancingType lb) {
        return [=](Config& c) {
            c.model.moe_expert_capacity_factor = 1.0;
            c.model.moe_router_load_balancing_type = lb;
        };
    };
    EXPECT_TRUE(fires("MO005", capacity(LoadBalancingType::kSinkhorn)));
    EXPECT_TRUE(fires("MO005", capacity(LoadBalancingType::kGlobalAuxLoss)));
    for (auto ok :
         {LoadBalancingType::kAuxLoss, LoadBalancingType::kSeqAuxLoss, LoadBalancingType::kNone}) {
        EXPECT_FALSE(fires("MO005", capacity(ok)));
    }
}

TEST(MoeRules, MO006ExpertBiasNeedsSigmoid) {
    EXPECT_TRUE(fires("MO006", [](Config& c) { c.model.moe_router_enable_expert_bias = true; }));
    EXPECT_FALSE(fires("MO006", [](Config& c) {
        c.model.moe_router_enable_expert_bias = true;
        c.model.moe_router_score_function = ScoreFunction::kSigmoid;
    }));
}

// Chunks by tokens were removed: the key still reads `tokens`, and MO007 refuses it whatever the
// chunk count, naming the field, the value, why (the measurement and where it is written down)
// and the fix. The other MO007 refusals hold for every chunk count > 1.
TEST(MoeRules, MO007RefusesTokenChunks) {
    for (int n : {1, 2}) {
        Config c = base();
        apply_overrides(
            c, std::vector<std::string>{"model.moe_ep_overlap_num_chunks=" + std::to_string(n),
                                        "model.moe_ep_overlap_chunk_by=tokens"});
        ASSERT_EQ(c.model.moe_ep_overlap_chunk_by, ChunkSplit::kTokens);
        const ValidationReport r = validate(c);
        ASSERT_TRUE(has(r.errors, "MO007")) << n << " chunk(s)";
        for (const Finding& f : r.errors) {
            if (f.id == "MO007") {
                EXPECT_EQ(f.field, "model.moe_ep_overlap_chunk_by");
                EXPECT_EQ(f.value, "tokens");
                EXPECT_NE(f.message.find("1.3-1.5x busier"), std::string::npos) << f.message;
                EXPECT_NE(f.message.find("docs/measurements.md"), std::string::npos) << f.message;
                EXPECT_NE(f.fix.find("model.moe_ep_overlap_chunk_by=experts"), std::string::npos)
                    << f.fix;
            }
        }
    }
    EXPECT_FALSE(fires("MO007", [](Config& c) {
        apply_overrides(c, std::vector<std::string>{"model.moe_ep_overlap_chunk_by=experts"});
    }));
    EXPECT_TRUE(fires("MO007", [](Config& c) {
        c.model.moe_ep_overlap_num_chunks = 2;
        c.model.moe_token_dispatcher_type = DispatcherType::kAllgather;
    }));
    EXPECT_TRUE(fires("MO007", [](Config& c) {
        c.model.moe_ep_overlap_num_chunks = 2;
        c.model.num_moe_experts.reset();
        c.model.expert_model_parallel_size = 1;
    }));
    EXPECT_FALSE(check([](Config& c) { c.model.moe_ep_overlap_num_chunks = 0; }).ok());
}

// Expert chunks (the default split): equal groups of each rank's local experts, with or without
// a capacity; tiny-moe on EP 4 has 8 / 4 = 2 local experts.
TEST(MoeRules, MO007ExpertChunks) {
    const auto chunks = [](int n) {
        return [n](Config& c) { c.model.moe_ep_overlap_num_chunks = n; };
    };
    EXPECT_FALSE(fires("MO007", chunks(2)));
    EXPECT_FALSE(fires("MO007", [](Config& c) {
        c.model.moe_ep_overlap_num_chunks = 2;
        c.model.moe_expert_capacity_factor = 1.0;
    }));
    const ValidationReport four = check(chunks(4));
    ASSERT_TRUE(has(four.errors, "MO007"));
    for (const Finding& f : four.errors) {
        if (f.id == "MO007") {
            EXPECT_EQ(f.field, "model.moe_ep_overlap_num_chunks");
            EXPECT_EQ(f.value, "4");
            EXPECT_NE(f.message.find("2 local experts"), std::string::npos) << f.message;
            EXPECT_NE(f.fix.find("divides 2"), std::string::npos) << f.fix;
            EXPECT_EQ(f.fix.find("tokens"), std::string::npos) << f.fix;
        }
    }
    EXPECT_FALSE(fires("MO007", [](Config& c) {  // EP 2: 4 local experts
        c.model.moe_ep_overlap_num_chunks = 4;
        c.model.expert_model_parallel_size = 2;
    }));
}

TEST(MoeRules, DenseModelsSkipMoeChecks) {
    const ValidationReport r = check([](Config& c) {
        c.model.num_moe_experts.reset();
        c.model.expert_model_parallel_size = 1;
        c.model.moe_router_topk = 99;
    });
    EXPECT_TRUE(r.ok()) << ::testing::PrintToString(ids(r.errors));
}

TEST(ValueRules, VA001EveryOutOfRangeValueAtOnce) {
    const ValidationReport r = check([](Config& c) {
        c.model.hidden_size = -4;
        c.model.tensor_model_parallel_size = 0;
        c.model.expert_model_parallel_size = 0;
        c.model.layernorm_epsilon = 0;
        c.model.num_layers = kMaxNumLayers + 1;
        c.train.micro_batch_size = 0;
        c.optimizer.adam_beta2 = 1.5;
        c.comm.timeout_s = -1;
        c.comm.link.latency_us = -2.0;
        c.comm_overlap.emplace();
        c.comm_overlap->bucket_size = 0;
    });
    std::vector<std::string> fields;
    for (const auto& f : r.errors) {
        if (f.id == "VA001") {
            fields.push_back(f.field);
        }
    }
    EXPECT_EQ(fields, (std::vector<std::string>{
                          "model.num_layers", "model.hidden_size", "model.layernorm_epsilon",
                          "model.tensor_model_parallel_size", "model.expert_model_parallel_size",
                          "comm_overlap.bucket_size", "optimizer.adam_beta2",
                          "train.micro_batch_size", "comm.link.latency_us", "comm.timeout_s"}));
    const Finding& hidden = r.errors[1];
    EXPECT_EQ(hidden.value, "-4");
    EXPECT_NE(hidden.message.find("at least 1"), std::string::npos);
    EXPECT_FALSE(fires("VA001", [](Config&) {}));
}

// comm.timeout_s above 1e7 s overflowed the nanosecond deadline into an immediate false timeout.
TEST(ValueRules, VA001TimeoutIsBounded) {
    EXPECT_TRUE(fires("VA001", [](Config& c) { c.comm.timeout_s = 1e10; }));
    EXPECT_FALSE(fires("VA001", [](Config& c) { c.comm.timeout_s = 1e7; }));
}

// Link values the model cannot honour (1e-300 Gbit/s turned it off silently) are refused with
// the key; a link so slow that one micro-batch's all-to-all outlasts comm.timeout_s too.
TEST(ValueRules, VA003AndVA004RefuseALinkTheModelCannotHonour) {
    EXPECT_TRUE(fires("VA003", [](Config& c) { c.comm.link.inter_node_gbps = 1e-300; }));
    EXPECT_TRUE(fires("VA003", [](Config& c) { c.comm.link.intra_node_gbps = 1e-6; }));
    EXPECT_TRUE(fires("VA003", [](Config& c) { c.comm.link.latency_us = 1e9; }));
    EXPECT_FALSE(fires("VA003", [](Config& c) { c.comm.link.inter_node_gbps = 0; }));
    EXPECT_FALSE(fires("VA003", [](Config& c) { c.comm.link.intra_node_gbps = 400; }));
    // tiny-moe: one micro-batch's dispatch moves well under 1 MB per rank.
    EXPECT_TRUE(fires("VA004", [](Config& c) {
        c.comm.link.intra_node_gbps = 1e-3;
        c.comm.timeout_s = 0.01;
    }));
    EXPECT_FALSE(fires("VA004", [](Config& c) { c.comm.link.intra_node_gbps = 1e-3; }));
}

TEST(ValueRules, VA002VocabularyIsRequired) {
    EXPECT_TRUE(fires("VA002", [](Config& c) { c.model.vocab_size.reset(); }));
    EXPECT_FALSE(fires("VA002", [](Config& c) { c.model.vocab_size = 32; }));
}

TEST(EnvRules, EN001To003UnknownDeviceAndUnreadableVersions) {
    EXPECT_TRUE(fires("EN001", [](Config& c) { c.env.gpu = "tpu-v5"; }));
    EXPECT_FALSE(fires("EN001", [](Config& c) { c.env.gpu = "NVIDIA H100 80GB HBM3"; }));
    EXPECT_TRUE(fires("EN002", [](Config& c) { c.env.torch_version = "latest"; }));
    EXPECT_FALSE(fires("EN002", [](Config& c) { c.env.torch_version = "2.7.0.dev20250101"; }));
    EXPECT_TRUE(fires("EN003", [](Config& c) { c.env.te_version = "2.x"; }));
    EXPECT_FALSE(fires("EN003", [](Config& c) { c.env.te_version = "2.8.0rc1"; }));
    const ValidationReport r = check([](Config& c) { c.env.gpu = "tpu-v5"; });
    EXPECT_NE(testing::get(r.errors, "EN001").message.find("h100"), std::string::npos);
}

TEST(EnvRules, VersionsCompareLikePackaging) {
    EXPECT_TRUE(version_at_least("2.6.0", "2.6.0"));
    EXPECT_TRUE(version_at_least("2.10.1", "2.6.0"));
    EXPECT_TRUE(version_at_least("2.6", "2.6.0"));
    EXPECT_TRUE(version_at_least("2.6.0.post1", "2.6.0"));
    EXPECT_TRUE(version_at_least("2.6.0+cu121", "2.6.0"));
    EXPECT_FALSE(version_at_least("2.6.0rc1", "2.6.0"));
    EXPECT_FALSE(version_at_least("2.6.0a0+git", "2.6.0"));
    EXPECT_FALSE(version_at_least("2.6.0.dev20250101", "2.6.0"));
    EXPECT_FALSE(version_at_least("2.5.99", "2.6.0"));
    EXPECT_FALSE(version_at_least("garbage", "2.6.0"));
    EXPECT_LT(parse_version("2.6.0.dev1")->compare(*parse_version("2.6.0a0")), 0);
    EXPECT_LT(parse_version("2.6.0a1")->compare(*parse_version("2.6.0b0")), 0);
    EXPECT_LT(parse_version("2.6.0b1")->compare(*parse_version("2.6.0rc1")), 0);
    EXPECT_EQ(describe_target(EnvConfig{}).description, "epo runtime");
    EXPECT_EQ(describe_target(EnvConfig{"h100", "2.7.1", "2.8.0"}).description,
              "torch 2.7.1 / TE 2.8.0 on h100");
}

TEST(ScheduleRules, TR001AndTR002) {
    EXPECT_TRUE(fires("TR001", [](Config& c) { c.train.lr_warmup_iters = 20; }));
    EXPECT_FALSE(fires("TR001", [](Config& c) {
        c.train.lr_warmup_iters = 20;
        c.train.lr_decay_iters = 40;
    }));
    EXPECT_TRUE(fires("TR002", [](Config& c) { c.optimizer.min_lr = 1.0; }));
    EXPECT_FALSE(fires("TR002", [](Config& c) { c.optimizer.min_lr = c.optimizer.lr; }));
}

TEST(CheckpointRules, W013IntervalWithoutDirectory) {
    EXPECT_TRUE(fires("W013", [](Config& c) { c.checkpoint.save_interval = 10; }));
    EXPECT_FALSE(fires("W013", [](Config& c) {
        c.checkpoint.save_interval = 10;
        c.checkpoint.save = "ckpt";
    }));
}

}  // namespace
}  // namespace epo::config
