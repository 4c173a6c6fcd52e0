// Token embedding: a lookup into the (V, H) table.
//
//   forward   x[t] = W[token[t]]                        (the compute copy, widened to f32)
//   backward  dW[token[t]] += dx[t]   for t ascending   (straight into main_grad: the order is
//                                                       fixed, so repeated tokens accumulate
//                                                       the same way in every schedule)
//
// Letters: T tokens, V vocabulary, H hidden.
#pragma once

#include <cstdint>
#include <span>

#include "epo/tensor/param.h"

namespace epo::model {

// x (T, H) f32. A token outside [0, V) raises epo::Error naming it.
void embedding_forward(const Param& table, std::span<const int32_t> tokens, const Tensor& x);
void embedding_backward(Param& table, std::span<const int32_t> tokens, const Tensor& dx);

}  // namespace epo::model
