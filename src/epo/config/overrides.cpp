#include "epo/config/overrides.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <vector>

#include "epo/config/yaml_io.h"
#include "epo/core/error.h"

namespace epo::config {
namespace {

bool is_key_segment(std::string_view segment) {
    if (segment.empty()) {
        return false;
    }
    for (char ch : segment) {
        if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_')) {
            return false;
        }
    }
    return true;
}

std::vector<std::string> split_key(std::string_view key) {
    std::vector<std::string> segments;
    std::string_view::size_type start = 0;
    while (true) {
        const auto dot = key.find('.', start);
        segments.emplace_back(key.substr(start, dot - start));
        if (dot == std::string_view::npos) {
            return segments;
        }
        start = dot + 1;
    }
}

// {segments[i]: {segments[i+1]: ... value}}. Built inside out by recursion: yaml-cpp's Node
// assignment rebinds shared nodes, so no node variable is reassigned here.
YAML::Node nest(const std::vector<std::string>& segments, std::size_t i, const YAML::Node& value) {
    YAML::Node map(YAML::NodeType::Map);
    map[segments[i]] = i + 1 == segments.size() ? value : nest(segments, i + 1, value);
    return map;
}

}  // namespace

bool looks_like_override(std::string_view arg) {
    const auto eq = arg.find('=');
    if (eq == std::string_view::npos || eq == 0) {
        return false;
    }
    for (const auto& segment : split_key(arg.substr(0, eq))) {
        if (!is_key_segment(segment)) {
            return false;
        }
    }
    return true;
}

Override parse_override(std::string_view arg) {
    if (!looks_like_override(arg)) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("'{}' is not an override: write KEY=VALUE with a dotted key, for "
                                "example model.num_moe_experts=64",
                                arg));
    }
    const auto eq = arg.find('=');
    Override out{std::string(arg.substr(0, eq)), std::string(arg.substr(eq + 1))};
    if (out.value.empty()) {
        throw Error(
            ErrorKind::kUsage,
            fmt::format("override '{}' has no value; write {}=null to clear it", arg, out.key));
    }
    return out;
}

void apply_override(Config& config, const Override& override_) {
    const YamlSource source{fmt::format("override '{}={}'", override_.key, override_.value),
                            /*has_positions=*/false};
    if (override_.key == "recipe") {
        throw Error(ErrorKind::kUsage,
                    source.name +
                        ": the recipe is the base of a config; choose it with --model "
                        "NAME or `recipe:` in the YAML file");
    }
    const YAML::Node value = [&] {
        try {
            return YAML::Load(override_.value);
        } catch (const YAML::Exception& e) {
            throw Error(ErrorKind::kUsage,
                        fmt::format("{}: cannot read the value ({}); quote it if it is a string",
                                    source.name, e.msg));
        }
    }();
    // {a: {b: value}} for "a.b=value": applied exactly like a config file.
    apply_yaml(config, nest(split_key(override_.key), 0, value), source);
}

namespace {

// Runs `apply` on every item, so that a command line with several bad overrides hears of all of
// them at once (it heard of the first only); one problem keeps its own message.
template <class Item, class Apply>
void apply_all(std::span<const Item> items, Apply&& apply) {
    std::vector<Error> problems;
    for (const Item& item : items) {
        try {
            apply(item);
        } catch (const Error& e) {
            if (e.kind() != ErrorKind::kUsage && e.kind() != ErrorKind::kConfig)
                throw;
            problems.push_back(e);
        }
    }
    if (problems.size() == 1)
        throw problems.front();
    if (!problems.empty()) {
        std::string text = fmt::format("{} of the overrides cannot be applied:", problems.size());
        for (const Error& e : problems)
            text += fmt::format("\n  {}", e.what());
        throw Error(ErrorKind::kUsage, text);
    }
}

}  // namespace

void apply_overrides(Config& config, std::span<const std::string> args) {
    apply_all(args, [&](const std::string& arg) { apply_override(config, parse_override(arg)); });
}

void apply_overrides(Config& config, std::span<const Override> overrides) {
    apply_all(overrides, [&](const Override& o) { apply_override(config, o); });
}

}  // namespace epo::config
