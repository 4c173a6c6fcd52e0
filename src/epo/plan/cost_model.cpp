#include "epo/plan/cost_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "epo/config/finalize.h"
#include "epo/plan/gpu_memory.h"
#include "epo/plan/layer_work.h"

namespace epo::plan {
namespace {

using schedule::NodeCall;
using schedule::NodeKind;
using schedule::Phase;

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

// TP and CP collectives of a call's forward or backward (`backward`: the CP bytes twice, the key
// and value gradients going back), on their links. TP with SP: each collective moves (TP-1)/TP of
// a (Tc, H) tensor per rank, the forward's gathers in the compute dtype, its reductions and every
// backward collective in tp_reduce_bytes; the loss's collectives with the forward.
void add_serial_comm(const PlanModel& m, const ForwardWork& f, bool backward, NodeWork& w) {
    if (m.tp_size > 1 && f.tp_collectives > 0) {
        const double per = (m.tp_size - 1.0) / m.tp_size * static_cast<double>(m.shape.tokens()) /
                           m.cp_size * static_cast<double>(m.shape.hidden);
        const double c = static_cast<double>(m.compute_bytes);
        const double bytes =
            backward
                ? per * f.tp_collectives * m.tp_reduce_bytes
                : per * (f.tp_gathers * c + (f.tp_collectives - f.tp_gathers) * m.tp_reduce_bytes) +
                      f.tp_loss_bytes;
        w.serial_bytes += group_bytes(bytes, m.tp_crosses_nodes);
        w.tp_bytes += bytes;
        w.num_serial_collectives += static_cast<int>(
            m.sequence_parallel ? f.tp_collectives : std::ceil(f.tp_collectives / 2));
        if (!backward)
            w.num_serial_collectives += static_cast<int>(f.tp_loss_collectives);
    }
    const double cp_times = backward ? 2 : 1;
    if (m.cp_size > 1 && f.cp_bytes > 0) {
        w.serial_bytes += group_bytes(cp_times * f.cp_bytes, m.cp_crosses_nodes);
        w.num_serial_collectives += static_cast<int>(cp_times) * (m.cp_size - 1);
    }
}

// Forward: the products once. Backward: input and weight gradients (twice the weight products,
// twice the core attention's, twice the bytes). Delayed: backward keeps the input gradients
// (weight products once, core attention twice), backward_dw the weight gradients. The TP and CP
// collectives run with the forward and the backward (input gradients), none with backward_dw.
NodeWork scale_for_phase(const ForwardWork& f, const PlanModel& m, const NodeCall& call) {
    NodeWork w;
    const double c = static_cast<double>(m.compute_bytes);
    const auto add = [&](const std::vector<Gemm>& gemms, double times, GemmPass pass) {
        for (Gemm g : gemms) {
            g.count *= times;
            g.pass = pass;
            w.gemms.push_back(g);
        }
    };
    // fp8: the weight products at the fp8 rate, each one's input cast first (read c, write 1
    // byte an element): the activation (m, k) forward, the output gradient (m, n) for dgrad.
    const auto add_weights = [&](const std::vector<Gemm>& gemms, double times, GemmPass pass) {
        for (Gemm g : gemms) {
            g.count *= times;
            g.pass = pass;
            g.fp8 = m.fp8 && !g.keeps_bf16;
            if (g.fp8 && pass != GemmPass::kWgrad)
                w.elementwise_bytes +=
                    (pass == GemmPass::kForward ? g.m * g.k : g.m * g.n) * (c + 1) * g.count;
            w.gemms.push_back(g);
        }
    };
    // A full recompute's call (Phase::kRecompute) is its forward node again.
    if (call.phase == Phase::kForward || call.phase == Phase::kRecompute) {
        add_weights(f.weight_gemms, 1, GemmPass::kForward);
        add(f.act_gemms, 1, GemmPass::kForward);
        w.elementwise_bytes += f.elementwise_bytes;
        add_serial_comm(m, f, false, w);
        return w;
    }
    if (call.phase == Phase::kBackward) {
        // Selective recomputation first: forward products and bytes again (a full recompute's are
        // the schedule's recompute calls).
        const ForwardWork r = recompute_work(m, call);
        add_weights(r.weight_gemms, 1, GemmPass::kForward);
        add(r.act_gemms, 1, GemmPass::kForward);
        w.elementwise_bytes += r.elementwise_bytes;
        add_serial_comm(m, r, false, w);
        add_weights(f.weight_gemms, 1, GemmPass::kDgrad);
        add(f.act_gemms, 2, GemmPass::kDgrad);
        w.elementwise_bytes += 2 * f.elementwise_bytes;
        add_serial_comm(m, f, true, w);
    }
    if (call.phase == Phase::kBackwardDw || !call.wgrad_delayed)
        add_weights(f.weight_gemms, 1, GemmPass::kWgrad);
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
        p.gemm_half_dim = p.wgrad_half_dim = 32;
        p.memory_efficiency = p.elementwise_efficiency = 1.0;
        p.link_efficiency = 1.0;
        p.overlap_slowdown = 0;
        p.node_overhead_us = 20;
        p.source = "cpu placeholders (no calibration file)";
        return p;
    }
    // GPU families: see docs/plan.md "Calibration" for where each comes from.
    p.gemm_efficiency = p.dgrad_efficiency = p.wgrad_efficiency = 0.70;
    p.gemm_half_dim = p.wgrad_half_dim = 96;
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
    // A communication call's host work: ~6 launches (the count exchange, the all-to-all, the
    // permutation around it, the event record and wait) at the same ~7 us.
    p.comm_launch_us = 42;
    // A CUDA graph replays its kernels from one launch (~10 us of host time).
    p.graph_launch_us = 10;
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

namespace {
// The gradient elements of this stage the TP group sums (an all-reduce in fp32 before the
// data-parallel reduction). Megatron-Core's _allreduce_non_tensor_model_parallel_grads: with
// sequence parallelism every parameter marked sequence_parallel (the norms, weight and bias for
// LayerNorm; the router), and the q/k layernorms always. The epo
// runtime (GptModel::tp_summed_params): its norms have a weight only, and the shared expert,
// which it does not split, is summed whole.
double plan_tp_summed_elements(const config::ModelConfig& mc, const PlanModel& m) {
    if (m.tp_size <= 1)
        return 0;
    const model::GptShape& s = m.shape;
    const double H = static_cast<double>(s.hidden);
    const double norm = m.epo_runtime_tp || mc.normalization == config::Normalization::kRMSNorm
                            ? 1.0
                            : 2.0;  // LayerNorm's bias
    const bool sp = m.sequence_parallel;
    const auto layer = [&](int64_t l) {
        double n = sp ? 2 * norm * H : 0;  // input and pre-MLP norms
        if (s.attn.qk_layernorm && !m.mla)
            n += 2 * norm * static_cast<double>(s.attn.head_dim);
        if (sp && s.moe_layers[static_cast<size_t>(l)]) {
            n += static_cast<double>(s.moe.num_experts) * H;  // the router
            const double Fs = static_cast<double>(s.moe.shared_expert_size);
            if (m.epo_runtime_tp)
                n += 3 * Fs * H;  // fc1 (2 Fs, H), fc2 (H, Fs)
        }
        return n;
    };
    double total = 0;
    for (int64_t l = 0; l < s.num_layers; ++l) {
        if (s.holds(l))
            total += layer(l);
    }
    if (s.holds(s.num_layers)) {
        total += sp ? norm * H : 0;  // the final norm
        // Each MTP depth: its enorm, hnorm and final norm, and a layer like the last.
        for (int i = 0; i < m.mtp_num_layers; ++i)
            total += (sp ? 3 * norm * H : 0) + layer(s.num_layers - 1);
    }
    return total;
}
}  // namespace

PlanModel make_plan_model(const config::Config& cfg, const train::StepPlan& plan,
                          const DeviceSpec& device, bool flex, const ExpertLoadImbalance& load,
                          int pipeline_rank) {
    PlanModel m;
    const config::ModelConfig& mc = cfg.model;
    m.ep_size = std::max(1, mc.expert_model_parallel_size);
    m.shape = model::gpt_shape_from_config(cfg, m.ep_size, 0, pipeline_rank);
    m.compute_bytes = compute_dtype_bytes(mc);
    m.grad_bytes = main_grad_bytes(cfg);
    m.num_nodes = config::num_nodes(cfg.comm);
    const int per_node = config::gpus_per_node(cfg.comm);
    m.ep_ranks_per_node = std::max(1, std::min(m.ep_size, per_node));
    m.flex = flex;
    m.attention_fraction = device.attention_fraction;
    m.fused_attention = device.fused_attention;
    m.dp_size = plan.dp_size;
    m.edp_size = plan.edp_size;
    m.dp_crosses_nodes = m.edp_crosses_nodes = m.num_nodes > 1;
    m.tp_size = mc.tensor_model_parallel_size;
    m.cp_size = mc.context_parallel_size;
    m.etp_size = config::expert_tensor_parallel_size(mc);
    m.sequence_parallel = mc.sequence_parallel;
    m.tp_comm_overlap = mc.tp_comm_overlap;
    if (device.id == "cpu") {
        m.tp_reduce_bytes = 4;
        m.epo_runtime_tp = true;
    } else {
        m.tp_reduce_bytes = static_cast<double>(m.compute_bytes);
    }
    // Megatron-Core's rank order (tp, cp, ep/dp, pp from fastest): a group crosses nodes when
    // its stride times its size exceeds the node.
    m.tp_crosses_nodes = m.tp_size > per_node;
    m.cp_crosses_nodes = int64_t{m.tp_size} * m.cp_size > per_node;
    const int64_t world = config::world_size(cfg);
    m.pp_crosses_nodes =
        mc.pipeline_model_parallel_size > 1 && world / mc.pipeline_model_parallel_size >= per_node;
    m.mla = mc.multi_latent_attention;
    m.q_lora_rank = mc.q_lora_rank.value_or(0);
    m.kv_lora_rank = mc.kv_lora_rank;
    m.qk_head_dim = mc.qk_head_dim;
    m.qk_pos_emb_head_dim = mc.qk_pos_emb_head_dim;
    m.v_head_dim = mc.v_head_dim;
    m.mtp_num_layers = mc.mtp_num_layers.value_or(0);
    m.fp8 = mc.fp8.has_value();
    if (mc.cuda_graph_impl != config::CudaGraphImpl::kNone) {
        // No module named: the reference graphs the whole layer.
        const bool all = config::graphed_module_names(mc).empty();
        m.graph_attn = all || config::is_graphed(mc, "attn");
        m.graph_router = all || config::is_graphed(mc, "moe_router");
        m.graph_preprocess = all || config::is_graphed(mc, "moe_preprocess");
        m.graph_mlp = all || config::is_graphed(mc, "mlp");
        m.graph_moe = all || config::is_graphed(mc, "moe");
    }
    m.recompute_granularity = mc.recompute_granularity;
    m.recompute_modules = mc.recompute_modules.value_or(
        std::vector<config::RecomputeModule>{config::RecomputeModule::kCoreAttn});
    m.recompute_block = mc.recompute_method == config::RecomputeMethod::kBlock;
    m.recompute_num_layers = mc.recompute_num_layers.value_or(1);
    m.layers_per_chunk = std::max(
        1, mc.num_layers / (mc.pipeline_model_parallel_size * config::virtual_pipeline_size(mc)));
    m.distributed_optimizer = plan.distributed_optimizer;
    m.tp_summed_elements = plan_tp_summed_elements(mc, m);
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
            // Dense weights split over TP, the experts' over ETP (norms and the router are
            // replicated: counted split, a rounding of their few bytes).
            for (int64_t n : sizes.dense)
                dense += plan.dp_size > 1 ? m.grad_bytes * n / m.tp_size : 0;
            for (int64_t n : sizes.expert)
                expert += plan.edp_size > 1 ? m.grad_bytes * n / m.etp_size : 0;
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
            // Flex with fp8 sends the forward dispatch's rows in fp8, one fp32 scale per 128.
            const bool fp8_rows =
                m.fp8 && m.flex && dispatch &&
                (call.phase == Phase::kForward || call.phase == Phase::kRecompute);
            const double row = fp8_rows ? H + H / 128 * 4 : H * c;
            w.bytes = scaled(routed_bytes(m, row + (dispatch ? 4 : 0)),
                             imbalance_at(m, call.layer) / chunk_share(m, call));
            w.num_collectives = (dispatch ? 2 : 1) + (m.etp_size > 1 ? 1 : 0);
            return w;
        }
        case NodeKind::kSendForward:
        case NodeKind::kRecvForward:
        case NodeKind::kSendBackward:
        case NodeKind::kRecvBackward: {
            // A pipeline hand-off: the (Ts, H) activation or its gradient, between neighbouring
            // stages (Megatron-Core's order puts them world / PP ranks apart).
            NodeWork w;
            w.bytes = group_bytes(sharded_tokens(m) * H * c, m.pp_crosses_nodes);
            w.num_collectives = 1;
            return w;
        }
        case NodeKind::kGradReduce:
        case NodeKind::kParamGather: {
            NodeWork w;
            const auto b = static_cast<size_t>(call.layer);
            const bool gather = call.node == NodeKind::kParamGather;
            // The buckets' gradient bytes (fp32, or the compute dtype with grad_reduce_in_fp32
            // false); a gather moves the parameters in the compute dtype.
            const double scale = gather ? c / static_cast<double>(m.grad_bytes)
                                        : (m.distributed_optimizer ? 1.0 : 2.0);
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
        default: {
            NodeWork w = scale_for_phase(forward_work(m, call), m, call);
            w.graphed_share = graphed_share(m, call);
            return w;
        }
    }
}

double launch_seconds(const NodeWork& w, const CostParams& p) {
    return (p.node_overhead_us * (1 - w.graphed_share) +
            (w.graphed_share > 0 ? p.graph_launch_us : 0)) *
           1e-6;
}

double compute_seconds(const NodeWork& w, const DeviceSpec& device, const CostParams& p) {
    double t = 0;
    for (const Gemm& g : w.gemms) {
        const double peak = (g.fp8 && device.peak_fp8_tflops > 0 ? device.peak_fp8_tflops
                                                                 : device.peak_bf16_tflops) *
                            1e12;
        const double x = std::min({g.m, g.n, g.k});
        const double e = g.pass == GemmPass::kForward ? p.gemm_efficiency
                         : g.pass == GemmPass::kDgrad ? p.dgrad_efficiency
                                                      : p.wgrad_efficiency;
        const double half = g.pass == GemmPass::kWgrad ? p.wgrad_half_dim : p.gemm_half_dim;
        const double eff = e * x / (x + half);
        t += 2 * g.m * g.n * g.k * g.count / (peak * eff);
    }
    t += w.elementwise_bytes / (device.memory_tbps * 1e12 * p.elementwise_efficiency);
    t += w.stream_bytes / (device.memory_tbps * 1e12 * p.memory_efficiency);
    return t + launch_seconds(w, p);
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

double serial_comm_seconds(const NodeWork& w, const NetworkSpec& network, const CostParams& p) {
    if (w.num_serial_collectives == 0)
        return 0;
    NodeWork c;
    c.bytes = w.serial_bytes;
    c.num_collectives = w.num_serial_collectives;
    return comm_seconds(c, network, p);
}

double call_seconds(const PlanModel& m, const NodeCall& call, const Hardware& hw,
                    const CostParams& p) {
    const NodeWork w = node_work(m, call);
    if (schedule::stream_of(call.node) == schedule::StreamId::kComm)
        return comm_seconds(w, hw.network, p);
    // The compute stream waits for its TP / CP collectives; with tp_comm_overlap they run under
    // the call's own products, so only what outlasts them counts.
    const double compute = compute_seconds(w, hw.device, p);
    const double serial = serial_comm_seconds(w, hw.network, p);
    if (!m.tp_comm_overlap)
        return compute + serial;
    NodeWork gemms_only;
    gemms_only.gemms = w.gemms;
    const double gemm_s = compute_seconds(gemms_only, hw.device, p) - launch_seconds(gemms_only, p);
    return compute + std::max(0.0, serial - gemm_s);
}

OptimizerWork optimizer_work(const PlanModel& m, const train::StepPlan& plan) {
    const int64_t L = m.shape.num_layers;
    double dense = 0, expert = 0;  // elements on this rank
    for (int position = -1; position <= L; ++position) {
        if (!m.shape.holds(position))
            continue;  // another pipeline stage's
        const train::PositionParamSizes sizes = train::param_sizes_at(m.shape, position);
        for (int64_t n : sizes.dense)
            dense += static_cast<double>(n) / m.tp_size;
        for (int64_t n : sizes.expert)
            expert += static_cast<double>(n) / m.etp_size;
    }
    OptimizerWork o;
    const double shard =
        plan.distributed_optimizer ? dense / m.dp_size + expert / m.edp_size : dense + expert;
    // Adam per element of the shard: gradient read, master and m, v read and written (3 x 8), the
    // compute copy written; every gradient zeroed for the next step.
    const double g_bytes = static_cast<double>(m.grad_bytes);
    o.elementwise_bytes =
        shard * (g_bytes + 24 + static_cast<double>(m.compute_bytes)) + (dense + expert) * g_bytes;
    NodeWork& w = o.collectives;
    w.num_collectives = 2;  // the loss and the grad norm
    const auto reduce = [&](double elements, int group, bool crosses) {
        if (group <= 1)
            return;
        const double g = (group - 1.0) / group;
        if (!plan.reduce_in_buckets) {
            w.bytes +=
                group_bytes(elements * g_bytes * g * (plan.distributed_optimizer ? 1 : 2), crosses);
            ++w.num_collectives;
        }
        if (plan.distributed_optimizer && !plan.param_gather_overlap) {
            w.bytes += group_bytes(elements * static_cast<double>(m.compute_bytes) * g, crosses);
            ++w.num_collectives;
        }
    };
    reduce(dense, m.dp_size, m.dp_crosses_nodes);
    reduce(expert, m.edp_size, m.edp_crosses_nodes);
    if (m.shape.has_embedding_copies() && (m.shape.holds(-1) || m.shape.holds_embedding_copy())) {
        // The word embedding's two copies (the first stage's, the last stage's for MTP or tied
        // output weights): their gradients summed over the embedding group (Megatron-Core's
        // _allreduce_word_embedding_grads, after the data-parallel reduction, the whole main
        // gradient; the epo runtime's embedding group likewise), 2 ranks: V H / TP elements.
        o.embedding_bytes = static_cast<double>(m.shape.vocab) *
                            static_cast<double>(m.shape.hidden) / m.tp_size * g_bytes;
        w.bytes += group_bytes(o.embedding_bytes, m.pp_crosses_nodes);
        ++w.num_collectives;
    }
    if (m.tp_summed_elements > 0) {
        // The TP group's sums of replicated gradients, one coalesced all-reduce of main grads.
        o.tp_bytes = m.tp_summed_elements * g_bytes * 2 * (m.tp_size - 1.0) / m.tp_size;
        w.bytes += group_bytes(o.tp_bytes, m.tp_crosses_nodes);
        ++w.num_collectives;
    }
    return o;
}

}  // namespace epo::plan
