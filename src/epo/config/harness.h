// The performance harness's overrides (docs/config.md "Where values come from"), as library
// functions that `epo validate`, `epo bench` and `epo train` share. Each field is "not given" when
// empty; the names are the reference harness's flags (`-tp`, `--moe_a2a_overlap`, ...).
//
// Applied in this fixed order (the reference's):
//   1. --moe_a2a_overlap true: comm_overlap.overlap_moe_expert_parallel_comm = true and
//      comm_overlap.delay_wgrad_compute = true, model.moe_shared_expert_overlap = false; a
//      missing comm_overlap section is created first with tp_comm_overlap = (TP > 1), TP being
//      the value before step 3. `false` (or not given) changes nothing.
//   2. topology (--num_nodes, --gpus_per_node) and --max_steps (train.train_iters);
//   3. parallel sizes: -tp (also sequence_parallel = TP > 1), -pp, -cp, -vp (None clears it),
//      -ep, -etp;
//   4. -gb, -mb, -sl; model shape: --hidden_size, --num_layers (a per-layer moe_layer_freq list
//      is rebuilt keeping its number of leading dense layers), --num_moe_experts;
//   5. --moe_flex_dispatcher_backend last: None forces alltoall with no backend; deepep/hybridep
//      run the activation step (devices.h) against the device probe.
#pragma once

#include <optional>
#include <string>
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
};

// Applies the overrides in the order above and returns the warnings of the flex activation step
// (W006-W008). `probe` defaults to the device named by config.env.gpu at that step. Raises
// kUsage for values the steps cannot apply (a --num_layers below the dense-layer count, or
// above kMaxNumLayers); other out-of-range sizes are left to the validator (VA001).
std::vector<Finding> apply_harness_overrides(Config& config, const HarnessOverrides& overrides,
                                             const DeviceProbe& probe = {});

}  // namespace epo::config
