#include "epo/config/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "epo/config/json_io.h"
#include "epo/config/tree_walk.h"

namespace epo::config {

std::string Limits::describe() const {
    const bool has_min = std::isfinite(min);
    const bool has_max = std::isfinite(max);
    if (has_min && has_max) {
        return fmt::format("between {} and {}", min, max);
    }
    if (has_min) {
        return fmt::format("{} {}", min_exclusive ? "greater than" : "at least", min);
    }
    if (has_max) {
        return fmt::format("at most {}", max);
    }
    return "any value";
}

// ---- Derived values.

bool is_moe(const ModelConfig& m) {
    return m.num_moe_experts.value_or(0) > 0;
}

int ffn_hidden_size(const ModelConfig& m) {
    if (m.ffn_hidden_size) {
        return *m.ffn_hidden_size;
    }
    // 4 * hidden_size, in 64 bits: an absurd hidden_size is VA001's to report, not an overflow.
    return static_cast<int>(std::clamp<std::int64_t>(4 * std::int64_t{m.hidden_size},
                                                     std::numeric_limits<int>::min(),
                                                     std::numeric_limits<int>::max()));
}

int moe_ffn_hidden_size(const ModelConfig& m) {
    return m.moe_ffn_hidden_size.value_or(ffn_hidden_size(m));
}

int num_query_groups(const ModelConfig& m) {
    return m.num_query_groups.value_or(m.num_attention_heads);
}

int kv_channels(const ModelConfig& m) {
    return m.kv_channels.value_or(m.hidden_size / std::max(1, m.num_attention_heads));
}

int expert_tensor_parallel_size(const ModelConfig& m) {
    return m.expert_tensor_parallel_size.value_or(m.tensor_model_parallel_size);
}

int virtual_pipeline_size(const ModelConfig& m) {
    return m.virtual_pipeline_model_parallel_size.value_or(1);
}

bool recomputes_module(const ModelConfig& m, RecomputeModule module) {
    if (m.recompute_granularity != RecomputeGranularity::kSelective)
        return false;
    if (!m.recompute_modules)
        return module == RecomputeModule::kCoreAttn;
    return std::find(m.recompute_modules->begin(), m.recompute_modules->end(), module) !=
           m.recompute_modules->end();
}

std::vector<int> full_recompute_groups(const ModelConfig& m, int first, int end) {
    std::vector<int> groups(static_cast<size_t>(std::max(0, end - first)), -1);
    if (m.recompute_granularity != RecomputeGranularity::kFull || !m.recompute_method ||
        m.recompute_num_layers.value_or(0) < 1)
        return groups;
    const int n = *m.recompute_num_layers;
    for (int l = first; l < end; ++l) {
        const int i = l - first;
        int& g = groups[static_cast<size_t>(i)];
        if (*m.recompute_method == RecomputeMethod::kUniform)
            g = first + i / n * n;
        else if (i < n)
            g = l;
    }
    return groups;
}

std::vector<bool> moe_layer_pattern(const ModelConfig& m) {
    const int num_layers = std::clamp(m.num_layers, 0, kMaxNumLayers);
    std::vector<bool> pattern(num_layers, false);
    if (!is_moe(m)) {
        return pattern;
    }
    if (const int* every = std::get_if<int>(&m.moe_layer_freq)) {
        for (int i = 0; i < num_layers; ++i) {
            pattern[i] = *every > 0 && i % *every == 0;
        }
    } else {
        const auto& list = std::get<std::vector<int>>(m.moe_layer_freq);
        for (int i = 0; i < num_layers && i < static_cast<int>(list.size()); ++i) {
            pattern[i] = list[i] == 1;
        }
    }
    return pattern;
}

namespace {

std::int64_t saturating_mul(std::int64_t a, std::int64_t b) {
    std::int64_t product = 0;
    if (__builtin_mul_overflow(a, b, &product)) {
        return (a < 0) != (b < 0) ? std::numeric_limits<std::int64_t>::min()
                                  : std::numeric_limits<std::int64_t>::max();
    }
    return product;
}

}  // namespace

std::int64_t model_parallel_size(const ModelConfig& m) {
    return saturating_mul(
        saturating_mul(m.tensor_model_parallel_size, m.pipeline_model_parallel_size),
        m.context_parallel_size);
}

std::int64_t world_size(const Config& c) {
    if (!topology_stated(c.comm)) {
        return 0;
    }
    return saturating_mul(num_nodes(c.comm), *c.comm.gpus_per_node);
}

bool topology_stated(const CommConfig& comm) {
    return comm.gpus_per_node.has_value();
}

int num_nodes(const CommConfig& comm) {
    return comm.num_nodes.value_or(1);
}

int gpus_per_node(const CommConfig& comm) {
    return comm.gpus_per_node.value_or(1);
}

std::int64_t data_parallel_size(const Config& c) {
    if (c.comm_overlap && c.comm_overlap->data_parallel_size) {
        return *c.comm_overlap->data_parallel_size;
    }
    return std::max<std::int64_t>(
        1, world_size(c) / std::max<std::int64_t>(1, model_parallel_size(c.model)));
}

std::int64_t samples_per_step(const Config& c) {
    return saturating_mul(c.train.micro_batch_size, data_parallel_size(c));
}

std::int64_t global_batch_size(const Config& c) {
    return c.train.global_batch_size ? *c.train.global_batch_size : samples_per_step(c);
}

std::int64_t num_microbatches(const Config& c) {
    return global_batch_size(c) / std::max<std::int64_t>(1, samples_per_step(c));
}

int lr_decay_iters(const Config& c) {
    return c.train.lr_decay_iters.value_or(c.train.train_iters);
}

bool link_model_enabled(const CommConfig& comm) {
    return comm.link.inter_node_gbps.value_or(0) > 0 || comm.link.intra_node_gbps.value_or(0) > 0 ||
           comm.link.latency_us.value_or(0) > 0;
}

namespace {

void add_scope_name(std::vector<std::string>& names, std::string name) {
    const auto strip = [](std::string& s) {
        const auto first = s.find_first_not_of(" \t");
        const auto last = s.find_last_not_of(" \t");
        s = first == std::string::npos ? "" : s.substr(first, last - first + 1);
    };
    strip(name);
    constexpr std::string_view kEnumPrefix = "CudaGraphScope.";
    if (name.rfind(kEnumPrefix, 0) == 0) {
        name.erase(0, kEnumPrefix.size());
    }
    if (name.empty() || name == "full" || name == "full_iteration") {
        return;  // whole-iteration graphs name no module
    }
    if (std::find(names.begin(), names.end(), name) == names.end()) {
        names.push_back(std::move(name));
    }
}

}  // namespace

std::vector<std::string> graphed_module_names(const ModelConfig& m) {
    std::vector<std::string> names;
    for (CudaGraphModule module : m.cuda_graph_modules) {
        add_scope_name(names, std::string(enum_name(module)));
    }
    if (m.cuda_graph_scope) {
        if (const auto* text = std::get_if<std::string>(&*m.cuda_graph_scope)) {
            std::string::size_type start = 0;
            while (start <= text->size()) {
                const auto comma = text->find(',', start);
                const auto end = comma == std::string::npos ? text->size() : comma;
                add_scope_name(names, text->substr(start, end - start));
                start = end + 1;
            }
        } else {
            for (const auto& name : std::get<std::vector<std::string>>(*m.cuda_graph_scope)) {
                add_scope_name(names, name);
            }
        }
    }
    return names;
}

bool is_graphed(const ModelConfig& m, std::string_view module) {
    const auto names = graphed_module_names(m);
    return std::find(names.begin(), names.end(), module) != names.end();
}

// ---- Keys.

namespace {

// Keys of a section type, optional sub-sections included whether present or not; with
// `sections`, the sections' own paths are listed too.
template <Section S>
void list_keys(std::string_view prefix, std::vector<std::string>& out, bool sections) {
    const S defaults{};
    S::fields(defaults, [&](std::string_view name, const auto& field, const Limits& = Limits{}) {
        using T = std::remove_cvref_t<decltype(field)>;
        const std::string key = detail::join_key(prefix, name);
        if constexpr (Section<T> || detail::IsOptionalSection<T>::value) {
            if (sections) {
                out.push_back(key);
            }
            if constexpr (Section<T>) {
                list_keys<T>(key, out, sections);
            } else {
                list_keys<typename T::value_type>(key, out, sections);
            }
        } else {
            out.push_back(key);
        }
    });
}

// What a mistyped key may have meant: every leaf key and every section.
const std::vector<std::string>& suggestion_candidates() {
    static const std::vector<std::string> candidates = [] {
        std::vector<std::string> out;
        list_keys<Config>("", out, /*sections=*/true);
        return out;
    }();
    return candidates;
}

}  // namespace

const std::vector<std::string>& known_keys() {
    static const std::vector<std::string> keys = [] {
        std::vector<std::string> out;
        list_keys<Config>("", out, /*sections=*/false);
        return out;
    }();
    return keys;
}

namespace {

std::size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) {
        row[j] = j;
    }
    for (std::size_t i = 1; i <= a.size(); ++i) {
        std::size_t diagonal = row[0];
        row[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            const std::size_t above = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
            diagonal = above;
        }
    }
    return row[b.size()];
}

std::string_view leaf_of(std::string_view key) {
    const auto dot = key.rfind('.');
    return dot == std::string_view::npos ? key : key.substr(dot + 1);
}

}  // namespace

std::optional<std::string> closest_key(std::string_view key) {
    if (key.size() > 256) {
        return std::nullopt;  // not a typo of any key; spare the quadratic distance
    }
    const std::string_view leaf = leaf_of(key);
    std::optional<std::string> best;
    std::size_t best_distance = std::string::npos;
    for (const auto& candidate : suggestion_candidates()) {
        // A right leaf under the wrong (or no) section counts as close as a small typo.
        const std::size_t leaf_distance = edit_distance(leaf, leaf_of(candidate)) + 1;
        std::size_t distance = std::min(edit_distance(key, candidate), leaf_distance);
        // A leaf cut short ("hidden" for "hidden_size") is as plausible as a small typo.
        if (leaf.size() >= 4 && leaf_of(candidate).rfind(leaf, 0) == 0) {
            distance = std::min<std::size_t>(distance, 2);
        }
        if (distance < best_distance) {
            best_distance = distance;
            best = candidate;
        }
    }
    // Plausible typo: at most a third of the leaf's letters wrong (and at least 2 allowed).
    const std::size_t allowed = std::max<std::size_t>(2, leaf.size() / 3) + 1;
    if (best && best_distance <= allowed) {
        return best;
    }
    return std::nullopt;
}

namespace {

// Megatron-Bridge's spellings, which a hand-written file in EPO's layout may carry over: said as
// such instead of a near-miss suggestion that points elsewhere (`rng` is not `env`, `model.fp8`
// is not `model.fp16`).
std::optional<std::string> bridge_key_message(std::string_view key) {
    static constexpr std::pair<std::string_view, std::string_view> kRenamed[] = {
        {"rng.seed", "train.seed"},
        {"logger.log_interval", "train.log_interval"},
        {"scheduler.lr_warmup_iters", "train.lr_warmup_iters"},
        {"scheduler.lr_decay_iters", "train.lr_decay_iters"},
        {"scheduler.lr_decay_style", "train.lr_decay_style"},
        {"mixed_precision.bf16", "model.bf16"},
        {"mixed_precision.fp16", "model.fp16"},
    };
    const std::string bridge_file =
        "a run_config.yaml that Megatron-Bridge wrote (with its _target_ tags) is read as it is";
    for (const auto& [bridge, epo] : kRenamed) {
        if (key == bridge) {
            return fmt::format(
                "unknown key '{}': that is Megatron-Bridge's name, which EPO's own "
                "layout calls '{}' ({})",
                key, epo, bridge_file);
        }
    }
    if (key == "model.fp4") {
        return fmt::format(
            "unknown key '{}': EPO does not model FP4 compute; remove it (fp8: model.fp8 and "
            "model.fp8_recipe)",
            key);
    }
    static constexpr std::string_view kBridgeSections[] = {"rng",
                                                           "scheduler",
                                                           "mixed_precision",
                                                           "tokenizer",
                                                           "dist",
                                                           "profiling",
                                                           "rerun_state_machine",
                                                           "validation",
                                                           "ft",
                                                           "straggler",
                                                           "nvrx_straggler",
                                                           "peft",
                                                           "inprocess_restart",
                                                           "tensor_inspect",
                                                           "env_vars",
                                                           "optimizer_config_override_provider"};
    const std::string_view section = key.substr(0, key.find('.'));
    for (std::string_view name : kBridgeSections) {
        if (section == name) {
            return fmt::format(
                "unknown key '{}': '{}' is a Megatron-Bridge section with no place "
                "in EPO's own layout ({}; in EPO's layout rng.seed is train.seed "
                "and scheduler.lr_* are train.lr_*)",
                key, name, bridge_file);
        }
    }
    return std::nullopt;
}

}  // namespace

std::string unknown_key_message(std::string_view key) {
    if (auto bridge = bridge_key_message(key)) {
        return *bridge;
    }
    if (auto suggestion = closest_key(key)) {
        return fmt::format("unknown key '{}'; did you mean '{}'?", key, *suggestion);
    }
    return fmt::format(
        "unknown key '{}' (docs/config.md lists every key; `epo validate --model tiny-moe` "
        "prints a complete tree)",
        key);
}

namespace {

void diff_json(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b,
               const std::string& key, std::vector<std::string>& out) {
    if (a.is_object() && b.is_object()) {
        for (const auto& [name, value] : a.items()) {
            const auto other = b.find(name);
            if (other == b.end()) {
                out.push_back(
                    fmt::format("{}: {} vs (absent)", detail::join_key(key, name), value.dump()));
            } else {
                diff_json(value, *other, detail::join_key(key, name), out);
            }
        }
        for (const auto& [name, value] : b.items()) {
            if (!a.contains(name)) {
                out.push_back(
                    fmt::format("{}: (absent) vs {}", detail::join_key(key, name), value.dump()));
            }
        }
    } else if (a != b) {
        out.push_back(fmt::format("{}: {} vs {}", key, a.dump(), b.dump()));
    }
}

}  // namespace

std::vector<std::string> diff_configs(const Config& a, const Config& b) {
    std::vector<std::string> out;
    diff_json(to_json(a), to_json(b), "", out);
    return out;
}

}  // namespace epo::config
