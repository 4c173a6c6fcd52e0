// Variable all-to-all under mpirun: throughput of Communicator::all_to_all_v against a raw
// MPI_Alltoallv of the same bytes in the same run (alternating, link model off), and the link
// model's accuracy (measured time of all-to-alls whose modelled time is 5-20 ms).
//
//   mpirun -np 2 build/release/bench/comm_alltoall_bench          (Open MPI: add
//   --allow-run-as-root) build/release/bin/epo launch -n 4 build/release/bench/comm_alltoall_bench
//
// Every rank runs every benchmark with fixed iteration counts (collectives need all ranks);
// rank 0 prints. GB/s = bytes this rank sent to other ranks / time (bytes actually moved).
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <vector>

#include "epo/comm/mpi_runtime.h"
#include "epo/comm/process_groups.h"
#include "mpi_benchmark_main.h"

namespace {

using epo::comm::AllToAllLayout;
using epo::comm::Clock;

int rank_() {
    return epo::comm::current_world_rank();
}
int size_() {
    return epo::comm::current_world_size();
}

// Per-peer sizes vary around `mean` (0.5x .. 1.5x), the same matrix on every rank.
AllToAllLayout variable_layout(int64_t mean, int n, int me) {
    auto count = [&](int s, int d) {
        return s == d ? mean / 4 : mean / 2 + mean * ((s * 7 + d * 3) % 5) / 4;
    };
    std::vector<int64_t> send(n), recv(n);
    for (int p = 0; p < n; ++p) {
        send[p] = count(me, p);
        recv[p] = count(p, me);
    }
    return AllToAllLayout::packed(send, recv);
}

std::vector<int> to_int(const std::vector<int64_t>& v) {
    return {v.begin(), v.end()};
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

void BM_AllToAllVsRawMpi(benchmark::State& state) {
    const int n = size_();
    const int me = rank_();
    auto groups = epo::comm::ProcessGroups::create({n, n, 1}, {}, "bench", nullptr);
    MPI_Comm raw;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    const auto layout = variable_layout(state.range(0), n, me);
    std::vector<char> send(layout.send_extent(), 1), recv(layout.recv_extent());
    const auto sc = to_int(layout.send_counts), so = to_int(layout.send_offsets);
    const auto rc = to_int(layout.recv_counts), ro = to_int(layout.recv_offsets);
    int64_t moved = 0;
    for (int p = 0; p < n; ++p)
        moved += p == me ? 0 : layout.send_counts[p];
    std::vector<double> t_raw, t_epo;
    for (auto _ : state) {
        // Alternate raw and epo so that both see the same machine load.
        MPI_Barrier(raw);
        auto t0 = Clock::now();
        MPI_Alltoallv(send.data(), sc.data(), so.data(), MPI_BYTE, recv.data(), rc.data(),
                      ro.data(), MPI_BYTE, raw);
        t_raw.push_back(epo::comm::seconds_between(t0, Clock::now()));
        MPI_Barrier(raw);
        t0 = Clock::now();
        groups->ep.all_to_all_v(send.data(), recv.data(), layout, 1);
        t_epo.push_back(epo::comm::seconds_between(t0, Clock::now()));
        state.SetIterationTime(t_epo.back());
    }
    const double raw_gbps = moved / median(t_raw) / 1e9;
    const double epo_gbps = moved / median(t_epo) / 1e9;
    state.counters["raw_GBps"] = raw_gbps;
    state.counters["epo_GBps"] = epo_gbps;
    state.counters["epo_over_raw"] = epo_gbps / raw_gbps;
    state.counters["bytes_per_rank"] = static_cast<double>(moved);
    MPI_Comm_free(&raw);
}
BENCHMARK(BM_AllToAllVsRawMpi)
    ->Arg(64 << 10)
    ->Arg(1 << 20)
    ->Arg(8 << 20)
    ->Iterations(30)
    ->Repetitions(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Link model: B_inter = 8 Gbit/s (1e9 bytes/s), latency 50 us, one rank per node (every byte is
// inter-node). Per-peer size chosen so the model says `range(0)` ms. Counters: see
// ModelAccuracy (mpi_benchmark_main.h).
void BM_LinkModelAccuracy(benchmark::State& state) {
    const int n = size_();
    epo::comm::CommOptions options;
    options.link = {8, 0, 50};
    auto groups = epo::comm::ProcessGroups::create({n, n, 1}, options, "bench", nullptr);
    const double model_s = state.range(0) * 1e-3;
    const int64_t per_peer = n > 1 ? static_cast<int64_t>((model_s - 50e-6) * 1e9 / (n - 1)) : 0;
    const auto layout = AllToAllLayout::packed(std::vector<int64_t>(n, per_peer),
                                               std::vector<int64_t>(n, per_peer));
    std::vector<char> send(layout.send_extent(), 1), recv(layout.recv_extent());
    // One untimed operation first: the receive buffer's first touch (page faults) and MPI's
    // first use of its shared-memory segments are not the link model's business.
    groups->ep.all_to_all_v(send.data(), recv.data(), layout, 1);
    epo::bench::ModelAccuracy accuracy;
    double modelled = 0;
    for (auto _ : state) {
        MPI_Barrier(MPI_COMM_WORLD);
        const auto t0 = Clock::now();
        const auto s = groups->ep.all_to_all_v(send.data(), recv.data(), layout, 1);
        const double t = epo::comm::seconds_between(t0, Clock::now());
        state.SetIterationTime(t);
        modelled = s.modelled_s;
        accuracy.add(t, s);
    }
    state.counters["model_ms"] = modelled * 1e3;
    accuracy.report(state);
}
BENCHMARK(BM_LinkModelAccuracy)
    ->Arg(5)
    ->Arg(10)
    ->Arg(20)
    ->Iterations(40)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
    return epo::bench::run_mpi_benchmarks(argc, argv);
}
