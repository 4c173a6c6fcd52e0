// One MPI communicator of a process group, with the collectives the runtime needs, deadlines on
// every wait, the link model, and byte/time accounting per operation.
//
// Every collective runs in three phases:
//   1. arrival: each rank sends every peer a small message (its entry time, the operation's
//      sequence number and kind, the size it will send to that peer) and waits for all of them,
//      testing with back-off sleeps (WaitPolicy). This is where a rank waits for late peers, so
//      the waiting sleeps instead of spinning on the compute thread's core; it has a deadline
//      (CommOptions::timeout_s) and, past it, the error names the peers that had not arrived. It
//      also catches collectives issued in a different order or with mismatched sizes, which
//      would otherwise hang or corrupt data.
//   2. data: non-blocking point-to-point transfers to and from each peer (every peer is known to
//      be inside the same operation, so they only move bytes), waited for by the progress loop
//      (progress_loop.h): tests with sleeps in between sized to the transfer's expected time
//      (DataWaitPolicy), so the bytes in flight cost the compute thread's core almost nothing.
//      Past its deadline (comm.timeout_s) the error names the peers whose bytes were still in
//      flight; the watchdog backs that up should an MPI call itself never return.
//   3. link model: hold until last_entry + modelled time (link_model.h), sleeping.
// Collectives of one Communicator must be issued in the same order on every rank; a Communicator
// is used by one thread at a time (the stream that owns it).
//
// Counts and offsets are in items; an item is `elem_bytes` bytes (a value or a row).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "epo/comm/doorbell.h"
#include "epo/comm/link_model.h"
#include "epo/comm/progress_loop.h"
#include "epo/comm/watchdog.h"

namespace epo::comm {

// How a rank waits for its peers in phase 1. MPI progresses only inside MPI calls, and a thread
// that calls MPI_Test continuously takes the core from the compute thread next to it (1.8-2.7x
// slower GEMMs were measured here), while testing too rarely delays the collective. So: test
// continuously for spin_us (peers that are on time arrive within it), then sleep between tests,
// starting at min_sleep_us and doubling up to max_sleep_us. A peer on the same host that arrives
// rings this rank's doorbell (doorbell.h) and ends the sleep at once; the doubling sleeps only
// bound how long a missed ring, or a peer on another host, can go unnoticed.
struct WaitPolicy {
    double spin_us = 20;
    double min_sleep_us = 50;
    double max_sleep_us = 1000;
};

// How a rank waits for the bytes of phase 2. A blocking MPI call busy-polls for the whole transfer:
// over a 500 Mbit/s TCP link that was 6-13 ms of CPU per MB moved (40-60% of a core), and a GEMM on
// the same core ran at 0.44x. The loop instead tests like phase 1 (spin_us, then sleeps from
// min_sleep_us doubling) but lets the sleeps grow to sleep_fraction of the transfer's expected time
// (bytes / the rate this communicator observed so far), at most max_sleep_us: a transfer expected
// to take T is tested about log2(cap / min_sleep_us) + 1 / sleep_fraction times (T / max_sleep_us
// times once the cap binds), and a longer sleep would let the TCP socket buffers drain and stall
// the link (docs/runtime.md "Data phase" has the sweep behind these numbers). Same-host peers ring
// the doorbell when they have posted their sends or taken this rank's bytes, so shared-memory
// transfers are not slowed by the sleeps.
//
// A fixed cap is right for one link speed only: over TCP each test hands the kernel what its
// socket takes (Open MPI's TCP transport moves 128 KiB fragments), and the link drains that in
// 2 ms at 500 Mbit/s but in 0.5 ms at 2 Gbit/s; a 2 ms sleep there left the link idle three
// quarters of the time (all-to-alls at 1.3-1.55x their time with 20 us sleeps, on the emulated
// cluster). So a sleep also ends before the observed rate has moved bytes_per_sleep, when some
// peer of the transfer is on another host (same-host peers ring the doorbell instead).
struct DataWaitPolicy {
    double sleep_fraction = 0.125;
    double max_sleep_us = 2000;
    double bytes_per_sleep = 128 << 10;
};

// The phase-2 sleep schedule for a transfer expected to take `expected_s` on a link observed to
// move `bytes_per_s` (0: not known, the rate cap does not apply).
SleepSchedule data_sleep_schedule(const WaitPolicy& arrival, const DataWaitPolicy& data,
                                  double expected_s, double bytes_per_s = 0);

struct CommOptions {
    double timeout_s = 300;  // comm.timeout_s: longest wait on peers before the job ends
    LinkModel link;          // comm.link.*
    WaitPolicy wait;
    DataWaitPolicy data_wait;
};

// Raises epo::Error naming the field (comm.timeout_s, comm.link.*) for invalid values.
void validate_comm_options(const CommOptions& options);

// Layout of a variable all-to-all; index = the peer's group rank; all in items.
struct AllToAllLayout {
    std::vector<int64_t> send_counts;   // items sent to peer p ...
    std::vector<int64_t> send_offsets;  // ... taken from send + send_offsets[p]
    std::vector<int64_t> recv_counts;   // items received from peer p ...
    std::vector<int64_t> recv_offsets;  // ... written to recv + recv_offsets[p]

    // Offsets packed back to back in peer order.
    static AllToAllLayout packed(std::vector<int64_t> send_counts,
                                 std::vector<int64_t> recv_counts);
    // The backward of an all-to-all: sends what was received and receives what was sent.
    AllToAllLayout swapped() const;
    // Buffer extents the layout needs: max over peers of offset + count.
    int64_t send_extent() const;
    int64_t recv_extent() const;
};

// The shard of a vector of `total` items that group rank r owns in a reduce-scatter or a shard
// all-gather: [r * total / n, (r + 1) * total / n). Balanced, and the same on every rank.
struct ShardRange {
    int64_t begin = 0;
    int64_t end = 0;
    int64_t size() const { return end - begin; }
};
ShardRange shard_of(int64_t total, int group_size, int group_rank);

struct OpStats {
    ByteCounts bytes;
    double duration_s = 0;      // entry to return
    double arrival_wait_s = 0;  // entry until every peer had arrived (as seen by this rank)
    double link_hold_s = 0;     // slept to honour the link model
    double modelled_s = 0;      // the link model's duration from the last entry (0: model off)
    double data_s = 0;          // in phase 2, moving bytes
    int64_t data_tests = 0;     // MPI tests in phase 2 (each a pass of MPI's progress engine)
};

struct CommStats {
    int64_t num_ops = 0;
    ByteCounts bytes;
    double duration_s = 0;
    double arrival_wait_s = 0;
    double link_hold_s = 0;
    double data_s = 0;
    int64_t data_tests = 0;

    void add(const OpStats& op);
};

class Communicator {
public:
    struct Members {
        std::vector<int> world_ranks;  // world rank of each group rank
        std::vector<int> nodes;        // node of each group rank
    };

    // Takes ownership of `comm` (freed by the destructor) and sets MPI_ERRORS_RETURN on it.
    // Collective over `comm` (it sets up the doorbells); the destructor is local.
    // `name` appears in every message, e.g. "ep (stream comm)".
    Communicator(MPI_Comm comm, std::string name, Members members, CommOptions options,
                 std::shared_ptr<Watchdog> watchdog);
    ~Communicator();
    Communicator(Communicator&& other) noexcept;
    Communicator(const Communicator&) = delete;
    Communicator& operator=(const Communicator&) = delete;
    Communicator& operator=(Communicator&&) = delete;

    int rank() const { return rank_; }
    int size() const { return size_; }
    const std::string& name() const { return name_; }
    const Members& members() const { return members_; }
    const CommOptions& options() const { return options_; }
    MPI_Comm handle() const { return comm_; }
    // Totals over every operation so far (read it from the owning thread, or after a sync).
    const CommStats& stats() const { return stats_; }
    // The data-phase rate observed so far (sizes the phase-2 sleeps).
    const TransferRate& transfer_rate() const { return rate_; }

    // Variable all-to-all (send and recv must not overlap).
    OpStats all_to_all_v(const void* send, void* recv, const AllToAllLayout& layout,
                         size_t elem_bytes);
    template <class T>
    OpStats all_to_all_v(std::span<const T> send, std::span<T> recv, const AllToAllLayout& layout,
                         size_t elems_per_item = 1);

    // recv (size() * bytes_per_rank bytes) = concatenation of every rank's send, in rank order.
    OpStats all_gather(const void* send, void* recv, size_t bytes_per_rank);
    template <class T>
    OpStats all_gather(std::span<const T> send, std::span<T> recv);

    // In-place fp32 sum. Deterministic and identical on every rank for any MPI library: the
    // vector is cut into size() chunks, rank r sums chunk r over the ranks in group-rank order
    // ((x_0 + x_1) + x_2) + ..., and the sums are gathered back.
    // It is reduce_scatter_sum followed by all_gather_shards in one operation: the same sums.
    OpStats all_reduce_sum(std::span<float> data);
    // In-place fp32 sum of this rank's shard (shard_of(data.size(), size(), rank())) only: the
    // same sums, bit for bit, as all_reduce_sum gives that shard. The rest of `data` keeps this
    // rank's own values. The distributed optimizer's gradient reduction.
    OpStats reduce_scatter_sum(std::span<float> data);
    // In place: every rank's shard of `data` (`total` items of `elem_bytes` each) is copied to
    // every rank. The distributed optimizer's parameter gather.
    OpStats all_gather_shards(void* data, int64_t total, size_t elem_bytes);

    OpStats broadcast(void* data, size_t bytes, int root);
    template <class T>
    OpStats broadcast(std::span<T> data, int root) {
        return broadcast(data.data(), data.size_bytes(), root);
    }

    // Returns once every rank has entered (phase 1 alone), then honours the link latency.
    OpStats barrier();

private:
    enum class OpKind : uint32_t;
    struct Arrival;
    struct Op {
        OpKind kind;
        uint32_t seq;
        Clock::time_point entry;
    };

    Op begin(OpKind kind);
    // Phase 1. size_to[p]: what this rank tells peer p it sends; expected_from[p]: what it must
    // hear from p; aux: a value every rank must agree on (item size, root). Returns last entry.
    Clock::time_point arrive(const Op& op, std::span<const int64_t> size_to,
                             std::span<const int64_t> expected_from, int64_t aux);
    // Phase 2: queue the transfers of one exchange (counts in items of `type`, `bytes` in all;
    // nothing for a zero count or for this rank itself), then move them all.
    void add_send(int peer, const void* data, int64_t count, MPI_Datatype type, int64_t bytes);
    void add_recv(int peer, void* data, int64_t count, MPI_Datatype type, int64_t bytes);
    void move_data(const Op& op, OpStats& stats);
    OpStats finish(const Op& op, Clock::time_point last_entry, const ByteCounts& bytes,
                   OpStats s = {});
    void add_peer_bytes(ByteCounts& bytes, int peer, int64_t sent, int64_t recv) const;
    void add_shard_bytes(ByteCounts& bytes, int64_t total, int64_t item_bytes, bool scatter) const;
    OpStats shard_sum(OpKind kind, std::span<float> data, bool gather);
    // Data phases (no arrival, no accounting).
    void sum_my_shard(const Op& op, std::span<float> data, OpStats& stats);
    void gather_shards(const Op& op, void* data, int64_t total, size_t elem_bytes, OpStats& stats);
    std::string describe(const Op& op) const;
    void check_extent(int64_t needed, int64_t available, const char* buffer) const;
    [[noreturn]] void fail(const std::string& message);
    MPI_Datatype item_type(size_t elem_bytes);

    MPI_Comm comm_ = MPI_COMM_NULL;
    std::string name_;
    Members members_;
    CommOptions options_;
    std::shared_ptr<Watchdog> watchdog_;
    std::unique_ptr<Doorbells> bells_;
    int rank_ = 0;
    int size_ = 1;
    uint32_t next_seq_ = 0;
    std::string broken_;  // first failure; non-empty = unusable
    CommStats stats_;
    std::unordered_map<size_t, MPI_Datatype> item_types_;
    // Reused per operation so steady-state collectives allocate nothing.
    std::vector<Arrival> arrivals_out_, arrivals_in_;
    std::vector<MPI_Request> requests_;
    std::vector<char> done_;
    std::vector<int> poll_indices_;
    struct Transfer {
        int peer;
        void* data;
        int count;
        MPI_Datatype type;
        bool receive;
    };
    std::vector<Transfer> transfers_;
    std::vector<char> is_receive_;
    int64_t transfer_sent_ = 0, transfer_recv_ = 0;  // bytes queued in transfers_
    TransferRate rate_;
    std::vector<int64_t> sizes_a_;
    std::vector<float> reduce_scratch_;
};

template <class T>
OpStats Communicator::all_to_all_v(std::span<const T> send, std::span<T> recv,
                                   const AllToAllLayout& layout, size_t elems_per_item) {
    check_extent(layout.send_extent() * static_cast<int64_t>(elems_per_item),
                 static_cast<int64_t>(send.size()), "send");
    check_extent(layout.recv_extent() * static_cast<int64_t>(elems_per_item),
                 static_cast<int64_t>(recv.size()), "recv");
    return all_to_all_v(send.data(), recv.data(), layout, sizeof(T) * elems_per_item);
}

template <class T>
OpStats Communicator::all_gather(std::span<const T> send, std::span<T> recv) {
    check_extent(static_cast<int64_t>(send.size()) * size(), static_cast<int64_t>(recv.size()),
                 "recv");
    return all_gather(send.data(), recv.data(), send.size_bytes());
}

}  // namespace epo::comm
