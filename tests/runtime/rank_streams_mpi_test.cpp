// The two streams of a rank on real MPI ranks: tasks get their own stream's communicators, task
// records carry the bytes their collectives moved, and two streams issuing random collectives
// concurrently (with events between them) never deadlock and deliver every payload correctly.
#include <gtest/gtest.h>

#include <atomic>
#include <random>

#include "epo/comm/mpi_runtime.h"
#include "epo/runtime/rank_streams.h"

namespace epo::runtime {
namespace {

int world_rank() {
    return comm::current_world_rank();
}
int world_size() {
    return comm::current_world_size();
}

comm::CommOptions test_options() {
    comm::CommOptions o;
    o.timeout_s = 120;  // a deadlock ends the job with the watchdog's message, not a ctest timeout
    return o;
}

TEST(RankStreams, TasksGetTheirOwnStreamsCommunicators) {
    auto streams = make_rank_streams({world_size(), world_size(), 2}, test_options());
    ASSERT_NE(streams.compute->groups(), streams.comm->groups());
    comm::ProcessGroups* seen_compute = nullptr;
    comm::ProcessGroups* seen_comm = nullptr;
    streams.compute->enqueue("a", [&](StreamContext& ctx) { seen_compute = &ctx.comm(); });
    streams.comm->enqueue("b", [&](StreamContext& ctx) { seen_comm = &ctx.comm(); });
    streams.synchronize();
    EXPECT_EQ(seen_compute, streams.compute->groups());
    EXPECT_EQ(seen_comm, streams.comm->groups());
    EXPECT_EQ(seen_comm->ep.name(), "ep (stream comm)");
}

TEST(RankStreams, TaskRecordsCarryTheBytesTheirCollectivesMoved) {
    const int n = world_size();
    auto streams = make_rank_streams({n, n, 1}, test_options());
    comm::OpStats op;
    streams.comm->enqueue("dispatch", [&](StreamContext& ctx) {
        const auto layout = comm::AllToAllLayout::packed(std::vector<int64_t>(n, 10 + world_rank()),
                                                         std::vector<int64_t>(n, 0));
        auto l = layout;
        for (int p = 0; p < n; ++p)
            l.recv_counts[p] = 10 + p;
        l = comm::AllToAllLayout::packed(l.send_counts, l.recv_counts);
        std::vector<float> send(l.send_extent()), recv(l.recv_extent());
        op = ctx.comm().ep.all_to_all_v(std::span<const float>(send), std::span<float>(recv), l);
    });
    streams.comm->enqueue("idle", [](StreamContext&) {});
    streams.synchronize();
    const auto records = streams.comm->take_records();
    ASSERT_EQ(records.size(), 2u);
    EXPECT_EQ(records[0].bytes, op.bytes);
    EXPECT_EQ(records[0].bytes.inter_sent, int64_t{4} * (10 + world_rank()) * (n - 1));
    EXPECT_EQ(records[1].bytes, comm::ByteCounts{});
    EXPECT_EQ(streams.comm->stats().bytes, op.bytes);
}

// Payload rows {sender world rank, index}; counts[s][d] from a seed shared by all ranks.
void random_all_to_all(comm::Communicator& c, unsigned seed, std::atomic<int>& bad) {
    const int n = c.size();
    auto count = [&](int s, int d) {
        return static_cast<int64_t>((seed * 2654435761u + s * 97u + d * 31u) % 400u) *
               ((s + d + seed) % 4 != 0);
    };
    std::vector<int64_t> send_counts(n), recv_counts(n);
    for (int p = 0; p < n; ++p) {
        send_counts[p] = count(c.rank(), p);
        recv_counts[p] = count(p, c.rank());
    }
    const auto layout = comm::AllToAllLayout::packed(send_counts, recv_counts);
    std::vector<int> send(2 * layout.send_extent()), recv(2 * layout.recv_extent(), -1);
    for (int p = 0; p < n; ++p) {
        for (int64_t i = 0; i < send_counts[p]; ++i) {
            send[2 * (layout.send_offsets[p] + i)] = c.members().world_ranks[c.rank()];
            send[2 * (layout.send_offsets[p] + i) + 1] = static_cast<int>(i);
        }
    }
    c.all_to_all_v(std::span<const int>(send), std::span<int>(recv), layout, 2);
    for (int p = 0; p < n; ++p) {
        for (int64_t i = 0; i < recv_counts[p]; ++i) {
            if (recv[2 * (layout.recv_offsets[p] + i)] != c.members().world_ranks[p] ||
                recv[2 * (layout.recv_offsets[p] + i) + 1] != i) {
                ++bad;
            }
        }
    }
}

TEST(RankStreams, ConcurrentCollectivesOnBothStreamsNeverDeadlock) {
    const int n = world_size();
    auto streams = make_rank_streams({n, n, 2}, test_options());
    std::mt19937 rng(2024);  // the same schedule on every rank
    std::atomic<int> bad{0};
    std::vector<Event> events;
    for (int i = 0; i < 8; ++i)
        events.emplace_back("mb" + std::to_string(i));
    constexpr int kOps = 160;
    for (int i = 0; i < kOps; ++i) {
        Stream& s = rng() % 2 ? *streams.comm : *streams.compute;
        Stream& other = &s == streams.comm.get() ? *streams.compute : *streams.comm;
        const unsigned seed = rng();
        switch (rng() % 4) {
            case 0:
            case 1:
                s.enqueue("a2a", [seed, &bad](StreamContext& ctx) {
                    random_all_to_all(ctx.comm().ep, seed, bad);
                });
                break;
            case 2:
                s.enqueue("count exchange", [seed, &bad](StreamContext& ctx) {
                    auto& c = ctx.comm().ep;
                    std::vector<int64_t> mine(1 + seed % 9, c.rank()), all(mine.size() * c.size());
                    c.all_gather(std::span<const int64_t>(mine), std::span<int64_t>(all));
                    for (size_t k = 0; k < all.size(); ++k) {
                        if (all[k] != static_cast<int64_t>(k / mine.size()))
                            ++bad;
                    }
                });
                break;
            default:
                s.enqueue("grad sum", [seed, &bad](StreamContext& ctx) {
                    std::vector<float> g(seed % 3000, 1.0f);
                    ctx.comm().dp.all_reduce_sum(g);
                    for (float v : g) {
                        if (v != static_cast<float>(ctx.comm().dp.size()))
                            ++bad;
                    }
                });
        }
        if (rng() % 4 == 0) {
            Event& e = events[rng() % events.size()];
            s.record(e);
            other.wait(e);
        }
    }
    streams.synchronize();
    EXPECT_EQ(bad, 0);
    const auto ops =
        streams.compute->groups()->ep.stats().num_ops + streams.comm->groups()->ep.stats().num_ops +
        streams.compute->groups()->dp.stats().num_ops + streams.comm->groups()->dp.stats().num_ops;
    EXPECT_EQ(ops, kOps);
}

}  // namespace
}  // namespace epo::runtime
