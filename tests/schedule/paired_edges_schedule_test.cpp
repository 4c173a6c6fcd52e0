// Paired edges (schedule.h "Paired edges"): the first forwards and the last backwards run in
// pairs.
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

ScheduleShape paired_shape(int mbs, std::vector<bool> layers, bool delay) {
    ScheduleShape s{mbs, std::move(layers), delay};
    s.pair_edges = true;
    return s;
}

TEST(Schedule, PairedEdgesRunTheFirstForwardsAndTheLastBackwardsTogether) {
    // One MoE layer, 2 micro-batches: the two forwards, then the two backwards, interleaved so
    // each micro-batch's all-to-all runs under the other's compute; nothing else (no combined
    // step at 2, so nothing is delayed even with delay_wgrad).
    for (bool delay : {false, true}) {
        const auto calls = names(overlap_schedule(paired_shape(2, {true}, delay)));
        const std::vector<std::string> want = {"mb0.embedding.forward",
                                               "mb1.embedding.forward",
                                               "mb0.layer0.pre_dispatch.forward",
                                               "mb0.layer0.dispatch.forward",
                                               "mb1.layer0.pre_dispatch.forward",
                                               "mb1.layer0.dispatch.forward",
                                               "mb0.layer0.mlp.forward",
                                               "mb0.layer0.combine.forward",
                                               "mb1.layer0.mlp.forward",
                                               "mb1.layer0.combine.forward",
                                               "mb0.output.forward",
                                               "mb0.output.backward",
                                               "mb1.output.forward",
                                               "mb1.output.backward",
                                               "mb0.layer0.combine.backward",
                                               "mb1.layer0.combine.backward",
                                               "mb0.layer0.mlp.backward",
                                               "mb0.layer0.dispatch.backward",
                                               "mb1.layer0.mlp.backward",
                                               "mb1.layer0.dispatch.backward",
                                               "mb0.layer0.pre_dispatch.backward",
                                               "mb1.layer0.pre_dispatch.backward",
                                               "mb0.embedding.backward",
                                               "mb1.embedding.backward"};
        EXPECT_EQ(calls, want) << "delay_wgrad " << delay;
    }
    // 3 micro-batches: the pair of forwards, one combined step (forward 2 with backward 0), the
    // pair of backwards (1 and 2). Each phase runs the output backward of the next phase's first
    // backward, whose forward has ended: mb0's between the two output forwards, mb1's in the
    // combined step right before its last attention backward.
    ScheduleShape s = paired_shape(3, {true, true}, true);
    const auto calls = overlap_schedule(s);
    const auto n = names(calls);
    const auto at = [&](const std::string& name) { return position_of(n, name); };
    EXPECT_EQ(at("mb0.output.forward") + 1, at("mb0.output.backward"));
    EXPECT_EQ(at("mb0.output.backward") + 1, at("mb1.output.forward"));
    EXPECT_EQ(at("mb1.output.forward") + 1, at("mb2.embedding.forward"));
    EXPECT_EQ(at("mb2.embedding.forward") + 1, at("mb0.layer1.combine.backward"));
    EXPECT_EQ(at("mb1.output.backward") + 1, at("mb0.layer0.pre_dispatch.backward"));
    EXPECT_LT(at("mb0.layer0.pre_dispatch.backward_dw"), at("mb2.output.backward"));
    EXPECT_EQ(at("mb2.output.backward") + 1, at("mb1.layer1.combine.backward"));
    EXPECT_EQ(std::count(n.begin(), n.end(), "mb1.output.backward"), 1);
    // A shape without layers still runs each micro-batch's output backward once, after its
    // output forward.
    const auto bare = names(overlap_schedule(paired_shape(3, {}, false)));
    for (const std::string mb : {"mb0.", "mb1.", "mb2."}) {
        const auto fwd = std::find(bare.begin(), bare.end(), mb + "output.forward");
        const auto bwd = std::find(bare.begin(), bare.end(), mb + "output.backward");
        EXPECT_LT(fwd, bwd) << mb;
        EXPECT_EQ(std::count(bare.begin(), bare.end(), mb + "output.backward"), 1) << mb;
    }
    // Otherwise the combined step is the unpaired schedule's (forward 1, backward 0), from mb1's
    // embedding forward to mb0's last delayed wgrad, with forward 1 renamed 2.
    ScheduleShape unpaired = s;
    unpaired.pair_edges = false;
    const auto plain = names(overlap_schedule(unpaired));
    const auto p0 = std::find(plain.begin(), plain.end(), "mb1.embedding.forward");
    const auto p1 = std::find(plain.begin(), plain.end(), "mb0.layer0.pre_dispatch.backward_dw");
    ASSERT_NE(p1, plain.end());
    std::vector<std::string> want;
    for (auto p = p0; p <= p1; ++p) {
        std::string renamed = *p;
        if (renamed.rfind("mb1.", 0) == 0)
            renamed.replace(0, 4, "mb2.");
        if (renamed == "mb0.output.backward")
            continue;
        if (renamed == "mb0.layer0.pre_dispatch.backward")
            want.push_back("mb1.output.backward");
        want.push_back(renamed);
    }
    const auto q0 = n.begin() + at("mb2.embedding.forward");
    EXPECT_EQ(std::vector<std::string>(q0, q0 + static_cast<std::ptrdiff_t>(want.size())), want);
}

TEST(Schedule, PairedEdgesRunEveryNodeOnceInDependencyAndAccumulationOrder) {
    for (int mbs : {1, 2, 3, 8}) {
        for (bool delay : {false, true}) {
            for (auto pattern : {std::vector<bool>{true, true},
                                 std::vector<bool>{false, true, true}, std::vector<bool>{true}}) {
                for (int chunks : {1, 2}) {
                    ScheduleShape s = paired_shape(mbs, pattern, delay);
                    s.num_moe_chunks = chunks;
                    SCOPED_TRACE(::testing::Message() << mbs << " micro-batches, delay " << delay
                                                      << ", " << chunks << " chunks");
                    const auto calls = overlap_schedule(s);
                    if (chunks == 1) {
                        // With one micro-batch there is nothing to pair.
                        expect_complete(calls, s, delay, mbs >= 2 ? mbs - 2 : 0);
                        expect_same_dependencies_and_accumulation_order(calls, s);
                    }
                    // Every chunk of a micro-batch's layer in ascending order, each once.
                    std::map<std::tuple<int, int, NodeKind, Phase>, int> next_chunk;
                    for (const NodeCall& c : calls) {
                        if (c.moe_chunk < 0)
                            continue;
                        int& want = next_chunk[{c.micro_batch, c.layer, c.node, c.phase}];
                        EXPECT_EQ(c.moe_chunk, want) << call_name(c);
                        ++want;
                    }
                    for (const auto& [key, count] : next_chunk)
                        EXPECT_EQ(count, chunks);
                }
            }
        }
    }
}

TEST(Schedule, PairedEdgesGatherInTheFirstForwardAndReduceInTheLastBackward) {
    for (int mbs : {2, 3}) {
        ScheduleShape s = paired_shape(mbs, {true, false}, true);
        s.grad_bucket_ends = {2, 1, 0, kEmbeddingPosition};
        s.param_bucket_ends = {2, 1, 0, kEmbeddingPosition};
        const auto calls = overlap_schedule(s);
        const auto n = names(calls);
        const auto at = [&](const std::string& name) { return position_of(n, name); };
        const int last = mbs - 1, before = mbs - 2;
        int gathers = 0, reduces = 0;
        for (size_t i = 0; i < calls.size(); ++i) {
            const NodeCall& c = calls[i];
            if (c.node == NodeKind::kParamGather) {
                ++gathers;
                EXPECT_EQ(c.micro_batch, 0);
            }
            if (c.wait_bucket >= 0) {
                EXPECT_EQ(c.micro_batch, 0) << call_name(c);
            }
            if (c.node == NodeKind::kGradReduce) {
                ++reduces;
                EXPECT_EQ(c.micro_batch, last);
            }
        }
        EXPECT_EQ(gathers, 4);
        EXPECT_EQ(reduces, 4);
        // A gather comes before micro-batch 0's first use of its bucket, which micro-batch 1's
        // first use follows on the compute stream.
        EXPECT_LT(at("mb0.bucket2.param_gather"), at("mb0.layer0.pre_dispatch.forward"));
        EXPECT_LT(at("mb0.layer0.pre_dispatch.forward"), at("mb1.layer0.pre_dispatch.forward"));
        EXPECT_LT(at("mb0.bucket1.param_gather"), at("mb1.layer0.pre_dispatch.forward"));
        EXPECT_LT(at("mb0.bucket0.param_gather"), at("mb0.output.forward"));
        // A bucket is reduced once both paired backwards have passed its position: layer 1's
        // bucket (1, a dense layer) right after the last backward's layer 1.
        const std::string a = "mb" + std::to_string(before) + ".",
                          b = "mb" + std::to_string(last) + ".";
        // The output layer's bucket: layer 1 is dense (no comm call to go behind), so at once.
        EXPECT_EQ(at(b + "output.backward") + 1, at(b + "bucket0.grad_reduce"));
        // Layer 1's: behind layer 0's two dispatches (not in front of them, where it would hold
        // back the all-to-alls the attention backward needs next).
        EXPECT_LT(at(a + "layer1.pre_dispatch.backward"), at(b + "bucket1.grad_reduce"));
        EXPECT_LT(at(b + "layer1.pre_dispatch.backward"), at(b + "bucket1.grad_reduce"));
        EXPECT_LT(at(a + "layer0.dispatch.backward"), at(b + "bucket1.grad_reduce"));
        EXPECT_EQ(at(b + "layer0.dispatch.backward") + 1, at(b + "bucket1.grad_reduce"));
        EXPECT_LT(at(b + "layer0.pre_dispatch.backward"), at(b + "bucket2.grad_reduce"));
        EXPECT_LT(at(a + "embedding.backward"), at(b + "bucket3.grad_reduce"));
        EXPECT_EQ(n.back(), b + "bucket3.grad_reduce");
    }
}

TEST(Schedule, PairedEdgesWithOneMicroBatchAreTheUnpairedSchedule) {
    ScheduleShape s = paired_shape(1, {true, true}, true);
    ScheduleShape unpaired = s;
    unpaired.pair_edges = false;
    EXPECT_EQ(overlap_schedule(s), overlap_schedule(unpaired));
    EXPECT_EQ(overlap_schedule(s), baseline_schedule(s));
}

TEST(Schedule, PairedEdgesCapIsTwo) {
    EXPECT_DOUBLE_EQ(overlap_speedup_cap(2, 1, true), 2.0);
    EXPECT_DOUBLE_EQ(overlap_speedup_cap(8, 2, true), 2.0);
    EXPECT_DOUBLE_EQ(overlap_speedup_cap(1, 1, true), overlap_speedup_cap(1, 1));
    EXPECT_DOUBLE_EQ(overlap_speedup_cap(2, 1, false), 4.0 / 3.0);
}

}  // namespace
}  // namespace epo::schedule
