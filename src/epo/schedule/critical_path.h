// The critical-path bound of a schedule: how long it would take with perfect concurrency and no
// contention, given how long each node takes. Overlap efficiency is measured against it:
//
//   efficiency = (T_baseline - T_overlap) / (T_baseline - T_bound)
//
// Replay: each stream runs its calls in issue order; a call also waits for the previous call of
// its own micro-batch (the event wait of the executor). start = max(stream free, previous call
// of the micro-batch done); end = start + duration; a call off the chain (a gradient reduction, a
// delayed weight gradient: schedule.h runs_off_chain) does not count as the micro-batch's previous
// call, and a gradient reduction also waits for its micro-batch's delayed weight gradients. With
// MoE chunks the previous call is that of the same
// (micro-batch, chunk), and a whole call waits for every chunk's (executor.h). The bound is the
// last end.
//
// The step goes on after the schedule's calls: the optimizer step's pieces
// (train/optimizer_schedule.h) are issued on the same two streams, so a replay of the whole step
// takes them as a tail. A piece starts when its stream is free and what it waits for has ended:
// its bucket's gradient reduction (the schedule's kGradReduce call of that bucket), every call
// of the schedule on the comm stream (the global norm), or an earlier piece (a bucket's
// parameter gather waits for that bucket's update). The distributed optimizer's gathers are
// charged where they run: at the end of the step (a compute-stream piece after the updates),
// under the optimizer step (comm-stream pieces, each after its bucket's update), or in the next
// forward (the schedule's kParamGather calls, which the readers' wait_bucket waits for).
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

// One piece of the step after the schedule's calls (the header: the optimizer step).
struct TailCall {
    StreamId stream = StreamId::kCompute;
    double duration_s = 0;
    int waits_for_reduction = -1;     // the schedule's kGradReduce call of this bucket; -1 none
    bool waits_for_schedule = false;  // every call of the schedule on the comm stream
    int waits_for = -1;               // the end of tail[waits_for], an earlier piece; -1 none
};
// The replay of `calls`, then of `tail` in its order on the same streams: the last end.
double critical_path_seconds(const std::vector<NodeCall>& calls,
                             const std::function<double(const NodeCall&)>& duration_s,
                             const std::vector<TailCall>& tail);

}  // namespace epo::schedule
