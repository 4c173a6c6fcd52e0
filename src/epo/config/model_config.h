// The `model` section: architecture, parallel sizes, MoE routing and dispatch, precision,
// recompute, CUDA graphs, and the communication fields that finalization mirrors in from
// `comm_overlap`. Field names and defaults are Megatron-Core's TransformerConfig /
// ModelParallelConfig ones (Megatron-Bridge's GPT provider where Core has none), so configs carry
// over unchanged. std::optional marks the fields the reference allows to be None; null keeps its
// reference meaning (for example num_moe_experts null = dense model, moe_expert_capacity_factor
// null = dropless).
//
// Derived values the runtime reads (effective ETP, kv_channels, which layers are MoE, ...) are
// free functions in config.h, never re-derived from strings.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "epo/config/field_types.h"

namespace epo::config {

inline constexpr int kMaxNumLayers = 4096;

struct ModelConfig {
    using IsSection = void;

    // Architecture.
    int num_layers = 0;
    int hidden_size = 0;
    std::optional<int> ffn_hidden_size;  // null: 4 * hidden_size
    int num_attention_heads = 0;
    std::optional<int> num_query_groups;  // null: one group per head (plain multi-head attention)
    std::optional<int> kv_channels;       // null: hidden_size / num_attention_heads
    int seq_length = 1024;
    std::optional<int> vocab_size;
    Normalization normalization = Normalization::kLayerNorm;
    double layernorm_epsilon = 1e-5;
    bool qk_layernorm = false;
    ActivationFunc activation_func = ActivationFunc::kGelu;
    bool gated_linear_unit = false;  // with activation_func silu: SwiGLU
    bool add_bias_linear = true;
    bool add_qkv_bias = false;
    PositionEmbedding position_embedding_type = PositionEmbedding::kLearnedAbsolute;
    double rotary_base = 10000.0;
    double init_method_std = 0.02;
    bool share_embeddings_and_output_weights = true;
    // Multi-latent attention (DeepSeek); the sizes are used only when it is on.
    bool multi_latent_attention = false;
    std::optional<int> q_lora_rank = 512;  // null: queries are not compressed
    int kv_lora_rank = 512;
    int qk_head_dim = 128;
    int qk_pos_emb_head_dim = 64;
    int v_head_dim = 128;
    // MLA's rotary embedding: "rope" (plain, what the runtime runs) or "yarn" (YaRN's frequency
    // scaling and softmax mscale: RT035). Megatron's MLA config defaults to "yarn"; EPO's
    // default is the variant it runs, and a config that names yarn is refused, not run as rope.
    std::string rope_type = "rope";

    // Parallel sizes.
    int tensor_model_parallel_size = 1;
    int pipeline_model_parallel_size = 1;
    std::optional<int> virtual_pipeline_model_parallel_size;
    // Uneven pipeline splits (config/pipeline_layout.h has the rules): at most one way of them.
    bool account_for_embedding_in_pipeline_split = false;
    bool account_for_loss_in_pipeline_split = false;
    std::optional<int> num_layers_in_first_pipeline_stage;
    std::optional<int> num_layers_in_last_pipeline_stage;
    std::optional<std::string> pipeline_model_parallel_layout;  // "Ett|(tt|)*6mL"
    int expert_model_parallel_size = 1;
    std::optional<int> expert_tensor_parallel_size;  // null: same as tensor_model_parallel_size
    bool sequence_parallel = false;
    int context_parallel_size = 1;

    // Mixture of experts.
    std::optional<int> num_moe_experts;      // null (or 0): dense model
    std::optional<int> moe_ffn_hidden_size;  // null: ffn_hidden_size
    int moe_router_topk = 2;
    ScoreFunction moe_router_score_function = ScoreFunction::kSoftmax;
    bool moe_router_pre_softmax = false;  // softmax over all logits before top-k (else over top-k)
    std::optional<int> moe_router_num_groups;
    std::optional<int> moe_router_group_topk;
    std::optional<double> moe_router_topk_scaling_factor;
    bool moe_router_enable_expert_bias = false;
    double moe_router_bias_update_rate = 1e-3;
    std::optional<RouterDtype> moe_router_dtype;  // null: the parameters' precision
    LoadBalancingType moe_router_load_balancing_type = LoadBalancingType::kAuxLoss;
    double moe_aux_loss_coeff = 0.0;
    std::optional<double> moe_z_loss_coeff;
    std::optional<double> moe_expert_capacity_factor;  // null: dropless
    bool moe_pad_expert_input_to_capacity = false;
    TokenDropPolicy moe_token_drop_policy = TokenDropPolicy::kProbs;
    std::optional<int> moe_shared_expert_intermediate_size;  // null: no shared expert
    bool moe_shared_expert_overlap = false;
    MoeLayerFreq moe_layer_freq = 1;
    DispatcherType moe_token_dispatcher_type = DispatcherType::kAllgather;
    std::optional<FlexBackend> moe_flex_dispatcher_backend;
    bool moe_permute_fusion = false;
    // Chunks of each MoE layer's dispatch/mlp/combine, so one chunk's all-to-all runs under
    // another's experts (docs/chunked-overlap.md); 1: whole micro-batches. The reference's open
    // proposal names the feature moe_ep_chunk_overlap; this is its count. A chunk is a group of
    // each rank's local experts (experts: every product and sum as unchunked). The proposal's
    // slices of the micro-batch's tokens (tokens) lost in step time and are refused (MO007).
    int moe_ep_overlap_num_chunks = 1;
    ChunkSplit moe_ep_overlap_chunk_by = ChunkSplit::kExperts;
    // The overlap schedule runs the step's first two forwards together and its last two
    // backwards together, instead of the first forward and the last backward alone, so their
    // all-to-alls hide under the other micro-batch's compute (docs/design.md "Schedules").
    // Bit-identical; about 2x the baseline's peak activations (1.4-1.5x unpaired), three
    // micro-batches in flight with 3 or more per step. Overlap only (W015).
    bool moe_ep_overlap_pair_edges = false;

    // Precision.
    bool bf16 = false;
    bool fp16 = false;
    // fp8 training (Transformer Engine's recipes, on top of bf16): the format, e4m3 or hybrid
    // (e4m3 forward, e5m2 gradients); null: none. The scaling recipe: delayed, tensorwise,
    // mxfp8 (Blackwell) or blockwise (Hopper). Rules: config/fp8_rules.h.
    std::optional<std::string> fp8;
    std::string fp8_recipe = "delayed";

    // Activation recompute.
    std::optional<RecomputeGranularity> recompute_granularity;
    std::optional<RecomputeMethod> recompute_method;
    std::optional<int> recompute_num_layers;
    std::optional<std::vector<RecomputeModule>> recompute_modules;

    std::optional<int> mtp_num_layers;  // multi-token prediction layers; null: none
    // The MTP loss's weight in the objective: each MTP layer's loss enters it times
    // mtp_loss_scaling_factor / mtp_num_layers (Megatron-Core's default 0.1).
    double mtp_loss_scaling_factor = 0.1;
    bool gradient_accumulation_fusion = false;

    // CUDA graphs: the implementation, the graphed modules, and the legacy scope spelling.
    CudaGraphImpl cuda_graph_impl = CudaGraphImpl::kNone;
    std::vector<CudaGraphModule> cuda_graph_modules;
    std::optional<CudaGraphScopeValue> cuda_graph_scope;

    // Mirrored from comm_overlap by finalization (see finalize.h).
    bool overlap_moe_expert_parallel_comm = false;
    bool delay_wgrad_compute = false;
    bool tp_comm_overlap = false;
    bool overlap_p2p_comm = false;
    bool batch_p2p_comm = true;

    bool operator==(const ModelConfig&) const = default;

    template <class Self, class V>
    static void fields(Self& s, V&& v) {
        const auto positive = Limits::at_least(1);
        v("num_layers", s.num_layers, Limits::between(1, kMaxNumLayers));
        v("hidden_size", s.hidden_size, positive);
        v("ffn_hidden_size", s.ffn_hidden_size, positive);
        v("num_attention_heads", s.num_attention_heads, positive);
        v("num_query_groups", s.num_query_groups, positive);
        v("kv_channels", s.kv_channels, positive);
        v("seq_length", s.seq_length, positive);
        v("vocab_size", s.vocab_size, positive);
        v("normalization", s.normalization);
        v("layernorm_epsilon", s.layernorm_epsilon, Limits::above(0));
        v("qk_layernorm", s.qk_layernorm);
        v("activation_func", s.activation_func);
        v("gated_linear_unit", s.gated_linear_unit);
        v("add_bias_linear", s.add_bias_linear);
        v("add_qkv_bias", s.add_qkv_bias);
        v("position_embedding_type", s.position_embedding_type);
        v("rotary_base", s.rotary_base, Limits::above(0));
        v("init_method_std", s.init_method_std, Limits::above(0));
        v("share_embeddings_and_output_weights", s.share_embeddings_and_output_weights);
        v("multi_latent_attention", s.multi_latent_attention);
        v("q_lora_rank", s.q_lora_rank, positive);
        v("kv_lora_rank", s.kv_lora_rank, positive);
        v("qk_head_dim", s.qk_head_dim, positive);
        v("qk_pos_emb_head_dim", s.qk_pos_emb_head_dim, Limits::at_least(0));
        v("v_head_dim", s.v_head_dim, positive);
        v("rope_type", s.rope_type);
        v("tensor_model_parallel_size", s.tensor_model_parallel_size, positive);
        v("pipeline_model_parallel_size", s.pipeline_model_parallel_size, positive);
        v("virtual_pipeline_model_parallel_size", s.virtual_pipeline_model_parallel_size, positive);
        v("account_for_embedding_in_pipeline_split", s.account_for_embedding_in_pipeline_split);
        v("account_for_loss_in_pipeline_split", s.account_for_loss_in_pipeline_split);
        v("num_layers_in_first_pipeline_stage", s.num_layers_in_first_pipeline_stage);
        v("num_layers_in_last_pipeline_stage", s.num_layers_in_last_pipeline_stage);
        v("pipeline_model_parallel_layout", s.pipeline_model_parallel_layout);
        v("expert_model_parallel_size", s.expert_model_parallel_size, positive);
        v("expert_tensor_parallel_size", s.expert_tensor_parallel_size, positive);
        v("sequence_parallel", s.sequence_parallel);
        v("context_parallel_size", s.context_parallel_size, positive);
        v("num_moe_experts", s.num_moe_experts, Limits::at_least(0));
        v("moe_ffn_hidden_size", s.moe_ffn_hidden_size, positive);
        v("moe_router_topk", s.moe_router_topk, positive);
        v("moe_router_score_function", s.moe_router_score_function);
        v("moe_router_pre_softmax", s.moe_router_pre_softmax);
        v("moe_router_num_groups", s.moe_router_num_groups, positive);
        v("moe_router_group_topk", s.moe_router_group_topk, positive);
        v("moe_router_topk_scaling_factor", s.moe_router_topk_scaling_factor, Limits::above(0));
        v("moe_router_enable_expert_bias", s.moe_router_enable_expert_bias);
        v("moe_router_bias_update_rate", s.moe_router_bias_update_rate, Limits::at_least(0));
        v("moe_router_dtype", s.moe_router_dtype);
        v("moe_router_load_balancing_type", s.moe_router_load_balancing_type);
        v("moe_aux_loss_coeff", s.moe_aux_loss_coeff, Limits::at_least(0));
        v("moe_z_loss_coeff", s.moe_z_loss_coeff, Limits::at_least(0));
        v("moe_expert_capacity_factor", s.moe_expert_capacity_factor, Limits::above(0));
        v("moe_pad_expert_input_to_capacity", s.moe_pad_expert_input_to_capacity);
        v("moe_token_drop_policy", s.moe_token_drop_policy);
        v("moe_shared_expert_intermediate_size", s.moe_shared_expert_intermediate_size, positive);
        v("moe_shared_expert_overlap", s.moe_shared_expert_overlap);
        v("moe_layer_freq", s.moe_layer_freq);
        v("moe_token_dispatcher_type", s.moe_token_dispatcher_type);
        v("moe_flex_dispatcher_backend", s.moe_flex_dispatcher_backend);
        v("moe_permute_fusion", s.moe_permute_fusion);
        v("moe_ep_overlap_num_chunks", s.moe_ep_overlap_num_chunks, positive);
        v("moe_ep_overlap_chunk_by", s.moe_ep_overlap_chunk_by);
        v("moe_ep_overlap_pair_edges", s.moe_ep_overlap_pair_edges);
        v("bf16", s.bf16);
        v("fp16", s.fp16);
        v("fp8", s.fp8);
        v("fp8_recipe", s.fp8_recipe);
        v("recompute_granularity", s.recompute_granularity);
        v("recompute_method", s.recompute_method);
        v("recompute_num_layers", s.recompute_num_layers, positive);
        v("recompute_modules", s.recompute_modules);
        v("mtp_num_layers", s.mtp_num_layers, Limits::at_least(0));
        v("mtp_loss_scaling_factor", s.mtp_loss_scaling_factor, Limits::at_least(0));
        v("gradient_accumulation_fusion", s.gradient_accumulation_fusion);
        v("cuda_graph_impl", s.cuda_graph_impl);
        v("cuda_graph_modules", s.cuda_graph_modules);
        v("cuda_graph_scope", s.cuda_graph_scope);
        v("overlap_moe_expert_parallel_comm", s.overlap_moe_expert_parallel_comm);
        v("delay_wgrad_compute", s.delay_wgrad_compute);
        v("tp_comm_overlap", s.tp_comm_overlap);
        v("overlap_p2p_comm", s.overlap_p2p_comm);
        v("batch_p2p_comm", s.batch_p2p_comm);
    }
};

}  // namespace epo::config
