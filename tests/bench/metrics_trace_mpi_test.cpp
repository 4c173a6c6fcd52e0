// Metrics and traces of real two-rank runs of a small model: the trace file parses, slices on
// one stream never overlap, an overlap run shows comm slices overlapping compute slices of
// another micro-batch, and the metrics add up.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "epo/bench/bench_report.h"
#include "epo/bench/metrics.h"
#include "epo/bench/trace.h"
#include "epo/comm/mpi_runtime.h"
#include "epo/config/builder.h"
#include "epo/config/validate.h"
#include "epo/train/trainer.h"

namespace epo::bench {
namespace {

constexpr double kTimeoutS = 120;  // comm.timeout_s: the gathers' deadline

config::Config small_config(bool overlap, bool delay) {
    const int world = comm::current_world_size();
    config::ConfigSources sources;
    sources.model = "tiny-moe";
    sources.overrides = {
        "model.num_layers=2", "model.hidden_size=128", "model.kv_channels=32",
        "model.ffn_hidden_size=256", "model.moe_ffn_hidden_size=128", "model.seq_length=64",
        "train.micro_batch_size=2", "train.global_batch_size=" + std::to_string(2 * world * 4),
        "comm.num_nodes=" + std::to_string(world), "comm.gpus_per_node=1",
        "model.expert_model_parallel_size=" + std::to_string(world),
        // Every collective takes at least 1 ms: long enough to see overlap.
        "comm.link.latency_us=1000",
        std::string("comm_overlap.overlap_moe_expert_parallel_comm=") +
            (overlap ? "true" : "false"),
        std::string("comm_overlap.delay_wgrad_compute=") + (delay ? "true" : "false")};
    const config::ValidationReport report =
        config::validate_for_run(config::build_config(sources).config);
    for (const auto& e : report.errors) {
        ADD_FAILURE() << e.id << " " << e.message;
    }
    return report.config;
}

struct TracedRun {
    std::vector<StepMetrics> metrics;
    std::vector<std::vector<runtime::TaskRecord>> records;  // this rank, per step
    std::vector<schedule::NodeCall> calls;
};

TracedRun run(const config::Config& cfg, int steps) {
    train::Trainer trainer(cfg, {.keep_records = true});
    TracedRun r;
    r.calls = trainer.schedule_calls();
    for (int i = 0; i < steps; ++i) {
        train::StepResult s = trainer.step();
        r.metrics.push_back(gather_step_metrics(step_work(cfg, trainer), s));
        r.records.push_back(std::move(s.records));
    }
    return r;
}

struct Slice {
    std::string name, cat;
    int pid = 0, tid = 0;
    double ts = 0, dur = 0;
};

std::vector<Slice> parse_slices(const nlohmann::json& file) {
    std::vector<Slice> out;
    for (const auto& e : file.at("traceEvents")) {
        if (e.at("ph") != "X") {
            continue;
        }
        out.push_back(
            {e.at("name"), e.at("cat"), e.at("pid"), e.at("tid"), e.at("ts"), e.at("dur")});
    }
    return out;
}

int micro_batch_of(const std::string& name) {
    if (name.rfind("mb", 0) != 0) {
        return -1;
    }
    return std::stoi(name.substr(2));
}

// Writes the run's trace through a file and reads it back (rank 0 only returns slices).
std::vector<Slice> traced(const TracedRun& r, const std::string& label) {
    Trace trace;
    for (const auto& step : r.records) {
        gather_trace(trace, step, kTimeoutS, label);
    }
    if (comm::current_world_rank() != 0) {
        return {};
    }
    const auto path = std::filesystem::temp_directory_path() /
                      ("epo_trace_test_" + std::to_string(::getpid()) + ".json");
    write_trace(trace, path);
    std::ifstream in(path);
    const nlohmann::json file = nlohmann::json::parse(in);  // throws if it does not parse
    std::filesystem::remove(path);
    EXPECT_EQ(file.at("displayTimeUnit"), "ms");
    return parse_slices(file);
}

void expect_no_overlap_within_a_stream(const std::vector<Slice>& slices) {
    std::map<std::pair<int, int>, std::vector<Slice>> tracks;
    for (const Slice& s : slices) {
        tracks[{s.pid, s.tid}].push_back(s);
    }
    ASSERT_GE(tracks.size(), 4u);  // 2 runs' steps x 2 ranks x 2 streams, at least
    for (auto& [key, track] : tracks) {
        std::sort(track.begin(), track.end(),
                  [](const Slice& a, const Slice& b) { return a.ts < b.ts; });
        for (size_t i = 1; i < track.size(); ++i) {
            // Microsecond timestamps printed as doubles: allow rounding of 1 ns.
            EXPECT_LE(track[i - 1].ts + track[i - 1].dur, track[i].ts + 1e-3)
                << track[i - 1].name << " and " << track[i].name << " overlap on pid " << key.first
                << " tid " << key.second;
        }
    }
}

bool comm_overlaps_compute_of_another_micro_batch(const std::vector<Slice>& slices) {
    for (const Slice& c : slices) {
        if (c.tid != 1 || c.cat != "task") {
            continue;
        }
        for (const Slice& k : slices) {
            if (k.pid != c.pid || k.tid != 0 || k.cat != "task") {
                continue;
            }
            const int mc = micro_batch_of(c.name), mk = micro_batch_of(k.name);
            if (mc < 0 || mk < 0 || mc == mk) {
                continue;
            }
            if (std::max(c.ts, k.ts) < std::min(c.ts + c.dur, k.ts + k.dur)) {
                return true;
            }
        }
    }
    return false;
}

TEST(Trace, BaselineParsesAndStreamsNeverOverlapThemselves) {
    const TracedRun r = run(small_config(false, false), 2);
    const std::vector<Slice> slices = traced(r, "baseline");
    if (comm::current_world_rank() != 0) {
        return;
    }
    ASSERT_FALSE(slices.empty());
    expect_no_overlap_within_a_stream(slices);
    // Named by node, layer and micro-batch.
    EXPECT_TRUE(std::any_of(slices.begin(), slices.end(), [](const Slice& s) {
        return s.name == "mb1.layer1.dispatch.forward" && s.tid == 1;
    }));
    EXPECT_TRUE(
        std::any_of(slices.begin(), slices.end(), [](const Slice& s) { return s.cat == "wait"; }));
    // In the baseline nothing of another micro-batch runs during a comm task.
    EXPECT_FALSE(comm_overlaps_compute_of_another_micro_batch(slices));
}

// A metrics.json document with what report_html() reads, one run per name.
nlohmann::json metrics_for(const std::vector<std::string>& names) {
    nlohmann::json runs = nlohmann::json::array();
    for (const std::string& n : names) {
        runs.push_back({{"name", n},
                        {"step_time_s", {{"median", 1.0}, {"min", 1.0}, {"max", 1.0}}},
                        {"tokens_per_s", 1.0},
                        {"tflops_per_rank", 1.0},
                        {"compute_s", 1.0},
                        {"comm_s", 1.0},
                        {"exposed_comm_s", 1.0},
                        {"speedup_vs_baseline", nullptr},
                        {"overlap_efficiency",
                         n == "baseline" ? nlohmann::json(nullptr) : nlohmann::json(-0.12)},
                        {"critical_path_bound_s", nullptr},
                        {"peak_rss_bytes", 1.0},
                        {"peak_activation_bytes", 1.0},
                        {"losses_match_baseline", true},
                        {"grad_norms_match_baseline", true},
                        {"params_match_baseline", true},
                        {"baseline_differences", ""},
                        {"losses", {1.0, 0.5}}});
    }
    return {{"model", "tiny-moe"},
            {"world_size", 2},
            {"num_nodes", 2},
            {"gpus_per_node", 1},
            {"expert_model_parallel_size", 2},
            {"num_micro_batches", 4},
            {"global_batch_size", 16},
            {"seq_length", 64},
            {"steps_per_run", 2},
            {"warmup_steps", 1},
            {"repeats", 1},
            {"link", {{"inter_node_gbps", 0.0}, {"intra_node_gbps", 0.0}, {"latency_us", 1000.0}}},
            {"calibration", nullptr},
            {"runs", runs},
            {"overlap_speedup", nullptr},
            {"overlap_efficiency", -0.12},
            {"loss_bitwise_identical", true},
            {"bitwise_identical", true}};
}

// The bench gathers its schedules in table order, not run order: with the trace's origin taken
// from the first gather, a schedule that ran earlier got negative timestamps, and the report's
// span, which started at 0, headed a 9 s step "64429.9 ms". Here the later run is gathered first.
TEST(Trace, SchedulesGatheredOutOfRunOrderEachShowTheirOwnStep) {
    const TracedRun early = run(small_config(false, false), 2);
    const TracedRun late = run(small_config(true, true), 2);
    Trace trace;
    gather_trace(trace, late.records.back(), kTimeoutS, "overlap");
    gather_trace(trace, early.records.back(), kTimeoutS, "baseline");
    if (comm::current_world_rank() != 0) {
        return;
    }
    const nlohmann::json doc = trace_json(trace);
    double earliest = 1e300;
    std::map<std::string, std::pair<double, double>> span;  // schedule: first start, last end
    std::map<int, std::string> schedule_of_pid;
    for (const auto& e : doc.at("traceEvents")) {
        if (e.at("ph") == "M" && e.at("name") == "process_name") {
            const std::string process = e.at("args").at("name");
            schedule_of_pid[e.at("pid")] = process.substr(0, process.find(' '));
        }
    }
    for (const auto& e : doc.at("traceEvents")) {
        if (e.at("ph") != "X") {
            continue;
        }
        const double ts = e.at("ts"), dur = e.at("dur");
        EXPECT_GE(ts, 0.0) << e.at("name");
        earliest = std::min(earliest, ts);
        auto [it, fresh] = span.try_emplace(schedule_of_pid.at(e.at("pid")), ts, ts + dur);
        it->second = {std::min(it->second.first, ts), std::max(it->second.second, ts + dur)};
    }
    EXPECT_EQ(earliest, 0.0);
    ASSERT_EQ(span.size(), 2u);
    // The report heads each schedule with its own span, a few percent from its step time (the
    // step also holds the issue of the first node and the end of the optimizer step).
    const std::string html = report_html(metrics_for({"baseline", "overlap"}), doc);
    for (const auto& [name, s] : span) {
        const std::regex heading("<h3>" + name + ": ([0-9.]+) ms</h3>");
        std::smatch m;
        ASSERT_TRUE(std::regex_search(html, m, heading)) << name;
        const double shown_ms = std::stod(m[1].str());
        EXPECT_NEAR(shown_ms, (s.second - s.first) / 1e3, 0.1) << name;
        const double step_ms = (name == "baseline" ? early : late).metrics.back().step_time_s * 1e3;
        EXPECT_NEAR(shown_ms / step_ms, 1.0, 0.05) << name << ": step " << step_ms << " ms";
    }
    // A negative overlap efficiency is not shown as a figure.
    EXPECT_NE(html.find("n/a (overlap slower)"), std::string::npos);
    EXPECT_EQ(html.find("-0.12"), std::string::npos);
    EXPECT_NE(format_table(metrics_for({"baseline", "overlap"})).find("n/a"), std::string::npos);
}

TEST(Trace, OverlapRunShowsCommUnderComputeOfAnotherMicroBatch) {
    const TracedRun r = run(small_config(true, true), 2);
    const std::vector<Slice> slices = traced(r, "overlap");
    if (comm::current_world_rank() != 0) {
        return;
    }
    expect_no_overlap_within_a_stream(slices);
    EXPECT_TRUE(comm_overlaps_compute_of_another_micro_batch(slices));
}

TEST(Metrics, AddUp) {
    const config::Config cfg = small_config(true, false);
    const TracedRun r = run(cfg, 2);
    const int world = comm::current_world_size();
    for (const StepMetrics& m : r.metrics) {
        ASSERT_EQ(m.ranks.size(), static_cast<size_t>(world));
        double slowest = 0;
        for (const RankStepMetrics& k : m.ranks) {
            slowest = std::max(slowest, k.step_time_s);
            EXPECT_GT(k.compute_busy_s, 0);
            EXPECT_GT(k.comm_busy_s, 0);
            EXPECT_GE(k.exposed_comm_s, 0);
            // One thread per stream: busy and waiting never exceed the step.
            EXPECT_LE(k.compute_busy_s + k.exposed_comm_s, k.step_time_s * 1.0001);
            EXPECT_LE(k.comm_busy_s, k.step_time_s * 1.0001);
            EXPECT_GT(k.peak_activation_bytes, 0);
            EXPECT_GE(k.peak_rss_bytes, k.peak_activation_bytes);
        }
        EXPECT_EQ(m.step_time_s, slowest);
        const double tokens = 2.0 * world * 4 * 64;
        EXPECT_NEAR(m.tokens_per_s, tokens / m.step_time_s, 1e-9 * m.tokens_per_s);
        EXPECT_GT(m.tflops_per_rank, 0);
    }
    // Per node kind, the compute stream's tasks add up to its busy time; the expert computation
    // moves no bytes, and the all-to-alls of dispatch and combine carry far more than the small
    // loss reductions of the attention node.
    NodeStatsMap stats;
    add_node_stats(stats, r.records.back());
    double compute = 0;
    for (const auto& [kind, s] : stats) {
        if (s.stream == "compute" && kind != "wait") {
            compute += s.total_s;
        }
    }
    for (const char* a2a :
         {"dispatch.forward", "combine.forward", "dispatch.backward", "combine.backward"}) {
        EXPECT_GT(stats[a2a].bytes.inter_sent, 100 * stats["pre_dispatch.forward"].bytes.sent())
            << a2a;
        EXPECT_EQ(stats[a2a].stream, "comm");
    }
    EXPECT_EQ(stats["mlp.forward"].bytes.sent(), 0);
    EXPECT_EQ(stats["mlp.backward"].bytes.sent(), 0);
    const int rank = comm::current_world_rank();
    EXPECT_NEAR(compute, r.metrics.back().ranks[static_cast<size_t>(rank)].compute_busy_s, 1e-6);
}

TEST(Metrics, CriticalPathBoundLiesBetweenIdealAndBaseline) {
    const int steps = 3;
    const TracedRun base = run(small_config(false, false), steps);
    const TracedRun over = run(small_config(true, true), steps);
    const CallDurations base_d = median_call_durations(base.records);
    const CallDurations over_d = median_call_durations(over.records);
    const double bound = critical_path_bound_s(over.calls, base_d, over_d);
    // Serial sum of the baseline's durations: the baseline cannot beat it, the bound must.
    double serial = 0;
    for (const auto& [name, d] : base_d) {
        serial += d;
    }
    // Lower bounds: each stream must fit its own work. Every call counts at no more than the
    // shorter of its two medians (what the bound may use); the backward calls, which the delayed
    // run splits, are left out of the compute side.
    double comm = 0, forward = 0;
    for (const auto& [name, d] : base_d) {
        const auto it = over_d.find(name);
        const double shortest = it == over_d.end() ? d : std::min(d, it->second);
        if (name.find(".dispatch.") != std::string::npos ||
            name.find(".combine.") != std::string::npos) {
            comm += shortest;
        } else if (name.find("forward") != std::string::npos) {
            forward += shortest;
        }
    }
    EXPECT_LT(bound, serial);
    EXPECT_GE(bound, std::max(comm, forward) * 0.999);
    // The baseline's own schedule replayed with its own durations is the serial sum.
    EXPECT_NEAR(critical_path_bound_s(base.calls, base_d, base_d), serial, 1e-9);
}

}  // namespace
}  // namespace epo::bench
