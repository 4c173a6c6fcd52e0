#include "epo/moe/flex_layout.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "epo/core/error.h"
#include "epo/kernels/rows.h"

namespace epo::moe::flex {
namespace {

std::int32_t float_bits(float f) {
    std::int32_t i = 0;
    std::memcpy(&i, &f, sizeof i);
    return i;
}
float bits_float(std::int32_t i) {
    float f = 0;
    std::memcpy(&f, &i, sizeof f);
    return f;
}

// Expert of plan row r (rows are grouped by expert).
std::int64_t expert_of_row(const DispatchPlan& plan, std::int64_t r) {
    const auto it = std::upper_bound(plan.expert_begin.begin(), plan.expert_begin.end(), r);
    return (it - plan.expert_begin.begin()) - 1;
}

struct Entry {
    std::int32_t code;
    std::int32_t slot;  // -1 for a padding row
    float weight;
};

}  // namespace

int flex_ranks_per_node(int ep_size, int gpus_per_node) {
    if (ep_size < 1 || gpus_per_node < 1 ||
        (gpus_per_node % ep_size != 0 && ep_size % gpus_per_node != 0)) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("comm.gpus_per_node={} with expert_model_parallel_size={}: the "
                                "flex dispatcher needs each expert-parallel group to be whole "
                                "nodes or to sit inside one node (one divides the other): choose "
                                "gpus_per_node dividing {} or a multiple of it, or use "
                                "moe_token_dispatcher_type=alltoall",
                                gpus_per_node, ep_size, ep_size));
    }
    return std::min(ep_size, gpus_per_node);
}

Geometry make_geometry(const MoeConfig& cfg, int ep_size, int ranks_per_node) {
    EPO_CHECK(ranks_per_node >= 1 && ep_size % ranks_per_node == 0,
              "{} EP ranks in nodes of {} ranks", ep_size, ranks_per_node);
    EPO_CHECK(cfg.num_experts % ep_size == 0, "{} experts over an expert-parallel group of {}",
              cfg.num_experts, ep_size);
    Geometry g;
    g.ranks_per_node = ranks_per_node;
    g.num_nodes = ep_size / ranks_per_node;
    g.num_experts = cfg.num_experts;
    g.local_experts = cfg.num_experts / ep_size;
    const std::int64_t per_node = cfg.num_experts / g.num_nodes;
    g.positions = cfg.pad_to_capacity ? per_node : std::min(cfg.topk, per_node);
    return g;
}

InterNodeCopies& InterNodeCopies::operator+=(const InterNodeCopies& o) {
    tokens += o.tokens;
    flex += o.flex;
    alltoall += o.alltoall;
    return *this;
}

InterNodeCopies operator-(InterNodeCopies a, const InterNodeCopies& b) {
    a.tokens -= b.tokens;
    a.flex -= b.flex;
    a.alltoall -= b.alltoall;
    return a;
}

InterNodeCopies inter_node_copies(const Geometry& g, const SourceLayout& s, std::int64_t num_tokens,
                                  int ep_rank) {
    const std::int64_t MW = meta_width(g);
    const int own = g.node_of_rank(ep_rank);
    InterNodeCopies c;
    c.tokens = num_tokens;
    std::int64_t m = 0;  // messages are node-major
    for (int node = 0; node < g.num_nodes; ++node) {
        const std::int64_t end = m + s.node_counts[static_cast<std::size_t>(node)];
        for (; m < end; ++m) {
            if (node == own)
                continue;
            ++c.flex;
            const std::int32_t* codes = s.meta.data() + m * MW;
            for (std::int64_t p = 0; p < g.positions; ++p)
                c.alltoall += codes[p] >= 0 ? 1 : 0;
        }
    }
    return c;
}

SourceLayout make_source_layout(const Geometry& g, const DispatchPlan& plan,
                                const Tensor& topk_index, const Tensor& topk_weight, int ep_rank) {
    const std::int64_t T = plan.num_tokens, K = plan.topk, W = g.positions, MW = meta_width(g);
    const int N = g.num_nodes, P = g.ranks_per_node;
    const std::int32_t* idx = topk_index.data<std::int32_t>();
    const float* weight = topk_weight.data<float>();
    const std::int32_t* slot_row = plan.slot_row.data<std::int32_t>();
    const std::int32_t* row_slot = plan.row_slot.data<std::int32_t>();
    const std::int32_t* row_token = plan.row_token.data<std::int32_t>();

    // Padding rows of each token, experts ascending (capacity padding only).
    std::vector<std::vector<std::int32_t>> pads(static_cast<std::size_t>(T));
    for (std::int64_t r = 0; r < plan.num_rows; ++r) {
        if (row_slot[r] < 0)
            pads[row_token[r]].push_back(static_cast<std::int32_t>(expert_of_row(plan, r)));
    }

    SourceLayout s;
    s.node_counts.assign(static_cast<std::size_t>(N), 0);
    s.token_msg.assign(static_cast<std::size_t>(T * N), -1);
    std::vector<Entry> entries;
    for (int m = 0; m < N; ++m) {
        for (std::int64_t t = 0; t < T; ++t) {
            entries.clear();
            for (int i = 0; i < P; ++i) {
                const int rank = m * P + i;
                for (std::int64_t q = 0; q < K; ++q) {
                    const std::int64_t slot = t * K + q;
                    if (slot_row[slot] >= 0 && g.rank_of_expert(idx[slot]) == rank)
                        entries.push_back(
                            {idx[slot], static_cast<std::int32_t>(slot), weight[slot]});
                }
                for (std::int32_t e : pads[t]) {
                    if (g.rank_of_expert(e) == rank)
                        entries.push_back({static_cast<std::int32_t>(g.num_experts + e), -1, 0.0f});
                }
            }
            if (entries.empty())
                continue;
            EPO_CHECK(static_cast<std::int64_t>(entries.size()) <= W,
                      "token {}: {} entries for node {}, room for {}", t, entries.size(), m, W);
            s.token_msg[t * N + m] = static_cast<std::int32_t>(s.msg_token.size());
            s.msg_token.push_back(static_cast<std::int32_t>(t));
            ++s.node_counts[m];
            const std::size_t base = s.meta.size();
            s.meta.resize(base + MW, -1);
            s.entry_slot.resize(s.entry_slot.size() + W, -1);
            std::int32_t* meta = s.meta.data() + base;
            std::int32_t* slots = s.entry_slot.data() + s.entry_slot.size() - W;
            bool real = false;
            for (std::size_t p = 0; p < entries.size(); ++p) {
                meta[p] = entries[p].code;
                slots[p] = entries[p].slot;
                real |= entries[p].slot >= 0;
            }
            for (std::int64_t p = 0; p < W; ++p) {
                meta[W + p] = float_bits(
                    p < static_cast<std::int64_t>(entries.size()) ? entries[p].weight : 0.0f);
            }
            meta[2 * W] = ep_rank;
            meta[2 * W + 1] = static_cast<std::int32_t>(t);
            s.msg_real.push_back(real);
        }
    }
    return s;
}

ForwardLayout make_forward_layout(const Geometry& g, const std::vector<std::int32_t>& meta,
                                  int node) {
    const std::int64_t W = g.positions, MW = meta_width(g), E = g.num_experts;
    const int P = g.ranks_per_node;
    const std::int64_t Mf = static_cast<std::int64_t>(meta.size()) / MW;
    // Local rank of each position's code, -1 for an empty one.
    auto local_of = [&](std::int32_t code) {
        if (code < 0)
            return -1;
        const int rank = g.rank_of_expert(expert_of_code(code, E));
        EPO_CHECK(g.node_of_rank(rank) == node, "a message for EP rank {} reached node {}", rank,
                  node);
        return rank % P;
    };
    std::vector<std::vector<std::int32_t>> by_rank(static_cast<std::size_t>(P));
    for (std::int64_t f = 0; f < Mf; ++f) {
        std::vector<char> seen(static_cast<std::size_t>(P), 0);
        for (std::int64_t p = 0; p < W; ++p) {
            const int i = local_of(meta[f * MW + p]);
            if (i >= 0 && !seen[i]) {
                seen[i] = 1;
                by_rank[i].push_back(static_cast<std::int32_t>(f));
            }
        }
    }
    ForwardLayout fw;
    fw.rank_counts.assign(static_cast<std::size_t>(P), 0);
    fw.msg_unit.assign(static_cast<std::size_t>(Mf * P), -1);
    for (int i = 0; i < P; ++i) {
        fw.rank_counts[i] = static_cast<std::int64_t>(by_rank[i].size());
        for (std::int32_t f : by_rank[i]) {
            fw.msg_unit[f * P + i] = static_cast<std::int32_t>(fw.unit_msg.size());
            fw.unit_msg.push_back(f);
            const std::int32_t* src = meta.data() + f * MW;
            const std::size_t base = fw.unit_meta.size();
            fw.unit_meta.insert(fw.unit_meta.end(), src, src + MW);
            std::int32_t* dst = fw.unit_meta.data() + base;
            bool real = false;
            for (std::int64_t p = 0; p < W; ++p) {
                if (local_of(dst[p]) != i) {
                    dst[p] = -1;  // another rank's position
                    dst[W + p] = float_bits(0.0f);
                } else {
                    real |= dst[p] < E;
                }
            }
            fw.unit_real.push_back(real);
        }
    }
    return fw;
}

ReceiveLayout make_receive_layout(const Geometry& g, const std::vector<std::int32_t>& meta,
                                  int ep_rank) {
    const std::int64_t W = g.positions, MW = meta_width(g), E = g.num_experts, L = g.local_experts;
    const std::int64_t Ur = static_cast<std::int64_t>(meta.size()) / MW;
    const std::int64_t first = ep_rank * L;
    // Units by source EP rank: a source's units come from one forwarder, in token order, so a
    // stable sort gives alltoall's order (source ranks ascending, tokens ascending).
    std::vector<std::int32_t> order(static_cast<std::size_t>(Ur));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
        return meta[a * MW + 2 * W] < meta[b * MW + 2 * W];
    });
    ReceiveLayout rl;
    rl.unit_real.assign(static_cast<std::size_t>(Ur), 0);
    std::vector<std::int64_t> counts(static_cast<std::size_t>(L), 0);
    for (std::int64_t u = 0; u < Ur; ++u) {
        for (std::int64_t p = 0; p < W; ++p) {
            const std::int32_t code = meta[u * MW + p];
            if (code < 0)
                continue;
            const std::int64_t l = expert_of_code(code, E) - first;
            EPO_CHECK(l >= 0 && l < L, "a unit for expert {} reached EP rank {}",
                      expert_of_code(code, E), ep_rank);
            ++counts[l];
            rl.unit_real[u] |= code < E;
        }
    }
    rl.segments = make_expert_segments(counts, kExpertRowAlign);
    const std::int64_t Rp = rl.segments.total_rows();
    rl.row_unit.assign(static_cast<std::size_t>(Rp), -1);
    rl.row_prob.assign(static_cast<std::size_t>(Rp), 0.0f);
    rl.unit_row.assign(static_cast<std::size_t>(Ur * W), -1);
    rl.pos_row.assign(static_cast<std::size_t>(Ur * W), -1);
    for (std::int64_t l = 0; l < L; ++l) {
        std::int64_t row = rl.segments.offsets[l];
        for (std::int32_t u : order) {
            for (std::int64_t p = 0; p < W; ++p) {
                const std::int32_t code = meta[u * MW + p];
                if (code < 0 || expert_of_code(code, E) != first + l)
                    continue;
                rl.row_unit[row] = u;
                rl.row_prob[row] = bits_float(meta[u * MW + W + p]);
                rl.pos_row[u * W + p] = static_cast<std::int32_t>(row);
                if (code < E)
                    rl.unit_row[u * W + p] = static_cast<std::int32_t>(row);
                ++row;
            }
        }
    }
    return rl;
}

void reference_token_sum(const Geometry& g, const DispatchPlan& plan,
                         const ExpertSegments& segments, const Tensor& rows, std::int64_t t,
                         float* acc) {
    const std::int64_t K = plan.topk, H = rows.row_size();
    const DType dt = rows.dtype();
    const std::size_t row_bytes = static_cast<std::size_t>(H) * dtype_size(dt);
    const std::int32_t* slot_row = plan.slot_row.data<std::int32_t>();
    std::vector<float> rank_acc(static_cast<std::size_t>(H)), node_acc(rank_acc);
    std::vector<char> rounded(row_bytes);
    bool any_node = false;
    for (int m = 0; m < g.num_nodes; ++m) {
        bool any_rank = false;
        for (int i = 0; i < g.ranks_per_node; ++i) {
            bool any = false;
            for (std::int64_t q = 0; q < K; ++q) {
                const std::int32_t r = slot_row[t * K + q];
                if (r < 0)
                    continue;
                const std::int64_t e = expert_of_row(plan, r);
                if (g.rank_of_expert(e) != m * g.ranks_per_node + i)
                    continue;
                const std::int64_t at = segments.offsets[e] + (r - plan.expert_begin[e]);
                const char* src = static_cast<const char*>(rows.raw()) + at * row_bytes;
                (any ? kernels::add_row : kernels::load_row)(src, dt, rank_acc.data(), H);
                any = true;
            }
            if (!any)
                continue;
            kernels::store_row(rank_acc.data(), rounded.data(), dt, H);  // the unit row
            (any_rank ? kernels::add_row : kernels::load_row)(rounded.data(), dt, node_acc.data(),
                                                              H);
            any_rank = true;
        }
        if (!any_rank)
            continue;
        kernels::store_row(node_acc.data(), rounded.data(), dt, H);  // the message row
        (any_node ? kernels::add_row : kernels::load_row)(rounded.data(), dt, acc, H);
        any_node = true;
    }
    if (!any_node)
        std::fill(acc, acc + H, 0.0f);
}

void reference_combine(const Geometry& g, const DispatchPlan& plan, const ExpertSegments& segments,
                       const Tensor& rows, const Tensor& shared, const Tensor& y) {
    const std::int64_t T = plan.num_tokens, H = rows.row_size();
    check_tensor(y, {T, H}, y.dtype(), "combine output y");
    std::vector<float> acc(static_cast<std::size_t>(H));
    const std::size_t y_row = static_cast<std::size_t>(H) * dtype_size(y.dtype());
    for (std::int64_t t = 0; t < T; ++t) {
        reference_token_sum(g, plan, segments, rows, t, acc.data());
        if (shared.defined())
            kernels::add_row(shared.data<float>() + t * H, DType::kF32, acc.data(), H);
        kernels::store_row(acc.data(), static_cast<char*>(y.raw()) + t * y_row, y.dtype(), H);
    }
}

}  // namespace epo::moe::flex
