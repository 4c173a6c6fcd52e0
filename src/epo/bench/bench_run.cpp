#include "epo/bench/bench_run.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <ostream>

#include "epo/bench/trace.h"
#include "epo/checkpoint/stop_signal.h"
#include "epo/comm/launch.h"
#include "epo/comm/link_limits.h"
#include "epo/comm/mpi_runtime.h"
#include "epo/comm/rank_runner.h"
#include "epo/config/memory_estimate.h"
#include "epo/config/report.h"
#include "epo/config/yaml_io.h"
#include "epo/core/error.h"
#include "epo/moe/flex_dispatcher.h"
#include "epo/schedule/pipeline_schedule.h"
#include "epo/schedule/schedule.h"
#include "epo/train/memory_plan.h"
#include "epo/train/param_checksum.h"
#include "epo/train/train_run.h"
#include "epo/train/trainer.h"

namespace epo::bench {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string format_duration(double s) {
    const int total = static_cast<int>(std::lround(std::max(0.0, s)));
    return total >= 60 ? fmt::format("{}m{:02d}s", total / 60, total % 60)
                       : fmt::format("{}s", total);
}

config::ConfigSources sources_for(const BenchOptions& options, const BenchSchedule* schedule,
                                  const std::vector<std::string>& extra) {
    config::ConfigSources s = with_bench_model(options.sources);
    if (schedule) {
        // Last, so the schedule under comparison wins over the user's own overlap settings.
        s.overrides.push_back(fmt::format("comm_overlap.overlap_moe_expert_parallel_comm={}",
                                          schedule->overlap ? "true" : "false"));
        s.overrides.push_back(fmt::format("comm_overlap.delay_wgrad_compute={}",
                                          schedule->delay_wgrad ? "true" : "false"));
        // The reference's rule (EP011): EP overlap excludes shared-expert overlap, so the
        // overlap rows run the shared expert inside pre_dispatch; the report says so when the
        // configuration asked for it (format_table's shared-expert note).
        if (schedule->overlap)
            s.overrides.push_back("model.moe_shared_expert_overlap=false");
    }
    s.overrides.insert(s.overrides.end(), extra.begin(), extra.end());
    return s;
}

config::Config finalized_or_throw(const config::ConfigSources& sources, const comm::JobShape& job,
                                  const std::string& what) {
    const config::ValidationReport report = train::prepare_run_config(sources, job);
    if (!report.ok()) {
        std::string ids;
        for (const auto& e : report.errors) {
            ids += (ids.empty() ? "" : ", ") + e.id;
        }
        throw Error(
            ErrorKind::kConfig,
            fmt::format("{}the configuration cannot run on this runtime ({}):\n{}",
                        what.empty() ? "" : what + ": ", ids, config::format_findings(report)));
    }
    return report.config;
}

std::string schedule_name_of(const config::Config& cfg) {
    if (!cfg.model.overlap_moe_expert_parallel_comm) {
        return "baseline";
    }
    return cfg.model.delay_wgrad_compute ? "overlap+delay_wgrad" : "overlap";
}

// One rank's log file and, on rank 0, the progress stream.
struct Logs {
    std::ofstream rank_file;
    std::ostream* progress = nullptr;  // rank 0 only

    void both(const std::string& line) {
        rank_file << line << "\n" << std::flush;
        if (progress) {
            *progress << line << "\n" << std::flush;
        }
    }
};

}  // namespace

std::optional<double> calibration_ratio(const BenchOptions& options, bool proxy) {
    if (options.comm_compute_ratio || !proxy) {
        return options.comm_compute_ratio;
    }
    const auto& overrides = options.sources.overrides;
    const bool link_given =
        std::any_of(overrides.begin(), overrides.end(),
                    [](const std::string& o) { return o.rfind("comm.link.", 0) == 0; });
    if (link_given) {
        return std::nullopt;
    }
    return 1.0;  // the embedded default studies a balanced cluster
}

namespace {

// The step's routing (bench_run.h ScheduleRun::routed_counts). With PP > 1 each stage holds its
// own layers; the expert load is then not recorded.
void add_routed_counts(ScheduleRun& run, train::Trainer& trainer) {
    if (run.config.model.pipeline_model_parallel_size > 1)
        return;
    const std::vector<model::LayerStepStats>& stats = trainer.model().layer_stats();
    const std::vector<bool>& moe = trainer.shape().moe_layers;
    run.routed_counts.resize(stats.size());
    for (size_t l = 0; l < stats.size(); ++l) {
        if (l >= moe.size() || !moe[l])
            continue;
        const std::vector<int64_t>& c = stats[l].routed_counts;
        std::vector<int64_t>& sum = run.routed_counts[l];
        sum.resize(c.size(), 0);
        for (size_t e = 0; e < c.size(); ++e)
            sum[e] += c[e];
    }
}

// With pipeline stages: each schedule's bubble, the compute stream's idle time per step (step
// time minus its busy time, averaged over ranks; medians over the measured steps), as a fraction
// of the busy time next to the interleaved schedule's ideal (p - 1) / (v m). The idle time also
// holds any exposed communication, so at PP = 1 it is not zero either.
void log_pipeline_bubbles(const BenchResult& result, Logs& logs) {
    for (const ScheduleRun& r : result.runs) {
        const config::ModelConfig& m = r.config.model;
        if (m.pipeline_model_parallel_size <= 1 || r.measured.empty())
            continue;
        std::vector<double> idle, busy;
        for (const StepMetrics& step : r.measured) {
            double i = 0, b = 0;
            for (const RankStepMetrics& rank : step.ranks) {
                i += rank.step_time_s - rank.compute_busy_s;
                b += rank.compute_busy_s;
            }
            const auto n = static_cast<double>(std::max<size_t>(step.ranks.size(), 1));
            idle.push_back(i / n);
            busy.push_back(b / n);
        }
        const schedule::PipelineShape shape{
            .num_stages = m.pipeline_model_parallel_size,
            .num_chunks = config::virtual_pipeline_size(m),
            .num_micro_batches = static_cast<int>(config::num_microbatches(r.config))};
        const double idle_s = summarize(idle).median, busy_s = summarize(busy).median;
        logs.both(fmt::format(
            "[bench] pipeline bubble, {} (PP {}, VPP {}, {} micro-batches): compute idle {:.3f} "
            "s/step = {:.3f} of its busy {:.3f} s; ideal (p - 1) / (v m) = {:.3f}",
            r.schedule.name, shape.num_stages, shape.num_chunks, shape.num_micro_batches, idle_s,
            busy_s > 0 ? idle_s / busy_s : 0.0, busy_s, schedule::ideal_bubble_fraction(shape)));
    }
}

// Fills the derived fields of every run once all are measured. Collective (bound, node stats).
void derive(BenchResult& result) {
    const ScheduleRun* base = nullptr;
    for (const ScheduleRun& r : result.runs) {
        if (r.schedule.name == "baseline") {
            base = &r;
        }
    }
    for (ScheduleRun& r : result.runs) {
        std::vector<double> step, compute, comm_s, exposed, comm_cpu;
        for (const StepMetrics& m : r.measured) {
            step.push_back(m.step_time_s);
            compute.push_back(m.compute_busy_s);
            comm_s.push_back(m.comm_busy_s);
            exposed.push_back(m.exposed_comm_s);
            comm_cpu.push_back(m.comm_cpu_s);
            r.peak_activation_bytes = std::max(r.peak_activation_bytes, m.peak_activation_bytes);
        }
        r.step_time_s = summarize(step);
        r.compute_s = summarize(compute).median;
        r.comm_s = summarize(comm_s).median;
        r.exposed_comm_s = summarize(exposed).median;
        r.comm_cpu_s = summarize(comm_cpu).median;
        if (r.step_time_s.median > 0 && !r.measured.empty()) {
            const StepMetrics& m = r.measured.front();
            r.tokens_per_s = m.tokens_per_s * m.step_time_s / r.step_time_s.median;
            r.tflops_per_rank = m.tflops_per_rank * m.step_time_s / r.step_time_s.median;
        }
        // Bit for bit, on the losses, the grad norms and the final parameters (metrics.h).
        const auto bits_of = [](const ScheduleRun& run, size_t rep) {
            return RunBits{run.losses[rep], run.grad_norms[rep],
                           rep < run.param_checksums.size() ? run.param_checksums[rep] : ""};
        };
        for (size_t rep = 1; rep < r.losses.size(); ++rep) {
            r.repeats_identical =
                r.repeats_identical && compare_bits(bits_of(r, 0), bits_of(r, rep)).all();
        }
        if (base && !base->losses.empty() && !r.losses.empty()) {
            const BitComparison c = compare_bits(bits_of(*base, 0), bits_of(r, 0));
            r.losses_match_baseline = c.losses;
            r.grad_norms_match_baseline = c.grad_norms;
            r.params_match_baseline = c.params;
            r.baseline_differences = c.differences;
        }
        if (base && &r != base && r.schedule.overlap && !r.durations.empty()) {
            r.critical_path_bound_s = max_over_ranks(
                critical_path_bound_s(r.calls, base->durations, r.durations, r.optimizer_ops),
                result.config.comm.timeout_s);
            r.overlap_efficiency = overlap_efficiency(
                base->step_time_s.median, r.step_time_s.median, *r.critical_path_bound_s);
        }
        if (base && r.step_time_s.median > 0) {
            r.speedup_vs_baseline = base->step_time_s.median / r.step_time_s.median;
        }
    }
    for (const ScheduleRun& r : result.runs) {
        result.loss_bitwise_identical =
            result.loss_bitwise_identical && r.losses_match_baseline && r.repeats_identical;
        result.bitwise_identical = result.bitwise_identical && r.losses_match_baseline &&
                                   r.grad_norms_match_baseline && r.params_match_baseline &&
                                   r.repeats_identical;
        if (r.schedule.name == "overlap" && base) {
            result.overlap_speedup = r.speedup_vs_baseline;
            result.overlap_efficiency = r.overlap_efficiency;
        }
    }
}

}  // namespace

const std::vector<BenchSchedule>& compare_schedules() {
    static const std::vector<BenchSchedule> s = {
        {"baseline", false, false}, {"overlap", true, false}, {"overlap+delay_wgrad", true, true}};
    return s;
}

config::Config check_bench_config(const BenchOptions& options, const comm::JobShape& job) {
    comm::check_omp_num_threads(std::getenv("OMP_NUM_THREADS"));  // before any kernel runs
    if (const auto& r = options.comm_compute_ratio; r && (!(*r >= 0) || !std::isfinite(*r))) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("--comm_compute_ratio {}: give a positive number (1 = the "
                                "baseline's communication as long as its compute) or 0 (link "
                                "model off: communication as this machine does it)",
                                *r));
    }
    if (options.repeats < 0 || options.warmup_steps < 0) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("--repeats {} / --warmup_steps {}: give 0 or more", options.repeats,
                                options.warmup_steps));
    }
    const config::Config cfg = finalized_or_throw(sources_for(options, nullptr, {}), job, "");
    // A flex benchmark that fell back to alltoall (a device whose gating refuses the backend,
    // W007) would measure alltoall under flex's name: refused.
    const auto& flex = options.sources.harness.moe_flex_dispatcher_backend;
    if (flex && flex->has_value() &&
        cfg.model.moe_token_dispatcher_type != config::DispatcherType::kFlex) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("--moe_flex_dispatcher_backend {}: the target device does not "
                                "admit this flex backend, so the run would fall back to alltoall "
                                "and measure alltoall under flex's name; choose a device that "
                                "admits it (env.gpu, e.g. cpu) or drop the flag",
                                **flex));
    }
    if (options.warmup_steps >= cfg.train.train_iters) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("--warmup_steps {} leaves none of the {} steps "
                                "(train.train_iters / --max_steps) to measure; raise --max_steps "
                                "or lower --warmup_steps",
                                options.warmup_steps, cfg.train.train_iters));
    }
    if (options.compare) {
        for (const BenchSchedule& s : compare_schedules()) {
            finalized_or_throw(sources_for(options, &s, {}), job, s.name);
        }
    }
    // Before any allocation, and in the launcher before any rank starts: the overlap schedule of
    // --compare holds two micro-batches' activations.
    config::Config memory_cfg = cfg;
    memory_cfg.model.overlap_moe_expert_parallel_comm |= options.compare;
    config::check_memory_fits(train::estimate_run_memory(memory_cfg),
                              job.ranks_per_host > 0 ? job.ranks_per_host : job.world_size,
                              config::available_memory_bytes());
    return cfg;
}

std::string bench_warnings(const BenchOptions& options, const comm::JobShape& job) {
    std::vector<BenchSchedule> schedules = compare_schedules();
    if (!options.compare)
        schedules.clear();
    config::ValidationReport all;
    all.target = "epo cpu runtime, the schedules this bench runs";
    const auto add = [&](const config::ConfigSources& sources) {
        const config::ValidationReport report = train::prepare_run_config(sources, job);
        for (const config::Finding& w : report.warnings) {
            const bool seen = std::any_of(
                all.warnings.begin(), all.warnings.end(),
                [&](const config::Finding& f) { return f.id == w.id && f.field == w.field; });
            if (!seen)
                all.warnings.push_back(w);
        }
    };
    add(sources_for(options, nullptr, {}));
    for (const BenchSchedule& s : schedules)
        add(sources_for(options, &s, {}));
    return all.warnings.empty() ? "" : config::format_findings(all);
}

BenchResult run_bench(const BenchOptions& options, std::ostream& log) {
    const auto t0 = Clock::now();
    const int rank = comm::current_world_rank();
    const comm::JobShape job = comm::current_job_shape();
    if (rank == 0) {
        if (const std::string w = comm::omp_oversubscription_warning(job.ranks_per_host);
            !w.empty())
            log << w << "\n" << std::flush;
    }
    BenchResult result;
    result.config = check_bench_config(options, job);
    // What `epo validate` warns of for the same flags (W012: nothing to overlap), before the
    // numbers it qualifies.
    if (rank == 0) {
        if (const std::string w = bench_warnings(options, job); !w.empty())
            log << w << std::flush;
    }
    with_bench_model(options.sources, &result.proxy);
    // Every rank looks before any creates anything (the reduction orders the two), so all reach
    // the same verdict on --out and none waits alone.
    int out_in_use = 0;
    std::string out_problem;
    if (options.out_dir) {
        try {
            check_out_dir_unused(*options.out_dir);
        } catch (const Error& e) {
            out_in_use = 1;
            out_problem = e.what();
        }
    }
    comm::watched_world_call("agreeing on --out", result.config.comm.timeout_s, [&] {
        comm::check_mpi(
            MPI_Allreduce(MPI_IN_PLACE, &out_in_use, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD),
            "agreeing on --out");
    });
    if (out_in_use) {
        throw Error(ErrorKind::kUsage,
                    out_problem.empty() ? fmt::format("--out {}: not a new or empty directory on "
                                                      "another rank",
                                                      options.out_dir->string())
                                        : out_problem);
    }
    result.run_dir = train::agree_on_run_dir(options.out_dir, result.config, "bench-");
    if (rank == 0) {
        std::filesystem::create_directories(result.run_dir / "logs");
    }
    comm::watched_world_call(
        "waiting for rank 0 to create the run directory", result.config.comm.timeout_s,
        [] { comm::check_mpi(MPI_Barrier(MPI_COMM_WORLD), "waiting for the run directory"); });
    Logs logs;
    logs.rank_file.open(result.run_dir / "logs" / fmt::format("rank-{}.log", rank));
    if (!logs.rank_file) {
        throw Error(ErrorKind::kIo, fmt::format("cannot write logs under '{}'; give a writable "
                                                "--out directory",
                                                result.run_dir.string()));
    }
    if (rank == 0) {
        logs.progress = &log;
    }

    const std::optional<double> ratio = calibration_ratio(options, result.proxy);
    std::vector<std::string> link;
    if (ratio && *ratio > 0) {
        const BenchSchedule base{"baseline", false, false};
        const config::Config link_off = finalized_or_throw(
            sources_for(options, &base, link_overrides(LinkCalibration{})), job, "calibration");
        const config::Config user = finalized_or_throw(sources_for(options, &base, {}), job, "run");
        result.calibration = calibrate_link(link_off, user, *ratio, options.warmup_steps,
                                            [&](const std::string& line) { logs.both(line); });
        link = link_overrides(*result.calibration);
    } else if (ratio) {
        // --comm_compute_ratio 0: the link model off, whatever the configuration says.
        link = link_overrides(LinkCalibration{});
    }

    std::vector<BenchSchedule> schedules;
    if (options.compare) {
        schedules = compare_schedules();
    } else {
        const std::string name = schedule_name_of(result.config);
        for (const BenchSchedule& s : compare_schedules()) {
            if (s.name == name) {
                schedules.push_back(s);
            }
        }
    }
    for (const BenchSchedule& s : schedules) {
        ScheduleRun run;
        run.schedule = s;
        run.config = finalized_or_throw(sources_for(options, &s, link), job, s.name);
        if (rank == 0) {
            config::ValidationReport report;
            report.config = run.config;
            report.target = "epo cpu runtime";
            logs.rank_file << "# run: " << s.name << "\n" << config::format_run_log(report);
            std::filesystem::create_directories(result.run_dir / "configs");
            config::save_yaml(run.config, result.run_dir / "configs" / (s.name + ".yaml"));
        }
        result.runs.push_back(std::move(run));
    }
    // The subject's finalized configuration, with the link settings the runs used.
    result.config = result.runs.back().config;
    if (rank == 0) {
        config::save_yaml(result.config, result.run_dir / "config.yaml");
    }

    result.command_line = options.command_line;
    result.repeats = options.repeats > 0 ? options.repeats : (options.compare ? 2 : 1);
    result.warmup_steps = options.warmup_steps;
    const int64_t steps = result.config.train.train_iters;
    const int64_t total_steps = steps * result.repeats * static_cast<int64_t>(result.runs.size());
    int64_t steps_done = 0;
    const auto measure_t0 = Clock::now();
    const size_t n = result.runs.size();
    for (int rep = 0; rep < result.repeats; ++rep) {
        for (size_t k = 0; k < n; ++k) {
            // Rotate the order so no schedule always runs first (or right after another).
            ScheduleRun& run = result.runs[(k + static_cast<size_t>(rep)) % n];
            reset_peak_rss();
            train::Trainer trainer(run.config, {.keep_records = true});
            run.calls = trainer.schedule_calls();
            run.optimizer_ops = trainer.optimizer_ops();
            const StepWork work = step_work(run.config, trainer);
            run.losses.emplace_back();
            run.grad_norms.emplace_back();
            run.steps_planned += steps;
            for (int64_t i = 0; i < steps; ++i) {
                const moe::flex::InterNodeCopies copies0 = moe::inter_node_copies_total();
                train::StepResult r = trainer.step();
                const moe::flex::InterNodeCopies copies = moe::inter_node_copies_total() - copies0;
                const StepMetrics m = gather_step_metrics(work, r);
                run.losses.back().push_back(r.lm_loss);
                run.grad_norms.back().push_back(r.grad_norm);
                run.steps_completed += 1;
                run.peak_rss_bytes = std::max(run.peak_rss_bytes, m.peak_rss_bytes);
                ++steps_done;
                const bool warm_up = i < options.warmup_steps;
                if (!warm_up) {
                    run.measured.push_back(m);
                    add_node_stats(run.nodes, r.records);
                    run.inter_node_copies += copies;
                    add_routed_counts(run, trainer);
                    run.measured_records.push_back(std::move(r.records));
                }
                const double elapsed = since(measure_t0);
                const double left = elapsed / static_cast<double>(steps_done) *
                                    static_cast<double>(total_steps - steps_done);
                logs.rank_file << fmt::format(
                    "{} repeat {} step {}: {:.4f} s (this rank {:.4f} s, compute {:.4f}, comm "
                    "{:.4f}, exposed {:.4f}, comm thread CPU {:.4f}), loss {:.6f}{}\n",
                    run.schedule.name, rep + 1, i + 1, m.step_time_s,
                    m.ranks[static_cast<size_t>(rank)].step_time_s,
                    m.ranks[static_cast<size_t>(rank)].compute_busy_s,
                    m.ranks[static_cast<size_t>(rank)].comm_busy_s,
                    m.ranks[static_cast<size_t>(rank)].exposed_comm_s,
                    m.ranks[static_cast<size_t>(rank)].comm_cpu_s, r.lm_loss,
                    warm_up ? " (warm-up)" : "");
                if (logs.progress) {
                    *logs.progress
                        << fmt::format(
                               "[bench] {:<20} repeat {}/{} step {}/{}: {:.3f} s{}  ({}/{} steps, "
                               "elapsed {}, about {} left)\n",
                               run.schedule.name, rep + 1, result.repeats, i + 1, steps,
                               m.step_time_s, warm_up ? " (warm-up)" : "", steps_done, total_steps,
                               format_duration(elapsed), format_duration(left))
                        << std::flush;
                }
            }
            // Collective; after the steps, outside every timing.
            run.param_checksums.push_back(
                train::final_param_checksum(trainer, run.config.comm.timeout_s));
        }
    }
    for (ScheduleRun& run : result.runs) {
        run.durations = median_call_durations(run.measured_records);
    }
    derive(result);
    log_pipeline_bubbles(result, logs);
    result.wall_s = since(t0);
    logs.rank_file << fmt::format("rank {} done: {} steps in {:.1f} s\n", rank, steps_done,
                                  result.wall_s)
                   << std::flush;
    return result;
}

}  // namespace epo::bench
