// The planner's hardware table and calibration files: datasheet figures resolved from env.gpu,
// bad hardware descriptions refused with the field and the fix, calibration round trips and the
// rate-curve fit.
#include "epo/plan/hardware.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "epo/core/error.h"
#include "epo/plan/calibration.h"
#include "epo/plan/cost_model.h"

namespace epo::plan {
namespace {

// The message of the kConfig / kUsage error `fn` raises ("" if none).
template <typename Fn>
std::string error_of(Fn&& fn, ErrorKind kind = ErrorKind::kConfig) {
    try {
        fn();
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), kind) << e.what();
        return e.what();
    }
    return "";
}

TEST(PlanHardware, DevicesResolveFromEnvGpu) {
    const Hardware hw = resolve_hardware("NVIDIA H100 80GB HBM3", {});
    EXPECT_EQ(hw.device.id, "h100");
    EXPECT_DOUBLE_EQ(hw.device.peak_bf16_tflops, 989);
    EXPECT_DOUBLE_EQ(hw.network.inter_node_gbps, 400);
    EXPECT_DOUBLE_EQ(hw.network.intra_node_gbps, 3600);
    for (const char* id : {"h100", "h200", "b200", "gb200", "cpu"}) {
        const Hardware d = resolve_hardware(id, {});
        EXPECT_FALSE(d.device.source.empty()) << id;
        EXPECT_FALSE(d.network.source.empty()) << id;
    }
    EXPECT_DOUBLE_EQ(resolve_hardware("b200", {}).network.intra_node_gbps, 7200);
}

TEST(PlanHardware, OverridesReplaceTheDefaults) {
    HardwareOverrides o;
    o.inter_node_gbps = 800;
    o.latency_us = 0;
    const Hardware hw = resolve_hardware("b200", o);
    EXPECT_DOUBLE_EQ(hw.network.inter_node_gbps, 800);
    EXPECT_DOUBLE_EQ(hw.network.latency_us, 0);
    EXPECT_NE(hw.network.source.find("command line"), std::string::npos);
}

TEST(PlanHardware, UnknownDeviceNamesEnvGpuAndTheKnownOnes) {
    const std::string m = error_of([] { resolve_hardware("a100", {}); });
    EXPECT_NE(m.find("env.gpu = 'a100'"), std::string::npos) << m;
    EXPECT_NE(m.find("h100, h200, b200, gb200, cpu"), std::string::npos) << m;
    EXPECT_NE(m.find("--peak_bf16_tflops"), std::string::npos) << m;
}

TEST(PlanHardware, BadFiguresNameTheFlagValueAndFix) {
    struct Case {
        HardwareOverrides o;
        const char* expect;
        const char* fix;
    };
    HardwareOverrides nic, nvlink, peak, latency, nan_bw;
    nic.inter_node_gbps = 0;
    nvlink.intra_node_gbps = -5;
    peak.peak_bf16_tflops = 1e9;
    latency.latency_us = -1;
    nan_bw.memory_tbps = std::nan("");
    const Case cases[] = {
        {nic, "--inter_node_gbps=0", "e.g. 400 for a 400 Gbit/s InfiniBand NIC"},
        {nvlink, "--intra_node_gbps=-5", "e.g. 3600 for NVLink 4"},
        {peak, "--peak_bf16_tflops=1e+09", "e.g. 989 for an H100"},
        {latency, "--latency_us=-1", "e.g. 10 for NCCL"},
        {nan_bw, "--memory_tbps=nan", "e.g. 3.35"},
    };
    for (const Case& c : cases) {
        const std::string m = error_of([&] { resolve_hardware("h100", c.o); });
        EXPECT_NE(m.find(c.expect), std::string::npos) << m;
        EXPECT_NE(m.find(c.fix), std::string::npos) << m;
    }
}

TEST(PlanCalibration, RoundTripsAndApplies) {
    const auto path = std::filesystem::temp_directory_path() / "epo_plan_calibration_test.json";
    Calibration c;
    c.device = "cpu";
    c.peak_bf16_tflops = 0.65;
    c.memory_tbps = 0.004;
    c.params.dgrad_efficiency = 0.8;
    c.params.wgrad_efficiency = 0.6;
    c.params.gemm_half_dim = 40;
    c.how = "test";
    write_calibration(path, c);
    const Calibration back = read_calibration(path);
    EXPECT_EQ(back.device, "cpu");
    EXPECT_DOUBLE_EQ(*back.peak_bf16_tflops, 0.65);
    EXPECT_DOUBLE_EQ(back.params.wgrad_efficiency, 0.6);
    EXPECT_DOUBLE_EQ(back.params.gemm_half_dim, 40);
    Hardware hw = resolve_hardware("cpu", {});
    CostParams p;
    apply_calibration(back, hw, p);
    EXPECT_DOUBLE_EQ(hw.device.peak_bf16_tflops, 0.65);
    EXPECT_DOUBLE_EQ(p.dgrad_efficiency, 0.8);
    // A calibration of one device does not apply to another.
    Hardware gpu = resolve_hardware("h100", {});
    const std::string m = error_of([&] { apply_calibration(back, gpu, p); });
    EXPECT_NE(m.find("the calibration is for env.gpu=cpu, the plan for env.gpu=h100"),
              std::string::npos)
        << m;
    std::filesystem::remove(path);
}

// Every figure the cost model uses is read from the file: the host's launch costs included (a
// GPU calibration used to drop them to 0, planning the host-bound case as free), and the fp8
// peak. A file written before they were read keeps the device's defaults.
TEST(PlanCalibration, EveryFigureTheModelUsesIsRead) {
    const auto path = std::filesystem::temp_directory_path() / "epo_plan_calibration_all.json";
    Calibration c;
    c.device = "h100";
    c.peak_fp8_tflops = 1500;
    c.params = default_params(*find_plan_device("h100"));
    c.params.gemm_efficiency = 0.61;
    c.params.dgrad_efficiency = 0.62;
    c.params.wgrad_efficiency = 0.63;
    c.params.gemm_half_dim = 101;
    c.params.wgrad_half_dim = 1001;
    c.params.memory_efficiency = 0.64;
    c.params.elementwise_efficiency = 0.65;
    c.params.link_efficiency = 0.66;
    c.params.overlap_slowdown = 0.31;
    c.params.flex_overlap_slowdown = 0.21;
    c.params.node_overhead_us = 111;
    c.params.comm_launch_us = 55;
    c.params.graph_launch_us = 12;
    write_calibration(path, c);
    const Calibration back = read_calibration(path);
    Hardware hw = resolve_hardware("h100", {});
    CostParams p;
    apply_calibration(back, hw, p);
    EXPECT_DOUBLE_EQ(hw.device.peak_fp8_tflops, 1500);
    const std::vector<std::pair<double, double>> figures = {
        {p.gemm_efficiency, 0.61}, {p.dgrad_efficiency, 0.62},  {p.wgrad_efficiency, 0.63},
        {p.gemm_half_dim, 101},    {p.memory_efficiency, 0.64}, {p.elementwise_efficiency, 0.65},
        {p.link_efficiency, 0.66}, {p.overlap_slowdown, 0.31},  {p.flex_overlap_slowdown, 0.21},
        {p.node_overhead_us, 111}, {p.comm_launch_us, 55},      {p.graph_launch_us, 12},
        {p.wgrad_half_dim, 1001}};
    for (size_t i = 0; i < figures.size(); ++i)
        EXPECT_DOUBLE_EQ(figures[i].first, figures[i].second) << "figure " << i;

    // Without the launch costs: the device's defaults, not 0.
    nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
    j.erase("comm_launch_us");
    j.erase("graph_launch_us");
    j.erase("wgrad_half_dim");
    std::ofstream(path) << j.dump();
    const CostParams h100 = default_params(*find_plan_device("h100"));
    EXPECT_GT(h100.comm_launch_us, 0);
    EXPECT_DOUBLE_EQ(read_calibration(path).params.comm_launch_us, h100.comm_launch_us);
    EXPECT_DOUBLE_EQ(read_calibration(path).params.graph_launch_us, h100.graph_launch_us);
    // ... and weight gradients the products' half point.
    EXPECT_DOUBLE_EQ(read_calibration(path).params.wgrad_half_dim, 101);

    // Out of range: named with the value and the fix.
    j["comm_launch_us"] = -1;
    std::ofstream(path) << j.dump();
    const std::string m = error_of([&] { read_calibration(path); }, ErrorKind::kUsage);
    EXPECT_NE(m.find("comm_launch_us = -1 is outside [0, 1e+06]; rewrite the file with epo plan "
                     "--calibrate"),
              std::string::npos)
        << m;
    std::filesystem::remove(path);
}

TEST(PlanCalibration, MalformedFilesNameTheField) {
    const auto path = std::filesystem::temp_directory_path() / "epo_plan_calibration_bad.json";
    std::ofstream(path) << R"({"device": "cpu", "gemm_efficiency": "fast"})";
    std::string m = error_of([&] { read_calibration(path); }, ErrorKind::kUsage);
    EXPECT_NE(m.find("'gemm_efficiency' has the wrong type"), std::string::npos) << m;
    std::ofstream(path) << R"({"device": "cpu"})";
    m = error_of([&] { read_calibration(path); }, ErrorKind::kUsage);
    EXPECT_NE(m.find("field 'gemm_efficiency' is missing"), std::string::npos) << m;
    std::filesystem::remove(path);
    m = error_of([&] { read_calibration(path); }, ErrorKind::kIo);
    EXPECT_NE(m.find("--calibrate kernels"), std::string::npos) << m;
}

TEST(PlanCalibration, FitWeighsEverySizeAlike) {
    // A curve that saturates harder than the model (a GPU's weight gradient, epo-gpu-probe on an
    // H200): the fit of the time's relative error stays within 15% at every size, where a fit of
    // 1/rate itself misses the largest by 45%.
    const std::vector<double> x = {64, 128, 256, 512, 1024, 2048, 4096, 8192};
    const std::vector<double> rate = {38.4, 77.6, 153.3, 288.1, 430.4, 548.2, 607.9, 650.1};
    const RateCurve c = fit_rate_curve(x, rate);
    for (size_t i = 0; i < x.size(); ++i)
        EXPECT_NEAR(c.peak * x[i] / (x[i] + c.half_dim) / rate[i], 1, 0.15) << x[i];
}

TEST(PlanCalibration, FitRecoversTheRateCurve) {
    // rate = 700 x / (x + 50): exactly the model's shape.
    std::vector<double> x = {64, 128, 256, 512, 1024}, rate;
    for (double v : x)
        rate.push_back(700 * v / (v + 50));
    const RateCurve c = fit_rate_curve(x, rate);
    EXPECT_NEAR(c.peak, 700, 1e-6);
    EXPECT_NEAR(c.half_dim, 50, 1e-6);
}

}  // namespace
}  // namespace epo::plan

namespace epo::plan {
namespace {

TEST(PlanCalibration, KernelMeasurementGivesAUsableCpuCalibration) {
    // Short: one thread, 10 ms per product and pass. Only plausibility (timings are the
    // machine's): positive figures, efficiencies a file accepts, and a plan that loads them.
    std::ostringstream log;
    const Calibration c = calibrate_kernels({.num_threads = 1, .seconds_per_measure = 0.01}, log);
    EXPECT_EQ(c.device, "cpu");
    EXPECT_GT(*c.peak_bf16_tflops, 0);
    EXPECT_GT(*c.memory_tbps, 0);
    EXPECT_GT(c.params.wgrad_efficiency, 0);
    EXPECT_LE(c.params.elementwise_efficiency, 1);
    EXPECT_NE(log.str().find("[plan] wgrad"), std::string::npos) << log.str();
    const auto path = std::filesystem::temp_directory_path() / "epo_plan_kernels_test.json";
    write_calibration(path, c);
    Hardware hw = resolve_hardware("cpu", {});
    CostParams p;
    apply_calibration(read_calibration(path), hw, p);
    EXPECT_DOUBLE_EQ(hw.device.peak_bf16_tflops, *c.peak_bf16_tflops);
    std::filesystem::remove(path);
}

}  // namespace
}  // namespace epo::plan
