// The one-stage schedules' call lists (schedule.h): the combined step's order, the streams, the
// dependencies, the bucketed reductions and the distributed optimizer's gathers.
#include "epo/schedule/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include "schedule/schedule_test_util.h"

namespace epo::schedule {
namespace {

using namespace test_util;

TEST(Schedule, CombinedStepFollowsTheTenStepPairOrder) {
    // 2 MoE layers, 2 micro-batches, delayed wgrad: the combined step of f=1, b=0.
    const auto calls = names(overlap_schedule(moe_shape(2, 2, true)));
    const std::vector<std::string> forward0 = {
        "mb0.embedding.forward",       "mb0.layer0.pre_dispatch.forward",
        "mb0.layer0.dispatch.forward", "mb0.layer0.mlp.forward",
        "mb0.layer0.combine.forward",  "mb0.layer1.pre_dispatch.forward",
        "mb0.layer1.dispatch.forward", "mb0.layer1.mlp.forward",
        "mb0.layer1.combine.forward",  "mb0.output.forward"};
    const std::vector<std::string> combined = {
        "mb1.embedding.forward", "mb0.output.backward",
        // pair j=0: forward layer 0 with backward layer 1
        "mb0.layer1.combine.backward",          // 1
        "mb1.layer0.pre_dispatch.forward",      // 2
        "mb0.layer1.mlp.backward",              // 3
        "mb1.layer0.dispatch.forward",          // 4
        "mb0.layer1.mlp.backward_dw",           // 5
        "mb0.layer1.dispatch.backward",         // 6
        "mb1.layer0.mlp.forward",               // 7
        "mb1.layer0.combine.forward",           // 8
        "mb0.layer1.pre_dispatch.backward",     // 9
        "mb0.layer1.pre_dispatch.backward_dw",  // 10
        // pair j=1: forward layer 1 with backward layer 0
        "mb0.layer0.combine.backward", "mb1.layer1.pre_dispatch.forward", "mb0.layer0.mlp.backward",
        "mb1.layer1.dispatch.forward", "mb0.layer0.mlp.backward_dw", "mb0.layer0.dispatch.backward",
        "mb1.layer1.mlp.forward", "mb1.layer1.combine.forward", "mb0.layer0.pre_dispatch.backward",
        // no step 10 for the backward's last layer inside the pair...
        "mb1.output.forward", "mb0.embedding.backward",
        "mb0.layer0.pre_dispatch.backward_dw"};  // ...it runs after the chunk
    ASSERT_GE(calls.size(), forward0.size() + combined.size());
    EXPECT_EQ(std::vector<std::string>(calls.begin(), calls.begin() + 10), forward0);
    EXPECT_EQ(std::vector<std::string>(calls.begin() + 10, calls.begin() + 10 + combined.size()),
              combined);
}

TEST(Schedule, StreamsFollowTheNodeSplit) {
    EXPECT_EQ(stream_of(NodeKind::kDispatch), StreamId::kComm);
    EXPECT_EQ(stream_of(NodeKind::kCombine), StreamId::kComm);
    EXPECT_EQ(stream_of(NodeKind::kGradReduce), StreamId::kComm);
    for (NodeKind n :
         {NodeKind::kEmbedding, NodeKind::kPreDispatch, NodeKind::kMlp, NodeKind::kOutput}) {
        EXPECT_EQ(stream_of(n), StreamId::kCompute);
    }
}

TEST(Schedule, EveryNodeRunsOnceInDependencyAndAccumulationOrder) {
    for (int mbs : {1, 2, 3, 8}) {
        for (bool delay : {false, true}) {
            for (auto pattern : {std::vector<bool>{true, true},
                                 std::vector<bool>{false, true, true}, std::vector<bool>{true}}) {
                ScheduleShape s{mbs, pattern, delay};
                const auto overlap = overlap_schedule(s);
                expect_complete(overlap, s, delay);
                expect_same_dependencies_and_accumulation_order(overlap, s);
                expect_complete(baseline_schedule(s), s, false);
            }
        }
    }
}

// ---- Paired edges (schedule.h "Paired edges") ----

TEST(Schedule, DenseLayersIssueNoCommunicationNodes) {
    ScheduleShape s{2, {false, false}, true};
    for (const auto& c : overlap_schedule(s)) {
        EXPECT_EQ(stream_of(c.node), StreamId::kCompute) << call_name(c);
    }
}

TEST(Schedule, OneMicroBatchOverlapEqualsBaseline) {
    ScheduleShape s = moe_shape(1, 3, true);
    EXPECT_EQ(overlap_schedule(s), baseline_schedule(s));
}

// The last backward of the step with a bucket per model position: each reduction goes behind the
// comm call that follows its bucket's last node (never in front of it), or right away when a
// compute call follows; earlier backwards reduce nothing. Both schedules end alike.
TEST(Schedule, GradReductionsFireInTheLastBackward) {
    for (const bool overlap : {false, true}) {
        ScheduleShape s = moe_shape(3, 2, false);
        s.grad_bucket_ends = {2, 1, 0, kEmbeddingPosition};
        const auto calls = names(overlap ? overlap_schedule(s) : baseline_schedule(s));
        const std::vector<std::string> last = {"mb2.output.backward",
                                               "mb2.layer1.combine.backward",
                                               "mb2.bucket0.grad_reduce",
                                               "mb2.layer1.mlp.backward",
                                               "mb2.layer1.dispatch.backward",
                                               "mb2.layer1.pre_dispatch.backward",
                                               "mb2.layer0.combine.backward",
                                               "mb2.bucket1.grad_reduce",
                                               "mb2.layer0.mlp.backward",
                                               "mb2.layer0.dispatch.backward",
                                               "mb2.layer0.pre_dispatch.backward",
                                               "mb2.bucket2.grad_reduce",
                                               "mb2.embedding.backward",
                                               "mb2.bucket3.grad_reduce"};
        ASSERT_GE(calls.size(), last.size());
        EXPECT_EQ(
            std::vector<std::string>(calls.end() - static_cast<long>(last.size()), calls.end()),
            last)
            << (overlap ? "overlap" : "baseline");
        EXPECT_EQ(std::count_if(calls.begin(), calls.end(),
                                [](const std::string& n) {
                                    return n.find("grad_reduce") != std::string::npos;
                                }),
                  4);
    }
}

TEST(Schedule, MergedBucketsAndDenseLayers) {
    // One bucket for the output layer and layer 1 (a dense layer: no comm call to wait for, so
    // the reduction is issued at once), one for layer 0 and the embedding.
    ScheduleShape s{2, {true, false}, false};
    s.grad_bucket_ends = {1, kEmbeddingPosition};
    const auto calls = names(baseline_schedule(s));
    const std::vector<std::string> last = {"mb1.output.backward",
                                           "mb1.layer1.mlp.backward",
                                           "mb1.layer1.pre_dispatch.backward",
                                           "mb1.layer0.combine.backward",
                                           "mb1.bucket0.grad_reduce",
                                           "mb1.layer0.mlp.backward",
                                           "mb1.layer0.dispatch.backward",
                                           "mb1.layer0.pre_dispatch.backward",
                                           "mb1.embedding.backward",
                                           "mb1.bucket1.grad_reduce"};
    EXPECT_EQ(std::vector<std::string>(calls.end() - static_cast<long>(last.size()), calls.end()),
              last);
    s.moe_layers = {false, false};
    const auto dense = names(baseline_schedule(s));
    EXPECT_EQ(dense[dense.size() - 6], "mb1.layer1.pre_dispatch.backward");
    EXPECT_EQ(dense[dense.size() - 5], "mb1.bucket0.grad_reduce");
    EXPECT_EQ(dense[dense.size() - 4], "mb1.layer0.mlp.backward");
}

// The parameter gathers of the distributed optimizer (schedule.h): issued in micro-batch 0's
// forward only, each before the first call that reads its bucket's weights, the later ones right
// after the previous layer's dispatch; that first call waits for the bucket (wait_bucket).
std::vector<std::string> head_with_waits(const std::vector<NodeCall>& calls, size_t n) {
    std::vector<std::string> out;
    for (size_t i = 0; i < n && i < calls.size(); ++i) {
        out.push_back(
            call_name(calls[i]) +
            (calls[i].wait_bucket >= 0 ? " <- bucket" + std::to_string(calls[i].wait_bucket) : ""));
    }
    return out;
}

TEST(Schedule, ParamGathersPrefetchTheFirstForward) {
    for (const bool overlap : {false, true}) {
        ScheduleShape s = moe_shape(3, 2, overlap);
        s.param_bucket_ends = {2, 1, 0, kEmbeddingPosition};
        const auto calls = overlap ? overlap_schedule(s) : baseline_schedule(s);
        const std::vector<std::string> head = {"mb0.bucket3.param_gather",
                                               "mb0.embedding.forward <- bucket3",
                                               "mb0.bucket2.param_gather",
                                               "mb0.layer0.pre_dispatch.forward <- bucket2",
                                               "mb0.layer0.dispatch.forward",
                                               "mb0.bucket1.param_gather",
                                               "mb0.layer0.mlp.forward",
                                               "mb0.layer0.combine.forward",
                                               "mb0.layer1.pre_dispatch.forward <- bucket1",
                                               "mb0.layer1.dispatch.forward",
                                               "mb0.bucket0.param_gather",
                                               "mb0.layer1.mlp.forward",
                                               "mb0.layer1.combine.forward",
                                               "mb0.output.forward <- bucket0"};
        EXPECT_EQ(head_with_waits(calls, head.size()), head) << (overlap ? "overlap" : "baseline");
        int gathers = 0, waits = 0;
        for (const NodeCall& c : calls) {
            gathers += c.node == NodeKind::kParamGather;
            waits += c.wait_bucket >= 0;
            EXPECT_EQ(stream_of(c.node) == StreamId::kComm, c.node == NodeKind::kParamGather ||
                                                                c.node == NodeKind::kDispatch ||
                                                                c.node == NodeKind::kCombine);
        }
        EXPECT_EQ(gathers, 4);
        EXPECT_EQ(waits, 4);
        // Without gathers the schedule is the one it was: same calls, nobody waits.
        ScheduleShape plain = s;
        plain.param_bucket_ends.clear();
        std::vector<NodeCall> stripped;
        for (NodeCall c : calls) {
            if (c.node == NodeKind::kParamGather)
                continue;
            c.wait_bucket = -1;
            stripped.push_back(c);
        }
        EXPECT_EQ(stripped, overlap ? overlap_schedule(plain) : baseline_schedule(plain));
    }
}

TEST(Schedule, ParamGathersOfMergedBucketsAndDenseLayers) {
    // Bucket 0 holds the output layer and layer 1: it is first read by layer 1, so it goes
    // right after layer 0's dispatch. Bucket 1 holds layer 0 and the embedding.
    ScheduleShape s{2, {true, true}, false};
    s.param_bucket_ends = {1, kEmbeddingPosition};
    EXPECT_EQ(
        head_with_waits(baseline_schedule(s), 7),
        (std::vector<std::string>{"mb0.bucket1.param_gather", "mb0.embedding.forward <- bucket1",
                                  "mb0.layer0.pre_dispatch.forward", "mb0.layer0.dispatch.forward",
                                  "mb0.bucket0.param_gather", "mb0.layer0.mlp.forward",
                                  "mb0.layer0.combine.forward"}));
    EXPECT_EQ(head_with_waits(baseline_schedule(s), 8)[7],
              "mb0.layer1.pre_dispatch.forward <- bucket0");
    // A dense layer 0 has no dispatch: layer 1's gather follows its pre_dispatch.
    s = ScheduleShape{2, {false, true}, false};
    s.param_bucket_ends = {2, 1, 0, kEmbeddingPosition};
    EXPECT_EQ(head_with_waits(baseline_schedule(s), 6),
              (std::vector<std::string>{
                  "mb0.bucket3.param_gather", "mb0.embedding.forward <- bucket3",
                  "mb0.bucket2.param_gather", "mb0.layer0.pre_dispatch.forward <- bucket2",
                  "mb0.bucket1.param_gather", "mb0.layer0.mlp.forward"}));
    s.param_bucket_ends = {2, 0};  // must end at the embedding
    EXPECT_THROW(overlap_schedule(s), std::invalid_argument);
}

TEST(Schedule, BucketEndsMustCoverTheModel) {
    ScheduleShape s = moe_shape(2, 2, false);
    s.grad_bucket_ends = {2, 0};  // never reaches the embedding
    EXPECT_THROW(baseline_schedule(s), std::invalid_argument);
    s.grad_bucket_ends = {0, 1, kEmbeddingPosition};  // not in backward order
    EXPECT_THROW(overlap_schedule(s), std::invalid_argument);
    s.grad_bucket_ends = {3, kEmbeddingPosition};  // past the output layer
    EXPECT_THROW(overlap_schedule(s), std::invalid_argument);
    s.grad_bucket_ends = {kEmbeddingPosition};
    EXPECT_NO_THROW(overlap_schedule(s));
}

// The speedup cap of the overlap schedule (schedule.h overlap_speedup_cap).
TEST(Schedule, SpeedupCapIsTwoNcOverNcPlusOne) {
    EXPECT_NEAR(overlap_speedup_cap(8, 1), 16.0 / 9.0, 1e-12);  // 1.78
    EXPECT_NEAR(overlap_speedup_cap(2, 1), 4.0 / 3.0, 1e-12);   // 1.33
    EXPECT_NEAR(overlap_speedup_cap(1, 1), 1.0, 1e-12);
    EXPECT_NEAR(overlap_speedup_cap(2, 4), 16.0 / 9.0, 1e-12);
    EXPECT_NEAR(overlap_speedup_cap(1, 2), 4.0 / 3.0, 1e-12);
}

}  // namespace
}  // namespace epo::schedule
