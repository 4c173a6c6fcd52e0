// MPI start-up and shutdown for one rank, and MPI errors as epo::Error.
//
// MpiRuntime initializes MPI asking for MPI_THREAD_MULTIPLE (the compute and comm streams call
// MPI from two threads at once) and refuses to run with less: that is rule EP005's runtime form.
// It sets MPI_ERRORS_RETURN on MPI_COMM_WORLD so failures come back as return codes, which
// check_mpi() turns into epo::Error with MPI's own message. If MPI was already initialized (for
// example by a test main), it adopts that and leaves finalization to whoever initialized it.
#pragma once

#include <mpi.h>

#include <string>
#include <string_view>

namespace epo::comm {

enum class MpiFlavor { kOpenMpi, kMpich, kOther };

// The MPI library this program is linked with (callable before MPI_Init).
MpiFlavor mpi_flavor();
const char* mpi_flavor_name(MpiFlavor flavor);
// First line of MPI_Get_library_version, e.g. "Open MPI v4.1.4, ...".
std::string mpi_library_version();

// Raises epo::Error(kComm, "<what> failed: <MPI's message>") unless rc is MPI_SUCCESS.
void check_mpi(int rc, std::string_view what);
// The same with "<call> on group <group>" as `what`, built only when it fails (hot paths).
void check_mpi(int rc, std::string_view call, std::string_view group);

// EP005 (runtime form): raises epo::Error unless `provided` is MPI_THREAD_MULTIPLE.
void check_thread_level(int provided);
const char* thread_level_name(int level);

class MpiRuntime {
public:
    // Pass main's argc/argv (or nullptrs). Raises epo::Error for EP005.
    MpiRuntime(int* argc, char*** argv);
    ~MpiRuntime();
    MpiRuntime(const MpiRuntime&) = delete;
    MpiRuntime& operator=(const MpiRuntime&) = delete;

    int world_rank() const { return world_rank_; }
    int world_size() const { return world_size_; }

private:
    bool owns_init_ = false;
    int world_rank_ = 0;
    int world_size_ = 1;
};

// World rank and size when MPI is initialized (and not finalized), else 0 and 1.
int current_world_rank();
int current_world_size();
// The number of ranks on each host of the job, 0 when the hosts hold different numbers (1 without
// MPI). Collective over MPI_COMM_WORLD: every rank calls it, at start-up, before any other work.
int current_ranks_per_host();

// The MPI job a run starts in, as the configuration's topology is resolved against it
// (config::resolve_topology).
struct JobShape {
    int world_size = 1;
    int ranks_per_host = 1;  // 0 when the hosts hold different numbers of ranks
};
JobShape current_job_shape();  // collective, like current_ranks_per_host()

}  // namespace epo::comm
