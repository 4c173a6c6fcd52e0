#include "epo/kernels/gemm_reference.h"

namespace epo::kernels {
namespace {

double load(const Matrix& m, std::int64_t i, std::int64_t j) {
    const std::size_t off = static_cast<std::size_t>(i * m.ld + j);
    if (m.dtype == DType::kBF16) {
        return bf16_to_float(static_cast<const BF16*>(m.data)[off]);
    }
    return static_cast<const float*>(m.data)[off];
}

}  // namespace

void gemm_reference(const Matrix& a, const Matrix& b, const Matrix& c, const GemmOptions& opts) {
    const std::int64_t m = opts.trans_a ? a.cols : a.rows;
    const std::int64_t k = opts.trans_a ? a.rows : a.cols;
    const std::int64_t n = opts.trans_b ? b.rows : b.cols;
    EPO_CHECK((opts.trans_b ? b.cols : b.rows) == k && c.rows == m && c.cols == n,
              "gemm_reference: shapes do not match");
    EPO_CHECK(c.dtype == DType::kF32 || !opts.accumulate, "gemm_reference: bf16 accumulate");
    for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (std::int64_t p = 0; p < k; ++p) {
                const double av = opts.trans_a ? load(a, p, i) : load(a, i, p);
                const double bv = opts.trans_b ? load(b, j, p) : load(b, p, j);
                s += av * bv;
            }
            const std::size_t off = static_cast<std::size_t>(i * c.ld + j);
            if (c.dtype == DType::kF32) {
                float* cp = static_cast<float*>(c.data) + off;
                *cp = opts.accumulate ? static_cast<float>(*cp + s) : static_cast<float>(s);
            } else {
                static_cast<BF16*>(c.data)[off] = float_to_bf16(static_cast<float>(s));
            }
        }
    }
}

}  // namespace epo::kernels
