#include "epo/model/mtp.h"

#include <cstring>

#include "epo/kernels/gemm.h"
#include "epo/kernels/rows.h"
#include "epo/model/rmsnorm.h"
#include "epo/moe/weight_grad.h"

namespace epo::model {
namespace {

// dst (T, 2H) rows = [left (T, H), right (T, H)], all of one dtype.
void mtp_concat_columns(const Tensor& left, const Tensor& right, const Tensor& dst) {
    const int64_t T = left.dim(0), H = left.dim(1);
    const size_t row = static_cast<size_t>(H) * dtype_size(dst.dtype());
    auto* out = static_cast<char*>(dst.raw());
    const auto* l = static_cast<const char*>(left.raw());
    const auto* r = static_cast<const char*>(right.raw());
    for (int64_t t = 0; t < T; ++t) {
        std::memcpy(out + 2 * t * row, l + t * row, row);
        std::memcpy(out + (2 * t + 1) * row, r + t * row, row);
    }
}

// left, right (T, H) = the column halves of src (T, 2H), all of one dtype.
void mtp_split_columns(const Tensor& src, const Tensor& left, const Tensor& right) {
    const int64_t T = left.dim(0), H = left.dim(1);
    const size_t row = static_cast<size_t>(H) * dtype_size(src.dtype());
    const auto* in = static_cast<const char*>(src.raw());
    auto* l = static_cast<char*>(left.raw());
    auto* r = static_cast<char*>(right.raw());
    for (int64_t t = 0; t < T; ++t) {
        std::memcpy(l + t * row, in + 2 * t * row, row);
        std::memcpy(r + t * row, in + (2 * t + 1) * row, row);
    }
}

}  // namespace

MtpParams make_mtp_params(int64_t hidden, DType compute_dtype) {
    const std::string prefix = "mtp.layers.0.";
    MtpParams p;
    p.enorm = make_param(prefix + "enorm.weight", {hidden}, DType::kF32);
    p.hnorm = make_param(prefix + "hnorm.weight", {hidden}, DType::kF32);
    p.eh_proj = make_param(prefix + "eh_proj.weight", {hidden, 2 * hidden}, compute_dtype);
    p.final_norm = make_param(prefix + "final_layernorm.weight", {hidden}, DType::kF32);
    return p;
}

std::vector<Param*> mtp_param_list(MtpParams& p) {
    return {&p.enorm, &p.hnorm, &p.eh_proj, &p.final_norm};
}

std::vector<int32_t> mtp_shift(const std::vector<int32_t>& values, int64_t seq_length,
                               int32_t fill) {
    EPO_CHECK(seq_length > 0 && static_cast<int64_t>(values.size()) % seq_length == 0,
              "{} values are not whole sequences of {}", values.size(), seq_length);
    std::vector<int32_t> out(values.size());
    for (size_t t = 0; t < values.size(); ++t) {
        const bool last =
            static_cast<int64_t>(t % static_cast<size_t>(seq_length)) == seq_length - 1;
        out[t] = last ? fill : values[t + 1];
    }
    return out;
}

std::vector<uint8_t> mtp_loss_mask(int64_t tokens, int64_t seq_length) {
    std::vector<uint8_t> mask(static_cast<size_t>(tokens));
    for (int64_t t = 0; t < tokens; ++t)
        mask[static_cast<size_t>(t)] = t % seq_length != seq_length - 1;
    return mask;
}

void mtp_prologue_forward(const Param& final_norm, const MtpParams& p, float eps, const Tensor& x,
                          const Tensor& e, MtpState& st, Arena& scratch) {
    const int64_t T = x.dim(0), H = x.dim(1);
    const DType cd = p.eh_proj.compute_dtype();
    Arena& ar = st.arena;
    st.h = ar.alloc({T, H}, cd);
    st.rstd_h = ar.alloc({T}, DType::kF32);
    rmsnorm_forward(x, final_norm, eps, st.h, st.rstd_h);
    const Tensor a = scratch.alloc({T, H}, cd);  // enorm(e)
    const Tensor b = scratch.alloc({T, H}, cd);  // hnorm(h)
    st.rstd_e = ar.alloc({T}, DType::kF32);
    st.rstd_b = ar.alloc({T}, DType::kF32);
    rmsnorm_forward(e, p.enorm, eps, a, st.rstd_e);
    rmsnorm_forward(st.h, p.hnorm, eps, b, st.rstd_b);
    st.cat = ar.alloc({T, 2 * H}, cd);
    mtp_concat_columns(a, b, st.cat);
    st.u = ar.alloc({T, H}, DType::kF32);
    kernels::gemm(kernels::as_matrix(st.cat), kernels::as_matrix(p.eh_proj.compute),
                  kernels::as_matrix(st.u), {.trans_b = true});
}

void mtp_prologue_backward(Param& final_norm, MtpParams& p, bool fusion, const Tensor& x,
                           const Tensor& e, MtpState& st, const Tensor& de, const Tensor& dx,
                           Arena& scratch) {
    const int64_t T = x.dim(0), H = x.dim(1);
    const DType cd = p.eh_proj.compute_dtype();
    // The projection: its output gradient as the GEMM operand (compute dtype), as the layers do.
    const Tensor du_c = scratch.alloc({T, H}, cd);
    kernels::store_row(st.du.data<float>(), du_c.raw(), cd, st.du.numel());
    const Tensor d_cat = scratch.alloc({T, 2 * H}, DType::kF32);
    kernels::gemm(kernels::as_matrix(du_c), kernels::as_matrix(p.eh_proj.compute),
                  kernels::as_matrix(d_cat));
    const Tensor ws_w = fusion ? Tensor() : scratch.alloc({p.eh_proj.master.numel()}, DType::kF32);
    moe::accumulate_weight_grad(kernels::as_matrix(du_c), kernels::as_matrix(st.cat),
                                kernels::as_matrix(p.eh_proj.main_grad), /*trans_a=*/true,
                                /*trans_b=*/false, fusion, ws_w);
    const Tensor da = scratch.alloc({T, H}, DType::kF32);
    const Tensor db = scratch.alloc({T, H}, DType::kF32);
    mtp_split_columns(d_cat, da, db);
    // The norms (each also adds its weight gradient). dh holds the main head's gradient: the
    // MTP's is added before the final norm's backward reads it.
    const Tensor ws = scratch.alloc({H}, DType::kF32);
    de.fill_zero();
    rmsnorm_backward(e, p.enorm, st.rstd_e, da, de, ws);
    rmsnorm_backward(st.h, p.hnorm, st.rstd_b, db, st.dh, ws);
    dx.fill_zero();
    rmsnorm_backward(x, final_norm, st.rstd_h, st.dh, dx, ws);
}

int64_t mtp_saved_bytes(int64_t tokens, int64_t hidden, int64_t vocab, int64_t c) {
    const int64_t T = tokens, H = hidden;
    const int64_t prologue =
        c * T * H + c * T * 2 * H + 4 * T * H * 3 + 4 * 3 * T;  // h cat u dh du
    const int64_t embedding = 2 * 4 * T * H;                    // e, de
    const int64_t head = c * T * H + 4 * T + c * T * vocab + 4 * T * H;
    return prologue + embedding + head;
}

}  // namespace epo::model
