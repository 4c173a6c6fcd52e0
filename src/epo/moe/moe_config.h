// MoeConfig: everything one MoE layer needs to know, in a small struct of its own (the model's
// configuration tree maps onto it with moe_config_from). Field comments give the Megatron-Core
// name each one mirrors.
//
// Letters: T tokens of the micro-batch on this rank, H hidden, E experts, K top-k, F expert FFN,
// S shared-expert FFN, C capacity (rows per expert in capacity mode).
#pragma once

#include <cstdint>
#include <optional>

#include "epo/tensor/tensor.h"

namespace epo::config {
struct ModelConfig;
}

namespace epo::moe {

enum class ScoreFunction { kSoftmax, kSigmoid };
enum class LoadBalancing { kNone, kAuxLoss, kSeqAuxLoss };
enum class DropPolicy { kProbs, kPosition };
enum class Precision { kFp32, kBf16 };
// The token dispatcher of an expert-parallel layer (token_dispatcher.h): alltoall, or flex with
// its backend (moe_flex_dispatcher_backend, flex_dispatcher.h).
enum class DispatcherKind { kAlltoall, kFlexDeepep, kFlexHybridep };

const char* score_function_name(ScoreFunction f);  // "softmax", "sigmoid"
const char* load_balancing_name(LoadBalancing l);  // "none", "aux_loss", "seq_aux_loss"
const char* drop_policy_name(DropPolicy p);        // "probs", "position"
const char* precision_name(Precision p);           // "fp32", "bf16"

struct MoeConfig {
    std::int64_t hidden_size = 0;                            // H   hidden_size
    std::int64_t num_experts = 0;                            // E   num_moe_experts
    std::int64_t topk = 1;                                   // K   moe_router_topk
    std::int64_t ffn_hidden_size = 0;                        // F   moe_ffn_hidden_size
    ScoreFunction score_function = ScoreFunction::kSoftmax;  // moe_router_score_function
    bool pre_softmax = false;                                // moe_router_pre_softmax
    std::int64_t num_groups = 0;  // moe_router_num_groups (0: no group-limited routing)
    std::int64_t group_topk = 0;  // moe_router_group_topk
    std::optional<double> topk_scaling_factor;  // moe_router_topk_scaling_factor
    bool router_fp32 = false;         // moe_router_dtype=fp32: router products in fp32 (the input
                                      // widened, the fp32 master weight) even in bf16 mode
    bool enable_expert_bias = false;  // moe_router_enable_expert_bias
    double expert_bias_update_rate = 1e-3;                        // moe_router_bias_update_rate
    LoadBalancing load_balancing_type = LoadBalancing::kAuxLoss;  // moe_router_load_balancing_type
    double aux_loss_coeff = 0.0;                                  // moe_aux_loss_coeff
    double z_loss_coeff = 0.0;                                    // moe_z_loss_coeff (0: no z-loss)
    std::optional<double> capacity_factor;        // moe_expert_capacity_factor (unset: dropless)
    DropPolicy drop_policy = DropPolicy::kProbs;  // moe_token_drop_policy
    bool pad_to_capacity = false;                 // moe_pad_expert_input_to_capacity
    std::int64_t shared_expert_size = 0;        // S  moe_shared_expert_intermediate_size (0: none)
    bool gradient_accumulation_fusion = false;  // gradient_accumulation_fusion
    Precision precision = Precision::kBf16;     // bf16 = true / false
    DispatcherKind dispatcher = DispatcherKind::kAlltoall;  // moe_token_dispatcher_type
    // C: the block's dispatch/mlp/combine run per chunk (moe_block.h), chunk c on group c of
    // L / C of each rank's local experts; moe_ep_overlap_num_chunks.
    std::int64_t num_chunks = 1;
    // Selective recompute (recompute_modules): moe_act, the experts' activation, recomputed from
    // their fc1 output for the fc2 weight gradient; shared_experts, the shared expert's fc1
    // output and activation, recomputed from its input in the backward (experts.h).
    bool recompute_moe_act = false;
    bool recompute_shared_experts = false;
    // moe_shared_expert_overlap (with a shared expert, without EP overlap, which excludes it):
    // the shared expert is a node of its own (block_shared_expert_forward / _backward), which
    // the schedule runs on the compute stream while the dispatch's all-to-all (forward) and the
    // combine backward's (backward) are in flight (docs/model.md "Shared-expert overlap").
    bool shared_expert_overlap = false;

    bool has_shared_experts() const { return shared_expert_size > 0; }
};

// Throws ErrorKind::kConfig naming the field, its value and the rule.
void validate_moe_config(const MoeConfig& cfg);

// The dtype kernels read and activations are stored in: bf16 or f32.
DType compute_dtype(const MoeConfig& cfg);
// The dtype of the router's products: f32 with router_fp32, else compute_dtype.
DType router_dtype(const MoeConfig& cfg);

// Capacity per expert for T local tokens: ceil(T * K / E * capacity_factor), as the reference
// computes it; -1 when dropless.
std::int64_t expert_capacity(const MoeConfig& cfg, std::int64_t num_tokens);

bool has_aux_loss(const MoeConfig& cfg);  // load balancing aux_loss or seq_aux_loss, coeff > 0

// The MoE layer of a model configuration (Megatron field names, see epo/config/model_config.h):
// precision bf16 when model.bf16, else fp32. Raises kConfig for a dense model and for settings
// this runtime does not execute (fp16, global_aux_loss, sinkhorn, an fp64 router, chunks by
// tokens), naming the field; the result is validated.
MoeConfig moe_config_from(const config::ModelConfig& model);

}  // namespace epo::moe
