#include "epo/model/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "epo/kernels/activation.h"
#include "epo/kernels/gemm.h"
#include "epo/kernels/rows.h"
#include "epo/model/attention.h"
#include "epo/model/rmsnorm.h"
#include "epo/moe/weight_grad.h"

namespace epo::model {
namespace {

using kernels::Matrix;

struct Dims {
    int64_t T, S, B, N, H, Rq, Rkv, Dn, Dr, Dq, Dv;
    int64_t q_in() const { return Rq > 0 ? Rq : H; }  // q_up's input width
    int64_t kv() const { return N * (Dn + Dv); }      // kv_up's output width
};

Dims dims_of(const MlaShape& s, int64_t tokens) {
    return Dims{.T = tokens,
                .S = s.seq_length,
                .B = tokens / s.seq_length,
                .N = s.num_heads,
                .H = s.hidden,
                .Rq = s.q_lora_rank,
                .Rkv = s.kv_lora_rank,
                .Dn = s.qk_head_dim,
                .Dr = s.qk_pos_emb_head_dim,
                .Dq = s.qk_head_dim + s.qk_pos_emb_head_dim,
                .Dv = s.v_head_dim};
}

// A (rows, cols) block of a row-major tensor with `ld` elements per row, from element `first`.
Matrix head_block(const Tensor& t, int64_t first, int64_t rows, int64_t cols, int64_t ld) {
    return Matrix{static_cast<char*>(t.raw()) + first * static_cast<int64_t>(dtype_size(t.dtype())),
                  t.dtype(), rows, cols, ld};
}

// Rounds columns [first_col, first_col + width) of src (T, src_ld) f32 into dst (T, width).
void round_cols(const float* src, int64_t src_ld, int64_t first_col, int64_t width, int64_t rows,
                const Tensor& dst) {
    const size_t es = dtype_size(dst.dtype());
    for (int64_t t = 0; t < rows; ++t) {
        kernels::store_row(src + t * src_ld + first_col,
                           static_cast<char*>(dst.raw()) + t * width * es, dst.dtype(), width);
    }
}

// MLA's rope on `num_vectors` positional vectors of width Dr per token of x (T, ld) f32, the
// v-th starting at column first_col + v * stride. Forward: reorder each vector to its even then
// its odd elements, then rotate; inverse: rotate back, then restore the order.
void mla_rope(const RopeTable& rope, float* x, int64_t tokens, int64_t ld, int64_t first_col,
              int64_t num_vectors, int64_t stride, bool inverse) {
    const int64_t Dr = rope.head_dim, half = Dr / 2;
    if (Dr == 0)
        return;
    std::vector<float> tmp(static_cast<size_t>(Dr));
    for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t v = 0; v < num_vectors; ++v) {
            float* p = x + t * ld + first_col + v * stride;
            if (!inverse) {
                for (int64_t i = 0; i < half; ++i) {
                    tmp[i] = p[2 * i];
                    tmp[half + i] = p[2 * i + 1];
                }
                std::copy(tmp.begin(), tmp.end(), p);
            }
        }
    }
    for (int64_t v = 0; v < num_vectors; ++v)
        rope_apply(rope, x, tokens, ld, first_col + v * stride, 1, inverse);
    if (!inverse)
        return;
    for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t v = 0; v < num_vectors; ++v) {
            float* p = x + t * ld + first_col + v * stride;
            for (int64_t i = 0; i < half; ++i) {
                tmp[2 * i] = p[i];
                tmp[2 * i + 1] = p[half + i];
            }
            std::copy(tmp.begin(), tmp.end(), p);
        }
    }
}

float softmax_scale(const Dims& d) {
    return 1.0f / std::sqrt(static_cast<float>(d.Dq));
}

// x (rows, width) f32 rounded into a new (rows, width) tensor of `dtype` in `arena`.
Tensor rounded(const Tensor& x, DType dtype, Arena& arena) {
    Tensor out = arena.alloc(x.shape(), dtype);
    kernels::store_row(x.data<float>(), out.raw(), dtype, x.numel());
    return out;
}

// q and k in the compute dtype from q32 (T, N Dq) f32 (rope applied), kv32 (T, N (Dn + Dv)) f32
// and kpe (T, Dr) f32 (rope applied); v from kv32.
void assemble_heads(const Dims& d, const Tensor& q32, const Tensor& kv32, const Tensor& kpe,
                    MlaContext& ctx) {
    const DType cd = ctx.q.dtype();
    const size_t es = dtype_size(cd);
    round_cols(q32.data<float>(), d.N * d.Dq, 0, d.N * d.Dq, d.T, ctx.q);
    std::vector<float> krow(static_cast<size_t>(d.N * d.Dq)), vrow(static_cast<size_t>(d.N * d.Dv));
    for (int64_t t = 0; t < d.T; ++t) {
        const float* kv = kv32.data<float>() + t * d.kv();
        for (int64_t h = 0; h < d.N; ++h) {
            const float* kvh = kv + h * (d.Dn + d.Dv);
            std::copy_n(kvh, d.Dn, krow.data() + h * d.Dq);
            std::copy_n(kpe.data<float>() + t * d.Dr, d.Dr, krow.data() + h * d.Dq + d.Dn);
            std::copy_n(kvh + d.Dn, d.Dv, vrow.data() + h * d.Dv);
        }
        kernels::store_row(krow.data(), static_cast<char*>(ctx.k.raw()) + t * d.N * d.Dq * es, cd,
                           d.N * d.Dq);
        kernels::store_row(vrow.data(), static_cast<char*>(ctx.v.raw()) + t * d.N * d.Dv * es, cd,
                           d.N * d.Dv);
    }
}

// Core attention per sequence and head: probs and ctx of the context.
void core_forward(const Dims& d, MlaContext& ctx, Arena& saved, Arena& scratch) {
    const DType cd = ctx.q.dtype();
    const size_t es = dtype_size(cd);
    ctx.probs = saved.alloc({d.B, d.N, d.S, d.S}, cd);
    ctx.ctx = saved.alloc({d.T, d.N * d.Dv}, cd);
    Tensor scores = scratch.alloc({d.S, d.S}, DType::kF32);  // (S, S)
    std::vector<float> row(static_cast<size_t>(d.S));
    const float scale = softmax_scale(d);
    const int64_t qw = d.N * d.Dq, vw = d.N * d.Dv;
    for (int64_t b = 0; b < d.B; ++b) {
        for (int64_t h = 0; h < d.N; ++h) {
            const Matrix q = head_block(ctx.q, b * d.S * qw + h * d.Dq, d.S, d.Dq, qw);
            const Matrix k = head_block(ctx.k, b * d.S * qw + h * d.Dq, d.S, d.Dq, qw);
            const Matrix v = head_block(ctx.v, b * d.S * vw + h * d.Dv, d.S, d.Dv, vw);
            kernels::gemm(q, k, kernels::as_matrix(scores), {.trans_b = true});
            char* p = static_cast<char*>(ctx.probs.raw()) + ((b * d.N + h) * d.S * d.S) * es;
            causal_softmax(scores.data<float>(), scale, d.S, p, cd, row);
            kernels::gemm(Matrix{p, cd, d.S, d.S, d.S}, v,
                          head_block(ctx.ctx, b * d.S * vw + h * d.Dv, d.S, d.Dv, vw));
        }
    }
}

// Core attention backward: dq32, dk32 (T, N Dq) f32 and dv32 (T, N Dv) f32 from dctx (T, N Dv).
void core_backward(const Dims& d, const MlaContext& ctx, const Tensor& dctx, const Tensor& dq32,
                   const Tensor& dk32, const Tensor& dv32, Arena& scratch) {
    const DType cd = ctx.q.dtype();
    const size_t es = dtype_size(cd);
    Tensor dp = scratch.alloc({d.S, d.S}, DType::kF32);  // (S, S)
    Tensor ds = scratch.alloc({d.S, d.S}, cd);           // (S, S)
    std::vector<float> prow(static_cast<size_t>(d.S)), srow(static_cast<size_t>(d.S));
    const float scale = softmax_scale(d);
    const int64_t qw = d.N * d.Dq, vw = d.N * d.Dv;
    for (int64_t b = 0; b < d.B; ++b) {
        for (int64_t h = 0; h < d.N; ++h) {
            const int64_t qo = b * d.S * qw + h * d.Dq, vo = b * d.S * vw + h * d.Dv;
            const Matrix q = head_block(ctx.q, qo, d.S, d.Dq, qw);
            const Matrix k = head_block(ctx.k, qo, d.S, d.Dq, qw);
            const Matrix v = head_block(ctx.v, vo, d.S, d.Dv, vw);
            const Matrix dc = head_block(dctx, vo, d.S, d.Dv, vw);
            char* p = static_cast<char*>(ctx.probs.raw()) + ((b * d.N + h) * d.S * d.S) * es;
            kernels::gemm(dc, v, kernels::as_matrix(dp), {.trans_b = true});
            // dS = P * (dP - rowsum(P * dP)) * scale
            for (int64_t i = 0; i < d.S; ++i) {
                kernels::load_row(p + i * d.S * es, cd, prow.data(), d.S);
                const float* dpi = dp.data<float>() + i * d.S;
                const float dot = kernels::dot16(prow.data(), dpi, i + 1);
                for (int64_t j = 0; j < d.S; ++j)
                    srow[j] = prow[j] * (dpi[j] - dot) * scale;
                kernels::store_row(srow.data(), static_cast<char*>(ds.raw()) + i * d.S * es, cd,
                                   d.S);
            }
            const Matrix dsm = kernels::as_matrix(ds);
            kernels::gemm(dsm, k, head_block(dq32, qo, d.S, d.Dq, qw));
            kernels::gemm(dsm, q, head_block(dk32, qo, d.S, d.Dq, qw), {.trans_a = true});
            kernels::gemm(Matrix{p, cd, d.S, d.S, d.S}, dc, head_block(dv32, vo, d.S, d.Dv, vw),
                          {.trans_a = true});
        }
    }
}

}  // namespace

void check_mla_shape(const MlaShape& s) {
    const auto positive = [](const char* field, int64_t v) {
        EPO_CHECK(v > 0, "multi-latent attention: {} = {} must be positive; set it in model", field,
                  v);
    };
    positive("hidden_size", s.hidden);
    positive("num_attention_heads", s.num_heads);
    positive("kv_lora_rank", s.kv_lora_rank);
    positive("qk_head_dim", s.qk_head_dim);
    positive("v_head_dim", s.v_head_dim);
    positive("seq_length", s.seq_length);
    EPO_CHECK(s.q_lora_rank >= 0,
              "multi-latent attention: q_lora_rank = {} must be positive or null", s.q_lora_rank);
    EPO_CHECK(s.qk_pos_emb_head_dim >= 0 && s.qk_pos_emb_head_dim % 2 == 0,
              "multi-latent attention: qk_pos_emb_head_dim = {} must be even (rope rotates pairs); "
              "set model.qk_pos_emb_head_dim to an even number",
              s.qk_pos_emb_head_dim);
}

MlaParams make_mla_params(const MlaShape& s, DType cd, const std::string& prefix) {
    check_mla_shape(s);
    const Dims d = dims_of(s, s.seq_length);
    const std::string sa = prefix + "self_attention.";
    MlaParams p;
    if (d.Rq > 0) {
        p.q_down = make_param(sa + "linear_q_down_proj.weight", {d.Rq, d.H}, cd);
        p.q_up = make_param(sa + "linear_q_up_proj.weight", {d.N * d.Dq, d.Rq}, cd);
    } else {
        p.q_up = make_param(sa + "linear_q_proj.weight", {d.N * d.Dq, d.H}, cd);
    }
    p.kv_down = make_param(sa + "linear_kv_down_proj.weight", {d.Rkv + d.Dr, d.H}, cd);
    p.kv_up = make_param(sa + "linear_kv_up_proj.weight", {d.kv(), d.Rkv}, cd);
    if (s.qk_layernorm) {
        // Megatron's spec fuses these norms into the up projections (TE's layer-norm linear).
        const std::string q_owner = d.Rq > 0 ? "linear_q_up_proj" : "linear_q_proj";
        p.q_norm = make_param(sa + q_owner + ".layer_norm_weight", {d.q_in()}, DType::kF32);
        p.kv_norm = make_param(sa + "linear_kv_up_proj.layer_norm_weight", {d.Rkv}, DType::kF32);
    }
    p.proj = make_param(sa + "linear_proj.weight", {d.H, d.N * d.Dv}, cd);
    return p;
}

void collect_mla_params(const MlaShape& s, MlaParams& p, std::vector<Param*>& out) {
    if (s.q_lora_rank > 0)
        out.push_back(&p.q_down);
    out.push_back(&p.q_up);
    if (s.qk_layernorm)
        out.push_back(&p.q_norm);
    out.push_back(&p.kv_down);
    out.push_back(&p.kv_up);
    if (s.qk_layernorm)
        out.push_back(&p.kv_norm);
    out.push_back(&p.proj);
}

std::vector<int64_t> mla_param_sizes(const MlaShape& s) {
    const Dims d = dims_of(s, s.seq_length);
    std::vector<int64_t> out;
    if (d.Rq > 0)
        out.push_back(d.Rq * d.H);         // linear_q_down_proj
    out.push_back(d.N * d.Dq * d.q_in());  // linear_q_up_proj / linear_q_proj
    if (s.qk_layernorm)
        out.push_back(d.q_in());          // its layer_norm_weight
    out.push_back((d.Rkv + d.Dr) * d.H);  // linear_kv_down_proj
    out.push_back(d.kv() * d.Rkv);        // linear_kv_up_proj
    if (s.qk_layernorm)
        out.push_back(d.Rkv);         // its layer_norm_weight
    out.push_back(d.H * d.N * d.Dv);  // linear_proj
    return out;
}

MlaSavedBytes mla_saved_bytes(const MlaShape& s, int64_t num_sequences, int64_t c) {
    const Dims d = dims_of(s, num_sequences * s.seq_length);
    const bool lora = d.Rq > 0, norm = s.qk_layernorm;
    int64_t per_token = 0;
    if (lora)
        per_token += c * d.Rq * (norm ? 2 : 1) + (norm ? 4 : 0);  // cq, qin, q_rstd
    else if (norm)
        per_token += c * d.H + 4;                              // qin = qnorm(x), q_rstd
    per_token += c * d.Rkv * (norm ? 2 : 1) + (norm ? 4 : 0);  // ckv, kvin, kv_rstd
    per_token += c * (2 * d.N * d.Dq + 2 * d.N * d.Dv);        // q, k, v, ctx
    MlaSavedBytes b;
    b.forward = d.T * per_token + c * d.B * d.N * d.S * d.S;  // + probs
    // dout, dq, dkv, dkv_down, dcq
    b.dgrad = d.T * c * (d.H + d.N * d.Dq + d.kv() + d.Rkv + d.Dr + (lora ? d.Rq : 0));
    return b;
}

void mla_forward(const MlaShape& s, const MlaParams& params, const RopeTable& rope, const Tensor& x,
                 const Tensor& out_acc, MlaContext& ctx, Arena& saved, Arena& scratch) {
    const Dims d = dims_of(s, x.dim(0));
    EPO_CHECK(d.T % d.S == 0, "multi-latent attention: {} tokens are not whole sequences of {}",
              d.T, d.S);
    EPO_CHECK(rope.head_dim == d.Dr, "multi-latent attention: rope table of width {}, needs {}",
              rope.head_dim, d.Dr);
    const DType cd = x.dtype();
    ctx.x = x;

    // 1. The queries' input: the normed q latent (lora), or x (normed with qk_layernorm).
    if (d.Rq > 0) {
        Tensor cq32 = scratch.alloc({d.T, d.Rq}, DType::kF32);  // (T, Rq)
        kernels::gemm(kernels::as_matrix(x), kernels::as_matrix(params.q_down.compute),
                      kernels::as_matrix(cq32), {.trans_b = true});
        ctx.cq = rounded(cq32, cd, saved);
        ctx.qin = ctx.cq;
    } else {
        ctx.qin = x;
    }
    if (s.qk_layernorm) {
        const Tensor pre = ctx.qin;
        ctx.qin = saved.alloc({d.T, d.q_in()}, cd);
        ctx.q_rstd = saved.alloc({d.T}, DType::kF32);
        rmsnorm_forward(pre, params.q_norm, s.norm_eps, ctx.qin, ctx.q_rstd);
    }
    Tensor q32 = scratch.alloc({d.T, d.N * d.Dq}, DType::kF32);  // (T, N Dq)
    kernels::gemm(kernels::as_matrix(ctx.qin), kernels::as_matrix(params.q_up.compute),
                  kernels::as_matrix(q32), {.trans_b = true});

    // 2. The kv latent and the shared positional key.
    const int64_t W = d.Rkv + d.Dr;
    Tensor ckv32 = scratch.alloc({d.T, W}, DType::kF32);  // (T, Rkv + Dr)
    kernels::gemm(kernels::as_matrix(x), kernels::as_matrix(params.kv_down.compute),
                  kernels::as_matrix(ckv32), {.trans_b = true});
    ctx.kvin = saved.alloc({d.T, d.Rkv}, cd);
    if (s.qk_layernorm) {
        ctx.ckv = saved.alloc({d.T, d.Rkv}, cd);
        round_cols(ckv32.data<float>(), W, 0, d.Rkv, d.T, ctx.ckv);
        ctx.kv_rstd = saved.alloc({d.T}, DType::kF32);
        rmsnorm_forward(ctx.ckv, params.kv_norm, s.norm_eps, ctx.kvin, ctx.kv_rstd);
    } else {
        round_cols(ckv32.data<float>(), W, 0, d.Rkv, d.T, ctx.kvin);
    }
    Tensor kv32 = scratch.alloc({d.T, d.kv()}, DType::kF32);  // (T, N (Dn + Dv))
    kernels::gemm(kernels::as_matrix(ctx.kvin), kernels::as_matrix(params.kv_up.compute),
                  kernels::as_matrix(kv32), {.trans_b = true});
    Tensor kpe = scratch.alloc({d.T, d.Dr}, DType::kF32);  // (T, Dr)
    for (int64_t t = 0; t < d.T; ++t)
        std::copy_n(ckv32.data<float>() + t * W + d.Rkv, d.Dr, kpe.data<float>() + t * d.Dr);

    // 3. Rope on the positional parts only, then the heads in the compute dtype.
    mla_rope(rope, q32.data<float>(), d.T, d.N * d.Dq, d.Dn, d.N, d.Dq, /*inverse=*/false);
    mla_rope(rope, kpe.data<float>(), d.T, d.Dr, 0, 1, d.Dr, /*inverse=*/false);
    ctx.q = saved.alloc({d.T, d.N * d.Dq}, cd);
    ctx.k = saved.alloc({d.T, d.N * d.Dq}, cd);
    ctx.v = saved.alloc({d.T, d.N * d.Dv}, cd);
    assemble_heads(d, q32, kv32, kpe, ctx);

    // 4. Core attention; 5. the output projection, accumulated into the residual stream.
    core_forward(d, ctx, saved, scratch);
    kernels::gemm(kernels::as_matrix(ctx.ctx), kernels::as_matrix(params.proj.compute),
                  kernels::as_matrix(out_acc), {.trans_b = true, .accumulate = true});
}

void mla_backward_dgrad(const MlaShape& s, MlaParams& params, const RopeTable& rope,
                        const Tensor& dout, const Tensor& dx, MlaContext& ctx, Arena& saved,
                        Arena& scratch) {
    const Dims d = dims_of(s, ctx.x.dim(0));
    const DType cd = ctx.x.dtype();

    // 1. Output projection and core attention.
    ctx.dout = saved.alloc({d.T, d.H}, cd);
    kernels::store_row(dout.data<float>(), ctx.dout.raw(), cd, d.T * d.H);
    Tensor dctx = scratch.alloc({d.T, d.N * d.Dv}, cd);  // (T, N Dv)
    kernels::gemm(kernels::as_matrix(ctx.dout), kernels::as_matrix(params.proj.compute),
                  kernels::as_matrix(dctx));
    Tensor dq32 = scratch.alloc({d.T, d.N * d.Dq}, DType::kF32);  // (T, N Dq)
    Tensor dk32 = scratch.alloc({d.T, d.N * d.Dq}, DType::kF32);  // (T, N Dq)
    Tensor dv32 = scratch.alloc({d.T, d.N * d.Dv}, DType::kF32);  // (T, N Dv)
    core_backward(d, ctx, dctx, dq32, dk32, dv32, scratch);

    // 2. Back through rope: the queries' positional parts, and the shared key's summed over
    // heads (ascending, so every schedule adds in the same order).
    mla_rope(rope, dq32.data<float>(), d.T, d.N * d.Dq, d.Dn, d.N, d.Dq, /*inverse=*/true);
    Tensor dkpe = scratch.alloc_zeros({d.T, d.Dr}, DType::kF32);  // (T, Dr)
    std::vector<float> dkv_row(static_cast<size_t>(d.kv()));
    ctx.dkv = saved.alloc({d.T, d.kv()}, cd);
    const size_t es = dtype_size(cd);
    for (int64_t t = 0; t < d.T; ++t) {
        const float* dk = dk32.data<float>() + t * d.N * d.Dq;
        const float* dv = dv32.data<float>() + t * d.N * d.Dv;
        float* dpe = dkpe.data<float>() + t * d.Dr;
        for (int64_t h = 0; h < d.N; ++h) {
            std::copy_n(dk + h * d.Dq, d.Dn, dkv_row.data() + h * (d.Dn + d.Dv));
            std::copy_n(dv + h * d.Dv, d.Dv, dkv_row.data() + h * (d.Dn + d.Dv) + d.Dn);
            for (int64_t i = 0; i < d.Dr; ++i)
                dpe[i] += dk[h * d.Dq + d.Dn + i];
        }
        kernels::store_row(dkv_row.data(), static_cast<char*>(ctx.dkv.raw()) + t * d.kv() * es, cd,
                           d.kv());
    }
    mla_rope(rope, dkpe.data<float>(), d.T, d.Dr, 0, 1, d.Dr, /*inverse=*/true);
    ctx.dq = rounded(dq32, cd, saved);

    // 3. The kv path: up projection, norm, and the down projection's output gradient.
    const int64_t W = d.Rkv + d.Dr;
    Tensor ws = scratch.alloc({std::max(d.q_in(), d.Rkv)}, DType::kF32);
    Tensor dkvin = scratch.alloc({d.T, d.Rkv}, DType::kF32);  // (T, Rkv)
    kernels::gemm(kernels::as_matrix(ctx.dkv), kernels::as_matrix(params.kv_up.compute),
                  kernels::as_matrix(dkvin));
    if (s.qk_layernorm) {
        Tensor dckv = scratch.alloc_zeros({d.T, d.Rkv}, DType::kF32);
        rmsnorm_backward(ctx.ckv, params.kv_norm, ctx.kv_rstd, dkvin, dckv, ws);
        dkvin = dckv;
    }
    ctx.dkv_down = saved.alloc({d.T, W}, cd);
    for (int64_t t = 0; t < d.T; ++t) {
        char* row = static_cast<char*>(ctx.dkv_down.raw()) + t * W * es;
        kernels::store_row(dkvin.data<float>() + t * d.Rkv, row, cd, d.Rkv);
        kernels::store_row(dkpe.data<float>() + t * d.Dr, row + d.Rkv * es, cd, d.Dr);
    }

    // 4. The query path into dx, then the kv path's share.
    const Tensor q_pre = d.Rq > 0 ? ctx.cq : ctx.x;  // the q norm's input
    if (d.Rq > 0) {
        Tensor dqin = scratch.alloc({d.T, d.Rq}, DType::kF32);  // (T, Rq)
        kernels::gemm(kernels::as_matrix(ctx.dq), kernels::as_matrix(params.q_up.compute),
                      kernels::as_matrix(dqin));
        if (s.qk_layernorm) {
            Tensor dcq = scratch.alloc_zeros({d.T, d.Rq}, DType::kF32);
            rmsnorm_backward(q_pre, params.q_norm, ctx.q_rstd, dqin, dcq, ws);
            dqin = dcq;
        }
        ctx.dcq = rounded(dqin, cd, saved);
        kernels::gemm(kernels::as_matrix(ctx.dcq), kernels::as_matrix(params.q_down.compute),
                      kernels::as_matrix(dx));
    } else if (s.qk_layernorm) {
        Tensor dqin = scratch.alloc({d.T, d.H}, DType::kF32);  // (T, H)
        kernels::gemm(kernels::as_matrix(ctx.dq), kernels::as_matrix(params.q_up.compute),
                      kernels::as_matrix(dqin));
        std::fill_n(dx.data<float>(), dx.numel(), 0.0f);
        rmsnorm_backward(q_pre, params.q_norm, ctx.q_rstd, dqin, dx, ws);
    } else {
        kernels::gemm(kernels::as_matrix(ctx.dq), kernels::as_matrix(params.q_up.compute),
                      kernels::as_matrix(dx));
    }
    kernels::gemm(kernels::as_matrix(ctx.dkv_down), kernels::as_matrix(params.kv_down.compute),
                  kernels::as_matrix(dx), {.accumulate = true});
}

void mla_backward_wgrad(const MlaShape& s, MlaParams& params, bool fusion, MlaContext& ctx,
                        Arena& scratch) {
    int64_t workspace = 0;
    for (const Param* p :
         {&params.q_down, &params.q_up, &params.kv_down, &params.kv_up, &params.proj}) {
        workspace = std::max(workspace, p->master.numel());
    }
    Tensor ws = fusion ? Tensor() : scratch.alloc({workspace}, DType::kF32);
    // dW += dY^T X for each projection Y = X W^T.
    const auto grad = [&](const Tensor& dy, const Tensor& in, Param& w) {
        moe::accumulate_weight_grad(kernels::as_matrix(dy), kernels::as_matrix(in),
                                    kernels::as_matrix(w.main_grad), /*trans_a=*/true,
                                    /*trans_b=*/false, fusion, ws);
    };
    grad(ctx.dout, ctx.ctx, params.proj);
    grad(ctx.dkv, ctx.kvin, params.kv_up);
    grad(ctx.dkv_down, ctx.x, params.kv_down);
    grad(ctx.dq, ctx.qin, params.q_up);
    if (s.q_lora_rank > 0)
        grad(ctx.dcq, ctx.x, params.q_down);
}

}  // namespace epo::model
