// One result of checking a configuration: a violated rule (an error) or a warning. The id is
// part of the public interface (tests and users match on it); docs/config.md and the README's
// rule reference list every id with its meaning and fix.
#pragma once

#include <string>

namespace epo::config {

struct Finding {
    std::string id;       // "EP001", "WG005", "LY004", "RT016", "W010", ...
    std::string field;    // the dotted key at fault ("" when no single key is)
    std::string value;    // that key's value as text
    std::string message;  // what is wrong, for the user
    std::string fix;      // what to change ("" when nothing needs changing)

    bool operator==(const Finding&) const = default;
};

}  // namespace epo::config
