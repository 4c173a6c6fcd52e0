#include "epo/config/json_io.h"

#include <string>
#include <variant>

namespace epo::config {
namespace {

using Json = nlohmann::ordered_json;

template <class T>
Json encode(const T& value);

template <class... Ts>
Json encode_variant(const std::variant<Ts...>& value) {
    return std::visit([](const auto& alternative) { return encode(alternative); }, value);
}

template <class T>
Json encode(const T& value) {
    if constexpr (Section<T>) {
        Json object = Json::object();
        T::fields(value, [&](std::string_view name, const auto& field, const Limits& = Limits{}) {
            object[std::string(name)] = encode(field);
        });
        return object;
    } else if constexpr (IsOptional<T>::value) {
        return value.has_value() ? encode(*value) : Json(nullptr);
    } else if constexpr (IsVector<T>::value) {
        Json array = Json::array();
        for (const auto& element : value) {
            array.push_back(encode(element));
        }
        return array;
    } else if constexpr (ConfigEnum<T>) {
        return std::string(enum_name(value));
    } else if constexpr (std::is_same_v<T, MoeLayerFreq> ||
                         std::is_same_v<T, CudaGraphScopeValue>) {
        return encode_variant(value);
    } else {
        return Json(value);  // bool, integers, double, std::string
    }
}

}  // namespace

nlohmann::ordered_json to_json(const Config& config) {
    return encode(config);
}

}  // namespace epo::config
