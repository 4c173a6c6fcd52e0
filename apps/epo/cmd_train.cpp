// `epo train`: one rank of a training job; run it under mpirun (`mpirun -np 4 epo train --model
// tiny-moe -ep 4`). Every rank parses the same command line; rank 0 logs.
#include <filesystem>
#include <iostream>
#include <memory>

#include "commands.h"
#include "epo/bench/trace.h"
#include "epo/comm/rank_runner.h"
#include "epo/config/overrides.h"
#include "epo/config/recipes.h"
#include "epo/train/train_run.h"
#include "harness_flags.h"

namespace epo::cli {
namespace {

struct TrainArgs {
    std::vector<std::string> positional;
    std::string model;
    std::string out;
    std::string trace;
    HarnessFlags harness;
    CLI::App* cmd = nullptr;
};

void run_train(const TrainArgs& args) {
    train::TrainRunOptions options;
    options.sources = config_sources(*args.cmd, args.model, args.positional, args.harness);
    if (!args.out.empty())
        options.out_dir = args.out;
    // Every rank checks the trace path, so all reach the same verdict before any collective.
    const std::filesystem::path trace_dir = std::filesystem::path(args.trace).parent_path();
    if (!args.trace.empty() && !trace_dir.empty() && !std::filesystem::is_directory(trace_dir)) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("--trace {}: directory '{}' does not exist; create it or give "
                                "another path",
                                args.trace, trace_dir.string()));
    }
    std::vector<std::vector<runtime::TaskRecord>> records;  // this rank's, per step
    if (!args.trace.empty()) {
        options.keep_records = true;
        options.on_step = [&records](const train::Trainer&, const train::StepResult& r) {
            records.push_back(r.records);
        };
    }
    int status = 0;
    comm::MpiRuntime mpi(nullptr, nullptr);
    try {
        const train::TrainRunResult run = train::run_training(options, std::cout);
        if (!args.trace.empty()) {
            bench::Trace trace;
            for (const auto& step : records) {
                bench::gather_trace(trace, step, run.config.comm.timeout_s);  // collective
            }
            if (mpi.world_rank() == 0) {
                bench::write_trace(trace, args.trace);
                std::cout << "trace: " << args.trace << "\n";
            }
        }
    } catch (const Error& e) {
        if (e.kind() != ErrorKind::kConfig && e.kind() != ErrorKind::kUsage) {
            comm::abort_job(std::current_exception());
        }
        // Every rank reaches the same verdict on the configuration: exit cleanly, rank 0 says why.
        if (mpi.world_rank() == 0)
            std::cerr << "epo train: " << e.what() << "\n";
        status = exit_status_for(e.kind());
    } catch (...) {
        comm::abort_job(std::current_exception());
    }
    if (status != 0)
        throw CLI::RuntimeError(status);
}

}  // namespace

void add_train_command(CLI::App& app) {
    auto args = std::make_shared<TrainArgs>();
    const std::string recipes = recipe_list();
    CLI::App* cmd = app.add_subcommand(
        "train",
        "Train an MoE model on this MPI job's ranks (run under mpirun); logs iterations in the "
        "reference format and writes the finalized configuration to the run directory.");
    args->cmd = cmd;
    cmd->add_option("config_and_overrides", args->positional,
                    "CONFIG.yaml, then KEY=VALUE overrides; later ones win");
    cmd->add_option("--model", args->model, "start from a recipe: " + recipes);
    cmd->add_option("--out", args->out,
                    "run directory (default: <logger.log_dir>/<time>-<recipe>)");
    cmd->add_option("--trace", args->trace,
                    "write a Chrome trace (Perfetto) of both streams of every rank, every step");
    add_harness_flags(*cmd, args->harness);
    cmd->footer(
        "Example:\n"
        "  mpirun -np 4 epo train --model tiny-moe -ep 4 --max_steps 200\n"
        "  mpirun -np 2 epo train --model tiny-moe -ep 2 --moe_a2a_overlap true -gb 16");
    cmd->callback([args] { run_train(*args); });
}

}  // namespace epo::cli
