// Multi-token prediction in the plan's pipeline stages: the word embedding's copy on the last
// stage (Megatron-Core's MTP looks up the shifted tokens there) and the embedding group's sum of
// the two copies' gradients.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "epo/config/builder.h"
#include "epo/config/validate.h"
#include "epo/plan/cost_model.h"
#include "epo/plan/gpu_memory.h"
#include "epo/plan/hardware.h"
#include "epo/train/step_plan.h"

namespace epo::plan {
namespace {

// qwen3-30b-a3b with one MTP depth over PP 2 (2 nodes x 8, EP 8): the MTP layer on stage 1.
config::Config mtp_pipeline() {
    config::ConfigSources sources;
    sources.model = "qwen3-30b-a3b";
    sources.harness.num_nodes = 2;
    sources.harness.gpus_per_node = 8;
    sources.harness.pipeline_model_parallel_size = 2;
    sources.harness.expert_model_parallel_size = 8;
    sources.overrides = {"model.mtp_num_layers=1", "env.gpu=h100"};
    const config::ValidationReport report = config::validate(config::build_config(sources));
    EXPECT_TRUE(report.ok());
    return report.config;
}

OptimizerWork stage_optimizer(const config::Config& cfg, int stage) {
    const model::GptShape shape = model::gpt_shape_from_config(cfg, 8, 0, stage);
    const train::StepPlan sp = train::make_step_plan(cfg, shape);
    const PlanModel m =
        make_plan_model(cfg, sp, resolve_hardware("h100", {}).device, false, {}, stage);
    return optimizer_work(m, sp);
}

// _allreduce_word_embedding_grads: after the data-parallel reduction, stage 0 and the last stage
// all-reduce the whole fp32 gradient of their copies, 2 ranks: V x H x 4 = 151936 x 2048 x 4
// bytes each, on the inter-node link (the stages are 8 ranks, a node, apart). Without PP there is
// one copy and nothing to sum.
TEST(PlanMtp, EmbeddingCopiesSumTheirGradientsOverTheEmbeddingGroup) {
    const config::Config cfg = mtp_pipeline();
    const double bytes = 151936.0 * 2048 * 4;
    for (int stage = 0; stage < 2; ++stage) {
        const OptimizerWork o = stage_optimizer(cfg, stage);
        EXPECT_EQ(o.embedding_bytes, bytes) << "stage " << stage;
        EXPECT_GE(o.collectives.bytes.inter_sent, static_cast<int64_t>(bytes));
    }
    config::Config one_stage = cfg;
    one_stage.model.pipeline_model_parallel_size = 1;
    EXPECT_EQ(stage_optimizer(one_stage, 0).embedding_bytes, 0);
}

// The memory model counts the copy too: with untied weights the last stage holds the output layer
// and the embedding copy, with tied ones a single copy serves both; the first stage holds one
// embedding either way. Untied - tied = V x H x 2 bytes of bf16 weights on the last stage only.
TEST(PlanMtp, LastStageWeightsHoldTheEmbeddingCopy) {
    const config::Config untied = mtp_pipeline();
    config::Config tied = untied;
    tied.model.share_embeddings_and_output_weights = true;
    const GpuMemory a = estimate_gpu_memory(untied), b = estimate_gpu_memory(tied);
    EXPECT_EQ(a.stages[1].weights - b.stages[1].weights, 151936.0 * 2048 * 2);
    EXPECT_EQ(a.stages[0].weights, b.stages[0].weights);
}

}  // namespace
}  // namespace epo::plan
