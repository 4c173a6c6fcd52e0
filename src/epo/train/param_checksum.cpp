#include "epo/train/param_checksum.h"

#include <fmt/format.h>

#include <vector>

#include "epo/comm/mpi_runtime.h"
#include "epo/comm/rank_runner.h"

namespace epo::train {

uint64_t fnv1a64(const void* data, size_t n, uint64_t hash) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
        hash ^= bytes[i];
        hash *= 1099511628211ull;  // the 64-bit FNV prime
    }
    return hash;
}

std::string final_param_checksum(Trainer& trainer, double timeout_s, MPI_Comm comm) {
    trainer.sync_params();
    uint64_t mine = kFnvOffsetBasis;
    for (const Param* p : trainer.model().all_params())
        mine =
            fnv1a64(p->master.raw(), static_cast<size_t>(p->master.numel()) * sizeof(float), mine);
    int size = 1;
    comm::check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
    std::vector<uint64_t> all(static_cast<size_t>(size));
    comm::watched_world_call("gathering the final parameter checksums", timeout_s, [&] {
        comm::check_mpi(MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, comm),
                        "MPI_Allgather");
    });
    return fmt::format("fnv1a64:{:016x}", fnv1a64(all.data(), all.size() * sizeof(uint64_t)));
}

}  // namespace epo::train
