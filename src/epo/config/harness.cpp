#include "epo/config/harness.h"

#include <fmt/format.h>

#include <algorithm>

#include "epo/config/devices.h"
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

// -c/--compute_dtype: the reference harness's precision recipes, each bf16 with Transformer
// Engine's fp8 on top as Bridge's mixed-precision recipe of that name sets it (epo plan models
// fp8; the CPU runtime refuses it, RT032). nvfp4 is refused: nothing here models FP4.
void apply_compute_dtype(ModelConfig& m, const std::string& dtype) {
    struct Recipe {
        std::string_view flag, fp8, fp8_recipe;
    };
    static constexpr Recipe kFp8[] = {
        {"fp8_cs", "hybrid", "tensorwise"},  // bf16_with_fp8_current_scaling_mixed
        {"fp8_mx", "e4m3", "mxfp8"},         // bf16_with_mxfp8_mixed
        {"fp8_sc", "hybrid", "blockwise"},   // bf16_with_fp8_subchannel_scaling_mixed
    };
    if (dtype == "nvfp4") {
        throw Error(ErrorKind::kUsage,
                    "-c/--compute_dtype nvfp4 selects Bridge's bf16_with_nvfp4_mixed; EPO does not "
                    "model FP4 compute, so it cannot honour it: use -c bf16 or an fp8 recipe "
                    "(fp8_cs, fp8_mx, fp8_sc)");
    }
    for (const Recipe& r : kFp8) {
        if (dtype == r.flag) {
            m.bf16 = true;
            m.fp16 = false;
            m.fp8 = std::string(r.fp8);
            m.fp8_recipe = std::string(r.fp8_recipe);
            return;
        }
    }
    if (dtype == "bf16") {
        m.bf16 = true;
        m.fp16 = false;
        m.fp8.reset();
        return;
    }
    throw Error(ErrorKind::kUsage,
                fmt::format("-c/--compute_dtype takes bf16, fp8_cs, fp8_mx, fp8_sc or nvfp4, got "
                            "'{}'",
                            dtype));
}

// Step 2's launch flags: -g names the device, -ng the GPUs, laid out on nodes of -gn (or the
// family's count) as the reference harness does: nodes = ceil(GPUs / per node).
void apply_launch(Config& config, const HarnessOverrides& o) {
    if (o.gpu) {
        const std::optional<DeviceInfo> device = find_device(*o.gpu);
        if (!device || device->is_cpu) {
            throw Error(ErrorKind::kUsage,
                        fmt::format("-g/--gpu '{}' is not a GPU EPO knows; known: {}", *o.gpu,
                                    known_device_list()));
        }
        config.env.gpu = device->id;
    }
    if (!o.num_gpus) {
        return;
    }
    const int gpus = *o.num_gpus;
    // -gn, else the config's stated count (unless -g names the family), else the family's.
    std::optional<int> per_node = o.gpus_per_node;
    if (!per_node && !o.gpu) {
        per_node = config.comm.gpus_per_node;
    }
    if (!per_node) {
        per_node = default_gpus_per_node(config.env.gpu);
    }
    if (gpus < 1) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("-ng/--num_gpus takes a positive count, got {}", gpus));
    }
    if (!per_node || *per_node < 1) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("-ng/--num_gpus {}: no GPUs per node known for env.gpu '{}'; give "
                                "-gn/--gpus_per_node N",
                                gpus, config.env.gpu));
    }
    if (gpus < *per_node) {
        config.comm.num_nodes = 1;
        config.comm.gpus_per_node = gpus;
        return;
    }
    if (gpus % *per_node != 0) {
        const int nodes = (gpus + *per_node - 1) / *per_node;
        throw Error(ErrorKind::kUsage,
                    fmt::format("-ng/--num_gpus {} on nodes of {} GPUs: the reference harness "
                                "launches ceil({} / {}) = {} nodes, {} ranks, so the world size "
                                "would not be the {} GPUs asked for; give -ng {} (a multiple of "
                                "{}) or -gn N dividing {}",
                                gpus, *per_node, gpus, *per_node, nodes, nodes * *per_node, gpus,
                                nodes * *per_node, *per_node, gpus));
    }
    if (o.num_nodes && *o.num_nodes != gpus / *per_node) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("--num_nodes {} contradicts -ng/--num_gpus {} on nodes of {} "
                                "GPUs ({} nodes); give one of them",
                                *o.num_nodes, gpus, *per_node, gpus / *per_node));
    }
    config.comm.num_nodes = gpus / *per_node;
    config.comm.gpus_per_node = *per_node;
}

template <ConfigEnum E>
E parse_flag_value(const char* flag, const std::string& text) {
    if (const auto value = parse_enum<E>(text)) {
        return *value;
    }
    throw Error(ErrorKind::kUsage,
                fmt::format("{} takes {}, got '{}'", flag, enum_choices<E>(), text));
}

// Step 5: the reference harness's _set_recompute_overrides and _set_cuda_graph_overrides.
void apply_recompute_and_graphs(ModelConfig& m, const HarnessOverrides& o) {
    if (o.recompute_num_layers) {
        m.recompute_granularity = RecomputeGranularity::kFull;
        m.recompute_method = RecomputeMethod::kBlock;
        m.recompute_num_layers = *o.recompute_num_layers;
    }
    if (o.recompute_modules) {
        std::vector<RecomputeModule> modules;
        for (const std::string& name : *o.recompute_modules) {
            modules.push_back(parse_flag_value<RecomputeModule>("--recompute_modules", name));
        }
        m.recompute_modules = std::move(modules);
        m.recompute_granularity = RecomputeGranularity::kSelective;
    }
    if (o.cuda_graph_impl) {
        m.cuda_graph_impl =
            parse_flag_value<CudaGraphImpl>("--cuda_graph_impl", *o.cuda_graph_impl);
    }
    if (!o.cuda_graph_scope) {
        return;
    }
    const std::vector<std::string>& scope = *o.cuda_graph_scope;
    if (m.cuda_graph_impl == CudaGraphImpl::kNone) {
        throw Error(ErrorKind::kUsage,
                    "--cuda_graph_scope needs a CUDA-graph implementation, but "
                    "model.cuda_graph_impl is none; add --cuda_graph_impl transformer_engine (or "
                    "local for full_iteration)");
    }
    if (std::find(scope.begin(), scope.end(), "full_iteration") != scope.end()) {
        if (scope.size() != 1 || m.cuda_graph_impl == CudaGraphImpl::kTransformerEngine) {
            throw Error(ErrorKind::kUsage,
                        "--cuda_graph_scope full_iteration stands alone and needs "
                        "--cuda_graph_impl local");
        }
        m.cuda_graph_modules.clear();
        m.cuda_graph_scope = std::string("full_iteration");
        return;
    }
    std::vector<CudaGraphModule> modules;
    for (const std::string& name : scope) {
        modules.push_back(parse_flag_value<CudaGraphModule>("--cuda_graph_scope", name));
    }
    m.cuda_graph_modules = std::move(modules);
    m.cuda_graph_scope.reset();
}

}  // namespace

// The flags a Megatron-LM launch script for an MoE model passes (pretrain_gpt.py's parallel
// sizes, model shape, MoE, batch, recompute and overlap flags) that name a field EPO has.
const std::vector<MegatronFlag>& megatron_flags() {
    static const std::vector<MegatronFlag> table = {
        {"--tensor-model-parallel-size", "model.tensor_model_parallel_size"},
        {"--pipeline-model-parallel-size", "model.pipeline_model_parallel_size"},
        {"--num-virtual-stages-per-pipeline-rank", "model.virtual_pipeline_model_parallel_size"},
        {"--context-parallel-size", "model.context_parallel_size"},
        {"--expert-model-parallel-size", "model.expert_model_parallel_size"},
        {"--expert-tensor-parallel-size", "model.expert_tensor_parallel_size"},
        {"--sequence-parallel", "model.sequence_parallel", true},
        {"--num-layers", "model.num_layers"},
        {"--hidden-size", "model.hidden_size"},
        {"--ffn-hidden-size", "model.ffn_hidden_size"},
        {"--num-attention-heads", "model.num_attention_heads"},
        {"--num-query-groups", "model.num_query_groups"},
        {"--kv-channels", "model.kv_channels"},
        {"--seq-length", "model.seq_length"},
        {"--num-experts", "model.num_moe_experts"},
        {"--moe-ffn-hidden-size", "model.moe_ffn_hidden_size"},
        {"--moe-shared-expert-intermediate-size", "model.moe_shared_expert_intermediate_size"},
        {"--moe-router-topk", "model.moe_router_topk"},
        {"--moe-router-score-function", "model.moe_router_score_function"},
        {"--moe-router-pre-softmax", "model.moe_router_pre_softmax", true},
        {"--moe-router-num-groups", "model.moe_router_num_groups"},
        {"--moe-router-group-topk", "model.moe_router_group_topk"},
        {"--moe-router-load-balancing-type", "model.moe_router_load_balancing_type"},
        {"--moe-aux-loss-coeff", "model.moe_aux_loss_coeff"},
        {"--moe-expert-capacity-factor", "model.moe_expert_capacity_factor"},
        {"--moe-token-dispatcher-type", "model.moe_token_dispatcher_type"},
        {"--moe-permute-fusion", "model.moe_permute_fusion", true},
        {"--moe-shared-expert-overlap", "model.moe_shared_expert_overlap", true},
        {"--overlap-moe-expert-parallel-comm", "model.overlap_moe_expert_parallel_comm", true},
        {"--delay-wgrad-compute", "model.delay_wgrad_compute", true},
        {"--recompute-granularity", "model.recompute_granularity"},
        {"--recompute-method", "model.recompute_method"},
        {"--recompute-num-layers", "model.recompute_num_layers"},
        {"--mtp-num-layers", "model.mtp_num_layers"},
        {"--bf16", "model.bf16", true},
        {"--micro-batch-size", "train.micro_batch_size"},
        {"--global-batch-size", "train.global_batch_size"},
        {"--train-iters", "train.train_iters"},
    };
    return table;
}

std::optional<int> default_gpus_per_node(std::string_view gpu) {
    static constexpr std::pair<std::string_view, int> kPerNode[] = {
        {"h100", 8}, {"b200", 8}, {"b300", 8}, {"gb200", 4}, {"gb300", 4}};
    for (const auto& [name, count] : kPerNode) {
        if (gpu == name) {
            return count;
        }
    }
    return std::nullopt;
}

std::vector<Finding> apply_harness_overrides(Config& config, const HarnessOverrides& o,
                                             const DeviceProbe& probe) {
    ModelConfig& m = config.model;
    apply_a2a_overlap(config, o);

    set_if(o.num_nodes, config.comm.num_nodes);
    set_if(o.gpus_per_node, config.comm.gpus_per_node);
    apply_launch(config, o);
    set_if(o.max_steps, config.train.train_iters);
    if (o.compute_dtype) {
        apply_compute_dtype(m, *o.compute_dtype);
    }

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
    apply_recompute_and_graphs(m, o);

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
