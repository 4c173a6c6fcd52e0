#include "epo/config/env.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "epo/core/error.h"

namespace epo::config {
namespace {

// Reads a decimal number at `pos`; false when there is none.
bool read_number(std::string_view text, std::size_t& pos, int& out) {
    const char* begin = text.data() + pos;
    const auto [ptr, ec] = std::from_chars(begin, text.data() + text.size(), out);
    if (ec != std::errc() || ptr == begin) {
        return false;
    }
    pos = static_cast<std::size_t>(ptr - text.data());
    return true;
}

bool consume(std::string_view text, std::size_t& pos, std::string_view word) {
    if (text.substr(pos, word.size()) == word) {
        pos += word.size();
        return true;
    }
    return false;
}

}  // namespace

int Version::compare(const Version& other) const {
    const std::size_t n = std::max(release.size(), other.release.size());
    for (std::size_t i = 0; i < n; ++i) {
        const int a = i < release.size() ? release[i] : 0;
        const int b = i < other.release.size() ? other.release[i] : 0;
        if (a != b) {
            return a < b ? -1 : 1;
        }
    }
    if (phase != other.phase) {
        return phase < other.phase ? -1 : 1;
    }
    if (phase_number != other.phase_number) {
        return phase_number < other.phase_number ? -1 : 1;
    }
    if (dev != other.dev) {
        return dev ? -1 : 1;
    }
    return 0;
}

std::optional<Version> parse_version(std::string_view text) {
    if (const auto plus = text.find('+'); plus != std::string_view::npos) {
        text = text.substr(0, plus);  // local version label: not part of the ordering
    }
    if (!text.empty() && (text[0] == 'v' || text[0] == 'V')) {
        text.remove_prefix(1);
    }
    Version v;
    std::size_t pos = 0;
    int number = 0;
    if (!read_number(text, pos, number)) {
        return std::nullopt;
    }
    v.release.push_back(number);
    while (pos + 1 < text.size() && text[pos] == '.' &&
           std::isdigit(static_cast<unsigned char>(text[pos + 1]))) {
        ++pos;
        read_number(text, pos, number);
        v.release.push_back(number);
    }
    consume(text, pos, ".");
    if (consume(text, pos, "rc") || consume(text, pos, "c")) {
        v.phase = 3;
    } else if (consume(text, pos, "alpha") || consume(text, pos, "a")) {
        v.phase = 1;
    } else if (consume(text, pos, "beta") || consume(text, pos, "b")) {
        v.phase = 2;
    } else if (consume(text, pos, "post")) {
        v.phase = 5;
    }
    if (v.phase != 4 && !read_number(text, pos, v.phase_number)) {
        v.phase_number = 0;
    }
    consume(text, pos, ".");
    if (consume(text, pos, "dev")) {
        v.dev = true;
        int ignored = 0;
        read_number(text, pos, ignored);
        if (v.phase == 4) {
            v.phase = 0;  // X.devN sorts before X.a0
            v.dev = false;
        }
    }
    if (pos != text.size()) {
        return std::nullopt;
    }
    return v;
}

bool version_at_least(std::string_view version, std::string_view minimum) {
    const auto have = parse_version(version);
    const auto need = parse_version(minimum);
    EPO_CHECK(need.has_value(), "minimum version '{}' does not parse", minimum);
    return have.has_value() && have->compare(*need) >= 0;
}

Target describe_target(const EnvConfig& env) {
    Target t;
    t.has_torch = env.torch_version.has_value();
    t.has_te = env.te_version.has_value();
    t.declared_stack = t.has_torch || t.has_te;
    if (!t.declared_stack) {
        t.description = "epo runtime";
        return t;
    }
    std::string stack;
    if (t.has_torch) {
        stack = "torch " + *env.torch_version;
    }
    if (t.has_te) {
        stack += (stack.empty() ? "TE " : " / TE ") + *env.te_version;
    }
    t.description = fmt::format("{} on {}", stack, env.gpu);
    return t;
}

}  // namespace epo::config
