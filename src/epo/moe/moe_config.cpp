#include "epo/moe/moe_config.h"

#include <cmath>

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
    if (c.hidden_size < 1)
        bad(fmt::format("hidden_size={} must be >= 1", c.hidden_size));
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
}

DType compute_dtype(const MoeConfig& cfg) {
    return cfg.precision == Precision::kBf16 ? DType::kBF16 : DType::kF32;
}

std::int64_t expert_capacity(const MoeConfig& cfg, std::int64_t num_tokens) {
    if (!cfg.capacity_factor)
        return -1;
    const double rows = static_cast<double>(num_tokens * cfg.topk);
    return static_cast<std::int64_t>(
        std::ceil(rows / static_cast<double>(cfg.num_experts) * *cfg.capacity_factor));
}

bool has_aux_loss(const MoeConfig& cfg) {
    return cfg.load_balancing_type != LoadBalancing::kNone && cfg.aux_loss_coeff > 0;
}

}  // namespace epo::moe
