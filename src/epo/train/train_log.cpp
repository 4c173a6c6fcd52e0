#include "epo/train/train_log.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <cmath>
#include <ctime>

namespace epo::train {

std::string format_fixed_significant(double value, int digits) {
    if (!std::isfinite(value)) {
        return fmt::format("{}", value);  // "nan" / "inf": what NaN detectors grep for
    }
    int decimals = 3;
    if (value != 0.0) {
        const int magnitude = static_cast<int>(std::floor(std::log10(std::fabs(value))));
        decimals = std::max(3, digits - 1 - magnitude);
    }
    return fmt::format("{:.{}f}", value, decimals);
}

std::string format_iteration_line(const IterationLog& log) {
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    std::string line = fmt::format(" [{:%Y-%m-%d %H:%M:%S}]", local);
    line += fmt::format(" iteration {:8d}/{:8d} |", log.iteration, log.train_iters);
    line += fmt::format(" consumed samples: {:12d} |", log.consumed_samples);
    line += fmt::format(" elapsed time per iteration (ms): {:.1f} |", log.elapsed_ms);
    line += fmt::format(" throughput per GPU (TFLOP/s/GPU): {:.1f} |", log.tflops_per_rank);
    line += fmt::format(" learning rate: {:.6E} |", log.learning_rate);
    line += fmt::format(" global batch size: {:5d} |", log.global_batch_size);
    line += fmt::format(" lm loss: {:.9E} |", log.lm_loss);
    if (log.mtp_loss) {
        line += fmt::format(" mtp_1 loss: {:.9E} |", *log.mtp_loss);
    }
    if (log.load_balancing_loss) {
        line += fmt::format(" load_balancing_loss: {:.9E} |", *log.load_balancing_loss);
    }
    line += " loss scale: 1.0 |";
    line += fmt::format(" grad norm: {} |", format_fixed_significant(log.grad_norm, 9));
    line += fmt::format(" number of skipped iterations: {:3d} |", log.skipped_iterations);
    line += fmt::format(" number of nan iterations: {:3d} |", log.nan_iterations);
    return line;
}

std::string format_step_time_line(double step_time_s, double tflops_per_rank) {
    return fmt::format("Step Time : {:.2f}s GPU utilization: {:.1f}MODEL_TFLOP/s/GPU", step_time_s,
                       tflops_per_rank);
}

}  // namespace epo::train
