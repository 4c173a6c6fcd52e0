#include "epo/config/harness.h"

#include <fmt/format.h>

#include <algorithm>

#include "epo/core/error.h"

namespace epo::config {
namespace {

template <class T, class U>
void set_if(const std::optional<T>& given, U& field) {
    if (given) {
        field = *given;
    }
}

// Step 1: the reference harness's _set_moe_a2a_overlap_overrides.
void apply_a2a_overlap(Config& config, const HarnessOverrides& o) {
    if (!o.moe_a2a_overlap.value_or(false)) {
        return;
    }
    if (!config.comm_overlap) {
        config.comm_overlap.emplace();
        config.comm_overlap->tp_comm_overlap = config.model.tensor_model_parallel_size > 1;
    }
    config.comm_overlap->overlap_moe_expert_parallel_comm = true;
    config.comm_overlap->delay_wgrad_compute = true;
    config.model.moe_shared_expert_overlap = false;
}

// --num_layers with a per-layer moe_layer_freq keeps the leading dense layers and makes the rest
// MoE layers; an integer frequency stays as it is.
void apply_num_layers(ModelConfig& m, int num_layers) {
    if (num_layers < 1 || num_layers > kMaxNumLayers) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("--num_layers {} is outside 1..{}", num_layers, kMaxNumLayers));
    }
    if (auto* list = std::get_if<std::vector<int>>(&m.moe_layer_freq)) {
        const int num_dense = static_cast<int>(std::count(list->begin(), list->end(), 0));
        if (num_dense > num_layers) {
            throw Error(ErrorKind::kUsage,
                        fmt::format("--num_layers {} is smaller than the model's {} dense layers "
                                    "(model.moe_layer_freq); set model.moe_layer_freq too",
                                    num_layers, num_dense));
        }
        std::vector<int> rebuilt(num_layers, 1);
        std::fill(rebuilt.begin(), rebuilt.begin() + num_dense, 0);
        *list = std::move(rebuilt);
    }
    m.num_layers = num_layers;
}

}  // namespace

std::vector<Finding> apply_harness_overrides(Config& config, const HarnessOverrides& o,
                                             const DeviceProbe& probe) {
    ModelConfig& m = config.model;
    apply_a2a_overlap(config, o);

    set_if(o.num_nodes, config.comm.num_nodes);
    set_if(o.gpus_per_node, config.comm.gpus_per_node);
    set_if(o.max_steps, config.train.train_iters);

    if (o.tensor_model_parallel_size) {
        m.tensor_model_parallel_size = *o.tensor_model_parallel_size;
        m.sequence_parallel = *o.tensor_model_parallel_size > 1;
    }
    set_if(o.pipeline_model_parallel_size, m.pipeline_model_parallel_size);
    set_if(o.context_parallel_size, m.context_parallel_size);
    set_if(o.virtual_pipeline_model_parallel_size, m.virtual_pipeline_model_parallel_size);
    set_if(o.expert_model_parallel_size, m.expert_model_parallel_size);
    set_if(o.expert_tensor_parallel_size, m.expert_tensor_parallel_size);

    set_if(o.global_batch_size, config.train.global_batch_size);
    set_if(o.micro_batch_size, config.train.micro_batch_size);
    set_if(o.seq_length, m.seq_length);
    set_if(o.hidden_size, m.hidden_size);
    if (o.num_layers) {
        apply_num_layers(m, *o.num_layers);
    }
    set_if(o.num_moe_experts, m.num_moe_experts);

    std::vector<Finding> warnings;
    if (o.moe_flex_dispatcher_backend) {
        if (!o.moe_flex_dispatcher_backend->has_value()) {
            m.moe_flex_dispatcher_backend.reset();
            m.moe_token_dispatcher_type = DispatcherType::kAlltoall;
        } else {
            const DeviceProbe device = probe ? probe : table_probe(config.env.gpu);
            warnings =
                apply_flex_dispatcher_backend(m, **o.moe_flex_dispatcher_backend, device).warnings;
        }
    }
    return warnings;
}

}  // namespace epo::config
