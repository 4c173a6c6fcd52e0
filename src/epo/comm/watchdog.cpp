#include "epo/comm/watchdog.h"

#include <vector>

#include "epo/comm/rank_runner.h"

namespace epo::comm {

Watchdog::Watchdog(OnExpired on_expired) : on_expired_(std::move(on_expired)) {
    if (!on_expired_) {
        on_expired_ = [](const std::string& message) { abort_job(message); };
    }
    thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

Watchdog::Guard::~Guard() {
    if (owner_ != nullptr)
        owner_->unwatch(id_);
}

Watchdog::Guard Watchdog::watch(std::string message, Clock::time_point deadline) {
    uint64_t id = 0;
    bool wake = false;
    {
        std::lock_guard lock(mutex_);
        id = next_id_++;
        entries_.emplace(id, Entry{deadline, std::move(message)});
        wake = deadline < wake_at_;
    }
    // The thread rescans at wake_at_ anyway; waking it for every operation would cost a context
    // switch on the compute thread's core per collective.
    if (wake)
        cv_.notify_all();
    return Guard(this, id);
}

void Watchdog::unwatch(uint64_t id) {
    std::lock_guard lock(mutex_);
    entries_.erase(id);
}

size_t Watchdog::num_watched() const {
    std::lock_guard lock(mutex_);
    return entries_.size();
}

void Watchdog::run() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
        const auto now = Clock::now();
        std::vector<std::string> expired;
        auto next = now + kIdleRescan;
        for (auto it = entries_.begin(); it != entries_.end();) {
            if (it->second.deadline <= now) {
                expired.push_back(std::move(it->second.message));
                it = entries_.erase(it);
            } else {
                next = std::min(next, it->second.deadline);
                ++it;
            }
        }
        if (!expired.empty()) {
            lock.unlock();
            for (const auto& message : expired)
                on_expired_(message);
            lock.lock();
            continue;
        }
        wake_at_ = next;
        cv_.wait_until(lock, next);
    }
}

}  // namespace epo::comm
