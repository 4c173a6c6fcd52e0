#include "epo/plan/plan_target.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace epo::plan {
namespace {

bool is_runtime_finding(const config::Finding& f) {
    return f.id.rfind("RT", 0) == 0;
}

// The epo runtime's start-up checks, which a GPU stack does not run (validate.cpp's notes).
bool is_runtime_note(const std::string& note) {
    return note.rfind("EP005 for the epo runtime", 0) == 0;
}

}  // namespace

RuntimeGaps retarget_for_plan(config::ValidationReport& report) {
    std::vector<std::string> ids, what;
    for (const config::Finding& f : report.warnings) {
        if (!is_runtime_finding(f))
            continue;
        ids.push_back(f.id);
        what.push_back(fmt::format("{} {}", f.field, f.value));
    }
    report.warnings.erase(
        std::remove_if(report.warnings.begin(), report.warnings.end(), is_runtime_finding),
        report.warnings.end());
    const bool gpu = report.config.env.gpu != "cpu";
    if (gpu) {
        report.notes.erase(
            std::remove_if(report.notes.begin(), report.notes.end(), is_runtime_note),
            report.notes.end());
    }
    if (ids.empty())
        return {};
    RuntimeGaps gaps{
        ids, fmt::format(
                 "the epo runtime cannot run this configuration to check the plan on CPU ({}: {}); "
                 "the plan is for {}, and `epo validate` lists each gap with its fix",
                 fmt::join(ids, ", "), fmt::join(what, ", "),
                 gpu ? fmt::format("env.gpu {}", report.config.env.gpu) : "this machine")};
    report.notes.push_back(gaps.note);
    return gaps;
}

}  // namespace epo::plan
