// What our runtime executes ("RT" checks, docs/config.md "Runtime support (RT)"): one id per
// feature it does not execute yet, so nothing a config asks for is silently ignored. `epo validate`
// lists these as warnings (the config may well be valid for a GPU target); `epo train` /
// `epo bench` refuse to start with any of them (validate_for_run in validate.h), before any rank
// does work.
//
// The set is data: RuntimeCapabilities says which features run. As the runtime gains one, its
// owner flips the member in RuntimeCapabilities::current() and the id stops being reported.
// Everything not listed here (EP/DP over MPI, the alltoall dispatcher dropless or with capacity,
// softmax/sigmoid routers with groups and expert bias, aux/seq-aux/z losses, shared experts, dense
// layers, EP overlap, delayed wgrad, bf16 with fp32 master weights, GQA, RMSNorm, SwiGLU, rotary
// embeddings) is what the runtime has executed from the start, so it needs no id.
#pragma once

#include <string_view>
#include <vector>

#include "epo/config/config.h"
#include "epo/config/finding.h"

namespace epo::config {

struct RuntimeCapabilities {
    bool tensor_parallel = false;             // RT001
    bool pipeline_parallel = false;           // RT002
    bool context_parallel = false;            // RT003
    bool expert_tensor_parallel = false;      // RT004 (runs now, alltoall)
    bool sequence_parallel = false;           // RT005
    bool multi_token_prediction = false;      // RT006 (more than one MTP layer; one runs)
    bool multi_latent_attention = false;      // RT007
    bool full_recompute = false;              // RT008 (runs now)
    bool fp16 = false;                        // RT009
    bool fp32_training = false;               // RT010
    bool shared_expert_overlap = false;       // RT011 (runs now)
    bool param_gather_overlap = false;        // RT012 (without a distributed optimizer: never)
    bool distributed_optimizer = false;       // RT013
    bool tp_comm_overlap = false;             // RT014
    bool cuda_graphs = false;                 // RT015
    bool allgather_dispatcher = false;        // RT016
    bool other_load_balancing = false;        // RT018
    bool linear_biases = false;               // RT019
    bool qk_layernorm = false;                // RT020
    bool layernorm = false;                   // RT021
    bool non_swiglu_mlp = false;              // RT022
    bool non_rope_positions = false;          // RT023
    bool tied_embeddings = false;             // RT024
    bool embedding_wgrad_deferral = false;    // RT025
    bool flex_irregular_nodes = false;        // RT026 (RT017, flex itself, runs now)
    bool virtual_pipeline_one_stage = false;  // RT027
    bool pipeline_tied_embeddings = false;    // RT028
    bool uneven_pipeline = false;             // RT031
    bool fp8_training = false;                // RT032
    bool interleaved_partial_group = false;   // RT033
    bool recompute_moe_mla = false;           // RT034 (the moe / mla_up_proj modules)
    bool mla_yarn_rope = false;               // RT035
    bool pipeline_mtp = false;                // RT037
    bool full_recompute_mtp = false;          // RT038
    bool tp_mla = false;                      // RT039
    bool tp_moe_without_sp = false;           // RT040
    bool tp_model_features = false;           // RT041 (MTP, tied embeddings, layernorm recompute)
    bool tp_router_losses = false;            // RT042 (aux / z loss, expert bias; runs now)
    bool tp_pipeline = false;                 // RT043 (runs now)
    bool etp_flex = false;                    // RT044 (the flex dispatcher with ETP > 1)
    bool etp_expert_chunks = false;           // RT045 (MoE chunks with ETP > 1)
    bool etp_pipeline = false;                // RT046 (ETP > 1 with PP > 1; runs now)
    bool low_precision_grad_reduce = false;   // RT047 (ddp.grad_reduce_in_fp32 false)

    // What the runtime on this branch executes.
    static RuntimeCapabilities current();
};

struct RuntimeFeature {
    std::string_view id;       // "RT001"
    std::string_view feature;  // "tensor parallelism (TP > 1)"
    bool RuntimeCapabilities::*supported;
};

const std::vector<RuntimeFeature>& runtime_features();

// One finding per feature the finalized `config` uses and `caps` lacks.
std::vector<Finding> runtime_findings(const Config& config, const RuntimeCapabilities& caps);

}  // namespace epo::config
