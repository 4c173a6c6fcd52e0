#include "epo/model/transformer_layer.h"

#include "epo/kernels/rows.h"
#include "epo/model/rmsnorm.h"
#include "epo/model/tensor_parallel.h"

namespace epo::model {
namespace {

// dst (T, H) f32 = a + b, both (T, H) f32.
void add_into(const Tensor& a, const Tensor& b, const Tensor& dst) {
    const int64_t n = a.numel();
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    float* pd = dst.data<float>();
    for (int64_t i = 0; i < n; ++i)
        pd[i] = pa[i] + pb[i];
}

// dst (T, H) compute dtype = round(src (T, H) f32).
void to_compute(const Tensor& src, const Tensor& dst) {
    kernels::store_row(src.data<float>(), dst.raw(), dst.dtype(), src.numel());
}

void rename(Param& p, const std::string& name) {
    p.name = name;
}

// The layer's MoE block. Its forward nodes only read the weights (the const_cast lets one
// MoeBlock serve the forward and the weight-gradient nodes).
moe::MoeBlock block_of(const LayerShape& s, const LayerParams& p, const NodeArgs& a) {
    EPO_CHECK(a.dispatcher != nullptr, "an MoE layer's node without a token dispatcher");
    return moe::MoeBlock{s.moe, const_cast<moe::MoeLayerParams&>(p.moe), *a.dispatcher};
}

// The chunk a MoE layer's dispatch/mlp/combine node runs on: its NodeCall's, or 0 (the whole
// micro-batch) when the block is not chunked.
int chunk_of(const LayerShape& s, const NodeArgs& a) {
    const bool chunked = s.moe.num_chunks > 1;
    EPO_CHECK(chunked == (a.moe_chunk >= 0),
              "a MoE layer's node with chunk {} in a block of {} chunk(s) "
              "(moe_ep_overlap_num_chunks and the schedule's num_moe_chunks disagree)",
              a.moe_chunk, s.moe.num_chunks);
    return chunked ? a.moe_chunk : 0;
}

// The running stream's TP communicator, for a layer with tp_size > 1.
comm::Communicator& layer_tp(const LayerShape& s, const NodeArgs& a) {
    EPO_CHECK(a.comms != nullptr && a.comms->tp != nullptr && a.comms->tp->size() == s.tp_size,
              "a layer of tensor-parallel size {} without a tp communicator of that size",
              s.tp_size);
    EPO_CHECK(!s.multi_latent_attention && !s.recompute.layernorm,
              "a tensor-parallel layer with MLA or the layernorm recompute");
    return *a.comms->tp;
}

// The layer's self-attention, multi-latent or grouped-query: the one place that chooses.
// forward: h (T, H) f32 += attention(n1). With TP: n1 gathered, attention on the rank's heads
// into a partial sum over all tp_tokens(), reduced (SP: scattered) into h.
void self_attention_forward(const LayerShape& s, const LayerParams& p, const RopeTable& rope,
                            LayerState& st, const NodeArgs& a) {
    Arena& scratch = *a.scratch;
    if (s.tp_size > 1) {
        comm::Communicator& tp = layer_tp(s, a);
        const int64_t Tf = s.tp_tokens(), H = s.hidden;
        st.n1_full = st.arena.alloc({Tf, H}, s.compute_dtype);
        tp_gather(tp, s.sequence_parallel, st.n1, st.n1_full);
        Tensor partial = scratch.alloc_zeros({Tf, H}, DType::kF32);
        attention_forward(s.attn, p.attn, rope, st.n1_full, partial, st.attn, st.arena, scratch);
        Tensor y = scratch.alloc({s.tokens, H}, DType::kF32);
        tp_reduce(tp, s.sequence_parallel, partial, y);
        add_into(st.x, y, st.h);
        return;
    }
    if (s.multi_latent_attention)
        mla_forward(s.mla, p.mla, rope, st.n1, st.h, st.mla, st.arena, scratch);
    else
        attention_forward(s.attn, p.attn, rope, st.n1, st.h, st.attn, st.arena, scratch);
}

// dn1 (T, H) f32 = the input gradient for dh (T, H) f32 (TP: dh gathered, the partial input
// gradient reduced back to the rank's rows).
void self_attention_dgrad(const LayerShape& s, LayerParams& p, const RopeTable& rope,
                          LayerState& st, const Tensor& dh, const Tensor& dn1, const NodeArgs& a) {
    Arena& scratch = *a.scratch;
    if (s.tp_size > 1) {
        comm::Communicator& tp = layer_tp(s, a);
        const int64_t Tf = s.tp_tokens(), H = s.hidden;
        Tensor dh_full = scratch.alloc({Tf, H}, DType::kF32);
        tp_gather(tp, s.sequence_parallel, dh, dh_full);
        Tensor partial = scratch.alloc({Tf, H}, DType::kF32);
        attention_backward_dgrad(s.attn, p.attn, rope, dh_full, partial, st.attn, st.arena,
                                 scratch);
        tp_reduce(tp, s.sequence_parallel, partial, dn1);
        return;
    }
    if (s.multi_latent_attention)
        mla_backward_dgrad(s.mla, p.mla, rope, dh, dn1, st.mla, st.arena, scratch);
    else
        attention_backward_dgrad(s.attn, p.attn, rope, dh, dn1, st.attn, st.arena, scratch);
}

void self_attention_wgrad(const LayerShape& s, LayerParams& p, LayerState& st, Arena& scratch) {
    if (s.multi_latent_attention)
        mla_backward_wgrad(s.mla, p.mla, s.gradient_accumulation_fusion, st.mla, scratch);
    else
        attention_backward_wgrad(p.attn, s.gradient_accumulation_fusion, st.attn, scratch);
}

// ---- Selective recompute of the norms (layernorm) and the dense MLP (mlp): see the header.

// n1 / n2 in the compute dtype: the kept one, or recomputed from the layer input / the residual
// and the kept rstd into `scratch`, pointed at by every context that reads it.
Tensor normed1(const LayerShape& s, const LayerParams& p, LayerState& st, Arena& scratch) {
    if (!st.n1.defined()) {
        st.n1 = scratch.alloc({s.tokens, s.hidden}, s.compute_dtype);
        rmsnorm_recompute(st.x, p.input_norm, st.rstd1, st.n1);
        st.attn.x = st.n1;
    }
    return st.n1;
}

Tensor normed2(const LayerShape& s, const LayerParams& p, LayerState& st, Arena& scratch) {
    if (!st.n2.defined()) {
        st.n2 = scratch.alloc({s.tokens, s.hidden}, s.compute_dtype);
        rmsnorm_recompute(st.h, p.pre_mlp_norm, st.rstd2, st.n2);
        if (!s.is_moe) {
            st.mlp.x = st.n2;
            return st.n2;
        }
        if (st.router_reads_n2)
            st.moe.router.x = st.n2;
        if (s.moe.has_shared_experts())
            st.moe.shared.x = st.n2;
    }
    return st.n2;
}

// At the end of a compute node: forgets the views of the node's scratch (recomputed norms, the
// dense MLP's and shared expert's recomputed tensors), so that a later node recomputes them
// instead of reading reset memory.
void forget_recomputed(const LayerShape& s, LayerState& st) {
    if (s.recompute.layernorm) {
        st.n1 = st.n2 = st.attn.x = Tensor();
        if (!s.is_moe) {
            st.mlp.x = Tensor();
        } else {
            if (st.router_reads_n2)
                st.moe.router.x = Tensor();
            if (s.moe.has_shared_experts())
                st.moe.shared.x = Tensor();
        }
    }
    moe::drop_recomputed(s.is_moe ? st.moe.shared : st.mlp);
}

// Where a tensor the layer does not keep is allocated in the forward: the node's scratch.
Arena& home(bool recomputed, LayerState& st, const NodeArgs& a) {
    return recomputed ? *a.scratch : st.arena;
}

}  // namespace

LayerParams make_layer_params(const LayerShape& s, const std::string& prefix) {
    const DType cd = s.compute_dtype;
    LayerParams p;
    p.input_norm = make_param(prefix + "input_layernorm.weight", {s.hidden}, DType::kF32);
    if (s.multi_latent_attention)
        p.mla = make_mla_params(s.mla, cd, prefix);
    else
        p.attn = make_attention_params(s.attn, cd, prefix);
    p.pre_mlp_norm = make_param(prefix + "pre_mlp_layernorm.weight", {s.hidden}, DType::kF32);
    if (!s.is_moe) {
        p.dense = moe::make_shared_expert_weights(s.hidden, s.ffn_hidden, cd);
        rename(p.dense.fc1, prefix + "mlp.linear_fc1.weight");
        rename(p.dense.fc2, prefix + "mlp.linear_fc2.weight");
        return p;
    }
    p.moe.router = moe::make_router_params(s.moe);
    rename(p.moe.router.weight, prefix + "mlp.router.weight");
    p.moe.experts = moe::make_expert_weights(s.num_local_experts, s.hidden,
                                             s.moe.ffn_hidden_size / s.etp_size, cd);
    rename(p.moe.experts.fc1, prefix + "mlp.experts.linear_fc1.weight");
    rename(p.moe.experts.fc2, prefix + "mlp.experts.linear_fc2.weight");
    if (s.moe.shared_expert_size > 0) {
        p.moe.shared = moe::make_shared_expert_weights(s.hidden, s.moe.shared_expert_size, cd);
        rename(p.moe.shared.fc1, prefix + "mlp.shared_experts.linear_fc1.weight");
        rename(p.moe.shared.fc2, prefix + "mlp.shared_experts.linear_fc2.weight");
    }
    return p;
}

void collect_layer_params(const LayerShape& s, LayerParams& p, std::vector<Param*>& dense,
                          std::vector<Param*>& expert) {
    dense.push_back(&p.input_norm);
    if (s.multi_latent_attention) {
        collect_mla_params(s.mla, p.mla, dense);
    } else {
        dense.push_back(&p.attn.qkv);
        dense.push_back(&p.attn.proj);
        if (s.attn.qk_layernorm) {
            dense.push_back(&p.attn.q_norm);
            dense.push_back(&p.attn.k_norm);
        }
    }
    dense.push_back(&p.pre_mlp_norm);
    if (!s.is_moe) {
        dense.push_back(&p.dense.fc1);
        dense.push_back(&p.dense.fc2);
        return;
    }
    dense.push_back(&p.moe.router.weight);
    if (s.moe.shared_expert_size > 0) {
        dense.push_back(&p.moe.shared.fc1);
        dense.push_back(&p.moe.shared.fc2);
    }
    expert.push_back(&p.moe.experts.fc1);
    expert.push_back(&p.moe.experts.fc2);
}

void pre_dispatch_forward(const LayerShape& s, const LayerParams& p, const RopeTable& rope,
                          LayerState& st, LayerStepStats& stats, const NodeArgs& a) {
    const int64_t T = s.tokens, H = s.hidden;
    const DType cd = s.compute_dtype;
    Arena& ar = st.arena;
    const bool ln = s.recompute.layernorm;
    st.n1 = home(ln, st, a).alloc({T, H}, cd);
    st.rstd1 = ar.alloc({T}, DType::kF32);
    rmsnorm_forward(st.x, p.input_norm, s.norm_eps, st.n1, st.rstd1);
    st.h = ar.alloc({T, H}, DType::kF32);
    if (s.tp_size == 1)
        st.h.copy_from(st.x);  // residual: attention accumulates into it
    self_attention_forward(s, p, rope, st, a);
    // A dense layer's n2 feeds the mlp node: recomputed, it is computed again there.
    st.n2 = home(ln, st, a).alloc({T, H}, cd);
    st.rstd2 = ar.alloc({T}, DType::kF32);
    rmsnorm_forward(st.h, p.pre_mlp_norm, s.norm_eps, st.n2, st.rstd2);
    if (!s.is_moe) {
        forget_recomputed(s, st);
        return;
    }

    // Under sequence parallelism the rank routes its rows of the micro-batch: the router takes
    // its losses' token counts over the TP group, as Megatron-Core's over tp_cp.
    comm::Communicator* sequence_group =
        s.tp_size > 1 && s.sequence_parallel ? &layer_tp(s, a) : nullptr;
    moe::block_pre_dispatch_forward(block_of(s, p, a), st.n2, s.num_sequences, st.moe, ar,
                                    a.scratch, sequence_group);
    st.router_reads_n2 = st.moe.router.x.raw() == st.n2.raw();
    forget_recomputed(s, st);
    const moe::RouterOutput& router = st.moe.router;
    stats.aux_loss += router.aux_loss;
    stats.z_loss += router.z_loss;
    for (size_t e = 0; e < stats.routed_counts.size(); ++e) {
        stats.routed_counts[e] += router.routed_counts[e];
    }
}

void dispatch_forward(const LayerShape& s, const LayerParams& p, LayerState& st,
                      const NodeArgs& a) {
    moe::block_dispatch_forward(block_of(s, p, a), *a.comms, st.moe, st.arena, chunk_of(s, a));
}

void mlp_forward(const LayerShape& s, const LayerParams& p, LayerState& st, const Tensor& out,
                 const NodeArgs& a) {
    if (!s.is_moe) {
        Tensor n2 = normed2(s, p, st, *a.scratch);
        Tensor y = a.scratch->alloc({s.tokens, s.hidden}, DType::kF32);
        // TP: the MLP on all tp_tokens() (n2 gathered) into a partial sum, reduced into y.
        const bool tp = s.tp_size > 1;
        Tensor y_mlp = y;
        if (tp) {
            st.n2_full = st.arena.alloc({s.tp_tokens(), s.hidden}, s.compute_dtype);
            tp_gather(layer_tp(s, a), s.sequence_parallel, n2, st.n2_full);
            n2 = st.n2_full;
            y_mlp = a.scratch->alloc({s.tp_tokens(), s.hidden}, DType::kF32);
        }
        moe::shared_expert_forward(
            p.dense, n2, y_mlp, st.mlp, st.arena,
            s.recompute.mlp ? moe::FfnRecompute::kAll : moe::FfnRecompute::kNone, a.scratch);
        if (tp)
            tp_reduce(layer_tp(s, a), s.sequence_parallel, y_mlp, y);
        if (out.defined())
            add_into(st.h, y, out);
        forget_recomputed(s, st);
        return;
    }
    moe::block_mlp_forward(block_of(s, p, a), st.moe, st.arena, chunk_of(s, a), a.scratch);
}

void combine_forward(const LayerShape& s, const LayerParams& p, LayerState& st, const Tensor& out,
                     const NodeArgs& a) {
    // The rows this chunk's combine writes (by experts, the last chunk writes them all).
    const moe::TokenRows r = moe::combine_output_rows(s.moe, s.tokens, chunk_of(s, a));
    if (r.begin == r.end) {
        moe::block_combine_forward(block_of(s, p, a), *a.comms, st.moe, Tensor(), chunk_of(s, a));
        return;
    }
    Tensor y = a.scratch->alloc({r.end - r.begin, s.hidden}, DType::kF32);
    moe::block_combine_forward(block_of(s, p, a), *a.comms, st.moe, y, chunk_of(s, a));
    if (out.defined())
        add_into(st.h.rows(r.begin, r.end), y, out.rows(r.begin, r.end));
}

// n2 for the shared expert's node: the kept one, or recomputed (layernorm) into the node's
// scratch without touching the state's other views (a comm node of this micro-batch runs
// meanwhile).
namespace {
Tensor shared_expert_input(const LayerShape& s, const LayerParams& p, const LayerState& st,
                           Arena& scratch) {
    if (st.n2.defined())
        return st.n2;
    Tensor n2 = scratch.alloc({s.tokens, s.hidden}, s.compute_dtype);
    rmsnorm_recompute(st.h, p.pre_mlp_norm, st.rstd2, n2);
    return n2;
}
}  // namespace

void shared_expert_forward(const LayerShape& s, const LayerParams& p, LayerState& st,
                           const NodeArgs& a) {
    EPO_CHECK(s.is_moe, "a shared-expert node in a dense layer");
    moe::block_shared_expert_forward(block_of(s, p, a), shared_expert_input(s, p, st, *a.scratch),
                                     st.moe, st.arena);
    if (s.recompute.layernorm)
        st.moe.shared.x = Tensor();  // a view of the node's scratch
}

void shared_expert_backward(const LayerShape& s, LayerParams& p, LayerState& st,
                            const Tensor& d_out, const NodeArgs& a) {
    EPO_CHECK(s.is_moe, "a shared-expert node in a dense layer");
    Arena& scratch = *a.scratch;
    st.moe.shared.x = shared_expert_input(s, p, st, scratch);
    // The output gradient in the compute dtype, as the combine backward converts it for itself
    // (the same rounding): that node runs meanwhile and owns d_out_c.
    Tensor dy = scratch.alloc(d_out.shape(), s.compute_dtype);
    to_compute(d_out, dy);
    st.dn2 = st.arena.alloc({s.tokens, s.hidden}, DType::kF32);
    moe::block_shared_expert_backward(block_of(s, p, a), dy, st.dn2, st.moe, st.arena, scratch);
    if (s.recompute.layernorm)
        st.moe.shared.x = Tensor();
}

void combine_backward(const LayerShape& s, const LayerParams& p, LayerState& st,
                      const Tensor& d_out, const NodeArgs& a) {
    // Each chunk converts the rows it reads (by experts the first chunk reads them all); the
    // first chunk's backward (the comm stream runs them in order) allocates the whole of
    // d_out_c, which the pre_dispatch backward reads.
    const moe::TokenRows r = moe::combine_grad_rows(s.moe, s.tokens, chunk_of(s, a));
    if (!st.d_out_c.defined())
        st.d_out_c = st.arena.alloc(d_out.shape(), s.compute_dtype);
    if (r.begin < r.end)
        to_compute(d_out.rows(r.begin, r.end), st.d_out_c.rows(r.begin, r.end));
    moe::block_combine_backward(block_of(s, p, a), *a.comms, st.d_out_c, st.moe, st.arena,
                                chunk_of(s, a));
}

void mlp_backward(const LayerShape& s, LayerParams& p, LayerState& st, const Tensor& d_out,
                  bool with_wgrad, const NodeArgs& a) {
    if (!s.is_moe && s.tp_size > 1) {
        // TP: the output gradient gathered, the partial input gradient reduced to the rank's rows.
        comm::Communicator& tp = layer_tp(s, a);
        const int64_t Tf = s.tp_tokens(), H = s.hidden;
        Tensor d_full = a.scratch->alloc({Tf, H}, DType::kF32);
        tp_gather(tp, s.sequence_parallel, d_out, d_full);
        st.d_out_c = st.arena.alloc({Tf, H}, s.compute_dtype);
        to_compute(d_full, st.d_out_c);
        Tensor partial = a.scratch->alloc_zeros({Tf, H}, DType::kF32);
        moe::shared_expert_backward_dgrad(p.dense, st.d_out_c, partial, st.mlp, st.arena,
                                          a.scratch);
        st.dn2 = st.arena.alloc({s.tokens, H}, DType::kF32);
        tp_reduce(tp, s.sequence_parallel, partial, st.dn2);
    } else if (!s.is_moe) {
        st.d_out_c = st.arena.alloc(d_out.shape(), s.compute_dtype);
        to_compute(d_out, st.d_out_c);
        st.dn2 = st.arena.alloc_zeros({s.tokens, s.hidden}, DType::kF32);
        normed2(s, p, st, *a.scratch);  // the MLP's input (its recompute reads it)
        moe::shared_expert_backward_dgrad(p.dense, st.d_out_c, st.dn2, st.mlp, st.arena, a.scratch);
    } else {
        moe::block_mlp_backward(block_of(s, p, a), st.moe, st.arena, chunk_of(s, a));
    }
    if (with_wgrad)
        mlp_backward_dw(s, p, st, a);
    if (!s.is_moe)
        forget_recomputed(s, st);
}

void mlp_backward_dw(const LayerShape& s, LayerParams& p, LayerState& st, const NodeArgs& a) {
    const bool fusion = s.gradient_accumulation_fusion;
    if (!s.is_moe) {
        normed2(s, p, st, *a.scratch);  // fc1's wgrad input
        moe::shared_expert_backward_wgrad(p.dense, fusion, st.mlp, *a.scratch);
        forget_recomputed(s, st);
    } else {
        moe::block_mlp_backward_dw(block_of(s, p, a), st.moe, *a.scratch, chunk_of(s, a));
    }
}

void dispatch_backward(const LayerShape& s, const LayerParams& p, LayerState& st,
                       const NodeArgs& a) {
    moe::block_dispatch_backward(block_of(s, p, a), *a.comms, st.moe, chunk_of(s, a));
}

void pre_dispatch_backward(const LayerShape& s, LayerParams& p, const RopeTable& rope,
                           LayerState& st, const Tensor& d_out, const Tensor& d_x, bool with_wgrad,
                           const NodeArgs& a) {
    const int64_t T = s.tokens, H = s.hidden;
    Arena& scratch = *a.scratch;
    if (s.is_moe) {
        // The shared expert's recompute reads n2, and so does a router / shared-expert wgrad
        // in this node.
        normed2(s, p, st, scratch);
        // With shared-expert overlap the shared expert's node allocated dn2 and wrote its term.
        if (!s.moe.shared_expert_overlap)
            st.dn2 = st.arena.alloc({T, H}, DType::kF32);
        moe::block_pre_dispatch_backward(block_of(s, p, a), a.loss_grad_scale, st.moe, st.dn2,
                                         st.arena, scratch);
    }
    Tensor ws = scratch.alloc({H}, DType::kF32);
    Tensor dh = scratch.alloc({T, H}, DType::kF32);
    dh.copy_from(d_out);  // residual
    rmsnorm_backward(st.h, p.pre_mlp_norm, st.rstd2, st.dn2, dh, ws);
    Tensor dn1 = scratch.alloc({T, H}, DType::kF32);
    self_attention_dgrad(s, p, rope, st, dh, dn1, a);
    d_x.copy_from(dh);  // residual
    rmsnorm_backward(st.x, p.input_norm, st.rstd1, dn1, d_x, ws);
    if (with_wgrad)
        pre_dispatch_backward_dw(s, p, st, a);
    forget_recomputed(s, st);
}

void pre_dispatch_backward_dw(const LayerShape& s, LayerParams& p, LayerState& st,
                              const NodeArgs& a) {
    normed1(s, p, st, *a.scratch);  // the qkv wgrad's input
    self_attention_wgrad(s, p, st, *a.scratch);
    if (s.is_moe) {
        normed2(s, p, st, *a.scratch);  // the router's and shared expert's wgrad input
        moe::block_pre_dispatch_backward_dw(block_of(s, p, a), st.moe, *a.scratch);
    }
    forget_recomputed(s, st);
}

}  // namespace epo::model
