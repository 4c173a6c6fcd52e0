#include "epo/plan/hardware.h"

#include <fmt/format.h>

#include <cmath>

#include "epo/config/devices.h"
#include "epo/core/error.h"

namespace epo::plan {
namespace {

// NVLink per GPU, one direction, in Gbit/s: NVLink 4 (Hopper) 900 GB/s both directions = 450
// GB/s each = 3600 Gbit/s; NVLink 5 (Blackwell) 1.8 TB/s both = 900 GB/s each = 7200 Gbit/s.
constexpr double kNvlink4Gbps = 3600;
constexpr double kNvlink5Gbps = 7200;
// One ConnectX-7 NIC per GPU (DGX H100, H200, B200 and GB200 reference systems).
constexpr double kConnectX7Gbps = 400;
// Per collective: NCCL's small-message all-to-all latency is of order 10 us (nccl-tests on a
// two-node HGX system); an assumption, not a datasheet figure.
constexpr double kGpuLatencyUs = 10;

}  // namespace

const std::vector<DeviceSpec>& plan_devices() {
    static const std::vector<DeviceSpec> devices = {
        {"h100", 989, 3.35, 80, 0.5, true, 132,
         "NVIDIA H100 SXM5 datasheet: BF16 1979 TFLOP/s with sparsity (989 dense), 80 GB "
         "HBM3 at 3.35 TB/s, 132 SMs; FP8 3958 with sparsity (1979 dense)",
         1979},
        {"h200", 989, 4.8, 141, 0.5, true, 132,
         "NVIDIA H200 SXM datasheet: BF16 1979 TFLOP/s with sparsity (989 dense), 141 GB "
         "HBM3e at 4.8 TB/s, 132 SMs; FP8 3958 with sparsity (1979 dense)",
         1979},
        {"b200", 2250, 8.0, 180, 0.5, true, 148,
         "NVIDIA HGX B200 datasheet: BF16 4.5 PFLOP/s per GPU with sparsity (2.25 dense), 180 "
         "GB HBM3e at 8 TB/s, 148 SMs; FP8 9 PFLOP/s with sparsity (4.5 dense)",
         4500},
        {"gb200", 2500, 8.0, 186, 0.5, true, 148,
         "NVIDIA GB200 NVL72 datasheet: BF16 360 PFLOP/s per 72 GPUs with sparsity (2.5 dense "
         "per GPU), 13.4 TB HBM3e at 576 TB/s per 72 GPUs (186 GB, 8 TB/s each), 148 SMs; FP8 "
         "720 PFLOP/s per 72 GPUs with sparsity (5 dense per GPU)",
         5000},
        {"cpu", 0.7, 0.02, 24, 1.0, false, 0,
         "this machine, one rank per core: placeholders (0.7 TFLOP/s bf16, 20 GB/s) until "
         "`epo plan --calibrate kernels` measures them"},
    };
    return devices;
}

std::string plan_device_list() {
    std::string out;
    for (const DeviceSpec& d : plan_devices())
        out += (out.empty() ? "" : ", ") + d.id;
    return out;
}

std::optional<DeviceSpec> find_plan_device(std::string_view env_gpu) {
    const std::optional<config::DeviceInfo> info = config::find_device(env_gpu);
    const std::string id = info ? info->id : std::string(env_gpu);
    for (const DeviceSpec& d : plan_devices()) {
        if (d.id == id)
            return d;
    }
    return std::nullopt;
}

NetworkSpec default_network(const DeviceSpec& device) {
    if (device.id == "h100" || device.id == "h200") {
        return {kNvlink4Gbps, kConnectX7Gbps, kGpuLatencyUs,
                "NVLink 4: 900 GB/s per GPU both directions (H100/H200 datasheets); one 400 "
                "Gbit/s ConnectX-7 NIC per GPU (DGX H100/H200 datasheets)"};
    }
    if (device.id == "b200" || device.id == "gb200") {
        return {kNvlink5Gbps, kConnectX7Gbps, kGpuLatencyUs,
                "NVLink 5: 1.8 TB/s per GPU both directions (B200/GB200 datasheets); one 400 "
                "Gbit/s ConnectX-7 NIC per GPU (DGX B200/GB200 datasheets)"};
    }
    // cpu: MPI through shared memory, order of magnitude; --comm_compute_ratio or comm.link.*
    // model a cluster instead.
    return {40, 40, 0, "cpu: shared-memory MPI, order of magnitude (40 Gbit/s)"};
}

Hardware resolve_hardware(std::string_view env_gpu, const HardwareOverrides& o) {
    const std::optional<DeviceSpec> device = find_plan_device(env_gpu);
    if (!device) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("env.gpu = '{}': epo plan has no performance figures for it; set "
                                "env.gpu to one of {} (e.g. env.gpu=h100), or to the nearest "
                                "one with --peak_bf16_tflops and --memory_tbps",
                                env_gpu, plan_device_list()));
    }
    Hardware hw{*device, default_network(*device)};
    const auto set = [](const std::optional<double>& given, double& field) {
        if (given)
            field = *given;
    };
    set(o.peak_bf16_tflops, hw.device.peak_bf16_tflops);
    set(o.memory_tbps, hw.device.memory_tbps);
    set(o.memory_gb, hw.device.memory_gb);
    set(o.intra_node_gbps, hw.network.intra_node_gbps);
    set(o.inter_node_gbps, hw.network.inter_node_gbps);
    set(o.latency_us, hw.network.latency_us);
    if (o.intra_node_gbps || o.inter_node_gbps || o.latency_us)
        hw.network.source = "given on the command line (other figures: " + hw.network.source + ")";
    validate_hardware(hw);
    return hw;
}

void validate_hardware(const Hardware& hw) {
    const struct {
        const char* flag;
        double value;
        double max;
        const char* example;
    } fields[] = {
        {"--peak_bf16_tflops", hw.device.peak_bf16_tflops, 1e6,
         "the device's dense bf16 TFLOP/s, e.g. 989 for an H100"},
        {"--memory_tbps", hw.device.memory_tbps, 1e3,
         "the device's memory bandwidth in TB/s, e.g. 3.35 for an H100"},
        {"--memory_gb", hw.device.memory_gb, 1e6, "the device's memory in GB, e.g. 80"},
        {"--intra_node_gbps", hw.network.intra_node_gbps, 1e6,
         "the per-GPU bandwidth inside a node in Gbit/s, e.g. 3600 for NVLink 4 (450 GB/s)"},
        {"--inter_node_gbps", hw.network.inter_node_gbps, 1e6,
         "the per-GPU NIC bandwidth in Gbit/s, e.g. 400 for a 400 Gbit/s InfiniBand NIC"},
    };
    for (const auto& f : fields) {
        if (!std::isfinite(f.value) || f.value <= 0 || f.value > f.max) {
            throw Error(ErrorKind::kConfig,
                        fmt::format("{}={:g} is not a positive figure up to {:g}: set it to {}",
                                    f.flag, f.value, f.max, f.example));
        }
    }
    const double latency = hw.network.latency_us;
    if (!std::isfinite(latency) || latency < 0 || latency > 1e6) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("--latency_us={:g} is not a latency from 0 to 1e6 microseconds: "
                                "set it to the per-collective latency, e.g. 10 for NCCL over "
                                "InfiniBand",
                                latency));
    }
}

}  // namespace epo::plan
