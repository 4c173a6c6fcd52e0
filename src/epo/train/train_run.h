// `epo train` as a library function: every rank of an MPI job calls run_training() with the same
// options. It builds the configuration (recipe < YAML < harness flags < KEY=VALUE), takes the
// topology from the MPI job when the command line did not give one, refuses anything the runtime
// does not execute (runtime-support ids) before any rank works, logs the finalized configuration
// (rank 0) and writes it to the run directory, then trains and logs every log_interval steps in
// the reference format (train_log.h).
//
// Runs that lose nothing (docs/checkpoint.md): with checkpoint.load it resumes from the latest
// complete checkpoint there; with checkpoint.save it saves every checkpoint.save_interval steps
// and at the end; SIGTERM/SIGINT on any rank makes every rank stop after the current step, save
// and return normally (a second signal exits at once); a NaN/Inf loss or gradient norm stops the
// run with an error naming the step and the parameter.
#pragma once

#include <filesystem>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string_view>
#include <vector>

#include "epo/comm/mpi_runtime.h"
#include "epo/config/builder.h"
#include "epo/config/report.h"
#include "epo/train/trainer.h"

namespace epo::train {

struct TrainRunOptions {
    config::ConfigSources sources;
    std::optional<std::filesystem::path> out_dir;  // default: <logger.log_dir>/<time>-<recipe>
    bool keep_records = false;                     // StepResult::records (traces)
    // Called on every rank after each step (progress, traces, tests).
    std::function<void(const Trainer&, const StepResult&)> on_step;
    // Called on every rank before each step: the fault-injection hook of tests (e.g. a NaN put
    // into a gradient).
    std::function<void(Trainer&)> before_step;
};

struct TrainRunResult {
    config::Config config;  // finalized
    std::filesystem::path run_dir;
    std::vector<StepResult> steps;  // the steps this call ran (after the resumed iteration)
    int64_t first_iteration = 1;    // iteration of steps[0]: 1, or the resumed iteration + 1
    // The run stopped early because a rank received SIGTERM/SIGINT (after saving, when
    // checkpoint.save is set).
    bool stopped_by_signal = false;
    std::optional<std::filesystem::path> last_checkpoint;  // the last one this call saved
};

// The finalized configuration for the MPI job `job`, with the topology it leaves to the launcher
// filled in from the job, and every error (the RT findings promoted to errors) in the report.
// Every rank computes the same.
config::ValidationReport prepare_run_config(const config::ConfigSources& sources,
                                            const comm::JobShape& job);

// Collective over MPI_COMM_WORLD: rank 0 picks the run directory (`out_dir`, or
// <logger.log_dir>/<time>-<kind><recipe>) and every rank learns it.
std::filesystem::path agree_on_run_dir(const std::optional<std::filesystem::path>& out_dir,
                                       const config::Config& cfg, std::string_view kind);

// Collective over MPI_COMM_WORLD. `log` receives rank 0's output (other ranks print nothing).
TrainRunResult run_training(const TrainRunOptions& options, std::ostream& log);

}  // namespace epo::train
