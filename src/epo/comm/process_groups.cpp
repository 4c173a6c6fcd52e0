#include "epo/comm/process_groups.h"

#include "epo/comm/mpi_runtime.h"
#include "epo/comm/rank_runner.h"
#include "epo/core/error.h"

namespace epo::comm {

namespace {

// Where a rank sits: its stage, and the layout of one stage (a world of world_size / P ranks, in
// which the stage groups are laid out as without PP).
struct Placement {
    ParallelLayout global;
    ParallelLayout stage_layout;
    int world_rank = 0;
    int stage = 0;
    int stage_size = 1;
    int local_rank() const { return world_rank - stage * stage_size; }
    bool per_stage(GroupKind kind) const {
        return kind != GroupKind::kWorld && kind != GroupKind::kNode &&
               kind != GroupKind::kPipeline;
    }
};

Placement placement_of(const ParallelLayout& layout, int world_rank) {
    Placement p;
    p.global = layout;
    p.world_rank = world_rank;
    const int P = layout.pipeline_model_parallel_size;
    p.stage_size = layout.world_size / P;
    p.stage = world_rank / p.stage_size;
    p.stage_layout = layout;
    p.stage_layout.world_size = p.stage_size;
    p.stage_layout.pipeline_model_parallel_size = 1;
    return p;
}

Communicator split(MPI_Comm parent, int color, int key, const std::string& name,
                   std::vector<int> world_ranks, const Placement& at, const CommOptions& options,
                   const std::string& owner, const std::shared_ptr<Watchdog>& watchdog) {
    Communicator::Members members;
    members.world_ranks = std::move(world_ranks);
    for (int r : members.world_ranks)
        members.nodes.push_back(node_of(at.global, r));
    MPI_Comm comm = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(parent, color, key, &comm),
              fmt::format("MPI_Comm_split for group {}", name));
    return Communicator(comm, fmt::format("{} (stream {})", name, owner), std::move(members),
                        options, watchdog);
}

Communicator make_group(const Placement& at, GroupKind kind, const CommOptions& options,
                        const std::string& owner, const std::shared_ptr<Watchdog>& watchdog,
                        MPI_Comm parent) {
    std::vector<int> members;
    int color = 0;
    if (at.per_stage(kind)) {
        const int offset = at.stage * at.stage_size;
        for (int r : group_members(at.stage_layout, kind, at.local_rank()))
            members.push_back(r + offset);
        // Colours unique over the world: stage, then the group inside the stage.
        color =
            at.stage * at.global.world_size + group_index(at.stage_layout, kind, at.local_rank());
    } else {
        members = group_members(at.global, kind, at.world_rank);
        color = group_index(at.global, kind, at.world_rank);
    }
    // Key = world rank, so group ranks follow world-rank order, as group_members() lists them.
    return split(parent, color, at.world_rank, group_name(kind), std::move(members), at, options,
                 owner, watchdog);
}

// The EP group's ranks on this rank's node (`peer` false) or of this rank's index inside its
// node's part of the EP group (`peer` true), and a colour naming that set. Defined for any layout;
// only a regular one (flex_ranks_per_node() accepts it) gives the flex dispatcher's geometry.
struct EpSubset {
    std::vector<int> members;
    int color = 0;
};
EpSubset ep_subset(const Placement& at, bool peer) {
    const int offset = at.stage * at.stage_size;
    std::vector<int> ep;
    for (int r : group_members(at.stage_layout, GroupKind::kExpertParallel, at.local_rank()))
        ep.push_back(r + offset);
    const auto node = [&](int r) { return node_of(at.global, r); };
    auto local_index = [&](int r) {
        int i = 0;
        for (int q : ep)
            i += q < r && node(q) == node(r);
        return i;
    };
    EpSubset s;
    for (int r : ep) {
        const bool in =
            peer ? local_index(r) == local_index(at.world_rank) : node(r) == node(at.world_rank);
        if (in)
            s.members.push_back(r);
    }
    // Colours unique over the world: stage and EP group index, then node (or local index).
    const int key = peer ? local_index(at.world_rank) : node(at.world_rank);
    const int ep_group = at.stage * at.stage_size +
                         group_index(at.stage_layout, GroupKind::kExpertParallel, at.local_rank());
    s.color = ep_group * at.global.world_size + key;
    return s;
}

Communicator make_ep_subset(const Placement& at, bool peer, const CommOptions& options,
                            const std::string& owner, const std::shared_ptr<Watchdog>& watchdog,
                            MPI_Comm parent) {
    EpSubset s = ep_subset(at, peer);
    return split(parent, s.color, at.world_rank, peer ? "ep_peer" : "ep_node", std::move(s.members),
                 at, options, owner, watchdog);
}

// The pipeline group: the rank at this place of every stage, in stage order.
Communicator make_pipeline_group(const Placement& at, const CommOptions& options,
                                 const std::string& owner,
                                 const std::shared_ptr<Watchdog>& watchdog, MPI_Comm parent) {
    std::vector<int> members;
    for (int s = 0; s < at.global.pipeline_model_parallel_size; ++s)
        members.push_back(s * at.stage_size + at.local_rank());
    return split(parent, at.local_rank(), at.world_rank, "pp", std::move(members), at, options,
                 owner, watchdog);
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
    if (layout.pipeline_model_parallel_size < 1 ||
        layout.world_size % layout.pipeline_model_parallel_size != 0) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("pipeline_model_parallel_size={} does not divide the world size "
                                "{}: launch a multiple of it or choose a divisor",
                                layout.pipeline_model_parallel_size, layout.world_size));
    }
    const Placement at = placement_of(layout, world_rank);
    validate_layout(at.stage_layout);
    auto make = [&](GroupKind kind) {
        return make_group(at, kind, options, owner, watchdog, parent);
    };
    auto make_ep = [&](bool peer) {
        return make_ep_subset(at, peer, options, owner, watchdog, parent);
    };
    // Creation order is fixed: MPI_Comm_split is collective over `parent` (braced initialisers
    // evaluate left to right). A rank that never comes ends the job at comm.timeout_s.
    std::unique_ptr<ProcessGroups> groups;
    watched_world_call(
        fmt::format("creating the communicators of stream {}", owner), options.timeout_s, [&] {
            groups.reset(new ProcessGroups{
                layout, make(GroupKind::kWorld), make(GroupKind::kExpertParallel),
                make(GroupKind::kDataParallel), make(GroupKind::kExpertDataParallel),
                make(GroupKind::kNode), make_ep(false), make_ep(true),
                make_pipeline_group(at, options, owner, watchdog, parent),
                make(GroupKind::kTensorParallel), make(GroupKind::kExpertTensorParallel),
                std::nullopt, std::nullopt});
            // Links k = 0 .. P-1, each a split every rank takes part in (MPI_UNDEFINED outside
            // it): stage k is group rank 0, stage k+1 mod P group rank 1.
            const int P = layout.pipeline_model_parallel_size;
            for (int k = 0; P > 1 && k < P; ++k) {
                const int next = (k + 1) % P;
                const bool sender = at.stage == k, receiver = at.stage == next;
                if (!sender && !receiver) {
                    MPI_Comm none = MPI_COMM_NULL;
                    check_mpi(MPI_Comm_split(parent, MPI_UNDEFINED, 0, &none),
                              "MPI_Comm_split for a pipeline link");
                    continue;
                }
                std::vector<int> members = {k * at.stage_size + at.local_rank(),
                                            next * at.stage_size + at.local_rank()};
                Communicator link =
                    split(parent, at.local_rank(), sender ? 0 : 1, fmt::format("pp_link{}", k),
                          std::move(members), at, options, owner, watchdog);
                (sender ? groups->pp_next : groups->pp_prev).emplace(std::move(link));
            }
            // The embedding group: a split every rank takes part in (MPI_UNDEFINED on the
            // middle stages), stage 0 group rank 0, stage P-1 group rank 1.
            if (P > 1) {
                const bool end_stage = at.stage == 0 || at.stage == P - 1;
                if (!end_stage) {
                    MPI_Comm none = MPI_COMM_NULL;
                    check_mpi(MPI_Comm_split(parent, MPI_UNDEFINED, 0, &none),
                              "MPI_Comm_split for the embedding group");
                } else {
                    std::vector<int> members = {at.local_rank(),
                                                (P - 1) * at.stage_size + at.local_rank()};
                    groups->embedding.emplace(split(parent, at.local_rank(), at.stage, "embedding",
                                                    std::move(members), at, options, owner,
                                                    watchdog));
                }
            }
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
        case GroupKind::kTensorParallel:
            return tp;
        case GroupKind::kPipeline:
            return pp;
        case GroupKind::kExpertTensorParallel:
            return etp;
    }
    EPO_CHECK(false, "stream {} has no {} communicator", world.name(), group_name(kind));
    return world;
}

ByteCounts ProcessGroups::total_bytes() const {
    ByteCounts total;
    for (const Communicator* c :
         {&world, &ep, &dp, &edp, &node, &ep_node, &ep_peer, &pp, &tp, &etp})
        total += c->stats().bytes;
    for (const std::optional<Communicator>* link : {&pp_next, &pp_prev, &embedding}) {
        if (link->has_value())
            total += (*link)->stats().bytes;
    }
    return total;
}

}  // namespace epo::comm
