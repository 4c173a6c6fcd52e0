// Validation of a configuration: every rule of docs/config.md "Rules", all violations at once.
//
// validate() takes the configuration as built from its sources (builder.h), finalizes a copy
// (finalize.h), and runs every rule family on the pair (rules.h): errors (EP, WG, FX, LY, MO,
// VA, EN, TR, DS ids) and warnings (W ids, and the RT ids of features the epo runtime does not
// execute yet). The report carries the finalized configuration and the target it validated for.
// It reads no files and takes well under a millisecond per config.
//
// validate_for_run() is what `epo train` / `epo bench` call before any rank does work: the
// same, with the RT findings promoted to errors. check_mpi_thread_level() and check_world_size()
// are the start-up checks the runtime runs once MPI is up.
#pragma once

#include <optional>

#include "epo/config/builder.h"
#include "epo/config/config.h"
#include "epo/config/devices.h"
#include "epo/config/report.h"
#include "epo/config/runtime_support.h"

namespace epo::config {

struct ValidateOptions {
    RuntimeCapabilities runtime = RuntimeCapabilities::current();
    DeviceProbe probe;  // empty: the device table entry named by env.gpu
};

ValidationReport validate(const Config& config, const ValidateOptions& options = {});
// The same for a built config: the build's warnings (flex activation) come first.
ValidationReport validate(const BuiltConfig& built, const ValidateOptions& options = {});

// Moves every RT finding from the warnings to the errors.
void promote_runtime_findings(ValidationReport& report);

ValidationReport validate_for_run(const Config& config, const ValidateOptions& options = {});
ValidationReport validate_for_run(const BuiltConfig& built, const ValidateOptions& options = {});

// EP005 in its runtime form: the comm stream's worker calls MPI while the compute stream's
// worker does too, so the library must grant MPI_THREAD_MULTIPLE. `provided` is what
// MPI_Init_thread returned. An error finding when it falls short.
std::optional<Finding> check_mpi_thread_level(int provided);

// Fills in the topology a configuration leaves to the launcher, from the MPI job. Neither stated:
// comm.gpus_per_node is the number of ranks on each host (`ranks_per_host`, 0 when the hosts
// hold different numbers) and comm.num_nodes the world size over it. Only comm.num_nodes stated:
// comm.gpus_per_node = world size / num_nodes. Only comm.gpus_per_node stated: one node, as
// validation took it. LY009 when the job cannot be split that way; check_world_size() then
// checks the result against the job.
std::optional<Finding> resolve_topology(CommConfig& comm, int mpi_world_size, int ranks_per_host);

// LY009: the job has exactly comm.num_nodes x comm.gpus_per_node ranks.
std::optional<Finding> check_world_size(const Config& config, int mpi_world_size);

}  // namespace epo::config
