#include "epo/comm/doorbell.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>

#include "epo/comm/mpi_runtime.h"

namespace epo::comm {

namespace {

long futex(uint32_t* word, int op, uint32_t value, const timespec* timeout) {
    // Not FUTEX_PRIVATE_FLAG: the word lives in memory shared between processes.
    return syscall(SYS_futex, word, op, value, timeout, nullptr, FUTEX_BITSET_MATCH_ANY);
}

}  // namespace

Doorbells::Doorbells(MPI_Comm comm) {
    int size = 0;
    check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
    peers_.assign(size, nullptr);
    MPI_Comm host_comm = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host_comm),
              "MPI_Comm_split_type (doorbells)");
    int host_rank = 0;
    int host_size = 1;
    MPI_Comm_rank(host_comm, &host_rank);
    MPI_Comm_size(host_comm, &host_size);
    segment_bytes_ = sizeof(Bell) * static_cast<size_t>(host_size);

    // The host's first rank creates the segment and shares its name; an empty name = none.
    static std::atomic<unsigned> next_id{0};
    char name[64] = {};
    if (host_rank == 0) {
        std::snprintf(name, sizeof name, "/epo-bells-%d-%u", static_cast<int>(getpid()), next_id++);
        const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0 || ftruncate(fd, static_cast<off_t>(segment_bytes_)) != 0) {
            if (fd >= 0) {
                close(fd);
                shm_unlink(name);
            }
            name[0] = '\0';
        } else {
            close(fd);
        }
    }
    check_mpi(MPI_Bcast(name, sizeof name, MPI_CHAR, 0, host_comm), "MPI_Bcast (doorbells)");
    if (name[0] != '\0') {
        const int fd = shm_open(name, O_RDWR, 0600);
        if (fd >= 0) {
            void* p = mmap(nullptr, segment_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            close(fd);
            if (p != MAP_FAILED)
                segment_ = p;  // zero-filled by ftruncate
        }
    }
    // Unlink once every rank has mapped (or failed to map) it: the mapping outlives the name.
    check_mpi(MPI_Barrier(host_comm), "MPI_Barrier (doorbells)");
    if (host_rank == 0 && name[0] != '\0')
        shm_unlink(name);

    if (segment_ != nullptr) {
        auto* bells = static_cast<Bell*>(segment_);
        mine_ = &bells[host_rank];
        std::vector<int> ranks(size), host_ranks(size);
        for (int r = 0; r < size; ++r)
            ranks[r] = r;
        MPI_Group group, host_group;
        MPI_Comm_group(comm, &group);
        MPI_Comm_group(host_comm, &host_group);
        check_mpi(
            MPI_Group_translate_ranks(group, size, ranks.data(), host_group, host_ranks.data()),
            "MPI_Group_translate_ranks");
        MPI_Group_free(&group);
        MPI_Group_free(&host_group);
        for (int r = 0; r < size; ++r) {
            if (host_ranks[r] != MPI_UNDEFINED)
                peers_[r] = &bells[host_ranks[r]];
        }
    }
    MPI_Comm_free(&host_comm);
}

Doorbells::~Doorbells() {
    if (segment_ != nullptr)
        munmap(segment_, segment_bytes_);
}

void Doorbells::ring(int peer) {
    Bell* bell = peers_[peer];
    if (bell == nullptr)
        return;
    std::atomic_ref<uint32_t>(bell->count).fetch_add(1);
    // Only a sleeping peer needs the system call. Paired with sleep_until (both seq_cst): either
    // the sleeper sees the new count and does not sleep, or this sees the sleeper and wakes it.
    if (std::atomic_ref<uint32_t>(bell->sleepers).load() > 0) {
        futex(&bell->count, FUTEX_WAKE, INT_MAX, nullptr);
    }
}

uint32_t Doorbells::count() const {
    return std::atomic_ref<uint32_t>(mine_->count).load();
}

bool Doorbells::sleep_until(uint32_t seen, Clock::time_point deadline) {
    lower_timer_slack();
    std::atomic_ref<uint32_t> count(mine_->count);
    std::atomic_ref<uint32_t> sleepers(mine_->sleepers);
    sleepers.fetch_add(1);
    if (count.load() == seen) {
        const int64_t ns = to_ns(deadline);
        const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
        // Absolute CLOCK_MONOTONIC deadline (the FUTEX_WAIT_BITSET form); returns on a ring, at
        // the deadline, or at once if the count already moved on.
        futex(&mine_->count, FUTEX_WAIT_BITSET, seen, &ts);
    }
    sleepers.fetch_sub(1);
    return count.load() != seen;
}

}  // namespace epo::comm
