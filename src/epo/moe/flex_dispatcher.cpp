#include "epo/moe/flex_dispatcher.h"

#include <atomic>
#include <cstring>

#include "epo/core/error.h"
#include "epo/kernels/rows.h"

namespace epo::moe {

const char* flex_backend_name(FlexBackend b) {
    return b == FlexBackend::kDeepep ? "deepep" : "hybridep";
}

namespace {
std::atomic<std::int64_t> g_copy_tokens{0}, g_copy_flex{0}, g_copy_alltoall{0};
}  // namespace

flex::InterNodeCopies inter_node_copies_total() {
    return {g_copy_tokens.load(std::memory_order_relaxed),
            g_copy_flex.load(std::memory_order_relaxed),
            g_copy_alltoall.load(std::memory_order_relaxed)};
}

namespace flex {
namespace {

std::size_t row_bytes(const Tensor& t) {
    return static_cast<std::size_t>(t.row_size()) * dtype_size(t.dtype());
}
char* row_ptr(const Tensor& t, std::int64_t row) {
    return static_cast<char*>(t.raw()) + static_cast<std::size_t>(row) * row_bytes(t);
}

// What each peer sends this rank, from what this rank sends each peer (one count per peer).
std::vector<std::int64_t> exchange_counts(comm::Communicator& c,
                                          const std::vector<std::int64_t>& send) {
    const std::vector<std::int64_t> ones(static_cast<std::size_t>(c.size()), 1);
    std::vector<std::int64_t> recv(send.size());
    c.all_to_all_v(send.data(), recv.data(), comm::AllToAllLayout::packed(ones, ones),
                   sizeof(std::int64_t));
    return recv;
}

// dst row = the f32 sum, in order, of the rows `src` of `rows` for which `take` holds (rounded
// to dst's dtype); a zero row when there are none. The sum starts from the first row (not from
// 0), so the bits are those of reference_token_sum's.
template <class Take>
void sum_rows(const Tensor& rows, std::int64_t count, Take take, const Tensor& dst,
              std::int64_t dst_row, std::vector<float>& acc) {
    const std::int64_t H = rows.row_size();
    acc.resize(static_cast<std::size_t>(H));
    bool any = false;
    for (std::int64_t i = 0; i < count; ++i) {
        const std::int64_t r = take(i);
        if (r < 0)
            continue;
        (any ? kernels::add_row : kernels::load_row)(row_ptr(rows, r), rows.dtype(), acc.data(), H);
        any = true;
    }
    if (any) {
        kernels::store_row(acc.data(), row_ptr(dst, dst_row), dst.dtype(), H);
    } else {
        std::memset(row_ptr(dst, dst_row), 0, row_bytes(dst));
    }
}

void copy_rows(const Tensor& src, const std::vector<std::int32_t>& src_of, const Tensor& dst) {
    const std::size_t bytes = row_bytes(src);
    for (std::size_t i = 0; i < src_of.size(); ++i)
        std::memcpy(row_ptr(dst, static_cast<std::int64_t>(i)), row_ptr(src, src_of[i]), bytes);
}

std::int64_t rows_of(const std::vector<std::int32_t>& meta, const Geometry& g) {
    return static_cast<std::int64_t>(meta.size()) / meta_width(g);
}

}  // namespace

FlexComms flex_comms(const DispatchComms& comms, const FlexDispatch& d) {
    if (comms.ep_node == nullptr || comms.ep_peer == nullptr) {
        throw Error(ErrorKind::kConfig,
                    "the flex dispatcher was given the EP communicator only: it needs the "
                    "stream's ep_node and ep_peer communicators too (pass the stream's "
                    "ProcessGroups as the DispatchComms)");
    }
    comm::Communicator& node = *comms.ep_node;
    comm::Communicator& peer = *comms.ep_peer;
    const int P = d.geo.ranks_per_node;
    EPO_CHECK(node.size() == P && peer.size() == d.geo.num_nodes && node.rank() == d.ep_rank % P &&
                  peer.rank() == d.ep_rank / P,
              "flex dispatch for EP rank {} as {} nodes x {} ranks on communicators {} (rank {} of "
              "{}) and {} (rank {} of {})",
              d.ep_rank, d.geo.num_nodes, P, node.name(), node.rank(), node.size(), peer.name(),
              peer.rank(), peer.size());
    return FlexComms{node, peer};
}

// ---- forward ---------------------------------------------------------------------------------

void dispatch_preprocess(const MoeConfig& cfg, FlexBackend backend, int ep_size, int ep_rank,
                         int ranks_per_node, const RouterOutput& routing, FlexDispatch& d,
                         Arena& arena) {
    d.backend = backend;
    d.ep_rank = ep_rank;
    d.geo = make_geometry(cfg, ep_size, ranks_per_node);
    d.plan = moe::dispatch_preprocess(cfg, routing.topk_index, routing.topk_weight, arena);
    d.source = make_source_layout(d.geo, d.plan, routing.topk_index, routing.topk_weight, ep_rank);
    const InterNodeCopies copies = inter_node_copies(d.geo, d.source, d.plan.num_tokens, ep_rank);
    g_copy_tokens.fetch_add(copies.tokens, std::memory_order_relaxed);
    g_copy_flex.fetch_add(copies.flex, std::memory_order_relaxed);
    g_copy_alltoall.fetch_add(copies.alltoall, std::memory_order_relaxed);
    const std::int64_t Ms = d.source.num_messages(), H = cfg.hidden_size;
    const DType cd = compute_dtype(cfg);
    d.send_rows = arena.alloc({Ms, H}, cd);
    d.combine_recv = arena.alloc({Ms, H}, cd);
}

void dispatch_permute(const Tensor& x, FlexDispatch& d) {
    copy_rows(x, d.source.msg_token, d.send_rows);
}

void dispatch_layout(const FlexComms& c, FlexDispatch& d, Arena& arena) {
    const Geometry& g = d.geo;
    const std::int64_t MW = meta_width(g);
    const int P = g.ranks_per_node, me = d.ep_rank % P, node = d.ep_rank / P;
    const std::size_t meta_bytes = static_cast<std::size_t>(MW) * sizeof(std::int32_t);

    // 1. Message counts, then the messages' metadata, to the forwarders (the peer ranks).
    d.peer_layout = comm::AllToAllLayout::packed(d.source.node_counts,
                                                 exchange_counts(c.peer, d.source.node_counts));
    d.fwd_meta.assign(static_cast<std::size_t>(d.peer_layout.recv_extent() * MW), 0);
    c.peer.all_to_all_v(d.source.meta.data(), d.fwd_meta.data(), d.peer_layout, meta_bytes);

    // 2. The forwarder's units; this rank's units from every forwarder of the node.
    d.forward = make_forward_layout(g, d.fwd_meta, node);
    if (d.backend == FlexBackend::kDeepep) {
        d.node_layout = comm::AllToAllLayout::packed(
            d.forward.rank_counts, exchange_counts(c.node, d.forward.rank_counts));
        d.recv_meta.assign(static_cast<std::size_t>(d.node_layout.recv_extent() * MW), 0);
        c.node.all_to_all_v(d.forward.unit_meta.data(), d.recv_meta.data(), d.node_layout,
                            meta_bytes);
    } else {
        // hybridep: every forwarder's metadata to every rank of the node (one node-wide copy),
        // from which each rank picks its units itself, in the order a deepep forwarder would
        // have sent them (forwarders ascending, messages in arrival order).
        const std::int64_t Mf = rows_of(d.fwd_meta, g);
        const std::vector<std::int64_t> own(static_cast<std::size_t>(P), Mf);
        const std::vector<std::int64_t> all = exchange_counts(c.node, own);
        d.node_gather = comm::AllToAllLayout::packed(own, all);
        std::fill(d.node_gather.send_offsets.begin(), d.node_gather.send_offsets.end(), 0);
        d.node_msg_offsets.assign(static_cast<std::size_t>(P) + 1, 0);
        for (int j = 0; j < P; ++j)
            d.node_msg_offsets[j + 1] = d.node_msg_offsets[j] + all[j];
        std::vector<std::int32_t> node_meta(
            static_cast<std::size_t>(d.node_gather.recv_extent() * MW));
        c.node.all_to_all_v(d.fwd_meta.data(), node_meta.data(), d.node_gather, meta_bytes);
        const ForwardLayout mine = make_forward_layout(g, node_meta, node);
        std::int64_t begin = 0;
        for (int i = 0; i < me; ++i)
            begin += mine.rank_counts[i];
        const std::int64_t count = mine.rank_counts[me];
        d.unit_node_msg.assign(mine.unit_msg.begin() + begin,
                               mine.unit_msg.begin() + begin + count);
        d.recv_meta.assign(mine.unit_meta.begin() + begin * MW,
                           mine.unit_meta.begin() + (begin + count) * MW);
        std::vector<std::int64_t> from(static_cast<std::size_t>(P), 0);
        for (std::int32_t m : d.unit_node_msg) {
            int j = 0;
            while (m >= d.node_msg_offsets[j + 1])
                ++j;
            ++from[j];
        }
        d.node_layout = comm::AllToAllLayout::packed(d.forward.rank_counts, from);
    }

    // 3. The expert rows and the receive side.
    d.receive = make_receive_layout(g, d.recv_meta, d.ep_rank);
    d.expert_segments = d.receive.segments;
    const std::int64_t H = d.send_rows.row_size(), Mf = rows_of(d.fwd_meta, g),
                       Uf = d.forward.num_units(), Ur = d.receive.num_units(),
                       Rp = d.expert_segments.total_rows();
    const DType cd = d.send_rows.dtype();
    d.fwd_rows = arena.alloc({Mf, H}, cd);
    if (d.backend == FlexBackend::kDeepep) {
        d.fwd_unit_rows = arena.alloc({Uf, H}, cd);
        d.recv_rows = arena.alloc({Ur, H}, cd);
    } else {
        d.node_rows = arena.alloc({d.node_gather.recv_extent(), H}, cd);
    }
    d.expert_rows = arena.alloc({Rp, H}, cd);
    d.expert_probs = arena.alloc({Rp}, DType::kF32);
    d.expert_out = arena.alloc({Rp, H}, cd);
    d.unit_out = arena.alloc({Ur, H}, cd);
    d.fwd_unit_out = arena.alloc({Uf, H}, cd);
    d.fwd_msg_out = arena.alloc({Mf, H}, cd);
}

void dispatch_payload(const FlexComms& c, FlexDispatch& d) {
    const std::size_t rb = row_bytes(d.send_rows);
    c.peer.all_to_all_v(d.send_rows.raw(), d.fwd_rows.raw(), d.peer_layout, rb);
    if (d.backend == FlexBackend::kDeepep) {
        copy_rows(d.fwd_rows, d.forward.unit_msg, d.fwd_unit_rows);
        c.node.all_to_all_v(d.fwd_unit_rows.raw(), d.recv_rows.raw(), d.node_layout, rb);
    } else {
        c.node.all_to_all_v(d.fwd_rows.raw(), d.node_rows.raw(), d.node_gather, rb);
    }
}

void dispatch_postprocess(FlexDispatch& d) {
    const ReceiveLayout& rl = d.receive;
    const bool deepep = d.backend == FlexBackend::kDeepep;
    const Tensor& src = deepep ? d.recv_rows : d.node_rows;  // hybridep: read in place
    const std::size_t rb = row_bytes(d.expert_rows);
    float* probs = d.expert_probs.data<float>();
    for (std::size_t row = 0; row < rl.row_unit.size(); ++row) {
        const std::int32_t u = rl.row_unit[row];
        char* dst = row_ptr(d.expert_rows, static_cast<std::int64_t>(row));
        if (u < 0) {
            std::memset(dst, 0, rb);  // alignment row
        } else {
            std::memcpy(dst, row_ptr(src, deepep ? u : d.unit_node_msg[u]), rb);
        }
        probs[row] = rl.row_prob[row];
    }
}

void combine_preprocess(FlexDispatch& d) {
    const std::int64_t W = d.geo.positions;
    std::vector<float> acc;
    for (std::int64_t u = 0; u < d.receive.num_units(); ++u) {
        sum_rows(
            d.expert_out, W, [&](std::int64_t p) { return d.receive.unit_row[u * W + p]; },
            d.unit_out, u, acc);
    }
}

namespace {

// Per message the node's unit rows in local-rank order (the forwarder's pre-reduction).
void sum_units(const FlexDispatch& d, const Tensor& unit_rows, const Tensor& msg_rows) {
    const int P = d.geo.ranks_per_node;
    std::vector<float> acc;
    for (std::int64_t f = 0; f < msg_rows.dim(0); ++f) {
        sum_rows(
            unit_rows, P,
            [&](std::int64_t i) {
                const std::int32_t u = d.forward.msg_unit[f * P + i];
                return u >= 0 && d.forward.unit_real[u] ? u : -1;
            },
            msg_rows, f, acc);
    }
}

}  // namespace

void token_combine(const FlexComms& c, FlexDispatch& d) {
    const std::size_t rb = row_bytes(d.unit_out);
    c.node.all_to_all_v(d.unit_out.raw(), d.fwd_unit_out.raw(), d.node_layout.swapped(), rb);
    sum_units(d, d.fwd_unit_out, d.fwd_msg_out);
    c.peer.all_to_all_v(d.fwd_msg_out.raw(), d.combine_recv.raw(), d.peer_layout.swapped(), rb);
}

namespace {

// acc = token t's node rows of `rows` ((Ms, H)) in node order, f32; zero when none.
void node_sum(const FlexDispatch& d, const Tensor& rows, std::int64_t t, float* acc) {
    const int N = d.geo.num_nodes;
    const std::int64_t H = rows.row_size();
    bool any = false;
    for (int m = 0; m < N; ++m) {
        const std::int32_t msg = d.source.token_msg[t * N + m];
        if (msg < 0 || !d.source.msg_real[msg])
            continue;
        (any ? kernels::add_row : kernels::load_row)(row_ptr(rows, msg), rows.dtype(), acc, H);
        any = true;
    }
    if (!any)
        std::fill(acc, acc + H, 0.0f);
}

}  // namespace

void combine_postprocess(const FlexDispatch& d, const Tensor& shared, const Tensor& y) {
    const std::int64_t T = d.plan.num_tokens, H = d.combine_recv.row_size();
    check_tensor(y, {T, H}, y.dtype(), "combine output y");
    if (shared.defined())
        check_tensor(shared, {T, H}, DType::kF32, "shared expert output");
    std::vector<float> acc(static_cast<std::size_t>(H));
    for (std::int64_t t = 0; t < T; ++t) {
        node_sum(d, d.combine_recv, t, acc.data());
        if (shared.defined())
            kernels::add_row(row_ptr(shared, t), DType::kF32, acc.data(), H);
        kernels::store_row(acc.data(), row_ptr(y, t), y.dtype(), H);
    }
}

// ---- backward --------------------------------------------------------------------------------

void combine_postprocess_backward(const Tensor& dy, FlexDispatch& d, Arena& arena) {
    const std::int64_t H = dy.row_size(), W = d.geo.positions, Ms = d.source.num_messages(),
                       Mf = rows_of(d.fwd_meta, d.geo), Uf = d.forward.num_units(),
                       Ur = d.receive.num_units(), Rp = d.expert_segments.total_rows();
    const DType cd = dy.dtype();
    d.d_msg = arena.alloc({Ms, H}, cd);
    d.d_fwd_msg = arena.alloc({Mf, H}, cd);
    d.d_fwd_unit = arena.alloc({Uf, H}, cd);
    d.d_unit = arena.alloc({Ur, H}, cd);
    d.d_expert_out = arena.alloc({Rp, H}, cd);
    d.d_expert_rows = arena.alloc({Rp, H}, cd);
    d.d_expert_probs = arena.alloc({Rp}, DType::kF32);
    d.d_unit_rows = arena.alloc({Ur, H}, cd);
    d.d_unit_probs = arena.alloc({Ur, W}, DType::kF32);
    d.d_fwd_unit_rows = arena.alloc({Uf, H}, cd);
    d.d_fwd_unit_probs = arena.alloc({Uf, W}, DType::kF32);
    d.d_fwd_msg_rows = arena.alloc({Mf, H}, cd);
    d.d_fwd_msg_probs = arena.alloc({Mf, W}, DType::kF32);
    d.d_send_rows = arena.alloc({Ms, H}, cd);
    d.d_send_probs = arena.alloc({Ms, W}, DType::kF32);
    copy_rows(dy, d.source.msg_token, d.d_msg);
}

void token_combine_backward(const FlexComms& c, FlexDispatch& d) {
    const std::size_t rb = row_bytes(d.d_msg);
    c.peer.all_to_all_v(d.d_msg.raw(), d.d_fwd_msg.raw(), d.peer_layout, rb);
    copy_rows(d.d_fwd_msg, d.forward.unit_msg, d.d_fwd_unit);
    c.node.all_to_all_v(d.d_fwd_unit.raw(), d.d_unit.raw(), d.node_layout, rb);
}

void combine_preprocess_backward(FlexDispatch& d) {
    const std::int64_t W = d.geo.positions;
    const std::size_t rb = row_bytes(d.d_expert_out);
    // Padding and alignment rows get 0: they were never summed into the output.
    std::memset(d.d_expert_out.raw(), 0, rb * static_cast<std::size_t>(d.d_expert_out.dim(0)));
    for (std::int64_t u = 0; u < d.receive.num_units(); ++u) {
        for (std::int64_t p = 0; p < W; ++p) {
            const std::int32_t row = d.receive.unit_row[u * W + p];
            if (row >= 0)
                std::memcpy(row_ptr(d.d_expert_out, row), row_ptr(d.d_unit, u), rb);
        }
    }
}

void dispatch_postprocess_backward(FlexDispatch& d) {
    const std::int64_t W = d.geo.positions;
    const float* dprobs = d.d_expert_probs.data<float>();
    float* unit_probs = d.d_unit_probs.data<float>();
    std::vector<float> acc;
    for (std::int64_t u = 0; u < d.receive.num_units(); ++u) {
        const std::int32_t* rows = d.receive.unit_row.data() + u * W;
        sum_rows(
            d.d_expert_rows, W, [&](std::int64_t p) { return rows[p]; }, d.d_unit_rows, u, acc);
        for (std::int64_t p = 0; p < W; ++p)
            unit_probs[u * W + p] = rows[p] >= 0 ? dprobs[rows[p]] : 0.0f;
    }
}

void token_dispatch_backward(const FlexComms& c, FlexDispatch& d) {
    const Geometry& g = d.geo;
    const std::int64_t W = g.positions, MW = meta_width(g);
    const int P = g.ranks_per_node;
    const std::size_t rb = row_bytes(d.d_unit_rows), pb = W * sizeof(float);
    const comm::AllToAllLayout back = d.node_layout.swapped();
    c.node.all_to_all_v(d.d_unit_rows.raw(), d.d_fwd_unit_rows.raw(), back, rb);
    c.node.all_to_all_v(d.d_unit_probs.raw(), d.d_fwd_unit_probs.raw(), back, pb);
    sum_units(d, d.d_fwd_unit_rows, d.d_fwd_msg_rows);
    // A position's weight gradient comes from the one unit (rank) it was for.
    const float* unit_probs = d.d_fwd_unit_probs.data<float>();
    float* msg_probs = d.d_fwd_msg_probs.data<float>();
    for (std::int64_t f = 0; f < d.d_fwd_msg_rows.dim(0); ++f) {
        for (std::int64_t p = 0; p < W; ++p) {
            const std::int32_t code = d.fwd_meta[f * MW + p];
            float v = 0.0f;
            if (code >= 0) {
                const int i = g.rank_of_expert(expert_of_code(code, g.num_experts)) % P;
                v = unit_probs[d.forward.msg_unit[f * P + i] * W + p];
            }
            msg_probs[f * W + p] = v;
        }
    }
    const comm::AllToAllLayout peer_back = d.peer_layout.swapped();
    c.peer.all_to_all_v(d.d_fwd_msg_rows.raw(), d.d_send_rows.raw(), peer_back, rb);
    c.peer.all_to_all_v(d.d_fwd_msg_probs.raw(), d.d_send_probs.raw(), peer_back, pb);
}

void gather_dweight(const FlexDispatch& d, const Tensor& dweight) {
    const std::int64_t T = d.plan.num_tokens, K = d.plan.topk;
    check_tensor(dweight, {T, K}, DType::kF32, "dweight");
    float* dw = dweight.data<float>();
    std::fill(dw, dw + T * K, 0.0f);
    const float* probs = d.d_send_probs.data<float>();
    for (std::size_t i = 0; i < d.source.entry_slot.size(); ++i) {
        if (d.source.entry_slot[i] >= 0)
            dw[d.source.entry_slot[i]] = probs[i];
    }
}

void token_row_sum(const FlexDispatch& d, std::int64_t t, float* acc) {
    node_sum(d, d.d_send_rows, t, acc);
}

}  // namespace flex

// ---- the interface ---------------------------------------------------------------------------

namespace {

// flex moves a micro-batch's tokens node by node in one piece: it has no expert groups (rule
// MO007 refuses chunks with flex before a run).
void whole_only(ExpertGroup g) {
    EPO_CHECK(g.count == 1, "the flex dispatcher cannot split by expert group ({} of {})", g.index,
              g.count);
}

FlexDispatch& own_flex(DispatchState& d) {
    return static_cast<FlexDispatch&>(d);
}
const FlexDispatch& own_flex(const DispatchState& d) {
    return static_cast<const FlexDispatch&>(d);
}

}  // namespace

FlexDispatcher::FlexDispatcher(const MoeConfig& cfg, FlexBackend backend, int ep_size, int ep_rank,
                               int ranks_per_node)
    : cfg_(cfg),
      backend_(backend),
      ep_size_(ep_size),
      ep_rank_(ep_rank),
      ranks_per_node_(ranks_per_node) {
    EPO_CHECK(ep_size >= 1 && ep_rank >= 0 && ep_rank < ep_size, "EP rank {} of {}", ep_rank,
              ep_size);
    if (ranks_per_node < 1 || ep_size % ranks_per_node != 0) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("the flex dispatcher for {} EP ranks was given {} EP ranks per "
                                "node: pass flex_ranks_per_node(expert_model_parallel_size, "
                                "comm.gpus_per_node)",
                                ep_size, ranks_per_node));
    }
    (void)flex::make_geometry(cfg, ep_size, ranks_per_node);  // checks E divides over the group
}

std::unique_ptr<DispatchState> FlexDispatcher::new_state() const {
    return std::make_unique<FlexDispatch>();
}

void FlexDispatcher::dispatch_preprocess(const RouterOutput& routing, const Tensor& x,
                                         DispatchState& d, Arena& arena) const {
    flex::dispatch_preprocess(cfg_, backend_, ep_size_, ep_rank_, ranks_per_node_, routing,
                              own_flex(d), arena);
    flex::dispatch_permute(x, own_flex(d));
}

void FlexDispatcher::token_dispatch(const DispatchComms& comms, DispatchState& d, Arena& arena,
                                    ExpertGroup g) const {
    whole_only(g);
    const flex::FlexComms c = flex::flex_comms(comms, own_flex(d));
    flex::dispatch_layout(c, own_flex(d), arena);
    flex::dispatch_payload(c, own_flex(d));
}

void FlexDispatcher::dispatch_postprocess(DispatchState& d, ExpertGroup g) const {
    whole_only(g);
    flex::dispatch_postprocess(own_flex(d));
}

void FlexDispatcher::combine_preprocess(DispatchState& d, ExpertGroup g) const {
    whole_only(g);
    flex::combine_preprocess(own_flex(d));
}

void FlexDispatcher::token_combine(const DispatchComms& comms, DispatchState& d,
                                   ExpertGroup g) const {
    whole_only(g);
    flex::token_combine(flex::flex_comms(comms, own_flex(d)), own_flex(d));
}

void FlexDispatcher::combine_postprocess(const DispatchState& d, const Tensor& shared,
                                         const Tensor& y) const {
    flex::combine_postprocess(own_flex(d), shared, y);
}

void FlexDispatcher::combine_postprocess_backward(const Tensor& dy, DispatchState& d,
                                                  Arena& arena) const {
    flex::combine_postprocess_backward(dy, own_flex(d), arena);
}

void FlexDispatcher::token_combine_backward(const DispatchComms& comms, DispatchState& d,
                                            ExpertGroup g) const {
    whole_only(g);
    flex::token_combine_backward(flex::flex_comms(comms, own_flex(d)), own_flex(d));
}

void FlexDispatcher::combine_preprocess_backward(DispatchState& d, ExpertGroup g) const {
    whole_only(g);
    flex::combine_preprocess_backward(own_flex(d));
}

void FlexDispatcher::dispatch_postprocess_backward(DispatchState& d, ExpertGroup g) const {
    whole_only(g);
    flex::dispatch_postprocess_backward(own_flex(d));
}

void FlexDispatcher::token_dispatch_backward(const DispatchComms& comms, DispatchState& d,
                                             ExpertGroup g) const {
    whole_only(g);
    flex::token_dispatch_backward(flex::flex_comms(comms, own_flex(d)), own_flex(d));
}

void FlexDispatcher::gather_dweight(const DispatchState& d, const Tensor& dweight) const {
    flex::gather_dweight(own_flex(d), dweight);
}

void FlexDispatcher::token_row_sum(const DispatchState& d, std::int64_t t, float* acc) const {
    flex::token_row_sum(own_flex(d), t, acc);
}

}  // namespace epo::moe
