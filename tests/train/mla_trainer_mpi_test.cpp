// Multi-latent attention in the trainer: tiny-moe with MLA (small latent ranks) trains, and the
// overlap schedule and overlap + delayed wgrad equal the baseline bit for bit (losses, grad
// norms, every parameter), with and without compressed queries, and with DeepSeek-V3's router
// (sigmoid scores, group-limited top-k, expert bias, sequence aux loss) on top.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "epo/comm/mpi_runtime.h"
#include "epo/config/memory_estimate.h"
#include "epo/train/trainer.h"
#include "train_test_util.h"

namespace epo::train {
namespace {

using testing::expect_bit_identical;
using testing::RunRecord;

constexpr int kSteps = 10;

// tiny-moe's test shape, EP = world, with MLA: 4 heads, Rkv 16, Dn 16, Dr 8, Dv 16.
std::vector<std::string> mla_overrides(int world, bool q_lora, std::vector<std::string> extra) {
    std::vector<std::string> o = testing::tiny_shape_overrides();
    o.insert(o.end(),
             {"comm.gpus_per_node=" + std::to_string(world),
              "model.expert_model_parallel_size=" + std::to_string(world),
              "train.global_batch_size=" + std::to_string(2 * world * 3),
              "model.multi_latent_attention=true", "model.qk_layernorm=true",
              q_lora ? "model.q_lora_rank=32" : "model.q_lora_rank=null", "model.kv_lora_rank=16",
              "model.qk_head_dim=16", "model.qk_pos_emb_head_dim=8", "model.v_head_dim=16"});
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
}

// Baseline, overlap, overlap + delayed wgrad of the same configuration: bit-identical, and the
// loss falls.
void expect_schedules_bit_identical(bool q_lora, const std::vector<std::string>& extra,
                                    int steps = kSteps) {
    const int world = comm::current_world_size();
    auto with = [&](std::vector<std::string> more) {
        std::vector<std::string> o = extra;
        o.insert(o.end(), more.begin(), more.end());
        return epo::testing::run_config("tiny-moe", mla_overrides(world, q_lora, o));
    };
    const config::Config base = with({});
    const config::Config overlap = with({"comm_overlap.overlap_moe_expert_parallel_comm=true",
                                         "comm_overlap.delay_wgrad_compute=false"});
    const config::Config delayed = with({"comm_overlap.overlap_moe_expert_parallel_comm=true",
                                         "comm_overlap.delay_wgrad_compute=true"});
    ASSERT_TRUE(base.model.multi_latent_attention);
    ASSERT_TRUE(delayed.model.overlap_moe_expert_parallel_comm);
    ASSERT_TRUE(delayed.model.delay_wgrad_compute);
    const RunRecord a = testing::record_run(base, steps);
    const RunRecord b = testing::record_run(overlap, steps);
    const RunRecord c = testing::record_run(delayed, steps);
    expect_bit_identical(a, b);
    expect_bit_identical(a, c);
    EXPECT_LT(a.losses.back(), a.losses.front());
    if (comm::current_world_rank() == 0) {
        std::printf(
            "MLA (q lora %d): loss %.4f -> %.4f; peak activation bytes baseline %lld, "
            "overlap %lld, overlap+delayed %lld\n",
            q_lora, a.losses.front(), a.losses.back(),
            static_cast<long long>(a.peak_activation_bytes),
            static_cast<long long>(b.peak_activation_bytes),
            static_cast<long long>(c.peak_activation_bytes));
    }
}

TEST(MlaTrainer, OverlapAndDelayedWgradAreBitIdenticalToBaseline) {
    expect_schedules_bit_identical(/*q_lora=*/true, {});
}

TEST(MlaTrainer, UncompressedQueriesAreBitIdenticalToBaseline) {
    expect_schedules_bit_identical(/*q_lora=*/false, {"model.gradient_accumulation_fusion=true"});
}

TEST(MlaTrainer, DeepSeekRouterWithMlaIsBitIdenticalToBaseline) {
    expect_schedules_bit_identical(
        /*q_lora=*/true,
        {"model.moe_router_score_function=sigmoid", "model.moe_router_enable_expert_bias=true",
         "model.moe_router_num_groups=4", "model.moe_router_group_topk=2",
         "model.moe_router_topk_scaling_factor=2.5", "model.moe_router_dtype=fp32",
         "model.moe_router_load_balancing_type=seq_aux_loss", "model.moe_aux_loss_coeff=1e-4"});
}

// PP 2 x VPP 2 with an uneven layout (5 layers: the first stage's chunks hold the embedding and 1
// layer, then 2; the second's 1, then 1 and the loss), EP 2 inside each stage: the interleaved
// schedule's combined steps run MLA's nodes like any other, bit for bit.
TEST(MlaTrainer, PipelineWithAnUnevenLayoutIsBitIdenticalToBaseline) {
    const int world = comm::current_world_size();
    if (world < 4 || world % 4 != 0)
        GTEST_SKIP() << "EP overlap needs EP > 1: PP 2 needs 4 ranks";
    const int ep = world / 2;
    expect_schedules_bit_identical(
        /*q_lora=*/true,
        {"model.num_layers=5", "model.pipeline_model_parallel_size=2",
         "model.virtual_pipeline_model_parallel_size=2",
         "model.pipeline_model_parallel_layout=Et|tt|t|tL",
         "model.expert_model_parallel_size=" + std::to_string(ep),
         "train.global_batch_size=" + std::to_string(2 * ep * 4)},
        4);
}

// DeepSeek-V3's features together at PP 1: MLA, one MTP layer, group-limited sigmoid routing
// with expert bias, a shared expert, the first layer dense, and selective recompute of the
// modules that run with MLA (moe_act, mlp, shared_experts; core_attn, layernorm and mla_up_proj
// are refused with MLA, RT034): overlap and overlap + delayed wgrad equal the baseline bit for
// bit (lm and MTP losses, grad norms, every parameter), and so does the baseline without
// recompute.
TEST(MlaTrainer, DeepSeekV3FeaturesTogetherAreBitIdenticalToBaseline) {
    const std::vector<std::string> model = {"model.num_layers=2",
                                            "model.moe_layer_freq=[0,1]",
                                            "model.mtp_num_layers=1",
                                            "model.moe_shared_expert_intermediate_size=64",
                                            "model.moe_router_score_function=sigmoid",
                                            "model.moe_router_enable_expert_bias=true",
                                            "model.moe_router_num_groups=4",
                                            "model.moe_router_group_topk=2",
                                            "model.moe_router_topk_scaling_factor=2.5",
                                            "model.moe_router_dtype=fp32",
                                            "model.moe_router_load_balancing_type=seq_aux_loss",
                                            "model.moe_aux_loss_coeff=1e-4"};
    std::vector<std::string> recompute = model;
    recompute.insert(recompute.end(), {"model.recompute_granularity=selective",
                                       "model.recompute_modules=[moe_act,mlp,shared_experts]"});
    expect_schedules_bit_identical(/*q_lora=*/true, recompute, 4);
    const int world = comm::current_world_size();
    const RunRecord with = testing::record_run(
        epo::testing::run_config("tiny-moe", mla_overrides(world, true, recompute)), 4);
    const RunRecord without = testing::record_run(
        epo::testing::run_config("tiny-moe", mla_overrides(world, true, model)), 4);
    expect_bit_identical(with, without);
    EXPECT_GT(with.mtp_losses.front(), 0.0);
}

// The same features at PP 2 x VPP 2 with an uneven layout whose last chunk holds the MTP layer
// (`Et|tt|t|tmL`: the last stage's embedding copy feeds the MTP, docs/pipeline.md), EP 2 inside
// each stage: overlap and overlap + delayed wgrad equal the baseline bit for bit, and so does the
// baseline without recompute.
TEST(MlaTrainer, DeepSeekV3FeaturesTogetherWithStagesAreBitIdenticalToBaseline) {
    const int world = comm::current_world_size();
    if (world < 4 || world % 4 != 0)
        GTEST_SKIP() << "EP overlap needs EP > 1: PP 2 needs 4 ranks";
    const int ep = world / 2;
    const std::vector<std::string> model = {
        "model.num_layers=5",
        "model.moe_layer_freq=[0,1,1,1,1]",
        "model.mtp_num_layers=1",
        "model.pipeline_model_parallel_size=2",
        "model.virtual_pipeline_model_parallel_size=2",
        "model.pipeline_model_parallel_layout=Et|tt|t|tmL",
        "model.expert_model_parallel_size=" + std::to_string(ep),
        "train.global_batch_size=" + std::to_string(2 * ep * 4),
        "model.moe_shared_expert_intermediate_size=64",
        "model.moe_router_score_function=sigmoid",
        "model.moe_router_enable_expert_bias=true",
        "model.moe_router_num_groups=4",
        "model.moe_router_group_topk=2",
        "model.moe_router_topk_scaling_factor=2.5",
        "model.moe_router_dtype=fp32",
        "model.moe_router_load_balancing_type=seq_aux_loss",
        "model.moe_aux_loss_coeff=1e-4"};
    std::vector<std::string> recompute = model;
    recompute.insert(recompute.end(), {"model.recompute_granularity=selective",
                                       "model.recompute_modules=[moe_act,mlp,shared_experts]"});
    expect_schedules_bit_identical(/*q_lora=*/true, recompute, 4);
    const RunRecord with = testing::record_run(
        epo::testing::run_config("tiny-moe", mla_overrides(world, true, recompute)), 4);
    const RunRecord without = testing::record_run(
        epo::testing::run_config("tiny-moe", mla_overrides(world, true, model)), 4);
    expect_bit_identical(with, without);
    EXPECT_GT(with.mtp_losses.front(), 0.0);
}

TEST(MlaTrainer, ActivationEstimateFollowsTheMeter) {
    // The memory estimate's activations (config/memory_estimate.h) against the model's
    // activation meter (the arenas' bytes, largest over the steps), baseline schedule: MLA's
    // ratio is GQA's on the same model, so the estimate counts MLA's saved tensors as it counts
    // GQA's.
    const int world = comm::current_world_size();
    const config::Config mla = epo::testing::run_config("tiny-moe", mla_overrides(world, true, {}));
    config::Config gqa = mla;
    gqa.model.multi_latent_attention = false;
    gqa.model.qk_layernorm = false;
    double ratio[2] = {};
    for (int i = 0; i < 2; ++i) {
        const config::Config& cfg = i == 0 ? mla : gqa;
        const RunRecord r = testing::record_run(cfg, 2);
        const int64_t estimate = config::estimate_rank_memory(cfg, world).activations;
        ratio[i] = static_cast<double>(estimate) / static_cast<double>(r.peak_activation_bytes);
        if (comm::current_world_rank() == 0) {
            std::printf("%s: estimated activations %lld, metered peak %lld, ratio %.3f\n",
                        i == 0 ? "MLA" : "GQA", static_cast<long long>(estimate),
                        static_cast<long long>(r.peak_activation_bytes), ratio[i]);
        }
    }
    EXPECT_NEAR(ratio[0], ratio[1], 0.1);
}

}  // namespace
}  // namespace epo::train
