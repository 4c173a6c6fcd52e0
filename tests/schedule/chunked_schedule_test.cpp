// Expert chunks (schedule.h): a MoE layer's experts split into chunks, each chunk's all-to-all
// overlapping the previous chunk's experts.
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

TEST(Schedule, OneChunkIsTheUnchunkedSchedule) {
    for (bool delay : {false, true}) {
        const ScheduleShape whole{3, {true, false, true}, delay};
        const ScheduleShape one = chunked_shape(3, {true, false, true}, delay, 1);
        EXPECT_EQ(baseline_schedule(one), baseline_schedule(whole));
        EXPECT_EQ(overlap_schedule(one), overlap_schedule(whole));
        for (const auto& c : overlap_schedule(one))
            EXPECT_EQ(c.moe_chunk, -1) << call_name(c);
    }
}

TEST(Schedule, ChunkedBaselineRunsChunkByChunk) {
    const auto calls = baseline_schedule(chunked_shape(1, {true}, false, 2));
    const std::vector<std::string> forward = {
        "mb0.layer0.pre_dispatch.forward",    "mb0.layer0.dispatch.forward.chunk0",
        "mb0.layer0.mlp.forward.chunk0",      "mb0.layer0.combine.forward.chunk0",
        "mb0.layer0.dispatch.forward.chunk1", "mb0.layer0.mlp.forward.chunk1",
        "mb0.layer0.combine.forward.chunk1"};
    const std::vector<std::string> backward = {
        "mb0.layer0.combine.backward.chunk0",  "mb0.layer0.mlp.backward.chunk0",
        "mb0.layer0.dispatch.backward.chunk0", "mb0.layer0.combine.backward.chunk1",
        "mb0.layer0.mlp.backward.chunk1",      "mb0.layer0.dispatch.backward.chunk1",
        "mb0.layer0.pre_dispatch.backward"};
    std::vector<std::string> both = forward;
    both.insert(both.end(), backward.begin(), backward.end());
    EXPECT_EQ(layer_calls(calls, 0, 0), both);
}

// A micro-batch alone in the overlap schedule: every chunk's incoming communication is issued
// before chunk 0's compute, in the forward and the backward.
TEST(Schedule, ChunkedOverlapPipelinesAMicroBatchAlone) {
    const auto calls = overlap_schedule(chunked_shape(1, {true}, false, 3));
    const std::vector<std::string> expected = {
        "mb0.layer0.pre_dispatch.forward",     "mb0.layer0.dispatch.forward.chunk0",
        "mb0.layer0.dispatch.forward.chunk1",  "mb0.layer0.dispatch.forward.chunk2",
        "mb0.layer0.mlp.forward.chunk0",       "mb0.layer0.combine.forward.chunk0",
        "mb0.layer0.mlp.forward.chunk1",       "mb0.layer0.combine.forward.chunk1",
        "mb0.layer0.mlp.forward.chunk2",       "mb0.layer0.combine.forward.chunk2",
        "mb0.layer0.combine.backward.chunk0",  "mb0.layer0.combine.backward.chunk1",
        "mb0.layer0.combine.backward.chunk2",  "mb0.layer0.mlp.backward.chunk0",
        "mb0.layer0.dispatch.backward.chunk0", "mb0.layer0.mlp.backward.chunk1",
        "mb0.layer0.dispatch.backward.chunk1", "mb0.layer0.mlp.backward.chunk2",
        "mb0.layer0.dispatch.backward.chunk2", "mb0.layer0.pre_dispatch.backward"};
    EXPECT_EQ(layer_calls(calls, 0, 0), expected);
}

// The combined step keeps the ten-step pair order, each chunked step expanded into its chunks.
TEST(Schedule, ChunkedCombinedStepExpandsEachStepIntoItsChunks) {
    const auto calls = overlap_schedule(chunked_shape(2, {true}, true, 2));
    const auto first = std::find_if(calls.begin(), calls.end(), [](const NodeCall& c) {
        return c.micro_batch == 1 && c.node == NodeKind::kEmbedding;
    });
    ASSERT_NE(first, calls.end());
    std::vector<std::string> step;
    for (auto it = first; it != calls.end() && step.size() < 18; ++it)
        step.push_back(call_name(*it));
    const std::vector<std::string> expected = {"mb1.embedding.forward",
                                               "mb0.output.backward",
                                               "mb0.layer0.combine.backward.chunk0",  // 1
                                               "mb0.layer0.combine.backward.chunk1",
                                               "mb1.layer0.pre_dispatch.forward",  // 2
                                               "mb0.layer0.mlp.backward.chunk0",   // 3
                                               "mb0.layer0.mlp.backward.chunk1",
                                               "mb1.layer0.dispatch.forward.chunk0",  // 4
                                               "mb1.layer0.dispatch.forward.chunk1",
                                               "mb0.layer0.mlp.backward_dw.chunk0",  // 5
                                               "mb0.layer0.mlp.backward_dw.chunk1",
                                               "mb0.layer0.dispatch.backward.chunk0",  // 6
                                               "mb0.layer0.dispatch.backward.chunk1",
                                               "mb1.layer0.mlp.forward.chunk0",  // 7
                                               "mb1.layer0.mlp.forward.chunk1",
                                               "mb1.layer0.combine.forward.chunk0",  // 8
                                               "mb1.layer0.combine.forward.chunk1",
                                               "mb0.layer0.pre_dispatch.backward"};  // 9
    EXPECT_EQ(step, expected);
}

// Every chunked node runs once per chunk and every whole node once; a (micro-batch, chunk)
// chain keeps the baseline's order (its data dependencies); every weight gradient accumulates
// in (micro-batch, chunk) order in both schedules (bit-identity between them).
TEST(Schedule, ChunkedSchedulesKeepDependenciesAndAccumulationOrder) {
    using ChainKey = std::pair<int, int>;  // (micro-batch, chunk)
    const auto chains = [](const std::vector<NodeCall>& calls, int chunks, bool skip_dw) {
        std::map<ChainKey, std::vector<std::string>> out;
        for (const auto& c : calls) {
            if (is_side_branch(c.node) || (skip_dw && c.phase == Phase::kBackwardDw))
                continue;
            for (int k = 0; k < chunks; ++k)
                if (c.moe_chunk < 0 || c.moe_chunk == k)
                    out[{c.micro_batch, k}].push_back(call_name(c));
        }
        return out;
    };
    const auto expect_accumulation_order = [](const std::vector<NodeCall>& calls) {
        std::map<std::pair<int, NodeKind>, ChainKey> last;
        for (const auto& c : calls) {
            const bool carries_wgrad =
                c.phase == Phase::kBackwardDw || (c.phase == Phase::kBackward && !c.wgrad_delayed);
            if (!carries_wgrad || is_side_branch(c.node))
                continue;
            const ChainKey now{c.micro_batch, c.moe_chunk};
            auto [it, inserted] = last.try_emplace({c.layer, c.node}, now);
            if (!inserted) {
                EXPECT_LT(it->second, now) << call_name(c);
                it->second = now;
            }
        }
    };
    for (int chunks : {2, 4}) {
        for (int mbs : {1, 2, 3}) {
            for (bool delay : {false, true}) {
                for (auto pattern :
                     {std::vector<bool>{true, true}, std::vector<bool>{false, true, false}}) {
                    const ScheduleShape s = chunked_shape(mbs, pattern, delay, chunks);
                    const auto base = baseline_schedule(s), overlap = overlap_schedule(s);
                    EXPECT_EQ(chains(overlap, chunks, true), chains(base, chunks, true));
                    expect_accumulation_order(base);
                    expect_accumulation_order(overlap);
                    std::map<std::tuple<int, int, NodeKind, Phase, int>, int> seen;
                    for (const auto& c : overlap)
                        seen[{c.micro_batch, c.layer, c.node, c.phase, c.moe_chunk}]++;
                    for (const auto& [key, n] : seen) {
                        EXPECT_EQ(n, 1);
                        const bool chunked_node =
                            std::get<2>(key) == NodeKind::kDispatch ||
                            std::get<2>(key) == NodeKind::kCombine ||
                            (std::get<2>(key) == NodeKind::kMlp && pattern[std::get<1>(key)]);
                        EXPECT_EQ(std::get<4>(key) >= 0, chunked_node);
                    }
                    EXPECT_EQ(num_moe_chunks(overlap), chunks);
                }
            }
        }
    }
}

TEST(Schedule, ChunksMustBePositive) {
    EXPECT_THROW(baseline_schedule(chunked_shape(1, {true}, false, 0)), std::invalid_argument);
    EXPECT_THROW(overlap_schedule(chunked_shape(1, {true}, false, -2)), std::invalid_argument);
}

}  // namespace
}  // namespace epo::schedule
