#include "epo/config/builder.h"

#include <fmt/format.h>

#include "epo/config/bridge_io.h"
#include "epo/config/overrides.h"
#include "epo/config/recipes.h"
#include "epo/config/yaml_io.h"
#include "epo/core/error.h"

namespace epo::config {
namespace {

// Megatron-LM: each pipeline rank holds num_layers / PP layers in chunks of N, so the virtual
// pipeline size is num_layers / PP / N, and N must divide the layers of a rank.
void apply_layers_per_virtual_stage(ModelConfig& m, int per_stage) {
    const int pp = m.pipeline_model_parallel_size;
    const std::string flag = fmt::format("--num-layers-per-virtual-pipeline-stage {}", per_stage);
    if (pp <= 1) {
        throw Error(ErrorKind::kUsage, fmt::format("{} needs pipeline parallelism, but "
                                                   "model.pipeline_model_parallel_size is {}; add "
                                                   "--pipeline-model-parallel-size N",
                                                   flag, pp));
    }
    if (per_stage < 1 || m.num_layers % pp != 0 || (m.num_layers / pp) % per_stage != 0) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("{}: the {} layers over PP {} do not split into virtual stages "
                                "of {} layers; choose N dividing num_layers / PP",
                                flag, m.num_layers, pp, per_stage));
    }
    m.virtual_pipeline_model_parallel_size = m.num_layers / pp / per_stage;
}

}  // namespace

BuiltConfig build_config(const ConfigSources& sources) {
    std::optional<YAML::Node> yaml;
    YamlSource yaml_source;
    if (sources.config_path || sources.config_text) {
        yaml_source.name = sources.config_path ? sources.config_path->string() : "<config>";
        const std::string text =
            sources.config_path ? read_text_file(*sources.config_path) : *sources.config_text;
        yaml = parse_yaml(text, yaml_source);
    }

    std::optional<std::string> recipe = sources.model;
    if (yaml) {
        const auto named = recipe_of(*yaml, yaml_source);
        if (named && recipe && *named != *recipe) {
            throw Error(ErrorKind::kUsage,
                        fmt::format("{} names recipe '{}' but --model says '{}'; use one",
                                    yaml_source.name, *named, *recipe));
        }
        recipe = recipe ? recipe : named;
    }
    if (!recipe && !yaml) {
        throw Error(ErrorKind::kUsage,
                    "nothing to build a configuration from: give a CONFIG.yaml or --model NAME");
    }

    BuiltConfig built;
    built.config = recipe ? make_recipe(*recipe) : Config{};
    const bool bridge_file = yaml && is_bridge_document(*yaml);
    if (bridge_file || (yaml && is_megatron_args_document(*yaml))) {
        const BridgeTranslation bridge = bridge_file ? translate_bridge(*yaml, yaml_source)
                                                     : translate_megatron_args(*yaml, yaml_source);
        apply_yaml(built.config, bridge.tree, yaml_source);
        built.notes = bridge.notes;
        if (const std::string note = ignored_keys_note(bridge); !note.empty()) {
            built.notes.push_back(note);
        }
    } else if (yaml) {
        apply_yaml(built.config, *yaml, yaml_source);
    }

    std::vector<Override> overrides;
    for (const auto& arg : sources.overrides) {
        overrides.push_back(parse_override(arg));
    }
    for (const auto& o : overrides) {
        if (o.key.rfind("env.", 0) == 0 || o.key == "env") {
            apply_override(built.config, o);  // the device the flex activation probes
        }
    }
    built.warnings = apply_harness_overrides(built.config, sources.harness, sources.probe);
    apply_overrides(built.config, std::span<const Override>(overrides));
    if (sources.num_layers_per_virtual_pipeline_stage) {
        apply_layers_per_virtual_stage(built.config.model,
                                       *sources.num_layers_per_virtual_pipeline_stage);
    }
    return built;
}

}  // namespace epo::config
