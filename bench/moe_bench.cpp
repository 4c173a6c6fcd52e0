// MoE performance on qwen3-30b-a3b shapes (hidden 2048, expert FFN 768), bf16, one thread
// (run with OMP_NUM_THREADS=1).
//
//   BM_ExpertFfn/<rows per expert>   8 local experts, forward + backward (dgrad + wgrad); every
//     iteration runs, one after the other:
//       epo experts (experts_forward + experts_backward, gradient-accumulation fusion, packed
//         weights, row tiles) - the reported time;
//       the same 6 GEMMs per expert issued directly to oneDNN (exact-shape primitives created
//         outside the timed loop, plain weights) - no activation, no bookkeeping;
//       epo experts with plain (unpacked) weights.
//     Counters: GFLOP/s of each from the median time, epo_over_direct = direct time / epo time.
//   BM_MoeLayer/<tokens>/<fresh routing>   the whole layer, 8 experts, top-2, forward + backward:
//     the production MoE block (moe_block.h) with its token dispatcher over an expert-parallel
//     group of one, node by node as training runs it (y and dx in f32, the model's hand-offs)
//     fresh routing 1: new router weights every iteration, so the rows per expert change
//   Counters: GFLOP/s (model FLOPs: 18 * rows * H * F per expert pass, = 3 * T * K * 6 * H * F
//   for the layer, router not counted), minor page faults and new oneDNN primitives per
//   iteration (after the warm-up iterations), and for the layer the share of its time outside the
//   experts' nodes (routing_share), the time per node (ms_*, forward + backward), and the time
//   inside oneDNN's products with their rate (ms_gemm, gemm_GFLOPs: every GEMM of the step).
//   BM_SwiGlu/<0|1>  the activation forward / backward alone, as a 4096-token step runs it.
//
// Run: OMP_NUM_THREADS=1 scripts/guarded.sh build/release/bench/moe_bench
// The layer against PyTorch on the same shapes: scripts/bench_moe_vs_pytorch.sh
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "epo/comm/mpi_runtime.h"
#include "epo/comm/process_groups.h"
#include "epo/kernels/activation.h"
#include "epo/kernels/gemm.h"
#include "epo/moe/moe_block.h"
#include "epo/tensor/random.h"

namespace {

using epo::DType;
using epo::Tensor;
namespace moe = epo::moe;

constexpr std::int64_t kHidden = 2048, kFfn = 768, kExperts = 8;
// Steps before measuring: the first steps create primitives and settle the allocators (the
// process takes a few dozen page faults in steps 2-5, none after).
constexpr int kWarmupSteps = 5;
// With fresh routing every step, the weight-gradient products meet a new padded row count (a
// new primitive, and page faults for its code) until the range the routing produces has been
// seen: a few dozen steps for the benchmark's random router weights.
constexpr int kFreshRoutingWarmupSteps = 30;

long minor_faults() {
    rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

Tensor random_bf16(const epo::Shape& shape, std::uint64_t seed) {
    Tensor t = Tensor::empty(shape, DType::kBF16);
    epo::fill_uniform(t, seed, -1.0f, 1.0f);  // fast enough for 100M-element fills
    return t;
}

// Per-iteration counters measured around the timed loop.
struct SteadyState {
    long faults0 = minor_faults();
    std::int64_t prims0 = epo::kernels::gemm_cache_stats().creations;
    void report(benchmark::State& state) const {
        const double n = static_cast<double>(state.iterations());
        state.counters["faults/iter"] = static_cast<double>(minor_faults() - faults0) / n;
        state.counters["new_prims/iter"] =
            static_cast<double>(epo::kernels::gemm_cache_stats().creations - prims0) / n;
    }
};

// ---- The baseline: the experts' GEMMs straight through oneDNN's API --------------------------

using dnnl::memory;
using dt = memory::data_type;

struct DirectGemm {
    dnnl::matmul prim;
    memory::desc a, b, c;
};

// C[M,N] (+)= op(A)[M,K] op(B)[K,N], row-major, A stored transposed when ta, B when tb.
DirectGemm make_direct(dnnl::engine& eng, memory::dim m, memory::dim k, memory::dim n, bool ta,
                       bool tb, dt c_type, bool accumulate) {
    DirectGemm g;
    g.a = ta ? memory::desc({m, k}, dt::bf16, memory::dims{1, m})
             : memory::desc({m, k}, dt::bf16, memory::dims{k, 1});
    g.b = tb ? memory::desc({k, n}, dt::bf16, memory::dims{1, k})
             : memory::desc({k, n}, dt::bf16, memory::dims{n, 1});
    g.c = memory::desc({m, n}, c_type, memory::dims{n, 1});
    dnnl::primitive_attr attr;
    if (accumulate) {
        dnnl::post_ops ops;
        ops.append_sum(1.0f);
        attr.set_post_ops(ops);
    }
    g.prim =
        dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(g.a, g.b, g.c), attr, eng));
    return g;
}

void run_direct(const DirectGemm& g, dnnl::engine& eng, dnnl::stream& s, void* a, void* b,
                void* c) {
    memory am(g.a, eng, a), bm(g.b, eng, b), cm(g.c, eng, c);
    g.prim.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
}

char* rows_at(const Tensor& t, std::int64_t row) {
    return static_cast<char*>(t.raw()) + row * t.row_size() * epo::dtype_size(t.dtype());
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The three implementations run alternately inside every iteration, so a change in the
// machine's load hits them alike; the ratios compare medians of the same iterations.
void BM_ExpertFfn(benchmark::State& state) {
    const std::int64_t rows = state.range(0);
    const std::int64_t total = rows * kExperts;
    moe::ExpertWeights w = moe::make_expert_weights(kExperts, kHidden, kFfn, DType::kBF16);
    epo::fill_uniform(w.fc1.master, 1, -0.03f, 0.03f);
    epo::fill_uniform(w.fc2.master, 2, -0.03f, 0.03f);
    epo::refresh_compute(w.fc1);
    epo::refresh_compute(w.fc2);
    Tensor x = random_bf16({total, kHidden}, 3), dy = random_bf16({total, kHidden}, 4);
    Tensor y = Tensor::empty({total, kHidden}, DType::kBF16);
    Tensor dx = Tensor::empty({total, kHidden}, DType::kBF16);
    Tensor probs = Tensor::empty({total}, DType::kF32),
           dprobs = Tensor::empty({total}, DType::kF32);
    epo::fill_uniform(probs, 5, 0.1f, 1.0f);
    const std::vector<std::int64_t> counts(kExperts, rows);
    const moe::ExpertSegments seg = moe::make_expert_segments(counts, moe::kExpertRowAlign);

    moe::ExpertsContext ctx;
    epo::Arena arena("bench");
    auto epo_step = [&](bool packed) {
        w.use_packed = packed;
        arena.reset();
        moe::experts_forward(w, seg, x, probs, y, ctx, arena);
        moe::experts_backward(w, /*fusion=*/true, dy, dx, dprobs, ctx, arena);
    };

    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    Tensor h = random_bf16({rows, 2 * kFfn}, 6), a = random_bf16({rows, kFfn}, 7);
    Tensor da = random_bf16({rows, kFfn}, 8), dh = random_bf16({rows, 2 * kFfn}, 9);
    const std::vector<DirectGemm> g = {
        make_direct(eng, rows, kHidden, 2 * kFfn, false, true, dt::bf16, false),   // h = x W1^T
        make_direct(eng, rows, kFfn, kHidden, false, true, dt::bf16, false),       // y = a W2^T
        make_direct(eng, rows, kHidden, kFfn, false, false, dt::bf16, false),      // da = dy W2
        make_direct(eng, rows, 2 * kFfn, kHidden, false, false, dt::bf16, false),  // dx = dh W1
        make_direct(eng, kHidden, rows, kFfn, true, false, dt::f32, true),         // dW2 += dy^T a
        make_direct(eng, 2 * kFfn, rows, kHidden, true, false, dt::f32, true)};    // dW1 += dh^T x
    auto direct_step = [&] {
        for (std::int64_t e = 0; e < kExperts; ++e) {
            const std::int64_t r0 = e * rows;
            char* w1 = static_cast<char*>(w.fc1.compute.raw()) + e * 2 * kFfn * kHidden * 2;
            char* w2 = static_cast<char*>(w.fc2.compute.raw()) + e * kHidden * kFfn * 2;
            float* g1 = w.fc1.main_grad.data<float>() + e * 2 * kFfn * kHidden;
            float* g2 = w.fc2.main_grad.data<float>() + e * kHidden * kFfn;
            run_direct(g[0], eng, strm, rows_at(x, r0), w1, h.raw());
            run_direct(g[1], eng, strm, a.raw(), w2, rows_at(y, r0));
            run_direct(g[2], eng, strm, rows_at(dy, r0), w2, da.raw());
            run_direct(g[3], eng, strm, dh.raw(), w1, rows_at(dx, r0));
            run_direct(g[4], eng, strm, rows_at(dy, r0), a.raw(), g2);
            run_direct(g[5], eng, strm, dh.raw(), rows_at(x, r0), g1);
        }
    };

    for (int i = 0; i < kWarmupSteps; ++i) {
        epo_step(true);
        epo_step(false);
        direct_step();
    }
    SteadyState steady;
    std::vector<double> t_epo, t_direct, t_unpacked;
    for (auto _ : state) {
        auto t0 = std::chrono::steady_clock::now();
        epo_step(true);
        t_epo.push_back(seconds_since(t0));
        t0 = std::chrono::steady_clock::now();
        direct_step();
        t_direct.push_back(seconds_since(t0));
        t0 = std::chrono::steady_clock::now();
        epo_step(false);
        t_unpacked.push_back(seconds_since(t0));
        state.SetIterationTime(t_epo.back());
    }
    steady.report(state);
    const double gflop = 18.0 * static_cast<double>(total) * kHidden * kFfn * 1e-9;
    state.counters["epo_GFLOPs"] = gflop / median(t_epo);
    state.counters["direct_GFLOPs"] = gflop / median(t_direct);
    state.counters["unpacked_GFLOPs"] = gflop / median(t_unpacked);
    state.counters["epo_over_direct"] = median(t_direct) / median(t_epo);
    state.counters["unpacked_over_direct"] = median(t_direct) / median(t_unpacked);
}

// The production MoE block (moe_block.h) over an expert-parallel group of one, node by node as a
// training step with EP = 1 runs it: the output y and the input gradient dx in f32 (the model adds
// y to its residual and feeds dx to the norm's backward), weight gradients after the dgrads.
struct BlockStep {
    moe::MoeConfig cfg;
    moe::MoeLayerParams params;
    std::unique_ptr<moe::TokenDispatcher> dispatcher;
    std::unique_ptr<epo::comm::ProcessGroups> groups;
    epo::Arena arena{"block"}, scratch{"block scratch"};
    moe::MoeBlockState st;
    Tensor x, dy, y, dx;
    // Seconds per node over the timed steps.
    double pre_dispatch = 0, dispatch = 0, mlp = 0, combine = 0;
    double combine_bwd = 0, mlp_dgrad = 0, dispatch_bwd = 0, pre_dispatch_bwd = 0;
    double mlp_wgrad = 0, pre_dispatch_wgrad = 0;

    BlockStep(const moe::MoeConfig& c, std::int64_t tokens)
        : cfg(c),
          params(moe::make_moe_layer_params(c)),
          dispatcher(moe::make_token_dispatcher(c, 1, 0)),
          groups(epo::comm::ProcessGroups::create({1, 1, 1}, epo::comm::CommOptions{}, "bench",
                                                  nullptr, MPI_COMM_SELF)) {
        moe::init_moe_layer_params(params, 7, 0.02f);
        x = random_bf16({tokens, kHidden}, 8);
        dy = random_bf16({tokens, kHidden}, 9);
        y = Tensor::empty({tokens, kHidden}, DType::kF32);
        dx = Tensor::empty({tokens, kHidden}, DType::kF32);
    }
    void run() {
        const moe::MoeBlock b{cfg, params, *dispatcher};
        epo::comm::Communicator& ep = groups->ep;
        arena.reset();
        timed(pre_dispatch, [&] { moe::block_pre_dispatch_forward(b, x, 1, st, arena); });
        timed(dispatch, [&] { moe::block_dispatch_forward(b, ep, st, arena); });
        timed(mlp, [&] { moe::block_mlp_forward(b, st, arena); });
        timed(combine, [&] { moe::block_combine_forward(b, ep, st, y); });
        timed(combine_bwd, [&] { moe::block_combine_backward(b, ep, dy, st, arena); });
        timed(mlp_dgrad, [&] { moe::block_mlp_backward(b, st, arena); });
        timed(dispatch_bwd, [&] { moe::block_dispatch_backward(b, ep, st); });
        timed(pre_dispatch_bwd, [&] {
            scratch.reset();
            moe::block_pre_dispatch_backward(b, 1.0f, st, dx, arena, scratch);
        });
        timed(mlp_wgrad, [&] {
            scratch.reset();
            moe::block_mlp_backward_dw(b, st, scratch);
        });
        timed(pre_dispatch_wgrad, [&] {
            scratch.reset();
            moe::block_pre_dispatch_backward_dw(b, st, scratch);
        });
    }
    void zero_times() {
        pre_dispatch = dispatch = mlp = combine = 0;
        combine_bwd = mlp_dgrad = dispatch_bwd = pre_dispatch_bwd = mlp_wgrad = pre_dispatch_wgrad =
            0;
    }

private:
    template <class Fn>
    static void timed(double& into, Fn&& fn) {
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        into += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
};

void BM_MoeLayer(benchmark::State& state) {
    const std::int64_t tokens = state.range(0);
    const bool fresh_routing = state.range(1) != 0;
    moe::MoeConfig cfg;
    cfg.hidden_size = kHidden;
    cfg.num_experts = kExperts;
    cfg.topk = 2;
    cfg.ffn_hidden_size = kFfn;
    cfg.load_balancing_type = moe::LoadBalancing::kAuxLoss;
    cfg.aux_loss_coeff = 1e-3;
    cfg.gradient_accumulation_fusion = true;
    cfg.precision = moe::Precision::kBf16;
    BlockStep block(cfg, tokens);
    std::uint64_t seed = 100;
    auto reroute = [&] {
        epo::fill_normal(block.params.router.weight.master, ++seed, 0.0f, 0.02f);
        epo::refresh_compute(block.params.router.weight);
    };
    for (int i = 0; i < (fresh_routing ? kFreshRoutingWarmupSteps : kWarmupSteps); ++i) {
        if (fresh_routing) {
            reroute();
        }
        block.run();
    }
    block.zero_times();
    SteadyState steady;
    const epo::kernels::GemmCacheStats gemm0 = epo::kernels::gemm_cache_stats();
    std::vector<double> step_ms;
    for (auto _ : state) {
        if (fresh_routing) {
            state.PauseTiming();
            reroute();
            state.ResumeTiming();
        }
        const auto t0 = std::chrono::steady_clock::now();
        block.run();
        step_ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
    }
    steady.report(state);
    std::sort(step_ms.begin(), step_ms.end());
    state.counters["ms_median"] = step_ms[step_ms.size() / 2];  // the statistic peers report
    const epo::kernels::GemmCacheStats gemm1 = epo::kernels::gemm_cache_stats();
    const BlockStep& t = block;
    const double total = t.pre_dispatch + t.dispatch + t.mlp + t.combine + t.combine_bwd +
                         t.mlp_dgrad + t.dispatch_bwd + t.pre_dispatch_bwd + t.mlp_wgrad +
                         t.pre_dispatch_wgrad;
    // Everything but the experts' nodes: router, permutation, the dispatcher's phases, combine.
    state.counters["routing_share"] = (total - t.mlp - t.mlp_dgrad - t.mlp_wgrad) / total;
    const double ms = 1e3 / static_cast<double>(state.iterations());
    // Time inside oneDNN's products and their rate (router GEMMs included, as FLOPs and time).
    state.counters["ms_gemm"] = (gemm1.exec_seconds - gemm0.exec_seconds) * ms;
    state.counters["gemm_GFLOPs"] =
        (gemm1.flops - gemm0.flops) / (gemm1.exec_seconds - gemm0.exec_seconds) * 1e-9;
    state.counters["ms_pre_dispatch"] = (t.pre_dispatch + t.pre_dispatch_bwd) * ms;
    state.counters["ms_dispatch"] = (t.dispatch + t.dispatch_bwd) * ms;
    state.counters["ms_combine"] = (t.combine + t.combine_bwd) * ms;
    state.counters["ms_experts_fwd"] = t.mlp * ms;
    state.counters["ms_experts_dgrad"] = t.mlp_dgrad * ms;
    state.counters["ms_experts_wgrad"] = t.mlp_wgrad * ms;
    state.counters["ms_router_wgrad"] = t.pre_dispatch_wgrad * ms;
    state.counters["GFLOP/s"] =
        benchmark::Counter(18.0 * static_cast<double>(tokens) * cfg.topk * kHidden * kFfn * 1e-9,
                           benchmark::Counter::kIsIterationInvariantRate);
}

// The activation alone as a 4096-token step runs it: 8192 routed rows (F = 768, bf16), one
// 256-row tile at a time, forward (arg 0) and backward (arg 1).
void BM_SwiGlu(benchmark::State& state) {
    const std::int64_t tile = epo::kernels::kGemmRowTile, rows = 8192, tiles = rows / tile;
    const bool backward = state.range(0) != 0;
    Tensor h = random_bf16({rows, 2 * kFfn}, 1), a = random_bf16({rows, kFfn}, 2);
    Tensor dh = random_bf16({rows, 2 * kFfn}, 3);
    Tensor probs = Tensor::empty({rows}, DType::kF32), dprobs = Tensor::empty({rows}, DType::kF32);
    epo::fill_uniform(probs, 4, 0.0f, 1.0f);
    namespace k = epo::kernels;
    auto run = [&] {
        for (std::int64_t i = 0; i < tiles; ++i) {
            if (backward) {
                k::swiglu_backward(
                    k::sub_rows(k::as_matrix(h), i * tile, tile), probs.data<float>() + i * tile,
                    k::sub_rows(k::as_matrix(a), i * tile, tile),
                    k::sub_rows(k::as_matrix(dh), i * tile, tile), dprobs.data<float>() + i * tile);
            } else {
                k::swiglu_forward(k::sub_rows(k::as_matrix(h), i * tile, tile),
                                  probs.data<float>() + i * tile,
                                  k::sub_rows(k::as_matrix(a), i * tile, tile));
            }
        }
    };
    run();
    for (auto _ : state) {
        run();
    }
    state.counters["Melem/s"] = benchmark::Counter(static_cast<double>(rows * kFfn) * 1e-6,
                                                   benchmark::Counter::kIsIterationInvariantRate);
}

// Iterations per size: a few seconds each (three implementations per iteration).
BENCHMARK(BM_ExpertFfn)->Arg(512)->Iterations(12)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ExpertFfn)->Arg(1024)->Iterations(8)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ExpertFfn)->Arg(2048)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ExpertFfn)->Arg(4096)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SwiGlu)->DenseRange(0, 1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MoeLayer)
    ->Args({2048, 0})
    ->Args({4096, 0})
    ->Args({2048, 1})
    ->Args({4096, 1})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);

}  // namespace

int main(int argc, char** argv) {
    // The block's dispatcher runs over an MPI communicator (a group of one, MPI_COMM_SELF).
    epo::comm::MpiRuntime mpi(&argc, &argv);
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
        return 1;
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
