#include "epo/schedule/pipeline_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

namespace epo::schedule {
namespace {

int num_layers(const PipelineShape& s) {
    return static_cast<int>(s.moe_layers.size());
}
int layers_per_chunk(const PipelineShape& s) {
    return num_layers(s) / (s.num_stages * s.num_chunks);
}
bool holds_embedding(const PipelineShape& s, int stage, int chunk) {
    return stage == 0 && chunk == 0;
}
bool holds_output(const PipelineShape& s, int stage, int chunk) {
    return stage == s.num_stages - 1 && chunk == s.num_chunks - 1;
}

// Unit k of a stage (header formula).
PipelineUnit unit_of(const PipelineShape& s, int k, bool forward) {
    const int P = s.num_stages, V = s.num_chunks;
    const int group = k / (P * V), within = k % (P * V);
    const int chunk = within / P;
    return PipelineUnit{group * P + within % P, forward ? chunk : V - 1 - chunk};
}

// What a stage has received (or made itself): the tick a unit's input became available.
// Key: (forward, micro-batch, chunk).
using Inputs = std::map<std::tuple<bool, int, int>, int>;

struct Emitter {
    const PipelineShape& shape;
    std::vector<std::vector<NodeCall>> calls;  // [stage]
    std::vector<Inputs> inputs;                // [stage]
    int tick = 0;

    void add(int stage, int chunk, int mb, int layer, NodeKind node, Phase phase,
             bool delayed = false) {
        NodeCall c{mb, layer, node, phase, delayed, -1};
        c.stage = stage;
        c.chunk = chunk;
        calls[static_cast<size_t>(stage)].push_back(c);
    }
    bool moe(int layer) const { return shape.moe_layers[static_cast<size_t>(layer)]; }

    bool ready(int stage, const PipelineUnit& u, bool forward) const {
        const auto& in = inputs[static_cast<size_t>(stage)];
        const auto it = in.find({forward, u.micro_batch, u.chunk});
        return it != in.end() && it->second < tick;
    }
    // The activations x[end] go to the next stage's chunk (the ring's next chunk after the last
    // stage); the transfer is appended to both lists at once (header: deadlock freedom).
    void send_forward(int stage, const PipelineUnit& u, int position) {
        const int P = shape.num_stages;
        const int to = (stage + 1) % P, to_chunk = stage == P - 1 ? u.chunk + 1 : u.chunk;
        add(stage, u.chunk, u.micro_batch, position, NodeKind::kSendForward, Phase::kForward);
        add(to, to_chunk, u.micro_batch, position, NodeKind::kRecvForward, Phase::kForward);
        inputs[static_cast<size_t>(to)][{true, u.micro_batch, to_chunk}] = tick;
    }
    void send_backward(int stage, const PipelineUnit& u, int position) {
        const int P = shape.num_stages;
        const int to = (stage + P - 1) % P, to_chunk = stage == 0 ? u.chunk - 1 : u.chunk;
        add(stage, u.chunk, u.micro_batch, position, NodeKind::kSendBackward, Phase::kBackward);
        add(to, to_chunk, u.micro_batch, position, NodeKind::kRecvBackward, Phase::kBackward);
        inputs[static_cast<size_t>(to)][{false, u.micro_batch, to_chunk}] = tick;
    }

    void forward_alone(int s, const PipelineUnit& u) {
        const ChunkLayers c = chunk_layers(shape, s, u.chunk);
        const int mb = u.micro_batch;
        if (holds_embedding(shape, s, u.chunk))
            add(s, u.chunk, mb, -1, NodeKind::kEmbedding, Phase::kForward);
        for (int l = c.first; l < c.end; ++l) {
            add(s, u.chunk, mb, l, NodeKind::kPreDispatch, Phase::kForward);
            if (moe(l))
                add(s, u.chunk, mb, l, NodeKind::kDispatch, Phase::kForward);
            add(s, u.chunk, mb, l, NodeKind::kMlp, Phase::kForward);
            if (moe(l))
                add(s, u.chunk, mb, l, NodeKind::kCombine, Phase::kForward);
        }
        finish_forward(s, u, c);
    }
    void finish_forward(int s, const PipelineUnit& u, const ChunkLayers& c) {
        if (holds_output(shape, s, u.chunk)) {
            add(s, u.chunk, u.micro_batch, -1, NodeKind::kOutput, Phase::kForward);
            // The output position's backward needs nothing from another stage.
            inputs[static_cast<size_t>(s)][{false, u.micro_batch, u.chunk}] = -1;
        } else {
            send_forward(s, u, c.end);
        }
    }
    // Weight gradients are part of each backward call outside the merged steps (schedule.h).
    void backward_alone(int s, const PipelineUnit& u) {
        const ChunkLayers c = chunk_layers(shape, s, u.chunk);
        const int mb = u.micro_batch;
        if (holds_output(shape, s, u.chunk))
            add(s, u.chunk, mb, -1, NodeKind::kOutput, Phase::kBackward);
        for (int l = c.end - 1; l >= c.first; --l) {
            if (moe(l))
                add(s, u.chunk, mb, l, NodeKind::kCombine, Phase::kBackward);
            add(s, u.chunk, mb, l, NodeKind::kMlp, Phase::kBackward);
            if (moe(l))
                add(s, u.chunk, mb, l, NodeKind::kDispatch, Phase::kBackward);
            add(s, u.chunk, mb, l, NodeKind::kPreDispatch, Phase::kBackward);
        }
        if (holds_embedding(shape, s, u.chunk)) {
            add(s, u.chunk, mb, -1, NodeKind::kEmbedding, Phase::kBackward);
        } else {
            send_backward(s, u, c.first);
        }
    }
    // A merged step: schedule.h's ten-step pair order over the chunk's layers, layer first + j of
    // the forward with layer end - 1 - j of the backward (both chunks hold the same number).
    void combined(int s, const PipelineUnit& fu, const PipelineUnit& bu) {
        const ChunkLayers fc = chunk_layers(shape, s, fu.chunk);
        const ChunkLayers bc = chunk_layers(shape, s, bu.chunk);
        const int f = fu.micro_batch, b = bu.micro_batch, cf = fu.chunk, cb = bu.chunk;
        const bool delay = shape.delay_wgrad;
        if (holds_embedding(shape, s, cf))
            add(s, cf, f, -1, NodeKind::kEmbedding, Phase::kForward);
        if (holds_output(shape, s, cb))
            add(s, cb, b, -1, NodeKind::kOutput, Phase::kBackward);
        for (int j = 0; j < fc.end - fc.first; ++j) {
            const int fl = fc.first + j, bl = bc.end - 1 - j;
            if (moe(bl))
                add(s, cb, b, bl, NodeKind::kCombine, Phase::kBackward);  // 1
            add(s, cf, f, fl, NodeKind::kPreDispatch, Phase::kForward);   // 2
            add(s, cb, b, bl, NodeKind::kMlp, Phase::kBackward, delay);   // 3
            if (moe(fl))
                add(s, cf, f, fl, NodeKind::kDispatch, Phase::kForward);  // 4
            if (delay)
                add(s, cb, b, bl, NodeKind::kMlp, Phase::kBackwardDw);  // 5
            if (moe(bl))
                add(s, cb, b, bl, NodeKind::kDispatch, Phase::kBackward);  // 6
            add(s, cf, f, fl, NodeKind::kMlp, Phase::kForward);            // 7
            if (moe(fl))
                add(s, cf, f, fl, NodeKind::kCombine, Phase::kForward);          // 8
            add(s, cb, b, bl, NodeKind::kPreDispatch, Phase::kBackward, delay);  // 9
            if (delay && bl != bc.first)
                add(s, cb, b, bl, NodeKind::kPreDispatch, Phase::kBackwardDw);  // 10
        }
        finish_forward(s, fu, fc);
        if (holds_embedding(shape, s, cb))
            add(s, cb, b, -1, NodeKind::kEmbedding, Phase::kBackward);
        // The chunk's first layer's delayed attention wgrad after the chunk, as schedule.h's
        // combined step does; before the gradient's send, which waits for the micro-batch's
        // previous call (executor.h) either way.
        if (delay && bc.end > bc.first)
            add(s, cb, b, bc.first, NodeKind::kPreDispatch, Phase::kBackwardDw);
        if (!holds_embedding(shape, s, cb))
            send_backward(s, bu, bc.first);
    }

    bool step_ready(int s, const PipelineStep& st) const {
        const bool f = !st.has_forward || holds_embedding(shape, s, st.forward.chunk) ||
                       ready(s, st.forward, true);
        const bool b = !st.has_backward || ready(s, st.backward, false);
        return f && b;
    }
    void emit(int s, const PipelineStep& st) {
        if (st.has_forward && st.has_backward && shape.overlap) {
            combined(s, st.forward, st.backward);
            return;
        }
        if (st.has_forward)
            forward_alone(s, st.forward);
        if (st.has_backward)
            backward_alone(s, st.backward);
    }
};

}  // namespace

void check_pipeline_shape(const PipelineShape& s) {
    const int L = num_layers(s);
    if (s.num_stages < 1 || s.num_chunks < 1 || s.num_micro_batches < 1) {
        throw std::invalid_argument(fmt::format(
            "pipeline shape: stages {}, chunks {} and micro-batches {} must each be at least 1",
            s.num_stages, s.num_chunks, s.num_micro_batches));
    }
    if (L % (s.num_stages * s.num_chunks) != 0) {
        throw std::invalid_argument(
            fmt::format("pipeline shape: {} layers do not split into PP {} x VPP {} equal chunks",
                        L, s.num_stages, s.num_chunks));
    }
    if (s.num_chunks > 1 && s.num_micro_batches % s.num_stages != 0) {
        throw std::invalid_argument(
            fmt::format("pipeline shape: the interleaved schedule runs micro-batches in groups "
                        "of PP = {}, and {} is not a multiple of it",
                        s.num_stages, s.num_micro_batches));
    }
}

ChunkLayers chunk_layers(const PipelineShape& s, int stage, int chunk) {
    const int n = layers_per_chunk(s);
    const int block = chunk * s.num_stages + stage;
    return ChunkLayers{block * n, (block + 1) * n};
}

int stage_of_position(const PipelineShape& s, int position) {
    if (position < 0)
        return 0;
    if (position >= num_layers(s))
        return s.num_stages - 1;
    return (position / layers_per_chunk(s)) % s.num_stages;
}

int chunk_of_position(const PipelineShape& s, int position) {
    if (position < 0)
        return 0;
    if (position >= num_layers(s))
        return s.num_chunks - 1;
    return (position / layers_per_chunk(s)) / s.num_stages;
}

int num_warmup_units(const PipelineShape& s, int stage) {
    const int P = s.num_stages, V = s.num_chunks, M = s.num_micro_batches;
    const int total = M * V;
    int w = 0;
    if (V == 1) {
        w = P - stage - 1;
    } else if (M == P) {
        w = total;
    } else {
        w = 2 * (P - stage - 1) + (V - 1) * P;
    }
    if (s.overlap)
        ++w;
    return std::min(w, total);
}

std::vector<PipelineStep> stage_steps(const PipelineShape& s, int stage) {
    check_pipeline_shape(s);
    const int total = s.num_micro_batches * s.num_chunks;
    const int w = num_warmup_units(s, stage);
    std::vector<PipelineStep> steps;
    for (int k = 0; k < w; ++k)
        steps.push_back({.has_forward = true, .forward = unit_of(s, k, true)});
    for (int i = 0; i + w < total; ++i) {
        steps.push_back({.has_forward = true,
                         .has_backward = true,
                         .forward = unit_of(s, w + i, true),
                         .backward = unit_of(s, i, false)});
    }
    for (int k = std::max(total - w, 0); k < total; ++k)
        steps.push_back({.has_backward = true, .backward = unit_of(s, k, false)});
    return steps;
}

std::vector<std::vector<NodeCall>> pipeline_schedules(const PipelineShape& shape) {
    check_pipeline_shape(shape);
    const auto P = static_cast<size_t>(shape.num_stages);
    std::vector<std::vector<PipelineStep>> steps(P);
    for (size_t s = 0; s < P; ++s) {
        // Emitted one unit per tick, unless merged: a baseline step's backward may need what
        // its forward has just sent on (the last stage's own output, another stage's reply).
        for (const PipelineStep& st : stage_steps(shape, static_cast<int>(s))) {
            if (st.has_forward && st.has_backward && !shape.overlap) {
                steps[s].push_back({.has_forward = true, .forward = st.forward});
                steps[s].push_back({.has_backward = true, .backward = st.backward});
            } else {
                steps[s].push_back(st);
            }
        }
    }
    Emitter e{shape, std::vector<std::vector<NodeCall>>(P), std::vector<Inputs>(P)};
    std::vector<size_t> next(P, 0);
    const auto done = [&] {
        for (size_t s = 0; s < P; ++s)
            if (next[s] < steps[s].size())
                return false;
        return true;
    };
    for (; !done(); ++e.tick) {
        bool progressed = false;
        for (size_t s = 0; s < P; ++s) {
            if (next[s] < steps[s].size() && e.step_ready(static_cast<int>(s), steps[s][next[s]])) {
                e.emit(static_cast<int>(s), steps[s][next[s]]);
                ++next[s];
                progressed = true;
            }
        }
        if (!progressed) {
            // A unit order whose inputs never arrive: a bug in stage_steps, not bad input.
            throw std::logic_error(fmt::format(
                "pipeline schedule (PP {}, VPP {}, {} micro-batches) is stuck at tick {}",
                shape.num_stages, shape.num_chunks, shape.num_micro_batches, e.tick));
        }
    }
    return e.calls;
}

double ideal_bubble_fraction(const PipelineShape& s) {
    return static_cast<double>(s.num_stages - 1) /
           (static_cast<double>(s.num_chunks) * static_cast<double>(s.num_micro_batches));
}

}  // namespace epo::schedule
