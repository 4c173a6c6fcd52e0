#include "epo/kernels/cpu_features.h"

namespace epo::kernels {
namespace {

CpuFeatures detect() {
    __builtin_cpu_init();
    CpuFeatures f;
    f.avx2 = __builtin_cpu_supports("avx2");
    f.fma = __builtin_cpu_supports("fma");
    f.avx512f = __builtin_cpu_supports("avx512f");
    f.avx512bw = __builtin_cpu_supports("avx512bw");
    f.avx512dq = __builtin_cpu_supports("avx512dq");
    f.avx512vl = __builtin_cpu_supports("avx512vl");
    f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
    f.amx_bf16 = __builtin_cpu_supports("amx-bf16");
    return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
    static const CpuFeatures features = detect();  // thread-safe one-time initialization
    return features;
}

std::string cpu_features_string() {
    const CpuFeatures& f = cpu_features();
    std::string s;
    auto add = [&](bool on, const char* name) {
        if (!on) {
            return;
        }
        if (!s.empty()) {
            s += ' ';
        }
        s += name;
    };
    add(f.avx2, "avx2");
    add(f.fma, "fma");
    add(f.avx512f, "avx512f");
    add(f.avx512bw, "avx512bw");
    add(f.avx512dq, "avx512dq");
    add(f.avx512vl, "avx512vl");
    add(f.avx512_bf16, "avx512_bf16");
    add(f.amx_bf16, "amx_bf16");
    return s.empty() ? "none" : s;
}

}  // namespace epo::kernels
