// The configuration tree of a run (docs/config.md "The tree") and the derived values the runtime
// reads from it.
//
// A Config is plain data: one struct per section, aggregated here, each listing its fields once
// in a static `fields(self, visitor)` function. That list drives everything generic about the
// tree: YAML in and out (yaml_io.h), JSON out (json_io.h), dotted overrides (overrides.h), the
// list of known keys and "did you mean" suggestions, value-range checks, and diffs. Adding a
// field is adding it to its struct and to that struct's list.
//
// What this file deliberately does not do: read files, apply recipes or overrides, or judge a
// configuration (see builder.h, finalize.h, validate.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "epo/config/field_types.h"
#include "epo/config/model_config.h"
#include "epo/config/sections.h"

namespace epo::config {

struct Config {
    using IsSection = void;

    std::optional<std::string> recipe;  // the recipe this config started from (recipes.h)
    ModelConfig model;
    std::optional<CommOverlapConfig> comm_overlap;  // absent: no comm-overlap finalization
    DdpConfig ddp;
    OptimizerConfig optimizer;
    TrainConfig train;
    DatasetConfig dataset;
    CheckpointConfig checkpoint;
    LoggerConfig logger;
    CommConfig comm;
    EnvConfig env;

    bool operator==(const Config&) const = default;

    template <class Self, class V>
    static void fields(Self& s, V&& v) {
        v("recipe", s.recipe);
        v("model", s.model);
        v("comm_overlap", s.comm_overlap);
        v("ddp", s.ddp);
        v("optimizer", s.optimizer);
        v("train", s.train);
        v("dataset", s.dataset);
        v("checkpoint", s.checkpoint);
        v("logger", s.logger);
        v("comm", s.comm);
        v("env", s.env);
    }
};

// ---- Derived values (what the runtime reads; all guard against out-of-range inputs, which the
// ---- validator reports as VA001, by treating a non-positive divisor as 1).

bool is_moe(const ModelConfig& m);  // num_moe_experts set and > 0
int ffn_hidden_size(const ModelConfig& m);
int moe_ffn_hidden_size(const ModelConfig& m);
int num_query_groups(const ModelConfig& m);
int kv_channels(const ModelConfig& m);
int expert_tensor_parallel_size(const ModelConfig& m);
int virtual_pipeline_size(const ModelConfig& m);  // 1 when null
// One entry per layer: true where the layer is an MoE layer (all false for a dense model).
std::vector<bool> moe_layer_pattern(const ModelConfig& m);
// Whether selective recompute recomputes `module`: recompute_granularity selective and the
// module in recompute_modules (null means [core_attn], Megatron-Core's default).
bool recomputes_module(const ModelConfig& m, RecomputeModule module);
// Full recompute (recompute_granularity full): for each layer of [first, end), the layers of one
// model chunk, the first layer of the group it is recomputed with, or -1 when it keeps its
// activations (also for every layer without full recompute). Megatron-Core's methods, per model
// chunk: uniform cuts the chunk into groups of recompute_num_layers from its first layer (the
// last group shorter); block recomputes the chunk's first recompute_num_layers layers, each on
// its own, and no other.
std::vector<int> full_recompute_groups(const ModelConfig& m, int first, int end);

// Products below saturate at the int64 limits instead of overflowing (sizes are unchecked input).
std::int64_t model_parallel_size(const ModelConfig& m);  // TP * PP * CP
// The topology is stated when comm.gpus_per_node is (comm.num_nodes then defaults to 1 node);
// otherwise the launcher decides it, and world_size() is 0 until resolve_topology() (validate.h)
// fills it in from the MPI job.
bool topology_stated(const CommConfig& comm);
std::int64_t world_size(const Config& c);  // num_nodes (default 1) x gpus_per_node, or 0
// comm_overlap.data_parallel_size when given, else world size / (TP * PP * CP).
std::int64_t data_parallel_size(const Config& c);
std::int64_t samples_per_step(const Config& c);   // micro batch * DP: one micro-batch per rank
std::int64_t global_batch_size(const Config& c);  // train.global_batch_size or micro * DP
std::int64_t num_microbatches(const Config& c);   // global / (micro * DP)
int lr_decay_iters(const Config& c);              // train.lr_decay_iters or train_iters
// Nodes (> 1 means inter-node links), 1 while comm.num_nodes is null.
int num_nodes(const CommConfig& comm);
int gpus_per_node(const CommConfig& comm);  // ranks per node; 1 while null
bool link_model_enabled(const CommConfig& comm);

// Module names inside a CUDA-graph scope, from cuda_graph_modules plus the legacy
// cuda_graph_scope ("a,b" string or list; "full" or empty means none; "CudaGraphScope.attn"
// means "attn"). Membership is by name only; cuda_graph_impl is not consulted.
std::vector<std::string> graphed_module_names(const ModelConfig& m);
bool is_graphed(const ModelConfig& m, std::string_view module);

// ---- Keys.

// Every dotted key of the tree, in field order ("model.hidden_size", "comm.link.latency_us").
const std::vector<std::string>& known_keys();
// The known key closest to `key` by edit distance over full dotted paths and leaf names, if any
// is close enough to be a plausible typo.
std::optional<std::string> closest_key(std::string_view key);
// "unknown key 'x'; did you mean 'y'?" or, with nothing close, a pointer to the key reference.
std::string unknown_key_message(std::string_view key);

// Dotted keys whose values differ between a and b ("model.num_layers: 2 vs 4"), for tests and
// multi-rank agreement checks.
std::vector<std::string> diff_configs(const Config& a, const Config& b);

}  // namespace epo::config
