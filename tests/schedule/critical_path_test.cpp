#include "epo/schedule/critical_path.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "schedule/schedule_test_util.h"

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

// Delayed weight gradients run off their micro-batch's chain: the dispatch backward starts when
// the expert dgrad ends, beside the expert wgrad; a gradient reduction after the wgrad.
TEST(CriticalPath, DelayedWeightGradientsRunBesideTheDispatchBackward) {
    const std::vector<NodeCall> calls = test_util::delayed_expert_backward();
    const auto dur = [](const NodeCall& c) { return c.phase == Phase::kBackwardDw ? 3.0 : 1.0; };
    const std::vector<CallSpan> spans = critical_path_spans(calls, dur);
    EXPECT_DOUBLE_EQ(spans[2].start, 1.0);  // not 4.0: the wgrad is not the dispatch's input
    EXPECT_DOUBLE_EQ(spans[3].start, 4.0);  // the reduction reads the wgrad's result
    EXPECT_DOUBLE_EQ(critical_path_seconds(calls, dur), 5.0);
}

// Shared-expert overlap: the shared expert runs beside the dispatch and the combine backward,
// so one micro-batch through one MoE layer (14 calls of unit duration, embedding and output
// included) takes 12 units, not 14 as when the same calls run in series.
TEST(CriticalPath, SharedExpertRunsBesideTheAllToAll) {
    ScheduleShape s{1, {true}};
    s.shared_expert_overlap = true;
    const auto one = [](const NodeCall&) { return 1.0; };
    EXPECT_DOUBLE_EQ(critical_path_seconds(baseline_schedule(s), one), 12.0);
    std::vector<NodeCall> serial = baseline_schedule(s);
    for (NodeCall& c : serial)
        if (c.node == NodeKind::kSharedExpert)
            c.node = NodeKind::kMlp;  // an ordinary compute call waits for the all-to-all
    EXPECT_DOUBLE_EQ(critical_path_seconds(serial, one), 14.0);
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

// MoE chunks: a chunk's calls wait for the chunk's previous call only, a whole call for every
// chunk. One MoE layer's forward alone, 2 chunks, every call 1 s: pre [0,1], d0 [1,2], d1 [2,3]
// with m0 [2,3], c0 [3,4] with m1 [3,4], c1 [4,5]: 5 s against the baseline's 7.
TEST(CriticalPath, ChunksOfOneMicroBatchOverlap) {
    ScheduleShape s{1, {true}, false};
    s.num_moe_chunks = 2;
    const auto one = [](const NodeCall&) { return 1.0; };
    std::vector<NodeCall> forward;
    for (const auto& c : overlap_schedule(s))
        if (c.phase == Phase::kForward && c.layer == 0)
            forward.push_back(c);
    EXPECT_DOUBLE_EQ(critical_path_seconds(forward, one), 5.0);
    std::vector<NodeCall> base_forward;
    for (const auto& c : baseline_schedule(s))
        if (c.phase == Phase::kForward && c.layer == 0)
            base_forward.push_back(c);
    EXPECT_DOUBLE_EQ(critical_path_seconds(base_forward, one), 7.0);
    // The whole next call waits for the last chunk.
    forward.push_back({0, 1, NodeKind::kPreDispatch, Phase::kForward});
    const auto spans = critical_path_spans(forward, one);
    EXPECT_DOUBLE_EQ(spans.back().start, 5.0);
}

// Uneven chunks (one expert group gets most tokens): every dispatch goes before the first
// combine, so a long chunk 0 does not hold chunk 2's dispatch. Forward alone, 3 chunks, every
// call 1 s but m0 3 s: pre [0,1], d0 d1 d2 [1,4], m0 [2,5] c0 [5,6], m1 [5,6] c1 [6,7], m2 [6,7]
// c2 [7,8]: 8 s (a combine between the dispatches, d0 d1 c0 d2 c1 c2, gives 9).
TEST(CriticalPath, UnevenChunksDoNotHoldTheNextDispatch) {
    ScheduleShape s{1, {true}, false};
    s.num_moe_chunks = 3;
    const auto dur = [](const NodeCall& c) {
        return c.node == NodeKind::kMlp && c.moe_chunk == 0 ? 3.0 : 1.0;
    };
    std::vector<NodeCall> forward;
    for (const auto& c : overlap_schedule(s))
        if (c.phase == Phase::kForward && c.layer == 0)
            forward.push_back(c);
    EXPECT_DOUBLE_EQ(critical_path_seconds(forward, dur), 8.0);
}

// Paired edges, 2 micro-batches a and b, one MoE layer, every call 1 s. Forward pair: compute
// a.emb [0,1] b.emb [1,2] a.pre [2,3] b.pre [3,4] a.mlp [4,5] b.mlp [5,6] a.out [6,7] b.out [7,8],
// comm a.disp [3,4] (under b.pre) b.disp [4,5] a.comb [5,6] b.comb [6,7]; the backward pair
// likewise from 8 to 16: 16 s, against 24 s for the baseline (nothing overlaps) and more for the
// unpaired schedule, whose first forward and last backward run alone.
TEST(CriticalPath, PairedEdgesHideTheEdgesCommunication) {
    const auto dur = [](const NodeCall&) { return 1.0; };
    ScheduleShape s{2, {true}, false};
    const double base = critical_path_seconds(baseline_schedule(s), dur);
    const double unpaired = critical_path_seconds(overlap_schedule(s), dur);
    s.pair_edges = true;
    EXPECT_DOUBLE_EQ(base, 24.0);
    EXPECT_DOUBLE_EQ(critical_path_seconds(overlap_schedule(s), dur), 16.0);
    EXPECT_GT(unpaired, 16.0);
    // 8 micro-batches, 2 layers: pairing the edges is never slower than the unpaired schedule.
    for (bool delay : {false, true}) {
        ScheduleShape m{8, {true, true}, delay};
        const double plain = critical_path_seconds(overlap_schedule(m), dur);
        m.pair_edges = true;
        EXPECT_LT(critical_path_seconds(overlap_schedule(m), dur), plain) << "delay " << delay;
    }
}

// The backward pair's reductions go behind the last MoE layer's dispatches. The test above's
// step with two buckets (the output layer; layer 0 and the embedding), a reduction taking 2 s:
// bucket 0 runs [13,15] under the attention backward (b.dispatch ends at 13), bucket 1 [16,18]
// after the last embedding backward: 18 s. In front of the dispatches (the order a backward
// alone uses) bucket 0 would run [11,13] and hold both dispatches back by 2 s: 20 s.
TEST(CriticalPath, PairedReductionsDoNotHoldTheLastDispatches) {
    ScheduleShape s{2, {true}, false};
    s.pair_edges = true;
    s.grad_bucket_ends = {1, kEmbeddingPosition};
    const auto dur = [](const NodeCall& c) { return c.node == NodeKind::kGradReduce ? 2.0 : 1.0; };
    std::vector<NodeCall> calls = overlap_schedule(s);
    EXPECT_DOUBLE_EQ(critical_path_seconds(calls, dur), 18.0);
    const auto named = [&](const std::string& name) {
        return std::find_if(calls.begin(), calls.end(),
                            [&](const NodeCall& c) { return call_name(c) == name; });
    };
    const NodeCall reduce = *named("mb1.bucket0.grad_reduce");
    calls.erase(named("mb1.bucket0.grad_reduce"));
    calls.insert(named("mb1.layer0.combine.backward") + 1, reduce);
    EXPECT_DOUBLE_EQ(critical_path_seconds(calls, dur), 20.0);
}

// With one micro-batch the unchunked overlap schedule is the baseline; chunks make it faster.
TEST(CriticalPath, ChunksMakeOneMicroBatchOverlap) {
    const auto dur = [](const NodeCall&) { return 1.0; };
    ScheduleShape whole{1, {true, true}, false};
    ScheduleShape chunked = whole;
    chunked.num_moe_chunks = 4;
    // Chunked durations: a chunk takes 1/C of its whole node.
    const auto chunk_dur = [&](const NodeCall& c) {
        return c.moe_chunk >= 0 ? dur(c) / chunked.num_moe_chunks : dur(c);
    };
    const double base = critical_path_seconds(baseline_schedule(whole), dur);
    EXPECT_DOUBLE_EQ(critical_path_seconds(overlap_schedule(whole), dur), base);
    EXPECT_DOUBLE_EQ(critical_path_seconds(baseline_schedule(chunked), chunk_dur), base);
    // Each MoE layer: pre_dispatch 1 s, then 2 s of comm with the experts under it (3 s, not
    // 4): 16 s against 20.
    EXPECT_DOUBLE_EQ(critical_path_seconds(overlap_schedule(chunked), chunk_dur), 0.8 * base);
}

// The optimizer step after the schedule (the tail), by hand. The schedule: output backward
// [0,1], bucket 0's reduction [1,3] (comm, after the output), embedding backward [1,2], bucket
// 1's reduction [3,5]. The optimizer with clipping and 2 buckets: squares 0.5 s each (bucket b's
// after its reduction), the norm 0.5 s (after the schedule's comm calls), updates 1 s (bucket 1
// first), gathers 2 s.
std::vector<NodeCall> tail_schedule() {
    return {{0, -1, NodeKind::kOutput, Phase::kBackward},
            {0, 0, NodeKind::kGradReduce, Phase::kBackward},
            {0, -1, NodeKind::kEmbedding, Phase::kBackward},
            {0, 1, NodeKind::kGradReduce, Phase::kBackward}};
}
double tail_durations(const NodeCall& c) {
    return c.node == NodeKind::kGradReduce ? 2.0 : 1.0;
}
std::vector<TailCall> tail_squares_and_norm() {
    return {{.duration_s = 0.5, .waits_for_reduction = 0},
            {.duration_s = 0.5, .waits_for_reduction = 1},
            {.duration_s = 0.5, .waits_for_schedule = true}};
}

// Gathers under the optimizer step run on the comm stream, each after its bucket's update:
// squares0 [3,3.5], squares1 [5,5.5], norm [5.5,6], update1 [6,7], gather1 [7,9], update0 [7,8],
// gather0 [9,11]: 11 s. At the end of the step, one compute-stream gather of 4 s after the
// updates: [8,12]. In the next forward (calls of the next step's schedule), none here: 8 s.
TEST(CriticalPath, TailChargesTheOptimizersGathersWhereTheyRun) {
    const std::vector<NodeCall> calls = tail_schedule();
    EXPECT_DOUBLE_EQ(critical_path_seconds(calls, tail_durations), 5.0);
    std::vector<TailCall> under = tail_squares_and_norm();
    under.push_back({.duration_s = 1.0});                                             // 3
    under.push_back({.stream = StreamId::kComm, .duration_s = 2.0, .waits_for = 3});  // 4
    under.push_back({.duration_s = 1.0});                                             // 5
    under.push_back({.stream = StreamId::kComm, .duration_s = 2.0, .waits_for = 5});
    EXPECT_DOUBLE_EQ(critical_path_seconds(calls, tail_durations, under), 11.0);
    std::vector<TailCall> at_end = tail_squares_and_norm();
    at_end.push_back({.duration_s = 1.0});
    at_end.push_back({.duration_s = 1.0});
    at_end.push_back({.duration_s = 4.0});
    EXPECT_DOUBLE_EQ(critical_path_seconds(calls, tail_durations, at_end), 12.0);
    std::vector<TailCall> none = tail_squares_and_norm();
    none.push_back({.duration_s = 1.0});
    none.push_back({.duration_s = 1.0});
    EXPECT_DOUBLE_EQ(critical_path_seconds(calls, tail_durations, none), 8.0);
    // A piece that waits for a reduction the schedule does not hold is an error.
    EXPECT_THROW(critical_path_seconds(calls, tail_durations, {{.waits_for_reduction = 2}}),
                 std::exception);
}

}  // namespace
}  // namespace epo::schedule
