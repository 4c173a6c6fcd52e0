#include "epo/moe/moe_config.h"

#include <cmath>

#include "epo/config/config.h"

namespace epo::moe {
namespace {

[[noreturn]] void bad(const std::string& msg) {
    throw Error(ErrorKind::kConfig, msg);
}

}  // namespace

const char* score_function_name(ScoreFunction f) {
    return f == ScoreFunction::kSoftmax ? "softmax" : "sigmoid";
}

const char* load_balancing_name(LoadBalancing l) {
    switch (l) {
        case LoadBalancing::kNone:
            return "none";
        case LoadBalancing::kAuxLoss:
            return "aux_loss";
        case LoadBalancing::kSeqAuxLoss:
            return "seq_aux_loss";
    }
    return "?";
}

const char* drop_policy_name(DropPolicy p) {
    return p == DropPolicy::kProbs ? "probs" : "position";
}

const char* precision_name(Precision p) {
    return p == Precision::kBf16 ? "bf16" : "fp32";
}

void validate_moe_config(const MoeConfig& c) {
    if (c.hidden_size < 1) {
        bad(fmt::format("hidden_size={} must be >= 1", c.hidden_size));
    }
    if (c.num_experts < 1) {
        bad(fmt::format("num_moe_experts={} must be >= 1 for an MoE layer", c.num_experts));
    }
    if (c.topk < 1 || c.topk > c.num_experts) {
        bad(fmt::format("moe_router_topk={} must be between 1 and num_moe_experts={}", c.topk,
                        c.num_experts));
    }
    if (c.ffn_hidden_size < 1) {
        bad(fmt::format("moe_ffn_hidden_size={} must be >= 1", c.ffn_hidden_size));
    }
    if (c.num_chunks < 1) {
        bad(fmt::format("moe_ep_overlap_num_chunks={} must be >= 1 (1: whole micro-batches)",
                        c.num_chunks));
    }
    if (c.num_groups != 0 || c.group_topk != 0) {
        if (c.num_groups < 1 || c.num_experts % c.num_groups != 0) {
            bad(fmt::format("moe_router_num_groups={} must divide num_moe_experts={}", c.num_groups,
                            c.num_experts));
        }
        if (c.group_topk < 1 || c.group_topk > c.num_groups) {
            bad(
                fmt::format("moe_router_group_topk={} must be between 1 and "
                            "moe_router_num_groups={}",
                            c.group_topk, c.num_groups));
        }
        if (c.topk < c.group_topk || c.topk > c.group_topk * (c.num_experts / c.num_groups)) {
            bad(
                fmt::format("moe_router_topk={} must be between moe_router_group_topk={} and the "
                            "experts in the kept groups ({})",
                            c.topk, c.group_topk, c.group_topk * (c.num_experts / c.num_groups)));
        }
    }
    if (c.topk_scaling_factor && !(*c.topk_scaling_factor > 0)) {
        bad(fmt::format("moe_router_topk_scaling_factor={} must be > 0 (or unset)",
                        *c.topk_scaling_factor));
    }
    if (c.enable_expert_bias && c.score_function != ScoreFunction::kSigmoid) {
        bad("moe_router_enable_expert_bias=true needs moe_router_score_function=sigmoid");
    }
    if (c.pre_softmax && c.score_function != ScoreFunction::kSoftmax) {
        bad("moe_router_pre_softmax=true needs moe_router_score_function=softmax");
    }
    if (c.aux_loss_coeff < 0 || c.z_loss_coeff < 0) {
        bad(fmt::format("moe_aux_loss_coeff={} and moe_z_loss_coeff={} must be >= 0",
                        c.aux_loss_coeff, c.z_loss_coeff));
    }
    if (c.capacity_factor && !(*c.capacity_factor > 0)) {
        bad(fmt::format("moe_expert_capacity_factor={} must be > 0 (or unset for dropless)",
                        *c.capacity_factor));
    }
    if (c.pad_to_capacity && !c.capacity_factor) {
        bad("moe_pad_expert_input_to_capacity=true needs moe_expert_capacity_factor");
    }
    if (c.shared_expert_size < 0) {
        bad(fmt::format("moe_shared_expert_intermediate_size={} must be >= 0",
                        c.shared_expert_size));
    }
    if (c.shared_expert_overlap && (!c.has_shared_experts() || c.recompute_shared_experts)) {
        bad(
            fmt::format("moe_shared_expert_overlap=true needs a shared expert "
                        "(moe_shared_expert_intermediate_size={}) that is not recomputed "
                        "(recompute_modules without shared_experts, as rule MC010 says)",
                        c.shared_expert_size));
    }
}

DType compute_dtype(const MoeConfig& cfg) {
    return cfg.precision == Precision::kBf16 ? DType::kBF16 : DType::kF32;
}

DType router_dtype(const MoeConfig& cfg) {
    return cfg.router_fp32 ? DType::kF32 : compute_dtype(cfg);
}

std::int64_t expert_capacity(const MoeConfig& cfg, std::int64_t num_tokens) {
    if (!cfg.capacity_factor) {
        return -1;
    }
    const double rows = static_cast<double>(num_tokens * cfg.topk);
    return static_cast<std::int64_t>(
        std::ceil(rows / static_cast<double>(cfg.num_experts) * *cfg.capacity_factor));
}

bool has_aux_loss(const MoeConfig& cfg) {
    return cfg.load_balancing_type != LoadBalancing::kNone && cfg.aux_loss_coeff > 0;
}

MoeConfig moe_config_from(const config::ModelConfig& m) {
    if (!config::is_moe(m)) {
        bad("model.num_moe_experts is null or 0: this is a dense model, it has no MoE layer");
    }
    if (m.fp16) {
        bad("model.fp16=true: fp16 (with loss scaling) is not supported; use model.bf16");
    }
    MoeConfig c;
    c.hidden_size = m.hidden_size;
    c.num_experts = *m.num_moe_experts;
    c.topk = m.moe_router_topk;
    c.ffn_hidden_size = config::moe_ffn_hidden_size(m);
    c.score_function = m.moe_router_score_function == config::ScoreFunction::kSigmoid
                           ? ScoreFunction::kSigmoid
                           : ScoreFunction::kSoftmax;
    c.pre_softmax = m.moe_router_pre_softmax;
    c.num_groups = m.moe_router_num_groups.value_or(0);
    c.group_topk = m.moe_router_group_topk.value_or(0);
    c.topk_scaling_factor = m.moe_router_topk_scaling_factor;
    if (m.moe_router_dtype == config::RouterDtype::kFp64) {
        bad("model.moe_router_dtype=fp64 is not supported by this runtime; use fp32 or null");
    }
    c.router_fp32 = m.moe_router_dtype == config::RouterDtype::kFp32;
    c.enable_expert_bias = m.moe_router_enable_expert_bias;
    c.expert_bias_update_rate = m.moe_router_bias_update_rate;
    switch (m.moe_router_load_balancing_type) {
        case config::LoadBalancingType::kAuxLoss:
            c.load_balancing_type = LoadBalancing::kAuxLoss;
            break;
        case config::LoadBalancingType::kSeqAuxLoss:
            c.load_balancing_type = LoadBalancing::kSeqAuxLoss;
            break;
        case config::LoadBalancingType::kNone:
            c.load_balancing_type = LoadBalancing::kNone;
            break;
        default:
            bad(
                fmt::format("model.moe_router_load_balancing_type={} is not supported by this "
                            "runtime; use aux_loss, seq_aux_loss or none",
                            config::enum_name(m.moe_router_load_balancing_type)));
    }
    c.aux_loss_coeff = m.moe_aux_loss_coeff;
    c.z_loss_coeff = m.moe_z_loss_coeff.value_or(0.0);
    c.capacity_factor = m.moe_expert_capacity_factor;
    c.drop_policy = m.moe_token_drop_policy == config::TokenDropPolicy::kPosition
                        ? DropPolicy::kPosition
                        : DropPolicy::kProbs;
    c.pad_to_capacity = m.moe_pad_expert_input_to_capacity;
    c.shared_expert_size = m.moe_shared_expert_intermediate_size.value_or(0);
    c.gradient_accumulation_fusion = m.gradient_accumulation_fusion;
    c.precision = m.bf16 ? Precision::kBf16 : Precision::kFp32;
    if (m.moe_ep_overlap_chunk_by == config::ChunkSplit::kTokens) {
        bad(fmt::format("model.moe_ep_overlap_chunk_by=tokens: {}; {}", config::kTokenChunksRemoved,
                        config::kTokenChunksFix));
    }
    c.num_chunks = m.moe_ep_overlap_num_chunks;
    c.recompute_moe_act = config::recomputes_module(m, config::RecomputeModule::kMoeAct);
    c.recompute_shared_experts =
        config::recomputes_module(m, config::RecomputeModule::kSharedExperts);
    // The reference's rule: EP overlap and shared-expert overlap exclude each other (EP011).
    c.shared_expert_overlap = m.moe_shared_expert_overlap && c.shared_expert_size > 0 &&
                              !m.overlap_moe_expert_parallel_comm;
    // flex without a backend was turned into alltoall at finalization (W009); allgather is
    // refused before a run (RT016).
    if (m.moe_token_dispatcher_type == config::DispatcherType::kFlex &&
        m.moe_flex_dispatcher_backend) {
        c.dispatcher = *m.moe_flex_dispatcher_backend == config::FlexBackend::kHybridep
                           ? DispatcherKind::kFlexHybridep
                           : DispatcherKind::kFlexDeepep;
    }
    validate_moe_config(c);
    return c;
}

}  // namespace epo::moe
