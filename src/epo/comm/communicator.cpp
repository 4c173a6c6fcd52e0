#include "epo/comm/communicator.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "epo/comm/link_limits.h"
#include "epo/comm/mpi_runtime.h"
#include "epo/core/error.h"

namespace epo::comm {

enum class Communicator::OpKind : uint32_t {
    kAllToAll = 1,
    kAllGather,
    kAllReduce,
    kBroadcast,
    kBarrier,
    kReduceScatter,
    kAllGatherShards
};

namespace {

// Tag of the phase-1 messages. Communicators are private duplicates, so only the runtime's own
// point-to-point traffic can share it, and messages between two ranks on one tag never overtake
// each other: the n-th arrival message from a peer belongs to its n-th operation.
constexpr int kArrivalTag = 0x45504f;  // "EPO"

const char* op_name(uint32_t kind) {
    switch (kind) {
        case 1:
            return "all_to_all";
        case 2:
            return "all_gather";
        case 3:
            return "all_reduce";
        case 4:
            return "broadcast";
        case 5:
            return "barrier";
        case 6:
            return "reduce_scatter";
        case 7:
            return "all_gather_shards";
    }
    return "unknown operation";
}

std::string rank_list(const std::vector<int>& ranks) {
    return fmt::format("{}", fmt::join(ranks, ", "));
}

int to_int(int64_t v, const std::string& what) {
    if (v < 0 || v > INT_MAX) {
        throw Error(ErrorKind::kComm,
                    fmt::format("{} = {} is outside MPI's count range [0, {}]: split the transfer "
                                "or use larger items",
                                what, v, INT_MAX));
    }
    return static_cast<int>(v);
}

}  // namespace

struct Communicator::Arrival {
    int64_t entry_ns;
    int64_t size;  // what the sender sends to the receiver (or the operation's common size)
    int64_t aux;   // a value all ranks must agree on: item size, root
    uint32_t seq;
    uint32_t kind;
};

void validate_comm_options(const CommOptions& options) {
    if (!std::isfinite(options.timeout_s) || options.timeout_s <= 0 ||
        options.timeout_s > kMaxTimeoutS) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("comm.timeout_s={} is not a number of seconds in (0, {:g}]: set "
                                "the longest wait on a peer, e.g. 300",
                                options.timeout_s, kMaxTimeoutS));
    }
    validate_link_model(options.link);
    const auto& w = options.wait;
    if (!(w.spin_us >= 0 && w.min_sleep_us > 0 && w.max_sleep_us >= w.min_sleep_us)) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("wait policy spin_us={} min_sleep_us={} max_sleep_us={}: need "
                                "spin >= 0 and 0 < min_sleep <= max_sleep",
                                w.spin_us, w.min_sleep_us, w.max_sleep_us));
    }
}

// ---- AllToAllLayout ----

AllToAllLayout AllToAllLayout::packed(std::vector<int64_t> send_counts,
                                      std::vector<int64_t> recv_counts) {
    AllToAllLayout layout;
    auto prefix = [](const std::vector<int64_t>& counts) {
        std::vector<int64_t> offsets(counts.size());
        int64_t at = 0;
        for (size_t p = 0; p < counts.size(); ++p) {
            offsets[p] = at;
            at += counts[p];
        }
        return offsets;
    };
    layout.send_offsets = prefix(send_counts);
    layout.recv_offsets = prefix(recv_counts);
    layout.send_counts = std::move(send_counts);
    layout.recv_counts = std::move(recv_counts);
    return layout;
}

AllToAllLayout AllToAllLayout::swapped() const {
    return {recv_counts, recv_offsets, send_counts, send_offsets};
}

namespace {
int64_t extent(const std::vector<int64_t>& counts, const std::vector<int64_t>& offsets) {
    int64_t e = 0;
    for (size_t p = 0; p < counts.size() && p < offsets.size(); ++p) {
        if (counts[p] > 0)
            e = std::max(e, offsets[p] + counts[p]);
    }
    return e;
}
}  // namespace

int64_t AllToAllLayout::send_extent() const {
    return extent(send_counts, send_offsets);
}
int64_t AllToAllLayout::recv_extent() const {
    return extent(recv_counts, recv_offsets);
}

void CommStats::add(const OpStats& op) {
    ++num_ops;
    bytes += op.bytes;
    duration_s += op.duration_s;
    arrival_wait_s += op.arrival_wait_s;
    link_hold_s += op.link_hold_s;
}

// ---- Communicator: lifetime ----

Communicator::Communicator(MPI_Comm comm, std::string name, Members members, CommOptions options,
                           std::shared_ptr<Watchdog> watchdog)
    : comm_(comm),
      name_(std::move(name)),
      members_(std::move(members)),
      options_(options),
      watchdog_(std::move(watchdog)) {
    validate_comm_options(options_);
    EPO_CHECK(watchdog_ != nullptr, "communicator {} needs a watchdog", name_);
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    EPO_CHECK_EQ(members_.world_ranks.size(), static_cast<size_t>(size_));
    EPO_CHECK_EQ(members_.nodes.size(), static_cast<size_t>(size_));
    bells_ = std::make_unique<Doorbells>(comm_);
}

Communicator::Communicator(Communicator&& o) noexcept
    : comm_(o.comm_),
      name_(std::move(o.name_)),
      members_(std::move(o.members_)),
      options_(o.options_),
      watchdog_(std::move(o.watchdog_)),
      bells_(std::move(o.bells_)),
      rank_(o.rank_),
      size_(o.size_),
      next_seq_(o.next_seq_),
      broken_(std::move(o.broken_)),
      stats_(o.stats_),
      item_types_(std::move(o.item_types_)) {
    o.comm_ = MPI_COMM_NULL;
    o.item_types_.clear();
}

Communicator::~Communicator() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return;
    for (auto& [bytes, type] : item_types_)
        MPI_Type_free(&type);
    if (comm_ != MPI_COMM_NULL)
        MPI_Comm_free(&comm_);
}

MPI_Datatype Communicator::item_type(size_t elem_bytes) {
    auto it = item_types_.find(elem_bytes);
    if (it != item_types_.end())
        return it->second;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    check_mpi(MPI_Type_contiguous(to_int(static_cast<int64_t>(elem_bytes), "item size in bytes"),
                                  MPI_BYTE, &type),
              "MPI_Type_contiguous");
    check_mpi(MPI_Type_commit(&type), "MPI_Type_commit");
    item_types_.emplace(elem_bytes, type);
    return type;
}

// ---- phases ----

std::string Communicator::describe(const Op& op) const {
    return fmt::format("{} #{} on group {} (world ranks {})",
                       op_name(static_cast<uint32_t>(op.kind)), op.seq, name_,
                       rank_list(members_.world_ranks));
}

void Communicator::fail(const std::string& message) {
    if (broken_.empty())
        broken_ = message;
    throw Error(ErrorKind::kComm, message);
}

void Communicator::check_extent(int64_t needed, int64_t available, const char* buffer) const {
    if (needed > available) {
        throw Error(ErrorKind::kComm,
                    fmt::format("group {}: the {} buffer holds {} elements but the layout needs {}",
                                name_, buffer, available, needed));
    }
}

Communicator::Op Communicator::begin(OpKind kind) {
    const auto entry = Clock::now();
    if (!broken_.empty()) {
        throw Error(
            ErrorKind::kComm,
            fmt::format("group {} is unusable after an earlier failure: {}", name_, broken_));
    }
    return Op{kind, next_seq_++, entry};
}

bool Communicator::poll(std::span<MPI_Request> requests, std::vector<char>& done,
                        Clock::time_point deadline) {
    const WaitPolicy& w = options_.wait;
    const auto spin = std::chrono::nanoseconds(std::llround(w.spin_us * 1e3));
    auto spin_end = Clock::now() + spin;
    double sleep_us = w.min_sleep_us;
    poll_indices_.resize(requests.size());
    for (;;) {
        // Read the bell before testing: a ring after this read makes the sleep below return.
        const uint32_t seen = bells_->count();
        int completed = 0;
        check_mpi(MPI_Testsome(static_cast<int>(requests.size()), requests.data(), &completed,
                               poll_indices_.data(), MPI_STATUSES_IGNORE),
                  "MPI_Testsome", name_);
        if (completed == MPI_UNDEFINED)
            return true;  // every request is done
        for (int i = 0; i < completed; ++i)
            done[poll_indices_[i]] = 1;
        if (std::all_of(done.begin(), done.end(), [](char d) { return d != 0; }))
            return true;
        const auto now = Clock::now();
        if (now >= deadline)
            return false;
        if (now < spin_end)
            continue;
        const auto wake = now + std::chrono::nanoseconds(std::llround(sleep_us * 1e3));
        if (bells_->sleep_until(seen, std::min(deadline, wake))) {
            // A peer arrived: test again now, and keep testing briefly in case its message
            // becomes visible to MPI a moment after the ring.
            spin_end = Clock::now() + spin;
            sleep_us = w.min_sleep_us;
        } else {
            sleep_us = std::min(sleep_us * 2, w.max_sleep_us);
        }
    }
}

Clock::time_point Communicator::arrive(const Op& op, std::span<const int64_t> size_to,
                                       std::span<const int64_t> expected_from, int64_t aux) {
    const int n = size_;
    if (size_to[rank_] != expected_from[rank_]) {
        fail(fmt::format(
            "{}: world rank {} sends size {} to itself but expects size {}; counts "
            "must agree between sender and receiver",
            describe(op), members_.world_ranks[rank_], size_to[rank_], expected_from[rank_]));
    }
    arrivals_out_.assign(n, Arrival{});
    arrivals_in_.assign(n, Arrival{});
    requests_.assign(2 * static_cast<size_t>(n), MPI_REQUEST_NULL);
    done_.assign(requests_.size(), 1);
    for (int p = 0; p < n; ++p) {
        if (p == rank_)
            continue;
        arrivals_out_[p] =
            Arrival{to_ns(op.entry), size_to[p], aux, op.seq, static_cast<uint32_t>(op.kind)};
        check_mpi(MPI_Irecv(&arrivals_in_[p], sizeof(Arrival), MPI_BYTE, p, kArrivalTag, comm_,
                            &requests_[p]),
                  "MPI_Irecv");
        check_mpi(MPI_Isend(&arrivals_out_[p], sizeof(Arrival), MPI_BYTE, p, kArrivalTag, comm_,
                            &requests_[n + p]),
                  "MPI_Isend");
        done_[p] = 0;
        done_[n + p] = 0;
    }
    for (int p = 0; p < n; ++p) {
        if (p != rank_)
            bells_->ring(p);  // after the send: the peer looks for it when it wakes
    }
    const auto deadline =
        op.entry + std::chrono::nanoseconds(std::llround(options_.timeout_s * 1e9));
    if (!poll(requests_, done_, deadline)) {
        std::vector<int> missing;
        for (int p = 0; p < n; ++p) {
            if (!done_[p])
                missing.push_back(members_.world_ranks[p]);
        }
        // Withdraw what is still pending: the communicator is unusable from here on.
        for (int i = 0; i < 2 * n; ++i) {
            if (requests_[i] == MPI_REQUEST_NULL)
                continue;
            if (i < n) {
                MPI_Cancel(&requests_[i]);
                MPI_Wait(&requests_[i], MPI_STATUS_IGNORE);
            } else {
                MPI_Request_free(&requests_[i]);
            }
        }
        fail(
            fmt::format("{} timed out after {} s (comm.timeout_s) waiting for world rank(s) {} "
                        "to arrive; a rank that never arrives has stopped, is stuck, or issued "
                        "its collectives in a different order (raise comm.timeout_s if it is "
                        "only slow)",
                        describe(op), options_.timeout_s,
                        missing.empty() ? std::string("?") : rank_list(missing)));
    }
    int64_t last_entry = to_ns(op.entry);
    for (int p = 0; p < n; ++p) {
        if (p == rank_)
            continue;
        const Arrival& a = arrivals_in_[p];
        const int peer = members_.world_ranks[p];
        if (a.seq != op.seq || a.kind != static_cast<uint32_t>(op.kind)) {
            fail(fmt::format(
                "collective order differs between ranks on group {}: this rank "
                "(world {}) issued {} #{}, world rank {} issued {} #{}; every rank "
                "must issue the collectives of a group in the same order",
                name_, members_.world_ranks[rank_], op_name(static_cast<uint32_t>(op.kind)), op.seq,
                peer, op_name(a.kind), a.seq));
        }
        if (a.size != expected_from[p] || a.aux != aux) {
            fail(
                fmt::format("{}: world rank {} sends size {} (parameter {}) but world rank {} "
                            "expects size {} (parameter {}); counts must agree between sender "
                            "and receiver",
                            describe(op), peer, a.size, a.aux, members_.world_ranks[rank_],
                            expected_from[p], aux));
        }
        last_entry = std::max(last_entry, a.entry_ns);
    }
    return from_ns(last_entry);
}

Watchdog::Guard Communicator::watch_data_phase(const Op& op) {
    return watchdog_->watch(
        fmt::format("watchdog: {}: every rank arrived but the data exchange did not finish within "
                    "{} s (comm.timeout_s); a peer died or stalls inside MPI",
                    describe(op), options_.timeout_s),
        Clock::now() + std::chrono::nanoseconds(std::llround(options_.timeout_s * 1e9)));
}

// Phase 3, the link model's hold (link_limits.h): never past the operation's deadline (entry +
// comm.timeout_s), cut short by a stop request.
OpStats Communicator::finish(const Op& op, Clock::time_point last_entry, const ByteCounts& bytes) {
    OpStats s;
    s.bytes = bytes;
    s.arrival_wait_s = std::max(0.0, seconds_between(op.entry, last_entry));
    if (options_.link.enabled() && size_ > 1) {
        s.modelled_s = modelled_seconds(options_.link, bytes);
        // Compared in seconds (doubles) before any conversion: a modelled time of years does not
        // fit a nanosecond count, and sleeping it would outlast every deadline.
        const double hold_end_s = s.arrival_wait_s + s.modelled_s;
        if (hold_end_s > options_.timeout_s) {
            fail(fmt::format(
                "{} timed out: the link model holds it {:.4g} s ({} bytes sent, {} received "
                "at comm.link.inter_node_gbps={:g} / intra_node_gbps={:g}, latency_us={:g}), "
                "beyond comm.timeout_s = {} s; raise the link bandwidth (comm.link.*) or "
                "comm.timeout_s",
                describe(op), s.modelled_s, bytes.sent(), bytes.received(),
                options_.link.inter_node_gbps, options_.link.intra_node_gbps,
                options_.link.latency_us, options_.timeout_s));
        }
        const auto until = last_entry + std::chrono::nanoseconds(std::llround(s.modelled_s * 1e9));
        const auto before = Clock::now();
        if (before < until) {
            hold_until(until);  // false: cut short by a stop request, the step ends sooner
            s.link_hold_s = seconds_between(before, Clock::now());
        }
    }
    s.duration_s = seconds_between(op.entry, Clock::now());
    stats_.add(s);
    return s;
}

void Communicator::add_peer_bytes(ByteCounts& bytes, int peer, int64_t sent, int64_t recv) const {
    if (peer == rank_)
        return;
    if (members_.nodes[peer] == members_.nodes[rank_]) {
        bytes.intra_sent += sent;
        bytes.intra_recv += recv;
    } else {
        bytes.inter_sent += sent;
        bytes.inter_recv += recv;
    }
}

// ---- collectives ----

OpStats Communicator::all_to_all_v(const void* send, void* recv, const AllToAllLayout& layout,
                                   size_t elem_bytes) {
    const Op op = begin(OpKind::kAllToAll);
    const size_t n = static_cast<size_t>(size_);
    if (layout.send_counts.size() != n || layout.send_offsets.size() != n ||
        layout.recv_counts.size() != n || layout.recv_offsets.size() != n) {
        fail(
            fmt::format("{}: the layout has {}/{} send and {}/{} recv counts/offsets, the group "
                        "has {} ranks",
                        describe(op), layout.send_counts.size(), layout.send_offsets.size(),
                        layout.recv_counts.size(), layout.recv_offsets.size(), n));
    }
    int_send_counts_.resize(n);
    int_send_offsets_.resize(n);
    int_recv_counts_.resize(n);
    int_recv_offsets_.resize(n);
    for (size_t p = 0; p < n; ++p) {
        int_send_counts_[p] = to_int(layout.send_counts[p], fmt::format("send_counts[{}]", p));
        int_send_offsets_[p] = to_int(layout.send_offsets[p], fmt::format("send_offsets[{}]", p));
        int_recv_counts_[p] = to_int(layout.recv_counts[p], fmt::format("recv_counts[{}]", p));
        int_recv_offsets_[p] = to_int(layout.recv_offsets[p], fmt::format("recv_offsets[{}]", p));
    }
    const Clock::time_point last_entry =
        arrive(op, layout.send_counts, layout.recv_counts, static_cast<int64_t>(elem_bytes));
    {
        auto guard = watch_data_phase(op);
        const MPI_Datatype type = item_type(elem_bytes);
        check_mpi(MPI_Alltoallv(send, int_send_counts_.data(), int_send_offsets_.data(), type, recv,
                                int_recv_counts_.data(), int_recv_offsets_.data(), type, comm_),
                  "MPI_Alltoallv", name_);
    }
    ByteCounts bytes;
    const auto eb = static_cast<int64_t>(elem_bytes);
    for (int p = 0; p < size_; ++p) {
        add_peer_bytes(bytes, p, layout.send_counts[p] * eb, layout.recv_counts[p] * eb);
    }
    return finish(op, last_entry, bytes);
}

OpStats Communicator::all_gather(const void* send, void* recv, size_t bytes_per_rank) {
    const Op op = begin(OpKind::kAllGather);
    const auto b = static_cast<int64_t>(bytes_per_rank);
    const int count = to_int(b, "all_gather bytes per rank");
    sizes_a_.assign(size_, b);
    const Clock::time_point last_entry = arrive(op, sizes_a_, sizes_a_, 0);
    {
        auto guard = watch_data_phase(op);
        check_mpi(MPI_Allgather(send, count, MPI_BYTE, recv, count, MPI_BYTE, comm_),
                  "MPI_Allgather", name_);
    }
    ByteCounts bytes;
    for (int p = 0; p < size_; ++p)
        add_peer_bytes(bytes, p, b, b);
    return finish(op, last_entry, bytes);
}

ShardRange shard_of(int64_t total, int group_size, int group_rank) {
    return ShardRange{group_rank * total / group_size, (group_rank + 1) * total / group_size};
}

void Communicator::sum_my_shard(std::span<float> data) {
    const int n = size_;
    const auto total = static_cast<int64_t>(data.size());
    const ShardRange mine = shard_of(total, n, rank_);
    const int mine_count = static_cast<int>(mine.size());
    int_send_counts_.resize(n);
    int_send_offsets_.resize(n);
    int_recv_counts_.assign(n, mine_count);
    int_recv_offsets_.resize(n);
    for (int r = 0; r < n; ++r) {
        const ShardRange theirs = shard_of(total, n, r);
        int_send_counts_[r] = static_cast<int>(theirs.size());
        int_send_offsets_[r] = static_cast<int>(theirs.begin);
        int_recv_offsets_[r] = r * mine_count;
    }
    reduce_scratch_.resize(static_cast<size_t>(n) * mine_count);  // (n, mine): my shard of each
    check_mpi(MPI_Alltoallv(data.data(), int_send_counts_.data(), int_send_offsets_.data(),
                            MPI_FLOAT, reduce_scratch_.data(), int_recv_counts_.data(),
                            int_recv_offsets_.data(), MPI_FLOAT, comm_),
              "MPI_Alltoallv (reduce-scatter)", name_);
    // Sum in group-rank order: the order, and so the rounding, never depends on timing.
    float* out = data.data() + mine.begin;
    for (int i = 0; i < mine_count; ++i)
        out[i] = reduce_scratch_[i];
    for (int r = 1; r < n; ++r) {
        const float* in = reduce_scratch_.data() + static_cast<size_t>(r) * mine_count;
        for (int i = 0; i < mine_count; ++i)
            out[i] += in[i];
    }
}

void Communicator::gather_shards(void* data, int64_t total, size_t elem_bytes) {
    const int n = size_;
    int_send_counts_.resize(n);
    int_send_offsets_.resize(n);
    for (int r = 0; r < n; ++r) {
        const ShardRange theirs = shard_of(total, n, r);
        int_send_counts_[r] = static_cast<int>(theirs.size());
        int_send_offsets_[r] = static_cast<int>(theirs.begin);
    }
    check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, int_send_counts_.data(),
                             int_send_offsets_.data(), item_type(elem_bytes), comm_),
              "MPI_Allgatherv (shards)", name_);
}

// Bytes of a reduce-scatter (scatter = true) or a shard all-gather of `total` items: each rank
// sends peer p its part of p's shard (reduce-scatter) or its own shard (all-gather).
void Communicator::add_shard_bytes(ByteCounts& bytes, int64_t total, int64_t item_bytes,
                                   bool scatter) const {
    const int64_t mine = shard_of(total, size_, rank_).size() * item_bytes;
    for (int p = 0; p < size_; ++p) {
        const int64_t theirs = shard_of(total, size_, p).size() * item_bytes;
        if (scatter)
            add_peer_bytes(bytes, p, theirs, mine);
        else
            add_peer_bytes(bytes, p, mine, theirs);
    }
}

// The all-reduce and the reduce-scatter: the same shard sums, then (all-reduce) the gather.
OpStats Communicator::shard_sum(OpKind kind, std::span<float> data, bool gather) {
    const Op op = begin(kind);
    const auto total = static_cast<int64_t>(data.size());
    to_int(total, fmt::format("{} element count", op_name(static_cast<uint32_t>(kind))));
    sizes_a_.assign(size_, total);
    const Clock::time_point last_entry = arrive(op, sizes_a_, sizes_a_, 0);
    {
        auto guard = watch_data_phase(op);
        sum_my_shard(data);
        if (gather)
            gather_shards(data.data(), total, sizeof(float));
    }
    ByteCounts bytes;
    add_shard_bytes(bytes, total, sizeof(float), true);
    if (gather)
        add_shard_bytes(bytes, total, sizeof(float), false);
    return finish(op, last_entry, bytes);
}

OpStats Communicator::all_reduce_sum(std::span<float> data) {
    return shard_sum(OpKind::kAllReduce, data, true);
}

OpStats Communicator::reduce_scatter_sum(std::span<float> data) {
    return shard_sum(OpKind::kReduceScatter, data, false);
}

OpStats Communicator::all_gather_shards(void* data, int64_t total, size_t elem_bytes) {
    const Op op = begin(OpKind::kAllGatherShards);
    to_int(total, "all_gather_shards item count");
    sizes_a_.assign(size_, total);
    const Clock::time_point last_entry =
        arrive(op, sizes_a_, sizes_a_, static_cast<int64_t>(elem_bytes));
    {
        auto guard = watch_data_phase(op);
        gather_shards(data, total, elem_bytes);
    }
    ByteCounts bytes;
    add_shard_bytes(bytes, total, static_cast<int64_t>(elem_bytes), false);
    return finish(op, last_entry, bytes);
}

OpStats Communicator::broadcast(void* data, size_t bytes_total, int root) {
    const Op op = begin(OpKind::kBroadcast);
    if (root < 0 || root >= size_) {
        fail(fmt::format("{}: root {} is not a rank of the group (size {})", describe(op), root,
                         size_));
    }
    const auto b = static_cast<int64_t>(bytes_total);
    const int count = to_int(b, "broadcast bytes");
    sizes_a_.assign(size_, b);
    const Clock::time_point last_entry = arrive(op, sizes_a_, sizes_a_, root);
    {
        auto guard = watch_data_phase(op);
        check_mpi(MPI_Bcast(data, count, MPI_BYTE, root, comm_), "MPI_Bcast", name_);
    }
    ByteCounts bytes;
    for (int p = 0; p < size_; ++p) {
        if (rank_ == root)
            add_peer_bytes(bytes, p, b, 0);
        else if (p == root)
            add_peer_bytes(bytes, p, 0, b);
    }
    return finish(op, last_entry, bytes);
}

OpStats Communicator::barrier() {
    const Op op = begin(OpKind::kBarrier);
    sizes_a_.assign(size_, 0);
    const Clock::time_point last_entry = arrive(op, sizes_a_, sizes_a_, 0);
    return finish(op, last_entry, ByteCounts{});
}

}  // namespace epo::comm
