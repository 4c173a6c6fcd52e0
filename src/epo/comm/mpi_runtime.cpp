#include "epo/comm/mpi_runtime.h"

#include "epo/comm/rank_runner.h"
#include "epo/core/error.h"

namespace epo::comm {

std::string mpi_library_version() {
    char buf[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int len = 0;
    MPI_Get_library_version(buf, &len);
    std::string s(buf);  // `len` may count the terminating NUL
    if (auto nl = s.find('\n'); nl != std::string::npos)
        s.resize(nl);
    return s;
}

MpiFlavor mpi_flavor() {
    const std::string v = mpi_library_version();
    if (v.find("Open MPI") != std::string::npos)
        return MpiFlavor::kOpenMpi;
    if (v.find("MPICH") != std::string::npos)
        return MpiFlavor::kMpich;
    return MpiFlavor::kOther;
}

const char* mpi_flavor_name(MpiFlavor flavor) {
    switch (flavor) {
        case MpiFlavor::kOpenMpi:
            return "Open MPI";
        case MpiFlavor::kMpich:
            return "MPICH";
        case MpiFlavor::kOther:
            return "other MPI";
    }
    return "?";
}

void check_mpi(int rc, std::string_view what) {
    if (rc == MPI_SUCCESS) [[likely]]
        return;
    char msg[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        len = 0;
    throw Error(ErrorKind::kComm,
                fmt::format("{} failed: {} (MPI error code {})", what,
                            len > 0 ? std::string(msg, len) : "unknown error", rc));
}

void check_mpi(int rc, std::string_view call, std::string_view group) {
    if (rc != MPI_SUCCESS) [[unlikely]]
        check_mpi(rc, fmt::format("{} on group {}", call, group));
}

const char* thread_level_name(int level) {
    if (level == MPI_THREAD_SINGLE)
        return "MPI_THREAD_SINGLE";
    if (level == MPI_THREAD_FUNNELED)
        return "MPI_THREAD_FUNNELED";
    if (level == MPI_THREAD_SERIALIZED)
        return "MPI_THREAD_SERIALIZED";
    if (level == MPI_THREAD_MULTIPLE)
        return "MPI_THREAD_MULTIPLE";
    return "an unknown thread level";
}

void check_thread_level(int provided) {
    if (provided == MPI_THREAD_MULTIPLE)
        return;
    throw Error(ErrorKind::kConfig,
                fmt::format("EP005: the MPI library must grant MPI_THREAD_MULTIPLE for the comm "
                            "stream, but {} granted {}: use an MPI built with thread support "
                            "(Open MPI and MPICH from Debian grant it)",
                            mpi_library_version(), thread_level_name(provided)));
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (initialized) {
        MPI_Query_thread(&provided);
    } else {
        // MPI_Init_thread reports failure through the default handler (abort); nothing to check.
        MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
        owns_init_ = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
    check_thread_level(provided);
    // A rank that ends without finishing (rank_runner.h) must not leave its launcher behind.
    if (owns_init_ && world_size_ > 1)
        guard_rank_under_launcher(world_rank_, world_size_);
}

MpiRuntime::~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_init_ && !finalized)
        MPI_Finalize();
    // Past MPI_Finalize: the run finished; the guardian leaves.
    if (owns_init_)
        release_rank_guardian();
}

namespace {
bool mpi_active() {
    int initialized = 0;
    int finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    return initialized && !finalized;
}
}  // namespace

int current_world_rank() {
    int rank = 0;
    if (mpi_active())
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

int current_world_size() {
    int size = 1;
    if (mpi_active())
        MPI_Comm_size(MPI_COMM_WORLD, &size);
    return size;
}

int current_ranks_per_host() {
    if (!mpi_active())
        return 1;
    // Ranks that can share memory are the ranks of one host (the launcher's node). Before the
    // configuration is read, so bounded by comm.timeout_s's default.
    int local = 0;
    int bounds[2] = {0, 0};
    watched_world_call("finding the ranks of each host", kDefaultCommTimeoutS, [&] {
        MPI_Comm host = MPI_COMM_NULL;
        check_mpi(
            MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host),
            "MPI_Comm_split_type for the ranks of this host");
        MPI_Comm_size(host, &local);
        MPI_Comm_free(&host);
        bounds[0] = local;
        bounds[1] = -local;
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, bounds, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD),
                  "MPI_Allreduce of the ranks per host");
    });
    return bounds[0] == -bounds[1] ? local : 0;
}

JobShape current_job_shape() {
    return JobShape{.world_size = current_world_size(), .ranks_per_host = current_ranks_per_host()};
}

}  // namespace epo::comm
