// The GPU memory model (src/epo/plan/gpu_memory.h) against Megatron's theoretical_memory_usage
// (megatron/training/theoretical_memory_usage.py) for three configurations, and its parts
// against hand counts: the distributed optimizer's sharding, the interleaved warm-up's units in
// flight, what EP overlap adds, and what recompute drops.
//
// The reference figures below were worked out from the reference's formulas (its
// compute_weight_and_optimizer_memory plus compute_activation_memory with SP and selective
// recompute, compute_activation_memory_without_sp otherwise), not from running Megatron:
//
//   A  GPT-3 175B: L 96, h 12288, 96 heads of 128, F 4h (gelu), V 51200 tied, s 2048, b 1,
//      TP 8, PP 8, SP, selective (core_attn), distributed optimizer, DP 16 (1024 ranks), M 96.
//      layer params 4h^2 + 2hF + 4h = 1.81203e9; block 96 x that + 2h; most loaded shard
//      (block / 8 + V h) / 8 = 2.79673e9 params x (6 + 12 / 16) bytes      = 1.887723e10
//      activations (s b h (18 + 4F/h) 96 + 8 s b 8 + s b h 8) / 8           = 1.029284e10
//      total 2.917007e10 bytes
//   B  7B-class GPT: L 32, h 4096, 32 heads, F 16384 (gelu), V 50304 untied, s 2048, b 1,
//      TP 1, PP 1, no SP, no recompute, plain optimizer (18 bytes a parameter), DP 8.
//      weights and optimizer 6.85507e9 params x 18                          = 1.233913e11
//      activations (s b h (10 + 24) 32 + 8 s b + s b h + 2 (s b V + s b h)) x 1.05
//                                                                         = 9.825935e9
//      total 1.332173e11
//   C  MoE, 8 experts top-1 (F_moe 16384, gelu), L 24, h 4096, 32 heads, V 32000 tied, s 4096,
//      b 1, TP 2 (ETP 2), PP 4, VPP 2, SP, selective, EP 1, distributed optimizer, DP 4
//      (32 ranks), M 16.
//      MoE layer 2h (8 F_moe + 2) + 4h^2; (block / 4 + V h) / 2 params x (6 + 12 / 4)
//                                                                         = 3.139324e10
//      activations (s b h 34 x 24 + 8 s b 4 + s b h 4) x (1 + 3 / 8) / 2   = 9.458246e9
//      total 4.085149e10
// Where the model counts differently: no dropout masks (2 s b h a layer: the configuration has
// no dropout and the reference recipes train without), the router's weights and fp32 logits,
// an MoE layer's expert outputs held for the combine, norms not split over TP, and with PP the
// last stage's copy of a tied output layer.
#include "epo/plan/gpu_memory.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace epo::plan {
namespace {

config::Config gpt(int L, int h, int heads, int F, int V, int s, int tp, int pp, int nodes) {
    config::Config c;
    config::ModelConfig& m = c.model;
    m.num_layers = L;
    m.hidden_size = h;
    m.num_attention_heads = heads;
    m.ffn_hidden_size = F;
    m.vocab_size = V;
    m.seq_length = s;
    m.tensor_model_parallel_size = tp;
    m.pipeline_model_parallel_size = pp;
    m.bf16 = true;
    m.normalization = config::Normalization::kLayerNorm;
    m.activation_func = config::ActivationFunc::kGelu;
    m.gated_linear_unit = false;
    c.train.micro_batch_size = 1;
    c.comm.num_nodes = nodes;
    c.comm.gpus_per_node = 8;
    return c;
}

config::Config config_a() {
    config::Config c = gpt(96, 12288, 96, 4 * 12288, 51200, 2048, 8, 8, 128);
    c.model.sequence_parallel = true;
    c.model.recompute_granularity = config::RecomputeGranularity::kSelective;
    c.ddp.use_distributed_optimizer = true;
    c.train.global_batch_size = 1536;  // DP 16: 96 micro-batches
    return c;
}

config::Config config_b() {
    config::Config c = gpt(32, 4096, 32, 16384, 50304, 2048, 1, 1, 1);
    c.model.share_embeddings_and_output_weights = false;
    c.train.global_batch_size = 8;
    return c;
}

config::Config config_c() {
    config::Config c = gpt(24, 4096, 32, 16384, 32000, 4096, 2, 4, 4);
    c.model.virtual_pipeline_model_parallel_size = 2;
    c.model.num_moe_experts = 8;
    c.model.moe_router_topk = 1;
    c.model.moe_ffn_hidden_size = 16384;
    c.model.sequence_parallel = true;
    c.model.recompute_granularity = config::RecomputeGranularity::kSelective;
    c.ddp.use_distributed_optimizer = true;
    c.train.global_batch_size = 64;  // DP 4: 16 micro-batches
    return c;
}

// Prints every comparison (docs/plan.md "Memory" quotes them) and checks its tolerance.
void expect_within(double got, double want, double tolerance, const char* what) {
    std::printf("[ memory ] %-16s model %.4g GiB, reference %.4g GiB (%+.1f%%)\n", what,
                got / (1 << 30), want / (1 << 30), 100 * (got / want - 1));
    EXPECT_LT(std::abs(got / want - 1), tolerance)
        << what << ": " << got << " against " << want << " (" << 100 * (got / want - 1) << "%)";
}

TEST(GpuMemory, MatchesMegatronsTheoreticalMemoryWithinTenPercent) {
    const GpuMemory a = estimate_gpu_memory(config_a());
    EXPECT_EQ(a.busiest_stage, 0);  // 8 micro-batches in flight and the embedding
    expect_within(a.peak(), 2.917007e10, 0.10, "A total");
    const StageMemory& sa = a.stages[0];
    expect_within(sa.weights + sa.main_grads + sa.optimizer, 1.887723e10, 0.02, "A weights");
    expect_within(sa.activations, 1.029284e10, 0.10, "A activations");

    const GpuMemory b = estimate_gpu_memory(config_b());
    expect_within(b.peak(), 1.332173e11, 0.10, "B total");
    const StageMemory& sb = b.stages[0];
    expect_within(sb.weights + sb.main_grads + sb.optimizer, 1.233913e11, 0.02, "B weights");
    // Without SP the reference adds 5% for temporaries on top of the masks: 13% together.
    expect_within(sb.activations, 9.825935e9, 0.15, "B activations");

    const GpuMemory c = estimate_gpu_memory(config_c());
    EXPECT_EQ(c.busiest_stage, 0);
    expect_within(c.peak(), 4.085149e10, 0.10, "C total");
    const StageMemory& sc = c.stages[0];
    expect_within(sc.weights + sc.main_grads + sc.optimizer, 3.139324e10, 0.02, "C weights");
    // The experts' inputs are gathered over ETP, whole on each of its ranks, where the
    // reference's formula divides every activation by TP: 12% more here.
    expect_within(sc.activations, 9.458246e9, 0.15, "C activations");
}

TEST(GpuMemory, InterleavedWarmupHoldsTheReferencesPenalty) {
    // P 4, V 2, M 16: stage s holds 2 (P - s - 1) + (V - 1) P + 1 units: 11, 9, 7, 5, each a
    // chunk of 3 layers; stage 0's 33 layers = 24 x (1 + (P - 1) / (P V)), the reference's
    // interleaving penalty.
    const GpuMemory m = estimate_gpu_memory(config_c());
    ASSERT_EQ(m.stages.size(), 4u);
    EXPECT_EQ(m.stages[0].units_in_flight, 11);
    EXPECT_EQ(m.stages[1].units_in_flight, 9);
    EXPECT_EQ(m.stages[3].units_in_flight, 5);
    EXPECT_EQ(m.stages[0].num_layers, 6);
}

TEST(GpuMemory, LayerActivationsAreTheHandCount) {
    // A's layer: n = s b / t = 256 tokens a rank (SP), h 12288: norms' inputs 4 n h, their
    // outputs 4 n h, q k v and context 2 s b (4 A d) / t = 8 n h, the MLP 2 s b (F + F) / t =
    // 16 n h: 32 n h = 100663296 bytes.
    const config::Config a = config_a();
    EXPECT_DOUBLE_EQ(layer_activation_bytes(a, false), 32.0 * 256 * 12288);
    // Selective layernorm recompute drops the norms' outputs (4 n h).
    config::Config ln = a;
    ln.model.recompute_modules = {config::RecomputeModule::kLayernorm};
    EXPECT_DOUBLE_EQ(layer_activation_bytes(ln, false), 28.0 * 256 * 12288);
    // C's MoE layer: n = 2048 tokens a rank, k 1, ETP 2: R = n k ETP = 4096 rows of F / ETP =
    // 8192 at the rank's experts; norms 8 n h, attention 8 n h, router 8 n E, experts: input
    // 2 R h, f1 output 2 R F', activation output 2 R F', output after the reduce-scatter 2 n k h.
    const config::Config c = config_c();
    const double n = 2048, h = 4096, R = 4096, Fp = 8192;
    EXPECT_DOUBLE_EQ(layer_activation_bytes(c, true),
                     16 * n * h + 8 * n * 8 + 2 * R * h + 4 * R * Fp + 2 * n * h);
    // moe_act drops the activation's output (2 R F').
    config::Config act = c;
    act.model.recompute_modules = {config::RecomputeModule::kMoeAct};
    EXPECT_DOUBLE_EQ(layer_activation_bytes(act, true),
                     16 * n * h + 8 * n * 8 + 2 * R * h + 2 * R * Fp + 2 * n * h);
}

TEST(GpuMemory, DistributedOptimizerShardsMasterAndMomentsOverDataParallel) {
    // B with the distributed optimizer: 12 bytes a parameter over DP 8 instead of 12.
    config::Config b = config_b();
    const StageMemory plain = estimate_gpu_memory(b).stages[0];
    b.ddp.use_distributed_optimizer = true;
    const StageMemory dist = estimate_gpu_memory(b).stages[0];
    EXPECT_DOUBLE_EQ(dist.weights, plain.weights);
    EXPECT_DOUBLE_EQ(dist.main_grads, plain.main_grads);
    EXPECT_NEAR(dist.optimizer, plain.optimizer / 8, plain.optimizer * 1e-12);
    EXPECT_DOUBLE_EQ(plain.optimizer, 6 * plain.weights);  // 12 bytes against 2
}

TEST(GpuMemory, MainGradientsInTheComputeDtypeWithoutFp32Reduction) {
    // ddp.grad_reduce_in_fp32 false (Megatron-Bridge's performance recipes): main gradients in
    // bf16, 2 bytes a parameter like the weights instead of 4; nothing else moves.
    config::Config b = config_b();
    const StageMemory fp32 = estimate_gpu_memory(b).stages[0];
    EXPECT_DOUBLE_EQ(fp32.main_grads, 2 * fp32.weights);
    b.ddp.grad_reduce_in_fp32 = false;
    const StageMemory bf16 = estimate_gpu_memory(b).stages[0];
    EXPECT_DOUBLE_EQ(bf16.main_grads, bf16.weights);
    EXPECT_DOUBLE_EQ(bf16.weights, fp32.weights);
    EXPECT_DOUBLE_EQ(bf16.optimizer, fp32.optimizer);
    EXPECT_DOUBLE_EQ(bf16.activations, fp32.activations);
}

TEST(GpuMemory, OverlapHoldsOneLayerMoreAndDelayedWgradAnother) {
    // The combined step frees a layer of one micro-batch as the other takes one: one layer
    // above the baseline; delayed wgrad one layer's output gradients more; paired edges the first
    // two forwards whole.
    config::Config b = config_b();
    const StageMemory base = estimate_gpu_memory(b).stages[0];
    EXPECT_EQ(base.units_in_flight, 1);
    const double layer = layer_activation_bytes(b, false);
    b.model.overlap_moe_expert_parallel_comm = true;
    const StageMemory ov = estimate_gpu_memory(b).stages[0];
    EXPECT_DOUBLE_EQ(ov.overlap_extra, layer);
    EXPECT_DOUBLE_EQ(ov.activations - base.activations, layer);
    b.model.delay_wgrad_compute = true;
    const StageMemory dw = estimate_gpu_memory(b).stages[0];
    EXPECT_DOUBLE_EQ(dw.activations - ov.activations, layer);
    b.model.delay_wgrad_compute = false;
    b.train.global_batch_size = 16;  // 2 micro-batches: something to pair
    const StageMemory unpaired = estimate_gpu_memory(b).stages[0];
    b.model.moe_ep_overlap_pair_edges = true;
    const StageMemory paired = estimate_gpu_memory(b).stages[0];
    EXPECT_EQ(paired.units_in_flight, 2);
    // Both micro-batches' layers, and the second one's token ids (8 s b).
    EXPECT_DOUBLE_EQ(paired.activations - unpaired.activations, 32 * layer + 8 * 2048);
}

TEST(GpuMemory, FullRecomputeHoldsOnlyEachGroupsInput) {
    // B with full uniform recompute of 1 layer: each layer holds its input 2 s b h, plus one
    // layer's activations rebuilt during its backward.
    config::Config b = config_b();
    b.model.recompute_granularity = config::RecomputeGranularity::kFull;
    b.model.recompute_method = config::RecomputeMethod::kUniform;
    b.model.recompute_num_layers = 1;
    const StageMemory m = estimate_gpu_memory(b).stages[0];
    const double sbh = 2048.0 * 4096;
    const double output = 4 * sbh + 4 * 2048.0 * 50304;
    const double ids = 8 * 2048.0;
    EXPECT_DOUBLE_EQ(m.activations, 32 * 2 * sbh + layer_activation_bytes(b, false) + output + ids);
}

// fp8 keeps a cast of every product weight for the whole step, row-wise and column-wise (the
// transposed copy the input gradient reads), next to the bf16 weights: 2 bytes an element, and
// 2 (1 + 1/32) with MXFP8's per-32 scales. Hand counts:
//   B (dense, L 32, h 4096, F 16384, gelu, TP 1): a layer's products 4h^2 + 2hF = 201326592
//     elements (QKV 3h^2, projection h^2, the two MLP products); 32 layers = 6442450944; the
//     embedding, output layer and norms stay bf16.
//   C (MoE, TP 2 = ETP 2, EP 1, PP 4, VPP 2: 6 layers a stage): attention 4h^2 / 2 = 33554432,
//     8 experts of 2 h F_moe / 2 = 536870912 (the router stays bf16): 570425344 a layer,
//     3422552064 a stage.
TEST(GpuMemory, Fp8KeepsARowwiseAndAColumnwiseCopyOfEachProductWeight) {
    config::Config b = config_b();
    const StageMemory bf16 = estimate_gpu_memory(b).stages[0];
    EXPECT_EQ(bf16.fp8_weights, 0);
    b.model.fp8 = "hybrid";
    b.model.fp8_recipe = "tensorwise";
    const StageMemory fp8 = estimate_gpu_memory(b).stages[0];
    EXPECT_DOUBLE_EQ(fp8.fp8_weights, 2.0 * 6442450944.0);
    EXPECT_DOUBLE_EQ(fp8.weights, bf16.weights);  // the bf16 weights stay
    EXPECT_DOUBLE_EQ(fp8.total() - bf16.total(), 2.0 * 6442450944.0);
    for (const char* recipe : {"delayed", "blockwise"}) {
        b.model.fp8_recipe = recipe;
        EXPECT_DOUBLE_EQ(estimate_gpu_memory(b).stages[0].fp8_weights, 2.0 * 6442450944.0)
            << recipe;
    }
    b.model.fp8_recipe = "mxfp8";
    EXPECT_DOUBLE_EQ(estimate_gpu_memory(b).stages[0].fp8_weights, 2.0625 * 6442450944.0);

    config::Config c = config_c();
    c.model.fp8 = "e4m3";
    c.model.fp8_recipe = "delayed";
    const GpuMemory moe = estimate_gpu_memory(c);
    ASSERT_EQ(moe.stages.size(), 4u);
    for (const StageMemory& st : moe.stages) {
        EXPECT_EQ(st.num_layers, 6);
        EXPECT_DOUBLE_EQ(st.fp8_weights, 2.0 * 3422552064.0) << "stage " << st.stage;
    }
}

}  // namespace
}  // namespace epo::plan
