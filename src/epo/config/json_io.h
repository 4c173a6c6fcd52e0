// The configuration tree as JSON (for `epo validate --json`, reports and run metadata): every
// field, in field order, null for unset optionals and for an absent comm_overlap section.
#pragma once

#include <nlohmann/json.hpp>

#include "epo/config/config.h"

namespace epo::config {

nlohmann::ordered_json to_json(const Config& config);

}  // namespace epo::config
