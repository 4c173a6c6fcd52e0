// The CPU features the kernels dispatch on, detected once at run time (the library is built for
// plain x86-64, never -march=native).
#pragma once

#include <string>

namespace epo::kernels {

struct CpuFeatures {
    bool avx2 = false;
    bool fma = false;
    bool avx512f = false;
    bool avx512bw = false;
    bool avx512dq = false;
    bool avx512vl = false;
    bool avx512_bf16 = false;
    bool amx_bf16 = false;

    // AVX-512 F/BW/VL/DQ: what the project's own AVX-512 kernels are compiled for.
    bool avx512_core() const { return avx512f && avx512bw && avx512vl && avx512dq; }
};

// Detected on first use; the same object for the life of the process.
const CpuFeatures& cpu_features();

// "avx2 fma avx512f avx512bw avx512vl avx512_bf16" (the detected ones), for logs and reports.
std::string cpu_features_string();

}  // namespace epo::kernels
