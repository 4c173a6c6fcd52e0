// What the data phase of a collective costs the communication thread, under mpirun -np 2: CPU
// time per MB moved, and the rate of a compute thread pinned to the same core during a transfer.
//
// Both benchmarks alternate, inside one run, the blocking MPI_Alltoallv that the data phase used
// to be (the library busy-polls until the bytes have moved) and Communicator::all_to_all_v (its
// progress loop: non-blocking transfers, tests with sleeps in between), over the same bytes:
//   BM_DataPhaseCpu/mb: a 2-rank all-to-all of `mb` MB per peer; counters *_cpu_ms_per_MB (CPU
//     of the calling thread, CLOCK_THREAD_CPUTIME_ID, per MB this rank sent), *_GBps (sent /
//     wall time), medians over the iterations.
//   BM_ComputeDuringTransfer/mb: rank 0 pins a GEMM loop and the communicating thread to CPU 0
//     and compares the GEMM rate during the transfer with the rate alone (1.0 = the transfer cost
//     the compute thread nothing); rank 1 uses CPU 1.
// The transport is Open MPI's choice: shared memory between ranks of one host; force TCP with
//   mpirun --mca btl tcp,self --mca btl_tcp_if_include lo ...
// and measure a slow link between emulated hosts (docs/emulated-cluster.md). Command lines and
// results: docs/runtime.md "Data phase".
#include <benchmark/benchmark.h>
#include <mpi.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <functional>
#include <thread>
#include <vector>

#include "epo/comm/mpi_runtime.h"
#include "epo/comm/process_groups.h"
#include "mpi_benchmark_main.h"

namespace {

using epo::comm::Clock;

double thread_cpu_s() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

void pin_to_cpu(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu % std::max(1u, std::thread::hardware_concurrency()), &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

// A 2-rank all-to-all of `per_peer` bytes to the other rank (and as many to itself), either way.
struct Exchange {
    explicit Exchange(int64_t per_peer, const epo::comm::CommOptions& options = {})
        : groups(epo::comm::ProcessGroups::create({2, 2, 1}, options, "bench", nullptr)),
          layout(epo::comm::AllToAllLayout::packed({per_peer, per_peer}, {per_peer, per_peer})),
          send(2 * per_peer, static_cast<char>(epo::comm::current_world_rank() + 1)),
          recv(2 * per_peer),
          counts{static_cast<int>(per_peer), static_cast<int>(per_peer)},
          offsets{0, static_cast<int>(per_peer)} {
        MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    }
    ~Exchange() { MPI_Comm_free(&raw); }
    void run(bool blocking) {
        if (blocking) {
            MPI_Alltoallv(send.data(), counts.data(), offsets.data(), MPI_BYTE, recv.data(),
                          counts.data(), offsets.data(), MPI_BYTE, raw);
        } else {
            groups->ep.all_to_all_v(send.data(), recv.data(), layout, 1);
        }
    }
    std::unique_ptr<epo::comm::ProcessGroups> groups;
    epo::comm::AllToAllLayout layout;
    std::vector<char> send, recv;
    std::vector<int> counts, offsets;
    MPI_Comm raw = MPI_COMM_NULL;
};

// A barrier that sleeps while it waits (MPI_Barrier busy-polls: on a machine whose two vCPUs may
// be hyperthreads of one core, a spinning rank 1 would slow rank 0's measurement by itself).
void sleepy_barrier(MPI_Comm comm) {
    MPI_Request req;
    MPI_Ibarrier(comm, &req);
    int done = 0;
    while (MPI_Test(&req, &done, MPI_STATUS_IGNORE), !done)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
}

bool two_ranks(benchmark::State& state) {
    if (epo::comm::current_world_size() == 2)
        return true;
    state.SkipWithError("run with exactly 2 ranks");
    for (auto _ : state) {
    }
    return false;
}

void BM_DataPhaseCpu(benchmark::State& state) {
    if (!two_ranks(state))
        return;
    const int64_t per_peer = state.range(0) << 20;
    Exchange ex(per_peer);
    std::vector<double> cpu[2], wall[2];
    ex.run(false);  // warm-up: connections, pages, the observed rate
    ex.run(true);
    int iteration = 0;
    for (auto _ : state) {
        for (int k = 0; k < 2; ++k) {
            const bool blocking = (iteration + k) % 2 == 0;  // alternate which goes first
            MPI_Barrier(ex.raw);  // both ranks start together: no arrival wait in the figures
            const double c0 = thread_cpu_s();
            const auto t0 = Clock::now();
            ex.run(blocking);
            wall[blocking].push_back(epo::comm::seconds_between(t0, Clock::now()));
            cpu[blocking].push_back(thread_cpu_s() - c0);
        }
        state.SetIterationTime(wall[0].back() + wall[1].back());
        ++iteration;
    }
    const double mb = static_cast<double>(per_peer) / (1 << 20);
    const char* names[2] = {"epo", "blocking"};
    for (int b = 0; b < 2; ++b) {
        state.counters[std::string(names[b]) + "_cpu_ms_per_MB"] = median(cpu[b]) * 1e3 / mb;
        state.counters[std::string(names[b]) + "_GBps"] = per_peer / median(wall[b]) * 1e-9;
        state.counters[std::string(names[b]) + "_ms"] = median(wall[b]) * 1e3;
    }
}
BENCHMARK(BM_DataPhaseCpu)
    ->ArgName("mb")
    ->Arg(2)
    ->Arg(8)
    ->Arg(32)
    ->Arg(64)
    ->Iterations(6)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The trade-off behind DataWaitPolicy: the longest sleep between tests (sleep_fraction 1, so the
// cap alone decides) against the rate and the CPU per MB. Too long a sleep lets the socket
// buffers drain and the link idle; too short tests more often than bytes arrive.
void BM_DataSleepSweep(benchmark::State& state) {
    if (!two_ranks(state))
        return;
    epo::comm::CommOptions options;
    options.data_wait.sleep_fraction = 1;
    options.data_wait.max_sleep_us = static_cast<double>(state.range(0));
    const int64_t per_peer = state.range(1) << 20;
    Exchange ex(per_peer, options);
    ex.run(false);
    std::vector<double> cpu, wall, tests;
    for (auto _ : state) {
        MPI_Barrier(ex.raw);
        const double c0 = thread_cpu_s();
        const auto t0 = Clock::now();
        const int64_t tests0 = ex.groups->ep.stats().data_tests;
        ex.run(false);
        wall.push_back(epo::comm::seconds_between(t0, Clock::now()));
        cpu.push_back(thread_cpu_s() - c0);
        tests.push_back(static_cast<double>(ex.groups->ep.stats().data_tests - tests0));
        state.SetIterationTime(wall.back());
    }
    const double mb = static_cast<double>(per_peer) / (1 << 20);
    state.counters["cpu_ms_per_MB"] = median(cpu) * 1e3 / mb;
    state.counters["GBps"] = per_peer / median(wall) * 1e-9;
    state.counters["tests"] = median(tests);
}
BENCHMARK(BM_DataSleepSweep)
    ->ArgNames({"max_sleep_us", "mb"})
    ->ArgsProduct({{100, 500, 2000, 8000, 32000}, {8}})
    ->Iterations(5)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

constexpr int kDim = 192;

// One oneDNN sgemm (single thread) of kDim^3 per call; returns the calls done until `stop`.
int64_t gemms_until(const std::atomic<bool>& stop) {
    static std::vector<float> a(kDim * kDim, 0.5f), b(kDim * kDim, 0.25f), c(kDim * kDim);
    int64_t done = 0;
    while (!stop.load(std::memory_order_relaxed)) {
        dnnl_sgemm('N', 'N', kDim, kDim, kDim, 1.0f, a.data(), kDim, b.data(), kDim, 0.0f, c.data(),
                   kDim);
        ++done;
    }
    return done;
}

// GEMMs per second on CPU 0 while `during` runs on another thread pinned to CPU 0 (or alone for
// `alone_s` when `during` is empty).
double gemm_rate(const std::function<void()>& during, double alone_s) {
    std::atomic<bool> stop{false};
    const auto t0 = Clock::now();
    std::thread worker;
    if (during) {
        worker = std::thread([&] {
            pin_to_cpu(0);
            during();
            stop = true;
        });
    } else {
        worker = std::thread([&] {
            std::this_thread::sleep_for(std::chrono::duration<double>(alone_s));
            stop = true;
        });
    }
    const int64_t done = gemms_until(stop);
    const double s = epo::comm::seconds_between(t0, Clock::now());
    worker.join();
    return done / s;
}

void BM_ComputeDuringTransfer(benchmark::State& state) {
    if (!two_ranks(state))
        return;
    const int me = epo::comm::current_world_rank();
    const int64_t per_peer = state.range(0) << 20;
    Exchange ex(per_peer);
    pin_to_cpu(me);
    ex.run(false);
    ex.run(true);
    std::vector<double> ratio[2], wall[2];
    int iteration = 0;
    for (auto _ : state) {
        for (int k = 0; k < 2; ++k) {
            const bool blocking = (iteration + k) % 2 == 0;
            sleepy_barrier(ex.raw);
            double secs = 0;
            if (me == 0) {
                const double during = gemm_rate(
                    [&] {
                        const auto t0 = Clock::now();
                        ex.run(blocking);
                        secs = epo::comm::seconds_between(t0, Clock::now());
                    },
                    0);
                const double alone = gemm_rate({}, secs);
                ratio[blocking].push_back(during / alone);
                wall[blocking].push_back(secs);
            } else {
                ex.run(blocking);
                sleepy_barrier(ex.raw);  // rank 1 idles while rank 0 measures alone
            }
            if (me == 0)
                sleepy_barrier(ex.raw);
        }
        state.SetIterationTime(1e-3);
        ++iteration;
    }
    if (me == 0) {
        const char* names[2] = {"epo", "blocking"};
        for (int b = 0; b < 2; ++b) {
            state.counters[std::string(names[b]) + "_gemm_ratio"] = median(ratio[b]);
            auto& r = ratio[b];
            state.counters[std::string(names[b]) + "_ratio_min"] =
                *std::min_element(r.begin(), r.end());
            state.counters[std::string(names[b]) + "_ms"] = median(wall[b]) * 1e3;
        }
    }
}
BENCHMARK(BM_ComputeDuringTransfer)
    ->ArgName("mb")
    ->Arg(16)
    ->Iterations(5)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
    return epo::bench::run_mpi_benchmarks(argc, argv);
}
