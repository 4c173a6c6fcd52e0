// Stopping a run at the first NaN or Inf, naming the step and the parameter.
//
// As in the reference, every step checks the loss and the global gradient norm. The norm sums
// every gradient, so one NaN or Inf anywhere makes it non-finite; then, before the gradients are
// cleared, each rank finds its first parameter (in optimizer order: dense, then expert) whose
// gradient holds one, and the run stops with an error naming the step, the values and, per rank,
// that parameter.
#pragma once

#include <string>
#include <vector>

#include "epo/comm/communicator.h"
#include "epo/core/error.h"
#include "epo/tensor/param.h"

namespace epo::train {

// The name of the first parameter whose main_grad holds a NaN or an Inf in the elements this rank
// reduced (`reduced[i]` of params[i]: its shard with the distributed optimizer, else all of it);
// "" when none does.
std::string first_nonfinite_grad(const std::vector<Param*>& params,
                                 const std::vector<comm::ShardRange>& reduced);

// The kNumerics error for a step whose loss or gradient norm is not finite. `grad_names[r]` is
// rank r's first_nonfinite_grad.
Error nonfinite_step_error(int64_t step, double lm_loss, double grad_norm,
                           const std::vector<std::string>& grad_names);

}  // namespace epo::train
