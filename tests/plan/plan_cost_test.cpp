// The planner's cost model (src/epo/plan/cost_model.h): the cost of a node call against its
// formula worked out by hand: products, dispatch bytes, expert load, chunks, flex, the layouts
// Megatron-Core runs (TP, CP, ETP, MLA, recompute, fp8, CUDA graphs, MTP).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "epo/config/builder.h"
#include "epo/config/recipes.h"
#include "epo/config/validate.h"
#include "epo/core/error.h"
#include "epo/plan/cost_model.h"
#include "epo/plan/plan.h"
#include "epo/schedule/critical_path.h"
#include "epo/train/step_plan.h"
#include "plan/plan_test_util.h"

namespace epo::plan {
namespace {

using namespace test_util;
using schedule::NodeCall;

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

// TP 2 with SP (qwen3-30b-a3b: H 2048, 32 heads and 4 groups of 128, T = 4096 tokens): the
// attention's products are half as wide, (T, (32 + 8) 128 / 2 = 2560, 2048) and (T, 2048,
// 32 128 / 2 = 2048); a gather before and a reduce-scatter after, each (TP-1)/TP T H c =
// 0.5 x 4096 x 2048 x 2 = 8388608 bytes inside the node.
// ddp.grad_reduce_in_fp32 false: every gradient reduction moves the main gradients in bf16, half
// the bytes of fp32 (the buckets' reduce-scatters, the optimizer step's reduction, the
// embedding copies' sum); the parameter gathers move the bf16 weights either way.
TEST(PlanCost, GradientReductionsMoveTheMainGradientsDtype) {
    const std::vector<std::string> common = {"ddp.use_distributed_optimizer=true",
                                             "ddp.overlap_grad_reduce=true",
                                             "ddp.overlap_param_gather=true"};
    std::vector<std::string> low = common;
    low.push_back("ddp.grad_reduce_in_fp32=false");
    const PlanModel fp32 = plan_model_of(finalized(common, 8));
    const PlanModel bf16 = plan_model_of(finalized(low, 8));
    EXPECT_EQ(fp32.grad_bytes, 4);
    EXPECT_EQ(bf16.grad_bytes, 2);
    ASSERT_FALSE(fp32.bucket_dense_bytes.empty());
    for (int b = 0; b < static_cast<int>(fp32.bucket_dense_bytes.size()); ++b) {
        SCOPED_TRACE(b);
        const NodeCall reduce{0, b, schedule::NodeKind::kGradReduce, schedule::Phase::kBackward};
        const NodeCall gather{0, b, schedule::NodeKind::kParamGather, schedule::Phase::kForward};
        EXPECT_EQ(2 * bf16.bucket_dense_bytes[static_cast<size_t>(b)],
                  fp32.bucket_dense_bytes[static_cast<size_t>(b)]);
        EXPECT_EQ(2 * node_work(bf16, reduce).bytes.inter_sent,
                  node_work(fp32, reduce).bytes.inter_sent);
        EXPECT_EQ(node_work(bf16, gather).bytes.inter_sent,
                  node_work(fp32, gather).bytes.inter_sent);
        EXPECT_GT(node_work(fp32, gather).bytes.inter_sent, 0);
    }
    // EP 8 on 16 ranks: the experts' reduction over EDP 2 halves the same way.
    const auto expert_sum = [](const PlanModel& m) {
        int64_t sum = 0;
        for (int64_t v : m.bucket_expert_bytes)
            sum += v;
        return sum;
    };
    EXPECT_GT(expert_sum(fp32), 0);
    EXPECT_EQ(2 * expert_sum(bf16), expert_sum(fp32));
}

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

// MTP (1 depth): its transformer layer is the model's last position (GptShape: layer 48 after
// qwen3-30b-a3b's 48), with its own calls in the step plan, like the decoder's last layer plus the
// projection (T, H, 2H) on its pre_dispatch; the output call adds only the MTP's output head. The
// layer is charged once: an earlier plan also charged it inside the output call (issue #37, row 4).
TEST(PlanCost, MultiTokenPredictionAddsItsLayerOnceAndItsHeadToTheOutput) {
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
