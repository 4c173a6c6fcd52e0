// docs/plan.md "Published runs against the plan" and "Examples: the shipped recipes": every
// planned figure of those tables, planned here from the same configuration as the commands
// beside them (the same sources, harness flags and overrides `epo plan` builds, the default
// calibration), so the tables cannot drift from the code. A change of the cost model that moves a
// figure by more than the tolerance fails here: rerun the commands under the table and update the
// table with it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "epo/config/builder.h"
#include "epo/config/validate.h"
#include "epo/plan/calibration.h"
#include "epo/plan/plan.h"
#include "epo/plan/plan_target.h"

namespace epo::plan {
namespace {

// The table prints 4 significant figures; 0.1% is what rounding leaves plus a little.
constexpr double kTableTolerance = 1e-3;

struct PublishedPlan {
    std::string recipe;
    std::string gpu;
    int nodes = 1;
    config::HarnessOverrides harness;
    std::vector<std::string> overrides;
};

PlanResult plan_published(const PublishedPlan& p, const Calibration* calibration = nullptr) {
    config::ConfigSources sources;
    sources.model = p.recipe;
    sources.harness = p.harness;
    sources.harness.num_nodes = p.nodes;
    sources.harness.gpus_per_node = 8;
    sources.overrides = p.overrides;
    sources.overrides.push_back("env.gpu=" + p.gpu);
    config::ValidationReport report = config::validate(config::build_config(sources));
    retarget_for_plan(report);
    for (const config::Finding& f : report.errors)
        ADD_FAILURE() << p.recipe << ": " << f.id << " " << f.field << " = " << f.value;
    if (!report.ok())
        return {};
    return make_plan(report.config, plan_options(report.config, {}, calibration));
}

const ScheduleEstimate& run_named(const PlanResult& r, const std::string& name) {
    for (const ScheduleEstimate& e : r.runs) {
        if (e.name == name)
            return e;
    }
    ADD_FAILURE() << "no schedule " << name;
    static const ScheduleEstimate none;
    return none;
}

void expect_table(double planned_s, double table_s, const char* what) {
    EXPECT_NEAR(planned_s, table_s, kTableTolerance * table_s)
        << what << ": the plan gives " << planned_s << " s, docs/plan.md says " << table_s;
}

// Speedup off / on and the plan's verdict on it (pays at 1.05x or more, docs/plan.md "How it
// predicts").
void expect_speedup(double off_s, double on_s, double table_speedup, bool pays) {
    EXPECT_NEAR(off_s / on_s, table_speedup, 0.006);
    EXPECT_EQ(off_s / on_s >= 1.05, pays);
}

PublishedPlan qwen3_30b() {
    PublishedPlan p{"qwen3-30b-a3b", "h100", 2, {}, {}};
    p.harness.expert_model_parallel_size = 16;
    return p;
}

PublishedPlan qwen3_235b_on_h100() {
    PublishedPlan p{"qwen3-235b-a22b", "h100", 32, {}, {}};
    p.harness.tensor_model_parallel_size = 2;
    p.harness.pipeline_model_parallel_size = 8;
    p.harness.virtual_pipeline_model_parallel_size = std::optional<int>(4);
    p.harness.expert_model_parallel_size = 32;
    p.harness.global_batch_size = 2048;
    p.harness.moe_flex_dispatcher_backend = std::optional<std::string>("deepep");
    p.overrides = {"model.expert_tensor_parallel_size=1",
                   "model.sequence_parallel=true",
                   "model.account_for_embedding_in_pipeline_split=true",
                   "model.account_for_loss_in_pipeline_split=true",
                   "model.recompute_granularity=selective",
                   "model.recompute_modules=[layernorm, moe_act]",
                   "model.tp_comm_overlap=true"};
    return p;
}

// Megatron-Bridge PR #1760's Qwen3-235B-A22B on 64 B200; `vpp` 4 before the PR, none after it
// for fp8 (the PR turned VPP off there along with the overlap).
PublishedPlan qwen3_235b_on_b200(std::optional<int> vpp, bool mxfp8) {
    PublishedPlan p{"qwen3-235b-a22b", "b200", 8, {}, {}};
    p.harness.pipeline_model_parallel_size = 8;
    if (vpp)
        p.harness.virtual_pipeline_model_parallel_size = vpp;
    p.harness.expert_model_parallel_size = 8;
    p.harness.global_batch_size = 1024;
    p.harness.seq_length = 4096;
    p.overrides = {"model.expert_tensor_parallel_size=1",
                   "model.account_for_embedding_in_pipeline_split=true",
                   "model.account_for_loss_in_pipeline_split=true"};
    if (mxfp8) {
        p.overrides.push_back("model.fp8=e4m3");
        p.overrides.push_back("model.fp8_recipe=mxfp8");
    }
    return p;
}

TEST(PlanPublished, Row1And1bQwen3On16H100) {
    const PlanResult r = plan_published(qwen3_30b());
    const double off = run_named(r, "baseline").step_time_s;
    const double on = run_named(r, "overlap").step_time_s;
    const double delay = run_named(r, "overlap+delay_wgrad").step_time_s;
    expect_table(off, 39.59, "row 1 baseline");
    expect_table(on, 28.83, "row 1 overlap");
    expect_table(delay, 28.52, "row 1b overlap+delay_wgrad");
    expect_speedup(off, on, 1.37, true);
    expect_speedup(off, delay, 1.39, true);
}

TEST(PlanPublished, Row2Qwen3HybridEpWithGraphsOn16H100) {
    PublishedPlan p = qwen3_30b();
    p.harness.moe_flex_dispatcher_backend = std::optional<std::string>("hybridep");
    p.overrides = {"model.cuda_graph_impl=transformer_engine",
                   "model.cuda_graph_modules=[moe_router, moe_preprocess]"};
    const PlanResult r = plan_published(p);
    const double off = run_named(r, "flex").step_time_s;
    const double on = run_named(r, "flex+overlap+delay_wgrad").step_time_s;
    expect_table(off, 23.79, "row 2 flex");
    expect_table(on, 20.58, "row 2 flex+overlap+delay_wgrad");
    expect_speedup(off, on, 1.16, true);
}

TEST(PlanPublished, Row3Qwen3_235BOn256H100) {
    const PlanResult r = plan_published(qwen3_235b_on_h100());
    const double off = run_named(r, "flex").step_time_s;
    const double on = run_named(r, "flex+overlap+delay_wgrad").step_time_s;
    expect_table(off, 19.95, "row 3 flex");
    expect_table(on, 15.55, "row 3 flex+overlap+delay_wgrad");
    expect_speedup(off, on, 1.28, true);
}

TEST(PlanPublished, Row4DeepSeekV3ProxyOn64H100) {
    PublishedPlan p{"deepseek-v3", "h100", 8, {}, {}};
    p.harness.pipeline_model_parallel_size = 4;
    p.harness.expert_model_parallel_size = 16;
    p.harness.global_batch_size = 256;
    p.harness.seq_length = 2048;
    p.overrides = {"model.num_layers=14",
                   "model.moe_layer_freq=[0,1,1,1,1,1,1,1,1,1,1,1,1,1]",
                   "model.pipeline_model_parallel_layout=Ett|(tt|)*6mL",
                   "model.recompute_granularity=full",
                   "model.recompute_method=uniform",
                   "model.recompute_num_layers=1"};
    const PlanResult r = plan_published(p);
    const double off = run_named(r, "baseline").step_time_s;
    const double on = run_named(r, "overlap").step_time_s;
    expect_table(off, 3.364, "rows 4, 4b baseline");
    expect_table(on, 3.100, "rows 4, 4b overlap");
    expect_speedup(off, on, 1.09, true);
    // Row 4c: without recompute (PR #6311's arm); the recompute adds 20.9% to the step.
    p.overrides.resize(p.overrides.size() - 3);
    const PlanResult plain = plan_published(p);
    expect_table(run_named(plain, "baseline").step_time_s, 2.783, "row 4c baseline");
}

// Overlap did not pay (0.93x measured); the plan says it pays: the verdict the table marks wrong.
TEST(PlanPublished, Row5Qwen3_235BBf16On64B200) {
    const PlanResult r = plan_published(qwen3_235b_on_b200(4, false));
    const double off = run_named(r, "baseline").step_time_s;
    const double on = run_named(r, "overlap+delay_wgrad").step_time_s;
    expect_table(off, 14.43, "row 5 baseline");
    expect_table(on, 13.32, "row 5 overlap+delay_wgrad");
    expect_speedup(off, on, 1.08, true);
    // The host's launches are far from ending the step (the table's discussion).
    EXPECT_FALSE(run_named(r, "overlap+delay_wgrad").host_bound);
    EXPECT_NEAR(run_named(r, "overlap+delay_wgrad").host_launch_s, 1.598, 0.01);
}

bool has_note(const PlanResult& r, const std::string& start) {
    for (const std::string& n : r.notes) {
        if (n.rfind(start, 0) == 0)
            return true;
    }
    return false;
}

// Where published runs contradict the verdict, the plan says so: on Blackwell with the alltoall
// dispatcher (rows 5 and 6), not on H100 (row 1) nor with flex (row 2's dispatcher on a B200).
TEST(PlanPublished, BlackwellAlltoallPlansNoteTheRunsWhereOverlapDidNotPay) {
    const std::string note = "host overhead on Blackwell: published B200 runs";
    EXPECT_TRUE(has_note(plan_published(qwen3_235b_on_b200(4, false)), note));
    PublishedPlan b200 = qwen3_30b();
    b200.gpu = "b200";
    EXPECT_TRUE(has_note(plan_published(b200), note));
    EXPECT_FALSE(has_note(plan_published(qwen3_30b()), note));
    b200.harness.moe_flex_dispatcher_backend = std::optional<std::string>("hybridep");
    EXPECT_FALSE(has_note(plan_published(b200), note));
}

// The table's sensitivity of row 5: every host figure times 4 (docs/plan-sensitivity), not a
// default. The per-call charge on delayed wgrad's extra calls, not the host floor, makes it slower.
TEST(PlanPublished, Row5WithAHostFourTimesSlowerIsMarginal) {
    const Calibration c =
        read_calibration(std::string(EPO_SOURCE_DIR) + "/docs/plan-sensitivity/b200_host_x4.json");
    const PlanResult r = plan_published(qwen3_235b_on_b200(4, false), &c);
    const double off = run_named(r, "baseline").step_time_s;
    const double on = run_named(r, "overlap+delay_wgrad").step_time_s;
    expect_table(off, 16.98, "row 5 host x4 baseline");
    expect_table(on, 17.01, "row 5 host x4 overlap+delay_wgrad");
    EXPECT_EQ(r.verdict, "pays");  // the overlap row (1.09x): only delayed wgrad turns slower
    EXPECT_FALSE(run_named(r, "overlap+delay_wgrad").host_bound);
    EXPECT_NEAR(off / on, 1.00, 0.006);
}

// Before the PR: VPP 4 with overlap (and delayed wgrad); after it: no VPP, no overlap. The
// measured 20.1 -> 16.9 s is the two changes together; the plan plans each side as it ran.
TEST(PlanPublished, Row6Qwen3_235BMxfp8On64B200) {
    const PlanResult before = plan_published(qwen3_235b_on_b200(4, true));
    const PlanResult after = plan_published(qwen3_235b_on_b200(std::nullopt, true));
    const double on = run_named(before, "overlap+delay_wgrad").step_time_s;
    const double off = run_named(after, "baseline").step_time_s;
    expect_table(off, 11.61, "row 6 baseline without VPP");
    expect_table(on, 11.22, "row 6 overlap+delay_wgrad with VPP 4");
    EXPECT_NEAR(off / on, 1.03, 0.006);  // the plan: on is 3% faster; measured 16% slower
    // MXFP8 against the BF16 of row 5 at the same layout: the plan's fp8 is 15% faster.
    expect_table(run_named(before, "baseline").step_time_s, 12.29, "row 6 baseline with VPP 4");
}

// docs/plan.md "Examples: the shipped recipes on H100 and B200 clusters": baseline / overlap /
// overlap + delayed wgrad as the table prints them (3 significant figures) and the verdict.
struct ExampleRow {
    PublishedPlan plan;
    double baseline, overlap, delayed;
    const char* verdict;
};

std::vector<ExampleRow> example_rows(const std::string& gpu, const std::vector<double>& figures,
                                     const std::vector<const char*>& verdicts) {
    const auto layout = [&](const std::string& recipe, int nodes, int ep) {
        PublishedPlan p{recipe, gpu, nodes, {}, {}};
        p.harness.expert_model_parallel_size = ep;
        return p;
    };
    PublishedPlan q235 = layout("qwen3-235b-a22b", 32, 32);
    q235.harness.tensor_model_parallel_size = 2;
    q235.harness.pipeline_model_parallel_size = 8;
    q235.harness.virtual_pipeline_model_parallel_size = std::optional<int>(4);
    q235.overrides = {"model.sequence_parallel=true",
                      "model.account_for_embedding_in_pipeline_split=true",
                      "model.account_for_loss_in_pipeline_split=true"};
    PublishedPlan dsv3 = layout("deepseek-v3", 128, 64);
    dsv3.harness.tensor_model_parallel_size = 2;
    dsv3.harness.pipeline_model_parallel_size = 8;
    dsv3.overrides = {"model.sequence_parallel=true",
                      "model.pipeline_model_parallel_layout=Et|(tt|)*30mL"};
    const std::vector<PublishedPlan> plans = {layout("qwen3-30b-a3b", 1, 8),
                                              layout("qwen3-30b-a3b", 2, 16),
                                              layout("qwen3-30b-a3b", 4, 32),
                                              layout("qwen3-235b-a22b", 4, 32),
                                              q235,
                                              dsv3,
                                              layout("mixtral-8x7b", 2, 8)};
    std::vector<ExampleRow> rows;
    for (size_t i = 0; i < plans.size(); ++i)
        rows.push_back(
            {plans[i], figures[3 * i], figures[3 * i + 1], figures[3 * i + 2], verdicts[i]});
    return rows;
}

void expect_examples(const std::vector<ExampleRow>& rows) {
    for (const ExampleRow& row : rows) {
        SCOPED_TRACE(row.plan.recipe + " on " + row.plan.gpu + ", " +
                     std::to_string(row.plan.nodes) + " nodes");
        const PlanResult r = plan_published(row.plan);
        // Three significant figures: within half a unit of the last one (0.5% at most).
        EXPECT_NEAR(run_named(r, "baseline").step_time_s, row.baseline, 0.0051 * row.baseline);
        EXPECT_NEAR(run_named(r, "overlap").step_time_s, row.overlap, 0.0051 * row.overlap);
        EXPECT_NEAR(run_named(r, "overlap+delay_wgrad").step_time_s, row.delayed,
                    0.0051 * row.delayed);
        EXPECT_EQ(r.verdict, row.verdict);
    }
}

TEST(PlanPublished, ExamplesTableOnH100) {
    expect_examples(example_rows("h100",
                                 {45.6, 40.5, 42.3, 39.6, 28.8, 28.5, 25.0, 19.6, 19.8, 211, 155,
                                  155,  28.4, 21.3, 21.5, 42.5, 33.7, 33.0, 10.2, 10.0, 10.2},
                                 {"pays", "pays", "pays", "pays", "pays", "pays", "marginal"}));
}

TEST(PlanPublished, ExamplesTableOnB200) {
    expect_examples(example_rows("b200",
                                 {22.6, 19.7, 21.5, 30.1, 24.4, 24.6, 20.3, 17.5, 17.7, 163, 137,
                                  137,  22.2, 18.7, 18.8, 31.5, 26.2, 26.3, 5.05, 4.93, 5.07},
                                 {"pays", "pays", "pays", "pays", "pays", "pays", "marginal"}));
}

}  // namespace
}  // namespace epo::plan
