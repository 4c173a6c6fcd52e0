#include "epo/config/yaml_io.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/depthguard.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "epo/config/recipes.h"
#include "epo/config/tree_walk.h"
#include "epo/core/error.h"

namespace epo::config {
namespace {

constexpr std::size_t kMaxYamlBytes = 16u << 20;

// Well-formed UTF-8 (shortest forms, no surrogates, at most U+10FFFF): strings end up in JSON
// reports and logs, which must stay valid text.
bool valid_utf8(std::string_view text) {
    std::size_t i = 0;
    while (i < text.size()) {
        const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
        const unsigned char lead = byte(i);
        std::size_t length = 0;
        std::uint32_t code = 0;
        if (lead < 0x80) {
            ++i;
            continue;
        } else if ((lead & 0xE0) == 0xC0) {
            length = 2;
            code = lead & 0x1F;
        } else if ((lead & 0xF0) == 0xE0) {
            length = 3;
            code = lead & 0x0F;
        } else if ((lead & 0xF8) == 0xF0) {
            length = 4;
            code = lead & 0x07;
        } else {
            return false;
        }
        if (i + length > text.size()) {
            return false;
        }
        for (std::size_t k = 1; k < length; ++k) {
            if ((byte(i + k) & 0xC0) != 0x80) {
                return false;
            }
            code = (code << 6) | (byte(i + k) & 0x3F);
        }
        constexpr std::uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
        if (code < kMinForLength[length] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
            return false;
        }
        i += length;
    }
    return true;
}

// Reads YAML nodes into typed fields. `key` is the dotted path of the value being read, `mark`
// the position of its key in the source (the user looks at the key).
class Reader {
public:
    explicit Reader(const YamlSource& source) : source_(source) {}

    template <class T>
    void read(const YAML::Node& node, T& out, const std::string& key, const YAML::Mark& mark) {
        if constexpr (IsOptional<T>::value) {
            if (node.IsNull()) {
                out.reset();
                return;
            }
            if (!out.has_value()) {
                out.emplace();  // an absent optional section starts from its defaults
            }
            read(node, *out, key, mark);
        } else {
            if (node.IsNull()) {
                fail(mark, key,
                     fmt::format("null is not allowed here; expected {}", expected<T>()));
            }
            read_value(node, out, key, mark);
        }
    }

    template <Section S>
    void read_section(const YAML::Node& node, S& out, const std::string& prefix) {
        const std::map<std::string, Entry> given = entries<S>(node, prefix);
        S::fields(out, [&](std::string_view name, auto& field, const Limits& = Limits{}) {
            const auto it = given.find(std::string(name));
            if (it != given.end()) {
                read(it->second.value, field, detail::join_key(prefix, name), it->second.mark);
            }
        });
    }

    [[noreturn]] void fail(const YAML::Mark& mark, const std::string& key,
                           const std::string& message) const {
        throw Error(ErrorKind::kUsage, fmt::format("{}{}: {}", where(mark), key, message));
    }

    std::string where(const YAML::Mark& mark) const {
        if (source_.has_positions && mark.line >= 0) {
            return fmt::format("{}:{}:{}: ", source_.name, mark.line + 1, mark.column + 1);
        }
        return source_.name + ": ";
    }

private:
    template <class T>
    static std::string expected() {
        if constexpr (std::is_same_v<T, bool>) {
            return "true or false";
        } else if constexpr (std::is_integral_v<T>) {
            return "an integer";
        } else if constexpr (std::is_floating_point_v<T>) {
            return "a number";
        } else if constexpr (std::is_same_v<T, std::string>) {
            return "a string";
        } else if constexpr (ConfigEnum<T>) {
            return "one of " + enum_choices<T>();
        } else if constexpr (IsVector<T>::value) {
            return "a list";
        } else if constexpr (std::is_same_v<T, MoeLayerFreq>) {
            return "an integer or a list of 0/1 per layer";
        } else if constexpr (std::is_same_v<T, CudaGraphScopeValue>) {
            return "a comma-separated string or a list of module names";
        } else {
            return "a mapping of keys";
        }
    }

    std::string scalar(const YAML::Node& node, const std::string& key, const YAML::Mark& mark,
                       const std::string& wanted) const {
        if (!node.IsScalar()) {
            fail(mark, key,
                 fmt::format("expected {}, got a {}", wanted,
                             node.IsSequence() ? "list" : "mapping"));
        }
        return node.Scalar();
    }

    void read_value(const YAML::Node& node, bool& out, const std::string& key,
                    const YAML::Mark& mark) const {
        const std::string text = scalar(node, key, mark, expected<bool>());
        if (text == "true" || text == "True" || text == "TRUE") {
            out = true;
        } else if (text == "false" || text == "False" || text == "FALSE") {
            out = false;
        } else {
            fail(mark, key, fmt::format("expected true or false, got '{}'", text));
        }
    }

    template <class I>
    requires(std::is_integral_v<I> && !std::is_same_v<I, bool>) void read_value(
        const YAML::Node& node, I& out, const std::string& key, const YAML::Mark& mark) const {
        const std::string text = scalar(node, key, mark, expected<I>());
        const char* begin = text.data() + (!text.empty() && text[0] == '+' ? 1 : 0);
        const char* end = text.data() + text.size();
        I value{};
        const auto [ptr, ec] = std::from_chars(begin, end, value);
        if (ec == std::errc::result_out_of_range) {
            fail(mark, key,
                 fmt::format("{} is out of range for this field (at most {})", text,
                             std::numeric_limits<I>::max()));
        }
        if (ec != std::errc() || ptr != end || begin == end) {
            fail(mark, key, fmt::format("expected an integer, got '{}'", text));
        }
        out = value;
    }

    void read_value(const YAML::Node& node, double& out, const std::string& key,
                    const YAML::Mark& mark) const {
        const std::string text = scalar(node, key, mark, expected<double>());
        const char* begin = text.data() + (!text.empty() && text[0] == '+' ? 1 : 0);
        const char* end = text.data() + text.size();
        double value = 0;
        const auto [ptr, ec] = std::from_chars(begin, end, value);
        if (ec == std::errc::result_out_of_range) {
            fail(mark, key, fmt::format("{} is out of the range of a double", text));
        }
        if (ec != std::errc() || ptr != end || begin == end || !std::isfinite(value)) {
            fail(mark, key, fmt::format("expected a finite number, got '{}'", text));
        }
        out = value;
    }

    void read_value(const YAML::Node& node, std::string& out, const std::string& key,
                    const YAML::Mark& mark) const {
        out = scalar(node, key, mark, expected<std::string>());
        if (!valid_utf8(out)) {
            fail(mark, key, "the value is not valid UTF-8 text");
        }
    }

    template <ConfigEnum E>
    void read_value(const YAML::Node& node, E& out, const std::string& key,
                    const YAML::Mark& mark) const {
        const std::string text = scalar(node, key, mark, expected<E>());
        const auto value = parse_enum<E>(text);
        if (!value) {
            fail(mark, key, fmt::format("'{}' is not one of {}", text, enum_choices<E>()));
        }
        out = *value;
    }

    template <class T>
    void read_value(const YAML::Node& node, std::vector<T>& out, const std::string& key,
                    const YAML::Mark& mark) {
        if (!node.IsSequence()) {
            fail(mark, key, fmt::format("expected a list, got '{}'", describe(node)));
        }
        std::vector<T> values(node.size());
        for (std::size_t i = 0; i < node.size(); ++i) {
            read(node[i], values[i], fmt::format("{}[{}]", key, i), node[i].Mark());
        }
        out = std::move(values);
    }

    template <class... Ts>
    void read_value(const YAML::Node& node, std::variant<Ts...>& out, const std::string& key,
                    const YAML::Mark& mark) {
        // First alternative is the scalar spelling, second the list spelling.
        using Scalar = std::variant_alternative_t<0, std::variant<Ts...>>;
        using List = std::variant_alternative_t<1, std::variant<Ts...>>;
        if (node.IsSequence()) {
            List list;
            read_value(node, list, key, mark);
            out = std::move(list);
        } else {
            Scalar value{};
            read_value(node, value, key, mark);
            out = std::move(value);
        }
    }

    template <Section S>
    void read_value(const YAML::Node& node, S& out, const std::string& key,
                    const YAML::Mark& mark) {
        if (!node.IsMap()) {
            fail(mark, key, fmt::format("expected a mapping of keys, got '{}'", describe(node)));
        }
        read_section(node, out, key);
    }

    struct Entry {
        YAML::Node value;
        YAML::Mark mark;  // of the key
    };

    // The entries of a mapping by key. Every key must be a scalar, appear once, and name a field
    // of S (else an error suggesting the closest known key).
    template <Section S>
    std::map<std::string, Entry> entries(const YAML::Node& node, const std::string& prefix) const {
        static const std::set<std::string, std::less<>> fields = [] {
            std::set<std::string, std::less<>> names;
            const S defaults{};
            S::fields(defaults, [&](std::string_view name, const auto&, const Limits& = Limits{}) {
                names.emplace(name);
            });
            return names;
        }();
        std::map<std::string, Entry> out;
        for (const auto& entry : node) {
            if (!entry.first.IsScalar()) {
                fail(entry.first.Mark(), prefix.empty() ? "(top level)" : prefix,
                     "keys must be plain names");
            }
            const std::string& name = entry.first.Scalar();
            const std::string key = detail::join_key(prefix, name);
            if (!fields.count(name)) {
                // Collected, not thrown: a file with several typos hears of all of them at once.
                unknown_keys_.push_back(where(entry.first.Mark()) + unknown_key_message(key));
                continue;
            }
            if (!out.emplace(name, Entry{entry.second, entry.first.Mark()}).second) {
                fail(entry.first.Mark(), key, "key given twice");
            }
        }
        return out;
    }

    static std::string describe(const YAML::Node& node) {
        if (node.IsScalar()) {
            return node.Scalar();
        }
        return node.IsSequence() ? "a list" : "a mapping";
    }

public:
    // Raises kUsage listing every unknown key the reader met, one per line.
    void throw_unknown_keys() const {
        if (unknown_keys_.empty()) {
            return;
        }
        throw Error(ErrorKind::kUsage,
                    unknown_keys_.size() == 1
                        ? unknown_keys_.front()
                        : fmt::format("{}: {} unknown keys:\n  {}", source_.name,
                                      unknown_keys_.size(), fmt::join(unknown_keys_, "\n  ")));
    }

private:
    const YamlSource& source_;
    mutable std::vector<std::string> unknown_keys_;
};

}  // namespace

YAML::Node parse_yaml(std::string_view text, const YamlSource& source) {
    if (text.size() > kMaxYamlBytes) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("{}: {} bytes is too large for a configuration (limit {} MiB)",
                                source.name, text.size(), kMaxYamlBytes >> 20));
    }
    std::vector<YAML::Node> documents;
    try {
        documents = YAML::LoadAll(std::string(text));
    } catch (const YAML::DeepRecursion& e) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("{}:{}:{}: malformed YAML: nesting too deep", source.name,
                                e.mark.line + 1, e.mark.column + 1));
    } catch (const YAML::ParserException& e) {
        throw Error(ErrorKind::kUsage, fmt::format("{}:{}:{}: malformed YAML: {}", source.name,
                                                   e.mark.line + 1, e.mark.column + 1, e.msg));
    } catch (const YAML::Exception& e) {
        throw Error(ErrorKind::kUsage, fmt::format("{}: malformed YAML: {}", source.name, e.msg));
    }
    if (documents.empty() || (documents.size() == 1 && documents[0].IsNull())) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("{}: the configuration is empty; give at least `recipe: NAME` "
                                "or the sections to set",
                                source.name));
    }
    if (documents.size() > 1) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("{}: holds {} YAML documents; a configuration is one document",
                                source.name, documents.size()));
    }
    if (!documents[0].IsMap()) {
        throw Error(
            ErrorKind::kUsage,
            fmt::format("{}:{}:{}: the top level of a configuration must be a mapping of "
                        "sections (model:, train:, ...)",
                        source.name, documents[0].Mark().line + 1, documents[0].Mark().column + 1));
    }
    return documents[0];
}

void apply_yaml(Config& config, const YAML::Node& root, const YamlSource& source) {
    Reader reader(source);
    const std::optional<std::string> recipe = config.recipe;  // applied by the caller
    reader.read_section(root, config, "");
    reader.throw_unknown_keys();
    config.recipe = recipe;
}

std::optional<std::string> recipe_of(const YAML::Node& root, const YamlSource& source) {
    Config scratch;
    Reader reader(source);
    for (const auto& entry : root) {
        if (entry.first.IsScalar() && entry.first.Scalar() == "recipe") {
            reader.read(entry.second, scratch.recipe, "recipe", entry.first.Mark());
            const auto& names = recipe_names();
            if (scratch.recipe &&
                std::find(names.begin(), names.end(), *scratch.recipe) == names.end()) {
                reader.fail(entry.first.Mark(), "recipe",
                            fmt::format("unknown recipe '{}'; known recipes: {}", *scratch.recipe,
                                        fmt::join(names, ", ")));
            }
        }
    }
    return scratch.recipe;
}

Config config_from_yaml(std::string_view text, const YamlSource& source) {
    const YAML::Node root = parse_yaml(text, source);
    const std::optional<std::string> recipe = recipe_of(root, source);
    Config config = recipe ? make_recipe(*recipe) : Config{};
    apply_yaml(config, root, source);
    return config;
}

std::string read_text_file(const std::filesystem::path& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("{}: is a directory, not a configuration file; give a YAML file "
                                "(e.g. examples/tiny-moe-cpu.yaml)",
                                path.string()));
    }
    if (!std::filesystem::is_regular_file(path, ec)) {
        throw Error(
            ErrorKind::kUsage,
            fmt::format("{}: {}", path.string(),
                        std::filesystem::exists(path, ec) ? "not a regular file" : "no such file"));
    }
    if (std::filesystem::file_size(path, ec) > kMaxYamlBytes) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("{}: too large for a configuration (limit {} MiB)", path.string(),
                                kMaxYamlBytes >> 20));
    }
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in && !in.eof()) {
        throw Error(ErrorKind::kIo, fmt::format("{}: cannot read", path.string()));
    }
    return text.str();
}

namespace {

// Shortest text that reads back to the same double ("0.001", "1e-05", "151936").
std::string format_double(double value) {
    char buffer[32];
    const auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
    return std::string(buffer, ec == std::errc() ? end : buffer);
}

template <class T>
void emit(YAML::Emitter& out, const T& value) {
    if constexpr (Section<T>) {
        out << YAML::BeginMap;
        T::fields(value, [&](std::string_view name, const auto& field, const Limits& = Limits{}) {
            out << YAML::Key << std::string(name) << YAML::Value;
            emit(out, field);
        });
        out << YAML::EndMap;
    } else if constexpr (IsOptional<T>::value) {
        if (value.has_value()) {
            emit(out, *value);
        } else {
            out << YAML::Null;
        }
    } else if constexpr (IsVector<T>::value) {
        out << YAML::Flow << YAML::BeginSeq;
        for (const auto& element : value) {
            emit(out, element);
        }
        out << YAML::EndSeq;
    } else if constexpr (std::is_same_v<T, MoeLayerFreq> ||
                         std::is_same_v<T, CudaGraphScopeValue>) {
        std::visit([&](const auto& alternative) { emit(out, alternative); }, value);
    } else if constexpr (ConfigEnum<T>) {
        out << std::string(enum_name(value));
    } else if constexpr (std::is_same_v<T, double>) {
        out << format_double(value);
    } else {
        out << value;  // bool, integers, std::string (quoted by the emitter when needed)
    }
}

}  // namespace

std::string to_yaml(const Config& config) {
    YAML::Emitter out;
    out.SetNullFormat(YAML::LowerNull);
    out.SetBoolFormat(YAML::TrueFalseBool);
    emit(out, config);
    EPO_CHECK(out.good(), "YAML emitter failed: {}", out.GetLastError());
    return std::string(out.c_str()) + "\n";
}

void save_yaml(const Config& config, const std::filesystem::path& path) {
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    file << to_yaml(config);
    file.close();
    if (!file) {
        throw Error(ErrorKind::kIo,
                    fmt::format("{}: cannot write the configuration", path.string()));
    }
}

}  // namespace epo::config
