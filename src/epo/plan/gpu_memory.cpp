#include "epo/plan/gpu_memory.h"

#include <algorithm>

#include "epo/config/finalize.h"
#include "epo/config/pipeline_layout.h"

namespace epo::plan {
namespace {

using config::ModelConfig;
using config::RecomputeGranularity;
using config::RecomputeModule;

bool recomputes(const ModelConfig& m, RecomputeModule module) {
    if (m.recompute_granularity != RecomputeGranularity::kSelective)
        return false;
    // The reference's default module list is core_attn alone.
    const std::vector<RecomputeModule> modules =
        m.recompute_modules.value_or(std::vector<RecomputeModule>{RecomputeModule::kCoreAttn});
    return std::find(modules.begin(), modules.end(), module) != modules.end();
}

double f1_factor(const ModelConfig& m) {
    return m.gated_linear_unit ? 2.0 : 1.0;  // the first MLP product's width over F
}

// Tokens of a micro-batch a rank holds outside the TP-split tensors.
double sp_tokens(const config::Config& cfg) {
    const ModelConfig& m = cfg.model;
    const double sb =
        static_cast<double>(m.seq_length) / m.context_parallel_size * cfg.train.micro_batch_size;
    return m.sequence_parallel ? sb / m.tensor_model_parallel_size : sb;
}

// (model chunk, micro-batch) units a stage holds at its peak (the header's W_s + 1).
double units_in_flight(const config::Config& cfg, int stage, bool overlap, bool pair_edges) {
    const ModelConfig& m = cfg.model;
    const config::PipelineLayout layout = config::pipeline_layout(m);
    const int64_t P = layout.num_stages, V = layout.num_chunks;
    const int64_t M = config::num_microbatches(cfg);
    int64_t warmup = P - stage - 1;
    if (V > 1)
        warmup = M == P ? M * V : 2 * (P - stage - 1) + (V - 1) * P;
    warmup = std::min(warmup, M * V);
    int64_t units = std::min(warmup + 1, M * V);
    // Paired edges run the first two forwards together: both held whole at the pair's end.
    if (overlap && pair_edges && P == 1 && M >= 2)
        units = 2;
    return static_cast<double>(std::max<int64_t>(1, units));
}

// One layer's activations as held with full recompute: its input alone (uniform: one per group).
double recomputed_layer_bytes(const config::Config& cfg) {
    return 2 * sp_tokens(cfg) * cfg.model.hidden_size;
}

}  // namespace

double fp8_weight_copy_bytes(const ModelConfig& m) {
    if (!m.fp8)
        return 0;
    // A row-wise and a column-wise (transposed) copy of one byte each; MXFP8 adds each copy's
    // E8M0 scale, one byte per 32 elements.
    return m.fp8_recipe == "mxfp8" ? 2 * (1 + 1.0 / 32) : 2;
}

LayerParams layer_params(const ModelConfig& m, bool moe_layer) {
    const double H = m.hidden_size, A = m.num_attention_heads;
    const double G = config::num_query_groups(m), d = config::kv_channels(m);
    const double tp = m.tensor_model_parallel_size;
    // Attention: the projections' weights (attn) and the rest (biases, the q/k and latent
    // norms).
    double attn = 0, attn_other = 0;
    if (m.multi_latent_attention) {
        const double qh = m.qk_head_dim + m.qk_pos_emb_head_dim, ql = m.q_lora_rank.value_or(0);
        attn = ql > 0 ? H * ql + ql * A * qh : H * A * qh;
        attn_other = ql > 0 ? ql : 0;
        attn += H * (m.kv_lora_rank + m.qk_pos_emb_head_dim) +
                m.kv_lora_rank * A * (m.qk_head_dim + m.v_head_dim);
        attn_other += m.kv_lora_rank;
        attn += A * m.v_head_dim * H;
    } else {
        attn = H * (A + 2 * G) * d + A * d * H;
        attn_other = (m.add_qkv_bias ? (A + 2 * G) * d : 0) + (m.qk_layernorm ? 2 * d : 0);
    }
    const double norms = (m.normalization == config::Normalization::kLayerNorm ? 2 : 1) * 2 * H;
    const double mlp_per_width = H * (f1_factor(m) + 1);  // both products, per unit of width
    LayerParams p;
    p.gemm_dense = attn / tp;
    p.dense = (attn + attn_other) / tp + norms;
    if (moe_layer) {
        const double E = m.num_moe_experts.value_or(0);
        p.dense += E * H;  // router (bf16 / fp32 products, never fp8)
        if (m.moe_shared_expert_intermediate_size) {
            const double shared = mlp_per_width * *m.moe_shared_expert_intermediate_size / tp;
            p.dense += shared;
            p.gemm_dense += shared;
        }
        p.expert = E / m.expert_model_parallel_size * mlp_per_width *
                   config::moe_ffn_hidden_size(m) / config::expert_tensor_parallel_size(m);
    } else {
        const double mlp = mlp_per_width * config::ffn_hidden_size(m) / tp;
        p.dense += mlp;
        p.gemm_dense += mlp;
    }
    return p;
}

double layer_activation_bytes(const config::Config& cfg, bool moe_layer) {
    const ModelConfig& m = cfg.model;
    const double t = m.tensor_model_parallel_size, h = m.hidden_size;
    const double sb =
        static_cast<double>(m.seq_length) / m.context_parallel_size * cfg.train.micro_batch_size;
    const double n = sp_tokens(cfg);
    const double A = m.num_attention_heads;
    const bool norm_recompute = recomputes(m, RecomputeModule::kLayernorm);
    double bytes = 4 * n * h;                     // the two norms' inputs
    bytes += norm_recompute ? 0 : 2 * 2 * n * h;  // their outputs: attention's and MLP's inputs
    if (m.multi_latent_attention) {
        const double qh = m.qk_head_dim + m.qk_pos_emb_head_dim, dv = m.v_head_dim;
        bytes += 2 * sb * (m.q_lora_rank.value_or(0) + m.kv_lora_rank + m.qk_pos_emb_head_dim);
        if (!recomputes(m, RecomputeModule::kMlaUpProj))
            bytes += 2 * sb * A * (2 * qh + dv) / t;  // q, k, v after the up projections
        bytes += 2 * sb * A * dv / t;                 // context
    } else {
        const double G = config::num_query_groups(m), d = config::kv_channels(m);
        bytes += 2 * sb * (2 * A * d + 2 * G * d) / t;  // q, context; k, v
    }
    const double f1 = f1_factor(m);
    if (!moe_layer) {
        if (!recomputes(m, RecomputeModule::kMlp))
            bytes += 2 * sb * (f1 + 1) * config::ffn_hidden_size(m) / t;
        return bytes;
    }
    const double E = m.num_moe_experts.value_or(0), k = m.moe_router_topk;
    const double etp = config::expert_tensor_parallel_size(m);
    const double F = config::moe_ffn_hidden_size(m) / etp;
    const double R = n * k * etp;  // rows at this rank's experts, each of width F / ETP
    bytes += 8 * n * E;            // router logits and probabilities, fp32
    if (!recomputes(m, RecomputeModule::kMoe)) {
        // Expert input (gathered over ETP: whole on each ETP rank), f1 output, and the
        // experts' output after the ETP reduce-scatter, held for the combine's probabilities.
        bytes += 2 * R * h + 2 * R * f1 * F + 2 * n * k * h;
        if (!recomputes(m, RecomputeModule::kMoeAct))
            bytes += 2 * R * F;  // the activation's output
    }
    if (m.moe_shared_expert_intermediate_size && !recomputes(m, RecomputeModule::kSharedExperts))
        bytes += 2 * sb * (f1 + 1) * *m.moe_shared_expert_intermediate_size / t;
    return bytes;
}

GpuMemory estimate_gpu_memory(const config::Config& cfg) {
    const ModelConfig& m = cfg.model;
    const int P = m.pipeline_model_parallel_size;
    const int64_t world = config::world_size(cfg);
    const double dp = static_cast<double>(world) / config::model_parallel_size(m);
    const double edp = static_cast<double>(world) /
                       (config::expert_tensor_parallel_size(m) * m.expert_model_parallel_size * P);
    const double c = compute_dtype_bytes(m);
    const bool dist = cfg.ddp.use_distributed_optimizer;
    const std::vector<bool> moe = config::moe_layer_pattern(m);
    const double t = m.tensor_model_parallel_size, H = m.hidden_size;
    const double V = m.vocab_size.value_or(0);
    const double n = sp_tokens(cfg);
    const double sb =
        static_cast<double>(m.seq_length) / m.context_parallel_size * cfg.train.micro_batch_size;
    const bool overlap = m.overlap_moe_expert_parallel_comm;
    const bool full = m.recompute_granularity == RecomputeGranularity::kFull;
    const int group = std::max(1, m.recompute_num_layers.value_or(1));
    const bool block = m.recompute_method == config::RecomputeMethod::kBlock;
    const int mtp = m.mtp_num_layers.value_or(0);
    const bool last_moe = !moe.empty() && moe.back();

    const config::PipelineLayout layout = config::pipeline_layout(m);
    GpuMemory out;
    for (int s = 0; s < P; ++s) {
        StageMemory st;
        st.stage = s;
        double dense = 0, expert = 0, act = 0, transient = 0, widest = 0;
        double gemm = 0;  // elements of the layers' fp8 product weights
        const std::vector<config::ModelChunk>& chunks = layout.chunks[static_cast<size_t>(s)];
        for (const config::ModelChunk& ch : chunks) {
            for (int i = 0; i < ch.num_layers; ++i) {
                const int l = ch.first_layer + i;
                const bool is_moe = moe[static_cast<size_t>(l)];
                const LayerParams p = layer_params(m, is_moe);
                dense += p.dense;
                expert += p.expert;
                gemm += p.gemm_dense + p.expert;
                const double a = layer_activation_bytes(cfg, is_moe);
                widest = std::max(widest, a);
                if (!full)
                    act += a;
                else if (block)
                    act += i < group ? recomputed_layer_bytes(cfg) : a;
                else
                    act += (i % group == 0) ? recomputed_layer_bytes(cfg) : 0;
            }
            st.num_layers += ch.num_layers;
            // Full recompute rebuilds one group's activations during its backward.
            if (full)
                transient = std::max(transient, widest * std::min(group, ch.num_layers));
        }
        const double per_unit = act / static_cast<double>(chunks.size());
        const double base_units = units_in_flight(cfg, s, false, false);
        st.units_in_flight = units_in_flight(cfg, s, overlap, m.moe_ep_overlap_pair_edges);
        // EP overlap's combined step runs layer j's forward of one micro-batch beside layer
        // L-1-j's backward of another: as one frees a layer the other takes one, so the peak is
        // one layer above the baseline's (the pair in flight); delayed weight gradients hold
        // one layer's output gradients more until backward_dw.
        st.overlap_extra = (st.units_in_flight - base_units) * per_unit + (overlap ? widest : 0) +
                           (overlap && m.delay_wgrad_compute ? widest : 0);
        st.activations = base_units * per_unit + st.overlap_extra + transient;
        if (s == 0) {
            dense += V * H / t;                                             // word embeddings
            st.activations += 8 * sb * st.units_in_flight / chunks.size();  // token ids
        }
        if (s == P - 1) {
            dense += (m.normalization == config::Normalization::kLayerNorm ? 2 : 1) * H;
            if (!m.share_embeddings_and_output_weights || P > 1)
                dense += V * H / t;  // the output layer (a copy of the tied embedding with PP)
            // MTP looks up the shifted tokens on this stage: with PP and untied weights it holds
            // a copy of the word embedding beside the output layer (Megatron-Core builds the
            // embedding on the MTP stage; the epo runtime likewise).
            if (mtp > 0 && P > 1 && !m.share_embeddings_and_output_weights)
                dense += V * H / t;
            // One micro-batch's output at a time: the last stage runs its backward at once.
            st.activations += 4 * n * H + 4 * sb * V / t;
            for (int i = 0; i < mtp; ++i) {
                const LayerParams p = layer_params(m, last_moe);
                dense += p.dense + 2 * H * H / t + 3 * H;
                expert += p.expert;
                gemm += p.gemm_dense + p.expert + 2 * H * H / t;  // its layer and projection
                st.activations += st.units_in_flight *
                                      (layer_activation_bytes(cfg, last_moe) + 2 * sb * 2 * H / t) +
                                  4 * sb * V / t;
            }
        }
        st.weights = c * (dense + expert);
        st.fp8_weights = fp8_weight_copy_bytes(m) * gemm;
        st.main_grads = main_grad_bytes(cfg) * (dense + expert);
        const double adam = c == 2 ? 12 : 8;
        st.optimizer = adam * (dist ? dense / dp + expert / edp : dense + expert);
        out.stages.push_back(st);
    }
    for (size_t s = 1; s < out.stages.size(); ++s) {
        if (out.stages[s].total() > out.stages[static_cast<size_t>(out.busiest_stage)].total())
            out.busiest_stage = static_cast<int>(s);
    }
    return out;
}

}  // namespace epo::plan
