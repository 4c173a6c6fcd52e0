#include "epo/train/step_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "epo/config/finalize.h"
#include "epo/core/error.h"
#include "epo/schedule/pipeline_schedule.h"
#include "epo/train/grad_buckets.h"

namespace epo::train {
namespace {

// Element counts as transformer_layer.cpp's make_layer_params / collect_layer_params allocate
// and list them: norms (H), attention qkv ((heads + 2 groups) * head_dim, H) and proj (H,
// heads * head_dim), q/k norms (head_dim), then the MLP: dense fc1 (2F, H) and fc2 (H, F), or
// router (E, H), shared experts as a dense MLP of their size, and the local experts
// (E_local, 2F, H), (E_local, H, F) with F the rank's ETP shard.
void layer_param_sizes(const model::GptShape& s, bool is_moe, PositionParamSizes& out) {
    const int64_t H = s.hidden;
    const model::AttentionShape& a = s.attn;
    out.dense.push_back(H);  // input_layernorm
    if (s.multi_latent_attention) {
        for (int64_t n : model::mla_param_sizes(s.mla))
            out.dense.push_back(n);
    } else {
        out.dense.push_back((a.num_heads + 2 * a.num_groups) * a.head_dim * H);  // linear_qkv
        out.dense.push_back(H * a.num_heads * a.head_dim);                       // linear_proj
    }
    if (!s.multi_latent_attention && a.qk_layernorm) {
        out.dense.push_back(a.head_dim);  // q_layernorm
        out.dense.push_back(a.head_dim);  // k_layernorm
    }
    out.dense.push_back(H);  // pre_mlp_layernorm
    if (!is_moe) {
        out.dense.push_back(2 * s.ffn_hidden * H);  // linear_fc1 (gate and up)
        out.dense.push_back(H * s.ffn_hidden);      // linear_fc2
        return;
    }
    out.dense.push_back(s.moe.num_experts * s.moe.hidden_size);  // router
    if (s.moe.shared_expert_size > 0) {
        out.dense.push_back(2 * s.moe.shared_expert_size * H);
        out.dense.push_back(H * s.moe.shared_expert_size);
    }
    const int64_t F = s.moe.ffn_hidden_size / s.etp_size;  // the rank's ETP shard of each FFN
    out.expert.push_back(s.num_local_experts() * 2 * F * H);
    out.expert.push_back(s.num_local_experts() * H * F);
}

int64_t grad_bytes(const std::vector<int64_t>& sizes) {
    int64_t bytes = 0;
    for (int64_t n : sizes)
        bytes += n * static_cast<int64_t>(sizeof(float));
    return bytes;
}

// The model's pipeline layout (GptShape::layer_stage, from config/pipeline_layout.h) as the
// schedule's [stage][chunk] layer ranges.
std::vector<std::vector<schedule::ChunkLayers>> schedule_layout(const model::GptShape& shape) {
    std::vector<std::vector<schedule::ChunkLayers>> out(
        static_cast<size_t>(shape.pipeline_size),
        std::vector<schedule::ChunkLayers>(static_cast<size_t>(shape.virtual_pipeline_size)));
    for (int s = 0; s < shape.pipeline_size; ++s) {
        for (int c = 0; c < shape.virtual_pipeline_size; ++c) {
            const model::LayerRange r = shape.chunk_layers(s, c);
            out[static_cast<size_t>(s)][static_cast<size_t>(c)] =
                schedule::ChunkLayers{static_cast<int>(r.first), static_cast<int>(r.end)};
        }
    }
    return out;
}

}  // namespace

PositionParamSizes param_sizes_at(const model::GptShape& s, int position) {
    PositionParamSizes out;
    if (position < 0) {
        out.dense.push_back(s.vocab * s.hidden);  // word embeddings
    } else if (position >= s.num_layers) {
        if (s.mtp_num_layers == 0)
            out.dense.push_back(s.hidden);  // final layernorm (with MTP: the MTP layer's)
        if (!s.tie_embeddings)
            out.dense.push_back(s.vocab * s.hidden);  // output layer
        if (s.has_embedding_copies() && position == s.embedding_copy_position())
            out.dense.push_back(s.vocab * s.hidden);  // the last stage's embedding copy
    } else {
        if (s.is_mtp_layer(position)) {
            // decoder final layernorm, then the MTP's enorm, hnorm, eh_proj, final layernorm
            for (int64_t n : {s.hidden, s.hidden, s.hidden, 2 * s.hidden * s.hidden, s.hidden})
                out.dense.push_back(n);
        }
        layer_param_sizes(s, s.moe_layers[static_cast<size_t>(position)], out);
        if (s.has_embedding_copies() && position == s.embedding_copy_position())
            out.dense.push_back(s.vocab * s.hidden);  // the last stage's embedding copy
    }
    return out;
}

StepPlan make_step_plan(const config::Config& cfg, const model::GptShape& shape) {
    const config::ModelConfig& m = cfg.model;
    const int64_t world = config::world_size(cfg);
    // Megatron-Core's groups: DP = world / (TP * PP * CP), EDP = world / (ETP * EP * PP).
    const int64_t model_parallel = config::model_parallel_size(m);
    const int64_t expert_parallel = int64_t{config::expert_tensor_parallel_size(m)} *
                                    m.expert_model_parallel_size * m.pipeline_model_parallel_size;
    if (world <= 0 || world % model_parallel != 0 || world % expert_parallel != 0) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("step plan: a world of {} ranks (comm.num_nodes x "
                                "comm.gpus_per_node) does not split into TP x PP x CP = {} or "
                                "ETP x EP x PP = {}; state a topology both divide",
                                world, model_parallel, expert_parallel));
    }
    StepPlan plan;
    plan.overlap = m.overlap_moe_expert_parallel_comm;
    plan.dp_size = static_cast<int>(world / model_parallel);
    plan.edp_size = static_cast<int>(world / expert_parallel);
    const bool has_group = plan.dp_size > 1 || plan.edp_size > 1;
    plan.reduce_in_buckets = cfg.ddp.overlap_grad_reduce && has_group;
    plan.distributed_optimizer = cfg.ddp.use_distributed_optimizer && has_group;
    plan.param_gather_overlap = plan.distributed_optimizer && cfg.ddp.overlap_param_gather;
    plan.param_gather_in_optimizer =
        plan.param_gather_overlap && cfg.optimizer.overlap_param_gather_with_optimizer_step;
    plan.num_stages = m.pipeline_model_parallel_size;
    plan.num_chunks = config::virtual_pipeline_size(m);
    EPO_CHECK(shape.pipeline_rank >= 0 && shape.pipeline_rank < plan.num_stages &&
                  shape.pipeline_size == plan.num_stages &&
                  shape.virtual_pipeline_size == plan.num_chunks,
              "the model shape (stage {} of PP {} x VPP {}) is not the configuration's (PP {} x "
              "VPP {})",
              shape.pipeline_rank, shape.pipeline_size, shape.virtual_pipeline_size,
              plan.num_stages, plan.num_chunks);
    schedule::PipelineShape p{.num_stages = plan.num_stages,
                              .num_chunks = plan.num_chunks,
                              .num_micro_batches = static_cast<int>(config::num_microbatches(cfg)),
                              .moe_layers = shape.moe_layers,
                              .overlap = plan.overlap,
                              .delay_wgrad = plan.overlap && m.delay_wgrad_compute,
                              .num_moe_chunks = m.moe_ep_overlap_num_chunks,
                              .pair_edges = plan.overlap && m.moe_ep_overlap_pair_edges,
                              .recompute_first = shape.recompute_first,
                              // The model's MoE config decides (moe_config.cpp): the shared
                              // expert's own node exists exactly when the block leaves it out of
                              // pre_dispatch.
                              .shared_expert_overlap = shape.moe.shared_expert_overlap,
                              .layout = schedule_layout(shape)};
    plan.shape =
        schedule::ScheduleShape{p.num_micro_batches, shape.moe_layers, m.delay_wgrad_compute};
    plan.shape.num_moe_chunks = p.num_moe_chunks;  // docs/chunked-overlap.md
    plan.shape.pair_edges = p.pair_edges;
    plan.shape.recompute_first = p.recompute_first;
    plan.shape.shared_expert_overlap = p.shared_expert_overlap;

    if (plan.reduce_in_buckets || plan.param_gather_overlap) {
        // What each position adds to a bucket: the parameters that have a group to reduce over.
        const auto bytes_at = [&](int position) {
            const PositionParamSizes sizes = param_sizes_at(shape, position);
            return (plan.dp_size > 1 ? grad_bytes(sizes.dense) : 0) +
                   (plan.edp_size > 1 ? grad_bytes(sizes.expert) : 0);
        };
        // Every stage's buckets over its own positions (each stage's list is built, so that any
        // rank can check another stage's call names). Unset: the bucket size the configuration
        // finalizes to for bucketed overlap (128 MiB).
        const int64_t bucket_bytes = cfg.ddp.bucket_size.value_or(config::kDefaultBucketSize);
        std::vector<std::vector<int>> ends;
        for (int s = 0; s < plan.num_stages; ++s)
            ends.push_back(
                grad_bucket_ends(schedule::stage_positions(p, s), bytes_at, bucket_bytes));
        if (plan.reduce_in_buckets)
            p.stage_grad_bucket_ends = ends;
        const bool gathers_in_schedule =
            plan.param_gather_overlap && !plan.param_gather_in_optimizer;
        if (gathers_in_schedule)
            p.stage_param_bucket_ends = ends;
        const std::vector<int>& mine = ends[static_cast<size_t>(shape.pipeline_rank)];
        if (plan.reduce_in_buckets)
            plan.shape.grad_bucket_ends = mine;
        if (gathers_in_schedule)
            plan.shape.param_bucket_ends = mine;
        plan.buckets.resize(mine.size());
        size_t bucket = 0;
        for (int position : schedule::stage_positions(p, shape.pipeline_rank)) {
            plan.buckets[bucket].positions.push_back(position);
            plan.buckets[bucket].bytes += bytes_at(position);
            if (mine[bucket] == position)
                ++bucket;
        }
    }
    try {
        plan.stage_calls = schedule::pipeline_schedules(p);
    } catch (const std::invalid_argument& e) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("step plan: {} (model.pipeline_model_parallel_size {}, "
                                "model.virtual_pipeline_model_parallel_size {}, {} micro-batches "
                                "per step = train.global_batch_size / (micro batch x DP)); "
                                "choose a global batch whose micro-batch count is a multiple of "
                                "PP",
                                e.what(), plan.num_stages, plan.num_chunks, p.num_micro_batches));
    }
    plan.calls = plan.stage_calls[static_cast<size_t>(shape.pipeline_rank)];
    // A one-stage list names no stage (schedule.h's single-stage schedules).
    if (plan.num_stages == 1) {
        for (schedule::NodeCall& c : plan.calls)
            c.stage = c.chunk = -1;
        plan.stage_calls.clear();
    }
    return plan;
}

}  // namespace epo::train
