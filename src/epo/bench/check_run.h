// `epo check-run DIR`: the success criteria of a run, applied to a finished `epo bench` run
// directory, one verdict per criterion. It reads only files (metrics.json, config.yaml,
// logs/rank-R.log) and recomputes what it can instead of trusting summary flags: the loss
// comparison uses the loss arrays, bit for bit.
//
// Criteria, in order:
//   configuration finalized    config.yaml loads and passes validation for the runtime, and the
//                               rank-0 log says "configuration finalized, no error" for every run
//   overlap flags              overlap_moe_expert_parallel_comm and delay_wgrad_compute are true
//                               in config.yaml and in the logged configuration
//   flex dispatcher logged     when the dispatcher is flex: its type and backend in the log
//   every step completed       steps_completed == steps_planned and one finite loss per step
//   no hang                    metrics.json says completed and every rank's log ends in "done"
//   identical to the baseline  every run's losses and grad norms (every step) and final-parameter
//                               checksum equal the baseline's, bit for bit, and every repeat's
//                               its first's (losses alone can pass a wrong run: metrics.h)
//   throughput                 the overlap runs' median step time is at most the baseline's
//                               times 1 + kThroughputTolerance (shared-machine noise); the
//                               medians are recomputed from step_times_s, and a stored median
//                               that disagrees fails
//   measured, not claimed      no speedup above its schedule's cap and none from fewer than
//                               kMinStepsPerRun steps (trust.h); a speedup within the noise
//                               passes with WARN
//
// A metrics.json whose fields are missing or of the wrong type fails every criterion that reads
// it, naming the first such field.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace epo::bench {

inline constexpr double kThroughputTolerance = 0.05;

struct Criterion {
    std::string name;
    bool pass = false;
    std::string detail;
    bool warning = false;  // passed, with a caveat the detail names (printed WARN)
};

inline constexpr const char* kIdenticalCriterion =
    "losses, grad norms and final parameters identical to the baseline";

// The "identical to the baseline" criterion on a parsed metrics.json (recomputed from its
// arrays and checksums, not from its summary flags).
Criterion identical_to_baseline(const nlohmann::json& metrics);

// Never throws for a broken directory: what is missing or malformed fails its criteria.
std::vector<Criterion> check_run_dir(const std::filesystem::path& dir);

// "PASS  name: detail" lines and a last verdict line.
std::string format_verdicts(const std::vector<Criterion>& criteria);

}  // namespace epo::bench
