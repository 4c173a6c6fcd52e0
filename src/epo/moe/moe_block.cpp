#include "epo/moe/moe_block.h"

#include "epo/core/error.h"

namespace epo::moe {
namespace {

std::int64_t num_chunks(const MoeBlock& b) {
    return b.cfg.num_chunks;
}

// The expert group chunk `chunk` dispatches ({0, 1}, every local expert, with one chunk).
ExpertGroup group_of(const MoeBlock& b, int chunk) {
    EPO_CHECK(chunk >= 0 && chunk < num_chunks(b),
              "expert chunk {} of a block with {} chunk(s) (moe_ep_overlap_num_chunks)", chunk,
              num_chunks(b));
    return ExpertGroup{chunk, static_cast<int>(num_chunks(b))};
}

ExpertsContext& experts_of(const MoeBlock& b, MoeBlockState& st, int chunk) {
    group_of(b, chunk);  // checks the chunk
    EPO_CHECK(static_cast<std::int64_t>(st.experts.size()) == num_chunks(b),
              "a block state with {} expert context(s) for {} chunk(s): its forward has not run",
              st.experts.size(), num_chunks(b));
    return st.experts[static_cast<size_t>(chunk)];
}

DispatchState& dispatch_of(MoeBlockState& st) {
    EPO_CHECK(st.dispatch != nullptr, "a MoE block state whose pre_dispatch forward has not run");
    return *st.dispatch;
}

// Chunk `chunk`'s view of the expert-facing buffers: its group's segments and rows (all of them
// with one chunk).
struct GroupRows {
    ExpertSegments segments;
    std::int64_t first_expert = 0, begin = 0, end = 0;  // rows [begin, end) of the buffers
    Tensor of(const Tensor& t) const { return t.rows(begin, end); }
};
GroupRows group_rows(const MoeBlock& b, const DispatchState& d, int chunk) {
    const ExpertSegments& seg = d.expert_segments;
    const ExpertRange r = expert_group_range(seg.num_experts(), group_of(b, chunk));
    return GroupRows{segment_range(seg, r.begin, r.end), r.begin,
                     seg.offsets[static_cast<size_t>(r.begin)],
                     seg.offsets[static_cast<size_t>(r.end)]};
}

}  // namespace

TokenRows combine_output_rows(const MoeConfig& cfg, std::int64_t num_tokens, int chunk) {
    return chunk == cfg.num_chunks - 1 ? TokenRows{0, num_tokens} : TokenRows{};
}

TokenRows combine_grad_rows(const MoeConfig& /*cfg*/, std::int64_t num_tokens, int chunk) {
    return chunk == 0 ? TokenRows{0, num_tokens} : TokenRows{};
}

void block_pre_dispatch_forward(const MoeBlock& b, const Tensor& x, std::int64_t num_sequences,
                                MoeBlockState& st, Arena& arena, Arena* scratch,
                                comm::Communicator* sequence_group) {
    const std::int64_t T = x.dim(0);
    st.shared_out = Tensor();
    if (b.cfg.has_shared_experts() && !b.cfg.shared_expert_overlap) {
        st.shared_out = arena.alloc({T, b.cfg.hidden_size}, DType::kF32);
        shared_expert_forward(
            b.params.shared, x, st.shared_out, st.shared, arena,
            b.cfg.recompute_shared_experts ? FfnRecompute::kAll : FfnRecompute::kNone, scratch);
    }
    st.router = router_forward(b.cfg, b.params.router, x, num_sequences, arena, sequence_group);
    st.experts.resize(static_cast<size_t>(num_chunks(b)));
    if (!st.dispatch)
        st.dispatch = b.dispatcher.new_state();
    st.combines_done = st.combine_backwards_done = 0;
    // Every chunk's send side is planned here, on the compute stream, before any chunk's
    // dispatch runs: the comm stream then only moves bytes.
    b.dispatcher.dispatch_preprocess(st.router, x, *st.dispatch, arena);
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
    b.dispatcher.token_dispatch(comms, dispatch_of(st), arena, group_of(b, chunk));
}

void block_mlp_forward(const MoeBlock& b, MoeBlockState& st, Arena& arena, int chunk,
                       Arena* scratch) {
    DispatchState& d = dispatch_of(st);
    const ExpertGroup g = group_of(b, chunk);
    b.dispatcher.dispatch_postprocess(d, g);
    const GroupRows gr = group_rows(b, d, chunk);
    experts_forward(b.params.experts, gr.segments, gr.of(d.expert_rows), gr.of(d.expert_probs),
                    gr.of(d.expert_out), experts_of(b, st, chunk), arena, gr.first_expert,
                    b.cfg.recompute_moe_act ? FfnRecompute::kActivation : FfnRecompute::kNone,
                    scratch);
    b.dispatcher.combine_preprocess(d, g);
}

void block_combine_forward(const MoeBlock& b, const DispatchComms& comms, MoeBlockState& st,
                           const Tensor& y, int chunk) {
    DispatchState& d = dispatch_of(st);
    b.dispatcher.token_combine(comms, d, group_of(b, chunk));
    // The sum reads every group's rows: it runs once they have all come back.
    EPO_CHECK(st.combines_done == chunk, "the combine of expert chunk {} after {} of them", chunk,
              st.combines_done);
    ++st.combines_done;
    if (chunk + 1 < num_chunks(b)) {
        EPO_CHECK(!y.defined(), "expert chunk {} of {} writes no output rows", chunk,
                  num_chunks(b));
        return;
    }
    const std::int64_t T = st.router.topk_index.dim(0);
    check_tensor(y, {T, b.cfg.hidden_size}, DType::kF32, "MoE block output");
    EPO_CHECK(!b.cfg.has_shared_experts() || st.shared_out.defined(),
              "the combine of a block whose shared expert has not run (with "
              "moe_shared_expert_overlap its node must come before the combine)");
    b.dispatcher.combine_postprocess(d, st.shared_out, y);
}

void block_combine_backward(const MoeBlock& b, const DispatchComms& comms, const Tensor& dy,
                            MoeBlockState& st, Arena& arena, int chunk) {
    DispatchState& d = dispatch_of(st);
    // The first chunk spreads all of dy to the rows (every group's); each chunk then sends its
    // group's rows back.
    const bool first = st.combine_backwards_done++ == 0;
    EPO_CHECK(st.combine_backwards_done == chunk + 1,
              "the combine backward of expert chunk {} out of order", chunk);
    if (first) {
        st.dy = dy;
        b.dispatcher.combine_postprocess_backward(dy, d, arena);
    }
    b.dispatcher.token_combine_backward(comms, d, group_of(b, chunk));
}

void block_mlp_backward(const MoeBlock& b, MoeBlockState& st, Arena& arena, int chunk) {
    DispatchState& d = dispatch_of(st);
    const ExpertGroup g = group_of(b, chunk);
    b.dispatcher.combine_preprocess_backward(d, g);
    const GroupRows gr = group_rows(b, d, chunk);
    experts_backward_dgrad(b.params.experts, gr.of(d.d_expert_out), gr.of(d.d_expert_rows),
                           gr.of(d.d_expert_probs), experts_of(b, st, chunk), arena);
    b.dispatcher.dispatch_postprocess_backward(d, g);
}

// Why the order matters: each chunk's weight gradient is added to the expert gradients as it
// comes, so both schedules run the chunks in ascending order (schedule.h) to stay bit-identical.
void block_mlp_backward_dw(const MoeBlock& b, MoeBlockState& st, Arena& scratch, int chunk) {
    experts_backward_wgrad(b.params.experts, b.cfg.gradient_accumulation_fusion,
                           experts_of(b, st, chunk), scratch);
}

void block_dispatch_backward(const MoeBlock& b, const DispatchComms& comms, MoeBlockState& st,
                             int chunk) {
    b.dispatcher.token_dispatch_backward(comms, dispatch_of(st), group_of(b, chunk));
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
// it. With chunks the row gradients sit where unchunked they would (one dispatcher state), so
// the sums are the unchunked ones.
void block_pre_dispatch_backward(const MoeBlock& b, float loss_grad_scale, MoeBlockState& st,
                                 const Tensor& dx, Arena& arena, Arena& scratch) {
    const std::int64_t T = dx.dim(0), H = b.cfg.hidden_size;
    check_tensor(dx, {T, H}, DType::kF32, "MoE block dx");
    const bool shared = b.cfg.has_shared_experts();
    if (shared && !b.cfg.shared_expert_overlap)
        shared_expert_dgrad_into(b, st.dy, dx, st, arena, &scratch);
    EPO_CHECK(!shared || st.shared.dgrad_done,
              "the pre_dispatch backward of a block whose shared expert's backward has not run "
              "(with moe_shared_expert_overlap its node must come before)");
    const DispatchState& d = dispatch_of(st);
    Tensor dweight = scratch.alloc({T, b.cfg.topk}, DType::kF32);
    b.dispatcher.gather_dweight(d, dweight);
    router_backward_dlogits(b.cfg, b.params.router, dweight, loss_grad_scale, st.router, arena);
    float* out = dx.data<float>();
    // (H) f32: a token's unpermuted rows and router term, before the shared term is added.
    float* row = shared ? scratch.alloc({H}, DType::kF32).data<float>() : nullptr;
    for (std::int64_t t = 0; t < T; ++t) {
        float* acc = shared ? row : out + t * H;
        b.dispatcher.token_row_sum(d, t, acc);
        router_dx_add_row(b.cfg, b.params.router, st.router, t, acc);
        if (shared) {
            float* o = out + t * H;
            for (std::int64_t i = 0; i < H; ++i)
                o[i] = acc[i] + o[i];
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
