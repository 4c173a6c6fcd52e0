#include "epo/plan/plan_notes.h"

#include <fmt/format.h>

#include <string>

#include "epo/config/pipeline_layout.h"

namespace epo::plan {
namespace {

constexpr double kNotesGiB = 1024.0 * 1024.0 * 1024.0;

// What to change when a schedule does not fit: after its largest part.
std::string memory_fix(const StageMemory& m, const config::Config& cfg) {
    const double state = m.weights + m.main_grads + m.optimizer + m.fp8_weights;
    if (m.activations > state) {
        return cfg.model.recompute_granularity
                   ? "recompute more (model.recompute_granularity=full, "
                     "recompute_method=uniform, recompute_num_layers=1), a smaller "
                     "train.micro_batch_size, or more TP / CP"
                   : "recompute (model.recompute_granularity=selective with "
                     "recompute_modules=[moe_act, layernorm], or full), a smaller "
                     "train.micro_batch_size, or more TP / CP";
    }
    return cfg.ddp.use_distributed_optimizer
               ? "spread the weights: more EP (experts) or PP (layers), or more data-parallel "
                 "ranks for the optimizer's shards"
               : "ddp.use_distributed_optimizer=true (shards the fp32 master weights and Adam "
                 "states over DP), or more EP / PP";
}

}  // namespace

// Each schedule's memory against the device, with a headroom kept for what the model does not
// count (CUDA context, communication buffers, fragmentation).
void check_memory(PlanResult& r, const config::Config& cfg) {
    // The datasheets' "80 GB" is what nvidia-smi reports in MiB (81559 MiB on an H100 SXM5):
    // binary gigabytes.
    const double capacity = r.hardware.device.memory_gb * kNotesGiB;
    const double usable = capacity * (1 - r.memory_headroom);
    const bool gpu = r.hardware.device.id != "cpu";
    for (ScheduleEstimate& e : r.runs) {
        e.fits = static_cast<double>(e.peak_memory_bytes) <= usable;
        if (e.fits)
            continue;
        if (!gpu) {
            r.notes.push_back(fmt::format(
                "{} needs {:.1f} GiB per rank by the epo runtime's memory estimate, more than "
                "the {:g} GiB of this machine's ranks",
                e.name, static_cast<double>(e.peak_memory_bytes) / kNotesGiB,
                r.hardware.device.memory_gb));
            continue;
        }
        const StageMemory& m = e.memory_stage;
        r.notes.push_back(fmt::format(
            "{} does not fit: stage {} needs {:.1f} GiB per rank (weights {:.1f}{}, main grads "
            "{:.1f}, optimizer {:.1f}, activations {:.1f} for {:g} micro-batch chunk(s) in "
            "flight), over {:.0f}% of the {:g} GiB of a {} ({:.0f}% kept for the CUDA context, "
            "communication buffers and fragmentation); {}",
            e.name, m.stage, m.total() / kNotesGiB, m.weights / kNotesGiB,
            m.fp8_weights > 0 ? fmt::format(", fp8 weight copies {:.1f}", m.fp8_weights / kNotesGiB)
                              : std::string(),
            m.main_grads / kNotesGiB, m.optimizer / kNotesGiB, m.activations / kNotesGiB,
            m.units_in_flight, 100 * (1 - r.memory_headroom), r.hardware.device.memory_gb,
            r.hardware.device.id, 100 * r.memory_headroom, memory_fix(m, cfg)));
    }
}

// What the plan approximates or what the targets disagree on, said once each.
void add_layout_notes(const config::Config& cfg, PlanResult& r) {
    const config::ModelConfig& m = cfg.model;
    const config::PipelineLayout layout = config::pipeline_layout(m);
    if (!layout.even) {
        std::string uneven;
        for (int s = 0; s < layout.num_stages; ++s) {
            if (layout.stage_layers(s) % layout.num_chunks != 0)
                uneven += fmt::format("{}stage {} ({} layers)", uneven.empty() ? "" : ", ", s,
                                      layout.stage_layers(s));
        }
        r.notes.push_back(fmt::format(
            "uneven pipeline split: each stage planned with its own layers{}; the memory model "
            "counts every stage's layers exactly",
            uneven.empty() ? ""
                           : fmt::format(" ({}: not a multiple of VPP {}, so planned at the "
                                         "two nearest multiples and interpolated)",
                                         uneven, layout.num_chunks)));
    }
    if (m.recompute_granularity == config::RecomputeGranularity::kFull) {
        r.notes.push_back(
            "full recompute with EP overlap: Megatron-LM's dev branch runs it (its overlap "
            "schedule recomputes inside the combined step); Megatron-Bridge's rules refuse it "
            "(EP007), so the overlap rows are for a Megatron-LM target");
    }
    if (m.mtp_num_layers.value_or(0) > 0 && layout.num_stages > 1) {
        r.notes.push_back(fmt::format(
            "MTP: {} depth(s) on the last stage: its layer (like the last, with its projection) "
            "is a layer of the schedule, paired by overlap like the others; its output head and "
            "loss run on the output call",
            *m.mtp_num_layers));
    }
    if (m.fp8 && r.hardware.device.peak_fp8_tflops <= 0)
        r.notes.push_back("fp8: this device has no fp8 rate; the products are planned at bf16");
    // Where published runs contradict the verdict (docs/plan.md "Published runs", rows 5 and 6):
    // on B200, overlap with the alltoall dispatcher ran slower than the baseline from host
    // overhead, which the host model does not reproduce with its defaults.
    const std::string& gpu = r.hardware.device.id;
    if ((gpu == "b200" || gpu == "gb200") &&
        m.moe_token_dispatcher_type == config::DispatcherType::kAlltoall &&
        r.verdict != "does not pay") {
        r.notes.push_back(
            "host overhead on Blackwell: published B200 runs measured EP overlap with the "
            "alltoall dispatcher slower than the baseline (Megatron-Bridge PR #1760, "
            "Qwen3-235B-A22B on 64 B200: 0.93x bf16, 0.84x mxfp8) where this model plans it "
            "faster; its host charges (node_overhead_us, comm_launch_us) are not checked on a "
            "Blackwell node and the per-layer token-count sync of the dispatcher is not modelled "
            "(docs/plan.md, published rows 5 and 6): measure one overlap step before relying on "
            "the verdict");
    }
}

}  // namespace epo::plan
