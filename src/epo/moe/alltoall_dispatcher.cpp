#include "epo/moe/alltoall_dispatcher.h"

#include "epo/core/error.h"
#include "epo/kernels/rows.h"

namespace epo::moe::alltoall {
namespace {

int64_t sum(const std::vector<int64_t>& v, size_t begin, size_t count) {
    int64_t s = 0;
    for (size_t i = begin; i < begin + count; ++i)
        s += v[i];
    return s;
}

size_t row_bytes(const Tensor& rows) {
    return static_cast<size_t>(rows.row_size()) * dtype_size(rows.dtype());
}

// The part of the dispatch layout that moves the rows of local experts [r.begin, r.end) of every
// rank: from peer p's block of the send buffer (global expert order) its experts
// p L + [begin, end); into source s's block of the receive buffer (local expert order) the same.
comm::AllToAllLayout group_layout(const AlltoallDispatch& d, int64_t L, ExpertRange r) {
    comm::AllToAllLayout g;
    const int ep = d.ep_size;
    for (int p = 0; p < ep; ++p) {
        const int64_t first = p * L + r.begin, last = p * L + r.end;
        g.send_offsets.push_back(d.send_segments.offsets[static_cast<size_t>(first)]);
        g.send_counts.push_back(d.send_segments.offsets[static_cast<size_t>(last)] -
                                g.send_offsets.back());
        g.recv_offsets.push_back(
            d.layout.recv_offsets[static_cast<size_t>(p)] +
            sum(d.recv_counts, static_cast<size_t>(p * L), static_cast<size_t>(r.begin)));
        g.recv_counts.push_back(sum(d.recv_counts, static_cast<size_t>(p * L + r.begin),
                                    static_cast<size_t>(r.end - r.begin)));
    }
    return g;
}

const comm::AllToAllLayout& layout_of(const AlltoallDispatch& d, ExpertGroup g) {
    EPO_CHECK(static_cast<size_t>(g.count) == d.group_layouts.size(),
              "expert group {} of {} of a dispatch whose counts were exchanged for {} group(s)",
              g.index, g.count, d.group_layouts.size());
    return d.group_layouts[static_cast<size_t>(g.index)];
}

// The local experts of group g, and its moves received (source-major) -> expert segments.
ExpertRange experts_of(const AlltoallDispatch& d, ExpertGroup g) {
    return expert_group_range(d.expert_segments.num_experts(), g);
}
ChunkMoves moves_of(const AlltoallDispatch& d, ExpertGroup g) {
    if (g.count == 1) {
        return d.to_experts;
    }
    const ExpertRange r = experts_of(d, g);
    const auto ep = static_cast<size_t>(d.ep_size);
    return sub_moves(d.to_experts, static_cast<size_t>(r.begin) * ep,
                     static_cast<size_t>(r.end) * ep);
}

bool has_etp(const AlltoallDispatch& d) {
    return d.etp_size > 1;
}

// The ETP communicator of a dispatch whose counts were exchanged for ETP d.etp_size.
comm::Communicator& etp_of(const AlltoallDispatch& d, comm::Communicator* etp_comm) {
    EPO_CHECK(
        etp_comm != nullptr && etp_comm->size() == d.etp_size && etp_comm->rank() == d.etp_rank,
        "a dispatch planned for ETP rank {} of {} runs without that ETP communicator", d.etp_rank,
        d.etp_size);
    return *etp_comm;
}

// out (sum of counts, C) = every ETP rank's `in` (counts[q] rows of `row_bytes_of` bytes), in
// ETP-rank order: a variable all-gather, as an all-to-all sending the same block to every rank.
void etp_gather_rows(comm::Communicator& etp, const Tensor& in, const Tensor& out,
                     const std::vector<int64_t>& counts, size_t row_bytes_of) {
    comm::AllToAllLayout l;
    int64_t offset = 0;
    for (int q = 0; q < etp.size(); ++q) {
        l.send_counts.push_back(counts[static_cast<size_t>(etp.rank())]);
        l.send_offsets.push_back(0);
        l.recv_counts.push_back(counts[static_cast<size_t>(q)]);
        l.recv_offsets.push_back(offset);
        offset += counts[static_cast<size_t>(q)];
    }
    etp.all_to_all_v(in.raw(), out.raw(), l, row_bytes_of);
}

// out (counts[me], C) = sum over ETP ranks p, in rank order, of block `me` of rank p's `in`
// (sum of counts, C; blocks in ETP-rank order): a variable reduce-scatter, as an all-to-all of
// the blocks then the sums here. f32 sums of the widened values, rounded once to out's dtype (the
// reference reduce-scatters in f32 and casts back: the same values, in half the bytes for bf16).
// `parts` and `row_sum` are the dispatch's scratch (AlltoallDispatch::etp_parts, etp_row_sum).
void etp_reduce_scatter_rows(comm::Communicator& etp, const Tensor& in, const Tensor& out,
                             const std::vector<int64_t>& counts, int64_t row_items,
                             const Tensor& parts_scratch, const Tensor& row_sum) {
    const int n = etp.size();
    const int64_t mine = counts[static_cast<size_t>(etp.rank())];
    const size_t item = dtype_size(in.dtype());
    const size_t row_bytes_of = static_cast<size_t>(row_items) * item;
    comm::AllToAllLayout l;
    int64_t offset = 0;
    for (int q = 0; q < n; ++q) {
        l.send_counts.push_back(counts[static_cast<size_t>(q)]);
        l.send_offsets.push_back(offset);
        offset += counts[static_cast<size_t>(q)];
        l.recv_counts.push_back(mine);
        l.recv_offsets.push_back(q * mine);
    }
    // (n, counts[me], C) the ranks' partial blocks, in ETP-rank order
    EPO_CHECK(parts_scratch.nbytes() >= static_cast<size_t>(n * mine) * row_bytes_of &&
                  row_sum.numel() >= row_items,
              "the ETP scratch holds {} bytes and {} sums for {} blocks of {} rows of {} bytes",
              parts_scratch.nbytes(), row_sum.numel(), n, mine, row_bytes_of);
    auto* parts = static_cast<std::byte*>(parts_scratch.raw());
    float* acc = row_sum.data<float>();
    etp.all_to_all_v(in.raw(), parts, l, row_bytes_of);
    auto* dst = static_cast<std::byte*>(out.raw());
    for (int64_t r = 0; r < mine; ++r) {
        kernels::load_row(parts + static_cast<size_t>(r) * row_bytes_of, in.dtype(), acc,
                          row_items);
        for (int p = 1; p < n; ++p) {
            kernels::add_row(parts + static_cast<size_t>(p * mine + r) * row_bytes_of, in.dtype(),
                             acc, row_items);
        }
        kernels::store_row(acc, dst + static_cast<size_t>(r) * row_bytes_of, out.dtype(),
                           row_items);
    }
}

// The expert side's source-order buffers: the gathered ones with ETP > 1, else the received.
const Tensor& source_rows(const AlltoallDispatch& d) {
    return has_etp(d) ? d.gathered_rows : d.recv_rows;
}
const Tensor& source_probs(const AlltoallDispatch& d) {
    return has_etp(d) ? d.gathered_probs : d.recv_probs;
}

}  // namespace

void dispatch_preprocess(const MoeConfig& cfg, int ep_size, int ep_rank,
                         const RouterOutput& routing, AlltoallDispatch& d, Arena& arena) {
    const int64_t E = cfg.num_experts, H = cfg.hidden_size;
    EPO_CHECK(E % ep_size == 0, "{} experts over an expert-parallel group of {}", E, ep_size);
    d.ep_size = ep_size;
    d.ep_rank = ep_rank;
    d.plan = moe::dispatch_preprocess(cfg, routing.topk_index, routing.topk_weight, arena);
    d.send_segments = make_expert_segments(d.plan.tokens_per_expert, 1);
    const DType cd = compute_dtype(cfg);
    const int64_t R = d.send_segments.total_rows();
    d.send_rows = arena.alloc({R, H}, cd);
    d.send_probs = arena.alloc({R}, DType::kF32);
    d.combine_recv = arena.alloc({R, H}, cd);
}

void exchange_counts(const MoeConfig& cfg, comm::Communicator& ep_comm, AlltoallDispatch& d,
                     Arena& arena, int num_groups, comm::Communicator* etp_comm) {
    const int ep = d.ep_size;
    d.etp_size = etp_comm != nullptr ? etp_comm->size() : 1;
    d.etp_rank = etp_comm != nullptr ? etp_comm->rank() : 0;
    EPO_CHECK(d.etp_size == 1 || num_groups == 1,
              "{} expert groups with expert tensor parallelism {} (moe_ep_overlap_num_chunks must "
              "be 1 with expert_tensor_parallel_size > 1: RT045)",
              num_groups, d.etp_size);
    EPO_CHECK(ep_comm.size() == ep && ep_comm.rank() == d.ep_rank,
              "the counts of a dispatch planned for EP rank {} of {} exchanged as rank {} of {}",
              d.ep_rank, ep, ep_comm.rank(), ep_comm.size());
    const int64_t E = cfg.num_experts, H = cfg.hidden_size;
    const int64_t L = E / ep;
    const std::vector<int64_t>& local = d.plan.tokens_per_expert;  // [E] rows this rank sends

    // Rows this rank receives for each of its experts from each source rank. With padding to
    // capacity every count is the capacity (the same on every rank, which routes micro-batches
    // of equal size), so nothing needs exchanging.
    d.recv_counts.assign(static_cast<size_t>(ep * L), 0);
    if (cfg.pad_to_capacity && d.plan.capacity >= 0) {
        std::fill(d.recv_counts.begin(), d.recv_counts.end(), d.plan.capacity);
    } else {
        std::vector<int64_t> gathered(static_cast<size_t>(ep * E));
        ep_comm.all_gather(std::span<const int64_t>(local), std::span<int64_t>(gathered));
        for (int s = 0; s < ep; ++s) {
            for (int64_t l = 0; l < L; ++l) {
                d.recv_counts[s * L + l] = gathered[s * E + d.ep_rank * L + l];
            }
        }
    }
    std::vector<int64_t> send_per_peer(static_cast<size_t>(ep)), recv_per_peer(ep);
    for (int p = 0; p < ep; ++p) {
        send_per_peer[p] = sum(local, static_cast<size_t>(p * L), static_cast<size_t>(L));
        recv_per_peer[p] = sum(d.recv_counts, static_cast<size_t>(p * L), static_cast<size_t>(L));
    }
    d.layout = comm::AllToAllLayout::packed(send_per_peer, recv_per_peer);
    // The experts' sources: the EP ranks, or with ETP the ETP ranks' EP ranks (ETP-major, the
    // order of the gathered rows), [S * L] rows of source s for local expert l.
    std::vector<int64_t> source_counts = d.recv_counts;
    d.etp_counts.clear();
    if (d.etp_size > 1) {
        source_counts.assign(static_cast<size_t>(d.etp_size * ep * L), 0);
        etp_of(d, etp_comm)
            .all_gather(std::span<const int64_t>(d.recv_counts), std::span<int64_t>(source_counts));
        for (int q = 0; q < d.etp_size; ++q) {
            d.etp_counts.push_back(
                sum(source_counts, static_cast<size_t>(q * ep * L), static_cast<size_t>(ep * L)));
        }
    }
    const int num_sources = d.etp_size * ep;
    std::vector<int64_t> expert_counts(static_cast<size_t>(L), 0);
    for (int s = 0; s < num_sources; ++s) {
        for (int64_t l = 0; l < L; ++l)
            expert_counts[l] += source_counts[s * L + l];
    }
    d.expert_segments = make_expert_segments(expert_counts, kExpertRowAlign);
    d.to_experts = rank_major_to_expert_major(source_counts, num_sources, d.expert_segments);
    d.group_layouts.clear();
    if (num_groups == 1) {
        d.group_layouts.push_back(d.layout);
    }
    for (int g = 0; num_groups > 1 && g < num_groups; ++g) {
        d.group_layouts.push_back(group_layout(d, L, expert_group_range(L, {g, num_groups})));
    }

    const DType cd = compute_dtype(cfg);
    const int64_t Rr = d.layout.recv_extent(), Rp = d.expert_segments.total_rows();
    d.recv_rows = arena.alloc({Rr, H}, cd);
    d.recv_probs = arena.alloc({Rr}, DType::kF32);
    d.expert_rows = arena.alloc({Rp, H}, cd);
    d.expert_probs = arena.alloc({Rp}, DType::kF32);
    d.expert_out = arena.alloc({Rp, H}, cd);
    d.combine_send = arena.alloc({Rr, H}, cd);
    if (d.etp_size > 1) {
        const int64_t Rg = sum(d.etp_counts, 0, d.etp_counts.size());
        d.gathered_rows = arena.alloc({Rg, H}, cd);
        d.gathered_probs = arena.alloc({Rg}, DType::kF32);
        d.gathered_out = arena.alloc({Rg, H}, cd);
        // The largest reduce-scatter: ETP blocks of this rank's Rr rows of H (the probabilities'
        // f32 blocks are narrower).
        d.etp_parts = arena.alloc({d.etp_size * Rr, H}, cd);
        d.etp_row_sum = arena.alloc({H}, DType::kF32);
    }
}

void dispatch_permute(const RouterOutput& routing, const Tensor& x, AlltoallDispatch& d) {
    permute_forward(d.plan, d.send_segments, x, routing.topk_weight, d.send_rows, d.send_probs);
}

void token_dispatch(comm::Communicator& ep_comm, AlltoallDispatch& d, ExpertGroup g,
                    comm::Communicator* etp_comm) {
    const comm::AllToAllLayout& layout = layout_of(d, g);
    ep_comm.all_to_all_v(d.send_rows.raw(), d.recv_rows.raw(), layout, row_bytes(d.send_rows));
    ep_comm.all_to_all_v(d.send_probs.raw(), d.recv_probs.raw(), layout, sizeof(float));
    if (has_etp(d)) {
        // Every ETP rank computes its FFN shard on the whole group's rows.
        comm::Communicator& etp = etp_of(d, etp_comm);
        etp_gather_rows(etp, d.recv_rows, d.gathered_rows, d.etp_counts, row_bytes(d.recv_rows));
        etp_gather_rows(etp, d.recv_probs, d.gathered_probs, d.etp_counts, sizeof(float));
    }
}

void dispatch_postprocess(AlltoallDispatch& d, ExpertGroup g) {
    const ChunkMoves moves = moves_of(d, g);
    const ExpertRange r = experts_of(d, g);
    move_chunks(source_rows(d), moves, d.expert_rows);
    move_chunks(source_probs(d), moves, d.expert_probs);
    zero_segment_padding(d.expert_segments, d.expert_rows, r.begin, r.end);
    zero_segment_padding(d.expert_segments, d.expert_probs, r.begin, r.end);
}

void combine_preprocess(AlltoallDispatch& d, ExpertGroup g) {
    move_chunks(d.expert_out, invert(moves_of(d, g)), has_etp(d) ? d.gathered_out : d.combine_send);
}

void token_combine(comm::Communicator& ep_comm, AlltoallDispatch& d, ExpertGroup g,
                   comm::Communicator* etp_comm) {
    if (has_etp(d)) {
        // The ETP ranks' partial sums (each holds 1/ETP of the FFN) of this rank's rows.
        etp_reduce_scatter_rows(etp_of(d, etp_comm), d.gathered_out, d.combine_send, d.etp_counts,
                                d.combine_send.row_size(), d.etp_parts, d.etp_row_sum);
    }
    ep_comm.all_to_all_v(d.combine_send.raw(), d.combine_recv.raw(), layout_of(d, g).swapped(),
                         row_bytes(d.combine_send));
}

void combine_postprocess(const AlltoallDispatch& d, const Tensor& shared, const Tensor& y) {
    combine_forward(d.plan, d.send_segments, d.combine_recv, shared, y);
}

void combine_postprocess_backward(const Tensor& dy, AlltoallDispatch& d, Arena& arena) {
    const int64_t H = dy.row_size();
    const DType cd = dy.dtype();
    const int64_t R = d.send_segments.total_rows(), Rr = d.layout.recv_extent(),
                  Rp = d.expert_segments.total_rows();
    d.d_combine_recv = arena.alloc({R, H}, cd);
    d.d_combine_send = arena.alloc({Rr, H}, cd);
    d.d_expert_out = arena.alloc({Rp, H}, cd);
    d.d_expert_rows = arena.alloc({Rp, H}, cd);
    d.d_expert_probs = arena.alloc({Rp}, DType::kF32);
    d.d_recv_rows = arena.alloc({Rr, H}, cd);
    d.d_recv_probs = arena.alloc({Rr}, DType::kF32);
    d.d_send_rows = arena.alloc({R, H}, cd);
    d.d_send_probs = arena.alloc({R}, DType::kF32);
    if (has_etp(d)) {
        const int64_t Rg = sum(d.etp_counts, 0, d.etp_counts.size());
        d.d_gathered_out = arena.alloc({Rg, H}, cd);
        d.d_gathered_rows = arena.alloc({Rg, H}, cd);
        d.d_gathered_probs = arena.alloc({Rg}, DType::kF32);
    }
    combine_backward(d.plan, d.send_segments, dy, d.d_combine_recv);
}

void token_combine_backward(comm::Communicator& ep_comm, AlltoallDispatch& d, ExpertGroup g,
                            comm::Communicator* etp_comm) {
    ep_comm.all_to_all_v(d.d_combine_recv.raw(), d.d_combine_send.raw(), layout_of(d, g),
                         row_bytes(d.d_combine_recv));
    if (has_etp(d)) {
        // The reduce-scatter's backward: every ETP rank's partial had gradient d_combine_send.
        etp_gather_rows(etp_of(d, etp_comm), d.d_combine_send, d.d_gathered_out, d.etp_counts,
                        row_bytes(d.d_combine_send));
    }
}

void combine_preprocess_backward(AlltoallDispatch& d, ExpertGroup g) {
    const ExpertRange r = experts_of(d, g);
    move_chunks(has_etp(d) ? d.d_gathered_out : d.d_combine_send, moves_of(d, g), d.d_expert_out);
    zero_segment_padding(d.expert_segments, d.d_expert_out, r.begin, r.end);
}

void dispatch_postprocess_backward(AlltoallDispatch& d, ExpertGroup g) {
    const ChunkMoves back = invert(moves_of(d, g));
    move_chunks(d.d_expert_rows, back, has_etp(d) ? d.d_gathered_rows : d.d_recv_rows);
    move_chunks(d.d_expert_probs, back, has_etp(d) ? d.d_gathered_probs : d.d_recv_probs);
}

void token_dispatch_backward(comm::Communicator& ep_comm, AlltoallDispatch& d, ExpertGroup g,
                             comm::Communicator* etp_comm) {
    if (has_etp(d)) {
        // The all-gather's backward: each rank's rows get the ETP ranks' partial gradients
        // (each from its FFN shard) summed; so do their weights'.
        comm::Communicator& etp = etp_of(d, etp_comm);
        etp_reduce_scatter_rows(etp, d.d_gathered_rows, d.d_recv_rows, d.etp_counts,
                                d.d_recv_rows.row_size(), d.etp_parts, d.etp_row_sum);
        etp_reduce_scatter_rows(etp, d.d_gathered_probs, d.d_recv_probs, d.etp_counts, 1,
                                d.etp_parts, d.etp_row_sum);
    }
    const comm::AllToAllLayout back = layout_of(d, g).swapped();
    ep_comm.all_to_all_v(d.d_recv_rows.raw(), d.d_send_rows.raw(), back, row_bytes(d.d_recv_rows));
    ep_comm.all_to_all_v(d.d_recv_probs.raw(), d.d_send_probs.raw(), back, sizeof(float));
}

void dispatch_permute_backward(const AlltoallDispatch& d, const Tensor& dx_acc,
                               const Tensor& dweight) {
    permute_backward(d.plan, d.send_segments, d.d_send_rows, d.d_send_probs, dx_acc, dweight);
}

}  // namespace epo::moe::alltoall

namespace epo::moe {
namespace {

// The dispatcher's own state behind the interface's handle (made by new_state()).
AlltoallDispatch& own(DispatchState& d) {
    return static_cast<AlltoallDispatch&>(d);
}
const AlltoallDispatch& own(const DispatchState& d) {
    return static_cast<const AlltoallDispatch&>(d);
}

}  // namespace

namespace {

// The comms' ETP communicator, which must have the dispatcher's ETP size (null: ETP 1).
comm::Communicator* etp_comm_of(const DispatchComms& comms, int etp_size) {
    EPO_CHECK(etp_size == 1 || (comms.etp != nullptr && comms.etp->size() == etp_size),
              "the alltoall dispatcher for expert tensor parallelism {} runs on a stream whose ETP "
              "group has {} rank(s)",
              etp_size, comms.etp != nullptr ? comms.etp->size() : 0);
    return etp_size > 1 ? comms.etp : nullptr;
}

}  // namespace

AlltoallDispatcher::AlltoallDispatcher(const MoeConfig& cfg, int ep_size, int ep_rank, int etp_size)
    : cfg_(cfg), ep_size_(ep_size), ep_rank_(ep_rank), etp_size_(etp_size) {
    EPO_CHECK(ep_size >= 1 && ep_rank >= 0 && ep_rank < ep_size, "EP rank {} of {}", ep_rank,
              ep_size);
    EPO_CHECK(etp_size >= 1, "expert tensor parallel size {}", etp_size);
}

std::unique_ptr<DispatchState> AlltoallDispatcher::new_state() const {
    return std::make_unique<AlltoallDispatch>();
}

void AlltoallDispatcher::dispatch_preprocess(const RouterOutput& routing, const Tensor& x,
                                             DispatchState& d, Arena& arena) const {
    alltoall::dispatch_preprocess(cfg_, ep_size_, ep_rank_, routing, own(d), arena);
    alltoall::dispatch_permute(routing, x, own(d));
}

void AlltoallDispatcher::token_dispatch(const DispatchComms& comms, DispatchState& d, Arena& arena,
                                        ExpertGroup g) const {
    if (g.index == 0) {
        alltoall::exchange_counts(cfg_, comms.ep, own(d), arena, g.count,
                                  etp_comm_of(comms, etp_size_));
    }
    alltoall::token_dispatch(comms.ep, own(d), g, etp_comm_of(comms, etp_size_));
}

void AlltoallDispatcher::dispatch_postprocess(DispatchState& d, ExpertGroup g) const {
    alltoall::dispatch_postprocess(own(d), g);
}

void AlltoallDispatcher::combine_preprocess(DispatchState& d, ExpertGroup g) const {
    alltoall::combine_preprocess(own(d), g);
}

void AlltoallDispatcher::token_combine(const DispatchComms& comms, DispatchState& d,
                                       ExpertGroup g) const {
    alltoall::token_combine(comms.ep, own(d), g, etp_comm_of(comms, etp_size_));
}

void AlltoallDispatcher::combine_postprocess(const DispatchState& d, const Tensor& shared,
                                             const Tensor& y) const {
    alltoall::combine_postprocess(own(d), shared, y);
}

void AlltoallDispatcher::combine_postprocess_backward(const Tensor& dy, DispatchState& d,
                                                      Arena& arena) const {
    alltoall::combine_postprocess_backward(dy, own(d), arena);
}

void AlltoallDispatcher::token_combine_backward(const DispatchComms& comms, DispatchState& d,
                                                ExpertGroup g) const {
    alltoall::token_combine_backward(comms.ep, own(d), g, etp_comm_of(comms, etp_size_));
}

void AlltoallDispatcher::combine_preprocess_backward(DispatchState& d, ExpertGroup g) const {
    alltoall::combine_preprocess_backward(own(d), g);
}

void AlltoallDispatcher::dispatch_postprocess_backward(DispatchState& d, ExpertGroup g) const {
    alltoall::dispatch_postprocess_backward(own(d), g);
}

void AlltoallDispatcher::token_dispatch_backward(const DispatchComms& comms, DispatchState& d,
                                                 ExpertGroup g) const {
    alltoall::token_dispatch_backward(comms.ep, own(d), g, etp_comm_of(comms, etp_size_));
}

void AlltoallDispatcher::gather_dweight(const DispatchState& d, const Tensor& dweight) const {
    const AlltoallDispatch& a = own(d);
    moe::gather_dweight(a.plan, a.send_segments, a.d_send_probs, dweight);
}

void AlltoallDispatcher::token_row_sum(const DispatchState& d, std::int64_t t, float* acc) const {
    const AlltoallDispatch& a = own(d);
    moe::token_row_sum(a.plan, a.send_segments, a.d_send_rows, t, acc);
}

}  // namespace epo::moe
