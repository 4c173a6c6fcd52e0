// The per-iteration log lines, in the reference system's format so that existing log parsers
// (Megatron-LM / Megatron-Bridge and the tools built on them) read EPO's logs unchanged:
//
//  [2026-11-29 12:00:00] iteration       10/     200 | consumed samples:          640 |
//   elapsed time per iteration (ms): 812.3 | throughput per GPU (TFLOP/s/GPU): 0.4 |
//   learning rate: 3.000000E-04 | global batch size:    64 | lm loss: 5.123456789E+00 |
//   mtp_1 loss: 5.234567891E+00 | load_balancing_loss: 1.000123456E+00 | loss scale: 1.0 |
//   grad norm: 1.23456789 | number of skipped iterations:   0 | number of nan iterations:   0 |
//  Step Time : 0.81s GPU utilization: 0.4MODEL_TFLOP/s/GPU
//
// (one line each; wrapped here). The loss and grad norm carry at least nine significant digits
// so two runs can be compared exactly from their logs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace epo::train {

struct IterationLog {
    int64_t iteration = 0;  // from 1
    int64_t train_iters = 0;
    int64_t consumed_samples = 0;
    double elapsed_ms = 0.0;
    double tflops_per_rank = 0.0;
    double learning_rate = 0.0;
    int64_t global_batch_size = 0;
    double lm_loss = 0.0;
    // Multi-token prediction: the MTP layer's loss (unscaled, as Megatron-Core's
    // MTPLossLoggingHelper logs "mtp_1 loss"), when the model has one.
    std::optional<double> mtp_loss;
    std::optional<double> load_balancing_loss;  // summed router aux losses, when the model has them
    double grad_norm = 0.0;
    int64_t skipped_iterations = 0;
    int64_t nan_iterations = 0;
};

// The " [date] iteration ..." line (no trailing newline).
std::string format_iteration_line(const IterationLog& log);

// The "Step Time : X.XXs GPU utilization: Y.YMODEL_TFLOP/s/GPU" line.
std::string format_step_time_line(double step_time_s, double tflops_per_rank);

// `value` in fixed notation with at least `digits` significant digits (and at least 3
// decimals), as the grad norm is printed: parsers read it with [\d.]+.
std::string format_fixed_significant(double value, int digits);

}  // namespace epo::train
