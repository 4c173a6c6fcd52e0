// Internal to the communicator's three sources, not part of the public interface
// (communicator.h is): the operation kinds, the phase-1 message, and the two helpers that more
// than one of the sources uses.
//   communicator.cpp              options, the all-to-all layout, statistics, the lifetime
//   communicator_phases.cpp       the three phases every operation runs (arrival, data, link hold)
//   communicator_collectives.cpp  the collectives, each built from those phases
#pragma once

#include <cstdint>
#include <string>

#include "epo/comm/communicator.h"

namespace epo::comm {

enum class Communicator::OpKind : uint32_t {
    kAllToAll = 1,
    kAllGather,
    kAllReduce,
    kBroadcast,
    kBarrier,
    kReduceScatter,
    kAllGatherShards
};

struct Communicator::Arrival {
    int64_t entry_ns;
    int64_t size;  // what the sender sends to the receiver (or the operation's common size)
    int64_t aux;   // a value all ranks must agree on: item size, root
    uint32_t seq;
    uint32_t kind;
};

namespace detail {

// The operation's name in messages ("all_to_all", ...).
const char* op_name(uint32_t kind);
// `v` as an MPI count; raises epo::Error naming `what` when it does not fit an int.
int to_int(int64_t v, const std::string& what);

}  // namespace detail

}  // namespace epo::comm
