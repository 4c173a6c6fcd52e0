// The one emitter of every schedule (pipeline_schedule.h; schedule.h's single-stage schedules are
// its P = V = 1 case). It works over units (a micro-batch through a model chunk: a layer range,
// with or without the embedding and the output position) and writes each way a step runs once:
// alone, combined, paired. MoE chunks are expanded here and only here; bucket reductions and
// parameter gathers are placed here and only here.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

#include "epo/schedule/pipeline_schedule.h"

namespace epo::schedule {
namespace {

// A unit with what its model chunk holds.
struct Unit {
    int stage = 0;
    int chunk = 0;
    int mb = 0;
    int first = 0, end = 0;  // layers [first, end)
    bool embedding = false;  // holds the embedding (position -1)
    bool output = false;     // holds the output position (L)
};

struct StageState {
    std::vector<PipelineStep> steps;
    size_t next = 0;
    // The tick a unit's input arrived: key (forward, micro-batch, chunk).
    std::map<std::tuple<bool, int, int>, int> inputs;
    // Micro-batches whose output position ran forward / backward (the output stage only).
    std::set<int> output_forward, output_backward;
    // Gradient buckets: closed (complete), issued (reduction added).
    size_t closed = 0, issued = 0;
};

class Emitter {
public:
    explicit Emitter(const PipelineShape& shape)
        : shape_(shape),
          calls_(static_cast<size_t>(shape.num_stages)),
          stages_(static_cast<size_t>(shape.num_stages)) {}

    std::vector<std::vector<NodeCall>> run() {
        const int P = shape_.num_stages;
        for (int s = 0; s < P; ++s) {
            // Emitted one unit per tick, unless combined: a baseline step's backward may need
            // what its forward has just sent on (the last stage's own output, another stage's
            // reply), so it runs as two steps.
            for (const PipelineStep& st : stage_steps(shape_, s)) {
                if (st.has_forward && st.has_backward && !shape_.overlap) {
                    state(s).steps.push_back({.has_forward = true, .forward = st.forward});
                    state(s).steps.push_back({.has_backward = true, .backward = st.backward});
                } else {
                    state(s).steps.push_back(st);
                }
            }
        }
        const auto done = [&] {
            return std::all_of(stages_.begin(), stages_.end(),
                               [](const StageState& st) { return st.next == st.steps.size(); });
        };
        for (; !done(); ++tick_) {
            bool progressed = false;
            for (int s = 0; s < P; ++s) {
                StageState& st = state(s);
                if (st.next < st.steps.size() && step_ready(s, st.steps[st.next])) {
                    emit(s, st.next);
                    ++st.next;
                    progressed = true;
                }
            }
            if (!progressed) {
                // A unit order whose inputs never arrive: a bug in stage_steps, not bad input.
                throw std::logic_error(fmt::format(
                    "pipeline schedule (PP {}, VPP {}, {} micro-batches) is stuck at tick {}",
                    shape_.num_stages, shape_.num_chunks, shape_.num_micro_batches, tick_));
            }
        }
        return std::move(calls_);
    }

private:
    const PipelineShape& shape_;
    std::vector<std::vector<NodeCall>> calls_;  // [stage]
    std::vector<StageState> stages_;            // [stage]
    int tick_ = 0;

    StageState& state(int s) { return stages_[static_cast<size_t>(s)]; }
    int num_layers() const { return static_cast<int>(shape_.moe_layers.size()); }
    bool moe(int layer) const { return shape_.moe_layers[static_cast<size_t>(layer)]; }
    bool last_backward(const Unit& u) const { return u.mb == shape_.num_micro_batches - 1; }

    Unit unit(int s, const PipelineUnit& pu) const {
        const ChunkLayers r = chunk_layers(shape_, s, pu.chunk);
        return Unit{.stage = s,
                    .chunk = pu.chunk,
                    .mb = pu.micro_batch,
                    .first = r.first,
                    .end = r.end,
                    .embedding = s == 0 && pu.chunk == 0,
                    .output = s == shape_.num_stages - 1 && pu.chunk == shape_.num_chunks - 1};
    }

    void add(const Unit& u, int layer, NodeKind node, Phase phase, bool delayed = false,
             int wait_bucket = -1, int moe_chunk = -1) {
        calls_[static_cast<size_t>(u.stage)].push_back(NodeCall{.micro_batch = u.mb,
                                                                .layer = layer,
                                                                .node = node,
                                                                .phase = phase,
                                                                .wgrad_delayed = delayed,
                                                                .wait_bucket = wait_bucket,
                                                                .stage = u.stage,
                                                                .chunk = u.chunk,
                                                                .moe_chunk = moe_chunk});
    }
    // The chunks a layer's dispatch/mlp/combine run in: C for a MoE layer, 1 (whole) otherwise.
    int moe_chunks(int layer) const { return moe(layer) ? shape_.num_moe_chunks : 1; }
    // A layer's call for each of its chunks, in ascending order (whole when C = 1).
    void add_chunks(const Unit& u, int layer, NodeKind node, Phase phase, bool delayed = false) {
        const int n = moe_chunks(layer);
        for (int c = 0; c < n; ++c)
            add(u, layer, node, phase, delayed, -1, n > 1 ? c : -1);
    }
    // A MoE layer's three chunked nodes while its unit runs alone: `in` (comm), `compute`, `out`
    // (comm) per chunk, as a pipeline with overlap, chunk by chunk without (schedule.h "MoE
    // chunks"). `after_in` runs once, right after the last chunk's `in`. With shared-expert
    // overlap the shared expert's call follows chunk 0's `in` (schedule.h).
    template <class AfterIn>
    void chunk_nodes(const Unit& u, int l, Phase phase, NodeKind in, NodeKind compute, NodeKind out,
                     AfterIn after_in) {
        const int n = moe_chunks(l);
        const auto chunk = [n](int c) { return n > 1 ? c : -1; };
        const auto add_in = [&](int c) {
            add(u, l, in, phase, false, -1, chunk(c));
            if (c == 0 && shape_.shared_expert_overlap)
                add(u, l, NodeKind::kSharedExpert, phase);
            if (c == n - 1)
                after_in();
        };
        // Why every `in` first: each needs only what the layer's previous node made, so the
        // comm stream moves them back to back while chunk 0 computes; an `out` between them
        // would hold the next chunk's `in` until the previous chunk's compute ends.
        if (shape_.overlap) {
            for (int c = 0; c < n; ++c)
                add_in(c);
        }
        for (int c = 0; c < n; ++c) {
            if (!shape_.overlap)
                add_in(c);
            add(u, l, compute, phase, false, -1, chunk(c));
            add(u, l, out, phase, false, -1, chunk(c));
        }
    }

    // ---- Full recompute (schedule.h "Full recompute") ----
    int recompute_first(int layer) const {
        const auto& g = shape_.recompute_first;
        return g.empty() ? -1 : g[static_cast<size_t>(layer)];
    }
    // The first layer of the group whose forward runs again right before layer l's backward: l
    // is recomputed and the last layer of its group; -1 otherwise.
    int recompute_before(int l) const {
        const int first = recompute_first(l);
        if (first < 0 || (l + 1 < num_layers() && recompute_first(l + 1) == first))
            return -1;
        return first;
    }
    // A unit's forward nodes of l's group again, layer by layer, MoE chunks as in its forward.
    void recompute(const Unit& u, int l) {
        const int first = recompute_before(l);
        for (int k = first; first >= 0 && k <= l; ++k) {
            add(u, k, NodeKind::kPreDispatch, Phase::kRecompute);
            if (moe(k)) {
                chunk_nodes(u, k, Phase::kRecompute, NodeKind::kDispatch, NodeKind::kMlp,
                            NodeKind::kCombine, [] {});
            } else {
                add(u, k, NodeKind::kMlp, Phase::kRecompute);
            }
        }
    }
    // Two backward units' recompute of l's group, layer by layer in forward_pair's order (a's
    // dispatch under b's attention, b's under a's experts).
    void recompute_pair(const Unit& a, const Unit& b, int l) {
        const int first = recompute_before(l);
        for (int k = first; first >= 0 && k <= l; ++k) {
            for (const Unit* u : {&a, &b}) {
                add(*u, k, NodeKind::kPreDispatch, Phase::kRecompute);
                if (moe(k))
                    add_chunks(*u, k, NodeKind::kDispatch, Phase::kRecompute);
            }
            for (const Unit* u : {&a, &b}) {
                add_chunks(*u, k, NodeKind::kMlp, Phase::kRecompute);
                if (moe(k))
                    add_chunks(*u, k, NodeKind::kCombine, Phase::kRecompute);
            }
        }
    }

    // ---- Parameter gathers: micro-batch 0's forward units (schedule.h) ----
    const std::vector<int>& param_ends(const Unit& u) const {
        static const std::vector<int> none;
        const auto& all = shape_.stage_param_bucket_ends;
        return u.mb == 0 && !all.empty() ? all[static_cast<size_t>(u.stage)] : none;
    }
    // The bucket whose lowest position is p, -1 none.
    int bucket_starting_at(const Unit& u, int position) const {
        const std::vector<int>& ends = param_ends(u);
        const auto it = std::find(ends.begin(), ends.end(), position);
        return it == ends.end() ? -1 : static_cast<int>(it - ends.begin());
    }
    void gather(const Unit& u, int position) {
        if (const int k = bucket_starting_at(u, position); k >= 0)
            add(u, k, NodeKind::kParamGather, Phase::kForward);
    }
    // Position p's first forward call, waiting for the bucket that starts at p.
    void first_use(const Unit& u, int position, int layer, NodeKind node) {
        add(u, layer, node, Phase::kForward, false, bucket_starting_at(u, position));
    }

    // ---- Gradient reductions: the last backward unit of each model chunk (header) ----
    const std::vector<int>& grad_ends(int s) const {
        static const std::vector<int> none;
        const auto& all = shape_.stage_grad_bucket_ends;
        return all.empty() ? none : all[static_cast<size_t>(s)];
    }
    // Marks the buckets that end at position p complete.
    void close(const Unit& u, int position) {
        if (!last_backward(u))
            return;
        StageState& st = state(u.stage);
        const std::vector<int>& ends = grad_ends(u.stage);
        while (st.closed < ends.size() && ends[st.closed] == position)
            ++st.closed;
    }
    // Adds the reduction of every complete bucket not yet issued.
    void issue(const Unit& u) {
        if (!last_backward(u))
            return;
        StageState& st = state(u.stage);
        for (; st.issued < st.closed; ++st.issued)
            add(u, static_cast<int>(st.issued), NodeKind::kGradReduce, Phase::kBackward);
    }

    // ---- Transfers (header: deadlock freedom) ----
    bool ready(int s, const PipelineUnit& u, bool forward) const {
        const auto& in = stages_[static_cast<size_t>(s)].inputs;
        const auto it = in.find({forward, u.micro_batch, u.chunk});
        return it != in.end() && it->second < tick_;
    }
    // The activations x[end] go to the next stage's chunk (the ring's next chunk after the last
    // stage), their gradient dx[first] to the previous one's; the transfer is appended to both
    // lists at once.
    void transfer(const Unit& u, bool forward) {
        const int P = shape_.num_stages;
        const int to = forward ? (u.stage + 1) % P : (u.stage + P - 1) % P;
        const int edge = forward ? P - 1 : 0;  // the stage whose peer is the ring's next chunk
        Unit peer = u;
        peer.stage = to;
        peer.chunk = u.stage == edge ? u.chunk + (forward ? 1 : -1) : u.chunk;
        const int position = forward ? u.end : u.first;
        const Phase phase = forward ? Phase::kForward : Phase::kBackward;
        add(u, position, forward ? NodeKind::kSendForward : NodeKind::kSendBackward, phase);
        add(peer, position, forward ? NodeKind::kRecvForward : NodeKind::kRecvBackward, phase);
        state(to).inputs[{forward, u.mb, peer.chunk}] = tick_;
    }
    void send_forward(const Unit& u) { transfer(u, true); }
    void send_backward(const Unit& u) { transfer(u, false); }

    // ---- The output position ----
    void output_forward(const Unit& u) {
        first_use(u, num_layers(), -1, NodeKind::kOutput);
        state(u.stage).output_forward.insert(u.mb);
        // The output position's backward needs nothing from another stage.
        state(u.stage).inputs[{false, u.mb, u.chunk}] = -1;
    }
    // The unit's loss gradient, unless an earlier step ran it (pair_edges).
    void output_backward(const Unit& u) {
        if (u.output && state(u.stage).output_backward.insert(u.mb).second)
            add(u, -1, NodeKind::kOutput, Phase::kBackward);
    }
    // pair_edges: `next` (the stage's next backward unit) runs its loss gradient now if its
    // forward has ended (header).
    void hoist_output_backward(const Unit* next) {
        if (next != nullptr && next->output && state(next->stage).output_forward.count(next->mb))
            output_backward(*next);
    }
    void finish_forward(const Unit& u) {
        if (u.output) {
            output_forward(u);
        } else {
            send_forward(u);
        }
    }

    // ---- The three ways a step runs ----

    // A unit's forward alone. In micro-batch 0's, parameter buckets are gathered: the bucket whose
    // lowest position is p is issued after the first comm call that follows position p-1's first
    // node, and position p's first node waits for it.
    void forward_alone(const Unit& u) {
        if (u.embedding) {
            gather(u, kEmbeddingPosition);
            first_use(u, kEmbeddingPosition, -1, NodeKind::kEmbedding);
        }
        gather(u, u.first);
        for (int l = u.first; l < u.end; ++l) {
            first_use(u, l, l, NodeKind::kPreDispatch);
            if (moe(l)) {
                chunk_nodes(u, l, Phase::kForward, NodeKind::kDispatch, NodeKind::kMlp,
                            NodeKind::kCombine, [&] { gather(u, l + 1); });
            } else {
                gather(u, l + 1);
                add(u, l, NodeKind::kMlp, Phase::kForward);
            }
        }
        finish_forward(u);
    }

    // A unit's backward alone; weight gradients are never delayed outside the combined steps. A
    // bucket that closed is issued behind the comm call that comes right after, or at once if a
    // compute call comes next.
    void backward_alone(const Unit& u) {
        output_backward(u);
        if (u.output)
            close(u, num_layers());
        for (int l = u.end - 1; l >= u.first; --l) {
            recompute(u, l);
            if (moe(l)) {
                chunk_nodes(u, l, Phase::kBackward, NodeKind::kCombine, NodeKind::kMlp,
                            NodeKind::kDispatch, [&] { issue(u); });
            } else {
                issue(u);
                add(u, l, NodeKind::kMlp, Phase::kBackward);
            }
            add(u, l, NodeKind::kPreDispatch, Phase::kBackward);
            close(u, l);
        }
        finish_backward(u);
    }
    void finish_backward(const Unit& u) {
        if (u.embedding) {
            issue(u);
            add(u, -1, NodeKind::kEmbedding, Phase::kBackward);
            close(u, kEmbeddingPosition);
            issue(u);
        } else {
            send_backward(u);
            issue(u);
        }
    }

    // The forward of f with the backward of b: schedule.h's ten-step pair order, layer
    // f.first + j of the forward with layer b.end - 1 - j of the backward (an uneven pair runs
    // the longer unit's remaining layers in the same order). `next` (pair_edges): the stage's
    // next backward unit, whose loss gradient runs right before the last attention backward.
    void combined(const Unit& f, const Unit& b, const Unit* next) {
        const bool delay = shape_.delay_wgrad;
        const int nf = f.end - f.first, nb = b.end - b.first;
        if (f.embedding)
            add(f, -1, NodeKind::kEmbedding, Phase::kForward);
        output_backward(b);
        if (b.output)
            close(b, num_layers());
        if (nb == 0)
            hoist_output_backward(next);
        for (int j = 0; j < std::max(nf, nb); ++j) {
            const bool fw = j < nf, bw = j < nb;
            const int fl = f.first + j, bl = b.end - 1 - j;
            if (bw)
                recompute(b, bl);  // a recomputed group's forward, before its last layer's step 1
            if (bw && moe(bl))
                add_chunks(b, bl, NodeKind::kCombine, Phase::kBackward);  // 1
            if (fw)
                add(f, fl, NodeKind::kPreDispatch, Phase::kForward);  // 2
            if (bw)
                add_chunks(b, bl, NodeKind::kMlp, Phase::kBackward, delay);  // 3
            if (fw && moe(fl))
                add_chunks(f, fl, NodeKind::kDispatch, Phase::kForward);  // 4
            if (bw && delay)
                add_chunks(b, bl, NodeKind::kMlp, Phase::kBackwardDw);  // 5
            if (bw && moe(bl))
                add_chunks(b, bl, NodeKind::kDispatch, Phase::kBackward);  // 6
            if (bw)
                issue(b);
            if (fw)
                add_chunks(f, fl, NodeKind::kMlp, Phase::kForward);  // 7
            if (fw && moe(fl))
                add_chunks(f, fl, NodeKind::kCombine, Phase::kForward);  // 8
            if (!bw)
                continue;
            if (bl == b.first)
                hoist_output_backward(next);
            add(b, bl, NodeKind::kPreDispatch, Phase::kBackward, delay);  // 9
            close(b, bl);
            if (delay && bl != b.first)
                add(b, bl, NodeKind::kPreDispatch, Phase::kBackwardDw);  // 10
        }
        finish_forward(f);
        if (b.embedding) {
            issue(b);
            add(b, -1, NodeKind::kEmbedding, Phase::kBackward);
            close(b, kEmbeddingPosition);
        }
        // The first layer's delayed attention wgrad runs after the chunk, issued before the
        // gradient's send, which does not wait for it (off the chain, schedule.h): the send runs
        // while it computes, as the reference keeps it back to overlap the pipeline's p2p
        // communication.
        if (delay && nb > 0)
            add(b, b.first, NodeKind::kPreDispatch, Phase::kBackwardDw);
        if (!b.embedding)
            send_backward(b);
        issue(b);
    }

    // Two forwards of one model chunk together (pair_edges), layer by layer: each one's dispatch
    // runs under the other's compute. a gathers the parameter buckets as forward_alone does; b's
    // first use of a bucket follows a's on the compute stream, so it needs no wait of its own.
    // `next`: as in combined (schedule.h: a's loss gradient between a's and b's output forward).
    void forward_pair(const Unit& a, const Unit& b, const Unit* next) {
        if (a.embedding) {
            gather(a, kEmbeddingPosition);
            first_use(a, kEmbeddingPosition, -1, NodeKind::kEmbedding);
        }
        gather(a, a.first);
        if (b.embedding)
            add(b, -1, NodeKind::kEmbedding, Phase::kForward);
        for (int l = a.first; l < a.end; ++l) {
            first_use(a, l, l, NodeKind::kPreDispatch);
            if (moe(l))
                add_chunks(a, l, NodeKind::kDispatch, Phase::kForward);
            gather(a, l + 1);
            add(b, l, NodeKind::kPreDispatch, Phase::kForward);
            if (moe(l))
                add_chunks(b, l, NodeKind::kDispatch, Phase::kForward);
            for (const Unit* u : {&a, &b}) {
                add_chunks(*u, l, NodeKind::kMlp, Phase::kForward);
                if (moe(l))
                    add_chunks(*u, l, NodeKind::kCombine, Phase::kForward);
                // Each activation leaves as soon as it exists.
                if (l == a.end - 1 && !u->output)
                    send_forward(*u);
            }
        }
        if (a.output) {
            output_forward(a);
            hoist_output_backward(next);
            output_forward(b);
        } else if (a.end == a.first) {
            send_forward(a);
            send_forward(b);
        }
    }

    // Two backwards of one model chunk together (pair_edges), a before b at every node, so each
    // weight gradient accumulates in micro-batch order. Weight gradients are not delayed here.
    // The pair keeps the comm stream busy, so a reduction (b is the chunk's last backward when
    // the pair ends the step) cannot fill a gap as in backward_alone: it goes behind a MoE
    // layer's two dispatches, which the layer's attention backward needs next, and delays the
    // next layer's combines instead; behind the last MoE layer's dispatches it runs under the
    // attention backward and delays nothing.
    void backward_pair(const Unit& a, const Unit& b) {
        output_backward(a);
        output_backward(b);
        if (b.output)
            close(b, num_layers());
        for (int l = b.end - 1; l >= b.first; --l) {
            recompute_pair(a, b, l);
            if (moe(l)) {
                add_chunks(a, l, NodeKind::kCombine, Phase::kBackward);
                add_chunks(b, l, NodeKind::kCombine, Phase::kBackward);
                for (const Unit* u : {&a, &b}) {
                    add_chunks(*u, l, NodeKind::kMlp, Phase::kBackward);
                    add_chunks(*u, l, NodeKind::kDispatch, Phase::kBackward);
                }
                issue(b);
            } else {
                issue(b);
                add(a, l, NodeKind::kMlp, Phase::kBackward);
                add(b, l, NodeKind::kMlp, Phase::kBackward);
            }
            for (const Unit* u : {&a, &b}) {
                add(*u, l, NodeKind::kPreDispatch, Phase::kBackward);
                if (l == b.first && !u->embedding)
                    send_backward(*u);
            }
            close(b, l);
        }
        if (b.embedding) {
            issue(b);
            add(a, -1, NodeKind::kEmbedding, Phase::kBackward);
            add(b, -1, NodeKind::kEmbedding, Phase::kBackward);
            close(b, kEmbeddingPosition);
        } else if (b.end == b.first) {
            send_backward(a);
            send_backward(b);
        }
        issue(b);
    }

    bool step_ready(int s, const PipelineStep& st) const {
        const auto fwd_ready = [&](const PipelineUnit& u) {
            return (s == 0 && u.chunk == 0) || ready(s, u, true);
        };
        const bool f =
            !st.has_forward || (fwd_ready(st.forward) && (!st.paired || fwd_ready(st.second)));
        const bool b = !st.has_backward ||
                       (ready(s, st.backward, false) && (!st.paired || ready(s, st.second, false)));
        return f && b;
    }

    void emit(int s, size_t index) {
        const StageState& ss = state(s);
        const PipelineStep& st = ss.steps[index];
        // pair_edges: the stage's next backward unit, whose loss gradient may run in this step.
        Unit next_unit;
        const Unit* next = nullptr;
        if (shape_.overlap && shape_.pair_edges && index + 1 < ss.steps.size() &&
            ss.steps[index + 1].has_backward) {
            next_unit = unit(s, ss.steps[index + 1].backward);
            next = &next_unit;
        }
        if (st.paired) {
            if (st.has_forward) {
                forward_pair(unit(s, st.forward), unit(s, st.second), next);
            } else {
                backward_pair(unit(s, st.backward), unit(s, st.second));
            }
            return;
        }
        if (st.has_forward && st.has_backward && shape_.overlap) {
            combined(unit(s, st.forward), unit(s, st.backward), next);
            return;
        }
        if (st.has_forward)
            forward_alone(unit(s, st.forward));
        if (st.has_backward)
            backward_alone(unit(s, st.backward));
    }
};

}  // namespace

std::vector<std::vector<NodeCall>> pipeline_schedules(const PipelineShape& shape) {
    check_pipeline_shape(shape);
    return Emitter(shape).run();
}

}  // namespace epo::schedule
