// The outcome of validating a configuration, and how it is shown: as text (what `epo validate`
// prints, and what a run logs at start-up: docs/config.md "What a run logs") and as JSON
// (`epo validate --json`).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "epo/config/config.h"
#include "epo/config/finding.h"

namespace epo::config {

struct ValidationReport {
    std::string target;  // "epo runtime", or the declared stack ("torch 2.7.1 / TE 2.8.0 on h100")
    std::vector<Finding> errors;     // every violated rule, all at once
    std::vector<Finding> warnings;   // W..., and RT... while they are not promoted to errors
    std::vector<std::string> notes;  // checks deferred to start-up, and similar remarks
    Config config;                   // the finalized configuration

    bool ok() const { return errors.empty(); }
};

// {"ok", "target", "errors": [{id, field, value, message, fix}], "warnings": [{id, message,
// fix}], "notes", "config"}.
nlohmann::ordered_json report_to_json(const ValidationReport& report);

// The start-up log of a run (docs/config.md "What a run logs"): a line saying finalization raised
// no error (or how many errors), then every field of the finalized configuration as YAML, greppable
// for `overlap_moe_expert_parallel_comm: true` or `moe_token_dispatcher_type: flex`.
std::string format_run_log(const ValidationReport& report);

// Errors and warnings with their ids, fields, values and fixes, then a one-line verdict.
std::string format_findings(const ValidationReport& report);

}  // namespace epo::config
