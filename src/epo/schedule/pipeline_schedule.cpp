#include "epo/schedule/pipeline_schedule.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>

namespace epo::schedule {
namespace {

int num_layers(const PipelineShape& s) {
    return static_cast<int>(s.moe_layers.size());
}

// Unit k of a stage (header formula).
PipelineUnit unit_of(const PipelineShape& s, int k, bool forward) {
    const int P = s.num_stages, V = s.num_chunks;
    const int group = k / (P * V), within = k % (P * V);
    const int chunk = within / P;
    return PipelineUnit{group * P + within % P, forward ? chunk : V - 1 - chunk};
}

// recompute_first: empty, or per layer -1 or the first layer of a run of consecutive layers
// inside one model chunk.
void check_recompute_groups(const PipelineShape& s) {
    const auto& g = s.recompute_first;
    if (g.empty())
        return;
    const int L = num_layers(s);
    if (g.size() != static_cast<size_t>(L)) {
        throw std::invalid_argument(fmt::format(
            "recompute_first has {} entries for {} layers (one per layer, or none)", g.size(), L));
    }
    for (int l = 0; l < L; ++l) {
        const int first = g[static_cast<size_t>(l)];
        if (first < 0)
            continue;
        const bool starts = first == l;
        const bool continues = l > 0 && first < l && g[static_cast<size_t>(l - 1)] == first &&
                               stage_of_position(s, first) == stage_of_position(s, l) &&
                               chunk_of_position(s, first) == chunk_of_position(s, l);
        if (!starts && !continues) {
            throw std::invalid_argument(fmt::format(
                "recompute_first[{}] = {}: a recompute group is a run of consecutive layers of "
                "one model chunk starting at its first layer",
                l, first));
        }
    }
}

void check_layout(const PipelineShape& s) {
    const int L = num_layers(s);
    if (s.layout.empty()) {
        if (L % (s.num_stages * s.num_chunks) != 0) {
            throw std::invalid_argument(fmt::format(
                "pipeline shape: {} layers do not split into PP {} x VPP {} equal chunks", L,
                s.num_stages, s.num_chunks));
        }
        return;
    }
    if (s.layout.size() != static_cast<size_t>(s.num_stages)) {
        throw std::invalid_argument(fmt::format("pipeline layout: {} stages given for PP {}",
                                                s.layout.size(), s.num_stages));
    }
    int next = 0;  // layers are consecutive in (chunk, stage) order
    for (int c = 0; c < s.num_chunks; ++c) {
        for (int st = 0; st < s.num_stages; ++st) {
            const auto& chunks = s.layout[static_cast<size_t>(st)];
            if (chunks.size() != static_cast<size_t>(s.num_chunks)) {
                throw std::invalid_argument(
                    fmt::format("pipeline layout: stage {} has {} model chunks for VPP {}", st,
                                chunks.size(), s.num_chunks));
            }
            const ChunkLayers& r = chunks[static_cast<size_t>(c)];
            if (r.first != next || r.end < r.first) {
                throw std::invalid_argument(fmt::format(
                    "pipeline layout: stage {} chunk {} holds layers [{}, {}), expected a range "
                    "starting at layer {}",
                    st, c, r.first, r.end, next));
            }
            next = r.end;
        }
    }
    if (next != L) {
        throw std::invalid_argument(
            fmt::format("pipeline layout: the chunks hold {} layers of {}", next, L));
    }
}

void check_bucket_ends(const PipelineShape& s, const std::vector<std::vector<int>>& all,
                       const char* name) {
    if (all.empty())
        return;
    if (all.size() != static_cast<size_t>(s.num_stages)) {
        throw std::invalid_argument(
            fmt::format("{}: {} stages given for PP {}", name, all.size(), s.num_stages));
    }
    for (int st = 0; st < s.num_stages; ++st) {
        const std::vector<int>& ends = all[static_cast<size_t>(st)];
        if (ends.empty())
            continue;
        const std::vector<int> positions = stage_positions(s, st);
        // Each end is a position of the stage, in the stage's backward order, the last its lowest.
        size_t at = 0;
        bool ok = ends.back() == positions.back();
        for (int e : ends) {
            while (at < positions.size() && positions[at] != e)
                ++at;
            ok = ok && at < positions.size();
            ++at;
        }
        if (!ok) {
            throw std::invalid_argument(
                fmt::format("{} [{}] must run strictly down from at most {} to {}{}", name,
                            fmt::join(ends, ", "), positions.front(), positions.back(),
                            s.num_stages > 1 ? fmt::format(" over stage {}'s positions", st) : ""));
        }
    }
}

}  // namespace

std::vector<int> stage_positions(const PipelineShape& s, int stage) {
    std::vector<int> out;
    if (stage == s.num_stages - 1)
        out.push_back(num_layers(s));
    for (int c = s.num_chunks - 1; c >= 0; --c) {
        const ChunkLayers r = chunk_layers(s, stage, c);
        for (int l = r.end - 1; l >= r.first; --l)
            out.push_back(l);
    }
    if (stage == 0)
        out.push_back(-1);
    return out;
}

void check_pipeline_shape(const PipelineShape& s) {
    if (s.num_stages < 1 || s.num_chunks < 1 || s.num_micro_batches < 1) {
        throw std::invalid_argument(fmt::format(
            "pipeline shape: stages {}, chunks {} and micro-batches {} must each be at least 1",
            s.num_stages, s.num_chunks, s.num_micro_batches));
    }
    if (s.num_moe_chunks < 1) {
        throw std::invalid_argument(fmt::format(
            "num_moe_chunks {} must be at least 1 (1: whole micro-batches)", s.num_moe_chunks));
    }
    check_layout(s);
    if (s.shared_expert_overlap && s.overlap) {
        throw std::invalid_argument(
            "shared-expert overlap with the EP-overlap schedule: the two exclude each other "
            "(rule EP011); set model.moe_shared_expert_overlap=false");
    }
    if (s.num_chunks > 1 && s.num_micro_batches % s.num_stages != 0) {
        throw std::invalid_argument(
            fmt::format("pipeline shape: the interleaved schedule runs micro-batches in groups "
                        "of PP = {}, and {} is not a multiple of it",
                        s.num_stages, s.num_micro_batches));
    }
    check_bucket_ends(s, s.stage_grad_bucket_ends, "grad_bucket_ends");
    check_bucket_ends(s, s.stage_param_bucket_ends, "param_bucket_ends");
    check_recompute_groups(s);
}

ChunkLayers chunk_layers(const PipelineShape& s, int stage, int chunk) {
    if (!s.layout.empty())
        return s.layout.at(static_cast<size_t>(stage)).at(static_cast<size_t>(chunk));
    const int n = num_layers(s) / (s.num_stages * s.num_chunks);
    const int block = chunk * s.num_stages + stage;
    return ChunkLayers{block * n, (block + 1) * n};
}

namespace {

// The (stage, chunk) holding position p (header).
std::pair<int, int> holder_of(const PipelineShape& s, int position) {
    if (position < 0)
        return {0, 0};
    if (position >= num_layers(s))
        return {s.num_stages - 1, s.num_chunks - 1};
    for (int c = 0; c < s.num_chunks; ++c) {
        for (int st = 0; st < s.num_stages; ++st) {
            const ChunkLayers r = chunk_layers(s, st, c);
            if (position >= r.first && position < r.end)
                return {st, c};
        }
    }
    throw std::invalid_argument(fmt::format("pipeline layout: no chunk holds layer {}", position));
}

}  // namespace

int stage_of_position(const PipelineShape& s, int position) {
    return holder_of(s, position).first;
}

int chunk_of_position(const PipelineShape& s, int position) {
    return holder_of(s, position).second;
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
    if (s.overlap && s.pair_edges)
        ++w;
    return std::min(w, total);
}

std::vector<PipelineStep> stage_steps(const PipelineShape& s, int stage) {
    check_pipeline_shape(s);
    const int total = s.num_micro_batches * s.num_chunks;
    const int w = num_warmup_units(s, stage);
    const bool pair = s.overlap && s.pair_edges;
    std::vector<PipelineStep> steps;
    // Warm-up forwards, two by two from the first when paired (same model chunk only).
    for (int k = 0; k < w; ++k) {
        PipelineStep st{.has_forward = true, .forward = unit_of(s, k, true)};
        if (pair && k + 1 < w && unit_of(s, k + 1, true).chunk == st.forward.chunk) {
            st.paired = true;
            st.second = unit_of(s, ++k, true);
        }
        steps.push_back(st);
    }
    for (int i = 0; i + w < total; ++i) {
        steps.push_back({.has_forward = true,
                         .has_backward = true,
                         .forward = unit_of(s, w + i, true),
                         .backward = unit_of(s, i, false)});
    }
    // Cool-down backwards, two by two up to the last when paired.
    const int first = std::max(total - w, 0);
    std::vector<PipelineStep> cool;
    for (int k = total - 1; k >= first; --k) {
        const PipelineUnit u = unit_of(s, k, false);
        if (pair && k - 1 >= first && unit_of(s, k - 1, false).chunk == u.chunk) {
            cool.push_back({.has_backward = true,
                            .backward = unit_of(s, k - 1, false),
                            .paired = true,
                            .second = u});
            --k;
        } else {
            cool.push_back({.has_backward = true, .backward = u});
        }
    }
    steps.insert(steps.end(), cool.rbegin(), cool.rend());
    return steps;
}

double ideal_bubble_fraction(const PipelineShape& s) {
    return static_cast<double>(s.num_stages - 1) /
           (static_cast<double>(s.num_chunks) * static_cast<double>(s.num_micro_batches));
}

}  // namespace epo::schedule
