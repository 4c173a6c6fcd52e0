// EP-overlap rules (EP001-EP013), delayed-wgrad rules (WG001-WG006), flex gating of a built config
// (FX001/FX002) and the overlap advisories (W005, W011, W012); docs/config.md "Rules" describes
// them and the README's rule reference lists every id.
//
// The reference asserts these one by one and stops at the first; here every violated rule is
// reported. They apply when the finalized model runs EP overlap / delayed wgrad: that is the
// user's comm_overlap value when the section exists (a non-null user value always wins), and
// the model's own value when it does not.
#include <algorithm>

#include "epo/config/rules.h"

namespace epo::config {
namespace {

bool older_than(const std::optional<std::string>& version, std::string_view minimum) {
    // An unparseable version is EN002/EN003's error, not also a version-rule violation.
    return version && parse_version(*version) && !version_at_least(*version, minimum);
}

// Full recompute with EP overlap: Megatron-Bridge's overlap validation refuses it
// (training/comm_overlap.py asserts recompute_granularity != "full", and a null method and layer
// count); Megatron-LM's dev branch runs it (its combined step replays each recomputed segment
// before the segment's backward), and so does epo (schedule.h "Full recompute"). So EP007 is a
// warning that names Bridge's refusal, and with full recompute the method and layer count are
// MC008's to check; without it they must be null, as both references require.
void check_recompute(const RuleContext& ctx) {
    const ModelConfig& m = ctx.user.model;
    const bool full = m.recompute_granularity == RecomputeGranularity::kFull;
    if (full) {
        ctx.warn("EP007", "model.recompute_granularity", "full",
                 "Megatron-Bridge's overlap validation refuses full recompute with EP overlap; "
                 "Megatron-LM's dev branch and epo run it (the recomputed layers' forward runs "
                 "again in the combined step, its dispatch exposed)",
                 "keep it for epo or a Megatron-LM target; for a Bridge run set "
                 "model.recompute_granularity=selective or null");
    }
    if (m.recompute_method && !full) {
        ctx.error("EP008", "model.recompute_method", show(m.recompute_method),
                  "a recompute method without full recompute cannot be set with EP overlap",
                  "set model.recompute_method=null");
    }
    if (m.recompute_num_layers && !full) {
        ctx.error("EP009", "model.recompute_num_layers", show(m.recompute_num_layers),
                  "recompute_num_layers must be null with EP overlap unless recompute is full",
                  "set model.recompute_num_layers=null");
    }
    if (m.recompute_modules && std::find(m.recompute_modules->begin(), m.recompute_modules->end(),
                                         RecomputeModule::kMoe) != m.recompute_modules->end()) {
        ctx.error("EP010", "model.recompute_modules", show(m.recompute_modules),
                  "recomputing the moe module cannot run with EP overlap",
                  "drop moe from model.recompute_modules");
    }
}

// "The weight gradient falls inside a CUDA-graph scope" (docs/config.md "Weight gradients inside
// a CUDA-graph scope").
bool wgrad_in_graph(const ModelConfig& m) {
    return is_graphed(m, "attn") ||
           (is_graphed(m, "moe_router") && m.moe_shared_expert_intermediate_size &&
            !m.moe_shared_expert_overlap);
}

}  // namespace

void check_ep_overlap(const RuleContext& ctx) {
    if (!ctx.fin.model.overlap_moe_expert_parallel_comm) {
        return;
    }
    const ModelConfig& m = ctx.user.model;
    if (m.expert_model_parallel_size <= 1) {
        ctx.error("EP001", "model.expert_model_parallel_size", show(m.expert_model_parallel_size),
                  "EP overlap hides the expert-parallel all-to-all, which needs "
                  "expert_model_parallel_size > 1",
                  "set model.expert_model_parallel_size > 1 (-ep N)");
    }
    if (m.num_moe_experts.value_or(0) <= 1) {
        ctx.error("EP002", "model.num_moe_experts", show(m.num_moe_experts),
                  "EP overlap needs an MoE model with more than one expert",
                  "use an MoE model with more than one expert (model.num_moe_experts > 1)");
    }
    if (m.moe_token_dispatcher_type == DispatcherType::kAllgather) {
        ctx.error("EP003", "model.moe_token_dispatcher_type", show(m.moe_token_dispatcher_type),
                  "EP overlap runs only with the alltoall or flex token dispatcher",
                  "set model.moe_token_dispatcher_type=alltoall (or flex)");
    }
    if (!m.bf16 && !m.fp16) {
        ctx.error("EP004", "model.bf16", "false", "EP overlap needs bf16 or fp16 training",
                  "set model.bf16=true");
    }
    if (ctx.target.has_torch && older_than(ctx.user.env.torch_version, "2.6.0")) {
        ctx.error("EP005", "env.torch_version", *ctx.user.env.torch_version,
                  "EP overlap hangs with torch older than 2.6.0", "upgrade to torch >= 2.6.0");
    }
    if (m.pipeline_model_parallel_size > 1 && !m.virtual_pipeline_model_parallel_size) {
        ctx.error("EP006", "model.virtual_pipeline_model_parallel_size", "null",
                  fmt::format("with pipeline_model_parallel_size {} EP overlap runs only in the "
                              "interleaved schedule, which needs a virtual pipeline size",
                              m.pipeline_model_parallel_size),
                  "set model.virtual_pipeline_model_parallel_size (-vp N) when PP > 1");
    }
    check_recompute(ctx);
    if (m.moe_shared_expert_overlap) {
        ctx.error("EP011", "model.moe_shared_expert_overlap", "true",
                  "shared-expert overlap and EP overlap cannot both run",
                  "set model.moe_shared_expert_overlap=false");
    }
    if (m.mtp_num_layers.value_or(0) > 1) {
        ctx.error("EP012", "model.mtp_num_layers", show(m.mtp_num_layers),
                  "EP overlap supports at most one multi-token-prediction layer",
                  "use at most one MTP layer (model.mtp_num_layers <= 1)");
    }
    if (m.cuda_graph_impl == CudaGraphImpl::kTransformerEngine &&
        (is_graphed(m, "moe") || is_graphed(m, "mlp"))) {
        ctx.error("EP013", "model.cuda_graph_modules", show(graphed_module_names(m)),
                  "with transformer_engine CUDA graphs and EP overlap, the moe and mlp modules "
                  "cannot be graphed",
                  "graph only attn / moe_router / moe_preprocess");
    }
}

void check_delay_wgrad(const RuleContext& ctx) {
    if (!ctx.fin.model.delay_wgrad_compute) {
        return;
    }
    const Config& c = ctx.user;
    const ModelConfig& m = c.model;
    const auto& co = c.comm_overlap;
    const bool ep_asked = m.overlap_moe_expert_parallel_comm ||
                          (co && co->overlap_moe_expert_parallel_comm.value_or(false));
    if (!ep_asked) {
        ctx.error("WG001", "comm_overlap.delay_wgrad_compute", "true",
                  "delayed weight-gradient compute needs EP overlap: without it there is no "
                  "communication to hide the delayed wgrad behind",
                  "set comm_overlap.overlap_moe_expert_parallel_comm=true (--moe_a2a_overlap "
                  "true sets both)");
    } else if (!ctx.fin.model.overlap_moe_expert_parallel_comm) {
        ctx.error("WG001", "comm_overlap.overlap_moe_expert_parallel_comm", "null",
                  "the finalized model delays wgrad but runs without EP overlap: "
                  "model.overlap_moe_expert_parallel_comm is true but the unset "
                  "comm_overlap.overlap_moe_expert_parallel_comm overrides it with false",
                  "set comm_overlap.overlap_moe_expert_parallel_comm=true");
    }
    const bool grad_reduce_overlap = c.ddp.overlap_grad_reduce ||
                                     (co && co->overlap_grad_reduce.value_or(false)) ||
                                     ctx.fin.ddp.overlap_grad_reduce;
    if (grad_reduce_overlap && older_than(c.env.te_version, "2.7.0")) {
        ctx.error("WG002", "env.te_version", *c.env.te_version,
                  "delayed wgrad with overlapped gradient reduction needs Transformer Engine "
                  ">= 2.7.0",
                  "upgrade to TE >= 2.7.0, or turn off ddp.overlap_grad_reduce");
    }
    if (m.gradient_accumulation_fusion && older_than(c.env.te_version, "2.7.0")) {
        ctx.error("WG003", "env.te_version", *c.env.te_version,
                  "delayed wgrad with gradient_accumulation_fusion needs Transformer Engine "
                  ">= 2.7.0",
                  "upgrade to TE >= 2.7.0, or set model.gradient_accumulation_fusion=false");
    }
    if (!wgrad_in_graph(m)) {
        return;
    }
    const std::string graphed = show(graphed_module_names(m));
    if (older_than(c.env.te_version, "2.12.0")) {
        ctx.error("WG004", "env.te_version", *c.env.te_version,
                  fmt::format("delayed wgrad inside a CUDA-graph scope ({}) needs Transformer "
                              "Engine >= 2.12.0",
                              graphed),
                  "upgrade to TE >= 2.12.0, or graph neither attn nor (with unoverlapped shared "
                  "experts) moe_router");
    }
    if (!m.gradient_accumulation_fusion) {
        ctx.error("WG005", "model.gradient_accumulation_fusion", "false",
                  fmt::format("delayed wgrad inside a CUDA-graph scope ({}) needs static gradient "
                              "buffers, i.e. gradient_accumulation_fusion",
                              graphed),
                  "set model.gradient_accumulation_fusion=true");
    }
    if (is_graphed(m, "attn") && (m.add_bias_linear || m.add_qkv_bias)) {
        const char* field = m.add_bias_linear ? "model.add_bias_linear" : "model.add_qkv_bias";
        ctx.error("WG006", field, "true",
                  "delayed wgrad with a graphed attention module does not support linear biases",
                  "set model.add_bias_linear=false and model.add_qkv_bias=false");
    }
}

void check_flex(const RuleContext& ctx, const DeviceProbe& probe) {
    const ModelConfig& m = ctx.user.model;
    if (m.moe_flex_dispatcher_backend && m.moe_token_dispatcher_type != DispatcherType::kFlex) {
        ctx.warn("W005", "model.moe_flex_dispatcher_backend", show(m.moe_flex_dispatcher_backend),
                 fmt::format("a flex backend is set but the dispatcher is {}: setting the backend "
                             "alone does not activate flex dispatch",
                             show(m.moe_token_dispatcher_type)),
                 "activate it with the activation step: --moe_flex_dispatcher_backend " +
                     show(m.moe_flex_dispatcher_backend));
    }
    if (!find_device(ctx.user.env.gpu) && !probe) {
        return;  // EN001 already says the device is unknown; the table probe would only repeat it
    }
    if (auto finding = check_flex_backend(m, probe ? probe : table_probe(ctx.user.env.gpu))) {
        ctx.errors.push_back(std::move(*finding));
    }
}

void check_advisories(const RuleContext& ctx) {
    const Config& c = ctx.fin;
    if (!c.model.overlap_moe_expert_parallel_comm) {
        return;
    }
    // The reference's advice is about its GPU clusters; on our runtime the link model decides.
    const int ep = c.model.expert_model_parallel_size;
    // Both need the topology; without one they wait for the launch (validate() notes it).
    if (!topology_stated(c.comm)) {
        return;
    }
    if (ctx.target.declared_stack && ep > 1 && ep <= 4 &&
        c.model.moe_token_dispatcher_type == DispatcherType::kAlltoall && num_nodes(c.comm) <= 2) {
        ctx.warn("W011", "model.expert_model_parallel_size", show(ep),
                 fmt::format("EP overlap at EP {} with the alltoall dispatcher on {} node(s): the "
                             "reference advises against it, the all-to-all is too small to gain "
                             "from hiding",
                             ep, num_nodes(c.comm)));
    }
    const std::int64_t microbatches = num_microbatches(c);
    // MoE chunks overlap within one micro-batch (docs/chunked-overlap.md).
    if (microbatches < 2 && c.model.moe_ep_overlap_num_chunks <= 1) {
        ctx.warn("W012", "train.global_batch_size", show(global_batch_size(c)),
                 fmt::format("{} micro-batch per step: EP overlap pairs the forward of one "
                             "micro-batch with the backward of another, so nothing overlaps",
                             microbatches),
                 "use a global batch of at least 2 x micro batch x data-parallel size, or "
                 "MoE chunks (model.moe_ep_overlap_num_chunks > 1)");
    }
}

}  // namespace epo::config
