// `epo train` as a library function: every rank of an MPI job calls run_training() with the same
// options. It builds the configuration (recipe < YAML < harness flags < KEY=VALUE), takes the
// topology from the MPI job when the command line did not give one, refuses anything the runtime
// does not execute (runtime-support ids) before any rank works, logs the finalized configuration
// (rank 0) and writes it to the run directory, then trains and logs every log_interval steps in
// the reference format (train_log.h).
#pragma once

#include <filesystem>
#include <functional>
#include <iosfwd>
#include <optional>
#include <vector>

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
};

struct TrainRunResult {
    config::Config config;  // finalized
    std::filesystem::path run_dir;
    std::vector<StepResult> steps;
};

// The finalized, runtime-valid configuration for a job of `world_size` ranks, or an epo::Error
// (kConfig) whose message lists every error with its id and fix. Every rank computes the same.
config::ValidationReport prepare_run_config(const config::ConfigSources& sources, int world_size);

// Collective over MPI_COMM_WORLD. `log` receives rank 0's output (other ranks print nothing).
TrainRunResult run_training(const TrainRunOptions& options, std::ostream& log);

}  // namespace epo::train
