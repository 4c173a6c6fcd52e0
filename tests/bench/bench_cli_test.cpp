// The `epo bench` and `epo check-run` command lines, run as a user runs them: bad input is
// refused before any rank starts (no launcher line, no run directory), and a small --compare
// run started by epo itself through mpirun leaves a run directory that check-run passes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "epo/bench/bench_run.h"
#include "epo/bench/check_run.h"
#include "epo/bench/run_info.h"
#include "epo/comm/launch.h"
#include "epo/config/recipes.h"
#include "epo/core/error.h"
#include "epo/train/train_run.h"

namespace epo::bench {
namespace {

namespace fs = std::filesystem;

// The epo binary of the same build tree as this test: <build>/bin/epo.
std::string epo_binary() {
    return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "bin" / "epo")
        .string();
}

comm::LaunchResult epo(std::vector<std::string> args, double timeout_s = 60) {
    args.insert(args.begin(), epo_binary());
    return comm::run_launch(args, timeout_s);
}

fs::path temp_dir(const std::string& tag) {
    return fs::temp_directory_path() / ("epo_bench_cli_" + tag + "_" + std::to_string(getpid()));
}

struct Rejection {
    std::vector<std::string> args;
    int exit_status;
    std::string message;  // part of stderr naming the reason
};

TEST(BenchCli, RefusesBadInputBeforeAnyRankStarts) {
    const std::vector<std::string> two_nodes = {"--model", "tiny-moe",        "--num_nodes",
                                                "2",       "--gpus_per_node", "1"};
    const auto with = [&](std::vector<std::string> extra) {
        std::vector<std::string> a = two_nodes;
        a.insert(a.end(), extra.begin(), extra.end());
        return a;
    };
    const std::vector<Rejection> cases = {
        {{"--model", "no-such-model"}, 2, "unknown recipe 'no-such-model'"},
        {with({"--no_such_flag"}), 2, "no_such_flag"},
        {with({"-ep", "2", "--comm_compute_ratio", "-1"}), 2, "--comm_compute_ratio -1"},
        // Flex over nodes of 3 cannot tile an EP group of 2 (RT026, naming the field).
        {{"--model", "tiny-moe", "--num_nodes", "2", "--gpus_per_node", "3", "-ep", "2",
          "--moe_flex_dispatcher_backend", "deepep"},
         1,
         "comm.gpus_per_node"},
        // 3 ranks cannot hold expert parallel 2.
        {{"--model", "tiny-moe", "--num_nodes", "3", "--gpus_per_node", "1", "-ep", "2"},
         1,
         "expert_model_parallel_size"},
        // 6 experts do not split over 4 ranks.
        {{"--model", "tiny-moe", "--num_nodes", "4", "--gpus_per_node", "1", "-ep", "4",
          "--num_moe_experts", "6"},
         1,
         "num_moe_experts"},
        {with({"-ep", "2", "--warmup_steps", "5", "--max_steps", "5"}), 2, "--warmup_steps 5"},
        // 0 silently meant the default (2 with --compare).
        {with({"-ep", "2", "--repeats", "0"}), 2, "--repeats 0: give 1 or more"},
    };
    for (const Rejection& c : cases) {
        const fs::path out = temp_dir("rejected");
        std::vector<std::string> args = {"bench"};
        args.insert(args.end(), c.args.begin(), c.args.end());
        args.insert(args.end(), {"--out", out.string()});
        const comm::LaunchResult r = epo(args);
        std::string line;
        for (const auto& a : c.args) {
            line += a + " ";
        }
        EXPECT_EQ(r.exit_status, c.exit_status) << line << "\n" << r.stderr_text;
        EXPECT_NE(r.stderr_text.find(c.message), std::string::npos)
            << line << "\nstderr: " << r.stderr_text;
        EXPECT_EQ(r.stdout_text.find("ranks ("), std::string::npos) << line;  // no launch
        EXPECT_FALSE(fs::exists(out)) << line;
    }
}

TEST(BenchCli, RefusesAnOutPathItCannotCreateBeforeAnyRankStarts) {
    // A symbolic link to a directory that is gone: refused naming the link's target (it failed
    // only after the ranks started).
    const fs::path link = temp_dir("dangling");
    fs::create_symlink(temp_dir("gone"), link);
    const comm::LaunchResult r = epo({"bench", "--model", "tiny-moe", "--num_nodes", "2",
                                      "--gpus_per_node", "1", "-ep", "2", "--out", link.string()});
    EXPECT_EQ(r.exit_status, 2) << r.stderr_text;
    EXPECT_NE(r.stderr_text.find("it is a symbolic link to '" + temp_dir("gone").string() +
                                 "', which does not exist"),
              std::string::npos)
        << r.stderr_text;
    EXPECT_EQ(r.stdout_text.find("ranks ("), std::string::npos);  // no launch
    fs::remove(link);
}

// A bench its user stops (SIGTERM to epo bench, as `kill` or a scheduler sends it) says so, exits
// 128 + the signal, and marks the run directory so that nobody reads it as a finished run. It
// exited 1 in 0.14 s with no message and an unmarked partial directory.
TEST(BenchCli, AStoppedBenchSaysSoAndMarksItsRunDirectory) {
    const fs::path out = temp_dir("stopped");
    int err[2];
    ASSERT_EQ(pipe(err), 0);
    const std::vector<std::string> args = {
        epo_binary(),           "bench", "--model", "tiny-moe",   "--num_nodes",        "2",
        "--gpus_per_node",      "1",     "-ep",     "2",          "--max_steps",        "100000",
        "--comm_compute_ratio", "0",     "--out",   out.string(), "model.seq_length=32"};
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        dup2(err[1], STDERR_FILENO);
        close(err[0]);
        std::vector<char*> argv;
        for (const std::string& a : args)
            argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        execv(argv[0], argv.data());
        _exit(127);
    }
    close(err[1]);
    // Stop it once its ranks run (rank 0 has logged the baseline's configuration), a moment
    // into the training.
    const auto t0 = std::chrono::steady_clock::now();
    bool training = false;
    while (!training && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(90)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        std::ifstream log(out / "logs" / "rank-0.log");
        const std::string text((std::istreambuf_iterator<char>(log)), {});
        training = text.find("# run: baseline") != std::string::npos;
    }
    EXPECT_TRUE(training) << "the ranks never started the baseline";
    std::this_thread::sleep_for(std::chrono::seconds(2));
    kill(pid, SIGTERM);
    int status = 0;
    for (int i = 0; i < 600 && waitpid(pid, &status, WNOHANG) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (waitpid(pid, &status, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ADD_FAILURE() << "epo bench did not end within 60 s of SIGTERM";
    }
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = read(err[0], buf, sizeof buf)) > 0;)
        text.append(buf, static_cast<size_t>(n));
    close(err[0]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM) << status << text;
    EXPECT_NE(text.find("epo bench: stopped by SIGTERM before the run finished; " + out.string() +
                        " is incomplete (marked by its file STOPPED)"),
              std::string::npos)
        << text;
    std::ifstream marker(out / kStoppedMarker);
    std::string line;
    std::getline(marker, line);
    EXPECT_NE(line.find("stopped by SIGTERM at "), std::string::npos) << line;
    const comm::LaunchResult check = epo({"check-run", out.string()});
    EXPECT_EQ(check.exit_status, 1);
    EXPECT_NE(check.stdout_text.find("the run did not finish"), std::string::npos)
        << check.stdout_text;
    fs::remove_all(out);
}

// W012 (one micro-batch: nothing to overlap) shows in the bench's own output, as epo validate
// prints it for the same flags.
TEST(BenchCli, PrintsTheValidationWarningsOfWhatItRuns) {
    const fs::path out = temp_dir("w012");
    const comm::LaunchResult r = epo({"bench",
                                      "--model",
                                      "tiny-moe",
                                      "--num_nodes",
                                      "2",
                                      "--gpus_per_node",
                                      "1",
                                      "-ep",
                                      "2",
                                      "-gb",
                                      "4",
                                      "--max_steps",
                                      "3",
                                      "--compare",
                                      "--repeats",
                                      "1",
                                      "--comm_compute_ratio",
                                      "0",
                                      "--out",
                                      out.string(),
                                      "model.seq_length=32",
                                      "train.lr_warmup_iters=0"},
                                     240);
    EXPECT_EQ(r.exit_status, 0) << r.stderr_text;
    EXPECT_NE(r.stdout_text.find("W012"), std::string::npos) << r.stdout_text;
    // One measured step per run: the table says its speedups cannot be used.
    EXPECT_NE(r.stdout_text.find("warning (too_few_steps)"), std::string::npos) << r.stdout_text;
    fs::remove_all(out);
}

// The proxy calibrates its link to comm = compute unless a ratio or a fixed link is given; a named
// model uses its configuration's link unless a ratio is given.
TEST(BenchCli, TheProxyCalibratesUnlessALinkOrARatioIsGiven) {
    BenchOptions o;
    EXPECT_EQ(calibration_ratio(o, true), 1.0);
    EXPECT_EQ(calibration_ratio(o, false), std::nullopt);
    o.sources.overrides = {"train.train_iters=3", "comm.link.inter_node_gbps=0.05"};
    EXPECT_EQ(calibration_ratio(o, true), std::nullopt);
    o.comm_compute_ratio = 2.0;
    EXPECT_EQ(calibration_ratio(o, true), 2.0);
    o.sources.overrides.clear();
    o.comm_compute_ratio = 0.0;
    EXPECT_EQ(calibration_ratio(o, true), 0.0);
    EXPECT_EQ(calibration_ratio(o, false), 0.0);
}

// `epo bench --model deepseek-v3` (no configuration file) runs its proxy, which validates for the
// runtime in every schedule --compare runs (the overlap rows with shared-expert overlap off, as
// the reference's rule demands) and fits; qwen3-30b-a3b and no model run the qwen3 proxy; a model
// without a proxy, or any model with a configuration file, runs as given.
TEST(BenchCli, DeepSeekV3RunsItsProxyWhichTheRuntimeRuns) {
    BenchOptions o;
    o.compare = true;
    o.sources.model = "deepseek-v3";
    bool proxy = false;
    const config::ConfigSources s = with_bench_model(o.sources, &proxy);
    EXPECT_TRUE(proxy);
    ASSERT_TRUE(s.config_text.has_value());
    EXPECT_EQ(*s.config_text, deepseek_v3_proxy_yaml());
    const comm::JobShape job{.world_size = 2, .ranks_per_host = 2};
    config::Config cfg;
    ASSERT_NO_THROW(cfg = check_bench_config(o, job));  // every compared schedule, and memory
    const config::ModelConfig& m = cfg.model;
    EXPECT_EQ(cfg.recipe, "deepseek-v3");
    EXPECT_TRUE(m.multi_latent_attention);
    EXPECT_EQ(m.q_lora_rank, 1536);
    EXPECT_EQ(m.kv_lora_rank, 512);
    EXPECT_EQ(m.qk_head_dim, 128);
    EXPECT_EQ(m.qk_pos_emb_head_dim, 64);
    EXPECT_EQ(m.v_head_dim, 128);
    EXPECT_EQ(m.moe_ffn_hidden_size, 2048);
    EXPECT_EQ(m.moe_shared_expert_intermediate_size, 2048);
    EXPECT_TRUE(m.moe_shared_expert_overlap);  // the baseline keeps the recipe's setting
    EXPECT_EQ(m.mtp_num_layers, 1);
    EXPECT_EQ(m.moe_router_score_function, config::ScoreFunction::kSigmoid);
    EXPECT_TRUE(m.moe_router_enable_expert_bias);
    EXPECT_EQ(m.moe_router_num_groups, 8);
    EXPECT_EQ(m.moe_router_group_topk, 4);
    EXPECT_EQ(m.moe_layer_freq, config::MoeLayerFreq(std::vector<int>{0, 1}));
    EXPECT_EQ(calibration_ratio(o, proxy), 1.0);
    // The overlap rows need shared-expert overlap off: with it on the reference's rule refuses.
    config::ConfigSources overlap = s;
    overlap.overrides.push_back("comm_overlap.overlap_moe_expert_parallel_comm=true");
    const config::ValidationReport refused = train::prepare_run_config(overlap, job);
    EXPECT_FALSE(refused.ok());
    overlap.overrides.push_back("model.moe_shared_expert_overlap=false");
    const config::ValidationReport ok = train::prepare_run_config(overlap, job);
    EXPECT_TRUE(ok.ok()) << config::format_findings(ok);

    for (std::optional<std::string> model :
         {std::optional<std::string>(), std::optional<std::string>("qwen3-30b-a3b")}) {
        BenchOptions q;
        q.sources.model = model;
        const config::ConfigSources qs = with_bench_model(q.sources, &proxy);
        EXPECT_TRUE(proxy);
        EXPECT_EQ(qs.model, kProxyRecipe);
        EXPECT_EQ(qs.config_text, proxy_yaml());
    }
    BenchOptions plain;
    plain.sources.model = "mixtral-8x7b";
    EXPECT_FALSE(with_bench_model(plain.sources, &proxy).config_text.has_value());
    EXPECT_FALSE(proxy);
    plain.sources.model = "deepseek-v3";
    plain.sources.config_text = "train:\n  train_iters: 2\n";
    EXPECT_EQ(with_bench_model(plain.sources, &proxy).config_text, plain.sources.config_text);
    EXPECT_FALSE(proxy);
}

// With no topology stated epo bench starts the ranks the layout needs, on one node of this host.
TEST(BenchCli, LaunchWorldSizeFillsAnUnstatedTopology) {
    config::Config c = config::make_recipe("tiny-moe");
    c.model.expert_model_parallel_size = 4;
    EXPECT_EQ(launch_world_size(c), 4);
    c.comm.num_nodes = 2;
    EXPECT_EQ(launch_world_size(c), 4);  // 2 nodes x 2
    c.comm.gpus_per_node = 3;
    EXPECT_EQ(launch_world_size(c), 6);  // stated: kept, and validated as such
    c.comm.gpus_per_node = kMaxLocalRanks;
    EXPECT_THROW(launch_world_size(c), Error);
}

TEST(BenchCli, LaunchesItsRanksAndCheckRunJudgesTheDirectory) {
    const fs::path out = temp_dir("run");
    const comm::LaunchResult r =
        epo({"bench", "--model", "tiny-moe", "--num_nodes", "2", "--gpus_per_node", "1", "-ep", "2",
             "-gb", "16", "--max_steps", "4", "--compare", "--repeats", "1",
             // A ratio well above the comm stream's own share:
             // with this tiny model under ctest -j2, the
             // all-to-alls' unmodelled time alone reached 2 x
             // compute, and calibration (rightly) refused.
             "--comm_compute_ratio", "8", "--out", out.string(), "model.hidden_size=64",
             "model.kv_channels=16", "model.ffn_hidden_size=128", "model.moe_ffn_hidden_size=64",
             "model.seq_length=32"},
            240);
    ASSERT_EQ(r.exit_status, 0) << r.stdout_text << r.stderr_text;
    EXPECT_NE(r.stdout_text.find("2 ranks (2 nodes x 1)"), std::string::npos) << r.stdout_text;
    EXPECT_NE(r.stdout_text.find("overlap+delay_wgrad"), std::string::npos);
    EXPECT_NE(r.stdout_text.find("losses, grad norms and final parameters bit-identical: yes"),
              std::string::npos)
        << r.stdout_text;
    EXPECT_NE(r.stdout_text.find("about"), std::string::npos);  // progress with time left
    for (const char* f : {"metrics.json", "report.html", "trace.json", "config.yaml",
                          "logs/rank-0.log", "logs/rank-1.log"}) {
        EXPECT_TRUE(fs::exists(out / f)) << f;
    }

    // How the run was made, as the user started it (not the line the launch gave the ranks),
    // and the options that explain it, in metrics.json and in the report's header.
    std::ifstream metrics_file(out / "metrics.json");
    const nlohmann::json m = nlohmann::json::parse(metrics_file);
    const nlohmann::json& run = m.at("run");
    const std::string command = run.at("command_line");
    EXPECT_EQ(command.rfind(epo_binary() + " bench --model tiny-moe --num_nodes 2", 0), 0u)
        << command;
    EXPECT_NE(command.find("--out " + out.string()), std::string::npos) << command;
    EXPECT_EQ(command.find("--command_line"), std::string::npos) << command;
    EXPECT_EQ(run.at("commit"), build_commit());
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    EXPECT_EQ(run.at("host"), host);
    for (const char* key : {"cpu_model", "cpu_features", "date_utc", "epo_version"})
        EXPECT_FALSE(run.at(key).get<std::string>().empty()) << key;
    EXPECT_TRUE(run.at("avx512_bf16").is_boolean());
    EXPECT_TRUE(run.at("amx_bf16").is_boolean());
    const nlohmann::json& o = m.at("schedule_options");
    EXPECT_EQ(o.at("schedules"), nlohmann::json({"baseline", "overlap", "overlap+delay_wgrad"}));
    EXPECT_EQ(o.at("dispatcher"), "alltoall");
    EXPECT_TRUE(o.at("flex_backend").is_null());
    EXPECT_EQ(o.at("num_chunks"), 1);
    EXPECT_EQ(o.at("pair_edges"), false);
    EXPECT_EQ(o.at("pipeline_model_parallel_size"), 1);
    EXPECT_TRUE(o.at("virtual_pipeline_model_parallel_size").is_null());
    EXPECT_EQ(o.at("num_micro_batches"), m.at("num_micro_batches"));
    EXPECT_TRUE(o.at("overlap_moe_expert_parallel_comm").get<bool>());
    EXPECT_TRUE(o.at("delay_wgrad_compute").get<bool>());
    EXPECT_EQ(o.at("link_model").get<std::string>().rfind("link model: inter-node ", 0), 0u);
    std::ifstream report_file(out / "report.html");
    const std::string report{std::istreambuf_iterator<char>(report_file), {}};
    EXPECT_NE(report.find(run.at("date_utc").get<std::string>()), std::string::npos);
    EXPECT_NE(report.find(build_commit()), std::string::npos);
    EXPECT_NE(report.find("intra-node not modelled"), std::string::npos);

    // Every criterion but the two timing ones (which depend on the machine's load; see
    // bench_run_mpi_test) passes; exit status 0 exactly when all do.
    const comm::LaunchResult ok = epo({"check-run", out.string()});
    for (const char* criterion :
         {"configuration finalized without errors", "overlap flags true in the logged config",
          "dispatcher type and backend logged when flex is used", "every step completed", "no hang",
          kIdenticalCriterion}) {
        EXPECT_NE(ok.stdout_text.find(std::string("PASS  ") + criterion), std::string::npos)
            << criterion << "\n"
            << ok.stdout_text;
    }
    const int timing_failed =
        (ok.stdout_text.find("FAIL  throughput") != std::string::npos) +
        (ok.stdout_text.find("FAIL  speedups measured, not claimed") != std::string::npos);
    EXPECT_EQ(ok.exit_status, timing_failed == 0 ? 0 : 1) << ok.stdout_text << ok.stderr_text;
    EXPECT_NE(ok.stdout_text.find(timing_failed == 0
                                      ? std::string("verdict: PASS")
                                      : fmt::format("verdict: FAIL ({} of 8", timing_failed)),
              std::string::npos)
        << ok.stdout_text;
    // Three measured steps per run (4, less the warm-up): enough to use the speedups.
    EXPECT_EQ(ok.stdout_text.find("measured step(s) against"), std::string::npos) << ok.stdout_text;

    // A run its user stopped (epo bench marks the directory) is not a finished run.
    ASSERT_TRUE(mark_run_stopped(out, SIGTERM, 143));
    const comm::LaunchResult stopped = epo({"check-run", out.string()});
    EXPECT_EQ(stopped.exit_status, 1) << stopped.stdout_text;
    EXPECT_NE(stopped.stdout_text.find("FAIL  no hang: the run did not finish: STOPPED says it was "
                                       "stopped by SIGTERM"),
              std::string::npos)
        << stopped.stdout_text;
    fs::remove(out / kStoppedMarker);

    fs::remove(out / "logs/rank-1.log");
    const comm::LaunchResult broken = epo({"check-run", out.string()});
    EXPECT_EQ(broken.exit_status, 1) << broken.stdout_text;
    EXPECT_NE(broken.stdout_text.find("FAIL  no hang"), std::string::npos) << broken.stdout_text;
    fs::remove_all(out);

    const comm::LaunchResult missing = epo({"check-run", out.string()});
    EXPECT_EQ(missing.exit_status, 2);
}

}  // namespace
}  // namespace epo::bench
