// The critical-path bound of a schedule: how long it would take with perfect concurrency and no
// contention, given how long each node takes. Overlap efficiency is measured against it:
//
//   efficiency = (T_baseline - T_overlap) / (T_baseline - T_bound)
//
// Replay: each stream runs its calls in issue order; a call also waits for the previous call of
// its own micro-batch (the event wait of the executor). start = max(stream free, previous call
// of the micro-batch done); end = start + duration; a gradient reduction does not count as the
// micro-batch's previous call. With MoE chunks the previous call is that of the same
// (micro-batch, chunk), and a whole call waits for every chunk's (executor.h). The bound is the
// last end.
#pragma once

#include <functional>
#include <vector>

#include "epo/schedule/schedule.h"

namespace epo::schedule {

// `duration_s(call)` gives each call's duration in seconds (typically measured in a baseline
// run, where nothing runs concurrently and durations carry no contention).
double critical_path_seconds(const std::vector<NodeCall>& calls,
                             const std::function<double(const NodeCall&)>& duration_s);

// The same replay, call by call: spans[i] is when calls[i] starts and ends (the planner,
// src/epo/plan/, reads which compute calls ran while the comm stream was busy).
struct CallSpan {
    double start = 0, end = 0;
};
std::vector<CallSpan> critical_path_spans(const std::vector<NodeCall>& calls,
                                          const std::function<double(const NodeCall&)>& duration_s);

}  // namespace epo::schedule
