#include "epo/train/memory_plan.h"

#include <algorithm>
#include <map>
#include <utility>

namespace epo::train {

config::MemoryEstimate estimate_stage_memory(const config::Config& cfg, const StepPlan& plan,
                                             const model::GptShape& shape) {
    const int64_t c = cfg.model.bf16 ? 2 : 4;
    int64_t dense = 0, expert = 0;
    for (int64_t position = -1; position <= shape.num_layers; ++position) {
        if (!shape.holds(position))
            continue;
        const PositionParamSizes sizes = param_sizes_at(shape, static_cast<int>(position));
        for (int64_t n : sizes.dense)
            dense += n;
        for (int64_t n : sizes.expert)
            expert += n;
    }
    config::MemoryEstimate m;
    m.parameters = (dense + expert) * (4 + (c == 4 ? 0 : c));
    m.gradients = (dense + expert) * 4;
    m.optimizer = dense * 8 / (plan.distributed_optimizer ? plan.dp_size : 1) +
                  expert * 8 / (plan.distributed_optimizer ? plan.edp_size : 1);
    m.packed = expert * 2 * c;
    m.scratch = config::scratch_bytes(cfg);

    // What a unit holds while alive.
    const config::ActivationBytes a = config::activation_bytes(cfg);
    const auto unit_bytes = [&](int chunk) {
        const int stage = shape.pipeline_rank;
        const model::LayerRange r = shape.chunk_layers(stage, std::max(chunk, 0));
        int64_t bytes = a.handoff + config::layers_activation_bytes(
                                        a, shape.moe_layers, shape.recompute_first, r.first, r.end);
        const bool output = stage == shape.pipeline_size - 1 &&
                            std::max(chunk, 0) == shape.virtual_pipeline_size - 1;
        // Multi-token prediction: its layer is counted above; its prologue, e and its gradient,
        // and its head's tensors (model/mtp.h) come with the chunk holding it.
        if (shape.mtp_num_layers > 0 && r.end == shape.num_layers)
            bytes += model::mtp_saved_bytes(shape.tokens(), shape.hidden, shape.vocab, c);
        return bytes + (output ? a.output : 0);
    };
    // Each unit's first and last call in the stage's list.
    std::map<std::pair<int, int>, std::pair<size_t, size_t>> alive;  // (mb, chunk) -> [first, last]
    for (size_t i = 0; i < plan.calls.size(); ++i) {
        const schedule::NodeCall& call = plan.calls[i];
        // A received activation waits in its (T, H) hand-off for the unit's first node: counted
        // from that node on (one tensor, left out).
        if (schedule::is_side_branch(call.node) || schedule::is_pipeline_transfer(call.node))
            continue;
        alive.try_emplace({call.micro_batch, call.chunk}, i, i).first->second.second = i;
    }
    int64_t peak = 0;
    int most = 0;
    for (size_t i = 0; i < plan.calls.size(); ++i) {
        int64_t bytes = 0;
        int units = 0;
        for (const auto& [unit, span] : alive) {
            if (span.first <= i && i <= span.second) {
                bytes += unit_bytes(unit.second);
                ++units;
            }
        }
        peak = std::max(peak, bytes);
        most = std::max(most, units);
    }
    m.activations = peak;
    m.micro_batches_in_flight = std::max(most, 1);
    return m;
}

config::MemoryEstimate estimate_run_memory(const config::Config& cfg) {
    const int ep = std::max(1, cfg.model.expert_model_parallel_size);
    config::MemoryEstimate worst;
    for (int stage = 0; stage < std::max(1, cfg.model.pipeline_model_parallel_size); ++stage) {
        const model::GptShape shape = model::gpt_shape_from_config(cfg, ep, 0, stage);
        const config::MemoryEstimate m =
            estimate_stage_memory(cfg, make_step_plan(cfg, shape), shape);
        if (stage == 0 || m.total() > worst.total())
            worst = m;
    }
    return worst;
}

}  // namespace epo::train
