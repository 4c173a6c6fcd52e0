// GptShape from a finalized configuration.
#include <algorithm>

#include "epo/config/config.h"
#include "epo/config/pipeline_layout.h"
#include "epo/model/gpt_model.h"
#include "epo/moe/flex_layout.h"
#include "epo/moe/moe_config.h"

namespace epo::model {

GptShape gpt_shape_from_config(const config::Config& cfg, int ep_size, int ep_rank,
                               int pipeline_rank) {
    const config::ModelConfig& m = cfg.model;
    GptShape s;
    s.num_layers = m.num_layers;
    s.hidden = m.hidden_size;
    s.vocab = m.vocab_size.value_or(0);
    s.seq_length = m.seq_length;
    s.micro_batch_size = cfg.train.micro_batch_size;
    s.attn = AttentionShape{
        .hidden = m.hidden_size,
        .num_heads = m.num_attention_heads,
        .num_groups = config::num_query_groups(m),
        .head_dim = config::kv_channels(m),
        .seq_length = m.seq_length,
        .qk_layernorm = m.qk_layernorm,
        .norm_eps = static_cast<float>(m.layernorm_epsilon),
        .recompute_core_attn = config::recomputes_module(m, config::RecomputeModule::kCoreAttn)};
    s.multi_latent_attention = m.multi_latent_attention;
    if (m.multi_latent_attention) {
        s.mla = MlaShape{.hidden = m.hidden_size,
                         .num_heads = m.num_attention_heads,
                         .q_lora_rank = m.q_lora_rank.value_or(0),
                         .kv_lora_rank = m.kv_lora_rank,
                         .qk_head_dim = m.qk_head_dim,
                         .qk_pos_emb_head_dim = m.qk_pos_emb_head_dim,
                         .v_head_dim = m.v_head_dim,
                         .seq_length = m.seq_length,
                         .qk_layernorm = m.qk_layernorm,
                         .norm_eps = static_cast<float>(m.layernorm_epsilon)};
    }
    s.norm_eps = static_cast<float>(m.layernorm_epsilon);
    s.rotary_base = m.rotary_base;
    s.init_std = static_cast<float>(m.init_method_std);
    s.ffn_hidden = config::ffn_hidden_size(m);
    s.moe_layers = config::moe_layer_pattern(m);
    // Multi-token prediction: the MTP's transformer layer is one more layer position, with the
    // decoder's last layer's kind (Megatron-Core's MTP block takes that layer's spec).
    s.mtp_num_layers = m.mtp_num_layers.value_or(0);
    if (s.mtp_num_layers > 0) {
        s.mtp_loss_scale =
            static_cast<float>(m.mtp_loss_scaling_factor / static_cast<double>(s.mtp_num_layers));
        const bool last_is_moe = !s.moe_layers.empty() && s.moe_layers.back();
        for (int64_t i = 0; i < s.mtp_num_layers; ++i)
            s.moe_layers.push_back(last_is_moe);
        s.num_layers += s.mtp_num_layers;
    }
    if (config::is_moe(m))
        s.moe = moe::moe_config_from(m);
    s.ep_size = ep_size;
    s.ep_rank = ep_rank;
    if (config::is_moe(m) && s.moe.dispatcher != moe::DispatcherKind::kAlltoall)
        s.ep_ranks_per_node =
            moe::flex::flex_ranks_per_node(ep_size, config::gpus_per_node(cfg.comm));
    s.tie_embeddings = m.share_embeddings_and_output_weights;
    s.gradient_accumulation_fusion = m.gradient_accumulation_fusion;
    s.compute_dtype = m.bf16 ? DType::kBF16 : DType::kF32;
    s.recompute = LayerRecompute{
        .layernorm = config::recomputes_module(m, config::RecomputeModule::kLayernorm),
        .mlp = config::recomputes_module(m, config::RecomputeModule::kMlp)};
    const config::PipelineLayout layout = config::pipeline_layout(m);
    s.pipeline_size = layout.num_stages;
    s.virtual_pipeline_size = layout.num_chunks;
    s.pipeline_rank = pipeline_rank;
    if (layout.num_stages * layout.num_chunks > 1) {
        for (const auto& stage : layout.chunks) {
            auto& out = s.pipeline_chunks.emplace_back();
            for (const config::ModelChunk& c : stage)
                out.push_back(LayerRange{c.first_layer, c.first_layer + c.num_layers});
        }
        // The MTP layers follow the decoder's last layer on the last stage (the layout's 'm').
        s.pipeline_chunks.back().back().end += s.mtp_num_layers;
    }
    if (m.recompute_granularity == config::RecomputeGranularity::kFull) {
        // Groups per model chunk, as Megatron-Core's TransformerBlock counts its own layers.
        s.recompute_first.assign(static_cast<size_t>(s.num_layers), -1);
        for (int stage = 0; stage < s.pipeline_size; ++stage) {
            for (int chunk = 0; chunk < s.virtual_pipeline_size; ++chunk) {
                const LayerRange r = s.chunk_layers(stage, chunk);
                const std::vector<int> g = config::full_recompute_groups(
                    m, static_cast<int>(r.first), static_cast<int>(r.end));
                std::copy(g.begin(), g.end(), s.recompute_first.begin() + r.first);
            }
        }
    }
    return s;
}

}  // namespace epo::model
