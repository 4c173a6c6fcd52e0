// The same training run on 1, 2 and 4 ranks (EP = ranks, the same global batch) gives the same
// losses within a stated tolerance. Every size runs inside this one MPI job: the world is split
// into groups of each size, each group trains its own copy, and the losses are compared with the
// largest group's. They are not bit-identical, by design: the partition of the global batch into
// per-rank micro-batches changes the summation order of gradients (bf16 GEMM partial sums, the
// data-parallel all-reduce) and the per-micro-batch auxiliary load-balancing loss.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>

#include "epo/comm/mpi_runtime.h"
#include "epo/train/trainer.h"
#include "train_test_util.h"

namespace epo::train {
namespace {

std::vector<double> losses_on(int group_size, int steps) {
    const int rank = comm::current_world_rank();
    MPI_Comm group = MPI_COMM_NULL;
    comm::check_mpi(MPI_Comm_split(MPI_COMM_WORLD, rank / group_size, rank, &group),
                    "MPI_Comm_split");
    const std::string n = std::to_string(group_size);
    const config::Config cfg = epo::testing::run_config(
        "tiny-moe", {"model.num_layers=2", "model.hidden_size=64", "model.kv_channels=16",
                     "model.ffn_hidden_size=128", "model.moe_ffn_hidden_size=64",
                     "model.seq_length=32", "train.micro_batch_size=1", "train.global_batch_size=8",
                     "comm.gpus_per_node=" + n, "model.expert_model_parallel_size=" + n});
    std::vector<double> losses;
    {
        Trainer trainer(cfg, TrainerOptions{.comm = group});
        EXPECT_EQ(trainer.world_size(), group_size);
        for (int i = 0; i < steps; ++i) {
            losses.push_back(trainer.step().lm_loss);
        }
    }
    MPI_Comm_free(&group);
    return losses;
}

TEST(WorldSize, LossesAgreeAcrossOneTwoAndFourRanks) {
    constexpr int kSteps = 12;
    // Relative tolerance per step: the differences come from summation order only, so they stay
    // at the level of rounding noise amplified over a few optimizer steps (seen: 2e-5 to 5e-5).
    constexpr double kRelTol = 1e-3;
    const int world = comm::current_world_size();
    const std::vector<double> reference = losses_on(world, kSteps);
    EXPECT_LT(reference.back(), reference.front() - 0.3)
        << "the reference run must learn: " << reference.front() << " -> " << reference.back();
    for (int size = world / 2; size >= 1; size /= 2) {
        const std::vector<double> other = losses_on(size, kSteps);
        double worst = 0;
        for (int i = 0; i < kSteps; ++i) {
            worst = std::max(worst, std::abs(other[i] - reference[i]) / std::abs(reference[i]));
        }
        if (comm::current_world_rank() == 0) {
            std::printf("world %d vs %d ranks: largest relative loss difference %.3g\n", size,
                        world, worst);
        }
        EXPECT_LE(worst, kRelTol) << size << " ranks vs " << world;
    }
}

}  // namespace
}  // namespace epo::train
