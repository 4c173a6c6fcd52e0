// The alltoall token dispatcher (moe/token_dispatcher.h) under mpirun: dispatch + combine
// throughput against raw MPI_Alltoallv of the same bytes in the same run, and with the link model
// on, measured vs modelled time.
//
//   build/release/bin/epo launch -n 2 build/release/bench/moe_dispatch_bench
//   build/release/bin/epo launch -n 4 build/release/bench/moe_dispatch_bench
//
// Shapes: T tokens per rank (arg), H = 2048 bf16, E = 8 experts, top-2, uniform random routing
// (a pure function of rank and token). One dispatch + combine = three all-to-alls over the EP
// group (rows and weights to the experts, rows back). GB/s = bytes this rank sent to other ranks
// in them / median time; raw = MPI_Alltoallv with the same counts and offsets on a duplicate of
// MPI_COMM_WORLD, alternating with the dispatcher in every iteration. full_GBps also counts the
// local work around the exchanges (permute, sort, unsort, combine).
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>

#include "epo/comm/process_groups.h"
#include "epo/moe/alltoall_dispatcher.h"
#include "epo/tensor/random.h"
#include "mpi_benchmark_main.h"

namespace {

using epo::Arena;
using epo::DType;
using epo::Tensor;
using epo::comm::Clock;
using namespace epo::moe;

constexpr std::int64_t kHidden = 2048, kExperts = 8, kTopk = 2;

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

struct Setup {
    MoeConfig cfg;
    RouterOutput routing;  // topk_index, topk_weight
    Tensor x;
    explicit Setup(std::int64_t tokens, int rank) {
        cfg.hidden_size = kHidden;
        cfg.num_experts = kExperts;
        cfg.topk = kTopk;
        cfg.ffn_hidden_size = 1;
        cfg.precision = Precision::kBf16;
        Tensor& topk_index = routing.topk_index;
        Tensor& topk_weight = routing.topk_weight;
        topk_index = Tensor::empty({tokens, kTopk}, DType::kI32);
        topk_weight = Tensor::empty({tokens, kTopk}, DType::kF32);
        for (std::int64_t t = 0; t < tokens; ++t) {
            const auto bits = epo::random_bits(rank + 1, static_cast<std::uint64_t>(t));
            const std::int64_t a = bits % kExperts,
                               b = (a + 1 + (bits >> 8) % (kExperts - 1)) % kExperts;
            topk_index.data<std::int32_t>()[t * 2] = static_cast<std::int32_t>(a);
            topk_index.data<std::int32_t>()[t * 2 + 1] = static_cast<std::int32_t>(b);
            topk_weight.data<float>()[t * 2] = 0.6f;
            topk_weight.data<float>()[t * 2 + 1] = 0.4f;
        }
        x = Tensor::empty({tokens, kHidden}, DType::kBF16);
        epo::fill_normal(x, 7, 0.0f, 1.0f);
    }
};

std::vector<int> bytes_of(const std::vector<std::int64_t>& rows, std::int64_t row_bytes) {
    std::vector<int> out;
    for (auto r : rows)
        out.push_back(static_cast<int>(r * row_bytes));
    return out;
}

void BM_DispatchCombineVsRawMpi(benchmark::State& state) {
    const int n = epo::comm::current_world_size(), me = epo::comm::current_world_rank();
    const std::int64_t tokens = state.range(0);
    auto groups = epo::comm::ProcessGroups::create({n, n, 1}, {}, "bench", nullptr);
    MPI_Comm raw;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    const Setup s(tokens, me);
    Arena arena;
    AlltoallDispatch d;
    alltoall::dispatch_preprocess(s.cfg, groups->ep.size(), groups->ep.rank(), s.routing, d, arena);
    alltoall::dispatch_permute(s.routing, s.x, d);
    alltoall::exchange_counts(s.cfg, groups->ep, d, arena);
    const Tensor y = Tensor::empty({tokens, kHidden}, DType::kBF16);
    // Raw MPI_Alltoallv in bytes with the dispatcher's layouts.
    const std::int64_t row = kHidden * 2;
    const auto& l = d.layout;
    const auto xs = bytes_of(l.send_counts, row), xso = bytes_of(l.send_offsets, row);
    const auto xr = bytes_of(l.recv_counts, row), xro = bytes_of(l.recv_offsets, row);
    const auto ps = bytes_of(l.send_counts, 4), pso = bytes_of(l.send_offsets, 4);
    const auto pr = bytes_of(l.recv_counts, 4), pro = bytes_of(l.recv_offsets, 4);
    std::int64_t moved = 0;
    for (int p = 0; p < n; ++p) {
        if (p != groups->ep.rank())
            moved += (l.send_counts[p] + l.recv_counts[p]) * row + l.send_counts[p] * 4;
    }
    std::vector<double> t_raw, t_epo, t_full;
    for (auto _ : state) {
        MPI_Barrier(raw);
        auto t0 = Clock::now();
        MPI_Alltoallv(d.send_rows.raw(), xs.data(), xso.data(), MPI_BYTE, d.recv_rows.raw(),
                      xr.data(), xro.data(), MPI_BYTE, raw);
        MPI_Alltoallv(d.send_probs.raw(), ps.data(), pso.data(), MPI_BYTE, d.recv_probs.raw(),
                      pr.data(), pro.data(), MPI_BYTE, raw);
        MPI_Alltoallv(d.combine_send.raw(), xr.data(), xro.data(), MPI_BYTE, d.combine_recv.raw(),
                      xs.data(), xso.data(), MPI_BYTE, raw);
        t_raw.push_back(epo::comm::seconds_between(t0, Clock::now()));

        MPI_Barrier(raw);
        t0 = Clock::now();
        alltoall::token_dispatch(groups->ep, d);
        alltoall::token_combine(groups->ep, d);
        t_epo.push_back(epo::comm::seconds_between(t0, Clock::now()));
        state.SetIterationTime(t_epo.back());

        MPI_Barrier(raw);
        t0 = Clock::now();
        alltoall::dispatch_permute(s.routing, s.x, d);
        alltoall::token_dispatch(groups->ep, d);
        alltoall::dispatch_postprocess(d);
        d.expert_out.copy_from(d.expert_rows);  // identity experts
        alltoall::combine_preprocess(d);
        alltoall::token_combine(groups->ep, d);
        alltoall::combine_postprocess(d, Tensor(), y);
        t_full.push_back(epo::comm::seconds_between(t0, Clock::now()));
    }
    const double raw_gbps = moved / median(t_raw) / 1e9, epo_gbps = moved / median(t_epo) / 1e9;
    state.counters["raw_GBps"] = raw_gbps;
    state.counters["epo_GBps"] = epo_gbps;
    state.counters["epo_over_raw"] = epo_gbps / raw_gbps;
    state.counters["full_GBps"] = moved / median(t_full) / 1e9;
    state.counters["MB_sent"] = moved / 1e6;
    MPI_Comm_free(&raw);
}
BENCHMARK(BM_DispatchCombineVsRawMpi)
    ->Arg(512)
    ->Arg(2048)
    ->Iterations(20)
    ->Repetitions(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Link model on: 8 Gbit/s between nodes (1e9 bytes/s), 20 us latency, one rank per node. The
// dispatcher's layouts for rows there and back (the weights' all-to-all is tiny), each
// all-to-all's measured time (entry to return) against its own modelled time; only those
// modelled at 5 ms or more count. Counters: see ModelAccuracy (mpi_benchmark_main.h).
void BM_DispatchLinkModel(benchmark::State& state) {
    const int n = epo::comm::current_world_size(), me = epo::comm::current_world_rank();
    const std::int64_t tokens = state.range(0);
    epo::comm::CommOptions options;
    options.link = {8, 0, 20};
    auto groups = epo::comm::ProcessGroups::create({n, n, 1}, options, "bench", nullptr);
    const Setup s(tokens, me);
    Arena arena;
    AlltoallDispatch d;
    alltoall::dispatch_preprocess(s.cfg, groups->ep.size(), groups->ep.rank(), s.routing, d, arena);
    alltoall::exchange_counts(s.cfg, groups->ep, d, arena);
    // One untimed dispatch + combine first (MPI's first use of its shared-memory segments).
    alltoall::token_dispatch(groups->ep, d);
    alltoall::token_combine(groups->ep, d);
    epo::bench::ModelAccuracy accuracy;
    double modelled = 0;
    for (auto _ : state) {
        MPI_Barrier(MPI_COMM_WORLD);
        // The dispatcher's all-to-alls of rows, each timed from entry to return.
        const std::size_t row_bytes = kHidden * 2;
        const auto t0 = Clock::now();
        const auto fwd =
            groups->ep.all_to_all_v(d.send_rows.raw(), d.recv_rows.raw(), d.layout, row_bytes);
        const auto t1 = Clock::now();
        MPI_Barrier(MPI_COMM_WORLD);
        const auto t2 = Clock::now();
        const auto back = groups->ep.all_to_all_v(d.combine_send.raw(), d.combine_recv.raw(),
                                                  d.layout.swapped(), row_bytes);
        const auto t3 = Clock::now();
        for (auto [op, from, to] : {std::tuple{fwd, t0, t1}, std::tuple{back, t2, t3}}) {
            if (op.modelled_s >= 5e-3)
                accuracy.add(epo::comm::seconds_between(from, to), op);
        }
        modelled = fwd.modelled_s;
        state.SetIterationTime(epo::comm::seconds_between(t0, t3));
    }
    state.counters["rows_model_ms"] = modelled * 1e3;
    accuracy.report(state);
}
BENCHMARK(BM_DispatchLinkModel)
    ->Arg(2048)
    ->Iterations(20)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
    return epo::bench::run_mpi_benchmarks(argc, argv);
}
