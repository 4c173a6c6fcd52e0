#include "epo/core/stop_flag.h"

#include <atomic>

namespace epo {
namespace {
// Signal handlers can reach only static storage; a lock-free atomic is async-signal-safe.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
}  // namespace

bool request_stop(int signal) noexcept {
    int expected = 0;
    return g_stop_signal.compare_exchange_strong(expected, signal);
}

int stop_requested() noexcept {
    return g_stop_signal.load();
}

void clear_stop_request() noexcept {
    g_stop_signal.store(0);
}

}  // namespace epo
