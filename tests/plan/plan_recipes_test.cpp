// Every shipped recipe plans at its reference layout (docs/recipes.md "Layouts the recipes are
// run at"; mixtral-8x7b and tiny-moe have none there: the layouts below are this test's) on every
// GPU family, and the four published cases of docs/plan.md plan without a refusal.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "epo/config/builder.h"
#include "epo/config/recipes.h"
#include "epo/config/validate.h"
#include "epo/plan/plan.h"
#include "epo/plan/plan_target.h"

namespace epo::plan {
namespace {

struct Layout {
    int nodes, per_node;
    std::vector<std::string> overrides;
};

Layout reference_layout(const std::string& recipe) {
    if (recipe == "qwen3-30b-a3b")
        return {2, 8, {"model.expert_model_parallel_size=16"}};
    if (recipe == "qwen3-235b-a22b") {
        // 94 layers over PP 8 x VPP 4: the embedding and the loss each count as a layer.
        return {
            32,
            8,
            {"model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
             "model.pipeline_model_parallel_size=8", "model.virtual_pipeline_model_parallel_size=4",
             "model.expert_model_parallel_size=32",
             "model.account_for_embedding_in_pipeline_split=true",
             "model.account_for_loss_in_pipeline_split=true"}};
    }
    if (recipe == "deepseek-v3") {
        // 61 layers and the MTP layer over PP 8 x VPP 4 = 32 model chunks.
        return {128,
                8,
                {"model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
                 "model.pipeline_model_parallel_size=8",
                 "model.pipeline_model_parallel_layout=Et|(tt|)*30mL",
                 "model.expert_model_parallel_size=64"}};
    }
    if (recipe == "mixtral-8x7b")
        return {2, 8, {"model.expert_model_parallel_size=8"}};
    return {1, 2, {"model.expert_model_parallel_size=2"}};  // tiny-moe
}

config::ValidationReport validated(const std::string& recipe, const std::string& gpu,
                                   std::vector<std::string> overrides, int nodes, int per_node) {
    config::ConfigSources sources;
    sources.model = recipe;
    sources.harness.num_nodes = nodes;
    sources.harness.gpus_per_node = per_node;
    overrides.push_back("env.gpu=" + gpu);
    sources.overrides = std::move(overrides);
    config::ValidationReport report = config::validate(config::build_config(sources));
    retarget_for_plan(report);
    return report;
}

PlanResult plan_of(const config::ValidationReport& report) {
    PlanOptions o;
    o.hardware = resolve_hardware(report.config.env.gpu, {});
    o.params = default_params(o.hardware.device);
    return make_plan(report.config, o);
}

TEST(PlanRecipes, EveryRecipePlansAtItsReferenceLayoutOnEveryGpu) {
    for (std::string_view name : config::recipe_names()) {
        const std::string recipe(name);
        const Layout layout = reference_layout(recipe);
        for (const char* gpu : {"h100", "h200", "b200", "gb200"}) {
            SCOPED_TRACE(recipe + " on " + gpu);
            const config::ValidationReport report =
                validated(recipe, gpu, layout.overrides, layout.nodes, layout.per_node);
            for (const config::Finding& f : report.errors)
                ADD_FAILURE() << f.id << " " << f.field << " = " << f.value << ": " << f.message;
            if (!report.ok())
                continue;
            for (const config::Finding& f : report.warnings)
                EXPECT_NE(f.id.rfind("RT", 0), 0u) << f.id << " left as a warning";
            const PlanResult r = plan_of(report);
            ASSERT_GE(r.runs.size(), 3u);
            for (const ScheduleEstimate& e : r.runs) {
                EXPECT_GT(e.step_time_s, 0);
                EXPECT_GT(e.peak_memory_bytes, 0);
            }
        }
    }
}

// The published cases of docs/plan.md "Published runs against the plan", as configurations.
TEST(PlanRecipes, PublishedCasesPlanWithoutARefusal) {
    const auto plans = [](const std::string& recipe, std::vector<std::string> o, int nodes) {
        const config::ValidationReport report = validated(recipe, "h100", std::move(o), nodes, 8);
        for (const config::Finding& f : report.errors)
            ADD_FAILURE() << recipe << ": " << f.id << " " << f.field << " = " << f.value << ": "
                          << f.message;
        return report.ok() && plan_of(report).runs.size() >= 3;
    };
    EXPECT_TRUE(plans("qwen3-30b-a3b", {"model.expert_model_parallel_size=16"}, 2));
    EXPECT_TRUE(plans(
        "qwen3-30b-a3b",
        {"model.expert_model_parallel_size=16", "model.moe_token_dispatcher_type=flex",
         "model.moe_flex_dispatcher_backend=hybridep", "model.cuda_graph_impl=transformer_engine",
         "model.cuda_graph_modules=[moe_router, moe_preprocess]"},
        2));
    std::vector<std::string> q235 = reference_layout("qwen3-235b-a22b").overrides;
    q235.push_back("model.moe_token_dispatcher_type=flex");
    q235.push_back("model.moe_flex_dispatcher_backend=deepep");
    q235.push_back("model.recompute_granularity=selective");
    q235.push_back("model.recompute_modules=[layernorm, moe_act]");
    EXPECT_TRUE(plans("qwen3-235b-a22b", q235, 32));
    // The DeepSeek-V3 proxy: 14 layers (the first dense), MTP 1, 256 experts, hidden 7168.
    EXPECT_TRUE(plans("deepseek-v3",
                      {"model.num_layers=14", "model.moe_layer_freq=[0,1,1,1,1,1,1,1,1,1,1,1,1,1]",
                       "model.pipeline_model_parallel_size=4",
                       "model.pipeline_model_parallel_layout=Ett|(tt|)*6mL",
                       "model.expert_model_parallel_size=16", "train.global_batch_size=256",
                       "model.seq_length=2048", "model.recompute_granularity=full",
                       "model.recompute_method=uniform", "model.recompute_num_layers=1"},
                      8));
}

}  // namespace
}  // namespace epo::plan
