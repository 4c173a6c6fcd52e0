// Param: one trainable parameter as the whole project holds it (mixed precision, as in
// Megatron-Core's distributed optimizer):
//   master     fp32, the weight the optimizer updates;
//   compute    the copy the kernels read: bf16 (rounded to nearest even from master) in bf16
//              mode; in fp32 mode it is the master itself (same storage);
//   main_grad  fp32, where weight gradients accumulate over micro-batches (the reference's
//              main_grad); the optimizer reads it and zero_grad() clears it.
// After changing master, the optimizer calls refresh_compute(), which rewrites compute and bumps
// `version`; anything derived from compute (for example oneDNN-packed copies of expert weights)
// compares the version and rebuilds itself when it is stale.
//
// Storage is owned and allocated once, when the parameter is made (large tensors on huge pages,
// see Tensor::empty).
#pragma once

#include <cstdint>
#include <string>

#include "epo/tensor/tensor.h"

namespace epo {

struct Param {
    std::string name;  // e.g. "experts.fc1.weight"
    Tensor master;     // f32, shape of the parameter
    Tensor compute;    // compute dtype, same shape (aliases master in fp32 mode)
    Tensor main_grad;  // f32, same shape
    std::uint64_t version = 0;

    const Shape& shape() const { return master.shape(); }
    DType compute_dtype() const { return compute.dtype(); }
};

// Master and main_grad are zero; compute matches master. compute_dtype: kF32 or kBF16.
Param make_param(std::string name, const Shape& shape, DType compute_dtype);

// compute = round_to_compute_dtype(master); ++version. In fp32 mode only the version changes.
void refresh_compute(Param& p);

// compute[begin, end) = round(master[begin, end)), for the distributed optimizer's own shard
// (flat element range); the version is left to whoever completes the rest of compute.
void refresh_compute_range(Param& p, int64_t begin, int64_t end);

// main_grad = 0.
void zero_grad(Param& p);

}  // namespace epo
