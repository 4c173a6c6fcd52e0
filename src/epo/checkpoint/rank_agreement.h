// Agreement between ranks on the main thread, between steps: whether to stop, whether a
// checkpoint was written or read everywhere, and which error to report when it was not.
//
// The training loop's streams own their communicators; the main thread gets its own "control"
// communicator over the world (its own MPI communicator, so its collectives never interleave with
// a stream's), with the same deadlines and watchdog semantics: a peer that never arrives ends the
// job after comm.timeout_s with a message naming it, so no rank waits forever for a dead one.
//
// The rule for failures that only some ranks see (a corrupt file on one rank, a full disk on
// another): every rank reaches the same verdict. agree_on_success() throws, on every rank, the
// error of the lowest failing rank, with that rank named; no rank goes on alone.
#pragma once

#include <exception>
#include <string>
#include <vector>

#include "epo/comm/communicator.h"
#include "epo/comm/topology.h"

namespace epo::checkpoint {

// Collective over MPI_COMM_WORLD (every rank, same point, main thread).
comm::Communicator make_control_communicator(const comm::ParallelLayout& layout, double timeout_s);

// Every rank's string, in rank order.
std::vector<std::string> all_gather_strings(comm::Communicator& world, const std::string& local);

// Root's string on every rank.
std::string broadcast_string(comm::Communicator& world, const std::string& value, int root);

// Returns when no rank failed. Otherwise every rank throws an epo::Error of the lowest failing
// rank's kind: "rank R of N: <its message>" (kInternal for exceptions that are not epo::Error).
void agree_on_success(comm::Communicator& world, const std::exception_ptr& local_failure);

struct StopRequest {
    int rank = -1;   // lowest rank that asked to stop; -1: none
    int signal = 0;  // the signal it received
    bool requested() const { return rank >= 0; }
};

// Collective: `local_signal` is this rank's pending stop signal (0: none).
StopRequest agree_on_stop(comm::Communicator& world, int local_signal);

}  // namespace epo::checkpoint
