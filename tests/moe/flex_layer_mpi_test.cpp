// The MoE block (moe_block.h) with the flex dispatcher, both backends, on real MPI ranks grouped
// into nodes (2 ranks as 1 node and as 2 x 1, 4 as 2 x 2, 6 as 3 x 2, 8 as 2 x 4), against:
//   - a single-rank reference that holds every expert and sums in flex's order
//     (flex::reference_combine / reference_token_sum): y, dx and the expert weight gradients
//     bit-identical;
//   - the same block with the alltoall dispatcher: y and dx within a stated tolerance (the sums
//     over a token's experts are associated differently), the expert weight gradients bit-identical
//     (the experts see the same rows in the same order, and dy reaches them unsummed);
//   - itself on the compute and comm streams (the overlap schedule's placement of the nodes):
//     bit-identical to the nodes in order on one thread.
#include <gtest/gtest.h>

#include "epo/comm/mpi_runtime.h"
#include "epo/comm/process_groups.h"
#include "epo/kernels/rows.h"
#include "epo/moe/flex_dispatcher.h"
#include "epo/moe/moe_block.h"
#include "epo/moe/moe_layer.h"
#include "epo/runtime/rank_streams.h"
#include "moe/moe_test_util.h"

namespace epo::moe {
namespace {

using testing::random_tensor;
using testing::relative_error;
using testing::same_bits;

int world_rank() {
    return comm::current_world_rank();
}
int world_size() {
    return comm::current_world_size();
}

// Flex against alltoall: the relative L2 error of y and dx (docs/flex.md "Numerics").
constexpr double kFp32Tolerance = 1e-6;
constexpr double kBf16Tolerance = 1e-2;

struct Case {
    const char* name;
    MoeConfig cfg;
    bool skew = false;
    bool equal_tokens = false;
    bool empty_rank = false;
};

MoeConfig base_config() {
    MoeConfig c;
    c.hidden_size = 16;
    c.num_experts = 24;  // divisible by EP = 1, 2, 3, 4, 6, 8
    c.topk = 4;
    c.ffn_hidden_size = 8;
    c.precision = Precision::kFp32;
    c.load_balancing_type = LoadBalancing::kAuxLoss;
    c.aux_loss_coeff = 0.1;
    return c;
}

std::vector<Case> cases() {
    std::vector<Case> out;
    {
        Case c{"fp32 dropless + shared expert", base_config()};
        c.cfg.shared_expert_size = 8;
        out.push_back(c);
    }
    {
        Case c{"bf16 dropless sigmoid", base_config()};
        c.cfg.precision = Precision::kBf16;
        c.cfg.score_function = ScoreFunction::kSigmoid;
        out.push_back(c);
    }
    {
        Case c{"capacity 0.75, drop by probs", base_config()};
        c.cfg.capacity_factor = 0.75;
        out.push_back(c);
    }
    {
        Case c{"bf16 capacity 1.5 padded to capacity", base_config()};
        c.cfg.precision = Precision::kBf16;
        c.cfg.capacity_factor = 1.5;
        c.cfg.drop_policy = DropPolicy::kPosition;
        c.cfg.pad_to_capacity = true;
        c.equal_tokens = true;
        out.push_back(c);
    }
    {
        Case c{"skew: every token to experts 0-3", base_config()};
        c.cfg.score_function = ScoreFunction::kSigmoid;
        c.cfg.enable_expert_bias = true;
        c.skew = true;
        out.push_back(c);
    }
    {
        Case c{"a rank without tokens", base_config()};
        c.empty_rank = true;
        out.push_back(c);
    }
    return out;
}

std::int64_t tokens_of(const Case& c, int rank) {
    if (c.empty_rank && rank == world_size() - 1)
        return 0;
    return c.equal_tokens ? 9 : 7 + 2 * rank;
}

struct RankData {
    Tensor x, dy;
};
RankData rank_data(const Case& c, int rank) {
    const DType dt = compute_dtype(c.cfg);
    const std::int64_t t = tokens_of(c, rank);
    return {random_tensor({t, c.cfg.hidden_size}, dt, 1000 + rank),
            random_tensor({t, c.cfg.hidden_size}, dt, 2000 + rank)};
}

constexpr std::uint64_t kSeed = 7;
constexpr float kLossGradScale = 0.5f;

// ---- the block, node by node -----------------------------------------------------------------

struct EpState {
    Arena arena{"flex test"};
    Arena scratch{"flex test scratch"};
    MoeBlockState block;
};

struct Result {
    Tensor y, dx;  // (T, H) compute dtype
};

void forward(const MoeBlock& b, const Tensor& x, EpState& st, const DispatchComms& comms,
             const Tensor& y) {
    st.arena.reset();
    st.scratch.reset();
    block_pre_dispatch_forward(b, x, 1, st.block, st.arena);
    block_dispatch_forward(b, comms, st.block, st.arena);
    block_mlp_forward(b, st.block, st.arena);
    Tensor y32 = st.arena.alloc({x.dim(0), b.cfg.hidden_size}, DType::kF32);
    block_combine_forward(b, comms, st.block, y32);
    kernels::store_row(y32.data<float>(), y.raw(), y.dtype(), y.numel());
}

void backward(const MoeBlock& b, const Tensor& dy, EpState& st, const DispatchComms& comms,
              const Tensor& dx) {
    block_combine_backward(b, comms, dy, st.block, st.arena);
    block_mlp_backward(b, st.block, st.arena);
    block_mlp_backward_dw(b, st.block, st.scratch);
    block_dispatch_backward(b, comms, st.block);
    Tensor acc = st.arena.alloc({dx.dim(0), b.cfg.hidden_size}, DType::kF32);
    block_pre_dispatch_backward(b, kLossGradScale, st.block, acc, st.arena, st.scratch);
    kernels::store_row(acc.data<float>(), dx.raw(), dx.dtype(), dx.numel());
    block_pre_dispatch_backward_dw(b, st.block, st.scratch);
}

MoeLayerParams local_params(const MoeConfig& cfg, const MoeLayerParams& full, std::int64_t first,
                            std::int64_t local) {
    MoeLayerParams p;
    p.router = make_router_params(cfg);
    p.experts =
        make_expert_weights(local, cfg.hidden_size, cfg.ffn_hidden_size, compute_dtype(cfg));
    if (cfg.shared_expert_size > 0) {
        p.shared =
            make_shared_expert_weights(cfg.hidden_size, cfg.shared_expert_size, compute_dtype(cfg));
    }
    std::vector<Param*> to = moe_layer_param_list(p);
    std::vector<Param*> from = moe_layer_param_list(const_cast<MoeLayerParams&>(full));
    for (std::size_t i = 0; i < to.size(); ++i) {
        const bool expert = to[i] == &p.experts.fc1 || to[i] == &p.experts.fc2;
        to[i]->master.copy_from(expert ? from[i]->master.rows(first, first + local)
                                       : from[i]->master);
        refresh_compute(*to[i]);
    }
    if (p.router.expert_bias.defined())
        p.router.expert_bias.copy_from(full.router.expert_bias);
    return p;
}

MoeLayerParams full_params(const Case& c) {
    MoeLayerParams full = make_moe_layer_params(c.cfg);
    init_moe_layer_params(full, kSeed, 0.4f);
    if (c.skew) {
        for (int e = 0; e < 4; ++e)
            full.router.expert_bias.data<float>()[e] = 100.0f - e;
    }
    return full;
}

// ---- the single-rank reference in flex's order -------------------------------------------------

// Every rank of the EP group `members` through one holder of all experts, each expert's rows in
// source-rank order then token order (the distributed order), combined and unpermuted in flex's
// order for EP ranks of `ranks_per_node` per node. Returns member `want`'s y and dx; the expert
// weight gradients go into `full`.
Result reference(const Case& c, MoeLayerParams& full, const std::vector<int>& members,
                 int ranks_per_node, int want) {
    const MoeConfig& cfg = c.cfg;
    const DType dt = compute_dtype(cfg);
    const std::int64_t h = cfg.hidden_size, E = cfg.num_experts;
    const flex::Geometry g =
        flex::make_geometry(cfg, static_cast<int>(members.size()), ranks_per_node);
    Arena arena;
    struct Ref {
        RankData data;
        RouterOutput router;
        ExpertsContext shared;
        Tensor shared_out;
        DispatchPlan plan;
        ExpertSegments seg;
        ChunkMoves to_global;
        Tensor x_perm, probs_perm;
    };
    std::vector<Ref> ranks(members.size());
    std::vector<std::int64_t> global_counts(static_cast<std::size_t>(E), 0);
    for (std::size_t i = 0; i < members.size(); ++i) {
        Ref& r = ranks[i];
        r.data = rank_data(c, members[i]);
        const std::int64_t t = r.data.x.dim(0);
        if (cfg.shared_expert_size > 0) {
            r.shared_out = arena.alloc({t, h}, DType::kF32);
            shared_expert_forward(full.shared, r.data.x, r.shared_out, r.shared, arena);
        }
        r.router = router_forward(cfg, full.router, r.data.x, 1, arena);
        r.plan = dispatch_preprocess(cfg, r.router.topk_index, r.router.topk_weight, arena);
        r.seg = make_expert_segments(r.plan.tokens_per_expert, 1);
        r.x_perm = arena.alloc({r.seg.total_rows(), h}, dt);
        r.probs_perm = arena.alloc({r.seg.total_rows()}, DType::kF32);
        permute_forward(r.plan, r.seg, r.data.x, r.router.topk_weight, r.x_perm, r.probs_perm);
        for (std::int64_t e = 0; e < E; ++e)
            global_counts[e] += r.plan.tokens_per_expert[e];
    }
    const ExpertSegments global = make_expert_segments(global_counts, kExpertRowAlign);
    std::vector<std::int64_t> at(global.offsets.begin(), global.offsets.end() - 1);
    for (Ref& r : ranks) {
        for (std::int64_t e = 0; e < E; ++e) {
            r.to_global.src_offsets.push_back(r.seg.offsets[e]);
            r.to_global.dst_offsets.push_back(at[e]);
            r.to_global.sizes.push_back(r.seg.counts[e]);
            at[e] += r.seg.counts[e];
        }
    }
    const std::int64_t rp = global.total_rows();
    Tensor gx = arena.alloc({rp, h}, dt), gp = arena.alloc({rp}, DType::kF32);
    Tensor gy = arena.alloc({rp, h}, dt);
    for (Ref& r : ranks) {
        move_chunks(r.x_perm, r.to_global, gx);
        move_chunks(r.probs_perm, r.to_global, gp);
    }
    zero_segment_padding(global, gx);
    zero_segment_padding(global, gp);
    ExpertsContext ectx;
    experts_forward(full.experts, global, gx, gp, gy, ectx, arena);
    Result out;
    Tensor gdy = arena.alloc({rp, h}, dt), gdx = arena.alloc({rp, h}, dt);
    Tensor gdp = arena.alloc({rp}, DType::kF32);
    for (std::size_t i = 0; i < ranks.size(); ++i) {
        Ref& r = ranks[i];
        Tensor y_perm = arena.alloc({r.seg.total_rows(), h}, dt);
        move_chunks(gy, invert(r.to_global), y_perm);
        Tensor y = Tensor::empty({r.plan.num_tokens, h}, dt);
        flex::reference_combine(g, r.plan, r.seg, y_perm, r.shared_out, y);
        if (static_cast<int>(i) == want)
            out.y = y;
        Tensor dy_perm = arena.alloc({r.seg.total_rows(), h}, dt);
        combine_backward(r.plan, r.seg, r.data.dy, dy_perm);
        move_chunks(dy_perm, r.to_global, gdy);
    }
    zero_segment_padding(global, gdy);
    experts_backward_dgrad(full.experts, gdy, gdx, gdp, ectx, arena);
    for (std::size_t i = 0; i < ranks.size(); ++i) {
        Ref& r = ranks[i];
        const std::int64_t t = r.plan.num_tokens;
        Tensor dx_perm = arena.alloc({r.seg.total_rows(), h}, dt);
        Tensor dprobs = arena.alloc({r.seg.total_rows()}, DType::kF32);
        move_chunks(gdx, invert(r.to_global), dx_perm);
        move_chunks(gdp, invert(r.to_global), dprobs);
        Tensor dweight = arena.alloc({t, cfg.topk}, DType::kF32);
        Tensor dx_acc = arena.alloc({t, h}, DType::kF32);
        gather_dweight(r.plan, r.seg, dprobs, dweight);
        for (std::int64_t q = 0; q < t; ++q)
            flex::reference_token_sum(g, r.plan, r.seg, dx_perm, q, dx_acc.data<float>() + q * h);
        router_backward_dgrad(cfg, full.router, dweight, kLossGradScale, r.router, dx_acc, arena);
        if (cfg.shared_expert_size > 0)
            shared_expert_backward_dgrad(full.shared, r.data.dy, dx_acc, r.shared, arena);
        if (static_cast<int>(i) == want) {
            out.dx = Tensor::empty({t, h}, dt);
            kernels::store_row(dx_acc.data<float>(), out.dx.raw(), dt, out.dx.numel());
        }
    }
    experts_backward_wgrad(full.experts, cfg.gradient_accumulation_fusion, ectx, arena);
    return out;
}

// ---- the comparisons -------------------------------------------------------------------------

void run_case(const Case& c, DispatcherKind flex_kind, int ep, int gpn, comm::ProcessGroups& g) {
    SCOPED_TRACE(::testing::Message()
                 << c.name << ", kind " << static_cast<int>(flex_kind) << ", EP " << ep << " of "
                 << world_size() << ", gpus_per_node " << gpn);
    const int me = world_rank(), ep_rank = g.ep.rank();
    const int P = flex::flex_ranks_per_node(ep, gpn);
    const std::int64_t local = c.cfg.num_experts / ep, first = ep_rank * local;
    const DType dt = compute_dtype(c.cfg);
    const RankData mine = rank_data(c, me);

    MoeConfig flex_cfg = c.cfg;
    flex_cfg.dispatcher = flex_kind;
    MoeLayerParams full = full_params(c);
    MoeLayerParams flex_params = local_params(c.cfg, full, first, local);
    MoeLayerParams a2a_params = local_params(c.cfg, full, first, local);
    const auto flex_dispatcher = make_token_dispatcher(flex_cfg, ep, ep_rank, P);
    const auto a2a_dispatcher = make_token_dispatcher(c.cfg, ep, ep_rank);

    Result fx{Tensor::empty(mine.x.shape(), dt), Tensor::empty(mine.x.shape(), dt)};
    Result ax{Tensor::empty(mine.x.shape(), dt), Tensor::empty(mine.x.shape(), dt)};
    {
        EpState st;
        const MoeBlock b{flex_cfg, flex_params, *flex_dispatcher};
        forward(b, mine.x, st, g, fx.y);
        backward(b, mine.dy, st, g, fx.dx);
    }
    {
        EpState st;
        const MoeBlock b{c.cfg, a2a_params, *a2a_dispatcher};
        forward(b, mine.x, st, g.ep, ax.y);
        backward(b, mine.dy, st, g.ep, ax.dx);
    }
    const Result ref = reference(c, full, g.ep.members().world_ranks, P, ep_rank);
    EXPECT_TRUE(same_bits(fx.y, ref.y)) << "y, relative error " << relative_error(fx.y, ref.y);
    EXPECT_TRUE(same_bits(fx.dx, ref.dx)) << "dx, relative error " << relative_error(fx.dx, ref.dx);
    for (auto [got, want] : {std::pair{&flex_params.experts.fc1, &full.experts.fc1},
                             std::pair{&flex_params.experts.fc2, &full.experts.fc2}}) {
        EXPECT_TRUE(same_bits(got->main_grad, want->main_grad.rows(first, first + local)))
            << got->name;
    }
    const double tol = dt == DType::kF32 ? kFp32Tolerance : kBf16Tolerance;
    EXPECT_LE(relative_error(fx.y, ax.y), tol) << "y against alltoall";
    EXPECT_LE(relative_error(fx.dx, ax.dx), tol) << "dx against alltoall";
    EXPECT_TRUE(same_bits(flex_params.experts.fc1.main_grad, a2a_params.experts.fc1.main_grad));
    EXPECT_TRUE(same_bits(flex_params.experts.fc2.main_grad, a2a_params.experts.fc2.main_grad));
    if (me == 0 && mine.x.dim(0) > 0) {
        std::printf(
            "[ flex ] %-38s %-8s EP %d, %d per node: |y - y_a2a| %.2e, |dx - dx_a2a| %.2e\n",
            c.name, flex_kind == DispatcherKind::kFlexDeepep ? "deepep" : "hybridep", ep, P,
            relative_error(fx.y, ax.y), relative_error(fx.dx, ax.dx));
    }
}

std::vector<std::pair<int, int>> groupings() {
    const int n = world_size();
    std::vector<std::pair<int, int>> out{{n, n <= 2 ? n : 2}};  // 2 x 1 node, n/2 nodes x 2
    if (n == 2)
        out.emplace_back(2, 1);  // 2 nodes x 1
    if (n == 8)
        out.emplace_back(8, 4);  // 2 nodes x 4
    if (n == 4)
        out.emplace_back(2, 1);  // EP 2 of 4, 2 nodes x 1 per EP group
    if (n % 2 == 1 && n > 1)
        out.clear();  // odd worlds: nodes of 2 do not divide EP
    if (n == 1)
        out = {{1, 1}};
    return out;
}

TEST(FlexLayer, MatchesTheFlexOrderReferenceAndAlltoallWithinTolerance) {
    static auto watchdog = std::make_shared<comm::Watchdog>();
    comm::CommOptions options;
    options.timeout_s = 120;
    for (const auto& [ep, gpn] : groupings()) {
        auto groups =
            comm::ProcessGroups::create({world_size(), ep, gpn}, options, "test", watchdog);
        for (const Case& c : cases()) {
            for (DispatcherKind k : {DispatcherKind::kFlexDeepep, DispatcherKind::kFlexHybridep})
                run_case(c, k, ep, gpn, *groups);
        }
    }
}

TEST(FlexLayer, NodesOnTwoStreamsMatchTheInOrderLayer) {
    // Two micro-batches through the block's nodes on the compute and comm streams (the overlap
    // schedule's placement) against the same micro-batches in order on one thread: same bits.
    const int n = world_size(), me = world_rank();
    if (n % 2 == 1 && n > 1)
        GTEST_SKIP() << "nodes of 2 do not divide " << n << " ranks";
    Case c{"two streams", base_config()};
    c.cfg.shared_expert_size = 8;
    c.cfg.dispatcher = DispatcherKind::kFlexDeepep;
    const int gpn = n <= 2 ? 1 : 2;
    const comm::ParallelLayout layout{n, n, gpn};
    comm::CommOptions options;
    options.timeout_s = 120;
    const int P = flex::flex_ranks_per_node(n, gpn);
    const DType dt = compute_dtype(c.cfg);
    constexpr int kMicroBatches = 2;
    std::vector<Tensor> x, dy;
    for (int m = 0; m < kMicroBatches; ++m) {
        x.push_back(random_tensor({7 + 2 * me, c.cfg.hidden_size}, dt, 3000 + 10 * me + m));
        dy.push_back(random_tensor({7 + 2 * me, c.cfg.hidden_size}, dt, 4000 + 10 * me + m));
    }
    const MoeLayerParams full = full_params(c);
    const std::int64_t local = c.cfg.num_experts / n;
    const auto dispatcher = make_token_dispatcher(c.cfg, n, me, P);
    auto new_tensor = [&](int m) { return Tensor::empty(x[m].shape(), dt); };

    MoeLayerParams in_order = local_params(c.cfg, full, me * local, local);
    std::vector<Tensor> y_ref, dx_ref;
    {
        auto groups = comm::ProcessGroups::create(layout, options, "in order", nullptr);
        const MoeBlock b{c.cfg, in_order, *dispatcher};
        std::vector<EpState> st(kMicroBatches);
        for (int m = 0; m < kMicroBatches; ++m) {
            y_ref.push_back(new_tensor(m));
            forward(b, x[m], st[m], *groups, y_ref[m]);
        }
        for (int m = 0; m < kMicroBatches; ++m) {
            dx_ref.push_back(new_tensor(m));
            backward(b, dy[m], st[m], *groups, dx_ref[m]);
        }
    }

    MoeLayerParams streamed = local_params(c.cfg, full, me * local, local);
    std::vector<Tensor> y, dx;
    for (int m = 0; m < kMicroBatches; ++m) {
        y.push_back(new_tensor(m));
        dx.push_back(new_tensor(m));
    }
    {
        const MoeBlock b{c.cfg, streamed, *dispatcher};
        auto streams = runtime::make_rank_streams(layout, options);
        std::vector<EpState> st(kMicroBatches);
        std::vector<Tensor> y32(kMicroBatches), acc(kMicroBatches);
        std::vector<runtime::Event> ev;
        for (int m = 0; m < kMicroBatches; ++m)
            ev.emplace_back("mb" + std::to_string(m));
        auto node = [&](runtime::Stream& s, int m, const char* name, runtime::Task fn) {
            s.wait(ev[m]);
            s.enqueue(name, std::move(fn));
            s.record(ev[m]);
        };
        runtime::Stream& compute = *streams.compute;
        runtime::Stream& comm = *streams.comm;
        for (int m = 0; m < kMicroBatches; ++m) {
            node(compute, m, "pre_dispatch", [&, m](runtime::StreamContext&) {
                block_pre_dispatch_forward(b, x[m], 1, st[m].block, st[m].arena);
                y32[m] = st[m].arena.alloc({x[m].dim(0), c.cfg.hidden_size}, DType::kF32);
            });
        }
        for (int m = 0; m < kMicroBatches; ++m) {
            node(comm, m, "dispatch", [&, m](runtime::StreamContext& sc) {
                block_dispatch_forward(b, sc.comm(), st[m].block, st[m].arena);
            });
            node(compute, m, "mlp", [&, m](runtime::StreamContext&) {
                block_mlp_forward(b, st[m].block, st[m].arena);
            });
            node(comm, m, "combine", [&, m](runtime::StreamContext& sc) {
                block_combine_forward(b, sc.comm(), st[m].block, y32[m]);
                kernels::store_row(y32[m].data<float>(), y[m].raw(), dt, y[m].numel());
            });
        }
        for (int m = 0; m < kMicroBatches; ++m) {
            node(comm, m, "combine backward", [&, m](runtime::StreamContext& sc) {
                block_combine_backward(b, sc.comm(), dy[m], st[m].block, st[m].arena);
            });
            node(compute, m, "mlp backward", [&, m](runtime::StreamContext&) {
                block_mlp_backward(b, st[m].block, st[m].arena);
                block_mlp_backward_dw(b, st[m].block, st[m].scratch);
            });
            node(comm, m, "dispatch backward", [&, m](runtime::StreamContext& sc) {
                block_dispatch_backward(b, sc.comm(), st[m].block);
            });
            node(compute, m, "pre_dispatch backward", [&, m](runtime::StreamContext&) {
                acc[m] = st[m].arena.alloc({x[m].dim(0), c.cfg.hidden_size}, DType::kF32);
                block_pre_dispatch_backward(b, kLossGradScale, st[m].block, acc[m], st[m].arena,
                                            st[m].scratch);
                kernels::store_row(acc[m].data<float>(), dx[m].raw(), dt, dx[m].numel());
                block_pre_dispatch_backward_dw(b, st[m].block, st[m].scratch);
            });
        }
        streams.synchronize();
        // Every flex collective ran on the comm stream's node and peer communicators.
        EXPECT_GT(streams.comm->groups()->ep_peer.stats().num_ops, 0);
        EXPECT_EQ(streams.compute->groups()->ep_peer.stats().num_ops, 0);
        EXPECT_EQ(streams.compute->groups()->ep_node.stats().num_ops, 0);
    }
    for (int m = 0; m < kMicroBatches; ++m) {
        EXPECT_TRUE(same_bits(y[m], y_ref[m])) << "micro-batch " << m;
        EXPECT_TRUE(same_bits(dx[m], dx_ref[m])) << "micro-batch " << m;
    }
    std::vector<Param*> a = moe_layer_param_list(streamed), r = moe_layer_param_list(in_order);
    for (std::size_t i = 0; i < a.size(); ++i)
        EXPECT_TRUE(same_bits(a[i]->main_grad, r[i]->main_grad)) << a[i]->name;
}

}  // namespace
}  // namespace epo::moe
