// Whether a benchmark's speedups were measured or only claimed: the checks `epo bench` prints
// under its table, writes to metrics.json ("trust") and report.html, and `epo check-run` applies.
//
// A speedup is a ratio of two medians of a few step times on a shared machine. It can come out
// larger than the schedule can give (noise, or a baseline slowed by something else), or from too
// few steps to mean anything. Three checks, each on one overlap run against the baseline:
//
//   above_cap      speedup > cap * (1 + kCapTolerance), where cap is the schedule's
//                  theoretical cap 2NC / (NC + 1) (2 with paired edges; schedule.h
//                  overlap_speedup_cap). That cap is the largest speedup at any comm/compute
//                  ratio: with compute c and communication r c per micro-batch the overlap step
//                  is at least (1 + r) c + (N - 1) max(1, r) c, so the speedup
//                  N (1 + r) / ((1 + r) + (N - 1) max(1, r)) peaks at r = 1. One-stage schedules
//                  only (PP = 1): a pipeline's cap depends on its bubble.
//   too_few_steps  fewer than kMinStepsPerRun measured steps in the run or in the baseline.
//   within_noise   the two runs' step-time ranges overlap by more than the difference of their
//                  medians allows: the slower run's fastest step is faster than the faster run's
//                  median, so the sign of the difference is not settled.
//
// above_cap and too_few_steps make a speedup unusable (check-run fails); within_noise is a
// warning (check-run passes with WARN). It reads only the metrics.json fields it names, and never
// throws on a malformed document: what it cannot read it does not judge.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace epo::bench {

inline constexpr double kCapTolerance = 0.05;
inline constexpr int kMinStepsPerRun = 3;

struct TrustFlag {
    std::string run;      // the run's name ("overlap", ...)
    std::string id;       // "above_cap", "too_few_steps", "within_noise"
    bool fatal = false;   // above_cap, too_few_steps: the speedup cannot be used
    std::string message;  // one sentence for the table, the report and check-run
};

// The flags of every non-baseline run of a metrics.json document (none without a baseline).
std::vector<TrustFlag> trust_flags(const nlohmann::json& metrics);

// metrics.json's "trust" object: {"ok": no fatal flag, "flags": [{run, id, fatal, message}]}.
nlohmann::json trust_json(const std::vector<TrustFlag>& flags);

// "warning: ..." lines for the table ("" without flags).
std::string format_trust(const std::vector<TrustFlag>& flags);

}  // namespace epo::bench
