// A plain matrix product for tests and benchmarks only: the same contract as kernels::gemm
// (op(A)·op(B), optional accumulate, f32 or bf16 operands and result), computed with a simple
// triple loop that accumulates in double. Slow on purpose: it is the yardstick the oneDNN path
// is compared against.
#pragma once

#include "epo/kernels/gemm.h"

namespace epo::kernels {

void gemm_reference(const Matrix& a, const Matrix& b, const Matrix& c,
                    const GemmOptions& opts = {});

}  // namespace epo::kernels
