// One MoE layer forward and backward from seeded random data, written as a safetensors file so
// anyone can check our numbers against another framework (the `epo moe-layer` command).
//
//   weights  ~ N(0, init_std) (moe_layer.h), expert bias ~ N(0, 0.1) when enabled (non-zero so
//            that a checker sees whether it is used for selection only)
//   x, dy    ~ N(0, 1), rounded to the activation dtype
//   loss     L = sum(y * dy) + aux_loss + z_loss   (loss_grad_scale 1)
// Dumped, all f32: x [T,H], dy [T,H], router.weight [E,H], router.expert_bias [E] (when used),
// experts.fc1.weight [E,2F,H] (rows 0..F-1 gate, F..2F-1 up), experts.fc2.weight [E,H,F],
// shared.fc1.weight [2S,H], shared.fc2.weight [H,S] (when used), y [T,H], aux_loss [],
// z_loss [], dx [T,H], and <weight>.grad for every weight. Weights are the values the kernels
// used: the bf16 compute copies (widened) in bf16 mode, except an fp32 router's fp32 master.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "epo/moe/moe_layer.h"

namespace epo::moe {

struct MoeLayerDumpOptions {
    MoeConfig cfg;
    std::int64_t tokens = 0;
    std::int64_t num_sequences = 1;
    std::uint64_t seed = 0;
    float init_std = 0.02f;
    std::string path;                             // the safetensors file to write
    std::map<std::string, std::string> metadata;  // added to the file's __metadata__
};

struct MoeLayerDumpResult {
    MoeLosses losses;
    int num_tensors = 0;
    std::int64_t num_dropped = 0;  // token slots dropped by capacity
};

MoeLayerDumpResult run_moe_layer_dump(const MoeLayerDumpOptions& options);

}  // namespace epo::moe
