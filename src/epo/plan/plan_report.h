// What `epo plan` prints: a table per schedule and the verdict (text), or one JSON object shaped
// like `epo bench`'s metrics.json where the two overlap (`runs` with name, step_time_s,
// compute_s, comm_s, exposed_comm_s, peak_memory_bytes; `overlap_speedup`), plus the verdict,
// the hardware and the calibration the plan used.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "epo/plan/plan.h"

namespace epo::plan {

std::string format_plan(const PlanResult& plan);
nlohmann::ordered_json plan_to_json(const PlanResult& plan);

}  // namespace epo::plan
