// Helpers of the schedule tests (tests/schedule/*_test.cpp): call lists as names, and the shapes
// the tests build.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "epo/schedule/schedule.h"

namespace epo::schedule::test_util {

inline std::vector<std::string> names(const std::vector<NodeCall>& calls) {
    std::vector<std::string> out;
    for (const auto& c : calls)
        out.push_back(call_name(c));
    return out;
}

// Where `name` stands in `list`: a failure names it when it is missing (the position is then
// the list's size).
inline std::ptrdiff_t position_of(const std::vector<std::string>& list, const std::string& name) {
    const auto it = std::find(list.begin(), list.end(), name);
    EXPECT_NE(it, list.end()) << name;
    return it - list.begin();
}

// One micro-batch's MoE layer backward with its weight gradient delayed, then what follows it
// on the comm stream: the expert dgrad, the delayed wgrad, the dispatch backward (which needs
// only the dgrad) and a gradient reduction (which needs the wgrad too).
inline std::vector<NodeCall> delayed_expert_backward() {
    const auto call = [](NodeKind node, Phase phase) {
        return NodeCall{.micro_batch = 0,
                        .layer = 0,
                        .node = node,
                        .phase = phase,
                        .wgrad_delayed = node == NodeKind::kMlp && phase == Phase::kBackward};
    };
    return {call(NodeKind::kMlp, Phase::kBackward), call(NodeKind::kMlp, Phase::kBackwardDw),
            call(NodeKind::kDispatch, Phase::kBackward),
            call(NodeKind::kGradReduce, Phase::kBackward)};
}

inline ScheduleShape moe_shape(int mbs, int layers, bool delay) {
    return ScheduleShape{mbs, std::vector<bool>(static_cast<size_t>(layers), true), delay};
}

// Every (micro-batch, layer, node) has one forward and one backward; with delayed wgrad the
// layers' pre_dispatch and mlp nodes also have one backward_dw, and their backward is marked.
// Micro-batches 0 .. delayed_below - 1 run their backward in a combined step (those delay their
// weight gradients); -1: every one but the last (the combined 1F1B schedule).
inline void expect_complete(const std::vector<NodeCall>& calls, const ScheduleShape& s,
                            bool delayed, int delayed_below = -1) {
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
inline void expect_same_dependencies_and_accumulation_order(const std::vector<NodeCall>& calls,
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

inline ScheduleShape chunked_shape(int mbs, std::vector<bool> layers, bool delay, int chunks) {
    ScheduleShape s{mbs, std::move(layers), delay};
    s.num_moe_chunks = chunks;
    return s;
}

inline std::vector<std::string> layer_calls(const std::vector<NodeCall>& calls, int mb, int layer) {
    std::vector<std::string> out;
    for (const auto& c : calls)
        if (c.micro_batch == mb && c.layer == layer && c.node != NodeKind::kGradReduce &&
            c.node != NodeKind::kParamGather)
            out.push_back(call_name(c));
    return out;
}

}  // namespace epo::schedule::test_util
