// The planner end to end (src/epo/plan/plan.h make_plan): the plan of a shipped recipe (step =
// replay + optimizer, exposed = step - compute), its schedules and rows, what moves it (micro-
// batches, the link, the expert load, the host), its refusals, and the options it shares with
// Python's epo.plan.
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
#include "plan/plan_test_util.h"

namespace epo::plan {
namespace {

using namespace test_util;
using schedule::NodeCall;
using schedule::StreamId;

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
