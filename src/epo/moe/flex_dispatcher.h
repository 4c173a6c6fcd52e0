// The `flex` token dispatcher (backends deepep and hybridep): the second implementation of the
// TokenDispatcher interface (token_dispatcher.h), node-deduplicated. A token crosses the
// inter-node link once per destination node (to its forwarder, the rank of the same local index
// there, over the ep_peer communicator), is fanned out inside the node (ep_node), and on the way
// back a token's rows are summed inside the node first, so one row per (token, node) crosses back.
// The layout (flex_layout.h) is the handle that combine and the backward reuse. Phases:
//
//   pre_dispatch (compute)  dispatch_preprocess: the plan, this rank's messages, the send rows
//   dispatch (comm)         dispatch_layout: message counts and metadata to the forwarders
//                           (peer), the forwarders' units, their counts and metadata to the
//                           ranks (node), the receive buffers; dispatch_payload: rows to the
//                           forwarders (peer), then to the ranks (node: deepep, one unit row per
//                           (token, rank); hybridep, the node's messages gathered once into one
//                           node-wide buffer that each rank reads its rows from)
//   mlp (compute)           dispatch_postprocess: received rows -> expert segments (a unit row
//                           copied to each of its experts); [experts]; combine_preprocess: per
//                           unit, its kept rows summed in k order (rounded to the compute dtype)
//   combine (comm)          token_combine: unit rows to the forwarders (node), summed there over
//                           the node's ranks in rank order (rounded), back to the sources (peer);
//                           combine_postprocess: per token the node rows in node order, in f32
//                           (+ shared expert)
// The backward of dispatch is a combine (row gradients summed the same way; weight gradients
// carried by position) and the backward of combine a dispatch (dy fanned out, deepep's way for
// both backends).
//
// Intra-node movement is an all-to-all (deepep) or an all-gather (hybridep) over ep_node, not a
// shared-memory window: every byte goes through Communicator collectives, so deadlines, the
// intra/inter byte split and the link model apply (docs/flex.md says what a window would change).
//
// Numerics: the sums are flex's order (reference_token_sum in flex_layout.h), not alltoall's
// (one f32 sum over k), so the two agree within rounding; within flex everything is bit-exact.
//
// Letters as in flex_layout.h.
#pragma once

#include <cstdint>
#include <vector>

#include "epo/comm/communicator.h"
#include "epo/moe/flex_layout.h"
#include "epo/moe/token_dispatcher.h"

namespace epo::moe {

enum class FlexBackend { kDeepep, kHybridep };
const char* flex_backend_name(FlexBackend b);  // "deepep", "hybridep"

// The sum of flex::inter_node_copies over every dispatch_preprocess of this process so far (the
// forward dispatches of every layer, micro-batch and token chunk): `epo bench` reads it around
// each step, as moe_bench reads the GEMM statistics. Thread-safe.
flex::InterNodeCopies inter_node_copies_total();

// One micro-batch's flex dispatch through one layer (the expert-facing buffers are
// DispatchState's). Tensors are views into the arenas given to the phases.
struct FlexDispatch : DispatchState {
    FlexBackend backend = FlexBackend::kDeepep;
    int ep_rank = 0;
    flex::Geometry geo;
    DispatchPlan plan;
    flex::SourceLayout source;
    flex::ForwardLayout forward;
    flex::ReceiveLayout receive;
    comm::AllToAllLayout peer_layout;     // messages, dispatch direction (ep_peer)
    comm::AllToAllLayout node_layout;     // units, dispatch direction (ep_node)
    std::vector<std::int32_t> fwd_meta;   // [Mf * meta_width] the messages this forwarder got
    std::vector<std::int32_t> recv_meta;  // [Ur * meta_width]
    // hybridep: the node-wide buffer holds every forwarder's messages, forwarder-major
    std::vector<std::int64_t> node_msg_offsets;  // [P + 1] first message of each forwarder
    comm::AllToAllLayout node_gather;            // every forwarder's messages to every rank
    std::vector<std::int32_t> unit_node_msg;     // [Ur] row of each unit in the node buffer

    // forward buffers (compute dtype rows)
    Tensor send_rows;      // (Ms, H)
    Tensor fwd_rows;       // (Mf, H)
    Tensor fwd_unit_rows;  // (Uf, H) deepep
    Tensor node_rows;      // (sum of Mf over the node, H) hybridep
    Tensor recv_rows;      // (Ur, H) deepep
    Tensor unit_out;       // (Ur, H) combine: per unit
    Tensor fwd_unit_out;   // (Uf, H)
    Tensor fwd_msg_out;    // (Mf, H)
    Tensor combine_recv;   // (Ms, H)
    // backward buffers
    Tensor d_msg;             // (Ms, H) dy per message
    Tensor d_fwd_msg;         // (Mf, H)
    Tensor d_fwd_unit;        // (Uf, H)
    Tensor d_unit;            // (Ur, H)
    Tensor d_unit_rows;       // (Ur, H) dx per unit
    Tensor d_unit_probs;      // (Ur, W) f32
    Tensor d_fwd_unit_rows;   // (Uf, H)
    Tensor d_fwd_unit_probs;  // (Uf, W)
    Tensor d_fwd_msg_rows;    // (Mf, H)
    Tensor d_fwd_msg_probs;   // (Mf, W)
    Tensor d_send_rows;       // (Ms, H)
    Tensor d_send_probs;      // (Ms, W)
};

namespace flex {

// The node and peer communicators of `comms`, checked against the geometry; raises kConfig when
// they are missing (a caller that passed only the EP communicator).
struct FlexComms {
    comm::Communicator& node;
    comm::Communicator& peer;
};
FlexComms flex_comms(const DispatchComms& comms, const FlexDispatch& d);

// --- forward ---
void dispatch_preprocess(const MoeConfig& cfg, FlexBackend backend, int ep_size, int ep_rank,
                         int ranks_per_node, const RouterOutput& routing, FlexDispatch& d,
                         Arena& arena);
void dispatch_permute(const Tensor& x, FlexDispatch& d);  // x (T, H) -> send_rows
void dispatch_layout(const FlexComms& c, FlexDispatch& d, Arena& arena);
void dispatch_payload(const FlexComms& c, FlexDispatch& d);
void dispatch_postprocess(FlexDispatch& d);
void combine_preprocess(FlexDispatch& d);
void token_combine(const FlexComms& c, FlexDispatch& d);
void combine_postprocess(const FlexDispatch& d, const Tensor& shared, const Tensor& y);

// --- backward ---
void combine_postprocess_backward(const Tensor& dy, FlexDispatch& d, Arena& arena);
void token_combine_backward(const FlexComms& c, FlexDispatch& d);
void combine_preprocess_backward(FlexDispatch& d);
void dispatch_postprocess_backward(FlexDispatch& d);
void token_dispatch_backward(const FlexComms& c, FlexDispatch& d);
void gather_dweight(const FlexDispatch& d, const Tensor& dweight);
void token_row_sum(const FlexDispatch& d, std::int64_t t, float* acc);

}  // namespace flex

class FlexDispatcher final : public TokenDispatcher {
public:
    FlexDispatcher(const MoeConfig& cfg, FlexBackend backend, int ep_size, int ep_rank,
                   int ranks_per_node);

    const char* name() const override { return "flex"; }
    FlexBackend backend() const { return backend_; }
    std::unique_ptr<DispatchState> new_state() const override;
    void dispatch_preprocess(const RouterOutput& routing, const Tensor& x, DispatchState& d,
                             Arena& arena) const override;
    void token_dispatch(const DispatchComms& comms, DispatchState& d, Arena& arena,
                        ExpertGroup g) const override;
    void dispatch_postprocess(DispatchState& d, ExpertGroup g) const override;
    void combine_preprocess(DispatchState& d, ExpertGroup g) const override;
    void token_combine(const DispatchComms& comms, DispatchState& d, ExpertGroup g) const override;
    void combine_postprocess(const DispatchState& d, const Tensor& shared,
                             const Tensor& y) const override;
    void combine_postprocess_backward(const Tensor& dy, DispatchState& d,
                                      Arena& arena) const override;
    void token_combine_backward(const DispatchComms& comms, DispatchState& d,
                                ExpertGroup g) const override;
    void combine_preprocess_backward(DispatchState& d, ExpertGroup g) const override;
    void dispatch_postprocess_backward(DispatchState& d, ExpertGroup g) const override;
    void token_dispatch_backward(const DispatchComms& comms, DispatchState& d,
                                 ExpertGroup g) const override;
    void gather_dweight(const DispatchState& d, const Tensor& dweight) const override;
    void token_row_sum(const DispatchState& d, std::int64_t t, float* acc) const override;

private:
    MoeConfig cfg_;
    FlexBackend backend_;
    int ep_size_;
    int ep_rank_;
    int ranks_per_node_;
};

}  // namespace epo::moe
