#include "epo/moe/router.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "moe/moe_test_util.h"

namespace epo::moe {
namespace {

using testing::check_gradient;
using testing::random_tensor;

MoeConfig base_config(std::int64_t e, std::int64_t k, std::int64_t h) {
    MoeConfig c;
    c.hidden_size = h;
    c.num_experts = e;
    c.topk = k;
    c.ffn_hidden_size = 4;
    c.precision = Precision::kFp32;
    c.aux_loss_coeff = 0.0;
    c.load_balancing_type = LoadBalancing::kNone;
    return c;
}

// Router with W = identity, so the logits are the rows of x.
struct IdentityRouter {
    MoeConfig cfg;
    RouterParams params;
    Arena arena;
    explicit IdentityRouter(MoeConfig c) : cfg(c), params(make_router_params(c)) {
        for (std::int64_t e = 0; e < cfg.num_experts; ++e) {
            params.weight.master.data<float>()[e * cfg.hidden_size + e] = 1.0f;
        }
        refresh_compute(params.weight);
    }
    RouterOutput route(const std::vector<float>& logits, std::int64_t sequences = 1) {
        const std::int64_t t = static_cast<std::int64_t>(logits.size()) / cfg.num_experts;
        Tensor x = Tensor::empty({t, cfg.hidden_size}, DType::kF32);
        std::copy(logits.begin(), logits.end(), x.data<float>());
        keep = x;
        return router_forward(cfg, params, x, sequences, arena);
    }
    Tensor keep;
};

TEST(Router, TopkIsDescendingWithTiesToTheLowerIndex) {
    const float v[6] = {0.5f, 2.0f, 2.0f, -1.0f, 3.0f, 2.0f};
    std::int32_t idx[6];
    topk_indices(v, 6, 4, idx);
    EXPECT_EQ(std::vector<std::int32_t>(idx, idx + 4), (std::vector<std::int32_t>{4, 1, 2, 5}));
    topk_indices(v, 6, 6, idx);
    EXPECT_EQ(idx[5], 3);
}

TEST(Router, SoftmaxOverTheChosenLogits) {
    IdentityRouter r(base_config(4, 2, 4));
    RouterOutput out = r.route({1.0f, 3.0f, 2.0f, 0.0f});
    EXPECT_EQ(out.topk_index.data<std::int32_t>()[0], 1);
    EXPECT_EQ(out.topk_index.data<std::int32_t>()[1], 2);
    const double w0 = 1.0 / (1.0 + std::exp(-1.0));
    EXPECT_NEAR(out.topk_weight.data<float>()[0], w0, 1e-6);
    EXPECT_NEAR(out.topk_weight.data<float>()[1], 1 - w0, 1e-6);
}

TEST(Router, PreSoftmaxTakesTheFullSoftmaxAndScales) {
    MoeConfig c = base_config(4, 2, 4);
    c.pre_softmax = true;
    c.topk_scaling_factor = 2.0;
    IdentityRouter r(c);
    RouterOutput out = r.route({1.0f, 3.0f, 2.0f, 0.0f});
    const double z = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + 1.0;
    EXPECT_NEAR(out.topk_prob.data<float>()[0], std::exp(3.0) / z, 1e-6);
    EXPECT_NEAR(out.topk_weight.data<float>()[0], 2 * std::exp(3.0) / z, 1e-6);
    EXPECT_NEAR(out.topk_weight.data<float>()[1], 2 * std::exp(2.0) / z, 1e-6);
}

TEST(Router, SigmoidBiasChoosesButDoesNotWeigh) {
    MoeConfig c = base_config(4, 2, 4);
    c.score_function = ScoreFunction::kSigmoid;
    c.enable_expert_bias = true;
    IdentityRouter r(c);
    const float bias[4] = {0.0f, 0.0f, 0.0f, 5.0f};
    std::copy(bias, bias + 4, r.params.expert_bias.data<float>());
    RouterOutput out = r.route({1.0f, 3.0f, 2.0f, 0.0f});
    EXPECT_EQ(out.topk_index.data<std::int32_t>()[0], 3);  // 0.5 + 5
    EXPECT_EQ(out.topk_index.data<std::int32_t>()[1], 1);
    const double s3 = 0.5, s1 = 1 / (1 + std::exp(-3.0));
    EXPECT_NEAR(out.topk_weight.data<float>()[0], s3 / (s3 + s1), 1e-6);
    EXPECT_NEAR(out.topk_weight.data<float>()[1], s1 / (s3 + s1), 1e-6);
    EXPECT_EQ(out.routed_counts, (std::vector<std::int64_t>{0, 1, 0, 1}));
}

TEST(Router, GroupLimitedKeepsTheBestGroups) {
    // 8 experts in 4 groups of 2; keep 2 groups, top-4 (2 per group for the group score).
    MoeConfig c = base_config(8, 4, 8);
    c.num_groups = 4;
    c.group_topk = 2;
    IdentityRouter r(c);  // selection on the logits (pre_softmax false)
    // Group sums: g0 = 9+0 = 9, g1 = 5+5 = 10, g2 = 6+6 = 12, g3 = 1+1 = 2 -> keep g2, g1.
    // Expert 0 (9, the best single score) is in a dropped group.
    RouterOutput out = r.route({9, 0, 5, 5, 6, 6, 1, 1});
    std::vector<std::int32_t> idx(out.topk_index.data<std::int32_t>(),
                                  out.topk_index.data<std::int32_t>() + 4);
    EXPECT_EQ(idx, (std::vector<std::int32_t>{4, 5, 2, 3}));
}

TEST(Router, AuxAndZLossValues) {
    MoeConfig c = base_config(4, 1, 4);
    c.load_balancing_type = LoadBalancing::kAuxLoss;
    c.aux_loss_coeff = 0.5;
    c.z_loss_coeff = 0.25;
    IdentityRouter r(c);
    const std::vector<float> logits = {1, 0, 0, 0, 0, 2, 0, 0, 3, 0, 0, 0};
    RouterOutput out = r.route(logits);
    // Direct evaluation of the formulas in double.
    const std::int64_t t_count = 3, e_count = 4;
    std::vector<double> psum(4, 0), counts(4, 0);
    double z = 0;
    for (std::int64_t t = 0; t < t_count; ++t) {
        double s = 0;
        for (std::int64_t e = 0; e < e_count; ++e) {
            s += std::exp(logits[t * 4 + e]);
        }
        z += std::log(s) * std::log(s);
        std::int64_t best = 0;
        for (std::int64_t e = 0; e < e_count; ++e) {
            psum[e] += std::exp(logits[t * 4 + e]) / s;
            if (logits[t * 4 + e] > logits[t * 4 + best]) {
                best = e;
            }
        }
        counts[best] += 1;
    }
    double aux = 0;
    for (int e = 0; e < 4; ++e) {
        aux += psum[e] * counts[e];
    }
    aux *= 0.5 * 4 / (1.0 * 9);
    EXPECT_NEAR(out.aux_loss, aux, 1e-6);
    EXPECT_NEAR(out.z_loss, 0.25 * z / 3, 1e-6);
}

TEST(Router, SeqAuxLossAveragesSequences) {
    MoeConfig c = base_config(2, 1, 2);
    c.load_balancing_type = LoadBalancing::kSeqAuxLoss;
    c.aux_loss_coeff = 1.0;
    IdentityRouter r(c);
    // Sequence 0: both tokens to expert 0; sequence 1: one to each.
    const std::vector<float> logits = {1, 0, 2, 0, 0, 1, 1, 0};
    RouterOutput out = r.route(logits, 2);
    auto sm = [](double a, double b) { return std::exp(a) / (std::exp(a) + std::exp(b)); };
    const double p00 = sm(1, 0) + sm(2, 0), p01 = 2 - p00;
    const double p10 = sm(0, 1) + sm(1, 0), p11 = 2 - p10;
    const double seq0 = 2.0 / (1 * 4) * (p00 * 2 + p01 * 0);
    const double seq1 = 2.0 / (1 * 4) * (p10 * 1 + p11 * 1);
    EXPECT_NEAR(out.aux_loss, (seq0 + seq1) / 2, 1e-6);
    EXPECT_THROW(r.route(logits, 3), Error);  // 4 tokens do not split into 3 sequences
}

// aux_loss pools the micro-batch's sequences (the reference's switch_load_balancing_loss over all
// its tokens); only seq_aux_loss keeps them apart. The same two sequences as above: pooled, expert
// 0 gets 3 of the 4 tokens.
TEST(Router, AuxLossPoolsTheMicroBatch) {
    MoeConfig c = base_config(2, 1, 2);
    c.load_balancing_type = LoadBalancing::kAuxLoss;
    c.aux_loss_coeff = 1.0;
    IdentityRouter r(c);
    const std::vector<float> logits = {1, 0, 2, 0, 0, 1, 1, 0};
    auto sm = [](double a, double b) { return std::exp(a) / (std::exp(a) + std::exp(b)); };
    const double p0 = sm(1, 0) + sm(2, 0) + sm(0, 1) + sm(1, 0), p1 = 4 - p0;
    const double pooled = 2.0 / (1 * 16) * (p0 * 3 + p1 * 1);
    EXPECT_NEAR(r.route(logits, 2).aux_loss, pooled, 1e-6);
    EXPECT_EQ(r.route(logits, 2).aux_loss, r.route(logits, 1).aux_loss);
    EXPECT_EQ(r.route(logits, 2).aux_counts, (std::vector<std::int64_t>{3, 1}));
}

TEST(Router, NonFiniteLogitsAreANumericsError) {
    IdentityRouter r(base_config(4, 2, 4));
    try {
        r.route({1.0f, NAN, 0.0f, 0.0f});
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kNumerics);
    }
}

TEST(Router, ExpertBiasUpdateFollowsTheSignOfTheImbalance) {
    Tensor bias = Tensor::zeros({3}, DType::kF32);
    const std::int64_t counts[3] = {10, 4, 4};  // mean 6
    update_expert_bias(bias, counts, 0.001);
    EXPECT_FLOAT_EQ(bias.data<float>()[0], -0.001f);
    EXPECT_FLOAT_EQ(bias.data<float>()[1], 0.001f);
}

// Finite differences of L = sum(p * G) + aux + z with respect to the router weight and the
// input, for every score function and loss.
struct GradCase {
    const char* name;
    MoeConfig cfg;
    std::int64_t sequences;
};

void check_router_gradients(const GradCase& gc) {
    SCOPED_TRACE(gc.name);
    const MoeConfig& cfg = gc.cfg;
    const std::int64_t t_count = 6;
    RouterParams params = make_router_params(cfg);
    fill_normal(params.weight.master, 11, 0.0f, 1.0f);
    refresh_compute(params.weight);
    if (cfg.enable_expert_bias) {
        fill_normal(params.expert_bias, 12, 0.0f, 0.3f);
    }
    Tensor x = random_tensor({t_count, cfg.hidden_size}, DType::kF32, 13);
    Tensor g = random_tensor({t_count, cfg.topk}, DType::kF32, 14);
    Arena arena;

    RouterOutput base = router_forward(cfg, params, x, gc.sequences, arena);
    std::vector<std::int32_t> base_idx(
        base.topk_index.data<std::int32_t>(),
        base.topk_index.data<std::int32_t>() + base.topk_index.numel());
    const std::vector<std::int64_t> base_counts = base.aux_counts;
    Tensor dx = Tensor::zeros({t_count, cfg.hidden_size}, DType::kF32);
    router_backward_dgrad(cfg, params, g, 1.0f, base, dx, arena);
    zero_grad(params.weight);
    router_backward_wgrad(cfg, params, base, arena);

    RouterOutput last;
    auto loss = [&] {
        arena.reset();
        last = router_forward(cfg, params, x, gc.sequences, arena);
        return testing::dot(last.topk_weight, g) + last.aux_loss + last.z_loss;
    };
    auto flipped = [&] {
        const std::int32_t* idx = last.topk_index.data<std::int32_t>();
        return !std::equal(base_idx.begin(), base_idx.end(), idx) || last.aux_counts != base_counts;
    };
    const int n_w = check_gradient(
        "router.weight", params.weight.master, params.weight.main_grad, loss, 1e-2, 5e-4, 1e-2,
        [] {}, flipped);
    const int n_x = check_gradient(
        "x", x, dx, loss, 1e-2, 5e-4, 1e-2, [] {}, flipped);
    EXPECT_GE(n_w, params.weight.master.numel() * 3 / 4);
    EXPECT_GE(n_x, x.numel() * 3 / 4);
}

TEST(Router, FiniteDifferenceGradients) {
    std::vector<GradCase> cases;
    {
        MoeConfig c = base_config(6, 2, 5);
        c.load_balancing_type = LoadBalancing::kAuxLoss;
        c.aux_loss_coeff = 1.5;
        c.z_loss_coeff = 0.05;
        cases.push_back({"softmax, topk then softmax, aux_loss, z-loss", c, 1});
        c.pre_softmax = true;
        c.topk_scaling_factor = 1.5;
        cases.push_back({"softmax, pre_softmax, scaled, aux_loss, z-loss", c, 1});
    }
    {
        MoeConfig c = base_config(6, 3, 5);
        c.score_function = ScoreFunction::kSigmoid;
        c.load_balancing_type = LoadBalancing::kAuxLoss;
        c.aux_loss_coeff = 1.5;
        cases.push_back({"sigmoid, aux_loss", c, 1});
        c.enable_expert_bias = true;
        c.topk_scaling_factor = 2.5;
        c.load_balancing_type = LoadBalancing::kSeqAuxLoss;
        c.z_loss_coeff = 0.05;
        cases.push_back({"sigmoid, expert bias, scaled, seq_aux_loss, z-loss", c, 2});
        c.topk = 1;
        cases.push_back({"sigmoid, top-1 (no normalization)", c, 3});
    }
    {
        MoeConfig c = base_config(8, 4, 5);
        c.num_groups = 4;
        c.group_topk = 2;
        c.score_function = ScoreFunction::kSigmoid;
        c.enable_expert_bias = true;
        c.load_balancing_type = LoadBalancing::kSeqAuxLoss;
        c.aux_loss_coeff = 1.5;
        cases.push_back({"group-limited sigmoid (deepseek-v3 style)", c, 2});
        c.score_function = ScoreFunction::kSoftmax;
        c.enable_expert_bias = false;
        c.pre_softmax = false;
        c.load_balancing_type = LoadBalancing::kAuxLoss;
        cases.push_back({"group-limited softmax", c, 1});
    }
    {
        MoeConfig c = base_config(4, 4, 5);
        c.load_balancing_type = LoadBalancing::kAuxLoss;
        c.aux_loss_coeff = 1.5;
        cases.push_back({"top-k = E", c, 1});
    }
    for (const GradCase& gc : cases) {
        check_router_gradients(gc);
    }
}

TEST(Router, LossGradScaleScalesOnlyTheLossTerms) {
    MoeConfig c = base_config(4, 2, 4);
    c.load_balancing_type = LoadBalancing::kAuxLoss;
    c.aux_loss_coeff = 0.5;
    c.z_loss_coeff = 0.1;
    RouterParams params = make_router_params(c);
    fill_normal(params.weight.master, 3, 0.0f, 1.0f);
    refresh_compute(params.weight);
    Tensor x = random_tensor({5, 4}, DType::kF32, 4);
    Tensor zero_g = Tensor::zeros({5, 2}, DType::kF32);
    Arena arena;
    RouterOutput a = router_forward(c, params, x, 1, arena);
    RouterOutput b = router_forward(c, params, x, 1, arena);
    Tensor dx = Tensor::zeros({5, 4}, DType::kF32);
    router_backward_dgrad(c, params, zero_g, 1.0f, a, dx, arena);
    router_backward_dgrad(c, params, zero_g, 0.25f, b, dx, arena);
    for (std::int64_t i = 0; i < a.dlogits.numel(); ++i) {
        EXPECT_NEAR(b.dlogits.data<float>()[i], 0.25f * a.dlogits.data<float>()[i], 1e-7);
    }
}

}  // namespace
}  // namespace epo::moe
