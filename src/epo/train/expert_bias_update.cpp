#include "epo/train/expert_bias_update.h"

#include <span>
#include <vector>

namespace epo::train {

void update_expert_biases(model::GptModel& model, comm::Communicator& dp) {
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
        // all[r * E + e]: rank r's count of expert e.
        std::vector<int64_t> all(stats.routed_counts.size() * static_cast<size_t>(dp.size()));
        dp.all_gather(std::span<const int64_t>(stats.routed_counts), std::span<int64_t>(all));
        std::vector<int64_t> total(stats.routed_counts.size(), 0);
        for (size_t i = 0; i < all.size(); ++i)
            total[i % total.size()] += all[i];
        moe::update_expert_bias(router.expert_bias, total, s.moe.expert_bias_update_rate);
    }
}

}  // namespace epo::train
