#include "epo/config/validate.h"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>

#include "epo/comm/mpi_runtime.h"
#include "epo/config/env.h"
#include "epo/config/finalize.h"
#include "epo/config/rules.h"

namespace epo::config {

ValidationReport validate(const Config& config, const ValidateOptions& options) {
    ValidationReport report;
    report.config = config;
    std::vector<Finding> finalize_warnings = finalize(report.config).warnings;

    const Target target = describe_target(config.env);
    report.target = target.description;
    const RuleContext ctx{config, report.config, target, report.errors, report.warnings};
    check_values(ctx);
    check_layout(ctx);
    check_moe(ctx);
    check_mcore(ctx);
    check_ep_overlap(ctx);
    check_delay_wgrad(ctx);
    check_flex(ctx, options.probe);
    report.warnings.insert(report.warnings.end(), finalize_warnings.begin(),
                           finalize_warnings.end());
    check_advisories(ctx);
    const std::vector<Finding> runtime = runtime_findings(report.config, options.runtime);
    report.warnings.insert(report.warnings.end(), runtime.begin(), runtime.end());

    if (!topology_stated(config.comm)) {
        report.notes.push_back(
            "no topology stated (comm.gpus_per_node, comm.num_nodes), so the world size is the "
            "launcher's: LY002, LY003, MC001, the data-parallel part of LY004, W011, W012 and the "
            "data-parallel defaults of comm_overlap (overlap_grad_reduce, overlap_param_gather) "
            "are checked when the job starts; pass --num_nodes and --gpus_per_node to check them "
            "now");
    }
    if (!target.has_torch && report.config.model.overlap_moe_expert_parallel_comm) {
        report.notes.push_back(
            "EP005 for the epo runtime: the MPI library must grant MPI_THREAD_MULTIPLE; checked "
            "when the job starts");
    }
    return report;
}

ValidationReport validate(const BuiltConfig& built, const ValidateOptions& options) {
    ValidationReport report = validate(built.config, options);
    report.warnings.insert(report.warnings.begin(), built.warnings.begin(), built.warnings.end());
    report.notes.insert(report.notes.begin(), built.notes.begin(), built.notes.end());
    return report;
}

void promote_runtime_findings(ValidationReport& report) {
    const auto is_runtime = [](const Finding& f) { return f.id.rfind("RT", 0) == 0; };
    for (const auto& f : report.warnings) {
        if (is_runtime(f)) {
            report.errors.push_back(f);
        }
    }
    report.warnings.erase(
        std::remove_if(report.warnings.begin(), report.warnings.end(), is_runtime),
        report.warnings.end());
}

ValidationReport validate_for_run(const Config& config, const ValidateOptions& options) {
    ValidationReport report = validate(config, options);
    promote_runtime_findings(report);
    return report;
}

ValidationReport validate_for_run(const BuiltConfig& built, const ValidateOptions& options) {
    ValidationReport report = validate(built, options);
    promote_runtime_findings(report);
    return report;
}

std::optional<Finding> check_mpi_thread_level(int provided) {
    if (provided >= MPI_THREAD_MULTIPLE) {
        return std::nullopt;
    }
    const char* const granted = comm::thread_level_name(provided);
    return Finding{"EP005", "MPI thread level", granted,
                   fmt::format("the MPI library granted {} but the communication stream needs "
                               "MPI_THREAD_MULTIPLE (two threads call MPI at once); overlap would "
                               "hang or corrupt messages",
                               granted),
                   "use an MPI built with thread support (OpenMPI and MPICH from Debian are)"};
}

std::optional<Finding> resolve_topology(CommConfig& comm, int mpi_world_size, int ranks_per_host) {
    const auto refuse = [&](std::string field, std::string value, std::string why) {
        return Finding{"LY009", std::move(field), std::move(value),
                       fmt::format("the job has {} ranks, but {}", mpi_world_size, why),
                       "state both comm.num_nodes and comm.gpus_per_node (--num_nodes / "
                       "--gpus_per_node) to match the job, or launch a matching number of ranks"};
    };
    if (comm.num_nodes && !comm.gpus_per_node) {
        if (*comm.num_nodes < 1 || mpi_world_size % *comm.num_nodes != 0) {
            return refuse(
                "comm.num_nodes", show(comm.num_nodes),
                fmt::format("they cannot be split evenly over comm.num_nodes {}", *comm.num_nodes));
        }
        comm.gpus_per_node = mpi_world_size / *comm.num_nodes;
    } else if (!comm.num_nodes && comm.gpus_per_node) {
        comm.num_nodes = 1;
    } else if (!comm.num_nodes && !comm.gpus_per_node) {
        if (ranks_per_host < 1 || mpi_world_size % ranks_per_host != 0) {
            return refuse("comm.gpus_per_node", "null",
                          "its hosts hold different numbers of ranks, so the ranks per node "
                          "cannot be taken from the hosts");
        }
        comm.gpus_per_node = ranks_per_host;
        comm.num_nodes = mpi_world_size / ranks_per_host;
    }
    return std::nullopt;
}

std::optional<Finding> check_world_size(const Config& config, int mpi_world_size) {
    const std::int64_t expected = world_size(config);
    if (expected == mpi_world_size) {
        return std::nullopt;
    }
    return Finding{"LY009", "comm.gpus_per_node", show(config.comm.gpus_per_node),
                   fmt::format("the job has {} ranks but the configuration describes {} "
                               "(comm.num_nodes {} x comm.gpus_per_node {})",
                               mpi_world_size, expected, show(config.comm.num_nodes),
                               show(config.comm.gpus_per_node)),
                   fmt::format("launch {} ranks (mpirun -np {}), or set comm.num_nodes / "
                               "comm.gpus_per_node (--num_nodes / --gpus_per_node) to match",
                               expected, expected)};
}

}  // namespace epo::config
