// Helpers for training tests: a finalized, runtime-valid configuration from a recipe and
// overrides.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "epo/config/builder.h"
#include "epo/config/validate.h"

namespace epo::testing {

inline config::Config run_config(const std::string& recipe, std::vector<std::string> overrides) {
    config::ConfigSources sources;
    sources.model = recipe;
    sources.overrides = std::move(overrides);
    const config::ValidationReport report =
        config::validate_for_run(config::build_config(sources).config);
    for (const auto& e : report.errors)
        ADD_FAILURE() << e.id << " " << e.message;
    return report.config;
}

}  // namespace epo::testing
