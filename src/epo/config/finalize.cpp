#include "epo/config/finalize.h"

#include <fmt/format.h>

#include "epo/config/env.h"
#include "epo/config/tree_walk.h"
#include "epo/core/error.h"

namespace epo::config {
namespace {

template <class T>
struct OptionalValue {
    using type = T;
};
template <class T>
struct OptionalValue<std::optional<T>> {
    using type = T;
};

// Copies `src` into `dst` for every same-named field, nulls included (the reference's
// _apply_cfgs). A null headed for a field that cannot hold one is a bug in this file: the
// computed defaults cover every non-nullable destination.
template <Section D>
void copy_same_named(D& dst, const CommOverlapConfig& src) {
    for_each_same_named(dst, src, [](auto& to, const auto& from, std::string_view name) {
        using To = std::remove_reference_t<decltype(to)>;
        using From = std::remove_cvref_t<decltype(from)>;
        if constexpr (std::is_same_v<To, From>) {
            to = from;
        } else if constexpr (IsOptional<From>::value &&
                             std::is_same_v<To, typename OptionalValue<From>::type>) {
            EPO_CHECK(from.has_value(), "finalization would copy null into non-nullable {}", name);
            to = *from;
        } else {
            EPO_CHECK(false, "comm_overlap.{} and its mirror have different types", name);
        }
    });
}

// Every non-null user value replaces the computed one.
void overlay_user_values(CommOverlapConfig& computed, const CommOverlapConfig& user) {
    for_each_same_named(computed, user, [](auto& to, const auto& from, std::string_view) {
        using To = std::remove_reference_t<decltype(to)>;
        if constexpr (std::is_same_v<To, std::remove_cvref_t<decltype(from)>>) {
            if (from.has_value()) {
                to = from;
            }
        }
    });
}

Finding tp_overlap_off(const char* id, const std::string& reason, const std::string& fix) {
    return Finding{id, "comm_overlap.tp_comm_overlap", "true",
                   "tensor-parallel communication overlap switched off: " + reason, fix};
}

// Step 1 for tp_comm_overlap: records the switch-off in the user's section (as the reference
// does in its snapshot), so a second finalization sees false and warns no more.
void settle_tp_overlap(Config& config, std::vector<Finding>& warnings) {
    auto& user = *config.comm_overlap;
    const ModelConfig& m = config.model;
    if (!user.tp_comm_overlap.has_value()) {
        warnings.push_back(Finding{
            "W004", "comm_overlap.tp_comm_overlap", "null",
            "comm_overlap.tp_comm_overlap was not given (the reference requires it whenever the "
            "section exists); using false",
            "set comm_overlap.tp_comm_overlap explicitly"});
        user.tp_comm_overlap = false;
        return;
    }
    if (!*user.tp_comm_overlap) {
        return;
    }
    if (m.tensor_model_parallel_size < 2) {
        warnings.push_back(
            tp_overlap_off("W001",
                           fmt::format("tensor_model_parallel_size is {} (needs >= 2)",
                                       m.tensor_model_parallel_size),
                           "use TP >= 2, or set comm_overlap.tp_comm_overlap=false"));
    } else if (!m.sequence_parallel) {
        warnings.push_back(tp_overlap_off("W002", "model.sequence_parallel is false",
                                          "set model.sequence_parallel=true"));
    } else if (!describe_target(config.env).has_te) {
        warnings.push_back(tp_overlap_off(
            "W003",
            "no TP-overlap library: it needs Transformer Engine (declare env.te_version); the "
            "epo runtime has none",
            "set comm_overlap.tp_comm_overlap=false"));
    } else {
        return;
    }
    user.tp_comm_overlap = false;
}

// W010: an unset comm_overlap field will overwrite the model's explicit true with false.
void warn_forced_false(const Config& config, std::vector<Finding>& warnings) {
    const auto& user = *config.comm_overlap;
    const auto check = [&](const std::optional<bool>& user_value, bool value, const char* section,
                           const char* name) {
        if (!user_value.has_value() && value) {
            warnings.push_back(Finding{
                "W010", fmt::format("{}.{}", section, name), "true",
                fmt::format("{0}.{1} is true but comm_overlap.{1} is unset: finalization copies "
                            "comm_overlap's value (null -> the default false) into {0}, so "
                            "the run uses {1}=false",
                            section, name),
                fmt::format("set comm_overlap.{}=true", name)});
        }
    };
    check(user.overlap_moe_expert_parallel_comm, config.model.overlap_moe_expert_parallel_comm,
          "model", "overlap_moe_expert_parallel_comm");
    check(user.delay_wgrad_compute, config.model.delay_wgrad_compute, "model",
          "delay_wgrad_compute");
    // Copied into the optimizer section only with the distributed optimizer.
    if (config.ddp.use_distributed_optimizer) {
        check(user.overlap_param_gather_with_optimizer_step,
              config.optimizer.overlap_param_gather_with_optimizer_step, "optimizer",
              "overlap_param_gather_with_optimizer_step");
    }
}

// The comm-overlap section's effects (the section exists): tensor-parallel overlap settled, then
// the computed model and data-parallel overlap fields with the user's values on top.
void settle_comm_overlap(Config& config, std::vector<Finding>& warnings) {
    settle_tp_overlap(config, warnings);
    warn_forced_false(config, warnings);
    copy_same_named(config.model, resolved_model_overlap(config));
    // Data-parallel overlap exists only with Megatron's DDP and distributed optimizer; without
    // it the ddp and optimizer sections are left exactly as given.
    if (config.ddp.use_distributed_optimizer) {
        const CommOverlapConfig optimizer_side = resolved_optimizer_overlap(config);
        copy_same_named(config.ddp, optimizer_side);
        copy_same_named(config.optimizer, optimizer_side);
    }
}

// Chunks by experts leave every product and sum as C = 1 computes it; they only let the overlap
// schedule run one chunk's all-to-all under another's experts. Without overlap nothing runs
// under anything, and each chunk's all-to-all would wait for the slower rank once more per
// layer, so the MoE layers run whole (the same bits; docs/chunked-overlap.md).
void settle_moe_chunks(ModelConfig& m, std::vector<Finding>& warnings) {
    if (m.moe_ep_overlap_num_chunks <= 1 || m.overlap_moe_expert_parallel_comm)
        return;
    warnings.push_back(Finding{
        "W014", "model.moe_ep_overlap_num_chunks", std::to_string(m.moe_ep_overlap_num_chunks),
        "chunks by experts without overlap_moe_expert_parallel_comm: the MoE layers run whole "
        "(C = 1 gives the same bits, and a baseline's chunks would only add waits)",
        "set model.moe_ep_overlap_num_chunks=1, or turn on "
        "comm_overlap.overlap_moe_expert_parallel_comm"});
    m.moe_ep_overlap_num_chunks = 1;
}

// Paired edges reorder the overlap schedule; the baseline has nothing to pair (every
// micro-batch runs alone, in order), so the field is cleared and a warning says so. A warning
// and not an error: `epo bench --compare` runs the baseline from the same overrides.
void settle_pair_edges(ModelConfig& m, std::vector<Finding>& warnings) {
    if (!m.moe_ep_overlap_pair_edges || m.overlap_moe_expert_parallel_comm)
        return;
    warnings.push_back(
        Finding{"W015", "model.moe_ep_overlap_pair_edges", "true",
                "paired edges without overlap_moe_expert_parallel_comm: the baseline schedule runs "
                "every micro-batch alone, so there is nothing to pair and the field is ignored",
                "set model.moe_ep_overlap_pair_edges=false, or turn on "
                "comm_overlap.overlap_moe_expert_parallel_comm"});
    m.moe_ep_overlap_pair_edges = false;
}

// Megatron-Core's router applies moe_router_pre_softmax to softmax scores only; with sigmoid
// scores it has no effect (Bridge's DeepSeek-V3 recipe sets both). The field is cleared, so every
// consumer sees the routing that runs, and a warning says so.
void settle_pre_softmax(ModelConfig& m, std::vector<Finding>& warnings) {
    if (!m.moe_router_pre_softmax || m.moe_router_score_function != ScoreFunction::kSigmoid)
        return;
    warnings.push_back(Finding{
        "W016", "model.moe_router_pre_softmax", "true",
        "moe_router_pre_softmax applies to softmax scores only (as Megatron-Core's router): with "
        "moe_router_score_function=sigmoid it has no effect, and the field is cleared",
        "set model.moe_router_pre_softmax=false, or use moe_router_score_function=softmax"});
    m.moe_router_pre_softmax = false;
}

}  // namespace

CommOverlapConfig resolved_model_overlap(const Config& config) {
    const ModelConfig& m = config.model;
    CommOverlapConfig computed;
    computed.tp_comm_overlap = false;
    computed.tp_comm_bootstrap_backend.reset();  // the only field whose default is not null
    computed.defer_embedding_wgrad_compute = false;
    computed.wgrad_deferral_limit = -1;
    computed.overlap_moe_expert_parallel_comm = false;
    computed.delay_wgrad_compute = false;
    const bool pipelined = m.pipeline_model_parallel_size > 1;
    const bool interleaved = pipelined && virtual_pipeline_size(m) > 1;
    computed.overlap_p2p_comm = interleaved;
    computed.batch_p2p_comm = pipelined && !interleaved;
    if (config.comm_overlap) {
        overlay_user_values(computed, *config.comm_overlap);
    }
    return computed;
}

CommOverlapConfig resolved_optimizer_overlap(const Config& config) {
    const ModelConfig& m = config.model;
    CommOverlapConfig computed;
    computed.tp_comm_bootstrap_backend.reset();
    computed.overlap_grad_reduce = false;
    computed.overlap_param_gather = false;
    computed.overlap_param_gather_with_optimizer_step = false;
    computed.align_param_gather = false;
    if (data_parallel_size(config) > 1) {
        computed.bucket_size = kDefaultBucketSize;
        computed.overlap_grad_reduce = true;
        computed.overlap_param_gather = true;
        computed.align_param_gather =
            m.pipeline_model_parallel_size > 1 && virtual_pipeline_size(m) > 1;
    }
    if (config.comm_overlap) {
        overlay_user_values(computed, *config.comm_overlap);
    }
    return computed;
}

FinalizeResult finalize(Config& config) {
    FinalizeResult result;
    ModelConfig& m = config.model;
    if (m.moe_token_dispatcher_type == DispatcherType::kFlex && !m.moe_flex_dispatcher_backend) {
        result.warnings.push_back(Finding{
            "W009", "model.moe_flex_dispatcher_backend", "null",
            "moe_token_dispatcher_type is flex but no flex backend is set: using the alltoall "
            "dispatcher",
            "set model.moe_flex_dispatcher_backend (deepep or hybridep) through the activation "
            "step (--moe_flex_dispatcher_backend)"});
        m.moe_token_dispatcher_type = DispatcherType::kAlltoall;
    }
    // The reference applies comm-overlap settings only when the section exists.
    if (config.comm_overlap)
        settle_comm_overlap(config, result.warnings);
    settle_moe_chunks(config.model, result.warnings);
    settle_pair_edges(config.model, result.warnings);
    settle_pre_softmax(config.model, result.warnings);
    return result;
}

}  // namespace epo::config
