// What the link model (link_model.h) can honour, and its hold. The hold never outlasts
// comm.timeout_s: the communicator fails an operation whose modelled time would end past its
// deadline with the timeout error instead of sleeping (a valid but tiny bandwidth used to hold
// each collective for years), and a stop request (core/stop_flag.h: SIGTERM) cuts a hold short,
// since the bytes have moved already and only the waiting is left.
#pragma once

#include <string>

#include "epo/comm/link_model.h"

namespace epo::comm {

// The values a link may take besides 0 (off). Below 1 Mbit/s a 1 MB all-to-all is held over two
// hours, and far below it the byte / bandwidth quotient leaves the range a nanosecond deadline
// can hold (1e-300 Gbit/s overflowed into no hold at all); above 1e9 Gbit/s nothing is modelled
// any more. A latency above 10 s per collective is a unit mistake (the key is in microseconds).
constexpr double kMinLinkGbps = 1e-3;
constexpr double kMaxLinkGbps = 1e9;
constexpr double kMaxLatencyUs = 1e7;

// The longest comm.timeout_s accepted: 1e7 s (116 days) is beyond any job and keeps every
// deadline (entry + timeout in int64 nanoseconds, overflowing at 9.2e9 s) exact; larger values
// overflowed into an immediate false timeout.
constexpr double kMaxTimeoutS = 1e7;

// "" when `value` is fine for the key comm.link.<...> `key`, else the message naming the key, the
// value and the fix. validate_link_model() raises it; the configuration's rules report it.
std::string link_value_problem(const char* key, double value);

// The hold: sleep_until(deadline), in slices of at most kHoldSliceMs, returning early (false) as
// soon as a stop request is seen; true when the deadline was reached. Every slice ends at an
// absolute time, so slicing adds no drift.
constexpr int kHoldSliceMs = 20;
bool hold_until(Clock::time_point deadline);

}  // namespace epo::comm
