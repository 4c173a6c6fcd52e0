// The alltoall token dispatcher (token_dispatcher.h) on real MPI ranks (1-4, every EP size that
// divides the world): rows filled with the sender's rank and token arrive where the plan says,
// sorted expert-major with the source ranks in order, their weights with them; with identity
// experts combine(dispatch(x)) = (kept k) * x, and the backward path returns dy the same way;
// the backward all-to-alls swap the splits; skew (every token to one expert: ranks and experts
// without rows) and capacity drops.
#include <gtest/gtest.h>

#include "epo/comm/mpi_runtime.h"
#include "epo/comm/process_groups.h"
#include "epo/moe/alltoall_dispatcher.h"
#include "epo/tensor/random.h"

namespace epo::moe {
namespace {

int world_rank() {
    return comm::current_world_rank();
}
int world_size() {
    return comm::current_world_size();
}

std::unique_ptr<comm::ProcessGroups> make_groups(int ep) {
    static auto watchdog = std::make_shared<comm::Watchdog>();
    comm::CommOptions options;
    options.timeout_s = 120;
    return comm::ProcessGroups::create({world_size(), ep, 2}, options, "test", watchdog);
}

enum class Routing { kSpread, kAllToExpertZero };

constexpr std::int64_t kWidth = 4;  // row: {rank, token, -1, 7}

float weight_code(int rank, std::int64_t t, std::int64_t k) {
    return static_cast<float>(rank * 10000 + t * 10 + k);
}

std::int64_t tokens_of(int rank) {
    return 5 + 2 * rank;
}  // odd, different on every rank

// The routing of world rank `rank`: K distinct experts per token, a pure function of (rank,
// token) so that every rank can work out every other rank's; weights encode (rank, token, k).
struct Tokens {
    RouterOutput routing;  // topk_index [T, K] i32, topk_weight [T, K] f32
    Tensor x;              // [T, 4] f32
};

Tokens make_tokens(int rank, std::int64_t k, std::int64_t e, Routing how) {
    const std::int64_t tokens = tokens_of(rank);
    Tokens tk;
    tk.routing.topk_index = Tensor::empty({tokens, k}, DType::kI32);
    tk.routing.topk_weight = Tensor::empty({tokens, k}, DType::kF32);
    tk.x = Tensor::empty({tokens, kWidth}, DType::kF32);
    for (std::int64_t t = 0; t < tokens; ++t) {
        const std::uint64_t bits = random_bits(rank * 1000 + 17, static_cast<std::uint64_t>(t));
        const std::int64_t first = how == Routing::kAllToExpertZero ? 0 : bits % e;
        for (std::int64_t q = 0; q < k; ++q) {
            tk.routing.topk_index.data<std::int32_t>()[t * k + q] =
                static_cast<std::int32_t>((first + q) % e);
            tk.routing.topk_weight.data<float>()[t * k + q] = weight_code(rank, t, q);
        }
        float* row = tk.x.data<float>() + t * kWidth;
        row[0] = static_cast<float>(rank);
        row[1] = static_cast<float>(t);
        row[2] = -1.0f;
        row[3] = 7.0f;
    }
    return tk;
}

MoeConfig dispatch_config(std::int64_t e, std::int64_t k) {
    MoeConfig c;
    c.hidden_size = kWidth;
    c.num_experts = e;
    c.topk = k;
    c.ffn_hidden_size = 4;
    c.precision = Precision::kFp32;
    return c;
}

// Checks that `rows` [Rp, 4] (with `probs` [Rp] when defined) holds, for each local expert, the
// rows of the EP group's ranks in rank order, each in token order (capacity: the kept ones).
void expect_expert_major(const MoeConfig& cfg, const AlltoallDispatch& d,
                         const std::vector<int>& members, Routing how, const Tensor& rows,
                         const Tensor& probs) {
    const std::int64_t k = cfg.topk, local = cfg.num_experts / d.ep_size;
    for (std::int64_t l = 0; l < local; ++l) {
        const std::int64_t expert = d.ep_rank * local + l;
        std::int64_t row = d.expert_segments.offsets[l];
        for (int src : members) {
            const Tokens theirs = make_tokens(src, k, cfg.num_experts, how);
            Arena scratch;
            const DispatchPlan plan = dispatch_preprocess(cfg, theirs.routing.topk_index,
                                                          theirs.routing.topk_weight, scratch);
            for (std::int64_t t = 0; t < tokens_of(src); ++t) {
                for (std::int64_t q = 0; q < k; ++q) {
                    if (theirs.routing.topk_index.data<std::int32_t>()[t * k + q] != expert) {
                        continue;
                    }
                    if (plan.slot_row.data<std::int32_t>()[t * k + q] < 0)
                        continue;  // dropped
                    const float* got = rows.data<float>() + row * kWidth;
                    ASSERT_EQ(got[0], src) << "expert " << expert << " row " << row;
                    ASSERT_EQ(got[1], t) << "expert " << expert << " row " << row;
                    if (probs.defined()) {
                        ASSERT_EQ(probs.data<float>()[row], weight_code(src, t, q));
                    }
                    ++row;
                }
            }
        }
        ASSERT_EQ(row, d.expert_segments.offsets[l] + d.expert_segments.counts[l]);
        for (; row < d.expert_segments.offsets[l + 1]; ++row) {  // alignment rows are zero
            ASSERT_EQ(rows.data<float>()[row * kWidth], 0.0f);
        }
    }
}

// (kept slots of token t) * x[t], what identity experts give back for token t.
void expect_kept_times(const AlltoallDispatch& d, const Tensor& x, const Tensor& got) {
    const std::int64_t k = d.plan.topk;
    for (std::int64_t t = 0; t < x.dim(0); ++t) {
        std::int64_t kept = 0;
        for (std::int64_t q = 0; q < k; ++q)
            kept += d.plan.slot_row.data<std::int32_t>()[t * k + q] >= 0;
        for (std::int64_t c = 0; c < kWidth; ++c) {
            ASSERT_EQ(got.data<float>()[t * kWidth + c], kept * x.data<float>()[t * kWidth + c])
                << "token " << t;
        }
    }
}

void check_round_trip(const MoeConfig& cfg, int ep_size, Routing how) {
    auto groups = make_groups(ep_size);
    comm::Communicator& ep = groups->ep;
    const int me = world_rank();
    const Tokens mine = make_tokens(me, cfg.topk, cfg.num_experts, how);
    Arena arena;
    AlltoallDispatch d;
    alltoall::dispatch_preprocess(cfg, ep.size(), ep.rank(), mine.routing, d, arena);
    alltoall::dispatch_permute(mine.routing, mine.x, d);
    alltoall::exchange_counts(cfg, ep, d, arena);
    alltoall::token_dispatch(ep, d);
    alltoall::dispatch_postprocess(d);
    expect_expert_major(cfg, d, ep.members().world_ranks, how, d.expert_rows, d.expert_probs);

    // Identity experts, then back to the tokens.
    d.expert_out.copy_from(d.expert_rows);
    alltoall::combine_preprocess(d);
    alltoall::token_combine(ep, d);
    Tensor y = arena.alloc({tokens_of(me), kWidth}, DType::kF32);
    alltoall::combine_postprocess(d, Tensor(), y);
    expect_kept_times(d, mine.x, y);

    // Backward: dy rows (the same payload) travel to the experts along the forward's path, and
    // the row gradients come back with the splits swapped.
    alltoall::combine_postprocess_backward(mine.x, d, arena);
    alltoall::token_combine_backward(ep, d);
    alltoall::combine_preprocess_backward(d);
    expect_expert_major(cfg, d, ep.members().world_ranks, how, d.d_expert_out, Tensor());
    d.d_expert_rows.copy_from(d.d_expert_out);
    d.d_expert_probs.fill_zero();
    alltoall::dispatch_postprocess_backward(d);
    alltoall::token_dispatch_backward(ep, d);
    Tensor dx = arena.alloc({tokens_of(me), kWidth}, DType::kF32);
    Tensor dweight = arena.alloc({tokens_of(me), cfg.topk}, DType::kF32);
    alltoall::dispatch_permute_backward(d, dx, dweight);
    expect_kept_times(d, mine.x, dx);
}

std::vector<int> ep_sizes() {
    std::vector<int> sizes;
    for (int ep = 1; ep <= world_size(); ++ep) {
        if (world_size() % ep == 0)
            sizes.push_back(ep);
    }
    return sizes;
}

TEST(TokenDispatcher, RankPayloadsArriveWhereThePlanSaysAndComeBack) {
    for (int ep : ep_sizes()) {
        for (std::int64_t k : {1, 2}) {
            SCOPED_TRACE(::testing::Message() << "ep " << ep << " k " << k);
            check_round_trip(dispatch_config(12, k), ep, Routing::kSpread);
        }
    }
}

TEST(TokenDispatcher, EveryTokenToOneExpert) {
    // Only expert 0's rank receives rows; every other rank and expert receives none.
    for (int ep : ep_sizes()) {
        SCOPED_TRACE(::testing::Message() << "ep " << ep);
        check_round_trip(dispatch_config(12, 1), ep, Routing::kAllToExpertZero);
    }
}

TEST(TokenDispatcher, CapacityDrops) {
    for (int ep : ep_sizes()) {
        for (DropPolicy policy : {DropPolicy::kProbs, DropPolicy::kPosition}) {
            MoeConfig cfg = dispatch_config(12, 2);
            cfg.capacity_factor = 0.5;
            cfg.drop_policy = policy;
            SCOPED_TRACE(::testing::Message() << "ep " << ep << " " << drop_policy_name(policy));
            check_round_trip(cfg, ep, Routing::kAllToExpertZero);
            check_round_trip(cfg, ep, Routing::kSpread);
        }
    }
}

TEST(TokenDispatcher, BackwardAllToAllsSwapTheSplits) {
    auto groups = make_groups(world_size());
    const MoeConfig cfg = dispatch_config(12, 2);
    const Tokens mine = make_tokens(world_rank(), 2, 12, Routing::kSpread);
    Arena arena;
    AlltoallDispatch d;
    alltoall::dispatch_preprocess(cfg, groups->ep.size(), groups->ep.rank(), mine.routing, d,
                                  arena);
    const int me = groups->ep.rank();
    alltoall::dispatch_permute(mine.routing, mine.x, d);
    alltoall::exchange_counts(cfg, groups->ep, d, arena);
    alltoall::token_dispatch(groups->ep, d);
    alltoall::dispatch_postprocess(d);
    alltoall::combine_postprocess_backward(mine.x, d, arena);
    alltoall::token_combine_backward(groups->ep, d);
    alltoall::combine_preprocess_backward(d);
    alltoall::dispatch_postprocess_backward(d);
    const comm::ByteCounts before = groups->ep.stats().bytes;
    alltoall::token_dispatch_backward(groups->ep, d);
    const comm::ByteCounts moved = groups->ep.stats().bytes - before;
    // The dispatch backward sends what the dispatch received and receives what it sent (rows of
    // 4 floats and one weight each), not counting this rank's own rows.
    const std::int64_t row = kWidth * 4 + 4;
    EXPECT_EQ(moved.sent(), (d.layout.recv_extent() - d.layout.recv_counts[me]) * row);
    EXPECT_EQ(moved.received(), (d.layout.send_extent() - d.layout.send_counts[me]) * row);
}

// Expert tensor parallelism: for every ETP size that divides the world (EP = world / ETP), the
// experts see the rows of their ETP group's ranks' EP groups, ETP-major (ETP rank q's EP sources,
// then q + 1's), each in rank and token order; with identity experts every ETP rank's output is the
// rows, so the reduce-scatter gives ETP x (kept k) x each token, and the backward ETP x that again
// (the gather of dy, then the reduce-scatter of the identity's row and weight gradients).
TEST(TokenDispatcher, ExpertTensorParallelGathersAndReduceScattersTheGroupsRows) {
    if (world_size() < 2)
        GTEST_SKIP() << "ETP needs 2 ranks";
    const int me = world_rank();
    for (int etp_size = 2; etp_size <= world_size(); ++etp_size) {
        if (world_size() % etp_size != 0)
            continue;
        const int ep_size = world_size() / etp_size;
        SCOPED_TRACE(::testing::Message() << "etp " << etp_size << " ep " << ep_size);
        comm::ParallelLayout layout{world_size(), ep_size, 8};
        layout.expert_tensor_parallel_size = etp_size;
        auto groups = comm::ProcessGroups::create(layout, comm::CommOptions{.timeout_s = 120},
                                                  "test", nullptr);
        comm::Communicator &ep = groups->ep, &etp = groups->etp;
        ASSERT_EQ(etp.size(), etp_size);
        const MoeConfig cfg = dispatch_config(12, 2);
        const Tokens mine = make_tokens(me, cfg.topk, cfg.num_experts, Routing::kSpread);
        Arena arena;
        AlltoallDispatch d;
        alltoall::dispatch_preprocess(cfg, ep.size(), ep.rank(), mine.routing, d, arena);
        alltoall::dispatch_permute(mine.routing, mine.x, d);
        alltoall::exchange_counts(cfg, ep, d, arena, 1, &etp);
        alltoall::token_dispatch(ep, d, {}, &etp);
        alltoall::dispatch_postprocess(d);
        // World rank of ETP rank q's EP rank p (etp-ep-edp order, ETP innermost).
        const int edp = me / (etp_size * ep_size);
        std::vector<int> sources;
        for (int q = 0; q < etp_size; ++q)
            for (int p = 0; p < ep_size; ++p)
                sources.push_back(q + etp_size * (p + ep_size * edp));
        expect_expert_major(cfg, d, sources, Routing::kSpread, d.expert_rows, d.expert_probs);

        d.expert_out.copy_from(d.expert_rows);
        alltoall::combine_preprocess(d);
        alltoall::token_combine(ep, d, {}, &etp);
        Tensor y = arena.alloc({tokens_of(me), kWidth}, DType::kF32);
        alltoall::combine_postprocess(d, Tensor(), y);
        Tensor etp_x = Tensor::empty(mine.x.shape(), DType::kF32);
        for (std::int64_t i = 0; i < mine.x.numel(); ++i)
            etp_x.data<float>()[i] = static_cast<float>(etp_size) * mine.x.data<float>()[i];
        expect_kept_times(d, etp_x, y);

        alltoall::combine_postprocess_backward(mine.x, d, arena);
        alltoall::token_combine_backward(ep, d, {}, &etp);
        alltoall::combine_preprocess_backward(d);
        expect_expert_major(cfg, d, sources, Routing::kSpread, d.d_expert_out, Tensor());
        d.d_expert_rows.copy_from(d.d_expert_out);
        d.d_expert_probs.copy_from(d.expert_probs);
        alltoall::dispatch_postprocess_backward(d);
        alltoall::token_dispatch_backward(ep, d, {}, &etp);
        Tensor dx = arena.alloc({tokens_of(me), kWidth}, DType::kF32);
        Tensor dweight = arena.alloc({tokens_of(me), cfg.topk}, DType::kF32);
        alltoall::dispatch_permute_backward(d, dx, dweight);
        expect_kept_times(d, etp_x, dx);
        for (std::int64_t t = 0; t < tokens_of(me); ++t)
            for (std::int64_t q = 0; q < cfg.topk; ++q)
                ASSERT_EQ(dweight.data<float>()[t * cfg.topk + q],
                          static_cast<float>(etp_size) * weight_code(me, t, q))
                    << "token " << t << " slot " << q;
    }
}

}  // namespace
}  // namespace epo::moe
