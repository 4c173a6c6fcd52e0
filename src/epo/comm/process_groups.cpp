#include "epo/comm/process_groups.h"

#include "epo/comm/mpi_runtime.h"
#include "epo/comm/rank_runner.h"
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

// The EP group's ranks on this rank's node (`peer` false) or of this rank's index inside its
// node's part of the EP group (`peer` true), and a colour naming that set. Defined for any layout;
// only a regular one (flex_ranks_per_node() accepts it) gives the flex dispatcher's geometry.
struct EpSubset {
    std::vector<int> members;
    int color = 0;
};
EpSubset ep_subset(const ParallelLayout& layout, int world_rank, bool peer) {
    const std::vector<int> ep = group_members(layout, GroupKind::kExpertParallel, world_rank);
    auto local_index = [&](int r) {
        int i = 0;
        for (int q : ep)
            i += q < r && node_of(layout, q) == node_of(layout, r);
        return i;
    };
    EpSubset s;
    for (int r : ep) {
        const bool in = peer ? local_index(r) == local_index(world_rank)
                             : node_of(layout, r) == node_of(layout, world_rank);
        if (in)
            s.members.push_back(r);
    }
    // Colours unique over the world: EP group index, then node (or local index).
    const int key = peer ? local_index(world_rank) : node_of(layout, world_rank);
    s.color = group_index(layout, GroupKind::kExpertParallel, world_rank) * layout.world_size + key;
    return s;
}

Communicator make_ep_subset(const ParallelLayout& layout, bool peer, const CommOptions& options,
                            const std::string& owner, const std::shared_ptr<Watchdog>& watchdog,
                            MPI_Comm parent, int world_rank) {
    const EpSubset s = ep_subset(layout, world_rank, peer);
    Communicator::Members members;
    members.world_ranks = s.members;
    for (int r : members.world_ranks)
        members.nodes.push_back(node_of(layout, r));
    const char* name = peer ? "ep_peer" : "ep_node";
    MPI_Comm comm = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(parent, s.color, world_rank, &comm),
              fmt::format("MPI_Comm_split for group {}", name));
    return Communicator(comm, fmt::format("{} (stream {})", name, owner), std::move(members),
                        options, watchdog);
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
    auto make_ep = [&](bool peer) {
        return make_ep_subset(layout, peer, options, owner, watchdog, parent, world_rank);
    };
    // Creation order is fixed: MPI_Comm_split is collective over `parent` (braced initialisers
    // evaluate left to right). A rank that never comes ends the job at comm.timeout_s.
    std::unique_ptr<ProcessGroups> groups;
    watched_world_call(fmt::format("creating the communicators of stream {}", owner),
                       options.timeout_s, [&] {
                           groups.reset(new ProcessGroups{
                               layout, make(GroupKind::kWorld), make(GroupKind::kExpertParallel),
                               make(GroupKind::kDataParallel), make(GroupKind::kExpertDataParallel),
                               make(GroupKind::kNode), make_ep(false), make_ep(true)});
                       });
    return groups;
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
    for (const Communicator* c : {&world, &ep, &dp, &edp, &node, &ep_node, &ep_peer})
        total += c->stats().bytes;
    return total;
}

}  // namespace epo::comm
