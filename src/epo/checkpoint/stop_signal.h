// SIGTERM / SIGINT as a request to stop cleanly: the first signal sets a flag that the training
// loop reads at the next step boundary (the ranks then agree, save a checkpoint and exit 0); a
// second signal ends the process at once with status 128 + signal, without saving.
//
// This is how a job scheduler's preemption (SIGTERM to every task, then SIGKILL after a grace
// period) or a user's `kill` loses at most the step in progress. The handler does only what is
// async-signal-safe: it sets a flag and write()s a message prepared beforehand.
//
// Process-wide by nature (signal dispositions are): one StopSignals object at a time; it
// restores the previous handlers when destroyed.
#pragma once

#include <csignal>

namespace epo::checkpoint {

class StopSignals {
public:
    // Installs the handlers; `rank` and `world_size` name this process in its messages.
    StopSignals(int rank, int world_size);
    ~StopSignals();
    StopSignals(const StopSignals&) = delete;
    StopSignals& operator=(const StopSignals&) = delete;

    // The first stop signal received since construction (SIGTERM or SIGINT), or 0.
    int pending() const;

private:
    struct sigaction previous_term_ {};
    struct sigaction previous_int_ {};
};

// "SIGTERM", "SIGINT", or "signal N".
const char* signal_name(int signal);

}  // namespace epo::checkpoint
