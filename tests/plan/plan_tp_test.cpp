// The plan's TP bytes against hand counts (issue #42), for Megatron-Core on a GPU and for the epo
// runtime on cpu (which tests/plan/plan_tp_bytes_mpi_test.cpp compares with a run's counted
// bytes). qwen3-30b-a3b at TP 2 with SP: H 2048, T = 4096 tokens a micro-batch, 48 MoE layers of
// 128 experts, 32 heads of 128 with q/k RMSNorms.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "epo/config/builder.h"
#include "epo/config/validate.h"
#include "epo/plan/cost_model.h"
#include "epo/plan/hardware.h"
#include "epo/train/step_plan.h"

namespace epo::plan {
namespace {

using schedule::NodeKind;
using schedule::Phase;

config::Config tp_qwen3(std::vector<std::string> extra = {}) {
    config::ConfigSources sources;
    sources.model = "qwen3-30b-a3b";
    sources.harness.num_nodes = 2;
    sources.harness.gpus_per_node = 8;
    sources.harness.expert_model_parallel_size = 8;
    sources.overrides = {"model.tensor_model_parallel_size=2", "model.sequence_parallel=true"};
    sources.overrides.insert(sources.overrides.end(), extra.begin(), extra.end());
    const config::ValidationReport report = config::validate(config::build_config(sources));
    EXPECT_TRUE(report.ok());
    return report.config;
}

PlanModel tp_plan_model(const config::Config& cfg, const std::string& gpu) {
    const model::GptShape shape = model::gpt_shape_from_config(cfg, 8, 0);
    const train::StepPlan sp = train::make_step_plan(cfg, shape);
    return make_plan_model(cfg, sp, resolve_hardware(gpu, {}).device, false);
}

NodeWork tp_call(const PlanModel& m, NodeKind node, Phase phase, int layer = 0) {
    return node_work(m, {0, layer, node, phase});
}

// Megatron-Core moves every TP collective of the layers in bf16: a gather or a reduce-scatter is
// (TP-1)/TP x T x H x 2 = 0.5 x 4096 x 2048 x 2 = 8388608 bytes a rank.
constexpr double kBf16Collective = 8388608;

TEST(PlanTp, MegatronMovesBf16AndAllReducesTheLossStatisticsOverTp) {
    const PlanModel m = tp_plan_model(tp_qwen3(), "h100");
    EXPECT_FALSE(m.epo_runtime_tp);
    EXPECT_EQ(m.tp_reduce_bytes, 2);
    EXPECT_EQ(tp_call(m, NodeKind::kPreDispatch, Phase::kForward).tp_bytes, 2 * kBf16Collective);
    EXPECT_EQ(tp_call(m, NodeKind::kPreDispatch, Phase::kBackward).tp_bytes, 2 * kBf16Collective);
    // The output layer: the gather of the final norm's rows, and vocab_parallel_cross_entropy's
    // three fp32 all-reduces of a figure per token (the maxima, the label's logits, the sums of
    // exponentials), 3 x 2 (TP-1)/TP x 4 x 4096 = 49152 bytes; the backward's reduce-scatter.
    const NodeWork out = tp_call(m, NodeKind::kOutput, Phase::kForward, -1);
    EXPECT_EQ(out.tp_bytes, kBf16Collective + 49152);
    EXPECT_EQ(out.num_serial_collectives, 1 + 3);
    EXPECT_EQ(tp_call(m, NodeKind::kOutput, Phase::kBackward, -1).tp_bytes, kBf16Collective);
    // The embedding's reduce-scatter forward, the gather of its gradient backward.
    EXPECT_EQ(tp_call(m, NodeKind::kEmbedding, Phase::kForward, -1).tp_bytes, kBf16Collective);
    EXPECT_EQ(tp_call(m, NodeKind::kEmbedding, Phase::kBackward, -1).tp_bytes, kBf16Collective);
    // The experts move nothing over TP (ETP 1: the router and the dispatcher see T / TP tokens).
    EXPECT_EQ(tp_call(m, NodeKind::kMlp, Phase::kForward).tp_bytes, 0);
}

// finalize_model_grads sums over TP the gradients of what SP replicates: per layer the input and
// pre-MLP RMSNorms (2 x 2048), the q/k layernorms (2 x 128, summed with or without SP) and the
// router (128 x 2048): 266496 elements, x 48 layers, + the final norm 2048 = 12793856 elements;
// one fp32 all-reduce, 2 (TP-1)/TP x 4 bytes an element = 51175424 bytes a rank.
TEST(PlanTp, GradientSumsOverTpAreTheReplicatedParameters) {
    const config::Config cfg = tp_qwen3();
    const PlanModel m = tp_plan_model(cfg, "h100");
    EXPECT_EQ(m.tp_summed_elements, 12793856);
    const model::GptShape shape = model::gpt_shape_from_config(cfg, 8, 0);
    const OptimizerWork o = optimizer_work(m, train::make_step_plan(cfg, shape));
    EXPECT_EQ(o.tp_bytes, 51175424);
    // Without SP only the q/k layernorms: 48 x 256 elements.
    const config::Config no_sp = tp_qwen3({"model.sequence_parallel=false"});
    EXPECT_EQ(tp_plan_model(no_sp, "h100").tp_summed_elements, 48 * 256);
    // TP 1: nothing.
    EXPECT_EQ(tp_plan_model(
                  tp_qwen3({"model.tensor_model_parallel_size=1", "model.sequence_parallel=false"}),
                  "h100")
                  .tp_summed_elements,
              0);
}

// The epo runtime (env.gpu=cpu) gathers the forward's activations in bf16 and moves its
// reductions and every gradient in fp32 (model/tensor_parallel.h): attention forward 8388608 +
// 16777216, backward 2 x 16777216. Its cross-entropy all-gathers the maxima ((TP-1) x 4 x T) and
// all-reduces the two other figures: at TP 2 the same 49152 bytes as Megatron-Core's.
TEST(PlanTp, TheEpoRuntimesTpMovesItsFp32SumsAndGradients) {
    const PlanModel m = tp_plan_model(tp_qwen3(), "cpu");
    EXPECT_TRUE(m.epo_runtime_tp);
    EXPECT_EQ(m.tp_reduce_bytes, 4);
    EXPECT_EQ(tp_call(m, NodeKind::kPreDispatch, Phase::kForward).tp_bytes,
              kBf16Collective + 2 * kBf16Collective);
    EXPECT_EQ(tp_call(m, NodeKind::kPreDispatch, Phase::kBackward).tp_bytes,
              2 * 2 * kBf16Collective);
    EXPECT_EQ(tp_call(m, NodeKind::kOutput, Phase::kForward, -1).tp_bytes, kBf16Collective + 49152);
    EXPECT_EQ(tp_call(m, NodeKind::kOutput, Phase::kBackward, -1).tp_bytes, 2 * kBf16Collective);
    EXPECT_EQ(tp_call(m, NodeKind::kEmbedding, Phase::kForward, -1).tp_bytes, 2 * kBf16Collective);
    // Its norms have no bias either: the same replicated elements as above (RMSNorm).
    EXPECT_EQ(m.tp_summed_elements, 12793856);
}

// A shared expert (Fs 1024): Megatron-Core splits it over TP (a gather and a reduce-scatter, half
// its width a rank); the epo runtime runs it whole on the rank's T / TP rows, no collective, and
// sums its gradients over TP (3 x 1024 x 2048 more elements a layer).
TEST(PlanTp, SharedExpertSplitInMegatronWholeInTheEpoRuntime) {
    const config::Config cfg = tp_qwen3({"model.moe_shared_expert_intermediate_size=1024"});
    const PlanModel gpu = tp_plan_model(cfg, "h100"), cpu = tp_plan_model(cfg, "cpu");
    const NodeWork g = tp_call(gpu, NodeKind::kPreDispatch, Phase::kForward);
    EXPECT_EQ(g.tp_bytes, 4 * kBf16Collective);  // attention's pair and the shared expert's
    // fc2 (rows, H, Fs / TP): the last weight product (core attention's follow).
    const auto fc2 = [](const NodeWork& w) {
        for (const Gemm& x : w.gemms) {
            if (x.n == 2048 && (x.k == 512 || x.k == 1024))
                return x;
        }
        return Gemm{};
    };
    EXPECT_EQ(fc2(g).m, 4096);
    EXPECT_EQ(fc2(g).k, 512);
    const NodeWork c = tp_call(cpu, NodeKind::kPreDispatch, Phase::kForward);
    EXPECT_EQ(c.tp_bytes, 3 * kBf16Collective);  // attention's only
    EXPECT_EQ(fc2(c).m, 2048);
    EXPECT_EQ(fc2(c).k, 1024);
    EXPECT_EQ(cpu.tp_summed_elements - gpu.tp_summed_elements, 48.0 * 3 * 1024 * 2048);
}

}  // namespace
}  // namespace epo::plan
