// Process groups of a run: which world ranks form the expert-parallel (EP), data-parallel (DP),
// expert-data-parallel (EDP) and node groups, derived from the world size, the EP size and the
// ranks per node. Pure functions: no MPI here (process_groups.h turns them into communicators).
//
// Ordering follows Megatron-Core with tensor, pipeline and context parallel sizes 1 (the only
// sizes the runtime executes): an EP group is a block of consecutive ranks, the EDP group of a
// rank holds the ranks with the same position in the other EP groups (stride EP), the DP group of
// non-expert parameters is the whole world. Nodes are blocks of `gpus_per_node` consecutive ranks
// (logical on one machine, real on a cluster); the last node may be partly filled.
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
};

// Raises epo::Error naming the field, its value and the fix when the layout cannot be built.
void validate_layout(const ParallelLayout& layout);

enum class GroupKind { kWorld, kExpertParallel, kDataParallel, kExpertDataParallel, kNode };

// Short name used in messages and traces: "world", "ep", "dp", "edp", "node".
const char* group_name(GroupKind kind);

// World ranks of the group of `kind` that contains `world_rank`, ascending (= group-rank order).
std::vector<int> group_members(const ParallelLayout& layout, GroupKind kind, int world_rank);

// Index of the group of `kind` containing `world_rank`; groups of one kind are numbered from 0.
int group_index(const ParallelLayout& layout, GroupKind kind, int world_rank);

int node_of(const ParallelLayout& layout, int world_rank);
int num_nodes(const ParallelLayout& layout);

}  // namespace epo::comm
