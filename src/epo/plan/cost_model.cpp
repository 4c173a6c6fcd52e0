#include "epo/plan/cost_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "epo/config/finalize.h"

namespace epo::plan {
namespace {

using schedule::NodeCall;
using schedule::NodeKind;
using schedule::Phase;

// A micro-batch's rows that leave this rank, split by where they go: `rows` copies spread
// evenly over the EP group (uniform routing), (ep_per_node - 1) / EP of them to this node's other
// ranks, (EP - ep_per_node) / EP to other nodes. Flex sends a token to each other node once
// (flex_remote_copies) and fans it out inside the destination node.
comm::ByteCounts routed_bytes(const PlanModel& m, double row_bytes) {
    const double T = static_cast<double>(m.shape.tokens());
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
    comm::ByteCounts b;
    b.intra_sent = b.intra_recv = static_cast<int64_t>(intra_rows * row_bytes);
    b.inter_sent = b.inter_recv = static_cast<int64_t>(inter_rows * row_bytes);
    return b;
}

comm::ByteCounts scaled(const comm::ByteCounts& b, double f) {
    const auto part = [f](int64_t n) { return static_cast<int64_t>(static_cast<double>(n) * f); };
    comm::ByteCounts out;
    out.intra_sent = part(b.intra_sent);
    out.intra_recv = part(b.intra_recv);
    out.inter_sent = part(b.inter_sent);
    out.inter_recv = part(b.inter_recv);
    return out;
}

// A collective over a group of `size` ranks moving `bytes` per rank (already scaled by
// (G-1)/G): on the inter-node link when the group spans nodes.
comm::ByteCounts group_bytes(double bytes, bool crosses_nodes) {
    comm::ByteCounts b;
    const auto n = static_cast<int64_t>(bytes);
    if (crosses_nodes)
        b.inter_sent = b.inter_recv = n;
    else
        b.intra_sent = b.intra_recv = n;
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

// The forward work of a compute node (its products and element-wise bytes); the backward is
// derived from it (scale_for_phase).
struct ForwardWork {
    std::vector<Gemm> weight_gemms;  // with a weight: counted again for the weight gradient
    std::vector<Gemm> act_gemms;     // activation x activation (core attention)
    double elementwise_bytes = 0;
};

ForwardWork forward_work(const PlanModel& m, const NodeCall& call) {
    const model::GptShape& s = m.shape;
    const double c = static_cast<double>(m.compute_bytes);
    const double T = static_cast<double>(s.tokens()), H = static_cast<double>(s.hidden);
    const double B = static_cast<double>(s.micro_batch_size), S = static_cast<double>(s.seq_length);
    const double A = static_cast<double>(s.attn.num_heads),
                 G = static_cast<double>(s.attn.num_groups);
    const double d = static_cast<double>(s.attn.head_dim);
    const bool moe = call.layer >= 0 && s.moe_layers[static_cast<size_t>(call.layer)];
    const double E = static_cast<double>(s.moe.num_experts), k = static_cast<double>(s.moe.topk);
    // Routed rows the busiest EP rank's experts receive (T k under balanced routing).
    const double R = T * k * imbalance_at(m, call.layer);
    ForwardWork w;
    switch (call.node) {
        case NodeKind::kEmbedding:
            w.elementwise_bytes = T * H * (c + 4);  // gather rows, write the f32 hand-off
            break;
        case NodeKind::kPreDispatch: {
            const double W = (A + 2 * G) * d;
            w.weight_gemms = {{T, W, H}, {T, H, A * d}};
            // Scores (S, S, d) and context (S, d, S) per sequence and head, the share computed.
            w.act_gemms = {{S, S, d, B * A * m.attention_fraction},
                           {S, d, S, B * A * m.attention_fraction}};
            w.elementwise_bytes =
                4 * T * H * (4 + c)    // two norms, residual add
                + 2 * T * W * (4 + c)  // q/k/v: norm, rope, split
                // softmax over the scores, unless fused (flash attention)
                + (m.fused_attention ? 0.0 : B * A * S * S * (8 + c) * m.attention_fraction);
            if (moe) {
                w.weight_gemms.push_back({T, E, H});
                // Permuting this rank's own T k rows (balanced on the sending side), top-k.
                w.elementwise_bytes += 2 * T * k * H * c + T * E * 12;
                // The shared expert runs here, beside the router (moe_block.cpp).
                if (s.moe.shared_expert_size > 0) {
                    const double Fs = static_cast<double>(s.moe.shared_expert_size);
                    w.weight_gemms.push_back({T, 2 * Fs, H});
                    w.weight_gemms.push_back({T, H, Fs});
                    w.elementwise_bytes += T * 3 * Fs * c;
                }
            }
            break;
        }
        case NodeKind::kMlp: {
            if (moe) {
                // The routed experts; a chunk's call (moe_block.h) runs a group of the local
                // experts with their whole rows, or every expert on a share of the rows.
                const double F = static_cast<double>(s.moe.ffn_hidden_size);
                const double local = static_cast<double>(s.num_local_experts());
                const double part = 1 / chunk_share(m, call);
                const bool by_experts = s.moe.chunk_by == moe::ChunkBy::kExperts;
                const double experts = by_experts ? local * part : local;
                const double rows = by_experts ? R / local : R / local * part;
                w.weight_gemms = {{rows, 2 * F, H, experts}, {rows, H, F, experts}};
                w.elementwise_bytes = (R * 3 * F * c + 4 * R * H * c) * part;  // activation, sorts
            } else {
                const double F = static_cast<double>(s.ffn_hidden);
                w.weight_gemms = {{T, 2 * F, H}, {T, H, F}};
                w.elementwise_bytes = T * 3 * F * c;
            }
            break;
        }
        case NodeKind::kOutput: {
            const double V = static_cast<double>(s.vocab);
            w.weight_gemms = {{T, V, H}};
            w.elementwise_bytes = T * H * (4 + c) + T * V * (8 + c);  // final norm, softmax + CE
            break;
        }
        default:
            break;
    }
    return w;
}

// Forward: the products once. Backward: input and weight gradients (twice the weight products,
// twice the core attention's, twice the bytes). Delayed: backward keeps the input gradients
// (weight products once, core attention twice), backward_dw the weight gradients.
NodeWork scale_for_phase(const ForwardWork& f, const NodeCall& call) {
    NodeWork w;
    const auto add = [&](const std::vector<Gemm>& gemms, double times, GemmPass pass) {
        for (Gemm g : gemms) {
            g.count *= times;
            g.pass = pass;
            w.gemms.push_back(g);
        }
    };
    if (call.phase == Phase::kForward) {
        add(f.weight_gemms, 1, GemmPass::kForward);
        add(f.act_gemms, 1, GemmPass::kForward);
        w.elementwise_bytes = f.elementwise_bytes;
        return w;
    }
    if (call.phase == Phase::kBackward) {
        add(f.weight_gemms, 1, GemmPass::kDgrad);
        add(f.act_gemms, 2, GemmPass::kDgrad);
        w.elementwise_bytes = 2 * f.elementwise_bytes;
    }
    if (call.phase == Phase::kBackwardDw || !call.wgrad_delayed)
        add(f.weight_gemms, 1, GemmPass::kWgrad);
    return w;
}

}  // namespace

CostParams default_params(const DeviceSpec& device) {
    CostParams p;
    if (device.id == "cpu") {
        // Until `epo plan --calibrate kernels` measures them: oneDNN bf16 products on this
        // machine's kind reach ~0.7 TFLOP/s per thread (the device's placeholder peak), and the
        // link model's waiting thread sleeps, so compute does not slow beside it.
        p.gemm_efficiency = p.dgrad_efficiency = p.wgrad_efficiency = 1.0;
        p.gemm_half_dim = 32;
        p.memory_efficiency = p.elementwise_efficiency = 1.0;
        p.link_efficiency = 1.0;
        p.overlap_slowdown = 0;
        p.node_overhead_us = 20;
        p.source = "cpu placeholders (no calibration file)";
        return p;
    }
    // GPU families: see docs/plan.md "Calibration" for where each comes from.
    p.gemm_efficiency = p.dgrad_efficiency = p.wgrad_efficiency = 0.70;
    p.gemm_half_dim = 96;
    p.memory_efficiency = p.elementwise_efficiency = 0.70;
    p.link_efficiency = 0.80;
    // The SMs the communication kernels hold: NCCL's all-to-all up to 32 channels of one block,
    // DeepEP's kernels 24 SMs by default; compute keeps the rest (and so, in turn, does the
    // communication, which shares SMs and memory with the compute kernels).
    const double sms = device.num_sms > 0 ? device.num_sms : 132;
    p.overlap_slowdown = 32 / (sms - 32);
    p.flex_overlap_slowdown = 24 / (sms - 24);
    // Kernel launches the host cannot run ahead of (the alltoall dispatcher waits for its token
    // counts on the host every layer): ~20 kernels per node at ~7 us each in eager PyTorch.
    p.node_overhead_us = 150;
    p.source = fmt::format("defaults for {} (docs/plan.md)", device.id);
    return p;
}

double flex_remote_copies(int64_t num_experts, int64_t top_k, int num_nodes) {
    if (num_nodes <= 1)
        return 0;
    // C(E - E/N, k) / C(E, k) = prod_{i<k} (E - E/N - i) / (E - i): no expert of the k on a node.
    const double E = static_cast<double>(num_experts);
    const double off = E - E / num_nodes;
    double none_on_node = 1;
    for (int64_t i = 0; i < top_k; ++i)
        none_on_node *= std::max(0.0, off - static_cast<double>(i)) / (E - static_cast<double>(i));
    return (num_nodes - 1) * (1 - none_on_node);
}

PlanModel make_plan_model(const config::Config& cfg, const train::StepPlan& plan,
                          const DeviceSpec& device, bool flex, const ExpertLoadImbalance& load) {
    PlanModel m;
    const config::ModelConfig& mc = cfg.model;
    m.ep_size = std::max(1, mc.expert_model_parallel_size);
    m.shape = model::gpt_shape_from_config(cfg, m.ep_size, 0);
    m.compute_bytes = mc.bf16 ? 2 : 4;
    m.num_nodes = config::num_nodes(cfg.comm);
    const int per_node = config::gpus_per_node(cfg.comm);
    m.ep_ranks_per_node = std::max(1, std::min(m.ep_size, per_node));
    m.flex = flex;
    m.attention_fraction = device.attention_fraction;
    m.fused_attention = device.fused_attention;
    m.dp_size = plan.dp_size;
    m.edp_size = plan.edp_size;
    m.dp_crosses_nodes = m.edp_crosses_nodes = m.num_nodes > 1;
    m.distributed_optimizer = plan.distributed_optimizer;
    m.load_imbalance.assign(static_cast<size_t>(m.shape.num_layers), 1.0);
    int moe_index = 0;
    for (size_t l = 0; l < m.load_imbalance.size(); ++l) {
        if (m.shape.moe_layers[l])
            m.load_imbalance[l] = load.of(moe_index++);
    }
    for (const train::PlanBucket& bucket : plan.buckets) {
        int64_t dense = 0, expert = 0;
        for (int position : bucket.positions) {
            const train::PositionParamSizes sizes = train::param_sizes_at(m.shape, position);
            for (int64_t n : sizes.dense)
                dense += plan.dp_size > 1 ? 4 * n : 0;
            for (int64_t n : sizes.expert)
                expert += plan.edp_size > 1 ? 4 * n : 0;
        }
        m.bucket_dense_bytes.push_back(dense);
        m.bucket_expert_bytes.push_back(expert);
    }
    return m;
}

NodeWork node_work(const PlanModel& m, const NodeCall& call) {
    const double c = static_cast<double>(m.compute_bytes);
    const double H = static_cast<double>(m.shape.hidden);
    switch (call.node) {
        case NodeKind::kDispatch:
        case NodeKind::kCombine: {
            NodeWork w;
            // Dispatch moves a row and its probability (and exchanges the counts first); combine
            // moves the rows back. Their backward moves the same bytes the other way.
            // A chunk's call moves its share of the rows; the busiest rank moves f times the
            // mean.
            const bool dispatch = call.node == NodeKind::kDispatch;
            w.bytes = scaled(routed_bytes(m, H * c + (dispatch ? 4 : 0)),
                             imbalance_at(m, call.layer) / chunk_share(m, call));
            w.num_collectives = dispatch ? 2 : 1;
            return w;
        }
        case NodeKind::kGradReduce:
        case NodeKind::kParamGather: {
            NodeWork w;
            const auto b = static_cast<size_t>(call.layer);
            const bool gather = call.node == NodeKind::kParamGather;
            // fp32 gradients; a gather moves the parameters in the compute dtype.
            const double scale = gather ? c / 4 : (m.distributed_optimizer ? 1.0 : 2.0);
            const auto part = [&](int64_t bytes, int group, bool crosses) {
                if (group <= 1 || bytes == 0)
                    return;
                w.bytes +=
                    group_bytes(scale * static_cast<double>(bytes) * (group - 1) / group, crosses);
                ++w.num_collectives;
            };
            part(m.bucket_dense_bytes.at(b), m.dp_size, m.dp_crosses_nodes);
            part(m.bucket_expert_bytes.at(b), m.edp_size, m.edp_crosses_nodes);
            return w;
        }
        default:
            return scale_for_phase(forward_work(m, call), call);
    }
}

double compute_seconds(const NodeWork& w, const DeviceSpec& device, const CostParams& p) {
    const double peak = device.peak_bf16_tflops * 1e12;
    double t = 0;
    for (const Gemm& g : w.gemms) {
        const double x = std::min({g.m, g.n, g.k});
        const double e = g.pass == GemmPass::kForward ? p.gemm_efficiency
                         : g.pass == GemmPass::kDgrad ? p.dgrad_efficiency
                                                      : p.wgrad_efficiency;
        const double eff = e * x / (x + p.gemm_half_dim);
        t += 2 * g.m * g.n * g.k * g.count / (peak * eff);
    }
    t += w.elementwise_bytes / (device.memory_tbps * 1e12 * p.elementwise_efficiency);
    t += w.stream_bytes / (device.memory_tbps * 1e12 * p.memory_efficiency);
    return t + p.node_overhead_us * 1e-6;
}

double comm_seconds(const NodeWork& w, const NetworkSpec& network, const CostParams& p) {
    if (w.num_collectives == 0)
        return 0;
    const comm::LinkModel link{network.inter_node_gbps * p.link_efficiency,
                               network.intra_node_gbps * p.link_efficiency, network.latency_us};
    // modelled_seconds adds the latency once; the other collectives of the call add theirs.
    return comm::modelled_seconds(link, w.bytes) +
           (w.num_collectives - 1) * network.latency_us * 1e-6;
}

double call_seconds(const PlanModel& m, const NodeCall& call, const Hardware& hw,
                    const CostParams& p) {
    const NodeWork w = node_work(m, call);
    return schedule::stream_of(call.node) == schedule::StreamId::kComm
               ? comm_seconds(w, hw.network, p)
               : compute_seconds(w, hw.device, p);
}

OptimizerWork optimizer_work(const PlanModel& m, const train::StepPlan& plan) {
    const int64_t L = m.shape.num_layers;
    double dense = 0, expert = 0;  // elements on this rank
    for (int position = -1; position <= L; ++position) {
        const train::PositionParamSizes sizes = train::param_sizes_at(m.shape, position);
        for (int64_t n : sizes.dense)
            dense += static_cast<double>(n);
        for (int64_t n : sizes.expert)
            expert += static_cast<double>(n);
    }
    OptimizerWork o;
    const double shard =
        plan.distributed_optimizer ? dense / m.dp_size + expert / m.edp_size : dense + expert;
    // Adam per element of the shard: gradient read, master and m, v read and written (4 + 3 x 8),
    // the compute copy written; every gradient zeroed for the next step.
    o.elementwise_bytes =
        shard * (28 + static_cast<double>(m.compute_bytes)) + (dense + expert) * 4;
    NodeWork& w = o.collectives;
    w.num_collectives = 2;  // the loss and the grad norm
    const auto reduce = [&](double elements, int group, bool crosses) {
        if (group <= 1)
            return;
        const double g = (group - 1.0) / group;
        if (!plan.reduce_in_buckets) {
            w.bytes +=
                group_bytes(elements * 4 * g * (plan.distributed_optimizer ? 1 : 2), crosses);
            ++w.num_collectives;
        }
        if (plan.distributed_optimizer && !plan.param_gather_overlap) {
            w.bytes += group_bytes(elements * static_cast<double>(m.compute_bytes) * g, crosses);
            ++w.num_collectives;
        }
    };
    reduce(dense, m.dp_size, m.dp_crosses_nodes);
    reduce(expert, m.edp_size, m.edp_crosses_nodes);
    return o;
}

}  // namespace epo::plan
