#include "epo/moe/moe_layer.h"

#include <chrono>

#include "epo/kernels/rows.h"
#include "epo/tensor/random.h"

namespace epo::moe {
namespace {

// Adds the time of its scope to a MoePhaseTimes field.
class Stopwatch {
public:
    explicit Stopwatch(double& into) : into_(into), start_(std::chrono::steady_clock::now()) {}
    ~Stopwatch() {
        into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
    Stopwatch(const Stopwatch&) = delete;
    Stopwatch& operator=(const Stopwatch&) = delete;

private:
    double& into_;
    std::chrono::steady_clock::time_point start_;
};

// Rows the permuted buffers can need for T tokens, so their arena offsets do not move with the
// routing (a steady-state step then maps nothing new).
std::int64_t row_bound(const MoeConfig& cfg, std::int64_t t_count) {
    const std::int64_t capacity = expert_capacity(cfg, t_count);
    const std::int64_t rows = cfg.pad_to_capacity ? capacity * cfg.num_experts : t_count * cfg.topk;
    return max_segment_rows(rows, cfg.num_experts, kExpertRowAlign);
}

Tensor alloc_rows(Arena& arena, std::int64_t bound, std::int64_t rows, std::int64_t width,
                  DType dt) {
    if (width == 1) {
        return arena.alloc({bound}, dt).rows(0, rows);
    }
    return arena.alloc({bound, width}, dt).rows(0, rows);
}

void check_activation(const MoeConfig& cfg, const Tensor& t, std::int64_t t_count,
                      const char* what) {
    check_tensor(t, {t_count, cfg.hidden_size}, compute_dtype(cfg), what);
}

// Everything of the backward up to the experts.
void backward_prologue(const MoeConfig& cfg, const Tensor& dy, MoeContext& ctx) {
    const std::int64_t t_count = ctx.plan.num_tokens, rp = ctx.segments.total_rows();
    const std::int64_t bound = row_bound(cfg, t_count);
    const DType dt = compute_dtype(cfg);
    check_activation(cfg, dy, t_count, "MoE layer dy");
    ctx.dy_perm = alloc_rows(ctx.arena, bound, rp, cfg.hidden_size, dt);
    ctx.dx_perm = alloc_rows(ctx.arena, bound, rp, cfg.hidden_size, dt);
    ctx.dprobs_perm = alloc_rows(ctx.arena, bound, rp, 1, DType::kF32);
    ctx.dweight = ctx.arena.alloc({t_count, cfg.topk}, DType::kF32);
    ctx.dx_acc = ctx.arena.alloc({t_count, cfg.hidden_size}, DType::kF32);  // dx between its terms
    Stopwatch sw(ctx.times.combine_bwd);
    combine_backward(ctx.plan, ctx.segments, dy, ctx.dy_perm);
}

// After the experts: dx = unpermuted rows + the router's term (+ the shared expert's), summed in
// f32 in that order as separate steps over the whole (T, H) buffer, then rounded once. The MoE
// block (moe_block.h) makes the first two one pass over the tokens with the same operations; its
// multi-rank test compares the two bit for bit.
void backward_epilogue(const MoeConfig& cfg, const MoeLayerParams& params, const Tensor& dy,
                       float loss_grad_scale, MoeContext& ctx, const Tensor& dx) {
    MoePhaseTimes& tm = ctx.times;
    check_activation(cfg, dx, ctx.plan.num_tokens, "MoE layer dx");
    {
        Stopwatch sw(tm.permute_bwd);
        permute_backward(ctx.plan, ctx.segments, ctx.dx_perm, ctx.dprobs_perm, ctx.dx_acc,
                         ctx.dweight);
    }
    {
        Stopwatch sw(tm.router_dgrad);
        router_backward_dgrad(cfg, params.router, ctx.dweight, loss_grad_scale, ctx.router,
                              ctx.dx_acc, ctx.arena);
    }
    if (cfg.has_shared_experts()) {
        Stopwatch sw(tm.shared_dgrad);
        shared_expert_backward_dgrad(params.shared, dy, ctx.dx_acc, ctx.shared, ctx.arena);
    }
    Stopwatch sw(tm.combine_bwd);  // the final f32 -> activation dtype store of dx
    kernels::store_row(ctx.dx_acc.data<float>(), dx.raw(), dx.dtype(), dx.numel());
}

}  // namespace

MoeLayerParams make_moe_layer_params(const MoeConfig& cfg) {
    validate_moe_config(cfg);
    const DType dt = compute_dtype(cfg);
    MoeLayerParams p;
    p.router = make_router_params(cfg);
    p.experts = make_expert_weights(cfg.num_experts, cfg.hidden_size, cfg.ffn_hidden_size, dt);
    if (cfg.has_shared_experts()) {
        p.shared = make_shared_expert_weights(cfg.hidden_size, cfg.shared_expert_size, dt);
    }
    return p;
}

void init_moe_layer_params(MoeLayerParams& params, std::uint64_t seed, float init_std) {
    std::uint64_t stream = 0;
    for (Param* p : moe_layer_param_list(params)) {
        fill_normal(p->master, random_bits(seed, stream++), 0.0f, init_std);
        refresh_compute(*p);
    }
    if (params.router.expert_bias.defined()) {
        params.router.expert_bias.fill_zero();
    }
}

std::vector<Param*> moe_layer_param_list(MoeLayerParams& params) {
    std::vector<Param*> list = {&params.router.weight, &params.experts.fc1, &params.experts.fc2};
    if (params.shared.fc1.master.defined()) {
        list.push_back(&params.shared.fc1);
        list.push_back(&params.shared.fc2);
    }
    return list;
}

MoeLosses moe_forward(const MoeConfig& cfg, const MoeLayerParams& params, const Tensor& x,
                      std::int64_t num_sequences, MoeContext& ctx, const Tensor& y) {
    const std::int64_t t_count = x.dim(0);
    const DType dt = compute_dtype(cfg);
    check_activation(cfg, x, t_count, "MoE layer input x");
    check_activation(cfg, y, t_count, "MoE layer output y");
    ctx.arena.reset();
    ctx.times = MoePhaseTimes{};
    Arena& arena = ctx.arena;
    MoePhaseTimes& tm = ctx.times;

    if (cfg.has_shared_experts()) {
        Stopwatch sw(tm.shared_fwd);
        ctx.shared_out = arena.alloc({t_count, cfg.hidden_size}, DType::kF32);
        shared_expert_forward(params.shared, x, ctx.shared_out, ctx.shared, arena);
    } else {
        ctx.shared_out = Tensor();
    }
    {
        Stopwatch sw(tm.router_fwd);
        ctx.router = router_forward(cfg, params.router, x, num_sequences, arena);
    }
    {
        Stopwatch sw(tm.dispatch_fwd);
        ctx.plan = dispatch_preprocess(cfg, ctx.router.topk_index, ctx.router.topk_weight, arena);
        ctx.segments = make_expert_segments(ctx.plan.tokens_per_expert, kExpertRowAlign);
        const std::int64_t bound = row_bound(cfg, t_count), rp = ctx.segments.total_rows();
        ctx.x_perm = alloc_rows(arena, bound, rp, cfg.hidden_size, dt);
        ctx.probs_perm = alloc_rows(arena, bound, rp, 1, DType::kF32);
        ctx.y_perm = alloc_rows(arena, bound, rp, cfg.hidden_size, dt);
        permute_forward(ctx.plan, ctx.segments, x, ctx.router.topk_weight, ctx.x_perm,
                        ctx.probs_perm);
    }
    {
        Stopwatch sw(tm.experts_fwd);
        experts_forward(params.experts, ctx.segments, ctx.x_perm, ctx.probs_perm, ctx.y_perm,
                        ctx.experts, arena);
    }
    {
        Stopwatch sw(tm.combine_fwd);
        combine_forward(ctx.plan, ctx.segments, ctx.y_perm, ctx.shared_out, y);
    }
    return MoeLosses{ctx.router.aux_loss, ctx.router.z_loss};
}

void moe_backward_dgrad(const MoeConfig& cfg, const MoeLayerParams& params, const Tensor& dy,
                        float loss_grad_scale, MoeContext& ctx, const Tensor& dx) {
    backward_prologue(cfg, dy, ctx);
    {
        Stopwatch sw(ctx.times.experts_dgrad);
        experts_backward_dgrad(params.experts, ctx.dy_perm, ctx.dx_perm, ctx.dprobs_perm,
                               ctx.experts, ctx.arena);
    }
    backward_epilogue(cfg, params, dy, loss_grad_scale, ctx, dx);
}

void moe_backward_wgrad(const MoeConfig& cfg, MoeLayerParams& params, MoeContext& ctx) {
    const bool fusion = cfg.gradient_accumulation_fusion;
    MoePhaseTimes& tm = ctx.times;
    {
        Stopwatch sw(tm.experts_wgrad);
        experts_backward_wgrad(params.experts, fusion, ctx.experts, ctx.arena);
    }
    {
        Stopwatch sw(tm.router_wgrad);
        router_backward_wgrad(cfg, params.router, ctx.router, ctx.arena);
    }
    if (cfg.has_shared_experts()) {
        Stopwatch sw(tm.shared_wgrad);
        shared_expert_backward_wgrad(params.shared, fusion, ctx.shared, ctx.arena);
    }
}

// The whole backward is the split one run back to back (every dgrad, then every weight
// gradient), so the benchmark times the order the training schedule runs. Interleaving each
// expert's wgrad with its dgrad instead ran the same within noise (docs/numerics.md).
void moe_backward(const MoeConfig& cfg, MoeLayerParams& params, const Tensor& dy,
                  float loss_grad_scale, MoeContext& ctx, const Tensor& dx) {
    moe_backward_dgrad(cfg, params, dy, loss_grad_scale, ctx, dx);
    moe_backward_wgrad(cfg, params, ctx);
}

}  // namespace epo::moe
