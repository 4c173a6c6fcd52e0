#include "epo/model/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "epo/kernels/activation.h"
#include "epo/kernels/gemm.h"
#include "epo/kernels/rows.h"

namespace epo::model {
namespace {

constexpr int64_t kTpLogitRows = 128;  // rows of f32 logits alive at once (as lm_head.cpp)

void check_tp_token(int32_t token, int64_t vocab, size_t t, const char* what) {
    if (token < 0 || token >= vocab) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("{} {} at position {} is outside the vocabulary [0, {}); the data "
                                "needs model.vocab_size > {}",
                                what, token, t, vocab, token));
    }
}

}  // namespace

TpRange tp_range(int64_t total, int size, int rank, const char* field) {
    EPO_CHECK(size >= 1 && rank >= 0 && rank < size, "TP rank {} of {}", rank, size);
    if (total % size != 0) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("{}={} is not divisible by tensor_model_parallel_size={}: each TP "
                                "rank holds an equal part; choose a multiple of {}",
                                field, total, size, size));
    }
    const int64_t part = total / size;
    return TpRange{rank * part, (rank + 1) * part};
}

void tp_copy_row_shard(const Tensor& full, std::span<const int64_t> blocks, int size, int rank,
                       const Tensor& shard) {
    const int64_t C = full.dim(1);
    int64_t total = 0, out_row = 0;
    for (int64_t rows : blocks) {
        const TpRange mine = tp_range(rows, size, rank, "a weight block's rows");
        shard.rows(out_row, out_row + mine.size())
            .copy_from(full.rows(total + mine.begin, total + mine.end));
        out_row += mine.size();
        total += rows;
    }
    EPO_CHECK(total == full.dim(0) && out_row == shard.dim(0) && shard.dim(1) == C,
              "row shard of {} in blocks summing to {} into {}", full.shape().str(), total,
              shard.shape().str());
}

void tp_copy_column_shard(const Tensor& full, int size, int rank, const Tensor& shard) {
    const int64_t R = full.dim(0), C = full.dim(1);
    const TpRange mine = tp_range(C, size, rank, "a weight's columns");
    EPO_CHECK(shard.dim(0) == R && shard.dim(1) == mine.size(), "column shard of {} into {}",
              full.shape().str(), shard.shape().str());
    const float* src = full.data<float>();
    float* dst = shard.data<float>();
    for (int64_t r = 0; r < R; ++r)
        std::copy_n(src + r * C + mine.begin, mine.size(), dst + r * mine.size());
}

void tp_gather(comm::Communicator& tp, bool sequence_parallel, const Tensor& in,
               const Tensor& out) {
    EPO_CHECK(in.dtype() == out.dtype(), "tp_gather {} into {}", dtype_name(in.dtype()),
              dtype_name(out.dtype()));
    if (!sequence_parallel || tp.size() == 1) {
        EPO_CHECK(in.numel() == out.numel(), "tp_gather {} into {}", in.shape().str(),
                  out.shape().str());
        if (in.raw() != out.raw())
            out.copy_from(in);
        return;
    }
    EPO_CHECK(in.numel() * tp.size() == out.numel(), "tp_gather of {} over {} ranks into {}",
              in.shape().str(), tp.size(), out.shape().str());
    tp.all_gather(in.raw(), out.raw(), in.nbytes());
}

void tp_reduce(comm::Communicator& tp, bool sequence_parallel, const Tensor& partial,
               const Tensor& out) {
    std::span<float> data(partial.data<float>(), static_cast<size_t>(partial.numel()));
    if (!sequence_parallel) {
        EPO_CHECK(partial.numel() == out.numel(), "tp_reduce {} into {}", partial.shape().str(),
                  out.shape().str());
        tp.all_reduce_sum(data);
        if (partial.raw() != out.raw())
            out.copy_from(partial);
        return;
    }
    const int64_t rows = partial.dim(0);
    const TpRange mine = tp_range(rows, tp.size(), tp.rank(), "the micro-batch's tokens");
    EPO_CHECK(out.numel() * tp.size() == partial.numel(), "tp_reduce of {} over {} ranks into {}",
              partial.shape().str(), tp.size(), out.shape().str());
    // The communicator's shard of T C items is rows [r T / n, (r + 1) T / n) when n divides T.
    tp.reduce_scatter_sum(data);
    out.copy_from(partial.rows(mine.begin, mine.end));
}

void vocab_parallel_embedding_forward(comm::Communicator& tp, bool sequence_parallel,
                                      const Param& table, int64_t vocab,
                                      std::span<const int32_t> tokens, const Tensor& x,
                                      Arena& scratch) {
    const int64_t hidden = table.master.dim(1), T = static_cast<int64_t>(tokens.size());
    const TpRange mine = tp_range(vocab, tp.size(), tp.rank(), "model.vocab_size");
    EPO_CHECK(table.master.dim(0) == mine.size(), "embedding shard of {} rows for {}",
              table.master.dim(0), mine.size());
    Tensor partial = scratch.alloc({T, hidden}, DType::kF32);
    const size_t es = dtype_size(table.compute.dtype());
    for (size_t t = 0; t < tokens.size(); ++t) {
        check_tp_token(tokens[t], vocab, t, "token");
        float* row = partial.data<float>() + static_cast<int64_t>(t) * hidden;
        if (tokens[t] < mine.begin || tokens[t] >= mine.end) {
            std::fill(row, row + hidden, 0.0f);
            continue;
        }
        kernels::load_row(
            static_cast<const char*>(table.compute.raw()) + (tokens[t] - mine.begin) * hidden * es,
            table.compute.dtype(), row, hidden);
    }
    tp_reduce(tp, sequence_parallel, partial, x);
}

void vocab_parallel_embedding_backward(comm::Communicator& tp, bool sequence_parallel, Param& table,
                                       std::span<const int32_t> tokens, const Tensor& dx,
                                       Arena& scratch) {
    const int64_t hidden = table.master.dim(1), T = static_cast<int64_t>(tokens.size());
    const int64_t rows = table.master.dim(0);
    const int64_t begin = rows * tp.rank();
    Tensor dx_full = scratch.alloc({T, hidden}, DType::kF32);
    tp_gather(tp, sequence_parallel, dx, dx_full);
    float* grad = table.main_grad.data<float>();
    for (int64_t t = 0; t < T; ++t) {
        const int64_t local = tokens[static_cast<size_t>(t)] - begin;
        if (local < 0 || local >= rows)
            continue;
        kernels::add_row(dx_full.data<float>() + t * hidden, DType::kF32, grad + local * hidden,
                         hidden);
    }
}

double vocab_parallel_lm_head_forward(comm::Communicator& tp, const Param& weight,
                                      const Tensor& h_full, std::span<const int32_t> labels,
                                      float grad_scale, LmHeadContext& ctx, Arena& saved,
                                      Arena& scratch, std::span<const uint8_t> loss_mask) {
    const int64_t T = h_full.dim(0), Vl = weight.master.dim(0);
    const int64_t V = Vl * tp.size(), begin = Vl * tp.rank();
    const int64_t counted = loss_token_count(T, labels, loss_mask);
    const DType cd = h_full.dtype();
    const size_t es = dtype_size(cd);
    ctx.h = h_full;
    ctx.dlogits = saved.alloc({T, Vl}, cd);
    Tensor logits = scratch.alloc({kTpLogitRows, Vl}, DType::kF32);
    Tensor exps = scratch.alloc({kTpLogitRows, Vl}, DType::kF32);
    const int n = tp.size();
    std::vector<float> max_local(kTpLogitRows), max_all(static_cast<size_t>(kTpLogitRows * n));
    std::vector<float> max_z(kTpLogitRows), sums(kTpLogitRows), target(kTpLogitRows);
    const float token_scale = counted > 0 ? grad_scale / static_cast<float>(counted) : 0.0f;
    double loss_sum = 0.0;
    for (int64_t first = 0; first < T; first += kTpLogitRows) {
        const int64_t rows = std::min(kTpLogitRows, T - first);
        const auto rows_n = static_cast<size_t>(rows);
        kernels::gemm(kernels::sub_rows(kernels::as_matrix(h_full), first, rows),
                      kernels::as_matrix(weight.compute),
                      kernels::sub_rows(kernels::as_matrix(logits), 0, rows),
                      {.trans_b = true, .row_tiles = true});
        const float* z = logits.data<float>();
        // The max over the whole vocabulary: every rank's row maxima, gathered.
        for (int64_t r = 0; r < rows; ++r)
            max_local[static_cast<size_t>(r)] = kernels::row_max(z + r * Vl, Vl);
        if (n == 1) {
            std::copy_n(max_local.begin(), rows, max_z.begin());
        } else {
            tp.all_gather(std::span<const float>(max_local.data(), rows_n),
                          std::span<float>(max_all.data(), rows_n * static_cast<size_t>(n)));
            for (int64_t r = 0; r < rows; ++r) {
                float m = max_all[static_cast<size_t>(r)];
                for (int q = 1; q < n; ++q)
                    m = std::max(m, max_all[static_cast<size_t>(q * rows + r)]);
                max_z[static_cast<size_t>(r)] = m;
            }
        }
        // The sums of exp and the label's logit (0 from the ranks that do not hold it).
        for (int64_t r = 0; r < rows; ++r) {
            const auto i = static_cast<size_t>(r);
            sums[i] = kernels::exp_shifted_sum(z + r * Vl, 1.0f, max_z[i],
                                               exps.data<float>() + r * Vl, Vl);
            const int64_t t = first + r;
            const bool masked = !loss_mask.empty() && loss_mask[static_cast<size_t>(t)] == 0;
            target[i] = 0.0f;
            if (masked)
                continue;
            const int32_t label = labels[static_cast<size_t>(t)];
            check_tp_token(label, V, static_cast<size_t>(t), "label");
            if (label >= begin && label < begin + Vl)
                target[i] = z[r * Vl + (label - begin)];
        }
        tp.all_reduce_sum(std::span<float>(sums.data(), rows_n));
        tp.all_reduce_sum(std::span<float>(target.data(), rows_n));
        for (int64_t r = 0; r < rows; ++r) {
            const auto i = static_cast<size_t>(r);
            const int64_t t = first + r;
            float* row = exps.data<float>() + r * Vl;
            char* out = static_cast<char*>(ctx.dlogits.raw()) + t * Vl * static_cast<int64_t>(es);
            if (!loss_mask.empty() && loss_mask[static_cast<size_t>(t)] == 0) {
                std::fill(row, row + Vl, 0.0f);
                kernels::store_row(row, out, cd, Vl);
                continue;
            }
            loss_sum += static_cast<double>(std::log(sums[i])) + max_z[i] - target[i];
            const float inv = token_scale / sums[i];
            for (int64_t v = 0; v < Vl; ++v)
                row[v] *= inv;
            const int32_t label = labels[static_cast<size_t>(t)];
            if (label >= begin && label < begin + Vl)
                row[label - begin] -= token_scale;
            kernels::store_row(row, out, cd, Vl);
        }
    }
    return counted > 0 ? loss_sum / static_cast<double>(counted) : 0.0;
}

}  // namespace epo::model
