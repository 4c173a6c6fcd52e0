// The link model (docs/runtime.md "Link model"): on one machine MPI moves bytes through shared
// memory with the CPU, so to measure overlap as a cluster would see it a collective is held until
// the time the modelled links would have needed. The bytes still really move through MPI; the model
// only adds the waiting, and the waiting thread sleeps (it never spins on the compute thread's
// core).
//
// Model: each rank has a full-duplex NIC of bandwidth B_inter to other nodes and a separate
// intra-node path of bandwidth B_intra. An operation that the LAST rank of its group entered at
// t0 completes on a rank no earlier than
//
//     t0 + latency + max( max(inter_sent, inter_recv) / B_inter,
//                         max(intra_sent, intra_recv) / B_intra )
//
// with this rank's own byte counts (bytes a rank sends to itself cross no link). A bandwidth of
// 0 leaves that path unmodelled (infinitely fast); all three at 0 = model off (the default).
#pragma once

#include <chrono>
#include <cstdint>

namespace epo::comm {

// Bytes one operation (or a sum of operations) moved between this rank and its peers, split by
// whether the peer is on this rank's node. Bytes to and from itself are not counted.
struct ByteCounts {
    int64_t intra_sent = 0;
    int64_t intra_recv = 0;
    int64_t inter_sent = 0;
    int64_t inter_recv = 0;

    int64_t sent() const { return intra_sent + inter_sent; }
    int64_t received() const { return intra_recv + inter_recv; }
    ByteCounts& operator+=(const ByteCounts& o);
    friend ByteCounts operator-(ByteCounts a, const ByteCounts& b);
    bool operator==(const ByteCounts&) const = default;
};

// Keys comm.link.* of the configuration. Bandwidths in Gbit/s (10^9 bits per second, the unit
// NICs are sold in: a 400 Gbit/s NIC moves 50 GB/s), latency in microseconds.
struct LinkModel {
    double inter_node_gbps = 0;
    double intra_node_gbps = 0;
    double latency_us = 0;

    bool enabled() const { return inter_node_gbps > 0 || intra_node_gbps > 0 || latency_us > 0; }
};

// Raises epo::Error naming the key (comm.link.*) for a negative or non-finite value, or one
// outside the ranges the model can honour (link_limits.h), with the fix.
void validate_link_model(const LinkModel& model);

// The modelled duration of an operation with these byte counts, in seconds from t0 (the formula
// above); 0 when the model is off.
double modelled_seconds(const LinkModel& model, const ByteCounts& bytes);

using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC: one time base for all ranks of a host

// Sleeps until `deadline` (absolute, so a late wake-up does not add to the next one), with the
// calling thread's timer slack lowered (lower_timer_slack()).
void sleep_until(Clock::time_point deadline);

// Sets the calling thread's timer slack to 1 ns (once per thread): the default 50 us adds to
// every timed wake-up, which here are up to ~0.8 ms late already.
void lower_timer_slack();

inline int64_t to_ns(Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
inline Clock::time_point from_ns(int64_t ns) {
    return Clock::time_point(std::chrono::nanoseconds(ns));
}
inline double seconds_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

}  // namespace epo::comm
