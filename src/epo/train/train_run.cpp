#include "epo/train/train_run.h"

#include <mpi.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <ostream>

#include "epo/comm/mpi_runtime.h"
#include "epo/config/validate.h"
#include "epo/config/yaml_io.h"
#include "epo/train/train_log.h"

namespace epo::train {
namespace {

// Rank 0 picks the run directory; every rank learns it.
std::filesystem::path agree_on_run_dir(const TrainRunOptions& options, const config::Config& cfg) {
    std::string path;
    if (comm::current_world_rank() == 0) {
        if (options.out_dir) {
            path = options.out_dir->string();
        } else {
            const std::time_t now = std::time(nullptr);
            std::tm local{};
            localtime_r(&now, &local);
            char stamp[32];
            std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
            path = (std::filesystem::path(cfg.logger.log_dir) /
                    fmt::format("{}-{}", stamp, cfg.recipe.value_or("run")))
                       .string();
        }
    }
    int length = static_cast<int>(path.size());
    comm::check_mpi(MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD), "broadcast of the run dir");
    path.resize(static_cast<size_t>(length));
    comm::check_mpi(MPI_Bcast(path.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD),
                    "broadcast of the run dir");
    return path;
}

void check_finite(const StepResult& r) {
    if (!std::isfinite(r.lm_loss) || !std::isfinite(r.grad_norm)) {
        throw Error(ErrorKind::kNumerics,
                    fmt::format("iteration {}: lm loss {} / grad norm {} is not finite; lower "
                                "optimizer.lr or raise optimizer.clip_grad's strictness",
                                r.step, r.lm_loss, r.grad_norm));
    }
}

}  // namespace

config::ValidationReport prepare_run_config(const config::ConfigSources& sources, int world_size) {
    config::BuiltConfig built = config::build_config(sources);
    config::Config& c = built.config;
    // Topology from the MPI job unless the command line named it: `mpirun -np 4 epo train`
    // runs 4 ranks on one node.
    if (!sources.harness.num_nodes && !sources.harness.gpus_per_node &&
        c.comm.num_nodes * c.comm.gpus_per_node != world_size && c.comm.num_nodes > 0 &&
        world_size % c.comm.num_nodes == 0) {
        c.comm.gpus_per_node = world_size / c.comm.num_nodes;
    }
    config::ValidationReport report = config::validate(built);
    config::promote_runtime_findings(report);
    if (auto f = config::check_world_size(report.config, world_size))
        report.errors.push_back(*f);
    return report;
}

TrainRunResult run_training(const TrainRunOptions& options, std::ostream& log) {
    const int rank = comm::current_world_rank();
    const config::ValidationReport report =
        prepare_run_config(options.sources, comm::current_world_size());
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
    result.run_dir = agree_on_run_dir(options, report.config);
    if (rank == 0) {
        std::filesystem::create_directories(result.run_dir);
        config::save_yaml(report.config, result.run_dir / "config.yaml");
        log << config::format_run_log(report) << std::flush;
    }

    Trainer trainer(report.config, TrainerOptions{.keep_records = options.keep_records});
    const config::Config& cfg = report.config;
    const int64_t iters = cfg.train.train_iters;
    const int64_t gbs = config::global_batch_size(cfg);
    for (int64_t i = 0; i < iters; ++i) {
        StepResult r = trainer.step();
        check_finite(r);
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
                              .load_balancing_loss = r.load_balancing_loss,
                              .grad_norm = r.grad_norm};
            log << format_iteration_line(line) << "\n"
                << format_step_time_line(r.step_time_s, tflops) << std::endl;
        }
        if (options.on_step)
            options.on_step(trainer, r);
        result.steps.push_back(std::move(r));
    }
    return result;
}

}  // namespace epo::train
