// Helpers the planner's tests share (plan_test.cpp, plan_cost_test.cpp): qwen3-30b-a3b finalized
// on a stated topology, the h100 device, the cost model's inputs for a configuration.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "epo/config/builder.h"
#include "epo/config/validate.h"
#include "epo/plan/cost_model.h"
#include "epo/plan/hardware.h"
#include "epo/train/step_plan.h"

namespace epo::plan::test_util {

inline config::Config finalized(std::vector<std::string> overrides, int ep = 16, int nodes = 2,
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

inline Hardware h100() {
    return resolve_hardware("h100", {});
}

inline PlanModel plan_model_of(const config::Config& cfg) {
    model::GptShape shape = model::gpt_shape_from_config(cfg, 16, 0);
    shape.pipeline_size = cfg.model.pipeline_model_parallel_size;
    shape.virtual_pipeline_size = config::virtual_pipeline_size(cfg.model);
    const train::StepPlan sp = train::make_step_plan(cfg, shape);
    return make_plan_model(cfg, sp, h100().device, false);
}

// A call's products in FLOPs: 2 m n k each, times its count.
inline double flops(const NodeWork& w) {
    double f = 0;
    for (const Gemm& g : w.gemms)
        f += 2 * g.m * g.n * g.k * g.count;
    return f;
}

inline config::Config with_overlap(config::Config cfg) {
    cfg.model.overlap_moe_expert_parallel_comm = true;
    return cfg;
}

}  // namespace epo::plan::test_util
