#include "epo/schedule/critical_path.h"

#include <gtest/gtest.h>

namespace epo::schedule {
namespace {

double unit_durations(const NodeCall& c, double comm, double compute) {
    return stream_of(c.node) == StreamId::kComm ? comm : compute;
}

TEST(CriticalPath, BaselineIsTheSumOfAllDurations) {
    ScheduleShape s{3, {true, true}, false};
    const auto calls = baseline_schedule(s);
    double sum = 0;
    for (const auto& c : calls)
        sum += unit_durations(c, 2.0, 1.0);
    EXPECT_DOUBLE_EQ(
        critical_path_seconds(calls, [](const NodeCall& c) { return unit_durations(c, 2.0, 1.0); }),
        sum);
}

TEST(CriticalPath, OverlapHidesCommunicationInCombinedSteps) {
    ScheduleShape s{8, {true, true}, false};
    auto dur = [](const NodeCall& c) { return unit_durations(c, 1.0, 1.0); };
    const double base = critical_path_seconds(baseline_schedule(s), dur);
    const double overlap = critical_path_seconds(overlap_schedule(s), dur);
    EXPECT_LT(overlap, base);
    // With comm as long as compute, the combined steps approach the compute time alone: the
    // bound lies between max(compute, comm) totals and the serial sum.
    double compute = 0;
    for (const auto& c : baseline_schedule(s))
        compute += stream_of(c.node) == StreamId::kCompute;
    EXPECT_GE(overlap, compute);
    EXPECT_LT(overlap, 0.75 * base);
}

TEST(CriticalPath, MicroBatchOrderIsRespected) {
    // Two calls of one micro-batch on different streams cannot overlap.
    std::vector<NodeCall> calls = {{0, 0, NodeKind::kPreDispatch, Phase::kForward},
                                   {0, 0, NodeKind::kDispatch, Phase::kForward}};
    EXPECT_DOUBLE_EQ(critical_path_seconds(calls, [](const NodeCall&) { return 1.0; }), 2.0);
    calls[1].micro_batch = 1;  // independent micro-batches on two streams do overlap
    EXPECT_DOUBLE_EQ(critical_path_seconds(calls, [](const NodeCall&) { return 1.0; }), 1.0);
}

TEST(CriticalPath, GradReductionIsASideBranch) {
    // The backward's next call does not wait for a reduction on the other stream; the bound
    // still ends when the reduction does.
    const std::vector<NodeCall> calls = {{0, -1, NodeKind::kOutput, Phase::kBackward},
                                         {0, 0, NodeKind::kGradReduce, Phase::kBackward},
                                         {0, -1, NodeKind::kEmbedding, Phase::kBackward}};
    const auto dur = [](const NodeCall& c) { return c.node == NodeKind::kGradReduce ? 3.0 : 1.0; };
    EXPECT_DOUBLE_EQ(critical_path_seconds(calls, dur), 4.0);  // 1 + 3; the embedding runs at 1
    std::vector<NodeCall> serial = calls;
    serial[1].node = NodeKind::kCombine;  // an ordinary comm call is waited for: 1 + 3 + 1
    EXPECT_DOUBLE_EQ(
        critical_path_seconds(
            serial, [](const NodeCall& c) { return c.node == NodeKind::kCombine ? 3.0 : 1.0; }),
        5.0);
}

TEST(CriticalPath, ParamGatherIsAPrefetchItsReaderWaitsFor) {
    // A gather waits for nothing of its micro-batch, only for its stream; the call that reads
    // the bucket waits for it, the other calls do not.
    std::vector<NodeCall> calls = {{0, 0, NodeKind::kParamGather, Phase::kForward},
                                   {0, -1, NodeKind::kEmbedding, Phase::kForward},
                                   {0, 1, NodeKind::kParamGather, Phase::kForward},
                                   {0, 0, NodeKind::kPreDispatch, Phase::kForward}};
    calls[1].wait_bucket = 0;
    calls[3].wait_bucket = 1;
    const auto dur = [](const NodeCall& c) { return c.node == NodeKind::kParamGather ? 2.0 : 1.0; };
    // gather0 [0,2], embedding [2,3], gather1 [2,4] (stream order only), pre_dispatch [4,5].
    EXPECT_DOUBLE_EQ(critical_path_seconds(calls, dur), 5.0);
    calls[3].wait_bucket = -1;  // nothing waits for gather1: pre_dispatch runs at [3,4]
    EXPECT_DOUBLE_EQ(critical_path_seconds(calls, dur), 4.0);
}

}  // namespace
}  // namespace epo::schedule
