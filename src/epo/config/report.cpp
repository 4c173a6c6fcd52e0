#include "epo/config/report.h"

#include <fmt/format.h>

#include "epo/config/json_io.h"
#include "epo/config/yaml_io.h"

namespace epo::config {
namespace {

std::string plural(std::size_t n, const char* word) {
    return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

void append_finding(std::string& out, const Finding& f) {
    out += fmt::format("  {}", f.id);
    if (!f.field.empty()) {
        out += fmt::format("  {}", f.field);
        if (!f.value.empty()) {
            out += fmt::format(" = {}", f.value);
        }
    }
    out += fmt::format("\n        {}\n", f.message);
    if (!f.fix.empty()) {
        out += fmt::format("        fix: {}\n", f.fix);
    }
}

}  // namespace

nlohmann::ordered_json report_to_json(const ValidationReport& report) {
    nlohmann::ordered_json out;
    out["ok"] = report.ok();
    out["target"] = report.target;
    out["errors"] = nlohmann::ordered_json::array();
    for (const auto& f : report.errors) {
        out["errors"].push_back({{"id", f.id},
                                 {"field", f.field},
                                 {"value", f.value},
                                 {"message", f.message},
                                 {"fix", f.fix}});
    }
    out["warnings"] = nlohmann::ordered_json::array();
    for (const auto& f : report.warnings) {
        out["warnings"].push_back({{"id", f.id}, {"message", f.message}, {"fix", f.fix}});
    }
    out["notes"] = report.notes;
    out["config"] = to_json(report.config);
    return out;
}

std::string format_run_log(const ValidationReport& report) {
    std::string out;
    if (report.ok()) {
        out +=
            fmt::format("# epo: configuration finalized, no error (target: {})\n", report.target);
    } else {
        out += fmt::format("# epo: configuration finalized with {} (target: {})\n",
                           plural(report.errors.size(), "error"), report.target);
    }
    out += to_yaml(report.config);
    return out;
}

std::string format_findings(const ValidationReport& report) {
    std::string out;
    if (!report.errors.empty()) {
        out += fmt::format("\nerrors ({}):\n", report.errors.size());
        for (const auto& f : report.errors) {
            append_finding(out, f);
        }
    }
    if (!report.warnings.empty()) {
        out += fmt::format("\nwarnings ({}):\n", report.warnings.size());
        for (const auto& f : report.warnings) {
            append_finding(out, f);
        }
    }
    if (!report.notes.empty()) {
        out += "\nnotes:\n";
        for (const auto& note : report.notes) {
            out += fmt::format("  {}\n", note);
        }
    }
    out += fmt::format("\n{}: {}, {} (target: {})\n", report.ok() ? "VALID" : "INVALID",
                       plural(report.errors.size(), "error"),
                       plural(report.warnings.size(), "warning"), report.target);
    return out;
}

}  // namespace epo::config
