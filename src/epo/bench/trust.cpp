#include "epo/bench/trust.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "epo/bench/metrics.h"

namespace epo::bench {
namespace {

// A run's measured step times, or none when the array is missing, empty or holds a non-number.
std::optional<std::vector<double>> step_times(const nlohmann::json& run) {
    const auto it = run.find("step_times_s");
    if (it == run.end() || !it->is_array())
        return std::nullopt;
    std::vector<double> times;
    for (const auto& v : *it) {
        if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0)
            return std::nullopt;
        times.push_back(v.get<double>());
    }
    return times;
}

std::string name_of(const nlohmann::json& run) {
    const auto it = run.find("name");
    return it != run.end() && it->is_string() ? it->get<std::string>() : "?";
}

}  // namespace

std::vector<TrustFlag> trust_flags(const nlohmann::json& m) {
    std::vector<TrustFlag> flags;
    if (!m.is_object() || !m.contains("runs") || !m.at("runs").is_array())
        return flags;
    const nlohmann::json* base = nullptr;
    for (const auto& r : m.at("runs")) {
        if (r.is_object() && name_of(r) == "baseline")
            base = &r;
    }
    if (!base)
        return flags;
    const auto base_times = step_times(*base);
    const auto number = [&](const char* key) -> std::optional<double> {
        const auto it = m.find(key);
        return it != m.end() && it->is_number() ? std::optional(it->get<double>()) : std::nullopt;
    };
    const std::optional<double> cap = number("theoretical_cap");
    const std::optional<double> pp = number("pipeline_model_parallel_size");
    for (const auto& r : m.at("runs")) {
        if (!r.is_object() || &r == base)
            continue;
        const std::string name = name_of(r);
        const auto times = step_times(r);
        if (!times || !base_times)
            continue;  // check-run reports the malformed arrays
        const size_t fewest = std::min(times->size(), base_times->size());
        if (fewest < static_cast<size_t>(kMinStepsPerRun)) {
            flags.push_back(
                {name, "too_few_steps", true,
                 fmt::format(
                     "{}: {} measured step(s) against the baseline's {}: a speedup needs at "
                     "least {} of each (raise --max_steps or --repeats)",
                     name, times->size(), base_times->size(), kMinStepsPerRun)});
        }
        if (times->empty() || base_times->empty())
            continue;
        const Summary own = summarize(*times);
        const Summary reference = summarize(*base_times);
        const double speedup = reference.median / own.median;
        if (cap && *cap > 0 && pp.value_or(1) <= 1 && speedup > *cap * (1 + kCapTolerance)) {
            flags.push_back(
                {name, "above_cap", true,
                 fmt::format("{}: speedup {:.2f}x is above the schedule's theoretical cap {:.2f}x "
                             "(at any comm/compute ratio): the step times are noise, or something "
                             "else slowed the baseline; rerun on a quieter machine with more steps",
                             name, speedup, *cap)});
        }
        // The slower run's fastest step beats the faster run's median: the ranges overlap past
        // the difference, so which schedule is faster is not settled by these steps.
        const Summary& faster = speedup >= 1 ? own : reference;
        const Summary& slower = speedup >= 1 ? reference : own;
        if (std::fabs(speedup - 1) > 1e-12 && slower.min < faster.median) {
            flags.push_back(
                {name, "within_noise", false,
                 fmt::format(
                     "{}: {:.2f}x is within the noise: the {} run's fastest step ({:.3f} s) "
                     "beats the {} run's median ({:.3f} s); more steps would settle it",
                     name, speedup, speedup >= 1 ? "baseline" : name, slower.min,
                     speedup >= 1 ? name : "baseline", faster.median)});
        }
    }
    return flags;
}

nlohmann::json trust_json(const std::vector<TrustFlag>& flags) {
    nlohmann::json list = nlohmann::json::array();
    bool ok = true;
    for (const TrustFlag& f : flags) {
        list.push_back({{"run", f.run}, {"id", f.id}, {"fatal", f.fatal}, {"message", f.message}});
        ok = ok && !f.fatal;
    }
    return {{"ok", ok}, {"flags", list}};
}

std::string format_trust(const std::vector<TrustFlag>& flags) {
    std::string out;
    for (const TrustFlag& f : flags)
        out += fmt::format("warning ({}): {}\n", f.id, f.message);
    return out;
}

}  // namespace epo::bench
