#include "epo/moe/moe_block.h"

#include "epo/core/error.h"

namespace epo::moe {
namespace {

std::int64_t num_chunks(const MoeBlock& b) {
    return b.cfg.num_chunks;
}

// Chunks are groups of experts over one dispatcher state (moe_block.h).
bool by_experts(const MoeBlock& b) {
    return b.cfg.num_chunks > 1 && b.cfg.chunk_by == ChunkBy::kExperts;
}

// The expert group chunk `chunk` dispatches: all experts unless chunked by experts.
ExpertGroup group_of(const MoeBlock& b, int chunk) {
    return by_experts(b) ? ExpertGroup{chunk, static_cast<int>(num_chunks(b))} : ExpertGroup{};
}

// The routing of rows [r.begin, r.end): views of what a dispatcher plans from (the top-k
// choices and weights, and the router input for dispatchers that read it).
RouterOutput routing_rows(const RouterOutput& all, TokenRows r) {
    const auto rows = [&](const Tensor& t) {
        return t.defined() ? t.rows(r.begin, r.end) : Tensor();
    };
    RouterOutput out;
    out.x = rows(all.x);
    out.topk_index = rows(all.topk_index);
    out.topk_prob = rows(all.topk_prob);
    out.topk_weight = rows(all.topk_weight);
    out.num_sequences = all.num_sequences;
    return out;
}

MoeTokenChunk& chunk_of(const MoeBlock& b, MoeBlockState& st, int chunk) {
    EPO_CHECK(chunk >= 0 && chunk < static_cast<int>(st.chunks.size()) &&
                  static_cast<std::int64_t>(st.chunks.size()) == num_chunks(b),
              "token chunk {} of a block state with {} chunk(s) (moe_ep_overlap_num_chunks {})",
              chunk, st.chunks.size(), num_chunks(b));
    return st.chunks[static_cast<size_t>(chunk)];
}

// The rows of the micro-batch chunk `chunk` covers (the router's T; all of them by experts).
TokenRows rows_of(const MoeBlock& b, const MoeBlockState& st, int chunk) {
    const std::int64_t T = st.router.topk_index.dim(0);
    return by_experts(b) ? TokenRows{0, T} : token_chunk_rows(T, num_chunks(b), chunk);
}

// The dispatcher state chunk `chunk` runs on: its own, or by experts the micro-batch's one.
DispatchState& dispatch_of(const MoeBlock& b, MoeBlockState& st, int chunk) {
    return *chunk_of(b, st, by_experts(b) ? 0 : chunk).dispatch;
}

// By experts, chunk `chunk`'s view of the expert-facing buffers: its group's segments and rows.
struct GroupRows {
    ExpertSegments segments;
    std::int64_t first_expert = 0, begin = 0, end = 0;  // rows [begin, end) of the buffers
    Tensor of(const Tensor& t) const { return t.rows(begin, end); }
};
GroupRows group_rows(const MoeBlock& b, const DispatchState& d, int chunk) {
    const ExpertSegments& seg = d.expert_segments;
    if (!by_experts(b)) {
        return GroupRows{seg, 0, 0, seg.total_rows()};
    }
    const ExpertRange r = expert_group_range(seg.num_experts(), group_of(b, chunk));
    return GroupRows{segment_range(seg, r.begin, r.end), r.begin,
                     seg.offsets[static_cast<size_t>(r.begin)],
                     seg.offsets[static_cast<size_t>(r.end)]};
}

}  // namespace

TokenRows token_chunk_rows(std::int64_t num_tokens, std::int64_t num_chunks, int chunk) {
    EPO_CHECK(num_chunks >= 1 && chunk >= 0 && chunk < num_chunks, "token chunk {} of {}", chunk,
              num_chunks);
    return {chunk * num_tokens / num_chunks, (chunk + 1) * num_tokens / num_chunks};
}

TokenRows combine_output_rows(const MoeConfig& cfg, std::int64_t num_tokens, int chunk) {
    if (cfg.num_chunks > 1 && cfg.chunk_by == ChunkBy::kExperts) {
        return chunk == cfg.num_chunks - 1 ? TokenRows{0, num_tokens} : TokenRows{};
    }
    return token_chunk_rows(num_tokens, cfg.num_chunks, chunk);
}

TokenRows combine_grad_rows(const MoeConfig& cfg, std::int64_t num_tokens, int chunk) {
    if (cfg.num_chunks > 1 && cfg.chunk_by == ChunkBy::kExperts) {
        return chunk == 0 ? TokenRows{0, num_tokens} : TokenRows{};
    }
    return token_chunk_rows(num_tokens, cfg.num_chunks, chunk);
}

void block_pre_dispatch_forward(const MoeBlock& b, const Tensor& x, std::int64_t num_sequences,
                                MoeBlockState& st, Arena& arena, Arena* scratch) {
    const std::int64_t T = x.dim(0), C = num_chunks(b);
    st.shared_out = Tensor();
    if (b.cfg.has_shared_experts() && !b.cfg.shared_expert_overlap) {
        st.shared_out = arena.alloc({T, b.cfg.hidden_size}, DType::kF32);
        shared_expert_forward(
            b.params.shared, x, st.shared_out, st.shared, arena,
            b.cfg.recompute_shared_experts ? FfnRecompute::kAll : FfnRecompute::kNone, scratch);
    }
    st.router = router_forward(b.cfg, b.params.router, x, num_sequences, arena);
    st.chunks.resize(static_cast<size_t>(C));
    for (size_t c = 0; c < st.chunks.size(); ++c) {
        if (!st.chunks[c].dispatch && (c == 0 || !by_experts(b)))
            st.chunks[c].dispatch = b.dispatcher.new_state();
    }
    st.combines_done = st.combine_backwards_done = 0;
    if (C == 1 || by_experts(b)) {
        b.dispatcher.dispatch_preprocess(st.router, x, *st.chunks[0].dispatch, arena);
        return;
    }
    // Every chunk's send side is planned here, on the compute stream, before any chunk's
    // dispatch runs: the comm stream then only moves bytes.
    for (int c = 0; c < C; ++c) {
        const TokenRows r = token_chunk_rows(T, C, c);
        b.dispatcher.dispatch_preprocess(routing_rows(st.router, r), x.rows(r.begin, r.end),
                                         *st.chunks[static_cast<size_t>(c)].dispatch, arena);
    }
}

void block_shared_expert_forward(const MoeBlock& b, const Tensor& x, MoeBlockState& st,
                                 Arena& arena) {
    EPO_CHECK(b.cfg.shared_expert_overlap,
              "the shared expert's own node in a block that runs it in pre_dispatch "
              "(moe_shared_expert_overlap is off)");
    st.shared_out = arena.alloc({x.dim(0), b.cfg.hidden_size}, DType::kF32);
    shared_expert_forward(b.params.shared, x, st.shared_out, st.shared, arena, FfnRecompute::kNone,
                          nullptr);
}

void block_dispatch_forward(const MoeBlock& b, const DispatchComms& comms, MoeBlockState& st,
                            Arena& arena, int chunk) {
    b.dispatcher.token_dispatch(comms, dispatch_of(b, st, chunk), arena, group_of(b, chunk));
}

void block_mlp_forward(const MoeBlock& b, MoeBlockState& st, Arena& arena, int chunk,
                       Arena* scratch) {
    MoeTokenChunk& ch = chunk_of(b, st, chunk);
    DispatchState& d = dispatch_of(b, st, chunk);
    const ExpertGroup g = group_of(b, chunk);
    b.dispatcher.dispatch_postprocess(d, g);
    const GroupRows gr = group_rows(b, d, chunk);
    experts_forward(b.params.experts, gr.segments, gr.of(d.expert_rows), gr.of(d.expert_probs),
                    gr.of(d.expert_out), ch.experts, arena, gr.first_expert,
                    b.cfg.recompute_moe_act ? FfnRecompute::kActivation : FfnRecompute::kNone,
                    scratch);
    b.dispatcher.combine_preprocess(d, g);
}

void block_combine_forward(const MoeBlock& b, const DispatchComms& comms, MoeBlockState& st,
                           const Tensor& y, int chunk) {
    DispatchState& d = dispatch_of(b, st, chunk);
    b.dispatcher.token_combine(comms, d, group_of(b, chunk));
    if (by_experts(b)) {
        // The sum reads every group's rows: it runs once they have all come back.
        EPO_CHECK(st.combines_done == chunk, "the combine of expert chunk {} after {} of them",
                  chunk, st.combines_done);
        ++st.combines_done;
        if (chunk + 1 < num_chunks(b)) {
            EPO_CHECK(!y.defined(), "expert chunk {} of {} writes no output rows", chunk,
                      num_chunks(b));
            return;
        }
    }
    const TokenRows r = rows_of(b, st, chunk);
    check_tensor(y, {r.end - r.begin, b.cfg.hidden_size}, DType::kF32, "MoE block chunk output");
    EPO_CHECK(!b.cfg.has_shared_experts() || st.shared_out.defined(),
              "the combine of a block whose shared expert has not run (with "
              "moe_shared_expert_overlap its node must come before the combine)");
    const Tensor shared = st.shared_out.defined() && num_chunks(b) > 1
                              ? st.shared_out.rows(r.begin, r.end)
                              : st.shared_out;
    b.dispatcher.combine_postprocess(d, shared, y);
}

void block_combine_backward(const MoeBlock& b, const DispatchComms& comms, const Tensor& dy,
                            MoeBlockState& st, Arena& arena, int chunk) {
    DispatchState& d = dispatch_of(b, st, chunk);
    const TokenRows r = rows_of(b, st, chunk);
    // By experts, the first chunk spreads all of dy to the rows (every group's); the others only
    // send their group's back.
    const bool first = !by_experts(b) || st.combine_backwards_done++ == 0;
    EPO_CHECK(!by_experts(b) || st.combine_backwards_done == chunk + 1,
              "the combine backward of expert chunk {} out of order", chunk);
    if (first) {
        st.dy = dy;
        b.dispatcher.combine_postprocess_backward(
            num_chunks(b) > 1 && !by_experts(b) ? dy.rows(r.begin, r.end) : dy, d, arena);
    }
    b.dispatcher.token_combine_backward(comms, d, group_of(b, chunk));
}

void block_mlp_backward(const MoeBlock& b, MoeBlockState& st, Arena& arena, int chunk) {
    MoeTokenChunk& ch = chunk_of(b, st, chunk);
    DispatchState& d = dispatch_of(b, st, chunk);
    const ExpertGroup g = group_of(b, chunk);
    b.dispatcher.combine_preprocess_backward(d, g);
    const GroupRows gr = group_rows(b, d, chunk);
    experts_backward_dgrad(b.params.experts, gr.of(d.d_expert_out), gr.of(d.d_expert_rows),
                           gr.of(d.d_expert_probs), ch.experts, arena);
    b.dispatcher.dispatch_postprocess_backward(d, g);
}

// Why the order matters: each chunk's weight gradient is added to the expert gradients as it
// comes, so both schedules run the chunks in ascending order (schedule.h) to stay bit-identical.
void block_mlp_backward_dw(const MoeBlock& b, MoeBlockState& st, Arena& scratch, int chunk) {
    experts_backward_wgrad(b.params.experts, b.cfg.gradient_accumulation_fusion,
                           chunk_of(b, st, chunk).experts, scratch);
}

void block_dispatch_backward(const MoeBlock& b, const DispatchComms& comms, MoeBlockState& st,
                             int chunk) {
    b.dispatcher.token_dispatch_backward(comms, dispatch_of(b, st, chunk), group_of(b, chunk));
}

namespace {

// The shared expert's input gradient (T, H) f32 into dx: one product over all rows into zeros,
// so dx holds round(dh W1) whichever node runs it.
void shared_expert_dgrad_into(const MoeBlock& b, const Tensor& dy, const Tensor& dx,
                              MoeBlockState& st, Arena& arena, Arena* scratch) {
    dx.fill_zero();
    shared_expert_backward_dgrad(b.params.shared, dy, dx, st.shared, arena, scratch);
}

}  // namespace

void block_shared_expert_backward(const MoeBlock& b, const Tensor& dy, const Tensor& dx,
                                  MoeBlockState& st, Arena& arena, Arena& scratch) {
    EPO_CHECK(b.cfg.shared_expert_overlap,
              "the shared expert's own node in a block that runs it in pre_dispatch "
              "(moe_shared_expert_overlap is off)");
    check_tensor(dx, {dy.dim(0), b.cfg.hidden_size}, DType::kF32, "MoE block dx");
    shared_expert_dgrad_into(b, dy, dx, st, arena, nullptr);
    shared_expert_backward_wgrad(b.params.shared, b.cfg.gradient_accumulation_fusion, st.shared,
                                 scratch);
    st.shared.dy = Tensor();  // the caller's node-local copy; nothing reads it after the wgrad
}

// dx = (unpermute + the router's term) + the shared expert's, summed in f32 in that order (the
// reference layer's order). The shared expert's term is one product over all rows, written to dx
// first: here, or with shared-expert overlap by its own node before this one (the same product
// into the same zeros, so the bits do not depend on which). Then one pass over the tokens sums
// a token's row gradients and the router's term in a row of its own and adds the shared term to
// it. With chunks, a token's row gradients come from its chunk's dispatcher state (the same sum,
// the same order).
void block_pre_dispatch_backward(const MoeBlock& b, float loss_grad_scale, MoeBlockState& st,
                                 const Tensor& dx, Arena& arena, Arena& scratch) {
    const std::int64_t T = dx.dim(0), H = b.cfg.hidden_size;
    const std::int64_t C = by_experts(b) ? 1 : num_chunks(b);  // dispatcher states
    check_tensor(dx, {T, H}, DType::kF32, "MoE block dx");
    const bool shared = b.cfg.has_shared_experts();
    if (shared && !b.cfg.shared_expert_overlap)
        shared_expert_dgrad_into(b, st.dy, dx, st, arena, &scratch);
    EPO_CHECK(!shared || st.shared.dgrad_done,
              "the pre_dispatch backward of a block whose shared expert's backward has not run "
              "(with moe_shared_expert_overlap its node must come before)");
    Tensor dweight = scratch.alloc({T, b.cfg.topk}, DType::kF32);
    for (int c = 0; c < C; ++c) {
        const TokenRows r = token_chunk_rows(T, C, c);
        b.dispatcher.gather_dweight(*chunk_of(b, st, c).dispatch,
                                    C > 1 ? dweight.rows(r.begin, r.end) : dweight);
    }
    router_backward_dlogits(b.cfg, b.params.router, dweight, loss_grad_scale, st.router, arena);
    float* out = dx.data<float>();
    // (H) f32: a token's unpermuted rows and router term, before the shared term is added.
    float* row = shared ? scratch.alloc({H}, DType::kF32).data<float>() : nullptr;
    for (int c = 0; c < C; ++c) {
        const TokenRows r = token_chunk_rows(T, C, c);
        const DispatchState& d = *chunk_of(b, st, c).dispatch;
        for (std::int64_t t = r.begin; t < r.end; ++t) {
            float* acc = shared ? row : out + t * H;
            b.dispatcher.token_row_sum(d, t - r.begin, acc);
            router_dx_add_row(b.cfg, b.params.router, st.router, t, acc);
            if (shared) {
                float* o = out + t * H;
                for (std::int64_t i = 0; i < H; ++i)
                    o[i] = acc[i] + o[i];
            }
        }
    }
}

void block_pre_dispatch_backward_dw(const MoeBlock& b, MoeBlockState& st, Arena& scratch) {
    router_backward_wgrad(b.cfg, b.params.router, st.router, scratch);
    // With shared-expert overlap the shared expert's node ran its wgrad with its dgrad.
    if (b.cfg.has_shared_experts() && !b.cfg.shared_expert_overlap) {
        shared_expert_backward_wgrad(b.params.shared, b.cfg.gradient_accumulation_fusion, st.shared,
                                     scratch);
    }
}

}  // namespace epo::moe
