// A fresh directory that every rank of the job shares, for checkpoint tests: named after rank 0's
// process id (so concurrent jobs do not meet), emptied and created by rank 0 while the others
// wait at a barrier. The test removes it when done.
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "epo/comm/mpi_runtime.h"

namespace epo::testing {

inline std::filesystem::path shared_temp_dir(const std::string& prefix) {
    long pid = getpid();
    MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    const auto dir = std::filesystem::temp_directory_path() / (prefix + std::to_string(pid));
    if (comm::current_world_rank() == 0) {
        std::filesystem::remove_all(dir);
        std::filesystem::create_directories(dir);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return dir;
}

}  // namespace epo::testing
