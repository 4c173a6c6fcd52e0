#include "harness_flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "epo/config/overrides.h"
#include "epo/config/recipes.h"
#include "epo/core/error.h"

namespace epo::cli {
namespace {

bool parse_bool(const std::string& flag, std::string text) {
    std::transform(text.begin(), text.end(), text.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    if (text == "true" || text == "1" || text == "t" || text == "yes" || text == "y") {
        return true;
    }
    if (text == "false" || text == "0" || text == "f" || text == "no" || text == "n") {
        return false;
    }
    throw Error(ErrorKind::kUsage, fmt::format("{} takes true or false, got '{}'", flag, text));
}

bool given(const HarnessFlags& flags, const char* name) {
    return flags.app->count(name) > 0;
}

}  // namespace

void add_harness_flags(CLI::App& app, HarnessFlags& f) {
    f.app = &app;
    app.add_option("--moe_a2a_overlap", f.moe_a2a_overlap,
                   "true: EP overlap and delayed wgrad on, shared-expert overlap off");
    app.add_option("--moe_flex_dispatcher_backend", f.moe_flex_dispatcher_backend,
                   "deepep or hybridep: activate the flex dispatcher; None: force alltoall")
        ->check(CLI::IsMember({"deepep", "hybridep", "None"}));
    app.add_option("--tp,--tensor_model_parallel_size", f.tensor_model_parallel_size,
                   "-tp N: tensor-parallel size (also sets sequence_parallel = TP > 1)");
    app.add_option("--pp,--pipeline_model_parallel_size", f.pipeline_model_parallel_size,
                   "-pp N: pipeline-parallel size");
    app.add_option("--vp,--virtual_pipeline_model_parallel_size",
                   f.virtual_pipeline_model_parallel_size,
                   "-vp N|None: virtual pipeline size, or None");
    app.add_option("--ep,--expert_model_parallel_size", f.expert_model_parallel_size,
                   "-ep N: expert-parallel size");
    app.add_option("--etp,--expert_tensor_parallel_size", f.expert_tensor_parallel_size,
                   "-etp N: expert tensor-parallel size");
    app.add_option("--cp,--context_parallel_size", f.context_parallel_size,
                   "-cp N: context-parallel size");
    app.add_option("--gb,--global_batch_size", f.global_batch_size, "-gb N: global batch size");
    app.add_option("--mb,--micro_batch_size", f.micro_batch_size, "-mb N: micro batch size");
    app.add_option("--sl,--seq_length", f.seq_length, "-sl N: sequence length");
    app.add_option("--max_steps", f.max_steps, "training iterations (train.train_iters)");
    app.add_option("--num_nodes", f.num_nodes, "nodes (comm.num_nodes)");
    app.add_option("--gpus_per_node", f.gpus_per_node, "ranks per node (comm.gpus_per_node)");
    app.add_option("--hidden_size", f.hidden_size, "shrink the model: hidden size");
    app.add_option("--num_layers", f.num_layers, "shrink the model: layers");
    app.add_option("--num_moe_experts", f.num_moe_experts, "shrink the model: experts");
}

config::HarnessOverrides harness_overrides(const HarnessFlags& f) {
    config::HarnessOverrides o;
    const auto take = [&](const char* name, int value, std::optional<int>& out) {
        if (given(f, name)) {
            out = value;
        }
    };
    if (given(f, "--moe_a2a_overlap")) {
        o.moe_a2a_overlap = parse_bool("--moe_a2a_overlap", f.moe_a2a_overlap);
    }
    take("--num_nodes", f.num_nodes, o.num_nodes);
    take("--gpus_per_node", f.gpus_per_node, o.gpus_per_node);
    take("--max_steps", f.max_steps, o.max_steps);
    take("--tp", f.tensor_model_parallel_size, o.tensor_model_parallel_size);
    take("--pp", f.pipeline_model_parallel_size, o.pipeline_model_parallel_size);
    take("--cp", f.context_parallel_size, o.context_parallel_size);
    if (given(f, "--vp")) {
        const std::string& text = f.virtual_pipeline_model_parallel_size;
        if (text == "None") {
            o.virtual_pipeline_model_parallel_size = std::optional<int>();
        } else {
            try {
                std::size_t used = 0;
                const int value = std::stoi(text, &used);
                if (used != text.size()) {
                    throw std::invalid_argument(text);
                }
                o.virtual_pipeline_model_parallel_size = std::optional<int>(value);
            } catch (const std::exception&) {
                throw Error(ErrorKind::kUsage,
                            fmt::format("-vp takes an integer or None, got '{}'", text));
            }
        }
    }
    take("--ep", f.expert_model_parallel_size, o.expert_model_parallel_size);
    take("--etp", f.expert_tensor_parallel_size, o.expert_tensor_parallel_size);
    take("--gb", f.global_batch_size, o.global_batch_size);
    take("--mb", f.micro_batch_size, o.micro_batch_size);
    take("--sl", f.seq_length, o.seq_length);
    take("--hidden_size", f.hidden_size, o.hidden_size);
    take("--num_layers", f.num_layers, o.num_layers);
    take("--num_moe_experts", f.num_moe_experts, o.num_moe_experts);
    if (given(f, "--moe_flex_dispatcher_backend")) {
        const std::string& backend = f.moe_flex_dispatcher_backend;
        o.moe_flex_dispatcher_backend =
            backend == "None" ? std::optional<std::string>() : std::optional<std::string>(backend);
    }
    return o;
}

config::ConfigSources config_sources(const CLI::App& cmd, const std::string& model,
                                     const std::vector<std::string>& positional,
                                     const HarnessFlags& flags) {
    config::ConfigSources sources;
    if (cmd.count("--model") > 0) {
        sources.model = model;
    }
    for (const auto& arg : positional) {
        if (config::looks_like_override(arg)) {
            sources.overrides.push_back(arg);
        } else if (sources.config_path) {
            throw Error(ErrorKind::kUsage,
                        fmt::format("two configuration files given ('{}' and '{}'); give one, "
                                    "and overrides as KEY=VALUE",
                                    sources.config_path->string(), arg));
        } else {
            sources.config_path = arg;
        }
    }
    sources.harness = harness_overrides(flags);
    return sources;
}

std::string recipe_list() {
    std::string recipes;
    for (auto name : config::recipe_names()) {
        recipes += (recipes.empty() ? "" : ", ") + std::string(name);
    }
    return recipes;
}

}  // namespace epo::cli
