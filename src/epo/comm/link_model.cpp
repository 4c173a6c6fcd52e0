#include "epo/comm/link_model.h"

#include <sys/prctl.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <ctime>
#include <string_view>

#include "epo/comm/link_limits.h"
#include "epo/core/error.h"
#include "epo/core/stop_flag.h"

namespace epo::comm {

ByteCounts& ByteCounts::operator+=(const ByteCounts& o) {
    intra_sent += o.intra_sent;
    intra_recv += o.intra_recv;
    inter_sent += o.inter_sent;
    inter_recv += o.inter_recv;
    return *this;
}

ByteCounts operator-(ByteCounts a, const ByteCounts& b) {
    a.intra_sent -= b.intra_sent;
    a.intra_recv -= b.intra_recv;
    a.inter_sent -= b.inter_sent;
    a.inter_recv -= b.inter_recv;
    return a;
}

std::string link_value_problem(const char* key, double value) {
    if (!std::isfinite(value) || value < 0) {
        return fmt::format(
            "{}={} is not a finite non-negative number: set it to 0 (link model "
            "off) or a positive value",
            key, value);
    }
    const bool latency = std::string_view(key).ends_with("latency_us");
    if (latency && value > kMaxLatencyUs) {
        return fmt::format(
            "{}={} is more than {} s per collective (the key is in microseconds): "
            "set it to at most {:g}, e.g. 5 for a real NIC",
            key, value, kMaxLatencyUs * 1e-6, kMaxLatencyUs);
    }
    if (!latency && value != 0 && (value < kMinLinkGbps || value > kMaxLinkGbps)) {
        return fmt::format(
            "{}={} Gbit/s is outside [{:g}, {:g}]: set it to 0 (that path "
            "unmodelled) or a bandwidth in that range, e.g. 400 for a 400 Gbit/s "
            "NIC",
            key, value, kMinLinkGbps, kMaxLinkGbps);
    }
    return "";
}

void validate_link_model(const LinkModel& model) {
    const struct {
        const char* key;
        double value;
    } fields[] = {{"comm.link.inter_node_gbps", model.inter_node_gbps},
                  {"comm.link.intra_node_gbps", model.intra_node_gbps},
                  {"comm.link.latency_us", model.latency_us}};
    for (const auto& f : fields) {
        if (std::string problem = link_value_problem(f.key, f.value); !problem.empty())
            throw Error(ErrorKind::kConfig, problem);
    }
}

double modelled_seconds(const LinkModel& model, const ByteCounts& bytes) {
    if (!model.enabled())
        return 0;
    // Gbit/s -> bytes/s: * 1e9 / 8.
    auto transfer = [](int64_t sent, int64_t recv, double gbps) {
        return gbps > 0 ? static_cast<double>(std::max(sent, recv)) / (gbps * 1e9 / 8) : 0.0;
    };
    const double inter = transfer(bytes.inter_sent, bytes.inter_recv, model.inter_node_gbps);
    const double intra = transfer(bytes.intra_sent, bytes.intra_recv, model.intra_node_gbps);
    return model.latency_us * 1e-6 + std::max(inter, intra);
}

void lower_timer_slack() {
    thread_local bool lowered = false;
    if (!lowered) {
        prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
        lowered = true;
    }
}

void sleep_until(Clock::time_point deadline) {
    lower_timer_slack();
    const int64_t ns = to_ns(deadline);
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(ns / 1000000000);
    ts.tv_nsec = static_cast<long>(ns % 1000000000);
    // steady_clock is CLOCK_MONOTONIC on Linux, so the absolute deadline is in the same time base.
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
    }
}

bool hold_until(Clock::time_point deadline) {
    // Why slices and not a wake-up from the handler: the signal lands on any thread of the
    // process, and a handler cannot wake a sleeper it does not know; a 20 ms slice costs 50
    // wake-ups a second only while a hold lasts, and a stop is seen within one slice.
    constexpr auto kSlice = std::chrono::milliseconds(kHoldSliceMs);
    for (;;) {
        if (stop_requested() != 0)
            return false;
        const auto now = Clock::now();
        if (now >= deadline)
            return true;
        sleep_until(std::min(deadline, now + kSlice));
    }
}

}  // namespace epo::comm
