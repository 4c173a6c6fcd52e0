// Issues a schedule's node calls to the two streams of a rank, CUDA style: each call waits on
// its micro-batch's event, is enqueued on its stream, and records the event. One event per
// micro-batch: a micro-batch's consecutive calls alternate streams and each wait binds to the
// most recent record, so they serialize; calls of two micro-batches are free to overlap. A
// gradient reduction waits like any call but records only its bucket's own event (returned, for
// the optimizer step's work on that bucket), so the micro-batch's next call does not wait for it.
// A delayed weight gradient (backward_dw) records only its micro-batch's wgrad event, which a
// gradient reduction of the micro-batch waits for: the dispatch backward after the expert wgrad,
// and the next layer's combine backward after the attention wgrad, run while it computes.
// With MoE chunks (schedule.h) the event is per (micro-batch, chunk): a chunk's call waits on and
// records its chunk's event, a whole call all of the micro-batch's, so chunk c+1's dispatch runs
// while chunk c's experts compute. A call that runs beside the previous one (schedule.h
// runs_beside_previous: the shared expert beside the dispatch) has its waits issued before that
// call's records, so it waits for that call's inputs, not for the call, and records nothing. The
// issuing thread never waits for computation.
#pragma once

#include <functional>
#include <vector>

#include "epo/runtime/rank_streams.h"
#include "epo/schedule/schedule.h"

namespace epo::schedule {

using NodeBody = std::function<void(const NodeCall&, runtime::StreamContext&)>;

// Events recorded by the issued calls that work after the schedule may wait for.
struct IssuedEvents {
    // [bucket] recorded on the comm stream right after that bucket's gradient reduction
    // (kGradReduce); empty without bucketed reduction.
    std::vector<runtime::Event> reduced;
};

// Enqueues every call in order; returns without waiting (synchronize the streams after).
IssuedEvents issue_schedule(const std::vector<NodeCall>& calls, int num_micro_batches,
                            runtime::RankStreams& streams, NodeBody body);

}  // namespace epo::schedule
