#include "epo/comm/process_groups.h"

#include "epo/comm/mpi_runtime.h"
#include "epo/core/error.h"

namespace epo::comm {

namespace {

Communicator make_group(const ParallelLayout& layout, GroupKind kind, const CommOptions& options,
                        const std::string& owner, const std::shared_ptr<Watchdog>& watchdog,
                        MPI_Comm parent, int world_rank) {
    Communicator::Members members;
    members.world_ranks = group_members(layout, kind, world_rank);
    for (int r : members.world_ranks)
        members.nodes.push_back(node_of(layout, r));
    // Key = world rank, so group ranks follow world-rank order, as group_members() lists them.
    MPI_Comm comm = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(parent, group_index(layout, kind, world_rank), world_rank, &comm),
              fmt::format("MPI_Comm_split for group {}", group_name(kind)));
    return Communicator(comm, fmt::format("{} (stream {})", group_name(kind), owner),
                        std::move(members), options, watchdog);
}

}  // namespace

std::unique_ptr<ProcessGroups> ProcessGroups::create(const ParallelLayout& layout,
                                                     const CommOptions& options,
                                                     const std::string& owner,
                                                     std::shared_ptr<Watchdog> watchdog,
                                                     MPI_Comm parent) {
    validate_layout(layout);
    validate_comm_options(options);
    int parent_size = 0;
    int world_rank = 0;
    check_mpi(MPI_Comm_size(parent, &parent_size), "MPI_Comm_size");
    check_mpi(MPI_Comm_rank(parent, &world_rank), "MPI_Comm_rank");
    if (parent_size != layout.world_size) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("the layout is for {} ranks but the job has {}: launch with "
                                "-np {} or adjust the parallel sizes",
                                layout.world_size, parent_size, layout.world_size));
    }
    if (!watchdog)
        watchdog = std::make_shared<Watchdog>();
    auto make = [&](GroupKind kind) {
        return make_group(layout, kind, options, owner, watchdog, parent, world_rank);
    };
    // Creation order is fixed: MPI_Comm_split is collective over `parent`.
    return std::unique_ptr<ProcessGroups>(
        new ProcessGroups{layout, make(GroupKind::kWorld), make(GroupKind::kExpertParallel),
                          make(GroupKind::kDataParallel), make(GroupKind::kExpertDataParallel),
                          make(GroupKind::kNode)});
}

Communicator& ProcessGroups::group(GroupKind kind) {
    switch (kind) {
        case GroupKind::kWorld:
            return world;
        case GroupKind::kExpertParallel:
            return ep;
        case GroupKind::kDataParallel:
            return dp;
        case GroupKind::kExpertDataParallel:
            return edp;
        case GroupKind::kNode:
            return node;
    }
    return world;
}

ByteCounts ProcessGroups::total_bytes() const {
    ByteCounts total;
    for (const Communicator* c : {&world, &ep, &dp, &edp, &node})
        total += c->stats().bytes;
    return total;
}

}  // namespace epo::comm
