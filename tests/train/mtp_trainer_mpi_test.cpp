// Multi-token prediction in the trainer (model/mtp.h): tiny-moe with one MTP layer (MoE, as the
// decoder's last layer is) trains, and the overlap schedule and overlap + delayed wgrad equal the
// baseline bit for bit (lm and MTP losses, grad norms, every parameter), also with paired edges
// and MoE chunks, and with tied embeddings. With mtp_loss_scaling_factor 0 (and no router
// losses) the MTP adds exact zeros to the shared embedding, output layer and decoder: the main
// model trains as without MTP, bit for bit.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "epo/comm/mpi_runtime.h"
#include "epo/train/memory_plan.h"
#include "train_test_util.h"

namespace epo::train {
namespace {

using testing::expect_bit_identical;
using testing::RunRecord;

constexpr int kSteps = 8;

// tiny-moe's test shape, EP = world, 3 micro-batches per step, one MTP layer.
std::vector<std::string> mtp_overrides(int world, std::vector<std::string> extra) {
    std::vector<std::string> o = testing::tiny_shape_overrides();
    o.insert(o.end(), {"comm.gpus_per_node=" + std::to_string(world),
                       "model.expert_model_parallel_size=" + std::to_string(world),
                       "train.global_batch_size=" + std::to_string(2 * world * 3),
                       "model.mtp_num_layers=1"});
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
}

config::Config mtp_config(std::vector<std::string> extra) {
    return epo::testing::run_config("tiny-moe",
                                    mtp_overrides(comm::current_world_size(), std::move(extra)));
}

void expect_schedules_bit_identical(const std::vector<std::string>& extra) {
    auto with = [&](std::vector<std::string> more) {
        std::vector<std::string> o = extra;
        o.insert(o.end(), more.begin(), more.end());
        return mtp_config(o);
    };
    const config::Config base = with({});
    const config::Config overlap = with({"comm_overlap.overlap_moe_expert_parallel_comm=true",
                                         "comm_overlap.delay_wgrad_compute=false"});
    const config::Config delayed = with({"comm_overlap.overlap_moe_expert_parallel_comm=true",
                                         "comm_overlap.delay_wgrad_compute=true"});
    ASSERT_EQ(base.model.mtp_num_layers, 1);
    ASSERT_TRUE(delayed.model.delay_wgrad_compute);
    const RunRecord a = testing::record_run(base, kSteps);
    const RunRecord b = testing::record_run(overlap, kSteps);
    const RunRecord c = testing::record_run(delayed, kSteps);
    expect_bit_identical(a, b);
    expect_bit_identical(a, c);
    EXPECT_LT(a.losses.back(), a.losses.front());
    EXPECT_LT(a.mtp_losses.back(), a.mtp_losses.front());
    EXPECT_GT(a.mtp_losses.front(), 0.0);
    if (comm::current_world_rank() == 0) {
        std::printf(
            "MTP: lm loss %.4f -> %.4f, mtp_1 loss %.4f -> %.4f; peak activation bytes "
            "baseline %lld, overlap %lld, overlap+delayed %lld\n",
            a.losses.front(), a.losses.back(), a.mtp_losses.front(), a.mtp_losses.back(),
            static_cast<long long>(a.peak_activation_bytes),
            static_cast<long long>(b.peak_activation_bytes),
            static_cast<long long>(c.peak_activation_bytes));
    }
}

TEST(MtpTrainer, OverlapAndDelayedWgradAreBitIdenticalToBaseline) {
    expect_schedules_bit_identical({});
}

TEST(MtpTrainer, PairedEdgesAndMoeChunksAreBitIdenticalToBaseline) {
    expect_schedules_bit_identical(
        {"model.moe_ep_overlap_pair_edges=true", "model.moe_ep_overlap_num_chunks=2"});
}

TEST(MtpTrainer, TiedEmbeddingsAndBucketedReductionAreBitIdenticalToBaseline) {
    expect_schedules_bit_identical({"model.share_embeddings_and_output_weights=true",
                                    "ddp.overlap_grad_reduce=true", "ddp.bucket_size=40000"});
}

// The memory plan (train/memory_plan.h) counts the MTP: against a model without MTP of as many
// layers (the MTP layer counts as one), its estimate grows by model::mtp_saved_bytes per
// micro-batch in flight and its parameters by the prologue's; it stays above the trainer's
// metered peak (baseline and overlap).
TEST(MtpTrainer, MemoryPlanCountsTheMtp) {
    std::vector<std::string> no_mtp = mtp_overrides(comm::current_world_size(), {});
    no_mtp.push_back("model.mtp_num_layers=null");
    no_mtp.push_back("model.num_layers=3");
    for (const char* overlap : {"false", "true"}) {
        SCOPED_TRACE(overlap);
        const std::string o =
            std::string("comm_overlap.overlap_moe_expert_parallel_comm=") + overlap;
        std::vector<std::string> plain = no_mtp;
        plain.push_back(o);
        const config::Config cfg[2] = {epo::testing::run_config("tiny-moe", plain),
                                       mtp_config({o})};
        config::MemoryEstimate m[2];
        int64_t peak[2] = {};
        for (int i = 0; i < 2; ++i) {
            Trainer trainer(cfg[i]);
            peak[i] = testing::record_run(trainer, 2).peak_activation_bytes;
            m[i] = estimate_run_memory(cfg[i]);
            int64_t param_bytes = 0;
            for (Param* p : trainer.model().all_params())
                param_bytes += p->master.numel() * 4;
            EXPECT_EQ(m[i].gradients, param_bytes);
            EXPECT_GT(m[i].activations, peak[i]);
        }
        const model::GptShape s = model::gpt_shape_from_config(cfg[1], 1, 0);
        EXPECT_EQ(m[1].activations - m[0].activations,
                  m[1].micro_batches_in_flight *
                      model::mtp_saved_bytes(s.tokens(), s.hidden, s.vocab, 2));
        const int64_t H = s.hidden;
        EXPECT_EQ(m[1].gradients - m[0].gradients, 4 * (3 * H + 2 * H * H));
        if (comm::current_world_rank() == 0) {
            std::printf(
                "overlap %s: activations estimated / metered: no MTP (3 layers) %lld / "
                "%lld, MTP %lld / %lld\n",
                overlap, static_cast<long long>(m[0].activations), static_cast<long long>(peak[0]),
                static_cast<long long>(m[1].activations), static_cast<long long>(peak[1]));
        }
    }
}

// Without router losses: the MTP layer's router aux loss has its own coefficient (as in
// Megatron-Core), so it would reach the main model through the prologue whatever the MTP factor.
TEST(MtpTrainer, ZeroScalingFactorTrainsTheMainModelAsWithoutMtp) {
    const std::vector<std::string> kNoAux = {"model.moe_aux_loss_coeff=0",
                                             "model.moe_z_loss_coeff=null"};
    const config::Config off = epo::testing::run_config("tiny-moe", [&] {
        std::vector<std::string> o = mtp_overrides(comm::current_world_size(), kNoAux);
        o.push_back("model.mtp_num_layers=null");
        return o;
    }());
    std::vector<std::string> zero_factor = kNoAux;
    zero_factor.push_back("model.mtp_loss_scaling_factor=0");
    const config::Config zero = mtp_config(zero_factor);
    const config::Config scaled = mtp_config(kNoAux);
    ASSERT_FALSE(off.model.mtp_num_layers.has_value());
    // Each run's final parameters by name.
    const auto run = [](const config::Config& cfg, RunRecord& r) {
        Trainer trainer(cfg);
        r = testing::record_run(trainer, 4);
        std::map<std::string, std::vector<float>> by_name;
        const std::vector<Param*> params = trainer.model().all_params();
        for (size_t i = 0; i < params.size(); ++i)
            by_name[params[i]->name] = r.params[i];
        return by_name;
    };
    RunRecord a, b, c;
    const auto pa = run(off, a), pb = run(zero, b), pc = run(scaled, c);
    EXPECT_EQ(a.losses, b.losses);
    EXPECT_EQ(a.grad_norms, b.grad_norms);
    EXPECT_GT(b.mtp_losses.front(), 0.0);  // computed and logged, weighted 0
    EXPECT_NE(a.losses.back(), c.losses.back());
    // Every parameter of the main model is the same bits with factor 0; with the default 0.1 the
    // MTP's gradient changes the shared embedding and output layer.
    ASSERT_GT(pb.size(), pa.size());
    for (const auto& [name, values] : pa) {
        SCOPED_TRACE(name);
        ASSERT_TRUE(pb.count(name));
        EXPECT_TRUE(values == pb.at(name));
    }
    EXPECT_FALSE(pa.at("embedding.word_embeddings.weight") ==
                 pc.at("embedding.word_embeddings.weight"));
    EXPECT_FALSE(pa.at("output_layer.weight") == pc.at("output_layer.weight"));
}

}  // namespace
}  // namespace epo::train
