#include "epo/comm/topology.h"

#include "epo/core/error.h"

namespace epo::comm {

void validate_layout(const ParallelLayout& layout) {
    if (layout.world_size < 1) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("world size {} is not positive: launch at least one rank",
                                layout.world_size));
    }
    const int ep = layout.expert_model_parallel_size;
    if (ep < 1) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("expert_model_parallel_size={} is not positive: set it to 1 or "
                                "more",
                                ep));
    }
    if (layout.world_size % ep != 0) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("expert_model_parallel_size={} does not divide the world size {}: "
                                "launch a multiple of {} ranks or choose a divisor of {}",
                                ep, layout.world_size, ep, layout.world_size));
    }
    if (layout.gpus_per_node < 1) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("gpus_per_node={} is not positive: set the ranks per node (1 or "
                                "more)",
                                layout.gpus_per_node));
    }
}

const char* group_name(GroupKind kind) {
    switch (kind) {
        case GroupKind::kWorld:
            return "world";
        case GroupKind::kExpertParallel:
            return "ep";
        case GroupKind::kDataParallel:
            return "dp";
        case GroupKind::kExpertDataParallel:
            return "edp";
        case GroupKind::kNode:
            return "node";
    }
    return "?";
}

int node_of(const ParallelLayout& layout, int world_rank) {
    return world_rank / layout.gpus_per_node;
}

int num_nodes(const ParallelLayout& layout) {
    return (layout.world_size + layout.gpus_per_node - 1) / layout.gpus_per_node;
}

int group_index(const ParallelLayout& layout, GroupKind kind, int world_rank) {
    const int ep = layout.expert_model_parallel_size;
    switch (kind) {
        case GroupKind::kWorld:
        case GroupKind::kDataParallel:
            return 0;
        case GroupKind::kExpertParallel:
            return world_rank / ep;
        case GroupKind::kExpertDataParallel:
            return world_rank % ep;
        case GroupKind::kNode:
            return node_of(layout, world_rank);
    }
    return 0;
}

std::vector<int> group_members(const ParallelLayout& layout, GroupKind kind, int world_rank) {
    validate_layout(layout);
    EPO_CHECK(world_rank >= 0 && world_rank < layout.world_size, "rank {} of {}", world_rank,
              layout.world_size);
    const int ep = layout.expert_model_parallel_size;
    std::vector<int> members;
    switch (kind) {
        case GroupKind::kWorld:
        case GroupKind::kDataParallel:
            for (int r = 0; r < layout.world_size; ++r)
                members.push_back(r);
            break;
        case GroupKind::kExpertParallel:
            for (int r = world_rank / ep * ep; r < (world_rank / ep + 1) * ep; ++r) {
                members.push_back(r);
            }
            break;
        case GroupKind::kExpertDataParallel:
            for (int r = world_rank % ep; r < layout.world_size; r += ep)
                members.push_back(r);
            break;
        case GroupKind::kNode: {
            const int first = node_of(layout, world_rank) * layout.gpus_per_node;
            for (int r = first; r < layout.world_size && r < first + layout.gpus_per_node; ++r) {
                members.push_back(r);
            }
            break;
        }
    }
    return members;
}

}  // namespace epo::comm
