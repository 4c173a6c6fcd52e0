// Devices and the flex-dispatcher activation step (docs/config.md "Flex dispatcher activation").
//
// The device a config targets is env.gpu: a short id (h100, gb200, cpu, ...) or a full device
// name as the driver reports it ("NVIDIA H100 80GB HBM3", matched by family prefix). The
// "device probe" resolves it to a DeviceInfo; it is passed around as a callable so tests can
// substitute any device (a future major-11 part, a failing probe) and count how often it runs.
//
// Gating (the reference's, kept exactly): deepep runs on compute-capability major 8 or 9 or on a
// device named "NVIDIA B200..." / "NVIDIA B300..." (so GB200, major 10, is not supported);
// hybridep runs on majors 8, 9 and 10. On `cpu` both run (our CPU implementations).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "epo/config/config.h"
#include "epo/config/finding.h"

namespace epo::config {

struct DeviceInfo {
    std::string id;    // "h100"; for a substituted device whatever the test says
    std::string name;  // "NVIDIA H100"
    int major = 0;     // compute capability
    int minor = 0;
    bool is_cpu = false;
};

// The device table: every id accepted in env.gpu, with its canonical name and capability.
const std::vector<DeviceInfo>& known_devices();
std::string known_device_list();  // "p100, v100, ..., cpu" for messages

// By id (case-insensitive) or by full name (case-insensitive family prefix: "NVIDIA A100-SXM4"
// is an A100, "NVIDIA A10" an A10).
std::optional<DeviceInfo> find_device(std::string_view id_or_name);

using DeviceProbe = std::function<DeviceInfo()>;

// The probe for env.gpu: looks the name up in the table; an unknown name raises
// ErrorKind::kConfig listing the known devices.
DeviceProbe table_probe(std::string gpu);

bool flex_backend_supported(FlexBackend backend, const DeviceInfo& device);
std::string flex_backend_families(FlexBackend backend);  // "Ampere, Hopper, B200 and B300"

struct FlexActivation {
    bool activated = false;
    std::vector<Finding> warnings;  // W006 no experts, W007 device fallback, W008 unknown backend
};

// The activation step (the reference's apply_flex_dispatcher_backend), in its order:
//   1. no experts (null or 0): warning, nothing changes (the device is not probed);
//   2. probe the device, exactly once (a probe failure propagates);
//   3. a backend name other than deepep/hybridep: warning, nothing changes;
//   4. unsupported device: warning, fall back to alltoall with no backend
//      (moe_shared_expert_overlap is left as it was);
//   5. otherwise: dispatcher flex, the backend set, moe_shared_expert_overlap = false.
FlexActivation apply_flex_dispatcher_backend(ModelConfig& model, std::string_view backend,
                                             const DeviceProbe& probe);

// Validation of an already-built config (FX001 deepep / FX002 hybridep on an unsupported
// device). Probes only when the dispatcher is flex and a backend is set; a probe failure
// propagates.
std::optional<Finding> check_flex_backend(const ModelConfig& model, const DeviceProbe& probe);

}  // namespace epo::config
