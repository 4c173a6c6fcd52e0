#include "epo/config/pipeline_layout.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdint>
#include <variant>

#include "epo/config/config.h"
#include "epo/core/error.h"

namespace epo::config {
namespace {

constexpr const char* kLayoutField = "model.pipeline_model_parallel_layout";
constexpr double kMaxExpanded = 1 << 20;

Finding finding(std::string field, std::string value, std::string message, std::string fix) {
    return Finding{"LY005", std::move(field), std::move(value), std::move(message), std::move(fix)};
}

using Built = std::variant<PipelineLayout, Finding>;

// Chunk sizes [stage][chunk] to a layout: layers consecutive in (chunk, stage) order.
PipelineLayout from_counts(const std::vector<std::vector<int>>& counts, int mtp) {
    PipelineLayout out;
    out.num_stages = static_cast<int>(counts.size());
    out.num_chunks = static_cast<int>(counts[0].size());
    out.chunks.assign(counts.size(), std::vector<ModelChunk>(counts[0].size()));
    int next = 0;
    for (int c = 0; c < out.num_chunks; ++c) {
        for (int s = 0; s < out.num_stages; ++s) {
            ModelChunk& ch = out.chunks[static_cast<size_t>(s)][static_cast<size_t>(c)];
            ch.first_layer = next;
            ch.num_layers = counts[static_cast<size_t>(s)][static_cast<size_t>(c)];
            next += ch.num_layers;
        }
    }
    out.chunks.front().front().embedding = true;
    out.chunks.back().back().loss = true;
    out.chunks.back().back().num_mtp_layers = mtp;
    return out;
}

// "(...)*n" groups expanded; the rest copied. Position `i` advances past what was read.
std::optional<std::string> expand(const std::string& s, size_t& i, int depth, std::string& error) {
    std::string out;
    while (i < s.size()) {
        const char ch = s[i];
        if (ch == '(') {
            ++i;
            const std::optional<std::string> inner = expand(s, i, depth + 1, error);
            if (!inner)
                return std::nullopt;
            if (i >= s.size() || s[i] != ')') {
                error = fmt::format("'(' at {} is never closed", i);
                return std::nullopt;
            }
            ++i;
            int times = 1;
            if (i < s.size() && s[i] == '*') {
                ++i;
                size_t digits = 0;
                times = 0;
                while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
                    times = times * 10 + (s[i] - '0');
                    ++i;
                    ++digits;
                    if (times > 100000)
                        break;
                }
                if (digits == 0 || times < 1) {
                    error = "a repetition needs a count of 1 or more after '*', as in (tt|)*6";
                    return std::nullopt;
                }
            }
            // A layout names each of at most a few thousand layers: refuse a repetition that
            // would expand past that before building it.
            if (static_cast<double>(inner->size()) * times + static_cast<double>(out.size()) >
                kMaxExpanded) {
                error = fmt::format("the layout expands to more than {} characters", kMaxExpanded);
                return std::nullopt;
            }
            for (int r = 0; r < times; ++r)
                out += *inner;
        } else if (ch == ')') {
            if (depth == 0) {
                error = fmt::format("')' at {} closes no group", i);
                return std::nullopt;
            }
            return out;
        } else if (ch == 'E' || ch == 't' || ch == 'm' || ch == 'L' || ch == '|') {
            out += ch;
            ++i;
        } else if (std::isspace(static_cast<unsigned char>(ch))) {
            ++i;
        } else {
            error = fmt::format("'{}' at {} is not one of E t m L | ( ) *", ch, i);
            return std::nullopt;
        }
    }
    return out;
}

Built from_layout_string(const ModelConfig& m, const std::string& text) {
    const int P = m.pipeline_model_parallel_size, mtp = m.mtp_num_layers.value_or(0);
    const auto bad = [&](std::string why) {
        return finding(kLayoutField, text, std::move(why),
                       "write one segment per (stage, model chunk), e.g. Ett|(tt|)*6mL for PP 4 "
                       "x VPP 2 over 14 layers and one MTP layer");
    };
    std::string error;
    size_t i = 0;
    const std::optional<std::string> flat = expand(text, i, 0, error);
    if (!flat)
        return bad(error);
    std::vector<std::string> segments(1);
    for (char ch : *flat) {
        if (ch == '|')
            segments.emplace_back();
        else
            segments.back() += ch;
    }
    const int n = static_cast<int>(segments.size());
    if (n % P != 0)
        return bad(fmt::format("{} segments do not split over PP {} stages", n, P));
    const int V = n / P;
    if (m.virtual_pipeline_model_parallel_size && *m.virtual_pipeline_model_parallel_size != V) {
        return finding(
            "model.virtual_pipeline_model_parallel_size",
            std::to_string(*m.virtual_pipeline_model_parallel_size),
            fmt::format("the layout {} has {} segments over PP {}, so VPP {}", text, n, P, V),
            fmt::format("set virtual_pipeline_model_parallel_size={} or null", V));
    }
    std::vector<std::vector<int>> counts(static_cast<size_t>(P), std::vector<int>(V, 0));
    int layers = 0, mtps = 0, embeddings = 0, losses = 0;
    for (int k = 0; k < n; ++k) {
        const std::string& seg = segments[static_cast<size_t>(k)];
        for (char ch : seg) {
            layers += ch == 't';
            counts[static_cast<size_t>(k % P)][static_cast<size_t>(k / P)] += ch == 't';
            if (ch == 'm') {
                ++mtps;
                if (k % P != P - 1)
                    return bad(
                        fmt::format("an MTP layer (m) in segment {}, stage {}: MTP "
                                    "layers belong to the last stage",
                                    k, k % P));
            }
            if (ch == 'E' && (++embeddings, k != 0))
                return bad(
                    fmt::format("the embedding (E) in segment {}: it belongs to the first", k));
            if (ch == 'L' && (++losses, k != n - 1))
                return bad(fmt::format("the loss (L) in segment {}: it belongs to the last", k));
        }
    }
    if (layers != m.num_layers) {
        return bad(fmt::format("the layout holds {} transformer layers (t), model.num_layers is {}",
                               layers, m.num_layers));
    }
    if (mtps != mtp) {
        return bad(fmt::format("the layout holds {} MTP layers (m), model.mtp_num_layers is {}",
                               mtps, mtp));
    }
    if (embeddings != 1 || losses != 1) {
        return bad(
            fmt::format("the layout holds {} embedding(s) (E) and {} loss(es) (L); it "
                        "needs one of each",
                        embeddings, losses));
    }
    PipelineLayout out = from_counts(counts, mtp);
    out.even = false;
    return out;
}

Built from_first_last(const ModelConfig& m) {
    const int P = m.pipeline_model_parallel_size, V = virtual_pipeline_size(m);
    int middle = P, rest = m.num_layers;
    std::vector<int> per_stage(static_cast<size_t>(P), 0);
    const auto edge = [&](const std::optional<int>& value, const char* field,
                          int stage) -> std::optional<Finding> {
        if (!value)
            return std::nullopt;
        if (*value <= 0)
            return finding(field, std::to_string(*value), "must be larger than 0",
                           "give the stage's layer count (1 or more), or null for an even split");
        if (*value % V != 0)
            return finding(field, std::to_string(*value),
                           fmt::format("must be divisible by the virtual pipeline size {}", V),
                           fmt::format("choose a multiple of {}", V));
        per_stage[static_cast<size_t>(stage)] = *value;
        rest -= *value;
        --middle;
        return std::nullopt;
    };
    if (P < 2) {
        return finding(m.num_layers_in_first_pipeline_stage
                           ? "model.num_layers_in_first_pipeline_stage"
                           : "model.num_layers_in_last_pipeline_stage",
                       std::to_string(m.num_layers_in_first_pipeline_stage.value_or(
                           m.num_layers_in_last_pipeline_stage.value_or(0))),
                       "an uneven first or last stage needs pipeline parallelism",
                       "set model.pipeline_model_parallel_size >= 2, or null the stage sizes");
    }
    if (auto f = edge(m.num_layers_in_first_pipeline_stage,
                      "model.num_layers_in_first_pipeline_stage", 0))
        return *f;
    if (auto f = edge(m.num_layers_in_last_pipeline_stage,
                      "model.num_layers_in_last_pipeline_stage", P - 1))
        return *f;
    const std::string value = std::to_string(m.num_layers);
    if (rest < 0 || (middle == 0 && rest != 0) || (middle > 0 && rest % middle != 0) ||
        (middle > 0 && (rest / middle) % V != 0) || (middle > 0 && rest == 0)) {
        return finding(
            "model.num_layers", value,
            fmt::format("the first and last stages take {} of {} layers, leaving {} for {} "
                        "middle stage(s): each needs the same count, a multiple of VPP {} and "
                        "at least one",
                        m.num_layers - rest, m.num_layers, rest, middle, V),
            "choose first / last stage sizes that leave the middle stages an equal multiple of "
            "VPP");
    }
    std::vector<std::vector<int>> counts;
    for (int s = 0; s < P; ++s) {
        const bool set = (s == 0 && m.num_layers_in_first_pipeline_stage) ||
                         (s == P - 1 && m.num_layers_in_last_pipeline_stage);
        const int layers = set ? per_stage[static_cast<size_t>(s)] : rest / middle;
        counts.emplace_back(static_cast<size_t>(V), layers / V);
    }
    PipelineLayout out = from_counts(counts, m.mtp_num_layers.value_or(0));
    out.even = false;
    return out;
}

Built from_accounting(const ModelConfig& m) {
    const int P = m.pipeline_model_parallel_size, V = virtual_pipeline_size(m);
    const int e = m.account_for_embedding_in_pipeline_split ? 1 : 0;
    const int l = m.account_for_loss_in_pipeline_split ? 1 : 0;
    const int slots = m.num_layers + e + l;
    if (slots % P != 0 || (slots / P) % V != 0) {
        return finding("model.num_layers", std::to_string(m.num_layers),
                       fmt::format("{} layers with the embedding and loss counted ({}) do not "
                                   "split evenly over PP {} x VPP {}",
                                   m.num_layers, slots, P, V),
                       "make num_layers + the accounted embedding / loss a multiple of PP x VPP");
    }
    const int per = slots / (P * V);
    std::vector<std::vector<int>> counts(static_cast<size_t>(P),
                                         std::vector<int>(static_cast<size_t>(V), per));
    counts.front().front() -= e;
    counts.back().back() -= l;
    PipelineLayout out = from_counts(counts, m.mtp_num_layers.value_or(0));
    out.even = false;
    return out;
}

Built build(const ModelConfig& m) {
    // More model chunks than layers (and the embedding and loss) never split: the reference's
    // divisibility rule fails, and nothing below allocates PP x VPP chunks for it.
    const int64_t chunks = int64_t{m.pipeline_model_parallel_size} * virtual_pipeline_size(m);
    if (chunks > int64_t{m.num_layers} + 2) {
        return finding("model.pipeline_model_parallel_size",
                       std::to_string(m.pipeline_model_parallel_size),
                       fmt::format("PP {} x VPP {} = {} model chunks for {} layers",
                                   m.pipeline_model_parallel_size, virtual_pipeline_size(m), chunks,
                                   m.num_layers),
                       "use at most as many pipeline stages (times VPP) as layers");
    }
    const bool first_last =
        m.num_layers_in_first_pipeline_stage || m.num_layers_in_last_pipeline_stage;
    const bool accounting =
        m.account_for_embedding_in_pipeline_split || m.account_for_loss_in_pipeline_split;
    if (m.pipeline_model_parallel_layout) {
        if (first_last || accounting) {
            return finding(kLayoutField, *m.pipeline_model_parallel_layout,
                           "a layout string says where every layer goes: it cannot be combined "
                           "with num_layers_in_first/last_pipeline_stage or "
                           "account_for_embedding/loss_in_pipeline_split",
                           "keep the layout and null the others, or drop the layout");
        }
        return from_layout_string(m, *m.pipeline_model_parallel_layout);
    }
    if (first_last && accounting) {
        return finding("model.account_for_embedding_in_pipeline_split",
                       m.account_for_embedding_in_pipeline_split ? "true" : "false",
                       "num_layers_in_first/last_pipeline_stage and account_for_embedding/"
                       "loss_in_pipeline_split cannot be set together",
                       "use one way of making the split uneven");
    }
    if (first_last)
        return from_first_last(m);
    if (accounting)
        return from_accounting(m);
    const int P = m.pipeline_model_parallel_size, V = virtual_pipeline_size(m);
    if (P * V > 1 && m.num_layers % (P * V) != 0) {
        return finding("model.num_layers", std::to_string(m.num_layers),
                       fmt::format("{} layers cannot be split evenly over PP {} x VPP {} = {} "
                                   "model chunks",
                                   m.num_layers, P, V, P * V),
                       "make model.num_layers a multiple of PP x VPP, or make the split uneven: "
                       "account_for_embedding_in_pipeline_split / "
                       "account_for_loss_in_pipeline_split, num_layers_in_first/"
                       "last_pipeline_stage, or pipeline_model_parallel_layout");
    }
    const int per = P * V > 0 ? m.num_layers / (P * V) : m.num_layers;
    return from_counts(std::vector<std::vector<int>>(static_cast<size_t>(std::max(1, P)),
                                                     std::vector<int>(std::max(1, V), per)),
                       m.mtp_num_layers.value_or(0));
}

}  // namespace

int PipelineLayout::stage_layers(int stage) const {
    int n = 0;
    for (const ModelChunk& c : chunks.at(static_cast<size_t>(stage)))
        n += c.num_layers;
    return n;
}

std::optional<Finding> check_pipeline_layout(const ModelConfig& m) {
    if (m.pipeline_model_parallel_size < 1 || m.num_layers < 1 || virtual_pipeline_size(m) < 1)
        return std::nullopt;  // VA001 reports the sizes themselves
    Built b = build(m);
    if (auto* f = std::get_if<Finding>(&b))
        return *f;
    return std::nullopt;
}

PipelineLayout pipeline_layout(const ModelConfig& m) {
    Built b = build(m);
    if (auto* f = std::get_if<Finding>(&b)) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("{} = {}: {}; {}", f->field, f->value, f->message, f->fix));
    }
    return std::get<PipelineLayout>(b);
}

}  // namespace epo::config
