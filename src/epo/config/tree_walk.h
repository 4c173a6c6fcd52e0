// Generic walks over the configuration tree, driven by each section's `fields` list.
//
// for_each_leaf(section, f) calls f(dotted_path, field, limits) for every leaf field (anything
// that is not a section), depth first in field order. Sections held in std::optional are walked
// only when present. The walk is the same for const and non-const trees.
// for_each_same_named(dst, src, f) pairs the fields of two sections by name.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

#include "epo/config/field_types.h"

namespace epo::config {

namespace detail {

inline std::string join_key(std::string_view prefix, std::string_view name) {
    std::string key;
    key.reserve(prefix.size() + 1 + name.size());
    if (!prefix.empty()) {
        key.append(prefix);
        key.push_back('.');
    }
    key.append(name);
    return key;
}

template <class T>
struct IsOptionalSection : std::false_type {};
template <Section S>
struct IsOptionalSection<std::optional<S>> : std::true_type {};

}  // namespace detail

template <class S, class F>
requires Section<std::remove_const_t<S>>
void for_each_leaf(S& section, F&& f, std::string_view prefix = {}) {
    std::remove_const_t<S>::fields(
        section, [&](std::string_view name, auto& field, const Limits& limits = Limits{}) {
            using T = std::remove_const_t<std::remove_reference_t<decltype(field)>>;
            const std::string key = detail::join_key(prefix, name);
            if constexpr (Section<T>) {
                for_each_leaf(field, f, key);
            } else if constexpr (detail::IsOptionalSection<T>::value) {
                if (field.has_value()) {
                    for_each_leaf(*field, f, key);
                }
            } else {
                f(std::string_view(key), field, limits);
            }
        });
}

// Calls f(dst_field, src_field, name) for every field of `dst` that has a field of the same name
// in `src` (the reference's "apply to every field of the same name"). f is instantiated for every
// pair of field types and must compile for all of them; it runs only for matching names.
template <Section D, Section S, class F>
void for_each_same_named(D& dst, const S& src, F&& f) {
    D::fields(dst, [&](std::string_view name, auto& dst_field, const Limits& = Limits{}) {
        S::fields(src,
                  [&](std::string_view src_name, const auto& src_field, const Limits& = Limits{}) {
                      if (src_name == name) {
                          f(dst_field, src_field, name);
                      }
                  });
    });
}

}  // namespace epo::config
