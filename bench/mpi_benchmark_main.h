// main() for Google Benchmark binaries that run under mpirun: every rank runs every benchmark
// (collectives need all ranks; the benchmarks use fixed iteration counts so that ranks agree),
// rank 0 reports.
#pragma once

#include <benchmark/benchmark.h>

#include <vector>

#include "epo/comm/mpi_runtime.h"

namespace epo::bench {

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
