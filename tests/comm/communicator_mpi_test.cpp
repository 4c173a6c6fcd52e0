// Communicators and collectives on real MPI ranks (run at every count in mpi_ranks.txt):
// groups match the topology, all-to-all payloads carry the sender's rank and arrive where the
// layout says (zero-size segments, gaps between segments), the swapped layout brings them back,
// bytes are accounted intra/inter-node, the all-reduce is the rank-ordered sum bit for bit, and
// misuse (mismatched counts, collectives in different orders, a peer that never comes) is an
// error naming the group and ranks instead of a hang.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <csignal>
#include <random>
#include <thread>

#include "epo/comm/link_limits.h"
#include "epo/comm/mpi_runtime.h"
#include "epo/comm/process_groups.h"
#include "epo/core/error.h"
#include "epo/core/stop_flag.h"

namespace epo::comm {
namespace {

int world_rank() {
    return current_world_rank();
}
int world_size() {
    return current_world_size();
}

std::unique_ptr<ProcessGroups> make_groups(int ep, int gpn, CommOptions options = {}) {
    static auto watchdog = std::make_shared<Watchdog>();
    options.timeout_s = 120;  // a hang fails the test through the watchdog instead of ctest
    return ProcessGroups::create({world_size(), ep, gpn}, options, "test", watchdog);
}

std::string message_of(const std::function<void()>& f) {  // "no error" if f does not throw
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "no error";
}

TEST(MpiErrors, BecomeErrorsWithMpisOwnMessage) {
    EXPECT_NO_THROW(check_mpi(MPI_SUCCESS, "MPI_Barrier"));
    const std::string m = message_of([] { check_mpi(MPI_ERR_TRUNCATE, "MPI_Recv on group ep"); });
    char expected[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(MPI_ERR_TRUNCATE, expected, &len);
    EXPECT_NE(m.find("MPI_Recv on group ep failed: " + std::string(expected, len)),
              std::string::npos)
        << m;
    // A real failing call: MPI_ERRORS_RETURN is set on the communicators the runtime owns.
    auto groups = make_groups(1, 8);
    int bad_root = world_size();
    int value = 0;
    const std::string bcast = message_of([&] {
        check_mpi(MPI_Bcast(&value, 1, MPI_INT, bad_root, groups->world.handle()), "MPI_Bcast");
    });
    EXPECT_NE(bcast.find("MPI_Bcast failed: "), std::string::npos) << bcast;
}

TEST(Groups, MatchTheTopologyForEveryEpSize) {
    const int n = world_size();
    for (int ep = 1; ep <= n; ++ep) {
        if (n % ep != 0)
            continue;
        for (int gpn : {1, 2, 3}) {
            auto groups = make_groups(ep, gpn);
            for (GroupKind kind :
                 {GroupKind::kWorld, GroupKind::kExpertParallel, GroupKind::kDataParallel,
                  GroupKind::kExpertDataParallel, GroupKind::kNode, GroupKind::kTensorParallel}) {
                Communicator& c = groups->group(kind);
                const auto expected = group_members(groups->layout, kind, world_rank());
                ASSERT_EQ(c.members().world_ranks, expected) << c.name();
                ASSERT_EQ(c.size(), static_cast<int>(expected.size()));
                ASSERT_EQ(expected[c.rank()], world_rank()) << c.name();
                // What MPI itself says the members are.
                std::vector<int> gathered(c.size());
                const int me = world_rank();
                c.all_gather(std::span<const int>(&me, 1), std::span<int>(gathered));
                EXPECT_EQ(gathered, expected) << c.name();
            }
        }
    }
}

// The embedding group (process_groups.h): with P > 1 stages, the rank of stage 0 and the rank of
// stage P-1 at the same place in their stages, in that order; none on the middle stages. Its sum
// is the same on both ranks.
TEST(Groups, EmbeddingGroupJoinsTheFirstAndTheLastStage) {
    const int n = world_size(), me = world_rank();
    for (int pp = 2; pp <= n; ++pp) {
        if (n % pp != 0)
            continue;
        static auto watchdog = std::make_shared<Watchdog>();
        CommOptions options;
        options.timeout_s = 120;
        auto groups = ProcessGroups::create(
            ParallelLayout{.world_size = n, .gpus_per_node = n, .pipeline_model_parallel_size = pp},
            options, "test", watchdog);
        const int stage_size = n / pp, stage = me / stage_size, local = me % stage_size;
        if (stage != 0 && stage != pp - 1) {
            EXPECT_FALSE(groups->embedding.has_value());
            continue;
        }
        ASSERT_TRUE(groups->embedding.has_value());
        Communicator& e = *groups->embedding;
        const std::vector<int> expected = {local, (pp - 1) * stage_size + local};
        EXPECT_EQ(e.members().world_ranks, expected);
        EXPECT_EQ(e.rank(), stage == 0 ? 0 : 1);
        std::vector<int> gathered(2);
        e.all_gather(std::span<const int>(&me, 1), std::span<int>(gathered));
        EXPECT_EQ(gathered, expected);
        EXPECT_NE(e.name().find("embedding"), std::string::npos) << e.name();
        std::vector<float> v = {0.1f * static_cast<float>(me + 1), 1e-8f, 3.0f};
        e.all_reduce_sum(std::span<float>(v));
        EXPECT_EQ(v[0], 0.1f * static_cast<float>(expected[0] + 1) +
                            0.1f * static_cast<float>(expected[1] + 1));
        EXPECT_EQ(v[2], 6.0f);
    }
}

// With TP (and PP) the stream's tp, dp, ep, edp and pp communicators hold the ranks topology.h
// lists, as MPI itself reports them.
TEST(Groups, MatchTheTopologyWithTensorAndPipelineParallelism) {
    const int n = world_size();
    for (int tp = 1; tp <= n; ++tp) {
        for (int pp = 1; pp <= n; ++pp) {
            if (n % (tp * pp) != 0 || tp * pp == 1)
                continue;
            for (int ep = 1; ep <= n / pp; ++ep) {
                if (n % (ep * pp) != 0)
                    continue;
                ParallelLayout layout{n, ep, 2, pp};
                layout.tensor_model_parallel_size = tp;
                static auto watchdog = std::make_shared<Watchdog>();
                auto groups =
                    ProcessGroups::create(layout, CommOptions{.timeout_s = 120}, "test", watchdog);
                for (GroupKind kind : {GroupKind::kTensorParallel, GroupKind::kDataParallel,
                                       GroupKind::kExpertParallel, GroupKind::kExpertDataParallel,
                                       GroupKind::kPipeline}) {
                    Communicator& c = groups->group(kind);
                    const auto expected = group_members(layout, kind, world_rank());
                    ASSERT_EQ(c.members().world_ranks, expected) << c.name();
                    std::vector<int> gathered(c.size());
                    const int me = world_rank();
                    c.all_gather(std::span<const int>(&me, 1), std::span<int>(gathered));
                    EXPECT_EQ(gathered, expected) << c.name();
                }
            }
        }
    }
}

// Items are rows of 3 ints {sender world rank, receiver group rank, index in the segment}.
struct Rows {
    std::vector<int> data;
    static constexpr int kWidth = 3;
};

// counts[s][d]: items group rank s sends to d; the same matrix on every rank (shared seed).
std::vector<std::vector<int64_t>> count_matrix(int n, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<std::vector<int64_t>> c(n, std::vector<int64_t>(n));
    for (int s = 0; s < n; ++s) {
        for (int d = 0; d < n; ++d)
            c[s][d] = (s + d + seed) % 3 == 0 ? 0 : rng() % 7;
    }
    return c;
}

TEST(AllToAll, RankPayloadsArriveWhereTheLayoutSays) {
    const int n = world_size();
    auto groups = make_groups(n, 2);  // EP = world, two ranks per node
    Communicator& ep = groups->ep;
    const int me = ep.rank();
    for (unsigned seed = 0; seed < 6; ++seed) {
        const auto c = count_matrix(n, seed);
        AllToAllLayout layout;
        int64_t at_send = 0;
        int64_t at_recv = 0;
        for (int p = 0; p < n; ++p) {
            // Gaps between segments (1 item on the send side, 2 on the receive side) check that
            // offsets, not packing, decide where rows go.
            layout.send_counts.push_back(c[me][p]);
            layout.send_offsets.push_back(at_send);
            at_send += c[me][p] + 1;
            layout.recv_counts.push_back(c[p][me]);
            layout.recv_offsets.push_back(at_recv);
            at_recv += c[p][me] + 2;
        }
        std::vector<int> send(at_send * Rows::kWidth, -7);
        for (int p = 0; p < n; ++p) {
            for (int64_t i = 0; i < c[me][p]; ++i) {
                int* row = &send[(layout.send_offsets[p] + i) * Rows::kWidth];
                row[0] = world_rank();
                row[1] = p;
                row[2] = static_cast<int>(i);
            }
        }
        std::vector<int> recv(at_recv * Rows::kWidth, -1);
        const OpStats stats =
            ep.all_to_all_v(std::span<const int>(send), std::span<int>(recv), layout, Rows::kWidth);
        ByteCounts expected_bytes;
        for (int p = 0; p < n; ++p) {
            for (int64_t i = 0; i < c[p][me]; ++i) {
                const int* row = &recv[(layout.recv_offsets[p] + i) * Rows::kWidth];
                ASSERT_EQ(row[0], ep.members().world_ranks[p]) << "seed " << seed;
                ASSERT_EQ(row[1], me);
                ASSERT_EQ(row[2], i);
            }
            // The gap after each segment is untouched.
            for (int64_t i = c[p][me]; i < c[p][me] + 2; ++i) {
                for (int k = 0; k < Rows::kWidth; ++k) {
                    ASSERT_EQ(recv[(layout.recv_offsets[p] + i) * Rows::kWidth + k], -1);
                }
            }
            if (p == me)
                continue;
            const bool same_node = p / 2 == me / 2;
            const int64_t sent = c[me][p] * 12;
            const int64_t got = c[p][me] * 12;
            (same_node ? expected_bytes.intra_sent : expected_bytes.inter_sent) += sent;
            (same_node ? expected_bytes.intra_recv : expected_bytes.inter_recv) += got;
        }
        EXPECT_EQ(stats.bytes, expected_bytes) << "seed " << seed;

        // Backward: the swapped layout returns every row to where it came from.
        std::vector<int> back(send.size(), -7);
        ep.all_to_all_v(std::span<const int>(recv), std::span<int>(back), layout.swapped(),
                        Rows::kWidth);
        EXPECT_EQ(back, send) << "seed " << seed;
    }
    EXPECT_EQ(ep.stats().num_ops, 12);
}

TEST(AllToAll, ZeroSizedEverywhere) {
    const int n = world_size();
    auto groups = make_groups(n, 8);
    const auto layout =
        AllToAllLayout::packed(std::vector<int64_t>(n, 0), std::vector<int64_t>(n, 0));
    const OpStats stats =
        groups->ep.all_to_all_v(std::span<const float>(), std::span<float>(), layout);
    EXPECT_EQ(stats.bytes, ByteCounts{});
}

TEST(AllToAll, BufferTooSmallIsAnError) {
    const int n = world_size();
    auto groups = make_groups(n, 8);
    const auto layout =
        AllToAllLayout::packed(std::vector<int64_t>(n, 2), std::vector<int64_t>(n, 2));
    std::vector<float> send(2 * n), recv(2 * n - 1);
    EXPECT_NE(message_of([&] {
                  groups->ep.all_to_all_v(std::span<const float>(send), std::span<float>(recv),
                                          layout);
              }).find("the recv buffer holds"),
              std::string::npos);
}

TEST(AllToAll, MismatchedCountsAreAnErrorNotAHang) {
    const int n = world_size();
    auto groups = make_groups(n, 8);
    // Every rank sends rank+1 items but expects p+2 from peer p: every receiver sees a mismatch
    // (a rank's own segment too), so every rank fails in the arrival phase.
    AllToAllLayout layout = AllToAllLayout::packed(std::vector<int64_t>(n, world_rank() + 1), {});
    for (int p = 0; p < n; ++p)
        layout.recv_counts.push_back(p + 2);
    layout = AllToAllLayout::packed(layout.send_counts, layout.recv_counts);
    std::vector<float> send(layout.send_extent()), recv(layout.recv_extent());
    const std::string m = message_of([&] {
        groups->ep.all_to_all_v(std::span<const float>(send), std::span<float>(recv), layout);
    });
    EXPECT_NE(m.find("counts must agree between sender and receiver"), std::string::npos) << m;
    EXPECT_NE(m.find("on group ep (stream test)"), std::string::npos) << m;
    // The communicator refuses further use rather than run out of step with its peers.
    EXPECT_NE(message_of([&] { groups->ep.barrier(); }).find("unusable after an earlier failure"),
              std::string::npos);
}

TEST(Collectives, DifferentOrderOnDifferentRanksIsAnError) {
    if (world_size() < 2)
        GTEST_SKIP() << "needs two ranks";
    auto groups = make_groups(1, 8);
    const std::string m = message_of([&] {
        if (world_rank() % 2 == 0) {
            groups->world.barrier();
        } else {
            std::vector<int> in(1), out(world_size());
            groups->world.all_gather(std::span<const int>(in), std::span<int>(out));
        }
    });
    EXPECT_NE(m.find("collective order differs between ranks on group world"), std::string::npos)
        << m;
}

TEST(Collectives, PeerThatNeverArrivesTimesOutNamingIt) {
    if (world_size() < 2)
        GTEST_SKIP() << "needs two ranks";
    // The deadline also bounds creating the groups (about ten communicator splits), which under
    // ThreadSanitizer with another MPI test beside it on two cores took over 0.3 s: 2 s.
    auto groups = ProcessGroups::create({world_size(), 1, 8}, CommOptions{2.0, {}, {}}, "test",
                                        std::make_shared<Watchdog>());
    if (world_rank() == 0) {
        const std::string m = message_of([&] { groups->world.barrier(); });
        std::string expected = "world rank(s) 1";
        for (int r = 2; r < world_size(); ++r)
            expected += ", " + std::to_string(r);
        EXPECT_NE(m.find("barrier #0 on group world (stream test)"), std::string::npos) << m;
        EXPECT_NE(
            m.find("timed out after 2 s (comm.timeout_s) waiting for " + expected + " to arrive"),
            std::string::npos)
            << m;
    }
    // Resynchronize on MPI's own barrier (the test groups are unusable on rank 0 now), then take
    // rank 0's arrival message off the other ranks' queues so nothing stale outlives the test.
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() != 0) {
        char stale[64];
        MPI_Recv(stale, sizeof stale, MPI_BYTE, 0, MPI_ANY_TAG, groups->world.handle(),
                 MPI_STATUS_IGNORE);
    }
}

TEST(Collectives, AllReduceIsTheRankOrderedSumOnEveryRank) {
    const int n = world_size();
    auto groups = make_groups(1, 8);
    for (int len : {0, 1, 5, 1000, 4097}) {
        // Values chosen so that the order of additions changes the rounding.
        auto value = [](int rank, int i) {
            return static_cast<float>(std::ldexp(1.0 + 0.1 * i, (rank * 7 + i) % 40 - 20));
        };
        std::vector<float> data(len);
        for (int i = 0; i < len; ++i)
            data[i] = value(world_rank(), i);
        groups->dp.all_reduce_sum(data);
        for (int i = 0; i < len; ++i) {
            float expected = value(0, i);
            for (int r = 1; r < n; ++r)
                expected += value(r, i);
            ASSERT_EQ(data[i], expected) << "len " << len << " i " << i;  // bit for bit
        }
    }
}

TEST(Collectives, ReduceScatterAndShardGatherMatchAllReduceBitForBit) {
    const int n = world_size();
    const int me = world_rank();
    auto groups = make_groups(1, 1);  // one rank per node: every byte crosses nodes
    for (int len : {0, 1, 3, 1000, 4097}) {
        auto value = [](int rank, int i) {
            return static_cast<float>(std::ldexp(1.0 - 0.07 * i, (rank * 5 + i) % 30 - 15));
        };
        std::vector<float> reduced(len), scattered(len);
        for (int i = 0; i < len; ++i)
            reduced[i] = scattered[i] = value(me, i);
        groups->dp.all_reduce_sum(reduced);
        const ShardRange mine = shard_of(len, n, me);
        EXPECT_EQ(mine.begin, int64_t{me} * len / n);
        const OpStats rs = groups->dp.reduce_scatter_sum(scattered);
        for (int i = 0; i < len; ++i) {
            if (i >= mine.begin && i < mine.end)
                ASSERT_EQ(scattered[i], reduced[i]) << "len " << len << " i " << i;
            else
                ASSERT_EQ(scattered[i], value(me, i)) << "outside the shard: untouched";
        }
        // Peer p receives this rank's part of p's shard; this rank receives its shard from each.
        if (n > 1) {
            EXPECT_EQ(rs.bytes.inter_sent, (len - mine.size()) * 4);
            EXPECT_EQ(rs.bytes.inter_recv, mine.size() * (n - 1) * 4);
        }
        const OpStats ag = groups->dp.all_gather_shards(scattered.data(), len, sizeof(float));
        ASSERT_EQ(scattered, reduced);
        if (n > 1) {
            EXPECT_EQ(ag.bytes.inter_sent, mine.size() * (n - 1) * 4);
            EXPECT_EQ(ag.bytes.inter_recv, (len - mine.size()) * 4);
        }
        // Any item size: 2-byte items (bf16 weights) gather the same way.
        std::vector<uint16_t> halves(len, 0);
        for (int64_t i = mine.begin; i < mine.end; ++i)
            halves[i] = static_cast<uint16_t>(i * 3 + 1);
        groups->dp.all_gather_shards(halves.data(), len, sizeof(uint16_t));
        for (int i = 0; i < len; ++i)
            ASSERT_EQ(halves[i], static_cast<uint16_t>(i * 3 + 1));
    }
    // Ranks that disagree on the length get an error naming the sizes, not a hang.
    if (n > 1) {
        std::vector<float> bad(static_cast<size_t>(10 + me));
        EXPECT_NE(message_of([&] { groups->world.reduce_scatter_sum(bad); }).find("size"),
                  std::string::npos);
    }
}

TEST(Collectives, BroadcastFromEveryRootAndBarrier) {
    const int n = world_size();
    auto groups = make_groups(1, 1);
    for (int root = 0; root < n; ++root) {
        std::vector<double> data(33, world_rank() == root ? root + 0.5 : -1.0);
        const OpStats s = groups->world.broadcast(std::span<double>(data), root);
        for (double v : data)
            ASSERT_EQ(v, root + 0.5);
        // One rank per node: everything crosses nodes; only the root sends.
        if (n > 1) {
            EXPECT_EQ(s.bytes.inter_sent, world_rank() == root ? 33 * 8 * (n - 1) : 0);
            EXPECT_EQ(s.bytes.inter_recv, world_rank() == root ? 0 : 33 * 8);
        }
        EXPECT_EQ(s.bytes.intra_sent + s.bytes.intra_recv, 0);
    }
    EXPECT_EQ(groups->world.barrier().bytes, ByteCounts{});
    EXPECT_NE(message_of([&] {
                  std::vector<int> d(1);
                  groups->world.broadcast(std::span<int>(d), n);
              }).find("is not a rank of the group"),
              std::string::npos);
}

TEST(LinkModel, HoldsUntilTheLastEntryPlusTheModel) {
    if (world_size() < 2)
        GTEST_SKIP() << "needs two ranks";
    const int n = world_size();
    CommOptions options;
    options.link = LinkModel{8, 0, 100};  // 1e9 bytes/s between nodes, 100 us latency
    auto groups = make_groups(n, 1, options);
    const int64_t per_peer = 1'000'000;  // 1 ms per peer at 1e9 bytes/s
    const auto layout = AllToAllLayout::packed(std::vector<int64_t>(n, per_peer),
                                               std::vector<int64_t>(n, per_peer));
    std::vector<char> send(per_peer * n), recv(per_peer * n);
    MPI_Barrier(MPI_COMM_WORLD);
    // The last rank enters 50 ms late: nobody may finish before its entry + the model. All ranks
    // of this test share one host, so their steady clocks compare directly.
    if (world_rank() == n - 1)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const int64_t entry = to_ns(Clock::now());
    const OpStats s = groups->ep.all_to_all_v(send.data(), recv.data(), layout, 1);
    const int64_t end = to_ns(Clock::now());
    std::vector<int64_t> entries(n);
    MPI_Allgather(&entry, 1, MPI_INT64_T, entries.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
    const int64_t last_entry = *std::max_element(entries.begin(), entries.end());
    const double model = 100e-6 + (n - 1) * per_peer / 1e9;
    EXPECT_DOUBLE_EQ(s.modelled_s, model);
    EXPECT_GE(end - last_entry, static_cast<int64_t>(model * 1e9));
    // What this rank saw of the wait for the last one (its own entry is taken inside the call, so
    // a rank descheduled between the two clock reads sees less: 3 ranks share 2 cores in CI).
    EXPECT_GE(s.arrival_wait_s, (last_entry - entry) * 1e-9 - 10e-3);
    EXPECT_EQ(s.bytes.inter_sent, per_peer * (n - 1));
}

// A link so slow that the hold would outlast comm.timeout_s: the operation fails at once on every
// rank with the timeout error naming it, instead of sleeping (formerly for years).
TEST(LinkModel, HoldPastTheTimeoutFailsAtOnceNamingTheOperation) {
    if (world_size() < 2)
        GTEST_SKIP() << "needs two ranks";
    const int n = world_size();
    CommOptions options;
    options.timeout_s = 2;
    options.link = LinkModel{kMinLinkGbps, 0, 0};  // 125 kB/s: 1 MB per peer takes 8 s
    auto groups = ProcessGroups::create({n, n, 1}, options, "test", std::make_shared<Watchdog>());
    const int64_t per_peer = 1'000'000;
    const auto layout = AllToAllLayout::packed(std::vector<int64_t>(n, per_peer),
                                               std::vector<int64_t>(n, per_peer));
    std::vector<char> send(per_peer * n), recv(per_peer * n);
    const auto t0 = Clock::now();
    const std::string m =
        message_of([&] { groups->ep.all_to_all_v(send.data(), recv.data(), layout, 1); });
    EXPECT_LT(seconds_between(t0, Clock::now()), 1.5);
    EXPECT_NE(m.find("all_to_all #0 on group ep"), std::string::npos) << m;
    EXPECT_NE(m.find("timed out: the link model holds it"), std::string::npos) << m;
    EXPECT_NE(m.find("beyond comm.timeout_s = 2 s"), std::string::npos) << m;
    MPI_Barrier(MPI_COMM_WORLD);
}

// SIGTERM's stop request ends a hold early: the bytes have moved, only the waiting is cut.
TEST(LinkModel, StopRequestCutsAHoldShort) {
    if (world_size() < 2)
        GTEST_SKIP() << "needs two ranks";
    CommOptions options;
    options.link = LinkModel{0, 0, 5e6};  // 5 s of latency per collective
    auto groups = make_groups(world_size(), 1, options);
    MPI_Barrier(MPI_COMM_WORLD);
    std::thread stopper([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        request_stop(SIGTERM);
    });
    const auto t0 = Clock::now();
    std::vector<int> data(4, world_rank());
    groups->world.broadcast(std::span<int>(data), 0);
    const double elapsed = seconds_between(t0, Clock::now());
    stopper.join();
    clear_stop_request();
    EXPECT_EQ(data[0], 0);
    EXPECT_LT(elapsed, 2.0);
    MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace epo::comm
