// `epo bench`: the benchmark harness (the project's main job). Started by hand it checks the
// configuration, picks the run directory and starts N x G ranks of itself through mpirun (the
// launcher of epo launch); started inside an MPI job (mpirun, srun) it is one of those ranks.
// The ranks run epo::bench::run_bench and rank 0 writes the run directory and prints the table.
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <memory>

#include "commands.h"
#include "epo/bench/bench_report.h"
#include "epo/bench/bench_run.h"
#include "epo/bench/run_info.h"
#include "epo/checkpoint/stop_signal.h"
#include "epo/comm/launch.h"
#include "epo/comm/rank_runner.h"
#include "epo/config/overrides.h"
#include "epo/config/recipes.h"
#include "harness_flags.h"

namespace epo::cli {
namespace {

struct BenchArgs {
    std::vector<std::string> positional;
    std::string model;
    std::string out;
    bool compare = false;
    double comm_compute_ratio = 0;
    int repeats = 0;
    int warmup_steps = 1;
    std::string command_line;  // hidden --command_line: what the user typed, set by the launch
    HarnessFlags harness;
    CLI::App* cmd = nullptr;
};

bench::BenchOptions options_from(const BenchArgs& args) {
    bench::BenchOptions o;
    o.sources = config_sources(*args.cmd, args.model, args.positional, args.harness);
    o.compare = args.compare;
    if (args.cmd->count("--comm_compute_ratio") > 0) {
        o.comm_compute_ratio = args.comm_compute_ratio;
    }
    if (args.cmd->count("--repeats") > 0 && args.repeats < 1) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("--repeats {}: give 1 or more runs per schedule (default: 2 with "
                                "--compare, else 1)",
                                args.repeats));
    }
    o.repeats = args.repeats;
    o.warmup_steps = args.warmup_steps;
    if (!args.out.empty()) {
        o.out_dir = args.out;
    }
    o.command_line = args.command_line;
    return o;
}

// Inside an MPI job when the launcher left its rank variables (Open MPI, MPICH/hydra, PMIx/srun).
bool inside_mpi_job() {
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
        if (std::getenv(v) != nullptr) {
            return true;
        }
    }
    return false;
}

std::string default_run_dir(const config::Config& cfg) {
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
    return (std::filesystem::path(cfg.logger.log_dir) /
            fmt::format("{}-bench-{}", stamp, cfg.recipe.value_or("run")))
        .string();
}

// Checks everything before any rank starts, then runs mpirun with the same command line on every
// rank, with the run directory fixed (its stderr filtered of the launcher's own noise).
void launch(bench::BenchOptions options) {
    const config::Config built =
        config::build_config(bench::with_bench_model(options.sources)).config;
    const int world = bench::launch_world_size(built);
    // mpirun starts every rank on this host.
    const config::Config cfg =
        bench::check_bench_config(options, {.world_size = world, .ranks_per_host = world});
    const std::string out = options.out_dir ? options.out_dir->string() : default_run_dir(cfg);
    bench::check_out_dir_unused(out);  // before any rank starts

    const std::vector<std::string> argv = bench::own_argv();  // as started, before any rewriting
    std::vector<std::string> command = {"/proc/self/exe"};
    command[0] = std::filesystem::read_symlink("/proc/self/exe").string();
    for (size_t i = 1; i < argv.size(); ++i) {
        if (argv[i] == "--out") {
            ++i;  // and its value
            continue;
        }
        if (argv[i].rfind("--out=", 0) == 0) {
            continue;
        }
        command.push_back(argv[i]);
    }
    command.push_back("--out");
    command.push_back(out);
    // The ranks record the command as the user typed it (metrics.json run.command_line), not the
    // one the launch rewrote.
    command.push_back("--command_line");
    command.push_back(bench::shell_join(argv));
    comm::LaunchOptions launch{.num_ranks = world, .command = command};
    const std::vector<std::string> line = comm::make_launch_command(launch);
    std::cout << fmt::format("[bench] {} ranks ({} nodes x {}), run directory {}\n", world,
                             config::num_nodes(cfg.comm), config::gpus_per_node(cfg.comm), out)
              << std::flush;
    const int status = comm::run_launch_forwarding(line);
    if (const int signal = comm::forwarded_signal(); signal != 0 && status != 0) {
        // The user stopped the run: say so, and mark what it left so that nobody reads it as a
        // finished run (check-run reports the mark).
        const bool marked = bench::mark_run_stopped(out, signal, status);
        std::cerr << fmt::format("epo bench: stopped by {} before the run finished; {}\n",
                                 checkpoint::signal_name(signal),
                                 marked ? fmt::format("{} is incomplete (marked by its file {})",
                                                      out, bench::kStoppedMarker)
                                        : "no run directory was written");
        throw CLI::RuntimeError(128 + signal);
    }
    if (status != 0)
        throw CLI::RuntimeError(status);
}

void run_ranks(const bench::BenchOptions& options) {
    int status = 0;
    comm::MpiRuntime mpi(nullptr, nullptr);
    try {
        const bench::BenchResult result = bench::run_bench(options, std::cout);
        bench::write_bench_outputs(result, std::cout);
    } catch (const Error& e) {
        if (e.kind() != ErrorKind::kConfig && e.kind() != ErrorKind::kUsage) {
            comm::abort_job(std::current_exception());
        }
        // Every rank reaches the same verdict on the configuration: exit cleanly, rank 0 says why.
        if (mpi.world_rank() == 0) {
            std::cerr << "epo bench: " << e.what() << "\n";
        }
        status = exit_status_for(e.kind());
    } catch (...) {
        comm::abort_job(std::current_exception());
    }
    if (status != 0) {
        throw CLI::RuntimeError(status);
    }
}

void run_bench_command(const BenchArgs& args) {
    if (inside_mpi_job()) {
        run_ranks(options_from(args));
        return;
    }
    try {
        launch(options_from(args));
    } catch (const Error& e) {
        std::cerr << "epo bench: " << e.what() << "\n";
        throw CLI::RuntimeError(exit_status_for(e.kind()));
    }
}

}  // namespace

void add_bench_command(CLI::App& app) {
    auto args = std::make_shared<BenchArgs>();
    const std::string recipes = recipe_list();
    CLI::App* cmd = app.add_subcommand(
        "bench",
        "Benchmark EP overlap: start N x G ranks (or run inside an MPI job), train the baseline "
        "and overlap schedules, print the comparison table and write metrics.json, report.html, "
        "a trace and per-rank logs. Without --model: a small proxy of qwen3-30b-a3b on 2 ranks "
        "as 2 nodes, link model calibrated to comm/compute 1.");
    args->cmd = cmd;
    cmd->add_option("config_and_overrides", args->positional,
                    "CONFIG.yaml, then KEY=VALUE overrides; later ones win");
    cmd->add_option("--model", args->model, "start from a recipe: " + recipes);
    cmd->add_flag("--compare", args->compare,
                  "run baseline, overlap and overlap+delay_wgrad, alternating repeats");
    cmd->add_option("--comm_compute_ratio", args->comm_compute_ratio,
                    "calibrate the link model so the baseline's communication takes R times its "
                    "compute; 0 turns the link model off (default: 1 for the embedded proxy, "
                    "link model as configured otherwise)");
    cmd->add_option("--repeats", args->repeats,
                    "runs per schedule, alternating (default: 2 with --compare, else 1)");
    cmd->add_option("--warmup_steps", args->warmup_steps,
                    "steps per run left out of the timing (default 1)");
    cmd->add_option("--out", args->out,
                    "run directory (default: <logger.log_dir>/<time>-bench-<recipe>)")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    // Set by the launch for its ranks; hidden (an empty group).
    cmd->add_option("--command_line", args->command_line,
                    "the command to record in metrics.json and report.html")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
        ->group("");
    add_harness_flags(*cmd, args->harness);
    cmd->footer(
        "Examples:\n"
        "  epo bench --compare\n"
        "  epo bench --model tiny-moe --num_nodes 2 --gpus_per_node 1 -ep 2 --compare "
        "--max_steps 4\n"
        "  epo bench --compare --comm_compute_ratio 2 -gb 32");
    cmd->callback([args] { run_bench_command(*args); });
}

}  // namespace epo::cli
