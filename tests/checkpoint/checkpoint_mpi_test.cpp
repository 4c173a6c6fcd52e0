// The checkpoint format and protocol on a real multi-rank job: round trip of every rank's
// tensors, the latest complete checkpoint found past the debris of an interrupted save, and
// corrupt, truncated, mixed and foreign-layout checkpoints refused on every rank.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "checkpoint_test_util.h"
#include "epo/checkpoint/checkpoint.h"
#include "epo/checkpoint/rank_agreement.h"
#include "epo/comm/mpi_runtime.h"
#include "epo/core/error.h"

namespace epo::checkpoint {
namespace {

namespace fs = std::filesystem;

comm::Communicator& control() {
    // Never destroyed: it must not outlive MPI_Finalize.
    static comm::Communicator* c = new comm::Communicator(
        make_control_communicator({.world_size = comm::current_world_size(),
                                   .expert_model_parallel_size = comm::current_world_size(),
                                   .gpus_per_node = comm::current_world_size()},
                                  30));
    return *c;
}

WorldLayout layout() {
    const int n = comm::current_world_size();
    return WorldLayout{
        .world_size = n, .num_nodes = 1, .gpus_per_node = n, .expert_model_parallel_size = n};
}

CheckpointInfo info(int64_t iteration) {
    return CheckpointInfo{.iteration = iteration,
                          .consumed_samples = iteration * 16,
                          .seed = 1234,
                          .layout = layout(),
                          .config_yaml = "recipe: tiny-moe\n"};
}

// Rank-encoded payloads: element i of rank r's tensor at iteration t is r * 1000 + t + i / 8.
std::vector<io::NamedTensor> rank_tensors(int64_t iteration) {
    const int rank = comm::current_world_rank();
    Tensor a = Tensor::zeros({3, 5}, DType::kF32);
    Tensor b = Tensor::zeros({7}, DType::kF32);
    for (Tensor* t : {&a, &b}) {
        for (int64_t i = 0; i < t->numel(); ++i)
            t->data<float>()[i] = static_cast<float>(rank * 1000 + iteration) + i / 8.0f;
    }
    return {{"weight", a}, {"weight.exp_avg", b}};
}

// Runs `f` on every rank and returns this rank's error message ("" if none), after the ranks
// agreed: every rank must see the same verdict.
std::string agreed_error(const std::function<void()>& f) {
    std::exception_ptr failure;
    try {
        f();
    } catch (...) {
        failure = std::current_exception();
    }
    try {
        agree_on_success(control(), failure);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(Checkpoint, SaveThenReadRestoresEveryRanksTensorsAndInfo) {
    const fs::path dir = epo::testing::shared_temp_dir("roundtrip");
    const fs::path saved = save_checkpoint(dir, info(7), rank_tensors(7), control());
    EXPECT_EQ(saved, dir / "iter_0000007");
    const RankCheckpoint got = read_rank_checkpoint(saved, comm::current_world_rank(), layout());
    EXPECT_EQ(got.info.iteration, 7);
    EXPECT_EQ(got.info.consumed_samples, 112);
    EXPECT_EQ(got.info.seed, 1234u);
    EXPECT_EQ(got.info.layout, layout());
    EXPECT_EQ(got.info.config_yaml, "recipe: tiny-moe\n");
    for (const io::NamedTensor& t : rank_tensors(7)) {
        const Tensor& back = got.file.at(t.name);
        ASSERT_EQ(back.shape(), t.tensor.shape());
        EXPECT_EQ(0, std::memcmp(back.raw(), t.tensor.raw(), t.tensor.nbytes())) << t.name;
    }
    EXPECT_FALSE(fs::exists(dir / "iter_0000007.tmp"));
    std::ifstream tracker(dir / "latest_checkpointed_iteration.txt");
    int64_t last = 0;
    tracker >> last;
    EXPECT_EQ(last, 7);
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Checkpoint, InterruptedSaveLeavesThePreviousOneTheLatestAndLoadable) {
    const fs::path dir = epo::testing::shared_temp_dir("interrupted");
    save_checkpoint(dir, info(2), rank_tensors(2), control());
    save_checkpoint(dir, info(4), rank_tensors(4), control());
    if (comm::current_world_rank() == 0) {
        // A crash during the save of iteration 6: its temporary directory with a partial file
        // and no metadata; and a directory of a later iteration copied without its metadata.
        fs::create_directories(dir / "iter_0000006.tmp");
        std::ofstream(dir / "iter_0000006.tmp" / "rank_00000.safetensors") << "partial";
        fs::create_directories(dir / "iter_0000008");
        fs::copy_file(dir / "iter_0000004" / "rank_00000.safetensors",
                      dir / "iter_0000008" / "rank_00000.safetensors");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const std::optional<fs::path> latest = find_latest_checkpoint(dir);
    ASSERT_TRUE(latest.has_value());
    EXPECT_EQ(*latest, dir / "iter_0000004");
    const RankCheckpoint got = read_rank_checkpoint(*latest, comm::current_world_rank(), layout());
    EXPECT_EQ(got.info.iteration, 4);
    EXPECT_EQ(got.file.at("weight").data<float>()[0], comm::current_world_rank() * 1000 + 4.0f);
    // A new save of iteration 6 discards the debris and completes.
    save_checkpoint(dir, info(6), rank_tensors(6), control());
    EXPECT_EQ(find_latest_checkpoint(dir), dir / "iter_0000006");
    EXPECT_EQ(find_latest_checkpoint(dir / "iter_0000002"), dir / "iter_0000002");
    EXPECT_FALSE(find_latest_checkpoint(dir / "nothing_here").has_value());
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Checkpoint, CorruptFileOnOneRankIsRefusedOnEveryRankNamingFileAndRank) {
    const fs::path dir = epo::testing::shared_temp_dir("corrupt");
    const fs::path saved = save_checkpoint(dir, info(3), rank_tensors(3), control());
    const int last = comm::current_world_size() - 1;
    if (comm::current_world_rank() == 0)
        epo::testing::flip_byte(saved / rank_file_name(last));
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string error =
        agreed_error([&] { read_rank_checkpoint(saved, comm::current_world_rank(), layout()); });
    EXPECT_NE(error.find(fmt::format("rank {} of", last)), std::string::npos) << error;
    EXPECT_NE(error.find(rank_file_name(last) + "' is corrupt: its SHA-256 is"), std::string::npos)
        << error;
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Checkpoint, TruncatedFileIsRefusedNamingTheSizes) {
    const fs::path dir = epo::testing::shared_temp_dir("truncated");
    const fs::path saved = save_checkpoint(dir, info(3), rank_tensors(3), control());
    const fs::path victim = saved / rank_file_name(0);
    const auto size = fs::file_size(victim);
    MPI_Barrier(MPI_COMM_WORLD);
    if (comm::current_world_rank() == 0)
        fs::resize_file(victim, size - 10);
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string error =
        agreed_error([&] { read_rank_checkpoint(saved, comm::current_world_rank(), layout()); });
    EXPECT_NE(error.find(fmt::format("has {} bytes, {} when it was saved", size - 10, size)),
              std::string::npos)
        << error;
    MPI_Barrier(MPI_COMM_WORLD);
}

// Two ranks' files swapped by hand (as after a copy that mixed up stage files) are named as
// such, not as truncated: each file is whole, under the other rank's name.
TEST(Checkpoint, SwappedRankFilesAreNamedAsSwapped) {
    if (comm::current_world_size() < 2)
        GTEST_SKIP() << "needs two ranks";
    const fs::path dir = epo::testing::shared_temp_dir("swapped");
    const fs::path saved = save_checkpoint(dir, info(3), rank_tensors(3), control());
    const int last = comm::current_world_size() - 1;
    MPI_Barrier(MPI_COMM_WORLD);
    if (comm::current_world_rank() == 0) {
        fs::rename(saved / rank_file_name(0), saved / "swap");
        fs::rename(saved / rank_file_name(last), saved / rank_file_name(0));
        fs::rename(saved / "swap", saved / rank_file_name(last));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string error =
        agreed_error([&] { read_rank_checkpoint(saved, comm::current_world_rank(), layout()); });
    EXPECT_NE(error.find(fmt::format("holds rank {}'s state (its size and SHA-256 are those saved "
                                     "for '{}'): the rank files were swapped or renamed",
                                     last, rank_file_name(last))),
              std::string::npos)
        << error;
    EXPECT_EQ(error.find("truncated"), std::string::npos) << error;
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Checkpoint, FilesOfAnotherCheckpointAreRefused) {
    const fs::path dir = epo::testing::shared_temp_dir("mixed");
    save_checkpoint(dir, info(1), rank_tensors(1), control());
    save_checkpoint(dir, info(2), rank_tensors(2), control());
    if (comm::current_world_rank() == 0) {
        // Iteration 1's file and metadata entry moved into iteration 2 (checksums then agree).
        fs::copy_file(dir / "iter_0000001" / rank_file_name(0), dir / "iter_0000002" / "r0",
                      fs::copy_options::overwrite_existing);
        fs::rename(dir / "iter_0000002" / "r0", dir / "iter_0000002" / rank_file_name(0));
        std::ifstream in1(dir / "iter_0000001" / "metadata.json");
        std::string m1((std::istreambuf_iterator<char>(in1)), {});
        std::ifstream in2(dir / "iter_0000002" / "metadata.json");
        std::string m2((std::istreambuf_iterator<char>(in2)), {});
        const auto entry = [](const std::string& m) {
            const auto at = m.find("\"bytes\"");
            return m.substr(at, m.find('}', at) - at);
        };
        const std::string e1 = entry(m1), e2 = entry(m2);
        m2.replace(m2.find(e2), e2.size(), e1);
        std::ofstream(dir / "iter_0000002" / "metadata.json") << m2;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string error = agreed_error(
        [&] { read_rank_checkpoint(dir / "iter_0000002", comm::current_world_rank(), layout()); });
    EXPECT_NE(error.find("belongs to rank 0 at iteration 1, not to rank 0 at iteration 2"),
              std::string::npos)
        << error;
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Checkpoint, AnotherLayoutIsRefusedNamingTheDifference) {
    const fs::path dir = epo::testing::shared_temp_dir("layout");
    const fs::path saved = save_checkpoint(dir, info(5), rank_tensors(5), control());
    WorldLayout other = layout();
    other.expert_model_parallel_size = 1;
    try {
        read_rank_checkpoint(saved, comm::current_world_rank(), other);
        ADD_FAILURE() << "a checkpoint of another layout was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kConfig);
        EXPECT_NE(std::string(e.what()).find(fmt::format(
                      "model.expert_model_parallel_size {} in the checkpoint, 1 in this job",
                      comm::current_world_size())),
                  std::string::npos)
            << e.what();
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

// The tensor-parallel sizes are part of the layout: a rank's file holds its shard of the dense
// weights (TP) and of the experts (ETP). Both sizes are named, with both values.
TEST(Checkpoint, AnotherTensorParallelLayoutIsRefusedNamingBothSizes) {
    const fs::path dir = epo::testing::shared_temp_dir("tp-layout");
    CheckpointInfo saved_info = info(5);
    saved_info.layout.tensor_model_parallel_size = 2;
    saved_info.layout.expert_tensor_parallel_size = 2;
    const fs::path saved = save_checkpoint(dir, saved_info, rank_tensors(5), control());
    // Written as saved, read back as saved.
    EXPECT_EQ(
        read_rank_checkpoint(saved, comm::current_world_rank(), saved_info.layout).info.layout,
        saved_info.layout);
    WorldLayout other = saved_info.layout;
    other.tensor_model_parallel_size = 1;
    other.expert_tensor_parallel_size = 1;
    const std::string error =
        agreed_error([&] { read_rank_checkpoint(saved, comm::current_world_rank(), other); });
    EXPECT_NE(error.find("model.tensor_model_parallel_size 2 in the checkpoint, 1 in this job; "
                         "model.expert_tensor_parallel_size 2 in the checkpoint, 1 in this job"),
              std::string::npos)
        << error;
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Checkpoint, AgreementThrowsTheLowestFailingRanksErrorEverywhere) {
    const int n = comm::current_world_size();
    const std::string error = agreed_error([&] {
        if (comm::current_world_rank() == n - 1)
            throw Error(ErrorKind::kIo, "disk full");
    });
    EXPECT_EQ(error, fmt::format("rank {} of {}: disk full", n - 1, n));
    EXPECT_EQ(agreed_error([] {}), "");
}

}  // namespace
}  // namespace epo::checkpoint
