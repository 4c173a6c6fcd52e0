#include "epo/plan/plan_report.h"

#include <fmt/format.h>

namespace epo::plan {
namespace {

double gib(int64_t bytes) {
    return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0);
}

}  // namespace

std::string format_plan(const PlanResult& r) {
    const Hardware& hw = r.hardware;
    std::string out = fmt::format(
        "[plan] {}: {} ranks ({} nodes x {}), TP {}, PP {}, EP {}, DP {}, {} micro-batches per "
        "rank per step\n"
        "[plan] device {}: {:g} TFLOP/s bf16, {:g} TB/s, {:g} GB ({})\n"
        "[plan] network: {:g} Gbit/s inside a node, {:g} Gbit/s between nodes per GPU, latency "
        "{:g} us ({})\n"
        "[plan] efficiencies ({}): products {:.2f} / dgrad {:.2f} / wgrad {:.2f}, half at {:.0f} "
        "(wgrad {:.0f}), "
        "memory {:.2f} / element-wise {:.2f}, links {:.2f}, slowdown while overlapped {:.2f} (flex "
        "{:.2f}), {:g} us per "
        "node\n"
        "[plan] expert load: {}\n\n",
        r.model, r.world_size, r.num_nodes, r.gpus_per_node, r.tp_size, r.num_stages, r.ep_size,
        r.dp_size, r.num_micro_batches, hw.device.id, hw.device.peak_bf16_tflops,
        hw.device.memory_tbps, hw.device.memory_gb, hw.device.source, hw.network.intra_node_gbps,
        hw.network.inter_node_gbps, hw.network.latency_us, hw.network.source, r.params.source,
        r.params.gemm_efficiency, r.params.dgrad_efficiency, r.params.wgrad_efficiency,
        r.params.gemm_half_dim, r.params.wgrad_half_dim, r.params.memory_efficiency,
        r.params.elementwise_efficiency, r.params.link_efficiency, r.params.overlap_slowdown,
        r.params.flex_overlap_slowdown, r.params.node_overhead_us, r.expert_load.source);
    out += fmt::format("{:26s} {:>10s} {:>10s} {:>8s} {:>9s} {:>9s} {:>9s} {:>8s} {:>9s} {:>9s}\n",
                       "schedule", "step s", "tokens/s", "TFLOP/s", "compute", "comm", "exposed",
                       "speedup", "peak mem", "overlap");
    out += fmt::format("{:26s} {:>10s} {:>10s} {:>8s} {:>9s} {:>9s} {:>9s} {:>8s} {:>9s} {:>9s}\n",
                       "", "", "", "per GPU", "s", "s", "s", "", "GiB", "holds GiB");
    for (const ScheduleEstimate& e : r.runs) {
        out += fmt::format(
            "{:26s} {:>10.4g} {:>10.0f} {:>8.4g} {:>9.4g} {:>9.4g} {:>9.4g} {:>7.2f}x {:>9.2f} "
            "{:>9}\n",
            e.name, e.step_time_s, e.tokens_per_s, e.tflops_per_gpu, e.compute_s, e.comm_s,
            e.exposed_comm_s, e.speedup.value_or(1), gib(e.peak_memory_bytes),
            e.name == "baseline" ? "-" : fmt::format("{:+.2f}", gib(e.extra_memory_bytes)));
    }
    const ScheduleEstimate& base = r.runs.front();
    if (hw.device.id != "cpu") {
        const StageMemory& m = base.memory_stage;
        out += fmt::format(
            "\nmemory (Megatron-Core layout, docs/plan.md \"Memory\"): busiest stage {} of {}: "
            "weights {:.2f}{} + main grads {:.2f} + optimizer {:.2f} + activations {:.2f} GiB "
            "({:g} micro-batch chunk(s) in flight) = {:.2f} GiB baseline; usable {:.1f} GiB "
            "({:.0f}% headroom):",
            m.stage, r.num_stages, gib(m.weights),
            m.fp8_weights > 0 ? fmt::format(" + fp8 weight copies {:.2f}", gib(m.fp8_weights))
                              : std::string(),
            gib(m.main_grads), gib(m.optimizer), gib(m.activations), m.units_in_flight,
            gib(m.total()), hw.device.memory_gb * (1 - r.memory_headroom), 100 * r.memory_headroom);
        for (const ScheduleEstimate& e : r.runs)
            out += fmt::format(" {} {}", e.name, e.fits ? "fits" : "DOES NOT FIT");
        out += "\n";
    }
    if (r.num_stages > 1) {
        out += fmt::format(
            "pipeline: {} stages x {} model chunks; slowest stage {}, bubble {:.3g} s of "
            "the baseline's step\n",
            r.num_stages, r.num_model_chunks, base.busiest_stage, base.pipeline_bubble_s);
    }
    out += fmt::format("\nverdict: EP overlap {}: {}\n", r.verdict, r.reason);
    for (const std::string& note : r.notes)
        out += "note: " + note + "\n";
    return out;
}

nlohmann::ordered_json plan_to_json(const PlanResult& r) {
    nlohmann::ordered_json j;
    j["model"] = r.model;
    j["world_size"] = r.world_size;
    j["num_nodes"] = r.num_nodes;
    j["gpus_per_node"] = r.gpus_per_node;
    j["expert_model_parallel_size"] = r.ep_size;
    j["num_micro_batches"] = r.num_micro_batches;
    j["runs"] = nlohmann::ordered_json::array();
    for (const ScheduleEstimate& e : r.runs) {
        j["runs"].push_back({{"name", e.name},
                             {"overlap_moe_expert_parallel_comm", e.overlap},
                             {"delay_wgrad_compute", e.delay_wgrad},
                             {"flex", e.flex},
                             {"step_time_s", e.step_time_s},
                             {"compute_s", e.compute_s},
                             {"comm_s", e.comm_s},
                             {"exposed_comm_s", e.exposed_comm_s},
                             {"alltoall_s", e.alltoall_s},
                             {"optimizer_s", e.optimizer_s},
                             {"tokens_per_s", e.tokens_per_s},
                             {"tflops_per_gpu", e.tflops_per_gpu},
                             {"peak_memory_bytes", e.peak_memory_bytes},
                             {"fits_memory", e.fits},
                             {"memory_stage", e.memory_stage.stage},
                             {"slowest_stage", e.busiest_stage},
                             {"pipeline_bubble_s", e.pipeline_bubble_s},
                             {"host_launch_s", e.host_launch_s},
                             {"tp_bytes_per_step", e.tp_bytes_per_step},
                             {"host_bound", e.host_bound},
                             {"extra_memory_bytes", e.extra_memory_bytes},
                             {"speedup_vs_baseline", e.speedup.value_or(1)},
                             {"nodes_seconds_per_step", e.node_seconds}});
    }
    j["overlap_speedup"] = r.overlap_speedup ? nlohmann::ordered_json(*r.overlap_speedup) : nullptr;
    j["verdict"] = {{"answer", r.verdict}, {"reason", r.reason}};
    j["notes"] = r.notes;
    j["expert_load"] = {{"imbalance", r.load_imbalance}, {"source", r.expert_load.source}};
    const Hardware& hw = r.hardware;
    j["hardware"] = {{"device", hw.device.id},
                     {"peak_bf16_tflops", hw.device.peak_bf16_tflops},
                     {"memory_tbps", hw.device.memory_tbps},
                     {"memory_gb", hw.device.memory_gb},
                     {"device_source", hw.device.source},
                     {"intra_node_gbps", hw.network.intra_node_gbps},
                     {"inter_node_gbps", hw.network.inter_node_gbps},
                     {"latency_us", hw.network.latency_us},
                     {"network_source", hw.network.source}};
    const CostParams& p = r.params;
    j["calibration"] = {{"source", p.source},
                        {"gemm_efficiency", p.gemm_efficiency},
                        {"dgrad_efficiency", p.dgrad_efficiency},
                        {"wgrad_efficiency", p.wgrad_efficiency},
                        {"gemm_half_dim", p.gemm_half_dim},
                        {"wgrad_half_dim", p.wgrad_half_dim},
                        {"memory_efficiency", p.memory_efficiency},
                        {"elementwise_efficiency", p.elementwise_efficiency},
                        {"link_efficiency", p.link_efficiency},
                        {"overlap_slowdown", p.overlap_slowdown},
                        {"flex_overlap_slowdown", p.flex_overlap_slowdown},
                        {"node_overhead_us", p.node_overhead_us},
                        {"comm_launch_us", p.comm_launch_us},
                        {"graph_launch_us", p.graph_launch_us}};
    return j;
}

nlohmann::ordered_json plan_to_json(const PlanResult& plan, const config::ValidationReport& report,
                                    const RuntimeGaps& gaps) {
    nlohmann::ordered_json j = plan_to_json(plan);
    nlohmann::ordered_json warnings = nlohmann::ordered_json::array();
    for (const config::Finding& f : report.warnings)
        warnings.push_back({{"id", f.id},
                            {"field", f.field},
                            {"value", f.value},
                            {"message", f.message},
                            {"fix", f.fix}});
    j["validation"] = {{"target", report.target}, {"warnings", warnings}, {"notes", report.notes}};
    j["runtime"] = {{"can_run_on_cpu", gaps.ids.empty()},
                    {"gaps", gaps.ids},
                    {"note", gaps.note.empty() ? nlohmann::ordered_json(nullptr)
                                               : nlohmann::ordered_json(gaps.note)}};
    return j;
}

}  // namespace epo::plan
