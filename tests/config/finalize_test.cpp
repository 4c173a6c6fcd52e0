#include "epo/config/finalize.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "config_test_util.h"

namespace epo::config {
namespace {

using testing::ep_overlap_config;
using testing::has;
using testing::ids;

Config with_section() {
    Config c = make_recipe("tiny-moe");
    c.comm_overlap.emplace();
    c.comm_overlap->tp_comm_overlap = false;
    return c;
}

TEST(Finalize, EpOverlapAskedIsTheFinalizedValue) {
    Config c = ep_overlap_config();
    const auto result = finalize(c);
    EXPECT_TRUE(result.warnings.empty()) << ::testing::PrintToString(ids(result.warnings));
    EXPECT_TRUE(c.model.overlap_moe_expert_parallel_comm);
    EXPECT_FALSE(c.model.delay_wgrad_compute);
    EXPECT_FALSE(c.model.tp_comm_overlap);
    EXPECT_FALSE(c.model.overlap_p2p_comm);
    EXPECT_FALSE(c.model.batch_p2p_comm);  // PP = 1: both off
}

TEST(Finalize, TpOverlapSwitchedOffWithTheReasonThatApplies) {
    Config c = with_section();
    c.comm_overlap->tp_comm_overlap = true;
    Config tp1 = c;
    auto w = finalize(tp1).warnings;
    EXPECT_EQ(ids(w), std::vector<std::string>{"W001"});
    EXPECT_FALSE(tp1.model.tp_comm_overlap);
    EXPECT_EQ(tp1.comm_overlap->tp_comm_overlap, false);  // recorded in the user's section

    c.model.tensor_model_parallel_size = 2;  // TP 2, sequence parallel off
    Config no_sp = c;
    EXPECT_EQ(ids(finalize(no_sp).warnings), std::vector<std::string>{"W002"});
    EXPECT_FALSE(no_sp.model.tp_comm_overlap);

    c.model.sequence_parallel = true;  // TP 2 + SP, but no TP-overlap library on our runtime
    Config no_lib = c;
    const auto lib = finalize(no_lib).warnings;
    EXPECT_EQ(ids(lib), std::vector<std::string>{"W003"});
    EXPECT_NE(lib[0].message.find("Transformer Engine"), std::string::npos);
    EXPECT_FALSE(no_lib.model.tp_comm_overlap);

    c.env.te_version = "2.8.0";  // a declared TE stack has the library
    Config te = c;
    EXPECT_TRUE(finalize(te).warnings.empty());
    EXPECT_TRUE(te.model.tp_comm_overlap);
}

TEST(Finalize, TpOverlapNotGivenBecomesFalseAndSaysSo) {
    Config c = make_recipe("tiny-moe");
    c.comm_overlap.emplace();
    const auto w = finalize(c).warnings;
    EXPECT_EQ(ids(w), std::vector<std::string>{"W004"});
    EXPECT_EQ(c.comm_overlap->tp_comm_overlap, false);
    EXPECT_FALSE(c.model.tp_comm_overlap);
}

TEST(Finalize, PipelineP2pDefaultsAndUserFalseWins) {
    Config c = with_section();
    c.model.pipeline_model_parallel_size = 4;
    c.model.virtual_pipeline_model_parallel_size = 2;
    Config vpp = c;
    finalize(vpp);
    EXPECT_TRUE(vpp.model.overlap_p2p_comm);
    EXPECT_FALSE(vpp.model.batch_p2p_comm);

    c.model.virtual_pipeline_model_parallel_size = 1;
    Config novpp = c;
    finalize(novpp);
    EXPECT_FALSE(novpp.model.overlap_p2p_comm);
    EXPECT_TRUE(novpp.model.batch_p2p_comm);
    c.model.virtual_pipeline_model_parallel_size.reset();  // null counts as 1
    finalize(c);
    EXPECT_TRUE(c.model.batch_p2p_comm);

    Config user = with_section();
    user.model.pipeline_model_parallel_size = 4;
    user.model.virtual_pipeline_model_parallel_size = 2;
    user.comm_overlap->overlap_p2p_comm = false;
    user.comm_overlap->batch_p2p_comm = false;
    finalize(user);
    EXPECT_FALSE(user.model.overlap_p2p_comm);
    EXPECT_FALSE(user.model.batch_p2p_comm);
}

TEST(Finalize, DistributedOptimizerWithDataParallelism) {
    Config c = with_section();
    c.ddp.use_distributed_optimizer = true;
    c.comm.gpus_per_node = 4;  // DP 4
    Config dp4 = c;
    finalize(dp4);
    EXPECT_EQ(dp4.ddp.bucket_size, kDefaultBucketSize);
    EXPECT_EQ(kDefaultBucketSize, 128 * 1024 * 1024);
    EXPECT_TRUE(dp4.ddp.overlap_grad_reduce);
    EXPECT_TRUE(dp4.ddp.overlap_param_gather);
    EXPECT_FALSE(dp4.ddp.align_param_gather);
    EXPECT_FALSE(dp4.optimizer.overlap_param_gather_with_optimizer_step);

    Config pp = c;  // PP 4 x VPP 2 on 16 ranks: DP 4, and align_param_gather too
    pp.comm.gpus_per_node = 16;
    pp.model.pipeline_model_parallel_size = 4;
    pp.model.virtual_pipeline_model_parallel_size = 2;
    finalize(pp);
    EXPECT_TRUE(pp.ddp.align_param_gather);
    EXPECT_TRUE(pp.ddp.overlap_grad_reduce);

    Config dp1 = c;
    dp1.comm.gpus_per_node = 1;
    dp1.ddp.bucket_size = 1000;
    dp1.ddp.overlap_grad_reduce = true;
    finalize(dp1);
    EXPECT_FALSE(dp1.ddp.bucket_size.has_value());  // the computed null is copied too
    EXPECT_FALSE(dp1.ddp.overlap_grad_reduce);
    EXPECT_FALSE(dp1.ddp.overlap_param_gather);
}

TEST(Finalize, WithoutDistributedOptimizerDdpAndOptimizerAreLeftAlone) {
    Config c = with_section();
    c.comm.gpus_per_node = 4;
    c.ddp.overlap_grad_reduce = true;
    c.ddp.bucket_size = 12345;
    c.ddp.delay_wgrad_compute = true;
    c.optimizer.overlap_param_gather_with_optimizer_step = true;
    c.comm_overlap->overlap_param_gather = true;
    const Config before = c;
    finalize(c);
    EXPECT_EQ(c.ddp, before.ddp);
    EXPECT_EQ(c.optimizer, before.optimizer);
}

TEST(Finalize, UserValuesWinOnlyWhereNotNull) {
    Config c = with_section();
    c.ddp.use_distributed_optimizer = true;
    c.comm.gpus_per_node = 4;
    c.comm_overlap->overlap_grad_reduce = false;  // user: false wins over the computed true
    c.comm_overlap->bucket_size = 4096;
    // overlap_param_gather: null -> the computed true stays
    finalize(c);
    EXPECT_FALSE(c.ddp.overlap_grad_reduce);
    EXPECT_EQ(c.ddp.bucket_size, 4096);
    EXPECT_TRUE(c.ddp.overlap_param_gather);
    const CommOverlapConfig side = resolved_optimizer_overlap(c);
    EXPECT_EQ(side.overlap_grad_reduce, false);
    EXPECT_EQ(side.overlap_param_gather, true);
}

TEST(Finalize, NullsAreCopiedIntoSameNamedFields) {
    Config c = with_section();
    c.ddp.use_distributed_optimizer = true;
    c.ddp.delay_wgrad_compute = false;
    finalize(c);
    EXPECT_FALSE(c.ddp.delay_wgrad_compute.has_value());  // the user's null, copied as null
    c.comm_overlap->delay_wgrad_compute = true;
    finalize(c);
    EXPECT_EQ(c.ddp.delay_wgrad_compute, true);
}

TEST(Finalize, UnsetEpOverlapForcesTheModelsTrueToFalseWithAWarning) {
    Config c = with_section();
    c.model.overlap_moe_expert_parallel_comm = true;
    c.model.delay_wgrad_compute = true;
    const auto w = finalize(c).warnings;
    ASSERT_EQ(ids(w), (std::vector<std::string>{"W010", "W010"}));
    EXPECT_EQ(w[0].field, "model.overlap_moe_expert_parallel_comm");
    EXPECT_EQ(w[1].field, "model.delay_wgrad_compute");
    EXPECT_NE(w[0].fix.find("comm_overlap.overlap_moe_expert_parallel_comm=true"),
              std::string::npos);
    EXPECT_FALSE(c.model.overlap_moe_expert_parallel_comm);
    EXPECT_FALSE(c.model.delay_wgrad_compute);
}

// The same for the optimizer-step gather: the section's null would silently turn the optimizer's
// true into false (the bench proxy has a comm_overlap section).
TEST(Finalize, UnsetGatherWithTheOptimizerStepWarns) {
    Config c = with_section();
    c.ddp.use_distributed_optimizer = true;
    c.comm.gpus_per_node = 4;
    c.optimizer.overlap_param_gather_with_optimizer_step = true;
    const auto w = finalize(c).warnings;
    ASSERT_EQ(ids(w), (std::vector<std::string>{"W010"}));
    EXPECT_EQ(w[0].field, "optimizer.overlap_param_gather_with_optimizer_step");
    EXPECT_NE(w[0].fix.find("comm_overlap.overlap_param_gather_with_optimizer_step=true"),
              std::string::npos);
    EXPECT_FALSE(c.optimizer.overlap_param_gather_with_optimizer_step);
    Config set = with_section();
    set.ddp.use_distributed_optimizer = true;
    set.comm.gpus_per_node = 4;
    set.comm_overlap->overlap_param_gather_with_optimizer_step = true;
    EXPECT_TRUE(finalize(set).warnings.empty());
    EXPECT_TRUE(set.optimizer.overlap_param_gather_with_optimizer_step);
}

TEST(Finalize, WithoutTheSectionTheModelKeepsItsValues) {
    Config c = make_recipe("tiny-moe");
    c.model.overlap_moe_expert_parallel_comm = true;
    c.model.batch_p2p_comm = true;
    c.ddp.use_distributed_optimizer = true;
    c.comm.gpus_per_node = 4;
    const Config before = c;
    EXPECT_TRUE(finalize(c).warnings.empty());
    EXPECT_EQ(c, before);
}

TEST(Finalize, SecondCallChangesNothing) {
    for (auto name : recipe_names()) {
        Config c = make_recipe(name);
        c.comm_overlap.emplace();
        c.comm_overlap->tp_comm_overlap = true;
        c.comm_overlap->overlap_moe_expert_parallel_comm = true;
        c.model.tensor_model_parallel_size = 2;
        c.model.sequence_parallel = true;
        c.ddp.use_distributed_optimizer = true;
        c.comm.gpus_per_node = 8;
        c.model.moe_token_dispatcher_type = DispatcherType::kFlex;
        EXPECT_FALSE(finalize(c).warnings.empty());
        const Config once = c;
        EXPECT_TRUE(finalize(c).warnings.empty()) << name;
        EXPECT_EQ(c, once) << name << ::testing::PrintToString(diff_configs(once, c));
    }
}

TEST(Finalize, FlexWithoutBackendFallsBackToAlltoall) {
    Config c = make_recipe("tiny-moe");
    c.model.moe_token_dispatcher_type = DispatcherType::kFlex;
    const auto w = finalize(c).warnings;
    EXPECT_TRUE(has(w, "W009"));
    EXPECT_EQ(c.model.moe_token_dispatcher_type, DispatcherType::kAlltoall);
    Config with_backend = make_recipe("tiny-moe");
    with_backend.model.moe_token_dispatcher_type = DispatcherType::kFlex;
    with_backend.model.moe_flex_dispatcher_backend = FlexBackend::kHybridep;
    EXPECT_TRUE(finalize(with_backend).warnings.empty());
    EXPECT_EQ(with_backend.model.moe_token_dispatcher_type, DispatcherType::kFlex);
}

// Expert chunks serve only the overlap schedule (they leave C = 1's bits): without overlap the
// layers run whole and W014 says so; with overlap C stays.
TEST(Finalize, ExpertChunksWithoutOverlapRunWhole) {
    const auto finalized = [](bool overlap) {
        Config c = make_recipe("tiny-moe");
        c.comm_overlap.emplace();
        c.comm_overlap->tp_comm_overlap = false;
        c.comm_overlap->overlap_moe_expert_parallel_comm = overlap;
        c.model.moe_ep_overlap_num_chunks = 2;
        const auto w = finalize(c).warnings;
        return std::pair{c.model.moe_ep_overlap_num_chunks, has(w, "W014")};
    };
    EXPECT_EQ(finalized(false), std::pair(1, true));
    EXPECT_EQ(finalized(true), std::pair(2, false));
    // Without a comm_overlap section overlap is the model's own field, off by default.
    Config bare = make_recipe("tiny-moe");
    bare.model.moe_ep_overlap_num_chunks = 2;
    EXPECT_TRUE(has(finalize(bare).warnings, "W014"));
    EXPECT_EQ(bare.model.moe_ep_overlap_num_chunks, 1);
    EXPECT_TRUE(finalize(bare).warnings.empty());  // finalizing twice changes nothing
}

// Paired edges reorder the overlap schedule only: without overlap W015 clears the field (the
// baseline of `epo bench --compare` is built from the same overrides, so not an error); with
// overlap it stays.
TEST(Finalize, PairedEdgesWithoutOverlapAreIgnored) {
    const auto finalized = [](bool overlap) {
        Config c = make_recipe("tiny-moe");
        c.comm_overlap.emplace();
        c.comm_overlap->tp_comm_overlap = false;
        c.comm_overlap->overlap_moe_expert_parallel_comm = overlap;
        c.model.moe_ep_overlap_pair_edges = true;
        const auto w = finalize(c).warnings;
        return std::pair{c.model.moe_ep_overlap_pair_edges, has(w, "W015")};
    };
    EXPECT_EQ(finalized(false), std::pair(false, true));
    EXPECT_EQ(finalized(true), std::pair(true, false));
}

}  // namespace
}  // namespace epo::config

namespace epo::config {
namespace {

// Megatron-Core applies moe_router_pre_softmax to softmax scores only: with sigmoid scores it is
// cleared with W016 (Bridge's DeepSeek-V3 recipe sets both), so the plan and the runtime see the
// routing that runs.
TEST(Finalize, PreSoftmaxWithSigmoidScoresIsClearedWithAWarning) {
    Config c = make_recipe("deepseek-v3");
    c.model.moe_router_score_function = ScoreFunction::kSigmoid;
    c.model.moe_router_pre_softmax = true;
    Config finalized = c;
    const FinalizeResult r = finalize(finalized);
    EXPECT_FALSE(finalized.model.moe_router_pre_softmax);
    ASSERT_EQ(std::count_if(r.warnings.begin(), r.warnings.end(),
                            [](const Finding& f) { return f.id == "W016"; }),
              1);
    // With softmax scores it is the user's choice and stays.
    c.model.moe_router_score_function = ScoreFunction::kSoftmax;
    finalize(c);
    EXPECT_TRUE(c.model.moe_router_pre_softmax);
}

}  // namespace
}  // namespace epo::config
