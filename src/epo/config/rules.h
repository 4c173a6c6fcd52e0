// The rule families the validator runs (validate.h orchestrates them). Each family appends
// findings to the context; none stops at the first problem. Rules read the user's values as
// given (`user`, before finalization copies anything) unless they say they check the finalized
// result (`fin`): a finalized config whose model says delay_wgrad_compute while EP overlap is
// off is an error whichever section it came from.
//
//   rules_values.cpp   VA (value ranges, required values), EN (env), TR (schedule), W013
//   rules_layout.cpp   LY (parallel layout and shapes), MO (MoE sanity), DS (dataset)
//   rules_overlap.cpp  EP001-EP013, WG001-WG006, FX001/FX002 and W005, W011, W012
//   rules_mcore.cpp    MC (Megatron-Core's start-up refusals the families above lack)
//   runtime_support.*  RT (what our runtime does not execute yet)
#pragma once

#include <fmt/format.h>

#include <charconv>
#include <optional>
#include <string>
#include <vector>

#include "epo/config/config.h"
#include "epo/config/devices.h"
#include "epo/config/env.h"
#include "epo/config/finding.h"

namespace epo::config {

struct RuleContext {
    const Config& user;  // as built from recipe, YAML, harness flags and overrides
    const Config& fin;   // the same after finalization
    const Target& target;
    std::vector<Finding>& errors;
    std::vector<Finding>& warnings;

    void error(std::string id, std::string field, std::string value, std::string message,
               std::string fix) const {
        errors.push_back({std::move(id), std::move(field), std::move(value), std::move(message),
                          std::move(fix)});
    }
    void warn(std::string id, std::string field, std::string value, std::string message,
              std::string fix = {}) const {
        warnings.push_back({std::move(id), std::move(field), std::move(value), std::move(message),
                            std::move(fix)});
    }
};

void check_values(const RuleContext& ctx);
void check_layout(const RuleContext& ctx);
void check_moe(const RuleContext& ctx);
void check_mcore(const RuleContext& ctx);
void check_ep_overlap(const RuleContext& ctx);
void check_delay_wgrad(const RuleContext& ctx);
void check_flex(const RuleContext& ctx, const DeviceProbe& probe);
void check_advisories(const RuleContext& ctx);

// ---- Showing values in findings ("null", "true", "4", "0.001", "[moe, mlp]").

inline std::string show(bool v) {
    return v ? "true" : "false";
}
inline std::string show(int v) {
    return std::to_string(v);
}
inline std::string show(std::int64_t v) {
    return std::to_string(v);
}
inline std::string show(double v) {
    char buffer[32];
    const auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), v);
    return std::string(buffer, ec == std::errc() ? end : buffer);
}
inline std::string show(const std::string& v) {
    return v;
}
template <ConfigEnum E>
std::string show(E v) {
    return std::string(enum_name(v));
}
template <class T>
std::string show(const std::vector<T>& v) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) {
        out += (i ? ", " : "") + show(v[i]);
    }
    return out + "]";
}
template <class T>
std::string show(const std::optional<T>& v) {
    return v ? show(*v) : "null";
}

// a % b == 0 with b > 0 (a non-positive divisor is a VA001 error reported elsewhere).
inline bool divides(std::int64_t b, std::int64_t a) {
    return b > 0 && a % b == 0;
}

}  // namespace epo::config
