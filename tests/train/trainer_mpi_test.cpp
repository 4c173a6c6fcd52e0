#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>

#include "epo/comm/mpi_runtime.h"
#include "epo/train/trainer.h"
#include "train_test_util.h"

namespace epo::train {
namespace {

struct RunRecord {
    std::vector<double> losses, grad_norms;
    std::vector<std::vector<float>> params;
};

RunRecord run(const config::Config& cfg, int steps) {
    Trainer trainer(cfg);
    RunRecord r;
    for (int i = 0; i < steps; ++i) {
        const StepResult s = trainer.step();
        r.losses.push_back(s.lm_loss);
        r.grad_norms.push_back(s.grad_norm);
    }
    for (Param* p : trainer.model().all_params()) {
        const float* d = p->master.data<float>();
        r.params.emplace_back(d, d + p->master.numel());
    }
    return r;
}

std::vector<std::string> tiny(int world, std::vector<std::string> extra) {
    std::vector<std::string> o = {"model.num_layers=2",
                                  "model.hidden_size=64",
                                  "model.kv_channels=16",
                                  "model.ffn_hidden_size=128",
                                  "model.moe_ffn_hidden_size=64",
                                  "model.seq_length=32",
                                  "train.micro_batch_size=2",
                                  "comm.gpus_per_node=" + std::to_string(world),
                                  "model.expert_model_parallel_size=" + std::to_string(world)};
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
}

TEST(Trainer, OverlapIsBitIdenticalToBaseline) {
    const int world = comm::current_world_size();
    const std::string gb = "train.global_batch_size=" + std::to_string(2 * world * 3);
    const config::Config base = epo::testing::run_config("tiny-moe", tiny(world, {gb}));
    const config::Config overlap = epo::testing::run_config(
        "tiny-moe", tiny(world, {gb, "comm_overlap.overlap_moe_expert_parallel_comm=true",
                                 "comm_overlap.delay_wgrad_compute=false"}));
    const config::Config delayed = epo::testing::run_config(
        "tiny-moe", tiny(world, {gb, "comm_overlap.overlap_moe_expert_parallel_comm=true",
                                 "comm_overlap.delay_wgrad_compute=true"}));
    ASSERT_TRUE(overlap.model.overlap_moe_expert_parallel_comm);
    ASSERT_TRUE(delayed.model.delay_wgrad_compute);
    const RunRecord a = run(base, 3), b = run(overlap, 3), c = run(delayed, 3);
    for (const RunRecord* other : {&b, &c}) {
        EXPECT_EQ(a.losses, other->losses);
        EXPECT_EQ(a.grad_norms, other->grad_norms);
        ASSERT_EQ(a.params.size(), other->params.size());
        for (size_t i = 0; i < a.params.size(); ++i) {
            EXPECT_EQ(0, std::memcmp(a.params[i].data(), other->params[i].data(),
                                     a.params[i].size() * sizeof(float)))
                << "parameter " << i;
        }
    }
    EXPECT_LT(a.losses.back(), a.losses.front());
}

}  // namespace
}  // namespace epo::train
