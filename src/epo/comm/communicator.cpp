#include "epo/comm/communicator.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

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
// Tag of the phase-2 transfers: one message per peer and direction per operation, so the same
// ordering rule matches the n-th data message from a peer with this rank's n-th receive from it.
constexpr int kDataTag = kArrivalTag + 1;

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
    const auto& d = options.data_wait;
    if (!(d.sleep_fraction > 0 && d.sleep_fraction <= 1 && d.max_sleep_us >= w.min_sleep_us &&
          d.max_sleep_us <= 1e6 && d.bytes_per_sleep > 0)) {
        throw Error(
            ErrorKind::kConfig,
            fmt::format("data wait policy sleep_fraction={} max_sleep_us={} "
                        "bytes_per_sleep={}: need 0 < sleep_fraction <= 1, min_sleep_us "
                        "({}) <= max_sleep_us <= 1e6 and bytes_per_sleep > 0",
                        d.sleep_fraction, d.max_sleep_us, d.bytes_per_sleep, w.min_sleep_us));
    }
}

SleepSchedule data_sleep_schedule(const WaitPolicy& arrival, const DataWaitPolicy& data,
                                  double expected_s, double bytes_per_s) {
    double longest = data.max_sleep_us;
    if (bytes_per_s > 0)
        longest = std::min(longest, data.bytes_per_sleep / bytes_per_s * 1e6);
    const double cap = std::clamp(expected_s * 1e6 * data.sleep_fraction, arrival.min_sleep_us,
                                  std::max(longest, arrival.min_sleep_us));
    return SleepSchedule{arrival.spin_us, arrival.min_sleep_us, cap};
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
    data_s += op.data_s;
    data_tests += op.data_tests;
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
      item_types_(std::move(o.item_types_)),
      rate_(o.rate_) {
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
    const WaitPolicy& w = options_.wait;
    ProgressCount count;
    if (!progress_requests(requests_, done_, *bells_,
                           SleepSchedule{w.spin_us, w.min_sleep_us, w.max_sleep_us}, deadline, {},
                           name_, poll_indices_, count)) {
        std::vector<int> missing;
        for (int p = 0; p < n; ++p) {
            if (!done_[p])
                missing.push_back(members_.world_ranks[p]);
        }
        // Withdraw what is still pending: the communicator is unusable from here on.
        is_receive_.assign(2 * static_cast<size_t>(n), 0);
        std::fill(is_receive_.begin(), is_receive_.begin() + n, 1);
        withdraw_requests(requests_, is_receive_);
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

void Communicator::add_send(int peer, const void* data, int64_t count, MPI_Datatype type,
                            int64_t bytes) {
    if (peer == rank_ || count == 0)
        return;
    // MPI's send buffers are const in MPI-3; the cast only fits the one Transfer record.
    transfers_.push_back(
        Transfer{peer, const_cast<void*>(data), static_cast<int>(count), type, false});
    transfer_sent_ += bytes;
}

void Communicator::add_recv(int peer, void* data, int64_t count, MPI_Datatype type, int64_t bytes) {
    if (peer == rank_ || count == 0)
        return;
    transfers_.push_back(Transfer{peer, data, static_cast<int>(count), type, true});
    transfer_recv_ += bytes;
}

// Phase 2. Receives are posted before sends, so a peer's message never arrives unexpected at a
// rank that has posted its receives. After posting, each destination on this host is rung (it
// may sleep in its own phase 1 or 2 and can now take the bytes); after each completed receive
// the sender is rung (its send may be complete now). The deadline is comm.timeout_s from the
// start of this phase, as the watchdog's was; the watchdog stays as a backstop, a second later,
// for an MPI call that never returns.
void Communicator::move_data(const Op& op, OpStats& stats) {
    const size_t num = transfers_.size();
    if (num == 0)
        return;  // one rank, or nothing to move
    requests_.assign(num, MPI_REQUEST_NULL);
    done_.assign(num, 0);
    is_receive_.resize(num);
    const auto start = Clock::now();
    for (int pass = 0; pass < 2; ++pass) {
        for (size_t i = 0; i < num; ++i) {
            const Transfer& t = transfers_[i];
            is_receive_[i] = t.receive ? 1 : 0;
            if (t.receive && pass == 0) {
                check_mpi(
                    MPI_Irecv(t.data, t.count, t.type, t.peer, kDataTag, comm_, &requests_[i]),
                    "MPI_Irecv", name_);
            } else if (!t.receive && pass == 1) {
                check_mpi(
                    MPI_Isend(t.data, t.count, t.type, t.peer, kDataTag, comm_, &requests_[i]),
                    "MPI_Isend", name_);
            }
        }
    }
    for (const Transfer& t : transfers_) {
        if (!t.receive)
            bells_->ring(t.peer);
    }
    const int64_t busiest = std::max(transfer_sent_, transfer_recv_);
    // The rate cap keeps a TCP peer's socket fed, which takes this rank's own tests; peers on this
    // host ring the doorbell as their part completes, so with only them the cap would only make a
    // rank whose peer is descheduled wake every 50 us (22% of its core, measured) for nothing.
    const bool remote_peer =
        std::any_of(transfers_.begin(), transfers_.end(),
                    [&](const Transfer& t) { return !bells_->shares_host(t.peer); });
    const SleepSchedule schedule =
        data_sleep_schedule(options_.wait, options_.data_wait, rate_.expected_s(busiest),
                            remote_peer ? rate_.bytes_per_s() : 0);
    const auto timeout = std::chrono::nanoseconds(std::llround(options_.timeout_s * 1e9));
    const auto deadline = start + timeout;
    // An MPI call that never returns cannot say which peer it waits for; the peers this rank
    // exchanges data with can be named (with two ranks, that is the silent one).
    std::vector<int> peers;
    for (const Transfer& t : transfers_) {
        const int w = members_.world_ranks[static_cast<size_t>(t.peer)];
        if (t.peer != rank_ && std::find(peers.begin(), peers.end(), w) == peers.end())
            peers.push_back(w);
    }
    std::sort(peers.begin(), peers.end());
    auto guard = watchdog_->watch(
        fmt::format("watchdog: {}: every rank arrived but the data exchange did not finish within "
                    "{} s (comm.timeout_s) and an MPI call has not returned since; a peer died or "
                    "MPI itself is stuck (this rank's data goes to and comes from world rank(s) "
                    "{}: the silent one is among them)",
                    describe(op), options_.timeout_s, rank_list(peers)),
        deadline + std::chrono::seconds(1));
    ProgressCount count;
    const bool ok = progress_requests(
        requests_, done_, *bells_, schedule, deadline,
        [this](int i) {
            if (transfers_[i].receive)
                bells_->ring(transfers_[i].peer);
        },
        name_, poll_indices_, count);
    const double seconds = seconds_between(start, Clock::now());
    if (!ok) {
        std::vector<int> not_delivered, not_taken;
        for (size_t i = 0; i < num; ++i) {
            if (done_[i])
                continue;
            const int world = members_.world_ranks[transfers_[i].peer];
            (transfers_[i].receive ? not_delivered : not_taken).push_back(world);
        }
        withdraw_requests(requests_, is_receive_);
        auto list = [](const std::vector<int>& ranks) {
            return ranks.empty() ? std::string("none") : rank_list(ranks);
        };
        fail(fmt::format(
            "{}: every rank arrived but the data exchange did not finish within {} s "
            "(comm.timeout_s): bytes from world rank(s) {} had not all arrived, and world "
            "rank(s) {} had not taken all of this rank's; a peer died, stalls, or its link "
            "stopped moving (raise comm.timeout_s if the link is only slow)",
            describe(op), options_.timeout_s, list(not_delivered), list(not_taken)));
    }
    rate_.observe(busiest, seconds);
    stats.data_s += seconds;
    stats.data_tests += count.num_tests;
    transfers_.clear();
    transfer_sent_ = 0;
    transfer_recv_ = 0;
}

// Phase 3, the link model's hold (link_limits.h): never past the operation's deadline (entry +
// comm.timeout_s), cut short by a stop request.
OpStats Communicator::finish(const Op& op, Clock::time_point last_entry, const ByteCounts& bytes,
                             OpStats s) {
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
    for (size_t p = 0; p < n; ++p) {
        to_int(layout.send_counts[p], fmt::format("send_counts[{}]", p));
        to_int(layout.send_offsets[p], fmt::format("send_offsets[{}]", p));
        to_int(layout.recv_counts[p], fmt::format("recv_counts[{}]", p));
        to_int(layout.recv_offsets[p], fmt::format("recv_offsets[{}]", p));
    }
    const Clock::time_point last_entry =
        arrive(op, layout.send_counts, layout.recv_counts, static_cast<int64_t>(elem_bytes));
    const MPI_Datatype type = item_type(elem_bytes);
    const auto eb = static_cast<int64_t>(elem_bytes);
    const auto* in = static_cast<const char*>(send);
    auto* out = static_cast<char*>(recv);
    for (int p = 0; p < size_; ++p) {
        add_recv(p, out + layout.recv_offsets[p] * eb, layout.recv_counts[p], type,
                 layout.recv_counts[p] * eb);
        add_send(p, in + layout.send_offsets[p] * eb, layout.send_counts[p], type,
                 layout.send_counts[p] * eb);
    }
    // This rank's own rows while the others are in flight (the arrival phase checked that the
    // counts agree).
    if (layout.send_counts[rank_] > 0) {
        std::memcpy(out + layout.recv_offsets[rank_] * eb, in + layout.send_offsets[rank_] * eb,
                    static_cast<size_t>(layout.send_counts[rank_] * eb));
    }
    OpStats s;
    move_data(op, s);
    ByteCounts bytes;
    for (int p = 0; p < size_; ++p) {
        add_peer_bytes(bytes, p, layout.send_counts[p] * eb, layout.recv_counts[p] * eb);
    }
    return finish(op, last_entry, bytes, s);
}

OpStats Communicator::all_gather(const void* send, void* recv, size_t bytes_per_rank) {
    const Op op = begin(OpKind::kAllGather);
    const auto b = static_cast<int64_t>(bytes_per_rank);
    const int count = to_int(b, "all_gather bytes per rank");
    sizes_a_.assign(size_, b);
    const Clock::time_point last_entry = arrive(op, sizes_a_, sizes_a_, 0);
    auto* out = static_cast<char*>(recv);
    for (int p = 0; p < size_; ++p) {
        add_recv(p, out + p * b, count, MPI_BYTE, b);
        add_send(p, send, count, MPI_BYTE, b);
    }
    if (b > 0)
        std::memmove(out + rank_ * b, send, static_cast<size_t>(b));
    OpStats s;
    move_data(op, s);
    ByteCounts bytes;
    for (int p = 0; p < size_; ++p)
        add_peer_bytes(bytes, p, b, b);
    return finish(op, last_entry, bytes, s);
}

ShardRange shard_of(int64_t total, int group_size, int group_rank) {
    return ShardRange{group_rank * total / group_size, (group_rank + 1) * total / group_size};
}

// Rank r receives every rank's part of shard r into row r of the scratch, in group-rank order:
// (n, mine) for this rank.
void Communicator::sum_my_shard(const Op& op, std::span<float> data, OpStats& stats) {
    const int n = size_;
    const auto total = static_cast<int64_t>(data.size());
    const ShardRange mine = shard_of(total, n, rank_);
    const int64_t mine_count = mine.size();
    reduce_scratch_.resize(static_cast<size_t>(n * mine_count));  // (n, mine): my shard of each
    constexpr int64_t kFloat = sizeof(float);
    for (int r = 0; r < n; ++r) {
        const ShardRange theirs = shard_of(total, n, r);
        add_recv(r, reduce_scratch_.data() + r * mine_count, mine_count, MPI_FLOAT,
                 mine_count * kFloat);
        add_send(r, data.data() + theirs.begin, theirs.size(), MPI_FLOAT, theirs.size() * kFloat);
    }
    std::copy(data.begin() + mine.begin, data.begin() + mine.end,
              reduce_scratch_.begin() + rank_ * mine_count);
    move_data(op, stats);
    // Sum in group-rank order: the order, and so the rounding, never depends on timing.
    float* out = data.data() + mine.begin;
    for (int64_t i = 0; i < mine_count; ++i)
        out[i] = reduce_scratch_[i];
    for (int r = 1; r < n; ++r) {
        const float* in = reduce_scratch_.data() + r * mine_count;
        for (int64_t i = 0; i < mine_count; ++i)
            out[i] += in[i];
    }
}

// In place: this rank's shard to every peer, every peer's shard into its place.
void Communicator::gather_shards(const Op& op, void* data, int64_t total, size_t elem_bytes,
                                 OpStats& stats) {
    const int n = size_;
    const MPI_Datatype type = item_type(elem_bytes);
    const auto eb = static_cast<int64_t>(elem_bytes);
    auto* bytes = static_cast<char*>(data);
    const ShardRange mine = shard_of(total, n, rank_);
    for (int r = 0; r < n; ++r) {
        const ShardRange theirs = shard_of(total, n, r);
        add_recv(r, bytes + theirs.begin * eb, theirs.size(), type, theirs.size() * eb);
        add_send(r, bytes + mine.begin * eb, mine.size(), type, mine.size() * eb);
    }
    move_data(op, stats);
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
    OpStats s;
    sum_my_shard(op, data, s);
    if (gather)
        gather_shards(op, data.data(), total, sizeof(float), s);
    ByteCounts bytes;
    add_shard_bytes(bytes, total, sizeof(float), true);
    if (gather)
        add_shard_bytes(bytes, total, sizeof(float), false);
    return finish(op, last_entry, bytes, s);
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
    OpStats s;
    gather_shards(op, data, total, elem_bytes, s);
    ByteCounts bytes;
    add_shard_bytes(bytes, total, static_cast<int64_t>(elem_bytes), false);
    return finish(op, last_entry, bytes, s);
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
    // Straight from the root to every rank: broadcasts here are small agreements (checkpoint
    // names), where a tree would only add latency.
    for (int p = 0; p < size_; ++p) {
        if (rank_ == root)
            add_send(p, data, count, MPI_BYTE, b);
        else if (p == root)
            add_recv(p, data, count, MPI_BYTE, b);
    }
    OpStats s;
    move_data(op, s);
    ByteCounts bytes;
    for (int p = 0; p < size_; ++p) {
        if (rank_ == root)
            add_peer_bytes(bytes, p, b, 0);
        else if (p == root)
            add_peer_bytes(bytes, p, 0, b);
    }
    return finish(op, last_entry, bytes, s);
}

OpStats Communicator::barrier() {
    const Op op = begin(OpKind::kBarrier);
    sizes_a_.assign(size_, 0);
    const Clock::time_point last_entry = arrive(op, sizes_a_, sizes_a_, 0);
    return finish(op, last_entry, ByteCounts{});
}

}  // namespace epo::comm
