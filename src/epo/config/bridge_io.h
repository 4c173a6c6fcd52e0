// Reading a Megatron-Bridge run configuration as Bridge writes it (ConfigContainer.to_yaml /
// to_dict: `run_config.yaml`) into EPO's tree.
//
// Bridge's file has sections model, train, comm_overlap, ddp, optimizer, scheduler, dataset,
// checkpoint, logger, rng, dist, mixed_precision, tokenizer, profiling, ... and tags every mapping
// with `_target_` (the dataclass it builds). Callables and dtypes are `{_target_: NAME, _call_:
// false}`, enums `{_target_: CLASS, _call_: true, _args_: [VALUE], _name_: NAME}`.
//
// The translation:
//   - tags are dropped; callables map to EPO's values (torch.nn.functional.silu -> silu), enums
//     to their names; dtypes are not read (EPO's precision is model.bf16 / model.fp16);
//   - Bridge's layout maps to EPO's: scheduler.lr_warmup_iters / lr_decay_iters /
//     lr_decay_style -> train.*, rng.seed -> train.seed, logger.log_interval ->
//     train.log_interval, mixed_precision (a mapping or a recipe name) -> model.bf16 / fp16;
//     model, train, optimizer, ddp and comm_overlap keep the keys EPO has under the same name;
//   - keys EPO does not use are collected once, in `ignored`, never errors;
//   - keys that would change the result but that EPO cannot honour (FP8 / FP4 compute, uneven
//     pipeline stages, a pipeline layout, an optimizer other than Adam, an LR decay style EPO
//     has not) are errors (kUsage) naming the key, the value and the reason;
//   - requested against effective overlap: Bridge's CommOverlapConfig.setup writes the comm_overlap
//     values (the request; null means off) over model.overlap_moe_expert_parallel_comm /
//     model.delay_wgrad_compute, as EPO's finalization does; where the file's model values differ
//     from the request, a note says so.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "epo/config/yaml_io.h"

namespace epo::config {

// True for a document Bridge wrote: a `_target_` tag at the top level or on a section.
bool is_bridge_document(const YAML::Node& root);

struct BridgeTranslation {
    YAML::Node tree;                   // EPO's layout, for apply_yaml
    std::vector<std::string> ignored;  // dotted Bridge keys EPO does not use, sorted, each once
    std::vector<std::string> notes;    // overlap reconciliation and the like
    std::string kind = "Megatron-Bridge keys";  // what `ignored` holds, for the note
};

BridgeTranslation translate_bridge(const YAML::Node& root, const YamlSource& source);

// A Megatron-LM arguments dump: the `args` namespace a checkpoint stores, written as one flat
// mapping of argument names (`tensor_model_parallel_size: 2`, `num_experts: 64`, `swiglu:
// true`). Recognized by parallel sizes at the top level, where EPO's own layout has sections.
bool is_megatron_args_document(const YAML::Node& root);

// The arguments EPO has a field for, mapped to it (Megatron-LM's names: num_experts,
// swiglu, untie_embeddings_and_output_weights, disable_bias_linear, norm_epsilon, ...); the
// others listed in `ignored`; FP8 and optimizers other than Adam refused as for Bridge's file.
BridgeTranslation translate_megatron_args(const YAML::Node& root, const YamlSource& source);

// The note listing `ignored` ("" when none): whole sections as `name.*`.
std::string ignored_keys_note(const BridgeTranslation& translation);

}  // namespace epo::config
