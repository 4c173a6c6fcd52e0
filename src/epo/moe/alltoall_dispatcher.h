// The `alltoall` token dispatcher over the expert-parallel group: the first implementation of
// the TokenDispatcher interface (token_dispatcher.h), as AlltoallDispatcher over the free
// functions below (which its own tests and benchmarks call directly). Its phases, on the streams
// of the layer's nodes (docs/design.md "A layer is four nodes"):
//
//   pre_dispatch (compute)  dispatch_preprocess: plan, this rank's per-expert counts, send
//                           buffers; dispatch_permute: rows (and their weights) into the send
//                           buffer in global expert order, which is destination-rank order
//   dispatch (comm)         exchange_counts: all-gather of the per-expert counts (skipped when
//                           padding to capacity fixes every count), the all-to-all layout,
//                           receive buffers; token_dispatch: all-to-all of rows and weights
//
// The count exchange is the dispatch's first step (as DeepEP's notify step is), not the end of
// pre_dispatch as in the reference's alltoall dispatcher: a collective on the compute stream
// holds the compute stream until the slowest rank arrives, a wait the overlap schedule cannot
// hide; on the comm stream the other micro-batch's compute runs meanwhile. Only the counts'
// consumers (layout, receive buffers, expert segments) come after it, all in dispatch or later.
//   mlp (compute)           dispatch_postprocess: chunk sort, source-rank-major -> expert-major
//                           segments; [experts]; combine_preprocess: the inverse sort
//   combine (comm)          token_combine: all-to-all back; combine_postprocess: unpermute, the
//                           k rows of a token summed in k order (+ shared expert)
// Each backward is the same phase run in reverse: an all-to-all's backward swaps its splits.
//
// Experts live on their owner rank: global expert e on EP rank e / L (L local experts), so the
// global expert order of the permutation is already grouped by destination rank.
//
// Expert tensor parallelism (ETP n > 1, Megatron-Core's alltoall dispatcher with
// expert_tensor_parallel_size > 1): each of the n ranks of an ETP group holds a 1/n shard of the
// FFN of the same local experts (fc1's gate and up rows, fc2's columns) and runs it on every
// token any of them received. So dispatch continues, on the comm stream after the EP all-to-all,
// with an all-gather over the ETP group of the received rows and weights (variable sizes, ETP
// rank order), and the experts' sort treats the gathered blocks as n EP (ETP-major) sources;
// combine starts with the reduce-scatter of the experts' partial outputs (each ETP rank's block
// back to it, summed over the ETP ranks in rank order in f32, then rounded to the compute dtype)
// before the EP all-to-all. The backward is the mirror: token_combine_backward all-gathers the
// output gradient after its all-to-all, token_dispatch_backward reduce-scatters the input
// (and weight) gradients before its. The count exchange adds an all-gather of the received
// counts over the ETP group. Both collectives are all-to-alls on the ETP communicator, so they
// have every collective's deadline and byte accounting. Not with expert groups (chunks).
//
// Letters: T tokens, H hidden, E experts, L = E / EP local experts, K top-k, R rows sent,
// Rr rows received, Rp expert rows with alignment padding.
#pragma once

#include <cstdint>
#include <vector>

#include "epo/comm/communicator.h"
#include "epo/moe/dispatch.h"
#include "epo/moe/router.h"
#include "epo/moe/token_dispatcher.h"

namespace epo::moe {

// One micro-batch's dispatch through one layer, kept from its forward until its backward (the
// expert-facing buffers are DispatchState's). Tensors are views into the arenas given to
// dispatch_preprocess, exchange_counts and combine_postprocess_backward.
struct AlltoallDispatch : DispatchState {
    int ep_size = 1;
    int ep_rank = 0;
    int etp_size = 1;  // the ETP group's size (the communicator's, set by exchange_counts)
    int etp_rank = 0;
    DispatchPlan plan;
    ExpertSegments send_segments;      // [E] this rank's rows per global expert, packed
    std::vector<int64_t> recv_counts;  // [EP * L] rows from source s for local expert l
    comm::AllToAllLayout layout;       // dispatch direction, in rows
    ChunkMoves to_experts;             // received (source-major) -> expert segments
    // Per expert group (token_dispatcher.h), the part of `layout` that moves the rows of that
    // group's experts (one entry, `layout` itself, without groups).
    std::vector<comm::AllToAllLayout> group_layouts;
    // ETP > 1: [ETP] rows each ETP rank received from its EP all-to-all (Rr of each), and the
    // gathered counts [ETP * EP * L] (ETP rank, source, local expert) the sort reads.
    std::vector<int64_t> etp_counts;

    // forward buffers
    Tensor send_rows;     // (R, H) compute dtype
    Tensor send_probs;    // (R) f32
    Tensor recv_rows;     // (Rr, H)
    Tensor recv_probs;    // (Rr)
    Tensor combine_send;  // (Rr, H)
    Tensor combine_recv;  // (R, H)
    // ETP > 1 (Rg = sum of etp_counts): the ETP group's received rows, gathered
    Tensor gathered_rows;   // (Rg, H)
    Tensor gathered_probs;  // (Rg)
    Tensor gathered_out;    // (Rg, H) this rank's partial expert outputs, source order
    // ETP > 1: the reduce-scatters' scratch, from the arena with the counts (no allocation per
    // call): every ETP rank's block of this rank's rows (ETP * Rr, H), and one f32 row of sums.
    Tensor etp_parts;
    Tensor etp_row_sum;
    // backward buffers
    Tensor d_combine_recv;  // (R, H)
    Tensor d_combine_send;  // (Rr, H)
    Tensor d_recv_rows;     // (Rr, H)
    Tensor d_recv_probs;    // (Rr)
    Tensor d_send_rows;     // (R, H)
    Tensor d_send_probs;    // (R)
    // ETP > 1
    Tensor d_gathered_out;    // (Rg, H)
    Tensor d_gathered_rows;   // (Rg, H) this rank's partial input gradients
    Tensor d_gathered_probs;  // (Rg)
};

namespace alltoall {

// --- forward -------------------------------------------------------------------------------

// Plans this rank's side of the dispatch for EP rank `ep_rank` of `ep_size`; allocates the
// send-side forward buffers from `arena`. No communication.
void dispatch_preprocess(const MoeConfig& cfg, int ep_size, int ep_rank,
                         const RouterOutput& routing, AlltoallDispatch& d, Arena& arena);
// `ep_comm` is the comm stream's EP communicator. Learns what every rank sends this rank's
// experts, sets the layout (and each of `num_groups` expert groups' part of it) and the expert
// segments, allocates the receive-side buffers. `etp_comm` (null or size 1: no ETP) is the comm
// stream's ETP communicator; with ETP > 1 the segments hold the whole ETP group's rows.
void exchange_counts(const MoeConfig& cfg, comm::Communicator& ep_comm, AlltoallDispatch& d,
                     Arena& arena, int num_groups = 1, comm::Communicator* etp_comm = nullptr);
// x (T, H) compute dtype -> send buffers.
void dispatch_permute(const RouterOutput& routing, const Tensor& x, AlltoallDispatch& d);
// `ep_comm` is the comm stream's EP communicator. `g`: the rows of that expert group only (its
// count must be exchange_counts' num_groups).
void token_dispatch(comm::Communicator& ep_comm, AlltoallDispatch& d, ExpertGroup g = {},
                    comm::Communicator* etp_comm = nullptr);
void dispatch_postprocess(AlltoallDispatch& d, ExpertGroup g = {});
void combine_preprocess(AlltoallDispatch& d, ExpertGroup g = {});
void token_combine(comm::Communicator& ep_comm, AlltoallDispatch& d, ExpertGroup g = {},
                   comm::Communicator* etp_comm = nullptr);
// y (T, H) f32 = sum over k of the token's expert outputs (+ shared (T, H) f32 when defined).
void combine_postprocess(const AlltoallDispatch& d, const Tensor& shared, const Tensor& y);

// --- backward (each phase's backward, in reverse order) --------------------------------------

// dy (T, H) compute dtype -> d_combine_recv. Allocates every backward buffer from `arena`.
void combine_postprocess_backward(const Tensor& dy, AlltoallDispatch& d, Arena& arena);
void token_combine_backward(comm::Communicator& ep_comm, AlltoallDispatch& d, ExpertGroup g = {},
                            comm::Communicator* etp_comm = nullptr);
// -> d_expert_out (padding rows zero)
void combine_preprocess_backward(AlltoallDispatch& d, ExpertGroup g = {});
void dispatch_postprocess_backward(AlltoallDispatch& d,
                                   ExpertGroup g = {});  // d_expert_* -> d_recv_*
void token_dispatch_backward(comm::Communicator& ep_comm, AlltoallDispatch& d, ExpertGroup g = {},
                             comm::Communicator* etp_comm = nullptr);
// dx_acc (T, H) f32 = sum over k of the token's row gradients; dweight (T, K) f32.
void dispatch_permute_backward(const AlltoallDispatch& d, const Tensor& dx_acc,
                               const Tensor& dweight);

}  // namespace alltoall

// The interface over the functions above: token_dispatch is exchange_counts then the payload.
class AlltoallDispatcher final : public TokenDispatcher {
public:
    // etp_size: the expert-tensor-parallel group's size (the comms' etp must have it).
    AlltoallDispatcher(const MoeConfig& cfg, int ep_size, int ep_rank, int etp_size = 1);

    const char* name() const override { return "alltoall"; }
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
    int ep_size_;
    int ep_rank_;
    int etp_size_;
};

}  // namespace epo::moe
