// Multi-latent attention against a float64 reference written here with naive loops, and against
// finite differences of the layer itself.
//
// The reference (ref_forward) follows Megatron's definition independently of the layer's code:
// rope is written in its interleaved form (pairs (2i, 2i+1) of the positional part rotate by
// p * base^(-2i/Dr)), which the layer computes as a reordering plus the rotate-half rope. The
// reference gradients are central differences of the float64 loss (step 1e-6 relative: their
// error is ~1e-9, far below the tolerances), so every gradient, of x, of each projection and of
// each norm weight, is checked against something that never saw the layer's backward.
//
// Tolerances: max |layer - reference| <= tol * max |reference| per tensor, with tol 1e-4 in f32
// compute (measured errors below 2e-6) and 4e-2 in bf16 (measured 5e-3 to 2e-2: roundings of x, the
// weights, every latent and head tensor and the probabilities, 8 bits each).
#include "epo/model/mla_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "epo/tensor/random.h"
#include "finite_difference.h"
#include "float64_reference.h"

namespace epo::model {
namespace {

using epo::testing::dot;
using epo::testing::expect_gradient_matches;
using Vec = std::vector<double>;
using epo::testing::linear;
using epo::testing::numeric_gradient;
using epo::testing::relative_error;
using epo::testing::rms_norm;
using epo::testing::to_vec;

constexpr double kRopeBase = 10000.0;

// ---- float64 reference -------------------------------------------------------------------

struct RefWeights {
    Vec q_down, q_up, q_norm, kv_down, kv_up, kv_norm, proj;
};

// Interleaved rope on the Dr values at v (position p).
void rope_pairs(double* v, int64_t Dr, int64_t p) {
    for (int64_t i = 0; i < Dr / 2; ++i) {
        const double angle = p * std::pow(kRopeBase, -2.0 * i / Dr);
        const double a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * std::cos(angle) - b * std::sin(angle);
        v[2 * i + 1] = b * std::cos(angle) + a * std::sin(angle);
    }
}

// out (T, H) = mla(x (T, H)).
Vec ref_forward(const MlaShape& s, const RefWeights& w, const Vec& x, int64_t T) {
    const int64_t H = s.hidden, N = s.num_heads, Rq = s.q_lora_rank, Rkv = s.kv_lora_rank,
                  Dn = s.qk_head_dim, Dr = s.qk_pos_emb_head_dim, Dq = Dn + Dr, Dv = s.v_head_dim,
                  S = s.seq_length;
    Vec qin = x;
    int64_t qw = H;
    if (Rq > 0) {
        qin = linear(x, w.q_down, T, H, Rq);
        qw = Rq;
    }
    if (s.qk_layernorm)
        qin = rms_norm(qin, w.q_norm, T, qw, s.norm_eps);
    Vec q = linear(qin, w.q_up, T, qw, N * Dq);
    const Vec ckv = linear(x, w.kv_down, T, H, Rkv + Dr);
    Vec latent(static_cast<size_t>(T * Rkv));
    Vec kpe(static_cast<size_t>(T * Dr));
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < Rkv; ++j)
            latent[t * Rkv + j] = ckv[t * (Rkv + Dr) + j];
        for (int64_t j = 0; j < Dr; ++j)
            kpe[t * Dr + j] = ckv[t * (Rkv + Dr) + Rkv + j];
        rope_pairs(&kpe[t * Dr], Dr, t % S);
        for (int64_t h = 0; h < N; ++h)
            rope_pairs(&q[t * N * Dq + h * Dq + Dn], Dr, t % S);
    }
    if (s.qk_layernorm)
        latent = rms_norm(latent, w.kv_norm, T, Rkv, s.norm_eps);
    const Vec kv = linear(latent, w.kv_up, T, Rkv, N * (Dn + Dv));
    // key of head h at token t, element c: the head's nope part, then the shared kpe.
    const auto key = [&](int64_t t, int64_t h, int64_t c) {
        return c < Dn ? kv[t * N * (Dn + Dv) + h * (Dn + Dv) + c] : kpe[t * Dr + c - Dn];
    };
    const auto value = [&](int64_t t, int64_t h, int64_t c) {
        return kv[t * N * (Dn + Dv) + h * (Dn + Dv) + Dn + c];
    };
    Vec ctx(static_cast<size_t>(T * N * Dv), 0.0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(Dq));
    for (int64_t b = 0; b < T / S; ++b)
        for (int64_t h = 0; h < N; ++h)
            for (int64_t i = 0; i < S; ++i) {
                const int64_t ti = b * S + i;
                Vec p(static_cast<size_t>(i + 1));
                double mx = -1e300, sum = 0;
                for (int64_t j = 0; j <= i; ++j) {
                    double sc = 0;
                    for (int64_t c = 0; c < Dq; ++c)
                        sc += q[ti * N * Dq + h * Dq + c] * key(b * S + j, h, c);
                    p[j] = sc * scale;
                    mx = std::max(mx, p[j]);
                }
                for (int64_t j = 0; j <= i; ++j)
                    sum += (p[j] = std::exp(p[j] - mx));
                for (int64_t j = 0; j <= i; ++j)
                    for (int64_t c = 0; c < Dv; ++c)
                        ctx[ti * N * Dv + h * Dv + c] += p[j] / sum * value(b * S + j, h, c);
            }
    return linear(ctx, w.proj, T, N * Dv, H);
}

// ---- the layer ----------------------------------------------------------------------------

struct MlaFixture {
    MlaShape shape;
    RopeTable rope;
    MlaParams params;
    DType dtype;
    Tensor x, r;  // (T, H) f32: input and the loss weights
    Arena saved{"saved"}, scratch{"scratch"};

    MlaFixture(MlaShape s, int64_t sequences, DType cd)
        : shape(s),
          rope(make_rope_table(s.seq_length, s.qk_pos_emb_head_dim, kRopeBase)),
          params(make_mla_params(s, cd, "")),
          dtype(cd) {
        uint64_t seed = 11;
        for (Param* p : weights()) {
            const bool norm = p->compute_dtype() == DType::kF32 && p->shape().rank == 1;
            if (norm)
                fill_uniform(p->master, seed++, 0.5f, 1.5f);
            else
                fill_normal(p->master, seed++, 0.0f, 0.4f);
            refresh_compute(*p);
        }
        const int64_t T = sequences * s.seq_length;
        x = Tensor::empty({T, s.hidden}, DType::kF32);
        r = Tensor::empty({T, s.hidden}, DType::kF32);
        fill_normal(x, 5, 0.0f, 1.0f);
        fill_normal(r, 6, 0.0f, 1.0f);
    }

    std::vector<Param*> weights() {
        std::vector<Param*> out;
        collect_mla_params(shape, params, out);
        return out;
    }

    Tensor input() {
        if (dtype == DType::kF32)
            return x;
        Tensor xc = Tensor::empty(x.shape(), DType::kBF16);
        convert_f32_to_bf16(x.data<float>(), xc.data<BF16>(), x.numel());
        return xc;
    }

    // L = sum(mla(x) * r), recomputed from the masters (finite differences perturb them).
    double loss() {
        for (Param* p : weights())
            refresh_compute(*p);
        Tensor out = Tensor::zeros(x.shape(), DType::kF32);
        MlaContext ctx;
        saved.reset();
        scratch.reset();
        mla_forward(shape, params, rope, input(), out, ctx, saved, scratch);
        return dot(out, r);
    }

    struct Result {
        Tensor out, dx;
    };
    // Forward, dgrad and wgrad once; the weight gradients land in main_grad.
    Result run(bool fusion = true) {
        for (Param* p : weights())
            zero_grad(*p);
        Result res{Tensor::zeros(x.shape(), DType::kF32), Tensor::zeros(x.shape(), DType::kF32)};
        MlaContext ctx;
        saved.reset();
        scratch.reset();
        Tensor xin = input();
        mla_forward(shape, params, rope, xin, res.out, ctx, saved, scratch);
        Arena scratch2("scratch2");
        mla_backward_dgrad(shape, params, rope, r, res.dx, ctx, saved, scratch2);
        mla_backward_wgrad(shape, params, fusion, ctx, scratch2);
        return res;
    }

    RefWeights ref_weights() {
        const auto v = [](const Param& p) { return p.name.empty() ? Vec{} : to_vec(p.master); };
        return RefWeights{v(params.q_down), v(params.q_up),    v(params.q_norm), v(params.kv_down),
                          v(params.kv_up),  v(params.kv_norm), v(params.proj)};
    }
};

// The layer (forward, dx, every weight gradient) against the float64 reference.
void check_against_reference(const MlaShape& s, DType cd, double tol) {
    const int64_t sequences = 2;
    MlaFixture f(s, sequences, cd);
    const MlaFixture::Result res = f.run();
    const int64_t T = f.x.dim(0);
    RefWeights w = f.ref_weights();
    Vec xr = to_vec(f.x);
    const Vec rr = to_vec(f.r);
    const auto loss = [&] {
        const Vec out = ref_forward(s, w, xr, T);
        double l = 0;
        for (size_t i = 0; i < out.size(); ++i)
            l += out[i] * rr[i];
        return l;
    };
    const double out_err = relative_error(to_vec(res.out), ref_forward(s, w, xr, T));
    EXPECT_LE(out_err, tol) << "forward";
    const double dx_err = relative_error(to_vec(res.dx), numeric_gradient(xr, loss));
    EXPECT_LE(dx_err, tol) << "dx";
    struct Check {
        const char* name;
        Vec* ref;
        const Param* param;
    };
    const Check checks[] = {
        {"q_down", &w.q_down, &f.params.q_down}, {"q_up", &w.q_up, &f.params.q_up},
        {"q_norm", &w.q_norm, &f.params.q_norm}, {"kv_down", &w.kv_down, &f.params.kv_down},
        {"kv_up", &w.kv_up, &f.params.kv_up},    {"kv_norm", &w.kv_norm, &f.params.kv_norm},
        {"proj", &w.proj, &f.params.proj}};
    int checked = 0;
    for (const Check& c : checks) {
        if (c.ref->empty())
            continue;
        const double err =
            relative_error(to_vec(c.param->main_grad), numeric_gradient(*c.ref, loss));
        EXPECT_LE(err, tol) << c.param->name;
        std::printf("  %-45s rel err %.2e (tol %.0e)\n", c.param->name.c_str(), err, tol);
        ++checked;
    }
    std::printf("  forward rel err %.2e, dx rel err %.2e, %d weight gradients\n", out_err, dx_err,
                checked);
}

MlaShape small_shape(bool lora, bool norm) {
    return MlaShape{.hidden = 16,
                    .num_heads = 2,
                    .q_lora_rank = lora ? 8 : 0,
                    .kv_lora_rank = 6,
                    .qk_head_dim = 4,
                    .qk_pos_emb_head_dim = 4,
                    .v_head_dim = 6,
                    .seq_length = 6,
                    .qk_layernorm = norm,
                    .norm_eps = 1e-6f};
}

constexpr double kTolF32 = 1e-4;
constexpr double kTolBf16 = 4e-2;

TEST(MlaAttention, MatchesFloat64ReferenceF32WithQLora) {
    check_against_reference(small_shape(true, true), DType::kF32, kTolF32);
}

TEST(MlaAttention, MatchesFloat64ReferenceF32WithoutQLora) {
    check_against_reference(small_shape(false, true), DType::kF32, kTolF32);
}

TEST(MlaAttention, MatchesFloat64ReferenceF32WithoutNorms) {
    check_against_reference(small_shape(true, false), DType::kF32, kTolF32);
    check_against_reference(small_shape(false, false), DType::kF32, kTolF32);
}

TEST(MlaAttention, MatchesFloat64ReferenceBf16WithQLora) {
    check_against_reference(small_shape(true, true), DType::kBF16, kTolBf16);
}

TEST(MlaAttention, MatchesFloat64ReferenceBf16WithoutQLora) {
    check_against_reference(small_shape(false, true), DType::kBF16, kTolBf16);
}

// Finite differences of the f32 layer itself on every parameter and on x.
void check_finite_differences(const MlaShape& s) {
    MlaFixture f(s, 2, DType::kF32);
    const MlaFixture::Result res = f.run();
    const auto loss = [&] { return f.loss(); };
    expect_gradient_matches("dx", f.x.data<float>(), res.dx.data<float>(), f.x.numel(), loss);
    for (Param* p : f.weights()) {
        Tensor g = p->main_grad.clone();
        expect_gradient_matches(p->name, p->master.data<float>(), g.data<float>(), g.numel(), loss);
    }
}

TEST(MlaAttention, GradientsMatchFiniteDifferencesWithQLora) {
    check_finite_differences(small_shape(true, true));
}

TEST(MlaAttention, GradientsMatchFiniteDifferencesWithoutQLora) {
    check_finite_differences(small_shape(false, true));
}

TEST(MlaAttention, ParameterNamesAreMegatrons) {
    std::vector<std::string> lora, plain;
    for (auto [lora_on, names] : {std::pair{true, &lora}, std::pair{false, &plain}}) {
        MlaShape s = small_shape(lora_on, true);
        MlaParams p = make_mla_params(s, DType::kBF16, "decoder.layers.0.");
        std::vector<Param*> all;
        collect_mla_params(s, p, all);
        for (const Param* q : all)
            names->push_back(q->name);
    }
    const std::string sa = "decoder.layers.0.self_attention.";
    EXPECT_EQ(lora, (std::vector<std::string>{
                        sa + "linear_q_down_proj.weight", sa + "linear_q_up_proj.weight",
                        sa + "linear_q_up_proj.layer_norm_weight",
                        sa + "linear_kv_down_proj.weight", sa + "linear_kv_up_proj.weight",
                        sa + "linear_kv_up_proj.layer_norm_weight", sa + "linear_proj.weight"}));
    EXPECT_EQ(plain, (std::vector<std::string>{
                         sa + "linear_q_proj.weight", sa + "linear_q_proj.layer_norm_weight",
                         sa + "linear_kv_down_proj.weight", sa + "linear_kv_up_proj.weight",
                         sa + "linear_kv_up_proj.layer_norm_weight", sa + "linear_proj.weight"}));
}

TEST(MlaAttention, SavedBytesMatchTheArena) {
    // The memory estimate's formula equals what forward and dgrad allocate in `saved`.
    for (bool lora : {true, false}) {
        for (bool norm : {true, false}) {
            const MlaShape s = small_shape(lora, norm);
            MlaFixture f(s, 2, DType::kBF16);
            MlaContext ctx;
            Tensor out = Tensor::zeros(f.x.shape(), DType::kF32);
            Tensor xin = f.input();
            Arena saved("saved", 1 << 20);
            mla_forward(s, f.params, f.rope, xin, out, ctx, saved, f.scratch);
            const size_t after_forward = saved.bytes_in_use();
            Tensor dx = Tensor::zeros(f.x.shape(), DType::kF32);
            mla_backward_dgrad(s, f.params, f.rope, f.r, dx, ctx, saved, f.scratch);
            const MlaSavedBytes b = mla_saved_bytes(s, 2, 2);
            // The arena pads each tensor to its alignment: at most 64 bytes per tensor.
            EXPECT_NEAR(static_cast<double>(after_forward), b.forward, 12 * 64)
                << "lora " << lora << " norm " << norm;
            EXPECT_NEAR(static_cast<double>(saved.bytes_in_use() - after_forward), b.dgrad, 6 * 64)
                << "lora " << lora << " norm " << norm;
        }
    }
}

TEST(MlaAttention, DgradThenWgradEqualsImmediateWgradBitwise) {
    // wgrad reads only what dgrad saved: run later, after the scratch arena was reused, it gives
    // the same bits (the overlap schedule's delayed wgrad relies on it).
    const MlaShape s = small_shape(true, true);
    MlaFixture a(s, 2, DType::kBF16), b(s, 2, DType::kBF16);
    for (MlaFixture* f : {&a, &b}) {
        MlaContext ctx;
        Tensor out = Tensor::zeros(f->x.shape(), DType::kF32);
        Tensor xin = f->input();
        mla_forward(s, f->params, f->rope, xin, out, ctx, f->saved, f->scratch);
        Tensor dx = Tensor::zeros(f->x.shape(), DType::kF32);
        Arena scratch("s");
        mla_backward_dgrad(s, f->params, f->rope, f->r, dx, ctx, f->saved, scratch);
        if (f == &b) {
            scratch.reset();
            Tensor junk = scratch.alloc({4096}, DType::kF32);
            fill_normal(junk, 9, 0.0f, 1.0f);
        }
        mla_backward_wgrad(s, f->params, /*fusion=*/false, ctx, scratch);
    }
    std::vector<Param*> pa = a.weights(), pb = b.weights();
    for (size_t i = 0; i < pa.size(); ++i) {
        EXPECT_EQ(0, std::memcmp(pa[i]->main_grad.raw(), pb[i]->main_grad.raw(),
                                 pa[i]->main_grad.nbytes()))
            << pa[i]->name;
    }
}

TEST(MlaAttention, OddPositionalWidthIsRefusedNamingTheField) {
    MlaShape s = small_shape(true, true);
    s.qk_pos_emb_head_dim = 3;
    try {
        make_mla_params(s, DType::kBF16, "");
        FAIL() << "an odd qk_pos_emb_head_dim was accepted";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("qk_pos_emb_head_dim"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace epo::model
