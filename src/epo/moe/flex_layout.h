// The flex dispatcher's layout (DeepEP's "handle"), as pure functions of the routing: no MPI here
// (flex_dispatcher.h moves the bytes). A token crosses the inter-node link once per destination
// node, as one message to the rank of its own local index there (the forwarder), which fans it
// out to the node's ranks that need it, one unit per (token, rank):
//
//   source     messages: one per (token, destination node) with at least one entry, node-major,
//              tokens in order within a node; an entry is one (token, expert) row of the plan
//   forwarder  units: one per (message, destination rank of the node) with an entry there,
//              destination-rank-major, messages in arrival order within a rank
//   receiver   expert rows: for each local expert, its entries over the units of every source
//              EP rank in rank order, tokens in order (alltoall's order, so the experts compute
//              the same rows in the same order); one unit feeds several rows when the token chose
//              several of the rank's experts
//
// An entry's code: e (a kept routed slot to global expert e), E + e (a capacity padding row of
// expert e: weight 0, computed, never summed into the output) or -1 (empty). A message has W
// entry positions, sorted by destination rank, then kept slots in k order, then padding rows in
// expert order; a unit keeps its message's positions (other ranks' codes -1), so the backward maps
// gradients back by position.
//
// Geometry: the EP group is N nodes of P ranks, EP rank r on node r / P with local index r % P
// (flex_ranks_per_node() checks the layout allows it).
//
// Letters: T tokens, K top-k, E experts, L local experts, H hidden, N nodes, P ranks per node,
// W entry positions per message, Ms messages sent, Mf messages a forwarder received, Uf units it
// sends, Ur units a rank received, Rp expert rows (segments padded to kExpertRowAlign).
#pragma once

#include <cstdint>
#include <vector>

#include "epo/moe/dispatch.h"
#include "epo/moe/moe_config.h"

namespace epo::moe::flex {

// EP ranks per node of the flex dispatcher's geometry: gpus_per_node when it divides EP (each EP
// group is whole nodes), EP when EP divides gpus_per_node (each group inside one node). Raises
// ErrorKind::kConfig naming comm.gpus_per_node and expert_model_parallel_size otherwise.
int flex_ranks_per_node(int ep_size, int gpus_per_node);

struct Geometry {
    int num_nodes = 1;       // N
    int ranks_per_node = 1;  // P
    std::int64_t num_experts = 0;
    std::int64_t local_experts = 0;  // L = E / (N P)
    std::int64_t positions = 0;      // W

    int rank_of_expert(std::int64_t e) const { return static_cast<int>(e / local_experts); }
    int node_of_rank(int r) const { return r / ranks_per_node; }
};
// W = E / N with padding to capacity (a token may be a padding row of every expert of a node),
// else min(K, E / N).
Geometry make_geometry(const MoeConfig& cfg, int ep_size, int ranks_per_node);

// Metadata row of a message or unit: [0, W) codes, [W, 2W) weights (f32 bits), then the source EP
// rank and the source token (what a receiver orders by, and what tests check).
inline std::int64_t meta_width(const Geometry& g) {
    return 2 * g.positions + 2;
}
inline std::int64_t expert_of_code(std::int32_t code, std::int64_t num_experts) {
    return code < num_experts ? code : code - num_experts;
}

// This rank's messages: which tokens go to which node, with which entries.
struct SourceLayout {
    std::vector<std::int64_t> node_counts;  // [N] messages to each node
    std::vector<std::int32_t> msg_token;    // [Ms] token of each message
    std::vector<std::int32_t> meta;         // [Ms * meta_width] (source rank and token filled)
    std::vector<std::int32_t> entry_slot;   // [Ms * W] slot t * K + k of each position, -1 else
    std::vector<char> msg_real;             // [Ms] has a kept slot (padding-only: not summed)
    std::vector<std::int32_t> token_msg;    // [T * N] message of (token, node), -1 when none

    std::int64_t num_messages() const { return static_cast<std::int64_t>(msg_token.size()); }
};
SourceLayout make_source_layout(const Geometry& g, const DispatchPlan& plan,
                                const Tensor& topk_index, const Tensor& topk_weight, int ep_rank);

// The inter-node copies of this rank's tokens: what the flex dispatcher's messages cost the slow
// link against what the alltoall dispatcher would send on the same routing. flex: messages to
// other nodes (one row per (token, node)); alltoall: their entries (one row per (token, expert),
// capacity padding rows included, which alltoall sends as well). Dispatch direction; combine
// and the backwards repeat the same rows.
struct InterNodeCopies {
    std::int64_t tokens = 0;
    std::int64_t flex = 0;
    std::int64_t alltoall = 0;

    InterNodeCopies& operator+=(const InterNodeCopies& o);
    friend InterNodeCopies operator-(InterNodeCopies a, const InterNodeCopies& b);
    bool operator==(const InterNodeCopies&) const = default;
};
InterNodeCopies inter_node_copies(const Geometry& g, const SourceLayout& s, std::int64_t num_tokens,
                                  int ep_rank);

// A forwarder's units, from the messages it received (`meta`, [Mf * meta_width], in arrival
// order) for the ranks of its node `node`.
struct ForwardLayout {
    std::vector<std::int64_t> rank_counts;  // [P] units for each local rank
    std::vector<std::int32_t> unit_msg;     // [Uf] message of each unit
    std::vector<std::int32_t> unit_meta;    // [Uf * meta_width]
    std::vector<char> unit_real;            // [Uf] has a kept slot
    std::vector<std::int32_t> msg_unit;     // [Mf * P] unit of (message, local rank), -1 when none

    std::int64_t num_units() const { return static_cast<std::int64_t>(unit_msg.size()); }
};
ForwardLayout make_forward_layout(const Geometry& g, const std::vector<std::int32_t>& meta,
                                  int node);

// A receiver's expert rows, from the units it received (`meta`, [Ur * meta_width]).
struct ReceiveLayout {
    ExpertSegments segments;             // [L], aligned to kExpertRowAlign
    std::vector<std::int32_t> row_unit;  // [Rp] unit of each expert row, -1 for alignment rows
    std::vector<float> row_prob;         // [Rp] weight of each expert row (0 for alignment)
    std::vector<std::int32_t> unit_row;  // [Ur * W] expert row of each kept-slot position, -1 else
    std::vector<std::int32_t> pos_row;   // [Ur * W] expert row of each position of this rank
                                         // (kept or padding), -1 else
    std::vector<char> unit_real;         // [Ur] has a kept slot

    std::int64_t num_units() const { return static_cast<std::int64_t>(unit_real.size()); }
};
ReceiveLayout make_receive_layout(const Geometry& g, const std::vector<std::int32_t>& meta,
                                  int ep_rank);

// --- the plain reference of flex's summation order (single rank, no communication) ----------

// acc[0, H) = flex's sum of token t's kept rows of `rows` (the plan's rows in `segments`, as
// dispatch.h's token_row_sum reads them): per destination rank the rows in k order, rounded to
// rows' dtype; per node those rank sums in rank order, rounded; then the node sums in node order
// in f32. Zero when every slot was dropped.
void reference_token_sum(const Geometry& g, const DispatchPlan& plan,
                         const ExpertSegments& segments, const Tensor& rows, std::int64_t t,
                         float* acc);
// y (T, H) = reference_token_sum (+ shared (T, H) f32 when defined), rounded to y's dtype.
void reference_combine(const Geometry& g, const DispatchPlan& plan, const ExpertSegments& segments,
                       const Tensor& rows, const Tensor& shared, const Tensor& y);

}  // namespace epo::moe::flex
