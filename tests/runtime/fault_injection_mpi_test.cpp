// Faults injected into a real multi-rank job, driven from outside by job_abort_test.cpp (which
// runs this binary under mpirun and checks exit status, stderr, elapsed time and that no rank
// survives). Without EPO_TEST_FAULT in the environment these tests skip.
//
//   EPO_TEST_FAULT=throw          the last rank throws in its 3rd dispatch while the others are
//                                 inside that all-to-all
//   EPO_TEST_FAULT=never_arrives  the last rank never enters its 3rd dispatch
//   EPO_TEST_FAULT=throw_main     the last rank throws on its main thread between steps
//   EPO_TEST_FAULT=late_world_call  the last rank never enters a plain MPI call on the world
//                                 (comm::watched_world_call) the others wait in
//   EPO_TEST_PID_DIR              each rank writes its pid there
//   EPO_TEST_TIMEOUT_S            comm.timeout_s
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "epo/comm/mpi_runtime.h"
#include "epo/comm/rank_runner.h"
#include "epo/core/error.h"
#include "epo/runtime/rank_streams.h"

namespace epo::runtime {
namespace {

void dispatch(comm::Communicator& ep) {
    const int n = ep.size();
    const auto layout =
        comm::AllToAllLayout::packed(std::vector<int64_t>(n, 1000), std::vector<int64_t>(n, 1000));
    std::vector<float> send(1000 * n, 1.0f), recv(1000 * n);
    ep.all_to_all_v(std::span<const float>(send), std::span<float>(recv), layout);
}

TEST(FaultInjection, Job) {
    const char* fault_env = std::getenv("EPO_TEST_FAULT");
    if (fault_env == nullptr)
        GTEST_SKIP() << "driven by job_abort_test";
    const std::string fault = fault_env;
    const int rank = comm::current_world_rank();
    const int n = comm::current_world_size();
    if (const char* dir = std::getenv("EPO_TEST_PID_DIR")) {
        std::ofstream(std::string(dir) + "/rank" + std::to_string(rank)) << getpid() << "\n";
    }
    comm::CommOptions options;
    options.timeout_s = std::atof(std::getenv("EPO_TEST_TIMEOUT_S"));
    const bool faulty = rank == n - 1;
    comm::run_rank([&] {
        auto streams = make_rank_streams({n, n, 1}, options);
        for (int step = 0; step < 4; ++step) {
            streams.comm->enqueue("dispatch", [&, step](StreamContext& ctx) {
                if (faulty && step == 2 && fault == "throw") {
                    throw Error(ErrorKind::kNumerics,
                                fmt::format("injected failure in dispatch on rank {}", rank));
                }
                if (faulty && step == 2 && fault == "never_arrives") {
                    std::this_thread::sleep_for(std::chrono::minutes(10));
                }
                dispatch(ctx.comm().ep);
            });
            streams.synchronize();
            if (faulty && step == 1 && fault == "throw_main") {
                throw std::runtime_error("injected failure on the main thread");
            }
            if (step == 1 && fault == "late_world_call") {
                if (faulty)
                    std::this_thread::sleep_for(std::chrono::minutes(10));
                comm::watched_world_call("agreeing on the test's barrier", options.timeout_s, [] {
                    comm::check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
                });
            }
        }
    });
    ADD_FAILURE() << "the job should have been aborted";
}

}  // namespace
}  // namespace epo::runtime
