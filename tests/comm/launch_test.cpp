// The launch command line for Open MPI and MPICH: root and oversubscription flags only where the
// launcher needs them, one OMP_NUM_THREADS per rank, extra environment, clear errors.
#include "epo/comm/launch.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "epo/comm/rank_runner.h"
#include "epo/core/error.h"

namespace epo::comm {
namespace {

using Argv = std::vector<std::string>;

LaunchOptions options_for(int n, int omp = 0) {
    LaunchOptions o;
    o.num_ranks = n;
    o.command = {"epo", "train", "--steps", "2"};
    o.omp_threads = omp;
    o.mpiexec = "mpirun";
    return o;
}

TEST(Launch, OpenMpiAsRootGetsItsFlags) {
    EXPECT_EQ(make_launch_command(options_for(4, 1), MpiFlavor::kOpenMpi, true, 2),
              (Argv{"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", "-x",
                    "OMP_NUM_THREADS=1", "epo", "train", "--steps", "2"}));
    EXPECT_EQ(make_launch_command(options_for(2, 3), MpiFlavor::kOpenMpi, false, 2),
              (Argv{"mpirun", "--oversubscribe", "-np", "2", "-x", "OMP_NUM_THREADS=3", "epo",
                    "train", "--steps", "2"}));
}

TEST(Launch, MpichNeedsNoFlagsAndUsesGenv) {
    auto o = options_for(3, 2);
    o.env = {{"EPO_X", "1"}};
    o.mpiexec_args = {"-bind-to", "core"};
    EXPECT_EQ(make_launch_command(o, MpiFlavor::kMpich, true, 2),
              (Argv{"mpirun", "-np", "3", "-bind-to", "core", "-genv", "EPO_X", "1", "-genv",
                    "OMP_NUM_THREADS", "2", "epo", "train", "--steps", "2"}));
}

TEST(Launch, OmpThreadsDefaultToCoresPerRank) {
    // Runs under ctest with OMP_NUM_THREADS set; clear it to see the automatic choice.
    const char* saved = std::getenv("OMP_NUM_THREADS");
    const std::string keep = saved ? saved : "";
    unsetenv("OMP_NUM_THREADS");
    auto omp_of = [](const Argv& argv) {
        for (size_t i = 0; i + 1 < argv.size(); ++i) {
            if (argv[i] == "-x" && argv[i + 1].rfind("OMP_NUM_THREADS=", 0) == 0) {
                return argv[i + 1].substr(16);
            }
        }
        return std::string("missing");
    };
    EXPECT_EQ(omp_of(make_launch_command(options_for(2), MpiFlavor::kOpenMpi, true, 8)), "4");
    EXPECT_EQ(omp_of(make_launch_command(options_for(4), MpiFlavor::kOpenMpi, true, 2)), "1");
    setenv("OMP_NUM_THREADS", "5", 1);
    EXPECT_EQ(omp_of(make_launch_command(options_for(4), MpiFlavor::kOpenMpi, true, 2)), "5");
    if (saved) {
        setenv("OMP_NUM_THREADS", keep.c_str(), 1);
    } else {
        unsetenv("OMP_NUM_THREADS");
    }
}

// Ranks started by a plain mpirun: a warning when their OpenMP threads outnumber the host's CPUs
// (each rank starts OMP_NUM_THREADS threads, or one per CPU it may use), none when they fit.
TEST(Launch, OmpOversubscriptionIsNamedWithItsFix) {
    // Two unbound ranks of two threads each on two cores (measured 3.8x slower steps).
    const std::string w = omp_oversubscription_warning(2, nullptr, 2, 2);
    EXPECT_NE(w.find("2 rank(s) on this host each start 2 OpenMP thread(s)"), std::string::npos)
        << w;
    EXPECT_NE(w.find("OMP_NUM_THREADS unset"), std::string::npos) << w;
    EXPECT_NE(w.find("4 threads on 2 CPUs"), std::string::npos) << w;
    EXPECT_NE(w.find("set OMP_NUM_THREADS=1 for every rank"), std::string::npos) << w;
    EXPECT_NE(omp_oversubscription_warning(8, "16", 64, 64).find("OMP_NUM_THREADS=16"),
              std::string::npos);
    EXPECT_NE(omp_oversubscription_warning(8, "16,2", 64, 64), "");  // nested: the first count
    // Fitting: bound ranks (one allowed CPU each), an explicit count, one rank per host.
    EXPECT_EQ(omp_oversubscription_warning(2, nullptr, 1, 2), "");
    EXPECT_EQ(omp_oversubscription_warning(8, "8", 64, 64), "");
    EXPECT_EQ(omp_oversubscription_warning(1, nullptr, 64, 64), "");
    // More ranks than CPUs, one thread each: the job's own oversubscription, not OpenMP's.
    EXPECT_EQ(omp_oversubscription_warning(4, "1", 1, 2), "");
    EXPECT_EQ(omp_oversubscription_warning(4, nullptr, 1, 2), "");
    EXPECT_NE(omp_oversubscription_warning(4, nullptr, 2, 2), "");  // unbound: 2 threads each
    // Unknown: uneven hosts, an OMP_NUM_THREADS OpenMP would not read as a count.
    EXPECT_EQ(omp_oversubscription_warning(0, nullptr, 2, 2), "");
    EXPECT_EQ(omp_oversubscription_warning(2, "lots", 2, 2), "");
    EXPECT_EQ(omp_oversubscription_warning(2, "-3", 2, 2), "");
}

TEST(Launch, BadOptionsAreUsageErrors) {
    try {
        make_launch_command(options_for(0), MpiFlavor::kOpenMpi, true, 2);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kUsage);
        EXPECT_NE(std::string(e.what()).find("number of ranks 0"), std::string::npos);
    }
    LaunchOptions empty = options_for(2);
    empty.command.clear();
    EXPECT_THROW(make_launch_command(empty, MpiFlavor::kMpich, true, 2), Error);
}

TEST(Launch, RunLaunchCapturesOutputStatusAndTimeout) {
    const auto ok = run_launch({"sh", "-c", "echo out; echo err >&2; exit 3"}, 30);
    EXPECT_EQ(ok.exit_status, 3);
    EXPECT_FALSE(ok.timed_out);
    EXPECT_EQ(ok.stdout_text, "out\n");
    EXPECT_EQ(ok.stderr_text, "err\n");
    const auto slow = run_launch({"sh", "-c", "sleep 60"}, 0.3);
    EXPECT_TRUE(slow.timed_out);
    EXPECT_LT(slow.elapsed_s, 30);
    const auto missing = run_launch({"/nonexistent/launcher"}, 30);
    EXPECT_EQ(missing.exit_status, 127);
    EXPECT_NE(missing.stderr_text.find("cannot run /nonexistent/launcher"), std::string::npos);
}

// Open MPI starts each local rank in a process group of its own: a timeout must end those too,
// or a test job past its bound trains on (and fills the disk with checkpoints).
TEST(Launch, RunLaunchTimeoutEndsWhatTheLauncherStartedInOtherProcessGroups) {
    // `set -m`: bash puts each background job in a group of its own, as mpirun does.
    // Each line: the child's pid and its process group (field 5 of /proc/PID/stat).
    const auto r = run_launch({"bash", "-c",
                               "set -m; for i in 1 2; do sleep 300 & "
                               "echo $! $(cut -d' ' -f5 /proc/$!/stat); done; wait"},
                              1.0);
    ASSERT_TRUE(r.timed_out);
    std::istringstream pids(r.stdout_text);
    int count = 0;
    for (pid_t p, group; pids >> p >> group; ++count) {
        ASSERT_GT(p, 1);
        EXPECT_EQ(group, p) << "the child should lead a group of its own";
        // Gone, or at most a zombie waiting for init to reap it.
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        bool gone = false;
        while (!gone && std::chrono::steady_clock::now() < end) {
            std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
            std::string line;
            gone = !std::getline(stat, line) || line.find(") Z ") != std::string::npos;
            if (!gone)
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        EXPECT_TRUE(gone) << "pid " << p << " outlived its launcher's timeout";
        if (!gone)
            kill(p, SIGKILL);
    }
    EXPECT_EQ(count, 2) << r.stdout_text;
}

// Open MPI's teardown lines (source locations of its own code) are dropped from what a user
// sees; a rank's message, and Open MPI's explanation of an abort, pass.
TEST(Launch, LauncherNoiseIsFilteredRanksLinesPass) {
    EXPECT_TRUE(is_launcher_noise(
        "[host:01234] [[4242,0],0] ORTE_ERROR_LOG: Data unpack would read past end of buffer in "
        "file util/show_help.c at line 507"));
    EXPECT_TRUE(is_launcher_noise(
        "[host:01234] [[4242,0],0] Error: pmix in file base/ptl_base.c at line 123"));
    EXPECT_FALSE(is_launcher_noise("epo: rank 1 of 2 failed: communication error: ..."));
    EXPECT_FALSE(
        is_launcher_noise("MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD"));
    EXPECT_FALSE(is_launcher_noise("[bench] 2 ranks (2 nodes x 1), run directory runs/x"));
}

// epo launch runs the launcher as a child: its exit status comes back, its stderr is filtered.
TEST(Launch, ForwardingRunReturnsTheStatusAndFiltersStderr) {
    EXPECT_EQ(run_launch_forwarding({"sh", "-c", "exit 3"}), 3);
    EXPECT_EQ(run_launch_forwarding({"sh", "-c", "kill -TERM $$"}), 128 + SIGTERM);
    EXPECT_EQ(run_launch_forwarding({"/nonexistent/launcher"}), 127);
}

}  // namespace
TEST(Launch, RankHostsFillEachHostsSlotsInOrder) {
    EXPECT_EQ(rank_hosts("a:2,b:2", 4), (std::vector<std::string>{"a", "a", "b", "b"}));
    EXPECT_EQ(rank_hosts("10.0.0.1,10.0.0.2", 2),
              (std::vector<std::string>{"10.0.0.1", "10.0.0.2"}));
    EXPECT_EQ(rank_hosts("a:3,b:3", 4), (std::vector<std::string>{"a", "a", "a", "b"}));
    EXPECT_TRUE(rank_hosts("a:1,b:1", 3).empty()) << "oversubscribed: placement unknown";
    EXPECT_TRUE(rank_hosts("", 2).empty());
    EXPECT_TRUE(rank_hosts("a:x", 1).empty());
}

TEST(Launch, SilentFailureNamesTheLostHostAndItsRanks) {
    const std::string m = silent_failure_message(9, {"h1"}, {"h0", "h0", "h1", "h1"});
    EXPECT_NE(m.find("status 9 without any rank reporting a failure"), std::string::npos) << m;
    EXPECT_NE(m.find("lost their connection to host h1 (rank 2, 3)"), std::string::npos) << m;
    const std::string unknown = silent_failure_message(9, {}, {"h0", "h0", "h1"});
    EXPECT_NE(unknown.find("may name the host (ranks by host: h0: rank 0, 1; h1: rank 2)"),
              std::string::npos)
        << unknown;
}

TEST(Launch, ForwardingSaysSoWhenTheJobEndsWithoutARanksMessage) {
    // A launcher that reports a lost peer the way Open MPI does, then fails with no rank message.
    testing::internal::CaptureStderr();
    const int status = run_launch_forwarding({"sh", "-c", "echo '  Peer host:  h1' >&2; exit 9"},
                                             30, {"h0", "h1"});
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(status, 9);
    EXPECT_NE(err.find("lost their connection to host h1 (rank 1)"), std::string::npos) << err;
    testing::internal::CaptureStderr();
    run_launch_forwarding({"sh", "-c",
                           "echo '  HNP daemon   : [[1,0],0] on node vm' >&2; echo '  Remote "
                           "daemon: [[1,0],1] on node h1' >&2; exit 205"},
                          30, {"h0", "h1"});
    const std::string daemon = testing::internal::GetCapturedStderr();
    EXPECT_NE(daemon.find("lost their connection to host h1 (rank 1)"), std::string::npos)
        << daemon;
    // A rank that said why: nothing added.
    testing::internal::CaptureStderr();
    run_launch_forwarding({"sh", "-c", "echo 'epo: rank 1 of 2 failed: x' >&2; exit 1"}, 30, {});
    EXPECT_EQ(testing::internal::GetCapturedStderr().find("epo launch:"), std::string::npos);
}

}  // namespace epo::comm

namespace epo::comm {
namespace {

// The watcher a failing rank leaves over its launcher (rank_runner.h): it ends a launcher that
// outlives the grace, and goes away at once, signalling nothing, when the launcher ends by itself.
pid_t spawn_sleeper(const char* seconds) {
    const pid_t pid = fork();
    if (pid == 0) {
        execlp("sleep", "sleep", seconds, static_cast<char*>(nullptr));
        _exit(127);
    }
    return pid;
}

TEST(LauncherWatch, EndsALauncherThatOutlivesTheGrace) {
    const pid_t launcher = spawn_sleeper("60");
    ASSERT_GT(launcher, 0);
    const auto t0 = std::chrono::steady_clock::now();
    const int watcher =
        start_launcher_watch(launcher, std::chrono::milliseconds(500), "epo: test watcher");
    ASSERT_GT(watcher, 0);
    int status = 0;
    ASSERT_EQ(waitpid(launcher, &status, 0), launcher);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
    EXPECT_GE(took, 0.4);
    EXPECT_LT(took, 5.0);
    waitpid(watcher, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// A "rank" (a forked child) starts a guardian over `launcher`, then either finishes (releases it)
// or ends abruptly (_exit without release, as Open MPI's own abort path or a signal would).
pid_t spawn_guarded_rank(pid_t launcher, bool finish) {
    const pid_t pid = fork();
    if (pid == 0) {
        if (start_rank_guardian(launcher, std::chrono::milliseconds(500), "epo: test guardian") < 0)
            _exit(3);
        if (finish)
            release_rank_guardian();
        _exit(0);
    }
    return pid;
}

TEST(RankGuardian, EndsTheLauncherOfARankThatEndedWithoutFinishing) {
    const pid_t launcher = spawn_sleeper("60");
    ASSERT_GT(launcher, 0);
    const auto t0 = std::chrono::steady_clock::now();
    const pid_t rank = spawn_guarded_rank(launcher, false);
    int status = 0;
    ASSERT_EQ(waitpid(rank, &status, 0), rank);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "no guardian started";
    ASSERT_EQ(waitpid(launcher, &status, 0), launcher);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
    EXPECT_GE(took, 0.4);
    EXPECT_LT(took, 5.0);
}

TEST(RankGuardian, LeavesTheLauncherOfARankThatFinished) {
    const pid_t launcher = spawn_sleeper("2");
    ASSERT_GT(launcher, 0);
    const pid_t rank = spawn_guarded_rank(launcher, true);
    int status = 0;
    ASSERT_EQ(waitpid(rank, &status, 0), rank);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "no guardian started";
    // Past the grace, the launcher still runs and ends by itself.
    ASSERT_EQ(waitpid(launcher, &status, 0), launcher);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the launcher was signalled";
}

TEST(LauncherWatch, LeavesAtOnceWhenTheLauncherEndsByItself) {
    const pid_t launcher = spawn_sleeper("0.3");
    ASSERT_GT(launcher, 0);
    const int watcher = start_launcher_watch(launcher, std::chrono::seconds(30), "unused");
    ASSERT_GT(watcher, 0);
    int status = 0;
    ASSERT_EQ(waitpid(launcher, &status, 0), launcher);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the launcher was signalled";
    // The watcher sees the launcher gone (reaped: its /proc entry is gone) within its poll.
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(waitpid(watcher, &status, 0), watcher);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
    // Not an MPI launcher: a rank under a plain shell never starts one.
    EXPECT_TRUE(is_mpi_launcher_name("mpirun"));
    EXPECT_TRUE(is_mpi_launcher_name("orted"));
    EXPECT_TRUE(is_mpi_launcher_name("mpirun.openmpi"));  // as epo launch runs it on Debian
    EXPECT_TRUE(is_mpi_launcher_name("mpiexec.hydra"));
    EXPECT_FALSE(is_mpi_launcher_name("mpirunner"));
    EXPECT_FALSE(is_mpi_launcher_name("bash"));
    EXPECT_FALSE(is_mpi_launcher_name("epo"));
}

}  // namespace
}  // namespace epo::comm
