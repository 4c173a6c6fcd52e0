// YAML in and out for the configuration tree.
//
// Reading is typed and strict: every key must be a known field (an unknown key is an error that
// suggests the closest known one), every value must have the field's type (bool: true/false;
// integers: decimal, range-checked; numbers: finite; enums: one of their spellings; null only
// where the field is nullable). Keys absent from the YAML keep the value they had, so a file
// layers onto a recipe; an explicit `null` sets a nullable field to null, which is how "not
// given" and "null" stay distinct from false. Every error is an epo::Error of kind kUsage whose
// message starts with "<source>:<line>:<column>:" and names the dotted key.
//
// Writing emits every field in field order, enums and numbers plain (so a log can be grepped
// for `moe_token_dispatcher_type: flex`), numbers in shortest round-trip form; the output loads
// back to an identical tree.
#pragma once

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <string>
#include <string_view>

#include "epo/config/config.h"

namespace epo::config {

// Where values come from, for error messages: a file name, or "override 'k=v'" (no positions).
struct YamlSource {
    std::string name;
    bool has_positions = true;
};

// Parses YAML text (one document whose top level is a mapping). Malformed YAML, an empty
// document, several documents, or input past 16 MiB raise kUsage with line and column.
YAML::Node parse_yaml(std::string_view text, const YamlSource& source);

// Applies a mapping onto `config`: each key present overrides, absent keys keep their values.
// The `recipe` key is read but not applied here (config_from_yaml / the builder apply it).
void apply_yaml(Config& config, const YAML::Node& root, const YamlSource& source);

// The recipe a parsed document names with `recipe: NAME`, if any (type-checked).
std::optional<std::string> recipe_of(const YAML::Node& root, const YamlSource& source);

// A whole config from YAML text: the named recipe (if any), then every key of the text.
Config config_from_yaml(std::string_view text, const YamlSource& source);

// The text of a configuration file: kUsage when it does not exist or is over 16 MiB, kIo when it
// cannot be read.
std::string read_text_file(const std::filesystem::path& path);

std::string to_yaml(const Config& config);
// Writes to_yaml(config) to `path` (kIo on failure), e.g. the run directory's config.yaml.
void save_yaml(const Config& config, const std::filesystem::path& path);

}  // namespace epo::config
