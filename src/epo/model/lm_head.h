// Output layer and language-model loss (cross-entropy over the vocabulary), fused so the (T, V)
// logits never exist in f32 all at once:
//
//   logits = h Wout^T                         (T, V) f32, computed kChunk rows at a time
//   loss   = mean_t ( logsumexp(logits[t]) - logits[t, label[t]] )
//   dlogits[t] = (softmax(logits[t]) - onehot(label[t])) * grad_scale / T    (compute dtype,
//                kept for the backward)
// backward, split as the overlap schedule needs it:
//   dgrad: dh = dlogits Wout                  (T, H) f32
//   wgrad: dWout += dlogits^T h               (into main_grad)
// The loss is summed in f64 in token order, so it is exact to print and compare.
// With a loss mask (multi-token prediction: mtp.h) only the tokens it marks count: the mean and
// the 1/T above run over them, and a masked token's dlogits row is zero (its label unread).
//
// Letters: T tokens, H hidden, V vocabulary.
#pragma once

#include <cstdint>
#include <span>

#include "epo/tensor/arena.h"
#include "epo/tensor/param.h"

namespace epo::model {

struct LmHeadContext {
    Tensor h;        // (T, H) compute dtype: final-norm output (a view the caller keeps alive)
    Tensor dlogits;  // (T, V) compute dtype
};

// Returns the mean loss over the T tokens (over those loss_mask marks, when given: T entries,
// 1 = counted; none marked gives 0). `grad_scale` is the factor the loss enters the optimized
// objective with (1 / number of micro-batches).
// The tokens a loss of T tokens averages over: all T, or those whose loss_mask entry is set.
// Checks that labels (and a non-empty loss_mask) have T entries.
int64_t loss_token_count(int64_t T, std::span<const int32_t> labels,
                         std::span<const uint8_t> loss_mask);

double lm_head_forward(const Param& weight, const Tensor& h, std::span<const int32_t> labels,
                       float grad_scale, LmHeadContext& ctx, Arena& saved, Arena& scratch,
                       std::span<const uint8_t> loss_mask = {});
void lm_head_backward_dgrad(const Param& weight, const LmHeadContext& ctx, const Tensor& dh);
void lm_head_backward_wgrad(Param& weight, bool fusion, const LmHeadContext& ctx, Arena& scratch);

}  // namespace epo::model
