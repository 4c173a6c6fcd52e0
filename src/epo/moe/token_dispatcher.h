// The token-dispatcher seam: what the MoE block (moe_block.h) needs from a dispatcher, and
// nothing else. A dispatcher moves each token's rows to the ranks holding the experts its router
// chose, hands the experts their rows grouped by local expert, and brings the outputs back; the
// block calls its phases from the nodes the overlap schedule runs (docs/design.md "A layer is four
// nodes"), so every dispatcher keeps the same split:
//
//   pre_dispatch (compute)  dispatch_preprocess: plan from the routing, rows into send order
//   dispatch (comm)         token_dispatch: counts and layout first (a rank must know what it
//                           receives before it can size its receive buffers), then the payload
//   mlp (compute)           dispatch_postprocess: received rows -> the experts' segments;
//                           [experts]; combine_preprocess: expert outputs -> send-back order
//   combine (comm)          token_combine: the payload back; combine_postprocess: a token's
//                           rows summed (+ shared expert)
// and each backward in reverse. Communication happens only in token_dispatch and token_combine
// (and their backwards), on the communicators of the stream the node runs on (DispatchComms:
// the EP group, and for a dispatcher that moves tokens node by node, its node and peer halves).
//
// Expert groups (the block's expert chunks, docs/chunked-overlap.md): the communicating and
// expert-facing phases take an ExpertGroup, and then move and sort only the rows of that group of
// every rank's local experts, so one group's all-to-all can run while another group's experts
// compute. The plan, the preprocess, the combine's sum and every backward of those stay whole:
// a micro-batch has one DispatchState whatever its groups, the groups' rows sit where the whole
// micro-batch's would, and running every group in order moves exactly the bytes of one whole
// call. The counts are exchanged once, by group 0's token_dispatch. A dispatcher that cannot split
// refuses any group but the whole one (flex; rule MO007 refuses such a configuration first).
//
// Per micro-batch a dispatcher keeps a DispatchState (DeepEP's "handle"): created by
// new_state(), filled by the forward and read by the backward, opaque to the block except for
// the expert-facing buffers every dispatcher provides. Adding a dispatcher is one file set that
// implements this interface (alltoall_dispatcher.h is the first) plus its tests, and a case in
// make_token_dispatcher().
//
// Letters: T tokens of the micro-batch on this rank, H hidden, K top-k, L local experts,
// Rp rows the local experts compute on (segments padded to kExpertRowAlign).
#pragma once

#include <cstdint>
#include <memory>

#include "epo/comm/communicator.h"
#include "epo/comm/process_groups.h"
#include "epo/moe/dispatch.h"
#include "epo/moe/moe_config.h"
#include "epo/moe/router.h"

namespace epo::moe {

// The running stream's communicators a dispatcher may use. alltoall needs the EP group only (a
// Communicator converts to this); flex also needs the EP group's ranks on this node and its peer
// ranks on the other nodes (process_groups.h), which a stream's ProcessGroups provides.
struct DispatchComms {
    comm::Communicator& ep;
    comm::Communicator* ep_node = nullptr;
    comm::Communicator* ep_peer = nullptr;
    // The stream's tensor-parallel group (model/tensor_parallel.h): the layers' TP collectives
    // run inline in their compute nodes on it. Null: no TP (a layer with tp_size > 1 refuses).
    comm::Communicator* tp = nullptr;
    // The stream's expert-tensor-parallel group: alltoall's ETP gather and reduce-scatter run on
    // it inside dispatch and combine (alltoall_dispatcher.h). Null: ETP 1.
    comm::Communicator* etp = nullptr;

    DispatchComms(comm::Communicator& ep_group) : ep(ep_group) {}  // NOLINT: implicit on purpose
    DispatchComms(comm::ProcessGroups& g)                          // NOLINT: implicit on purpose
        : ep(g.ep), ep_node(&g.ep_node), ep_peer(&g.ep_peer), tp(&g.tp), etp(&g.etp) {}
};

// Group `index` of `count` equal groups of each EP rank's local experts: local experts
// [index L / count, (index + 1) L / count). {0, 1} is all of them.
struct ExpertGroup {
    int index = 0;
    int count = 1;
};
struct ExpertRange {
    std::int64_t begin = 0, end = 0;
};
// The local experts of group g for L local experts; refuses count > L (an empty group).
ExpertRange expert_group_range(std::int64_t num_local_experts, ExpertGroup g);

// One micro-batch's dispatch through one layer, kept from its forward until its backward. The
// fields here are what the experts read and write; a dispatcher derives its own state from it.
struct DispatchState {
    virtual ~DispatchState() = default;

    ExpertSegments expert_segments;  // [L] aligned segments the experts compute on
    Tensor expert_rows;              // (Rp, H) compute dtype, set by dispatch_postprocess
    Tensor expert_probs;             // (Rp) f32
    Tensor expert_out;               // (Rp, H) the experts' output, read by combine_preprocess
    Tensor d_expert_out;             // (Rp, H) set by combine_preprocess_backward
    Tensor d_expert_rows;            // (Rp, H) the experts' input gradient
    Tensor d_expert_probs;           // (Rp) f32
};

class TokenDispatcher {
public:
    virtual ~TokenDispatcher() = default;

    virtual const char* name() const = 0;  // "alltoall"
    virtual std::unique_ptr<DispatchState> new_state() const = 0;

    // --- forward ---
    // Plans this rank's side from the routing and puts x (T, H) compute dtype into send order;
    // allocates the send-side buffers from `arena`. No communication.
    virtual void dispatch_preprocess(const RouterOutput& routing, const Tensor& x, DispatchState& d,
                                     Arena& arena) const = 0;
    // Counts and layout, then the payload, over `comms`; allocates the receive side from `arena`.
    // With groups, group 0's call exchanges the counts of all of them.
    virtual void token_dispatch(const DispatchComms& comms, DispatchState& d, Arena& arena,
                                ExpertGroup g) const = 0;
    virtual void dispatch_postprocess(DispatchState& d, ExpertGroup g) const = 0;
    virtual void combine_preprocess(DispatchState& d, ExpertGroup g) const = 0;
    virtual void token_combine(const DispatchComms& comms, DispatchState& d,
                               ExpertGroup g) const = 0;
    // y (T, H) f32 = sum over k of the token's expert outputs (+ shared (T, H) f32 if defined).
    virtual void combine_postprocess(const DispatchState& d, const Tensor& shared,
                                     const Tensor& y) const = 0;

    // --- backward (each phase's backward, in reverse order) ---
    // dy (T, H) compute dtype; allocates every backward buffer from `arena`.
    virtual void combine_postprocess_backward(const Tensor& dy, DispatchState& d,
                                              Arena& arena) const = 0;
    virtual void token_combine_backward(const DispatchComms& comms, DispatchState& d,
                                        ExpertGroup g) const = 0;
    virtual void combine_preprocess_backward(DispatchState& d, ExpertGroup g) const = 0;
    virtual void dispatch_postprocess_backward(DispatchState& d, ExpertGroup g) const = 0;
    virtual void token_dispatch_backward(const DispatchComms& comms, DispatchState& d,
                                         ExpertGroup g) const = 0;
    // The preprocess's backward, in the two halves the block fuses into its one pass over the
    // tokens: dweight (T, K) f32 = the gradient of each kept (token, k) weight (0 when dropped),
    // and acc[0, H) = sum over token t's kept slots, in k order, of its row gradients (f32).
    virtual void gather_dweight(const DispatchState& d, const Tensor& dweight) const = 0;
    virtual void token_row_sum(const DispatchState& d, std::int64_t t, float* acc) const = 0;
};

// The dispatcher cfg.dispatcher names, for EP rank `ep_rank` of `ep_size`. flex needs the EP
// ranks per node (flex_ranks_per_node()); 0 = not given, which flex refuses. etp_size: the
// experts' tensor-parallel size (alltoall only; flex refuses more than 1, RT044).
std::unique_ptr<TokenDispatcher> make_token_dispatcher(const MoeConfig& cfg, int ep_size,
                                                       int ep_rank, int ep_ranks_per_node = 0,
                                                       int etp_size = 1);

}  // namespace epo::moe
