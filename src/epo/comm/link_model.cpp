#include "epo/comm/link_model.h"

#include <sys/prctl.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <string_view>
#include <vector>

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
    if (std::string_view(key).ends_with("cpu_ns_per_byte")) {
        if (value > kMaxCpuNsPerByte) {
            return fmt::format(
                "{}={} ns per byte is more CPU than any network stack takes (at most {:g}, "
                "1 MB/s per core): set it to 0 (the NIC takes no host CPU) or a measured cost, "
                "e.g. 13 for kernel TCP on a 2-vCPU VM",
                key, value, kMaxCpuNsPerByte);
        }
        return "";
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
                  {"comm.link.latency_us", model.latency_us},
                  {"comm.link.cpu_ns_per_byte", model.cpu_ns_per_byte}};
    for (const auto& f : fields) {
        if (std::string problem = link_value_problem(f.key, f.value); !problem.empty())
            throw Error(ErrorKind::kConfig, problem);
    }
    if (model.cpu_ns_per_byte > 0 && !model.enabled()) {
        throw Error(ErrorKind::kConfig, cpu_without_link_problem(model.cpu_ns_per_byte));
    }
}

std::string cpu_without_link_problem(double cpu_ns_per_byte) {
    return fmt::format(
        "comm.link.cpu_ns_per_byte={} charges CPU to the modelled links, but the link model is "
        "off: set comm.link.inter_node_gbps (or intra_node_gbps / latency_us), or leave "
        "cpu_ns_per_byte at 0; over a real network the stack's CPU cost is already real",
        cpu_ns_per_byte);
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

double modelled_cpu_seconds(const LinkModel& model, const ByteCounts& bytes) {
    if (!model.enabled())
        return 0;
    return model.cpu_ns_per_byte * 1e-9 * static_cast<double>(bytes.inter_sent + bytes.inter_recv);
}

namespace {

double thread_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

bool burn_cpu(double cpu_s, Clock::time_point deadline) {
    // Copies through a buffer past the L2 caches, as the stack's copies stream through memory and
    // evict the compute thread's working set; allocated once per thread and touched once here
    // (page faults cost 10-25 us each on small VMs), then reused by every later charge.
    constexpr size_t kHalf = size_t{2} << 20;
    thread_local std::vector<char> buffer;
    if (buffer.empty())
        buffer.assign(2 * kHalf, 1);
    const double end = thread_cpu_seconds() + cpu_s;
    size_t chunk = 0;
    constexpr size_t kChunk = size_t{64} << 10;  // ~5-20 us of copying between clock reads
    while (thread_cpu_seconds() < end) {
        if (stop_requested() != 0 || Clock::now() >= deadline)
            return false;
        const size_t off = (chunk * kChunk) % kHalf;
        std::memcpy(buffer.data() + kHalf + off, buffer.data() + off, kChunk);
        ++chunk;
    }
    return true;
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
