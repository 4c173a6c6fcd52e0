// Tensor parallelism's pieces (Megatron-Core's tensor_parallel package, learned from, not
// copied): the collectives around a tensor-parallel (TP) region, with and without sequence
// parallelism (SP), and the vocabulary-parallel embedding and output layer with their
// cross-entropy.
//
// A TP region is a column-parallel linear (its output features split over the TP ranks) followed
// by a row-parallel one (its input features split), e.g. attention's QKV then its output
// projection, or the MLP's fc1 then fc2. Around it:
//
//                    forward                                backward
//   tp_gather        SP: all-gather of the sequence shards   = tp_reduce of the gradient
//   (enter)          (T/n, C) -> (T, C), rows in rank order
//                    no SP: identity (a copy)
//   tp_reduce        SP: reduce-scatter of the partial sums  = tp_gather of the gradient
//   (leave)          (T, C) -> this rank's rows (T/n, C)
//                    no SP: all-reduce (T, C)
//
// The sums are the communicator's (communicator.h): fp32, in group-rank order, the same bits on
// every rank. Rank r's sequence shard is rows [r T / n, (r + 1) T / n) of the micro-batch's T
// tokens (T % n == 0: Megatron-Core requires the sequence to divide by TP under SP).
//
// Vocabulary-parallel embedding and output layer: TP rank r holds rows [r V / n, (r + 1) V / n)
// of the (V, H) table (V % n == 0; Megatron-Core pads the vocabulary to make it so).
//   embedding   partial[t] = W_r[token[t] - begin] if the token is in the rank's range, else 0;
//               x = tp_reduce(partial) (SP: the rank's sequence shard)
//               backward: dx_full = tp_gather(dx); dW_r[token - begin] += dx_full[t], t ascending
//   output      logits_r = h_full W_r^T (T, V/n), h_full = tp_gather(h) (the caller's);
//               per token, the max of the logits and the sum of exp(logit - max) over the whole
//               vocabulary by a max and a sum over the TP ranks, and the label's logit from the
//               rank that holds it (Megatron-Core's vocab_parallel_cross_entropy); every TP rank
//               computes the same loss. dlogits_r = softmax_r - onehot_r, scaled as lm_head.h.
//               backward: dh_partial = dlogits_r W_r (lm_head_backward_dgrad), then the caller's
//               tp_reduce; dW_r += dlogits_r^T h_full (lm_head_backward_wgrad).
// Weights: a column-parallel weight (out, in) is split by rows, a row-parallel one by columns, as
// Megatron-Core splits them; a fused weight made of blocks (SwiGLU's fc1 = [gate; up], GQA's
// qkv = [A query heads; G key heads; G value heads]) is split block by block, so rank r holds
// heads [r A / n, (r + 1) A / n) and groups [r G / n, (r + 1) G / n), and the layer functions
// (attention.h with A / n heads and G / n groups, experts.h's SwiGLU) run unchanged on the shard.
// Parameters that stay whole on every TP rank but see different tokens (sequence parallelism:
// the norms, the router) or different heads (the q/k norms) have their gradients summed over the
// TP group before the data-parallel reduction (Megatron-Core's finalize_model_grads).
//
// With n = 1 every function is the single-rank path (lm_head.h, embedding.h) but for where the
// sums of exp are taken, so the tests compare n > 1 with n = 1.
//
// Letters: T tokens of the micro-batch, n TP ranks, C channels, H hidden, V vocabulary.
#pragma once

#include <cstdint>
#include <span>

#include "epo/comm/communicator.h"
#include "epo/model/lm_head.h"
#include "epo/tensor/arena.h"
#include "epo/tensor/param.h"

namespace epo::model {

// [begin, end) of `total` rows that TP rank `rank` of `size` owns: a sequence shard (total = T) or
// a vocabulary shard (total = V). Raises epo::Error naming `field` when size does not divide total.
struct TpRange {
    int64_t begin = 0;
    int64_t end = 0;
    int64_t size() const { return end - begin; }
};
TpRange tp_range(int64_t total, int size, int rank, const char* field);

// shard = rank `rank`'s rows of `full` (f32 (R, C)): each block of `blocks` (row counts, summing
// to R) split into `size` equal parts, the rank's parts concatenated in block order.
void tp_copy_row_shard(const Tensor& full, std::span<const int64_t> blocks, int size, int rank,
                       const Tensor& shard);
// shard = columns [rank C / size, (rank + 1) C / size) of `full` (f32 (R, C)).
void tp_copy_column_shard(const Tensor& full, int size, int rank, const Tensor& shard);

// in (T/n, C) (SP) or (T, C), any dtype; out (T, C) of the same dtype.
void tp_gather(comm::Communicator& tp, bool sequence_parallel, const Tensor& in, const Tensor& out);
// partial (T, C) f32, overwritten; out (T/n, C) (SP) or (T, C) f32 (may be `partial` without SP).
void tp_reduce(comm::Communicator& tp, bool sequence_parallel, const Tensor& partial,
               const Tensor& out);

// table: this rank's (V/n, H) rows; x (T/n, H) (SP) or (T, H) f32; tokens: all T of the
// micro-batch. `scratch` holds the (T, H) partial sums. A token outside [0, vocab) raises
// epo::Error naming it.
void vocab_parallel_embedding_forward(comm::Communicator& tp, bool sequence_parallel,
                                      const Param& table, int64_t vocab,
                                      std::span<const int32_t> tokens, const Tensor& x,
                                      Arena& scratch);
// dx as x; adds into table.main_grad.
void vocab_parallel_embedding_backward(comm::Communicator& tp, bool sequence_parallel, Param& table,
                                       std::span<const int32_t> tokens, const Tensor& dx,
                                       Arena& scratch);

// weight: this rank's (V/n, H) rows; h_full (T, H) compute dtype (all T tokens); labels: all T.
// Returns the mean loss over the T tokens (over those loss_mask marks), the same on every TP
// rank. ctx.dlogits is this rank's (T, V/n); the backward is lm_head.h's dgrad / wgrad on it.
double vocab_parallel_lm_head_forward(comm::Communicator& tp, const Param& weight,
                                      const Tensor& h_full, std::span<const int32_t> labels,
                                      float grad_scale, LmHeadContext& ctx, Arena& saved,
                                      Arena& scratch, std::span<const uint8_t> loss_mask = {});

}  // namespace epo::model
