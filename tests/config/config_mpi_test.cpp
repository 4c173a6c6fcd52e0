// Multi-rank agreement: every rank of an MPI job builds, finalizes and validates the same
// configuration (the shipped CPU example sized to the job) and all ranks must agree on the
// verdict and on the finalized tree byte for byte, as a run requires before any rank does work.
// Also runs the start-up checks the runtime will run (MPI thread level, world size).
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "epo/config/builder.h"
#include "epo/config/validate.h"
#include "epo/config/yaml_io.h"

namespace epo::config {
namespace {

int world_rank() {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

int world_ranks() {
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return size;
}

// Rank 0's string, on every rank.
std::string broadcast_from_root(std::string text) {
    unsigned long long length = text.size();
    MPI_Bcast(&length, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    text.resize(length);
    MPI_Bcast(text.data(), static_cast<int>(length), MPI_CHAR, 0, MPI_COMM_WORLD);
    return text;
}

ValidationReport validate_example(int ranks) {
    ConfigSources sources;
    sources.config_path = std::string(EPO_SOURCE_DIR) + "/examples/tiny-moe-cpu.yaml";
    sources.harness.gpus_per_node = ranks;
    sources.harness.expert_model_parallel_size = ranks;
    sources.harness.global_batch_size = 4 * ranks;
    return validate_for_run(build_config(sources));
}

TEST(ConfigMpi, EveryRankFinalizesTheSameConfigAndAgrees) {
    const int ranks = world_ranks();
    const ValidationReport report = validate_example(ranks);
    const std::string mine = format_run_log(report) + format_findings(report);

    const std::string root = broadcast_from_root(mine);
    EXPECT_EQ(mine, root) << "rank " << world_rank() << " finalized a different configuration";

    const int ok = report.ok() ? 1 : 0;
    int all_ok = 0;
    int any_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&ok, &any_ok, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(all_ok, any_ok) << "ranks disagree on the verdict";

    // EP overlap over EP = ranks and 8 experts: valid exactly when there is more than one rank
    // (EP001) and the rank count divides the experts (LY001).
    EXPECT_EQ(report.ok(), ranks > 1 && 8 % ranks == 0) << format_findings(report);
    if (report.ok()) {
        EXPECT_TRUE(report.config.model.overlap_moe_expert_parallel_comm);
        EXPECT_EQ(report.config.model.expert_model_parallel_size, ranks);
        // The finalized tree a run writes to its directory loads back identical on every rank.
        EXPECT_EQ(config_from_yaml(to_yaml(report.config), {"rank"}), report.config);
    }
}

TEST(ConfigMpi, StartupChecksPassOnThisJob) {
    int provided = 0;
    MPI_Query_thread(&provided);
    const auto thread_level = check_mpi_thread_level(provided);
    EXPECT_FALSE(thread_level.has_value()) << thread_level->message;
    const ValidationReport report = validate_example(world_ranks());
    EXPECT_FALSE(check_world_size(report.config, world_ranks()).has_value());
    const auto mismatch = check_world_size(report.config, world_ranks() + 1);
    ASSERT_TRUE(mismatch.has_value());
    EXPECT_EQ(mismatch->id, "LY009");
}

}  // namespace
}  // namespace epo::config
