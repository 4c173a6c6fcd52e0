// The planner's replay (src/epo/plan/plan.h replay_schedule): a schedule with known call
// durations against the time worked out by hand, with and without the slowdown while the streams
// overlap.
#include <gtest/gtest.h>

#include <vector>

#include "epo/plan/plan.h"
#include "epo/schedule/critical_path.h"

namespace epo::plan {
namespace {

using schedule::NodeCall;
using schedule::StreamId;

double unit(const NodeCall& c) {
    return schedule::stream_of(c.node) == StreamId::kComm ? 2.0 : 1.0;
}

// One MoE layer, 2 micro-batches, compute calls 1 s, comm calls 2 s.
const schedule::ScheduleShape kTwoMicroBatches{2, {true}, false};

TEST(PlanReplay, BaselineIsTheSerialSum) {
    // Per micro-batch: embedding, pre_dispatch, mlp, output forward and backward = 8 compute
    // calls (8 s), dispatch and combine forward and backward = 4 comm calls (8 s).
    const Replay r = replay_schedule(schedule::baseline_schedule(kTwoMicroBatches), unit, 0);
    EXPECT_DOUBLE_EQ(r.end_s, 32.0);
    EXPECT_DOUBLE_EQ(r.compute_s, 16.0);
    EXPECT_DOUBLE_EQ(r.comm_s, 16.0);
}

TEST(PlanReplay, OverlapEqualsTheHandComputedTime) {
    // Worked out call by call (start = max(stream free, micro-batch's previous call done)):
    //   mb0 forward alone            emb 0-1, pd 1-2, dispatch 2-4, mlp 4-5, combine 5-7, out 7-8
    //   combined step (f = 1, b = 0) mb1 emb 8-9, mb0 out.b 9-10, mb0 combine.b 10-12,
    //                                mb1 pd 10-11, mb0 mlp.b 12-13, mb1 dispatch 12-14,
    //                                mb0 dispatch.b 14-16, mb1 mlp 14-15, mb1 combine 16-18,
    //                                mb0 pd.b 16-17, mb1 out 18-19, mb0 emb.b 19-20
    //   mb1 backward alone           out.b 20-21, combine.b 21-23, mlp.b 23-24, dispatch.b
    //                                24-26, pd.b 26-27, emb.b 27-28
    const auto calls = schedule::overlap_schedule(kTwoMicroBatches);
    const Replay r = replay_schedule(calls, unit, 0);
    EXPECT_DOUBLE_EQ(r.end_s, 28.0);
    EXPECT_DOUBLE_EQ(r.compute_s, 16.0);
    EXPECT_DOUBLE_EQ(r.comm_s, 16.0);
    EXPECT_DOUBLE_EQ(r.end_s, schedule::critical_path_seconds(calls, unit));
}

TEST(PlanReplay, SlowdownOnlyWhereTheStreamsOverlap) {
    // The baseline never runs both streams at once: no slowdown. In the overlap schedule the
    // combined step's calls share the device: longer, still below the baseline here.
    const auto base = replay_schedule(schedule::baseline_schedule(kTwoMicroBatches), unit, 0.5);
    EXPECT_DOUBLE_EQ(base.end_s, 32.0);
    const auto slowed = replay_schedule(schedule::overlap_schedule(kTwoMicroBatches), unit, 0.5);
    EXPECT_GT(slowed.end_s, 28.0);
    EXPECT_GT(slowed.compute_s, 16.0);
    EXPECT_LT(slowed.end_s, 32.0);
}

TEST(PlanReplay, SlowdownOfOneOverlappedPairIsHandComputed) {
    // Two micro-batches' independent calls on the two streams, 1 s and 2 s. Replay 1: spans 0-1
    // and 0-2, overlapping for 1 s: compute 1 * (1 + 0.5 * 1/1) = 1.5, comm 2 * (1 + 0.5 * 1/2)
    // = 2.5. Replay 2: spans 0-1.5 and 0-2.5, overlapping for 1.5 s: compute 1 * (1 + 0.5 *
    // 1.5/1.5) = 1.5, comm 2 * (1 + 0.5 * 1.5/2.5) = 2.6. Replay 3 runs those: the end is 2.6.
    const std::vector<NodeCall> calls = {
        {0, 0, schedule::NodeKind::kMlp, schedule::Phase::kForward},
        {1, 0, schedule::NodeKind::kDispatch, schedule::Phase::kForward}};
    const Replay r = replay_schedule(calls, unit, 0.5);
    EXPECT_DOUBLE_EQ(r.compute_s, 1.5);
    EXPECT_DOUBLE_EQ(r.comm_s, 2.6);
    EXPECT_DOUBLE_EQ(r.end_s, 2.6);
}

}  // namespace
}  // namespace epo::plan
