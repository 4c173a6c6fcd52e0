#include "epo/bench/metrics.h"

#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "epo/comm/mpi_runtime.h"
#include "epo/comm/rank_runner.h"
#include "epo/config/config.h"
#include "epo/core/error.h"
#include "epo/schedule/critical_path.h"

namespace epo::bench {
namespace {

// "VmHWM:   123456 kB" -> bytes; 0 if the field is absent.
int64_t status_field_bytes(const std::string& field) {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind(field + ":", 0) == 0) {
            std::istringstream fields(line.substr(field.size() + 1));
            int64_t kib = 0;
            fields >> kib;
            return kib * 1024;
        }
    }
    return 0;
}

double seconds(int64_t start_ns, int64_t end_ns) {
    return static_cast<double>(end_ns - start_ns) * 1e-9;
}

double median_of(std::vector<double> v) {
    if (v.empty()) {
        return 0;
    }
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double lookup(const CallDurations& durations, const std::string& name, const char* which) {
    const auto it = durations.find(name);
    if (it == durations.end()) {
        throw Error(ErrorKind::kInternal,
                    fmt::format("no measured duration of '{}' in the {} run", name, which));
    }
    return it->second;
}

// The optimizer step's pieces as the replay's tail (critical_path.h), each at the shorter of its
// medians in the two runs (one run's where only it has the piece), then "optimizer_step.end" (the
// losses and the step's end, on the compute stream) likewise.
std::vector<schedule::TailCall> optimizer_tail(const std::vector<train::OptimizerOp>& ops,
                                               const CallDurations& baseline,
                                               const CallDurations& own) {
    const auto shorter = [&](const std::string& name) {
        const auto b = baseline.find(name), o = own.find(name);
        if (b == baseline.end() && o == own.end())
            return lookup(own, name, "overlap");  // raises, naming the piece
        if (b == baseline.end())
            return o->second;
        return o == own.end() ? b->second : std::min(b->second, o->second);
    };
    std::vector<schedule::TailCall> tail;
    std::map<int, int> update_of;  // bucket -> the index of its update in `tail`
    for (const train::OptimizerOp& op : ops) {
        schedule::TailCall t{.stream = train::stream_of(op),
                             .duration_s = shorter(train::op_name(op)),
                             .waits_for_reduction = op.waits_for_reduction ? op.unit : -1,
                             .waits_for_schedule = op.kind == train::OptimizerOpKind::kGradNorm};
        if (op.kind == train::OptimizerOpKind::kGather)
            t.waits_for = update_of.at(op.unit);
        if (op.kind == train::OptimizerOpKind::kUpdate)
            update_of[op.unit] = static_cast<int>(tail.size());
        tail.push_back(t);
    }
    if (baseline.count("optimizer_step.end") || own.count("optimizer_step.end"))
        tail.push_back({.duration_s = shorter("optimizer_step.end")});
    return tail;
}

}  // namespace

int64_t peak_rss_bytes() {
    return status_field_bytes("VmHWM");
}

int64_t current_rss_bytes() {
    return status_field_bytes("VmRSS");
}

bool reset_peak_rss() {
    std::ofstream out("/proc/self/clear_refs");
    out << "5";
    out.flush();
    return static_cast<bool>(out);
}

StepWork step_work(const config::Config& cfg, const train::Trainer& trainer) {
    return StepWork{.tokens = static_cast<double>(config::global_batch_size(cfg)) *
                              static_cast<double>(cfg.model.seq_length),
                    .flops = trainer.step_flops(),
                    .timeout_s = cfg.comm.timeout_s};
}

StepMetrics gather_step_metrics(const StepWork& work, const train::StepResult& result) {
    // Fixed layout of one rank's numbers, gathered as doubles (byte counts stay exact below 2^53).
    constexpr int kFields = 7;
    const double mine[kFields] = {result.step_time_s,
                                  result.compute_busy_s,
                                  result.comm_busy_s,
                                  result.exposed_comm_s,
                                  static_cast<double>(result.peak_activation_bytes),
                                  static_cast<double>(peak_rss_bytes()),
                                  result.comm_cpu_s};
    const int world = comm::current_world_size();
    std::vector<double> all(static_cast<size_t>(world * kFields));
    comm::watched_world_call("gathering the step metrics", work.timeout_s, [&] {
        comm::check_mpi(MPI_Allgather(mine, kFields, MPI_DOUBLE, all.data(), kFields, MPI_DOUBLE,
                                      MPI_COMM_WORLD),
                        "gathering the step metrics");
    });

    StepMetrics m;
    m.step = result.step;
    m.lm_loss = result.lm_loss;
    m.grad_norm = result.grad_norm;
    for (int r = 0; r < world; ++r) {
        const double* f = &all[static_cast<size_t>(r * kFields)];
        RankStepMetrics rank{.step_time_s = f[0],
                             .compute_busy_s = f[1],
                             .comm_busy_s = f[2],
                             .exposed_comm_s = f[3],
                             .comm_cpu_s = f[6],
                             .peak_activation_bytes = static_cast<int64_t>(f[4]),
                             .peak_rss_bytes = static_cast<int64_t>(f[5])};
        m.step_time_s = std::max(m.step_time_s, rank.step_time_s);
        m.compute_busy_s = std::max(m.compute_busy_s, rank.compute_busy_s);
        m.comm_busy_s = std::max(m.comm_busy_s, rank.comm_busy_s);
        m.exposed_comm_s = std::max(m.exposed_comm_s, rank.exposed_comm_s);
        m.comm_cpu_s = std::max(m.comm_cpu_s, rank.comm_cpu_s);
        m.peak_activation_bytes = std::max(m.peak_activation_bytes, rank.peak_activation_bytes);
        m.peak_rss_bytes = std::max(m.peak_rss_bytes, rank.peak_rss_bytes);
        m.ranks.push_back(rank);
    }
    if (m.step_time_s > 0) {
        m.tokens_per_s = work.tokens / m.step_time_s;
        m.tflops_per_rank = work.flops / m.step_time_s / world / 1e12;
    }
    return m;
}

std::string node_kind_of(const std::string& record_name) {
    if (record_name.rfind("wait ", 0) == 0) {
        return "wait";
    }
    // The optimizer step's pieces ("optimizer_step.update.bucket2", train/optimizer_schedule.h).
    if (record_name.rfind("optimizer_step", 0) == 0) {
        return "optimizer_step";
    }
    std::string rest = record_name;
    for (const char* prefix : {"mb", "layer", "bucket"}) {
        // Strip a leading "mb<digits>." / "layer<digits>." / "bucket<digits>." part.
        const size_t p = std::string(prefix).size();
        if (rest.rfind(prefix, 0) == 0 && rest.size() > p && std::isdigit(rest[p])) {
            const size_t dot = rest.find('.');
            if (dot != std::string::npos) {
                rest = rest.substr(dot + 1);
            }
        }
    }
    // A MoE chunk's call counts as its node's ("dispatch.forward.chunk1" -> "dispatch.forward").
    if (const size_t c = rest.rfind(".chunk");
        c != std::string::npos && c + 6 < rest.size() &&
        std::all_of(rest.begin() + static_cast<std::ptrdiff_t>(c + 6), rest.end(),
                    [](unsigned char ch) { return std::isdigit(ch) != 0; })) {
        rest.resize(c);
    }
    return rest;
}

void add_node_stats(NodeStatsMap& stats, const std::vector<runtime::TaskRecord>& records) {
    for (const runtime::TaskRecord& r : records) {
        NodeStats& s = stats[node_kind_of(r.name)];
        s.stream = r.stream;
        s.count += 1;
        s.total_s += seconds(r.start_ns, r.end_ns);
        s.bytes += r.bytes;
    }
}

CallDurations median_call_durations(const std::vector<std::vector<runtime::TaskRecord>>& steps) {
    std::map<std::string, std::vector<double>> samples;
    for (const auto& records : steps) {
        for (const runtime::TaskRecord& r : records) {
            if (r.kind == runtime::RecordKind::kTask) {
                samples[r.name].push_back(seconds(r.start_ns, r.end_ns));
            }
        }
    }
    CallDurations out;
    for (auto& [name, values] : samples) {
        out[name] = median_of(std::move(values));
    }
    return out;
}

double critical_path_bound_s(const std::vector<schedule::NodeCall>& calls,
                             const CallDurations& baseline, const CallDurations& own,
                             const std::vector<train::OptimizerOp>& optimizer_ops) {
    using schedule::NodeCall;
    const int num_chunks = schedule::num_moe_chunks(calls);
    // The two halves of a delayed weight gradient's backward: this run's durations of the input
    // gradient (the delayed backward) and of the weight gradient (backward_dw).
    const auto halves = [&](NodeCall call) {
        call.phase = schedule::Phase::kBackward;
        call.wgrad_delayed = true;
        const double d = lookup(own, schedule::call_name(call), "overlap");
        call.phase = schedule::Phase::kBackwardDw;
        return std::pair{d, lookup(own, schedule::call_name(call), "overlap")};
    };
    // This run's time for `call`; for a backward that this run split into input and weight
    // gradients, the two halves together.
    const auto own_full = [&](const NodeCall& call) {
        const std::string name = schedule::call_name(call);
        if (own.count(name) || call.phase != schedule::Phase::kBackward || call.wgrad_delayed)
            return lookup(own, name, "overlap");
        const auto [d, w] = halves(call);
        return d + w;
    };
    // The baseline's time for `call` (its weight gradients included): measured under the same
    // name, or, where the baseline ran the layer whole (chunks by experts, W014), the whole
    // call's time shared out in the proportion this run measured across the chunks.
    const auto baseline_of = [&](const NodeCall& call) {
        const std::string name = schedule::call_name(call);
        if (baseline.count(name) || call.moe_chunk < 0)
            return lookup(baseline, name, "baseline");
        NodeCall whole = call;
        whole.moe_chunk = -1;
        double sum = 0;
        for (int c = 0; c < num_chunks; ++c) {
            NodeCall part = call;
            part.moe_chunk = c;
            sum += own_full(part);
        }
        const double b = lookup(baseline, schedule::call_name(whole), "baseline");
        return sum > 0 ? b * own_full(call) / sum : 0.0;
    };
    // A call's best case is the shorter of its two medians: the baseline's carries no contention,
    // but its communication calls also hold the wait for the slowest rank to enter, which the
    // overlap run partly hides.
    const auto shortest = [&](const NodeCall& call) {
        const double b = baseline_of(call);
        const auto it = own.find(schedule::call_name(call));
        return it == own.end() ? b : std::min(b, it->second);
    };
    const auto duration = [&](const NodeCall& call) {
        const bool split = call.phase == schedule::Phase::kBackwardDw || call.wgrad_delayed;
        if (!split) {
            return shortest(call);
        }
        // The baseline ran input and weight gradients as one call; share its duration out in
        // the proportion this run measured for the two halves.
        NodeCall undelayed = call;
        undelayed.phase = schedule::Phase::kBackward;
        undelayed.wgrad_delayed = false;
        const auto [d, w] = halves(call);
        const double whole = std::min(baseline_of(undelayed), d + w);
        const double mine = call.phase == schedule::Phase::kBackwardDw ? w : d;
        return d + w > 0 ? whole * mine / (d + w) : 0.0;
    };
    if (!optimizer_ops.empty())
        return schedule::critical_path_seconds(calls, duration,
                                               optimizer_tail(optimizer_ops, baseline, own));
    // The optimizer step's pieces, each run's sum (the shorter of the two).
    const auto optimizer_total = [](const CallDurations& d) {
        double sum = 0;
        for (const auto& [name, seconds] : d) {
            if (node_kind_of(name) == "optimizer_step")
                sum += seconds;
        }
        return sum;
    };
    const double baseline_optimizer = optimizer_total(baseline),
                 own_optimizer = optimizer_total(own);
    const double optimizer =
        own_optimizer > 0 ? std::min(baseline_optimizer, own_optimizer) : baseline_optimizer;
    return schedule::critical_path_seconds(calls, duration) + optimizer;
}

std::optional<double> overlap_efficiency(double t_base, double t_overlap, double t_bound) {
    if (!(t_base > t_bound)) {
        return std::nullopt;
    }
    return (t_base - t_overlap) / (t_base - t_bound);
}

Summary summarize(std::vector<double> values) {
    if (values.empty()) {
        return {};
    }
    Summary s;
    s.min = *std::min_element(values.begin(), values.end());
    s.max = *std::max_element(values.begin(), values.end());
    s.median = median_of(std::move(values));
    return s;
}

namespace {

// 0 when `a` and `b` are equal bit for bit, else the first step (from 1) where they differ.
size_t first_difference(const std::vector<double>& a, const std::vector<double>& b) {
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
        if (i >= a.size() || i >= b.size() || std::memcmp(&a[i], &b[i], sizeof(double)) != 0)
            return i + 1;
    }
    return 0;
}

}  // namespace

BitComparison compare_bits(const RunBits& a, const RunBits& b) {
    BitComparison c;
    const size_t loss_step = first_difference(a.losses, b.losses);
    const size_t norm_step = first_difference(a.grad_norms, b.grad_norms);
    c.losses = loss_step == 0 && !a.losses.empty();
    c.grad_norms = norm_step == 0 && !a.grad_norms.empty();
    c.params = !a.param_checksum.empty() && a.param_checksum == b.param_checksum;
    const auto add = [&](const std::string& what) {
        c.differences += (c.differences.empty() ? "" : ", ") + what;
    };
    if (!c.losses)
        add(a.losses.empty() ? "losses (none recorded)"
                             : fmt::format("losses (first at step {})", loss_step));
    if (!c.grad_norms)
        add(a.grad_norms.empty() ? "grad norms (none recorded)"
                                 : fmt::format("grad norms (first at step {})", norm_step));
    if (!c.params)
        add(a.param_checksum.empty() || b.param_checksum.empty()
                ? "final parameters (no checksum recorded)"
                : fmt::format("final parameters ({} vs {})", a.param_checksum, b.param_checksum));
    return c;
}

double max_over_ranks(double v, double timeout_s) {
    double out = v;
    comm::watched_world_call("reducing a benchmark metric", timeout_s, [&] {
        comm::check_mpi(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD),
                        "reducing a benchmark metric");
    });
    return out;
}

}  // namespace epo::bench
