// The performance harness's flags (`-tp 2`, `--moe_a2a_overlap true`, `-ng 16 -g h100`, ...) as
// CLI11 options, shared by every subcommand that builds a configuration (validate, plan, bench,
// train). The spellings are Megatron-Bridge's scripts/performance argument parser's; one-dash
// forms of several letters are rewritten to two dashes by normalize_harness_flags before CLI11
// sees them.
//
// Megatron-LM's dashed flags (`--expert-model-parallel-size 8`, `--sequence-parallel`, ...: the
// set a launch script for an MoE model passes, config::megatron_flags()) are accepted too. Each
// sets the field it names, as Megatron-LM does (no harness side effects:
// `--tensor-model-parallel-size 2` leaves sequence parallelism alone), as an override applied after
// the harness flags and before the command line's KEY=VALUE overrides.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <string>
#include <vector>

#include "epo/config/builder.h"
#include "epo/config/harness.h"

namespace epo::cli {

struct HarnessFlags {
    std::string moe_a2a_overlap;
    std::string moe_flex_dispatcher_backend;
    std::string virtual_pipeline_model_parallel_size;
    int num_nodes = 0, gpus_per_node = 0, max_steps = 0;
    int tensor_model_parallel_size = 0, pipeline_model_parallel_size = 0;
    int context_parallel_size = 0, expert_model_parallel_size = 0;
    int expert_tensor_parallel_size = 0;
    int global_batch_size = 0, micro_batch_size = 0, seq_length = 0;
    int hidden_size = 0, num_layers = 0, num_moe_experts = 0;
    int num_gpus = 0, recompute_num_layers = 0;
    std::string gpu, compute_dtype, recompute_modules, cuda_graph_impl, cuda_graph_scope;
    // Megatron-LM's flags, by dashed name: the value given (switches: "true").
    std::map<std::string, std::string> megatron;
    int num_layers_per_virtual_pipeline_stage = 0;
    std::string model_family_name, model_recipe_name;  // -m / -mr: the harness's recipe
    CLI::App* app = nullptr;                           // to ask which options were given
};

// Multi-letter one-dash flags (`-tp`, `-ng`, ...), which normalize_harness_flags rewrites.
const std::vector<std::string>& short_harness_flags();

void add_harness_flags(CLI::App& app, HarnessFlags& flags);

// The given flags as library overrides; raises a usage error for a malformed value.
config::HarnessOverrides harness_overrides(const HarnessFlags& flags);

// The configuration sources of a command line: the recipe when --model was given, one
// CONFIG.yaml and any KEY=VALUE overrides among the positionals, and the harness flags. Two
// configuration files are a usage error.
config::ConfigSources config_sources(const CLI::App& cmd, const std::string& model,
                                     const std::vector<std::string>& positional,
                                     const HarnessFlags& flags);

// "name, name, ..." of every recipe, for --model's help.
std::string recipe_list();

}  // namespace epo::cli
