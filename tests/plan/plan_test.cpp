// The planner (src/epo/plan/): its replay of a schedule with known durations against the time
// worked out by hand, the cost of a node call against its formula, the plan of a shipped recipe
// end to end (step = replay + optimizer, exposed = step - compute), and its refusals.
#include "epo/plan/plan.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "epo/config/builder.h"
#include "epo/config/recipes.h"
#include "epo/config/validate.h"
#include "epo/core/error.h"
#include "epo/schedule/critical_path.h"
#include "epo/train/step_plan.h"

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

config::Config finalized(std::vector<std::string> overrides, int ep = 16, int nodes = 2,
                         int per_node = 8) {
    config::ConfigSources sources;
    sources.model = "qwen3-30b-a3b";
    sources.harness.num_nodes = nodes;
    sources.harness.gpus_per_node = per_node;
    sources.harness.expert_model_parallel_size = ep;
    sources.overrides = std::move(overrides);
    const config::ValidationReport report = config::validate(config::build_config(sources));
    EXPECT_TRUE(report.ok());
    return report.config;
}

Hardware h100() {
    return resolve_hardware("h100", {});
}

TEST(PlanCost, ProductTimeFollowsTheEfficiencyCurve) {
    // 2 m n k / (peak * e * x / (x + h)), x = min(m, n, k) = 128: 2 * 128 * 1024 * 4096 /
    // (989e12 * 0.5 * 128 / 256) = 4.342e-6 s, plus the node overhead.
    NodeWork w;
    w.gemms = {{128, 1024, 4096}};
    CostParams p;
    p.gemm_efficiency = 0.5;
    p.gemm_half_dim = 128;
    p.node_overhead_us = 10;
    const DeviceSpec d = h100().device;
    EXPECT_NEAR(compute_seconds(w, d, p), 2.0 * 128 * 1024 * 4096 / (989e12 * 0.25) + 10e-6, 1e-12);
    // A weight gradient at its own efficiency and half point: 0.25 * 128 / (128 + 384).
    w.gemms[0].pass = GemmPass::kWgrad;
    p.wgrad_efficiency = 0.25;
    p.wgrad_half_dim = 384;
    EXPECT_NEAR(compute_seconds(w, d, p), 2.0 * 128 * 1024 * 4096 / (989e12 * 0.0625) + 10e-6,
                1e-12);
}

TEST(PlanCost, DispatchMovesTheRoutedRowsByNode) {
    // EP 16 over 2 nodes of 8: of a micro-batch's T k = 4096 * 8 rows, 7/16 go to this node's
    // other ranks and 8/16 to the other node; a row is H c + 4 = 2048 * 2 + 4 bytes.
    const config::Config cfg = finalized({});
    const model::GptShape shape = model::gpt_shape_from_config(cfg, 16, 0);
    const train::StepPlan sp = train::make_step_plan(cfg, shape);
    const PlanModel m = make_plan_model(cfg, sp, h100().device, false);
    const NodeWork w =
        node_work(m, {0, 0, schedule::NodeKind::kDispatch, schedule::Phase::kForward});
    EXPECT_EQ(w.bytes.inter_sent, static_cast<int64_t>(4096.0 * 8 * 8 / 16 * 4100));
    EXPECT_EQ(w.bytes.intra_sent, static_cast<int64_t>(4096.0 * 8 * 7 / 16 * 4100));
    EXPECT_EQ(w.num_collectives, 2);  // counts, then rows
    // At link efficiency 1: the inter-node bytes over 400 Gbit/s, plus two latencies.
    CostParams p;
    p.link_efficiency = 1;
    EXPECT_NEAR(comm_seconds(w, h100().network, p),
                static_cast<double>(w.bytes.inter_sent) / 50e9 + 2 * 10e-6, 1e-12);
}

// The busiest EP rank (docs/plan.md "Expert load"): its experts compute f times the mean rows
// and its all-to-alls move f times the mean bytes; the router's permutation of the rank's own
// tokens and the dense calls stay as they are.
TEST(PlanCost, ExpertLoadImbalanceChargesTheBusiestRank) {
    const config::Config cfg = finalized({});
    const model::GptShape shape = model::gpt_shape_from_config(cfg, 16, 0);
    const train::StepPlan sp = train::make_step_plan(cfg, shape);
    const PlanModel even = make_plan_model(cfg, sp, h100().device, false);
    ExpertLoadImbalance load;
    load.all = 1.5;
    const PlanModel busy = make_plan_model(cfg, sp, h100().device, false, load);
    const auto call = [](schedule::NodeKind kind, schedule::Phase phase) {
        return NodeCall{0, 3, kind, phase};
    };
    using schedule::NodeKind;
    using schedule::Phase;
    for (Phase phase : {Phase::kForward, Phase::kBackward}) {
        const NodeWork a = node_work(even, call(NodeKind::kMlp, phase));
        const NodeWork b = node_work(busy, call(NodeKind::kMlp, phase));
        ASSERT_EQ(a.gemms.size(), b.gemms.size());
        for (size_t i = 0; i < a.gemms.size(); ++i) {
            EXPECT_DOUBLE_EQ(b.gemms[i].m, 1.5 * a.gemms[i].m);
            EXPECT_DOUBLE_EQ(b.gemms[i].count, a.gemms[i].count);
        }
        EXPECT_DOUBLE_EQ(b.elementwise_bytes, 1.5 * a.elementwise_bytes);
        for (NodeKind k : {NodeKind::kDispatch, NodeKind::kCombine}) {
            const NodeWork x = node_work(even, call(k, phase));
            const NodeWork y = node_work(busy, call(k, phase));
            EXPECT_NEAR(static_cast<double>(y.bytes.inter_recv),
                        1.5 * static_cast<double>(x.bytes.inter_recv), 2.0);
            EXPECT_NEAR(static_cast<double>(y.bytes.intra_sent),
                        1.5 * static_cast<double>(x.bytes.intra_sent), 2.0);
        }
        const NodeWork p = node_work(even, call(NodeKind::kPreDispatch, phase));
        const NodeWork q = node_work(busy, call(NodeKind::kPreDispatch, phase));
        EXPECT_DOUBLE_EQ(q.elementwise_bytes, p.elementwise_bytes);
        EXPECT_EQ(q.gemms.size(), p.gemms.size());
    }
    // A per-layer list applies layer by layer.
    load.per_moe_layer.assign(static_cast<size_t>(shape.num_layers), 1.0);
    load.per_moe_layer[3] = 2.0;
    const PlanModel one = make_plan_model(cfg, sp, h100().device, false, load);
    EXPECT_DOUBLE_EQ(node_work(one, call(NodeKind::kMlp, Phase::kForward)).gemms[0].m,
                     2 * node_work(even, call(NodeKind::kMlp, Phase::kForward)).gemms[0].m);
    EXPECT_DOUBLE_EQ(node_work(one, NodeCall{0, 2, NodeKind::kMlp, Phase::kForward}).gemms[0].m,
                     node_work(even, NodeCall{0, 2, NodeKind::kMlp, Phase::kForward}).gemms[0].m);
}

// A chunked MoE layer's calls (docs/chunked-overlap.md) split the micro-batch's work: together
// the C chunks' calls do the products and move the bytes of the one whole call, each chunk
// running L / C experts on their whole rows.
TEST(PlanCost, ChunksShareTheWholeCallsWork) {
    const auto flops = [](const NodeWork& w) {
        double f = 0;
        for (const Gemm& g : w.gemms)
            f += 2 * g.m * g.n * g.k * g.count;
        return f;
    };
    const auto work = [](const std::vector<std::string>& o, schedule::NodeKind kind, int chunk) {
        const config::Config cfg = finalized(o);
        const model::GptShape shape = model::gpt_shape_from_config(cfg, 16, 0);
        const PlanModel m =
            make_plan_model(cfg, train::make_step_plan(cfg, shape), h100().device, false);
        NodeCall call{0, 0, kind, schedule::Phase::kForward};
        call.moe_chunk = chunk;
        return node_work(m, call);
    };
    const NodeWork whole = work({}, schedule::NodeKind::kMlp, -1);
    const NodeWork whole_dispatch = work({}, schedule::NodeKind::kDispatch, -1);
    ASSERT_FALSE(whole.gemms.empty());
    // With overlap: without it, chunks run whole (W014).
    const std::vector<std::string> o = {"model.moe_ep_overlap_num_chunks=4",
                                        "comm_overlap.overlap_moe_expert_parallel_comm=true"};
    const NodeWork part = work(o, schedule::NodeKind::kMlp, 1);
    EXPECT_NEAR(4 * flops(part), flops(whole), 1e-6 * flops(whole));
    EXPECT_NEAR(4 * part.elementwise_bytes, whole.elementwise_bytes,
                1e-9 * whole.elementwise_bytes);
    // qwen3-30b-a3b at EP 16: 8 local experts, so 2 per chunk, each on its whole rows.
    EXPECT_DOUBLE_EQ(part.gemms[0].m, whole.gemms[0].m);
    EXPECT_DOUBLE_EQ(part.gemms[0].count, 2);
    const NodeWork d = work(o, schedule::NodeKind::kDispatch, 3);
    EXPECT_NEAR(4.0 * static_cast<double>(d.bytes.inter_sent),
                static_cast<double>(whole_dispatch.bytes.inter_sent), 4.0);
}

TEST(PlanCost, FlexDeduplicatesAsDocsFlexSays) {
    // docs/flex.md: E = 256, k = 8: 1.0 remote copies per token on 2 nodes, 2.7 on 4, 4.6 on 8.
    EXPECT_NEAR(flex_remote_copies(256, 8, 2), 1.0, 0.01);
    EXPECT_NEAR(flex_remote_copies(256, 8, 4), 2.7, 0.05);
    EXPECT_NEAR(flex_remote_copies(256, 8, 8), 4.6, 0.05);
    EXPECT_EQ(flex_remote_copies(256, 8, 1), 0.0);
}

TEST(Plan, StepIsTheReplayPlusTheOptimizer) {
    const config::Config cfg = finalized({});
    const Hardware hw = h100();
    CostParams p = default_params(hw.device);
    p.overlap_slowdown = 0;  // the baseline's gradient buckets overlap its backward
    const ScheduleEstimate e = estimate_schedule(cfg, hw, p, false);
    const model::GptShape shape = model::gpt_shape_from_config(cfg, 16, 0);
    const train::StepPlan sp = train::make_step_plan(cfg, shape);
    const PlanModel m = make_plan_model(cfg, sp, hw.device, false);
    const double replay = schedule::critical_path_seconds(
        sp.calls, [&](const NodeCall& c) { return call_seconds(m, c, hw, p); });
    EXPECT_NEAR(e.step_time_s, replay + e.optimizer_s, 1e-9 * replay);
    EXPECT_NEAR(e.exposed_comm_s, e.step_time_s - e.compute_s, 1e-9);
    EXPECT_EQ(e.name, "baseline");
    EXPECT_EQ(e.num_calls, sp.calls.size());
}

TEST(Plan, ThreeSchedulesNamedAsEpoBenchNamesThem) {
    const PlanResult r = make_plan(finalized({}), {h100(), default_params(h100().device), {}});
    ASSERT_EQ(r.runs.size(), 3u);
    EXPECT_EQ(r.runs[0].name, "baseline");
    EXPECT_EQ(r.runs[1].name, "overlap");
    EXPECT_EQ(r.runs[2].name, "overlap+delay_wgrad");
    EXPECT_EQ(r.num_micro_batches, 64);
    ASSERT_TRUE(r.overlap_speedup);
    EXPECT_DOUBLE_EQ(*r.overlap_speedup, r.runs[0].step_time_s / r.runs[1].step_time_s);
    EXPECT_GT(r.runs[1].extra_memory_bytes, 0);  // two micro-batches in flight
    EXPECT_FALSE(r.verdict.empty());
}

TEST(Plan, FlexRowsWhenTheFlexDispatcherIsSelected) {
    const config::Config cfg = finalized({"env.gpu=h100", "model.moe_token_dispatcher_type=flex",
                                          "model.moe_flex_dispatcher_backend=hybridep",
                                          "model.moe_shared_expert_overlap=false"});
    const PlanResult r = make_plan(cfg, {h100(), default_params(h100().device), {}});
    ASSERT_EQ(r.runs.size(), 5u);
    EXPECT_EQ(r.runs[3].name, "flex");
    EXPECT_EQ(r.runs[4].name, "flex+overlap+delay_wgrad");
    EXPECT_LT(r.runs[3].comm_s, r.runs[0].comm_s);  // deduplicated inter-node bytes
}

TEST(Plan, FewerMicroBatchesGainLess) {
    const Hardware hw = h100();
    const PlanResult many = make_plan(finalized({}), {hw, default_params(hw.device), {}});
    const PlanResult two =
        make_plan(finalized({"train.global_batch_size=32"}), {hw, default_params(hw.device), {}});
    EXPECT_EQ(two.num_micro_batches, 2);
    EXPECT_LT(*two.overlap_speedup, *many.overlap_speedup);
    EXPECT_NE(two.reason.find("2 micro-batches per step"), std::string::npos) << two.reason;
}

// Paired edges (docs/paired-edges.md): a plan that leaves the edges alone notes what pairing them
// would give; a paired configuration is planned with the runtime's paired schedule, which hides
// more at 2 micro-batches, and its reason no longer blames the unpaired phases.
TEST(Plan, PairedEdgesAreNotedAndPlannedWithThePairedSchedule) {
    const Hardware hw = h100();
    const PlanResult two =
        make_plan(finalized({"train.global_batch_size=32"}), {hw, default_params(hw.device), {}});
    ASSERT_EQ(two.num_micro_batches, 2);
    EXPECT_FALSE(two.pair_edges);
    // Pairing is an epo runtime knob: a GPU plan does not suggest it, a plan for this machine
    // does.
    const auto noted = [](const PlanResult& r) {
        bool found = false;
        for (const std::string& n : r.notes)
            found = found || n.find("model.moe_ep_overlap_pair_edges=true") != std::string::npos;
        return found;
    };
    EXPECT_FALSE(noted(two));
    const Hardware cpu = resolve_hardware("cpu", {});
    EXPECT_TRUE(noted(make_plan(finalized({"train.global_batch_size=32"}),
                                {cpu, default_params(cpu.device), {}})));
    const config::Config cfg =
        finalized({"train.global_batch_size=32", "model.moe_ep_overlap_pair_edges=true",
                   "comm_overlap.overlap_moe_expert_parallel_comm=true"});
    ASSERT_TRUE(cfg.model.moe_ep_overlap_pair_edges);
    const PlanResult paired = make_plan(cfg, {hw, default_params(hw.device), {}});
    EXPECT_TRUE(paired.pair_edges);
    EXPECT_GT(*paired.overlap_speedup, *two.overlap_speedup);
    EXPECT_EQ(paired.reason.find("unpaired"), std::string::npos) << paired.reason;
    for (const std::string& n : paired.notes)
        EXPECT_EQ(n.find("with paired edges"), std::string::npos) << n;
    // Megatron-Core's layout (gpu_memory.h): unpaired overlap holds one layer above the
    // baseline; the paired forwards hold two whole micro-batches at their end.
    EXPECT_GT(paired.runs[1].peak_memory_bytes, two.runs[1].peak_memory_bytes);
    const PlanResult three =
        make_plan(finalized({"train.global_batch_size=48", "model.moe_ep_overlap_pair_edges=true",
                             "comm_overlap.overlap_moe_expert_parallel_comm=true"}),
                  {hw, default_params(hw.device), {}});
    const PlanResult three_unpaired =
        make_plan(finalized({"train.global_batch_size=48"}), {hw, default_params(hw.device), {}});
    ASSERT_EQ(three.num_micro_batches, 3);
    EXPECT_GT(three.runs[1].peak_memory_bytes, three_unpaired.runs[1].peak_memory_bytes);
}

TEST(Plan, CommComputeRatioSetsTheLinkAsEpoBenchDoes) {
    // The baseline's communication at the chosen bandwidth takes R times its compute.
    config::Config cfg = finalized({"env.gpu=cpu"}, 2, 2, 1);
    Hardware hw = resolve_hardware("cpu", {});
    CostParams p = default_params(hw.device);
    const PlanResult r = make_plan(cfg, {hw, p, 2.0});
    EXPECT_NEAR(r.runs[0].comm_s / r.runs[0].compute_s, 2.0, 0.05);
}

TEST(Plan, ExpertLoadSlowsTheStepAndIsReported) {
    const Hardware hw = h100();
    const config::Config cfg = finalized({});
    const PlanResult even = make_plan(cfg, {hw, default_params(hw.device), {}});
    PlanOptions o{hw, default_params(hw.device), {}};
    o.expert_load = parse_expert_load_imbalance("1.2");
    const PlanResult busy = make_plan(cfg, o);
    for (size_t i = 0; i < even.runs.size(); ++i) {
        EXPECT_GT(busy.runs[i].step_time_s, even.runs[i].step_time_s) << even.runs[i].name;
        EXPECT_GT(busy.runs[i].alltoall_s, 1.15 * even.runs[i].alltoall_s) << even.runs[i].name;
    }
    // A note says what balanced routing would give: the balanced plan's own times.
    const auto note = std::find_if(busy.notes.begin(), busy.notes.end(), [](const std::string& n) {
        return n.find("expert load up to 1.20x the mean") != std::string::npos;
    });
    ASSERT_NE(note, busy.notes.end());
    EXPECT_NE(note->find(fmt::format("the baseline would take {:.4g} s", even.runs[0].step_time_s)),
              std::string::npos)
        << *note;
    for (const std::string& n : even.notes)
        EXPECT_EQ(n.find("expert load"), std::string::npos) << n;
    ASSERT_EQ(busy.load_imbalance.size(), 48u);  // every layer of qwen3-30b-a3b is MoE
    EXPECT_DOUBLE_EQ(busy.load_imbalance[7], 1.2);
    EXPECT_DOUBLE_EQ(even.load_imbalance[7], 1.0);
}

TEST(Plan, RefusesAnExpertLoadThatDoesNotFitTheModel) {
    const Hardware hw = h100();
    const auto refusal = [&](ExpertLoadImbalance load, int ep) {
        PlanOptions o{hw, default_params(hw.device), {}};
        o.expert_load = std::move(load);
        try {
            make_plan(finalized({}, ep), o);
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::kConfig);
            return std::string(e.what());
        }
        ADD_FAILURE() << "planned";
        return std::string();
    };
    ExpertLoadImbalance two;  // a run of a 2-layer proxy, against the 48 MoE layers
    two.per_moe_layer = {1.3, 1.1};
    two.source = "runs/proxy/metrics.json";
    const std::string e = refusal(two, 16);
    EXPECT_NE(e.find("lists 2 MoE layer(s), the planned model has 48"), std::string::npos) << e;
    EXPECT_NE(e.find("give one number for every layer"), std::string::npos) << e;
    ExpertLoadImbalance high;
    high.all = 3;  // EP 2: one rank receiving everything is an imbalance of 2
    const std::string h = refusal(high, 2);
    EXPECT_NE(h.find("above the EP size 2"), std::string::npos) << h;
}

PlanModel plan_model_of(const config::Config& cfg) {
    model::GptShape shape = model::gpt_shape_from_config(cfg, 16, 0);
    shape.pipeline_size = cfg.model.pipeline_model_parallel_size;
    shape.virtual_pipeline_size = config::virtual_pipeline_size(cfg.model);
    const train::StepPlan sp = train::make_step_plan(cfg, shape);
    return make_plan_model(cfg, sp, h100().device, false);
}

// TP 2 with SP (qwen3-30b-a3b: H 2048, 32 heads and 4 groups of 128, T = 4096 tokens): the
// attention's products are half as wide, (T, (32 + 8) 128 / 2 = 2560, 2048) and (T, 2048,
// 32 128 / 2 = 2048); a gather before and a reduce-scatter after, each (TP-1)/TP T H c =
// 0.5 x 4096 x 2048 x 2 = 8388608 bytes inside the node.
TEST(PlanCost, TensorParallelSplitsProductsAndGathersAroundThem) {
    const config::Config cfg =
        finalized({"model.tensor_model_parallel_size=2", "model.sequence_parallel=true"});
    const PlanModel m = plan_model_of(cfg);
    const NodeWork w =
        node_work(m, {0, 0, schedule::NodeKind::kPreDispatch, schedule::Phase::kForward});
    EXPECT_EQ(w.gemms[0].m, 4096);
    EXPECT_EQ(w.gemms[0].n, 2560);
    EXPECT_EQ(w.gemms[1].k, 2048);
    EXPECT_EQ(w.serial_bytes.intra_sent, 2 * 8388608);
    EXPECT_EQ(w.serial_bytes.inter_sent, 0);
    EXPECT_EQ(w.num_serial_collectives, 2);
    // The router sees this rank's T / TP = 2048 tokens: (2048, 128 experts, 2048).
    EXPECT_EQ(w.gemms[2].m, 2048);
    EXPECT_EQ(w.gemms[2].n, 128);
    // The backward moves the same bytes (the gradients' scatter and gather).
    const NodeWork b =
        node_work(m, {0, 0, schedule::NodeKind::kPreDispatch, schedule::Phase::kBackward});
    EXPECT_EQ(b.serial_bytes.intra_sent, 2 * 8388608);
    // Without SP the pair is one all-reduce: the same bytes, one collective.
    const PlanModel no_sp = plan_model_of(finalized({"model.tensor_model_parallel_size=2"}));
    const NodeWork a =
        node_work(no_sp, {0, 0, schedule::NodeKind::kPreDispatch, schedule::Phase::kForward});
    EXPECT_EQ(a.serial_bytes.intra_sent, 2 * 8388608);
    EXPECT_EQ(a.num_serial_collectives, 1);
    // The compute call waits for them: call time = compute + link time of the bytes.
    CostParams p = default_params(h100().device);
    NodeWork serial;
    serial.bytes = w.serial_bytes;
    serial.num_collectives = w.num_serial_collectives;
    EXPECT_NEAR(call_seconds(m, {0, 0, schedule::NodeKind::kPreDispatch, schedule::Phase::kForward},
                             h100(), p),
                compute_seconds(w, h100().device, p) + comm_seconds(serial, h100().network, p),
                1e-12);
}

// CP 2: queries S / 2 = 2048 against all 4096 keys; the other rank's keys and values,
// (CP-1) x T / CP x 2 G d / TP x c = 2048 x 1024 x 2 = 4194304 bytes, twice in the backward.
TEST(PlanCost, ContextParallelSplitsTheQueriesAndExchangesKeysAndValues) {
    const PlanModel m = plan_model_of(finalized({"model.context_parallel_size=2"}, 16, 4, 8));
    const NodeWork w =
        node_work(m, {0, 0, schedule::NodeKind::kPreDispatch, schedule::Phase::kForward});
    EXPECT_EQ(w.gemms[0].m, 2048);  // qkv over this rank's 2048 tokens
    EXPECT_EQ(w.gemms[3].m, 2048);  // scores (after qkv, proj, router): (S / CP, S, d)
    EXPECT_EQ(w.gemms[3].n, 4096);
    EXPECT_EQ(w.serial_bytes.intra_sent, 4194304);
    const NodeWork b =
        node_work(m, {0, 0, schedule::NodeKind::kPreDispatch, schedule::Phase::kBackward});
    EXPECT_EQ(b.serial_bytes.intra_sent, 2 * 4194304);
}

// ETP 2 (TP 2, SP): this rank routes T / TP = 2048 tokens x k 8 rows; the experts of the rank see
// the ETP group's rows (x2) at half the width (768 / 2 = 384); the dispatch all-gathers the
// received rows inside the ETP group: (ETP - 1) x 2048 x 8 more rows inside the node.
TEST(PlanCost, ExpertTensorParallelGathersRowsAndHalvesTheExperts) {
    const config::Config base =
        finalized({"model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
                   "model.expert_tensor_parallel_size=1"},
                  16, 4, 8);
    const config::Config etp =
        finalized({"model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
                   "model.expert_tensor_parallel_size=2"},
                  16, 4, 8);
    const PlanModel m1 = plan_model_of(base), m2 = plan_model_of(etp);
    const NodeCall mlp{0, 0, schedule::NodeKind::kMlp, schedule::Phase::kForward};
    const NodeWork e1 = node_work(m1, mlp), e2 = node_work(m2, mlp);
    EXPECT_EQ(e1.gemms[0].n, 2 * 768);
    EXPECT_EQ(e2.gemms[0].n, 768);                // 2F / ETP
    EXPECT_EQ(e2.gemms[0].m, 2 * e1.gemms[0].m);  // twice the rows
    const NodeCall dispatch{0, 0, schedule::NodeKind::kDispatch, schedule::Phase::kForward};
    const NodeWork d1 = node_work(m1, dispatch), d2 = node_work(m2, dispatch);
    EXPECT_EQ(d2.bytes.intra_sent - d1.bytes.intra_sent, static_cast<int64_t>(2048.0 * 8 * 4100));
    EXPECT_EQ(d2.num_collectives, d1.num_collectives + 1);
}

// MLA (deepseek-v3's sizes on a qwen3 body: q_lora 1536, kv_lora 512, 32 heads of 128 + 64
// rope, v 128): q down (T, 1536, H), q up (T, 32 x 192, 1536), kv down (T, 512 + 64, H), kv up
// (T, 32 x (128 + 128), 512), proj (T, H, 32 x 128); scores with head dim 192.
TEST(PlanCost, MultiLatentAttentionComputesItsProjections) {
    const PlanModel m = plan_model_of(finalized(
        {"model.multi_latent_attention=true", "model.q_lora_rank=1536", "model.kv_lora_rank=512",
         "model.qk_head_dim=128", "model.qk_pos_emb_head_dim=64", "model.v_head_dim=128"}));
    const NodeWork w =
        node_work(m, {0, 0, schedule::NodeKind::kPreDispatch, schedule::Phase::kForward});
    ASSERT_GE(w.gemms.size(), 8u);
    EXPECT_EQ(w.gemms[0].n, 1536);
    EXPECT_EQ(w.gemms[1].n, 32 * 192);
    EXPECT_EQ(w.gemms[1].k, 1536);
    EXPECT_EQ(w.gemms[2].n, 512 + 64);
    EXPECT_EQ(w.gemms[3].n, 32 * 256);
    EXPECT_EQ(w.gemms[3].k, 512);
    EXPECT_EQ(w.gemms[4].k, 32 * 128);
    EXPECT_EQ(w.gemms[6].k, 192);  // scores (S, S, dn + dr), after the router (T, E, H)
}

// Full recompute: the schedule's recompute call runs the layer's forward products again (the
// backward call adds nothing); selective core_attn: the backward runs only the score and context
// products again first; none as the baseline.
TEST(PlanCost, RecomputeAddsTheForwardItRunsAgain) {
    const auto flops = [](const NodeWork& w) {
        double f = 0;
        for (const Gemm& g : w.gemms)
            f += 2 * g.m * g.n * g.k * g.count;
        return f;
    };
    const NodeCall fwd{0, 0, schedule::NodeKind::kPreDispatch, schedule::Phase::kForward};
    const NodeCall bwd{0, 0, schedule::NodeKind::kPreDispatch, schedule::Phase::kBackward};
    const PlanModel none = plan_model_of(finalized({}));
    const PlanModel full = plan_model_of(
        finalized({"model.recompute_granularity=full", "model.recompute_method=uniform",
                   "model.recompute_num_layers=1"}));
    const NodeCall again{0, 0, schedule::NodeKind::kPreDispatch, schedule::Phase::kRecompute};
    EXPECT_EQ(flops(node_work(full, bwd)), flops(node_work(none, bwd)));
    EXPECT_NEAR(flops(node_work(full, again)), flops(node_work(none, fwd)),
                1e-6 * flops(node_work(none, fwd)));
    const PlanModel sel = plan_model_of(finalized({"model.recompute_granularity=selective"}));
    const NodeWork f = node_work(none, fwd);
    // Scores and context: the products after qkv, proj and the router.
    double core = 0;
    for (size_t i : {3u, 4u})
        core += 2 * f.gemms[i].m * f.gemms[i].n * f.gemms[i].k * f.gemms[i].count;
    EXPECT_NEAR(flops(node_work(sel, bwd)) - flops(node_work(none, bwd)), core, 1e-6 * core);
}

// Every layout Megatron runs plans: TP with SP, PP with VPP, MLA and MTP (deepseek-v3).
TEST(Plan, PlansTensorAndPipelineParallelLayouts) {
    const Hardware hw = h100();
    const PlanResult tp =
        make_plan(finalized({"model.tensor_model_parallel_size=2", "model.sequence_parallel=true"}),
                  {hw, default_params(hw.device), {}});
    EXPECT_EQ(tp.tp_size, 2);
    EXPECT_GT(tp.runs[0].step_time_s, 0);
    // PP 2: 48 layers, 2 stages; the bubble is (P - 1) / (V M) of the slowest stage's compute.
    const PlanResult pp = make_plan(finalized({"model.pipeline_model_parallel_size=2",
                                               "model.share_embeddings_and_output_weights=false"},
                                              8),
                                    {hw, default_params(hw.device), {}});
    const ScheduleEstimate& b = pp.runs[0];
    EXPECT_EQ(pp.num_stages, 2);
    EXPECT_NEAR(b.pipeline_bubble_s,
                1.0 / static_cast<double>(pp.num_micro_batches) * (b.compute_s - b.optimizer_s),
                1e-9);
}

}  // namespace
}  // namespace epo::plan

namespace epo::plan {
namespace {

// fp8 (qwen3-30b-a3b, T = 4096): the weight products at the fp8 rate; each forward product's
// input cast first, (m, k) elements at c + 1 = 3 bytes: qkv (4096 x 2048) + proj (4096 x 4096)
// = 25165824 elements, 75497472 bytes more than bf16. Core attention and the router (Megatron
// runs it outside Transformer Engine) stay bf16; so does the output layer (below).
TEST(PlanCost, Fp8RunsWeightProductsAtTheFp8RateAndChargesTheCasts) {
    const NodeCall fwd{0, 0, schedule::NodeKind::kPreDispatch, schedule::Phase::kForward};
    const NodeWork bf = node_work(plan_model_of(finalized({})), fwd);
    const NodeWork f8 = node_work(plan_model_of(finalized({"model.fp8=e4m3"})), fwd);
    ASSERT_EQ(f8.gemms.size(), bf.gemms.size());
    EXPECT_TRUE(f8.gemms[0].fp8 && f8.gemms[1].fp8);
    EXPECT_FALSE(f8.gemms[2].fp8);  // the router: outside Transformer Engine, never fp8
    EXPECT_FALSE(f8.gemms[3].fp8);  // scores
    EXPECT_DOUBLE_EQ(f8.elementwise_bytes - bf.elementwise_bytes,
                     3.0 * (4096.0 * 2048 + 4096.0 * 4096));
    // The product's time at the fp8 peak (1979 against 989 TFLOP/s).
    CostParams p;
    p.node_overhead_us = 0;
    NodeWork one;
    one.gemms = {f8.gemms[0]};
    NodeWork other = one;
    other.gemms[0].fp8 = false;
    EXPECT_NEAR(compute_seconds(other, h100().device, p) / compute_seconds(one, h100().device, p),
                1979.0 / 989, 1e-9);
    // The output layer: a plain column-parallel linear in Megatron-Core, bf16 with fp8 on.
    const config::Config cfg = finalized({"model.fp8=e4m3"});
    const NodeCall out{0, -1, schedule::NodeKind::kOutput, schedule::Phase::kForward};
    const NodeWork head = node_work(plan_model_of(cfg), out);
    ASSERT_FALSE(head.gemms.empty());
    for (const Gemm& g : head.gemms)
        EXPECT_FALSE(g.fp8) << g.m << " x " << g.n << " x " << g.k;
}

// Flex with fp8: the forward dispatch's rows are H + H / 128 x 4 + 4 = 2048 + 64 + 4 bytes
// instead of 2 H + 4; the combine stays bf16.
TEST(PlanCost, Fp8FlexDispatchSendsFp8RowsWithScales) {
    // The flex rows' model (make_plan_model's flex argument), with and without fp8.
    const std::vector<std::string> flex = {};
    const std::vector<std::string> fp8 = {"model.fp8=e4m3"};
    const auto model_of = [](const config::Config& cfg) {
        model::GptShape shape = model::gpt_shape_from_config(cfg, 16, 0);
        const train::StepPlan sp = train::make_step_plan(cfg, shape);
        return make_plan_model(cfg, sp, h100().device, true);
    };
    const PlanModel b = model_of(finalized(flex)), f = model_of(finalized(fp8));
    const NodeCall dispatch{0, 0, schedule::NodeKind::kDispatch, schedule::Phase::kForward};
    const NodeCall combine{0, 0, schedule::NodeKind::kCombine, schedule::Phase::kForward};
    const double ratio = static_cast<double>(node_work(f, dispatch).bytes.inter_sent) /
                         static_cast<double>(node_work(b, dispatch).bytes.inter_sent);
    EXPECT_NEAR(ratio, (2048.0 + 64 + 4) / (2 * 2048.0 + 4), 1e-6);
    EXPECT_EQ(node_work(f, combine).bytes.inter_sent, node_work(b, combine).bytes.inter_sent);
}

// CUDA graphs on moe_router and moe_preprocess: 0.4 of pre_dispatch's launches become one graph
// launch: 150 x 0.6 + 10 us instead of 150 us.
TEST(PlanCost, CudaGraphsReplaceTheGraphedModulesLaunches) {
    const NodeCall fwd{0, 0, schedule::NodeKind::kPreDispatch, schedule::Phase::kForward};
    const NodeWork w = node_work(
        plan_model_of(finalized({"model.cuda_graph_impl=transformer_engine",
                                 "model.cuda_graph_modules=[moe_router, moe_preprocess]"})),
        fwd);
    EXPECT_DOUBLE_EQ(w.graphed_share, 0.4);
    const CostParams p = default_params(h100().device);
    EXPECT_NEAR(launch_seconds(w, p), (150 * 0.6 + 10) * 1e-6, 1e-12);
    EXPECT_DOUBLE_EQ(node_work(plan_model_of(finalized({})), fwd).graphed_share, 0);
}

config::Config with_overlap(config::Config cfg) {
    cfg.model.overlap_moe_expert_parallel_comm = true;
    return cfg;
}

// The host floor: with a launch cost far above the GPU's work, the step is the host's launches
// of every call (compute calls node_overhead_us, comm calls comm_launch_us) plus the optimizer.
TEST(Plan, HostLaunchesBoundAScheduleTheGpuOutruns) {
    const config::Config cfg = finalized({"train.global_batch_size=64"});
    const Hardware hw = h100();
    CostParams p = default_params(hw.device);
    p.node_overhead_us = 1e5;  // 0.1 s a compute call
    p.comm_launch_us = 1e5;
    const ScheduleEstimate e = estimate_schedule(with_overlap(cfg), hw, p, false);
    EXPECT_TRUE(e.host_bound);
    EXPECT_NEAR(e.host_launch_s, 0.1 * static_cast<double>(e.num_calls), 1e-6);
    EXPECT_NEAR(e.step_time_s, e.host_launch_s + e.optimizer_s, 1e-9);
}

// MTP (1 depth): its transformer layer is the model's last position (GptShape: layer 48 after
// qwen3-30b-a3b's 48), with its own calls in the step plan, like the decoder's last layer plus the
// projection (T, H, 2H) on its pre_dispatch; the output call adds only the MTP's output head. The
// layer is charged once: an earlier plan also charged it inside the output call (issue #37, row 4).
TEST(PlanCost, MultiTokenPredictionAddsItsLayerOnceAndItsHeadToTheOutput) {
    const auto flops = [](const NodeWork& w) {
        double f = 0;
        for (const Gemm& g : w.gemms)
            f += 2 * g.m * g.n * g.k * g.count;
        return f;
    };
    const config::Config none_cfg = finalized({});
    const config::Config mtp_cfg = finalized({"model.mtp_num_layers=1"});
    const PlanModel none = plan_model_of(none_cfg);
    const PlanModel mtp = plan_model_of(mtp_cfg);
    ASSERT_EQ(mtp.shape.num_layers, 49);
    ASSERT_TRUE(mtp.shape.is_mtp_layer(48));
    const NodeCall out{0, -1, schedule::NodeKind::kOutput, schedule::Phase::kForward};
    const NodeCall pre{0, 47, schedule::NodeKind::kPreDispatch, schedule::Phase::kForward};
    const NodeCall mlp{0, 47, schedule::NodeKind::kMlp, schedule::Phase::kForward};
    const NodeCall mtp_pre{0, 48, schedule::NodeKind::kPreDispatch, schedule::Phase::kForward};
    const NodeCall mtp_mlp{0, 48, schedule::NodeKind::kMlp, schedule::Phase::kForward};
    const double head = flops(node_work(none, out));
    const double proj = 2.0 * 4096 * 2048 * 4096;
    EXPECT_NEAR(flops(node_work(mtp, out)), 2 * head, 1e-6 * head);
    EXPECT_NEAR(flops(node_work(mtp, mtp_pre)), flops(node_work(none, pre)) + proj, 1e-6 * proj);
    EXPECT_NEAR(flops(node_work(mtp, mtp_mlp)), flops(node_work(none, mlp)), 1e-6 * proj);
    // The step plan issues the MTP layer's calls (its dispatch and combine on the comm stream).
    const model::GptShape shape = model::gpt_shape_from_config(mtp_cfg, 16, 0);
    int mtp_calls = 0;
    for (const NodeCall& c : train::make_step_plan(mtp_cfg, shape).calls)
        mtp_calls += c.layer == 48 && c.node == schedule::NodeKind::kDispatch ? 1 : 0;
    EXPECT_GT(mtp_calls, 0);
}

}  // namespace
}  // namespace epo::plan

namespace epo::plan {
namespace {

// The options `epo plan` and Python's epo.plan share: on this machine the configuration's link
// model is the network (held exactly: efficiency 1) unless a network is given; on a GPU the
// family's network and efficiencies.
TEST(PlanOptions, TheLinkModelIsTheNetworkOnCpuUnlessOneIsGiven) {
    config::Config c = config::make_recipe("tiny-moe");
    c.comm.link.inter_node_gbps = 7.5;
    c.comm.link.latency_us = 3;
    PlanOptions o = plan_options(c);
    EXPECT_EQ(o.hardware.network.inter_node_gbps, 7.5);
    EXPECT_EQ(o.hardware.network.intra_node_gbps, 1e6);
    EXPECT_EQ(o.hardware.network.latency_us, 3);
    EXPECT_EQ(o.params.link_efficiency, 1);
    EXPECT_NE(o.hardware.network.source.find("comm.link"), std::string::npos);
    HardwareOverrides given;
    given.inter_node_gbps = 100;
    o = plan_options(c, given);
    EXPECT_EQ(o.hardware.network.inter_node_gbps, 100);
    EXPECT_EQ(o.hardware.network.source.find("comm.link"), std::string::npos);
    c.env.gpu = "h100";
    o = plan_options(c);
    EXPECT_EQ(o.hardware.device.id, "h100");
    EXPECT_NE(o.hardware.network.inter_node_gbps, 7.5);
}

}  // namespace
}  // namespace epo::plan
