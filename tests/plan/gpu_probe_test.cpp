// A GPU calibration from epo-gpu-probe's measurements: the conversion recovers known curves as
// efficiencies of the device's datasheet figures, keeps what one GPU cannot measure at the
// device's defaults, refuses malformed files naming the field, and the H200 probe shipped in
// examples/calibration converts into a calibration a plan loads.
#include "epo/plan/gpu_probe.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "epo/core/error.h"
#include "epo/plan/hardware.h"

namespace epo::plan {
namespace {

std::string probe_error(const nlohmann::json& j, ErrorKind kind = ErrorKind::kUsage) {
    const auto path = std::filesystem::temp_directory_path() / "epo_gpu_probe_bad.json";
    std::ofstream(path) << j.dump();
    try {
        calibration_from_gpu_probe(read_gpu_probe(path), path.string());
    } catch (const Error& e) {
        std::filesystem::remove(path);
        EXPECT_EQ(e.kind(), kind) << e.what();
        return e.what();
    }
    std::filesystem::remove(path);
    return "";
}

// Rates exactly on the cost model's curve: peak * m / (m + half).
nlohmann::json synthetic_probe() {
    nlohmann::json j;
    j["epo_gpu_probe"] = 1;
    j["device_name"] = "NVIDIA H200";
    j["num_sms"] = 132;
    j["compute_capability"] = "9.0";
    nlohmann::json shapes = nlohmann::json::array(), fwd = shapes, dgrad = shapes, wgrad = shapes;
    for (double m : {64.0, 256.0, 1024.0, 4096.0}) {
        shapes.push_back({m, 4096, 7168});
        fwd.push_back(700 * m / (m + 100));
        dgrad.push_back(600 * m / (m + 140));
        wgrad.push_back(650 * m / (m + 1000));
    }
    j["gemm_shapes"] = shapes;
    j["forward_tflops"] = fwd;
    j["dgrad_tflops"] = dgrad;
    j["wgrad_tflops"] = wgrad;
    j["stream_tbps"] = 3.6;
    j["elementwise_tbps"] = 2.4;
    j["kernel_launch_us"] = 3.5;
    j["graph_launch_us"] = 1.5;
    return j;
}

TEST(GpuProbe, ConvertsMeasuredCurvesIntoTheDevicesEfficiencies) {
    const auto path = std::filesystem::temp_directory_path() / "epo_gpu_probe_test.json";
    std::ofstream(path) << synthetic_probe().dump();
    const Calibration c = calibration_from_gpu_probe(read_gpu_probe(path), path.string());
    std::filesystem::remove(path);
    const DeviceSpec h200 = *find_plan_device("h200");
    const CostParams defaults = default_params(h200);
    EXPECT_EQ(c.device, "h200");
    // The datasheet figures stay; the efficiencies carry the measurement.
    EXPECT_FALSE(c.peak_bf16_tflops.has_value());
    EXPECT_FALSE(c.memory_tbps.has_value());
    EXPECT_NEAR(c.params.gemm_efficiency, 700 / h200.peak_bf16_tflops, 1e-9);
    EXPECT_NEAR(c.params.dgrad_efficiency, 600 / h200.peak_bf16_tflops, 1e-9);
    EXPECT_NEAR(c.params.wgrad_efficiency, 650 / h200.peak_bf16_tflops, 1e-9);
    EXPECT_NEAR(c.params.gemm_half_dim, (100 + 140) / 2.0, 1e-6);
    EXPECT_NEAR(c.params.wgrad_half_dim, 1000, 1e-6);
    EXPECT_NEAR(c.params.memory_efficiency, 3.6 / h200.memory_tbps, 1e-12);
    EXPECT_NEAR(c.params.elementwise_efficiency, 2.4 / h200.memory_tbps, 1e-12);
    EXPECT_DOUBLE_EQ(c.params.graph_launch_us, 1.5);
    // What one GPU cannot measure keeps the device's defaults.
    EXPECT_DOUBLE_EQ(c.params.link_efficiency, defaults.link_efficiency);
    EXPECT_DOUBLE_EQ(c.params.overlap_slowdown, defaults.overlap_slowdown);
    EXPECT_DOUBLE_EQ(c.params.node_overhead_us, defaults.node_overhead_us);
    EXPECT_DOUBLE_EQ(c.params.comm_launch_us, defaults.comm_launch_us);
    EXPECT_NE(c.how.find("raw kernel launch 3.50 us"), std::string::npos) << c.how;

    // It round-trips through a calibration file and applies to the device's plan.
    const auto cal = std::filesystem::temp_directory_path() / "epo_gpu_probe_cal.json";
    write_calibration(cal, c);
    const Calibration back = read_calibration(cal);
    std::filesystem::remove(cal);
    Hardware hw = resolve_hardware("h200", {});
    CostParams p;
    apply_calibration(back, hw, p);
    EXPECT_DOUBLE_EQ(hw.device.peak_bf16_tflops, h200.peak_bf16_tflops);
    EXPECT_DOUBLE_EQ(p.wgrad_half_dim, c.params.wgrad_half_dim);
}

TEST(GpuProbe, MalformedProbesNameTheFieldAndTheFix) {
    nlohmann::json j = synthetic_probe();
    j.erase("stream_tbps");
    EXPECT_NE(probe_error(j).find("field 'stream_tbps' is missing; write it with epo-gpu-probe"),
              std::string::npos);
    j = synthetic_probe();
    j["wgrad_tflops"].erase(0);
    EXPECT_NE(probe_error(j).find("field 'wgrad_tflops' has 3 rates for 4 gemm_shapes"),
              std::string::npos);
    j = synthetic_probe();
    j["forward_tflops"][1] = -5;
    EXPECT_NE(probe_error(j).find("field 'forward_tflops' holds -5, not a positive rate"),
              std::string::npos);
    j = synthetic_probe();
    j.erase("epo_gpu_probe");
    EXPECT_NE(probe_error(j).find("not an epo-gpu-probe file"), std::string::npos);
    j = synthetic_probe();
    for (auto& s : j["gemm_shapes"])
        s[0] = 512;
    EXPECT_NE(probe_error(j).find("fewer than two distinct token counts"), std::string::npos);
    j = synthetic_probe();
    j["device_name"] = "NVIDIA A10";
    const std::string m = probe_error(j, ErrorKind::kConfig);
    EXPECT_NE(m.find("the probe measured 'NVIDIA A10', which the planner has no figures for"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("--peak_bf16_tflops"), std::string::npos) << m;
}

TEST(GpuProbe, TheShippedH200ProbeConverts) {
    // Measured on an H200 (examples/calibration/h200-probe.json; docs/measurements.md): the
    // weight gradient needs about ten times the tokens of a forward product for half its peak.
    const auto path =
        std::filesystem::path(EPO_SOURCE_DIR) / "examples" / "calibration" / "h200-probe.json";
    const Calibration c = calibration_from_gpu_probe(read_gpu_probe(path), path.string());
    EXPECT_EQ(c.device, "h200");
    EXPECT_GT(c.params.gemm_efficiency, 0.5);
    EXPECT_LE(c.params.gemm_efficiency, 1.0);
    EXPECT_GT(c.params.wgrad_half_dim, 5 * c.params.gemm_half_dim);
    EXPECT_GT(c.params.memory_efficiency, 0.5);
}

}  // namespace
}  // namespace epo::plan
