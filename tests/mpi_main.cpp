// GoogleTest main for tests that run under mpirun: every rank runs every test; rank 0 prints the
// usual report, other ranks print only their failures (prefixed with the rank); the process exits
// non-zero on every rank if any rank failed, so a failure anywhere fails the CTest case. CTest
// runs it through scripts/mpi_test_run.sh (Open MPI's teardown race, explained there).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

namespace {

class RankFailurePrinter : public testing::EmptyTestEventListener {
public:
    explicit RankFailurePrinter(int rank) : rank_(rank) {}
    void OnTestPartResult(const testing::TestPartResult& result) override {
        if (result.failed()) {
            std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                         result.file_name() ? result.file_name() : "?", result.line_number(),
                         result.summary());
        }
    }

private:
    int rank_;
};

}  // namespace

int main(int argc, char** argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    testing::InitGoogleTest(&argc, argv);
    if (rank != 0) {
        auto& listeners = testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
        listeners.Append(new RankFailurePrinter(rank));
    }
    int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
    int any_failed = 0;
    MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0 && any_failed == 0) {
        // scripts/mpi_test_run.sh tells Open MPI's teardown race from a failure by this line.
        int size = 0;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        std::printf("[mpi_main] all %d ranks passed\n", size);
        std::fflush(stdout);
    }
    MPI_Finalize();
    return any_failed;
}
