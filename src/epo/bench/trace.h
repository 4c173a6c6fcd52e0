// Chrome trace-event files (open in Perfetto or chrome://tracing) of the two streams of every
// rank: one process per rank, one track per stream, one complete ("X") slice per task, named as
// the schedule names the call ("mb3.layer1.dispatch.forward"), and one slice per event wait
// ("wait mb3", category "wait") so the time a stream sat blocked is visible.
//
// Timestamps are the stream records' CLOCK_MONOTONIC times, which the ranks of one host share;
// across hosts they are only as aligned as the hosts' clocks. All slices of a trace are shifted
// by one origin, the earliest record over every gather, so no timestamp is negative whatever
// order the gathers come in (`epo bench` gathers its schedules in table order, not run order).
//
// Format: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}; ts and dur in
// microseconds; "M" metadata events name processes ("rank 0", or "<label> rank 0") and threads.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "epo/runtime/stream.h"

namespace epo::bench {

struct Trace {
    // "X" events carry their start as "ts_ns" (the raw clock) until trace_json() shifts them.
    nlohmann::json events = nlohmann::json::array();
    std::optional<int64_t> origin_ns;  // the earliest record of all gathers so far
    int next_pid = 0;                  // processes used so far
};

// Collective over MPI_COMM_WORLD: gathers every rank's `records` to rank 0 and appends them to
// `trace` there as processes "<label> rank R" (just "rank R" when the label is empty). Other
// ranks' `trace` is left unchanged. A gather that outlives `timeout_s` (comm.timeout_s) ends the
// job (comm::watched_world_call).
void gather_trace(Trace& trace, const std::vector<runtime::TaskRecord>& records, double timeout_s,
                  const std::string& label = "");

// The file's JSON (rank 0's trace).
nlohmann::json trace_json(const Trace& trace);

// Writes trace_json() to `path`; raises epo::Error (kIo) naming the path if it cannot.
void write_trace(const Trace& trace, const std::filesystem::path& path);

// Collective: every rank's strings, in rank order, on rank 0 (empty elsewhere); bounded by
// `timeout_s` as gather_trace.
std::vector<std::string> gather_strings_to_root(const std::string& mine, double timeout_s);

}  // namespace epo::bench
