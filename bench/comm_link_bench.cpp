// The link model against a real link: the collectives the training step issues (uniform
// all-to-alls, the gradient reduce-scatter, the parameter gather), run with the link model OFF
// over whatever links the job has, and each one's measured time next to what the link model
// (link_model.h) predicts for its byte counts on a link of the given nominal rate. Run it on the
// emulated cluster (docs/emulated-cluster.md), whose links are shaped to a known rate:
//
//   scripts/emulated-cluster.sh up 2 500mbit
//   cmd='mpirun -H "$EPO_CLUSTER_HOSTS" -np 2 -x EPO_LINK_GBPS build/release/bench/comm_link_bench'
//   EPO_LINK_GBPS=0.5 scripts/emulated-cluster.sh run bash -c "$cmd"
//
// EPO_LINK_GBPS is one host's NIC rate in Gbit/s (the RATE given to `up`). An emulated host has
// one NIC for all its ranks, a GPU node one per GPU (the model's B_inter is per rank), so the
// prediction uses B_inter = EPO_LINK_GBPS / ranks per host; EPO_LINK_LATENCY_US (default 0) sets
// the model's latency. EPO_DATA_MAX_SLEEP_US (default: the runtime's, communicator.h
// DataWaitPolicy) caps the data phase's sleeps between tests, to see what the sleeping wait costs
// on a link against a wait that tests all the time (e.g. 20).
//
// Counters (rank 0's view): measured_ms = median over the iterations of the time from the last
// rank's entry to return (entry-to-return minus the arrival wait, where the model's clock
// starts), model_ms = the model's time for the same bytes, measured_over_model = their ratio.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "epo/comm/mpi_runtime.h"
#include "epo/comm/process_groups.h"
#include "mpi_benchmark_main.h"

namespace {

using epo::comm::AllToAllLayout;
using epo::comm::Clock;
using epo::comm::OpStats;

double env_number(const char* name, double fallback) {
    const char* value = std::getenv(name);
    return value && *value ? std::atof(value) : fallback;
}

// The link the job's hosts are connected by, as the model sees one rank's share of it.
epo::comm::LinkModel nominal_link(int ranks_per_host) {
    epo::comm::LinkModel link;
    link.inter_node_gbps = env_number("EPO_LINK_GBPS", 0) / std::max(1, ranks_per_host);
    link.latency_us = env_number("EPO_LINK_LATENCY_US", 0);
    return link;
}

struct Job {
    int world = 1;
    int ranks_per_host = 1;
    std::unique_ptr<epo::comm::ProcessGroups> groups;  // link model off: the real link only
};

Job& job() {
    static Job j = [] {
        Job out;
        const epo::comm::JobShape shape = epo::comm::current_job_shape();
        out.world = shape.world_size;
        out.ranks_per_host = std::max(1, shape.ranks_per_host);
        epo::comm::CommOptions options;
        options.data_wait.max_sleep_us =
            env_number("EPO_DATA_MAX_SLEEP_US", options.data_wait.max_sleep_us);
        options.wait.min_sleep_us =
            std::min(options.wait.min_sleep_us, options.data_wait.max_sleep_us);
        out.groups = epo::comm::ProcessGroups::create({out.world, out.world, out.ranks_per_host},
                                                      options, "bench", nullptr);
        return out;
    }();
    return j;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

// Runs `op` (one collective) once untimed (first touch, connection set-up), then per iteration:
// barrier, op; reports the median measured and modelled times.
template <class Op>
void measure(benchmark::State& state, Op&& op) {
    Job& j = job();
    const epo::comm::LinkModel link = nominal_link(j.ranks_per_host);
    op();
    std::vector<double> measured, modelled;
    for (auto _ : state) {
        MPI_Barrier(MPI_COMM_WORLD);
        const OpStats s = op();
        const double t = s.duration_s - s.arrival_wait_s;
        state.SetIterationTime(t);
        measured.push_back(t);
        modelled.push_back(epo::comm::modelled_seconds(link, s.bytes));
    }
    const double m = median(measured), p = median(modelled);
    state.counters["measured_ms"] = m * 1e3;
    state.counters["model_ms"] = p * 1e3;
    state.counters["measured_over_model"] = p > 0 ? m / p : 0;
    state.counters["ranks_per_host"] = j.ranks_per_host;
}

// Every rank sends range(0) KiB to every other rank (the EP dispatch/combine shape).
void BM_RealLinkAllToAll(benchmark::State& state) {
    Job& j = job();
    const int64_t per_peer = state.range(0) << 10;
    const auto layout = AllToAllLayout::packed(std::vector<int64_t>(j.world, per_peer),
                                               std::vector<int64_t>(j.world, per_peer));
    std::vector<char> send(layout.send_extent(), 1), recv(layout.recv_extent());
    measure(state, [&] { return j.groups->ep.all_to_all_v(send.data(), recv.data(), layout, 1); });
}
BENCHMARK(BM_RealLinkAllToAll)
    ->Arg(256)
    ->Arg(1024)
    ->Arg(4096)
    ->Arg(8192)
    ->Iterations(12)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The gradient reduction: a reduce-scatter of range(0) MiB of fp32 over the world.
void BM_RealLinkReduceScatter(benchmark::State& state) {
    Job& j = job();
    std::vector<float> grad(static_cast<size_t>(state.range(0) << 20) / sizeof(float), 1.0f);
    measure(state, [&] { return j.groups->world.reduce_scatter_sum(grad); });
}
BENCHMARK(BM_RealLinkReduceScatter)
    ->Arg(4)
    ->Arg(8)
    ->Arg(16)
    ->Iterations(8)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The distributed optimizer's parameter gather: every rank's shard of range(0) MiB to all.
void BM_RealLinkAllGatherShards(benchmark::State& state) {
    Job& j = job();
    std::vector<char> params(static_cast<size_t>(state.range(0) << 20), 1);
    measure(state, [&] {
        return j.groups->world.all_gather_shards(params.data(), static_cast<int64_t>(params.size()),
                                                 1);
    });
}
BENCHMARK(BM_RealLinkAllGatherShards)
    ->Arg(4)
    ->Arg(8)
    ->Arg(16)
    ->Iterations(8)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
    return epo::bench::run_mpi_benchmarks(argc, argv);
}
