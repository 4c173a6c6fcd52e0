// Process groups of a run: which world ranks form the tensor-parallel (TP), data-parallel (DP),
// pipeline (PP), expert-tensor-parallel (ETP), expert-parallel (EP), expert-data-parallel (EDP)
// and node groups, derived from the world size, the parallel sizes and the ranks per node. Pure
// functions: no MPI here (process_groups.h turns them into communicators).
//
// Ordering is Megatron-Core's `initialize_model_parallel` (its RankGenerator, context parallel
// size 1): a rank's coordinates are read from its world rank with the first dimension of an
// order fastest. The dense layers use the order tp-cp-dp-pp (TP innermost: a TP group is a block
// of TP consecutive ranks, DP has stride TP, PP stride world / PP), the MoE layers the order
// etp-ep-edp-pp in the same world (ETP innermost, then EP, then EDP = world / (ETP EP PP)). So a
// pipeline stage is a block of world / PP consecutive ranks, and every group but world, node and
// pp lies inside one stage. With TP = ETP = 1 an EP group is a block of EP consecutive ranks and
// the DP group the whole stage. Nodes are blocks of `gpus_per_node` consecutive ranks (logical on
// one machine, real on a cluster); the last node may be partly filled.
#pragma once

#include <vector>

namespace epo::comm {

struct ParallelLayout {
    int world_size = 1;
    int expert_model_parallel_size = 1;  // EP: ranks that together hold one copy of all experts
    int gpus_per_node = 8;  // ranks per node (the reference harness's name and default)
    // PP: stages of world_size / PP consecutive ranks each; the groups above lie inside one
    // stage (process_groups.h builds them per stage).
    int pipeline_model_parallel_size = 1;
    int tensor_model_parallel_size = 1;   // TP: dense layers' tensor-parallel group
    int expert_tensor_parallel_size = 1;  // ETP: the experts' tensor-parallel group
};

// Raises epo::Error naming the field, its value and the fix when the layout cannot be built.
void validate_layout(const ParallelLayout& layout);

enum class GroupKind {
    kWorld,
    kExpertParallel,
    kDataParallel,
    kExpertDataParallel,
    kNode,
    kTensorParallel,
    kExpertTensorParallel,
    kPipeline,
};

// Short name used in messages and traces: "world", "ep", "dp", "edp", "node", "tp", "etp", "pp".
const char* group_name(GroupKind kind);

// World ranks of the group of `kind` that contains `world_rank`, ascending (= group-rank order).
std::vector<int> group_members(const ParallelLayout& layout, GroupKind kind, int world_rank);

// Index of the group of `kind` containing `world_rank`; groups of one kind are numbered from 0.
int group_index(const ParallelLayout& layout, GroupKind kind, int world_rank);

int node_of(const ParallelLayout& layout, int world_rank);
int num_nodes(const ParallelLayout& layout);

}  // namespace epo::comm
