// The performance harness's overrides (docs/config.md "Where values come from"), as library
// functions that `epo validate`, `epo bench` and `epo train` share. Each field is "not given" when
// empty; the names are the reference harness's flags (`-tp`, `--moe_a2a_overlap`, ...).
//
// Applied in this fixed order (the reference's):
//   1. --moe_a2a_overlap true: comm_overlap.overlap_moe_expert_parallel_comm = true and
//      comm_overlap.delay_wgrad_compute = true, model.moe_shared_expert_overlap = false; a
//      missing comm_overlap section is created first with tp_comm_overlap = (TP > 1), TP being
//      the value before step 3. `false` (or not given) changes nothing.
//   2. topology and --max_steps (train.train_iters): -g/--gpu sets env.gpu; --num_nodes and
//      -gn/--gpus_per_node set comm.*; -ng/--num_gpus N sets comm.gpus_per_node to -gn, else
//      the GPU family's count (h100, b200, b300: 8; gb200, gb300: 4, as the reference harness),
//      else the config's, and comm.num_nodes = ceil(N / per node). N must fill its nodes (N a
//      multiple of the per-node count) or fit one node (N below it: one node of N);
//      -c/--compute_dtype: bf16 sets model.bf16 (fp16 off); the FP8/FP4 recipes are refused;
//   3. parallel sizes: -tp (also sequence_parallel = TP > 1), -pp, -cp, -vp (None clears it),
//      -ep, -etp;
//   4. -gb, -mb, -sl; model shape: --hidden_size, --num_layers (a per-layer moe_layer_freq list
//      is rebuilt keeping its number of leading dense layers), --num_moe_experts;
//   5. recompute and CUDA graphs, as the reference harness: -rl/--recompute_num_layers N sets
//      full recompute, method block, N layers; --recompute_modules a,b sets those modules and
//      selective granularity; --cuda_graph_impl sets model.cuda_graph_impl; --cuda_graph_scope
//      a,b sets model.cuda_graph_modules (full_iteration: the local whole-iteration graph);
//   6. --moe_flex_dispatcher_backend last: None forces alltoall with no backend; deepep/hybridep
//      run the activation step (devices.h) against the device probe.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "epo/config/config.h"
#include "epo/config/devices.h"
#include "epo/config/finding.h"

namespace epo::config {

struct HarnessOverrides {
    std::optional<bool> moe_a2a_overlap;
    std::optional<int> num_nodes;
    std::optional<int> gpus_per_node;
    std::optional<int> max_steps;
    std::optional<int> tensor_model_parallel_size;
    std::optional<int> pipeline_model_parallel_size;
    std::optional<int> context_parallel_size;
    // Outer optional: given or not; inner: a size or None.
    std::optional<std::optional<int>> virtual_pipeline_model_parallel_size;
    std::optional<int> expert_model_parallel_size;
    std::optional<int> expert_tensor_parallel_size;
    std::optional<int> global_batch_size;
    std::optional<int> micro_batch_size;
    std::optional<int> seq_length;
    std::optional<int> hidden_size;
    std::optional<int> num_layers;
    std::optional<int> num_moe_experts;
    // Outer optional: given or not; inner: a backend name or None.
    std::optional<std::optional<std::string>> moe_flex_dispatcher_backend;
    // The reference harness's launch and precision flags (step 2).
    std::optional<int> num_gpus;
    std::optional<std::string> gpu;
    std::optional<std::string> compute_dtype;
    // Recompute and CUDA graphs (step 5); lists are the comma-separated flag values.
    std::optional<int> recompute_num_layers;
    std::optional<std::vector<std::string>> recompute_modules;
    std::optional<std::string> cuda_graph_impl;
    std::optional<std::vector<std::string>> cuda_graph_scope;
};

// A Megatron-LM flag and the configuration key it sets; a switch takes no value and sets true.
// The command line accepts each as an alias that overrides the key (docs/config.md).
struct MegatronFlag {
    const char* flag;  // "--expert-model-parallel-size"
    const char* key;   // "model.expert_model_parallel_size"
    bool is_switch = false;
};
const std::vector<MegatronFlag>& megatron_flags();

// GPUs per node of a GPU family when -gn is not given (the reference harness's table); null for
// a device it has no count for.
std::optional<int> default_gpus_per_node(std::string_view gpu);

// Applies the overrides in the order above and returns the warnings of the flex activation step
// (W006-W008). `probe` defaults to the device named by config.env.gpu at that step. Raises
// kUsage for values the steps cannot apply (a --num_layers below the dense-layer count, or
// above kMaxNumLayers; an unknown GPU; -ng that leaves a node part-filled; a compute dtype, a
// recompute module or a CUDA-graph scope EPO cannot honour), naming the flag, the value and the
// fix; other out-of-range sizes are left to the validator (VA001).
std::vector<Finding> apply_harness_overrides(Config& config, const HarnessOverrides& overrides,
                                             const DeviceProbe& probe = {});

}  // namespace epo::config
