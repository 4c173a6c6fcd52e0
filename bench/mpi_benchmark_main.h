// main() for Google Benchmark binaries that run under mpirun: every rank runs every benchmark
// (collectives need all ranks; the benchmarks use fixed iteration counts so that ranks agree),
// rank 0 reports.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "epo/comm/communicator.h"
#include "epo/comm/mpi_runtime.h"

namespace epo::bench {

// Link-model accuracy of a series of collectives: measured time / modelled time, two ways.
//   measured_over_model_*: from this rank's entry (what a caller waits, including a late peer).
//   from_last_entry_*: from the last rank's entry, where the model's clock starts
//     (docs/runtime.md "Link model"): entry-to-return minus the arrival wait, so a peer
//     descheduled before it entered (a loaded machine) does not count against the model.
//   *_within_10pct: share of the operations within +-10% of the model.
class ModelAccuracy {
public:
    void add(double measured_s, const comm::OpStats& op) {
        if (op.modelled_s <= 0) {
            return;
        }
        from_entry_.push_back(measured_s / op.modelled_s);
        from_last_.push_back((measured_s - op.arrival_wait_s) / op.modelled_s);
    }
    void report(benchmark::State& state) {
        put(state, "measured_over_model", from_entry_);
        put(state, "from_last_entry", from_last_);
    }

private:
    static void put(benchmark::State& state, const std::string& name, std::vector<double> v) {
        if (v.empty()) {
            return;
        }
        std::sort(v.begin(), v.end());
        const auto within =
            std::count_if(v.begin(), v.end(), [](double r) { return r >= 0.9 && r <= 1.1; });
        state.counters[name + "_median"] = v[v.size() / 2];
        state.counters[name + "_min"] = v.front();
        state.counters[name + "_max"] = v.back();
        state.counters[name + "_within_10pct"] =
            static_cast<double>(within) / static_cast<double>(v.size());
    }

    std::vector<double> from_entry_, from_last_;
};

class NullReporter : public benchmark::BenchmarkReporter {
public:
    bool ReportContext(const Context&) override { return true; }
    void ReportRuns(const std::vector<Run>&) override {}
};

inline int run_mpi_benchmarks(int argc, char** argv) {
    comm::MpiRuntime mpi(&argc, &argv);
    benchmark::Initialize(&argc, argv);
    if (mpi.world_rank() == 0) {
        benchmark::RunSpecifiedBenchmarks();
    } else {
        NullReporter null;
        benchmark::RunSpecifiedBenchmarks(&null);
    }
    benchmark::Shutdown();
    return 0;
}

}  // namespace epo::bench
