// Calibration files of `epo plan` (docs/plan.md "Calibration"): the efficiency parameters of the
// cost model (cost_model.h) for one device, and, for `cpu`, the device figures measured here.
// `epo plan --calibrate kernels --out FILE` writes one from kernel measurements only (matrix
// products and an element-wise kernel of this runtime, timed on as many threads at once as the
// planned job has ranks on this host); `epo plan --calibration FILE` loads it.
//
// Kernel measurement: every thread times the same products, one after the other, in each of the
// three layouts training runs them in (forward A W^T; input gradient dY W; weight gradient
// dY^T X accumulated into f32), over shapes whose smallest dimension x runs from 64 to 1024,
// and fits the rate curve of cost_model.h per pass,
//
//   1 / rate(x) = a + b / x   (least squares of the relative error)  =>  peak_p = 1 / a,
//                                                               half_dim = b / a,
//
// then a streaming loop (a = b + s c, f32, beyond the caches) for the memory bandwidth and the
// SwiGLU forward and backward over (rows, 2F) for the element-wise kernels' share of it. The
// device's peak is the forward curve's peak; dgrad/wgrad efficiencies are their peaks over it.
//
// Deliberately not done: timing whole training steps (a plan calibrated from the runs it
// predicts would predict nothing).
#pragma once

#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "epo/plan/cost_model.h"
#include "epo/plan/hardware.h"

namespace epo::plan {

struct Calibration {
    std::string device;  // the env.gpu id it is for
    // Replace the device table's figures where given.
    std::optional<double> peak_bf16_tflops, memory_tbps, peak_fp8_tflops;
    CostParams params;
    std::string how;  // what was measured, where, under which load
};

void write_calibration(const std::filesystem::path& path, const Calibration& calibration);
// Every figure of CostParams and the device's peaks are read. kIo for a missing or unreadable
// file, kUsage for a malformed one (naming the field). comm_launch_us and graph_launch_us, which
// files written before they were read lack, are then the device's defaults (default_params).
Calibration read_calibration(const std::filesystem::path& path);
// kConfig when the file is for another device than `hardware` (naming both and the fix).
void apply_calibration(const Calibration& calibration, Hardware& hardware, CostParams& params);

// 1 / rate = a + b / x by least squares of the time's relative error over (x, rate) pairs; at
// least two distinct x.
struct RateCurve {
    double peak = 0;      // rate as x grows
    double half_dim = 0;  // x at which the rate is half the peak
};
RateCurve fit_rate_curve(const std::vector<double>& x, const std::vector<double>& rate);

struct KernelCalibrationOptions {
    int num_threads = 2;               // ranks per host of the planned job
    double seconds_per_measure = 0.5;  // each shape and pass, per thread (over 5 rounds)
};
// Measures this machine (one OpenMP thread per measuring thread: the caller sets
// OMP_NUM_THREADS=1 before oneDNN starts). Progress lines go to `log`.
Calibration calibrate_kernels(const KernelCalibrationOptions& options, std::ostream& log);

}  // namespace epo::plan
