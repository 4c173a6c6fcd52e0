#include "epo/model/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "epo/kernels/activation.h"
#include "epo/kernels/gemm.h"
#include "epo/kernels/rows.h"
#include "epo/model/rmsnorm.h"
#include "epo/moe/weight_grad.h"

namespace epo::model {
namespace {

using kernels::Matrix;

// A (rows, cols) block of a row-major tensor with `ld` elements per row, starting at element
// offset `first`.
Matrix block(const Tensor& t, int64_t first, int64_t rows, int64_t cols, int64_t ld) {
    return Matrix{static_cast<char*>(t.raw()) + first * static_cast<int64_t>(dtype_size(t.dtype())),
                  t.dtype(), rows, cols, ld};
}

int64_t qkv_width(const AttentionShape& s) {
    return (s.num_heads + 2 * s.num_groups) * s.head_dim;
}

// Copies columns [first_col, first_col + width) of every row of src (T, src_ld) f32 into dst
// (T, width) f32.
void gather_cols(const float* src, int64_t src_ld, int64_t first_col, int64_t width, int64_t rows,
                 float* dst) {
    for (int64_t t = 0; t < rows; ++t) {
        std::copy_n(src + t * src_ld + first_col, width, dst + t * width);
    }
}

// Writes src (T, width) f32 into columns [first_col, first_col + width) of dst (T, dst_ld),
// rounded to dst's dtype.
void scatter_cols(const float* src, int64_t width, int64_t rows, const Tensor& dst, int64_t dst_ld,
                  int64_t first_col) {
    const size_t es = dtype_size(dst.dtype());
    for (int64_t t = 0; t < rows; ++t) {
        kernels::store_row(src + t * width,
                           static_cast<char*>(dst.raw()) + (t * dst_ld + first_col) * es,
                           dst.dtype(), width);
    }
}

// Columns [first_col, first_col + width) of src (T, src_ld) f32 into dst (T, width), rounded to
// dst's dtype.
void scatter_cols_from(const float* src, int64_t src_ld, int64_t first_col, int64_t width,
                       int64_t rows, const Tensor& dst) {
    const size_t es = dtype_size(dst.dtype());
    for (int64_t t = 0; t < rows; ++t) {
        kernels::store_row(src + t * src_ld + first_col,
                           static_cast<char*>(dst.raw()) + t * width * es, dst.dtype(), width);
    }
}

// Queries or keys: optional qk-norm then rope, from columns of qkv (T, qkv_ld) f32, into `out`
// (T, heads d) compute dtype. Saves the pre-norm values and rstd when normalizing.
void prepare_heads(const AttentionShape& s, const Param* norm, const RopeTable& rope,
                   const float* qkv, int64_t qkv_ld, int64_t first_col, int64_t heads,
                   int64_t tokens, const Tensor& out, Tensor& pre, Tensor& rstd, Arena& saved,
                   Arena& scratch) {
    const int64_t width = heads * s.head_dim;
    Tensor buf = scratch.alloc({tokens, width}, DType::kF32);
    if (norm != nullptr) {
        pre = saved.alloc({tokens * heads, s.head_dim}, DType::kF32);
        rstd = saved.alloc({tokens * heads}, DType::kF32);
        gather_cols(qkv, qkv_ld, first_col, width, tokens, pre.data<float>());
        rmsnorm_forward(pre, *norm, s.norm_eps, buf.view({tokens * heads, s.head_dim}), rstd);
    } else {
        gather_cols(qkv, qkv_ld, first_col, width, tokens, buf.data<float>());
    }
    rope_apply(rope, buf.data<float>(), tokens, width, 0, heads, /*inverse=*/false);
    scatter_cols(buf.data<float>(), width, tokens, out, width, 0);
}

// One head's probabilities p (S, S) compute dtype = causal_softmax(q k^T * scale), with
// scores (S, S) f32 as workspace. The forward and core_attn's recompute both call it, so the
// recomputed P has the forward's bits.
void head_probs(const Matrix& q, const Matrix& k, float scale, const Tensor& scores, char* p,
                DType p_type, std::vector<float>& row) {
    kernels::gemm(q, k, kernels::as_matrix(scores), {.trans_b = true});
    causal_softmax(scores.data<float>(), scale, q.rows, p, p_type, row);
}

}  // namespace

void causal_softmax(const float* scores, float scale, int64_t S, void* p, DType p_type,
                    std::vector<float>& row) {
    const size_t es = dtype_size(p_type);
    for (int64_t i = 0; i < S; ++i) {
        const float* si = scores + i * S;
        // max_j (si[j] * scale) = max_j si[j] * scale exactly: scale > 0 and rounding is
        // monotonic.
        const float max_v = kernels::row_max(si, i + 1) * scale;
        const float sum = kernels::exp_shifted_sum(si, scale, max_v, row.data(), i + 1);
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j <= i; ++j)
            row[j] *= inv;
        for (int64_t j = i + 1; j < S; ++j)
            row[j] = 0.0f;
        kernels::store_row(row.data(), static_cast<char*>(p) + i * S * es, p_type, S);
    }
}

AttentionParams make_attention_params(const AttentionShape& s, DType compute_dtype,
                                      const std::string& prefix) {
    AttentionParams p;
    p.qkv = make_param(prefix + "self_attention.linear_qkv.weight", {qkv_width(s), s.hidden},
                       compute_dtype);
    p.proj = make_param(prefix + "self_attention.linear_proj.weight",
                        {s.hidden, s.num_heads * s.head_dim}, compute_dtype);
    if (s.qk_layernorm) {
        p.q_norm =
            make_param(prefix + "self_attention.q_layernorm.weight", {s.head_dim}, DType::kF32);
        p.k_norm =
            make_param(prefix + "self_attention.k_layernorm.weight", {s.head_dim}, DType::kF32);
    }
    return p;
}

void attention_forward(const AttentionShape& s, const AttentionParams& params,
                       const RopeTable& rope, const Tensor& x, const Tensor& out_acc,
                       AttentionContext& ctx, Arena& saved, Arena& scratch) {
    const int64_t T = x.dim(0), S = s.seq_length, B = T / S, A = s.num_heads, G = s.num_groups,
                  d = s.head_dim, W = qkv_width(s);
    EPO_CHECK(T % S == 0 && A % G == 0, "attention: {} tokens, seq {}, heads {}, groups {}", T, S,
              A, G);
    const DType cd = x.dtype();
    ctx.x = x;

    // qkv projection in f32, then per-head preparation.
    Tensor qkv = scratch.alloc({T, W}, DType::kF32);
    kernels::gemm(kernels::as_matrix(x), kernels::as_matrix(params.qkv.compute),
                  kernels::as_matrix(qkv), {.trans_b = true});
    ctx.q = saved.alloc({T, A * d}, cd);
    ctx.k = saved.alloc({T, G * d}, cd);
    ctx.v = saved.alloc({T, G * d}, cd);
    prepare_heads(s, s.qk_layernorm ? &params.q_norm : nullptr, rope, qkv.data<float>(), W, 0, A, T,
                  ctx.q, ctx.q_pre, ctx.q_rstd, saved, scratch);
    prepare_heads(s, s.qk_layernorm ? &params.k_norm : nullptr, rope, qkv.data<float>(), W, A * d,
                  G, T, ctx.k, ctx.k_pre, ctx.k_rstd, saved, scratch);
    scatter_cols_from(qkv.data<float>(), W, (A + G) * d, G * d, T, ctx.v);

    // Core attention per sequence and head. Recomputed, each head's P lives in one scratch
    // (S, S) buffer until its context product.
    ctx.probs = s.recompute_core_attn ? Tensor() : saved.alloc({B, A, S, S}, cd);
    Tensor head_p = s.recompute_core_attn ? scratch.alloc({S, S}, cd) : Tensor();
    ctx.ctx = saved.alloc({T, A * d}, cd);
    Tensor scores = scratch.alloc({S, S}, DType::kF32);
    std::vector<float> row(static_cast<size_t>(S));
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const int64_t heads_per_group = A / G;
    const size_t es = dtype_size(cd);
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t h = 0; h < A; ++h) {
            const int64_t g = h / heads_per_group;
            const Matrix q = block(ctx.q, b * S * A * d + h * d, S, d, A * d);
            const Matrix k = block(ctx.k, b * S * G * d + g * d, S, d, G * d);
            const Matrix v = block(ctx.v, b * S * G * d + g * d, S, d, G * d);
            char* p = s.recompute_core_attn
                          ? static_cast<char*>(head_p.raw())
                          : static_cast<char*>(ctx.probs.raw()) + ((b * A + h) * S * S) * es;
            head_probs(q, k, scale, scores, p, cd, row);
            kernels::gemm(Matrix{p, cd, S, S, S}, v,
                          block(ctx.ctx, b * S * A * d + h * d, S, d, A * d));
        }
    }

    // Output projection, accumulated into the residual stream.
    kernels::gemm(kernels::as_matrix(ctx.ctx), kernels::as_matrix(params.proj.compute),
                  kernels::as_matrix(out_acc), {.trans_b = true, .accumulate = true});
}

void attention_backward_dgrad(const AttentionShape& s, AttentionParams& params,
                              const RopeTable& rope, const Tensor& dout, const Tensor& dx,
                              AttentionContext& ctx, Arena& saved, Arena& scratch) {
    // T and the dtype from q: the input x may have been recomputed away (layernorm recompute).
    const int64_t T = ctx.q.dim(0), S = s.seq_length, B = T / S, A = s.num_heads, G = s.num_groups,
                  d = s.head_dim, W = qkv_width(s);
    const DType cd = ctx.q.dtype();
    const size_t es = dtype_size(cd);

    ctx.dout = saved.alloc({T, s.hidden}, cd);
    for (int64_t t = 0; t < T; ++t) {
        kernels::store_row(dout.data<float>() + t * s.hidden,
                           static_cast<char*>(ctx.dout.raw()) + t * s.hidden * es, cd, s.hidden);
    }
    Tensor dctx = scratch.alloc({T, A * d}, cd);
    kernels::gemm(kernels::as_matrix(ctx.dout), kernels::as_matrix(params.proj.compute),
                  kernels::as_matrix(dctx));

    Tensor dq = scratch.alloc({T, A * d}, DType::kF32);
    Tensor dk = scratch.alloc({T, G * d}, DType::kF32);
    Tensor dv = scratch.alloc({T, G * d}, DType::kF32);
    Tensor dp = scratch.alloc({S, S}, DType::kF32);
    Tensor ds = scratch.alloc({S, S}, cd);
    // core_attn recompute: each head's P again, from q and k, into scratch.
    const bool recompute = !ctx.probs.defined();
    Tensor head_p = recompute ? scratch.alloc({S, S}, cd) : Tensor();
    Tensor scores = recompute ? scratch.alloc({S, S}, DType::kF32) : Tensor();
    std::vector<float> prow(static_cast<size_t>(S)), srow(static_cast<size_t>(S));
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const int64_t heads_per_group = A / G;
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t h = 0; h < A; ++h) {
            const int64_t g = h / heads_per_group;
            const bool first_in_group = h % heads_per_group == 0;
            const Matrix q = block(ctx.q, b * S * A * d + h * d, S, d, A * d);
            const Matrix k = block(ctx.k, b * S * G * d + g * d, S, d, G * d);
            const Matrix v = block(ctx.v, b * S * G * d + g * d, S, d, G * d);
            const Matrix dc = block(dctx, b * S * A * d + h * d, S, d, A * d);
            char* p = recompute ? static_cast<char*>(head_p.raw())
                                : static_cast<char*>(ctx.probs.raw()) + ((b * A + h) * S * S) * es;
            if (recompute)
                head_probs(q, k, scale, scores, p, cd, prow);
            const Matrix pm{p, cd, S, S, S};
            kernels::gemm(dc, v, kernels::as_matrix(dp), {.trans_b = true});
            for (int64_t i = 0; i < S; ++i) {
                kernels::load_row(p + i * S * es, cd, prow.data(), S);
                const float* dpi = dp.data<float>() + i * S;
                const float dot = kernels::dot16(prow.data(), dpi, i + 1);
                for (int64_t j = 0; j < S; ++j)
                    srow[j] = prow[j] * (dpi[j] - dot) * scale;
                kernels::store_row(srow.data(), static_cast<char*>(ds.raw()) + i * S * es, cd, S);
            }
            const Matrix dsm = kernels::as_matrix(ds);
            kernels::gemm(dsm, k, block(dq, b * S * A * d + h * d, S, d, A * d));
            kernels::gemm(dsm, q, block(dk, b * S * G * d + g * d, S, d, G * d),
                          {.trans_a = true, .accumulate = !first_in_group});
            kernels::gemm(pm, dc, block(dv, b * S * G * d + g * d, S, d, G * d),
                          {.trans_a = true, .accumulate = !first_in_group});
        }
    }

    // Inverse rope, qk-norm backward, then assemble dqkv in the compute dtype.
    rope_apply(rope, dq.data<float>(), T, A * d, 0, A, /*inverse=*/true);
    rope_apply(rope, dk.data<float>(), T, G * d, 0, G, /*inverse=*/true);
    if (s.qk_layernorm) {
        Tensor dq_pre = scratch.alloc_zeros({T * A, d}, DType::kF32);
        Tensor dk_pre = scratch.alloc_zeros({T * G, d}, DType::kF32);
        Tensor dw = scratch.alloc({d}, DType::kF32);
        rmsnorm_backward(ctx.q_pre, params.q_norm, ctx.q_rstd, dq.view({T * A, d}), dq_pre, dw);
        rmsnorm_backward(ctx.k_pre, params.k_norm, ctx.k_rstd, dk.view({T * G, d}), dk_pre, dw);
        dq = dq_pre.view({T, A * d});
        dk = dk_pre.view({T, G * d});
    }
    ctx.dqkv = saved.alloc({T, W}, cd);
    scatter_cols(dq.data<float>(), A * d, T, ctx.dqkv, W, 0);
    scatter_cols(dk.data<float>(), G * d, T, ctx.dqkv, W, A * d);
    scatter_cols(dv.data<float>(), G * d, T, ctx.dqkv, W, (A + G) * d);

    kernels::gemm(kernels::as_matrix(ctx.dqkv), kernels::as_matrix(params.qkv.compute),
                  kernels::as_matrix(dx));
}

void attention_backward_wgrad(AttentionParams& params, bool fusion, AttentionContext& ctx,
                              Arena& scratch) {
    const int64_t workspace = std::max(params.proj.master.numel(), params.qkv.master.numel());
    Tensor ws = fusion ? Tensor() : scratch.alloc({workspace}, DType::kF32);
    moe::accumulate_weight_grad(kernels::as_matrix(ctx.dout), kernels::as_matrix(ctx.ctx),
                                kernels::as_matrix(params.proj.main_grad), /*trans_a=*/true,
                                /*trans_b=*/false, fusion, ws);
    moe::accumulate_weight_grad(kernels::as_matrix(ctx.dqkv), kernels::as_matrix(ctx.x),
                                kernels::as_matrix(params.qkv.main_grad), /*trans_a=*/true,
                                /*trans_b=*/false, fusion, ws);
}

}  // namespace epo::model
