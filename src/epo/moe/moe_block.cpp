#include "epo/moe/moe_block.h"

#include "epo/core/error.h"

namespace epo::moe {
namespace {

std::int64_t num_chunks(const MoeBlock& b) {
    return b.cfg.num_token_chunks;
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

// The rows of the micro-batch chunk `chunk` covers (the router's T).
TokenRows rows_of(const MoeBlock& b, const MoeBlockState& st, int chunk) {
    return token_chunk_rows(st.router.topk_index.dim(0), num_chunks(b), chunk);
}

}  // namespace

TokenRows token_chunk_rows(std::int64_t num_tokens, std::int64_t num_chunks, int chunk) {
    EPO_CHECK(num_chunks >= 1 && chunk >= 0 && chunk < num_chunks, "token chunk {} of {}", chunk,
              num_chunks);
    return {chunk * num_tokens / num_chunks, (chunk + 1) * num_tokens / num_chunks};
}

void block_pre_dispatch_forward(const MoeBlock& b, const Tensor& x, std::int64_t num_sequences,
                                MoeBlockState& st, Arena& arena) {
    const std::int64_t T = x.dim(0), C = num_chunks(b);
    if (b.cfg.has_shared_experts()) {
        st.shared_out = arena.alloc({T, b.cfg.hidden_size}, DType::kF32);
        shared_expert_forward(b.params.shared, x, st.shared_out, st.shared, arena);
    } else {
        st.shared_out = Tensor();
    }
    st.router = router_forward(b.cfg, b.params.router, x, num_sequences, arena);
    st.chunks.resize(static_cast<size_t>(C));
    for (MoeTokenChunk& ch : st.chunks) {
        if (!ch.dispatch)
            ch.dispatch = b.dispatcher.new_state();
    }
    if (C == 1) {
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

void block_dispatch_forward(const MoeBlock& b, const DispatchComms& comms, MoeBlockState& st,
                            Arena& arena, int chunk) {
    b.dispatcher.token_dispatch(comms, *chunk_of(b, st, chunk).dispatch, arena);
}

void block_mlp_forward(const MoeBlock& b, MoeBlockState& st, Arena& arena, int chunk) {
    MoeTokenChunk& ch = chunk_of(b, st, chunk);
    DispatchState& d = *ch.dispatch;
    b.dispatcher.dispatch_postprocess(d);
    experts_forward(b.params.experts, d.expert_segments, d.expert_rows, d.expert_probs,
                    d.expert_out, ch.experts, arena);
    b.dispatcher.combine_preprocess(d);
}

void block_combine_forward(const MoeBlock& b, const DispatchComms& comms, MoeBlockState& st,
                           const Tensor& y, int chunk) {
    DispatchState& d = *chunk_of(b, st, chunk).dispatch;
    const TokenRows r = rows_of(b, st, chunk);
    check_tensor(y, {r.end - r.begin, b.cfg.hidden_size}, DType::kF32, "MoE block chunk output");
    b.dispatcher.token_combine(comms, d);
    const Tensor shared = st.shared_out.defined() && num_chunks(b) > 1
                              ? st.shared_out.rows(r.begin, r.end)
                              : st.shared_out;
    b.dispatcher.combine_postprocess(d, shared, y);
}

void block_combine_backward(const MoeBlock& b, const DispatchComms& comms, const Tensor& dy,
                            MoeBlockState& st, Arena& arena, int chunk) {
    DispatchState& d = *chunk_of(b, st, chunk).dispatch;
    const TokenRows r = rows_of(b, st, chunk);
    st.dy = dy;
    b.dispatcher.combine_postprocess_backward(num_chunks(b) > 1 ? dy.rows(r.begin, r.end) : dy, d,
                                              arena);
    b.dispatcher.token_combine_backward(comms, d);
}

void block_mlp_backward(const MoeBlock& b, MoeBlockState& st, Arena& arena, int chunk) {
    MoeTokenChunk& ch = chunk_of(b, st, chunk);
    DispatchState& d = *ch.dispatch;
    b.dispatcher.combine_preprocess_backward(d);
    experts_backward_dgrad(b.params.experts, d.d_expert_out, d.d_expert_rows, d.d_expert_probs,
                           ch.experts, arena);
    b.dispatcher.dispatch_postprocess_backward(d);
}

// Why the order matters: each chunk's weight gradient is added to the expert gradients as it
// comes, so both schedules run the chunks in ascending order (schedule.h) to stay bit-identical.
void block_mlp_backward_dw(const MoeBlock& b, MoeBlockState& st, Arena& scratch, int chunk) {
    experts_backward_wgrad(b.params.experts, b.cfg.gradient_accumulation_fusion,
                           chunk_of(b, st, chunk).experts, scratch);
}

void block_dispatch_backward(const MoeBlock& b, const DispatchComms& comms, MoeBlockState& st,
                             int chunk) {
    b.dispatcher.token_dispatch_backward(comms, *chunk_of(b, st, chunk).dispatch);
}

// dx = unpermute + the router's term + the shared expert's, summed in f32 in that order (the
// reference layer's order). The first two are one pass over the tokens; the shared expert's
// dgrad is a product that accumulates into the whole of dx after it. With chunks, a token's row
// gradients come from its chunk's dispatcher state (the same sum, the same order).
void block_pre_dispatch_backward(const MoeBlock& b, float loss_grad_scale, MoeBlockState& st,
                                 const Tensor& dx, Arena& arena, Arena& scratch) {
    const std::int64_t T = dx.dim(0), H = b.cfg.hidden_size, C = num_chunks(b);
    check_tensor(dx, {T, H}, DType::kF32, "MoE block dx");
    Tensor dweight = scratch.alloc({T, b.cfg.topk}, DType::kF32);
    for (int c = 0; c < C; ++c) {
        const TokenRows r = token_chunk_rows(T, C, c);
        b.dispatcher.gather_dweight(*chunk_of(b, st, c).dispatch,
                                    C > 1 ? dweight.rows(r.begin, r.end) : dweight);
    }
    router_backward_dlogits(b.cfg, b.params.router, dweight, loss_grad_scale, st.router, arena);
    float* out = dx.data<float>();
    for (int c = 0; c < C; ++c) {
        const TokenRows r = token_chunk_rows(T, C, c);
        const DispatchState& d = *chunk_of(b, st, c).dispatch;
        for (std::int64_t t = r.begin; t < r.end; ++t) {
            b.dispatcher.token_row_sum(d, t - r.begin, out + t * H);
            router_dx_add_row(b.cfg, b.params.router, st.router, t, out + t * H);
        }
    }
    if (b.cfg.has_shared_experts()) {
        shared_expert_backward_dgrad(b.params.shared, st.dy, dx, st.shared, arena);
    }
}

void block_pre_dispatch_backward_dw(const MoeBlock& b, MoeBlockState& st, Arena& scratch) {
    router_backward_wgrad(b.cfg, b.params.router, st.router, scratch);
    if (b.cfg.has_shared_experts()) {
        shared_expert_backward_wgrad(b.params.shared, b.cfg.gradient_accumulation_fusion, st.shared,
                                     scratch);
    }
}

}  // namespace epo::moe
