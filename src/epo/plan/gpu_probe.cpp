#include "epo/plan/gpu_probe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "epo/core/error.h"
#include "epo/io/files.h"
#include "epo/plan/hardware.h"

namespace epo::plan {
namespace {

[[noreturn]] void probe_malformed(const std::filesystem::path& path, const std::string& what) {
    throw Error(ErrorKind::kUsage,
                fmt::format("probe file {}: {}; write it with epo-gpu-probe --out {}",
                            path.string(), what, path.string()));
}

double probe_positive(const nlohmann::json& j, const char* key, const std::filesystem::path& path) {
    if (!j.contains(key))
        probe_malformed(path, fmt::format("field '{}' is missing", key));
    if (!j[key].is_number())
        probe_malformed(path, fmt::format("field '{}' is {}, not a number", key, j[key].dump()));
    const double v = j[key].get<double>();
    if (!(std::isfinite(v) && v > 0))
        probe_malformed(path, fmt::format("field '{}' = {:g} is not a positive number", key, v));
    return v;
}

std::vector<double> probe_rates(const nlohmann::json& j, const char* key, size_t count,
                                const std::filesystem::path& path) {
    if (!j.contains(key) || !j[key].is_array())
        probe_malformed(path, fmt::format("field '{}' is missing or not a list", key));
    if (j[key].size() != count) {
        probe_malformed(path, fmt::format("field '{}' has {} rates for {} gemm_shapes", key,
                                          j[key].size(), count));
    }
    std::vector<double> out;
    for (const auto& v : j[key]) {
        if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
            probe_malformed(path,
                            fmt::format("field '{}' holds {}, not a positive rate", key, v.dump()));
        out.push_back(v.get<double>());
    }
    return out;
}

}  // namespace

GpuProbe read_gpu_probe(const std::filesystem::path& path) {
    if (std::error_code ec; std::filesystem::exists(path, ec))
        io::require_regular_file(path, "--probe");
    std::ifstream in(path);
    if (!in) {
        throw Error(ErrorKind::kIo,
                    fmt::format("--probe {}: cannot open the file; write one on the GPU with "
                                "epo-gpu-probe --out {}",
                                path.string(), path.string()));
    }
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
        probe_malformed(path, fmt::format("not JSON ({})", e.what()));
    }
    if (!j.is_object() || !j.contains("epo_gpu_probe"))
        probe_malformed(path, "it is not an epo-gpu-probe file (no 'epo_gpu_probe' field)");
    if (j["epo_gpu_probe"] != 1)
        probe_malformed(path, fmt::format("format {} is not 1", j["epo_gpu_probe"].dump()));
    GpuProbe p;
    if (!j.contains("device_name") || !j["device_name"].is_string())
        probe_malformed(path, "field 'device_name' is missing or not a string");
    p.device_name = j["device_name"].get<std::string>();
    p.num_sms = static_cast<int>(probe_positive(j, "num_sms", path));
    p.compute_capability = j.value("compute_capability", "");
    p.rounds = j.value("rounds", 0);
    if (!j.contains("gemm_shapes") || !j["gemm_shapes"].is_array())
        probe_malformed(path, "field 'gemm_shapes' is missing or not a list");
    for (const auto& s : j["gemm_shapes"]) {
        if (!s.is_array() || s.size() != 3 || !s[0].is_number() || !s[1].is_number() ||
            !s[2].is_number() || !(s[0].get<double>() > 0) || !(s[1].get<double>() > 0) ||
            !(s[2].get<double>() > 0))
            probe_malformed(path, fmt::format("gemm_shapes entry {} is not [m, n, k]", s.dump()));
        p.shapes.push_back({s[0].get<double>(), s[1].get<double>(), s[2].get<double>()});
    }
    if (p.shapes.size() < 2)
        probe_malformed(path, "gemm_shapes needs at least two token counts");
    p.forward_tflops = probe_rates(j, "forward_tflops", p.shapes.size(), path);
    p.dgrad_tflops = probe_rates(j, "dgrad_tflops", p.shapes.size(), path);
    p.wgrad_tflops = probe_rates(j, "wgrad_tflops", p.shapes.size(), path);
    p.stream_tbps = probe_positive(j, "stream_tbps", path);
    p.elementwise_tbps = probe_positive(j, "elementwise_tbps", path);
    p.kernel_launch_us = probe_positive(j, "kernel_launch_us", path);
    p.graph_launch_us = probe_positive(j, "graph_launch_us", path);
    return p;
}

Calibration calibration_from_gpu_probe(const GpuProbe& probe, const std::string& source) {
    const std::optional<DeviceSpec> device = find_plan_device(probe.device_name);
    if (!device || device->id == "cpu") {
        throw Error(ErrorKind::kConfig,
                    fmt::format("the probe measured '{}', which the planner has no figures for "
                                "(it knows {}); plan that GPU with --peak_bf16_tflops and "
                                "--memory_tbps instead",
                                probe.device_name, plan_device_list()));
    }
    std::vector<double> x;
    for (const GpuProbe::Product& s : probe.shapes)
        x.push_back(s.m);
    if (std::set<double>(x.begin(), x.end()).size() < 2) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("the probe {} measured fewer than two distinct token counts; "
                                "rerun epo-gpu-probe",
                                source));
    }
    const RateCurve fwd = fit_rate_curve(x, probe.forward_tflops);
    const RateCurve dgrad = fit_rate_curve(x, probe.dgrad_tflops);
    const RateCurve wgrad = fit_rate_curve(x, probe.wgrad_tflops);

    Calibration c;
    c.device = device->id;
    CostParams& p = c.params;
    p = default_params(*device);
    const double peak = device->peak_bf16_tflops;
    p.gemm_efficiency = std::min(1.0, fwd.peak / peak);
    p.dgrad_efficiency = dgrad.peak / peak;
    p.wgrad_efficiency = wgrad.peak / peak;
    p.gemm_half_dim = (fwd.half_dim + dgrad.half_dim) / 2;
    p.wgrad_half_dim = wgrad.half_dim;
    p.memory_efficiency = std::min(1.0, probe.stream_tbps / device->memory_tbps);
    p.elementwise_efficiency = std::min(1.0, probe.elementwise_tbps / device->memory_tbps);
    p.graph_launch_us = probe.graph_launch_us;
    p.source = "calibration (gpu probe)";
    c.how = fmt::format(
        "epo plan --calibrate gpu-probe from {} ({}, {} SMs, compute capability {}): bf16 "
        "cuBLAS products peak {:.0f} / {:.0f} / {:.0f} TFLOP/s (forward / dgrad / wgrad), half "
        "at {:.0f} / {:.0f} / {:.0f} tokens; streaming {:.2f} TB/s, SwiGLU {:.2f} TB/s; raw "
        "kernel launch {:.2f} us, graph replay {:.2f} us",
        source, probe.device_name, probe.num_sms, probe.compute_capability, fwd.peak, dgrad.peak,
        wgrad.peak, fwd.half_dim, dgrad.half_dim, wgrad.half_dim, probe.stream_tbps,
        probe.elementwise_tbps, probe.kernel_launch_us, probe.graph_launch_us);
    return c;
}

}  // namespace epo::plan
