// The launcher side of `epo bench`: what the command checks and decides on this host before any
// rank starts (how many ranks, whether --out may be written) and after the job ends (marking a
// run that a signal stopped).
#pragma once

#include <filesystem>

#include "epo/config/config.h"

namespace epo::bench {

// How many ranks `epo bench` starts on this host for a built configuration: comm.num_nodes x
// comm.gpus_per_node where stated; an unstated comm.num_nodes is 1 and an unstated
// comm.gpus_per_node what the model-parallel and expert-parallel sizes need at least
// (TP x PP x CP x EP over the nodes). Raises epo::Error (kUsage) above kMaxLocalRanks.
inline constexpr int kMaxLocalRanks = 256;
int launch_world_size(const config::Config& built);

// --out DIR must name a directory that does not exist yet or is empty: a run never writes into
// another run's directory (its metrics, report and trace would be replaced and its configs/ and
// logs/ mixed with the new ones). kUsage naming the directory and the fix otherwise. Local.
void check_out_dir_unused(const std::filesystem::path& dir);

// A run directory whose job was stopped before it finished (SIGTERM, SIGINT or SIGHUP to
// `epo bench`) holds a file of this name saying so; `epo check-run` reports it. Its metrics,
// report and trace, if any, are missing or partial.
inline constexpr const char* kStoppedMarker = "STOPPED";
// Writes that file (`signal` names the signal, `status` the launcher's exit status); returns
// false when the directory does not exist (the ranks never created it: nothing to mark).
bool mark_run_stopped(const std::filesystem::path& dir, int signal, int status);

}  // namespace epo::bench
