#include "epo/moe/moe_block.h"

namespace epo::moe {

void block_pre_dispatch_forward(const MoeBlock& b, const Tensor& x, std::int64_t num_sequences,
                                MoeBlockState& st, Arena& arena) {
    const std::int64_t T = x.dim(0);
    if (b.cfg.has_shared_experts()) {
        st.shared_out = arena.alloc({T, b.cfg.hidden_size}, DType::kF32);
        shared_expert_forward(b.params.shared, x, st.shared_out, st.shared, arena);
    } else {
        st.shared_out = Tensor();
    }
    st.router = router_forward(b.cfg, b.params.router, x, num_sequences, arena);
    if (!st.dispatch) {
        st.dispatch = b.dispatcher.new_state();
    }
    b.dispatcher.dispatch_preprocess(st.router, x, *st.dispatch, arena);
}

void block_dispatch_forward(const MoeBlock& b, const DispatchComms& comms, MoeBlockState& st,
                            Arena& arena) {
    b.dispatcher.token_dispatch(comms, *st.dispatch, arena);
}

void block_mlp_forward(const MoeBlock& b, MoeBlockState& st, Arena& arena) {
    DispatchState& d = *st.dispatch;
    b.dispatcher.dispatch_postprocess(d);
    experts_forward(b.params.experts, d.expert_segments, d.expert_rows, d.expert_probs,
                    d.expert_out, st.experts, arena);
    b.dispatcher.combine_preprocess(d);
}

void block_combine_forward(const MoeBlock& b, const DispatchComms& comms, MoeBlockState& st,
                           const Tensor& y) {
    b.dispatcher.token_combine(comms, *st.dispatch);
    b.dispatcher.combine_postprocess(*st.dispatch, st.shared_out, y);
}

void block_combine_backward(const MoeBlock& b, const DispatchComms& comms, const Tensor& dy,
                            MoeBlockState& st, Arena& arena) {
    st.dy = dy;
    b.dispatcher.combine_postprocess_backward(dy, *st.dispatch, arena);
    b.dispatcher.token_combine_backward(comms, *st.dispatch);
}

void block_mlp_backward(const MoeBlock& b, MoeBlockState& st, Arena& arena) {
    DispatchState& d = *st.dispatch;
    b.dispatcher.combine_preprocess_backward(d);
    experts_backward_dgrad(b.params.experts, d.d_expert_out, d.d_expert_rows, d.d_expert_probs,
                           st.experts, arena);
    b.dispatcher.dispatch_postprocess_backward(d);
}

void block_mlp_backward_dw(const MoeBlock& b, MoeBlockState& st, Arena& scratch) {
    experts_backward_wgrad(b.params.experts, b.cfg.gradient_accumulation_fusion, st.experts,
                           scratch);
}

void block_dispatch_backward(const MoeBlock& b, const DispatchComms& comms, MoeBlockState& st) {
    b.dispatcher.token_dispatch_backward(comms, *st.dispatch);
}

// dx = unpermute + the router's term + the shared expert's, summed in f32 in that order (the
// reference layer's order). The first two are one pass over the tokens; the shared expert's
// dgrad is a product that accumulates into the whole of dx after it.
void block_pre_dispatch_backward(const MoeBlock& b, float loss_grad_scale, MoeBlockState& st,
                                 const Tensor& dx, Arena& arena, Arena& scratch) {
    const std::int64_t T = dx.dim(0), H = b.cfg.hidden_size;
    check_tensor(dx, {T, H}, DType::kF32, "MoE block dx");
    Tensor dweight = scratch.alloc({T, b.cfg.topk}, DType::kF32);
    b.dispatcher.gather_dweight(*st.dispatch, dweight);
    router_backward_dlogits(b.cfg, b.params.router, dweight, loss_grad_scale, st.router, arena);
    float* out = dx.data<float>();
    for (std::int64_t t = 0; t < T; ++t) {
        b.dispatcher.token_row_sum(*st.dispatch, t, out + t * H);
        router_dx_add_row(b.cfg, b.params.router, st.router, t, out + t * H);
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
