// Megatron-Core's start-up refusals (MC): the checks `initialize_model_parallel` and the
// `__post_init__` of ModelParallelConfig / TransformerConfig make before any rank trains, which
// the other families (LY, MO, EP, WG) do not already cover. Each raises in the reference, so each
// is an error here, except MC009, which the reference only warns about.
//
//   MC001  world size % (ETP x EP x PP): the MoE layers' groups (expert tensor, expert, pipeline)
//          tile the world; ETP null means TP. Needs a world size (checked again at launch).
//   MC002  a virtual pipeline needs PP > 1 (the interleaved schedule).
//   MC003  expert parallelism needs experts (EP > 1 on a dense model).
//   MC004  top-1 routing with the softmax score needs the softmax before top-k (the softmax of a
//          single logit is 1, whose gradient is zero), unless load balancing is sinkhorn.
//   MC005  shared-expert overlap needs the alltoall or flex dispatcher.
//   MC006  the flex dispatcher's deepep backend cannot pad expert inputs to capacity.
//   MC007  sequence parallelism needs tensor parallelism (TP > 1).
//   MC008  full recompute needs a method and a layer count between 1 and the layers per
//          pipeline stage; selective takes no layer count.
//   MC009  (warning) EP > 1 with TP > 1 should use sequence parallelism.
//   MC010  selective recompute of a module the model lacks or cannot recompute: mla_up_proj
//          without multi-latent attention, shared_experts with shared-expert overlap, moe_act or
//          layernorm with fp8's delayed scaling.
//   MC011  (warning) recompute_modules without recompute_granularity=selective: the modules are
//          ignored (Megatron-Core reads them only for selective recompute).
//   MC012  overlap_param_gather_with_optimizer_step needs the distributed optimizer (there is
//          nothing to gather without shards).
//   MC013  overlap_param_gather_with_optimizer_step needs overlap_param_gather (Megatron-LM's
//          argument checks: the optimizer step starts the gathers that the forward pre-hooks
//          would otherwise wait for).
//   MC014  (warning) overlap_param_gather_with_optimizer_step without an interleaved pipeline:
//          Megatron-LM's training script refuses it, because its optimizer gathers only the first
//          model chunk early; epo gathers bucket by bucket under the rest of the step, which works
//          in every layout, so the config runs here but not there.
//
// Rules read the user's values (before finalization), as the reference does at construction;
// MC012-MC014 read the finalized ones, since the flag may come from comm_overlap.
#include <algorithm>
#include <optional>
#include <string>

#include "epo/config/rules.h"

namespace epo::config {
namespace {

void check_groups(const RuleContext& ctx) {
    const Config& c = ctx.user;
    const ModelConfig& m = c.model;
    const std::int64_t world = world_size(c);
    const int tp = m.tensor_model_parallel_size;
    const int etp = m.expert_tensor_parallel_size.value_or(tp);
    const int ep = m.expert_model_parallel_size;
    const int pp = m.pipeline_model_parallel_size;
    const std::int64_t expert_grid = std::int64_t{etp} * ep * pp;
    if (world > 0 && expert_grid > 0 && !divides(expert_grid, world)) {
        ctx.error("MC001", "model.expert_model_parallel_size", show(ep),
                  fmt::format("world size {} (comm.num_nodes {} x comm.gpus_per_node {}) is not "
                              "divisible by ETP {} x EP {} x PP {} = {}: the MoE layers' expert "
                              "tensor, expert and pipeline groups must tile the world "
                              "(Megatron-Core refuses it at start-up)",
                              world, show(c.comm.num_nodes), show(c.comm.gpus_per_node), etp, ep,
                              pp, expert_grid),
                  fmt::format("choose EP, ETP (model.expert_tensor_parallel_size, null = TP) and "
                              "PP whose product divides {}, or change --num_nodes / "
                              "--gpus_per_node to a multiple of {}",
                              world, expert_grid));
    }
    if (m.virtual_pipeline_model_parallel_size && pp <= 1) {
        ctx.error("MC002", "model.virtual_pipeline_model_parallel_size",
                  show(m.virtual_pipeline_model_parallel_size),
                  "a virtual pipeline (the interleaved schedule) needs "
                  "pipeline_model_parallel_size > 1, got 1",
                  "set model.virtual_pipeline_model_parallel_size=null (-vp None), or PP > 1");
    }
    if (ep > 1 && !is_moe(m)) {
        ctx.error("MC003", "model.expert_model_parallel_size", show(ep),
                  fmt::format("expert parallelism needs experts, but model.num_moe_experts is {}",
                              show(m.num_moe_experts)),
                  "set model.expert_model_parallel_size=1 for a dense model, or set "
                  "model.num_moe_experts");
    }
    if (m.sequence_parallel && tp <= 1) {
        ctx.error("MC007", "model.sequence_parallel", "true",
                  "sequence parallelism splits activations over the tensor-parallel group and "
                  "needs tensor_model_parallel_size > 1, got 1",
                  "set model.sequence_parallel=false, or TP > 1 (-tp N, which sets both)");
    }
    if (ep > 1 && tp > 1 && !m.sequence_parallel) {
        ctx.warn("MC009", "model.sequence_parallel", "false",
                 fmt::format("with expert parallelism (EP {}) and tensor parallelism (TP {}) "
                             "Megatron-Core expects sequence parallelism for training",
                             ep, tp),
                 "set model.sequence_parallel=true");
    }
}

void check_router_and_dispatcher(const RuleContext& ctx) {
    const ModelConfig& m = ctx.user.model;
    if (!is_moe(m)) {
        return;
    }
    if (m.moe_router_topk == 1 && m.moe_router_score_function == ScoreFunction::kSoftmax &&
        !m.moe_router_pre_softmax &&
        m.moe_router_load_balancing_type != LoadBalancingType::kSinkhorn) {
        ctx.error("MC004", "model.moe_router_pre_softmax", "false",
                  "top-1 routing with the softmax score takes the softmax over the one chosen "
                  "logit, which is always 1: the router would get a zero gradient",
                  "set model.moe_router_pre_softmax=true (softmax before top-k), or use "
                  "moe_router_topk > 1 or moe_router_score_function=sigmoid");
    }
    const DispatcherType dispatcher = m.moe_token_dispatcher_type;
    if (m.moe_shared_expert_intermediate_size && m.moe_shared_expert_overlap &&
        dispatcher == DispatcherType::kAllgather) {
        ctx.error("MC005", "model.moe_shared_expert_overlap", "true",
                  "the shared expert overlaps the token exchange of the alltoall or flex "
                  "dispatcher; the allgather dispatcher has none to overlap",
                  "set model.moe_token_dispatcher_type=alltoall, or "
                  "model.moe_shared_expert_overlap=false");
    }
    if (dispatcher == DispatcherType::kFlex &&
        m.moe_flex_dispatcher_backend == FlexBackend::kDeepep &&
        m.moe_pad_expert_input_to_capacity) {
        ctx.error("MC006", "model.moe_pad_expert_input_to_capacity", "true",
                  "the flex dispatcher's deepep backend does not pad expert inputs to capacity",
                  "set model.moe_pad_expert_input_to_capacity=false, or use the alltoall "
                  "dispatcher");
    }
}

void check_recompute_settings(const RuleContext& ctx) {
    const ModelConfig& m = ctx.user.model;
    if (m.recompute_granularity == RecomputeGranularity::kFull) {
        const int per_stage = m.pipeline_model_parallel_size > 0
                                  ? m.num_layers / m.pipeline_model_parallel_size
                                  : m.num_layers;
        if (!m.recompute_method) {
            ctx.error("MC008", "model.recompute_method", "null",
                      "full recompute needs a method: which layers of a stage are recomputed",
                      "set model.recompute_method=uniform or block");
        }
        if (!m.recompute_num_layers) {
            ctx.error("MC008", "model.recompute_num_layers", "null",
                      "full recompute needs the number of layers recomputed per stage",
                      fmt::format("set model.recompute_num_layers between 1 and {} (the layers "
                                  "per pipeline stage)",
                                  per_stage));
        } else if (*m.recompute_num_layers > per_stage && per_stage > 0) {
            ctx.error("MC008", "model.recompute_num_layers", show(m.recompute_num_layers),
                      fmt::format("full recompute's layer count must be between 1 and the "
                                  "layers per pipeline stage, {} (num_layers {} / PP {})",
                                  per_stage, m.num_layers, m.pipeline_model_parallel_size),
                      fmt::format("set model.recompute_num_layers between 1 and {}", per_stage));
        }
    } else if (m.recompute_granularity == RecomputeGranularity::kSelective &&
               m.recompute_num_layers) {
        ctx.error("MC008", "model.recompute_num_layers", show(m.recompute_num_layers),
                  "selective recompute chooses modules (recompute_modules), not a number of "
                  "layers",
                  "set model.recompute_num_layers=null");
    }
}

bool lists(const ModelConfig& m, RecomputeModule module) {
    return m.recompute_modules &&
           std::find(m.recompute_modules->begin(), m.recompute_modules->end(), module) !=
               m.recompute_modules->end();
}

void check_recompute_modules(const RuleContext& ctx) {
    const ModelConfig& m = ctx.user.model;
    if (m.recompute_modules && !m.recompute_modules->empty() &&
        m.recompute_granularity != RecomputeGranularity::kSelective) {
        ctx.warn("MC011", "model.recompute_modules", show(m.recompute_modules),
                 fmt::format("recompute_granularity is {}: the modules are recomputed only with "
                             "selective recompute, so nothing is recomputed by them",
                             show(m.recompute_granularity)),
                 "set model.recompute_granularity=selective (--recompute_modules sets both), or "
                 "model.recompute_modules=null");
    }
    if (m.recompute_granularity != RecomputeGranularity::kSelective)
        return;
    if (lists(m, RecomputeModule::kMlaUpProj) && !m.multi_latent_attention) {
        ctx.error("MC010", "model.recompute_modules", show(m.recompute_modules),
                  "mla_up_proj recomputes multi-latent attention's up projections, but "
                  "model.multi_latent_attention is false",
                  "drop mla_up_proj from model.recompute_modules, or use multi-latent attention");
    }
    if (lists(m, RecomputeModule::kSharedExperts) && m.moe_shared_expert_intermediate_size &&
        m.moe_shared_expert_overlap) {
        ctx.error("MC010", "model.recompute_modules", show(m.recompute_modules),
                  "shared_experts recompute cannot work with shared-expert overlap "
                  "(model.moe_shared_expert_overlap=true)",
                  "drop shared_experts from model.recompute_modules, or set "
                  "model.moe_shared_expert_overlap=false");
    }
    if (m.fp8 && m.fp8_recipe == "delayed" &&
        (lists(m, RecomputeModule::kMoeAct) || lists(m, RecomputeModule::kLayernorm))) {
        ctx.error("MC010", "model.recompute_modules", show(m.recompute_modules),
                  "fp8's delayed scaling (fp8_recipe=delayed) does not support moe_act and "
                  "layernorm recompute",
                  "drop moe_act and layernorm from model.recompute_modules, or use another "
                  "fp8_recipe (tensorwise, mxfp8, blockwise)");
    }
}

// Where the finalized config asks for the optimizer-step gather: the optimizer's field, or a
// comm_overlap value that finalization did not copy (it copies only with a distributed optimizer).
std::optional<std::string> gather_with_step_field(const Config& c) {
    if (c.optimizer.overlap_param_gather_with_optimizer_step)
        return "optimizer.overlap_param_gather_with_optimizer_step";
    if (c.comm_overlap && c.comm_overlap->overlap_param_gather_with_optimizer_step.value_or(false))
        return "comm_overlap.overlap_param_gather_with_optimizer_step";
    return std::nullopt;
}

void check_param_gather_with_step(const RuleContext& ctx) {
    const Config& c = ctx.fin;
    const std::optional<std::string> field = gather_with_step_field(c);
    if (!field)
        return;
    if (!c.ddp.use_distributed_optimizer) {
        ctx.error("MC012", *field, "true",
                  "overlapping the parameter gather with the optimizer step needs the distributed "
                  "optimizer: without its shards there is nothing to gather",
                  fmt::format("set ddp.use_distributed_optimizer=true, or {}=false", *field));
        return;
    }
    if (!c.ddp.overlap_param_gather) {
        ctx.error(
            "MC013", *field, "true",
            "overlapping the parameter gather with the optimizer step needs "
            "ddp.overlap_param_gather=true (Megatron-LM refuses it otherwise)",
            fmt::format("set comm_overlap.overlap_param_gather=true (ddp.overlap_param_gather "
                        "without a comm_overlap section), or {}=false",
                        *field));
    }
    if (!c.model.virtual_pipeline_model_parallel_size) {
        ctx.warn("MC014", *field, "true",
                 "Megatron-LM's training script accepts overlap_param_gather_with_optimizer_step "
                 "only with an interleaved pipeline (virtual_pipeline_model_parallel_size set); "
                 "the epo runtime gathers bucket by bucket under the optimizer step in any layout",
                 "set model.virtual_pipeline_model_parallel_size for a config the reference "
                 "trains, or keep it: epo runs it");
    }
}

}  // namespace

void check_mcore(const RuleContext& ctx) {
    check_groups(ctx);
    check_router_and_dispatcher(ctx);
    check_recompute_settings(ctx);
    check_recompute_modules(ctx);
    check_param_gather_with_step(ctx);
}

}  // namespace epo::config
