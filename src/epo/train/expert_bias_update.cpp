#include "epo/train/expert_bias_update.h"

#include <algorithm>
#include <span>
#include <vector>

namespace epo::train {
namespace {

// counts[i] = the sum of every rank's counts[i] over `group`, in rank order (exact: integers).
void sum_expert_counts(comm::Communicator& group, std::vector<int64_t>& counts) {
    if (group.size() == 1)
        return;
    // all[r * E + e]: rank r's count of expert e.
    std::vector<int64_t> all(counts.size() * static_cast<size_t>(group.size()));
    group.all_gather(std::span<const int64_t>(counts), std::span<int64_t>(all));
    std::fill(counts.begin(), counts.end(), 0);
    for (size_t i = 0; i < all.size(); ++i)
        counts[i % counts.size()] += all[i];
}

}  // namespace

void update_expert_biases(model::GptModel& model, comm::Communicator& tp, comm::Communicator& dp) {
    const model::GptShape& s = model.shape();
    if (!s.moe.enable_expert_bias)
        return;
    for (int64_t l = 0; l < s.num_layers; ++l) {
        if (!s.moe_layers[static_cast<size_t>(l)])
            continue;
        const model::LayerStepStats& stats = model.layer_stats()[static_cast<size_t>(l)];
        moe::RouterParams& router = model.layer(static_cast<int>(l)).moe.router;
        if (!router.expert_bias.defined())
            continue;
        std::vector<int64_t> total = stats.routed_counts;
        // Why the TP group first: under sequence parallelism its ranks routed disjoint rows of the
        // same micro-batches, so their sum is the DP rank's count.
        if (s.tp_size > 1 && s.sequence_parallel)
            sum_expert_counts(tp, total);
        sum_expert_counts(dp, total);
        moe::update_expert_bias(router.expert_bias, total, s.moe.expert_bias_update_rate);
    }
}

}  // namespace epo::train
