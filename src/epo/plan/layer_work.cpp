#include "epo/plan/layer_work.h"

#include <algorithm>

namespace epo::plan {
namespace {

using schedule::NodeCall;
using schedule::NodeKind;
using schedule::Phase;

// Attention of one layer: multi-latent (MLA, DeepSeek) or grouped-query, heads split over TP,
// the sequence over CP (this rank's queries Sc = S / CP against every key).
//   GQA  qkv (Tc, (A + 2G) d / TP, H), proj (Tc, H, A d / TP); scores (Sc, S, d), context
//        (Sc, d, S) per sequence and local head
//   MLA  q: (Tc, q_lora, H) then (Tc, A (dn + dr) / TP, q_lora) [or (Tc, A (dn + dr) / TP, H)
//        without q_lora]; kv: (Tc, kv_lora + dr, H) then (Tc, A (dn + dv) / TP, kv_lora);
//        proj (Tc, H, A dv / TP); scores with head dim dn + dr, context with dv
//        (dn = qk_head_dim, dr = qk_pos_emb_head_dim: the rope part, dv = v_head_dim)
void attention_work(const PlanModel& m, ForwardWork& w) {
    const model::GptShape& s = m.shape;
    const double c = static_cast<double>(m.compute_bytes);
    const double tp = m.tp_size, cp = m.cp_size;
    const double Tc = static_cast<double>(s.tokens()) / cp, H = static_cast<double>(s.hidden);
    const double B = static_cast<double>(s.micro_batch_size), S = static_cast<double>(s.seq_length);
    const double A = static_cast<double>(s.attn.num_heads);
    const double heads = B * A / tp * m.attention_fraction;
    double width = 0;  // q, k, v per token and rank after the projections
    if (m.mla) {
        const double qh = m.qk_head_dim + m.qk_pos_emb_head_dim, dv = m.v_head_dim;
        if (m.q_lora_rank > 0) {
            w.weight_gemms.push_back({Tc, m.q_lora_rank, H});
            w.weight_gemms.push_back({Tc, A * qh / tp, m.q_lora_rank});
        } else {
            w.weight_gemms.push_back({Tc, A * qh / tp, H});
        }
        w.weight_gemms.push_back({Tc, m.kv_lora_rank + m.qk_pos_emb_head_dim, H});
        w.weight_gemms.push_back({Tc, A * (m.qk_head_dim + dv) / tp, m.kv_lora_rank});
        w.weight_gemms.push_back({Tc, H, A * dv / tp});
        w.act_gemms = {{S / cp, S, qh, heads}, {S / cp, dv, S, heads}};
        width = A * (2 * qh + dv) / tp;
        w.cp_bytes = (cp - 1) * Tc * A * (qh + dv) / tp * c;
    } else {
        const double G = static_cast<double>(s.attn.num_groups);
        const double d = static_cast<double>(s.attn.head_dim);
        width = (A + 2 * G) * d / tp;
        w.weight_gemms.push_back({Tc, width, H});
        w.weight_gemms.push_back({Tc, H, A * d / tp});
        w.act_gemms = {{S / cp, S, d, heads}, {S / cp, d, S, heads}};
        w.cp_bytes = (cp - 1) * Tc * 2 * G * d / tp * c;
    }
    w.elementwise_bytes +=
        4 * sharded_tokens(m) * H * (4 + c)  // two norms, residual add
        + 2 * Tc * width * (4 + c)           // q/k/v: norm, rope, split
        // softmax over the scores, unless fused (flash attention)
        + (m.fused_attention ? 0.0 : B * A / tp * S / cp * S * (8 + c) * m.attention_fraction);
    w.tp_collectives += 2;  // gather before the projections, scatter (reduce) after
    w.tp_gathers += 1;
}

// The MLP of a layer: routed experts (a chunk's share), or dense.
//   MoE   the busiest rank's R = f Ts k rows (Ts = sharded_tokens), gathered over ETP: R ETP
//         rows over its E_local experts, each (rows, 2F / ETP, H) and (rows, H, F / ETP)
//   dense (Tc, 2F / TP, H), (Tc, H, F / TP)
void mlp_work(const PlanModel& m, const NodeCall& call, bool moe, double part, ForwardWork& w) {
    const model::GptShape& s = m.shape;
    const double c = static_cast<double>(m.compute_bytes), H = static_cast<double>(s.hidden);
    if (moe) {
        const double R =
            sharded_tokens(m) * static_cast<double>(s.moe.topk) *
            (call.layer >= 0 && static_cast<size_t>(call.layer) < m.load_imbalance.size()
                 ? m.load_imbalance[static_cast<size_t>(call.layer)]
                 : 1.0);
        const double F = static_cast<double>(s.moe.ffn_hidden_size) / m.etp_size;
        const double local = static_cast<double>(s.num_local_experts());
        // A chunk runs `part` of the local experts on their whole rows.
        const double experts = local * part;
        const double rows = R / local * m.etp_size;
        w.weight_gemms.push_back({rows, 2 * F, H, experts});
        w.weight_gemms.push_back({rows, H, F, experts});
        // activation, sorts
        w.elementwise_bytes += (R * m.etp_size * 3 * F * c + 4 * R * m.etp_size * H * c) * part;
    } else {
        const double Tc = static_cast<double>(s.tokens()) / m.cp_size;
        const double F = static_cast<double>(s.ffn_hidden) / m.tp_size;
        w.weight_gemms.push_back({Tc, 2 * F, H});
        w.weight_gemms.push_back({Tc, H, F});
        w.elementwise_bytes += Tc * 3 * F * c;
        w.tp_collectives += 2;
        w.tp_gathers += 1;
    }
}

bool recomputes(const PlanModel& m, config::RecomputeModule module) {
    return std::find(m.recompute_modules.begin(), m.recompute_modules.end(), module) !=
           m.recompute_modules.end();
}

}  // namespace

// Tokens of a micro-batch this rank holds outside the tensor-parallel products: the sequence
// chunk of its CP rank, split over TP with sequence parallelism (Megatron-Core requires it for MoE
// with TP > 1, so the router and the dispatcher see T / (CP TP) tokens).
double sharded_tokens(const PlanModel& m) {
    return static_cast<double>(m.shape.tokens()) / m.cp_size /
           (m.sequence_parallel ? m.tp_size : 1);
}

// A micro-batch's rows that leave this rank, split by where they go: `rows` copies spread
// evenly over the EP group (uniform routing), (ep_per_node - 1) / EP of them to this node's other
// ranks, (EP - ep_per_node) / EP to other nodes. Flex sends a token to each other node once
// (flex_remote_copies) and fans it out inside the destination node. With ETP > 1 the rows a rank
// receives are all-gathered inside its expert-tensor-parallel group (and reduce-scattered on the
// way back): (ETP - 1) more copies of them inside the node.
comm::ByteCounts routed_bytes(const PlanModel& m, double row_bytes) {
    const double T = sharded_tokens(m);
    const double k = static_cast<double>(m.shape.moe.topk);
    const double ep = m.ep_size, local = m.ep_ranks_per_node;
    double intra_rows = T * k * (local - 1) / ep;
    double inter_rows = T * k * (ep - local) / ep;
    if (m.flex && m.ep_size > m.ep_ranks_per_node) {
        const int ep_nodes = m.ep_size / m.ep_ranks_per_node;
        inter_rows = T * flex_remote_copies(m.shape.moe.num_experts, m.shape.moe.topk, ep_nodes);
        // What arrives from other nodes for this node's other ranks goes on inside the node.
        intra_rows += inter_rows * (local - 1) / local;
    }
    intra_rows += T * k * (m.etp_size - 1);
    comm::ByteCounts b;
    b.intra_sent = b.intra_recv = static_cast<int64_t>(intra_rows * row_bytes);
    b.inter_sent = b.inter_recv = static_cast<int64_t>(inter_rows * row_bytes);
    return b;
}

// The expert load imbalance of the call's layer (1 for dense layers and for whole-model calls).
double imbalance_at(const PlanModel& m, int layer) {
    return layer >= 0 && static_cast<size_t>(layer) < m.load_imbalance.size()
               ? m.load_imbalance[static_cast<size_t>(layer)]
               : 1.0;
}

// How many equal chunks a MoE layer's dispatch/mlp/combine call is one of (1 for a whole call).
double chunk_share(const PlanModel& m, const NodeCall& call) {
    return call.moe_chunk >= 0 ? static_cast<double>(m.shape.moe.num_chunks) : 1.0;
}

namespace {
// The shared expert's forward: fc1 (Tc, 2 Fs / TP, H), fc2 (Tc, H, Fs / TP), SwiGLU, between a
// gather and a reduce-scatter over TP (Megatron-Core's SharedExpertMLP); the epo runtime runs it
// whole on the rank's Ts rows (epo_runtime_tp).
void plan_shared_expert_work(const PlanModel& m, ForwardWork& w) {
    const model::GptShape& s = m.shape;
    const double c = static_cast<double>(m.compute_bytes), H = static_cast<double>(s.hidden);
    const bool split = !m.epo_runtime_tp;
    const double rows = split ? static_cast<double>(s.tokens()) / m.cp_size : sharded_tokens(m);
    const double Fs = static_cast<double>(s.moe.shared_expert_size) / (split ? m.tp_size : 1);
    w.weight_gemms.push_back({rows, 2 * Fs, H});
    w.weight_gemms.push_back({rows, H, Fs});
    w.elementwise_bytes += rows * 3 * Fs * c;
    if (split) {
        w.tp_collectives += 2;
        w.tp_gathers += 1;
    }
}
}  // namespace

ForwardWork forward_work(const PlanModel& m, const NodeCall& call) {
    const model::GptShape& s = m.shape;
    const double c = static_cast<double>(m.compute_bytes);
    const double Ts = sharded_tokens(m), H = static_cast<double>(s.hidden);
    const double Tc = static_cast<double>(s.tokens()) / m.cp_size;
    const bool moe = call.layer >= 0 && s.moe_layers[static_cast<size_t>(call.layer)];
    const double E = static_cast<double>(s.moe.num_experts), k = static_cast<double>(s.moe.topk);
    ForwardWork w;
    switch (call.node) {
        case NodeKind::kEmbedding:
            w.elementwise_bytes = Ts * H * (c + 4);  // gather rows, write the hand-off
            w.tp_collectives = 1;                    // the vocabulary-parallel lookup's reduction
            break;
        case NodeKind::kPreDispatch: {
            if (s.is_mtp_layer(call.layer)) {
                // The MTP layer first looks up the shifted tokens' embeddings, normalizes them
                // and the hidden state (enorm, hnorm) and projects their concatenation
                // (Tc, H, 2H) back to H.
                w.elementwise_bytes += Ts * H * (c + 4) + 2 * Ts * H * (4 + c);
                w.weight_gemms.push_back({Tc, H, 2 * H / m.tp_size});
            }
            attention_work(m, w);
            if (moe) {
                w.weight_gemms.push_back({.m = Ts, .n = E, .k = H, .keeps_bf16 = true});  // router
                // Permuting this rank's own Ts k rows (balanced on the sending side), top-k.
                w.elementwise_bytes += 2 * Ts * k * H * c + Ts * E * 12;
                // The shared expert runs here, beside the router (moe_block.cpp), unless it is
                // a node of its own (shared-expert overlap).
                if (s.moe.shared_expert_size > 0 && !s.moe.shared_expert_overlap)
                    plan_shared_expert_work(m, w);
            }
            break;
        }
        case NodeKind::kSharedExpert:
            plan_shared_expert_work(m, w);
            break;
        case NodeKind::kMlp:
            mlp_work(m, call, moe, 1 / chunk_share(m, call), w);
            break;
        case NodeKind::kOutput: {
            const double V = static_cast<double>(s.vocab) / m.tp_size;
            // Each multi-token-prediction depth adds its own output head and loss here (the
            // runtime's output call runs them); its transformer layer is a layer of the schedule
            // (GptShape's last position: its own pre_dispatch, dispatch, mlp and combine calls).
            const double heads = 1 + m.mtp_num_layers;
            w.weight_gemms.push_back({.m = Tc, .n = V, .k = H, .count = heads, .keeps_bf16 = true});
            // final norm, softmax + CE
            w.elementwise_bytes += heads * (Ts * H * (4 + c) + Tc * V * (8 + c));
            w.tp_collectives += heads;  // gather before the output layer
            w.tp_gathers += heads;
            // The vocabulary-parallel cross-entropy over TP (per token, fp32): Megatron-Core
            // all-reduces the maxima, the label's logits and the sums of exponentials, 3 x
            // 2 (TP-1)/TP x 4 bytes a token; the epo runtime all-gathers the maxima ((TP-1) x 4)
            // and all-reduces the other two. Equal at TP 2.
            if (m.tp_size > 1) {
                const double g = m.tp_size;
                const double per_token = m.epo_runtime_tp ? ((g - 1) + 2 * 2 * (g - 1) / g) * 4
                                                          : 3 * 2 * (g - 1) / g * 4;
                w.tp_loss_bytes += heads * Tc * per_token;
                w.tp_loss_collectives += 3 * heads;
            }
            break;
        }
        default:
            break;
    }
    return w;
}

// The forward work the backward of `call` recomputes first (cost_model.h "recompute").
ForwardWork recompute_work(const PlanModel& m, const NodeCall& call) {
    using config::RecomputeModule;
    ForwardWork r;
    if (call.layer < 0 || !m.recompute_granularity ||
        (call.node != NodeKind::kPreDispatch && call.node != NodeKind::kMlp))
        return r;
    // Full recompute: the schedule runs the forward nodes again as calls of their own
    // (Phase::kRecompute, costed as forwards), so a backward call adds nothing.
    if (*m.recompute_granularity == config::RecomputeGranularity::kFull)
        return r;
    const ForwardWork f = forward_work(m, call);
    const model::GptShape& s = m.shape;
    const double c = static_cast<double>(m.compute_bytes), H = static_cast<double>(s.hidden);
    const bool moe = s.moe_layers[static_cast<size_t>(call.layer)];
    if (call.node == NodeKind::kPreDispatch) {
        if (recomputes(m, RecomputeModule::kCoreAttn))
            r.act_gemms = f.act_gemms;
        if (recomputes(m, RecomputeModule::kLayernorm))
            r.elementwise_bytes += 2 * sharded_tokens(m) * H * (4 + c);
        if (recomputes(m, RecomputeModule::kMlaUpProj) && m.mla) {
            // attention_work's order: [q_down,] q_up (or q), kv_down, kv_up, proj
            const size_t q_up = m.q_lora_rank > 0 ? 1 : 0;
            if (m.q_lora_rank > 0)
                r.weight_gemms.push_back(f.weight_gemms[q_up]);
            r.weight_gemms.push_back(f.weight_gemms[q_up + 2]);
        }
        if (moe && s.moe.shared_expert_size > 0 && recomputes(m, RecomputeModule::kSharedExperts)) {
            r.weight_gemms.insert(r.weight_gemms.end(), f.weight_gemms.end() - 2,
                                  f.weight_gemms.end());
        }
        return r;
    }
    if (moe ? recomputes(m, RecomputeModule::kMoe) : recomputes(m, RecomputeModule::kMlp))
        return f;
    if (moe && recomputes(m, RecomputeModule::kMoeAct)) {
        // The activation over the rows' f1 outputs: a third of the MLP's activation bytes.
        const double F = static_cast<double>(s.moe.ffn_hidden_size);
        const double R = sharded_tokens(m) * static_cast<double>(s.moe.topk);
        r.elementwise_bytes += R * 3 * F * c / chunk_share(m, call);
    }
    return r;
}

// The share of a compute call's launches its CUDA graphs cover (cost_model.h "graphs").
double graphed_share(const PlanModel& m, const NodeCall& call) {
    const bool moe = call.layer >= 0 && m.shape.moe_layers[static_cast<size_t>(call.layer)];
    if (call.node == NodeKind::kPreDispatch) {
        if (!moe)
            return m.graph_attn ? 1.0 : 0.0;
        return (m.graph_attn ? 0.6 : 0.0) + (m.graph_router ? 0.2 : 0.0) +
               (m.graph_preprocess ? 0.2 : 0.0);
    }
    if (call.node == NodeKind::kMlp)
        return (moe ? m.graph_moe : m.graph_mlp) ? 1.0 : 0.0;
    return 0;
}

}  // namespace epo::plan
