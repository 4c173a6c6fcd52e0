// The communicators of one stream: world, tensor-parallel (tp), expert-tensor-parallel (etp),
// expert-parallel (ep),
// data-parallel (dp), expert-data-parallel (edp) and node groups of this rank (topology.h lays
// them out as Megatron-Core does), each its own MPI communicator, and the
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
// Pipeline parallelism (layout.pipeline_model_parallel_size = P > 1): the world is P stages of
// world_size / P consecutive ranks (the reference's order, pipeline outermost), and tp, ep, dp,
// edp, ep_node and ep_peer are those of the rank's own stage, laid out inside it as a world of one
// stage would be. pp is the pipeline group (the rank of each stage with this rank's place in its
// stage, in stage order); pp_next and pp_prev are two-rank links, link k joining stage k (group
// rank 0) to stage k+1 mod P (group rank 1): pp_next is the link of this rank's stage, pp_prev the
// previous stage's. A transfer between stages is a broadcast on a link from its sender, so it has
// every collective's deadline (naming the peer), byte accounting and link model.
// embedding (P > 1, on the first and the last stage only) is the reference's embedding group: the
// rank of stage 0 and the rank of stage P-1 at this rank's place in the stage, which sum the
// gradients of the two copies of the word embedding (model/gpt_model.h "Embedding copy").
//
// Creating a set is collective over `parent` (every rank must create its sets in the same order,
// normally at start-up on the main thread).
#pragma once

#include <mpi.h>

#include <memory>
#include <optional>
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
    Communicator pp;       // one rank per stage, in stage order (size 1 without PP)
    Communicator tp;       // TP consecutive ranks (size 1 without TP)
    Communicator etp;      // ETP consecutive ranks: the experts' TP group (size 1 without ETP)
    std::optional<Communicator> pp_next, pp_prev;  // P > 1 only
    std::optional<Communicator> embedding;         // P > 1, stages 0 and P-1 only

    int num_stages() const { return layout.pipeline_model_parallel_size; }
    int stage() const { return pp.rank(); }

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
