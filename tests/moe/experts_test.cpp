#include "epo/moe/experts.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "epo/kernels/activation.h"
#include "moe/moe_test_util.h"

namespace epo::moe {
namespace {

using testing::check_gradient;
using testing::random_tensor;
using testing::value_at;

struct ExpertsSetup {
    std::int64_t h = 16, f = 20;
    std::vector<std::int64_t> counts = {5, 0, 37};
    DType dt = DType::kF32;
};

struct Experts {
    ExpertWeights w;
    ExpertSegments seg;
    Tensor x, probs, g;  // input rows, weights, and G = dL/dy for L = sum(y * G)
};

Experts make_experts(const ExpertsSetup& s, std::uint64_t seed = 1) {
    Experts e;
    const std::int64_t n = static_cast<std::int64_t>(s.counts.size());
    e.w = make_expert_weights(n, s.h, s.f, s.dt);
    fill_normal(e.w.fc1.master, seed, 0.0f, 0.3f);
    fill_normal(e.w.fc2.master, seed + 1, 0.0f, 0.3f);
    refresh_compute(e.w.fc1);
    refresh_compute(e.w.fc2);
    e.seg = make_expert_segments(s.counts, kExpertRowAlign);
    const std::int64_t rp = e.seg.total_rows();
    e.x = random_tensor({rp, s.h}, s.dt, seed + 2);
    zero_segment_padding(e.seg, e.x);
    e.probs = Tensor::empty({rp}, DType::kF32);
    fill_uniform(e.probs, seed + 3, 0.1f, 1.0f);
    zero_segment_padding(e.seg, e.probs);
    e.g = random_tensor({rp, s.h}, s.dt, seed + 4);
    zero_segment_padding(e.seg, e.g);
    return e;
}

// A per-expert loop in double precision, row by row, from the compute-dtype values.
TEST(Experts, GroupedMatchesAPerExpertLoop) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
        ExpertsSetup s;
        s.dt = dt;
        Experts e = make_experts(s);
        const std::int64_t rp = e.seg.total_rows();
        Tensor y = Tensor::empty({rp, s.h}, dt);
        ExpertsContext ctx;
        Arena arena;
        experts_forward(e.w, e.seg, e.x, e.probs, y, ctx, arena);
        Tensor want = Tensor::zeros({rp, s.h}, DType::kF32);
        for (std::int64_t ex = 0; ex < e.seg.num_experts(); ++ex) {
            for (std::int64_t j = 0; j < e.seg.counts[ex]; ++j) {
                const std::int64_t r = e.seg.offsets[ex] + j;
                std::vector<double> a(s.f);
                for (std::int64_t q = 0; q < s.f; ++q) {
                    double g = 0, u = 0;
                    for (std::int64_t i = 0; i < s.h; ++i) {
                        const double xv = value_at(e.x, r * s.h + i);
                        g += value_at(e.w.fc1.compute, (ex * 2 * s.f + q) * s.h + i) * xv;
                        u += value_at(e.w.fc1.compute, (ex * 2 * s.f + s.f + q) * s.h + i) * xv;
                    }
                    a[q] = e.probs.data<float>()[r] * g / (1 + std::exp(-g)) * u;
                }
                for (std::int64_t i = 0; i < s.h; ++i) {
                    double v = 0;
                    for (std::int64_t q = 0; q < s.f; ++q) {
                        v += value_at(e.w.fc2.compute, (ex * s.h + i) * s.f + q) * a[q];
                    }
                    want.data<float>()[r * s.h + i] = static_cast<float>(v);
                }
            }
        }
        // Only the real rows are outputs.
        double err = 0, norm = 0;
        for (std::int64_t ex = 0; ex < e.seg.num_experts(); ++ex) {
            for (std::int64_t j = 0; j < e.seg.counts[ex] * s.h; ++j) {
                const std::int64_t i = e.seg.offsets[ex] * s.h + j;
                err += std::pow(value_at(y, i) - value_at(want, i), 2);
                norm += std::pow(value_at(want, i), 2);
            }
        }
        // fp32: summation order only. bf16: h, a and y are stored in bf16 (2^-9 relative each).
        EXPECT_LT(std::sqrt(err / norm), dt == DType::kF32 ? 1e-5 : 1.5e-2) << dtype_name(dt);
    }
}

TEST(Experts, PackedAndPlainWeightsAgree) {
    ExpertsSetup s;
    s.dt = DType::kBF16;
    Experts e = make_experts(s);
    const std::int64_t rp = e.seg.total_rows();
    Tensor y1 = Tensor::empty({rp, s.h}, s.dt), y2 = Tensor::empty({rp, s.h}, s.dt);
    ExpertsContext c1, c2;
    Arena arena;
    experts_forward(e.w, e.seg, e.x, e.probs, y1, c1, arena);
    e.w.use_packed = false;
    experts_forward(e.w, e.seg, e.x, e.probs, y2, c2, arena);
    EXPECT_LT(testing::relative_error(y1, y2), 1e-2);
}

// L = sum(y * G): finite differences for both weights, the input rows and the probabilities.
TEST(Experts, FiniteDifferenceGradients) {
    ExpertsSetup s;
    s.h = 8;
    s.f = 6;
    s.counts = {3, 0, 34};
    Experts e = make_experts(s);
    const std::int64_t rp = e.seg.total_rows();
    Tensor y = Tensor::empty({rp, s.h}, DType::kF32);
    Tensor dx = Tensor::empty({rp, s.h}, DType::kF32);
    Tensor dp = Tensor::empty({rp}, DType::kF32);
    ExpertsContext ctx;
    Arena arena;
    zero_grad(e.w.fc1);
    zero_grad(e.w.fc2);
    experts_forward(e.w, e.seg, e.x, e.probs, y, ctx, arena);
    experts_backward(e.w, true, e.g, dx, dp, ctx, arena);
    auto loss = [&] {
        ExpertsContext c;
        Arena a;
        experts_forward(e.w, e.seg, e.x, e.probs, y, c, a);
        return testing::dot(y, e.g);
    };
    check_gradient("fc1", e.w.fc1.master, e.w.fc1.main_grad, loss, 1e-2, 1e-3, 1e-2,
                   [&] { refresh_compute(e.w.fc1); });
    check_gradient("fc2", e.w.fc2.master, e.w.fc2.main_grad, loss, 1e-2, 1e-3, 1e-2,
                   [&] { refresh_compute(e.w.fc2); });
    // Only real rows are inputs (alignment rows must stay zero).
    for (std::int64_t ex = 0; ex < 3; ++ex) {
        const Tensor xs = e.x.rows(e.seg.offsets[ex], e.seg.offsets[ex] + e.seg.counts[ex]);
        const Tensor dxs = dx.rows(e.seg.offsets[ex], e.seg.offsets[ex] + e.seg.counts[ex]);
        check_gradient("x", xs, dxs, loss, 1e-2, 1e-3, 1e-2);
        const Tensor ps = e.probs.rows(e.seg.offsets[ex], e.seg.offsets[ex] + e.seg.counts[ex]);
        const Tensor dps = dp.rows(e.seg.offsets[ex], e.seg.offsets[ex] + e.seg.counts[ex]);
        check_gradient("probs", ps, dps, loss, 1e-2, 1e-3, 1e-2);
    }
}

TEST(Experts, SharedExpertFiniteDifferenceGradients) {
    const std::int64_t t = 5, h = 8, sz = 6;
    SharedExpertWeights w = make_shared_expert_weights(h, sz, DType::kF32);
    fill_normal(w.fc1.master, 1, 0.0f, 0.4f);
    fill_normal(w.fc2.master, 2, 0.0f, 0.4f);
    Tensor x = random_tensor({t, h}, DType::kF32, 3);
    Tensor g = random_tensor({t, h}, DType::kF32, 4);
    Tensor y = Tensor::empty({t, h}, DType::kF32);
    Tensor dx = Tensor::zeros({t, h}, DType::kF32);
    ExpertsContext ctx;
    Arena arena;
    shared_expert_forward(w, x, y, ctx, arena);
    shared_expert_backward_dgrad(w, g, dx, ctx, arena);
    shared_expert_backward_wgrad(w, false, ctx, arena);
    auto loss = [&] {
        ExpertsContext c;
        Arena a;
        shared_expert_forward(w, x, y, c, a);
        return testing::dot(y, g);
    };
    check_gradient("shared.fc1", w.fc1.master, w.fc1.main_grad, loss, 1e-2, 1e-3, 1e-2);
    check_gradient("shared.fc2", w.fc2.master, w.fc2.main_grad, loss, 1e-2, 1e-3, 1e-2);
    check_gradient("x", x, dx, loss, 1e-2, 1e-3, 1e-2);
}

// dgrad now and wgrad later (with other work between) == the fused backward, bit for bit.
TEST(Experts, DgradThenWgradEqualsFusedBackward) {
    for (bool fusion : {true, false}) {
        for (DType dt : {DType::kF32, DType::kBF16}) {
            ExpertsSetup s;
            s.dt = dt;
            Experts a = make_experts(s, 7), b = make_experts(s, 7);
            const std::int64_t rp = a.seg.total_rows();
            Tensor y = Tensor::empty({rp, s.h}, dt);
            Tensor dx_a = Tensor::empty({rp, s.h}, dt), dx_b = Tensor::empty({rp, s.h}, dt);
            Tensor dp_a = Tensor::empty({rp}, DType::kF32), dp_b = Tensor::empty({rp}, DType::kF32);
            // Gradients accumulate onto earlier ones, as over micro-batches.
            fill_normal(a.w.fc1.main_grad, 9, 0.0f, 1.0f);
            fill_normal(a.w.fc2.main_grad, 10, 0.0f, 1.0f);
            b.w.fc1.main_grad.copy_from(a.w.fc1.main_grad);
            b.w.fc2.main_grad.copy_from(a.w.fc2.main_grad);
            ExpertsContext ca, cb, other;
            Arena aa, ab, ao;
            experts_forward(a.w, a.seg, a.x, a.probs, y, ca, aa);
            experts_backward(a.w, fusion, a.g, dx_a, dp_a, ca, aa);

            experts_forward(b.w, b.seg, b.x, b.probs, y, cb, ab);
            experts_backward_dgrad(b.w, b.g, dx_b, dp_b, cb, ab);
            // Another micro-batch's forward in between, through the same weights.
            Experts o = make_experts(s, 99);
            Tensor yo = Tensor::empty({o.seg.total_rows(), s.h}, dt);
            experts_forward(b.w, o.seg, o.x, o.probs, yo, other, ao);
            experts_backward_wgrad(b.w, fusion, cb, ab);

            EXPECT_TRUE(testing::same_bits(dx_a, dx_b));
            EXPECT_TRUE(testing::same_bits(dp_a, dp_b));
            EXPECT_TRUE(testing::same_bits(a.w.fc1.main_grad, b.w.fc1.main_grad))
                << "fusion " << fusion << " " << dtype_name(dt);
            EXPECT_TRUE(testing::same_bits(a.w.fc2.main_grad, b.w.fc2.main_grad));
        }
    }
}

// The FFN runs tile by tile (fc1, activation, fc2 per row tile, so the tile stays in cache). With
// segments of several tiles plus remainders, every output and gradient must have the bits of the
// plain sequence of whole-segment products: fc1 over all rows, the activation, then fc2.
TEST(Experts, TileByTileEqualsWholeSegmentProducts) {
    using kernels::as_matrix;
    using kernels::sub_rows;
    for (bool packed : {true, false}) {
        ExpertsSetup s;
        s.h = 32;
        s.f = 24;
        s.dt = DType::kBF16;
        s.counts = {300, 0, 2 * kernels::kGemmRowTile + 17, 16};
        Experts e = make_experts(s, 11);
        e.w.use_packed = packed;
        const std::int64_t rp = e.seg.total_rows();
        Tensor y = Tensor::empty({rp, s.h}, s.dt), dx = Tensor::empty({rp, s.h}, s.dt);
        Tensor dprobs = Tensor::empty({rp}, DType::kF32);
        ExpertsContext ctx;
        Arena arena;
        experts_forward(e.w, e.seg, e.x, e.probs, y, ctx, arena);
        experts_backward(e.w, true, e.g, dx, dprobs, ctx, arena);

        Tensor want_h = Tensor::zeros({rp, 2 * s.f}, s.dt), want_a = Tensor::zeros({rp, s.f}, s.dt);
        Tensor want_y = Tensor::zeros({rp, s.h}, s.dt), want_dx = Tensor::zeros({rp, s.h}, s.dt);
        Tensor want_dp = Tensor::zeros({rp}, DType::kF32);
        Tensor da = Tensor::zeros({rp, s.f}, s.dt), dh = Tensor::zeros({rp, 2 * s.f}, s.dt);
        const kernels::GemmOptions tiles{false, false, false, true};
        const std::int64_t experts = e.seg.num_experts();
        for (std::int64_t ex = 0; ex < experts; ++ex) {
            const std::int64_t off = e.seg.offsets[ex], n = e.seg.counts[ex];
            if (n == 0) {
                continue;
            }
            const kernels::Matrix w1 =
                sub_rows(as_matrix(e.w.fc1.compute, experts * 2 * s.f, s.h), ex * 2 * s.f, 2 * s.f);
            const kernels::Matrix w2 =
                sub_rows(as_matrix(e.w.fc2.compute, experts * s.h, s.f), ex * s.h, s.h);
            auto product = [&](const kernels::Matrix& a, const kernels::Matrix& w, bool trans,
                               const kernels::Matrix& c) {
                if (packed) {
                    kernels::gemm(a, kernels::pack_b(w, trans), c, tiles);
                } else {
                    kernels::gemm(a, w, c, {false, trans, false, true});
                }
            };
            auto rows = [&](const Tensor& t) { return sub_rows(as_matrix(t), off, n); };
            product(rows(e.x), w1, true, rows(want_h));
            kernels::swiglu_forward(rows(want_h), e.probs.data<float>() + off, rows(want_a));
            product(rows(want_a), w2, true, rows(want_y));
            product(rows(e.g), w2, false, rows(da));
            kernels::swiglu_backward(rows(want_h), e.probs.data<float>() + off, rows(da), rows(dh),
                                     want_dp.data<float>() + off);
            product(rows(dh), w1, false, rows(want_dx));
        }
        SCOPED_TRACE(packed ? "packed weights" : "plain weights");
        zero_segment_padding(e.seg, ctx.h);  // h is defined on the real rows only
        EXPECT_TRUE(testing::same_bits(ctx.h, want_h));
        EXPECT_TRUE(testing::same_bits(ctx.a, want_a));
        EXPECT_TRUE(testing::same_bits(y, want_y));
        EXPECT_TRUE(testing::same_bits(ctx.dh, dh));
        EXPECT_TRUE(testing::same_bits(dx, want_dx));
        EXPECT_TRUE(testing::same_bits(dprobs, want_dp));
    }
}

TEST(Experts, WgradBeforeDgradIsAnError) {
    ExpertsSetup s;
    Experts e = make_experts(s);
    ExpertsContext ctx;
    Arena arena;
    Tensor y = Tensor::empty({e.seg.total_rows(), s.h}, s.dt);
    experts_forward(e.w, e.seg, e.x, e.probs, y, ctx, arena);
    EXPECT_THROW(experts_backward_wgrad(e.w, true, ctx, arena), Error);
}

}  // namespace
}  // namespace epo::moe
