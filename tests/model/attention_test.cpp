#include "epo/model/attention.h"

#include <gtest/gtest.h>

#include "epo/tensor/random.h"
#include "finite_difference.h"

namespace epo::model {
namespace {

using epo::testing::dot;
using epo::testing::expect_gradient_matches;

struct AttentionFixture {
    AttentionShape shape;
    RopeTable rope;
    AttentionParams params;
    Tensor x, r;
    Arena saved{"saved"}, scratch{"scratch"};

    explicit AttentionFixture(AttentionShape s, int64_t sequences, DType dtype = DType::kF32)
        : shape(s), rope(make_rope_table(s.seq_length, s.head_dim, 10000.0)) {
        params = make_attention_params(s, dtype, "");
        fill_normal(params.qkv.master, 1, 0.0f, 0.4f);
        fill_normal(params.proj.master, 2, 0.0f, 0.4f);
        refresh_compute(params.qkv);
        refresh_compute(params.proj);
        if (s.qk_layernorm) {
            fill_uniform(params.q_norm.master, 3, 0.5f, 1.5f);
            fill_uniform(params.k_norm.master, 4, 0.5f, 1.5f);
            refresh_compute(params.q_norm);
            refresh_compute(params.k_norm);
        }
        const int64_t T = sequences * s.seq_length;
        x = Tensor::empty({T, s.hidden}, DType::kF32);
        r = Tensor::empty({T, s.hidden}, DType::kF32);
        fill_normal(x, 5, 0.0f, 1.0f);
        fill_normal(r, 6, 0.0f, 1.0f);
    }

    // L = sum(attention(x) * r)
    double loss() {
        for (Param* p : {&params.qkv, &params.proj})
            refresh_compute(*p);
        Tensor out = Tensor::zeros(x.shape(), DType::kF32);
        AttentionContext ctx;
        saved.reset();
        scratch.reset();
        attention_forward(shape, params, rope, x, out, ctx, saved, scratch);
        return dot(out, r);
    }
};

void check_gradients(AttentionShape s, int64_t sequences) {
    AttentionFixture f(s, sequences);
    AttentionContext ctx;
    Tensor out = Tensor::zeros(f.x.shape(), DType::kF32);
    attention_forward(f.shape, f.params, f.rope, f.x, out, ctx, f.saved, f.scratch);
    Tensor dx = Tensor::zeros(f.x.shape(), DType::kF32);
    Arena scratch2("scratch2");
    attention_backward_dgrad(f.shape, f.params, f.rope, f.r, dx, ctx, f.saved, scratch2);
    attention_backward_wgrad(f.params, /*fusion=*/true, ctx, scratch2);
    Tensor dx_copy = dx.clone();
    Tensor gqkv = f.params.qkv.main_grad.clone(), gproj = f.params.proj.main_grad.clone();
    auto loss = [&] { return f.loss(); };
    expect_gradient_matches("dx", f.x.data<float>(), dx_copy.data<float>(), f.x.numel(), loss);
    expect_gradient_matches("dWqkv", f.params.qkv.master.data<float>(), gqkv.data<float>(),
                            gqkv.numel(), loss);
    expect_gradient_matches("dWproj", f.params.proj.master.data<float>(), gproj.data<float>(),
                            gproj.numel(), loss);
    if (s.qk_layernorm) {
        Tensor gq = f.params.q_norm.main_grad.clone(), gk = f.params.k_norm.main_grad.clone();
        expect_gradient_matches("dq_norm", f.params.q_norm.master.data<float>(), gq.data<float>(),
                                gq.numel(), loss);
        expect_gradient_matches("dk_norm", f.params.k_norm.master.data<float>(), gk.data<float>(),
                                gk.numel(), loss);
    }
}

TEST(Attention, GradientsMatchFiniteDifferencesGqa) {
    check_gradients({.hidden = 8, .num_heads = 4, .num_groups = 2, .head_dim = 4, .seq_length = 5},
                    2);
}

TEST(Attention, GradientsMatchFiniteDifferencesQkLayernorm) {
    check_gradients({.hidden = 8,
                     .num_heads = 2,
                     .num_groups = 1,
                     .head_dim = 6,
                     .seq_length = 4,
                     .qk_layernorm = true},
                    2);
}

TEST(Attention, IsCausal) {
    // Changing the last token of a sequence changes no earlier output row.
    AttentionFixture f(
        {.hidden = 8, .num_heads = 2, .num_groups = 2, .head_dim = 4, .seq_length = 6}, 1);
    AttentionContext ctx;
    Tensor out1 = Tensor::zeros(f.x.shape(), DType::kF32);
    attention_forward(f.shape, f.params, f.rope, f.x, out1, ctx, f.saved, f.scratch);
    for (int j = 0; j < 8; ++j)
        f.x.data<float>()[5 * 8 + j] += 1.0f;
    Tensor out2 = Tensor::zeros(f.x.shape(), DType::kF32);
    f.saved.reset();
    f.scratch.reset();
    attention_forward(f.shape, f.params, f.rope, f.x, out2, ctx, f.saved, f.scratch);
    for (int i = 0; i < 5 * 8; ++i)
        EXPECT_EQ(out1.data<float>()[i], out2.data<float>()[i]);
    bool last_changed = false;
    for (int j = 0; j < 8; ++j)
        last_changed |= out1.data<float>()[40 + j] != out2.data<float>()[40 + j];
    EXPECT_TRUE(last_changed);
}

TEST(Attention, DgradThenWgradEqualsImmediateWgradBitwise) {
    // wgrad reads only what dgrad saved: calling it later, after other work reused the scratch
    // arena, gives the same bits.
    AttentionShape s{.hidden = 16,
                     .num_heads = 4,
                     .num_groups = 2,
                     .head_dim = 4,
                     .seq_length = 8,
                     .qk_layernorm = true};
    AttentionFixture a(s, 2, DType::kBF16), b(s, 2, DType::kBF16);
    for (AttentionFixture* f : {&a, &b}) {
        AttentionContext ctx;
        Tensor out = Tensor::zeros(f->x.shape(), DType::kF32);
        Tensor xc = Tensor::empty(f->x.shape(), DType::kBF16);
        convert_f32_to_bf16(f->x.data<float>(), xc.data<BF16>(), f->x.numel());
        attention_forward(f->shape, f->params, f->rope, xc, out, ctx, f->saved, f->scratch);
        Tensor dx = Tensor::zeros(f->x.shape(), DType::kF32);
        Arena scratch("s");
        attention_backward_dgrad(f->shape, f->params, f->rope, f->r, dx, ctx, f->saved, scratch);
        if (f == &b) {
            scratch.reset();
            Tensor junk = scratch.alloc({4096}, DType::kF32);
            fill_normal(junk, 9, 0.0f, 1.0f);
        }
        attention_backward_wgrad(f->params, /*fusion=*/false, ctx, scratch);
    }
    for (auto [pa, pb] :
         {std::pair{&a.params.qkv, &b.params.qkv}, std::pair{&a.params.proj, &b.params.proj}}) {
        EXPECT_EQ(0, std::memcmp(pa->main_grad.raw(), pb->main_grad.raw(), pa->main_grad.nbytes()));
    }
}

}  // namespace
}  // namespace epo::model
