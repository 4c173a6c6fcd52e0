#include "epo/bench/metrics.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "epo/bench/bench_report.h"
#include "epo/schedule/critical_path.h"

namespace epo::bench {
namespace {

TEST(NodeKind, StripsMicroBatchAndLayer) {
    EXPECT_EQ(node_kind_of("mb3.layer1.dispatch.forward"), "dispatch.forward");
    EXPECT_EQ(node_kind_of("mb12.layer10.mlp.backward_dw"), "mlp.backward_dw");
    EXPECT_EQ(node_kind_of("mb0.embedding.forward"), "embedding.forward");
    EXPECT_EQ(node_kind_of("mb3.layer1.dispatch.forward.chunk12"), "dispatch.forward");
    EXPECT_EQ(node_kind_of("wait mb3"), "wait");
    EXPECT_EQ(node_kind_of("optimizer_step"), "optimizer_step");
    EXPECT_EQ(node_kind_of("optimizer_step.update.bucket2"), "optimizer_step");
    EXPECT_EQ(node_kind_of("optimizer_step.squares.unbucketed"), "optimizer_step");
    EXPECT_EQ(node_kind_of("bucket2.param_gather"), "param_gather");
}

TEST(Summary, MedianMinMax) {
    const Summary odd = summarize({3, 1, 2});
    EXPECT_EQ(odd.median, 2);
    EXPECT_EQ(odd.min, 1);
    EXPECT_EQ(odd.max, 3);
    EXPECT_EQ(summarize({4, 1, 2, 3}).median, 2.5);
    EXPECT_EQ(summarize({}).median, 0);
}

// The table warns when the calibrated comm/compute was missed by more than the tolerance
// (this machine changed speed between calibration and runs), and only then.
TEST(BenchTable, WarnsWhenTheAchievedRatioMissesTheCalibration) {
    auto table_for = [](nlohmann::json calibration) {
        return format_table(
            {{"runs", nlohmann::json::array()},
             {"link", {{"inter_node_gbps", 0.44}, {"intra_node_gbps", 0.0}, {"latency_us", 0.0}}},
             {"calibration", std::move(calibration)},
             {"overlap_speedup", 1.45},
             {"overlap_efficiency", 0.9},
             {"loss_bitwise_identical", true},
             {"bitwise_identical", true}});
    };
    const std::string off = table_for({{"target_ratio", 1.0}, {"achieved_ratio", 1.41}});
    EXPECT_NE(off.find("achieved 1.41"), std::string::npos) << off;
    EXPECT_NE(
        off.find("warning: the baseline's comm/compute came out at 1.41, not the calibrated 1"),
        std::string::npos)
        << off;
    for (const double achieved : {0.8, 1.0, 1.2}) {
        const std::string near = table_for({{"target_ratio", 1.0}, {"achieved_ratio", achieved}});
        EXPECT_EQ(near.find("warning"), std::string::npos) << near;
    }
    EXPECT_NE(table_for({{"target_ratio", 2.0}, {"achieved_ratio", 1.4}}).find("warning"),
              std::string::npos);
    EXPECT_EQ(table_for(nullptr).find("warning"), std::string::npos);  // link model as configured
    EXPECT_EQ(table_for({{"target_ratio", 1.0}, {"achieved_ratio", nullptr}}).find("warning"),
              std::string::npos);
}

// The table puts the critical-path bound next to the theoretical cap 2NC/(NC+1), and the comm
// threads' CPU time next to their communication time.
TEST(BenchTable, ShowsTheBoundNextToTheCapAndTheCommCpu) {
    const auto run = [](const char* name, nlohmann::json bound) {
        return nlohmann::json{{"name", name},
                              {"step_time_s", {{"median", 2.0}, {"min", 2.0}, {"max", 2.0}}},
                              {"tokens_per_s", 1.0},
                              {"tflops_per_rank", 1.0},
                              {"compute_s", 1.0},
                              {"comm_s", 0.8},
                              {"exposed_comm_s", 0.5},
                              {"comm_cpu_s", 0.2},
                              {"speedup_vs_baseline", nullptr},
                              {"overlap_efficiency", nullptr},
                              {"critical_path_bound_s", std::move(bound)},
                              {"peak_rss_bytes", 1.0},
                              {"losses_match_baseline", true},
                              {"grad_norms_match_baseline", true},
                              {"params_match_baseline", true},
                              {"baseline_differences", ""}};
    };
    // A 2-micro-batch metrics.json with the schedule fields `schedule` adds.
    const auto table_of = [&](nlohmann::json schedule) {
        nlohmann::json m = {
            {"runs", {run("baseline", nullptr), run("overlap", 1.25)}},
            {"link", {{"inter_node_gbps", 0.44}, {"intra_node_gbps", 0.0}, {"latency_us", 0.0}}},
            {"calibration", nullptr},
            {"num_micro_batches", 2},
            {"overlap_speedup", 1.45},
            {"overlap_efficiency", 0.9},
            {"loss_bitwise_identical", true},
            {"bitwise_identical", true}};
        m.update(schedule);
        return format_table(m);
    };
    const std::string table =
        table_of({{"num_chunks", 2}, {"theoretical_cap", schedule::overlap_speedup_cap(2, 2)}});
    EXPECT_NE(table.find("overlap: critical-path bound 1.250 s = at most 1.60x; theoretical cap "
                         "2NC/(NC+1) = 1.60x (N = 2, C = 2)"),
              std::string::npos)
        << table;
    EXPECT_NE(table.find("baseline: comm threads' CPU 0.200 s per step for 0.800 s of "
                         "communication (25%)"),
              std::string::npos)
        << table;
    // With paired edges the cap is 2 and named so.
    const std::string paired =
        table_of({{"num_chunks", 1},
                  {"pair_edges", true},
                  {"theoretical_cap", schedule::overlap_speedup_cap(2, 1, true)}});
    EXPECT_NE(paired.find("theoretical cap with paired edges = 2.00x (N = 2, C = 1)"),
              std::string::npos)
        << paired;
}

TEST(OverlapEfficiency, AgainstTheBound) {
    EXPECT_DOUBLE_EQ(*overlap_efficiency(10, 6, 5), 0.8);
    EXPECT_DOUBLE_EQ(*overlap_efficiency(10, 10, 5), 0.0);
    EXPECT_FALSE(overlap_efficiency(5, 4, 5).has_value());
}

TEST(PeakRss, GrowsWithTouchedMemoryAndResets) {
    const int64_t before = peak_rss_bytes();
    ASSERT_GT(before, 0);
    constexpr size_t kBytes = 256 << 20;
    {
        std::unique_ptr<char[]> block(new char[kBytes]);
        std::memset(block.get(), 1, kBytes);  // touch every page
        EXPECT_GE(peak_rss_bytes(), current_rss_bytes());
        EXPECT_GE(peak_rss_bytes() - before, static_cast<int64_t>(kBytes) / 2);
    }
    // The block went back to the OS (glibc maps blocks this large); after a reset the peak is
    // the current size again.
    ASSERT_TRUE(reset_peak_rss());
    EXPECT_LT(peak_rss_bytes(), before + static_cast<int64_t>(kBytes) / 2);
}

std::vector<runtime::TaskRecord> records(
    const std::vector<schedule::NodeCall>& calls,
    const std::function<double(const schedule::NodeCall&)>& d) {
    std::vector<runtime::TaskRecord> out;
    int64_t t = 0;
    for (const auto& c : calls) {
        const int64_t ns = static_cast<int64_t>(d(c) * 1e9);
        out.push_back(
            {.name = schedule::call_name(c), .stream = "compute", .start_ns = t, .end_ns = t + ns});
        t += ns;
    }
    return out;
}

TEST(CriticalPathBound, BaselineDurationsSplitForDelayedWgrad) {
    const schedule::ScheduleShape shape{
        .num_micro_batches = 3, .moe_layers = {true, true}, .delay_wgrad = true};
    // Baseline: every call 1 ms, comm calls 2 ms; optimizer 5 ms.
    const auto base_d = [](const schedule::NodeCall& c) {
        return schedule::stream_of(c.node) == schedule::StreamId::kComm ? 2e-3 : 1e-3;
    };
    std::vector<runtime::TaskRecord> base = records(schedule::baseline_schedule(shape), base_d);
    base.push_back(
        {.name = "optimizer_step", .stream = "compute", .start_ns = 0, .end_ns = 5'000'000});
    // The delayed run measured dgrad : wgrad as 1 : 3 for every split node, at other absolute
    // durations (contention): only the proportion may be used.
    const auto own_d = [](const schedule::NodeCall& c) {
        if (c.phase == schedule::Phase::kBackwardDw) {
            return 3e-2;
        }
        return c.wgrad_delayed ? 1e-2 : 7e-3;
    };
    const std::vector<schedule::NodeCall> calls = schedule::overlap_schedule(shape);
    const CallDurations baseline = median_call_durations({base});
    const CallDurations own = median_call_durations({records(calls, own_d)});
    const double bound = critical_path_bound_s(calls, baseline, own);
    const double expected =
        schedule::critical_path_seconds(calls,
                                        [&](const schedule::NodeCall& c) {
                                            if (c.phase == schedule::Phase::kBackwardDw) {
                                                return 0.75 * base_d(c);
                                            }
                                            return c.wgrad_delayed ? 0.25 * base_d(c) : base_d(c);
                                        }) +
        5e-3;
    EXPECT_NEAR(bound, expected, 1e-9);
    // And it is below the serial baseline.
    double serial = 5e-3;
    for (const auto& c : schedule::baseline_schedule(shape)) {
        serial += base_d(c);
    }
    EXPECT_LT(bound, serial);
}

// A call that was shorter in the run itself (a comm call that waited less for its peer) counts
// at that shorter duration: the bound is the best case of what was measured.
TEST(CriticalPathBound, TakesTheShorterOfBaselineAndOwnDurations) {
    const schedule::ScheduleShape shape{.num_micro_batches = 2, .moe_layers = {true}};
    const auto base_d = [](const schedule::NodeCall& c) {
        return schedule::stream_of(c.node) == schedule::StreamId::kComm ? 4e-3 : 1e-3;
    };
    const auto own_d = [](const schedule::NodeCall& c) {
        return schedule::stream_of(c.node) == schedule::StreamId::kComm ? 1e-3 : 3e-3;
    };
    std::vector<runtime::TaskRecord> base = records(schedule::baseline_schedule(shape), base_d);
    base.push_back(
        {.name = "optimizer_step", .stream = "compute", .start_ns = 0, .end_ns = 5'000'000});
    const std::vector<schedule::NodeCall> calls = schedule::overlap_schedule(shape);
    std::vector<runtime::TaskRecord> own = records(calls, own_d);
    own.push_back(
        {.name = "optimizer_step", .stream = "compute", .start_ns = 0, .end_ns = 2'000'000});
    const double bound =
        critical_path_bound_s(calls, median_call_durations({base}), median_call_durations({own}));
    const double expected =
        schedule::critical_path_seconds(calls, [](const schedule::NodeCall&) { return 1e-3; }) +
        2e-3;
    EXPECT_NEAR(bound, expected, 1e-9);
}

// Chunks by experts run whole in the baseline (W014): a chunk call gets its share of the whole
// call's baseline time, in the proportion the run itself measured across the chunks (1 : 3
// here), and a delayed chunk's halves split that share as the run measured them (1 : 1).
TEST(CriticalPathBound, ChunkCallsShareTheWholeBaselineCall) {
    const schedule::ScheduleShape whole{
        .num_micro_batches = 2, .moe_layers = {true}, .delay_wgrad = true};
    schedule::ScheduleShape chunked = whole;
    chunked.num_moe_chunks = 2;
    const auto base_d = [](const schedule::NodeCall& c) {
        return schedule::stream_of(c.node) == schedule::StreamId::kComm ? 2e-3 : 1e-3;
    };
    // The run's own durations are far longer (contention): only their proportions may count.
    const auto own_d = [](const schedule::NodeCall& c) { return c.moe_chunk == 1 ? 3e-2 : 1e-2; };
    const std::vector<schedule::NodeCall> calls = schedule::overlap_schedule(chunked);
    const double bound = critical_path_bound_s(
        calls, median_call_durations({records(schedule::baseline_schedule(whole), base_d)}),
        median_call_durations({records(calls, own_d)}));
    const double expected =
        schedule::critical_path_seconds(calls, [&](const schedule::NodeCall& c) {
            const double share = c.moe_chunk < 0 ? 1.0 : c.moe_chunk == 0 ? 0.25 : 0.75;
            const bool split = c.phase == schedule::Phase::kBackwardDw || c.wgrad_delayed;
            return base_d(c) * share * (split ? 0.5 : 1.0);
        });
    EXPECT_NEAR(bound, expected, 1e-9);
}

// The optimizer step in the bound, by hand (tests/schedule/critical_path_test.cpp has the same
// step): output backward 1 s, two bucket reductions 2 s each, embedding backward 1 s; squares
// and the norm 0.5 s each, updates 1 s, each bucket's gather 2 s, optimizer_step.end 0.25 s.
// The baseline measured every piece 0.1 s longer: the shorter median counts.
//   gathers under the optimizer step   squares0 [3,3.5] squares1 [5,5.5] norm [5.5,6]
//                                      update1 [6,7] gather1 [7,9] update0 [7,8] gather0 [9,11]
//                                      end [8,8.25]: 11 s (the gathers' 4 s on the comm stream)
//   gathers at the end of the step     update1 [6,7] update0 [7,8] gather_all (4 s) [8,12]
//                                      end [12,12.25]: 12.25 s
//   gathers in the next forward        update1 [6,7] update0 [7,8] end [8,8.25]: 8.25 s
// Summing the pieces after the schedule instead would give 5 + 3.25 = 8.25 s whatever the
// gathers do.
TEST(CriticalPathBound, ChargesTheOptimizersGathersWhereTheyRun) {
    const std::vector<schedule::NodeCall> calls = {
        {0, -1, schedule::NodeKind::kOutput, schedule::Phase::kBackward},
        {0, 0, schedule::NodeKind::kGradReduce, schedule::Phase::kBackward},
        {0, -1, schedule::NodeKind::kEmbedding, schedule::Phase::kBackward},
        {0, 1, schedule::NodeKind::kGradReduce, schedule::Phase::kBackward}};
    const auto call_d = [](const schedule::NodeCall& c) {
        return c.node == schedule::NodeKind::kGradReduce ? 2.0 : 1.0;
    };
    const auto bound = [&](bool each_bucket, bool at_end) {
        const std::vector<train::OptimizerOp> ops =
            train::optimizer_ops({.num_buckets = 2,
                                  .has_unbucketed = false,
                                  .buckets_reduced = true,
                                  .gather_each_bucket = each_bucket,
                                  .gather_at_end = at_end});
        const auto piece_d = [](const train::OptimizerOp& op) {
            switch (op.kind) {
                case train::OptimizerOpKind::kSquares:
                case train::OptimizerOpKind::kGradNorm:
                    return 0.5;
                case train::OptimizerOpKind::kUpdate:
                    return 1.0;
                case train::OptimizerOpKind::kGather:
                    return 2.0;
                default:
                    return 4.0;  // the gather of every weight at the end
            }
        };
        std::vector<runtime::TaskRecord> own = records(calls, call_d), base = own;
        const auto add = [](std::vector<runtime::TaskRecord>& r, const std::string& name,
                            double s) {
            r.push_back({.name = name,
                         .stream = "compute",
                         .start_ns = 0,
                         .end_ns = static_cast<int64_t>(s * 1e9)});
        };
        for (const train::OptimizerOp& op : ops) {
            add(own, train::op_name(op), piece_d(op));
            add(base, train::op_name(op), piece_d(op) + 0.1);
        }
        add(own, "optimizer_step.end", 0.25);
        add(base, "optimizer_step.end", 0.35);
        return critical_path_bound_s(calls, median_call_durations({base}),
                                     median_call_durations({own}), ops);
    };
    EXPECT_NEAR(bound(true, false), 11.0, 1e-6);
    EXPECT_NEAR(bound(false, true), 12.25, 1e-6);
    EXPECT_NEAR(bound(false, false), 8.25, 1e-6);
}

TEST(CriticalPathBound, MissingDurationIsAnError) {
    const schedule::ScheduleShape shape{.num_micro_batches = 2, .moe_layers = {true}};
    EXPECT_THROW(critical_path_bound_s(schedule::overlap_schedule(shape), {}, {}), Error);
}

TEST(NodeStats, SumsPerKind) {
    NodeStatsMap stats;
    runtime::TaskRecord a{
        .name = "mb0.layer0.dispatch.forward", .stream = "comm", .start_ns = 0, .end_ns = 1000};
    a.bytes.inter_sent = 10;
    runtime::TaskRecord b = a;
    b.name = "mb1.layer1.dispatch.forward";
    add_node_stats(stats, {a, b});
    ASSERT_EQ(stats.size(), 1u);
    EXPECT_EQ(stats["dispatch.forward"].count, 2);
    EXPECT_EQ(stats["dispatch.forward"].bytes.inter_sent, 20);
    EXPECT_NEAR(stats["dispatch.forward"].total_s, 2e-6, 1e-15);
}

}  // namespace
}  // namespace epo::bench
