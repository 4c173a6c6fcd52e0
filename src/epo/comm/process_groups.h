// The communicators of one stream: world, expert-parallel (ep), data-parallel (dp),
// expert-data-parallel (edp) and node groups of this rank, each its own MPI communicator, and the
// two halves of the EP group the flex dispatcher (flex_dispatcher.h) moves tokens over: ep_node,
// the EP group's ranks on this rank's node, and ep_peer, the EP group's ranks that have this
// rank's index inside their ep_node (one per node: the cross-node hop of a token goes to the rank
// of the same local index on the destination node).
//
// Why per stream: MPI requires every rank to issue the collectives of a communicator in the same
// order. Two streams issuing collectives concurrently on a shared communicator would interleave
// them differently on different ranks and deadlock; with one set per stream, each communicator
// sees exactly its stream's schedule order, which is the same on every rank.
//
// Creating a set is collective over `parent` (every rank must create its sets in the same order,
// normally at start-up on the main thread).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "epo/comm/communicator.h"
#include "epo/comm/topology.h"

namespace epo::comm {

struct ProcessGroups {
    ParallelLayout layout;
    Communicator world;
    Communicator ep;
    Communicator dp;
    Communicator edp;
    Communicator node;
    Communicator ep_node;  // EP group ∩ this rank's node, in EP-rank order
    Communicator ep_peer;  // EP ranks of this rank's local index in their node, in EP-rank order

    // `owner` names the stream in messages ("compute", "comm"). The layout's world_size must equal
    // the size of `parent`. One watchdog may be shared by several sets.
    static std::unique_ptr<ProcessGroups> create(const ParallelLayout& layout,
                                                 const CommOptions& options,
                                                 const std::string& owner,
                                                 std::shared_ptr<Watchdog> watchdog,
                                                 MPI_Comm parent = MPI_COMM_WORLD);

    Communicator& group(GroupKind kind);
    // Sum of every group's bytes (what a stream's task moved = difference of two readings).
    ByteCounts total_bytes() const;
};

}  // namespace epo::comm
