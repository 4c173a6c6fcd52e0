// GEMM on the expert shapes of qwen3-30b-a3b (hidden 2048, expert FFN 768), bf16, one thread:
// how to run products whose row count changes every call (routed rows per expert) without
// creating a oneDNN primitive per new row count.
//
//   BM_RowGemm/<shape>/<M>/<mode>   forward/dgrad-like products, M = rows
//     mode 0: exact M, plain weights          (a new primitive per new M)
//     mode 1: exact M, packed weights         (a new primitive per new M)
//     mode 2: row tiles, packed weights       (what the experts use; bounded primitives)
//     mode 3: tiles of 512 + remainder pieces (alternative tile size), packed weights
//   BM_WgradGemm/<shape>/<M>/<mode>  weight-gradient products, M = reduction length
//     mode 0: exact M, one call (A transposed, accumulate)
//     mode 1: M split into 512-row chunks accumulated into C
//     mode 2: exact M without accumulate (overwrite C)
//     mode 3: exact M with A stored already transposed ([x, M], not a strided view)
//     mode 4: moe::accumulate_weight_grad with fusion (what every weight gradient runs: mode 0
//             issued in blocks of kWeightGradRowBlock gradient rows)
//   BM_PrimitiveCreation/<shape>     cost of creating one primitive for a new row count
//
// Run: OMP_NUM_THREADS=1 build/release/bench/gemm_bench --benchmark_repetitions=3
#include <benchmark/benchmark.h>

#include <algorithm>

#include "epo/kernels/gemm.h"
#include "epo/moe/weight_grad.h"
#include "epo/tensor/random.h"

namespace {

using epo::DType;
using epo::Tensor;
using namespace epo::kernels;

struct RowShape {
    const char* name;
    std::int64_t k, n;
    bool trans_b;  // weight stored [N, K] (forward) or [K, N] (dgrad)
};
constexpr RowShape kRowShapes[] = {
    {"fc1_fwd", 2048, 1536, true},
    {"fc2_fwd", 768, 2048, true},
    {"fc1_dgrad", 1536, 2048, false},
    {"fc2_dgrad", 2048, 768, false},
};

Tensor random_bf16(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
    Tensor t = Tensor::empty({rows, cols}, DType::kBF16);
    epo::fill_normal(t, seed, 0.0f, 1.0f);
    return t;
}

void BM_RowGemm(benchmark::State& state) {
    const RowShape& s = kRowShapes[state.range(0)];
    const std::int64_t m = state.range(1);
    const int mode = static_cast<int>(state.range(2));
    Tensor a = random_bf16(m, s.k, 1);
    Tensor w = s.trans_b ? random_bf16(s.n, s.k, 2) : random_bf16(s.k, s.n, 2);
    Tensor c = Tensor::zeros({m, s.n}, DType::kF32);
    PackedMatrix packed = pack_b(as_matrix(w), s.trans_b);
    auto run = [&] {
        switch (mode) {
            case 0:
                gemm(as_matrix(a), as_matrix(w), as_matrix(c), {false, s.trans_b});
                break;
            case 1:
                gemm(as_matrix(a), packed, as_matrix(c));
                break;
            case 2:
                gemm(as_matrix(a), packed, as_matrix(c), {false, false, false, true});
                break;
            default: {
                std::int64_t m0 = 0;
                for (; m - m0 >= 512; m0 += 512) {
                    gemm(sub_rows(as_matrix(a), m0, 512), packed, sub_rows(as_matrix(c), m0, 512));
                }
                if (m0 < m) {
                    gemm(sub_rows(as_matrix(a), m0, m - m0), packed,
                         sub_rows(as_matrix(c), m0, m - m0), {false, false, false, true});
                }
            }
        }
    };
    run();  // create the primitives outside the timed loop
    for (auto _ : state) {
        run();
    }
    state.SetLabel(s.name);
    state.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * s.k * s.n * 1e-9,
                                                   benchmark::Counter::kIsIterationInvariantRate);
}

struct WgradShape {
    const char* name;
    std::int64_t x, y;  // dW[x, y] = A^T B, A stored [M, x], B stored [M, y]
};
constexpr WgradShape kWgradShapes[] = {{"fc1_wgrad", 1536, 2048}, {"fc2_wgrad", 2048, 768}};

void BM_WgradGemm(benchmark::State& state) {
    const WgradShape& s = kWgradShapes[state.range(0)];
    const std::int64_t m = state.range(1);
    const int mode = static_cast<int>(state.range(2));
    Tensor a = random_bf16(m, s.x, 1);
    Tensor at = random_bf16(s.x, m, 1);
    Tensor b = random_bf16(m, s.y, 2);
    Tensor c = Tensor::zeros({s.x, s.y}, DType::kF32);
    const GemmOptions acc{true, false, true, false};
    auto run = [&] {
        if (mode == 0) {
            gemm(as_matrix(a), as_matrix(b), as_matrix(c), acc);
            return;
        }
        if (mode == 2) {
            gemm(as_matrix(a), as_matrix(b), as_matrix(c), {true, false, false, false});
            return;
        }
        if (mode == 4) {
            epo::moe::accumulate_weight_grad(as_matrix(a), as_matrix(b), as_matrix(c), true, false,
                                             true, Tensor());
            return;
        }
        if (mode == 3) {
            gemm(as_matrix(at), as_matrix(b), as_matrix(c), {false, false, true, false});
            return;
        }
        for (std::int64_t m0 = 0; m0 < m; m0 += 512) {
            const std::int64_t rows = std::min<std::int64_t>(512, m - m0);
            gemm(sub_rows(as_matrix(a), m0, rows), sub_rows(as_matrix(b), m0, rows), as_matrix(c),
                 acc);
        }
    };
    run();
    for (auto _ : state) {
        run();
    }
    state.SetLabel(s.name);
    state.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * s.x * s.y * 1e-9,
                                                   benchmark::Counter::kIsIterationInvariantRate);
}

void BM_PrimitiveCreation(benchmark::State& state) {
    const RowShape& s = kRowShapes[state.range(0)];
    Tensor a = random_bf16(4096, s.k, 1);
    Tensor w = s.trans_b ? random_bf16(s.n, s.k, 2) : random_bf16(s.k, s.n, 2);
    Tensor c = Tensor::zeros({4096, s.n}, DType::kF32);
    PackedMatrix packed = pack_b(as_matrix(w), s.trans_b);
    std::int64_t m = 3000;
    double seconds = 0;
    std::int64_t made = 0;
    for (auto _ : state) {
        const auto before = gemm_cache_stats();
        // A row count not seen before: the cached path must create a primitive.
        ++m;
        gemm_impl_name(sub_rows(as_matrix(a), 0, m), packed, sub_rows(as_matrix(c), 0, m));
        const auto after = gemm_cache_stats();
        seconds += after.create_seconds - before.create_seconds;
        made += after.creations - before.creations;
    }
    state.SetLabel(s.name);
    state.counters["ms_per_primitive"] = made ? seconds / static_cast<double>(made) * 1e3 : 0;
}

void row_args(benchmark::internal::Benchmark* b) {
    for (int shape = 0; shape < 4; ++shape) {
        for (int m : {512, 700, 1000, 2048, 4096}) {
            for (int mode = 0; mode < 4; ++mode) {
                b->Args({shape, m, mode});
            }
        }
    }
}

void wgrad_args(benchmark::internal::Benchmark* b) {
    for (int shape = 0; shape < 2; ++shape) {
        for (int m : {512, 1024, 2048, 4096}) {
            for (int mode = 0; mode < 5; ++mode) {
                b->Args({shape, m, mode});
            }
        }
    }
}

BENCHMARK(BM_RowGemm)->Apply(row_args)->Unit(benchmark::kMillisecond)->MinTime(0.3);
BENCHMARK(BM_WgradGemm)->Apply(wgrad_args)->Unit(benchmark::kMillisecond)->MinTime(0.3);
BENCHMARK(BM_PrimitiveCreation)->DenseRange(0, 3)->Iterations(20)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
