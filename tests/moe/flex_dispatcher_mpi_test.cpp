// The flex token dispatcher (flex_dispatcher.h) on real MPI ranks, for every node grouping the
// world allows (2 ranks as one node, 4 as 2 x 2, 6 as 3 x 2, 8 as 2 x 4, and more), both
// backends, dropless, capacity and capacity padded, spread and skewed routing (ranks and experts
// that receive nothing) and a rank without tokens. Rows carry {source rank, token, -1, 7} and
// weights encode (rank, token, k), so a wrong row names the rank at fault. Checked against a
// plain reference worked out from every rank's routing (a pure function of the rank):
//   - the layout: messages per node and their tokens, units (distinct (token, rank) pairs),
//     per-local-expert counts, expert rows source-major in token order with their weights;
//   - bytes: inter-node row bytes = distinct (token, remote node) pairs x row size;
//   - a cached layout reproduces the dispatch of new rows bit for bit;
//   - combine(dispatch(x)) of the unit rows = x * ranks reached; with identity experts
//     y = x * kept slots, and the backward returns x * kept slots and the weight codes.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "epo/comm/mpi_runtime.h"
#include "epo/comm/process_groups.h"
#include "epo/moe/flex_dispatcher.h"
#include "epo/tensor/random.h"

namespace epo::moe {
namespace {

int world_rank() {
    return comm::current_world_rank();
}
int world_size() {
    return comm::current_world_size();
}

enum class Routing { kSpread, kSkew };

constexpr std::int64_t kWidth = 4;  // row: {rank, token, -1, 7}
constexpr std::int64_t kExperts = 24;
constexpr std::int64_t kTopk = 4;

float weight_code(int rank, std::int64_t t, std::int64_t k) {
    return static_cast<float>(rank * 1000 + t * 10 + k + 1);
}

struct Case {
    const char* name;
    Routing routing = Routing::kSpread;
    std::optional<double> capacity_factor;
    bool pad = false;
    bool empty_rank = false;
};

std::int64_t tokens_of(const Case& c, int rank) {
    if (c.empty_rank && rank == world_size() - 1)
        return 0;
    return c.pad ? 9 : 5 + 2 * rank;
}

struct Tokens {
    RouterOutput routing;
    Tensor x;  // (T, 4) f32
};

Tokens make_tokens(const Case& c, int rank) {
    const std::int64_t T = tokens_of(c, rank), K = kTopk;
    Tokens tk;
    tk.routing.topk_index = Tensor::empty({T, K}, DType::kI32);
    tk.routing.topk_weight = Tensor::empty({T, K}, DType::kF32);
    tk.x = Tensor::empty({T, kWidth}, DType::kF32);
    for (std::int64_t t = 0; t < T; ++t) {
        const std::uint64_t bits = random_bits(rank * 1000 + 17, static_cast<std::uint64_t>(t));
        for (std::int64_t q = 0; q < K; ++q) {
            // Spread: K distinct experts from a random start with a random stride (1 or 7);
            // skew: experts 0..K-1 (the first rank's), every other rank receives nothing.
            std::int64_t e = q;
            if (c.routing == Routing::kSpread) {
                const std::int64_t stride = (bits >> 20) % 2 ? 7 : 1;
                e = (static_cast<std::int64_t>(bits % kExperts) + q * stride) % kExperts;
            }
            tk.routing.topk_index.data<std::int32_t>()[t * K + q] = static_cast<std::int32_t>(e);
            tk.routing.topk_weight.data<float>()[t * K + q] = weight_code(rank, t, q);
        }
        float* row = tk.x.data<float>() + t * kWidth;
        row[0] = static_cast<float>(rank);
        row[1] = static_cast<float>(t);
        row[2] = -1.0f;
        row[3] = 7.0f;
    }
    return tk;
}

MoeConfig config(const Case& c) {
    MoeConfig cfg;
    cfg.hidden_size = kWidth;
    cfg.num_experts = kExperts;
    cfg.topk = kTopk;
    cfg.ffn_hidden_size = 4;
    cfg.precision = Precision::kFp32;
    cfg.capacity_factor = c.capacity_factor;
    cfg.pad_to_capacity = c.pad;
    return cfg;
}

// The plan of EP group rank `src` (world rank members[src]).
struct SourcePlan {
    Tokens tokens;
    Arena arena;
    DispatchPlan plan;
};
std::unique_ptr<SourcePlan> plan_of(const Case& c, int world) {
    auto s = std::make_unique<SourcePlan>();
    s->tokens = make_tokens(c, world);
    s->plan = dispatch_preprocess(config(c), s->tokens.routing.topk_index,
                                  s->tokens.routing.topk_weight, s->arena);
    return s;
}

std::int64_t expert_of_row(const DispatchPlan& plan, std::int64_t r) {
    std::int64_t e = 0;
    while (plan.expert_begin[e + 1] <= r)
        ++e;
    return e;
}

// Destination ranks of token t (kept slots and padding rows): the plan's rows.
std::set<int> ranks_of(const DispatchPlan& plan, std::int64_t t, std::int64_t L, bool kept_only) {
    std::set<int> out;
    for (std::int64_t r = 0; r < plan.num_rows; ++r) {
        if (plan.row_token.data<std::int32_t>()[r] == t &&
            (!kept_only || plan.row_slot.data<std::int32_t>()[r] >= 0))
            out.insert(static_cast<int>(expert_of_row(plan, r) / L));
    }
    return out;
}

std::int64_t kept_slots(const DispatchPlan& plan, std::int64_t t) {
    std::int64_t n = 0;
    for (std::int64_t q = 0; q < plan.topk; ++q)
        n += plan.slot_row.data<std::int32_t>()[t * plan.topk + q] >= 0;
    return n;
}

struct Run {
    FlexDispatch d;
    Arena arena;
};

void full_dispatch(const MoeConfig& cfg, FlexBackend backend, int ep, int ep_rank, int P,
                   const Tokens& tk, comm::ProcessGroups& g, Run& run) {
    flex::dispatch_preprocess(cfg, backend, ep, ep_rank, P, tk.routing, run.d, run.arena);
    flex::dispatch_permute(tk.x, run.d);
    const flex::FlexComms c = flex::flex_comms(g, run.d);
    flex::dispatch_layout(c, run.d, run.arena);
    flex::dispatch_payload(c, run.d);
    flex::dispatch_postprocess(run.d);
}

// The unit rows a rank received (deepep: its receive buffer; hybridep: the node-wide buffer).
const float* unit_row(const FlexDispatch& d, std::int64_t u) {
    if (d.backend == FlexBackend::kDeepep)
        return d.recv_rows.data<float>() + u * kWidth;
    return d.node_rows.data<float>() + d.unit_node_msg[u] * kWidth;
}

std::unique_ptr<comm::ProcessGroups> make_groups(int ep, int gpn) {
    static auto watchdog = std::make_shared<comm::Watchdog>();
    comm::CommOptions options;
    options.timeout_s = 120;
    return comm::ProcessGroups::create({world_size(), ep, gpn}, options, "test", watchdog);
}

void run_case(const Case& c, FlexBackend backend, int ep, int gpn,
              std::unique_ptr<comm::ProcessGroups>& groups) {
    const int n = world_size(), me = world_rank();
    SCOPED_TRACE(::testing::Message() << c.name << ", " << flex_backend_name(backend) << ", EP "
                                      << ep << " of " << n << ", gpus_per_node " << gpn);
    const int P = flex::flex_ranks_per_node(ep, gpn);
    const int ep_rank = groups->ep.rank(), N = ep / P;
    const std::vector<int>& members = groups->ep.members().world_ranks;
    const MoeConfig cfg = config(c);
    const std::int64_t L = kExperts / ep;
    const Tokens mine = make_tokens(c, me);

    Run run;
    const comm::ByteCounts peer_before = groups->ep_peer.stats().bytes;
    const flex::InterNodeCopies copies_before = inter_node_copies_total();
    full_dispatch(cfg, backend, ep, ep_rank, P, mine, *groups, run);
    const flex::InterNodeCopies copies = inter_node_copies_total() - copies_before;
    FlexDispatch& d = run.d;

    std::vector<std::unique_ptr<SourcePlan>> plans;
    for (int w : members)
        plans.push_back(plan_of(c, w));
    const DispatchPlan& my_plan = plans[ep_rank]->plan;

    // Source side: messages per node, their tokens in order.
    std::int64_t remote_msgs = 0;
    for (int m = 0; m < N; ++m) {
        std::vector<std::int32_t> want;
        for (std::int64_t t = 0; t < my_plan.num_tokens; ++t) {
            for (int r : ranks_of(my_plan, t, L, false)) {
                if (r / P == m) {
                    want.push_back(static_cast<std::int32_t>(t));
                    break;
                }
            }
        }
        ASSERT_EQ(d.source.node_counts[m], static_cast<std::int64_t>(want.size())) << "node " << m;
        std::int64_t first = 0;
        for (int q = 0; q < m; ++q)
            first += d.source.node_counts[q];
        for (std::size_t i = 0; i < want.size(); ++i)
            ASSERT_EQ(d.source.msg_token[first + i], want[i]) << "node " << m;
        if (m != ep_rank / P)
            remote_msgs += static_cast<std::int64_t>(want.size());
    }
    // The copies epo bench reports: flex's are the remote messages; alltoall's, on the same
    // routing, one per plan row (kept slot or padding row) whose expert is on another node.
    std::int64_t remote_rows = 0;
    for (std::int64_t r = 0; r < my_plan.num_rows; ++r)
        remote_rows += expert_of_row(my_plan, r) / L / P != ep_rank / P;
    EXPECT_EQ(copies, (flex::InterNodeCopies{my_plan.num_tokens, remote_msgs, remote_rows}))
        << "flex " << copies.flex << " vs " << remote_msgs << ", alltoall " << copies.alltoall
        << " vs " << remote_rows << ", tokens " << copies.tokens;
    EXPECT_EQ(copies, flex::inter_node_copies(d.geo, d.source, my_plan.num_tokens, ep_rank));
    // Inter-node traffic: metadata and rows of the remote messages only, once per (token, node).
    const comm::ByteCounts peer_bytes = groups->ep_peer.stats().bytes - peer_before;
    const std::int64_t per_msg = kWidth * 4 + flex::meta_width(d.geo) * 4;
    EXPECT_EQ(peer_bytes.inter_sent, remote_msgs * per_msg + (N - 1) * 8)  // + the counts
        << "inter-node bytes are not one row + metadata per (token, remote node)";
    EXPECT_EQ(peer_bytes.intra_sent, 0);

    // Receiver side: units = distinct (token, this rank) pairs; each unit's row is its source's.
    std::int64_t units = 0;
    for (std::size_t s = 0; s < plans.size(); ++s) {
        for (std::int64_t t = 0; t < plans[s]->plan.num_tokens; ++t)
            units += ranks_of(plans[s]->plan, t, L, false).count(ep_rank);
    }
    ASSERT_EQ(d.receive.num_units(), units);
    const std::int64_t MW = flex::meta_width(d.geo), W = d.geo.positions;
    for (std::int64_t u = 0; u < units; ++u) {
        const float* row = unit_row(d, u);
        ASSERT_EQ(row[0], members[d.recv_meta[u * MW + 2 * W]]) << "unit " << u;
        ASSERT_EQ(row[1], d.recv_meta[u * MW + 2 * W + 1]) << "unit " << u;
        ASSERT_EQ(row[3], 7.0f);
    }
    // Expert rows: per local expert, the sources in EP-rank order, each source's plan rows of
    // that expert (kept and padding) in token order, with their weights.
    for (std::int64_t l = 0; l < L; ++l) {
        const std::int64_t e = ep_rank * L + l;
        std::int64_t row = d.expert_segments.offsets[l], count = 0;
        for (std::size_t s = 0; s < plans.size(); ++s) {
            const DispatchPlan& p = plans[s]->plan;
            count += p.tokens_per_expert[e];
            for (std::int64_t r = p.expert_begin[e]; r < p.expert_begin[e + 1]; ++r, ++row) {
                const float* got = d.expert_rows.data<float>() + row * kWidth;
                const std::int32_t t = p.row_token.data<std::int32_t>()[r];
                const std::int32_t slot = p.row_slot.data<std::int32_t>()[r];
                ASSERT_EQ(got[0], members[s]) << "expert " << e << " row " << row;
                ASSERT_EQ(got[1], t) << "expert " << e << " row " << row;
                ASSERT_EQ(d.expert_probs.data<float>()[row],
                          slot < 0 ? 0.0f : weight_code(members[s], t, slot % kTopk));
            }
        }
        ASSERT_EQ(d.expert_segments.counts[l], count) << "expert " << e;
        for (; row < d.expert_segments.offsets[l + 1]; ++row)
            ASSERT_EQ(d.expert_rows.data<float>()[row * kWidth], 0.0f);
    }

    // A cached layout reproduces the dispatch of new rows: x' = 3x + 1 through the same handle
    // against a fresh dispatch of x'.
    Tokens changed = make_tokens(c, me);
    for (std::int64_t i = 0; i < changed.x.numel(); ++i)
        changed.x.data<float>()[i] = 3.0f * changed.x.data<float>()[i] + 1.0f;
    const flex::FlexComms comms = flex::flex_comms(*groups, d);
    flex::dispatch_permute(changed.x, d);
    flex::dispatch_payload(comms, d);
    flex::dispatch_postprocess(d);
    Run fresh;
    full_dispatch(cfg, backend, ep, ep_rank, P, changed, *groups, fresh);
    ASSERT_EQ(d.expert_rows.numel(), fresh.d.expert_rows.numel());
    EXPECT_EQ(std::memcmp(d.expert_rows.raw(), fresh.d.expert_rows.raw(),
                          static_cast<std::size_t>(d.expert_rows.numel()) * 4),
              0)
        << "the cached layout dispatched differently";
    flex::dispatch_permute(mine.x, d);
    flex::dispatch_payload(comms, d);
    flex::dispatch_postprocess(d);

    // combine(dispatch(x)) of the unit rows themselves = x * ranks the token reached.
    const std::int64_t T = my_plan.num_tokens;
    for (std::int64_t u = 0; u < units; ++u)
        std::memcpy(d.unit_out.data<float>() + u * kWidth, unit_row(d, u), kWidth * 4);
    flex::token_combine(comms, d);
    Tensor y = Tensor::empty({T, kWidth}, DType::kF32);
    flex::combine_postprocess(d, Tensor(), y);
    for (std::int64_t t = 0; t < T; ++t) {
        const auto reached = static_cast<float>(ranks_of(my_plan, t, L, true).size());
        for (std::int64_t h = 0; h < kWidth; ++h)
            ASSERT_EQ(y.data<float>()[t * kWidth + h],
                      mine.x.data<float>()[t * kWidth + h] * reached)
                << "token " << t;
    }
    // Identity experts: y = x * kept slots; backward with dy = x: dx = x * kept slots, the weight
    // gradients are the weights (identity in the probs too).
    std::memcpy(d.expert_out.raw(), d.expert_rows.raw(),
                static_cast<std::size_t>(d.expert_rows.numel()) * 4);
    flex::combine_preprocess(d);
    flex::token_combine(comms, d);
    flex::combine_postprocess(d, Tensor(), y);
    flex::combine_postprocess_backward(mine.x, d, run.arena);
    flex::token_combine_backward(comms, d);
    flex::combine_preprocess_backward(d);
    std::memcpy(d.d_expert_rows.raw(), d.d_expert_out.raw(),
                static_cast<std::size_t>(d.d_expert_out.numel()) * 4);
    std::memcpy(d.d_expert_probs.raw(), d.expert_probs.raw(),
                static_cast<std::size_t>(d.expert_probs.numel()) * 4);
    flex::dispatch_postprocess_backward(d);
    flex::token_dispatch_backward(comms, d);
    Tensor dweight = Tensor::empty({T, kTopk}, DType::kF32);
    flex::gather_dweight(d, dweight);
    std::vector<float> acc(kWidth);
    for (std::int64_t t = 0; t < T; ++t) {
        const auto kept = static_cast<float>(kept_slots(my_plan, t));
        flex::token_row_sum(d, t, acc.data());
        for (std::int64_t h = 0; h < kWidth; ++h) {
            const float x = mine.x.data<float>()[t * kWidth + h];
            ASSERT_EQ(y.data<float>()[t * kWidth + h], x * kept) << "token " << t;
            ASSERT_EQ(acc[h], x * kept) << "dx of token " << t;
        }
        for (std::int64_t q = 0; q < kTopk; ++q) {
            const bool kept_slot = my_plan.slot_row.data<std::int32_t>()[t * kTopk + q] >= 0;
            ASSERT_EQ(dweight.data<float>()[t * kTopk + q],
                      kept_slot ? weight_code(me, t, q) : 0.0f)
                << "token " << t << " k " << q;
        }
    }
}

std::vector<Case> cases() {
    std::vector<Case> out;
    out.push_back({"dropless spread"});
    out.push_back({"dropless skew: one rank receives everything", Routing::kSkew});
    out.push_back({"capacity 0.75 spread", Routing::kSpread, 0.75});
    out.push_back({"capacity 1.0 skew", Routing::kSkew, 1.0});
    out.push_back({"capacity 1.5 padded to capacity", Routing::kSpread, 1.5, true});
    out.push_back({"a rank without tokens", Routing::kSpread, std::nullopt, false, true});
    return out;
}

// Every (EP, gpus_per_node) the flex geometry allows with EP = the world, or half of it.
std::vector<std::pair<int, int>> groupings() {
    const int n = world_size();
    std::vector<std::pair<int, int>> out;
    for (int ep : {n, n / 2}) {
        if (ep < 1 || n % ep != 0 || (ep == n / 2 && n < 4))
            continue;
        for (int gpn : {1, 2, 3, 4}) {
            if ((gpn % ep == 0 || ep % gpn == 0) && (gpn <= ep || gpn == 4))
                out.emplace_back(ep, gpn);
        }
    }
    return out;
}

TEST(FlexDispatch, LayoutRowsBytesAndRoundTripsMatchThePlainReference) {
    for (const auto& [ep, gpn] : groupings()) {
        auto groups = make_groups(ep, gpn);
        for (const Case& c : cases()) {
            for (FlexBackend b : {FlexBackend::kDeepep, FlexBackend::kHybridep})
                run_case(c, b, ep, gpn, groups);
        }
    }
}

TEST(FlexDispatch, ALayoutThatCannotWorkIsRefusedNamingTheFields) {
    try {
        flex::flex_ranks_per_node(6, 4);
        FAIL() << "EP 6 over nodes of 4 was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("comm.gpus_per_node=4"), std::string::npos);
        EXPECT_NE(std::string(e.what()).find("expert_model_parallel_size=6"), std::string::npos);
    }
    EXPECT_EQ(flex::flex_ranks_per_node(8, 4), 4);
    EXPECT_EQ(flex::flex_ranks_per_node(2, 8), 2);
}

TEST(FlexDispatch, TheEpCommunicatorAloneIsRefused) {
    const int n = world_size();
    auto groups = comm::ProcessGroups::create({n, n, n}, comm::CommOptions{}, "test", nullptr);
    FlexDispatch d;
    d.geo = flex::make_geometry(config(Case{"x"}), n, n);
    EXPECT_THROW(flex::flex_comms(DispatchComms(groups->ep), d), Error);
}

}  // namespace
}  // namespace epo::moe
