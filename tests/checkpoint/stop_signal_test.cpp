#include "epo/checkpoint/stop_signal.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "epo/comm/rank_runner.h"

namespace epo::checkpoint {
namespace {

TEST(StopSignals, FirstSignalIsAPendingRequest) {
    StopSignals signals(3, 4);
    EXPECT_EQ(signals.pending(), 0);
    ASSERT_EQ(std::raise(SIGINT), 0);
    EXPECT_EQ(signals.pending(), SIGINT);
}

TEST(StopSignals, PreviousHandlersComeBackAfterwards) {
    { StopSignals signals(0, 1); }
    struct sigaction now {};
    sigaction(SIGTERM, nullptr, &now);
    EXPECT_EQ(now.sa_handler, SIG_DFL);
    // And a new one starts with nothing pending.
    StopSignals again(0, 1);
    EXPECT_EQ(again.pending(), 0);
}

TEST(StopSignalsDeathTest, SecondSignalExitsAtOnce) {
    EXPECT_EXIT(
        {
            StopSignals signals(1, 2);
            std::raise(SIGTERM);
            std::raise(SIGTERM);
            std::_Exit(0);  // not reached
        },
        ::testing::ExitedWithCode(128 + SIGTERM),
        "rank 1 of 2 received SIGTERM: stopping after the current step(.|\n)*rank 1 of 2 "
        "received a second SIGTERM: exiting at once without saving");
}

namespace fs = std::filesystem;

void write_marker(const fs::path& path, const std::string& text,
                  std::chrono::seconds age = std::chrono::seconds(0)) {
    std::ofstream(path) << text;
    fs::last_write_time(path, fs::file_time_type::clock::now() - age);
}

// Exports a job id no other test or job uses, as a launcher would, and returns its marker.
// Called in the test (the death test's child is a fork of it, so both see the same id).
std::string unique_marker_under_slurm_id(const char* test) {
    const std::string id = std::string("epo-") + test + "-" + std::to_string(::getpid());
    ::setenv("SLURM_JOB_ID", id.c_str(), 1);
    ::unsetenv("SLURM_STEP_ID");
    ::unsetenv("PMIX_NAMESPACE");
    ::unsetenv("OMPI_MCA_ess_base_jobid");
    return comm::job_failure_marker_path();
}

TEST(StopSignalsDeathTest, PeerFailureMarkerOfThisJobExplainsTheSignal) {
    const std::string marker = unique_marker_under_slurm_id("fresh-marker");
    EXPECT_EXIT(
        {
            StopSignals signals(0, 2);
            write_marker(marker, "1\n");
            std::raise(SIGTERM);
            std::_Exit(0);  // not reached
        },
        ::testing::ExitedWithCode(128 + SIGTERM),
        "rank 0 of 2 received SIGTERM: the job is ending because rank 1 failed");
    fs::remove(marker);
    ::unsetenv("SLURM_JOB_ID");
}

TEST(StopSignalsDeathTest, TeardownNamesTheFirstFailureAndItsMessage) {
    const std::string marker = unique_marker_under_slurm_id("first-failure");
    // Rank 3 stopped answering; rank 0's watchdog failed first and named it. Ranks 1 and 2 time
    // out moments later: their claims must not replace rank 0's.
    ASSERT_TRUE(comm::claim_job_failure_marker(
        marker, 0, "watchdog: all_to_all #110 on group ep: rank(s) 3 had not arrived\nmore"));
    EXPECT_FALSE(comm::claim_job_failure_marker(marker, 1, "watchdog: all_reduce #90 ..."));
    EXPECT_FALSE(comm::claim_job_failure_marker(marker, 2, "watchdog: ..."));
    EXPECT_EXIT(
        {
            StopSignals signals(2, 4);
            std::raise(SIGTERM);
            std::_Exit(0);  // not reached
        },
        ::testing::ExitedWithCode(128 + SIGTERM),
        "rank 2 of 4 received SIGTERM: the job is ending because rank 0 failed first \\(watchdog: "
        "all_to_all #110 on group ep: rank\\(s\\) 3 had not arrived\\); exiting without saving");
    // The rank that failed first said why already: its own teardown adds no line blaming itself.
    EXPECT_EXIT(
        {
            StopSignals signals(0, 4);
            std::raise(SIGTERM);
            std::_Exit(0);  // not reached
        },
        ::testing::ExitedWithCode(128 + SIGTERM), "^$");
    fs::remove(marker);
    ::unsetenv("SLURM_JOB_ID");
}

TEST(JobFailureMarkers, AnotherJobsMarkerIsReplacedByTheFirstFailure) {
    const std::string marker = unique_marker_under_slurm_id("reused-id");
    write_marker(marker, "5\nan old job's failure\n", std::chrono::seconds(600));
    EXPECT_TRUE(comm::claim_job_failure_marker(marker, 1, "this job's failure"));
    std::ifstream in(marker);
    std::string rank, what;
    std::getline(in, rank);
    std::getline(in, what);
    EXPECT_EQ(rank, "1");
    EXPECT_EQ(what, "this job's failure");
    fs::remove(marker);
    ::unsetenv("SLURM_JOB_ID");
}

TEST(StopSignalsDeathTest, MarkerOlderThanTheJobIsAnotherJobs) {
    // A launcher that reuses a job id must not make this job claim a peer failed.
    const std::string marker = unique_marker_under_slurm_id("stale-marker");
    write_marker(marker, "1\n", std::chrono::seconds(600));
    EXPECT_EXIT(
        {
            StopSignals signals(0, 2);
            std::raise(SIGTERM);
            std::_Exit(signals.pending() == SIGTERM ? 7 : 8);
        },
        ::testing::ExitedWithCode(7), "stopping after the current step");
    fs::remove(marker);
    ::unsetenv("SLURM_JOB_ID");
}

TEST(JobFailureMarkers, MarkersOlderThanTheLimitAreRemovedOthersKept) {
    const fs::path dir = fs::temp_directory_path() / ("epo_markers_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    write_marker(dir / "epo-job-old.failed", "1\n", std::chrono::hours(25));
    write_marker(dir / "epo-job-new.failed", "1\n", std::chrono::hours(1));
    write_marker(dir / "unrelated.failed", "1\n", std::chrono::hours(48));
    EXPECT_EQ(comm::remove_stale_job_failure_markers(std::chrono::hours(24), dir.string()), 1);
    EXPECT_FALSE(fs::exists(dir / "epo-job-old.failed"));
    EXPECT_TRUE(fs::exists(dir / "epo-job-new.failed"));
    EXPECT_TRUE(fs::exists(dir / "unrelated.failed"));
    // A directory that cannot be read removes nothing and does not throw.
    EXPECT_EQ(
        comm::remove_stale_job_failure_markers(std::chrono::hours(24), (dir / "missing").string()),
        0);
    fs::remove_all(dir);
}

}  // namespace
}  // namespace epo::checkpoint
