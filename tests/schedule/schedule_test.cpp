#include "epo/schedule/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

namespace epo::schedule {
namespace {

std::vector<std::string> names(const std::vector<NodeCall>& calls) {
    std::vector<std::string> out;
    for (const auto& c : calls)
        out.push_back(call_name(c));
    return out;
}

ScheduleShape moe_shape(int mbs, int layers, bool delay) {
    return ScheduleShape{mbs, std::vector<bool>(static_cast<size_t>(layers), true), delay};
}

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

using Key = std::tuple<int, int, NodeKind>;

// Every (micro-batch, layer, node) has one forward and one backward; with delayed wgrad the
// layers' pre_dispatch and mlp nodes also have one backward_dw, and their backward is marked.
// Micro-batches 0 .. delayed_below - 1 run their backward in a combined step (those delay their
// weight gradients); -1: every one but the last (the combined 1F1B schedule).
void expect_complete(const std::vector<NodeCall>& calls, const ScheduleShape& s, bool delayed,
                     int delayed_below = -1) {
    if (delayed_below < 0)
        delayed_below = s.num_micro_batches - 1;
    std::map<std::tuple<int, int, NodeKind, Phase>, int> seen;
    for (const auto& c : calls)
        seen[{c.micro_batch, c.layer, c.node, c.phase}]++;
    for (int mb = 0; mb < s.num_micro_batches; ++mb) {
        for (int l = -1; l < static_cast<int>(s.moe_layers.size()); ++l) {
            std::vector<NodeKind> nodes;
            if (l < 0) {
                nodes = {NodeKind::kEmbedding, NodeKind::kOutput};
            } else {
                nodes = {NodeKind::kPreDispatch, NodeKind::kMlp};
                if (s.moe_layers[l]) {
                    nodes.push_back(NodeKind::kDispatch);
                    nodes.push_back(NodeKind::kCombine);
                }
            }
            for (NodeKind n : nodes) {
                EXPECT_EQ((seen[{mb, l, n, Phase::kForward}]), 1);
                EXPECT_EQ((seen[{mb, l, n, Phase::kBackward}]), 1);
                const bool has_dw = delayed && l >= 0 &&
                                    (n == NodeKind::kPreDispatch || n == NodeKind::kMlp) &&
                                    mb < delayed_below;
                EXPECT_EQ((seen[{mb, l, n, Phase::kBackwardDw}]), has_dw ? 1 : 0)
                    << "mb " << mb << " layer " << l << " " << node_name(n);
            }
        }
    }
    EXPECT_EQ(seen.size() > 0, true);
}

// Each micro-batch's own calls come in the same relative order as in the baseline (the data
// dependencies), and every weight gradient of a node is accumulated in micro-batch order.
void expect_same_dependencies_and_accumulation_order(const std::vector<NodeCall>& calls,
                                                     const ScheduleShape& s) {
    const auto base = baseline_schedule(s);
    for (int mb = 0; mb < s.num_micro_batches; ++mb) {
        std::vector<std::string> a, b;
        for (const auto& c : base)
            if (c.micro_batch == mb)
                a.push_back(call_name(c));
        for (const auto& c : calls)
            if (c.micro_batch == mb && c.phase != Phase::kBackwardDw)
                b.push_back(call_name(c));
        EXPECT_EQ(a, b) << "micro-batch " << mb;
    }
    std::map<std::pair<int, NodeKind>, int> last_wgrad_mb;
    for (const auto& c : calls) {
        const bool carries_wgrad =
            c.phase == Phase::kBackwardDw || (c.phase == Phase::kBackward && !c.wgrad_delayed);
        if (!carries_wgrad)
            continue;
        auto [it, inserted] = last_wgrad_mb.try_emplace({c.layer, c.node}, c.micro_batch);
        if (!inserted) {
            EXPECT_EQ(it->second + 1, c.micro_batch) << call_name(c);
            it->second = c.micro_batch;
        }
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
    const auto at = [&](const std::string& name) {
        const auto it = std::find(n.begin(), n.end(), name);
        EXPECT_NE(it, n.end()) << name;
        return it - n.begin();
    };
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
        const auto at = [&](const std::string& name) {
            const auto it = std::find(n.begin(), n.end(), name);
            EXPECT_NE(it, n.end()) << name;
            return it - n.begin();
        };
        const int last = mbs - 1, before = mbs - 2;
        int gathers = 0, reduces = 0;
        for (size_t i = 0; i < calls.size(); ++i) {
            const NodeCall& c = calls[i];
            if (c.node == NodeKind::kParamGather) {
                ++gathers;
                EXPECT_EQ(c.micro_batch, 0);
            }
            if (c.wait_bucket >= 0)
                EXPECT_EQ(c.micro_batch, 0) << call_name(c);
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

// ---- Token chunks (schedule.h "Token chunks") ----

ScheduleShape chunked_shape(int mbs, std::vector<bool> layers, bool delay, int chunks) {
    ScheduleShape s{mbs, std::move(layers), delay};
    s.num_moe_chunks = chunks;
    return s;
}

std::vector<std::string> layer_calls(const std::vector<NodeCall>& calls, int mb, int layer) {
    std::vector<std::string> out;
    for (const auto& c : calls)
        if (c.micro_batch == mb && c.layer == layer && c.node != NodeKind::kGradReduce &&
            c.node != NodeKind::kParamGather)
            out.push_back(call_name(c));
    return out;
}

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

TEST(Schedule, PairedEdgesCapIsTwo) {
    EXPECT_DOUBLE_EQ(overlap_speedup_cap(2, 1, true), 2.0);
    EXPECT_DOUBLE_EQ(overlap_speedup_cap(8, 2, true), 2.0);
    EXPECT_DOUBLE_EQ(overlap_speedup_cap(1, 1, true), overlap_speedup_cap(1, 1));
    EXPECT_DOUBLE_EQ(overlap_speedup_cap(2, 1, false), 4.0 / 3.0);
}

TEST(Schedule, SpeedupCapIsTwoNcOverNcPlusOne) {
    EXPECT_NEAR(overlap_speedup_cap(8, 1), 16.0 / 9.0, 1e-12);  // 1.78
    EXPECT_NEAR(overlap_speedup_cap(2, 1), 4.0 / 3.0, 1e-12);   // 1.33
    EXPECT_NEAR(overlap_speedup_cap(1, 1), 1.0, 1e-12);
    EXPECT_NEAR(overlap_speedup_cap(2, 4), 16.0 / 9.0, 1e-12);
    EXPECT_NEAR(overlap_speedup_cap(1, 2), 4.0 / 3.0, 1e-12);
}

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
    const auto at = [&](const std::string& name) {
        return std::find(calls.begin(), calls.end(), name) - calls.begin();
    };
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
