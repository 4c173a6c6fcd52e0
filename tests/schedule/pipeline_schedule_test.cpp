// The pipeline schedules (pipeline_schedule.h): the layer split, the reduction to schedule.h's two
// schedules at P = V = 1, every stage running exactly its own part of the single-stage work, and
// deadlock freedom checked by replaying every stage's lists with rendezvous transfers.
#include "epo/schedule/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>

namespace epo::schedule {
namespace {

PipelineShape shape_of(int P, int V, int M, int L, bool overlap, bool delay = false) {
    std::vector<bool> moe(static_cast<size_t>(L), true);
    if (L > 1)
        moe[1] = false;  // one dense layer: no dispatch / combine there
    return PipelineShape{P, V, M, moe, overlap, delay};
}

std::vector<NodeCall> without_pipeline_fields(std::vector<NodeCall> calls) {
    for (NodeCall& c : calls)
        c.stage = c.chunk = -1;
    return calls;
}

TEST(PipelineSchedule, LayersFollowTheInterleavedBlocks) {
    const PipelineShape s = shape_of(2, 2, 4, 8, false);
    // Blocks of 2: stage 0 holds blocks 0 and 2, stage 1 blocks 1 and 3.
    EXPECT_EQ(chunk_layers(s, 0, 0).first, 0);
    EXPECT_EQ(chunk_layers(s, 1, 0).first, 2);
    EXPECT_EQ(chunk_layers(s, 0, 1).first, 4);
    EXPECT_EQ(chunk_layers(s, 1, 1).first, 6);
    EXPECT_EQ(chunk_layers(s, 1, 1).end, 8);
    EXPECT_EQ(stage_of_position(s, 5), 0);
    EXPECT_EQ(chunk_of_position(s, 5), 1);
    EXPECT_EQ(stage_of_position(s, -1), 0);
    EXPECT_EQ(stage_of_position(s, 8), 1);
    EXPECT_EQ(chunk_of_position(s, 8), 1);
}

TEST(PipelineSchedule, OneStageIsTheSingleStageSchedules) {
    for (int M : {1, 2, 5}) {
        for (bool delay : {false, true}) {
            const PipelineShape p = shape_of(1, 1, M, 3, false, delay);
            ScheduleShape s{M, p.moe_layers, delay};
            EXPECT_EQ(without_pipeline_fields(pipeline_schedules(p)[0]), baseline_schedule(s));
            PipelineShape o = p;
            o.overlap = true;
            EXPECT_EQ(without_pipeline_fields(pipeline_schedules(o)[0]), overlap_schedule(s))
                << M << " micro-batches, delay " << delay;
        }
    }
}

TEST(PipelineSchedule, WarmupCountsAreTheReferences) {
    EXPECT_EQ(num_warmup_units(shape_of(4, 1, 8, 4, false), 0), 3);
    EXPECT_EQ(num_warmup_units(shape_of(4, 1, 8, 4, false), 3), 0);
    EXPECT_EQ(num_warmup_units(shape_of(4, 2, 8, 8, false), 0), 2 * 3 + 4);
    EXPECT_EQ(num_warmup_units(shape_of(4, 2, 8, 8, false), 3), 4);
    EXPECT_EQ(num_warmup_units(shape_of(2, 2, 2, 4, false), 1), 4);  // M = P: all forwards first
    EXPECT_EQ(num_warmup_units(shape_of(2, 2, 4, 4, true), 1), 3);   // one more with overlap
}

TEST(PipelineSchedule, RefusesShapesItCannotSplit) {
    EXPECT_THROW(pipeline_schedules(shape_of(2, 2, 4, 6, false)), std::invalid_argument);
    EXPECT_THROW(pipeline_schedules(shape_of(2, 2, 3, 4, false)), std::invalid_argument);
    EXPECT_THROW(pipeline_schedules(shape_of(0, 1, 3, 4, false)), std::invalid_argument);
}

// Replays the stages' lists as the executor issues them (executor.h): two FIFO streams per
// stage; each call after what its events bind it to: the previous recorded call of its
// (micro-batch, MoE chunk) chain (a whole call joins every chunk's), nothing for a parameter
// gather, and the gather of the bucket it waits for; a gradient reduction also after its
// micro-batch's latest delayed weight gradient. Calls off the chain (side branches, delayed
// weight gradients) record nothing on it. A transfer
// completes only when the send is at the head of the sender's comm stream and the matching
// receive at the head of the receiver's, both with their inputs done. Returns whether everything
// completed.
bool replays_without_deadlock(const std::vector<std::vector<NodeCall>>& lists, std::string& why) {
    const size_t P = lists.size();
    struct Cursor {
        std::vector<size_t> compute, comm;  // indices into the stage's list
        size_t next_compute = 0, next_comm = 0;
        std::vector<bool> done;
        std::vector<std::vector<size_t>> deps;  // the calls each call waits for
    };
    std::vector<Cursor> cur(P);
    for (size_t s = 0; s < P; ++s) {
        int C = 1;
        for (const NodeCall& c : lists[s])
            C = std::max(C, c.moe_chunk + 1);
        std::map<std::pair<int, int>, size_t> last;  // (mb, chunk) -> last recording call
        std::map<int, size_t> gather;                // bucket -> its gather
        std::map<int, size_t> wgrad;                 // mb -> its latest delayed weight gradient
        cur[s].done.assign(lists[s].size(), false);
        for (size_t i = 0; i < lists[s].size(); ++i) {
            const NodeCall& c = lists[s][i];
            (stream_of(c.node) == StreamId::kCompute ? cur[s].compute : cur[s].comm).push_back(i);
            std::vector<size_t> deps;
            const int lo = c.moe_chunk >= 0 ? c.moe_chunk : 0;
            const int hi = c.moe_chunk >= 0 ? c.moe_chunk + 1 : C;
            for (int k = lo; k < hi; ++k) {
                const auto it = last.find({c.micro_batch, k});
                if (waits_for_micro_batch(c.node) && it != last.end())
                    deps.push_back(it->second);
            }
            if (c.wait_bucket >= 0)
                deps.push_back(gather.at(c.wait_bucket));
            if (c.node == NodeKind::kGradReduce && wgrad.count(c.micro_batch) > 0)
                deps.push_back(wgrad.at(c.micro_batch));
            if (c.node == NodeKind::kParamGather)
                gather[c.layer] = i;
            if (c.phase == Phase::kBackwardDw)
                wgrad[c.micro_batch] = i;
            if (!runs_off_chain(c)) {
                for (int k = lo; k < hi; ++k)
                    last[{c.micro_batch, k}] = i;
            }
            cur[s].deps.push_back(deps);
        }
    }
    const auto inputs_done = [&](size_t s, size_t i) {
        for (size_t d : cur[s].deps[i])
            if (!cur[s].done[d])
                return false;
        return true;
    };
    const auto comm_head = [&](size_t s) -> const NodeCall* {
        return cur[s].next_comm < cur[s].comm.size() ? &lists[s][cur[s].comm[cur[s].next_comm]]
                                                     : nullptr;
    };
    for (bool progressed = true; progressed;) {
        progressed = false;
        for (size_t s = 0; s < P; ++s) {
            Cursor& c = cur[s];
            while (c.next_compute < c.compute.size() && inputs_done(s, c.compute[c.next_compute])) {
                c.done[c.compute[c.next_compute++]] = true;
                progressed = true;
            }
            while (c.next_comm < c.comm.size() && inputs_done(s, c.comm[c.next_comm])) {
                const NodeCall& call = lists[s][c.comm[c.next_comm]];
                if (!is_pipeline_transfer(call.node)) {
                    c.done[c.comm[c.next_comm++]] = true;
                    progressed = true;
                    continue;
                }
                if (call.node != NodeKind::kSendForward && call.node != NodeKind::kSendBackward)
                    break;  // a receive completes with its send
                const bool fwd = call.node == NodeKind::kSendForward;
                const size_t to = fwd ? (s + 1) % P : (s + P - 1) % P;
                const NodeCall* peer = comm_head(to);
                if (peer == nullptr || !inputs_done(to, cur[to].comm[cur[to].next_comm]) ||
                    peer->node != (fwd ? NodeKind::kRecvForward : NodeKind::kRecvBackward))
                    break;
                if (peer->micro_batch != call.micro_batch || peer->layer != call.layer) {
                    why = "stage " + std::to_string(s) + " sends " + call_name(call) +
                          " while stage " + std::to_string(to) + " receives " + call_name(*peer);
                    return false;
                }
                cur[to].done[cur[to].comm[cur[to].next_comm++]] = true;
                c.done[c.comm[c.next_comm++]] = true;
                progressed = true;
            }
        }
    }
    for (size_t s = 0; s < P; ++s) {
        if (cur[s].next_comm < cur[s].comm.size() || cur[s].next_compute < cur[s].compute.size()) {
            why = "stage " + std::to_string(s) + " stuck";
            return false;
        }
    }
    return true;
}

// Every shape of the grid: each stage's calls are exactly the single-stage baseline's calls of
// the layers it holds (same micro-batches, nodes and phases; weight gradients as delayed calls
// when delayed), and the lists replay without a deadlock.
TEST(PipelineSchedule, EveryStageRunsItsLayersAndNothingDeadlocks) {
    for (int P : {2, 4}) {
        for (int V : {1, 2}) {
            for (int mult : {1, 2, 3}) {
                for (int mode = 0; mode < 3; ++mode) {
                    const int M = P * mult, L = P * V * 2;
                    const PipelineShape s = shape_of(P, V, M, L, mode > 0, mode == 2);
                    const std::string label = "PP " + std::to_string(P) + " VPP " +
                                              std::to_string(V) + " M " + std::to_string(M) +
                                              " mode " + std::to_string(mode);
                    const auto lists = pipeline_schedules(s);
                    std::string why;
                    EXPECT_TRUE(replays_without_deadlock(lists, why)) << label << ": " << why;
                    // The single-stage reference: which (mb, layer, node, phase) each stage runs.
                    using Key = std::tuple<int, int, int, int>;
                    std::map<int, std::multiset<Key>> expected;
                    for (const NodeCall& c : baseline_schedule(ScheduleShape{M, s.moe_layers})) {
                        const int position =
                            c.layer >= 0 ? c.layer : (c.node == NodeKind::kEmbedding ? -1 : L);
                        expected[stage_of_position(s, position)].insert(
                            {c.micro_batch, c.layer, static_cast<int>(c.node),
                             static_cast<int>(c.phase)});
                    }
                    for (int st = 0; st < P; ++st) {
                        std::multiset<Key> got;
                        for (const NodeCall& c : lists[static_cast<size_t>(st)]) {
                            EXPECT_EQ(c.stage, st);
                            if (is_pipeline_transfer(c.node) || c.phase == Phase::kBackwardDw)
                                continue;
                            got.insert({c.micro_batch, c.layer, static_cast<int>(c.node),
                                        static_cast<int>(c.phase)});
                        }
                        EXPECT_EQ(got, expected[st]) << label << " stage " << st;
                    }
                }
            }
        }
    }
}

// Buckets of two positions each over every stage's positions (the last one may hold one).
std::vector<std::vector<int>> two_position_buckets(const PipelineShape& s) {
    std::vector<std::vector<int>> out;
    for (int st = 0; st < s.num_stages; ++st) {
        const std::vector<int> pos = stage_positions(s, st);
        std::vector<int> ends;
        for (size_t i = 1; i < pos.size(); i += 2)
            ends.push_back(pos[i]);
        if (ends.empty() || ends.back() != pos.back())
            ends.push_back(pos.back());
        out.push_back(ends);
    }
    return out;
}

// The one emitter over every way a step runs, with pipelines: MoE chunks, paired edges, bucket
// reductions and parameter gathers, even and uneven layouts. Each stage runs exactly the
// single-stage baseline's calls of the positions it holds (chunked the same way), every bucket is
// reduced and gathered once on its stage, weight gradients accumulate in micro-batch order, and
// the lists replay without a deadlock (chunk events and gather waits modelled).
TEST(PipelineSchedule, ChunksPairsAndBucketsRunWithPipelinesWithoutDeadlock) {
    for (int P : {1, 2, 4}) {
        for (int V : {1, 2}) {
            if (P == 1 && V > 1)
                continue;
            for (int mult : {1, 2, 3}) {
                for (int mode = 0; mode < 3; ++mode) {
                    for (int C : {1, 2}) {
                        for (bool pair : {false, true}) {
                            for (bool uneven : {false, true}) {
                                const int M = P * mult;
                                const int L = P * V * 2 + (uneven ? 1 : 0);
                                PipelineShape s = shape_of(P, V, M, L, mode > 0, mode == 2);
                                s.num_moe_chunks = C;
                                s.pair_edges = pair;
                                if (uneven) {
                                    // The first chunk of stage 0 one layer short, the last chunk
                                    // of the last stage one longer (+1 layer in total... plus 2).
                                    s.layout.assign(
                                        static_cast<size_t>(P),
                                        std::vector<ChunkLayers>(static_cast<size_t>(V)));
                                    int next = 0;
                                    for (int c = 0; c < V; ++c) {
                                        for (int st = 0; st < P; ++st) {
                                            int n = 2;
                                            if (c == 0 && st == 0)
                                                n = 1;
                                            if (c == V - 1 && st == P - 1)
                                                n = L - next;
                                            s.layout[static_cast<size_t>(st)]
                                                    [static_cast<size_t>(c)] = {next, next + n};
                                            next += n;
                                        }
                                    }
                                }
                                s.stage_grad_bucket_ends = two_position_buckets(s);
                                s.stage_param_bucket_ends = s.stage_grad_bucket_ends;
                                const std::string label =
                                    "PP " + std::to_string(P) + " VPP " + std::to_string(V) +
                                    " M " + std::to_string(M) + " mode " + std::to_string(mode) +
                                    " C " + std::to_string(C) + " pair " + std::to_string(pair) +
                                    " uneven " + std::to_string(uneven);
                                const auto lists = pipeline_schedules(s);
                                std::string why;
                                EXPECT_TRUE(replays_without_deadlock(lists, why))
                                    << label << ": " << why;
                                using Key = std::tuple<int, int, int, int, int>;
                                std::map<int, std::multiset<Key>> expected;
                                ScheduleShape one{M, s.moe_layers};
                                one.num_moe_chunks = C;
                                for (const NodeCall& c : baseline_schedule(one)) {
                                    const int position =
                                        c.layer >= 0 ? c.layer
                                                     : (c.node == NodeKind::kEmbedding ? -1 : L);
                                    expected[stage_of_position(s, position)].insert(
                                        {c.micro_batch, c.layer, static_cast<int>(c.node),
                                         static_cast<int>(c.phase), c.moe_chunk});
                                }
                                for (int st = 0; st < P; ++st) {
                                    std::multiset<Key> got;
                                    std::map<int, int> reduced, gathered;
                                    // (layer, node, moe chunk) -> last micro-batch accumulated
                                    std::map<std::tuple<int, int, int>, int> accumulated;
                                    for (const NodeCall& c : lists[static_cast<size_t>(st)]) {
                                        if (c.node == NodeKind::kGradReduce) {
                                            ++reduced[c.layer];
                                            EXPECT_EQ(c.micro_batch, M - 1) << label;
                                            continue;
                                        }
                                        if (c.node == NodeKind::kParamGather) {
                                            ++gathered[c.layer];
                                            EXPECT_EQ(c.micro_batch, 0) << label;
                                            continue;
                                        }
                                        const bool wgrad =
                                            c.phase == Phase::kBackwardDw ||
                                            (c.phase == Phase::kBackward && !c.wgrad_delayed);
                                        if (wgrad && !is_pipeline_transfer(c.node)) {
                                            auto [it, fresh] = accumulated.try_emplace(
                                                {c.layer, static_cast<int>(c.node), c.moe_chunk},
                                                c.micro_batch);
                                            EXPECT_TRUE(fresh || it->second < c.micro_batch)
                                                << label << ": " << call_name(c);
                                            it->second = c.micro_batch;
                                        }
                                        if (is_pipeline_transfer(c.node) ||
                                            c.phase == Phase::kBackwardDw)
                                            continue;
                                        got.insert({c.micro_batch, c.layer,
                                                    static_cast<int>(c.node),
                                                    static_cast<int>(c.phase), c.moe_chunk});
                                    }
                                    EXPECT_EQ(got, expected[st]) << label << " stage " << st;
                                    const size_t buckets =
                                        s.stage_grad_bucket_ends[static_cast<size_t>(st)].size();
                                    EXPECT_EQ(reduced.size(), buckets) << label;
                                    EXPECT_EQ(gathered.size(), buckets) << label;
                                    for (const auto& [b, n] : reduced)
                                        EXPECT_EQ(n, 1) << label << " bucket " << b;
                                    for (const auto& [b, n] : gathered)
                                        EXPECT_EQ(n, 1) << label << " bucket " << b;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

// Paired edges in a pipeline: the warm-up's forwards of one model chunk run two by two and the
// last two backwards together, with one more warm-up unit than unpaired.
// Full recompute with pipelines: groups of 2 layers per model chunk; every stage runs the
// single-stage baseline's calls of its positions, recompute calls included, and nothing
// deadlocks. A group that crosses model chunks is refused.
TEST(PipelineSchedule, FullRecomputeGroupsRunPerModelChunkWithoutDeadlock) {
    for (int V : {1, 2}) {
        for (int mode = 0; mode < 3; ++mode) {
            const int P = 2, M = 4, L = 8;
            PipelineShape s = shape_of(P, V, M, L, mode > 0, mode == 2);
            const int per_chunk = L / (P * V);
            for (int l = 0; l < L; ++l)
                s.recompute_first.push_back(l / 2 * 2);  // chunks hold 2 or 4 layers
            const std::string label = "VPP " + std::to_string(V) + " mode " + std::to_string(mode);
            const auto lists = pipeline_schedules(s);
            std::string why;
            EXPECT_TRUE(replays_without_deadlock(lists, why)) << label << ": " << why;
            using Key = std::tuple<int, int, int, int>;
            std::map<int, std::multiset<Key>> expected;
            ScheduleShape one{M, s.moe_layers};
            one.recompute_first = s.recompute_first;
            for (const NodeCall& c : baseline_schedule(one)) {
                const int position =
                    c.layer >= 0 ? c.layer : (c.node == NodeKind::kEmbedding ? -1 : L);
                expected[stage_of_position(s, position)].insert(
                    {c.micro_batch, c.layer, static_cast<int>(c.node), static_cast<int>(c.phase)});
            }
            size_t recomputes = 0;
            for (int st = 0; st < P; ++st) {
                std::multiset<Key> got;
                for (const NodeCall& c : lists[static_cast<size_t>(st)]) {
                    if (is_pipeline_transfer(c.node) || c.phase == Phase::kBackwardDw)
                        continue;
                    recomputes += c.phase == Phase::kRecompute;
                    got.insert({c.micro_batch, c.layer, static_cast<int>(c.node),
                                static_cast<int>(c.phase)});
                }
                EXPECT_EQ(got, expected[st]) << label << " stage " << st;
            }
            // Every layer's forward nodes once more per micro-batch: 7 MoE layers of 4 nodes and
            // a dense one of 2.
            EXPECT_EQ(recomputes, static_cast<size_t>(M * (7 * 4 + 2))) << label;
            if (per_chunk == 2) {
                PipelineShape across = s;
                across.recompute_first[2] = 1;  // layer 2 starts chunk 1 (stage 1)
                across.recompute_first[1] = 1;
                EXPECT_THROW(pipeline_schedules(across), std::invalid_argument);
            }
        }
    }
}

TEST(PipelineSchedule, PairedEdgesPairTheWarmupAndTheCooldown) {
    PipelineShape s = shape_of(2, 1, 4, 4, true);
    s.pair_edges = true;
    EXPECT_EQ(num_warmup_units(s, 1), 2);  // 0 + 1 (overlap) + 1 (pair)
    EXPECT_EQ(num_warmup_units(s, 0), 3);
    const std::vector<PipelineStep> last = stage_steps(s, 1);
    ASSERT_GE(last.size(), 2u);
    EXPECT_TRUE(last.front().paired && last.front().has_forward);
    EXPECT_EQ(last.front().forward.micro_batch, 0);
    EXPECT_EQ(last.front().second.micro_batch, 1);
    EXPECT_TRUE(last.back().paired && last.back().has_backward);
    EXPECT_EQ(last.back().backward.micro_batch, 2);
    EXPECT_EQ(last.back().second.micro_batch, 3);
    // Stage 0: forwards 0 and 1 paired, then 2 alone (its partner would be a steady unit).
    const std::vector<PipelineStep> first = stage_steps(s, 0);
    EXPECT_TRUE(first[0].paired);
    EXPECT_FALSE(first[1].paired);
    EXPECT_EQ(first[1].forward.micro_batch, 2);
}

TEST(PipelineSchedule, OverlapMergesAForwardWithAnotherUnitsBackward) {
    const auto lists = pipeline_schedules(shape_of(2, 2, 4, 4, true));
    // Somewhere on stage 0 a dispatch of one (micro-batch, chunk) is issued right after the
    // compute of a different one: the merged steady state.
    bool merged = false;
    const auto& l = lists[0];
    for (size_t i = 1; i < l.size(); ++i) {
        merged |= l[i].node == NodeKind::kDispatch && l[i - 1].node == NodeKind::kMlp &&
                  (l[i].micro_batch != l[i - 1].micro_batch || l[i].chunk != l[i - 1].chunk);
    }
    EXPECT_TRUE(merged);
    EXPECT_EQ(call_name(l.front()), "stage0.chunk0.mb0.embedding.forward");
}

TEST(PipelineSchedule, IdealBubble) {
    EXPECT_DOUBLE_EQ(ideal_bubble_fraction(shape_of(2, 2, 4, 4, false)), 1.0 / 8.0);
}

}  // namespace
}  // namespace epo::schedule
