#include "epo/comm/topology.h"

#include <optional>

#include "epo/core/error.h"

namespace epo::comm {

void validate_layout(const ParallelLayout& layout) {
    if (layout.world_size < 1) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("world size {} is not positive: launch at least one rank",
                                layout.world_size));
    }
    const auto positive = [](const char* field, int value) {
        if (value < 1) {
            throw Error(ErrorKind::kConfig,
                        fmt::format("{}={} is not positive: set it to 1 or more", field, value));
        }
    };
    const int ep = layout.expert_model_parallel_size;
    positive("expert_model_parallel_size", ep);
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
    const int tp = layout.tensor_model_parallel_size;
    const int etp = layout.expert_tensor_parallel_size;
    const int pp = layout.pipeline_model_parallel_size;
    positive("tensor_model_parallel_size", tp);
    positive("expert_tensor_parallel_size", etp);
    positive("pipeline_model_parallel_size", pp);
    if (layout.world_size % (tp * pp) != 0) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("tensor_model_parallel_size={} x pipeline_model_parallel_size={} "
                                "= {} does not divide the world size {}: the dense layers' "
                                "tensor, data and pipeline groups must tile the world; launch a "
                                "multiple of {} ranks or choose TP and PP whose product divides {}",
                                tp, pp, tp * pp, layout.world_size, tp * pp, layout.world_size));
    }
    if (layout.world_size % (etp * ep * pp) != 0) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("expert_tensor_parallel_size={} x expert_model_parallel_size={} x "
                                "pipeline_model_parallel_size={} = {} does not divide the world "
                                "size {}: the MoE layers' expert tensor, expert, expert-data and "
                                "pipeline groups must tile the world; launch a multiple of {} "
                                "ranks or choose ETP, EP and PP whose product divides {}",
                                etp, ep, pp, etp * ep * pp, layout.world_size, etp * ep * pp,
                                layout.world_size));
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
        case GroupKind::kTensorParallel:
            return "tp";
        case GroupKind::kExpertTensorParallel:
            return "etp";
        case GroupKind::kPipeline:
            return "pp";
    }
    return "?";
}

int node_of(const ParallelLayout& layout, int world_rank) {
    return world_rank / layout.gpus_per_node;
}

int num_nodes(const ParallelLayout& layout) {
    return (layout.world_size + layout.gpus_per_node - 1) / layout.gpus_per_node;
}

namespace {

// One of Megatron-Core's RankGenerator orders: the sizes of its dimensions, first fastest (a
// rank's coordinate in dimension d is rank / (product of the sizes before d) % size d), and the
// dimension a group varies.
struct RankGrid {
    std::vector<int> sizes;
    int axis = 0;
};

// Dense order tp-cp-dp-pp (CP = 1 is left out) or expert order etp-ep-edp-pp; nullopt for the
// kinds that are not a dimension of either (world, node).
std::optional<RankGrid> rank_grid(const ParallelLayout& layout, GroupKind kind) {
    const int tp = layout.tensor_model_parallel_size;
    const int pp = layout.pipeline_model_parallel_size;
    const int etp = layout.expert_tensor_parallel_size;
    const int ep = layout.expert_model_parallel_size;
    const int dp = layout.world_size / (tp * pp);
    const int edp = layout.world_size / (etp * ep * pp);
    const std::vector<int> dense = {tp, dp, pp};
    const std::vector<int> expert = {etp, ep, edp, pp};
    switch (kind) {
        case GroupKind::kTensorParallel:
            return RankGrid{dense, 0};
        case GroupKind::kDataParallel:
            return RankGrid{dense, 1};
        case GroupKind::kPipeline:
            return RankGrid{dense, 2};
        case GroupKind::kExpertTensorParallel:
            return RankGrid{expert, 0};
        case GroupKind::kExpertParallel:
            return RankGrid{expert, 1};
        case GroupKind::kExpertDataParallel:
            return RankGrid{expert, 2};
        case GroupKind::kWorld:
        case GroupKind::kNode:
            break;
    }
    return std::nullopt;
}

int stride_of(const RankGrid& g, int dim) {
    int stride = 1;
    for (int d = 0; d < dim; ++d)
        stride *= g.sizes[d];
    return stride;
}

}  // namespace

int group_index(const ParallelLayout& layout, GroupKind kind, int world_rank) {
    if (kind == GroupKind::kWorld)
        return 0;
    if (kind == GroupKind::kNode)
        return node_of(layout, world_rank);
    const RankGrid g = *rank_grid(layout, kind);
    // The other dimensions' coordinates, first fastest: groups are numbered 0..count-1.
    int index = 0;
    int scale = 1;
    for (int d = 0; d < static_cast<int>(g.sizes.size()); ++d) {
        if (d == g.axis)
            continue;
        index += world_rank / stride_of(g, d) % g.sizes[d] * scale;
        scale *= g.sizes[d];
    }
    return index;
}

std::vector<int> group_members(const ParallelLayout& layout, GroupKind kind, int world_rank) {
    validate_layout(layout);
    EPO_CHECK(world_rank >= 0 && world_rank < layout.world_size, "rank {} of {}", world_rank,
              layout.world_size);
    std::vector<int> members;
    if (kind == GroupKind::kWorld) {
        for (int r = 0; r < layout.world_size; ++r)
            members.push_back(r);
    } else if (kind == GroupKind::kNode) {
        const int first = node_of(layout, world_rank) * layout.gpus_per_node;
        for (int r = first; r < layout.world_size && r < first + layout.gpus_per_node; ++r)
            members.push_back(r);
    } else {
        const RankGrid g = *rank_grid(layout, kind);
        const int stride = stride_of(g, g.axis);
        const int size = g.sizes[g.axis];
        const int first = world_rank - world_rank / stride % size * stride;
        for (int i = 0; i < size; ++i)
            members.push_back(first + i * stride);
    }
    return members;
}

}  // namespace epo::comm
