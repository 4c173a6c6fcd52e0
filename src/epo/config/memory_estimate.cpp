#include "epo/config/memory_estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "epo/core/error.h"

namespace epo::config {
namespace {

struct Widths {
    int64_t c = 2;  // compute dtype bytes
    int64_t H = 0, V = 0, S = 0, B = 1, T = 0;
    int64_t A = 0, G = 0, d = 0, W = 0;
    int64_t E = 0, E_local = 0, k = 0, F = 0, f1 = 0;  // MoE
    int64_t Fd = 0, f1d = 0;                           // dense MLP
    int64_t Fs = 0, f1s = 0;                           // shared expert (0: none)
    // Multi-latent attention (mla): q_lora_rank (0: none), kv_lora_rank, qk_head_dim,
    // qk_pos_emb_head_dim, v_head_dim.
    bool mla = false;
    int64_t Rq = 0, Rkv = 0, Dn = 0, Dr = 0, Dv = 0;
};

Widths widths_of(const Config& cfg) {
    const ModelConfig& m = cfg.model;
    Widths w;
    const bool gated = m.gated_linear_unit;
    w.c = m.bf16 ? 2 : 4;
    w.H = m.hidden_size;
    w.V = m.vocab_size.value_or(0);
    w.S = m.seq_length;
    w.B = cfg.train.micro_batch_size;
    w.T = w.B * w.S;
    w.A = m.num_attention_heads;
    w.G = num_query_groups(m);
    w.d = kv_channels(m);
    w.W = (w.A + 2 * w.G) * w.d;
    w.mla = m.multi_latent_attention;
    if (w.mla) {
        w.Rq = m.q_lora_rank.value_or(0);
        w.Rkv = m.kv_lora_rank;
        w.Dn = m.qk_head_dim;
        w.Dr = m.qk_pos_emb_head_dim;
        w.Dv = m.v_head_dim;
    }
    w.Fd = ffn_hidden_size(m);
    w.f1d = gated ? 2 * w.Fd : w.Fd;
    if (is_moe(m)) {
        w.E = *m.num_moe_experts;
        w.E_local = w.E / std::max(1, m.expert_model_parallel_size);
        w.k = m.moe_router_topk;
        w.F = moe_ffn_hidden_size(m);
        w.f1 = gated ? 2 * w.F : w.F;
        w.Fs = m.moe_shared_expert_intermediate_size.value_or(0);
        w.f1s = gated ? 2 * w.Fs : w.Fs;
    }
    return w;
}

struct LayerBytes {
    int64_t fwd = 0;
    int64_t bwd = 0;
    int64_t recomputed = 0;  // what selective recompute writes to scratch instead of fwd
};

// Multi-latent attention's parameters (model/mla_attention.h): q_down (Rq, H) and q_up
// (A Dq, Rq), or q_proj (A Dq, H); kv_down (Rkv + Dr, H); kv_up (A (Dn + Dv), Rkv); proj
// (H, A Dv); with qk_layernorm the q norm (Rq, or H) and the kv norm (Rkv).
int64_t mla_params(const ModelConfig& m, const Widths& w) {
    const int64_t Dq = w.Dn + w.Dr, q_in = w.Rq > 0 ? w.Rq : w.H;
    int64_t n = (w.Rq > 0 ? w.Rq * w.H : 0) + w.A * Dq * q_in + (w.Rkv + w.Dr) * w.H +
                w.A * (w.Dn + w.Dv) * w.Rkv + w.H * w.A * w.Dv;
    if (m.qk_layernorm)
        n += q_in + w.Rkv;
    return n;
}

// What multi-latent attention saves per micro-batch (model/mla_attention.h, mla_saved_bytes):
// forward: cq and q_up's input (or the normed x), the kv latent before and after its norm, the
// norms' rstd, q, k, v, ctx and the probabilities; dgrad for wgrad: the gradients of every
// projection's output (dout, dq, dkv, dkv_down, dcq).
LayerBytes mla_bytes(const ModelConfig& m, const Widths& w) {
    const int64_t c = w.c, T = w.T, Dq = w.Dn + w.Dr;
    const bool lora = w.Rq > 0, norm = m.qk_layernorm;
    int64_t per_token = 0;
    if (lora)
        per_token += c * w.Rq * (norm ? 2 : 1) + (norm ? 4 : 0);
    else if (norm)
        per_token += c * w.H + 4;
    per_token += c * w.Rkv * (norm ? 2 : 1) + (norm ? 4 : 0);
    per_token += c * (2 * w.A * Dq + 2 * w.A * w.Dv);
    LayerBytes b;
    b.fwd = T * per_token + c * w.B * w.A * w.S * w.S;
    b.bwd = T * c * (w.H + w.A * Dq + w.A * (w.Dn + w.Dv) + w.Rkv + w.Dr + (lora ? w.Rq : 0));
    return b;
}

struct ParamCounts {
    int64_t dense = 0;
    int64_t expert = 0;
};

ParamCounts param_counts(const Config& cfg, const Widths& w) {
    const ModelConfig& m = cfg.model;
    ParamCounts p;
    p.dense = w.V * w.H * (m.share_embeddings_and_output_weights ? 1 : 2) + w.H;
    for (bool moe : moe_layer_pattern(m)) {
        p.dense += 2 * w.H + (w.mla ? mla_params(m, w)
                                    : w.H * w.W + w.A * w.d * w.H + (m.qk_layernorm ? 2 * w.d : 0));
        if (moe) {
            p.dense += w.E * w.H + (m.moe_router_enable_expert_bias ? w.E : 0);
            p.dense += w.H * w.f1s + w.Fs * w.H;
            p.expert += w.E_local * (w.H * w.f1 + w.F * w.H);
        } else {
            p.dense += w.H * w.f1d + w.Fd * w.H;
        }
    }
    return p;
}

// What each selected module does not keep (the header's recompute line), for one layer.
int64_t recompute_saving(const Config& cfg, const Widths& w, bool moe) {
    const ModelConfig& m = cfg.model;
    const int64_t c = w.c, T = w.T, H = w.H, R = T * w.k;
    int64_t saved = 0;
    if (recomputes_module(m, RecomputeModule::kLayernorm))
        saved += 2 * c * T * H;
    if (recomputes_module(m, RecomputeModule::kCoreAttn))
        saved += c * w.B * w.A * w.S * w.S;
    if (moe && recomputes_module(m, RecomputeModule::kMoeAct))
        saved += c * R * w.F;
    if (moe && w.Fs > 0 && recomputes_module(m, RecomputeModule::kSharedExperts))
        saved += c * T * (w.f1s + w.Fs);
    if (!moe && recomputes_module(m, RecomputeModule::kMlp))
        saved += c * T * (w.f1d + w.Fd);
    return saved;
}

// The per-layer formulas of the header, one micro-batch.
LayerBytes layer_bytes(const Config& cfg, const Widths& w, bool moe) {
    const int64_t c = w.c, T = w.T, H = w.H, R = T * w.k;
    LayerBytes b;
    b.fwd = 8 * T * H + 2 * c * T * H + 8 * T;
    b.bwd = c * T * H + 4 * T * H;  // d_out_c, dn2
    if (w.mla) {
        const LayerBytes a = mla_bytes(cfg.model, w);
        b.fwd += a.fwd;
        b.bwd += a.bwd;
    } else {
        b.fwd += c * T * (w.W + w.A * w.d) + c * w.B * w.A * w.S * w.S;
        if (cfg.model.qk_layernorm)
            b.fwd += 4 * T * (w.A + w.G) * (w.d + 1);
        b.bwd += c * T * H + c * T * w.W;  // dout, dqkv
    }
    if (moe) {
        b.fwd += 8 * T * w.E + 12 * T * w.k + 6 * c * R * H + c * R * (w.f1 + w.F);
        b.bwd += 6 * T * w.E + 5 * c * R * H + c * R * w.f1;
        if (w.Fs > 0) {
            b.fwd += c * T * (w.f1s + w.Fs) + 4 * T * H;
            b.bwd += c * T * w.f1s;
        }
    } else {
        b.fwd += c * T * (w.f1d + w.Fd);
        b.bwd += c * T * w.f1d;
    }
    b.recomputed = recompute_saving(cfg, w, moe);
    b.fwd -= b.recomputed;
    return b;
}

double gib(int64_t bytes) {
    return static_cast<double>(bytes) / (1024.0 * 1024 * 1024);
}

std::optional<int64_t> read_number(const char* path) {
    std::ifstream in(path);
    std::string text;
    if (!(in >> text) || text == "max")
        return std::nullopt;
    try {
        return std::stoll(text);
    } catch (...) {
        return std::nullopt;
    }
}

std::optional<int64_t> mem_available() {
    std::ifstream in("/proc/meminfo");
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream fields(line);
        std::string key;
        int64_t kib = 0;
        if (fields >> key >> kib && key == "MemAvailable:")
            return kib * 1024;
    }
    return std::nullopt;
}

}  // namespace

ActivationBytes activation_bytes(const Config& cfg) {
    const Widths w = widths_of(cfg);
    ActivationBytes a;
    const LayerBytes moe = layer_bytes(cfg, w, true), dense = layer_bytes(cfg, w, false);
    a.moe_layer = moe.fwd + moe.bwd;
    a.dense_layer = dense.fwd + dense.bwd;
    a.output = w.T * (4 * w.H + w.c * w.H + 4 * w.H + w.c * w.V) + 4 * w.T;
    a.handoff = 8 * w.T * w.H;
    a.layer_input = 4 * w.T * w.H;
    return a;
}

int64_t layers_activation_bytes(const ActivationBytes& a, const std::vector<bool>& moe_layers,
                                const std::vector<int>& recompute_first, int64_t first,
                                int64_t end) {
    const auto group_of = [&](int64_t l) {
        return recompute_first.empty() ? -1 : recompute_first[static_cast<size_t>(l)];
    };
    const auto layer = [&](int64_t l) {
        return moe_layers[static_cast<size_t>(l)] ? a.moe_layer : a.dense_layer;
    };
    // below: what the layers under the current one hold once the backward has reached it (kept
    // layers whole, recomputed groups their input).
    int64_t below = 0, peak = 0;
    for (int64_t l = first; l < end; ++l) {
        const int64_t g = group_of(l);
        if (g < 0) {
            below += layer(l);
            continue;
        }
        if (g != l)
            continue;
        int64_t group = 0;
        for (int64_t k = l; k < end && group_of(k) == g; ++k)
            group += layer(k);
        // While the group runs its recompute and backward, the layers above it are done.
        peak = std::max(peak, below + group);
        below += a.layer_input;
    }
    // Before the backward (the output position's turn): every kept layer and group input.
    return std::max(peak, below);
}

int64_t scratch_bytes(const Config& cfg) {
    const Widths w = widths_of(cfg);
    int64_t recomputed = 0;  // the largest layer's recomputed tensors, in scratch
    for (bool moe : moe_layer_pattern(cfg.model))
        recomputed = std::max(recomputed, layer_bytes(cfg, w, moe).recomputed);
    if (recomputes_module(cfg.model, RecomputeModule::kCoreAttn)) {
        // One head's P and scores at a time, instead of the layer's probabilities.
        recomputed += (w.c + 4) * w.S * w.S - w.c * w.B * w.A * w.S * w.S;
    }
    int64_t base = 4 * w.T * w.W + w.c * w.T * w.A * w.d + (4 + w.c) * w.S * w.S + 8 * w.T * w.H;
    if (w.mla) {
        // MLA's dgrad: f32 dq, dk, dv, the context gradient, and the latents' f32 gradients.
        const int64_t Dq = w.Dn + w.Dr;
        base = 4 * w.T * (2 * w.A * Dq + w.A * w.Dv + w.Dr + w.Rkv + std::max(w.Rq, w.H)) +
               w.c * w.T * w.A * w.Dv + (4 + w.c) * w.S * w.S + 8 * w.T * w.H;
    }
    return base + std::max<int64_t>(0, recomputed);
}

int micro_batches_in_flight(const Config& cfg) {
    if (!cfg.model.overlap_moe_expert_parallel_comm)
        return 1;
    // Paired edges: a combined step (forward i + 2, backward i) holds i, i + 1 and i + 2.
    return cfg.model.moe_ep_overlap_pair_edges && num_microbatches(cfg) >= 3 ? 3 : 2;
}

MemoryEstimate estimate_rank_memory(const Config& cfg, int64_t world_size) {
    const Widths w = widths_of(cfg);
    const ParamCounts p = param_counts(cfg, w);
    const int64_t params = p.dense + p.expert;
    MemoryEstimate m;
    m.parameters = params * (4 + (w.c == 4 ? 0 : w.c));
    m.gradients = params * 4;
    const bool distributed = cfg.ddp.use_distributed_optimizer;
    const int64_t dp_dense = std::max<int64_t>(1, data_parallel_size(cfg));
    const int64_t dp_expert =
        std::max<int64_t>(1, world_size / std::max(1, cfg.model.expert_model_parallel_size));
    m.optimizer =
        p.dense * 8 / (distributed ? dp_dense : 1) + p.expert * 8 / (distributed ? dp_expert : 1);
    m.packed = p.expert * 2 * w.c;

    const ActivationBytes a = activation_bytes(cfg);
    const std::vector<bool> moe_layers = moe_layer_pattern(cfg.model);
    const auto L = static_cast<int>(moe_layers.size());
    // One model chunk of every layer (PP = 1: this estimate's case).
    const int64_t per_micro_batch =
        a.output + a.handoff +
        layers_activation_bytes(a, moe_layers, full_recompute_groups(cfg.model, 0, L), 0, L);
    m.micro_batches_in_flight = micro_batches_in_flight(cfg);
    m.activations = m.micro_batches_in_flight * per_micro_batch;
    m.scratch = scratch_bytes(cfg);
    return m;
}

std::string format_memory_estimate(const MemoryEstimate& m) {
    return fmt::format(
        "{:.2f} GiB per rank: parameters {:.2f}, gradients {:.2f}, optimizer state {:.2f}, "
        "packed expert weights {:.2f}, activations {:.2f} ({} micro-batch{} in flight), "
        "scratch {:.2f}, runtime {:.2f} GiB",
        gib(m.total()), gib(m.parameters), gib(m.gradients), gib(m.optimizer), gib(m.packed),
        gib(m.activations), m.micro_batches_in_flight, m.micro_batches_in_flight == 1 ? "" : "es",
        gib(m.scratch), gib(m.runtime));
}

std::optional<int64_t> available_memory_bytes() {
    std::optional<int64_t> available = mem_available();
    // cgroup v2, then v1: the limit minus what the group already uses.
    const struct {
        const char* limit;
        const char* usage;
    } groups[] = {{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
                  {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                   "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
    for (const auto& g : groups) {
        const std::optional<int64_t> limit = read_number(g.limit);
        // v1 reports "no limit" as a huge number (close to 2^63).
        if (!limit || *limit >= (int64_t{1} << 60))
            continue;
        const int64_t left = *limit - read_number(g.usage).value_or(0);
        available = available ? std::min(*available, left) : left;
        break;
    }
    return available;
}

void check_memory_fits(const MemoryEstimate& estimate, int ranks_on_host,
                       std::optional<int64_t> available) {
    const int64_t need = estimate.total() * std::max(1, ranks_on_host);
    if (!available || need <= *available)
        return;
    throw Error(
        ErrorKind::kConfig,
        fmt::format("the run needs about {:.2f} GiB of memory ({} rank{} on this host at {}) but "
                    "this machine has {:.2f} GiB available (MemAvailable, or the cgroup's limit "
                    "when lower); shrink model.hidden_size, model.num_layers, "
                    "model.moe_ffn_hidden_size / ffn_hidden_size, model.num_moe_experts, "
                    "model.vocab_size, model.seq_length or train.micro_batch_size, or spread the "
                    "experts over more ranks (model.expert_model_parallel_size)",
                    gib(need), ranks_on_host, ranks_on_host == 1 ? "" : "s",
                    format_memory_estimate(estimate), gib(*available)));
}

}  // namespace epo::config
