// Link calibration for `epo bench --comm_compute_ratio R`: a baseline run with the link model
// off measures the compute stream's busy time and the bytes of every collective of a step; the
// link's bandwidth is then set so that the modelled communication of a step is R times the
// compute. What the runs then use is the overrides link_overrides() gives.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "epo/config/config.h"

namespace epo::bench {

// Communication counts every collective: the all-to-alls of the comm stream and the gradient and
// loss reductions the compute stream runs in the optimizer step (the overlap schedule can hide
// only the former). With C the compute stream's busy time and E, A their bytes per step (link
// model off; per collective the larger of sent and received across nodes):
//
//   bandwidth = 8 * (E + A) / (R * C - collectives * latency)   bits/s
struct LinkCalibration {
    double target_ratio = 0;
    double compute_s = 0;              // compute-stream busy per step, link model off
    double comm_s_unmodelled = 0;      // comm-stream busy per step, link model off
    double alltoall_bytes = 0;         // E: the comm stream's dispatch/combine all-to-alls
    double grad_reduce_bytes = 0;      // the comm stream's bucketed gradient reductions
    double param_gather_bytes = 0;     // the comm stream's bucketed parameter gathers
    double compute_stream_bytes = 0;   // the optimizer step's reductions (A with the above)
    double compute_stream_comm_s = 0;  // A's modelled time at the chosen bandwidth
    int64_t num_collectives = 0;       // tasks with communication, per step
    bool inter_node = true;            // which bandwidth was set
    double inter_node_gbps = 0;
    double intra_node_gbps = 0;
    double latency_us = 0;
};

// The comm.link.* overrides that set a calibration's link (all zero: the link model off).
std::vector<std::string> link_overrides(const LinkCalibration& c);

// Runs `link_off` (the baseline, finalized, with the link model off) for warmup_steps + 2 steps,
// measures the last two, and returns the link that makes the modelled communication `ratio`
// times the compute, keeping `user`'s latency. Lines for the progress log go to `log`.
// Collective (the medians are the largest over the ranks). Raises epo::Error (kConfig) when
// there is no all-to-all or the latency alone exceeds the target, (kUsage) when the link would
// hold a step past comm.timeout_s or fall below the link model's least bandwidth.
LinkCalibration calibrate_link(const config::Config& link_off, const config::Config& user,
                               double ratio, int warmup_steps,
                               const std::function<void(const std::string&)>& log);

}  // namespace epo::bench
