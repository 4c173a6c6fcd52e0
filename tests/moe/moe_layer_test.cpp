#include "epo/moe/moe_layer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "epo/kernels/gemm.h"
#include "epo/kernels/rows.h"
#include "moe/moe_test_util.h"

namespace epo::moe {
namespace {

using testing::check_gradient;
using testing::random_tensor;

MoeConfig small_config() {
    MoeConfig c;
    c.hidden_size = 8;
    c.num_experts = 4;
    c.topk = 2;
    c.ffn_hidden_size = 6;
    c.precision = Precision::kFp32;
    c.load_balancing_type = LoadBalancing::kAuxLoss;
    c.aux_loss_coeff = 0.5;
    c.z_loss_coeff = 0.05;
    return c;
}

struct Layer {
    MoeConfig cfg;
    MoeLayerParams params;
    Tensor x, dy;
    std::int64_t sequences = 1;

    Layer(const MoeConfig& c, std::int64_t tokens, std::uint64_t seed, float router_std = 1.0f)
        : cfg(c), params(make_moe_layer_params(c)) {
        init_moe_layer_params(params, seed, 0.4f);
        fill_normal(params.router.weight.master, seed + 100, 0.0f, router_std);
        refresh_compute(params.router.weight);
        const DType dt = compute_dtype(c);
        x = random_tensor({tokens, c.hidden_size}, dt, seed + 1);
        dy = random_tensor({tokens, c.hidden_size}, dt, seed + 2);
    }
    std::int64_t tokens() const { return x.dim(0); }
    Tensor new_activation() const {
        return Tensor::empty({tokens(), cfg.hidden_size}, compute_dtype(cfg));
    }
    // L = sum(y * dy) + aux + z
    double loss(MoeContext& ctx) {
        Tensor y = new_activation();
        MoeLosses l = moe_forward(cfg, params, x, sequences, ctx, y);
        return testing::dot(y, dy) + l.aux_loss + l.z_loss;
    }
    void zero_grads() {
        for (Param* p : moe_layer_param_list(params)) {
            zero_grad(*p);
        }
    }
};

// The routing decisions of a forward (a finite difference across a change of any is skipped).
struct Decisions {
    std::vector<std::int32_t> index, slot_row;
    std::vector<std::int64_t> aux_counts;
    explicit Decisions(const MoeContext& c)
        : index(c.router.topk_index.data<std::int32_t>(),
                c.router.topk_index.data<std::int32_t>() + c.router.topk_index.numel()),
          slot_row(c.plan.slot_row.data<std::int32_t>(),
                   c.plan.slot_row.data<std::int32_t>() + c.plan.slot_row.numel()),
          aux_counts(c.router.aux_counts) {}
    bool operator==(const Decisions& o) const {
        return index == o.index && slot_row == o.slot_row && aux_counts == o.aux_counts;
    }
};

// Finite differences for every weight and the input of the whole layer (fp32).
void check_layer_gradients(Layer& layer, double min_checked_fraction = 0.7) {
    MoeContext ctx;
    layer.zero_grads();
    layer.loss(ctx);
    const Decisions base(ctx);
    Tensor dx = layer.new_activation();
    moe_backward(layer.cfg, layer.params, layer.dy, 1.0f, ctx, dx);

    MoeContext probe;
    auto loss = [&] { return layer.loss(probe); };
    auto flipped = [&] { return !(Decisions(probe) == base); };
    for (Param* p : moe_layer_param_list(layer.params)) {
        const int n = check_gradient(
            p->name.c_str(), p->master, p->main_grad, loss, 1e-2, 1e-3, 2e-2,
            [p] { refresh_compute(*p); }, flipped);
        EXPECT_GE(n, min_checked_fraction * static_cast<double>(p->master.numel())) << p->name;
    }
    const int n = check_gradient(
        "x", layer.x, dx, loss, 1e-2, 1e-3, 2e-2, [] {}, flipped);
    EXPECT_GE(n, min_checked_fraction * static_cast<double>(layer.x.numel()));
}

TEST(MoeLayer, FiniteDifferenceGradientsSoftmaxWithSharedExpert) {
    MoeConfig c = small_config();
    c.shared_expert_size = 5;
    c.gradient_accumulation_fusion = true;
    Layer layer(c, 10, 1);
    check_layer_gradients(layer);
}

TEST(MoeLayer, FiniteDifferenceGradientsSigmoidGroupLimitedSeqAux) {
    MoeConfig c = small_config();
    c.num_experts = 8;
    c.topk = 3;
    c.num_groups = 4;
    c.group_topk = 2;
    c.score_function = ScoreFunction::kSigmoid;
    c.enable_expert_bias = true;
    c.topk_scaling_factor = 2.5;
    c.load_balancing_type = LoadBalancing::kSeqAuxLoss;
    c.shared_expert_size = 4;
    Layer layer(c, 12, 2);
    layer.sequences = 3;
    fill_normal(layer.params.router.expert_bias, 5, 0.0f, 0.2f);
    check_layer_gradients(layer);
}

TEST(MoeLayer, FiniteDifferenceGradientsWithCapacityDrops) {
    for (DropPolicy policy : {DropPolicy::kProbs, DropPolicy::kPosition}) {
        MoeConfig c = small_config();
        c.capacity_factor = 0.6;
        c.drop_policy = policy;
        Layer layer(c, 12, 3);
        MoeContext ctx;
        layer.loss(ctx);
        EXPECT_GT(ctx.plan.num_dropped, 0) << drop_policy_name(policy);
        check_layer_gradients(layer, 0.5);
    }
}

TEST(MoeLayer, FiniteDifferenceGradientsWithPaddingToCapacity) {
    MoeConfig c = small_config();
    c.capacity_factor = 1.5;
    c.pad_to_capacity = true;
    c.drop_policy = DropPolicy::kPosition;
    Layer layer(c, 8, 4);
    MoeContext ctx;
    layer.loss(ctx);
    for (std::int64_t n : ctx.plan.tokens_per_expert) {
        EXPECT_EQ(n, ctx.plan.capacity);
    }
    check_layer_gradients(layer, 0.5);
}

// Edge cases, each checked with finite differences.
TEST(MoeLayer, ExpertWithNoTokensAndAllTokensToOneExpert) {
    MoeConfig c = small_config();
    c.score_function = ScoreFunction::kSigmoid;
    c.enable_expert_bias = true;
    {
        Layer layer(c, 9, 5);
        layer.params.router.expert_bias.data<float>()[3] = -100.0f;  // never chosen
        MoeContext ctx;
        layer.loss(ctx);
        EXPECT_EQ(ctx.plan.tokens_per_expert[3], 0);
        check_layer_gradients(layer);
        const Param& fc1 = layer.params.experts.fc1;
        const std::int64_t per = fc1.master.numel() / 4;
        for (std::int64_t i = 3 * per; i < 4 * per; ++i) {
            ASSERT_EQ(fc1.main_grad.data<float>()[i], 0.0f);
        }
    }
    {
        c.topk = 1;
        Layer layer(c, 9, 6);
        layer.params.router.expert_bias.data<float>()[2] = 100.0f;  // always chosen
        MoeContext ctx;
        layer.loss(ctx);
        EXPECT_EQ(ctx.plan.tokens_per_expert[2], 9);
        check_layer_gradients(layer);
    }
}

TEST(MoeLayer, TopkEqualsExpertsAndSingleToken) {
    {
        MoeConfig c = small_config();
        c.topk = 4;
        Layer layer(c, 7, 7);
        check_layer_gradients(layer);
    }
    {
        MoeConfig c = small_config();
        c.shared_expert_size = 3;
        Layer layer(c, 1, 8);
        check_layer_gradients(layer);
    }
}

struct RunResult {
    Tensor y, dx;
    std::vector<Tensor> grads;
};

// Micro-batches 0 and 1 through the same weights; `interleaved` runs both forwards, then both
// dgrads, then both wgrads (as the overlap schedule does); otherwise forward + fused backward
// one after the other.
RunResult run_two_microbatches(const MoeConfig& cfg, bool interleaved) {
    Layer l0(cfg, 40, 11), l1(cfg, 40, 12);
    MoeLayerParams& p = l0.params;
    // Gradients accumulate on top of a previous step's values.
    std::uint64_t s = 50;
    for (Param* q : moe_layer_param_list(p)) {
        fill_normal(q->main_grad, s++, 0.0f, 1.0f);
    }
    MoeContext c0, c1;
    RunResult r{l0.new_activation(), l0.new_activation(), {}};
    Tensor y1 = l0.new_activation(), dx1 = l0.new_activation();
    if (interleaved) {
        moe_forward(cfg, p, l0.x, 1, c0, r.y);
        moe_forward(cfg, p, l1.x, 1, c1, y1);
        moe_backward_dgrad(cfg, p, l0.dy, 0.5f, c0, r.dx);
        moe_backward_dgrad(cfg, p, l1.dy, 0.5f, c1, dx1);
        moe_backward_wgrad(cfg, p, c0);
        moe_backward_wgrad(cfg, p, c1);
    } else {
        moe_forward(cfg, p, l0.x, 1, c0, r.y);
        moe_backward(cfg, p, l0.dy, 0.5f, c0, r.dx);
        moe_forward(cfg, p, l1.x, 1, c1, y1);
        moe_backward(cfg, p, l1.dy, 0.5f, c1, dx1);
    }
    for (Param* q : moe_layer_param_list(p)) {
        r.grads.push_back(q->main_grad.clone());
    }
    return r;
}

TEST(MoeLayer, DgradThenWgradEqualsFusedBackwardBitForBit) {
    for (bool fusion : {true, false}) {
        for (Precision prec : {Precision::kFp32, Precision::kBf16}) {
            MoeConfig c = small_config();
            c.hidden_size = 32;
            c.ffn_hidden_size = 24;
            c.shared_expert_size = 16;
            c.gradient_accumulation_fusion = fusion;
            c.precision = prec;
            RunResult a = run_two_microbatches(c, false);
            RunResult b = run_two_microbatches(c, true);
            SCOPED_TRACE(::testing::Message()
                         << "fusion " << fusion << " " << precision_name(prec));
            EXPECT_TRUE(testing::same_bits(a.y, b.y));
            EXPECT_TRUE(testing::same_bits(a.dx, b.dx));
            for (std::size_t i = 0; i < a.grads.size(); ++i) {
                EXPECT_TRUE(testing::same_bits(a.grads[i], b.grads[i])) << "param " << i;
            }
        }
    }
}

TEST(MoeLayer, DeterministicRunToRun) {
    MoeConfig c = small_config();
    c.precision = Precision::kBf16;
    c.shared_expert_size = 8;
    RunResult a = run_two_microbatches(c, true);
    RunResult b = run_two_microbatches(c, true);
    EXPECT_TRUE(testing::same_bits(a.y, b.y));
    for (std::size_t i = 0; i < a.grads.size(); ++i) {
        EXPECT_TRUE(testing::same_bits(a.grads[i], b.grads[i]));
    }
}

// bf16 vs fp32 from the same fp32 masters. Tolerance: bf16 keeps 8 significant bits (unit
// roundoff u = 2^-9 = 0.2%); x, the weights, h, a, y, dy and the gradient operands are each
// rounded once, so the relative error of a result is a few u (independent roundings add in
// quadrature, ~sqrt(8) u ~ 0.6%; measured 0.4-0.5%); 2% leaves room for cancellation in sums
// without hiding a wrong formula (those give O(1) errors). Routing must be the same in both for the
// comparison to mean anything; the seed gives clear top-k margins and the test asserts it.
TEST(MoeLayer, Bf16AgreesWithFp32) {
    MoeConfig c32 = small_config();
    c32.hidden_size = 64;
    c32.ffn_hidden_size = 48;
    c32.num_experts = 8;
    c32.shared_expert_size = 32;
    MoeConfig c16 = c32;
    c16.precision = Precision::kBf16;
    Layer l32(c32, 64, 21, 0.3f), l16(c16, 64, 21, 0.3f);
    // Same inputs: the bf16 values, widened for fp32.
    l32.x = testing::to_f32(l16.x);
    l32.dy = testing::to_f32(l16.dy);
    MoeContext ctx32, ctx16;
    Tensor y32 = l32.new_activation(), y16 = l16.new_activation();
    Tensor dx32 = l32.new_activation(), dx16 = l16.new_activation();
    l32.zero_grads();
    l16.zero_grads();
    MoeLosses loss32 = moe_forward(c32, l32.params, l32.x, 1, ctx32, y32);
    MoeLosses loss16 = moe_forward(c16, l16.params, l16.x, 1, ctx16, y16);
    ASSERT_TRUE(Decisions(ctx32) == Decisions(ctx16)) << "routing differs; pick another seed";
    moe_backward(c32, l32.params, l32.dy, 1.0f, ctx32, dx32);
    moe_backward(c16, l16.params, l16.dy, 1.0f, ctx16, dx16);
    const double tol = 2e-2;
    EXPECT_LT(testing::relative_error(y16, y32), tol);
    EXPECT_LT(testing::relative_error(dx16, dx32), tol);
    EXPECT_NEAR(loss16.aux_loss, loss32.aux_loss, tol * loss32.aux_loss);
    EXPECT_NEAR(loss16.z_loss, loss32.z_loss, tol * loss32.z_loss);
    auto p32 = moe_layer_param_list(l32.params);
    auto p16 = moe_layer_param_list(l16.params);
    for (std::size_t i = 0; i < p32.size(); ++i) {
        const double err = testing::relative_error(p16[i]->main_grad, p32[i]->main_grad);
        EXPECT_LT(err, tol) << p32[i]->name;
    }
}

TEST(MoeLayer, SteadyStateStepsMapNoMemoryAndCreateNoPrimitives) {
    MoeConfig c = small_config();
    c.precision = Precision::kBf16;
    c.shared_expert_size = 8;
    Layer layer(c, 50, 31);
    MoeContext ctx;
    Tensor y = layer.new_activation(), dx = layer.new_activation();
    int maps = 0;
    std::int64_t creations = 0;
    for (int step = 0; step < 4; ++step) {
        if (step == 2) {
            maps = ctx.arena.num_maps();
            creations = kernels::gemm_cache_stats().creations;
        }
        moe_forward(c, layer.params, layer.x, 1, ctx, y);
        moe_backward(c, layer.params, layer.dy, 1.0f, ctx, dx);
    }
    EXPECT_EQ(ctx.arena.num_maps(), maps);
    EXPECT_EQ(kernels::gemm_cache_stats().creations, creations);
}

TEST(MoeLayer, InputOfTheWrongShapeOrTypeIsAnError) {
    MoeConfig c = small_config();
    Layer layer(c, 4, 41);
    MoeContext ctx;
    Tensor y = layer.new_activation();
    EXPECT_THROW(moe_forward(c, layer.params, Tensor::zeros({4, 7}, DType::kF32), 1, ctx, y),
                 Error);
    EXPECT_THROW(moe_forward(c, layer.params, Tensor::zeros({4, 8}, DType::kBF16), 1, ctx, y),
                 Error);
}

TEST(MoeConfig, ValidationNamesTheField) {
    MoeConfig c = small_config();
    c.topk = 5;
    try {
        validate_moe_config(c);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kConfig);
        EXPECT_NE(std::string(e.what()).find("moe_router_topk=5"), std::string::npos);
    }
    c = small_config();
    c.pad_to_capacity = true;
    EXPECT_THROW(validate_moe_config(c), Error);
    c = small_config();
    c.num_groups = 3;
    c.group_topk = 1;
    EXPECT_THROW(validate_moe_config(c), Error);
    c = small_config();
    c.enable_expert_bias = true;  // softmax
    EXPECT_THROW(validate_moe_config(c), Error);
    c = small_config();
    c.capacity_factor = 1.5;
    EXPECT_EQ(expert_capacity(c, 10), 8);  // ceil(10 * 2 / 4 * 1.5) = ceil(7.5)
    EXPECT_NO_THROW(validate_moe_config(c));
}

}  // namespace
}  // namespace epo::moe
