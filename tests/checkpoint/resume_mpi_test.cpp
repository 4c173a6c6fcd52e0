// Training runs that lose nothing, end to end through run_training (what `epo train` runs):
// resume after a save continues bit-identically, a checkpoint of another configuration, layout
// or with a corrupt file is refused on every rank, and an injected NaN stops the run naming the
// step and the parameter.
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <limits>
#include <sstream>

#include "checkpoint_test_util.h"
#include "epo/comm/mpi_runtime.h"
#include "epo/train/train_run.h"

namespace epo::train {
namespace {

namespace fs = std::filesystem;

TrainRunResult train(const fs::path& out, std::vector<std::string> overrides,
                     std::function<void(Trainer&)> before_step = {},
                     std::function<void(const Trainer&, const StepResult&)> on_step = {}) {
    TrainRunOptions options;
    options.sources.model = "tiny-moe";
    options.sources.overrides = std::move(overrides);
    options.out_dir = out;
    options.before_step = std::move(before_step);
    options.on_step = std::move(on_step);
    std::ostringstream log;
    TrainRunResult r = run_training(options, log);
    return r;
}

uint64_t bits(double v) {
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof b);
    return b;
}

// Runs `f` expecting an epo::Error of `kind`; returns its message.
std::string error_of(const std::function<void()>& f, ErrorKind kind) {
    try {
        f();
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), kind) << e.what();
        return e.what();
    }
    ADD_FAILURE() << "no error";
    return "";
}

class Resume : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        world_ = comm::current_world_size();
        dir_ = new fs::path(epo::testing::shared_temp_dir("resume"));
        // The reference: 5 steps without interruption.
        *reference_ = train(*dir_ / "a", epo::testing::small_moe(world_, {"train.train_iters=5"}));
        // The same run, saving every 2 iterations, stopped by a SIGTERM to the last rank during
        // iteration 3: every rank saves iteration 3 and returns.
        *first_part_ = train(*dir_ / "b",
                             epo::testing::small_moe(world_, {"train.train_iters=5",
                                                              "checkpoint.save=" + ckpt().string(),
                                                              "checkpoint.save_interval=2"}),
                             {}, [](const Trainer& t, const StepResult& r) {
                                 if (r.step == 3 && t.world_rank() == t.world_size() - 1)
                                     std::raise(SIGTERM);
                             });
    }
    static void TearDownTestSuite() { MPI_Barrier(MPI_COMM_WORLD); }

    static fs::path ckpt() { return *dir_ / "ckpt"; }

    static int world_;
    static fs::path* dir_;
    static TrainRunResult* reference_;
    static TrainRunResult* first_part_;
};

int Resume::world_ = 0;
fs::path* Resume::dir_ = nullptr;
TrainRunResult* Resume::reference_ = new TrainRunResult;
TrainRunResult* Resume::first_part_ = new TrainRunResult;

TEST_F(Resume, SigtermSavesEveryIntervalAndOnStopping) {
    EXPECT_TRUE(first_part_->stopped_by_signal);
    EXPECT_TRUE(fs::exists(ckpt() / "iter_0000002" / "metadata.json"));
    EXPECT_TRUE(fs::exists(ckpt() / "iter_0000003" / "metadata.json"));
    EXPECT_FALSE(fs::exists(ckpt() / "iter_0000001"));
    EXPECT_EQ(first_part_->last_checkpoint, ckpt() / "iter_0000003");
    ASSERT_EQ(first_part_->steps.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
        EXPECT_EQ(bits(first_part_->steps[i].lm_loss), bits(reference_->steps[i].lm_loss));
}

TEST_F(Resume, ContinuesBitIdenticallyPastTheDebrisOfAnInterruptedSave) {
    if (comm::current_world_rank() == 0) {
        // A save of iteration 4 that crashed half-way: temporary directory, partial file.
        fs::create_directories(ckpt() / "iter_0000004.tmp");
        std::ofstream(ckpt() / "iter_0000004.tmp" / "rank_00000.safetensors") << "partial";
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const TrainRunResult resumed = train(
        *dir_ / "c", epo::testing::small_moe(
                         world_, {"train.train_iters=5", "checkpoint.load=" + ckpt().string()}));
    EXPECT_EQ(resumed.first_iteration, 4);
    ASSERT_EQ(resumed.steps.size(), 2u);
    ASSERT_EQ(reference_->steps.size(), 5u);
    for (size_t i = 0; i < 2; ++i) {
        const StepResult& want = reference_->steps[3 + i];
        const StepResult& got = resumed.steps[i];
        EXPECT_EQ(got.step, want.step);
        EXPECT_EQ(bits(got.lm_loss), bits(want.lm_loss)) << got.lm_loss << " vs " << want.lm_loss;
        EXPECT_EQ(bits(got.grad_norm), bits(want.grad_norm))
            << got.grad_norm << " vs " << want.grad_norm;
        EXPECT_EQ(got.learning_rate, want.learning_rate);
        ASSERT_TRUE(got.load_balancing_loss && want.load_balancing_loss);
        EXPECT_EQ(bits(*got.load_balancing_loss), bits(*want.load_balancing_loss));
    }
}

// The documented way to switch the overlap on, `--moe_a2a_overlap true`, creates the
// comm_overlap section and changes model.batch_p2p_comm: schedule switches, bit-identical by
// design. A baseline run's checkpoint resumes under the overlap schedule (it was refused for those
// differences) and continues bit-identically to the uninterrupted baseline run.
TEST_F(Resume, BaselineCheckpointResumesWithTheOverlapSwitchedOnByTheHarnessFlag) {
    if (world_ < 2)
        GTEST_SKIP() << "the overlap needs expert parallelism over 2 ranks or more";
    TrainRunOptions options;
    options.sources.model = "tiny-moe";
    options.sources.overrides = epo::testing::small_moe(
        world_, {"train.train_iters=5", "checkpoint.load=" + ckpt().string()});
    options.sources.harness.moe_a2a_overlap = true;
    options.out_dir = *dir_ / "overlap";
    std::ostringstream log;
    const TrainRunResult resumed = run_training(options, log);
    EXPECT_TRUE(resumed.config.model.overlap_moe_expert_parallel_comm);
    ASSERT_EQ(resumed.first_iteration, 4);
    ASSERT_EQ(resumed.steps.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
        const StepResult& want = reference_->steps[3 + i];
        const StepResult& got = resumed.steps[i];
        EXPECT_EQ(bits(got.lm_loss), bits(want.lm_loss)) << got.lm_loss << " vs " << want.lm_loss;
        EXPECT_EQ(bits(got.grad_norm), bits(want.grad_norm));
    }
}

// Checkpoints hold whole tensors whatever the optimizer: a distributed-optimizer run (shards
// of masters and moments gathered at save) continues a plain run's checkpoint, and a plain run
// continues a distributed one's, both bit-identically to the uninterrupted plain run.
TEST_F(Resume, DistributedAndPlainOptimizersResumeEachOthersCheckpoints) {
    const std::vector<std::string> distributed = {"ddp.use_distributed_optimizer=true",
                                                  "ddp.overlap_grad_reduce=true",
                                                  "ddp.overlap_param_gather=true"};
    const auto expect_reference = [&](const TrainRunResult& r, int64_t first) {
        ASSERT_EQ(r.first_iteration, first);
        ASSERT_EQ(r.steps.size(), static_cast<size_t>(5 - first + 1));
        for (size_t i = 0; i < r.steps.size(); ++i) {
            const StepResult& want = reference_->steps[static_cast<size_t>(first - 1) + i];
            EXPECT_EQ(bits(r.steps[i].lm_loss), bits(want.lm_loss)) << "step " << want.step;
            EXPECT_EQ(bits(r.steps[i].grad_norm), bits(want.grad_norm)) << "step " << want.step;
        }
    };
    // Plain checkpoint of iteration 3 (SetUpTestSuite), resumed by a distributed run.
    std::vector<std::string> o = {"train.train_iters=5", "checkpoint.load=" + ckpt().string()};
    o.insert(o.end(), distributed.begin(), distributed.end());
    const TrainRunResult dist_resumed = train(*dir_ / "f", epo::testing::small_moe(world_, o));
    expect_reference(dist_resumed, 4);

    // A distributed run from the start, stopped after iteration 4 (which it saves); a plain run
    // resumes it.
    const fs::path dist_ckpt = *dir_ / "dist_ckpt";
    o = {"train.train_iters=5", "checkpoint.save=" + dist_ckpt.string()};
    o.insert(o.end(), distributed.begin(), distributed.end());
    const TrainRunResult dist = train(*dir_ / "g", epo::testing::small_moe(world_, o), {},
                                      [](const Trainer& t, const StepResult& r) {
                                          if (r.step == 4 && t.world_rank() == 0)
                                              std::raise(SIGTERM);
                                      });
    ASSERT_TRUE(dist.stopped_by_signal);
    ASSERT_EQ(dist.steps.size(), 4u);
    for (size_t i = 0; i < 4; ++i)
        EXPECT_EQ(bits(dist.steps[i].lm_loss), bits(reference_->steps[i].lm_loss));
    const TrainRunResult plain_resumed = train(
        *dir_ / "h", epo::testing::small_moe(
                         world_, {"train.train_iters=5", "checkpoint.load=" + dist_ckpt.string()}));
    expect_reference(plain_resumed, 5);
}

TEST_F(Resume, AnotherConfigurationIsRefusedNamingTheKey) {
    const std::string error = error_of(
        [&] {
            train(*dir_ / "d",
                  epo::testing::small_moe(world_, {"train.train_iters=5", "optimizer.lr=0.002",
                                                   "checkpoint.load=" + ckpt().string()}));
        },
        ErrorKind::kConfig);
    EXPECT_NE(error.find("optimizer.lr: 0.001 vs 0.002 (checkpoint vs now)"), std::string::npos)
        << error;
}

TEST_F(Resume, AnotherExpertParallelLayoutIsRefused) {
    const std::string error = error_of(
        [&] {
            train(*dir_ / "e",
                  epo::testing::small_moe(
                      world_, {"train.train_iters=5", "model.expert_model_parallel_size=1",
                               "checkpoint.load=" + ckpt().string()}));
        },
        ErrorKind::kConfig);
    EXPECT_NE(error.find(fmt::format(
                  "model.expert_model_parallel_size {} in the checkpoint, 1 in this job", world_)),
              std::string::npos)
        << error;
}

TEST_F(Resume, ACorruptFileIsRefusedOnEveryRankAndNothingRuns) {
    const fs::path copy = *dir_ / "corrupt";
    const int last = world_ - 1;
    if (comm::current_world_rank() == 0) {
        fs::create_directories(copy);
        fs::copy(ckpt() / "iter_0000003", copy / "iter_0000003", fs::copy_options::recursive);
        epo::testing::flip_byte(copy / "iter_0000003" /
                                fmt::format("rank_{:05d}.safetensors", last));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    int steps_run = 0;
    const std::string error = error_of(
        [&] {
            train(*dir_ / "f",
                  epo::testing::small_moe(
                      world_, {"train.train_iters=5", "checkpoint.load=" + copy.string()}),
                  [&](Trainer&) { ++steps_run; });
        },
        ErrorKind::kIo);
    EXPECT_NE(error.find(fmt::format("rank {} of {}: checkpoint file", last, world_)),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("is corrupt"), std::string::npos) << error;
    EXPECT_EQ(steps_run, 0);
}

TEST(NonFinite, InjectedNanStopsTheRunNamingStepAndParameter) {
    const int world_ = comm::current_world_size();
    const fs::path dir = epo::testing::shared_temp_dir("nan");
    const int victim = world_ - 1;
    const std::string param = "decoder.layers.1.mlp.experts.linear_fc2.weight";
    const std::string error = error_of(
        [&] {
            train(dir / "g", epo::testing::small_moe(world_, {"train.train_iters=5"}),
                  [&](Trainer& t) {
                      // Before iteration 3, one element of one expert gradient on the last rank.
                      if (t.steps_done() != 2 || t.world_rank() != victim)
                          return;
                      for (Param* p : t.model().all_params()) {
                          if (p->name == param)
                              p->main_grad.data<float>()[5] =
                                  std::numeric_limits<float>::quiet_NaN();
                      }
                  });
        },
        ErrorKind::kNumerics);
    EXPECT_NE(error.find("iteration 3:"), std::string::npos) << error;
    EXPECT_NE(error.find(fmt::format("first non-finite gradient: {} (rank {})", param, victim)),
              std::string::npos)
        << error;
}

}  // namespace
}  // namespace epo::train
