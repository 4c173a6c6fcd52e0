// Finalization of a configuration (docs/config.md "Finalization"): what a run actually uses,
// computed from what the user wrote.
//
// With a comm_overlap section:
//   1. The section holds the user's values (null = not said). TP overlap asked for but
//      impossible is switched off there with a warning naming the first reason that applies
//      (TP < 2: W001; sequence_parallel off: W002; no TP-overlap library, i.e. no declared TE
//      stack: W003); not given at all, it becomes false (W004).
//   2. Defaults are computed from the model: TP overlap, EP overlap, delayed wgrad and embedding
//      wgrad deferral off, wgrad_deferral_limit -1; p2p: PP > 1 with VPP > 1 -> overlap on /
//      batch off, PP > 1 otherwise -> overlap off / batch on, PP = 1 -> both off. With a
//      distributed optimizer also: DP > 1 -> bucket 128 MiB, grad-reduce and param-gather
//      overlap on (plus align_param_gather with PP > 1 and VPP > 1), DP = 1 -> bucket null and
//      all off; overlap_param_gather_with_optimizer_step off.
//   3. Every non-null user value replaces its computed default.
//   4. The result is copied into every field of the same name in `model` and, only with a
//      distributed optimizer, in `ddp` and `optimizer`: nulls included. So an unset
//      comm_overlap.overlap_moe_expert_parallel_comm turns a model's `true` into false; that
//      is reported as warning W010 (the reference is silent about it).
// Independently of comm_overlap: a flex dispatcher without a backend falls back to alltoall
// (W009), and MoE chunks by experts without EP overlap become C = 1 (W014: they give C = 1's
// bits and would only add waits to a schedule that overlaps nothing).
//
// Finalizing a finalized config changes nothing (the user's values are kept in comm_overlap, so
// the same inputs give the same outputs, and the switch-offs of step 1 are already recorded).
#pragma once

#include <vector>

#include "epo/config/config.h"
#include "epo/config/finding.h"

namespace epo::config {

inline constexpr std::int64_t kDefaultBucketSize = 128LL * 1024 * 1024;

struct FinalizeResult {
    std::vector<Finding> warnings;
};

FinalizeResult finalize(Config& config);

// The values finalization would mirror into `model` / into `ddp` and `optimizer`: computed
// defaults overlaid with the user's non-null values (steps 2-3 above), for tests and tools.
CommOverlapConfig resolved_model_overlap(const Config& config);
CommOverlapConfig resolved_optimizer_overlap(const Config& config);

}  // namespace epo::config
