#include "epo/config/runtime_support.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <optional>

#include "epo/config/rules.h"

namespace epo::config {
namespace {

// Where a feature shows in a finalized config: the key and its value, or nothing.
struct Use {
    std::string field;
    std::string value;
};
using Detector = std::function<std::optional<Use>(const Config&)>;

struct FeatureRow {
    RuntimeFeature feature;
    Detector uses;
    std::string_view fix;
};

std::optional<Use> when(bool used, std::string field, std::string value) {
    return used ? std::optional<Use>(Use{std::move(field), std::move(value)}) : std::nullopt;
}

// RT033's layout: an interleaved pipeline whose micro-batch count leaves a partial group of PP
// (known once the world size is).
bool interleaved_partial_group(const Config& c) {
    const int pp = c.model.pipeline_model_parallel_size;
    const std::int64_t n = num_microbatches(c);
    return pp > 1 && virtual_pipeline_size(c.model) > 1 && world_size(c) > 0 && n > 0 &&
           n % pp != 0;
}

// The id of the first combination with tensor parallelism that runs without it (RT039-RT043),
// "" when TP = 1 or none applies. One id per layout, as for RT002's: RT001 (and RT002, RT007)
// stand for TP (PP, MLA) alone.
std::string_view tp_combination(const Config& c) {
    const ModelConfig& m = c.model;
    if (m.tensor_model_parallel_size <= 1)
        return "";
    if (m.multi_latent_attention)
        return "RT039";
    if (m.pipeline_model_parallel_size > 1)
        return "RT043";
    if (m.mtp_num_layers.value_or(0) > 0 || m.share_embeddings_and_output_weights ||
        recomputes_module(m, RecomputeModule::kLayernorm))
        return "RT041";
    if (is_moe(m) && !m.sequence_parallel)
        return "RT040";
    if (is_moe(m) && (m.moe_aux_loss_coeff > 0 || m.moe_z_loss_coeff.value_or(0) > 0 ||
                      m.moe_router_enable_expert_bias))
        return "RT042";
    return "";
}

// The id of the first combination with expert tensor parallelism that runs without it
// (RT044-RT046), "" when ETP = 1 or none applies (ETP itself is RT004).
std::string_view etp_combination(const Config& c) {
    const ModelConfig& m = c.model;
    if (expert_tensor_parallel_size(m) <= 1)
        return "";
    if (is_moe(m) && m.moe_token_dispatcher_type == DispatcherType::kFlex &&
        m.moe_flex_dispatcher_backend)
        return "RT044";
    if (m.overlap_moe_expert_parallel_comm && m.moe_ep_overlap_num_chunks > 1)
        return "RT045";
    if (m.pipeline_model_parallel_size > 1)
        return "RT046";
    return "";
}

const std::vector<FeatureRow>& rows() {
    using C = const Config&;
    using RC = RuntimeCapabilities;
    static const std::vector<FeatureRow> table = {
        {{"RT001", "tensor parallelism (TP > 1)", &RC::tensor_parallel},
         [](C c) {
             // Its combinations that do not run have ids of their own (RT039-RT043).
             return when(c.model.tensor_model_parallel_size > 1 && tp_combination(c).empty(),
                         "model.tensor_model_parallel_size",
                         show(c.model.tensor_model_parallel_size));
         },
         "set model.tensor_model_parallel_size=1 (-tp 1)"},
        {{"RT002", "pipeline parallelism (PP > 1)", &RC::pipeline_parallel},
         [](C c) {
             // The layouts of it that do not run have ids of their own (RT027, RT033, with ETP
             // RT046); RT028 and RT037 (tied embeddings, MTP) run with the last stage's embedding
             // copy.
             return when(
                 c.model.pipeline_model_parallel_size > 1 &&
                     !c.model.share_embeddings_and_output_weights &&
                     !interleaved_partial_group(c) && c.model.mtp_num_layers.value_or(0) == 0 &&
                     c.model.tensor_model_parallel_size <= 1 &&
                     expert_tensor_parallel_size(c.model) <= 1,
                 "model.pipeline_model_parallel_size", show(c.model.pipeline_model_parallel_size));
         },
         "set model.pipeline_model_parallel_size=1 and virtual_pipeline_model_parallel_size=null"},
        {{"RT003", "context parallelism (CP > 1)", &RC::context_parallel},
         [](C c) {
             return when(c.model.context_parallel_size > 1, "model.context_parallel_size",
                         show(c.model.context_parallel_size));
         },
         "set model.context_parallel_size=1"},
        {{"RT004", "expert tensor parallelism (ETP > 1)", &RC::expert_tensor_parallel},
         [](C c) {
             // Its combinations that do not run have ids of their own (RT044-RT046).
             return when(expert_tensor_parallel_size(c.model) > 1 && etp_combination(c).empty(),
                         "model.expert_tensor_parallel_size",
                         show(expert_tensor_parallel_size(c.model)));
         },
         "set model.expert_tensor_parallel_size=1"},
        {{"RT005", "sequence parallelism", &RC::sequence_parallel},
         [](C c) {
             // As RT001: its combinations with TP that do not run have ids of their own.
             return when(c.model.sequence_parallel && tp_combination(c).empty(),
                         "model.sequence_parallel", "true");
         },
         "set model.sequence_parallel=false"},
        // One MTP layer runs (model/mtp.h); a chain of them does not.
        {{"RT006", "multi-token prediction with more than one MTP layer",
          &RC::multi_token_prediction},
         [](C c) {
             return when(c.model.mtp_num_layers.value_or(0) > 1, "model.mtp_num_layers",
                         show(c.model.mtp_num_layers));
         },
         "set model.mtp_num_layers=1 (or null)"},
        {{"RT007", "multi-latent attention", &RC::multi_latent_attention},
         [](C c) {
             // With a rope type other than plain rope it has an id of its own (RT034), with
             // tensor parallelism too (RT039).
             return when(c.model.multi_latent_attention && c.model.rope_type == "rope" &&
                             c.model.tensor_model_parallel_size <= 1,
                         "model.multi_latent_attention", "true");
         },
         "set model.multi_latent_attention=false"},
        // Full recompute runs (schedule.h "Full recompute"); selective recompute too
        // (model/transformer_layer.h), but for the modules of RT034.
        {{"RT008", "full activation recompute (recompute_granularity=full)", &RC::full_recompute},
         [](C c) {
             // With MTP it has an id of its own (RT038).
             return when(c.model.recompute_granularity == RecomputeGranularity::kFull &&
                             c.model.mtp_num_layers.value_or(0) == 0,
                         "model.recompute_granularity", "full");
         },
         "use model.recompute_granularity=selective with model.recompute_modules (core_attn, "
         "layernorm, moe_act, mlp, shared_experts run), or null"},
        {{"RT009", "fp16 training with loss scaling", &RC::fp16},
         [](C c) { return when(c.model.fp16, "model.fp16", "true"); },
         "use model.bf16=true and model.fp16=false"},
        {{"RT010", "fp32 training (neither bf16 nor fp16)", &RC::fp32_training},
         [](C c) { return when(!c.model.bf16 && !c.model.fp16, "model.bf16", "false"); },
         "set model.bf16=true"},
        // Shared-expert overlap runs (schedule.h "Shared-expert overlap").
        {{"RT011", "shared-expert overlap", &RC::shared_expert_overlap},
         [](C c) {
             return when(c.model.moe_shared_expert_overlap, "model.moe_shared_expert_overlap",
                         "true");
         },
         "set model.moe_shared_expert_overlap=false"},
        {{"RT012",
          "param-gather overlap without the distributed optimizer (nothing is sharded, so "
          "there is nothing to gather)",
          &RC::param_gather_overlap},
         [](C c) {
             return when(c.ddp.overlap_param_gather && !c.ddp.use_distributed_optimizer,
                         "ddp.overlap_param_gather", "true");
         },
         "set ddp.use_distributed_optimizer=true (its shards are what the overlap gathers), or "
         "ddp.overlap_param_gather=false (with a comm_overlap section: "
         "comm_overlap.overlap_param_gather=false)"},
        {{"RT013", "the distributed optimizer", &RC::distributed_optimizer},
         [](C c) {
             return when(c.ddp.use_distributed_optimizer, "ddp.use_distributed_optimizer", "true");
         },
         "set ddp.use_distributed_optimizer=false"},
        {{"RT014", "tensor-parallel communication overlap", &RC::tp_comm_overlap},
         [](C c) { return when(c.model.tp_comm_overlap, "model.tp_comm_overlap", "true"); },
         "set comm_overlap.tp_comm_overlap=false"},
        {{"RT015", "CUDA graphs", &RC::cuda_graphs},
         [](C c) {
             return when(c.model.cuda_graph_impl != CudaGraphImpl::kNone, "model.cuda_graph_impl",
                         show(c.model.cuda_graph_impl));
         },
         "set model.cuda_graph_impl=none"},
        {{"RT016", "the allgather token dispatcher", &RC::allgather_dispatcher},
         [](C c) {
             return when(
                 is_moe(c.model) && c.model.moe_token_dispatcher_type == DispatcherType::kAllgather,
                 "model.moe_token_dispatcher_type", "allgather");
         },
         "set model.moe_token_dispatcher_type=alltoall"},
        {{"RT018", "load balancing other than aux_loss / seq_aux_loss / none",
          &RC::other_load_balancing},
         [](C c) {
             const auto lb = c.model.moe_router_load_balancing_type;
             return when(is_moe(c.model) && (lb == LoadBalancingType::kSinkhorn ||
                                             lb == LoadBalancingType::kGlobalAuxLoss),
                         "model.moe_router_load_balancing_type", show(lb));
         },
         "use aux_loss, seq_aux_loss or none"},
        {{"RT019", "linear-layer biases", &RC::linear_biases},
         [](C c) {
             return when(c.model.add_bias_linear || c.model.add_qkv_bias,
                         c.model.add_bias_linear ? "model.add_bias_linear" : "model.add_qkv_bias",
                         "true");
         },
         "set model.add_bias_linear=false and model.add_qkv_bias=false"},
        {{"RT020", "query/key layernorm", &RC::qk_layernorm},
         [](C c) { return when(c.model.qk_layernorm, "model.qk_layernorm", "true"); },
         "set model.qk_layernorm=false"},
        {{"RT021", "LayerNorm (it has RMSNorm)", &RC::layernorm},
         [](C c) {
             return when(c.model.normalization != Normalization::kRMSNorm, "model.normalization",
                         show(c.model.normalization));
         },
         "set model.normalization=RMSNorm"},
        {{"RT022", "an MLP other than SwiGLU", &RC::non_swiglu_mlp},
         [](C c) {
             return when(
                 c.model.activation_func != ActivationFunc::kSilu || !c.model.gated_linear_unit,
                 "model.activation_func", show(c.model.activation_func));
         },
         "set model.activation_func=silu and model.gated_linear_unit=true"},
        {{"RT023", "position embeddings other than rotary", &RC::non_rope_positions},
         [](C c) {
             return when(c.model.position_embedding_type != PositionEmbedding::kRope,
                         "model.position_embedding_type", show(c.model.position_embedding_type));
         },
         "set model.position_embedding_type=rope"},
        {{"RT024", "tied input/output embeddings", &RC::tied_embeddings},
         [](C c) {
             return when(c.model.share_embeddings_and_output_weights &&
                             c.model.pipeline_model_parallel_size <= 1,
                         "model.share_embeddings_and_output_weights", "true");
         },
         "set model.share_embeddings_and_output_weights=false"},
        {{"RT025", "deferred embedding wgrad compute", &RC::embedding_wgrad_deferral},
         [](C c) {
             return when(
                 c.comm_overlap && c.comm_overlap->defer_embedding_wgrad_compute.value_or(false),
                 "comm_overlap.defer_embedding_wgrad_compute", "true");
         },
         "set comm_overlap.defer_embedding_wgrad_compute=false"},
        // The flex dispatcher (moe/flex_dispatcher.h) runs; its node grouping must tile the EP
        // group (flex_ranks_per_node in moe/flex_layout.h applies the same rule on every rank).
        {{"RT026", "the flex dispatcher over nodes that do not tile the expert-parallel group",
          &RC::flex_irregular_nodes},
         [](C c) {
             const int ep = c.model.expert_model_parallel_size, gpn = gpus_per_node(c.comm);
             return when(is_moe(c.model) &&
                             c.model.moe_token_dispatcher_type == DispatcherType::kFlex &&
                             c.model.moe_flex_dispatcher_backend && ep >= 1 && gpn >= 1 &&
                             gpn % ep != 0 && ep % gpn != 0,
                         "comm.gpus_per_node", show(gpn));
         },
         "choose comm.gpus_per_node dividing model.expert_model_parallel_size or a multiple of "
         "it (each EP group whole nodes or inside one node), or set "
         "model.moe_token_dispatcher_type=alltoall (--moe_flex_dispatcher_backend None)"},
        // Pipelines run (docs/pipeline.md); these two layouts of them do not.
        {{"RT027", "a virtual pipeline without pipeline stages (VPP set with PP = 1)",
          &RC::virtual_pipeline_one_stage},
         [](C c) {
             return when(c.model.pipeline_model_parallel_size <= 1 &&
                             c.model.virtual_pipeline_model_parallel_size.has_value(),
                         "model.virtual_pipeline_model_parallel_size",
                         show(c.model.virtual_pipeline_model_parallel_size));
         },
         "set model.virtual_pipeline_model_parallel_size=null, or PP > 1 (-pp N)"},
        {{"RT028",
          "tied input/output embeddings with pipeline parallelism (the embedding and the output "
          "layer live on different stages)",
          &RC::pipeline_tied_embeddings},
         [](C c) {
             return when(c.model.pipeline_model_parallel_size > 1 &&
                             c.model.share_embeddings_and_output_weights,
                         "model.share_embeddings_and_output_weights", "true");
         },
         "set model.share_embeddings_and_output_weights=false, or "
         "model.pipeline_model_parallel_size=1"},
        // Uneven splits run (config/pipeline_layout.h is the model's and the schedule's layout).
        {{"RT031",
          "uneven pipeline splits (num_layers_in_first/last_pipeline_stage, "
          "account_for_embedding/loss_in_pipeline_split, pipeline_model_parallel_layout)",
          &RC::uneven_pipeline},
         [](C c) {
             const ModelConfig& m = c.model;
             if (m.pipeline_model_parallel_layout)
                 return when(true, "model.pipeline_model_parallel_layout",
                             *m.pipeline_model_parallel_layout);
             if (m.num_layers_in_first_pipeline_stage || m.num_layers_in_last_pipeline_stage)
                 return when(true,
                             m.num_layers_in_first_pipeline_stage
                                 ? "model.num_layers_in_first_pipeline_stage"
                                 : "model.num_layers_in_last_pipeline_stage",
                             show(m.num_layers_in_first_pipeline_stage
                                      ? m.num_layers_in_first_pipeline_stage
                                      : m.num_layers_in_last_pipeline_stage));
             return when(
                 m.account_for_embedding_in_pipeline_split || m.account_for_loss_in_pipeline_split,
                 m.account_for_embedding_in_pipeline_split
                     ? "model.account_for_embedding_in_pipeline_split"
                     : "model.account_for_loss_in_pipeline_split",
                 "true");
         },
         "make model.num_layers a multiple of PP x VPP and null the uneven-split options (epo "
         "plan plans them)"},
        {{"RT032", "fp8 training", &RC::fp8_training},
         [](C c) { return when(c.model.fp8.has_value(), "model.fp8", show(c.model.fp8)); },
         "set model.fp8=null"},
        // The interleaved schedule (pipeline_schedule.h) runs micro-batches in groups of PP
        // through each model chunk; the step plan refuses a count that leaves a partial group.
        {{"RT033",
          "the interleaved pipeline schedule with a micro-batch count that is not a multiple of "
          "PP",
          &RC::interleaved_partial_group},
         [](C c) {
             return when(
                 interleaved_partial_group(c), "train.global_batch_size",
                 fmt::format("{} ({} micro-batches per step, PP {})", show(global_batch_size(c)),
                             num_microbatches(c), c.model.pipeline_model_parallel_size));
         },
         "use a global batch whose micro-batch count (global batch / (micro batch x DP)) is a "
         "multiple of model.pipeline_model_parallel_size, or "
         "model.virtual_pipeline_model_parallel_size=null"},
        // The MoE layer whole would re-run its all-to-alls in the backward; multi-latent
        // attention (model/mla_attention.h) keeps its probabilities, norm inputs and up
        // projections: its core_attn, layernorm and mla_up_proj are not recomputed.
        {{"RT034",
          "selective recompute of the moe module, or of core_attn, layernorm or mla_up_proj with "
          "multi-latent attention",
          &RC::recompute_moe_mla},
         [](C c) {
             std::vector<std::string> modules;
             using M = RecomputeModule;
             const bool mla = c.model.multi_latent_attention;
             for (M m : {M::kMoe, M::kMlaUpProj, M::kCoreAttn, M::kLayernorm}) {
                 const bool refused = m == M::kMoe || (mla && m != M::kMoe);
                 if (refused && recomputes_module(c.model, m))
                     modules.emplace_back(enum_name(m));
             }
             return when(!modules.empty(), "model.recompute_modules",
                         fmt::format("{} (in {})", fmt::join(modules, ", "),
                                     show(c.model.recompute_modules)));
         },
         "drop moe (and, with multi-latent attention, core_attn, layernorm and mla_up_proj) from "
         "model.recompute_modules (core_attn, layernorm, moe_act, mlp and shared_experts run; "
         "with MLA moe_act, mlp and shared_experts)"},
        // model/mla_attention.h applies plain rotary embeddings to MLA's positional part;
        // YaRN also rescales the frequencies and the softmax (mscale).
        {{"RT035", "multi-latent attention with a rope type other than plain rope (YaRN)",
          &RC::mla_yarn_rope},
         [](C c) {
             return when(c.model.multi_latent_attention && c.model.rope_type != "rope",
                         "model.rope_type", c.model.rope_type);
         },
         "set model.rope_type=rope (EPO's MLA runs plain rotary embeddings)"},
        // The MTP layer sits on the last stage and looks up the shifted tokens in the embedding,
        // which lives on stage 0: the last stage holds a copy (model/gpt_model.h), as for RT028.
        {{"RT037",
          "multi-token prediction with pipeline parallelism (the MTP on the last stage needs "
          "stage 0's embedding)",
          &RC::pipeline_mtp},
         [](C c) {
             return when(
                 c.model.mtp_num_layers.value_or(0) > 0 && c.model.pipeline_model_parallel_size > 1,
                 "model.mtp_num_layers", show(c.model.mtp_num_layers));
         },
         "set model.pipeline_model_parallel_size=1, or model.mtp_num_layers=null"},
        // Full recompute groups would take in the MTP layer, whose forward reads the decoder's
        // output and the shifted tokens' embedding: that pairing is not built or tested.
        {{"RT038", "multi-token prediction with full recompute", &RC::full_recompute_mtp},
         [](C c) {
             return when(c.model.mtp_num_layers.value_or(0) > 0 &&
                             c.model.recompute_granularity == RecomputeGranularity::kFull,
                         "model.recompute_granularity", "full");
         },
         "use model.recompute_granularity=selective, or model.mtp_num_layers=null"},
        // Tensor parallelism (RT001) runs for GQA attention, the dense MLP, the vocabulary and MoE
        // layers at ETP 1 (model/gpt_model.h); these combinations with it do not.
        {{"RT039", "multi-latent attention with tensor parallelism", &RC::tp_mla},
         [](C c) {
             return when(tp_combination(c) == "RT039", "model.multi_latent_attention", "true");
         },
         "set model.tensor_model_parallel_size=1 (-tp 1), or use GQA attention"},
        // Megatron-Core's MoE layer raises for it too; the model's MoE block expects the rank's
        // rows, which only the sequence-parallel split gives each TP rank.
        {{"RT040", "MoE layers with tensor parallelism but without sequence parallelism",
          &RC::tp_moe_without_sp},
         [](C c) { return when(tp_combination(c) == "RT040", "model.sequence_parallel", "false"); },
         "set model.sequence_parallel=true (-tp N sets it), or "
         "model.tensor_model_parallel_size=1"},
        {{"RT041",
          "multi-token prediction, tied embeddings or the layernorm recompute with tensor "
          "parallelism",
          &RC::tp_model_features},
         [](C c) -> std::optional<Use> {
             if (tp_combination(c) != "RT041")
                 return std::nullopt;
             if (c.model.mtp_num_layers.value_or(0) > 0)
                 return Use{"model.mtp_num_layers", show(*c.model.mtp_num_layers)};
             if (c.model.share_embeddings_and_output_weights)
                 return Use{"model.share_embeddings_and_output_weights", "true"};
             return when(recomputes_module(c.model, RecomputeModule::kLayernorm),
                         "model.recompute_modules", "layernorm");
         },
         "set model.tensor_model_parallel_size=1 (-tp 1), or drop the feature (mtp_num_layers="
         "null, share_embeddings_and_output_weights=false, layernorm out of recompute_modules)"},
        // Runs now: under sequence parallelism each TP rank routes its own rows, and the router
        // takes the aux loss's token counts over the TP group, scales both losses by the whole
        // micro-batch's tokens, and the expert-bias update sums the counts over TP and DP, as
        // Megatron-Core does over TP (x CP) (moe/router.h, train/expert_bias_update.h). The row
        // is for a runtime without that.
        {{"RT042", "the router's aux loss, z loss or expert bias with tensor parallelism",
          &RC::tp_router_losses},
         [](C c) -> std::optional<Use> {
             if (tp_combination(c) != "RT042")
                 return std::nullopt;
             if (c.model.moe_aux_loss_coeff > 0)
                 return Use{"model.moe_aux_loss_coeff", show(c.model.moe_aux_loss_coeff)};
             if (c.model.moe_z_loss_coeff.value_or(0) > 0)
                 return Use{"model.moe_z_loss_coeff", show(*c.model.moe_z_loss_coeff)};
             return when(c.model.moe_router_enable_expert_bias,
                         "model.moe_router_enable_expert_bias", "true");
         },
         "set model.moe_aux_loss_coeff=0, model.moe_z_loss_coeff=null and "
         "model.moe_router_enable_expert_bias=false, or model.tensor_model_parallel_size=1"},
        // Runs now (the stages' transfers carry the rank's rows; PipelineTensorParallel test).
        {{"RT043", "tensor parallelism with pipeline parallelism", &RC::tp_pipeline},
         [](C c) {
             return when(tp_combination(c) == "RT043", "model.pipeline_model_parallel_size",
                         show(c.model.pipeline_model_parallel_size));
         },
         "set model.pipeline_model_parallel_size=1, or model.tensor_model_parallel_size=1"},
        // Expert tensor parallelism (RT004) runs with the alltoall dispatcher (moe/
        // alltoall_dispatcher.h: the ETP gather and reduce-scatter inside dispatch and combine);
        // these combinations with it do not. Megatron-Core's flex dispatcher sends each token to
        // every ETP rank of its expert over the TP x EP group (no ETP gather), a different
        // exchange from this runtime's flex (moe/flex_dispatcher.h), which moves over EP only.
        {{"RT044", "the flex dispatcher with expert tensor parallelism", &RC::etp_flex},
         [](C c) {
             return when(etp_combination(c) == "RT044", "model.expert_tensor_parallel_size",
                         show(expert_tensor_parallel_size(c.model)));
         },
         "set model.moe_token_dispatcher_type=alltoall (--moe_flex_dispatcher_backend None), or "
         "model.expert_tensor_parallel_size=1"},
        // A chunk's all-to-all moves only its experts' rows; the ETP gather and reduce-scatter
        // are not split by chunk (moe/alltoall_dispatcher.h).
        {{"RT045", "MoE expert chunks with expert tensor parallelism", &RC::etp_expert_chunks},
         [](C c) {
             return when(etp_combination(c) == "RT045", "model.moe_ep_overlap_num_chunks",
                         show(c.model.moe_ep_overlap_num_chunks));
         },
         "set model.moe_ep_overlap_num_chunks=1, or model.expert_tensor_parallel_size=1"},
        // Runs now (PipelineExpertTensorParallel test: ETP with stages equals one stage).
        {{"RT046", "expert tensor parallelism with pipeline parallelism", &RC::etp_pipeline},
         [](C c) {
             return when(etp_combination(c) == "RT046", "model.pipeline_model_parallel_size",
                         show(c.model.pipeline_model_parallel_size));
         },
         "set model.pipeline_model_parallel_size=1, or model.expert_tensor_parallel_size=1"},
        {{"RT047", "gradients accumulated and reduced in the compute dtype",
          &RC::low_precision_grad_reduce},
         [](C c) { return when(!c.ddp.grad_reduce_in_fp32, "ddp.grad_reduce_in_fp32", "false"); },
         "set ddp.grad_reduce_in_fp32=true (the runtime's main gradients are fp32)"},
    };
    return table;
}

}  // namespace

RuntimeCapabilities RuntimeCapabilities::current() {
    RuntimeCapabilities caps;
    caps.qk_layernorm = true;            // model/attention.h
    caps.multi_latent_attention = true;  // model/mla_attention.h
    caps.tied_embeddings = true;         // model/gpt_model.h: the output layer reads the embedding
    caps.fp32_training = true;          // every kernel has an f32 path (the gradient checks use it)
    caps.distributed_optimizer = true;  // train/trainer.h (ZeRO-1, with bucketed param gather)
    caps.pipeline_parallel = true;      // schedule/pipeline_schedule.h, docs/pipeline.md
    caps.uneven_pipeline = true;        // config/pipeline_layout.h, used by model and schedule
    caps.full_recompute = true;         // schedule.h "Full recompute", model/gpt_model.h
    caps.shared_expert_overlap = true;  // schedule.h "Shared-expert overlap", moe/moe_block.h
    // The last stage's embedding copy and the embedding group (model/gpt_model.h).
    caps.pipeline_tied_embeddings = true;
    caps.pipeline_mtp = true;
    // model/gpt_model.h (GptShape::tp_size, sequence_parallel), train/optimizer.h (TP sums).
    caps.tensor_parallel = true;
    caps.sequence_parallel = true;
    caps.tp_pipeline = true;  // tests/train/tensor_parallel_mpi_test.cpp PipelineTensorParallel
    // moe/router.h (sequence group), train/expert_bias_update.h (TP sum of the counts).
    caps.tp_router_losses = true;
    // moe/alltoall_dispatcher.h (ETP gather / reduce-scatter), model/gpt_model.h (ETP shards),
    // train/optimizer.h (the norm's ETP sum); tests/train/expert_tensor_parallel_mpi_test.cpp.
    caps.expert_tensor_parallel = true;
    caps.etp_pipeline = true;  // tests/train/expert_tensor_parallel_mpi_test.cpp
    return caps;
}

const std::vector<RuntimeFeature>& runtime_features() {
    static const std::vector<RuntimeFeature> features = [] {
        std::vector<RuntimeFeature> out;
        for (const auto& row : rows()) {
            out.push_back(row.feature);
        }
        return out;
    }();
    return features;
}

std::vector<Finding> runtime_findings(const Config& config, const RuntimeCapabilities& caps) {
    std::vector<Finding> out;
    for (const auto& row : rows()) {
        if (caps.*(row.feature.supported)) {
            continue;
        }
        if (auto use = row.uses(config)) {
            out.push_back(
                Finding{std::string(row.feature.id), use->field, use->value,
                        fmt::format("the epo runtime does not execute {} yet", row.feature.feature),
                        std::string(row.fix)});
        }
    }
    return out;
}

}  // namespace epo::config
