#include "epo/model/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "epo/model/rmsnorm.h"
#include "epo/model/tensor_parallel.h"

namespace epo::model {
namespace {

// A state back to empty, keeping its arena's mapped memory for the next user.
template <class State>
void reset_keeping_arena(State& s) {
    Arena arena = std::move(s.arena);
    s = State{};
    arena.reset();
    s.arena = std::move(arena);
}

}  // namespace

void ActivationMeter::add(int64_t delta) {
    const int64_t now = bytes.fetch_add(delta) + delta;
    int64_t prev = peak.load();
    while (now > prev && !peak.compare_exchange_weak(prev, now)) {
    }
}

template <class State>
State* StatePool<State>::acquire() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.empty()) {
        all_.push_back(std::make_unique<State>());
        return all_.back().get();
    }
    State* s = free_.back();
    free_.pop_back();
    return s;
}

template <class State>
void StatePool<State>::release(State* s) {
    // Under the lock: account() on the other stream may be reading this state's arena and
    // reported bytes (a delayed weight gradient releases its layer while the micro-batch's next
    // call runs, executor.h).
    std::lock_guard<std::mutex> lock(mutex_);
    meter_.add(-static_cast<int64_t>(s->reported_bytes));
    reset_keeping_arena(*s);
    free_.push_back(s);
}

template <class State>
void StatePool<State>::account(State* s) {
    // Why the lock: with MoE chunks two nodes of one micro-batch (one per stream) account its
    // states at once.
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = static_cast<int64_t>(s->arena.bytes_in_use());
    meter_.add(now - static_cast<int64_t>(s->reported_bytes));
    s->reported_bytes = static_cast<size_t>(now);
}

template class StatePool<LayerState>;
template class StatePool<OutputState>;
template class StatePool<HandoffState>;
template class StatePool<MtpState>;

void GptModel::begin_step(std::vector<std::vector<int32_t>> tokens,
                          std::vector<std::vector<int32_t>> labels, float loss_grad_scale) {
    EPO_CHECK_EQ(tokens.size(), labels.size());
    EPO_CHECK(num_in_flight() == 0,
              "a step begins while {} micro-batch(es) of the last one are "
              "in flight",
              num_in_flight());
    step_tokens_ = std::move(tokens);
    step_labels_ = std::move(labels);
    loss_grad_scale_ = loss_grad_scale;
    results_.assign(step_tokens_.size(), MicroBatchResult{});
    step_mtp_tokens_.clear();
    step_mtp_labels_.clear();
    if (shape_.mtp_num_layers > 0) {
        // The rolled-in token of a sequence's last position is 0 (its label is masked).
        for (size_t mb = 0; mb < step_tokens_.size(); ++mb) {
            step_mtp_tokens_.push_back(mtp_shift(step_tokens_[mb], shape_.seq_length, 0));
            step_mtp_labels_.push_back(mtp_shift(step_labels_[mb], shape_.seq_length, 0));
        }
        mtp_mask_ = mtp_loss_mask(shape_.tokens(), shape_.seq_length);
    }
    for (LayerStepStats& s : layer_stats_) {
        s = LayerStepStats{};
        s.routed_counts.assign(static_cast<size_t>(shape_.moe.num_experts), 0);
    }
    const auto positions = static_cast<size_t>(shape_.num_layers + 1);
    while (micro_batches_.size() < step_tokens_.size()) {
        MicroBatch m;
        m.layers.assign(static_cast<size_t>(shape_.num_layers), nullptr);
        m.x.assign(positions, nullptr);
        m.dx.assign(positions, nullptr);
        m.index = static_cast<int>(micro_batches_.size());
        micro_batches_.push_back(std::move(m));
    }
}

int GptModel::num_in_flight() const {
    int n = 0;
    for (const MicroBatch& m : micro_batches_) {
        const auto used = [](const auto& v) {
            return std::any_of(v.begin(), v.end(), [](const auto* s) { return s != nullptr; });
        };
        n += used(m.layers) || used(m.x) || used(m.dx) || m.output != nullptr || m.mtp != nullptr ||
             m.mtp_embed != nullptr || m.d_mtp_embed != nullptr;
    }
    return n;
}

GptModel::MicroBatch& GptModel::micro_batch(int mb) {
    EPO_CHECK(mb >= 0 && static_cast<size_t>(mb) < step_tokens_.size(),
              "micro-batch {} of a step with {}", mb, step_tokens_.size());
    return micro_batches_[static_cast<size_t>(mb)];
}

LayerState& GptModel::layer_state(MicroBatch& m, int l) {
    const std::lock_guard<std::mutex> lock(slots_mutex_);
    LayerState*& s = m.layers[static_cast<size_t>(l)];
    if (s == nullptr)
        s = layer_pool_.acquire();
    return *s;
}

void GptModel::release_layer(MicroBatch& m, int l) {
    const std::lock_guard<std::mutex> lock(slots_mutex_);
    LayerState*& s = m.layers[static_cast<size_t>(l)];
    layer_pool_.release(s);
    s = nullptr;
    // The MTP layer's input u lives in the prologue's state (its wgrad may recompute from it).
    if (shape_.is_mtp_layer(l) && m.mtp != nullptr) {
        mtp_pool_.release(m.mtp);
        m.mtp = nullptr;
    }
    // Its input goes with it (the backward that needed it is done), and the gradient it
    // consumed: nothing below reads the gradient of position l + 1.
    release_slot_locked(m.x[static_cast<size_t>(l)]);
    release_slot_locked(m.dx[static_cast<size_t>(l) + 1]);
}

Tensor GptModel::handoff(std::vector<HandoffState*>& slots, int position) {
    return fill_slot(slots[static_cast<size_t>(position)], position);
}

void GptModel::release_handoff(std::vector<HandoffState*>& slots, int position) {
    release_slot(slots[static_cast<size_t>(position)]);
}

Tensor GptModel::fill_slot(HandoffState*& h, int position) {
    const std::lock_guard<std::mutex> lock(slots_mutex_);
    EPO_CHECK(h == nullptr, "hand-off tensor of position {} written twice", position);
    h = handoff_pool_.acquire();
    h->t = h->arena.alloc({shape_.local_tokens(), shape_.hidden}, DType::kF32);
    return h->t;
}

void GptModel::release_slot(HandoffState*& h) {
    const std::lock_guard<std::mutex> lock(slots_mutex_);
    release_slot_locked(h);
}

void GptModel::release_slot_locked(HandoffState*& h) {
    if (h != nullptr) {
        handoff_pool_.release(h);
        h = nullptr;
    }
}

void GptModel::account(MicroBatch& m) {
    // A node writes to its own states and to the hand-off tensors next to it; accounting every
    // live state of the micro-batch is a few atomic adds.
    const std::lock_guard<std::mutex> lock(slots_mutex_);
    for (LayerState* s : m.layers) {
        if (s != nullptr)
            layer_pool_.account(s);
    }
    for (auto* slots : {&m.x, &m.dx}) {
        for (HandoffState* h : *slots) {
            if (h != nullptr)
                handoff_pool_.account(h);
        }
    }
    for (HandoffState* h : {m.mtp_embed, m.d_mtp_embed}) {
        if (h != nullptr)
            handoff_pool_.account(h);
    }
    if (m.mtp != nullptr)
        mtp_pool_.account(m.mtp);
    if (m.output != nullptr)
        output_pool_.account(m.output);
}

comm::Communicator& GptModel::tp_comm(const NodeArgs& a) const {
    EPO_CHECK(a.comms != nullptr && a.comms->tp != nullptr && a.comms->tp->size() == shape_.tp_size,
              "a model of tensor-parallel size {} run without a tp communicator of that size",
              shape_.tp_size);
    return *a.comms->tp;
}

void GptModel::embedding_forward(int mb, MicroBatch& m, const NodeArgs& a) {
    EPO_CHECK(m.x[0] == nullptr, "micro-batch {} starts while its states are still in use", mb);
    if (shape_.tp_size > 1) {
        vocab_parallel_embedding_forward(tp_comm(a), shape_.sequence_parallel, embedding_,
                                         shape_.vocab, step_tokens_[static_cast<size_t>(mb)],
                                         handoff(m.x, 0), *a.scratch);
        return;
    }
    model::embedding_forward(embedding_, step_tokens_[static_cast<size_t>(mb)], handoff(m.x, 0));
    // The MTP's embedding of the shifted tokens: here, so that the table's gradient is added in
    // one place in one order (the embedding backward) whatever the schedule. With stages the
    // MTP layer's prologue looks them up in the last stage's copy (mtp_forward).
    if (mtp_lookup_at_embedding())
        model::embedding_forward(embedding_, step_mtp_tokens_[static_cast<size_t>(mb)],
                                 fill_slot(m.mtp_embed, -1));
}

void GptModel::embedding_backward(int mb, MicroBatch& m, const NodeArgs& a) {
    if (shape_.tp_size > 1) {
        vocab_parallel_embedding_backward(tp_comm(a), shape_.sequence_parallel, embedding_,
                                          step_tokens_[static_cast<size_t>(mb)], m.dx[0]->t,
                                          *a.scratch);
        release_handoff(m.dx, 0);
        return;
    }
    model::embedding_backward(embedding_, step_tokens_[static_cast<size_t>(mb)], m.dx[0]->t);
    release_handoff(m.dx, 0);
    if (mtp_lookup_at_embedding()) {
        model::embedding_backward(embedding_, step_mtp_tokens_[static_cast<size_t>(mb)],
                                  m.d_mtp_embed->t);
        release_slot(m.d_mtp_embed);
    }
}

// The MTP prologue (mtp.h) of the MTP layer's input: x[L-1] is the decoder's output.
Tensor GptModel::mtp_forward(MicroBatch& m, Arena& scratch) {
    const auto l = static_cast<size_t>(shape_.num_layers - 1);
    // With stages: e from the last stage's embedding copy, here (the MTP layer's own node), so
    // that the copy's gradient is added in one place in one order (mtp_backward).
    if (!mtp_lookup_at_embedding())
        model::embedding_forward(embedding_, step_mtp_tokens_[static_cast<size_t>(m.index)],
                                 fill_slot(m.mtp_embed, -1));
    EPO_CHECK(m.mtp == nullptr && m.mtp_embed != nullptr,
              "the MTP prologue runs with its state in use or without the embedding's e");
    m.mtp = mtp_pool_.acquire();
    mtp_prologue_forward(final_norm_, mtp_, shape_.norm_eps, m.x[l]->t, m.mtp_embed->t, *m.mtp,
                         scratch);
    return m.mtp->u;
}

void GptModel::mtp_backward(MicroBatch& m, Arena& scratch) {
    const auto l = static_cast<size_t>(shape_.num_layers - 1);
    MtpState& st = *m.mtp;
    EPO_CHECK(st.dh.defined(), "the MTP prologue's backward before the output position's");
    const Tensor de = fill_slot(m.d_mtp_embed, -1);
    mtp_prologue_backward(final_norm_, mtp_, shape_.gradient_accumulation_fusion, m.x[l]->t,
                          m.mtp_embed->t, st, de, handoff(m.dx, static_cast<int>(l)), scratch);
    release_slot(m.mtp_embed);
    if (!mtp_lookup_at_embedding()) {
        model::embedding_backward(embedding_, step_mtp_tokens_[static_cast<size_t>(m.index)], de);
        release_slot(m.d_mtp_embed);
    }
}

// The output position: final norm, output layer (the embedding when tied) and loss.
void GptModel::output_forward(int mb, MicroBatch& m, Arena& scratch, const NodeArgs& a) {
    EPO_CHECK(m.output == nullptr, "output state of micro-batch {} still in use", mb);
    if (shape_.mtp_num_layers > 0) {
        mtp_output_forward(mb, m, scratch);
        return;
    }
    m.output = output_pool_.acquire();
    OutputState& o = *m.output;
    const Tensor& x = m.x[static_cast<size_t>(shape_.num_layers)]->t;
    o.normed = o.arena.alloc({shape_.local_tokens(), shape_.hidden}, shape_.compute_dtype);
    o.rstd = o.arena.alloc({shape_.local_tokens()}, DType::kF32);
    rmsnorm_forward(x, final_norm_, shape_.norm_eps, o.normed, o.rstd);
    if (shape_.tp_size > 1) {
        // The output layer on all tokens (the normed rows gathered), over the rank's vocabulary.
        comm::Communicator& tp = tp_comm(a);
        Tensor full = o.arena.alloc({shape_.tokens(), shape_.hidden}, shape_.compute_dtype);
        tp_gather(tp, shape_.sequence_parallel, o.normed, full);
        results_[static_cast<size_t>(mb)].lm_loss =
            vocab_parallel_lm_head_forward(tp, output_, full, step_labels_[static_cast<size_t>(mb)],
                                           loss_grad_scale_, o.head, o.arena, *a.scratch);
        return;
    }
    const Param& w = shape_.tie_embeddings ? embedding_ : output_;
    results_[static_cast<size_t>(mb)].lm_loss =
        lm_head_forward(w, o.normed, step_labels_[static_cast<size_t>(mb)], loss_grad_scale_,
                        o.head, o.arena, scratch);
}

void GptModel::output_backward(MicroBatch& m, Arena& scratch, const NodeArgs& a) {
    if (shape_.mtp_num_layers > 0) {
        mtp_output_backward(m, scratch);
        return;
    }
    OutputState& o = *m.output;
    Param& w = shape_.tie_embeddings ? embedding_ : output_;
    o.d_normed = o.arena.alloc({shape_.local_tokens(), shape_.hidden}, DType::kF32);
    if (shape_.tp_size > 1) {
        // The partial input gradient over the rank's vocabulary, reduced to its rows.
        Tensor partial = scratch.alloc({shape_.tokens(), shape_.hidden}, DType::kF32);
        lm_head_backward_dgrad(w, o.head, partial);
        tp_reduce(tp_comm(a), shape_.sequence_parallel, partial, o.d_normed);
    } else {
        lm_head_backward_dgrad(w, o.head, o.d_normed);
    }
    lm_head_backward_wgrad(w, shape_.gradient_accumulation_fusion, o.head, scratch);
    const int last = static_cast<int>(shape_.num_layers);
    const Tensor d_last = handoff(m.dx, last);
    d_last.fill_zero();  // rmsnorm_backward accumulates
    Tensor ws = scratch.alloc({shape_.hidden}, DType::kF32);
    rmsnorm_backward(m.x[static_cast<size_t>(last)]->t, final_norm_, o.rstd, o.d_normed, d_last,
                     ws);
    output_pool_.release(m.output);
    m.output = nullptr;
    release_handoff(m.x, last);
}

// With MTP: the main head on the final norm's output h (the prologue's), the MTP head on the
// MTP's final norm of x[L] (the MTP layer's output).
void GptModel::mtp_output_forward(int mb, MicroBatch& m, Arena& scratch) {
    EPO_CHECK(m.mtp != nullptr, "the output position of micro-batch {} before its MTP layer", mb);
    m.output = output_pool_.acquire();
    OutputState& o = *m.output;
    const auto at = static_cast<size_t>(mb);
    const Param& w = shape_.tie_embeddings ? embedding_ : output_;
    o.normed = m.mtp->h;
    results_[at].lm_loss =
        lm_head_forward(w, o.normed, step_labels_[at], loss_grad_scale_, o.head, o.arena, scratch);
    const Tensor& y = m.x[static_cast<size_t>(shape_.num_layers)]->t;
    o.mtp_normed = o.arena.alloc({shape_.tokens(), shape_.hidden}, shape_.compute_dtype);
    o.mtp_rstd = o.arena.alloc({shape_.tokens()}, DType::kF32);
    rmsnorm_forward(y, mtp_.final_norm, shape_.norm_eps, o.mtp_normed, o.mtp_rstd);
    results_[at].mtp_loss = lm_head_forward(w, o.mtp_normed, step_mtp_labels_[at],
                                            loss_grad_scale_ * shape_.mtp_loss_scale, o.mtp_head,
                                            o.arena, scratch, mtp_mask_);
}

void GptModel::mtp_output_backward(MicroBatch& m, Arena& scratch) {
    OutputState& o = *m.output;
    MtpState& st = *m.mtp;
    Param& w = shape_.tie_embeddings ? embedding_ : output_;
    const bool fusion = shape_.gradient_accumulation_fusion;
    // The main head's gradient of h; the prologue's backward adds the MTP's and runs the norm.
    st.dh = st.arena.alloc({shape_.tokens(), shape_.hidden}, DType::kF32);
    lm_head_backward_dgrad(w, o.head, st.dh);
    lm_head_backward_wgrad(w, fusion, o.head, scratch);
    o.d_normed = o.arena.alloc({shape_.tokens(), shape_.hidden}, DType::kF32);
    lm_head_backward_dgrad(w, o.mtp_head, o.d_normed);
    lm_head_backward_wgrad(w, fusion, o.mtp_head, scratch);
    const int last = static_cast<int>(shape_.num_layers);
    const Tensor d_last = handoff(m.dx, last);
    d_last.fill_zero();  // rmsnorm_backward accumulates
    Tensor ws = scratch.alloc({shape_.hidden}, DType::kF32);
    rmsnorm_backward(m.x[static_cast<size_t>(last)]->t, mtp_.final_norm, o.mtp_rstd, o.d_normed,
                     d_last, ws);
    output_pool_.release(m.output);
    m.output = nullptr;
    release_handoff(m.x, last);
}

void GptModel::run(const schedule::NodeCall& c, const moe::DispatchComms& comms, Arena& scratch) {
    using schedule::NodeKind;
    using schedule::Phase;
    scratch.reset();
    MicroBatch& m = micro_batch(c.micro_batch);
    const NodeArgs args{.comms = &comms,
                        .dispatcher = dispatcher_.get(),
                        .scratch = &scratch,
                        .loss_grad_scale = loss_grad_scale_,
                        .moe_chunk = c.moe_chunk};
    if (c.node == NodeKind::kEmbedding) {
        if (c.phase == Phase::kForward) {
            embedding_forward(c.micro_batch, m, args);
        } else {
            embedding_backward(c.micro_batch, m, args);
        }
    } else if (c.node == NodeKind::kOutput) {
        if (c.phase == Phase::kForward) {
            output_forward(c.micro_batch, m, scratch, args);
        } else {
            output_backward(m, scratch, args);
        }
    } else {
        run_layer(c, m, args);
    }
    account(m);
}

bool GptModel::recomputed(int l) const {
    return !shape_.recompute_first.empty() && shape_.recompute_first[static_cast<size_t>(l)] >= 0;
}

bool GptModel::last_of_group(int l) const {
    const auto& g = shape_.recompute_first;
    return recomputed(l) && (l + 1 >= static_cast<int>(shape_.num_layers) ||
                             g[static_cast<size_t>(l + 1)] != g[static_cast<size_t>(l)]);
}

void GptModel::run_layer(const schedule::NodeCall& c, MicroBatch& m, const NodeArgs& a) {
    using schedule::NodeKind;
    using schedule::Phase;
    const int l = c.layer;
    const auto at = static_cast<size_t>(l);
    const LayerShape& s = layer_shapes_[at];
    LayerParams& p = layers_[at];
    LayerState& st = layer_state(m, l);
    const bool wgrad = !c.wgrad_delayed;
    // A recompute call runs the forward again (full recompute, schedule.h): the same functions
    // on the same inputs, so the state it rebuilds is the forward's bit for bit. Its routing
    // tallies are not counted twice, and the recompute of a group's last layer writes no output:
    // the layer above has run its backward, and nothing reads x[l + 1] again.
    const bool recompute = c.phase == Phase::kRecompute;
    const bool forward = c.phase == Phase::kForward || recompute;
    LayerStepStats recompute_stats;
    LayerStepStats& stats = recompute ? recompute_stats : layer_stats_[at];
    const bool writes_output = !(recompute && last_of_group(l));
    // The layer's output, produced by its last forward node (combine, or mlp for a dense layer).
    const auto output = [&] { return writes_output ? handoff(m.x, l + 1) : Tensor(); };
    // After a recomputed layer's last forward node (not its recompute): its state goes back to
    // the pool, and its input too inside a group (the group's first input is all it keeps).
    const auto forward_done = [&] {
        if (c.phase != Phase::kForward || !recomputed(l))
            return;
        layer_pool_.release(m.layers[at]);
        m.layers[at] = nullptr;
        if (shape_.recompute_first[at] != l)
            release_handoff(m.x, l);
    };
    switch (c.node) {
        case NodeKind::kPreDispatch:
            if (forward) {
                st.x = shape_.is_mtp_layer(l) ? mtp_forward(m, *a.scratch) : m.x[at]->t;
                pre_dispatch_forward(s, p, rope_, st, stats, a);
                // Chunks: the chunks' combines write the output, so it exists before them
                // (here, not from the comm stream while this micro-batch's compute nodes read
                // its hand-off slots).
                if (s.is_moe && s.moe.num_chunks > 1)
                    output();
            } else if (c.phase == Phase::kBackward) {
                if (shape_.is_mtp_layer(l)) {
                    // The layer's input gradient is the prologue's output gradient du.
                    MtpState& mtp = *m.mtp;
                    mtp.du = mtp.arena.alloc({shape_.tokens(), shape_.hidden}, DType::kF32);
                    pre_dispatch_backward(s, p, rope_, st, m.dx[at + 1]->t, mtp.du, wgrad, a);
                    mtp_backward(m, *a.scratch);
                } else {
                    pre_dispatch_backward(s, p, rope_, st, m.dx[at + 1]->t, handoff(m.dx, l), wgrad,
                                          a);
                }
                if (wgrad)
                    release_layer(m, l);
            } else {
                pre_dispatch_backward_dw(s, p, st, a);
                release_layer(m, l);
            }
            return;
        case NodeKind::kDispatch:
            forward ? dispatch_forward(s, p, st, a) : dispatch_backward(s, p, st, a);
            return;
        case NodeKind::kMlp:
            if (forward) {
                mlp_forward(s, p, st, s.is_moe ? Tensor() : output(), a);
                if (!s.is_moe)
                    forward_done();
            } else if (c.phase == Phase::kBackward) {
                mlp_backward(s, p, st, m.dx[at + 1]->t, wgrad, a);
            } else {
                mlp_backward_dw(s, p, st, a);
            }
            return;
        case NodeKind::kCombine:
            if (forward) {
                const bool chunked = c.moe_chunk >= 0;
                combine_forward(s, p, st,
                                !chunked        ? output()
                                : writes_output ? m.x[at + 1]->t
                                                : Tensor(),
                                a);
                // The last chunk's combine is the layer's last forward node (every chunk's mlp
                // and combine before it: the comm stream runs the combines in order).
                if (!chunked || c.moe_chunk == s.moe.num_chunks - 1)
                    forward_done();
            } else {
                combine_backward(s, p, st, m.dx[at + 1]->t, a);
            }
            return;
        case NodeKind::kSharedExpert:
            EPO_CHECK(s.is_moe && s.moe.shared_expert_overlap && c.phase != Phase::kBackwardDw &&
                          !c.wgrad_delayed,
                      "{}: a shared-expert call for a layer that does not overlap its shared "
                      "expert (model.moe_shared_expert_overlap and the schedule disagree)",
                      schedule::call_name(c));
            if (forward) {
                shared_expert_forward(s, p, st, a);
            } else {
                shared_expert_backward(s, p, st, m.dx[at + 1]->t, a);
            }
            return;
        default:
            EPO_CHECK(false, "node {} is not a layer node", schedule::node_name(c.node));
    }
}

Tensor GptModel::transfer_tensor(const schedule::NodeCall& c) {
    using schedule::NodeKind;
    MicroBatch& m = micro_batch(c.micro_batch);
    const auto at = static_cast<size_t>(c.layer);
    EPO_CHECK(c.layer >= 0 && c.layer <= shape_.num_layers, "transfer of position {}", c.layer);
    switch (c.node) {
        case NodeKind::kSendForward:
            EPO_CHECK(m.x[at] != nullptr, "micro-batch {} sends x[{}] before it exists",
                      c.micro_batch, c.layer);
            return m.x[at]->t;
        case NodeKind::kSendBackward:
            EPO_CHECK(m.dx[at] != nullptr, "micro-batch {} sends dx[{}] before it exists",
                      c.micro_batch, c.layer);
            return m.dx[at]->t;
        case NodeKind::kRecvForward:
            return handoff(m.x, c.layer);
        case NodeKind::kRecvBackward:
            return handoff(m.dx, c.layer);
        default:
            EPO_CHECK(false, "node {} is not a pipeline transfer", schedule::node_name(c.node));
    }
    return Tensor();
}

void GptModel::transfer_done(const schedule::NodeCall& c) {
    using schedule::NodeKind;
    MicroBatch& m = micro_batch(c.micro_batch);
    if (c.node == NodeKind::kSendForward)
        release_handoff(m.x, c.layer);
    if (c.node == NodeKind::kSendBackward)
        release_handoff(m.dx, c.layer);
    account(m);
}

// The backward is the forward's list reversed (weight gradients inside each backward call), with
// a recomputed group's forward calls again right before its last layer's backward.
std::vector<schedule::NodeCall> GptModel::straight_calls(int mb, schedule::Phase phase) const {
    using schedule::NodeKind;
    using schedule::Phase;
    std::vector<schedule::NodeCall> calls;
    const auto add = [&](int layer, NodeKind node, Phase ph) {
        calls.push_back({.micro_batch = mb, .layer = layer, .node = node, .phase = ph});
    };
    const auto add_layer = [&](int l, Phase ph) {
        const bool moe = layer_shapes_[static_cast<size_t>(l)].is_moe;
        add(l, NodeKind::kPreDispatch, ph);
        if (moe)
            add(l, NodeKind::kDispatch, ph);
        if (moe && layer_shapes_[static_cast<size_t>(l)].moe.shared_expert_overlap)
            add(l, NodeKind::kSharedExpert, ph);
        add(l, NodeKind::kMlp, ph);
        if (moe)
            add(l, NodeKind::kCombine, ph);
    };
    const int L = static_cast<int>(shape_.num_layers);
    if (phase == Phase::kForward) {
        add(-1, NodeKind::kEmbedding, phase);
        for (int l = 0; l < L; ++l)
            add_layer(l, phase);
        add(-1, NodeKind::kOutput, phase);
        return calls;
    }
    add(-1, NodeKind::kOutput, phase);
    for (int l = L - 1; l >= 0; --l) {
        if (last_of_group(l)) {
            for (int k = shape_.recompute_first[static_cast<size_t>(l)]; k <= l; ++k)
                add_layer(k, Phase::kRecompute);
        }
        const size_t first = calls.size();
        add_layer(l, phase);
        std::reverse(calls.begin() + static_cast<std::ptrdiff_t>(first), calls.end());
    }
    add(-1, NodeKind::kEmbedding, phase);
    return calls;
}

void GptModel::forward(int mb, const moe::DispatchComms& comms, Arena& scratch) {
    for (const schedule::NodeCall& c : straight_calls(mb, schedule::Phase::kForward))
        run(c, comms, scratch);
}

void GptModel::backward(int mb, const moe::DispatchComms& comms, Arena& scratch) {
    for (const schedule::NodeCall& c : straight_calls(mb, schedule::Phase::kBackward))
        run(c, comms, scratch);
}

void GptModel::forward_backward(int mb, const moe::DispatchComms& comms, Arena& scratch) {
    forward(mb, comms, scratch);
    backward(mb, comms, scratch);
}

}  // namespace epo::model
