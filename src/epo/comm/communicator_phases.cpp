// The three phases every operation of a Communicator runs (communicator.h has the protocol):
// entry and arrival (phase 1), the data transfers (phase 2), the link model's hold (phase 3),
// and the byte accounting and failure messages they share.
#include <algorithm>
#include <cmath>

#include "epo/comm/communicator.h"
#include "epo/comm/communicator_internal.h"
#include "epo/comm/link_limits.h"
#include "epo/comm/mpi_runtime.h"
#include "epo/core/error.h"

namespace epo::comm {

namespace {

// Tag of the phase-1 messages. Communicators are private duplicates, so only the runtime's own
// point-to-point traffic can share it, and messages between two ranks on one tag never overtake
// each other: the n-th arrival message from a peer belongs to its n-th operation.
constexpr int kArrivalTag = 0x45504f;  // "EPO"
// Tag of the phase-2 transfers: one message per peer and direction per operation, so the same
// ordering rule matches the n-th data message from a peer with this rank's n-th receive from it.
constexpr int kDataTag = kArrivalTag + 1;

std::string rank_list(const std::vector<int>& ranks) {
    return fmt::format("{}", fmt::join(ranks, ", "));
}

}  // namespace

// ---- failures ----

std::string Communicator::describe(const Op& op) const {
    return fmt::format("{} #{} on group {} (world ranks {})",
                       detail::op_name(static_cast<uint32_t>(op.kind)), op.seq, name_,
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

// ---- phases ----

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
                name_, members_.world_ranks[rank_], detail::op_name(static_cast<uint32_t>(op.kind)),
                op.seq, peer, detail::op_name(a.kind), a.seq));
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

}  // namespace epo::comm
