#include "epo/bench/calibration.h"

#include <algorithm>

#include "epo/bench/metrics.h"
#include "epo/comm/link_limits.h"
#include "epo/core/error.h"
#include "epo/schedule/schedule.h"
#include "epo/train/trainer.h"

namespace epo::bench {

std::vector<std::string> link_overrides(const LinkCalibration& c) {
    return {fmt::format("comm.link.inter_node_gbps={:.6g}", c.inter_node_gbps),
            fmt::format("comm.link.intra_node_gbps={:.6g}", c.intra_node_gbps),
            fmt::format("comm.link.latency_us={:.6g}", c.latency_us)};
}

LinkCalibration calibrate_link(const config::Config& link_off, const config::Config& user,
                               double ratio, int warmup_steps,
                               const std::function<void(const std::string&)>& log) {
    log(
        fmt::format("[bench] calibrating the link model to comm/compute = {}: baseline "
                    "with the link model off",
                    ratio));
    train::Trainer trainer(link_off, {.keep_records = true});
    const int steps = warmup_steps + 2;
    std::vector<double> compute, comm_s, a2a_bytes, reduce_bytes, gather_bytes, other_bytes,
        collectives;
    const bool inter = config::num_nodes(link_off.comm) > 1;
    for (int i = 0; i < steps; ++i) {
        const train::StepResult r = trainer.step();
        if (i < warmup_steps) {
            continue;
        }
        compute.push_back(r.compute_busy_s);
        comm_s.push_back(r.comm_busy_s);
        double a2a = 0, reduce = 0, gather = 0, other = 0, n = 0;
        for (const runtime::TaskRecord& t : r.records) {
            const int64_t sent = inter ? t.bytes.inter_sent : t.bytes.intra_sent;
            const int64_t recv = inter ? t.bytes.inter_recv : t.bytes.intra_recv;
            if (t.kind != runtime::RecordKind::kTask || sent + recv == 0) {
                continue;
            }
            const std::string kind = node_kind_of(t.name);
            (t.stream != "comm"                                              ? other
             : kind == schedule::node_name(schedule::NodeKind::kGradReduce)  ? reduce
             : kind == schedule::node_name(schedule::NodeKind::kParamGather) ? gather
                                                                             : a2a) +=
                static_cast<double>(std::max(sent, recv));
            n += 1;
        }
        a2a_bytes.push_back(a2a);
        reduce_bytes.push_back(reduce);
        gather_bytes.push_back(gather);
        other_bytes.push_back(other);
        collectives.push_back(n);
    }
    LinkCalibration c;
    c.target_ratio = ratio;
    c.compute_s = max_over_ranks(summarize(compute).median, link_off.comm.timeout_s);
    c.comm_s_unmodelled = max_over_ranks(summarize(comm_s).median, link_off.comm.timeout_s);
    c.alltoall_bytes = max_over_ranks(summarize(a2a_bytes).median, link_off.comm.timeout_s);
    c.grad_reduce_bytes = max_over_ranks(summarize(reduce_bytes).median, link_off.comm.timeout_s);
    c.param_gather_bytes = max_over_ranks(summarize(gather_bytes).median, link_off.comm.timeout_s);
    c.compute_stream_bytes = max_over_ranks(summarize(other_bytes).median, link_off.comm.timeout_s);
    c.num_collectives = static_cast<int64_t>(
        max_over_ranks(summarize(collectives).median, link_off.comm.timeout_s));
    c.inter_node = inter;
    c.latency_us = user.comm.link.latency_us.value_or(0.0);
    const double optimizer_bytes =
        c.grad_reduce_bytes + c.param_gather_bytes + c.compute_stream_bytes;
    const double bytes = c.alltoall_bytes + optimizer_bytes;
    // The comm stream's busy time with the link model off (waiting for the other ranks to enter
    // each all-to-all, then the copies) stays when the link model is on: the model holds a
    // collective from the moment the last rank entered it. Leave it out of the modelled time so
    // the calibrated baseline's communication comes out at R x C, not R x C plus that.
    const double link_time =
        ratio * c.compute_s - c.num_collectives * c.latency_us * 1e-6 - c.comm_s_unmodelled;
    if (c.alltoall_bytes <= 0 || link_time <= 0) {
        throw Error(
            ErrorKind::kConfig,
            fmt::format("--comm_compute_ratio {}: cannot calibrate: {} collectives moving "
                        "{:.0f} bytes per step with comm.link.latency_us={} already take "
                        "more than {:.3f} s, of which {:.3f} s is the all-to-alls' own time "
                        "without the link model (or there is no all-to-all: is the model MoE "
                        "with expert parallel > 1?); lower comm.link.latency_us or raise "
                        "the ratio",
                        ratio, c.num_collectives, bytes, c.latency_us, ratio * c.compute_s,
                        c.comm_s_unmodelled));
    }
    const double gbps = bytes * 8.0 / link_time / 1e9;
    // The calibrated link holds one step's collectives about ratio x compute seconds; past
    // comm.timeout_s no step could finish, so say so now instead of starting runs that time out
    // (or, before the hold was bounded, slept for years).
    if (link_time > user.comm.timeout_s || gbps < comm::kMinLinkGbps) {
        throw Error(
            ErrorKind::kUsage,
            fmt::format("--comm_compute_ratio {}: the link this calibrates to ({:.3g} "
                        "Gbit/s) holds one step's {} collectives {:.3g} s, beyond "
                        "comm.timeout_s = {} s (or below the {:g} Gbit/s the link model "
                        "accepts); give a ratio of at most {:.3g}, or raise "
                        "comm.timeout_s",
                        ratio, gbps, c.num_collectives, link_time, user.comm.timeout_s,
                        comm::kMinLinkGbps,
                        std::min(user.comm.timeout_s, bytes * 8.0 / (comm::kMinLinkGbps * 1e9)) /
                            c.compute_s));
    }
    (c.inter_node ? c.inter_node_gbps : c.intra_node_gbps) = gbps;
    c.compute_stream_comm_s = c.compute_stream_bytes * 8.0 / (gbps * 1e9);
    log(fmt::format(
        "[bench] link model: compute {:.3f} s/step; per step {:.1f} MB of all-to-alls and "
        "{:.1f} MB of data-parallel gradient/parameter traffic and loss reductions -> "
        "comm.link.{}_node_gbps={:.4g} latency_us={}",
        c.compute_s, c.alltoall_bytes / 1e6, optimizer_bytes / 1e6,
        c.inter_node ? "inter" : "intra", gbps, c.latency_us));
    return c;
}

}  // namespace epo::bench
