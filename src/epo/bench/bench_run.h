// `epo bench` as a library function: every rank of an MPI job calls run_bench() with the same
// options. It builds and checks the configuration (refusing anything the runtime does not
// execute before any rank works), optionally calibrates the link model to a
// communication/compute ratio, then trains each schedule for the configured number of steps
// with a fresh Trainer per run:
//
//   baseline              overlap off
//   overlap               comm_overlap.overlap_moe_expert_parallel_comm = true
//   overlap+delay_wgrad   the same with comm_overlap.delay_wgrad_compute = true
//
// `compare` runs all three, `repeats` times, rotating which goes first in each repeat, so slow
// phases of a shared machine fall on every schedule alike; without it, the one schedule the
// configuration selects runs. Warm-up steps count for the loss trajectory but not for timing.
//
// Link calibration (comm_compute_ratio = R): a baseline with the link model off measures the
// compute stream's busy time C and the bytes of every collective; the inter-node bandwidth
// (intra-node on a single node) is then set so the modelled communication of a step is R * C
// (latency kept as configured). The chosen settings go into every run's configuration.
//
// Outputs are written by bench_report.h; this file only measures.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "epo/bench/bench_launch.h"
#include "epo/bench/calibration.h"
#include "epo/bench/metrics.h"
#include "epo/bench/proxies.h"
#include "epo/comm/mpi_runtime.h"
#include "epo/config/builder.h"
#include "epo/config/config.h"
#include "epo/moe/flex_layout.h"

namespace epo::bench {

struct BenchSchedule {
    std::string name;  // "baseline", "overlap", "overlap+delay_wgrad"
    bool overlap = false;
    bool delay_wgrad = false;
};

const std::vector<BenchSchedule>& compare_schedules();

struct BenchOptions {
    config::ConfigSources sources;
    bool compare = false;
    int repeats = 0;  // 0: 3 with compare, else 1
    int warmup_steps = 1;
    std::optional<double> comm_compute_ratio;
    std::optional<std::filesystem::path> out_dir;  // default: <logger.log_dir>/<time>-bench
    // The command as the user started it (run_info.h shell_join), for metrics.json and the
    // report; "" records rank 0's own command line.
    std::string command_line;
};

// The comm/compute ratio the link model is calibrated to, or none (the configuration's link):
// --comm_compute_ratio when given; else 1 for the embedded proxy, unless KEY=VALUE overrides set
// a comm.link.* key (one fixed link, for runs that must compare like for like, such as two
// dispatchers on the same cluster); else none.
std::optional<double> calibration_ratio(const BenchOptions& options, bool proxy);

struct ScheduleRun {
    BenchSchedule schedule;
    config::Config config;                        // finalized
    std::vector<std::vector<double>> losses;      // [repeat][step]
    std::vector<std::vector<double>> grad_norms;  // [repeat][step]
    std::vector<StepMetrics> measured;            // warm-up excluded, every repeat
    int64_t steps_planned = 0;
    int64_t steps_completed = 0;
    int64_t peak_rss_bytes = 0;         // largest over ranks and repeats
    int64_t peak_activation_bytes = 0;  // largest over ranks and steps
    NodeStatsMap nodes;                 // this rank, summed over the measured steps
    // Flex runs: this rank's inter-node token copies (moe/flex_layout.h), summed over the
    // measured steps; zero for alltoall.
    moe::flex::InterNodeCopies inter_node_copies;
    // This rank's routed rows per layer and expert (model/transformer_layer.h LayerStepStats),
    // summed over the measured steps; [layer] empty for dense layers, all empty with PP > 1.
    std::vector<std::vector<int64_t>> routed_counts;
    std::vector<std::vector<runtime::TaskRecord>> measured_records;  // this rank, per step
    std::vector<schedule::NodeCall> calls;
    std::vector<train::OptimizerOp> optimizer_ops;  // the optimizer step's pieces, in issue order
    CallDurations durations;                        // this rank: medians over measured steps

    Summary step_time_s;
    double tokens_per_s = 0, tflops_per_rank = 0;          // at the median step time
    double compute_s = 0, comm_s = 0, exposed_comm_s = 0;  // medians
    double comm_cpu_s = 0;  // median CPU time of the comm stream's thread (largest rank)
    std::optional<double> critical_path_bound_s;  // overlap runs: largest over ranks
    std::optional<double> overlap_efficiency;
    std::optional<double> speedup_vs_baseline;  // baseline median / this median
    // train/param_checksum.h after the last step of each repeat.
    std::vector<std::string> param_checksums;  // [repeat]
    // Every repeat the same losses, grad norms and final parameters, bit for bit.
    bool repeats_identical = true;
    bool losses_match_baseline = true;
    bool grad_norms_match_baseline = true;
    bool params_match_baseline = true;
    std::string baseline_differences;  // "" or what differs (metrics.h compare_bits)
};

struct BenchResult {
    std::filesystem::path run_dir;
    std::string command_line;  // BenchOptions::command_line, or rank 0's own
    config::Config config;     // the subject: what --moe_a2a_overlap / the config selects
    bool proxy = false;
    std::vector<ScheduleRun> runs;
    std::optional<LinkCalibration> calibration;
    int repeats = 1;
    int warmup_steps = 0;
    bool loss_bitwise_identical = true;  // every run's losses and repeats as the baseline's
    // Losses, grad norms and final parameters of every run and repeat as the baseline's.
    bool bitwise_identical = true;
    std::optional<double> overlap_speedup;     // baseline median / "overlap" median
    std::optional<double> overlap_efficiency;  // of the "overlap" run
    double wall_s = 0;
};

// The finalized, runtime-valid configuration of the subject run for the MPI job `job`, or an
// epo::Error whose message lists each problem with its id and fix. Refuses
// --moe_flex_dispatcher_backend deepep|hybridep when the device's gating falls back to alltoall:
// running alltoall under flex's name would measure something else. Same on every rank; no MPI
// needed.
config::Config check_bench_config(const BenchOptions& options, const comm::JobShape& job);

// The validation warnings of the schedules the bench will run (W012: one micro-batch, nothing
// to overlap; ...), each id and field once, as `epo validate` prints them; "" without any. Rank 0
// prints them before the runs.
std::string bench_warnings(const BenchOptions& options, const comm::JobShape& job);

// Collective over MPI_COMM_WORLD. `log` receives rank 0's progress; every rank also writes its
// own log to <run_dir>/logs/rank-R.log.
BenchResult run_bench(const BenchOptions& options, std::ostream& log);

}  // namespace epo::bench
