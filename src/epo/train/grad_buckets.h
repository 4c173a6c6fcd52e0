// Gradient buckets for ddp.overlap_grad_reduce: which parameters' data-parallel all-reduce goes
// together, and at which model position of the last backward it may fire (schedule.h).
//
// Like Megatron-Core's DDP buckets, a bucket collects gradients in the order the backward
// finishes them (output layer and final norm, layers L-1 down to 0, embedding) until it holds
// at least bucket_size bytes of fp32 gradient; the last bucket ends at the embedding. A model
// position is never split: its gradients are all final at the same moment (the end of its
// backward node), so a finer split would not let anything fire earlier.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace epo::train {

// The position at which each bucket closes, in firing order (ScheduleShape::grad_bucket_ends).
// `bytes_at(position)` is the gradient bytes the position's bucket entry would hold.
// `bucket_bytes` must be positive.
std::vector<int> grad_bucket_ends(int num_layers, const std::function<int64_t(int)>& bytes_at,
                                  int64_t bucket_bytes);
// The same over a pipeline stage's positions in backward order (schedule::stage_positions): the
// last bucket ends at the last position.
std::vector<int> grad_bucket_ends(const std::vector<int>& positions,
                                  const std::function<int64_t(int)>& bytes_at,
                                  int64_t bucket_bytes);

}  // namespace epo::train
