#include "epo/model/rmsnorm.h"

#include <cmath>
#include <vector>

#include "epo/kernels/rows.h"

namespace epo::model {
namespace {

// Norm weights are f32 parameters (their compute copy is the master): they stay exact, and the
// distributed optimizer's gather of compute copies brings them whole.
const float* norm_weight(const Param& weight) {
    EPO_CHECK(weight.compute_dtype() == DType::kF32, "norm weight '{}' must be an f32 parameter",
              weight.name);
    return weight.compute.data<float>();
}

}  // namespace

void rmsnorm_forward(const Tensor& x, const Param& weight, float eps, const Tensor& y,
                     const Tensor& rstd) {
    const int64_t n = x.dim(0), d = x.row_size();
    EPO_CHECK(y.numel() == x.numel() && weight.master.numel() == d && rstd.numel() == n,
              "rmsnorm shapes x {} y {} w {} rstd {}", x.shape().str(), y.shape().str(),
              weight.master.shape().str(), rstd.shape().str());
    const float* w = norm_weight(weight);
    float* r = rstd.data<float>();
    std::vector<float> row(static_cast<size_t>(d));
    const size_t xs = dtype_size(x.dtype()), ys = dtype_size(y.dtype());
    for (int64_t t = 0; t < n; ++t) {
        kernels::load_row(static_cast<const char*>(x.raw()) + t * d * xs, x.dtype(), row.data(), d);
        float sum_sq = 0.0f;
        for (int64_t j = 0; j < d; ++j)
            sum_sq += row[j] * row[j];
        const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(d) + eps);
        r[t] = inv;
        for (int64_t j = 0; j < d; ++j)
            row[j] = row[j] * inv * w[j];
        kernels::store_row(row.data(), static_cast<char*>(y.raw()) + t * d * ys, y.dtype(), d);
    }
}

void rmsnorm_recompute(const Tensor& x, const Param& weight, const Tensor& rstd, const Tensor& y) {
    const int64_t n = x.dim(0), d = x.row_size();
    EPO_CHECK(y.numel() == x.numel() && weight.master.numel() == d && rstd.numel() == n,
              "rmsnorm recompute shapes x {} y {} w {} rstd {}", x.shape().str(), y.shape().str(),
              weight.master.shape().str(), rstd.shape().str());
    const float* w = norm_weight(weight);
    const float* r = rstd.data<float>();
    std::vector<float> row(static_cast<size_t>(d));
    const size_t xs = dtype_size(x.dtype()), ys = dtype_size(y.dtype());
    for (int64_t t = 0; t < n; ++t) {
        kernels::load_row(static_cast<const char*>(x.raw()) + t * d * xs, x.dtype(), row.data(), d);
        const float inv = r[t];
        // The forward's expression: (x * rstd) * w, so the bits are the forward's.
        for (int64_t j = 0; j < d; ++j)
            row[j] = row[j] * inv * w[j];
        kernels::store_row(row.data(), static_cast<char*>(y.raw()) + t * d * ys, y.dtype(), d);
    }
}

void rmsnorm_backward(const Tensor& x, Param& weight, const Tensor& rstd, const Tensor& dy,
                      const Tensor& dx_acc, const Tensor& dw_workspace) {
    const int64_t n = x.dim(0), d = x.row_size();
    EPO_CHECK(dy.numel() == x.numel() && dx_acc.numel() == x.numel() && dw_workspace.numel() >= d,
              "rmsnorm backward shapes x {} dy {} dx {}", x.shape().str(), dy.shape().str(),
              dx_acc.shape().str());
    const float* w = norm_weight(weight);
    const float* r = rstd.data<float>();
    float* dx = dx_acc.data<float>();
    float* dw = dw_workspace.data<float>();
    for (int64_t j = 0; j < d; ++j)
        dw[j] = 0.0f;
    std::vector<float> xh(static_cast<size_t>(d)), g(static_cast<size_t>(d));
    const size_t xs = dtype_size(x.dtype()), gs = dtype_size(dy.dtype());
    for (int64_t t = 0; t < n; ++t) {
        kernels::load_row(static_cast<const char*>(x.raw()) + t * d * xs, x.dtype(), xh.data(), d);
        kernels::load_row(static_cast<const char*>(dy.raw()) + t * d * gs, dy.dtype(), g.data(), d);
        const float inv = r[t];
        float dot = 0.0f;
        for (int64_t j = 0; j < d; ++j) {
            xh[j] *= inv;
            dw[j] += g[j] * xh[j];
            g[j] *= w[j];
            dot += g[j] * xh[j];
        }
        const float mean_dot = dot / static_cast<float>(d);
        float* dxr = dx + t * d;
        for (int64_t j = 0; j < d; ++j)
            dxr[j] += inv * (g[j] - xh[j] * mean_dot);
    }
    float* mg = weight.main_grad.data<float>();
    for (int64_t j = 0; j < d; ++j)
        mg[j] += dw[j];
}

}  // namespace epo::model
