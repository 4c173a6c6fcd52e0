// The validator as a whole: reporting every violation at once, the report's shapes, the flex
// checks of a built config, the overlap advisories, verdicts that survive a YAML round trip,
// and the shipped examples.
#include "epo/config/validate.h"

#include <gtest/gtest.h>

#include "config_test_util.h"
#include "epo/config/builder.h"
#include "epo/config/harness.h"
#include "epo/config/yaml_io.h"

namespace epo::config {
namespace {

using testing::delay_wgrad_config;
using testing::ep_overlap_config;
using testing::has;
using testing::ids;

TEST(Validate, EveryFamilyReportsInOnePass) {
    Config c = delay_wgrad_config();
    c.model.moe_shared_expert_overlap = true;               // EP011
    c.model.cuda_graph_modules = {CudaGraphModule::kAttn};  // WG005 (fusion off)
    c.model.num_moe_experts = 3;                            // LY001 (EP 2)
    c.model.moe_router_enable_expert_bias = true;           // MO006
    c.optimizer.adam_eps = 0;                               // VA001
    c.env.gpu = "tpu";                                      // EN001
    const ValidationReport r = validate(c);
    for (const char* id : {"EP011", "WG005", "LY001", "MO006", "VA001", "EN001"}) {
        EXPECT_TRUE(has(r.errors, id)) << id << " in " << ::testing::PrintToString(ids(r.errors));
    }
    EXPECT_FALSE(r.ok());
}

TEST(Validate, ClearingTheBackendAfterActivationFallsBackToAlltoall) {
    Config c = ep_overlap_config();
    c.env.gpu = "h100";
    ASSERT_TRUE(apply_flex_dispatcher_backend(c.model, "deepep", table_probe("h100")).activated);
    c.model.moe_flex_dispatcher_backend.reset();
    const ValidationReport r = validate(c);
    EXPECT_TRUE(r.ok()) << ::testing::PrintToString(ids(r.errors));
    EXPECT_TRUE(has(r.warnings, "W009"));
    EXPECT_EQ(r.config.model.moe_token_dispatcher_type, DispatcherType::kAlltoall);
    EXPECT_FALSE(r.config.model.moe_flex_dispatcher_backend.has_value());
}

TEST(Validate, ProbesTheDeviceOnlyForAFlexDispatcher) {
    int calls = 0;
    ValidateOptions options;
    options.probe = [&] {
        ++calls;
        return DeviceInfo{"v100", "Tesla V100", 7, 0};
    };
    Config c = ep_overlap_config();
    c.model.moe_flex_dispatcher_backend = FlexBackend::kDeepep;  // set but not activated
    const ValidationReport alltoall = validate(c, options);
    EXPECT_EQ(calls, 0);
    EXPECT_TRUE(has(alltoall.warnings, "W005"));  // backend without activation
    EXPECT_NE(testing::get(alltoall.warnings, "W005").fix.find("--moe_flex_dispatcher_backend"),
              std::string::npos);
    c.model.moe_token_dispatcher_type = DispatcherType::kFlex;
    const ValidationReport flex = validate(c, options);
    EXPECT_EQ(calls, 1);
    EXPECT_TRUE(has(flex.errors, "FX001"));
    EXPECT_FALSE(has(flex.warnings, "W005"));
}

TEST(Validate, FlexOnAConfiguredDevice) {
    Config c = ep_overlap_config();
    c.model.moe_token_dispatcher_type = DispatcherType::kFlex;
    c.model.moe_flex_dispatcher_backend = FlexBackend::kHybridep;
    c.env.gpu = "v100";
    EXPECT_EQ(ids(validate(c).errors), std::vector<std::string>{"FX002"});
    c.env.gpu = "NVIDIA GB200";
    EXPECT_TRUE(validate(c).ok());
    c.env.gpu = "cpu";
    EXPECT_TRUE(validate(c).ok());
    c.env.gpu = "mystery";  // reported once, as an unknown device
    EXPECT_EQ(ids(validate(c).errors), std::vector<std::string>{"EN001"});
}

TEST(Validate, SmallEpOverlapAdvisoryForGpuStacks) {
    Config c = ep_overlap_config();
    c.env = {"h100", "2.7.1", "2.8.0"};
    EXPECT_TRUE(has(validate(c).warnings, "W011"));
    c.comm.num_nodes = 4;
    c.comm.gpus_per_node = 2;
    c.train.global_batch_size = 16;
    EXPECT_FALSE(has(validate(c).warnings, "W011"));
    EXPECT_FALSE(has(validate(ep_overlap_config()).warnings, "W011"));  // our runtime
}

TEST(Validate, OneMicroBatchHasNothingToOverlap) {
    Config c = ep_overlap_config();
    c.train.global_batch_size = 2;  // micro 1 x DP 2
    const ValidationReport r = validate(c);
    EXPECT_TRUE(r.ok());
    EXPECT_TRUE(has(r.warnings, "W012"));
    EXPECT_FALSE(has(validate(ep_overlap_config()).warnings, "W012"));
    c.model.moe_ep_overlap_num_chunks = 2;  // expert chunks overlap within the micro-batch
    EXPECT_FALSE(has(validate(c).warnings, "W012"));
}

TEST(Validate, VerdictSurvivesAYamlRoundTripOfTheFinalizedConfig) {
    std::vector<Config> configs = {ep_overlap_config(), delay_wgrad_config()};
    for (auto name : recipe_names()) {
        Config c = make_recipe(name);
        HarnessOverrides h;
        h.moe_a2a_overlap = true;
        h.expert_model_parallel_size = 8;
        h.gpus_per_node = 8;
        apply_harness_overrides(c, h);
        c.env = {"h100", "2.5.0", "2.6.0"};
        configs.push_back(c);
    }
    Config gotcha = delay_wgrad_config();
    gotcha.comm_overlap->overlap_moe_expert_parallel_comm.reset();
    gotcha.model.overlap_moe_expert_parallel_comm = true;
    configs.push_back(gotcha);
    for (const Config& c : configs) {
        const ValidationReport first = validate(c);
        const Config reloaded = config_from_yaml(to_yaml(first.config), {"round-trip"});
        EXPECT_EQ(reloaded, first.config);
        const ValidationReport second = validate(reloaded);
        EXPECT_EQ(ids(second.errors), ids(first.errors)) << c.recipe.value_or("(none)");
        EXPECT_EQ(second.config, first.config);
    }
}

TEST(Validate, BuildWarningsComeFirst) {
    ConfigSources s;
    s.model = "tiny-moe";
    s.overrides = {"env.gpu=v100"};
    s.harness.moe_flex_dispatcher_backend = std::optional<std::string>("deepep");
    const ValidationReport r = validate(build_config(s));
    ASSERT_FALSE(r.warnings.empty());
    EXPECT_EQ(r.warnings[0].id, "W007");
}

TEST(ValidateReport, JsonHasTheDocumentedShape) {
    Config c = delay_wgrad_config();
    c.model.expert_model_parallel_size = 1;
    c.comm_overlap->tp_comm_overlap.reset();
    const auto json = report_to_json(validate(c));
    EXPECT_EQ(json["ok"], false);
    EXPECT_EQ(json["target"], "epo runtime");
    ASSERT_TRUE(json["errors"].is_array());
    const auto& e = json["errors"][0];
    for (const char* key : {"id", "field", "value", "message", "fix"}) {
        EXPECT_TRUE(e.contains(key)) << key;
        EXPECT_TRUE(e[key].is_string()) << key;
    }
    EXPECT_EQ(e["id"], "EP001");
    EXPECT_EQ(e["value"], "1");
    ASSERT_TRUE(json["warnings"].is_array());
    EXPECT_EQ(json["warnings"][0]["id"], "W004");
    EXPECT_TRUE(json["warnings"][0]["message"].is_string());
    EXPECT_EQ(json["config"]["comm_overlap"]["tp_comm_overlap"], false);  // finalized
    EXPECT_EQ(json["config"]["model"]["delay_wgrad_compute"], true);
    EXPECT_TRUE(json["notes"].is_array());
}

TEST(ValidateReport, TextShowsTheRunLogThenFindingsThenAVerdict) {
    Config c = ep_overlap_config();
    const ValidationReport ok = validate(c);
    const std::string log = format_run_log(ok);
    EXPECT_EQ(log.rfind("# epo: configuration finalized, no error (target: epo runtime)\n", 0), 0u);
    EXPECT_NE(log.find("  overlap_moe_expert_parallel_comm: true\n"), std::string::npos);
    EXPECT_NE(format_findings(ok).find("VALID: 0 errors, 0 warnings (target: epo runtime)"),
              std::string::npos);
    c.model.mtp_num_layers = 2;
    const ValidationReport bad = validate(c);
    EXPECT_NE(format_run_log(bad).find("finalized with 1 error"), std::string::npos);
    const std::string text = format_findings(bad);
    EXPECT_NE(text.find("EP012  model.mtp_num_layers = 2"), std::string::npos) << text;
    EXPECT_NE(text.find("fix: use at most one MTP layer"), std::string::npos);
    EXPECT_NE(text.find("INVALID: 1 error, 1 warning"), std::string::npos) << text;  // + RT006
}

TEST(Examples, ShippedConfigsValidate) {
    const std::string dir = std::string(EPO_SOURCE_DIR) + "/examples/";
    const Config qwen =
        config_from_yaml(read_text_file(dir + "qwen3-30b-a3b-ep-overlap.yaml"), {"qwen"});
    const ValidationReport gpu = validate(qwen);
    EXPECT_TRUE(gpu.ok()) << ::testing::PrintToString(ids(gpu.errors));
    EXPECT_EQ(gpu.target, "torch 2.7.1 / TE 2.8.0 on NVIDIA H100 80GB HBM3");
    EXPECT_TRUE(gpu.config.model.overlap_moe_expert_parallel_comm);
    EXPECT_TRUE(gpu.config.model.delay_wgrad_compute);
    for (const auto& w : gpu.warnings) {
        EXPECT_EQ(w.id.substr(0, 2), "RT") << w.id << ": " << w.message;
    }
    const Config tiny = config_from_yaml(read_text_file(dir + "tiny-moe-cpu.yaml"), {"tiny"});
    const ValidationReport cpu = validate_for_run(tiny);
    EXPECT_TRUE(cpu.ok()) << ::testing::PrintToString(ids(cpu.errors));
    EXPECT_TRUE(cpu.warnings.empty()) << ::testing::PrintToString(ids(cpu.warnings));
    EXPECT_TRUE(cpu.config.model.overlap_moe_expert_parallel_comm);
    EXPECT_GE(num_microbatches(cpu.config), 2);
}

}  // namespace
}  // namespace epo::config
