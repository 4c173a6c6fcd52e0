// The process's stop request: set by the SIGTERM/SIGINT handler (checkpoint/stop_signal.h), read
// by whatever waits a long time on purpose, so that a stop request ends the wait instead of
// waiting for it. Today that is the link model's hold (comm/link_model.h): a held collective has
// already moved its bytes, so cutting the hold short changes timings only, never the math, and the
// step in progress ends at once and the ranks can agree to stop.
//
// Process-wide by nature (a signal is): one lock-free atomic, async-signal-safe to set.
#pragma once

namespace epo {

// Records `signal` as the stop request unless one is already recorded; returns true when this
// call recorded it (the first request). Async-signal-safe.
bool request_stop(int signal) noexcept;

// The recorded stop signal, or 0.
int stop_requested() noexcept;

// Forgets the request (a new StopSignals, a test).
void clear_stop_request() noexcept;

}  // namespace epo
