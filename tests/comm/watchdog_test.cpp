// The watchdog fires for an operation still running at its deadline, with its message, and never
// for one that finished; a later registration with an earlier deadline is not delayed by an
// earlier one with a later deadline.
#include "epo/comm/watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <vector>

namespace epo::comm {
namespace {

struct Fired {
    std::mutex mutex;
    std::vector<std::pair<std::string, Clock::time_point>> calls;
    Watchdog::OnExpired callback() {
        return [this](const std::string& m) {
            std::lock_guard lock(mutex);
            calls.emplace_back(m, Clock::now());
        };
    }
    size_t count() {
        std::lock_guard lock(mutex);
        return calls.size();
    }
};

void wait_for(Fired& fired, size_t n, std::chrono::seconds limit) {
    const auto end = Clock::now() + limit;
    while (fired.count() < n && Clock::now() < end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
}

TEST(Watchdog, FiresForAnOperationPastItsDeadline) {
    Fired fired;
    Watchdog dog(fired.callback());
    const auto deadline = Clock::now() + std::chrono::milliseconds(50);
    auto guard = dog.watch("all_to_all #3 on group ep: stuck", deadline);
    wait_for(fired, 1, std::chrono::seconds(10));
    ASSERT_EQ(fired.count(), 1u);
    EXPECT_EQ(fired.calls[0].first, "all_to_all #3 on group ep: stuck");
    EXPECT_GE(fired.calls[0].second, deadline);
    EXPECT_EQ(dog.num_watched(), 0u);
}

TEST(Watchdog, FinishedOperationsNeverFire) {
    Fired fired;
    Watchdog dog(fired.callback());
    for (int i = 0; i < 100; ++i) {
        auto guard = dog.watch("op", Clock::now() + std::chrono::milliseconds(30));
    }
    EXPECT_EQ(dog.num_watched(), 0u);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(fired.count(), 0u);
}

TEST(Watchdog, EarlierDeadlineRegisteredLaterFiresFirst) {
    Fired fired;
    Watchdog dog(fired.callback());
    // Let the thread settle into its idle sleep, then register a long and a short deadline.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto slow = dog.watch("slow", Clock::now() + std::chrono::seconds(30));
    const auto short_deadline = Clock::now() + std::chrono::milliseconds(40);
    auto fast = dog.watch("fast", short_deadline);
    wait_for(fired, 1, std::chrono::seconds(10));
    ASSERT_EQ(fired.count(), 1u);
    EXPECT_EQ(fired.calls[0].first, "fast");
    // Well before the idle rescan (1 s) and the slow deadline: the short one woke the thread.
    EXPECT_LT(fired.calls[0].second, short_deadline + std::chrono::milliseconds(900));
    EXPECT_EQ(dog.num_watched(), 1u);
}

}  // namespace
}  // namespace epo::comm
