// Doorbells: wake a rank sleeping in a collective's arrival phase as soon as a peer on the same
// host has arrived, instead of at its next timed test.
//
// Why: a rank waiting for late peers sleeps between MPI tests (it must not spin on the compute
// thread's core). Without a wake-up, the last rank to arrive finds its peers asleep and spins in
// the data phase until they wake (up to a sleep interval plus wake-up lateness, ~2 ms measured
// here), and every collective with a late peer ends that much later. With a doorbell, the
// arriving rank rings each same-host peer after sending its arrival message, and the sleeper
// wakes within microseconds.
//
// How: one bell per rank in a POSIX shared-memory segment shared by the ranks of the communicator
// that share a host; a bell is a counter and a sleeper count, and sleeping is a futex wait on the
// counter with an absolute deadline (so a missed ring costs at most one sleep interval). Peers on
// other hosts have no bell: waiting for them falls back to timed tests, as does everything if
// shared memory is unavailable. The segment is unlinked as soon as every rank has mapped it, so
// nothing is left behind even if the job is killed, and tearing down is local (munmap): a rank
// that unwinds after a failure never blocks on its peers here.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "epo/comm/link_model.h"

namespace epo::comm {

class Doorbells {
public:
    // Collective over `comm`; the destructor is local.
    explicit Doorbells(MPI_Comm comm);
    ~Doorbells();
    Doorbells(const Doorbells&) = delete;
    Doorbells& operator=(const Doorbells&) = delete;

    // True if group rank `peer` of the communicator shares this rank's host (has a bell).
    bool shares_host(int peer) const { return peers_[peer] != nullptr; }
    // Rings `peer`'s bell (call after the message it should look for was sent); no-op for a
    // peer on another host.
    void ring(int peer);
    // This rank's bell count: read it before testing, pass it to sleep_until().
    uint32_t count() const;
    // Sleeps until `deadline`, or until the bell has rung since `seen` was read. Returns true if
    // it was rung.
    bool sleep_until(uint32_t seen, Clock::time_point deadline);

private:
    struct Bell {
        uint32_t count;
        uint32_t sleepers;
    };
    void* segment_ = nullptr;  // mapped bells of this host's ranks
    size_t segment_bytes_ = 0;
    Bell local_{0, 0};  // this rank's bell when there is no shared segment
    Bell* mine_ = &local_;
    std::vector<Bell*> peers_;  // by group rank of the communicator; null = other host
};

}  // namespace epo::comm
