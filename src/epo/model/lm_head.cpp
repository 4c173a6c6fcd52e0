#include "epo/model/lm_head.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "epo/kernels/activation.h"
#include "epo/kernels/gemm.h"
#include "epo/kernels/rows.h"
#include "epo/moe/weight_grad.h"

namespace epo::model {
namespace {

constexpr int64_t kChunk = 128;  // rows of f32 logits alive at once

}  // namespace

int64_t loss_token_count(int64_t T, std::span<const int32_t> labels,
                         std::span<const uint8_t> loss_mask) {
    EPO_CHECK(static_cast<int64_t>(labels.size()) == T, "{} labels for {} tokens", labels.size(),
              T);
    EPO_CHECK(loss_mask.empty() || static_cast<int64_t>(loss_mask.size()) == T,
              "a loss mask of {} for {} tokens", loss_mask.size(), T);
    int64_t counted = T;
    if (!loss_mask.empty()) {
        counted = 0;
        for (uint8_t m : loss_mask)
            counted += m != 0;
    }
    return counted;
}

double lm_head_forward(const Param& weight, const Tensor& h, std::span<const int32_t> labels,
                       float grad_scale, LmHeadContext& ctx, Arena& saved, Arena& scratch,
                       std::span<const uint8_t> loss_mask) {
    const int64_t T = h.dim(0), V = weight.master.dim(0);
    const int64_t counted = loss_token_count(T, labels, loss_mask);
    const DType cd = h.dtype();
    const size_t es = dtype_size(cd);
    ctx.h = h;
    ctx.dlogits = saved.alloc({T, V}, cd);
    Tensor logits = scratch.alloc({kChunk, V}, DType::kF32);
    std::vector<float> row(static_cast<size_t>(V));
    const float token_scale = counted > 0 ? grad_scale / static_cast<float>(counted) : 0.0f;
    double loss_sum = 0.0;
    for (int64_t begin = 0; begin < T; begin += kChunk) {
        const int64_t rows = std::min(kChunk, T - begin);
        kernels::gemm(kernels::sub_rows(kernels::as_matrix(h), begin, rows),
                      kernels::as_matrix(weight.compute),
                      kernels::sub_rows(kernels::as_matrix(logits), 0, rows),
                      {.trans_b = true, .row_tiles = true});
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t t = begin + r;
            if (!loss_mask.empty() && loss_mask[static_cast<size_t>(t)] == 0) {
                std::fill(row.begin(), row.end(), 0.0f);
                kernels::store_row(row.data(), static_cast<char*>(ctx.dlogits.raw()) + t * V * es,
                                   cd, V);
                continue;
            }
            const int32_t label = labels[t];
            if (label < 0 || label >= V) {
                throw Error(ErrorKind::kConfig,
                            fmt::format("label {} at position {} is outside the vocabulary [0, "
                                        "{}); the data needs model.vocab_size > {}",
                                        label, t, V, label));
            }
            const float* z = logits.data<float>() + r * V;
            const float max_z = kernels::row_max(z, V);
            const float sum = kernels::exp_shifted_sum(z, 1.0f, max_z, row.data(), V);
            loss_sum += static_cast<double>(std::log(sum)) + max_z - z[label];
            const float inv = token_scale / sum;
            for (int64_t v = 0; v < V; ++v)
                row[v] *= inv;
            row[label] -= token_scale;
            kernels::store_row(row.data(), static_cast<char*>(ctx.dlogits.raw()) + t * V * es, cd,
                               V);
        }
    }
    return counted > 0 ? loss_sum / static_cast<double>(counted) : 0.0;
}

void lm_head_backward_dgrad(const Param& weight, const LmHeadContext& ctx, const Tensor& dh) {
    kernels::gemm(kernels::as_matrix(ctx.dlogits), kernels::as_matrix(weight.compute),
                  kernels::as_matrix(dh));
}

void lm_head_backward_wgrad(Param& weight, bool fusion, const LmHeadContext& ctx, Arena& scratch) {
    Tensor ws = fusion ? Tensor() : scratch.alloc({weight.master.numel()}, DType::kF32);
    moe::accumulate_weight_grad(kernels::as_matrix(ctx.dlogits), kernels::as_matrix(ctx.h),
                                kernels::as_matrix(weight.main_grad), /*trans_a=*/true,
                                /*trans_b=*/false, fusion, ws);
}

}  // namespace epo::model
