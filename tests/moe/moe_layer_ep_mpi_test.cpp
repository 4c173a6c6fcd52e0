// The MoE layer with expert parallelism (the production MoE block of moe_block.h: router, shared
// expert, the configured token dispatcher, this rank's experts, node by node as the model runs
// it) against a single-rank reference, on real MPI ranks (1-4 ranks, every EP size that
// divides the world). The reference holds every expert and processes the EP group's tokens with
// the same per-rank routing (router, capacity and aux losses per rank), in rank order, through
// the single-rank layer's own phases: each expert sees the same rows in the same order as on its
// owner rank. Required: y, dx and expert weight gradients bit-identical; the router and
// shared-expert gradients (summed over ranks) and the aux losses within 1e-6 relative (the test
// prints a note when they are not also exact).
#include <gtest/gtest.h>

#include "epo/comm/mpi_runtime.h"
#include "epo/comm/process_groups.h"
#include "epo/kernels/rows.h"
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

struct Case {
    const char* name;
    MoeConfig cfg;
    bool skew = false;          // expert bias sends every token to experts 0 and 1
    bool equal_tokens = false;  // pad_to_capacity needs the same T on every rank
    bool empty_rank = false;    // the last rank has no tokens
};

MoeConfig base_config() {
    MoeConfig c;
    c.hidden_size = 16;
    c.num_experts = 12;  // divisible by EP = 1, 2, 3, 4
    c.topk = 2;
    c.ffn_hidden_size = 8;
    c.precision = Precision::kFp32;
    c.load_balancing_type = LoadBalancing::kAuxLoss;
    c.aux_loss_coeff = 0.1;
    c.z_loss_coeff = 0.01;
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
        Case c{"bf16 dropless sigmoid top-3 seq aux loss", base_config()};
        c.cfg.precision = Precision::kBf16;
        c.cfg.score_function = ScoreFunction::kSigmoid;
        c.cfg.topk = 3;
        c.cfg.load_balancing_type = LoadBalancing::kSeqAuxLoss;
        out.push_back(c);
    }
    {
        Case c{"capacity 0.75, drop by probs", base_config()};
        c.cfg.capacity_factor = 0.75;
        out.push_back(c);
    }
    {
        Case c{"capacity 1.5, position, padded to capacity, bf16", base_config()};
        c.cfg.precision = Precision::kBf16;
        c.cfg.capacity_factor = 1.5;
        c.cfg.drop_policy = DropPolicy::kPosition;
        c.cfg.pad_to_capacity = true;
        c.equal_tokens = true;
        out.push_back(c);
    }
    {
        Case c{"skew: every token to experts 0 and 1, grad accumulation fusion", base_config()};
        c.cfg.score_function = ScoreFunction::kSigmoid;
        c.cfg.enable_expert_bias = true;
        c.cfg.gradient_accumulation_fusion = true;
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
    return c.equal_tokens ? 9 : 7 + 2 * rank;  // odd counts
}

// ---- the layer with expert parallelism: the production MoE block (moe_block.h), node by node

struct EpState {  // one micro-batch
    Arena arena{"ep test"};
    Arena scratch{"ep test scratch"};
    MoeBlockState block;
    Tensor dx_acc;  // [T, H] f32
};

bool has_shared(const MoeConfig& cfg) {
    return cfg.shared_expert_size > 0;
}

// The block of this rank's EP group: its weights and the configured dispatcher.
struct EpBlock {
    const MoeConfig& cfg;
    MoeLayerParams& params;
    std::unique_ptr<TokenDispatcher> dispatcher;
    EpBlock(const MoeConfig& c, MoeLayerParams& p, int ep_size, int ep_rank)
        : cfg(c), params(p), dispatcher(make_token_dispatcher(c, ep_size, ep_rank)) {}
    MoeBlock block() const { return MoeBlock{cfg, params, *dispatcher}; }
};

MoeLosses pre_dispatch(const EpBlock& b, const Tensor& x, EpState& st) {
    st.arena.reset();
    st.scratch.reset();
    block_pre_dispatch_forward(b.block(), x, 1, st.block, st.arena);
    return {st.block.router.aux_loss, st.block.router.z_loss};
}
void dispatch_node(const EpBlock& b, EpState& st, comm::Communicator& ep) {
    block_dispatch_forward(b.block(), ep, st.block, st.arena);
}
void mlp(const EpBlock& b, EpState& st) {
    block_mlp_forward(b.block(), st.block, st.arena);
}
// y [T, H] compute dtype, as the single-rank layer gives it.
void combine(const EpBlock& b, EpState& st, const Tensor& y, comm::Communicator& ep) {
    Tensor y32 = st.arena.alloc({y.dim(0), b.cfg.hidden_size}, DType::kF32);
    block_combine_forward(b.block(), ep, st.block, y32);
    kernels::store_row(y32.data<float>(), y.raw(), y.dtype(), y.numel());
}
void combine_backward_node(const EpBlock& b, const Tensor& dy, EpState& st,
                           comm::Communicator& ep) {
    block_combine_backward(b.block(), ep, dy, st.block, st.arena);
}
void mlp_backward(const EpBlock& b, EpState& st) {
    block_mlp_backward(b.block(), st.block, st.arena);
    block_mlp_backward_dw(b.block(), st.block, st.scratch);
}
void dispatch_backward(const EpBlock& b, EpState& st, comm::Communicator& ep) {
    block_dispatch_backward(b.block(), ep, st.block);
}
void pre_dispatch_backward(const EpBlock& b, float loss_grad_scale, EpState& st, const Tensor& dx) {
    st.dx_acc = st.arena.alloc({dx.dim(0), b.cfg.hidden_size}, DType::kF32);
    block_pre_dispatch_backward(b.block(), loss_grad_scale, st.block, st.dx_acc, st.arena,
                                st.scratch);
    kernels::store_row(st.dx_acc.data<float>(), dx.raw(), dx.dtype(), dx.numel());
    block_pre_dispatch_backward_dw(b.block(), st.block, st.scratch);
}

MoeLosses forward_ep(const EpBlock& b, const Tensor& x, EpState& st, const Tensor& y,
                     comm::Communicator& ep) {
    const MoeLosses losses = pre_dispatch(b, x, st);
    dispatch_node(b, st, ep);
    mlp(b, st);
    combine(b, st, y, ep);
    return losses;
}
void backward_ep(const EpBlock& b, const Tensor& dy, float scale, EpState& st, const Tensor& dx,
                 comm::Communicator& ep) {
    combine_backward_node(b, dy, st, ep);
    mlp_backward(b, st);
    dispatch_backward(b, st, ep);
    pre_dispatch_backward(b, scale, st, dx);
}

// This rank's parameters: the full layer's router and shared expert, and experts
// [first, first + local) of it.
MoeLayerParams local_params(const MoeConfig& cfg, const MoeLayerParams& full, std::int64_t first,
                            std::int64_t local) {
    MoeLayerParams p;
    p.router = make_router_params(cfg);
    p.experts =
        make_expert_weights(local, cfg.hidden_size, cfg.ffn_hidden_size, compute_dtype(cfg));
    if (has_shared(cfg)) {
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

// Sums the gradients as the trainer does at the end of a step: experts over the
// expert-data-parallel group, everything else over the data-parallel group.
void reduce_grads(MoeLayerParams& p, comm::ProcessGroups& groups) {
    for (Param* param : moe_layer_param_list(p)) {
        const bool expert = param == &p.experts.fc1 || param == &p.experts.fc2;
        (expert ? groups.edp : groups.dp)
            .all_reduce_sum(std::span<float>(param->main_grad.data<float>(),
                                             static_cast<std::size_t>(param->main_grad.numel())));
    }
}

constexpr std::uint64_t kSeed = 42;
constexpr float kLossGradScale = 0.5f;

void init_params(const Case& c, MoeLayerParams& p) {
    if (c.skew)
        p.router.expert_bias.data<float>()[0] = 100.0f;
    if (c.skew)
        p.router.expert_bias.data<float>()[1] = 50.0f;
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

// One reference rank's state.
struct RefRank {
    RouterOutput router;
    ExpertsContext shared;
    Tensor shared_out;
    DispatchPlan plan;
    ExpertSegments seg;  // packed
    ChunkMoves to_global;
    Tensor y, dx;
};

// The single-rank reference for the EP group with world ranks `members`: accumulates weight
// gradients into `full`'s main_grad and returns each member's y and dx.
std::vector<RefRank> reference(const Case& c, MoeLayerParams& full,
                               const std::vector<int>& members) {
    const MoeConfig& cfg = c.cfg;
    const DType dt = compute_dtype(cfg);
    const std::int64_t h = cfg.hidden_size, e_count = cfg.num_experts;
    static Arena arena;  // outlives the expert contexts' views within one call
    arena.reset();
    std::vector<RefRank> ranks(members.size());
    std::vector<RankData> data;
    std::vector<Tensor> x_perm, probs_perm;
    std::vector<std::int64_t> global_counts(e_count, 0);
    for (std::size_t i = 0; i < members.size(); ++i) {
        RefRank& r = ranks[i];
        data.push_back(rank_data(c, members[i]));
        const std::int64_t t = data[i].x.dim(0);
        if (cfg.shared_expert_size > 0) {
            r.shared_out = arena.alloc({t, h}, DType::kF32);
            shared_expert_forward(full.shared, data[i].x, r.shared_out, r.shared, arena);
        }
        r.router = router_forward(cfg, full.router, data[i].x, 1, arena);
        r.plan = dispatch_preprocess(cfg, r.router.topk_index, r.router.topk_weight, arena);
        r.seg = make_expert_segments(r.plan.tokens_per_expert, 1);
        x_perm.push_back(arena.alloc({r.seg.total_rows(), h}, dt));
        probs_perm.push_back(arena.alloc({r.seg.total_rows()}, DType::kF32));
        permute_forward(r.plan, r.seg, data[i].x, r.router.topk_weight, x_perm[i], probs_perm[i]);
        for (std::int64_t e = 0; e < e_count; ++e)
            global_counts[e] += r.plan.tokens_per_expert[e];
    }
    // Expert-major rows of the whole group: for each expert, the ranks in order.
    const ExpertSegments global = make_expert_segments(global_counts, kExpertRowAlign);
    std::vector<std::int64_t> at(global.offsets.begin(), global.offsets.end() - 1);
    for (RefRank& r : ranks) {
        for (std::int64_t e = 0; e < e_count; ++e) {
            r.to_global.src_offsets.push_back(r.seg.offsets[e]);
            r.to_global.dst_offsets.push_back(at[e]);
            r.to_global.sizes.push_back(r.seg.counts[e]);
            at[e] += r.seg.counts[e];
        }
    }
    const std::int64_t rp = global.total_rows();
    Tensor gx = arena.alloc({rp, h}, dt), gp = arena.alloc({rp}, DType::kF32);
    Tensor gy = arena.alloc({rp, h}, dt);
    for (std::size_t i = 0; i < ranks.size(); ++i) {
        move_chunks(x_perm[i], ranks[i].to_global, gx);
        move_chunks(probs_perm[i], ranks[i].to_global, gp);
    }
    zero_segment_padding(global, gx);
    zero_segment_padding(global, gp);
    ExpertsContext ectx;
    experts_forward(full.experts, global, gx, gp, gy, ectx, arena);
    for (RefRank& r : ranks) {
        Tensor y_perm = arena.alloc({r.seg.total_rows(), h}, dt);
        move_chunks(gy, invert(r.to_global), y_perm);
        r.y = Tensor::empty({r.plan.num_tokens, h}, dt);
        combine_forward(r.plan, r.seg, y_perm, r.shared_out, r.y);
    }
    // Backward.
    Tensor gdy = arena.alloc({rp, h}, dt), gdx = arena.alloc({rp, h}, dt);
    Tensor gdp = arena.alloc({rp}, DType::kF32);
    for (std::size_t i = 0; i < ranks.size(); ++i) {
        RefRank& r = ranks[i];
        Tensor dy_perm = arena.alloc({r.seg.total_rows(), h}, dt);
        combine_backward(r.plan, r.seg, data[i].dy, dy_perm);
        move_chunks(dy_perm, r.to_global, gdy);
    }
    zero_segment_padding(global, gdy);
    experts_backward_dgrad(full.experts, gdy, gdx, gdp, ectx, arena);
    for (std::size_t i = 0; i < ranks.size(); ++i) {
        RefRank& r = ranks[i];
        const std::int64_t t = r.plan.num_tokens;
        Tensor dx_perm = arena.alloc({r.seg.total_rows(), h}, dt);
        Tensor dprobs = arena.alloc({r.seg.total_rows()}, DType::kF32);
        move_chunks(gdx, invert(r.to_global), dx_perm);
        move_chunks(gdp, invert(r.to_global), dprobs);
        Tensor dweight = arena.alloc({t, cfg.topk}, DType::kF32);
        Tensor dx_acc = arena.alloc({t, h}, DType::kF32);
        permute_backward(r.plan, r.seg, dx_perm, dprobs, dx_acc, dweight);
        router_backward_dgrad(cfg, full.router, dweight, kLossGradScale, r.router, dx_acc, arena);
        if (cfg.shared_expert_size > 0) {
            shared_expert_backward_dgrad(full.shared, data[i].dy, dx_acc, r.shared, arena);
        }
        r.dx = Tensor::empty({t, h}, dt);
        kernels::store_row(dx_acc.data<float>(), r.dx.raw(), dt, r.dx.numel());
    }
    experts_backward_wgrad(full.experts, cfg.gradient_accumulation_fusion, ectx, arena);
    for (RefRank& r : ranks) {
        router_backward_wgrad(cfg, full.router, r.router, arena);
        if (cfg.shared_expert_size > 0) {
            shared_expert_backward_wgrad(full.shared, cfg.gradient_accumulation_fusion, r.shared,
                                         arena);
        }
    }
    return ranks;
}

// main_grad rows of experts [first, first + count) of a full [E, ...] parameter.
Tensor expert_rows(const Param& p, std::int64_t first, std::int64_t count) {
    return p.main_grad.rows(first, first + count);
}

bool close(const Tensor& got, const Tensor& want, const char* what, bool& exact) {
    exact = exact && same_bits(got, want);
    const double err = relative_error(got, want);
    EXPECT_LE(err, 1e-6) << what;
    return err <= 1e-6;
}

void run_case(const Case& c, int ep_size) {
    SCOPED_TRACE(::testing::Message() << c.name << ", EP " << ep_size << " of " << world_size());
    const MoeConfig& cfg = c.cfg;
    const DType dt = compute_dtype(cfg);
    const int n = world_size(), me = world_rank();
    static auto watchdog = std::make_shared<comm::Watchdog>();
    comm::CommOptions options;
    options.timeout_s = 120;
    auto groups = comm::ProcessGroups::create({n, ep_size, 2}, options, "test", watchdog);
    const int ep_rank = groups->ep.rank();
    const std::int64_t local = cfg.num_experts / ep_size;

    MoeLayerParams full = make_moe_layer_params(cfg);
    init_moe_layer_params(full, kSeed, 0.4f);
    init_params(c, full);
    const std::int64_t first = ep_rank * local;

    // Distributed.
    MoeLayerParams params = local_params(cfg, full, first, local);
    const RankData mine = rank_data(c, me);
    EpState st;
    Tensor y = Tensor::empty(mine.x.shape(), dt), dx = Tensor::empty(mine.x.shape(), dt);
    const EpBlock block(cfg, params, ep_size, ep_rank);
    const MoeLosses losses = forward_ep(block, mine.x, st, y, groups->ep);
    backward_ep(block, mine.dy, kLossGradScale, st, dx, groups->ep);

    // Reference for this rank's EP group.
    const auto& members = groups->ep.members().world_ranks;
    const std::vector<RefRank> ref = reference(c, full, members);
    const RefRank& r = ref[ep_rank];
    EXPECT_TRUE(same_bits(y, r.y)) << "y differs, relative error " << relative_error(y, r.y);
    EXPECT_TRUE(same_bits(dx, r.dx)) << "dx differs, relative error " << relative_error(dx, r.dx);
    EXPECT_TRUE(
        same_bits(params.experts.fc1.main_grad, expert_rows(full.experts.fc1, first, local)))
        << "expert fc1 gradient differs";
    EXPECT_TRUE(
        same_bits(params.experts.fc2.main_grad, expert_rows(full.experts.fc2, first, local)))
        << "expert fc2 gradient differs";
    bool exact = true;
    // A rank without tokens: the single-rank router's losses are 0/0 (NaN) in both paths, so
    // there is nothing to compare (its gradients are compared below).
    if (mine.x.dim(0) > 0) {
        exact = losses.aux_loss == r.router.aux_loss && losses.z_loss == r.router.z_loss;
        EXPECT_NEAR(losses.aux_loss, r.router.aux_loss, 1e-6 * std::fabs(r.router.aux_loss));
        EXPECT_NEAR(losses.z_loss, r.router.z_loss, 1e-6 * std::fabs(r.router.z_loss));
    }

    // Gradients after the end-of-step reduction against the reference over every EP group (the
    // router and shared expert sum over all ranks, the experts over the EP groups).
    reduce_grads(params, *groups);
    for (Param* p : moe_layer_param_list(full))
        zero_grad(*p);
    for (int g = 0; g < n / ep_size; ++g) {
        std::vector<int> group;
        for (int i = 0; i < ep_size; ++i)
            group.push_back(g * ep_size + i);
        reference(c, full, group);
    }
    close(params.router.weight.main_grad, full.router.weight.main_grad, "router gradient", exact);
    if (cfg.shared_expert_size > 0) {
        close(params.shared.fc1.main_grad, full.shared.fc1.main_grad, "shared fc1 gradient", exact);
        close(params.shared.fc2.main_grad, full.shared.fc2.main_grad, "shared fc2 gradient", exact);
    }
    close(params.experts.fc1.main_grad, expert_rows(full.experts.fc1, first, local),
          "reduced expert fc1 gradient", exact);
    close(params.experts.fc2.main_grad, expert_rows(full.experts.fc2, first, local),
          "reduced expert fc2 gradient", exact);
    if (me == 0 && !exact) {
        std::printf("[ note ] %s, EP %d: summed gradients / losses within tolerance, not exact\n",
                    c.name, ep_size);
    }
}

TEST(MoeLayerEp, MatchesTheSingleRankReference) {
    for (const Case& c : cases()) {
        for (int ep = 1; ep <= world_size(); ++ep) {
            if (world_size() % ep == 0)
                run_case(c, ep);
        }
    }
}

TEST(MoeLayerEp, NodesOnTwoStreamsMatchTheInOrderLayer) {
    // Two micro-batches through the layer's nodes on the compute and comm streams, one event per
    // micro-batch chaining its nodes across the streams (docs/design.md "Streams and events"),
    // against the same micro-batches through the nodes in order on one thread: same bits.
    MoeConfig cfg = base_config();
    cfg.shared_expert_size = 8;
    const int n = world_size(), me = world_rank();
    const comm::ParallelLayout layout{n, n, 2};
    comm::CommOptions options;
    options.timeout_s = 120;
    const DType dt = compute_dtype(cfg);
    constexpr int kMicroBatches = 2;
    std::vector<Tensor> x, dy;
    for (int m = 0; m < kMicroBatches; ++m) {
        x.push_back(random_tensor({7 + 2 * me, cfg.hidden_size}, dt, 3000 + 10 * me + m));
        dy.push_back(random_tensor({7 + 2 * me, cfg.hidden_size}, dt, 4000 + 10 * me + m));
    }
    MoeLayerParams full = make_moe_layer_params(cfg);
    init_moe_layer_params(full, kSeed, 0.4f);
    const std::int64_t local = cfg.num_experts / n;
    auto make_params = [&] { return local_params(cfg, full, me * local, local); };
    auto new_tensor = [&](int m) { return Tensor::empty(x[m].shape(), dt); };

    MoeLayerParams in_order = make_params();
    std::vector<Tensor> y_ref, dx_ref;
    {
        auto groups = comm::ProcessGroups::create(layout, options, "in order", nullptr);
        const EpBlock block(cfg, in_order, n, me);
        std::vector<EpState> st(kMicroBatches);
        for (int m = 0; m < kMicroBatches; ++m) {
            y_ref.push_back(new_tensor(m));
            forward_ep(block, x[m], st[m], y_ref[m], groups->ep);
        }
        for (int m = 0; m < kMicroBatches; ++m) {
            dx_ref.push_back(new_tensor(m));
            backward_ep(block, dy[m], kLossGradScale, st[m], dx_ref[m], groups->ep);
        }
    }

    MoeLayerParams streamed = make_params();
    std::vector<Tensor> y, dx;
    for (int m = 0; m < kMicroBatches; ++m) {
        y.push_back(new_tensor(m));
        dx.push_back(new_tensor(m));
    }
    {
        const EpBlock block(cfg, streamed, n, me);
        auto streams = runtime::make_rank_streams(layout, options);
        runtime::Stream& compute = *streams.compute;
        runtime::Stream& comm = *streams.comm;
        std::vector<EpState> ctx(kMicroBatches);
        std::vector<runtime::Event> ev;
        for (int m = 0; m < kMicroBatches; ++m)
            ev.emplace_back("mb" + std::to_string(m));
        // Node `fn` of micro-batch m on stream s, after that micro-batch's previous node.
        auto node = [&](runtime::Stream& s, int m, const char* name, runtime::Task fn) {
            s.wait(ev[m]);
            s.enqueue(name, std::move(fn));
            s.record(ev[m]);
        };
        for (int m = 0; m < kMicroBatches; ++m) {
            node(compute, m, "pre_dispatch",
                 [&, m](runtime::StreamContext&) { pre_dispatch(block, x[m], ctx[m]); });
        }
        for (int m = 0; m < kMicroBatches; ++m) {
            node(comm, m, "dispatch", [&, m](runtime::StreamContext& sc) {
                dispatch_node(block, ctx[m], sc.comm().ep);
            });
            node(compute, m, "mlp", [&, m](runtime::StreamContext&) { mlp(block, ctx[m]); });
            node(comm, m, "combine", [&, m](runtime::StreamContext& sc) {
                combine(block, ctx[m], y[m], sc.comm().ep);
            });
        }
        for (int m = 0; m < kMicroBatches; ++m) {
            node(comm, m, "combine backward", [&, m](runtime::StreamContext& sc) {
                combine_backward_node(block, dy[m], ctx[m], sc.comm().ep);
            });
            node(compute, m, "mlp backward",
                 [&, m](runtime::StreamContext&) { mlp_backward(block, ctx[m]); });
            node(comm, m, "dispatch backward", [&, m](runtime::StreamContext& sc) {
                dispatch_backward(block, ctx[m], sc.comm().ep);
            });
            node(compute, m, "pre_dispatch backward", [&, m](runtime::StreamContext&) {
                pre_dispatch_backward(block, kLossGradScale, ctx[m], dx[m]);
            });
        }
        streams.synchronize();
        // The count exchange and the all-to-alls ran on the comm stream's communicators, nothing
        // on the compute stream's.
        EXPECT_EQ(streams.comm->groups()->ep.stats().num_ops, 7 * kMicroBatches);  // 1+2+1, 1+2
        EXPECT_EQ(streams.compute->groups()->ep.stats().num_ops, 0);
    }
    for (int m = 0; m < kMicroBatches; ++m) {
        EXPECT_TRUE(same_bits(y[m], y_ref[m])) << "micro-batch " << m;
        EXPECT_TRUE(same_bits(dx[m], dx_ref[m])) << "micro-batch " << m;
    }
    std::vector<Param*> a = moe_layer_param_list(streamed), b = moe_layer_param_list(in_order);
    for (std::size_t i = 0; i < a.size(); ++i) {
        EXPECT_TRUE(same_bits(a[i]->main_grad, b[i]->main_grad)) << a[i]->name;
    }
}

}  // namespace
}  // namespace epo::moe
