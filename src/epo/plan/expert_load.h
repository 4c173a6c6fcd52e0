// Expert load: how evenly a MoE layer's routed rows fall on the EP ranks (docs/plan.md "Expert
// load"). The all-to-alls of a layer end together on every rank of the EP group, so a step runs
// at the pace of the rank whose experts received the most rows: its experts compute longest,
// and it receives (and, in the combine, sends back) the most bytes. The planner charges that
// rank's load; `epo bench` measures it on every run.
//
//   rows(r)    = sum over the experts of EP rank r of their routed rows (per step, per EP group)
//   imbalance  = max_r rows(r) / mean_r rows(r)      (1 when balanced; at most EP)
//
// Counted over whole steps (every micro-batch of a step together), before capacity drops. The
// routing depends on the weights and the data only, never on the schedule or the link: the
// baseline and the overlap schedules route bit-identically.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace epo::plan {

struct LayerExpertLoad {
    int layer = 0;
    std::vector<double> rows_per_ep_rank;  // per step and EP group
    double imbalance = 1;
};

// From routed-row counts summed over every rank of the job and `num_steps` steps: counts[l][e]
// for layer l (empty for a dense layer), expert e; experts in EP-rank order, E / ep_size each.
// `num_ep_groups`: how many EP groups the job's ranks form (world / EP without PP).
std::vector<LayerExpertLoad> expert_load(const std::vector<std::vector<int64_t>>& counts,
                                         int ep_size, int num_ep_groups, int64_t num_steps);

// metrics.json's "expert_load": {"layers": [{"layer", "rows_per_ep_rank", "imbalance"}],
// "mean_imbalance"} (null without MoE layers).
nlohmann::json expert_load_json(const std::vector<LayerExpertLoad>& layers);

// Where a plan's imbalance comes from: `epo plan --expert_load_imbalance VALUE`, VALUE one
// number >= 1 for every MoE layer, or an `epo bench` run directory (or its metrics.json), whose
// measured per-layer figures are used.
struct ExpertLoadImbalance {
    std::vector<double> per_moe_layer;  // one per MoE layer, in layer order; empty: one for all
    double all = 1;                     // when per_moe_layer is empty
    std::string source =                // for the report
        "1 (balanced routing; epo bench measures a run's: --expert_load_imbalance RUN_DIR)";
    // The imbalance of the i-th MoE layer (make_plan checks that a measured list has one per
    // MoE layer of the planned model).
    double of(int moe_layer_index) const;
};

// kUsage naming the flag, the value and the fix: not a number >= 1 and not a readable run
// directory or metrics.json with an "expert_load" section.
ExpertLoadImbalance parse_expert_load_imbalance(const std::string& value);

}  // namespace epo::plan
