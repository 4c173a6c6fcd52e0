// A thread that ends the job when an operation outlives its deadline.
//
// A blocking MPI call cannot time out by itself. Communicators therefore register every blocking
// phase here (watch() returns a guard; destroying the guard = the phase finished). If a watched
// phase is still running at its deadline, the watchdog calls its expiry action with the message
// given at registration: by default abort_job(), which prints the message (naming operation,
// group and, when known, the peers that had not arrived) and ends every rank. The thread sleeps
// on a condition variable until the earliest deadline (at most a second while idle), and a new
// registration wakes it only when its deadline comes before that: watching costs no context switch.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "epo/comm/link_model.h"

namespace epo::comm {

class Watchdog {
public:
    using OnExpired = std::function<void(const std::string& message)>;

    // `on_expired` runs on the watchdog thread; empty = abort_job(message).
    explicit Watchdog(OnExpired on_expired = {});
    ~Watchdog();
    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;

    class Guard {
    public:
        Guard(Guard&& other) noexcept : owner_(other.owner_), id_(other.id_) {
            other.owner_ = nullptr;
        }
        Guard(const Guard&) = delete;
        Guard& operator=(const Guard&) = delete;
        Guard& operator=(Guard&&) = delete;
        ~Guard();

    private:
        friend class Watchdog;
        Guard(Watchdog* owner, uint64_t id) : owner_(owner), id_(id) {}
        Watchdog* owner_;
        uint64_t id_;
    };

    // Watches an operation until the returned guard is destroyed; `message` says what expired.
    [[nodiscard]] Guard watch(std::string message, Clock::time_point deadline);

    // Number of operations being watched (for tests).
    size_t num_watched() const;

private:
    void run();
    void unwatch(uint64_t id);

    static constexpr std::chrono::milliseconds kIdleRescan{1000};

    struct Entry {
        Clock::time_point deadline;
        std::string message;
    };
    OnExpired on_expired_;
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::map<uint64_t, Entry> entries_;
    uint64_t next_id_ = 0;
    // When the thread will next rescan; a deadline after it needs no wake-up.
    Clock::time_point wake_at_ = Clock::time_point::min();
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace epo::comm
