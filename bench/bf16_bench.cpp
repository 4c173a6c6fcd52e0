// fp32 <-> bf16 conversion speed per implementation (scalar, AVX-512 integer rounding,
// AVX512-BF16 instruction with the subnormal fix-up), on 4 Mi elements (in L3 / memory).
//
// Run: OMP_NUM_THREADS=1 build/release/bench/bf16_bench
#include <benchmark/benchmark.h>

#include <vector>

#include "epo/tensor/bf16.h"
#include "epo/tensor/random.h"

namespace {

constexpr std::size_t kN = std::size_t{4} << 20;

void BM_F32ToBf16(benchmark::State& state) {
    const auto impl = static_cast<epo::Bf16Impl>(state.range(0));
    if (!epo::bf16_impl_supported(impl)) {
        state.SkipWithError("not supported by this CPU");
        return;
    }
    epo::Tensor src = epo::Tensor::empty({static_cast<std::int64_t>(kN)}, epo::DType::kF32);
    epo::fill_uniform(src, 1, -100.0f, 100.0f);
    std::vector<epo::BF16> dst(kN);
    for (auto _ : state) {
        epo::convert_f32_to_bf16(src.data<float>(), dst.data(), kN, impl);
        benchmark::DoNotOptimize(dst.data());
    }
    state.SetLabel(epo::bf16_impl_name(impl));
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kN * 6));
}

void BM_Bf16ToF32(benchmark::State& state) {
    const auto impl = static_cast<epo::Bf16Impl>(state.range(0));
    if (!epo::bf16_impl_supported(impl)) {
        state.SkipWithError("not supported by this CPU");
        return;
    }
    std::vector<epo::BF16> src(kN, epo::float_to_bf16(1.5f));
    std::vector<float> dst(kN);
    for (auto _ : state) {
        epo::convert_bf16_to_f32(src.data(), dst.data(), kN, impl);
        benchmark::DoNotOptimize(dst.data());
    }
    state.SetLabel(epo::bf16_impl_name(impl));
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kN * 6));
}

// 1 = scalar, 2 = AVX-512, 3 = AVX512-BF16 (the Bf16Impl values).
BENCHMARK(BM_F32ToBf16)->DenseRange(1, 3)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Bf16ToF32)->DenseRange(1, 2)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
