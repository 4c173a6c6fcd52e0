#include "epo/schedule/schedule.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>

namespace epo::schedule {
namespace {

int num_layers(const ScheduleShape& s) {
    return static_cast<int>(s.moe_layers.size());
}

struct Builder {
    const ScheduleShape& shape;
    std::vector<NodeCall> calls;

    // Overlap schedule: a micro-batch alone runs a MoE layer's chunks as a pipeline; baseline:
    // chunk by chunk (schedule.h).
    bool pipelined = false;

    void add(int mb, int layer, NodeKind node, Phase phase, bool delayed = false,
             int wait_bucket = -1, int moe_chunk = -1) {
        calls.push_back(NodeCall{.micro_batch = mb,
                                 .layer = layer,
                                 .node = node,
                                 .phase = phase,
                                 .wgrad_delayed = delayed,
                                 .wait_bucket = wait_bucket,
                                 .moe_chunk = moe_chunk});
    }
    bool moe(int layer) const { return shape.moe_layers[static_cast<size_t>(layer)]; }
    // The chunks a layer's dispatch/mlp/combine run in: C for a MoE layer, 1 (whole) otherwise.
    int chunks(int layer) const { return moe(layer) ? shape.num_moe_chunks : 1; }
    // A layer's call for each of its chunks, in ascending order (whole when C = 1).
    void add_chunks(int mb, int layer, NodeKind node, Phase phase, bool delayed = false) {
        const int n = chunks(layer);
        for (int c = 0; c < n; ++c)
            add(mb, layer, node, phase, delayed, -1, n > 1 ? c : -1);
    }
    // A MoE layer's three chunked nodes while its micro-batch runs alone: `in` (comm), `compute`,
    // `out` (comm) for each chunk, pipelined or chunk by chunk (schedule.h). `after_in` runs
    // once, right after the last chunk's `in` (C = 1: in, after_in, compute, out as before).
    template <class AfterIn>
    void chunk_nodes(int mb, int l, Phase phase, NodeKind in, NodeKind compute, NodeKind out,
                     AfterIn after_in) {
        const int n = chunks(l);
        const auto chunk = [n](int c) { return n > 1 ? c : -1; };
        const auto add_in = [&](int c) {
            add(mb, l, in, phase, false, -1, chunk(c));
            if (c == n - 1)
                after_in();
        };
        // Why every `in` first: each needs only what the layer's previous node made, so the
        // comm stream moves them back to back while chunk 0 computes; an `out` between them
        // would hold the next chunk's `in` until the previous chunk's compute ends.
        if (pipelined) {
            for (int c = 0; c < n; ++c)
                add_in(c);
        }
        for (int c = 0; c < n; ++c) {
            if (!pipelined)
                add_in(c);
            add(mb, l, compute, phase, false, -1, chunk(c));
            add(mb, l, out, phase, false, -1, chunk(c));
        }
    }

    void layer_forward(int mb, int l) {
        add(mb, l, NodeKind::kPreDispatch, Phase::kForward);
        if (moe(l))
            add(mb, l, NodeKind::kDispatch, Phase::kForward);
        add(mb, l, NodeKind::kMlp, Phase::kForward);
        if (moe(l))
            add(mb, l, NodeKind::kCombine, Phase::kForward);
    }
    // Micro-batch mb's parameter gathers (schedule.h): only micro-batch 0 gathers. gather(p)
    // issues the bucket whose lowest position is p, first(p, ...) adds position p's first node,
    // waiting for that bucket.
    struct Gathers {
        Builder& b;
        int mb;
        const std::vector<int>& ends;
        int bucket_starting_at(int position) const {
            const auto it = std::find(ends.begin(), ends.end(), position);
            return it == ends.end() ? -1 : static_cast<int>(it - ends.begin());
        }
        void gather(int position) const {
            if (const int k = bucket_starting_at(position); k >= 0)
                b.add(mb, k, NodeKind::kParamGather, Phase::kForward);
        }
        void first(int position, int layer, NodeKind node) const {
            b.add(mb, layer, node, Phase::kForward, false, bucket_starting_at(position));
        }
    };
    Gathers gathers(int mb) {
        static const std::vector<int> none;
        return Gathers{*this, mb, mb == 0 ? shape.param_bucket_ends : none};
    }
    // Micro-batch mb's backward buckets (schedule.h): only the step's last backward reduces.
    // close(p) marks the buckets that end at position p complete, issue() adds the reductions of
    // every complete bucket not yet issued.
    struct Reductions {
        Builder& b;
        int mb;
        const std::vector<int>& ends;
        size_t closed = 0, issued = 0;
        void close(int position) {
            while (closed < ends.size() && ends[closed] == position)
                ++closed;
        }
        void issue() {
            for (; issued < closed; ++issued)
                b.add(mb, static_cast<int>(issued), NodeKind::kGradReduce, Phase::kBackward);
        }
    };
    Reductions reductions(int mb, bool last) {
        static const std::vector<int> none;
        return Reductions{*this, mb, last ? shape.grad_bucket_ends : none};
    }

    // A micro-batch's forward alone. In micro-batch 0's, parameter buckets are gathered
    // (schedule.h): the bucket whose lowest position is p is issued after the first comm call
    // that follows position p-1's first node, and position p's first node waits for it.
    void forward_alone(int mb) {
        const Gathers g = gathers(mb);
        g.gather(kEmbeddingPosition);
        g.first(kEmbeddingPosition, -1, NodeKind::kEmbedding);
        g.gather(0);
        for (int l = 0; l < num_layers(shape); ++l) {
            g.first(l, l, NodeKind::kPreDispatch);
            if (moe(l)) {
                chunk_nodes(mb, l, Phase::kForward, NodeKind::kDispatch, NodeKind::kMlp,
                            NodeKind::kCombine, [&] { g.gather(l + 1); });
            } else {
                g.gather(l + 1);
                add(mb, l, NodeKind::kMlp, Phase::kForward);
            }
        }
        g.first(num_layers(shape), -1, NodeKind::kOutput);
    }
    void check_bucket_ends(const std::vector<int>& ends, const char* name) const {
        const bool ordered = std::is_sorted(ends.rbegin(), ends.rend()) &&
                             std::adjacent_find(ends.begin(), ends.end()) == ends.end();
        if (!ends.empty() &&
            (!ordered || ends.front() > num_layers(shape) || ends.back() != kEmbeddingPosition)) {
            throw std::invalid_argument(
                fmt::format("{} [{}] must run strictly down from at most {} to {}", name,
                            fmt::join(ends, ", "), num_layers(shape), kEmbeddingPosition));
        }
    }
    void check_bucket_ends() const {
        check_bucket_ends(shape.grad_bucket_ends, "grad_bucket_ends");
        check_bucket_ends(shape.param_bucket_ends, "param_bucket_ends");
    }
    // A micro-batch's backward alone; weight gradients are never delayed outside the combined
    // steps, so each backward includes them. In the step's last one, gradient buckets are reduced
    // (schedule.h): a bucket that closed is issued behind the comm call that comes right after,
    // or at once if a compute call comes next.
    void backward_alone(int mb, bool last) {
        Reductions r = reductions(mb, last);
        add(mb, -1, NodeKind::kOutput, Phase::kBackward);
        r.close(num_layers(shape));
        for (int l = num_layers(shape) - 1; l >= 0; --l) {
            if (moe(l)) {
                chunk_nodes(mb, l, Phase::kBackward, NodeKind::kCombine, NodeKind::kMlp,
                            NodeKind::kDispatch, [&] { r.issue(); });
            } else {
                r.issue();
                add(mb, l, NodeKind::kMlp, Phase::kBackward);
            }
            add(mb, l, NodeKind::kPreDispatch, Phase::kBackward);
            r.close(l);
        }
        r.issue();
        add(mb, -1, NodeKind::kEmbedding, Phase::kBackward);
        r.close(kEmbeddingPosition);
        r.issue();
    }
    // The first two forwards together (pair_edges, schedule.h): layer by layer, each
    // micro-batch's dispatch runs under the other's compute. Micro-batch a (0) gathers the
    // parameter buckets as forward_alone does; b's first use of a bucket follows a's on the
    // compute stream, so it needs no wait of its own.
    void forward_pair(int a, int b) {
        const Gathers g = gathers(a);
        g.gather(kEmbeddingPosition);
        g.first(kEmbeddingPosition, -1, NodeKind::kEmbedding);
        g.gather(0);
        add(b, -1, NodeKind::kEmbedding, Phase::kForward);
        for (int l = 0; l < num_layers(shape); ++l) {
            g.first(l, l, NodeKind::kPreDispatch);
            if (moe(l))
                add_chunks(a, l, NodeKind::kDispatch, Phase::kForward);
            g.gather(l + 1);
            add(b, l, NodeKind::kPreDispatch, Phase::kForward);
            if (moe(l))
                add_chunks(b, l, NodeKind::kDispatch, Phase::kForward);
            for (int mb : {a, b}) {
                add_chunks(mb, l, NodeKind::kMlp, Phase::kForward);
                if (moe(l))
                    add_chunks(mb, l, NodeKind::kCombine, Phase::kForward);
            }
        }
        g.first(num_layers(shape), -1, NodeKind::kOutput);
        // a's loss gradient: the next phase's first backward is a's, so its output backward runs
        // here, in the wait for b's last combine, and a's first combine backward queues on the
        // comm stream right behind b's (schedule.h "Paired edges").
        add(a, -1, NodeKind::kOutput, Phase::kBackward);
        add(b, -1, NodeKind::kOutput, Phase::kForward);
    }
    // The last two backwards together (pair_edges), a before b at every node, so each weight
    // gradient accumulates in micro-batch order; b is the step's last backward and reduces a
    // bucket once b has passed its last position. Weight gradients are not delayed here (each
    // micro-batch's communication runs under the other's compute). The pair keeps the comm
    // stream busy, so a reduction cannot fill a gap as in backward_alone: it goes behind a MoE
    // layer's two dispatches, which the layer's attention backward needs next, and delays the
    // next layer's combines instead; behind the last MoE layer's dispatches it runs under the
    // attention backward and delays nothing.
    // a's output backward already ran in the phase before (forward_pair or combined_step).
    void backward_pair(int a, int b) {
        Reductions r = reductions(b, true);
        add(b, -1, NodeKind::kOutput, Phase::kBackward);
        r.close(num_layers(shape));
        for (int l = num_layers(shape) - 1; l >= 0; --l) {
            if (moe(l)) {
                add_chunks(a, l, NodeKind::kCombine, Phase::kBackward);
                add_chunks(b, l, NodeKind::kCombine, Phase::kBackward);
                for (int mb : {a, b}) {
                    add_chunks(mb, l, NodeKind::kMlp, Phase::kBackward);
                    add_chunks(mb, l, NodeKind::kDispatch, Phase::kBackward);
                }
                r.issue();
            } else {
                r.issue();
                add(a, l, NodeKind::kMlp, Phase::kBackward);
                add(b, l, NodeKind::kMlp, Phase::kBackward);
            }
            add(a, l, NodeKind::kPreDispatch, Phase::kBackward);
            add(b, l, NodeKind::kPreDispatch, Phase::kBackward);
            r.close(l);
        }
        r.issue();
        add(a, -1, NodeKind::kEmbedding, Phase::kBackward);
        add(b, -1, NodeKind::kEmbedding, Phase::kBackward);
        r.close(kEmbeddingPosition);
        r.issue();
    }
    // One combined step: forward of micro-batch f with backward of micro-batch b. With paired
    // edges (`next_b` >= 0), b's output backward already ran in the phase before, and this step
    // runs that of the next phase's first backward, micro-batch next_b, whose forward has ended:
    // right before the last attention backward (step 9 of the last pair), in the compute
    // stream's wait for b's last dispatch, so next_b's first combine backward is queued on the
    // comm stream behind f's last combine and runs under that attention backward instead of
    // after it (schedule.h "Paired edges").
    void combined_step(int f, int b, int next_b = -1) {
        const int L = num_layers(shape);
        const bool delay = shape.delay_wgrad;
        const bool hoisted = next_b >= 0;
        add(f, -1, NodeKind::kEmbedding, Phase::kForward);
        if (!hoisted)
            add(b, -1, NodeKind::kOutput, Phase::kBackward);
        if (hoisted && L == 0)
            add(next_b, -1, NodeKind::kOutput, Phase::kBackward);
        for (int j = 0; j < L; ++j) {
            const int fl = j, bl = L - 1 - j;
            if (moe(bl))
                add_chunks(b, bl, NodeKind::kCombine, Phase::kBackward);  // 1
            add(f, fl, NodeKind::kPreDispatch, Phase::kForward);          // 2
            add_chunks(b, bl, NodeKind::kMlp, Phase::kBackward, delay);   // 3
            if (moe(fl))
                add_chunks(f, fl, NodeKind::kDispatch, Phase::kForward);  // 4
            if (delay)
                add_chunks(b, bl, NodeKind::kMlp, Phase::kBackwardDw);  // 5
            if (moe(bl))
                add_chunks(b, bl, NodeKind::kDispatch, Phase::kBackward);  // 6
            add_chunks(f, fl, NodeKind::kMlp, Phase::kForward);            // 7
            if (moe(fl))
                add_chunks(f, fl, NodeKind::kCombine, Phase::kForward);  // 8
            if (hoisted && bl == 0)
                add(next_b, -1, NodeKind::kOutput, Phase::kBackward);
            add(b, bl, NodeKind::kPreDispatch, Phase::kBackward, delay);  // 9
            if (delay && bl != 0)
                add(b, bl, NodeKind::kPreDispatch, Phase::kBackwardDw);  // 10
        }
        add(f, -1, NodeKind::kOutput, Phase::kForward);
        add(b, -1, NodeKind::kEmbedding, Phase::kBackward);
        // The first layer's delayed attention wgrad runs after the chunk (the reference keeps
        // it back to overlap the pipeline's p2p communication).
        if (delay && L > 0)
            add(b, 0, NodeKind::kPreDispatch, Phase::kBackwardDw);
    }
};

}  // namespace

StreamId stream_of(NodeKind node) {
    return node == NodeKind::kDispatch || node == NodeKind::kCombine ||
                   node == NodeKind::kGradReduce || node == NodeKind::kParamGather ||
                   is_pipeline_transfer(node)
               ? StreamId::kComm
               : StreamId::kCompute;
}

const char* node_name(NodeKind node) {
    switch (node) {
        case NodeKind::kEmbedding:
            return "embedding";
        case NodeKind::kPreDispatch:
            return "pre_dispatch";
        case NodeKind::kDispatch:
            return "dispatch";
        case NodeKind::kMlp:
            return "mlp";
        case NodeKind::kCombine:
            return "combine";
        case NodeKind::kOutput:
            return "output";
        case NodeKind::kGradReduce:
            return "grad_reduce";
        case NodeKind::kParamGather:
            return "param_gather";
        case NodeKind::kSendForward:
            return "send_forward";
        case NodeKind::kRecvForward:
            return "recv_forward";
        case NodeKind::kSendBackward:
            return "send_backward";
        case NodeKind::kRecvBackward:
            return "recv_backward";
    }
    return "?";
}

const char* phase_name(Phase phase) {
    switch (phase) {
        case Phase::kForward:
            return "forward";
        case Phase::kBackward:
            return "backward";
        case Phase::kBackwardDw:
            return "backward_dw";
    }
    return "?";
}

std::string call_name(const NodeCall& c) {
    if (c.stage >= 0) {
        NodeCall plain = c;
        plain.stage = plain.chunk = -1;
        return fmt::format("stage{}.chunk{}.{}", c.stage, c.chunk, call_name(plain));
    }
    if (is_pipeline_transfer(c.node)) {
        return fmt::format("mb{}.x{}.{}", c.micro_batch, c.layer, node_name(c.node));
    }
    if (c.node == NodeKind::kGradReduce || c.node == NodeKind::kParamGather) {
        return fmt::format("mb{}.bucket{}.{}", c.micro_batch, c.layer, node_name(c.node));
    }
    if (c.layer < 0) {
        return fmt::format("mb{}.{}.{}", c.micro_batch, node_name(c.node), phase_name(c.phase));
    }
    if (c.moe_chunk >= 0) {
        return fmt::format("mb{}.layer{}.{}.{}.chunk{}", c.micro_batch, c.layer, node_name(c.node),
                           phase_name(c.phase), c.moe_chunk);
    }
    return fmt::format("mb{}.layer{}.{}.{}", c.micro_batch, c.layer, node_name(c.node),
                       phase_name(c.phase));
}

int num_moe_chunks(const std::vector<NodeCall>& calls) {
    int n = 1;
    for (const NodeCall& c : calls)
        n = std::max(n, c.moe_chunk + 1);
    return n;
}

double overlap_speedup_cap(int num_micro_batches, int num_moe_chunks, bool pair_edges) {
    if (pair_edges && num_micro_batches >= 2)
        return 2.0;
    const double nc = static_cast<double>(num_micro_batches) * num_moe_chunks;
    return nc > 0 ? 2.0 * nc / (nc + 1.0) : 0.0;
}

namespace {

void check_schedule_shape(const ScheduleShape& shape) {
    if (shape.num_moe_chunks < 1) {
        throw std::invalid_argument(fmt::format(
            "num_moe_chunks {} must be at least 1 (1: whole micro-batches)", shape.num_moe_chunks));
    }
}

}  // namespace

std::vector<NodeCall> baseline_schedule(const ScheduleShape& shape) {
    check_schedule_shape(shape);
    Builder b{shape, {}};
    b.check_bucket_ends();
    for (int mb = 0; mb < shape.num_micro_batches; ++mb) {
        b.forward_alone(mb);
        b.backward_alone(mb, mb + 1 == shape.num_micro_batches);
    }
    return b.calls;
}

std::vector<NodeCall> overlap_schedule(const ScheduleShape& shape) {
    check_schedule_shape(shape);
    Builder b{shape, {}};
    b.pipelined = true;
    b.check_bucket_ends();
    const int n = shape.num_micro_batches;
    if (n <= 0)
        return {};
    if (shape.pair_edges && n >= 2) {
        b.forward_pair(0, 1);
        for (int i = 0; i + 2 < n; ++i)
            b.combined_step(i + 2, i, i + 1);
        b.backward_pair(n - 2, n - 1);
        return b.calls;
    }
    b.forward_alone(0);
    for (int i = 0; i + 1 < n; ++i)
        b.combined_step(i + 1, i);
    b.backward_alone(n - 1, true);
    return b.calls;
}

}  // namespace epo::schedule
