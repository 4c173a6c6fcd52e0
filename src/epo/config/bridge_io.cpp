#include "epo/config/bridge_io.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "epo/config/harness.h"
#include "epo/config/tree_walk.h"
#include "epo/core/error.h"

namespace epo::config {
namespace {

bool has_tag(const YAML::Node& node) {
    return node.IsMap() && node["_target_"].IsDefined();
}

std::string tag_of(const YAML::Node& node) {
    const YAML::Node tag = node["_target_"];
    return tag.IsScalar() ? tag.Scalar() : std::string();
}

// The dotted keys of EPO's tree, every optional section present.
const std::set<std::string>& epo_keys() {
    static const std::set<std::string> keys = [] {
        Config c;
        c.comm_overlap.emplace();
        std::set<std::string> out;
        for_each_leaf(
            c, [&](std::string_view key, auto&, const Limits&) { out.insert(std::string(key)); });
        return out;
    }();
    return keys;
}

// Keys EPO has no field for whose value changes what would be planned or trained: allowed only at
// the value that changes nothing (null, false or zero), else refused with the reason. (fp8_recipe
// and the like only matter with fp8 set, so they are merely ignored.) (Once EPO grows a field of
// the same name it is read like any other.)
struct Unhonoured {
    std::string_view key;
    std::string_view reason;
};
constexpr Unhonoured kUnhonoured[] = {
    {"model.fp4", "EPO does not model FP4 compute"},
    {"mixed_precision.fp4", "EPO does not model FP4 compute"},
    // Megatron's MLA scales its softmax by mscale^2 / sqrt(q_head_dim), mscale =
    // 0.1 mscale_all_dim ln(rotary_scaling_factor) + 1, whatever the rope type; EPO's MLA uses
    // 1 / sqrt(q_head_dim), which is the reference's at mscale_all_dim = 0.
    {"model.mscale_all_dim",
     "EPO's multi-latent attention does not apply YaRN's softmax mscale (0 leaves the scale at "
     "1 / sqrt(q_head_dim))"},
};

// "0", "0.0", "-0e0": a number that is zero (a zero scale changes nothing either).
bool is_zero(const std::string& text) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    return end != text.c_str() && *end == '\0' && v == 0.0;
}

class Translator {
public:
    explicit Translator(const YamlSource& source) : source_(source) {
        out_.tree = YAML::Node(YAML::NodeType::Map);
    }

    BridgeTranslation run(const YAML::Node& root) {
        for (const auto& entry : root) {
            const std::string section = entry.first.Scalar();
            const YAML::Node& value = entry.second;
            if (section == "_target_") {
                continue;
            }
            if (section == "model" || section == "train" || section == "ddp" ||
                section == "comm_overlap") {
                same_named(section, value, section);
            } else if (section == "optimizer") {
                optimizer(value);
            } else if (section == "scheduler") {
                renamed(section, value,
                        {{"lr_warmup_iters", "train.lr_warmup_iters"},
                         {"lr_decay_iters", "train.lr_decay_iters"},
                         {"lr_decay_style", "train.lr_decay_style"}});
            } else if (section == "rng") {
                renamed(section, value, {{"seed", "train.seed"}});
            } else if (section == "logger") {
                renamed(section, value, {{"log_interval", "train.log_interval"}});
            } else if (section == "mixed_precision") {
                mixed_precision(value, entry.first.Mark());
            } else {
                ignore(section, value);
            }
        }
        reconcile_overlap(root);
        if (mixed_grad_reduce_in_fp32_)
            set("ddp.grad_reduce_in_fp32", *mixed_grad_reduce_in_fp32_);
        out_.ignored.assign(ignored_.begin(), ignored_.end());
        return std::move(out_);
    }

private:
    [[noreturn]] void fail(const YAML::Mark& mark, const std::string& key,
                           const std::string& message) const {
        const std::string where =
            source_.has_positions && mark.line >= 0
                ? fmt::format("{}:{}:{}: ", source_.name, mark.line + 1, mark.column + 1)
                : source_.name + ": ";
        throw Error(ErrorKind::kUsage, fmt::format("{}{}: {}", where, key, message));
    }

    // Bridge writes a pipeline layout as Megatron-Core's list form, one list of layer names per
    // virtual stage ([[embedding, decoder], [decoder], ..., [decoder, mtp, loss]]); EPO's field
    // holds Megatron's string form of the same layout ("Et|t|...|tmL").
    std::string layout_string(const std::string& key, const YAML::Node& stages,
                              const YAML::Mark& mark) const {
        static const std::map<std::string, char> kLetters = {
            {"embedding", 'E'}, {"decoder", 't'}, {"mtp", 'm'}, {"loss", 'L'}};
        std::string out;
        for (const auto& stage : stages) {
            if (!stage.IsSequence())
                fail(mark, key, "expected a list of lists of layer names (one list per stage)");
            if (!out.empty())
                out += '|';
            for (const auto& layer : stage) {
                const auto it = kLetters.find(layer.IsScalar() ? layer.Scalar() : "");
                if (it == kLetters.end()) {
                    fail(mark, key,
                         fmt::format("layer name '{}' is none of embedding, decoder, mtp, loss",
                                     layer.IsScalar() ? layer.Scalar() : "(not a name)"));
                }
                out += it->second;
            }
        }
        return out;
    }

    void set(const std::string& dotted, const YAML::Node& value) {
        const std::size_t dot = dotted.find('.');
        out_.tree[dotted.substr(0, dot)][dotted.substr(dot + 1)] = value;
    }

    // Every key of a tagged section, dotted, as ignored (a whole section counts once: `name.*`).
    void ignore(const std::string& key, const YAML::Node& value) {
        if (value.IsMap() && !value.IsNull()) {
            ignored_.insert(key + ".*");
        } else if (!value.IsNull()) {
            ignored_.insert(key);
        }
    }

    // A Bridge value as EPO reads it: callables by name, enums by name, lists element-wise.
    YAML::Node decode(const std::string& key, const YAML::Node& value, const YAML::Mark& mark) {
        if (value.IsSequence()) {
            YAML::Node list(YAML::NodeType::Sequence);
            for (const auto& item : value) {
                list.push_back(decode(key, item, mark));
            }
            return list;
        }
        if (!has_tag(value)) {
            return value;
        }
        const std::string target = tag_of(value);
        if (value["_name_"].IsDefined()) {
            return YAML::Node(value["_name_"].Scalar());  // an enum: CudaGraphScope.attn -> attn
        }
        static const std::map<std::string, std::string> kCallables = {
            {"torch.nn.functional.silu", "silu"},
            {"torch.nn.functional.gelu", "gelu"},
            {"megatron.core.fusions.fused_bias_gelu.bias_gelu_impl", "gelu"},
        };
        if (const auto it = kCallables.find(target); it != kCallables.end()) {
            return YAML::Node(it->second);
        }
        fail(mark, key,
             fmt::format("'{}' has no EPO counterpart (EPO models silu and gelu: "
                         "torch.nn.functional.silu / gelu)",
                         target));
    }

    void check_unhonoured(const std::string& key, const YAML::Node& value, const YAML::Mark& mark) {
        for (const Unhonoured& u : kUnhonoured) {
            if (u.key != key) {
                continue;
            }
            const bool harmless =
                value.IsNull() ||
                (value.IsScalar() && (value.Scalar() == "false" || value.Scalar() == "False" ||
                                      is_zero(value.Scalar())));
            if (!harmless) {
                const std::string shown = value.IsScalar()     ? value.Scalar()
                                          : value.IsSequence() ? "a list"
                                                               : "a mapping";
                fail(mark, key,
                     fmt::format("{} = {} would change the result, but {}; set it to null (or "
                                 "false, or 0) to plan without it",
                                 key, shown, u.reason));
            }
        }
    }

    // Keys with the same name in EPO's section; the rest ignored, or refused when unhonoured.
    void same_named(const std::string& bridge_section, const YAML::Node& section,
                    const std::string& epo_section) {
        if (section.IsNull()) {
            return;
        }
        if (!section.IsMap()) {
            fail(YAML::Mark(), bridge_section, "expected a mapping");
        }
        for (const auto& entry : section) {
            const std::string name = entry.first.Scalar();
            if (name == "_target_") {
                continue;
            }
            const std::string key = bridge_section + "." + name;
            const std::string epo_key = epo_section + "." + name;
            if (epo_key == "model.pipeline_model_parallel_layout" && entry.second.IsSequence()) {
                set(epo_key, YAML::Node(layout_string(key, entry.second, entry.first.Mark())));
            } else if (epo_keys().count(epo_key) > 0) {
                set(epo_key, decode(key, entry.second, entry.first.Mark()));
            } else {
                check_unhonoured(key, entry.second, entry.first.Mark());
                ignored_.insert(key);
            }
        }
    }

    void renamed(const std::string& bridge_section, const YAML::Node& section,
                 const std::map<std::string, std::string>& names) {
        if (!section.IsMap()) {
            ignore(bridge_section, section);
            return;
        }
        for (const auto& entry : section) {
            const std::string name = entry.first.Scalar();
            if (name == "_target_") {
                continue;
            }
            const auto it = names.find(name);
            if (it == names.end()) {
                ignored_.insert(bridge_section + "." + name);
            } else if (!entry.second.IsNull()) {
                set(it->second, entry.second);
            }
        }
    }

    void optimizer(const YAML::Node& section) {
        if (!section.IsMap()) {
            ignore("optimizer", section);
            return;
        }
        const YAML::Node kind = section["optimizer"];
        if (kind.IsDefined() && kind.IsScalar() && kind.Scalar() != "adam") {
            fail(kind.Mark(), "optimizer.optimizer",
                 fmt::format("optimizer.optimizer = {} would change the result, but EPO models "
                             "Adam (its optimizer state and step); use adam",
                             kind.Scalar()));
        }
        for (const auto& entry : section) {
            const std::string name = entry.first.Scalar();
            if (name == "_target_" || name == "optimizer") {
                continue;
            }
            // use_distributed_optimizer is ddp's in EPO (Bridge keeps the two copies equal).
            const std::string epo_key = "optimizer." + name;
            if (name != "use_distributed_optimizer" && epo_keys().count(epo_key) > 0) {
                set(epo_key, entry.second);
            } else {
                ignored_.insert("optimizer." + name);
            }
        }
    }

    // A recipe name ("bf16_mixed") or a MixedPrecisionConfig mapping.
    void mixed_precision(const YAML::Node& value, const YAML::Mark& mark) {
        if (value.IsNull()) {
            return;
        }
        if (value.IsScalar()) {
            const std::string name = value.Scalar();
            if (name.find("fp8") != std::string::npos || name.find("fp4") != std::string::npos) {
                fail(mark, "mixed_precision",
                     fmt::format("mixed_precision = {} names a recipe whose fields EPO cannot see "
                                 "here; write it as Bridge's to_yaml does (a mapping with fp8 and "
                                 "fp8_recipe), or pass -c fp8_cs / fp8_mx / fp8_sc (FP4 is not "
                                 "modelled)",
                                 name));
            }
            set("model.bf16", YAML::Node(name.find("bf16") != std::string::npos));
            set("model.fp16", YAML::Node(name.find("fp16") != std::string::npos));
            // Bridge's fp16 recipes reduce gradients in fp16, its bf16 ones in fp32.
            mixed_grad_reduce_in_fp32_ = YAML::Node(name.find("fp16") == std::string::npos);
            return;
        }
        for (const auto& entry : value) {
            const std::string name = entry.first.Scalar();
            if (name == "_target_") {
                continue;
            }
            const std::string key = "mixed_precision." + name;
            check_unhonoured(key, entry.second, entry.first.Mark());
            if (name == "bf16" || name == "fp16") {
                set("model." + name, entry.second);
            } else if (name == "grad_reduce_in_fp32") {
                // Bridge's set-up copies it over the DDP config's (run() applies it last).
                if (!entry.second.IsNull())
                    mixed_grad_reduce_in_fp32_ = entry.second;
            } else if ((name == "fp8" || name == "fp8_recipe") && !entry.second.IsNull()) {
                // Bridge's mixed-precision recipe writes fp8 over the model's (its setup copies
                // these fields onto the model config).
                set("model." + name, entry.second);
            } else {
                ignored_.insert(key);
            }
        }
    }

    // Bridge's CommOverlapConfig.setup writes the requested values (null: off) over the model's.
    void reconcile_overlap(const YAML::Node& root) {
        const YAML::Node overlap = root["comm_overlap"];
        const YAML::Node model = root["model"];
        if (!overlap.IsDefined() || !overlap.IsMap() || !model.IsDefined() || !model.IsMap()) {
            return;
        }
        for (const char* name : {"overlap_moe_expert_parallel_comm", "delay_wgrad_compute"}) {
            const YAML::Node requested = overlap[name];
            const YAML::Node effective = model[name];
            const bool want =
                requested.IsDefined() && requested.IsScalar() && requested.Scalar() == "true";
            const bool has =
                effective.IsDefined() && effective.IsScalar() && effective.Scalar() == "true";
            if (want != has) {
                out_.notes.push_back(fmt::format(
                    "comm_overlap.{0} (requested: {1}) and model.{0} ({2}) differ in this file; "
                    "as Bridge's CommOverlapConfig.setup does, the request wins and the run uses "
                    "{0}={3}",
                    name,
                    requested.IsDefined() && !requested.IsNull() ? requested.Scalar() : "null",
                    has ? "true" : "false", want ? "true" : "false"));
            }
        }
    }

    const YamlSource& source_;
    BridgeTranslation out_;
    std::set<std::string> ignored_;
    // mixed_precision's grad_reduce_in_fp32 (undefined: not given), which wins over ddp's.
    std::optional<YAML::Node> mixed_grad_reduce_in_fp32_;
};

// Megatron-LM argument names that differ from EPO's key, or set more than one field.
void translate_megatron_arg(const std::string& name, const YAML::Node& value,
                            const std::function<void(const std::string&, const YAML::Node&)>& set,
                            bool& used) {
    const auto truthy = [&] { return value.IsScalar() && value.Scalar() == "true"; };
    static const std::map<std::string, std::string> kRenamed = {
        {"norm_epsilon", "model.layernorm_epsilon"},
        {"padded_vocab_size", "model.vocab_size"},
        {"lr", "optimizer.lr"},
        {"min_lr", "optimizer.min_lr"},
        {"weight_decay", "optimizer.weight_decay"},
        {"adam_beta1", "optimizer.adam_beta1"},
        {"adam_beta2", "optimizer.adam_beta2"},
        {"adam_eps", "optimizer.adam_eps"},
        {"clip_grad", "optimizer.clip_grad"},
        {"lr_warmup_iters", "train.lr_warmup_iters"},
        {"lr_decay_iters", "train.lr_decay_iters"},
        {"lr_decay_style", "train.lr_decay_style"},
        {"seed", "train.seed"},
        {"log_interval", "train.log_interval"},
        {"use_distributed_optimizer", "ddp.use_distributed_optimizer"},
        {"overlap_grad_reduce", "ddp.overlap_grad_reduce"},
        {"overlap_param_gather", "ddp.overlap_param_gather"},
        // The dump holds arguments.py's resolved value (bf16 sets it unless grad_reduce_in_bf16).
        {"accumulate_allreduce_grads_in_fp32", "ddp.grad_reduce_in_fp32"},
        {"virtual_pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size"},
        {"normalization", "model.normalization"},
        {"position_embedding_type", "model.position_embedding_type"},
        {"rotary_base", "model.rotary_base"},
        {"qk_layernorm", "model.qk_layernorm"},
        {"add_qkv_bias", "model.add_qkv_bias"},
        {"init_method_std", "model.init_method_std"},
        {"multi_latent_attention", "model.multi_latent_attention"},
        {"q_lora_rank", "model.q_lora_rank"},
        {"kv_lora_rank", "model.kv_lora_rank"},
        {"qk_head_dim", "model.qk_head_dim"},
        {"qk_pos_emb_head_dim", "model.qk_pos_emb_head_dim"},
        {"v_head_dim", "model.v_head_dim"},
        {"moe_router_enable_expert_bias", "model.moe_router_enable_expert_bias"},
        {"moe_router_topk_scaling_factor", "model.moe_router_topk_scaling_factor"},
        {"moe_layer_freq", "model.moe_layer_freq"},
        {"fp16", "model.fp16"},
    };
    used = true;
    if (name == "swiglu") {
        if (truthy()) {
            set("model.gated_linear_unit", YAML::Node(true));
            set("model.activation_func", YAML::Node("silu"));
        }
    } else if (name == "untie_embeddings_and_output_weights") {
        set("model.share_embeddings_and_output_weights", YAML::Node(!truthy()));
    } else if (name == "disable_bias_linear") {
        set("model.add_bias_linear", YAML::Node(!truthy()));
    } else if (const auto it = kRenamed.find(name); it != kRenamed.end()) {
        if (!value.IsNull() || it->second.rfind("model.", 0) == 0) {
            set(it->second, value);
        }
    } else {
        used = false;
    }
}

}  // namespace

bool is_megatron_args_document(const YAML::Node& root) {
    if (!root.IsMap() || has_tag(root)) {
        return false;
    }
    for (const char* name : {"tensor_model_parallel_size", "num_experts",
                             "expert_model_parallel_size", "pipeline_model_parallel_size"}) {
        const YAML::Node v = root[name];
        if (v.IsDefined() && v.IsScalar()) {
            return true;
        }
    }
    return false;
}

BridgeTranslation translate_megatron_args(const YAML::Node& root, const YamlSource& source) {
    BridgeTranslation out;
    out.tree = YAML::Node(YAML::NodeType::Map);
    out.kind = "Megatron-LM arguments";
    std::set<std::string> ignored;
    const auto set = [&](const std::string& dotted, const YAML::Node& value) {
        const std::size_t dot = dotted.find('.');
        out.tree[dotted.substr(0, dot)][dotted.substr(dot + 1)] = value;
    };
    const auto fail = [&](const YAML::Node& key, const std::string& message) {
        const YAML::Mark mark = key.Mark();
        throw Error(ErrorKind::kUsage, source.has_positions && mark.line >= 0
                                           ? fmt::format("{}:{}:{}: {}", source.name, mark.line + 1,
                                                         mark.column + 1, message)
                                           : fmt::format("{}: {}", source.name, message));
    };
    std::map<std::string, std::string> by_arg;  // Megatron-LM's flags table, by argument name
    for (const MegatronFlag& f : megatron_flags()) {
        std::string arg = std::string(f.flag).substr(2);
        std::replace(arg.begin(), arg.end(), '-', '_');
        by_arg[arg] = f.key;
    }
    for (const auto& entry : root) {
        const std::string name = entry.first.Scalar();
        const YAML::Node& value = entry.second;
        if ((name == "fp8" || name == "fp4") && !value.IsNull()) {
            fail(entry.first, fmt::format("{} = {} would change the result, but EPO does not "
                                          "model FP8/FP4 compute yet",
                                          name, value.IsScalar() ? value.Scalar() : "set"));
        }
        if (name == "optimizer" && value.IsScalar() && value.Scalar() != "adam") {
            fail(entry.first, fmt::format("optimizer = {} would change the result, but EPO "
                                          "models Adam",
                                          value.Scalar()));
        }
        if (const auto it = by_arg.find(name); it != by_arg.end()) {
            if (!value.IsNull() || std::string(it->second).rfind("model.", 0) == 0) {
                set(it->second, value);
            }
            continue;
        }
        bool used = false;
        translate_megatron_arg(name, value, set, used);
        if (!used && epo_keys().count("model." + name) > 0) {
            set("model." + name, value);  // TransformerConfig's own name
        } else if (!used) {
            ignored.insert(name);
        }
    }
    out.ignored.assign(ignored.begin(), ignored.end());
    return out;
}

bool is_bridge_document(const YAML::Node& root) {
    if (!root.IsMap()) {
        return false;
    }
    if (has_tag(root)) {
        return true;
    }
    for (const auto& entry : root) {
        if (has_tag(entry.second)) {
            return true;
        }
    }
    return false;
}

BridgeTranslation translate_bridge(const YAML::Node& root, const YamlSource& source) {
    return Translator(source).run(root);
}

std::string ignored_keys_note(const BridgeTranslation& translation) {
    const std::vector<std::string>& ignored = translation.ignored;
    if (ignored.empty()) {
        return "";
    }
    return fmt::format("{} EPO does not use (read, not applied; {} in all): {}", translation.kind,
                       ignored.size(), fmt::join(ignored, ", "));
}

}  // namespace epo::config
