#include "epo/train/train_run.h"

#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <ostream>

#include "epo/checkpoint/checkpoint.h"
#include "epo/checkpoint/rank_agreement.h"
#include "epo/checkpoint/start_checks.h"
#include "epo/checkpoint/stop_signal.h"
#include "epo/comm/launch.h"
#include "epo/comm/mpi_runtime.h"
#include "epo/comm/rank_runner.h"
#include "epo/config/memory_estimate.h"
#include "epo/config/validate.h"
#include "epo/config/yaml_io.h"
#include "epo/train/memory_plan.h"
#include "epo/train/nonfinite.h"
#include "epo/train/train_log.h"

namespace epo::train {
namespace {

// The loss and the grad norm are reduced over the ranks, so every rank takes the same branch.
void check_finite(const StepResult& r, comm::Communicator& control) {
    if (std::isfinite(r.lm_loss) && std::isfinite(r.grad_norm))
        return;
    throw nonfinite_step_error(r.step, r.lm_loss, r.grad_norm,
                               checkpoint::all_gather_strings(control, r.first_nonfinite_grad));
}

// Start-up checks, before the trainer allocates anything and before the first step: the memory
// the ranks of this host need (config/memory_estimate.h) against what the machine has, and the
// checkpoint paths. Every rank checks on its own (no rank waits on another to learn the verdict),
// then the ranks agree through the control communicator, a collective with a deadline, so a problem
// one rank sees stops all of them at once with its message (formerly rank 0 said "not a directory"
// and the others waited comm.timeout_s for it, then reported a false communication error).
// Returns the checkpoint to load, the same on every rank.
std::optional<std::filesystem::path> start_up_checks(const config::Config& cfg,
                                                     const comm::JobShape& job,
                                                     comm::Communicator& control) {
    std::optional<std::filesystem::path> found;
    std::exception_ptr failure;
    try {
        config::check_memory_fits(estimate_run_memory(cfg),
                                  job.ranks_per_host > 0 ? job.ranks_per_host : job.world_size,
                                  config::available_memory_bytes());
        if (cfg.checkpoint.save)
            checkpoint::check_save_dir_writable(*cfg.checkpoint.save);
        if (cfg.checkpoint.load) {
            const std::filesystem::path load = *cfg.checkpoint.load;
            found = checkpoint::find_latest_checkpoint(load);
            // A load directory that does not exist is the first run of a restartable job only
            // when it is also where the run saves; anything else is a typo that would silently
            // start from iteration 0.
            const bool restartable =
                cfg.checkpoint.save && std::filesystem::path(*cfg.checkpoint.save) == load;
            if (!found && !std::filesystem::exists(load) && !restartable) {
                throw Error(ErrorKind::kConfig,
                            fmt::format("checkpoint.load = '{}' does not exist; give the "
                                        "directory checkpoints were saved to, or set "
                                        "checkpoint.load to the checkpoint.save directory to make "
                                        "a first run that finds nothing start from iteration 0",
                                        load.string()));
            }
        }
    } catch (...) {
        failure = std::current_exception();
    }
    checkpoint::agree_on_success(control, failure);
    const std::string agreed =
        checkpoint::broadcast_string(control, found ? found->string() : std::string(), 0);
    if (agreed.empty())
        return std::nullopt;
    return std::filesystem::path(agreed);
}

// checkpoint.load: every rank loads the checkpoint the start-up checks found.
void resume(Trainer& trainer, const config::Config& cfg,
            const std::optional<std::filesystem::path>& found, comm::Communicator& control,
            std::ostream& log) {
    const int rank = control.rank();
    if (!found) {
        if (rank == 0)
            log << fmt::format("no checkpoint in '{}' (checkpoint.load): starting from iteration 0",
                               *cfg.checkpoint.load)
                << std::endl;
        return;
    }
    const auto start = std::chrono::steady_clock::now();
    trainer.load_checkpoint(*found, control);
    if (rank == 0) {
        log << fmt::format(
                   "successfully loaded checkpoint from {} at iteration {} [ {:.2f} s ]",
                   found->string(), trainer.steps_done(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count())
            << std::endl;
    }
}

std::filesystem::path save(Trainer& trainer, const config::Config& cfg, comm::Communicator& control,
                           std::ostream& log) {
    const auto start = std::chrono::steady_clock::now();
    std::filesystem::path dir = trainer.save_checkpoint(*cfg.checkpoint.save, control);
    if (control.rank() == 0) {
        log << fmt::format(
                   "successfully saved checkpoint from iteration {} to {} [ {:.2f} s ]",
                   trainer.steps_done(), dir.string(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count())
            << std::endl;
    }
    return dir;
}

}  // namespace

config::ValidationReport prepare_run_config(const config::ConfigSources& sources,
                                            const comm::JobShape& job) {
    config::BuiltConfig built = config::build_config(sources);
    // What the configuration leaves unstated comes from the job: `mpirun -np 4 epo train` runs
    // 4 ranks on one node, `mpirun -H a,b` 2 nodes. A stated topology must match the job.
    const std::optional<config::Finding> unresolved =
        config::resolve_topology(built.config.comm, job.world_size, job.ranks_per_host);
    config::ValidationReport report = config::validate(built);
    config::promote_runtime_findings(report);
    if (unresolved) {
        report.errors.push_back(*unresolved);
    } else if (auto f = config::check_world_size(report.config, job.world_size)) {
        report.errors.push_back(*f);
    }
    return report;
}

TrainRunResult run_training(const TrainRunOptions& options, std::ostream& log) {
    comm::check_omp_num_threads(std::getenv("OMP_NUM_THREADS"));  // before any kernel runs
    const int rank = comm::current_world_rank();
    const comm::JobShape job = comm::current_job_shape();
    const config::ValidationReport report = prepare_run_config(options.sources, job);
    if (!report.ok()) {
        std::string ids;
        for (const auto& e : report.errors)
            ids += (ids.empty() ? "" : ", ") + e.id;
        throw Error(ErrorKind::kConfig,
                    fmt::format("the configuration cannot run on this runtime ({}):\n{}", ids,
                                config::format_findings(report)));
    }
    TrainRunResult result;
    result.config = report.config;
    result.run_dir = agree_on_run_dir(options.out_dir, report.config, "");
    if (rank == 0) {
        std::filesystem::create_directories(result.run_dir);
        config::save_yaml(report.config, result.run_dir / "config.yaml");
        log << config::format_run_log(report) << std::flush;
        if (const std::string w = comm::omp_oversubscription_warning(job.ranks_per_host);
            !w.empty())
            log << w << "\n" << std::flush;
    }

    const config::Config& cfg = report.config;
    // Before anything slow, so that a signal during start-up is a stop request too.
    checkpoint::StopSignals stop_signals(rank, comm::current_world_size());
    comm::Communicator control = checkpoint::make_control_communicator(
        comm::ParallelLayout{.world_size = comm::current_world_size(),
                             .expert_model_parallel_size = cfg.model.expert_model_parallel_size,
                             .gpus_per_node = config::gpus_per_node(cfg.comm)},
        cfg.comm.timeout_s);
    const std::optional<std::filesystem::path> to_load = start_up_checks(cfg, job, control);
    Trainer trainer(report.config, TrainerOptions{.keep_records = options.keep_records});
    if (cfg.checkpoint.load)
        resume(trainer, cfg, to_load, control, log);
    result.first_iteration = trainer.steps_done() + 1;
    const int64_t iters = cfg.train.train_iters;
    const int64_t gbs = config::global_batch_size(cfg);
    const int interval = cfg.checkpoint.save_interval.value_or(0);
    for (int64_t i = trainer.steps_done(); i < iters; ++i) {
        if (options.before_step)
            options.before_step(trainer);
        StepResult r = trainer.step();
        check_finite(r, control);
        if (rank == 0 &&
            (r.step == 1 || r.step % std::max(1, cfg.train.log_interval) == 0 || r.step == iters)) {
            const double tflops =
                trainer.step_flops() / r.step_time_s / trainer.world_size() / 1e12;
            IterationLog line{.iteration = r.step,
                              .train_iters = iters,
                              .consumed_samples = r.step * gbs,
                              .elapsed_ms = r.step_time_s * 1e3,
                              .tflops_per_rank = tflops,
                              .learning_rate = r.learning_rate,
                              .global_batch_size = gbs,
                              .lm_loss = r.lm_loss,
                              .mtp_loss = r.mtp_loss,
                              .load_balancing_loss = r.load_balancing_loss,
                              .grad_norm = r.grad_norm};
            log << format_iteration_line(line) << "\n"
                << format_step_time_line(r.step_time_s, tflops) << std::endl;
        }
        if (options.on_step)
            options.on_step(trainer, r);
        result.steps.push_back(std::move(r));

        // Every rank learns at the same step boundary whether any rank was asked to stop.
        const checkpoint::StopRequest stop =
            checkpoint::agree_on_stop(control, stop_signals.pending());
        const int64_t done = trainer.steps_done();
        if (cfg.checkpoint.save &&
            (stop.requested() || done == iters || (interval > 0 && done % interval == 0))) {
            result.last_checkpoint = save(trainer, cfg, control, log);
        }
        if (stop.requested()) {
            result.stopped_by_signal = true;
            if (rank == 0) {
                log << fmt::format(
                           "exiting at iteration {}: rank {} received {}; {}", done, stop.rank,
                           checkpoint::signal_name(stop.signal),
                           cfg.checkpoint.save
                               ? fmt::format("resume with checkpoint.load={}", *cfg.checkpoint.save)
                               : std::string("nothing saved (checkpoint.save is not set)"))
                    << std::endl;
            }
            break;
        }
    }
    return result;
}

std::filesystem::path agree_on_run_dir(const std::optional<std::filesystem::path>& out_dir,
                                       const config::Config& cfg, std::string_view kind) {
    std::string path;
    if (comm::current_world_rank() == 0) {
        if (out_dir) {
            path = out_dir->string();
        } else {
            const std::time_t now = std::time(nullptr);
            std::tm local{};
            localtime_r(&now, &local);
            char stamp[32];
            std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
            path = (std::filesystem::path(cfg.logger.log_dir) /
                    fmt::format("{}-{}{}", stamp, kind, cfg.recipe.value_or("run")))
                       .string();
        }
    }
    comm::watched_world_call("broadcast of the run directory", cfg.comm.timeout_s, [&] {
        int length = static_cast<int>(path.size());
        comm::check_mpi(MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD),
                        "broadcast of the run dir");
        path.resize(static_cast<size_t>(length));
        comm::check_mpi(MPI_Bcast(path.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD),
                        "broadcast of the run dir");
    });
    return path;
}

}  // namespace epo::train
