// Multi-token prediction (MTP, DeepSeek-V3 / Megatron-Core's MTP block with one layer): the
// parts of the MTP that are not a transformer layer. The model (gpt_model.h) runs them around
// the MTP's transformer layer, which is an ordinary layer position of its own (the last one), so
// that every schedule runs it like a decoder layer.
//
//   prologue (in the MTP layer's pre_dispatch):
//     h   = final_norm(x)                          the main model's hidden state (the decoder's
//                                                  final norm; the main head reads h too)
//     e   = embed(tokens shifted left by one)      the embedding position computes it (the same
//                                                  table, so its gradient stays at position -1)
//     u   = [enorm(e), hnorm(h)] Weh^T             (T, H): the MTP layer's input
//   the MTP layer:  y = layer(u)
//   head (in the output position): z = mtp_final_norm(y); loss_mtp = CE(z Wout^T, labels shifted
//     left by one), the last position of every sequence masked, averaged over the others
//   objective: lm_loss + (mtp_loss_scaling_factor / mtp_num_layers) loss_mtp
// backward of the prologue:
//   d[a, b] = du Weh  (a = enorm(e), b = hnorm(h));   dWeh += du^T [a, b]
//   de = enorm^T(da)  (to the embedding position);    dh += hnorm^T(db)  (dh already holds the
//   main head's gradient);   dx = final_norm^T(dh)
// The shift: token t of a sequence takes token t + 1's place; the last position gets token 0
// and no label, as Megatron-Core's roll_tensor does.
//
// The projection's weight gradient is never delayed (like the output layer's): it runs in the
// MTP layer's pre_dispatch backward, with the norms' (which have no separate weight gradient).
//
// Letters: T tokens (B sequences of S), H hidden.
#pragma once

#include <cstdint>
#include <vector>

#include "epo/tensor/arena.h"
#include "epo/tensor/param.h"

namespace epo::model {

// Megatron-Core's names: "mtp.layers.0." + enorm / hnorm / eh_proj / final_layernorm.
struct MtpParams {
    Param enorm;       // (H) "enorm.weight"
    Param hnorm;       // (H) "hnorm.weight"
    Param eh_proj;     // (H, 2H) "eh_proj.weight": columns [0, H) read enorm(e), [H, 2H) hnorm(h)
    Param final_norm;  // (H) "final_layernorm.weight"
};

MtpParams make_mtp_params(int64_t hidden, DType compute_dtype);
// In the order the model lists them (gpt_model.h params_at).
std::vector<Param*> mtp_param_list(MtpParams& p);

// One micro-batch's prologue activations, from the MTP layer's forward to its backward.
struct MtpState {
    Arena arena{"mtp activations"};
    size_t reported_bytes = 0;
    Tensor h;       // (T, H) compute dtype: final_norm(x), also the main head's input
    Tensor rstd_h;  // (T) f32: the final norm's
    Tensor cat;     // (T, 2H) compute dtype: [enorm(e), hnorm(h)], eh_proj's input
    Tensor rstd_e;  // (T) f32
    Tensor rstd_b;  // (T) f32: hnorm's
    Tensor u;       // (T, H) f32: eh_proj's output, the MTP layer's input
    Tensor dh;      // (T, H) f32: gradient of h (the output position writes the main head's)
    Tensor du;      // (T, H) f32: gradient of u (the MTP layer's input gradient)
};

// Tokens (or labels) shifted left by one within each sequence of `seq_length`; the last
// position of a sequence gets `fill`.
std::vector<int32_t> mtp_shift(const std::vector<int32_t>& values, int64_t seq_length,
                               int32_t fill);
// 1 for every position but the last of each sequence.
std::vector<uint8_t> mtp_loss_mask(int64_t tokens, int64_t seq_length);

// x (T, H) f32 the decoder's output, e (T, H) f32 the shifted tokens' embedding: fills h,
// rstd_h, cat, rstd_e, rstd_b and u (allocated in st.arena).
void mtp_prologue_forward(const Param& final_norm, const MtpParams& p, float eps, const Tensor& x,
                          const Tensor& e, MtpState& st, Arena& scratch);
// From st.du and st.dh (the main head's part of it): de (T, H) f32 = e's gradient, dx (T, H) f32
// = x's gradient (both overwritten); every prologue weight gradient into main_grad.
void mtp_prologue_backward(Param& final_norm, MtpParams& p, bool fusion, const Tensor& x,
                           const Tensor& e, MtpState& st, const Tensor& de, const Tensor& dx,
                           Arena& scratch);

// Bytes one micro-batch keeps for the MTP beyond its transformer layer and the main output
// state (c = compute dtype bytes, V vocabulary): the prologue state, e and its gradient, the MTP
// head's normed input, rstd, logit gradients and d_normed.
int64_t mtp_saved_bytes(int64_t tokens, int64_t hidden, int64_t vocab, int64_t c);

}  // namespace epo::model
