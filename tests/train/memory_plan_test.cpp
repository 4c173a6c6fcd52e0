// The memory estimate from the step plan (memory_plan.h): at PP = 1 it is the configuration's
// estimate (config/memory_estimate.h, hand-counted in tests/config), and with pipeline stages
// each stage counts its own positions, the expert optimizer state over EDP = world / (ETP EP PP),
// and the units its call list keeps alive.
#include "epo/train/memory_plan.h"

#include <gtest/gtest.h>

#include "epo/config/finalize.h"
#include "train_test_util.h"

namespace epo::train {
namespace {

config::Config tiny(std::vector<std::string> extra) {
    std::vector<std::string> o = {"model.num_layers=4", "comm.gpus_per_node=4",
                                  "model.expert_model_parallel_size=2", "train.micro_batch_size=2",
                                  "train.global_batch_size=16"};
    o.insert(o.end(), extra.begin(), extra.end());
    return epo::testing::run_config("tiny-moe", o);
}

TEST(MemoryPlan, OneStageIsTheConfigurationsEstimate) {
    for (const std::vector<std::string>& extra :
         {std::vector<std::string>{},
          {"comm_overlap.overlap_moe_expert_parallel_comm=true"},
          {"comm_overlap.overlap_moe_expert_parallel_comm=true",
           "model.moe_ep_overlap_pair_edges=true"}}) {
        const config::Config c = tiny(extra);
        const config::MemoryEstimate want = config::estimate_rank_memory(c, 4);
        const config::MemoryEstimate got = estimate_run_memory(c);
        EXPECT_EQ(got.activations, want.activations) << extra.size();
        EXPECT_EQ(got.micro_batches_in_flight, want.micro_batches_in_flight) << extra.size();
        EXPECT_EQ(got.optimizer, want.optimizer);
        EXPECT_EQ(got.scratch, want.scratch);
        // The configuration also counts the router's expert bias, which is a buffer, not a
        // parameter: a few bytes per layer.
        EXPECT_NEAR(static_cast<double>(got.parameters), static_cast<double>(want.parameters),
                    1e-3 * static_cast<double>(want.parameters));
    }
}

// PP 2 on 4 ranks, 4 micro-batches, baseline: stage 0 holds layers 0-1 and the embedding with
// two units alive in its warm-up (P - s - 1 = 1 forward ahead), stage 1 layers 2-3 and the output
// with one.
TEST(MemoryPlan, EachStageCountsItsOwnLayersAndItsUnitsInFlight) {
    const config::Config c = tiny({"model.pipeline_model_parallel_size=2"});
    const config::ActivationBytes a = config::activation_bytes(c);
    const int64_t half = 2 * a.moe_layer;  // tiny-moe: every layer MoE
    for (int stage : {0, 1}) {
        const model::GptShape shape = model::gpt_shape_from_config(c, 2, 0, stage);
        const config::MemoryEstimate m = estimate_stage_memory(c, make_step_plan(c, shape), shape);
        if (stage == 0) {
            EXPECT_EQ(m.micro_batches_in_flight, 2);
            EXPECT_EQ(m.activations, 2 * (half + a.handoff));
        } else {
            EXPECT_EQ(m.micro_batches_in_flight, 1);
            EXPECT_EQ(m.activations, half + a.handoff + a.output);
        }
    }
    // Every layer on one rank costs more than either stage.
    const config::MemoryEstimate whole = config::estimate_rank_memory(c, 4);
    EXPECT_LT(estimate_run_memory(c).parameters, whole.parameters);
}

// Distributed optimizer, PP 2 x EP 2 on 8 ranks: the experts' moments are sharded over
// EDP = 8 / (EP 2 x PP 2) = 2, the dense ones over DP = 8 / PP 2 = 4.
TEST(MemoryPlan, ExpertMomentsShardOverTheExpertDataParallelGroup) {
    const config::Config c =
        tiny({"model.pipeline_model_parallel_size=2", "comm.gpus_per_node=8",
              "ddp.use_distributed_optimizer=true", "train.global_batch_size=32"});
    const model::GptShape shape = model::gpt_shape_from_config(c, 2, 0, 1);
    const StepPlan plan = make_step_plan(c, shape);
    ASSERT_EQ(plan.dp_size, 4);
    ASSERT_EQ(plan.edp_size, 2);
    int64_t dense = 0, expert = 0;
    for (int p = 2; p <= 4; ++p) {
        for (int64_t n : param_sizes_at(shape, p).dense)
            dense += n;
        for (int64_t n : param_sizes_at(shape, p).expert)
            expert += n;
    }
    EXPECT_EQ(estimate_stage_memory(c, plan, shape).optimizer, dense * 8 / 4 + expert * 8 / 2);
}

}  // namespace
}  // namespace epo::train
