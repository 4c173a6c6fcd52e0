// The loop every wait of a Communicator runs: test a set of MPI requests, sleeping between tests,
// until all are done or a deadline passes; and the observed transfer rate that sizes the sleeps
// of the data phase.
//
// Why a loop and not a blocking call: a blocking MPI call busy-polls its thread for the whole
// wait, on the core the compute thread next to it needs (the other micro-batch's GEMMs). Open MPI
// moves bytes only inside MPI calls, though: over TCP each test writes what the socket takes and
// reads what arrived, and the kernel keeps the link busy from its socket buffers in between; over
// shared memory the receiver copies the whole message (one process_vm_readv) in the test that
// finds the sender's request. So the loop must test often enough that the socket buffers never
// drain, and rarely enough that testing costs next to nothing. Same-host peers ring a doorbell
// (doorbell.h) when there is something to do (they arrived, posted their sends, took our bytes),
// which ends a sleep at once; peers on other hosts are only seen at the next timed test.
//
// It does not decide what a timeout means: it returns false and the caller names the operation
// and the peers whose requests are still pending.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "epo/comm/doorbell.h"
#include "epo/comm/link_model.h"

namespace epo::comm {

// Test continuously for spin_us (after the start and after every doorbell ring), then sleep
// between tests: first_sleep_us, doubling up to max_sleep_us.
struct SleepSchedule {
    double spin_us = 20;
    double first_sleep_us = 50;
    double max_sleep_us = 1000;
};

// What one wait did (for statistics and tests).
struct ProgressCount {
    int64_t num_tests = 0;   // MPI_Testsome calls
    int64_t num_sleeps = 0;  // sleeps between them (each a futex wait, ended by time or a ring)
};

// Tests `requests` until every one is done (true) or `deadline` passes (false). done[i] is set
// when request i completes (entries already set are not waited for); on_done(i), if given, runs
// for each completion (e.g. to ring the peer whose bytes have arrived). `group` names the
// communicator in MPI errors; `scratch` is reused storage (no allocation per wait). Adds to
// `count`.
bool progress_requests(std::span<MPI_Request> requests, std::span<char> done, Doorbells& bells,
                       const SleepSchedule& schedule, Clock::time_point deadline,
                       const std::function<void(int)>& on_done, const std::string& group,
                       std::vector<int>& scratch, ProgressCount& count);

// After a timeout: cancels the pending receives (and waits for the cancellation, which is local,
// so that MPI writes nothing into their buffers later) and frees the pending sends. The
// communicator is unusable afterwards.
void withdraw_requests(std::span<MPI_Request> requests, std::span<const char> is_receive);

// A communicator's observed data-phase rate: bytes through this rank's busiest direction (sent or
// received, bytes to itself not counted) per second of data phase, averaged over the operations
// large enough to measure (an exponential average, so it follows a link that changes speed).
class TransferRate {
public:
    // The expected duration of a data phase moving `bytes`.
    double expected_s(int64_t bytes) const { return static_cast<double>(bytes) / bytes_per_s_; }
    // Records a data phase; phases under kMinBytes are dominated by latency and ignored.
    void observe(int64_t bytes, double seconds);
    double bytes_per_s() const { return bytes_per_s_; }

    static constexpr int64_t kMinBytes = 64 << 10;
    // Until a phase was measured: shared memory's order of magnitude here (~2-5 GB/s). Too high
    // for a slow link, which only makes the first phase test more often than needed.
    static constexpr double kInitialBytesPerS = 2e9;

private:
    double bytes_per_s_ = kInitialBytesPerS;
    bool measured_ = false;
};

}  // namespace epo::comm
