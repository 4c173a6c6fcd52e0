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

// "a,b" -> {"a", "b"}, as the reference harness's list_of_strings.
std::vector<std::string> split_list(const std::string& text) {
    std::vector<std::string> out;
    std::size_t start = 0;
    while (true) {
        const std::size_t comma = text.find(',', start);
        out.push_back(text.substr(start, comma - start));
        if (comma == std::string::npos) {
            return out;
        }
        start = comma + 1;
    }
}

}  // namespace

const std::vector<std::string>& short_harness_flags() {
    static const std::vector<std::string> flags = {"-tp", "-pp", "-vp", "-ep", "-etp",
                                                   "-et", "-cp", "-gb", "-mb", "-sl",
                                                   "-ms", "-ng", "-gn", "-rl", "-mr"};
    return flags;
}

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
                   "-vp N|None|-1: virtual pipeline size, None, or -1 to keep the config's");
    app.add_option("--ep,--expert_model_parallel_size", f.expert_model_parallel_size,
                   "-ep N: expert-parallel size");
    app.add_option("--etp,--et,--expert_tensor_parallel_size", f.expert_tensor_parallel_size,
                   "-et/-etp N: expert tensor-parallel size");
    app.add_option("--cp,--context_parallel_size", f.context_parallel_size,
                   "-cp N: context-parallel size");
    app.add_option("--gb,--global_batch_size", f.global_batch_size, "-gb N: global batch size");
    app.add_option("--mb,--micro_batch_size", f.micro_batch_size, "-mb N: micro batch size");
    app.add_option("--sl,--seq_length", f.seq_length, "-sl N: sequence length");
    app.add_option("--ms,--max_steps", f.max_steps,
                   "-ms N: training iterations (train.train_iters)");
    app.add_option("--num_nodes", f.num_nodes, "nodes (comm.num_nodes)");
    app.add_option("--gn,--gpus_per_node", f.gpus_per_node,
                   "-gn N: ranks per node (comm.gpus_per_node); default with -ng: the GPU "
                   "family's (h100, b200, b300: 8; gb200, gb300: 4)");
    app.add_option("--ng,--num_gpus", f.num_gpus,
                   "-ng N: GPUs in all; nodes = ceil(N / GPUs per node)");
    app.add_option("-g,--gpu", f.gpu, "-g NAME: the target GPU (env.gpu): h100, b200, gb200, ...");
    app.add_option("-c,--compute_dtype", f.compute_dtype,
                   "-c bf16|fp8_cs|fp8_mx|fp8_sc: model.bf16, and model.fp8 / fp8_recipe as "
                   "Bridge's recipe of that name sets them (nvfp4 is refused)");
    app.add_option("--rl,--recompute_num_layers", f.recompute_num_layers,
                   "-rl N: full recompute of N layers per stage (method block)");
    app.add_option("--recompute_modules", f.recompute_modules,
                   "a,b: selective recompute of these modules (core_attn, moe_act, ...)");
    app.add_option("--cuda_graph_impl", f.cuda_graph_impl,
                   "none, local or transformer_engine (model.cuda_graph_impl)");
    app.add_option("--cuda_graph_scope", f.cuda_graph_scope,
                   "a,b: graphed modules (attn, mlp, moe, moe_router, moe_preprocess, mamba), or "
                   "full_iteration");
    auto* megatron = app.add_option_group("Megatron-LM flags",
                                          "Megatron-LM's spelling: each sets the field it names");
    for (const config::MegatronFlag& m : config::megatron_flags()) {
        const std::string flag = m.flag;
        if (m.is_switch) {
            megatron->add_flag_callback(
                flag, [&f, flag] { f.megatron[flag] = "true"; }, std::string("sets ") + m.key);
        } else {
            megatron->add_option_function<std::string>(
                flag, [&f, flag](const std::string& v) { f.megatron[flag] = v; },
                std::string("sets ") + m.key);
        }
    }
    megatron->add_option("--num-layers-per-virtual-pipeline-stage",
                         f.num_layers_per_virtual_pipeline_stage,
                         "N: virtual pipeline size = num_layers / (PP x N)");
    app.add_option(
        "-m,--model_family_name", f.model_family_name,
        "-m NAME: the harness's model family (qwen, deepseek, ...), checked against -mr");
    app.add_option("--mr,--model_recipe_name", f.model_recipe_name,
                   "-mr NAME: the harness's recipe (qwen3_30b_a3b: the recipe qwen3-30b-a3b)");
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
        } else if (text == "-1") {
            // The reference harness's default: -1 keeps the configuration's value.
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
    if (given(f, "--ng")) {
        o.num_gpus = f.num_gpus;
    }
    if (given(f, "--gpu")) {
        o.gpu = f.gpu;
    }
    if (given(f, "--compute_dtype")) {
        o.compute_dtype = f.compute_dtype;
    }
    take("--rl", f.recompute_num_layers, o.recompute_num_layers);
    if (given(f, "--recompute_modules")) {
        o.recompute_modules = split_list(f.recompute_modules);
    }
    if (given(f, "--cuda_graph_impl")) {
        o.cuda_graph_impl = f.cuda_graph_impl;
    }
    if (given(f, "--cuda_graph_scope")) {
        o.cuda_graph_scope = split_list(f.cuda_graph_scope);
    }
    if (given(f, "--moe_flex_dispatcher_backend")) {
        const std::string& backend = f.moe_flex_dispatcher_backend;
        o.moe_flex_dispatcher_backend =
            backend == "None" ? std::optional<std::string>() : std::optional<std::string>(backend);
    }
    return o;
}

namespace {

// -m / -mr as the reference harness takes them: the recipe qwen3_30b_a3b is EPO's qwen3-30b-a3b;
// the family must be the recipe's (qwen for qwen3_30b_a3b).
std::optional<std::string> harness_recipe(const HarnessFlags& f) {
    const bool family = f.app->count("--model_family_name") > 0;
    if (f.app->count("--model_recipe_name") == 0) {
        if (family) {
            throw Error(ErrorKind::kUsage,
                        fmt::format("-m/--model_family_name {} needs -mr/--model_recipe_name "
                                    "(e.g. -mr qwen3_30b_a3b), as the reference harness does",
                                    f.model_family_name));
        }
        return std::nullopt;
    }
    std::string recipe = f.model_recipe_name;
    std::transform(recipe.begin(), recipe.end(), recipe.begin(), [](unsigned char ch) {
        return ch == '_' ? '-' : static_cast<char>(std::tolower(ch));
    });
    const auto& names = config::recipe_names();
    if (std::find(names.begin(), names.end(), recipe) == names.end()) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("-mr/--model_recipe_name {}: EPO has no recipe {}; its recipes: "
                                "{}",
                                f.model_recipe_name, recipe, recipe_list()));
    }
    if (family && recipe.rfind(f.model_family_name, 0) != 0) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("-m/--model_family_name {} is not the family of the recipe {}",
                                f.model_family_name, f.model_recipe_name));
    }
    return recipe;
}

}  // namespace

config::ConfigSources config_sources(const CLI::App& cmd, const std::string& model,
                                     const std::vector<std::string>& positional,
                                     const HarnessFlags& flags) {
    config::ConfigSources sources;
    if (cmd.count("--model") > 0) {
        sources.model = model;
    }
    if (const auto recipe = harness_recipe(flags)) {
        if (sources.model && *sources.model != *recipe) {
            throw Error(ErrorKind::kUsage,
                        fmt::format("--model {} and -mr {} name different recipes; use one",
                                    *sources.model, flags.model_recipe_name));
        }
        sources.model = recipe;
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
    // Megatron-LM's flags set the field they name, before the command line's KEY=VALUE.
    std::vector<std::string> megatron;
    for (const config::MegatronFlag& m : config::megatron_flags()) {
        if (const auto it = flags.megatron.find(m.flag); it != flags.megatron.end()) {
            megatron.push_back(std::string(m.key) + "=" + it->second);
        }
    }
    sources.overrides.insert(sources.overrides.begin(), megatron.begin(), megatron.end());
    if (flags.app->count("--num-layers-per-virtual-pipeline-stage") > 0) {
        sources.num_layers_per_virtual_pipeline_stage = flags.num_layers_per_virtual_pipeline_stage;
    }
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
