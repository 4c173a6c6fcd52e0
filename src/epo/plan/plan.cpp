#include "epo/plan/plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "epo/config/finalize.h"
#include "epo/config/memory_estimate.h"
#include "epo/config/pipeline_layout.h"
#include "epo/core/error.h"
#include "epo/plan/calibration.h"
#include "epo/plan/gpu_memory.h"
#include "epo/plan/plan_notes.h"
#include "epo/schedule/critical_path.h"
#include "epo/train/flops.h"
#include "epo/train/memory_plan.h"
#include "epo/train/step_plan.h"

namespace epo::plan {
namespace {

using schedule::NodeCall;
using schedule::NodeKind;
using schedule::StreamId;

// Three replays: the first without slowdown, each later one slowing every call by the other
// stream's busy share of its span in the previous one.
constexpr int kReplayPasses = 3;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

int stream_index(const NodeCall& c) {
    return schedule::stream_of(c.node) == StreamId::kCompute ? 0 : 1;
}

// The run's estimate (train/memory_plan.h: each stage's own layers and the units its call list
// keeps alive, the one `epo train` checks), its largest stage, less what fused attention never
// holds: the probabilities c B A S^2 of every layer of every unit in flight (a unit holds one
// model chunk: the stage's layers / V), and the (4 + c) S^2 score scratch of one sequence.
int64_t cpu_peak_memory(const config::Config& cfg, const DeviceSpec& device) {
    const int ep = std::max(1, cfg.model.expert_model_parallel_size);
    int64_t peak = 0;
    for (int stage = 0; stage < std::max(1, cfg.model.pipeline_model_parallel_size); ++stage) {
        const model::GptShape s = model::gpt_shape_from_config(cfg, ep, 0, stage);
        const config::MemoryEstimate m =
            train::estimate_stage_memory(cfg, train::make_step_plan(cfg, s), s);
        int64_t bytes = m.total();
        if (device.fused_attention) {
            int64_t layers = 0;
            for (int64_t l = 0; l < s.num_layers; ++l)
                layers += s.holds(l) ? 1 : 0;
            const int64_t c = cfg.model.bf16 ? 2 : 4;
            const int64_t S2 = s.seq_length * s.seq_length;
            const int64_t probs = m.micro_batches_in_flight * layers /
                                  std::max(1, s.virtual_pipeline_size) * c * s.micro_batch_size *
                                  s.attn.num_heads * S2;
            bytes = std::max<int64_t>(0, bytes - probs - (4 + c) * S2);
        }
        peak = std::max(peak, bytes);
    }
    return peak;
}

config::Config with_schedule(config::Config cfg, bool overlap, bool delay_wgrad) {
    cfg.model.overlap_moe_expert_parallel_comm = overlap;
    cfg.model.delay_wgrad_compute = delay_wgrad;
    return cfg;
}

// What the planner cannot plan at all: a model without experts (no EP communication to
// overlap), or no topology. Every layout Megatron runs (TP, SP, CP, ETP, PP, VPP) and every model
// family plans; what the cost model approximates is said in a note (plan_notes).
void check_plannable(const config::Config& cfg) {
    const config::ModelConfig& m = cfg.model;
    if (!config::is_moe(m)) {
        throw Error(ErrorKind::kConfig,
                    "epo plan: model.num_moe_experts is 0; the model has no experts, so there is "
                    "no EP communication to overlap: plan an MoE model");
    }
    if (config::world_size(cfg) <= 0) {
        throw Error(ErrorKind::kConfig,
                    "epo plan: no topology stated (comm.num_nodes x comm.gpus_per_node); give "
                    "--num_nodes and --gpus_per_node, e.g. --num_nodes 2 --gpus_per_node 8");
    }
}

// The expert load of each MoE layer as given, checked against the model: a measured list needs
// one figure per MoE layer, and no rank can receive more than all of a layer's rows (<= EP).
std::vector<double> checked_expert_load(const ExpertLoadImbalance& load,
                                        const model::GptShape& shape) {
    std::vector<double> per_layer;
    for (bool moe : shape.moe_layers) {
        if (moe)
            per_layer.push_back(load.per_moe_layer.empty() ? load.all : 0.0);
    }
    if (!load.per_moe_layer.empty()) {
        if (load.per_moe_layer.size() != per_layer.size()) {
            throw Error(ErrorKind::kConfig,
                        fmt::format("--expert_load_imbalance: {} lists {} MoE layer(s), the "
                                    "planned model has {}; give one number for every layer (e.g. "
                                    "its mean imbalance), or a run of this model",
                                    load.source, load.per_moe_layer.size(), per_layer.size()));
        }
        per_layer = load.per_moe_layer;
    }
    const double ep = std::max(1, shape.ep_size);
    for (double f : per_layer) {
        if (f > ep) {
            throw Error(ErrorKind::kConfig,
                        fmt::format("--expert_load_imbalance {:g}: above the EP size {:g} (one "
                                    "rank receiving every row is an imbalance of EP); give a "
                                    "value in 1..{:g}",
                                    f, ep, ep));
        }
    }
    return per_layer;
}

// The bytes a step's collectives move on the link `epo bench`'s calibration sets (inter-node,
// or intra-node on one node), and how many collectives carry them.
struct StepBytes {
    double bytes = 0;
    int64_t collectives = 0;
};
StepBytes calibrated_link_bytes(const PlanModel& pm, const train::StepPlan& sp) {
    StepBytes out;
    const bool inter = pm.num_nodes > 1;
    const auto add = [&](const NodeWork& w) {
        out.bytes += static_cast<double>(inter ? std::max(w.bytes.inter_sent, w.bytes.inter_recv)
                                               : std::max(w.bytes.intra_sent, w.bytes.intra_recv));
        out.collectives += w.num_collectives;
    };
    for (const NodeCall& c : sp.calls) {
        if (schedule::stream_of(c.node) == StreamId::kComm)
            add(node_work(pm, c));
    }
    add(optimizer_work(pm, sp).collectives);
    return out;
}

// Paired edges are an epo runtime schedule (docs/paired-edges.md), single-stage: a GPU stack
// has no such knob, so only a plan for this machine suggests it.
bool suggests_pairing(const PlanResult& r) {
    return r.hardware.device.id == "cpu" && r.num_stages == 1;
}

std::string verdict_reason(const PlanResult& r, const ScheduleEstimate& base,
                           const ScheduleEstimate& best) {
    const double share = base.step_time_s > 0 ? base.exposed_comm_s / base.step_time_s : 0;
    if (share < 0.1) {
        return fmt::format(
            "communication is {:.0f}% of the baseline step ({:.3g} s of {:.3g} s): "
            "little to hide",
            100 * share, base.exposed_comm_s, base.step_time_s);
    }
    if (r.num_micro_batches <= 2 && !r.pair_edges) {
        return fmt::format(
            "{} micro-batch{} per step: the unpaired first forward and last backward leave "
            "{:.3g} s of the baseline's {:.3g} s communication exposed (more micro-batches per "
            "rank hide more{})",
            r.num_micro_batches, r.num_micro_batches == 1 ? "" : "es", best.exposed_comm_s,
            base.exposed_comm_s,
            r.num_micro_batches >= 2 && suggests_pairing(r)
                ? ", and so does pairing the edges: note below"
                : "");
    }
    const double a2a_compute = base.compute_s - base.optimizer_s;
    if (base.alltoall_s > 1.5 * a2a_compute) {
        return fmt::format(
            "the all-to-alls ({:.3g} s) outlast the compute they pair with "
            "({:.3g} s): the compute stream waits for them anyway",
            base.alltoall_s, a2a_compute);
    }
    return fmt::format(
        "{} hides {:.3g} s of the baseline's {:.3g} s exposed communication "
        "behind the other micro-batch's compute",
        best.name, base.exposed_comm_s - best.exposed_comm_s, base.exposed_comm_s);
}

// epo bench's link calibration (bench/bench_run.h): B = bytes / (R C - n latency), from the
// baseline's compute C and the bytes of its collectives, on the inter-node link (intra-node on
// one node).
void set_network_to_ratio(const config::Config& base_cfg, const model::GptShape& shape,
                          double ratio, PlanResult& r) {
    const ScheduleEstimate probe =
        estimate_schedule(base_cfg, r.hardware, r.params, false, r.expert_load);
    const train::StepPlan sp = train::make_step_plan(base_cfg, shape);
    const StepBytes bytes = calibrated_link_bytes(
        make_plan_model(base_cfg, sp, r.hardware.device, false, r.expert_load), sp);
    const double time = ratio * probe.compute_s - static_cast<double>(bytes.collectives) *
                                                      r.hardware.network.latency_us * 1e-6;
    if (ratio <= 0 || time <= 0 || bytes.bytes <= 0) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("--comm_compute_ratio {:g}: no bandwidth gives that ratio "
                                "(compute {:.3g} s, {:.3g} bytes per step); give a ratio above "
                                "0, or the network with --inter_node_gbps",
                                ratio, probe.compute_s, bytes.bytes));
    }
    const double gbps = 8 * bytes.bytes / time / 1e9 / r.params.link_efficiency;
    (r.num_nodes > 1 ? r.hardware.network.inter_node_gbps : r.hardware.network.intra_node_gbps) =
        gbps;
    r.hardware.network.source = fmt::format(
        "set to comm/compute {:g} as epo bench --comm_compute_ratio does: {:.4g} Gbit/s {} for "
        "{:.4g} MB per step",
        ratio, gbps, r.num_nodes > 1 ? "between nodes" : "inside the node", bytes.bytes / 1e6);
}

// The verdict on the better overlap schedule, its reason, and a note when it does not fit.
void judge(PlanResult& r, const config::Config& cfg) {
    const ScheduleEstimate& base = r.runs.front();
    const ScheduleEstimate* best = &r.runs[1];
    for (const ScheduleEstimate& e : r.runs) {
        if (e.overlap && !e.flex && *e.speedup > *best->speedup)
            best = &e;
    }
    const double s = *best->speedup;
    r.verdict = s >= 1.05 ? "pays" : s >= 0.98 ? "marginal" : "does not pay";
    r.reason = fmt::format("{} {:.2f}x: {}", best->name, s, verdict_reason(r, base, *best));
    check_memory(r, cfg);
}

}  // namespace

Replay replay_schedule(const std::vector<NodeCall>& calls,
                       const std::function<double(const NodeCall&)>& base_s,
                       double overlap_slowdown) {
    std::vector<double> base(calls.size()), now(calls.size());
    for (size_t i = 0; i < calls.size(); ++i)
        base[i] = now[i] = base_s(calls[i]);
    // The replay passes each call by reference into `calls`: its index is its offset.
    const auto duration = [&](const NodeCall& c) {
        return now[static_cast<size_t>(&c - calls.data())];
    };
    std::vector<schedule::CallSpan> spans;
    for (int pass = 0; pass < kReplayPasses; ++pass) {
        spans = schedule::critical_path_spans(calls, duration);
        if (overlap_slowdown == 0 || pass + 1 == kReplayPasses)
            break;
        // Each stream's busy intervals, in order (one stream's calls do not overlap).
        std::vector<schedule::CallSpan> busy[2];
        for (size_t i = 0; i < calls.size(); ++i) {
            if (spans[i].end > spans[i].start)
                busy[stream_index(calls[i])].push_back(spans[i]);
        }
        for (size_t i = 0; i < calls.size(); ++i) {
            const std::vector<schedule::CallSpan>& other = busy[1 - stream_index(calls[i])];
            const schedule::CallSpan s = spans[i];
            // First interval of the other stream that ends after this call starts.
            auto it =
                std::upper_bound(other.begin(), other.end(), s.start,
                                 [](double t, const schedule::CallSpan& b) { return t < b.end; });
            double shared = 0;
            for (; it != other.end() && it->start < s.end; ++it)
                shared += std::min(s.end, it->end) - std::max(s.start, it->start);
            const double length = s.end - s.start;
            now[i] = base[i] * (1 + overlap_slowdown * (length > 0 ? shared / length : 0));
        }
    }
    Replay r;
    r.durations_s = now;
    for (size_t i = 0; i < calls.size(); ++i) {
        r.end_s = std::max(r.end_s, spans[i].end);
        (schedule::stream_of(calls[i].node) == StreamId::kCompute ? r.compute_s : r.comm_s) +=
            now[i];
    }
    return r;
}

namespace {

// The configuration whose even split plans stage `stage` of an uneven one: every model chunk
// `per_chunk` layers (the stage's own layers in order, the last repeated to pad or the tail cut),
// so the runtime's schedules (which cut PP x VPP equal blocks) give the stage its own chunks.
config::Config stage_config(const config::Config& cfg, const config::PipelineLayout& layout,
                            int stage, int per_chunk) {
    config::Config out = cfg;
    config::ModelConfig& m = out.model;
    const int P = layout.num_stages, V = layout.num_chunks;
    const std::vector<bool> moe = config::moe_layer_pattern(cfg.model);
    std::vector<int> own;  // the stage's layers, model chunk by model chunk
    for (const config::ModelChunk& ch : layout.chunks[static_cast<size_t>(stage)]) {
        for (int l = ch.first_layer; l < ch.first_layer + ch.num_layers; ++l)
            own.push_back(moe[static_cast<size_t>(l)] ? 1 : 0);
    }
    if (own.empty())
        own.push_back(moe.empty() ? 0 : moe.back() ? 1 : 0);
    while (static_cast<int>(own.size()) < per_chunk * V)
        own.push_back(own.back());
    own.resize(static_cast<size_t>(per_chunk * V));
    std::vector<int> pattern;
    for (int c = 0; c < V; ++c) {
        for (int s = 0; s < P; ++s)
            pattern.insert(pattern.end(), own.begin() + c * per_chunk,
                           own.begin() + (c + 1) * per_chunk);
    }
    m.num_layers = per_chunk * P * V;
    if (config::is_moe(m))
        m.moe_layer_freq = pattern;
    m.virtual_pipeline_model_parallel_size = V > 1 ? std::optional<int>(V) : std::optional<int>();
    m.account_for_embedding_in_pipeline_split = m.account_for_loss_in_pipeline_split = false;
    m.num_layers_in_first_pipeline_stage.reset();
    m.num_layers_in_last_pipeline_stage.reset();
    m.pipeline_model_parallel_layout.reset();
    return out;
}

// One pipeline stage's schedule (the whole step with PP = 1).
ScheduleEstimate estimate_stage(const config::Config& full_cfg, const config::Config& cfg,
                                const Hardware& hw, const CostParams& params, bool flex,
                                const ExpertLoadImbalance& load, int stage) {
    const model::GptShape shape = model::gpt_shape_from_config(
        cfg, std::max(1, cfg.model.expert_model_parallel_size), 0, stage);
    const train::StepPlan sp = train::make_step_plan(cfg, shape);
    const PlanModel pm = make_plan_model(cfg, sp, hw.device, flex, load, stage);
    const Replay r = replay_schedule(
        sp.calls, [&](const NodeCall& c) { return call_seconds(pm, c, hw, params); },
        flex ? params.flex_overlap_slowdown : params.overlap_slowdown);
    const OptimizerWork opt = optimizer_work(pm, sp);
    NodeWork opt_compute;
    opt_compute.stream_bytes = opt.elementwise_bytes;

    ScheduleEstimate e;
    e.overlap = cfg.model.overlap_moe_expert_parallel_comm;
    e.delay_wgrad = e.overlap && cfg.model.delay_wgrad_compute;
    e.flex = flex;
    e.name = std::string(flex ? "flex" : "") + (flex && e.overlap ? "+" : "") +
             (e.overlap ? (e.delay_wgrad ? "overlap+delay_wgrad" : "overlap")
                        : (flex ? "" : "baseline"));
    e.optimizer_s = compute_seconds(opt_compute, hw.device, params) +
                    comm_seconds(opt.collectives, hw.network, params);
    // The host launches every call one after another (cost_model.h "host"): the step cannot
    // end before it has.
    double host_s = 0;
    for (const NodeCall& c : sp.calls) {
        host_s += schedule::stream_of(c.node) == StreamId::kComm
                      ? params.comm_launch_us * 1e-6
                      : launch_seconds(node_work(pm, c), params);
    }
    e.host_launch_s = host_s;
    e.host_bound = host_s > r.end_s;
    e.tp_bytes_per_step = opt.tp_bytes;
    for (const NodeCall& c : sp.calls) {
        if (schedule::stream_of(c.node) != StreamId::kComm)
            e.tp_bytes_per_step += node_work(pm, c).tp_bytes;
    }
    e.step_time_s = std::max(r.end_s, host_s) + e.optimizer_s;
    e.compute_s = r.compute_s + e.optimizer_s;
    e.comm_s = r.comm_s;
    e.exposed_comm_s = std::max(0.0, e.step_time_s - e.compute_s);
    for (size_t i = 0; i < sp.calls.size(); ++i) {
        const NodeCall& c = sp.calls[i];
        if (c.node == NodeKind::kDispatch || c.node == NodeKind::kCombine)
            e.alltoall_s += r.durations_s[i];
        e.node_seconds[schedule::is_side_branch(c.node)
                           ? std::string(schedule::node_name(c.node))
                           : fmt::format("{}.{}", schedule::node_name(c.node),
                                         schedule::phase_name(c.phase))] += r.durations_s[i];
    }
    e.node_seconds["optimizer_step"] = e.optimizer_s;
    const int64_t world = config::world_size(cfg);
    e.tokens_per_s = static_cast<double>(cfg.train.global_batch_size.value_or(0)) *
                     cfg.model.seq_length / e.step_time_s;
    e.tflops_per_gpu = train::model_flops(model::gpt_shape_from_config(full_cfg, pm.ep_size, 0),
                                          cfg.train.global_batch_size.value_or(0)) /
                       e.step_time_s / world / 1e12;
    if (hw.device.id == "cpu") {
        e.peak_memory_bytes = cpu_peak_memory(full_cfg, hw.device);
    } else {
        // Megatron-Core's layout (gpu_memory.h), its busiest stage.
        const GpuMemory mem = estimate_gpu_memory(full_cfg);
        e.peak_memory_bytes = static_cast<int64_t>(mem.peak());
        e.memory_stage = mem.stages[static_cast<size_t>(mem.busiest_stage)];
    }
    e.num_calls = sp.calls.size();
    e.busiest_stage = stage;
    return e;
}

// A stage of an uneven split: with n layers over V model chunks, planned at floor(n / V) and
// ceil(n / V) layers a chunk and interpolated linearly in the layers (exact when V divides n).
ScheduleEstimate estimate_stage(const config::Config& cfg, const Hardware& hw,
                                const CostParams& params, bool flex,
                                const ExpertLoadImbalance& load, int stage) {
    const config::PipelineLayout layout = config::pipeline_layout(cfg.model);
    if (layout.even)
        return estimate_stage(cfg, cfg, hw, params, flex, load, stage);
    const int n = layout.stage_layers(stage), V = layout.num_chunks;
    const int lo = n / V, hi = (n + V - 1) / V;
    ScheduleEstimate e = estimate_stage(cfg, stage_config(cfg, layout, stage, std::max(1, hi)), hw,
                                        params, flex, load, stage);
    if (lo == hi || lo == 0)
        return e;
    const ScheduleEstimate f =
        estimate_stage(cfg, stage_config(cfg, layout, stage, lo), hw, params, flex, load, stage);
    const double w = static_cast<double>(n - lo * V) / V;  // the share of the way to hi
    const auto mix = [w](double a, double b) { return b + w * (a - b); };
    e.step_time_s = mix(e.step_time_s, f.step_time_s);
    e.compute_s = mix(e.compute_s, f.compute_s);
    e.comm_s = mix(e.comm_s, f.comm_s);
    e.exposed_comm_s = mix(e.exposed_comm_s, f.exposed_comm_s);
    e.alltoall_s = mix(e.alltoall_s, f.alltoall_s);
    e.optimizer_s = mix(e.optimizer_s, f.optimizer_s);
    e.host_launch_s = mix(e.host_launch_s, f.host_launch_s);
    e.tp_bytes_per_step = mix(e.tp_bytes_per_step, f.tp_bytes_per_step);
    e.tokens_per_s = mix(e.tokens_per_s, f.tokens_per_s);
    e.tflops_per_gpu = mix(e.tflops_per_gpu, f.tflops_per_gpu);
    for (auto& [node, seconds] : e.node_seconds)
        seconds = mix(seconds, f.node_seconds.count(node) ? f.node_seconds.at(node) : 0.0);
    return e;
}

}  // namespace

// PP > 1: every stage planned on its own list; the step is the slowest stage's, plus the
// pipeline's bubble, which a stage's own replay does not see (it does not wait for its
// neighbours): (P - 1) / (V M) of its compute, the fill and drain of P - 1 stages of V chunks
// each holding 1 / (V M) of the stage's work.
ScheduleEstimate estimate_schedule(const config::Config& cfg, const Hardware& hw,
                                   const CostParams& params, bool flex,
                                   const ExpertLoadImbalance& load) {
    const int P = cfg.model.pipeline_model_parallel_size;
    ScheduleEstimate worst = estimate_stage(cfg, hw, params, flex, load, 0);
    for (int stage = 1; stage < P; ++stage) {
        ScheduleEstimate e = estimate_stage(cfg, hw, params, flex, load, stage);
        if (e.step_time_s > worst.step_time_s)
            worst = std::move(e);
    }
    if (P > 1) {
        const double V = config::pipeline_layout(cfg.model).num_chunks;
        const double M = static_cast<double>(config::num_microbatches(cfg));
        const double bubble = (P - 1) / (V * M) * (worst.compute_s - worst.optimizer_s);
        worst.step_time_s += bubble;
        worst.pipeline_bubble_s = bubble;
        worst.node_seconds["pipeline_bubble"] = bubble;
        worst.tokens_per_s *= (worst.step_time_s - bubble) / worst.step_time_s;
        worst.tflops_per_gpu *= (worst.step_time_s - bubble) / worst.step_time_s;
    }
    return worst;
}

PlanOptions plan_options(const config::Config& cfg, const HardwareOverrides& overrides,
                         const Calibration* calibration) {
    PlanOptions options;
    options.hardware = resolve_hardware(cfg.env.gpu, overrides);
    options.params = default_params(options.hardware.device);
    if (calibration)
        apply_calibration(*calibration, options.hardware, options.params);
    const bool network_given =
        overrides.intra_node_gbps || overrides.inter_node_gbps || overrides.latency_us;
    const config::LinkConfig& link = cfg.comm.link;
    if (options.hardware.device.id == "cpu" && !network_given &&
        (link.inter_node_gbps.value_or(0) > 0 || link.intra_node_gbps.value_or(0) > 0)) {
        NetworkSpec& n = options.hardware.network;
        n.inter_node_gbps = link.inter_node_gbps.value_or(0) > 0 ? *link.inter_node_gbps : 1e6;
        n.intra_node_gbps = link.intra_node_gbps.value_or(0) > 0 ? *link.intra_node_gbps : 1e6;
        n.latency_us = link.latency_us.value_or(0);
        n.source = "comm.link.* of the configuration (the link model)";
        options.params.link_efficiency = 1;
    }
    return options;
}

PlanResult make_plan(const config::Config& cfg, const PlanOptions& options) {
    check_plannable(cfg);
    PlanResult r;
    r.model = cfg.recipe.value_or("config");
    r.world_size = config::world_size(cfg);
    r.num_nodes = config::num_nodes(cfg.comm);
    r.gpus_per_node = config::gpus_per_node(cfg.comm);
    r.ep_size = cfg.model.expert_model_parallel_size;
    r.tp_size = cfg.model.tensor_model_parallel_size;
    r.num_stages = cfg.model.pipeline_model_parallel_size;
    r.num_model_chunks = config::pipeline_layout(cfg.model).num_chunks;
    r.dp_size = static_cast<int>(r.world_size / config::model_parallel_size(cfg.model));
    r.num_micro_batches = config::num_microbatches(cfg);
    r.hardware = options.hardware;
    r.params = options.params;
    const config::Config base_cfg = with_schedule(cfg, false, false);
    const model::GptShape shape = model::gpt_shape_from_config(cfg, std::max(1, r.ep_size), 0);
    r.step_flops = train::model_flops(shape, cfg.train.global_batch_size.value_or(0));
    r.step_tokens =
        static_cast<double>(cfg.train.global_batch_size.value_or(0)) * cfg.model.seq_length;

    r.load_imbalance = checked_expert_load(options.expert_load, shape);
    r.expert_load = options.expert_load;
    if (options.comm_compute_ratio)
        set_network_to_ratio(base_cfg, shape, *options.comm_compute_ratio, r);

    struct Variant {
        bool overlap, delay, flex;
    };
    std::vector<Variant> variants = {
        {false, false, false}, {true, false, false}, {true, true, false}};
    const bool flex = cfg.model.moe_token_dispatcher_type == config::DispatcherType::kFlex;
    if (flex) {
        variants.push_back({false, false, true});
        variants.push_back({true, true, true});
        r.notes.push_back(
            "flex rows: planned from the deduplicated inter-node bytes (docs/flex.md), as the "
            "flex dispatcher sends them");
    }
    for (const Variant& v : variants)
        r.runs.push_back(estimate_schedule(with_schedule(cfg, v.overlap, v.delay), r.hardware,
                                           r.params, v.flex, r.expert_load));
    const ScheduleEstimate& base = r.runs.front();
    for (ScheduleEstimate& e : r.runs) {
        e.speedup = base.step_time_s / e.step_time_s;
        e.extra_memory_bytes = e.peak_memory_bytes - base.peak_memory_bytes;
    }
    r.overlap_speedup = r.runs[1].speedup;
    r.pair_edges = cfg.model.moe_ep_overlap_pair_edges;

    judge(r, cfg);
    add_layout_notes(cfg, r);
    // What an uneven expert load costs: the same schedules planned balanced.
    const double worst = r.load_imbalance.empty()
                             ? 1.0
                             : *std::max_element(r.load_imbalance.begin(), r.load_imbalance.end());
    if (worst > 1.0) {
        const ScheduleEstimate even_base = estimate_schedule(base_cfg, r.hardware, r.params, false);
        const ScheduleEstimate even_overlap =
            estimate_schedule(with_schedule(cfg, true, false), r.hardware, r.params, false);
        r.notes.push_back(fmt::format(
            "expert load up to {:.2f}x the mean on the busiest EP rank: with balanced routing "
            "the baseline would take {:.4g} s ({:.0f}% less) and overlap {:.4g} s ({:.2f}x); "
            "load balancing (moe_router_load_balancing_type, moe_router_enable_expert_bias) "
            "shortens the step with or without overlap",
            worst, even_base.step_time_s, 100 * (1 - even_base.step_time_s / base.step_time_s),
            even_overlap.step_time_s, even_base.step_time_s / even_overlap.step_time_s));
    }
    // The same overlap with the step's edges paired (docs/paired-edges.md), when the
    // configuration leaves them alone: a note, so `runs` stays the schedules as configured.
    if (!r.pair_edges && r.num_micro_batches >= 2 && suggests_pairing(r)) {
        config::Config paired = with_schedule(cfg, true, false);
        paired.model.moe_ep_overlap_pair_edges = true;
        const ScheduleEstimate p =
            estimate_schedule(paired, r.hardware, r.params, false, r.expert_load);
        const ScheduleEstimate& unpaired = r.runs[1];
        r.notes.push_back(fmt::format(
            "with paired edges (model.moe_ep_overlap_pair_edges=true, docs/paired-edges.md) "
            "overlap would take {:.4g} s, {:.2f}x against {:.2f}x unpaired, and hold {:.3g} GiB "
            "per rank against {:.3g} GiB",
            p.step_time_s, base.step_time_s / p.step_time_s, *unpaired.speedup,
            static_cast<double>(p.peak_memory_bytes) / kGiB,
            static_cast<double>(unpaired.peak_memory_bytes) / kGiB));
    }
    return r;
}

}  // namespace epo::plan
