// Dotted overrides from the command line: `model.num_moe_experts=64`, `a.b=null`,
// `model.recompute_modules=[moe,mlp]`, `comm_overlap=null` (drops the section).
//
// The value is read as YAML and then exactly like a value in a config file, so the same types,
// nulls and error messages apply (an unknown key suggests the closest known one; a wrong type
// names the key, the value and the expected type). Setting a key under an absent optional
// section (comm_overlap.*) creates the section with its defaults first.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "epo/config/config.h"

namespace epo::config {

struct Override {
    std::string key;    // dotted, e.g. "model.hidden_size"
    std::string value;  // YAML text, e.g. "1024", "null", "[moe, mlp]"
};

// True when `arg` has the shape KEY=VALUE with a dotted-identifier key (how the command line
// tells overrides from a config file path).
bool looks_like_override(std::string_view arg);

// Splits "KEY=VALUE"; raises kUsage when the shape is wrong or the value is empty.
Override parse_override(std::string_view arg);

void apply_override(Config& config, const Override& override_);
// Applies "KEY=VALUE" arguments in order (later ones win).
void apply_overrides(Config& config, std::span<const std::string> args);
// The same for parsed overrides. Both try every override and report every bad one at once.
void apply_overrides(Config& config, std::span<const Override> overrides);

}  // namespace epo::config
