// `epo train` jobs driven from outside, as a scheduler or an operator would: SIGTERM to one rank
// makes every rank save and exit 0 (and the job resumes from that checkpoint); kill -9 of one
// rank ends the whole job in bounded time with a message naming it. Each test runs a real
// mpirun job of the built `epo` binary and watches its processes through /proc.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <regex>
#include <thread>

#include "epo/comm/launch.h"

namespace epo::checkpoint {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

fs::path epo_binary() {
    return fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "bin" / "epo";
}

std::vector<std::string> small_train_args(const fs::path& dir, std::vector<std::string> extra) {
    std::vector<std::string> args = {epo_binary().string(),
                                     "train",
                                     "--model",
                                     "tiny-moe",
                                     "--out",
                                     (dir / "run").string(),
                                     "model.num_layers=2",
                                     "model.hidden_size=64",
                                     "model.kv_channels=16",
                                     "model.ffn_hidden_size=128",
                                     "model.moe_ffn_hidden_size=64",
                                     "model.seq_length=32",
                                     "train.micro_batch_size=2",
                                     "train.global_batch_size=8",
                                     "model.expert_model_parallel_size=2",
                                     "checkpoint.save=" + (dir / "ckpt").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
}

// A job started in the background; its rank processes are found by a tag in their environment.
class Job {
public:
    Job(const std::string& tag, std::vector<std::string> command, double timeout_s) : tag_(tag) {
        comm::LaunchOptions options;
        options.num_ranks = 2;
        options.omp_threads = 1;
        options.command = std::move(command);
        options.env = {{"EPO_TEST_JOB", tag}};
        const auto argv = comm::make_launch_command(options);
        result_ = std::async(std::launch::async,
                             [argv, timeout_s] { return comm::run_launch(argv, timeout_s); });
    }

    // World rank -> pid of the job's rank processes (empty until they have started).
    std::map<int, pid_t> ranks() const {
        std::map<int, pid_t> out;
        for (const auto& entry : fs::directory_iterator("/proc")) {
            const std::string name = entry.path().filename().string();
            if (name.find_first_not_of("0123456789") != std::string::npos)
                continue;
            // A rank's guardian (comm/rank_runner.h) shares its environment.
            std::string comm;
            std::getline(std::ifstream(entry.path() / "comm"), comm);
            if (comm == "epo-guardian")
                continue;
            std::ifstream in(entry.path() / "environ", std::ios::binary);
            std::string env((std::istreambuf_iterator<char>(in)), {});
            if (env.find("EPO_TEST_JOB=" + tag_ + '\0') == std::string::npos)
                continue;
            for (const char* key : {"OMPI_COMM_WORLD_RANK=", "PMI_RANK="}) {
                const auto at = env.find(std::string("\0", 1) + key);
                if (at != std::string::npos) {
                    out[std::stoi(env.substr(at + 1 + std::strlen(key)))] = std::stoi(name);
                    break;
                }
            }
        }
        return out;
    }

    comm::LaunchResult wait() { return result_.get(); }

private:
    std::string tag_;
    std::future<comm::LaunchResult> result_;
};

// Waits until `path` exists (the job is training), at most `timeout_s`.
bool wait_for(const fs::path& path, double timeout_s) {
    const auto end = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (!fs::exists(path)) {
        if (Clock::now() > end)
            return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return true;
}

fs::path fresh_dir(const std::string& name) {
    const fs::path dir =
        fs::temp_directory_path() / ("epo_job_" + std::to_string(getpid()) + "_" + name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

int64_t latest_iteration(const fs::path& ckpt) {
    std::ifstream in(ckpt / "latest_checkpointed_iteration.txt");
    int64_t n = -1;
    in >> n;
    return n;
}

TEST(JobControl, SigtermToOneRankSavesOnEveryRankExitsZeroAndResumes) {
    const fs::path dir = fresh_dir("sigterm");
    const std::string tag = "sigterm" + std::to_string(getpid());
    // Saves every step, so the first checkpoint appearing means the ranks are in the loop.
    Job job(tag, small_train_args(dir, {"train.train_iters=100000", "checkpoint.save_interval=1"}),
            400);
    ASSERT_TRUE(wait_for(dir / "ckpt" / "iter_0000001" / "metadata.json", 300));
    const std::map<int, pid_t> ranks = job.ranks();
    ASSERT_EQ(ranks.size(), 2u);
    ASSERT_EQ(kill(ranks.at(1), SIGTERM), 0);
    const comm::LaunchResult r = job.wait();
    ASSERT_FALSE(r.timed_out) << r.stderr_text;
    EXPECT_EQ(r.exit_status, 0) << r.stdout_text << r.stderr_text;
    EXPECT_NE(r.stderr_text.find("epo: rank 1 of 2 received SIGTERM: stopping after the current "
                                 "step"),
              std::string::npos)
        << r.stderr_text;
    const std::regex exiting(
        "exiting at iteration ([0-9]+): rank 1 received SIGTERM; resume with "
        "checkpoint.load=");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.stdout_text, m, exiting)) << r.stdout_text;
    const int64_t stopped_at = std::stoll(m[1].str());
    EXPECT_EQ(latest_iteration(dir / "ckpt"), stopped_at);
    const fs::path saved = dir / "ckpt" / fmt::format("iter_{:07d}", stopped_at);
    for (const char* file : {"metadata.json", "rank_00000.safetensors", "rank_00001.safetensors"})
        EXPECT_TRUE(fs::exists(saved / file)) << saved / file;

    // The same command with checkpoint.load continues from there.
    Job resumed(tag + "r",
                small_train_args(dir, {"train.train_iters=" + std::to_string(stopped_at + 1),
                                       "checkpoint.load=" + (dir / "ckpt").string()}),
                400);
    const comm::LaunchResult r2 = resumed.wait();
    EXPECT_EQ(r2.exit_status, 0) << r2.stdout_text << r2.stderr_text;
    EXPECT_NE(r2.stdout_text.find(fmt::format("successfully loaded checkpoint from {} at "
                                              "iteration {}",
                                              saved.string(), stopped_at)),
              std::string::npos)
        << r2.stdout_text;
    EXPECT_NE(
        r2.stdout_text.find(fmt::format("iteration {:8d}/{:8d}", stopped_at + 1, stopped_at + 1)),
        std::string::npos)
        << r2.stdout_text;
    fs::remove_all(dir);
}

// A collective held by the link model (here 5 s of latency each, a step holds dozens) used to
// sleep to its deadline whatever happened: SIGTERM could not stop the step. Now the stop
// request cuts every hold short, the step ends, the ranks save and exit 0 within seconds.
TEST(JobControl, SigtermEndsAStepOfLongLinkModelHoldsWithinSeconds) {
    const fs::path dir = fresh_dir("hold");
    const std::string tag = "hold" + std::to_string(getpid());
    Job job(tag, small_train_args(dir, {"train.train_iters=100000", "comm.link.latency_us=5e6"}),
            120);
    // The ranks are up; give them time to be inside the first step's holds.
    const auto end = Clock::now() + std::chrono::seconds(60);
    while (job.ranks().size() < 2u && Clock::now() < end)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::this_thread::sleep_for(std::chrono::seconds(4));
    const std::map<int, pid_t> ranks = job.ranks();
    ASSERT_EQ(ranks.size(), 2u);
    const auto signalled_at = Clock::now();
    for (const auto& [rank, pid] : ranks)
        ASSERT_EQ(kill(pid, SIGTERM), 0);
    const comm::LaunchResult r = job.wait();
    const double seconds = std::chrono::duration<double>(Clock::now() - signalled_at).count();
    ASSERT_FALSE(r.timed_out) << r.stderr_text;
    EXPECT_EQ(r.exit_status, 0) << r.stdout_text << r.stderr_text;
    EXPECT_LT(seconds, 20) << r.stderr_text;
    EXPECT_NE(r.stdout_text.find("exiting at iteration 1: rank 0 received SIGTERM"),
              std::string::npos)
        << r.stdout_text;
    fs::remove_all(dir);
}

TEST(JobControl, KilledRankEndsTheJobInBoundedTimeNamingIt) {
    const fs::path dir = fresh_dir("kill9");
    const std::string tag = "kill9" + std::to_string(getpid());
    Job job(tag,
            small_train_args(dir, {"train.train_iters=100000", "checkpoint.save_interval=1",
                                   "comm.timeout_s=5"}),
            400);
    ASSERT_TRUE(wait_for(dir / "ckpt" / "iter_0000001" / "metadata.json", 300));
    const std::map<int, pid_t> ranks = job.ranks();
    ASSERT_EQ(ranks.size(), 2u);
    const auto killed_at = Clock::now();
    ASSERT_EQ(kill(ranks.at(1), SIGKILL), 0);
    const comm::LaunchResult r = job.wait();
    const double seconds = std::chrono::duration<double>(Clock::now() - killed_at).count();
    ASSERT_FALSE(r.timed_out);
    EXPECT_NE(r.exit_status, 0);
    // Whichever notices first names rank 1: the launcher (it saw the process die) or a peer's
    // deadline (comm.timeout_s) on the collective rank 1 never entered.
    const std::regex names_rank_1(
        "rank 1 with PID [0-9]+ on node \\S+ exited on signal 9|world rank\\(s\\) 1 to arrive");
    EXPECT_TRUE(std::regex_search(r.stderr_text, names_rank_1)) << r.stderr_text;
    EXPECT_LT(seconds, 30) << r.stderr_text;
    std::cout << "the job ended " << seconds << " s after kill -9 of rank 1; stderr:\n"
              << r.stderr_text;
    // No rank is left behind.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    EXPECT_TRUE(job.ranks().empty());
    fs::remove_all(dir);
}

}  // namespace
}  // namespace epo::checkpoint
