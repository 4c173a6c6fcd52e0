// The stack a configuration is validated for (docs/config.md "Targets"), and version comparison.
//
// With env.torch_version or env.te_version set, the config targets that declared PyTorch /
// Transformer Engine stack and the reference's version rules apply (EP005: torch >= 2.6.0;
// WG002-WG004: TE >= 2.7.0 / 2.12.0). With neither, it targets our own runtime: EP005 becomes
// the MPI thread-level check at start-up and WG002-WG004 carry no version condition.
//
// Versions compare like Python's packaging.Version, which the reference uses: release numbers
// first, then dev < a < b < rc < final < post; a local suffix (+cu121, +git...) is ignored.
// So an NGC "2.6.0a0+ecf3bae" counts as earlier than 2.6.0, as it does for the reference.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "epo/config/sections.h"

namespace epo::config {

struct Version {
    std::vector<int> release;  // 2.6.0 -> {2, 6, 0}
    int phase = 4;             // 0 dev-only, 1 a, 2 b, 3 rc, 4 final, 5 post
    int phase_number = 0;      // the N of aN / bN / rcN / postN
    bool dev = false;          // a .devN suffix on top of the phase

    int compare(const Version& other) const;  // <0, 0, >0
};

std::optional<Version> parse_version(std::string_view text);

// True when `version` parses and is >= `minimum` (which must parse).
bool version_at_least(std::string_view version, std::string_view minimum);

struct Target {
    bool declared_stack = false;  // env names a torch/TE stack
    bool has_torch = false;
    bool has_te = false;
    std::string description;  // "epo runtime" or "torch 2.7.1 / TE 2.8.0 on h100"
};

Target describe_target(const EnvConfig& env);

}  // namespace epo::config
