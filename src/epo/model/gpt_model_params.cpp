// GptModel's parameters: the constructor (which parameters a rank holds, by its stage, TP and
// ETP place) and init_weights (seeded values, each shard sliced from the TP 1 / ETP 1 tensor).
// The rest of the model is gpt_model.cpp.
#include <algorithm>
#include <cmath>
#include <functional>

#include "epo/model/gpt_model.h"
#include "epo/model/tensor_parallel.h"
#include "epo/tensor/random.h"

namespace epo::model {
namespace {

uint64_t name_hash(const std::string& name) {
    return std::hash<std::string>{}(name);
}

// Fills a parameter with N(0, std) from a stream keyed by (seed, name), starting at element
// `first_index` of the global tensor (an expert shard starts where its first expert does).
void init_normal(Param& p, uint64_t seed, float std, uint64_t first_index = 0) {
    fill_normal(p.master, random_bits(seed, name_hash(p.name)), 0.0f, std, first_index);
    refresh_compute(p);
}

// Expert tensor parallelism: p = ETP rank `rank`'s shard of the local experts' weight whose
// ETP 1 values are `full` (its first element global index `first_index`, drawn as init_normal
// draws it): rows block by block (`blocks`: fc1's gate and up of each expert), or with no blocks
// columns (fc2's, the experts' (H, F) matrices stacked).
void init_normal_etp_shard(Param& p, uint64_t seed, float std, uint64_t first_index,
                           const Shape& full, std::vector<int64_t> blocks, int size, int rank) {
    Tensor whole = Tensor::empty(full, DType::kF32);
    fill_normal(whole, random_bits(seed, name_hash(p.name)), 0.0f, std, first_index);
    const int64_t cols = p.master.shape()[p.master.shape().rank - 1];
    const Tensor shard = p.master.view({p.master.numel() / cols, cols});
    if (blocks.empty())
        tp_copy_column_shard(whole, size, rank, shard);
    else
        tp_copy_row_shard(whole, blocks, size, rank, shard);
    refresh_compute(p);
}

void init_ones(Param& p) {
    float* w = p.master.data<float>();
    for (int64_t i = 0; i < p.master.numel(); ++i)
        w[i] = 1.0f;
    refresh_compute(p);
}

}  // namespace

GptModel::GptModel(const GptShape& shape)
    : shape_(shape),
      // MLA rotates only the positional part of its heads (width qk_pos_emb_head_dim).
      rope_(make_rope_table(
          shape.seq_length,
          shape.multi_latent_attention ? shape.mla.qk_pos_emb_head_dim : shape.attn.head_dim,
          shape.rotary_base)) {
    const DType cd = shape.compute_dtype;
    EPO_CHECK(shape.pipeline_size >= 1 && shape.virtual_pipeline_size >= 1 &&
                  shape.pipeline_rank >= 0 && shape.pipeline_rank < shape.pipeline_size &&
                  (shape.pipeline_chunks.empty()
                       ? shape.pipeline_size * shape.virtual_pipeline_size == 1
                       : shape.pipeline_chunks.size() == static_cast<size_t>(shape.pipeline_size)),
              "{} layers on stage {} of PP {} x VPP {} ({} stages laid out)", shape.num_layers,
              shape.pipeline_rank, shape.pipeline_size, shape.virtual_pipeline_size,
              shape.pipeline_chunks.size());
    EPO_CHECK(shape.mtp_num_layers == 0 ||
                  (shape.mtp_num_layers == 1 && shape.num_layers >= 2 &&
                   shape.stage_of_layer(shape.num_layers - 1) == shape.pipeline_size - 1),
              "{} MTP layer(s) in {} layers with PP {} (one MTP layer after at least one decoder "
              "layer, on the last stage: RT006, LY005)",
              shape.mtp_num_layers, shape.num_layers, shape.pipeline_size);
    // Tensor parallelism: what runs sharded (tensor_parallel.h); the runtime refuses the rest
    // with RT ids before a model is built.
    const int tp = shape.tp_size;
    EPO_CHECK(tp >= 1 && shape.tp_rank >= 0 && shape.tp_rank < tp, "TP rank {} of {}",
              shape.tp_rank, tp);
    EPO_CHECK(tp == 1 || (!shape.multi_latent_attention && shape.mtp_num_layers == 0 &&
                          !shape.tie_embeddings && !shape.recompute.layernorm),
              "tensor parallelism with MLA, MTP, tied embeddings or the layernorm recompute");
    const int64_t vocab_rows = tp_range(shape.vocab, tp, shape.tp_rank, "model.vocab_size").size();
    EPO_CHECK(shape.etp_size >= 1 && shape.etp_rank >= 0 && shape.etp_rank < shape.etp_size,
              "ETP rank {} of {}", shape.etp_rank, shape.etp_size);
    if (shape.etp_size > 1 && shape.moe.ffn_hidden_size % shape.etp_size != 0) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("model.moe_ffn_hidden_size={} is not divisible by "
                                "model.expert_tensor_parallel_size={}: each ETP rank holds an "
                                "equal part of every expert; choose a multiple of {}",
                                shape.moe.ffn_hidden_size, shape.etp_size, shape.etp_size));
    }
    if (shape.sequence_parallel)
        tp_range(shape.tokens(), tp, shape.tp_rank, "micro_batch_size x seq_length");
    if (shape.holds(-1) || shape.holds_embedding_copy())
        embedding_ = make_param("embedding.word_embeddings.weight", {vocab_rows, shape.hidden}, cd);
    for (int64_t l = 0; l < shape.num_layers; ++l) {
        LayerShape s{.hidden = shape.hidden,
                     .tokens = shape.tokens(),
                     .num_sequences = shape.micro_batch_size,
                     .attn = shape.attn,
                     .multi_latent_attention = shape.multi_latent_attention,
                     .mla = shape.mla,
                     .norm_eps = shape.norm_eps,
                     .is_moe = shape.moe_layers[static_cast<size_t>(l)],
                     .ffn_hidden = shape.ffn_hidden,
                     .moe = shape.moe,
                     .num_local_experts = shape.num_local_experts(),
                     .gradient_accumulation_fusion = shape.gradient_accumulation_fusion,
                     .compute_dtype = cd,
                     .recompute = shape.recompute};
        s.etp_size = shape.etp_size;
        if (tp > 1) {
            s.tokens = shape.local_tokens();
            s.attn.num_heads =
                tp_range(shape.attn.num_heads, tp, shape.tp_rank, "model.num_attention_heads")
                    .size();
            s.attn.num_groups =
                tp_range(shape.attn.num_groups, tp, shape.tp_rank, "model.num_query_groups").size();
            if (!s.is_moe)
                s.ffn_hidden =
                    tp_range(shape.ffn_hidden, tp, shape.tp_rank, "model.ffn_hidden_size").size();
            s.tp_size = tp;
            s.sequence_parallel = shape.sequence_parallel;
        }
        layer_shapes_.push_back(s);
    }
    layers_.reserve(static_cast<size_t>(shape.num_layers));
    // Another stage's layers stay empty (no memory), in their place so that indices are global.
    for (int64_t l = 0; l < shape.num_layers; ++l) {
        // Megatron-Core's names: the MTP's transformer layer is "mtp.layers.0.mtp_model_layer.".
        const std::string prefix = shape.is_mtp_layer(l) ? "mtp.layers.0.mtp_model_layer."
                                                         : fmt::format("decoder.layers.{}.", l);
        layers_.push_back(shape.holds(l) ? make_layer_params(layer_shapes_[l], prefix)
                                         : LayerParams{});
    }
    bool any_moe = false;
    for (int64_t l = 0; l < shape.num_layers; ++l)
        any_moe |= shape.holds(l) && layer_shapes_[l].is_moe;
    if (shape.holds(shape.num_layers)) {
        final_norm_ = make_param("decoder.final_layernorm.weight", {shape.hidden}, DType::kF32);
        if (!shape.tie_embeddings)
            output_ = make_param("output_layer.weight", {vocab_rows, shape.hidden}, cd);
    }
    if (shape.mtp_num_layers > 0)
        mtp_ = make_mtp_params(shape.hidden, cd);
    // Listed position by position (params_at), in the order the forward reaches them.
    for (int position = -1; position <= static_cast<int>(shape.num_layers); ++position) {
        const PositionParams p = params_at(position);
        dense_params_.insert(dense_params_.end(), p.dense.begin(), p.dense.end());
        expert_params_.insert(expert_params_.end(), p.expert.begin(), p.expert.end());
    }
    if (tp > 1) {
        // Replicated: every TP rank holds the whole tensor (the norms, the router, the shared
        // expert); the TP group sums the gradients of those each rank computes from its own share
        // of the work (its heads; under SP its rows).
        const bool sp = shape.sequence_parallel;
        auto replicated = [&](Param& p, bool summed) {
            tp_replicated_params_.push_back(&p);
            if (summed)
                tp_summed_params_.push_back(&p);
        };
        for (int64_t l = 0; l < shape.num_layers; ++l) {
            if (!shape.holds(l))
                continue;
            LayerParams& p = layers_[static_cast<size_t>(l)];
            replicated(p.input_norm, sp);
            if (shape.attn.qk_layernorm) {
                replicated(p.attn.q_norm, true);
                replicated(p.attn.k_norm, true);
            }
            replicated(p.pre_mlp_norm, sp);
            if (layer_shapes_[static_cast<size_t>(l)].is_moe) {
                replicated(p.moe.router.weight, sp);
                if (shape.moe.shared_expert_size > 0) {
                    replicated(p.moe.shared.fc1, sp);
                    replicated(p.moe.shared.fc2, sp);
                }
            }
        }
        if (shape.holds(shape.num_layers))
            replicated(final_norm_, sp);
    }
    layer_stats_.resize(static_cast<size_t>(shape.num_layers));
    if (any_moe) {
        dispatcher_ = moe::make_token_dispatcher(shape.moe, shape.ep_size, shape.ep_rank,
                                                 shape.ep_ranks_per_node, shape.etp_size);
    }
}

std::vector<Param*> GptModel::all_params() const {
    std::vector<Param*> all = dense_params_;
    all.insert(all.end(), expert_params_.begin(), expert_params_.end());
    return all;
}

Param* GptModel::embedding_copy() {
    return shape_.has_embedding_copies() && (shape_.holds(-1) || shape_.holds_embedding_copy())
               ? &embedding_
               : nullptr;
}

GptModel::PositionParams GptModel::params_at(int position) {
    PositionParams out;
    if (!shape_.holds(position))
        return out;
    // The last stage's embedding copy, last at its position (train/step_plan.h param_sizes_at).
    const bool copy_here = shape_.holds_embedding_copy() &&
                           position == static_cast<int>(shape_.embedding_copy_position());
    if (position < 0) {
        out.dense.push_back(&embedding_);
    } else if (position >= shape_.num_layers) {
        if (shape_.mtp_num_layers == 0)
            out.dense.push_back(&final_norm_);
        if (!shape_.tie_embeddings)
            out.dense.push_back(&output_);
        if (copy_here)
            out.dense.push_back(&embedding_);
    } else {
        const auto l = static_cast<size_t>(position);
        // The MTP layer's position runs the decoder's final norm and the MTP's own weights (its
        // final norm runs in the output position, whose backward comes first).
        if (shape_.is_mtp_layer(position)) {
            out.dense.push_back(&final_norm_);
            for (Param* p : mtp_param_list(mtp_))
                out.dense.push_back(p);
        }
        collect_layer_params(layer_shapes_[l], layers_[l], out.dense, out.expert);
        if (copy_here)
            out.dense.push_back(&embedding_);
    }
    return out;
}

void GptModel::init_normal_shard(Param& p, uint64_t seed, float std, const Shape& full,
                                 std::vector<int64_t> blocks) const {
    Tensor whole = Tensor::empty(full, DType::kF32);
    fill_normal(whole, random_bits(seed, name_hash(p.name)), 0.0f, std);
    if (blocks.empty())
        tp_copy_column_shard(whole, shape_.tp_size, shape_.tp_rank, p.master);
    else
        tp_copy_row_shard(whole, blocks, shape_.tp_size, shape_.tp_rank, p.master);
    refresh_compute(p);
}

void GptModel::init_weights(uint64_t seed) {
    const float std = shape_.init_std;
    // Megatron-Core scales by the decoder's layer count; the MTP layer uses the same config.
    const float out_std = std / std::sqrt(2.0f * static_cast<float>(shape_.num_decoder_layers()));
    const bool tp = shape_.tp_size > 1;
    const int64_t H = shape_.hidden, V = shape_.vocab;
    // The copy's name is the embedding's: the same values (GptShape::has_embedding_copies).
    if (shape_.holds(-1) || shape_.holds_embedding_copy()) {
        if (tp)
            init_normal_shard(embedding_, seed, std, {V, H}, {V});
        else
            init_normal(embedding_, seed, std);
    }
    for (int64_t l = 0; l < shape_.num_layers; ++l) {
        if (!shape_.holds(l))
            continue;
        LayerParams& p = layers_[static_cast<size_t>(l)];
        init_ones(p.input_norm);
        init_ones(p.pre_mlp_norm);
        if (shape_.multi_latent_attention) {
            // As Megatron: every projection normal(std), the output projection scaled.
            for (Param* w : {&p.mla.q_down, &p.mla.q_up, &p.mla.kv_down, &p.mla.kv_up}) {
                if (!w->name.empty())
                    init_normal(*w, seed, std);
            }
            init_normal(p.mla.proj, seed, out_std);
            if (shape_.mla.qk_layernorm) {
                init_ones(p.mla.q_norm);
                init_ones(p.mla.kv_norm);
            }
        } else if (tp) {
            const AttentionShape& a = shape_.attn;
            init_normal_shard(
                p.attn.qkv, seed, std, {(a.num_heads + 2 * a.num_groups) * a.head_dim, H},
                {a.num_heads * a.head_dim, a.num_groups * a.head_dim, a.num_groups * a.head_dim});
            init_normal_shard(p.attn.proj, seed, out_std, {H, a.num_heads * a.head_dim}, {});
        } else {
            init_normal(p.attn.qkv, seed, std);
            init_normal(p.attn.proj, seed, out_std);
        }
        if (!shape_.multi_latent_attention && shape_.attn.qk_layernorm) {
            init_ones(p.attn.q_norm);
            init_ones(p.attn.k_norm);
        }
        if (!layer_shapes_[l].is_moe && tp) {
            const int64_t F = shape_.ffn_hidden;
            init_normal_shard(p.dense.fc1, seed, std, {2 * F, H}, {F, F});
            init_normal_shard(p.dense.fc2, seed, out_std, {H, F}, {});
            continue;
        }
        if (!layer_shapes_[l].is_moe) {
            init_normal(p.dense.fc1, seed, std);
            init_normal(p.dense.fc2, seed, out_std);
            continue;
        }
        init_normal(p.moe.router.weight, seed, std);
        if (p.moe.router.expert_bias.defined())
            p.moe.router.expert_bias.fill_zero();
        // This rank's experts are a slice [ep_rank * L_local, ...) of the global expert tensors.
        const uint64_t first_expert = static_cast<uint64_t>(shape_.ep_rank) *
                                      static_cast<uint64_t>(shape_.num_local_experts());
        if (shape_.etp_size > 1) {
            // The ETP 1 experts' values (whole FFN), then this rank's ETP shard of each.
            const int64_t L = shape_.num_local_experts(), F = shape_.moe.ffn_hidden_size;
            const auto first = static_cast<uint64_t>(first_expert);
            init_normal_etp_shard(p.moe.experts.fc1, seed, std,
                                  first * static_cast<uint64_t>(2 * F * H), {L * 2 * F, H},
                                  std::vector<int64_t>(static_cast<size_t>(2 * L), F),
                                  shape_.etp_size, shape_.etp_rank);
            init_normal_etp_shard(p.moe.experts.fc2, seed, out_std,
                                  first * static_cast<uint64_t>(H * F), {L * H, F}, {},
                                  shape_.etp_size, shape_.etp_rank);
        } else {
            init_normal(p.moe.experts.fc1, seed, std,
                        first_expert * static_cast<uint64_t>(p.moe.experts.fc1.master.row_size()));
            init_normal(p.moe.experts.fc2, seed, out_std,
                        first_expert * static_cast<uint64_t>(p.moe.experts.fc2.master.row_size()));
        }
        if (shape_.moe.shared_expert_size > 0) {
            init_normal(p.moe.shared.fc1, seed, std);
            init_normal(p.moe.shared.fc2, seed, out_std);
        }
    }
    if (shape_.mtp_num_layers > 0) {
        init_ones(mtp_.enorm);
        init_ones(mtp_.hnorm);
        init_normal(mtp_.eh_proj, seed, std);
        init_ones(mtp_.final_norm);
    }
    if (!shape_.holds(shape_.num_layers))
        return;
    init_ones(final_norm_);
    if (!shape_.tie_embeddings && tp)
        init_normal_shard(output_, seed, std, {V, H}, {V});
    else if (!shape_.tie_embeddings)
        init_normal(output_, seed, std);
}

}  // namespace epo::model
