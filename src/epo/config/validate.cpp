#include "epo/config/validate.h"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>

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
    check_ep_overlap(ctx);
    check_delay_wgrad(ctx);
    check_flex(ctx, options.probe);
    report.warnings.insert(report.warnings.end(), finalize_warnings.begin(),
                           finalize_warnings.end());
    check_advisories(ctx);
    const std::vector<Finding> runtime = runtime_findings(report.config, options.runtime);
    report.warnings.insert(report.warnings.end(), runtime.begin(), runtime.end());

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
    const auto name = [](int level) -> const char* {
        if (level == MPI_THREAD_SINGLE)
            return "MPI_THREAD_SINGLE";
        if (level == MPI_THREAD_FUNNELED)
            return "MPI_THREAD_FUNNELED";
        if (level == MPI_THREAD_SERIALIZED)
            return "MPI_THREAD_SERIALIZED";
        return "an unknown level";
    };
    return Finding{"EP005", "MPI thread level", name(provided),
                   fmt::format("the MPI library granted {} but the communication stream needs "
                               "MPI_THREAD_MULTIPLE (two threads call MPI at once); overlap would "
                               "hang or corrupt messages",
                               name(provided)),
                   "use an MPI built with thread support (OpenMPI and MPICH from Debian are)"};
}

std::optional<Finding> check_world_size(const Config& config, int mpi_world_size) {
    const std::int64_t expected = world_size(config);
    if (expected == mpi_world_size) {
        return std::nullopt;
    }
    return Finding{
        "LY009", "comm.gpus_per_node", show(config.comm.gpus_per_node),
        fmt::format("the job has {} ranks but the configuration describes {} "
                    "(comm.num_nodes {} x comm.gpus_per_node {})",
                    mpi_world_size, expected, config.comm.num_nodes, config.comm.gpus_per_node),
        fmt::format("launch {} ranks (mpirun -np {}), or set comm.num_nodes / "
                    "comm.gpus_per_node (--num_nodes / --gpus_per_node) to match",
                    expected, expected)};
}

}  // namespace epo::config
