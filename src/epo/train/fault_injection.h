// Fault injection for failure tests, as a wrapper around the node body the executor runs: the
// environment variable EPO_INJECT_FAILURE=RANK:STEP:CALL (CALL a schedule::call_name such as
// "mb1.layer0.combine.forward") makes that node's body throw on that rank in that step, so
// tests can check that one failing rank ends the whole job with a message. The step is issued
// exactly as any other: the wrapper is the only difference. Unset (the normal case), the body
// is not wrapped at all.
//
// The injected error is a failure of the node's own work (ErrorKind::kCompute, "compute
// failure"), not a communication error: no peer and no collective is involved, even when the
// node runs on the comm stream.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "epo/schedule/executor.h"
#include "epo/schedule/schedule.h"

namespace epo::train {

struct InjectedFailure {
    int rank = -1;
    int64_t step = 0;  // optimizer step, from 1
    std::string call;
};

// The parsed variable, or nullopt when unset or empty. A value that is not exactly
// RANK:STEP:CALL with decimal integers (such as "1x:2y" or "oops") is an epo::Error (kUsage)
// naming the variable, the value and the fix.
std::optional<InjectedFailure> injected_failure_from_env();

// Refuses (kUsage, naming the variable, the value and the fix) an injection that could never
// fire in this run: a rank outside [0, world_size), a step outside [1, train_iters], or a call
// the step's schedule does not have.
void check_injected_failure(const InjectedFailure& failure, int world_size, int64_t train_iters,
                            const std::vector<schedule::NodeCall>& calls);

// `body`, or when `failure` targets this rank and step, `body` behind a check that throws
// instead of running the targeted call.
schedule::NodeBody with_injected_failure(schedule::NodeBody body,
                                         const std::optional<InjectedFailure>& failure, int rank,
                                         int64_t step);

}  // namespace epo::train
