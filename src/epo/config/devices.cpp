#include "epo/config/devices.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "epo/core/error.h"

namespace epo::config {
namespace {

struct DeviceEntry {
    DeviceInfo info;
    std::vector<std::string> name_prefixes;  // canonical name first, then other spellings
};

const std::vector<DeviceEntry>& device_entries() {
    static const std::vector<DeviceEntry> entries = {
        {{"p100", "Tesla P100", 6, 0}, {"Tesla P100", "NVIDIA P100", "NVIDIA Tesla P100"}},
        {{"v100", "Tesla V100", 7, 0}, {"Tesla V100", "NVIDIA V100", "NVIDIA Tesla V100"}},
        {{"t4", "Tesla T4", 7, 5}, {"Tesla T4", "NVIDIA T4", "NVIDIA Tesla T4"}},
        {{"a100", "NVIDIA A100", 8, 0}, {"NVIDIA A100"}},
        {{"a10", "NVIDIA A10", 8, 6}, {"NVIDIA A10"}},
        {{"a40", "NVIDIA A40", 8, 6}, {"NVIDIA A40"}},
        {{"l40s", "NVIDIA L40S", 8, 9}, {"NVIDIA L40S"}},
        {{"h100", "NVIDIA H100", 9, 0}, {"NVIDIA H100"}},
        {{"h800", "NVIDIA H800", 9, 0}, {"NVIDIA H800"}},
        {{"h200", "NVIDIA H200", 9, 0}, {"NVIDIA H200"}},
        {{"h20", "NVIDIA H20", 9, 0}, {"NVIDIA H20"}},
        {{"b200", "NVIDIA B200", 10, 0}, {"NVIDIA B200"}},
        {{"gb200", "NVIDIA GB200", 10, 0}, {"NVIDIA GB200"}},
        {{"b300", "NVIDIA B300", 10, 3}, {"NVIDIA B300"}},
        {{"gb300", "NVIDIA GB300", 10, 3}, {"NVIDIA GB300"}},
        {{"rtx5090", "NVIDIA GeForce RTX 5090", 12, 0}, {"NVIDIA GeForce RTX 5090"}},
        {{"cpu", "cpu", 0, 0, true}, {}},
    };
    return entries;
}

std::string lower(std::string_view text) {
    std::string out(text);
    std::transform(out.begin(), out.end(), out.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    return out;
}

// `name` starts with `prefix` and the family ends there ("NVIDIA A100-SXM4" matches
// "NVIDIA A100" but not "NVIDIA A10").
bool family_prefix(std::string_view name, std::string_view prefix) {
    if (name.size() < prefix.size() || lower(name.substr(0, prefix.size())) != lower(prefix)) {
        return false;
    }
    if (name.size() == prefix.size()) {
        return true;
    }
    const char next = name[prefix.size()];
    return next == ' ' || next == '-' || next == '_';
}

Finding warning(std::string id, std::string message, std::string fix = {}) {
    return Finding{std::move(id), "model.moe_flex_dispatcher_backend", "", std::move(message),
                   std::move(fix)};
}

}  // namespace

const std::vector<DeviceInfo>& known_devices() {
    static const std::vector<DeviceInfo> devices = [] {
        std::vector<DeviceInfo> out;
        for (const auto& entry : device_entries()) {
            out.push_back(entry.info);
        }
        return out;
    }();
    return devices;
}

std::string known_device_list() {
    std::string out;
    for (const auto& device : known_devices()) {
        out += (out.empty() ? "" : ", ") + device.id;
    }
    return out + " (or a full device name such as \"NVIDIA H100 80GB HBM3\")";
}

std::optional<DeviceInfo> find_device(std::string_view id_or_name) {
    const std::string key = lower(id_or_name);
    for (const auto& entry : device_entries()) {
        if (entry.info.id == key) {
            return entry.info;
        }
    }
    const DeviceEntry* best = nullptr;
    const std::string* best_prefix = nullptr;
    for (const auto& entry : device_entries()) {
        for (const auto& prefix : entry.name_prefixes) {
            if ((best_prefix == nullptr || prefix.size() > best_prefix->size()) &&
                family_prefix(id_or_name, prefix)) {
                best = &entry;
                best_prefix = &prefix;
            }
        }
    }
    if (best == nullptr) {
        return std::nullopt;
    }
    // The full name the user gave, with the family spelled as the driver spells it.
    DeviceInfo info = best->info;
    info.name = *best_prefix + std::string(id_or_name.substr(best_prefix->size()));
    return info;
}

DeviceProbe table_probe(std::string gpu) {
    return [gpu = std::move(gpu)]() -> DeviceInfo {
        if (auto device = find_device(gpu)) {
            return *device;
        }
        throw Error(ErrorKind::kConfig,
                    fmt::format("env.gpu = '{}' names no known device; known devices: {}", gpu,
                                known_device_list()));
    };
}

bool flex_backend_supported(FlexBackend backend, const DeviceInfo& device) {
    if (device.is_cpu) {
        return true;
    }
    switch (backend) {
        case FlexBackend::kDeepep:
            return device.major == 8 || device.major == 9 ||
                   device.name.rfind("NVIDIA B200", 0) == 0 ||
                   device.name.rfind("NVIDIA B300", 0) == 0;
        case FlexBackend::kHybridep:
            return device.major == 8 || device.major == 9 || device.major == 10;
    }
    return false;
}

std::string flex_backend_families(FlexBackend backend) {
    return backend == FlexBackend::kDeepep
               ? "Ampere and Hopper (compute capability 8.x, 9.x), B200 and B300, or cpu"
               : "Ampere, Hopper and Blackwell data-center parts (compute capability 8.x, 9.x, "
                 "10.x: B200, GB200, B300, GB300), or cpu";
}

FlexActivation apply_flex_dispatcher_backend(ModelConfig& model, std::string_view backend,
                                             const DeviceProbe& probe) {
    FlexActivation out;
    if (!is_moe(model)) {
        out.warnings.push_back(warning(
            "W006",
            fmt::format("flex dispatcher backend '{}' not applied: the model has no experts "
                        "(model.num_moe_experts is null or 0); nothing changed",
                        backend)));
        return out;
    }
    const DeviceInfo device = probe();  // exactly once, before the backend name is looked at
    const auto parsed = parse_enum<FlexBackend>(backend);
    if (!parsed) {
        out.warnings.push_back(warning(
            "W008",
            fmt::format("'{}' is not a flex dispatcher backend (deepep or hybridep); nothing "
                        "changed",
                        backend),
            "use deepep or hybridep"));
        return out;
    }
    if (!flex_backend_supported(*parsed, device)) {
        out.warnings.push_back(warning(
            "W007",
            fmt::format("{} is not supported on {} (compute capability {}.{}): falling back to "
                        "the alltoall dispatcher; {} runs on {}",
                        backend, device.name, device.major, device.minor, backend,
                        flex_backend_families(*parsed)),
            "run on a supported device, or use the alltoall dispatcher"));
        model.moe_token_dispatcher_type = DispatcherType::kAlltoall;
        model.moe_flex_dispatcher_backend.reset();
        return out;
    }
    model.moe_token_dispatcher_type = DispatcherType::kFlex;
    model.moe_flex_dispatcher_backend = *parsed;
    model.moe_shared_expert_overlap = false;
    out.activated = true;
    return out;
}

std::optional<Finding> check_flex_backend(const ModelConfig& model, const DeviceProbe& probe) {
    if (model.moe_token_dispatcher_type != DispatcherType::kFlex ||
        !model.moe_flex_dispatcher_backend) {
        return std::nullopt;  // not flex, or flex without a backend (falls back to alltoall)
    }
    const FlexBackend backend = *model.moe_flex_dispatcher_backend;
    const DeviceInfo device = probe();
    if (flex_backend_supported(backend, device)) {
        return std::nullopt;
    }
    return Finding{backend == FlexBackend::kDeepep ? "FX001" : "FX002",
                   "model.moe_flex_dispatcher_backend", std::string(enum_name(backend)),
                   fmt::format("the {} flex dispatcher does not run on {} (compute capability "
                               "{}.{}); it runs on {}",
                               enum_name(backend), device.name, device.major, device.minor,
                               flex_backend_families(backend)),
                   "target a supported device (env.gpu), or use "
                   "model.moe_token_dispatcher_type=alltoall"};
}

}  // namespace epo::config
