#include "epo/plan/calibration.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <thread>

#include "epo/core/error.h"
#include "epo/io/files.h"
#include "epo/kernels/activation.h"
#include "epo/kernels/gemm.h"
#include "epo/tensor/random.h"
#include "epo/tensor/tensor.h"

namespace epo::plan {
namespace {

using Clock = std::chrono::steady_clock;

// Products timed: (m, n, k) with the smallest dimension x = m from 64 to 1024 at the widths of
// an MoE layer (n, k = 1536, 1024), and the core attention's (512, 512, 128).
struct Shape {
    int64_t m, n, k;
};
const std::vector<Shape>& calibration_shapes() {
    static const std::vector<Shape> shapes = {{64, 1536, 1024},   {128, 1536, 1024},
                                              {256, 1536, 1024},  {512, 1536, 1024},
                                              {1024, 1536, 1024}, {512, 512, 128}};
    return shapes;
}

Tensor bf16_tensor(int64_t rows, int64_t cols, uint64_t seed) {
    Tensor t = Tensor::empty({rows, cols}, DType::kBF16);
    fill_uniform(t, seed, -1.0f, 1.0f);
    return t;
}

// Seconds per call of `fn`: the mean over calls for about `budget_s`, at least two.
template <typename Fn>
double time_per_call(Fn&& fn, double budget_s) {
    const auto t0 = Clock::now();
    int calls = 0;
    double elapsed = 0;
    do {
        fn();
        ++calls;
        elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    } while (calls < 2 || elapsed < budget_s);
    return elapsed / calls;
}

double median_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// One thread's measurements: rate[pass][shape] in FLOP/s, and the element-wise bytes/s.
struct ThreadRates {
    std::vector<std::vector<double>> rate;  // [3][shapes]
    double elementwise_bps = 0;
    double stream_bps = 0;
};

// The operands of one shape's three products.
struct ShapeOperands {
    Shape s;
    Tensor x, w, dy, y, dx, dw;
};

// Rounds: each round times every product and the element-wise kernel once, so a change of the
// machine's load between rounds hits all alike; the result is each one's median over rounds.
constexpr int kRounds = 5;

ThreadRates measure_thread(double budget_s, uint64_t seed) {
    namespace k = kernels;
    std::vector<ShapeOperands> ops;
    for (const Shape& s : calibration_shapes()) {
        ops.push_back({s, bf16_tensor(s.m, s.k, seed + 1), bf16_tensor(s.n, s.k, seed + 2),
                       bf16_tensor(s.m, s.n, seed + 3), Tensor::empty({s.m, s.n}, DType::kBF16),
                       Tensor::empty({s.m, s.k}, DType::kBF16),
                       Tensor::zeros({s.n, s.k}, DType::kF32)});
    }
    // SwiGLU forward and backward over (rows, 2F): bytes read and written per pair.
    const int64_t rows = 2048, F = 768;
    Tensor h = bf16_tensor(rows, 2 * F, seed + 4), a = bf16_tensor(rows, F, seed + 5);
    Tensor dh = Tensor::empty({rows, 2 * F}, DType::kBF16);
    Tensor probs = Tensor::empty({rows}, DType::kF32), dprobs = Tensor::empty({rows}, DType::kF32);
    fill_uniform(probs, seed + 6, 0.0f, 1.0f);
    const double swiglu_bytes = 2.0 * static_cast<double>(rows * (2 * F + F)) +         // forward
                                2.0 * static_cast<double>(rows * (2 * F + F + 2 * F));  // backward

    std::vector<std::vector<std::vector<double>>> rates(
        3, std::vector<std::vector<double>>(ops.size()));
    // A streaming loop (a = b + s c over f32 arrays far larger than the caches), as Adam runs.
    const size_t n = size_t{8} << 20;
    std::vector<float> sa(n, 0.0f), sb(n, 1.0f), sc(n, 2.0f);
    const double stream_bytes = 12.0 * static_cast<double>(n);
    std::vector<double> elementwise, stream;
    const double each = budget_s / kRounds;
    for (int round = 0; round < kRounds; ++round) {
        for (size_t i = 0; i < ops.size(); ++i) {
            ShapeOperands& o = ops[i];
            const double flops = 2.0 * static_cast<double>(o.s.m * o.s.n * o.s.k);
            // Forward y = x w^T; input gradient dx = dy w; weight gradient dw += dy^T x (f32).
            rates[0][i].push_back(flops / time_per_call(
                                              [&] {
                                                  k::gemm(k::as_matrix(o.x), k::as_matrix(o.w),
                                                          k::as_matrix(o.y), {.trans_b = true});
                                              },
                                              each));
            rates[1][i].push_back(
                flops /
                time_per_call(
                    [&] { k::gemm(k::as_matrix(o.dy), k::as_matrix(o.w), k::as_matrix(o.dx)); },
                    each));
            rates[2][i].push_back(flops / time_per_call(
                                              [&] {
                                                  k::gemm(k::as_matrix(o.dy), k::as_matrix(o.x),
                                                          k::as_matrix(o.dw),
                                                          {.trans_a = true, .accumulate = true});
                                              },
                                              each));
        }
        elementwise.push_back(
            swiglu_bytes /
            time_per_call(
                [&] {
                    k::swiglu_forward(k::as_matrix(h), probs.data<float>(), k::as_matrix(a));
                    k::swiglu_backward(k::as_matrix(h), probs.data<float>(), k::as_matrix(a),
                                       k::as_matrix(dh), dprobs.data<float>());
                },
                each));
        stream.push_back(stream_bytes / time_per_call(
                                            [&] {
                                                float* a = sa.data();
                                                const float* b = sb.data();
                                                const float* c = sc.data();
                                                for (size_t i = 0; i < n; ++i)
                                                    a[i] = b[i] + 0.5f * c[i];
                                            },
                                            each));
    }
    ThreadRates out;
    out.stream_bps = median_of(stream);
    out.rate.assign(3, {});
    for (int p = 0; p < 3; ++p) {
        for (const auto& r : rates[p])
            out.rate[p].push_back(median_of(r));
    }
    out.elementwise_bps = median_of(elementwise);
    return out;
}

std::string load_text() {
    std::ifstream in("/proc/loadavg");
    std::string a, b, c;
    in >> a >> b >> c;
    return a.empty() ? "unknown" : fmt::format("{} {} {}", a, b, c);
}

template <typename T>
T field(const nlohmann::json& j, const char* key, const std::filesystem::path& path) {
    if (!j.contains(key)) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("calibration file {}: field '{}' is missing; write the file with "
                                "epo plan --calibrate",
                                path.string(), key));
    }
    try {
        return j.at(key).get<T>();
    } catch (const nlohmann::json::exception&) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("calibration file {}: field '{}' has the wrong type ({}); write "
                                "the file with epo plan --calibrate",
                                path.string(), key, j.at(key).dump()));
    }
}

}  // namespace

RateCurve fit_rate_curve(const std::vector<double>& x, const std::vector<double>& rate) {
    // Time per FLOP 1/rate = a + b/x, fitted by least squares of the relative error of the time,
    // (a + b/x) rate - 1: every size counts alike (an absolute fit of 1/rate follows the small
    // sizes only and misses the peak by up to 45% on a GPU's weight gradient).
    double s11 = 0, s12 = 0, s22 = 0, t1 = 0, t2 = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const double r = rate[i], ru = rate[i] / x[i];
        s11 += r * r;
        s12 += r * ru;
        s22 += ru * ru;
        t1 += r;
        t2 += ru;
    }
    const double det = s11 * s22 - s12 * s12;
    if (x.size() < 2 || !(det > 1e-12 * s11 * s22)) {
        throw Error(ErrorKind::kInternal, "fit_rate_curve: needs two distinct sizes");
    }
    double a = (t1 * s22 - t2 * s12) / det;
    double b = (s11 * t2 - s12 * t1) / det;
    if (b < 0) {  // faster at small sizes: no size effect, the mean time per FLOP
        b = 0;
        a = t1 / s11;
    }
    return {1 / a, b / a};
}

void write_calibration(const std::filesystem::path& path, const Calibration& c) {
    nlohmann::ordered_json j;
    j["epo_plan_calibration"] = 1;
    j["device"] = c.device;
    if (c.peak_bf16_tflops)
        j["peak_bf16_tflops"] = *c.peak_bf16_tflops;
    if (c.memory_tbps)
        j["memory_tbps"] = *c.memory_tbps;
    if (c.peak_fp8_tflops)
        j["peak_fp8_tflops"] = *c.peak_fp8_tflops;
    const CostParams& p = c.params;
    j["gemm_efficiency"] = p.gemm_efficiency;
    j["dgrad_efficiency"] = p.dgrad_efficiency;
    j["wgrad_efficiency"] = p.wgrad_efficiency;
    j["gemm_half_dim"] = p.gemm_half_dim;
    j["wgrad_half_dim"] = p.wgrad_half_dim;
    j["memory_efficiency"] = p.memory_efficiency;
    j["elementwise_efficiency"] = p.elementwise_efficiency;
    j["link_efficiency"] = p.link_efficiency;
    j["overlap_slowdown"] = p.overlap_slowdown;
    j["flex_overlap_slowdown"] = p.flex_overlap_slowdown;
    j["node_overhead_us"] = p.node_overhead_us;
    j["comm_launch_us"] = p.comm_launch_us;
    j["graph_launch_us"] = p.graph_launch_us;
    j["how"] = c.how;
    io::write_file_atomically(path, j.dump(2) + "\n", "the calibration file");
}

Calibration read_calibration(const std::filesystem::path& path) {
    // A directory, a FIFO or a device is refused by name (a FIFO would block the read for good);
    // a missing file gets the fix below.
    if (std::error_code ec; std::filesystem::exists(path, ec))
        io::require_regular_file(path, "--calibration");
    std::ifstream in(path);
    if (!in) {
        throw Error(ErrorKind::kIo,
                    fmt::format("--calibration {}: cannot open the file; write one with epo plan "
                                "--calibrate kernels --out {}",
                                path.string(), path.string()));
    }
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("calibration file {} is not JSON: {}", path.string(), e.what()));
    }
    Calibration c;
    c.device = field<std::string>(j, "device", path);
    if (j.contains("peak_bf16_tflops"))
        c.peak_bf16_tflops = field<double>(j, "peak_bf16_tflops", path);
    if (j.contains("memory_tbps"))
        c.memory_tbps = field<double>(j, "memory_tbps", path);
    if (j.contains("peak_fp8_tflops"))
        c.peak_fp8_tflops = field<double>(j, "peak_fp8_tflops", path);
    CostParams& p = c.params;
    p.gemm_efficiency = field<double>(j, "gemm_efficiency", path);
    p.dgrad_efficiency = field<double>(j, "dgrad_efficiency", path);
    p.wgrad_efficiency = field<double>(j, "wgrad_efficiency", path);
    p.gemm_half_dim = field<double>(j, "gemm_half_dim", path);
    // Files written before weight gradients had their own: the products' figure.
    p.wgrad_half_dim =
        j.contains("wgrad_half_dim") ? field<double>(j, "wgrad_half_dim", path) : p.gemm_half_dim;
    p.memory_efficiency = field<double>(j, "memory_efficiency", path);
    // Files written before the streaming measurement: their memory figure is the kernels'.
    p.elementwise_efficiency = j.contains("elementwise_efficiency")
                                   ? field<double>(j, "elementwise_efficiency", path)
                                   : p.memory_efficiency;
    p.link_efficiency = field<double>(j, "link_efficiency", path);
    p.overlap_slowdown = field<double>(j, "overlap_slowdown", path);
    p.flex_overlap_slowdown = field<double>(j, "flex_overlap_slowdown", path);
    p.node_overhead_us = field<double>(j, "node_overhead_us", path);
    // The host's launch costs: files written before they were read take the device's defaults
    // (an unknown device's file is refused when it is applied).
    const std::optional<DeviceSpec> device = find_plan_device(c.device);
    const CostParams defaults = device ? default_params(*device) : CostParams{};
    p.comm_launch_us = j.contains("comm_launch_us") ? field<double>(j, "comm_launch_us", path)
                                                    : defaults.comm_launch_us;
    p.graph_launch_us = j.contains("graph_launch_us") ? field<double>(j, "graph_launch_us", path)
                                                      : defaults.graph_launch_us;
    c.how = j.value("how", "");
    p.source = "calibration " + path.string();
    const struct {
        const char* key;
        double value;
        double lo, hi;
    } checks[] = {{"peak_bf16_tflops", c.peak_bf16_tflops.value_or(1), 1e-6, 1e6},
                  {"memory_tbps", c.memory_tbps.value_or(1), 1e-6, 1e6},
                  {"peak_fp8_tflops", c.peak_fp8_tflops.value_or(1), 1e-6, 1e6},
                  {"gemm_efficiency", p.gemm_efficiency, 1e-3, 1},
                  {"dgrad_efficiency", p.dgrad_efficiency, 1e-3, 2},
                  {"wgrad_efficiency", p.wgrad_efficiency, 1e-3, 2},
                  {"gemm_half_dim", p.gemm_half_dim, 0, 1e5},
                  {"wgrad_half_dim", p.wgrad_half_dim, 0, 1e5},
                  {"memory_efficiency", p.memory_efficiency, 1e-3, 1},
                  {"elementwise_efficiency", p.elementwise_efficiency, 1e-3, 1},
                  {"link_efficiency", p.link_efficiency, 1e-3, 1},
                  {"overlap_slowdown", p.overlap_slowdown, 0, 10},
                  {"flex_overlap_slowdown", p.flex_overlap_slowdown, 0, 10},
                  {"node_overhead_us", p.node_overhead_us, 0, 1e6},
                  {"comm_launch_us", p.comm_launch_us, 0, 1e6},
                  {"graph_launch_us", p.graph_launch_us, 0, 1e6}};
    for (const auto& f : checks) {
        if (!(f.value >= f.lo && f.value <= f.hi)) {
            throw Error(ErrorKind::kUsage,
                        fmt::format("calibration file {}: {} = {:g} is outside [{:g}, {:g}]; "
                                    "rewrite the file with epo plan --calibrate",
                                    path.string(), f.key, f.value, f.lo, f.hi));
        }
    }
    return c;
}

void apply_calibration(const Calibration& c, Hardware& hw, CostParams& params) {
    if (c.device != hw.device.id) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("the calibration is for env.gpu={}, the plan for env.gpu={}: set "
                                "env.gpu={} or calibrate for {}",
                                c.device, hw.device.id, c.device, hw.device.id));
    }
    if (c.peak_bf16_tflops)
        hw.device.peak_bf16_tflops = *c.peak_bf16_tflops;
    if (c.memory_tbps)
        hw.device.memory_tbps = *c.memory_tbps;
    if (c.peak_fp8_tflops)
        hw.device.peak_fp8_tflops = *c.peak_fp8_tflops;
    if (c.peak_bf16_tflops || c.memory_tbps || c.peak_fp8_tflops)
        hw.device.source = "calibrated: " + c.how;
    params = c.params;
    validate_hardware(hw);
}

Calibration calibrate_kernels(const KernelCalibrationOptions& o, std::ostream& log) {
    const std::string load_before = load_text();
    std::vector<ThreadRates> rates(static_cast<size_t>(std::max(1, o.num_threads)));
    {
        std::vector<std::thread> threads;
        for (size_t t = 0; t < rates.size(); ++t)
            threads.emplace_back(
                [&, t] { rates[t] = measure_thread(o.seconds_per_measure, 17 * t); });
        for (std::thread& t : threads)
            t.join();
    }
    const std::vector<Shape>& shapes = calibration_shapes();
    std::vector<double> x;
    for (const Shape& s : shapes)
        x.push_back(static_cast<double>(std::min({s.m, s.n, s.k})));
    // Per pass and shape the slowest thread's rate (a rank waits for the slowest in the end).
    RateCurve curves[3];
    const char* names[3] = {"forward", "dgrad", "wgrad"};
    for (int p = 0; p < 3; ++p) {
        std::vector<double> r(shapes.size());
        for (size_t i = 0; i < shapes.size(); ++i) {
            r[i] = rates[0].rate[p][i];
            for (const ThreadRates& t : rates)
                r[i] = std::min(r[i], t.rate[p][i]);
        }
        curves[p] = fit_rate_curve(x, r);
        std::string row;
        for (size_t i = 0; i < shapes.size(); ++i)
            row +=
                fmt::format(" {}x{}x{}:{:.0f}", shapes[i].m, shapes[i].n, shapes[i].k, r[i] / 1e9);
        log << fmt::format("[plan] {:8s} GFLOP/s{} -> peak {:.0f}, half at {:.0f}\n", names[p], row,
                           curves[p].peak / 1e9, curves[p].half_dim);
    }
    double elementwise = rates[0].elementwise_bps, stream = rates[0].stream_bps;
    for (const ThreadRates& t : rates) {
        elementwise = std::min(elementwise, t.elementwise_bps);
        stream = std::min(stream, t.stream_bps);
    }
    log << fmt::format(
        "[plan] streaming loop {:.2f} GB/s, element-wise (SwiGLU forward + "
        "backward) {:.2f} GB/s per thread\n",
        stream / 1e9, elementwise / 1e9);

    Calibration c;
    c.device = "cpu";
    c.peak_bf16_tflops = curves[0].peak / 1e12;
    c.memory_tbps = stream / 1e12;
    CostParams& p = c.params;
    p = default_params(*find_plan_device("cpu"));
    p.gemm_efficiency = 1;
    p.dgrad_efficiency = curves[1].peak / curves[0].peak;
    p.wgrad_efficiency = curves[2].peak / curves[0].peak;
    p.gemm_half_dim = (curves[0].half_dim + curves[1].half_dim) / 2;
    p.wgrad_half_dim = curves[2].half_dim;
    p.memory_efficiency = 1;
    p.elementwise_efficiency = std::min(1.0, elementwise / stream);
    c.how = fmt::format(
        "epo plan --calibrate kernels: {} threads at once, bf16 oneDNN products "
        "and SwiGLU; load average before {}, after {}",
        rates.size(), load_before, load_text());
    p.source = "calibration (kernels)";
    return c;
}

}  // namespace epo::plan
