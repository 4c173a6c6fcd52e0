#include "epo/moe/dispatch.h"

#include <algorithm>
#include <cstring>

#include "epo/kernels/rows.h"

namespace epo::moe {
namespace {

char* row_ptr(const Tensor& t, std::int64_t row) {
    return static_cast<char*>(t.raw()) +
           static_cast<std::size_t>(row * t.row_size()) * dtype_size(t.dtype());
}

std::size_t row_bytes(const Tensor& t) {
    return static_cast<std::size_t>(t.row_size()) * dtype_size(t.dtype());
}

// Expert of row r (rows are grouped by expert in plan order).
std::int64_t expert_of_row(const DispatchPlan& plan, std::int64_t r) {
    const auto it = std::upper_bound(plan.expert_begin.begin(), plan.expert_begin.end(), r);
    return (it - plan.expert_begin.begin()) - 1;
}

// Row r of the plan in the segment layout.
std::int64_t layout_row(const DispatchPlan& plan, const ExpertSegments& seg, std::int64_t r) {
    const std::int64_t e = expert_of_row(plan, r);
    return seg.offsets[static_cast<std::size_t>(e)] +
           (r - plan.expert_begin[static_cast<std::size_t>(e)]);
}

void check_segments(const DispatchPlan& plan, const ExpertSegments& seg) {
    EPO_CHECK(seg.counts == plan.tokens_per_expert,
              "segments were not made from this plan's tokens_per_expert");
}

}  // namespace

std::int64_t ExpertSegments::padded_count(std::int64_t e) const {
    return offsets[static_cast<std::size_t>(e + 1)] - offsets[static_cast<std::size_t>(e)];
}

ExpertSegments make_expert_segments(std::span<const std::int64_t> counts, std::int64_t align) {
    EPO_CHECK(align >= 1, "segment alignment {}", align);
    ExpertSegments seg;
    seg.counts.assign(counts.begin(), counts.end());
    seg.offsets.resize(counts.size() + 1);
    seg.offsets[0] = 0;
    for (std::size_t e = 0; e < counts.size(); ++e) {
        EPO_CHECK(counts[e] >= 0, "negative row count {} for expert {}", counts[e], e);
        seg.offsets[e + 1] = seg.offsets[e] + (counts[e] + align - 1) / align * align;
    }
    return seg;
}

ExpertSegments segment_range(const ExpertSegments& seg, std::int64_t begin, std::int64_t end) {
    EPO_CHECK(begin >= 0 && begin <= end && end <= seg.num_experts(),
              "experts [{}, {}) of segments of {}", begin, end, seg.num_experts());
    ExpertSegments out;
    out.counts.assign(seg.counts.begin() + begin, seg.counts.begin() + end);
    out.offsets.resize(static_cast<std::size_t>(end - begin + 1));
    for (std::int64_t e = begin; e <= end; ++e) {
        out.offsets[static_cast<std::size_t>(e - begin)] =
            seg.offsets[static_cast<std::size_t>(e)] - seg.offsets[static_cast<std::size_t>(begin)];
    }
    return out;
}

std::int64_t max_segment_rows(std::int64_t rows, std::int64_t num_experts, std::int64_t align) {
    return rows + num_experts * (align - 1);
}

DispatchPlan dispatch_preprocess(const MoeConfig& cfg, const Tensor& topk_index,
                                 const Tensor& topk_weight, Arena& arena) {
    const std::int64_t t_count = topk_index.dim(0), k = cfg.topk, e_count = cfg.num_experts;
    check_tensor(topk_index, {t_count, k}, DType::kI32, "topk_index");
    check_tensor(topk_weight, {t_count, k}, DType::kF32, "topk_weight");
    const std::int32_t* idx = topk_index.data<std::int32_t>();
    const float* weight = topk_weight.data<float>();

    DispatchPlan plan;
    plan.num_tokens = t_count;
    plan.topk = k;
    plan.num_experts = e_count;
    plan.capacity = expert_capacity(cfg, t_count);
    if (cfg.pad_to_capacity && plan.capacity > t_count) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("moe_expert_capacity_factor={} gives a capacity of {} rows per "
                                "expert for {} tokens; with moe_pad_expert_input_to_capacity the "
                                "capacity must not exceed the tokens: lower the factor",
                                *cfg.capacity_factor, plan.capacity, t_count));
    }

    // Slots routed to each expert, in token order (counting sort by expert).
    std::vector<std::int64_t> routed(static_cast<std::size_t>(e_count) + 1, 0);
    for (std::int64_t s = 0; s < t_count * k; ++s) {
        const std::int32_t e = idx[s];
        EPO_CHECK(e >= 0 && e < e_count, "topk_index {} out of [0, {})", e, e_count);
        ++routed[static_cast<std::size_t>(e) + 1];
    }
    for (std::int64_t e = 0; e < e_count; ++e) {
        routed[e + 1] += routed[e];
    }
    std::int32_t* by_expert = arena.alloc({t_count * k}, DType::kI32).data<std::int32_t>();
    {
        std::vector<std::int64_t> fill(routed.begin(), routed.end() - 1);
        for (std::int64_t s = 0; s < t_count * k; ++s) {
            by_expert[fill[static_cast<std::size_t>(idx[s])]++] = static_cast<std::int32_t>(s);
        }
    }

    // Kept slots per expert (capacity drops), still in token order.
    std::int64_t kept_total = 0;
    std::vector<std::int64_t> kept(static_cast<std::size_t>(e_count));
    for (std::int64_t e = 0; e < e_count; ++e) {
        std::int32_t* list = by_expert + routed[e];
        const std::int64_t n = routed[e + 1] - routed[e];
        std::int64_t keep = n;
        if (plan.capacity >= 0 && n > plan.capacity) {
            keep = plan.capacity;
            if (cfg.drop_policy == DropPolicy::kProbs) {
                // Highest weights first, ties to the lower token; then back to token order.
                std::stable_sort(list, list + n, [&](std::int32_t a, std::int32_t b) {
                    return weight[a] > weight[b];
                });
                std::sort(list, list + keep);
            }
        }
        kept[static_cast<std::size_t>(e)] = keep;
        kept_total += keep;
    }
    plan.num_dropped = t_count * k - kept_total;

    plan.tokens_per_expert.resize(static_cast<std::size_t>(e_count));
    for (std::int64_t e = 0; e < e_count; ++e) {
        plan.tokens_per_expert[static_cast<std::size_t>(e)] =
            cfg.pad_to_capacity ? plan.capacity : kept[static_cast<std::size_t>(e)];
    }
    plan.expert_begin.assign(static_cast<std::size_t>(e_count) + 1, 0);
    for (std::int64_t e = 0; e < e_count; ++e) {
        plan.expert_begin[e + 1] = plan.expert_begin[e] + plan.tokens_per_expert[e];
    }
    plan.num_rows = plan.expert_begin.back();
    plan.row_token = arena.alloc({plan.num_rows}, DType::kI32);
    plan.row_slot = arena.alloc({plan.num_rows}, DType::kI32);
    plan.slot_row = arena.alloc({t_count * k}, DType::kI32);
    std::int32_t* row_token = plan.row_token.data<std::int32_t>();
    std::int32_t* row_slot = plan.row_slot.data<std::int32_t>();
    std::int32_t* slot_row = plan.slot_row.data<std::int32_t>();
    std::fill(slot_row, slot_row + t_count * k, -1);

    for (std::int64_t e = 0; e < e_count; ++e) {
        const std::int32_t* list = by_expert + routed[e];
        const std::int64_t keep = kept[static_cast<std::size_t>(e)];
        std::int64_t r = plan.expert_begin[e];
        std::int64_t pads = plan.tokens_per_expert[e] - keep;
        // Merge the kept slots with padding rows (the lowest tokens not routed to e, weight 0)
        // in token order.
        std::int64_t j = 0;
        for (std::int64_t t = 0; t < t_count && (j < keep || pads > 0); ++t) {
            if (j < keep && list[j] / k == t) {
                row_token[r] = static_cast<std::int32_t>(t);
                row_slot[r] = list[j];
                slot_row[list[j]] = static_cast<std::int32_t>(r);
                ++r;
                ++j;
            } else if (pads > 0) {
                bool routed_here = false;
                for (std::int64_t q = 0; q < k; ++q) {
                    routed_here |= idx[t * k + q] == e;
                }
                if (routed_here) {
                    continue;  // a dropped token is not a padding row
                }
                row_token[r] = static_cast<std::int32_t>(t);
                row_slot[r] = -1;
                ++r;
                --pads;
            }
        }
        EPO_CHECK_EQ(r, plan.expert_begin[e + 1]);
    }
    return plan;
}

void permute_forward(const DispatchPlan& plan, const ExpertSegments& seg, const Tensor& x,
                     const Tensor& topk_weight, const Tensor& x_perm, const Tensor& probs_perm) {
    check_segments(plan, seg);
    const std::int64_t h = x.row_size();
    check_tensor(x_perm, {seg.total_rows(), h}, x.dtype(), "x_perm");
    check_tensor(probs_perm, {seg.total_rows()}, DType::kF32, "probs_perm");
    const std::int32_t* row_token = plan.row_token.data<std::int32_t>();
    const std::int32_t* row_slot = plan.row_slot.data<std::int32_t>();
    const float* weight = topk_weight.data<float>();
    float* probs = probs_perm.data<float>();
    const std::size_t bytes = row_bytes(x);
    for (std::int64_t e = 0; e < plan.num_experts; ++e) {
        const std::int64_t begin = plan.expert_begin[e], dst = seg.offsets[e];
        for (std::int64_t j = 0; j < seg.counts[e]; ++j) {
            const std::int64_t r = begin + j;
            std::memcpy(row_ptr(x_perm, dst + j), row_ptr(x, row_token[r]), bytes);
            probs[dst + j] = row_slot[r] >= 0 ? weight[row_slot[r]] : 0.0f;
        }
    }
    zero_segment_padding(seg, x_perm);
    zero_segment_padding(seg, probs_perm);
}

void gather_dweight(const DispatchPlan& plan, const ExpertSegments& seg, const Tensor& dprobs_perm,
                    const Tensor& dweight) {
    check_segments(plan, seg);
    const std::int64_t t_count = plan.num_tokens, k = plan.topk;
    check_tensor(dweight, {t_count, k}, DType::kF32, "dweight");
    check_tensor(dprobs_perm, {seg.total_rows()}, DType::kF32, "dprobs_perm");
    const std::int32_t* slot_row = plan.slot_row.data<std::int32_t>();
    const float* dprobs = dprobs_perm.data<float>();
    float* dw = dweight.data<float>();
    for (std::int64_t s = 0; s < t_count * k; ++s) {
        const std::int32_t r = slot_row[s];
        dw[s] = r < 0 ? 0.0f : dprobs[layout_row(plan, seg, r)];
    }
}

void token_row_sum(const DispatchPlan& plan, const ExpertSegments& seg, const Tensor& rows,
                   std::int64_t t, float* acc) {
    const std::int64_t k = plan.topk, h = rows.row_size();
    const std::int32_t* slot_row = plan.slot_row.data<std::int32_t>();
    bool first = true;
    for (std::int64_t q = 0; q < k; ++q) {
        const std::int32_t r = slot_row[t * k + q];
        if (r < 0) {
            continue;
        }
        const char* src = row_ptr(rows, layout_row(plan, seg, r));
        if (first) {
            kernels::load_row(src, rows.dtype(), acc, h);
        } else {
            kernels::add_row(src, rows.dtype(), acc, h);
        }
        first = false;
    }
    if (first) {
        std::fill(acc, acc + h, 0.0f);
    }
}

void permute_backward(const DispatchPlan& plan, const ExpertSegments& seg, const Tensor& dx_perm,
                      const Tensor& dprobs_perm, const Tensor& dx_acc, const Tensor& dweight) {
    const std::int64_t t_count = plan.num_tokens, h = dx_perm.row_size();
    check_tensor(dx_acc, {t_count, h}, DType::kF32, "dx accumulator");
    gather_dweight(plan, seg, dprobs_perm, dweight);
    for (std::int64_t t = 0; t < t_count; ++t) {
        token_row_sum(plan, seg, dx_perm, t, dx_acc.data<float>() + t * h);
    }
}

void combine_forward(const DispatchPlan& plan, const ExpertSegments& seg, const Tensor& y_perm,
                     const Tensor& shared, const Tensor& y) {
    check_segments(plan, seg);
    const std::int64_t t_count = plan.num_tokens, h = y_perm.row_size();
    check_tensor(y, {t_count, h}, y.dtype(), "combine output y");
    if (shared.defined()) {
        check_tensor(shared, {t_count, h}, DType::kF32, "shared expert output");
    }
    std::vector<float> acc(static_cast<std::size_t>(h));
    for (std::int64_t t = 0; t < t_count; ++t) {
        token_row_sum(plan, seg, y_perm, t, acc.data());
        if (shared.defined()) {
            kernels::add_row(row_ptr(shared, t), DType::kF32, acc.data(), h);
        }
        kernels::store_row(acc.data(), row_ptr(y, t), y.dtype(), h);
    }
}

void combine_backward(const DispatchPlan& plan, const ExpertSegments& seg, const Tensor& dy,
                      const Tensor& dy_perm) {
    check_segments(plan, seg);
    check_tensor(dy_perm, {seg.total_rows(), dy.row_size()}, dy.dtype(), "dy_perm");
    const std::int32_t* row_token = plan.row_token.data<std::int32_t>();
    const std::int32_t* row_slot = plan.row_slot.data<std::int32_t>();
    const std::size_t bytes = row_bytes(dy);
    for (std::int64_t e = 0; e < plan.num_experts; ++e) {
        for (std::int64_t j = 0; j < seg.counts[e]; ++j) {
            const std::int64_t r = plan.expert_begin[e] + j;
            char* dst = row_ptr(dy_perm, seg.offsets[e] + j);
            if (row_slot[r] >= 0) {
                std::memcpy(dst, row_ptr(dy, row_token[r]), bytes);
            } else {
                std::memset(dst, 0, bytes);
            }
        }
    }
    zero_segment_padding(seg, dy_perm);
}

void zero_segment_padding(const ExpertSegments& seg, const Tensor& rows) {
    zero_segment_padding(seg, rows, 0, seg.num_experts());
}

void zero_segment_padding(const ExpertSegments& seg, const Tensor& rows, std::int64_t begin,
                          std::int64_t end) {
    EPO_CHECK(rows.dim(0) >= seg.total_rows(), "{} rows for segments of {}", rows.dim(0),
              seg.total_rows());
    EPO_CHECK(begin >= 0 && begin <= end && end <= seg.num_experts(),
              "experts [{}, {}) of segments of {}", begin, end, seg.num_experts());
    const std::size_t bytes = row_bytes(rows);
    for (std::int64_t e = begin; e < end; ++e) {
        const std::int64_t pad = seg.padded_count(e) - seg.counts[e];
        if (pad > 0) {
            std::memset(row_ptr(rows, seg.offsets[e] + seg.counts[e]), 0, bytes * pad);
        }
    }
}

ChunkMoves rank_major_to_expert_major(std::span<const std::int64_t> counts, std::int64_t num_ranks,
                                      const ExpertSegments& seg) {
    const std::int64_t l_count = seg.num_experts();
    EPO_CHECK_EQ(static_cast<std::int64_t>(counts.size()), num_ranks * l_count);
    ChunkMoves m;
    std::vector<std::int64_t> src_offset(counts.size());
    std::int64_t pos = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
        src_offset[i] = pos;
        pos += counts[i];
    }
    for (std::int64_t l = 0; l < l_count; ++l) {
        std::int64_t dst = seg.offsets[l];
        for (std::int64_t s = 0; s < num_ranks; ++s) {
            const std::size_t i = static_cast<std::size_t>(s * l_count + l);
            m.src_offsets.push_back(src_offset[i]);
            m.dst_offsets.push_back(dst);
            m.sizes.push_back(counts[i]);
            dst += counts[i];
        }
        EPO_CHECK(dst - seg.offsets[l] == seg.counts[l],
                  "expert {}: {} received rows, segment holds {}", l, dst - seg.offsets[l],
                  seg.counts[l]);
    }
    return m;
}

ChunkMoves invert(const ChunkMoves& moves) {
    return ChunkMoves{moves.dst_offsets, moves.src_offsets, moves.sizes};
}

ChunkMoves sub_moves(const ChunkMoves& moves, std::size_t begin, std::size_t end) {
    EPO_CHECK(begin <= end && end <= moves.sizes.size(), "moves [{}, {}) of {}", begin, end,
              moves.sizes.size());
    const auto part = [&](const std::vector<std::int64_t>& v) {
        return std::vector<std::int64_t>(v.begin() + static_cast<std::ptrdiff_t>(begin),
                                         v.begin() + static_cast<std::ptrdiff_t>(end));
    };
    return ChunkMoves{part(moves.src_offsets), part(moves.dst_offsets), part(moves.sizes)};
}

void move_chunks(const Tensor& src, const ChunkMoves& moves, const Tensor& dst) {
    EPO_CHECK(src.dtype() == dst.dtype() && src.row_size() == dst.row_size(),
              "move_chunks between {} {} and {} {}", dtype_name(src.dtype()), src.shape().str(),
              dtype_name(dst.dtype()), dst.shape().str());
    const std::size_t bytes = row_bytes(src);
    for (std::size_t i = 0; i < moves.sizes.size(); ++i) {
        const std::int64_t n = moves.sizes[i];
        EPO_CHECK(moves.src_offsets[i] + n <= src.dim(0) && moves.dst_offsets[i] + n <= dst.dim(0),
                  "chunk {} of {} rows out of range", i, n);
        if (n) {
            std::memcpy(row_ptr(dst, moves.dst_offsets[i]), row_ptr(src, moves.src_offsets[i]),
                        bytes * static_cast<std::size_t>(n));
        }
    }
}

}  // namespace epo::moe
