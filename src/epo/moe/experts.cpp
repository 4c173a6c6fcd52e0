#include "epo/moe/experts.h"

#include <algorithm>
#include <cstring>

#include "epo/kernels/activation.h"
#include "epo/moe/weight_grad.h"

namespace epo::moe {
namespace {

using kernels::as_matrix;
using kernels::GemmOptions;
using kernels::Matrix;
using kernels::sub_rows;

// One FFN's weights as matrices: W1 [2F, H], W2 [H, F], their main_grad slices, and the packed
// copies when used.
struct Ffn {
    Matrix w1, w2, g1, g2;
    const kernels::PackedMatrix* fc1_fwd = nullptr;
    const kernels::PackedMatrix* fc2_fwd = nullptr;
    const kernels::PackedMatrix* fc1_dgrad = nullptr;
    const kernels::PackedMatrix* fc2_dgrad = nullptr;
};

Matrix slice(const Tensor& t, std::int64_t e) {  // t [E, rows, cols] -> matrix e
    const std::int64_t rows = t.dim(1), cols = t.dim(2);
    return sub_rows(as_matrix(t, t.dim(0) * rows, cols), e * rows, rows);
}

Ffn expert_ffn(const ExpertWeights& w, std::int64_t e) {
    Ffn f{slice(w.fc1.compute, e), slice(w.fc2.compute, e), slice(w.fc1.main_grad, e),
          slice(w.fc2.main_grad, e)};
    if (w.use_packed) {
        const PackedFfnWeights& p = *w.packed;
        const auto i = static_cast<std::size_t>(e);
        f.fc1_fwd = &p.fc1_fwd[i];
        f.fc2_fwd = &p.fc2_fwd[i];
        f.fc1_dgrad = &p.fc1_dgrad[i];
        f.fc2_dgrad = &p.fc2_dgrad[i];
    }
    return f;
}

Ffn shared_ffn(const SharedExpertWeights& w) {
    return Ffn{as_matrix(w.fc1.compute), as_matrix(w.fc2.compute), as_matrix(w.fc1.main_grad),
               as_matrix(w.fc2.main_grad)};
}

void pack_all(std::vector<kernels::PackedMatrix>& dst, const Tensor& weight, bool trans) {
    const std::int64_t e_count = weight.dim(0);
    if (dst.size() != static_cast<std::size_t>(e_count)) {
        dst.clear();
        for (std::int64_t e = 0; e < e_count; ++e) {
            dst.push_back(kernels::pack_b(slice(weight, e), trans));
        }
        return;
    }
    for (std::int64_t e = 0; e < e_count; ++e) {
        kernels::repack_b(dst[static_cast<std::size_t>(e)], slice(weight, e), trans);
    }
}

// Rebuilds the packed copies whose Param changed since they were made.
void ensure_packed(const ExpertWeights& w) {
    if (!w.use_packed) {
        return;
    }
    PackedFfnWeights& p = *w.packed;
    if (p.fc1_version != w.fc1.version || p.fc1_fwd.empty()) {
        pack_all(p.fc1_fwd, w.fc1.compute, true);
        pack_all(p.fc1_dgrad, w.fc1.compute, false);
        p.fc1_version = w.fc1.version;
    }
    if (p.fc2_version != w.fc2.version || p.fc2_fwd.empty()) {
        pack_all(p.fc2_fwd, w.fc2.compute, true);
        pack_all(p.fc2_dgrad, w.fc2.compute, false);
        p.fc2_version = w.fc2.version;
    }
}

// C = A op(W) with W plain (trans as given) or packed (transpose already applied).
void weight_gemm(const Matrix& a, const Matrix& w, bool trans_w,
                 const kernels::PackedMatrix* packed, const Matrix& c) {
    const GemmOptions row_tiles{false, false, false, /*row_tiles=*/true};
    if (packed) {
        kernels::gemm(a, *packed, c, row_tiles);
    } else {
        kernels::gemm(a, w, c, GemmOptions{false, trans_w, false, true});
    }
}

void zero_rows(const Matrix& m, std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r) {
        std::memset(
            static_cast<char*>(m.data) + static_cast<std::size_t>(r * m.ld) * dtype_size(m.dtype),
            0, static_cast<std::size_t>(m.cols) * dtype_size(m.dtype));
    }
}

// Rows [off, off + n) of an FFN, padded to off + np.
struct Rows {
    std::int64_t off, n, np;
};

// The FFN runs tile by tile (the row tiles its products are computed in anyway), so a tile's h
// and a are still in cache for the activation and the second product; the calls, and so the
// bits, are those of whole-segment products.
void ffn_forward(const Ffn& f, Rows r, const ExpertsContext& ctx, const float* probs,
                 const Tensor& y) {
    const Matrix x = sub_rows(as_matrix(ctx.x), r.off, r.n);
    const Matrix h = sub_rows(as_matrix(ctx.h), r.off, r.n);
    const Matrix a = sub_rows(as_matrix(ctx.a), r.off, r.np);
    const Matrix ym = sub_rows(as_matrix(y), r.off, r.np);
    const float* p = probs ? probs + r.off : nullptr;
    kernels::for_each_row_tile(r.n, [&](std::int64_t m0, std::int64_t n) {
        const Matrix ht = sub_rows(h, m0, n), at = sub_rows(a, m0, n);
        weight_gemm(sub_rows(x, m0, n), f.w1, true, f.fc1_fwd, ht);  // h = x W1^T
        kernels::swiglu_forward(ht, p ? p + m0 : nullptr, at);
        weight_gemm(at, f.w2, true, f.fc2_fwd, sub_rows(ym, m0, n));  // y = a W2^T
    });
    zero_rows(a, r.n, r.np);   // the wgrad reduction runs over the padded rows
    zero_rows(ym, r.n, r.np);  // outputs are fully defined
}

// The forward's h (with_h) and a again, into ctx.h / ctx.a (allocated by the caller), tile by
// tile as ffn_forward computes them: the same products and kernel calls, so the same bits.
void ffn_recompute(const Ffn& f, Rows r, const ExpertsContext& ctx, const float* probs,
                   bool with_h) {
    const Matrix x = sub_rows(as_matrix(ctx.x), r.off, r.n);
    const Matrix h = sub_rows(as_matrix(ctx.h), r.off, r.n);
    const Matrix a = sub_rows(as_matrix(ctx.a), r.off, r.np);
    const float* p = probs ? probs + r.off : nullptr;
    kernels::for_each_row_tile(r.n, [&](std::int64_t m0, std::int64_t n) {
        const Matrix ht = sub_rows(h, m0, n);
        if (with_h)
            weight_gemm(sub_rows(x, m0, n), f.w1, true, f.fc1_fwd, ht);  // h = x W1^T
        kernels::swiglu_forward(ht, p ? p + m0 : nullptr, sub_rows(a, m0, n));
    });
    zero_rows(a, r.n, r.np);
}

// da_tile: scratch for one row tile of da = dy W2 ([kGemmRowTile or fewer rows, F]).
void ffn_dgrad(const Ffn& f, Rows r, const ExpertsContext& ctx, const float* probs,
               const Tensor& da_tile, const Tensor& dx, float* dprobs, bool dx_accumulate) {
    const Matrix dy = sub_rows(as_matrix(ctx.dy), r.off, r.n);
    const Matrix h = sub_rows(as_matrix(ctx.h), r.off, r.n);
    const Matrix dh = sub_rows(as_matrix(ctx.dh), r.off, r.np);
    const Matrix dxm = sub_rows(as_matrix(dx), r.off, r.np);
    const float* p = probs ? probs + r.off : nullptr;
    float* dp = dprobs ? dprobs + r.off : nullptr;
    kernels::for_each_row_tile(r.n, [&](std::int64_t m0, std::int64_t n) {
        const Matrix da = sub_rows(as_matrix(da_tile), 0, n), dht = sub_rows(dh, m0, n);
        weight_gemm(sub_rows(dy, m0, n), f.w2, false, f.fc2_dgrad, da);  // da = dy W2
        kernels::swiglu_backward(sub_rows(h, m0, n), p ? p + m0 : nullptr, da, dht,
                                 dp ? dp + m0 : nullptr);
        if (!dx_accumulate) {
            weight_gemm(dht, f.w1, false, f.fc1_dgrad, sub_rows(dxm, m0, n));  // dx = dh W1
        }
    });
    zero_rows(dh, r.n, r.np);
    if (dx_accumulate) {  // shared expert: dx_acc += dh W1, one product over all rows
        kernels::gemm(sub_rows(dh, 0, r.n), f.w1, sub_rows(dxm, 0, r.n),
                      GemmOptions{false, false, true, false});
        return;
    }
    zero_rows(dxm, r.n, r.np);
    if (dprobs) {
        std::fill(dprobs + r.off + r.n, dprobs + r.off + r.np, 0.0f);
    }
}

void ffn_wgrad(const Ffn& f, Rows r, const ExpertsContext& ctx, bool fusion,
               const Tensor& workspace) {
    if (r.np == 0) {
        return;
    }
    // dW2 [H, F] += dy^T [H, Rp] a [Rp, F];  dW1 [2F, H] += dh^T [2F, Rp] x [Rp, H]
    accumulate_weight_grad(sub_rows(as_matrix(ctx.dy), r.off, r.np),
                           sub_rows(as_matrix(ctx.a), r.off, r.np), f.g2, true, false, fusion,
                           workspace);
    accumulate_weight_grad(sub_rows(as_matrix(ctx.dh), r.off, r.np),
                           sub_rows(as_matrix(ctx.x), r.off, r.np), f.g1, true, false, fusion,
                           workspace);
}

Rows expert_rows(const ExpertSegments& s, std::int64_t e) {
    return Rows{s.offsets[static_cast<std::size_t>(e)], s.counts[static_cast<std::size_t>(e)],
                s.padded_count(e)};
}

// Scratch for non-fused weight gradients: one [rows, cols] f32 product at a time.
Tensor wgrad_workspace(std::int64_t elements, bool fusion, Arena& arena) {
    return fusion ? Tensor() : arena.alloc({elements}, DType::kF32);
}

std::int64_t per_expert_elements(const ExpertWeights& w) {
    const std::int64_t e_count = w.fc1.shape()[0];
    return std::max(w.fc1.shape().numel(), w.fc2.shape().numel()) / e_count;
}

void start_backward(ExpertsContext& ctx, const Tensor& dy, Arena& arena) {
    check_tensor(dy, ctx.x.shape(), ctx.x.dtype(), "experts dy");
    ctx.dy = dy;
    ctx.dh = arena.alloc(ctx.h.shape(), ctx.h.dtype());
}

// Scratch for one row tile of da (ffn_dgrad): [rows, F] (h is [rows, 2F]; a may be recomputed
// away).
Tensor da_tile(const ExpertsContext& ctx, Arena& arena) {
    return arena.alloc({std::min(kernels::kGemmRowTile, ctx.h.dim(0)), ctx.h.dim(1) / 2},
                       ctx.h.dtype());
}

// Recomputed buffers of the context, from `scratch`: h (kAll) and a.
void alloc_recomputed(ExpertsContext& ctx, std::int64_t f2, DType dt, Arena& scratch) {
    const std::int64_t rp = ctx.x.dim(0);
    if (ctx.recompute == FfnRecompute::kAll)
        ctx.h = scratch.alloc({rp, f2}, dt);
    ctx.a = scratch.alloc({rp, f2 / 2}, dt);
}

}  // namespace

ExpertWeights make_expert_weights(std::int64_t num_experts, std::int64_t hidden, std::int64_t ffn,
                                  DType compute_dtype) {
    ExpertWeights w;
    w.fc1 = make_param("experts.fc1.weight", {num_experts, 2 * ffn, hidden}, compute_dtype);
    w.fc2 = make_param("experts.fc2.weight", {num_experts, hidden, ffn}, compute_dtype);
    return w;
}

SharedExpertWeights make_shared_expert_weights(std::int64_t hidden, std::int64_t ffn,
                                               DType compute_dtype) {
    SharedExpertWeights w;
    w.fc1 = make_param("shared.fc1.weight", {2 * ffn, hidden}, compute_dtype);
    w.fc2 = make_param("shared.fc2.weight", {hidden, ffn}, compute_dtype);
    return w;
}

void experts_forward(const ExpertWeights& w, const ExpertSegments& segments, const Tensor& x,
                     const Tensor& probs, const Tensor& y, ExpertsContext& ctx, Arena& arena,
                     std::int64_t first_expert, FfnRecompute recompute, Arena* scratch) {
    const std::int64_t f2 = w.fc1.shape()[1], h = w.fc1.shape()[2];
    const std::int64_t e_count = segments.num_experts(), rp = segments.total_rows();
    const DType dt = w.fc1.compute_dtype();
    EPO_CHECK(first_expert >= 0 && first_expert + e_count <= w.fc1.shape()[0],
              "segments of experts [{}, {}) of {} expert weights", first_expert,
              first_expert + e_count, w.fc1.shape()[0]);
    check_tensor(x, {rp, h}, dt, "experts input x");
    check_tensor(probs, {rp}, DType::kF32, "experts probs");
    EPO_CHECK(y.shape() == Shape({rp, h}), "experts output y is {}, want [{}, {}]", y.shape().str(),
              rp, h);
    ensure_packed(w);
    ctx = ExpertsContext{};
    ctx.segments = segments;
    ctx.first_expert = first_expert;
    ctx.x = x;
    ctx.probs = probs;
    EPO_CHECK(recompute != FfnRecompute::kAll,
              "the routed experts recompute only their "
              "activation (moe_act); moe is not recomputed");
    EPO_CHECK(recompute == FfnRecompute::kNone || scratch != nullptr,
              "experts: recompute without a scratch arena");
    ctx.recompute = recompute;
    ctx.h = arena.alloc({rp, f2}, dt);
    ctx.a = recompute == FfnRecompute::kNone ? arena.alloc({rp, f2 / 2}, dt)
                                             : scratch->alloc({rp, f2 / 2}, dt);
    for (std::int64_t e = 0; e < e_count; ++e) {
        ffn_forward(expert_ffn(w, first_expert + e), expert_rows(segments, e), ctx,
                    probs.data<float>(), y);
    }
    drop_recomputed(ctx);
}

void experts_backward_dgrad(const ExpertWeights& w, const Tensor& dy, const Tensor& dx,
                            const Tensor& dprobs, ExpertsContext& ctx, Arena& arena) {
    const std::int64_t e_count = ctx.segments.num_experts();
    check_tensor(dx, ctx.x.shape(), ctx.x.dtype(), "experts dx");
    check_tensor(dprobs, {ctx.x.dim(0)}, DType::kF32, "experts dprobs");
    ensure_packed(w);
    start_backward(ctx, dy, arena);
    const Tensor da = da_tile(ctx, arena);
    for (std::int64_t e = 0; e < e_count; ++e) {
        ffn_dgrad(expert_ffn(w, ctx.first_expert + e), expert_rows(ctx.segments, e), ctx,
                  ctx.probs.data<float>(), da, dx, dprobs.data<float>(), false);
    }
    ctx.dgrad_done = true;
}

void experts_backward_wgrad(ExpertWeights& w, bool fusion, ExpertsContext& ctx, Arena& arena) {
    EPO_CHECK(ctx.dgrad_done, "experts wgrad before their dgrad");
    const std::int64_t e_count = ctx.segments.num_experts();
    Tensor workspace = wgrad_workspace(per_expert_elements(w), fusion, arena);
    const bool recompute = !ctx.a.defined();
    if (recompute) {  // moe_act: a = swiglu(h) again, from the kept h
        EPO_CHECK(ctx.recompute == FfnRecompute::kActivation,
                  "experts wgrad without their "
                  "activation");
        alloc_recomputed(ctx, ctx.h.dim(1), ctx.h.dtype(), arena);
        for (std::int64_t e = 0; e < e_count; ++e) {
            ffn_recompute(expert_ffn(w, ctx.first_expert + e), expert_rows(ctx.segments, e), ctx,
                          ctx.probs.data<float>(), /*with_h=*/false);
        }
    }
    for (std::int64_t e = 0; e < e_count; ++e) {
        ffn_wgrad(expert_ffn(w, ctx.first_expert + e), expert_rows(ctx.segments, e), ctx, fusion,
                  workspace);
    }
    if (recompute)
        drop_recomputed(ctx);
}

void experts_backward(ExpertWeights& w, bool fusion, const Tensor& dy, const Tensor& dx,
                      const Tensor& dprobs, ExpertsContext& ctx, Arena& arena) {
    experts_backward_dgrad(w, dy, dx, dprobs, ctx, arena);
    experts_backward_wgrad(w, fusion, ctx, arena);
}

void shared_expert_forward(const SharedExpertWeights& w, const Tensor& x, const Tensor& y,
                           ExpertsContext& ctx, Arena& arena, FfnRecompute recompute,
                           Arena* scratch) {
    const std::int64_t t_count = x.dim(0), f2 = w.fc1.shape()[0], h = w.fc1.shape()[1];
    const DType dt = w.fc1.compute_dtype();
    check_tensor(x, {t_count, h}, dt, "shared expert input x");
    check_tensor(y, {t_count, h}, DType::kF32, "shared expert output y");
    ctx = ExpertsContext{};
    const std::int64_t counts[1] = {t_count};
    ctx.segments = make_expert_segments(counts, 1);
    ctx.x = x;
    EPO_CHECK(recompute != FfnRecompute::kActivation, "the shared expert recomputes all or none");
    EPO_CHECK(recompute == FfnRecompute::kNone || scratch != nullptr,
              "shared expert: recompute without a scratch arena");
    ctx.recompute = recompute;
    if (recompute == FfnRecompute::kNone) {
        ctx.h = arena.alloc({t_count, f2}, dt);
        ctx.a = arena.alloc({t_count, f2 / 2}, dt);
    } else {
        alloc_recomputed(ctx, f2, dt, *scratch);
    }
    ffn_forward(shared_ffn(w), Rows{0, t_count, t_count}, ctx, nullptr, y);
    drop_recomputed(ctx);
}

void shared_expert_backward_dgrad(const SharedExpertWeights& w, const Tensor& dy,
                                  const Tensor& dx_acc, ExpertsContext& ctx, Arena& arena,
                                  Arena* scratch) {
    check_tensor(dx_acc, ctx.x.shape(), DType::kF32, "shared expert dx accumulator");
    const std::int64_t rows = ctx.x.dim(0);
    if (ctx.recompute == FfnRecompute::kAll) {  // h (and a, for a wgrad in this node) again
        EPO_CHECK(scratch != nullptr, "shared expert: recompute without a scratch arena");
        alloc_recomputed(ctx, w.fc1.shape()[0], w.fc1.compute_dtype(), *scratch);
        ffn_recompute(shared_ffn(w), Rows{0, rows, rows}, ctx, nullptr, /*with_h=*/true);
    }
    start_backward(ctx, dy, arena);
    const Tensor da = da_tile(ctx, arena);
    const std::int64_t t_count = ctx.x.dim(0);
    ffn_dgrad(shared_ffn(w), Rows{0, t_count, t_count}, ctx, nullptr, da, dx_acc, nullptr, true);
    ctx.dgrad_done = true;
}

void shared_expert_backward_wgrad(SharedExpertWeights& w, bool fusion, ExpertsContext& ctx,
                                  Arena& arena) {
    EPO_CHECK(ctx.dgrad_done, "shared expert wgrad before its dgrad");
    Tensor workspace =
        wgrad_workspace(std::max(w.fc1.shape().numel(), w.fc2.shape().numel()), fusion, arena);
    const std::int64_t t_count = ctx.x.dim(0);
    const bool recompute = !ctx.a.defined();
    if (recompute) {  // a delayed wgrad: h and a again, from x
        EPO_CHECK(ctx.recompute == FfnRecompute::kAll,
                  "shared expert wgrad without its "
                  "activation");
        alloc_recomputed(ctx, w.fc1.shape()[0], w.fc1.compute_dtype(), arena);
        ffn_recompute(shared_ffn(w), Rows{0, t_count, t_count}, ctx, nullptr, /*with_h=*/true);
    }
    ffn_wgrad(shared_ffn(w), Rows{0, t_count, t_count}, ctx, fusion, workspace);
    if (recompute)
        drop_recomputed(ctx);
}

void drop_recomputed(ExpertsContext& ctx) {
    if (ctx.recompute == FfnRecompute::kAll)
        ctx.h = Tensor();
    if (ctx.recompute != FfnRecompute::kNone)
        ctx.a = Tensor();
}

}  // namespace epo::moe
