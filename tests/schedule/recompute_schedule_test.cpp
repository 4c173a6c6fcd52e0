// Full recompute and shared-expert overlap (schedule.h): where the recomputed forwards and the
// shared expert's calls sit in the call lists.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include "epo/schedule/schedule.h"
#include "schedule/schedule_test_util.h"

namespace epo::schedule {
namespace {

using namespace test_util;

// ---- Full recompute (schedule.h "Full recompute") ----

ScheduleShape recompute_shape(int mbs, std::vector<bool> layers, bool delay,
                              std::vector<int> recompute_first) {
    ScheduleShape s{mbs, std::move(layers), delay};
    s.recompute_first = std::move(recompute_first);
    return s;
}

TEST(Schedule, FullRecomputeRunsAGroupsForwardRightBeforeItsLastLayersBackward) {
    // Layers: 0 dense, 1 and 2 MoE; groups [0, 1] and [2] (uniform, 2 layers a group).
    const auto calls =
        names(baseline_schedule(recompute_shape(1, {false, true, true}, false, {0, 0, 2})));
    const std::vector<std::string> backward = {
        "mb0.output.backward",
        // group [2]: its forward again, then its backward
        "mb0.layer2.pre_dispatch.recompute", "mb0.layer2.dispatch.recompute",
        "mb0.layer2.mlp.recompute", "mb0.layer2.combine.recompute", "mb0.layer2.combine.backward",
        "mb0.layer2.mlp.backward", "mb0.layer2.dispatch.backward",
        "mb0.layer2.pre_dispatch.backward",
        // group [0, 1]: both layers' forward, then layer 1's backward and layer 0's
        "mb0.layer0.pre_dispatch.recompute", "mb0.layer0.mlp.recompute",
        "mb0.layer1.pre_dispatch.recompute", "mb0.layer1.dispatch.recompute",
        "mb0.layer1.mlp.recompute", "mb0.layer1.combine.recompute", "mb0.layer1.combine.backward",
        "mb0.layer1.mlp.backward", "mb0.layer1.dispatch.backward",
        "mb0.layer1.pre_dispatch.backward", "mb0.layer0.mlp.backward",
        "mb0.layer0.pre_dispatch.backward", "mb0.embedding.backward"};
    ASSERT_EQ(calls.size(), 1 + 2 + 4 + 4 + 1 + backward.size());  // the forward, then these
    EXPECT_EQ(std::vector<std::string>(calls.end() - static_cast<std::ptrdiff_t>(backward.size()),
                                       calls.end()),
              backward);
    // The recompute's dispatch and combine are comm-stream calls of their own.
    for (const NodeCall& c : baseline_schedule(recompute_shape(1, {true}, false, {0}))) {
        if (c.phase == Phase::kRecompute) {
            EXPECT_EQ(stream_of(c.node) == StreamId::kComm,
                      c.node == NodeKind::kDispatch || c.node == NodeKind::kCombine);
        }
    }
}

TEST(Schedule, FullRecomputeInACombinedStepComesBeforeStepOne) {
    // 2 MoE layers, 2 micro-batches, delayed wgrad, only layer 1 recomputed: the combined step
    // of f = 1, b = 0.
    const auto calls = names(overlap_schedule(recompute_shape(2, {true, true}, true, {-1, 1})));
    const std::vector<std::string> pair0 = {
        "mb1.embedding.forward", "mb0.output.backward", "mb0.layer1.pre_dispatch.recompute",
        "mb0.layer1.dispatch.recompute", "mb0.layer1.mlp.recompute", "mb0.layer1.combine.recompute",
        "mb0.layer1.combine.backward",       // 1
        "mb1.layer0.pre_dispatch.forward",   // 2
        "mb0.layer1.mlp.backward",           // 3
        "mb1.layer0.dispatch.forward",       // 4
        "mb0.layer1.mlp.backward_dw",        // 5
        "mb0.layer1.dispatch.backward",      // 6
        "mb1.layer0.mlp.forward",            // 7
        "mb1.layer0.combine.forward",        // 8
        "mb0.layer1.pre_dispatch.backward",  // 9
        "mb0.layer1.pre_dispatch.backward_dw",
        // layer 0 keeps its activations: no recompute in the second pair
        "mb0.layer0.combine.backward"};
    const auto at = std::find(calls.begin(), calls.end(), "mb1.embedding.forward");
    ASSERT_LE(at + static_cast<std::ptrdiff_t>(pair0.size()), calls.end());
    EXPECT_EQ(std::vector<std::string>(at, at + static_cast<std::ptrdiff_t>(pair0.size())), pair0);
}

// Over schedules, groups, chunks and paired edges: each micro-batch's calls come in the
// baseline's order (so its recompute calls too), weight gradients accumulate in micro-batch
// order, and every forward node of a recomputed layer runs again exactly once, after the
// layer above finished its backward and before the group's last layer starts its own.
TEST(Schedule, FullRecomputeRunsEveryRecomputedNodeOnceJustBeforeItsGroupsBackward) {
    const std::vector<bool> pattern = {false, true, true, true};
    const std::vector<std::vector<int>> groups = {
        {0, 1, 2, 3}, {0, 0, 2, 2}, {0, 0, 0, 3}, {0, 1, -1, -1}, {-1, -1, -1, -1}};
    for (const auto& g : groups) {
        for (int mbs : {1, 2, 3}) {
            for (bool delay : {false, true}) {
                for (bool pair : {false, true}) {
                    for (int chunks : {1, 2}) {
                        ScheduleShape s = recompute_shape(mbs, pattern, delay, g);
                        s.pair_edges = pair;
                        s.num_moe_chunks = chunks;
                        const std::string label = ::testing::PrintToString(g) + " mbs " +
                                                  std::to_string(mbs) + (delay ? " delay" : "") +
                                                  (pair ? " pair" : "") + " chunks " +
                                                  std::to_string(chunks);
                        SCOPED_TRACE(label);
                        for (const auto& calls : {baseline_schedule(s), overlap_schedule(s)}) {
                            if (chunks == 1)
                                expect_same_dependencies_and_accumulation_order(calls, s);
                            // Per (mb, layer, node, chunk): recompute count and its position
                            // between the layer above's last backward call and the group's last
                            // layer's first one.
                            for (int mb = 0; mb < mbs; ++mb) {
                                std::vector<const NodeCall*> mine;
                                for (const NodeCall& c : calls)
                                    if (c.micro_batch == mb && !is_side_branch(c.node))
                                        mine.push_back(&c);
                                for (int l = 0; l < 4; ++l) {
                                    int last = l;
                                    while (g[l] >= 0 && last + 1 < 4 && g[last + 1] == g[l])
                                        ++last;
                                    size_t above_done = 0, group_starts = mine.size();
                                    size_t recomputes = 0;
                                    std::vector<size_t> at;
                                    for (size_t i = 0; i < mine.size(); ++i) {
                                        const NodeCall& c = *mine[i];
                                        const bool bwd = c.phase == Phase::kBackward;
                                        if (bwd && c.layer == last + 1 && last + 1 < 4)
                                            above_done = i;
                                        if (bwd && c.node == NodeKind::kOutput && last == 3)
                                            above_done = i;
                                        if (bwd && c.layer == last)
                                            group_starts = std::min(group_starts, i);
                                        if (c.layer == l && c.phase == Phase::kRecompute) {
                                            ++recomputes;
                                            at.push_back(i);
                                        }
                                    }
                                    const size_t nodes =
                                        pattern[l] ? 1 + 3 * static_cast<size_t>(chunks) : 2;
                                    EXPECT_EQ(recomputes, g[l] >= 0 ? nodes : 0) << "layer " << l;
                                    for (size_t i : at) {
                                        EXPECT_GT(i, above_done) << "layer " << l;
                                        EXPECT_LT(i, group_starts) << "layer " << l;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

TEST(Schedule, FullRecomputeGroupsMustBeRunsOfConsecutiveLayers) {
    EXPECT_THROW(baseline_schedule(recompute_shape(1, {true, true}, false, {0})),
                 std::invalid_argument);  // one entry per layer
    EXPECT_THROW(baseline_schedule(recompute_shape(1, {true, true}, false, {1, 1})),
                 std::invalid_argument);  // a group starts at its first layer
    EXPECT_THROW(baseline_schedule(recompute_shape(1, {true, true, true}, false, {0, -1, 0})),
                 std::invalid_argument);  // consecutive
    EXPECT_NO_THROW(baseline_schedule(recompute_shape(1, {true, true, true}, false, {0, 0, -1})));
}

// Shared-expert overlap (schedule.h): each MoE layer's shared expert is a compute call issued
// right after the all-to-all it hides, before the call that waits for that all-to-all; dense
// layers have none. Any other place (before the dispatch, after the mlp) fails this.
TEST(Schedule, SharedExpertSitsBetweenTheDispatchAndTheMlp) {
    ScheduleShape s{2, {false, true}};
    s.shared_expert_overlap = true;
    const auto calls = baseline_schedule(s);
    EXPECT_EQ(layer_calls(calls, 1, 1),
              (std::vector<std::string>{
                  "mb1.layer1.pre_dispatch.forward", "mb1.layer1.dispatch.forward",
                  "mb1.layer1.shared_expert.forward", "mb1.layer1.mlp.forward",
                  "mb1.layer1.combine.forward", "mb1.layer1.combine.backward",
                  "mb1.layer1.shared_expert.backward", "mb1.layer1.mlp.backward",
                  "mb1.layer1.dispatch.backward", "mb1.layer1.pre_dispatch.backward"}));
    EXPECT_EQ(
        layer_calls(calls, 0, 0),
        (std::vector<std::string>{"mb0.layer0.pre_dispatch.forward", "mb0.layer0.mlp.forward",
                                  "mb0.layer0.mlp.backward", "mb0.layer0.pre_dispatch.backward"}));
    int shared = 0;
    for (const NodeCall& c : calls) {
        if (c.node != NodeKind::kSharedExpert)
            continue;
        ++shared;
        EXPECT_EQ(stream_of(c.node), StreamId::kCompute);
        EXPECT_TRUE(runs_beside_previous(c.node));
        EXPECT_FALSE(c.wgrad_delayed);
    }
    EXPECT_EQ(shared, 2 * 2);  // forward and backward of each micro-batch's MoE layer
    // Without the flag the lists are today's.
    s.shared_expert_overlap = false;
    for (const NodeCall& c : baseline_schedule(s))
        EXPECT_NE(c.node, NodeKind::kSharedExpert);
}

// With MoE chunks (run chunk by chunk in the baseline) the shared expert follows chunk 0's
// all-to-all; a full recompute runs it again after the recompute's dispatch.
TEST(Schedule, SharedExpertFollowsTheFirstChunkAndRunsInTheRecompute) {
    ScheduleShape chunked = chunked_shape(1, {true}, false, 2);
    chunked.shared_expert_overlap = true;
    EXPECT_EQ(layer_calls(baseline_schedule(chunked), 0, 0),
              (std::vector<std::string>{
                  "mb0.layer0.pre_dispatch.forward", "mb0.layer0.dispatch.forward.chunk0",
                  "mb0.layer0.shared_expert.forward", "mb0.layer0.mlp.forward.chunk0",
                  "mb0.layer0.combine.forward.chunk0", "mb0.layer0.dispatch.forward.chunk1",
                  "mb0.layer0.mlp.forward.chunk1", "mb0.layer0.combine.forward.chunk1",
                  "mb0.layer0.combine.backward.chunk0", "mb0.layer0.shared_expert.backward",
                  "mb0.layer0.mlp.backward.chunk0", "mb0.layer0.dispatch.backward.chunk0",
                  "mb0.layer0.combine.backward.chunk1", "mb0.layer0.mlp.backward.chunk1",
                  "mb0.layer0.dispatch.backward.chunk1", "mb0.layer0.pre_dispatch.backward"}));
    ScheduleShape recomputed = recompute_shape(1, {true}, false, {0});
    recomputed.shared_expert_overlap = true;
    const auto calls = layer_calls(baseline_schedule(recomputed), 0, 0);
    const auto at = [&](const std::string& name) { return position_of(calls, name); };
    EXPECT_EQ(at("mb0.layer0.shared_expert.recompute"), at("mb0.layer0.dispatch.recompute") + 1);
    EXPECT_EQ(at("mb0.layer0.mlp.recompute"), at("mb0.layer0.shared_expert.recompute") + 1);
}

// The reference's rule: shared-expert overlap and EP overlap exclude each other.
TEST(Schedule, SharedExpertOverlapIsRefusedWithTheOverlapSchedule) {
    ScheduleShape s{2, {true}};
    s.shared_expert_overlap = true;
    EXPECT_THROW(overlap_schedule(s), std::invalid_argument);
}

}  // namespace
}  // namespace epo::schedule
