// Shared-expert overlap (model.moe_shared_expert_overlap, schedule.h "Shared-expert overlap") in
// the trainer: the shared expert as a node of its own beside the dispatch and the combine
// backward trains bit for bit as the shared expert inside pre_dispatch (losses, grad norms,
// every parameter), with both dispatchers, with MoE chunks and layernorm recompute, with full
// recompute, with DeepSeek-V3's router, and on a pipeline stage; and the step plan of the flagged
// run does hold the shared expert's own calls (so the comparison is not of two equal plans).
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "epo/comm/mpi_runtime.h"
#include "epo/model/gpt_model.h"
#include "epo/train/step_plan.h"
#include "train_test_util.h"

namespace epo::train {
namespace {

using testing::expect_bit_identical;
using testing::RunRecord;

constexpr int kSteps = 4;

struct SharedCase {
    const char* name;
    int pp = 1;
    std::vector<std::string> extra;
};

// tiny-moe's test shape, the first layer dense (as DeepSeek-V3's first layers are), a shared
// expert, 3 micro-batches per step, EP = the ranks of a stage.
config::Config shared_config(const SharedCase& c, bool overlap_shared) {
    const int world = comm::current_world_size();
    const int ep = world / c.pp;
    std::vector<std::string> o = testing::tiny_shape_overrides();
    o.insert(o.end(), {"model.num_layers=3", "model.moe_layer_freq=[0,1,1]",
                       "model.moe_shared_expert_intermediate_size=64",
                       "comm.gpus_per_node=" + std::to_string(world),
                       "model.expert_model_parallel_size=" + std::to_string(ep),
                       "model.pipeline_model_parallel_size=" + std::to_string(c.pp),
                       "train.global_batch_size=" + std::to_string(2 * ep * 3),
                       std::string("model.moe_shared_expert_overlap=") +
                           (overlap_shared ? "true" : "false")});
    o.insert(o.end(), c.extra.begin(), c.extra.end());
    return epo::testing::run_config("tiny-moe", o);
}

// The shared-expert calls of this rank's plan.
int shared_calls(const config::Config& cfg) {
    const int rank = comm::current_world_rank();
    const int stage = rank / (comm::current_world_size() / cfg.model.pipeline_model_parallel_size);
    const model::GptShape shape = model::gpt_shape_from_config(cfg, 1, 0, stage);
    int n = 0;
    for (const schedule::NodeCall& c : make_step_plan(cfg, shape).calls)
        n += c.node == schedule::NodeKind::kSharedExpert;
    return n;
}

class SharedExpertOverlap : public ::testing::TestWithParam<SharedCase> {};

TEST_P(SharedExpertOverlap, BitIdenticalToTheSharedExpertInPreDispatch) {
    const SharedCase& c = GetParam();
    if (comm::current_world_size() % c.pp != 0)
        GTEST_SKIP() << "PP " << c.pp << " does not divide the ranks";
    const config::Config off = shared_config(c, false);
    const config::Config on = shared_config(c, true);
    ASSERT_TRUE(on.model.moe_shared_expert_overlap);
    ASSERT_FALSE(on.model.overlap_moe_expert_parallel_comm);
    EXPECT_EQ(shared_calls(off), 0);
    EXPECT_GT(shared_calls(on), 0);
    const RunRecord a = testing::record_run(off, kSteps);
    const RunRecord b = testing::record_run(on, kSteps);
    expect_bit_identical(a, b);
    EXPECT_LT(a.losses.back(), a.losses.front());
}

INSTANTIATE_TEST_SUITE_P(
    Trainer, SharedExpertOverlap,
    ::testing::Values(
        SharedCase{"alltoall"},
        SharedCase{
            "flex_deepep",
            1,
            {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=deepep"}},
        SharedCase{
            "dsv3_router_chunks_layernorm_recompute",
            1,
            {"model.moe_router_score_function=sigmoid", "model.moe_router_enable_expert_bias=true",
             "model.moe_router_num_groups=4", "model.moe_router_group_topk=2",
             "model.moe_ep_overlap_num_chunks=2", "model.recompute_granularity=selective",
             "model.recompute_modules=[layernorm,moe_act]"}},
        SharedCase{"full_recompute",
                   1,
                   {"model.recompute_granularity=full", "model.recompute_method=uniform",
                    "model.recompute_num_layers=1"}},
        SharedCase{"pp2", 2, {"model.num_layers=4", "model.moe_layer_freq=[0,1,1,1]"}}),
    [](const ::testing::TestParamInfo<SharedCase>& info) { return info.param.name; });

}  // namespace
}  // namespace epo::train
