// A GPU calibration from kernel measurements (docs/plan.md "Calibrating for a GPU"):
// tools/gpu_probe/gpu_probe.cu (`epo-gpu-probe`, built with -DEPO_GPU_PROBE=ON) measures one
// GPU's bf16 products in the three layouts training runs them in, a streaming loop, SwiGLU and
// the host's launch costs, and writes them as a probe file; `epo plan --calibrate gpu-probe
// --probe FILE --out CAL` reads it here and writes a calibration file for that device.
//
// The conversion, against the planner's device table (hardware.h) for the probed device:
//   - per pass p, fit_rate_curve over the token dimension: e_p = fitted peak / datasheet peak,
//     gemm_half_dim the forward and input-gradient curves' mean, wgrad_half_dim the weight
//     gradient's;
//   - memory_efficiency = streaming loop / datasheet bandwidth, elementwise_efficiency = SwiGLU
//     forward + backward / datasheet bandwidth (the probe's own kernels: a lower bound for fused
//     ones);
//   - graph_launch_us = the host's cost of one graph replay.
// The datasheet peak and bandwidth stay the device's figures (the efficiencies carry the
// measurement), so the file composes with --peak_bf16_tflops and --memory_tbps. What one GPU
// cannot measure keeps the device's defaults (cost_model.h default_params): link efficiency,
// the slowdown while overlapped, and the host's per-node and per-collective launch costs (the
// probe's raw kernel launch is a lower bound of PyTorch's; it is quoted in `how`).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "epo/plan/calibration.h"

namespace epo::plan {

struct GpuProbe {
    std::string device_name;  // as the driver reports it: "NVIDIA H200"
    int num_sms = 0;
    std::string compute_capability;
    struct Product {
        double m = 0, n = 0, k = 0;
    };
    std::vector<Product> shapes;                                     // m the token dimension
    std::vector<double> forward_tflops, dgrad_tflops, wgrad_tflops;  // per shape
    double stream_tbps = 0, elementwise_tbps = 0;
    double kernel_launch_us = 0, graph_launch_us = 0;
    int rounds = 0;
};

// kIo for a missing or unreadable file, kUsage for a malformed one (naming the field and the
// fix).
GpuProbe read_gpu_probe(const std::filesystem::path& path);

// kConfig when the planner has no figures for the probed device (naming it and the devices it
// has). `source` names the probe file in the calibration's `how`.
Calibration calibration_from_gpu_probe(const GpuProbe& probe, const std::string& source);

}  // namespace epo::plan
