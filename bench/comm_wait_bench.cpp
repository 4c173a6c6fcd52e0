// What waiting for a late peer costs the compute thread on the same core, under mpirun -np 2.
//
// Rank 0 pins its compute thread and its communication thread to CPU 0; the communication thread
// enters an all-to-all that rank 1 (on CPU 1) joins only after a window W, while the compute
// thread runs a GEMM loop (oneDNN sgemm, one thread) for W. Each iteration measures the GEMM rate
// alone and then while the other thread waits, back to back; the counter gemm_rate_while_waiting
// is the median ratio (1.0 = the wait cost nothing). Rank 1 sleeps while rank 0 measures.
// Strategies:
//   epo            Communicator::all_to_all_v (arrival phase: short spin, then 50 us..1 ms sleeps)
//   mpi_blocking   MPI_Alltoallv: the library busy-polls
//   test_50us      MPI_Ialltoallv + MPI_Test every 50 us (testing too often)
//   test_1ms       MPI_Ialltoallv + MPI_Test every 1 ms
//
//   build/release/bin/epo launch -n 2 build/release/bench/comm_wait_bench
#include <benchmark/benchmark.h>
#include <mpi.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "epo/comm/mpi_runtime.h"
#include "epo/comm/process_groups.h"
#include "mpi_benchmark_main.h"

namespace {

using epo::comm::Clock;
using namespace std::chrono_literals;

void pin_to_cpu(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu % std::max(1u, std::thread::hardware_concurrency()), &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

constexpr int kDim = 192;

// GEMMs completed per second during `window`.
double gemm_rate(std::chrono::milliseconds window) {
    static std::vector<float> a(kDim * kDim, 0.5f), b(kDim * kDim, 0.25f), c(kDim * kDim);
    const auto end = Clock::now() + window;
    int64_t done = 0;
    const auto t0 = Clock::now();
    while (Clock::now() < end) {
        dnnl_sgemm('N', 'N', kDim, kDim, kDim, 1.0f, a.data(), kDim, b.data(), kDim, 0.0f, c.data(),
                   kDim);
        ++done;
    }
    return done / epo::comm::seconds_between(t0, Clock::now());
}

enum Strategy { kEpo, kMpiBlocking, kTest50us, kTest1ms };

double thread_cpu_s() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void BM_WaitCost(benchmark::State& state) {
    const int n = epo::comm::current_world_size();
    const int me = epo::comm::current_world_rank();
    if (n != 2) {
        state.SkipWithError("run with exactly 2 ranks");
        for (auto _ : state) {
        }
        return;
    }
    const auto strategy = static_cast<Strategy>(state.range(0));
    const auto window = std::chrono::milliseconds(state.range(1));
    auto groups = epo::comm::ProcessGroups::create({n, n, 1}, {}, "bench", nullptr);
    MPI_Comm raw;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    const int64_t per_peer = 64 << 10;
    const auto layout = epo::comm::AllToAllLayout::packed(std::vector<int64_t>(n, per_peer),
                                                          std::vector<int64_t>(n, per_peer));
    std::vector<char> send(2 * per_peer, 1), recv(2 * per_peer);
    const std::vector<int> counts(n, per_peer), offsets{0, static_cast<int>(per_peer)};

    auto all_to_all = [&] {
        if (strategy == kEpo) {
            groups->ep.all_to_all_v(send.data(), recv.data(), layout, 1);
        } else if (strategy == kMpiBlocking) {
            MPI_Alltoallv(send.data(), counts.data(), offsets.data(), MPI_BYTE, recv.data(),
                          counts.data(), offsets.data(), MPI_BYTE, raw);
        } else {
            MPI_Request req;
            MPI_Ialltoallv(send.data(), counts.data(), offsets.data(), MPI_BYTE, recv.data(),
                           counts.data(), offsets.data(), MPI_BYTE, raw, &req);
            int done = 0;
            while (!done) {
                MPI_Test(&req, &done, MPI_STATUS_IGNORE);
                if (!done)
                    std::this_thread::sleep_for(strategy == kTest50us ? 50us : 1ms);
            }
        }
    };

    pin_to_cpu(me);
    std::vector<double> ratios, comm_cpu;
    // One window alone, one window while the other thread waits; the order alternates between
    // iterations so that drifts in machine load do not favour either.
    auto measure_alone = [&] {
        MPI_Barrier(raw);
        double rate = 0;
        if (me == 0) {
            rate = gemm_rate(window);
        } else {
            // Rank 1 sleeps through rank 0's windows: the two vCPUs may be hyperthreads of one
            // core, so a busy rank 1 would slow rank 0's GEMM by itself.
            std::this_thread::sleep_for(window + 20ms);
        }
        return rate;
    };
    auto measure_contended = [&] {
        MPI_Barrier(raw);
        double rate = 0;
        if (me == 0) {
            std::thread comm([&] {
                pin_to_cpu(0);
                const double c0 = thread_cpu_s();
                all_to_all();
                comm_cpu.push_back(thread_cpu_s() - c0);
            });
            rate = gemm_rate(window);
            comm.join();
        } else {
            // Join late: rank 0's communication thread waits for the whole window.
            std::this_thread::sleep_for(window + 20ms);
            all_to_all();
        }
        return rate;
    };
    int iteration = 0;
    for (auto _ : state) {
        double alone = 0;
        double contended = 0;
        if (iteration++ % 2 == 0) {
            alone = measure_alone();
            contended = measure_contended();
        } else {
            contended = measure_contended();
            alone = measure_alone();
        }
        if (me == 0)
            ratios.push_back(contended / alone);
        state.SetIterationTime(window.count() * 1e-3);
    }
    if (me == 0) {
        std::sort(ratios.begin(), ratios.end());
        state.counters["gemm_rate_while_waiting"] = ratios[ratios.size() / 2];
        state.counters["min"] = ratios.front();
        state.counters["max"] = ratios.back();
        std::sort(comm_cpu.begin(), comm_cpu.end());
        state.counters["waiter_cpu_ms"] = comm_cpu[comm_cpu.size() / 2] * 1e3;
    }
    MPI_Comm_free(&raw);
}
BENCHMARK(BM_WaitCost)
    ->ArgNames({"strategy", "window_ms"})
    ->Args({kEpo, 200})
    ->Args({kMpiBlocking, 200})
    ->Args({kTest50us, 200})
    ->Args({kTest1ms, 200})
    ->Iterations(8)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The other side: rank 0 arrives LAST, after rank 1 has waited `range(1)` ms. With epo, rank 1
// sleeps between tests, so rank 0 may spin in the data phase until rank 1 wakes (at most one
// sleep, up to 1 ms, plus wake-up lateness). Counter: CPU time rank 0's thread spent in the call.
void BM_LateRankCost(benchmark::State& state) {
    const int n = epo::comm::current_world_size();
    const int me = epo::comm::current_world_rank();
    if (n != 2) {
        state.SkipWithError("run with exactly 2 ranks");
        for (auto _ : state) {
        }
        return;
    }
    const auto strategy = static_cast<Strategy>(state.range(0));
    auto groups = epo::comm::ProcessGroups::create({n, n, 1}, {}, "bench", nullptr);
    MPI_Comm raw;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    const int64_t per_peer = 64 << 10;
    const auto layout = epo::comm::AllToAllLayout::packed(std::vector<int64_t>(n, per_peer),
                                                          std::vector<int64_t>(n, per_peer));
    std::vector<char> send(2 * per_peer, 1), recv(2 * per_peer);
    const std::vector<int> counts(n, per_peer), offsets{0, static_cast<int>(per_peer)};
    pin_to_cpu(me);
    std::vector<double> cpu, wall;
    for (auto _ : state) {
        MPI_Barrier(raw);
        if (me == 0)
            std::this_thread::sleep_for(std::chrono::milliseconds(state.range(1)));
        const double c0 = thread_cpu_s();
        const auto t0 = Clock::now();
        if (strategy == kEpo) {
            groups->ep.all_to_all_v(send.data(), recv.data(), layout, 1);
        } else {
            MPI_Alltoallv(send.data(), counts.data(), offsets.data(), MPI_BYTE, recv.data(),
                          counts.data(), offsets.data(), MPI_BYTE, raw);
        }
        cpu.push_back(thread_cpu_s() - c0);
        wall.push_back(epo::comm::seconds_between(t0, Clock::now()));
        state.SetIterationTime(wall.back());
    }
    if (me == 0) {
        std::sort(cpu.begin(), cpu.end());
        std::sort(wall.begin(), wall.end());
        state.counters["late_rank_cpu_ms"] = cpu[cpu.size() / 2] * 1e3;
        state.counters["late_rank_cpu_ms_max"] = cpu.back() * 1e3;
        state.counters["late_rank_wall_ms"] = wall[wall.size() / 2] * 1e3;
    }
    MPI_Comm_free(&raw);
}
BENCHMARK(BM_LateRankCost)
    ->ArgNames({"strategy", "late_ms"})
    ->Args({kEpo, 20})
    ->Args({kMpiBlocking, 20})
    ->Iterations(30)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
    return epo::bench::run_mpi_benchmarks(argc, argv);
}
