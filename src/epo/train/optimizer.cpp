#include "epo/train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <utility>

#include "epo/config/finalize.h"
#include "epo/core/error.h"
#include "epo/train/nonfinite.h"

namespace epo::train {

double group_sum(comm::Communicator& c, double local) {
    std::vector<double> all(static_cast<size_t>(c.size()));
    c.all_gather(std::span<const double>(&local, 1), std::span<double>(all));
    double s = 0;
    for (double v : all)
        s += v;
    return s;
}

namespace {

LrDecayStyle lr_style(config::LrDecayStyle s) {
    switch (s) {
        case config::LrDecayStyle::kCosine:
            return LrDecayStyle::kCosine;
        case config::LrDecayStyle::kLinear:
            return LrDecayStyle::kLinear;
        case config::LrDecayStyle::kConstant:
            return LrDecayStyle::kConstant;
    }
    return LrDecayStyle::kLinear;
}

// The (parameter, shard) sums of squares of params[begin, end) (one group) as the norm adds them:
// parts[j * g + r] is shard r of parameter begin + j. The distributed optimizer, which has only
// its own shards reduced, took its shards' sums (square_grads) and gathers the others', so both
// optimizers get the same bits.
std::vector<double> square_parts(const OptimizerState& state, size_t begin, size_t end,
                                 comm::Communicator& group) {
    const int g = group.size();
    const size_t k = end - begin;
    std::vector<double> parts(k * static_cast<size_t>(g), 0.0);
    for (size_t j = 0; j < k; ++j) {
        const std::vector<double>& sq = state.grad_squares[begin + j];
        for (int r = 0; r < g; ++r)
            parts[j * g + r] = sq[static_cast<size_t>(r)];
    }
    if (state.distributed && g > 1) {
        std::vector<double> mine(k), all(k * static_cast<size_t>(g));
        for (size_t j = 0; j < k; ++j)
            mine[j] = parts[j * g + group.rank()];
        group.all_gather(std::span<const double>(mine), std::span<double>(all));
        for (int r = 0; r < g; ++r)
            for (size_t j = 0; j < k; ++j)
                parts[j * g + r] = all[r * k + j];
    }
    return parts;
}

// With pipeline stages: this stage's parts at their places in the whole model's order
// (norm_slots from `begin`), the stages' vectors gathered over pp, and at each place the one
// stage's value that is not an exact zero (added in stage order: x + 0 = x).
std::vector<double> model_parts(const OptimizerState& state, const std::vector<double>& parts,
                                size_t begin, size_t end, int num_model, int g,
                                comm::Communicator& pp) {
    const size_t n = static_cast<size_t>(num_model) * static_cast<size_t>(g);
    std::vector<double> mine(n, 0.0), all(n * static_cast<size_t>(pp.size()));
    for (size_t j = 0; j < end - begin; ++j) {
        if (state.norm_slots[begin + j] < 0)
            continue;  // the last stage's embedding copy: stage 0's counts it
        const auto slot = static_cast<size_t>(state.norm_slots[begin + j]);
        for (int r = 0; r < g; ++r)
            mine[slot * g + r] = parts[j * g + r];
    }
    pp.all_gather(std::span<const double>(mine), std::span<double>(all));
    std::vector<double> out(n, 0.0);
    for (int s = 0; s < pp.size(); ++s)
        for (size_t i = 0; i < n; ++i)
            out[i] += all[static_cast<size_t>(s) * n + i];
    return out;
}

double sum_squares(const OptimizerState& state, size_t begin, size_t end, comm::Communicator& group,
                   int num_model, comm::Communicator& pp) {
    std::vector<double> parts = square_parts(state, begin, end, group);
    if (!state.norm_slots.empty())
        parts = model_parts(state, parts, begin, end, num_model, group.size(), pp);
    double sum = 0;
    for (double v : parts)
        sum += v;
    return sum;
}

// The dense term at TP > 1: the replicated parameters' parts once, the sharded ones' summed over
// the TP group in rank order. Each kind's parts keep their places (the other kind's are exact
// zeros), so the stages' gather and the order of the sum are those of sum_squares.
double tp_dense_squares(const OptimizerState& state, comm::ProcessGroups& groups) {
    const size_t num_dense = state.num_dense;
    const int g = groups.dp.size();
    const std::vector<double> parts = square_parts(state, 0, num_dense, groups.dp);
    std::vector<double> replicated(parts.size(), 0.0), sharded(parts.size(), 0.0);
    for (size_t j = 0; j < num_dense; ++j) {
        std::vector<double>& to = state.tp_replicated[j] ? replicated : sharded;
        for (int r = 0; r < g; ++r)
            to[j * g + r] = parts[j * g + r];
    }
    double sums[2] = {0, 0};
    for (int kind = 0; kind < 2; ++kind) {
        std::vector<double> v = kind == 0 ? replicated : sharded;
        if (!state.norm_slots.empty())
            v = model_parts(state, v, 0, num_dense, state.num_model_dense, g, groups.pp);
        for (double x : v)
            sums[kind] += x;
    }
    return sums[0] + group_sum(groups.tp, sums[1]);
}

// The global norm (header formula) from the squares square_grads took.
double global_grad_norm(const OptimizerState& state, comm::ProcessGroups& groups) {
    const size_t num_params = state.params.size(), num_dense = state.num_dense;
    const double dense_sq =
        state.tp_replicated.empty()
            ? sum_squares(state, 0, num_dense, groups.dp, state.num_model_dense, groups.pp)
            : tp_dense_squares(state, groups);
    double expert_sq =
        sum_squares(state, num_dense, num_params, groups.edp, state.num_model_expert, groups.pp);
    // Dense gradients are identical on every rank; expert gradients differ across the EP group,
    // whose sums of squares are added up in rank order, and with expert tensor parallelism each
    // ETP rank holds another shard of its experts: the EP sums are added up over the ETP group
    // in rank order (each shard counted once, the same value on every rank).
    if (groups.ep.size() > 1)
        expert_sq = group_sum(groups.ep, expert_sq);
    if (groups.etp.size() > 1)
        expert_sq = group_sum(groups.etp, expert_sq);
    return std::sqrt(dense_sq + expert_sq);
}

}  // namespace

OptimizerConfig optimizer_config_from(const config::Config& cfg) {
    return OptimizerConfig{
        .adam = AdamConfig{.lr = cfg.optimizer.lr,
                           .beta1 = cfg.optimizer.adam_beta1,
                           .beta2 = cfg.optimizer.adam_beta2,
                           .eps = cfg.optimizer.adam_eps,
                           .weight_decay = cfg.optimizer.weight_decay},
        .lr = LrScheduleConfig{.max_lr = cfg.optimizer.lr,
                               .min_lr = cfg.optimizer.min_lr,
                               .warmup_iters = cfg.train.lr_warmup_iters,
                               .decay_iters = config::lr_decay_iters(cfg),
                               .decay_style = lr_style(cfg.train.lr_decay_style)},
        .clip_grad = cfg.optimizer.clip_grad,
        .use_distributed_optimizer = cfg.ddp.use_distributed_optimizer,
        .overlap_param_gather = cfg.ddp.overlap_param_gather,
        .overlap_param_gather_with_optimizer_step =
            cfg.optimizer.overlap_param_gather_with_optimizer_step};
}

OptimizerState make_optimizer_state(const std::vector<Param*>& dense,
                                    const std::vector<Param*>& expert,
                                    const comm::ProcessGroups& groups,
                                    const OptimizerConfig& config) {
    OptimizerState state;
    state.params = dense;
    state.params.insert(state.params.end(), expert.begin(), expert.end());
    state.num_dense = dense.size();
    // CP = 1 at run time (RT003): the dp group is the stage's ranks of this rank's TP place
    // (stage / TP of them), whose gradients are averaged; experts' too, as Megatron-Core scales
    // expert gradients by the dense DP size.
    state.dp_size = groups.dp.size();
    state.distributed =
        config.use_distributed_optimizer && (groups.dp.size() > 1 || groups.edp.size() > 1);
    // With the gathers under the optimizer step nothing is left for the next forward.
    state.param_gather_overlap = state.distributed && config.overlap_param_gather &&
                                 !config.overlap_param_gather_with_optimizer_step;
    for (size_t i = 0; i < state.params.size(); ++i) {
        const Param* p = state.params[i];
        const comm::Communicator& group = i >= state.num_dense ? groups.edp : groups.dp;
        const comm::ShardRange shard =
            state.distributed ? comm::shard_of(p->master.numel(), group.size(), group.rank())
                              : comm::ShardRange{0, p->master.numel()};
        state.shard.push_back(shard);
        state.exp_avg.emplace_back(static_cast<size_t>(shard.size()), 0.0f);
        state.exp_avg_sq.emplace_back(static_cast<size_t>(shard.size()), 0.0f);
    }
    state.grad_squares.resize(state.params.size());
    state.first_nonfinite = state.params.size();
    return state;
}

bool OptimizerState::tp_summed_param(const Param* p) const {
    return std::binary_search(tp_summed.begin(), tp_summed.end(), p);
}

void set_tensor_parallel(OptimizerState& state, const std::vector<Param*>& summed,
                         const std::vector<Param*>& replicated) {
    state.tp_summed.assign(summed.begin(), summed.end());
    std::sort(state.tp_summed.begin(), state.tp_summed.end());
    state.tp_replicated.clear();
    if (summed.empty() && replicated.empty())
        return;
    state.tp_replicated.assign(state.num_dense, false);
    for (size_t i = 0; i < state.num_dense; ++i) {
        state.tp_replicated[i] =
            std::find(replicated.begin(), replicated.end(), state.params[i]) != replicated.end();
    }
    for (const Param* p : summed) {
        const auto it = std::find(state.params.begin(), state.params.begin() + state.num_dense, p);
        EPO_CHECK(it != state.params.begin() + state.num_dense &&
                      state.tp_replicated[static_cast<size_t>(it - state.params.begin())],
                  "TP-summed parameter {} is not a replicated dense parameter", p->name);
    }
}

void reduce_grads(const OptimizerState& state, const std::vector<Param*>& dense,
                  const std::vector<Param*>& expert, comm::ProcessGroups& groups) {
    auto grad_of = [](Param* p) {
        return std::span(p->main_grad.data<float>(), static_cast<size_t>(p->main_grad.numel()));
    };
    // Why first: the DP sum (or reduce-scatter) must add whole-sequence gradients; the TP ranks'
    // shares are summed before, so both optimizers see the same sums.
    if (groups.tp.size() > 1) {
        for (Param* p : dense) {
            if (state.tp_summed_param(p))
                groups.tp.all_reduce_sum(grad_of(p));
        }
    }
    for (auto [params, group] : {std::pair{&dense, &groups.dp}, std::pair{&expert, &groups.edp}}) {
        if (group->size() <= 1)
            continue;
        for (Param* p : *params) {
            if (state.distributed)
                group->reduce_scatter_sum(grad_of(p));
            else
                group->all_reduce_sum(grad_of(p));
        }
    }
}

void sum_embedding_grads(const OptimizerState& state, size_t i, comm::ProcessGroups& groups) {
    EPO_CHECK(groups.embedding.has_value() && i < state.num_dense,
              "the embedding copies' sum on a rank outside the embedding group (parameter {})", i);
    Param& p = *state.params[i];
    const comm::ShardRange shard = state.shard[i];
    groups.embedding->all_reduce_sum(
        std::span(p.main_grad.data<float>() + shard.begin, static_cast<size_t>(shard.size())));
}

void gather_params(const std::vector<Param*>& dense, const std::vector<Param*>& expert,
                   comm::ProcessGroups& groups) {
    for (auto [params, group] : {std::pair{&dense, &groups.dp}, std::pair{&expert, &groups.edp}}) {
        if (group->size() <= 1)
            continue;
        for (Param* p : *params) {
            group->all_gather_shards(p->compute.raw(), p->compute.numel(),
                                     dtype_size(p->compute.dtype()));
            ++p->version;  // derived copies (packed expert weights) rebuild themselves
        }
    }
}

void square_grads(OptimizerState& state, const std::vector<size_t>& params,
                  comm::ProcessGroups& groups) {
    const float inv_dp = 1.0f / static_cast<float>(state.dp_size);
    for (size_t i : params) {
        Param& p = *state.params[i];
        const comm::Communicator& group = state.group_of(i, groups);
        const int g = group.size();
        float* grad = p.main_grad.data<float>();
        std::vector<double>& sq = state.grad_squares[i];
        sq.assign(static_cast<size_t>(g), 0.0);
        bool finite = true;
        // One sum per shard of the group even when this rank reduced all of it (the plain
        // optimizer), so that both optimizers add the same terms.
        for (int r = 0; r < g; ++r) {
            if (state.distributed && r != group.rank())
                continue;  // that shard's owner takes it
            const comm::ShardRange range = comm::shard_of(p.main_grad.numel(), g, r);
            sq[static_cast<size_t>(r)] = scale_and_sum_squares(
                grad + range.begin, static_cast<size_t>(range.size()), inv_dp);
            finite = finite && std::isfinite(sq[static_cast<size_t>(r)]);
        }
        // A sum that overflowed from finite values names no parameter (nonfinite.h).
        if (!finite && !first_nonfinite_grad({&p}, {state.shard[i]}).empty())
            state.first_nonfinite = std::min(state.first_nonfinite, i);
    }
}

void finish_grad_norm(OptimizerState& state, comm::ProcessGroups& groups,
                      OptimizerStepResult& result) {
    result.grad_norm = global_grad_norm(state, groups);
    // square_grads noted the parameters with a NaN or an Inf in their reduced elements before
    // any update cleared them (without clipping the updates may come before this norm).
    if (!std::isfinite(result.grad_norm) && state.first_nonfinite < state.params.size()) {
        const size_t i = state.first_nonfinite;
        result.first_nonfinite_grad = state.params[i]->name;
    }
    state.first_nonfinite = state.params.size();
}

void update_params(OptimizerState& state, const AdamConfig& adam, int64_t step, double clip,
                   const std::vector<size_t>& params) {
    for (size_t i : params) {
        Param& p = *state.params[i];
        const comm::ShardRange shard = state.shard[i];
        adam_step_and_zero_grad(
            adam, step, p.master.rank() > 1, p.master.data<float>() + shard.begin,
            p.main_grad.data<float>() + shard.begin, clip < 1.0 ? static_cast<float>(clip) : 1.0f,
            AdamState{state.exp_avg[i].data(), state.exp_avg_sq[i].data()},
            static_cast<size_t>(shard.size()));
        if (shard.size() == p.master.numel()) {
            refresh_compute(p);
            continue;
        }
        // Distributed: the rest of the gradient held this rank's unreduced values; the compute
        // copy of this shard is fresh now, the other shards arrive by gather.
        float* grad = p.main_grad.data<float>();
        std::fill(grad, grad + shard.begin, 0.0f);
        std::fill(grad + shard.end, grad + p.main_grad.numel(), 0.0f);
        refresh_compute_range(p, shard.begin, shard.end);
    }
}

void sync_params(OptimizerState& state, const std::vector<Param*>& dense,
                 const std::vector<Param*>& expert, comm::ProcessGroups& groups) {
    if (!state.distributed)
        return;
    if (state.params_pending) {
        gather_params(dense, expert, groups);
        state.params_pending = false;
    }
    for (size_t i = 0; i < state.params.size(); ++i) {
        Param& p = *state.params[i];
        comm::Communicator& group = state.group_of(i, groups);
        if (group.size() > 1)
            group.all_gather_shards(p.master.raw(), p.master.numel(), sizeof(float));
    }
}

std::vector<std::vector<float>> full_moments(const OptimizerState& state, bool second,
                                             comm::ProcessGroups& groups) {
    std::vector<std::vector<float>> full;
    for (size_t i = 0; i < state.params.size(); ++i) {
        const Param& p = *state.params[i];
        const std::vector<float>& mine = second ? state.exp_avg_sq[i] : state.exp_avg[i];
        const comm::ShardRange shard = state.shard[i];
        std::vector<float>& f = full.emplace_back(static_cast<size_t>(p.master.numel()), 0.0f);
        std::copy(mine.begin(), mine.end(), f.begin() + shard.begin);
        if (shard.size() != p.master.numel()) {
            comm::Communicator& group = state.group_of(i, groups);
            group.all_gather_shards(f.data(), p.master.numel(), sizeof(float));
        }
    }
    return full;
}

}  // namespace epo::train
