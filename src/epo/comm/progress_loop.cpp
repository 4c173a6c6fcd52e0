#include "epo/comm/progress_loop.h"

#include <algorithm>
#include <cmath>

#include "epo/comm/mpi_runtime.h"

namespace epo::comm {

bool progress_requests(std::span<MPI_Request> requests, std::span<char> done, Doorbells& bells,
                       const SleepSchedule& schedule, Clock::time_point deadline,
                       const std::function<void(int)>& on_done, const std::string& group,
                       std::vector<int>& scratch, ProgressCount& count) {
    const auto spin = std::chrono::nanoseconds(std::llround(schedule.spin_us * 1e3));
    auto spin_end = Clock::now() + spin;
    double sleep_us = schedule.first_sleep_us;
    bool past_deadline = false;
    scratch.resize(requests.size());
    auto all_done = [&] { return std::all_of(done.begin(), done.end(), [](char d) { return d; }); };
    if (all_done())
        return true;
    for (;;) {
        // Read the bell before testing: a ring after this read makes the sleep below return.
        const uint32_t seen = bells.count();
        int completed = 0;
        ++count.num_tests;
        check_mpi(MPI_Testsome(static_cast<int>(requests.size()), requests.data(), &completed,
                               scratch.data(), MPI_STATUSES_IGNORE),
                  "MPI_Testsome", group);
        if (completed != MPI_UNDEFINED) {
            for (int i = 0; i < completed; ++i) {
                done[scratch[i]] = 1;
                if (on_done)
                    on_done(scratch[i]);
            }
        }
        if (completed == MPI_UNDEFINED || all_done())
            return true;
        const auto now = Clock::now();
        if (now >= deadline) {
            // One more test first: Open MPI's MPI_Testsome reports what earlier calls completed
            // and then progresses, so what its last call received shows only in the next one. A
            // rank descheduled past its deadline (a loaded machine, a stopped process) would
            // otherwise fail with its peers' messages already delivered.
            if (past_deadline)
                return false;
            past_deadline = true;
            continue;
        }
        if (completed > 0) {
            // Progress: the rest may follow at once (the next message of the same peer).
            spin_end = std::max(spin_end, now + spin);
        }
        if (now < spin_end)
            continue;
        const auto wake = now + std::chrono::nanoseconds(std::llround(sleep_us * 1e3));
        ++count.num_sleeps;
        if (bells.sleep_until(seen, std::min(deadline, wake))) {
            // A peer rang: test again now, and keep testing briefly in case what it announced
            // becomes visible to MPI a moment after the ring.
            spin_end = Clock::now() + spin;
            sleep_us = schedule.first_sleep_us;
        } else {
            sleep_us = std::min(sleep_us * 2, schedule.max_sleep_us);
        }
    }
}

void withdraw_requests(std::span<MPI_Request> requests, std::span<const char> is_receive) {
    for (size_t i = 0; i < requests.size(); ++i) {
        if (requests[i] == MPI_REQUEST_NULL)
            continue;
        if (is_receive[i]) {
            MPI_Cancel(&requests[i]);
            MPI_Wait(&requests[i], MPI_STATUS_IGNORE);
        } else {
            MPI_Request_free(&requests[i]);
        }
    }
}

void TransferRate::observe(int64_t bytes, double seconds) {
    if (bytes < kMinBytes || !(seconds > 0))
        return;
    const double rate = static_cast<double>(bytes) / seconds;
    // The first measurement replaces the guess; later ones move the average a quarter of the way.
    bytes_per_s_ = measured_ ? 0.75 * bytes_per_s_ + 0.25 * rate : rate;
    measured_ = true;
}

}  // namespace epo::comm
