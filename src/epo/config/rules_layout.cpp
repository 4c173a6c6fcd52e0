// Layout and shape checks (LY), MoE sanity (MO) and the dataset (DS). World size here is the
// configured one (comm.num_nodes x comm.gpus_per_node). A configuration that leaves the topology
// to the launcher has no world size yet: the checks that need one (LY002, LY003, the
// data-parallel part of LY004) run when the job starts, where resolve_topology() has filled it in
// and check_world_size() (validate.h, LY009) has checked it against MPI.
#include <algorithm>

#include "epo/config/fp8_rules.h"
#include "epo/config/pipeline_layout.h"
#include "epo/config/rules.h"

namespace epo::config {
namespace {

void check_moe_layer_freq(const RuleContext& ctx) {
    const ModelConfig& m = ctx.user.model;
    if (const int* every = std::get_if<int>(&m.moe_layer_freq)) {
        if (*every < 1) {
            ctx.error("LY008", "model.moe_layer_freq", show(*every),
                      "an integer moe_layer_freq N makes every N-th layer an MoE layer; N must be "
                      "at least 1",
                      "set model.moe_layer_freq to 1 (every layer) or a list of 0/1 per layer");
        }
        return;
    }
    const auto& list = std::get<std::vector<int>>(m.moe_layer_freq);
    const bool zero_one =
        std::all_of(list.begin(), list.end(), [](int v) { return v == 0 || v == 1; });
    if (!zero_one || static_cast<std::int64_t>(list.size()) != m.num_layers) {
        ctx.error("LY008", "model.moe_layer_freq", show(list),
                  fmt::format("a moe_layer_freq list needs one entry per layer (num_layers = {}, "
                              "got {}), each 0 (dense) or 1 (MoE)",
                              m.num_layers, list.size()),
                  "give exactly num_layers entries of 0 or 1");
    }
}

}  // namespace

void check_layout(const RuleContext& ctx) {
    const Config& c = ctx.user;
    const ModelConfig& m = c.model;
    const std::int64_t world = world_size(c);
    const int ep = m.expert_model_parallel_size;
    const std::string world_text =
        fmt::format("world size {} (comm.num_nodes {} x comm.gpus_per_node {})", world,
                    show(c.comm.num_nodes), show(c.comm.gpus_per_node));

    if (is_moe(m) && ep > 0 && !divides(ep, *m.num_moe_experts)) {
        ctx.error("LY001", "model.num_moe_experts", show(m.num_moe_experts),
                  fmt::format("{} experts cannot be split evenly over expert_model_parallel_size "
                              "{}",
                              *m.num_moe_experts, ep),
                  "make model.num_moe_experts a multiple of model.expert_model_parallel_size");
    }
    if (ep > 0 && world > 0 && !divides(ep, world)) {
        ctx.error(
            "LY002", "model.expert_model_parallel_size", show(ep),
            fmt::format("{} is not divisible by expert_model_parallel_size {}", world_text, ep),
            "choose an EP size that divides the world size, or change --num_nodes / "
            "--gpus_per_node");
    }
    const std::int64_t model_parallel = model_parallel_size(m);
    if (model_parallel > 0 && world > 0 && !divides(model_parallel, world)) {
        ctx.error(
            "LY003", "comm.gpus_per_node", show(c.comm.gpus_per_node),
            fmt::format("{} is not divisible by TP x PP x CP = {}", world_text, model_parallel),
            "make the world size a multiple of TP x PP x CP");
    }
    // Without a world size only the micro batch is known, and it must divide the global batch
    // whatever the data-parallel size turns out to be.
    const std::int64_t per_step = world > 0 ? samples_per_step(c) : c.train.micro_batch_size;
    if (c.train.global_batch_size && per_step > 0 &&
        !divides(per_step, *c.train.global_batch_size)) {
        const std::string divisor =
            world > 0 ? fmt::format("micro batch {} x data-parallel size {}",
                                    c.train.micro_batch_size, data_parallel_size(c))
                      : fmt::format("micro batch {} (whatever the data-parallel size)",
                                    c.train.micro_batch_size);
        ctx.error("LY004", "train.global_batch_size", show(c.train.global_batch_size),
                  fmt::format("global batch {} is not divisible by {}", *c.train.global_batch_size,
                              divisor),
                  fmt::format("use a global batch that is a multiple of {}", per_step));
    }
    // LY005: the pipeline split by the reference's rules (config/pipeline_layout.h).
    if (std::optional<Finding> split = check_pipeline_layout(m)) {
        ctx.error(split->id, split->field, split->value, split->message, split->fix);
    }
    for (const Finding& f : check_fp8(m, c.env.gpu))  // FP ids (config/fp8_rules.h)
        ctx.errors.push_back(f);
    const int groups = num_query_groups(m);
    if (m.num_attention_heads > 0 && groups > 0 && !divides(groups, m.num_attention_heads)) {
        ctx.error("LY006", "model.num_query_groups", show(groups),
                  fmt::format("{} attention heads cannot be shared evenly by {} query groups",
                              m.num_attention_heads, groups),
                  "make model.num_attention_heads a multiple of model.num_query_groups");
    }
    const int tp = m.tensor_model_parallel_size;
    if (tp > 1 && (!divides(tp, m.num_attention_heads) || !divides(tp, groups))) {
        ctx.error("LY007", "model.tensor_model_parallel_size", show(tp),
                  fmt::format("TP {} must divide both the {} attention heads and the {} query "
                              "groups",
                              tp, m.num_attention_heads, groups),
                  "choose a TP size dividing the number of heads and of query groups");
    }
    check_moe_layer_freq(ctx);
    if (!m.kv_channels && m.num_attention_heads > 0 &&
        !divides(m.num_attention_heads, m.hidden_size)) {
        ctx.error("LY010", "model.hidden_size", show(m.hidden_size),
                  fmt::format("with kv_channels null the head size is hidden_size / heads, but "
                              "{} is not divisible by {}",
                              m.hidden_size, m.num_attention_heads),
                  "set model.kv_channels, or make hidden_size a multiple of num_attention_heads");
    }
    if (c.dataset.type == DatasetType::kText && !c.dataset.path) {
        ctx.error("DS001", "dataset.path", "null", "dataset.type is text but dataset.path is null",
                  "set dataset.path to a text file, or use dataset.type=mock");
    }
}

namespace {

// MO007: chunks of each MoE layer's dispatch (docs/chunked-overlap.md "Configuration"): equal
// groups of each rank's local experts, with the alltoall dispatcher (the one the chunked tests
// cover), with or without EP overlap. Chunks by tokens are refused whatever the count: they were
// measured to lose (kTokenChunksRemoved).
void check_moe_chunks(const RuleContext& ctx) {
    const ModelConfig& m = ctx.user.model;
    if (m.moe_ep_overlap_chunk_by == ChunkSplit::kTokens) {
        ctx.error("MO007", "model.moe_ep_overlap_chunk_by", show(m.moe_ep_overlap_chunk_by),
                  std::string(kTokenChunksRemoved), std::string(kTokenChunksFix));
    }
    const int chunks = m.moe_ep_overlap_num_chunks;
    if (chunks <= 1) {
        return;
    }
    const std::string field = "model.moe_ep_overlap_num_chunks";
    const std::string fix_one = "or set model.moe_ep_overlap_num_chunks=1";
    if (!is_moe(m)) {
        ctx.error("MO007", field, show(chunks),
                  "chunks split the dispatch of MoE layers; this is a dense model",
                  "set model.moe_ep_overlap_num_chunks=1");
        return;
    }
    const int ep = m.expert_model_parallel_size;
    const int local = ep >= 1 && *m.num_moe_experts % ep == 0 ? *m.num_moe_experts / ep : 0;
    if (local > 0 && local % chunks != 0) {
        ctx.error("MO007", field, show(chunks),
                  fmt::format("chunks split the {} local experts of each rank "
                              "(model.num_moe_experts {} / model.expert_model_parallel_size {}) "
                              "into equal groups, and {} groups do not divide them",
                              local, *m.num_moe_experts, ep, chunks),
                  fmt::format("use a number of chunks that divides {}, {}", local, fix_one));
    }
    // The finalized dispatcher: flex without a backend runs as alltoall (W009).
    const DispatcherType dispatcher = ctx.fin.model.moe_token_dispatcher_type;
    if (dispatcher != DispatcherType::kAlltoall) {
        ctx.error("MO007", field, show(chunks),
                  fmt::format("chunks run with the alltoall token dispatcher only (got {})",
                              show(dispatcher)),
                  "set model.moe_token_dispatcher_type=alltoall, " + fix_one);
    }
}

}  // namespace

void check_moe(const RuleContext& ctx) {
    check_moe_chunks(ctx);
    const ModelConfig& m = ctx.user.model;
    if (!is_moe(m)) {
        return;
    }
    const int experts = *m.num_moe_experts;
    if (m.moe_router_topk < 1 || m.moe_router_topk > experts) {
        ctx.error("MO001", "model.moe_router_topk", show(m.moe_router_topk),
                  fmt::format("top-k must be between 1 and the number of experts ({})", experts),
                  fmt::format("set model.moe_router_topk to 1..{}", experts));
    }
    if (m.moe_router_num_groups && !divides(*m.moe_router_num_groups, experts)) {
        ctx.error("MO002", "model.moe_router_num_groups", show(m.moe_router_num_groups),
                  fmt::format("{} experts cannot be split into {} equal groups", experts,
                              *m.moe_router_num_groups),
                  "use a number of groups that divides model.num_moe_experts");
    }
    if (m.moe_router_group_topk) {
        const int group_topk = *m.moe_router_group_topk;
        if (!m.moe_router_num_groups || group_topk > *m.moe_router_num_groups) {
            ctx.error("MO003", "model.moe_router_group_topk", show(group_topk),
                      fmt::format("group-limited routing keeps {} groups but the router has {}",
                                  group_topk, show(m.moe_router_num_groups)),
                      "set model.moe_router_num_groups >= model.moe_router_group_topk");
        } else if (divides(*m.moe_router_num_groups, experts) &&
                   std::int64_t{m.moe_router_topk} >
                       std::int64_t{group_topk} * (experts / *m.moe_router_num_groups)) {
            ctx.error("MO003", "model.moe_router_group_topk", show(group_topk),
                      fmt::format("top-{} cannot be chosen from the {} experts of the {} kept "
                                  "groups",
                                  m.moe_router_topk,
                                  group_topk * (experts / *m.moe_router_num_groups), group_topk),
                      "raise model.moe_router_group_topk or lower model.moe_router_topk");
        }
    }
    if (m.moe_pad_expert_input_to_capacity && !m.moe_expert_capacity_factor) {
        ctx.error(
            "MO004", "model.moe_pad_expert_input_to_capacity", "true",
            "padding expert inputs to capacity needs a capacity (moe_expert_capacity_factor "
            "is null: dropless)",
            "set model.moe_expert_capacity_factor, or moe_pad_expert_input_to_capacity=false");
    }
    const auto lb = m.moe_router_load_balancing_type;
    if (m.moe_expert_capacity_factor && lb != LoadBalancingType::kAuxLoss &&
        lb != LoadBalancingType::kSeqAuxLoss && lb != LoadBalancingType::kNone) {
        ctx.error("MO005", "model.moe_router_load_balancing_type", show(lb),
                  "a capacity factor works only with load balancing aux_loss, seq_aux_loss or none",
                  "use one of those, or set model.moe_expert_capacity_factor=null");
    }
    if (m.moe_router_enable_expert_bias && m.moe_router_score_function != ScoreFunction::kSigmoid) {
        ctx.error("MO006", "model.moe_router_enable_expert_bias", "true",
                  "the expert bias (aux-loss-free balancing) needs the sigmoid score function",
                  "set model.moe_router_score_function=sigmoid, or disable the expert bias");
    }
}

}  // namespace epo::config
