// The two streams of a rank (docs/runtime.md "Streams and events"): `compute` and `comm`, each with
// its own set of communicators, sharing one watchdog. A failure on either ends the whole job with
// this rank's number and the message (comm::abort_job), since peers may be blocked waiting for this
// rank.
//
// Creating them is collective over `parent` (the job's ranks, MPI_COMM_WORLD unless a test or a
// harness runs several jobs side by side): call it at start-up, on every rank of `parent`.
#pragma once

#include <mpi.h>

#include <memory>

#include "epo/comm/communicator.h"
#include "epo/comm/topology.h"
#include "epo/runtime/stream.h"

namespace epo::runtime {

struct RankStreams {
    std::unique_ptr<Stream> compute;
    std::unique_ptr<Stream> comm;

    void synchronize() {
        compute->synchronize();
        comm->synchronize();
    }
};

RankStreams make_rank_streams(const comm::ParallelLayout& layout, const comm::CommOptions& options,
                              MPI_Comm parent = MPI_COMM_WORLD);

}  // namespace epo::runtime
