// A failing rank ends the whole job, with its rank and message, well within the deadline, and no
// rank is left running: runs runtime_mpi_test's FaultInjection.Job under mpirun as a child
// process and watches it from outside.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "epo/comm/launch.h"

namespace epo::runtime {
namespace {

namespace fs = std::filesystem;

struct FaultRun {
    comm::LaunchResult result;
    std::vector<pid_t> pids;
};

FaultRun run_fault(const std::string& fault, int num_ranks, double comm_timeout_s) {
    const fs::path dir =
        fs::temp_directory_path() / ("epo_fault_" + std::to_string(getpid()) + "_" + fault);
    fs::remove_all(dir);
    fs::create_directories(dir);
    comm::LaunchOptions options;
    options.num_ranks = num_ranks;
    options.omp_threads = 1;
    options.command = {
        (fs::read_symlink("/proc/self/exe").parent_path() / "runtime_mpi_test").string(),
        "--gtest_filter=FaultInjection.*"};
    options.env = {{"EPO_TEST_FAULT", fault},
                   {"EPO_TEST_PID_DIR", dir.string()},
                   {"EPO_TEST_TIMEOUT_S", std::to_string(comm_timeout_s)}};
    FaultRun run;
    run.result = comm::run_launch(comm::make_launch_command(options), 240);
    for (const auto& entry : fs::directory_iterator(dir)) {
        pid_t pid = 0;
        std::ifstream(entry.path()) >> pid;
        if (pid > 0)
            run.pids.push_back(pid);
    }
    fs::remove_all(dir);
    return run;
}

// A process is gone when it no longer exists or is a zombie (its exit is only not yet reaped).
bool alive(pid_t pid) {
    if (kill(pid, 0) != 0)
        return false;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const auto close = line.rfind(')');
    return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

void expect_no_rank_left(const FaultRun& run, int num_ranks) {
    EXPECT_EQ(static_cast<int>(run.pids.size()), num_ranks) << "ranks that wrote their pid";
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (pid_t pid : run.pids) {
        while (alive(pid) && std::chrono::steady_clock::now() < end) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        EXPECT_FALSE(alive(pid)) << "rank process " << pid << " still running";
    }
}

TEST(JobAbort, RankThrowingMidCollectiveEndsTheJobWithItsRankAndMessage) {
    // The peers are blocked in the all-to-all the failing rank never enters; the job must end
    // through the failing rank's abort, long before the 60 s comm deadline would.
    const FaultRun run = run_fault("throw", 3, 60);
    const auto& r = run.result;
    EXPECT_FALSE(r.timed_out);
    EXPECT_NE(r.exit_status, 0);
    EXPECT_NE(r.stderr_text.find("epo: rank 2 of 3 failed: numerical error: injected failure in "
                                 "dispatch on rank 2"),
              std::string::npos)
        << r.stderr_text;
    EXPECT_LT(r.elapsed_s, 45) << "the job ended by timeout, not by the failing rank";
    EXPECT_EQ(r.stderr_text.find("timed out"), std::string::npos) << r.stderr_text;
    expect_no_rank_left(run, 3);
}

TEST(JobAbort, RankFailingOnTheMainThreadEndsTheJob) {
    const FaultRun run = run_fault("throw_main", 2, 60);
    EXPECT_NE(run.result.exit_status, 0);
    EXPECT_NE(run.result.stderr_text.find(
                  "epo: rank 1 of 2 failed: internal error: injected failure on the main thread"),
              std::string::npos)
        << run.result.stderr_text;
    EXPECT_LT(run.result.elapsed_s, 45);
    expect_no_rank_left(run, 2);
}

TEST(JobAbort, RankThatNeverArrivesTripsTheDeadlineNamingOpGroupAndPeer) {
    const FaultRun run = run_fault("never_arrives", 3, 2);
    const auto& r = run.result;
    EXPECT_FALSE(r.timed_out);
    EXPECT_NE(r.exit_status, 0);
    // One of the waiting ranks (0 or 1) reports first; both would name the same op and peer.
    EXPECT_NE(r.stderr_text.find("all_to_all #2 on group ep (stream comm) (world ranks 0, 1, 2) "
                                 "timed out after 2 s (comm.timeout_s) waiting for world rank(s) "
                                 "2 to arrive"),
              std::string::npos)
        << r.stderr_text;
    EXPECT_LT(r.elapsed_s, 40);
    expect_no_rank_left(run, 3);
}

TEST(JobAbort, PlainWorldCallThatAPeerNeverEntersEndsTheJobAtTheDeadline) {
    // The start-up agreements and end-of-run gathers are plain MPI calls (no Communicator);
    // comm::watched_world_call bounds them with the same comm.timeout_s.
    const FaultRun run = run_fault("late_world_call", 2, 2);
    const auto& r = run.result;
    EXPECT_FALSE(r.timed_out);
    EXPECT_NE(r.exit_status, 0);
    EXPECT_NE(r.stderr_text.find("epo: rank 0 of 2 failed: agreeing on the test's barrier: the "
                                 "other ranks did not all arrive within comm.timeout_s = 2 s"),
              std::string::npos)
        << r.stderr_text;
    EXPECT_LT(r.elapsed_s, 40);
    expect_no_rank_left(run, 2);
}

}  // namespace
}  // namespace epo::runtime
