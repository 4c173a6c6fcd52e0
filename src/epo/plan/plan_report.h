// What `epo plan` prints: a table per schedule and the verdict (text), or one JSON object shaped
// like `epo bench`'s metrics.json where the two overlap (`runs` with name, step_time_s,
// compute_s, comm_s, exposed_comm_s, peak_memory_bytes; `overlap_speedup`), plus the verdict,
// the hardware and the calibration the plan used.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "epo/config/report.h"
#include "epo/plan/plan.h"
#include "epo/plan/plan_target.h"

namespace epo::plan {

std::string format_plan(const PlanResult& plan);
nlohmann::ordered_json plan_to_json(const PlanResult& plan);

// As `epo plan --json` prints it: plan_to_json with what the text output prints above the plan,
//   validation {target, warnings[] {id, field, value, message, fix}, notes[]} (notes hold the
//   runtime note among the others),
//   runtime {can_run_on_cpu, gaps[] (the RT ids), note (or null)}: whether the epo CPU runtime
//   can run this configuration to check the plan (plan_target.h).
nlohmann::ordered_json plan_to_json(const PlanResult& plan, const config::ValidationReport& report,
                                    const RuntimeGaps& gaps);

}  // namespace epo::plan
