#include "epo/train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include "epo/comm/mpi_runtime.h"
#include "epo/config/finalize.h"
#include "epo/schedule/executor.h"
#include "epo/train/grad_buckets.h"
#include "epo/train/nonfinite.h"

namespace epo::train {
namespace {

double seconds_between(int64_t start_ns, int64_t end_ns) {
    return (end_ns - start_ns) * 1e-9;
}

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               comm::Clock::now().time_since_epoch())
        .count();
}

// Sum over the group of one double per rank, added in group-rank order (exact and identical on
// every rank).
double group_sum(comm::Communicator& c, double local) {
    std::vector<double> all(static_cast<size_t>(c.size()));
    c.all_gather(std::span<const double>(&local, 1), std::span<double>(all));
    double s = 0;
    for (double v : all)
        s += v;
    return s;
}

bool is_injected_here(const std::optional<InjectedFailure>& f, int rank, int64_t step) {
    return f && f->rank == rank && f->step == step;
}

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

}  // namespace

std::optional<InjectedFailure> injected_failure_from_env() {
    const char* value = std::getenv("EPO_INJECT_FAILURE");
    if (value == nullptr || *value == '\0') {
        return std::nullopt;
    }
    const std::string text = value;
    const size_t a = text.find(':');
    const size_t b = a == std::string::npos ? a : text.find(':', a + 1);
    InjectedFailure f;
    try {
        if (b == std::string::npos) {
            throw std::invalid_argument("fields");
        }
        f.rank = std::stoi(text.substr(0, a));
        f.step = std::stoll(text.substr(a + 1, b - a - 1));
        f.call = text.substr(b + 1);
    } catch (const std::exception&) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("EPO_INJECT_FAILURE='{}' is not RANK:STEP:CALL (for example "
                                "1:2:mb1.layer0.combine.forward); unset it for a normal run",
                                text));
    }
    return f;
}

Trainer::Trainer(const config::Config& cfg, TrainerOptions options) : cfg_(cfg), options_(options) {
    comm::check_mpi(MPI_Comm_rank(options_.comm, &world_rank_), "MPI_Comm_rank");
    comm::check_mpi(MPI_Comm_size(options_.comm, &world_size_), "MPI_Comm_size");
    ep_size_ = cfg.model.expert_model_parallel_size;
    dp_size_ = world_size_;  // TP = PP = CP = 1 at run time (runtime-support checks)
    num_micro_batches_ = config::num_microbatches(cfg);
    overlap_ = cfg.model.overlap_moe_expert_parallel_comm;

    const comm::ParallelLayout layout{.world_size = world_size_,
                                      .expert_model_parallel_size = ep_size_,
                                      .gpus_per_node = config::gpus_per_node(cfg.comm)};
    comm::CommOptions comm_options;
    comm_options.timeout_s = cfg.comm.timeout_s;
    comm_options.link = comm::LinkModel{cfg.comm.link.inter_node_gbps.value_or(0.0),
                                        cfg.comm.link.intra_node_gbps.value_or(0.0),
                                        cfg.comm.link.latency_us.value_or(0.0)};
    streams_ = runtime::make_rank_streams(layout, comm_options, options_.comm);

    const int ep_rank = world_rank_ % ep_size_;
    model_ =
        std::make_unique<model::GptModel>(model::gpt_shape_from_config(cfg, ep_size_, ep_rank));
    model_->init_weights(static_cast<uint64_t>(cfg.train.seed));

    const comm::ProcessGroups& groups = *streams_.comm->groups();
    distributed_ =
        cfg.ddp.use_distributed_optimizer && (groups.dp.size() > 1 || groups.edp.size() > 1);
    param_gather_overlap_ = distributed_ && cfg.ddp.overlap_param_gather;
    optimizer_ = std::make_unique<OptimizerState>();
    optimizer_->params = model_->all_params();
    optimizer_->num_dense = model_->dense_params().size();
    for (size_t i = 0; i < optimizer_->params.size(); ++i) {
        const Param* p = optimizer_->params[i];
        const comm::Communicator& group = optimizer_->group_of(i, *streams_.comm->groups());
        const comm::ShardRange shard =
            distributed_ ? comm::shard_of(p->master.numel(), group.size(), group.rank())
                         : comm::ShardRange{0, p->master.numel()};
        optimizer_->shard.push_back(shard);
        optimizer_->exp_avg.emplace_back(static_cast<size_t>(shard.size()), 0.0f);
        optimizer_->exp_avg_sq.emplace_back(static_cast<size_t>(shard.size()), 0.0f);
    }

    DatasetConfig data{.type = cfg.dataset.type == config::DatasetType::kText ? "text" : "mock",
                       .path = cfg.dataset.path.value_or(""),
                       .seq_length = cfg.model.seq_length,
                       .vocab_size = cfg.model.vocab_size.value_or(0),
                       .seed = static_cast<uint64_t>(cfg.train.seed)};
    dataset_ = make_dataset(data);

    lr_ = LrScheduleConfig{.max_lr = cfg.optimizer.lr,
                           .min_lr = cfg.optimizer.min_lr,
                           .warmup_iters = cfg.train.lr_warmup_iters,
                           .decay_iters = config::lr_decay_iters(cfg),
                           .decay_style = lr_style(cfg.train.lr_decay_style)};
    adam_ = AdamConfig{.lr = cfg.optimizer.lr,
                       .beta1 = cfg.optimizer.adam_beta1,
                       .beta2 = cfg.optimizer.adam_beta2,
                       .eps = cfg.optimizer.adam_eps,
                       .weight_decay = cfg.optimizer.weight_decay};
    clip_grad_ = cfg.optimizer.clip_grad;

    const model::GptShape& s = model_->shape();
    schedule::ScheduleShape sched{static_cast<int>(num_micro_batches_), s.moe_layers,
                                  cfg.model.delay_wgrad_compute};
    plan_grad_buckets(sched);
    calls_ = overlap_ ? schedule::overlap_schedule(sched) : schedule::baseline_schedule(sched);
    injected_failure_ = injected_failure_from_env();
    if (injected_failure_ &&
        std::none_of(calls_.begin(), calls_.end(), [&](const schedule::NodeCall& c) {
            return schedule::call_name(c) == injected_failure_->call;
        })) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("EPO_INJECT_FAILURE names call '{}', which this step's schedule "
                                "does not have (names look like mb0.layer1.dispatch.forward)",
                                injected_failure_->call));
    }

    int64_t num_moe_layers = 0;
    for (bool m : s.moe_layers)
        num_moe_layers += m;
    const FlopsShape flops{.num_layers = s.num_layers,
                           .num_moe_layers = num_moe_layers,
                           .hidden_size = s.hidden,
                           .ffn_hidden_size = s.ffn_hidden,
                           .moe_ffn_hidden_size = s.moe.ffn_hidden_size,
                           .moe_shared_expert_intermediate_size = s.moe.shared_expert_size,
                           .moe_router_topk = s.moe.topk,
                           .num_attention_heads = s.attn.num_heads,
                           .num_query_groups = s.attn.num_groups,
                           .kv_channels = s.attn.head_dim,
                           .seq_length = s.seq_length,
                           .vocab_size = s.vocab};
    step_flops_ = model_flops(flops, config::global_batch_size(cfg));
}

Trainer::~Trainer() = default;

void Trainer::plan_grad_buckets(schedule::ScheduleShape& sched) {
    const int dp = streams_.comm->groups()->dp.size();
    const int edp = streams_.comm->groups()->edp.size();
    reduce_in_buckets_ = cfg_.ddp.overlap_grad_reduce && (dp > 1 || edp > 1);
    if (!reduce_in_buckets_ && !param_gather_overlap_) {
        return;
    }
    // What each position adds to a bucket: the parameters that have a group to reduce over.
    // Indexed by position + 1 (the embedding is -1).
    const int num_layers = static_cast<int>(model_->shape().num_layers);
    std::vector<model::GptModel::PositionParams> entries;
    for (int position = schedule::kEmbeddingPosition; position <= num_layers; ++position) {
        model::GptModel::PositionParams p = model_->params_at(position);
        if (dp <= 1)
            p.dense.clear();
        if (edp <= 1)
            p.expert.clear();
        entries.push_back(std::move(p));
    }
    const auto entry = [&](int position) -> const model::GptModel::PositionParams& {
        return entries[static_cast<size_t>(position - schedule::kEmbeddingPosition)];
    };
    const auto bytes_at = [&](int position) {
        int64_t bytes = 0;
        for (const auto* list : {&entry(position).dense, &entry(position).expert})
            for (const Param* param : *list)
                bytes += param->main_grad.numel() * static_cast<int64_t>(sizeof(float));
        return bytes;
    };
    // Unset: the bucket size the configuration finalizes to for bucketed overlap (128 MiB).
    // One bucket list serves both the gradient reduction and the parameter gather, as in the
    // reference.
    const std::vector<int> ends = grad_bucket_ends(
        num_layers, bytes_at, cfg_.ddp.bucket_size.value_or(config::kDefaultBucketSize));
    if (reduce_in_buckets_)
        sched.grad_bucket_ends = ends;
    if (param_gather_overlap_)
        sched.param_bucket_ends = ends;
    size_t bucket = 0;
    buckets_.resize(ends.size());
    for (int position = num_layers; position >= schedule::kEmbeddingPosition; --position) {
        const model::GptModel::PositionParams& p = entry(position);
        GradBucket& b = buckets_[bucket];
        b.dense.insert(b.dense.end(), p.dense.begin(), p.dense.end());
        b.expert.insert(b.expert.end(), p.expert.begin(), p.expert.end());
        if (ends[bucket] == position)
            ++bucket;
    }
}

// Sums gradients over the data-parallel ranks: dense over all ranks, experts over the ranks
// holding the same experts. One blocking collective per parameter, whichever stream runs it, so
// the sums are the same with and without bucketed overlap: an all-reduce, or with the
// distributed optimizer a reduce-scatter, which sums this rank's shard exactly as the all-reduce
// does.
void Trainer::reduce_grads(const std::vector<Param*>& dense, const std::vector<Param*>& expert,
                           comm::ProcessGroups& groups) {
    auto grad_of = [](Param* p) {
        return std::span(p->main_grad.data<float>(), static_cast<size_t>(p->main_grad.numel()));
    };
    for (auto [params, group] : {std::pair{&dense, &groups.dp}, std::pair{&expert, &groups.edp}}) {
        if (group->size() <= 1)
            continue;
        for (Param* p : *params) {
            if (distributed_)
                group->reduce_scatter_sum(grad_of(p));
            else
                group->all_reduce_sum(grad_of(p));
        }
    }
}

void Trainer::gather_params(const std::vector<Param*>& dense, const std::vector<Param*>& expert,
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

double Trainer::sum_squares(size_t begin, size_t end, comm::Communicator& group, float factor) {
    const int g = group.size();
    const size_t k = end - begin;
    // parts[j * g + r]: shard r of parameter begin + j.
    std::vector<double> parts(k * static_cast<size_t>(g), 0.0);
    for (size_t j = 0; j < k; ++j) {
        Param& p = *optimizer_->params[begin + j];
        float* grad = p.main_grad.data<float>();
        for (int r = 0; r < g; ++r) {
            if (distributed_ && r != group.rank())
                continue;  // that shard's owner computes it
            const comm::ShardRange range = comm::shard_of(p.main_grad.numel(), g, r);
            parts[j * g + r] = scale_and_sum_squares(grad + range.begin,
                                                     static_cast<size_t>(range.size()), factor);
        }
    }
    if (distributed_ && g > 1) {
        std::vector<double> mine(k), all(k * static_cast<size_t>(g));
        for (size_t j = 0; j < k; ++j)
            mine[j] = parts[j * g + group.rank()];
        group.all_gather(std::span<const double>(mine), std::span<double>(all));
        for (int r = 0; r < g; ++r)
            for (size_t j = 0; j < k; ++j)
                parts[j * g + r] = all[r * k + j];
    }
    double sum = 0;
    for (double v : parts)
        sum += v;
    return sum;
}

void Trainer::sync_params() {
    if (!distributed_)
        return;
    // On the comm stream, whose communicators the in-schedule gathers use, then whole masters.
    streams_.comm->enqueue("sync_params", [this](runtime::StreamContext& ctx) {
        comm::ProcessGroups& groups = ctx.comm();
        if (params_pending_) {
            gather_params(model_->dense_params(), model_->expert_params(), groups);
            params_pending_ = false;
        }
        for (size_t i = 0; i < optimizer_->params.size(); ++i) {
            Param& p = *optimizer_->params[i];
            comm::Communicator& group = optimizer_->group_of(i, groups);
            if (group.size() > 1)
                group.all_gather_shards(p.master.raw(), p.master.numel(), sizeof(float));
        }
    });
    streams_.synchronize();
}

StepResult Trainer::step() {
    const model::GptShape& s = model_->shape();
    const int n = static_cast<int>(num_micro_batches_);
    std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(n)),
        labels(static_cast<size_t>(n));
    for (int mb = 0; mb < n; ++mb) {
        const MicroBatchPosition pos{.step = steps_done_,
                                     .micro_batch = mb,
                                     .dp_rank = world_rank_,
                                     .dp_size = dp_size_,
                                     .micro_batch_size = s.micro_batch_size,
                                     .global_batch_size = config::global_batch_size(cfg_)};
        read_micro_batch(*dataset_, pos, s.seq_length, tokens[mb], labels[mb]);
    }
    model_->begin_step(std::move(tokens), std::move(labels), 1.0f / static_cast<float>(n));
    model_->reset_activation_peak();

    StepResult result;
    result.step = steps_done_ + 1;
    const bool gather_pending = params_pending_;
    params_pending_ = false;
    const auto body = [this, gather_pending](const schedule::NodeCall& call,
                                             runtime::StreamContext& ctx) {
        if (call.node == schedule::NodeKind::kGradReduce) {
            const GradBucket& b = buckets_[static_cast<size_t>(call.layer)];
            reduce_grads(b.dense, b.expert, ctx.comm());
            return;
        }
        if (call.node == schedule::NodeKind::kParamGather) {
            // Every rank agrees whether the last step left a gather (the first step and one
            // after a checkpoint load have nothing to gather).
            if (gather_pending) {
                const GradBucket& b = buckets_[static_cast<size_t>(call.layer)];
                gather_params(b.dense, b.expert, ctx.comm());
            }
            return;
        }
        Arena& scratch = schedule::stream_of(call.node) == schedule::StreamId::kCompute
                             ? compute_scratch_
                             : comm_scratch_;
        model_->run(call, ctx.comm().ep, scratch);
    };
    const int64_t start = now_ns();
    if (is_injected_here(injected_failure_, world_rank_, steps_done_ + 1)) {
        const std::string target = injected_failure_->call;
        const int64_t step = steps_done_ + 1;
        schedule::issue_schedule(
            calls_, n, streams_,
            [&body, target, step](const schedule::NodeCall& call, runtime::StreamContext& ctx) {
                if (schedule::call_name(call) == target) {
                    throw Error(
                        ErrorKind::kComm,
                        fmt::format("injected failure (EPO_INJECT_FAILURE) in {} of step {}",
                                    target, step));
                }
                body(call, ctx);
            });
    } else {
        schedule::issue_schedule(calls_, n, streams_, body);
    }
    // The optimizer step needs every node of both streams done.
    runtime::Event comm_done("comm done");
    streams_.comm->record(comm_done);
    streams_.compute->wait(comm_done);
    streams_.compute->enqueue("optimizer_step", [this, &result](runtime::StreamContext& ctx) {
        finish_step(ctx, result);
    });
    streams_.synchronize();
    result.step_time_s = seconds_between(start, now_ns());

    for (runtime::Stream* stream : {streams_.compute.get(), streams_.comm.get()}) {
        std::vector<runtime::TaskRecord> records = stream->take_records();
        for (const runtime::TaskRecord& r : records) {
            const double d = seconds_between(r.start_ns, r.end_ns);
            if (r.kind == runtime::RecordKind::kWait) {
                if (stream == streams_.compute.get())
                    result.exposed_comm_s += d;
            } else if (stream == streams_.compute.get()) {
                result.compute_busy_s += d;
            } else {
                result.comm_busy_s += d;
                result.comm_cpu_s += static_cast<double>(r.cpu_ns) * 1e-9;
            }
        }
        if (options_.keep_records) {
            result.records.insert(result.records.end(), records.begin(), records.end());
        }
    }
    result.peak_activation_bytes = model_->peak_activation_bytes();
    ++steps_done_;
    return result;
}

// Runs on the compute stream after every node of the step.
void Trainer::finish_step(runtime::StreamContext& ctx, StepResult& result) {
    comm::ProcessGroups& groups = ctx.comm();
    const std::vector<Param*>& dense = model_->dense_params();
    const std::vector<Param*>& expert = model_->expert_params();

    // Gradients averaged over the data-parallel size: dense over all ranks, experts over the
    // ranks holding the same experts (their token contributions from the other EP ranks
    // already arrived through the all-to-all backward). With bucketed overlap the sums were
    // taken during the last backward. The averaging and the squares for the global norm are
    // one pass, in parameter order either way.
    if (!reduce_in_buckets_) {
        reduce_grads(dense, expert, groups);
    }
    // Squares per (parameter, shard) of its group, so that the distributed optimizer, which has
    // only its own shards reduced, adds the same numbers in the same order.
    const float inv_dp = 1.0f / static_cast<float>(dp_size_);
    const size_t num_params = optimizer_->params.size(), num_dense = optimizer_->num_dense;
    const double dense_sq = sum_squares(0, num_dense, groups.dp, inv_dp);
    double expert_sq = sum_squares(num_dense, num_params, groups.edp, inv_dp);

    // Global norm: dense gradients are identical on every rank; expert gradients differ across
    // the EP group, whose sum of squares is added up in rank order.
    if (groups.ep.size() > 1) {
        expert_sq = group_sum(groups.ep, expert_sq);
    }
    result.grad_norm = std::sqrt(dense_sq + expert_sq);
    if (!std::isfinite(result.grad_norm))
        result.first_nonfinite_grad = first_nonfinite_grad(optimizer_->params, optimizer_->shard);

    const double clip = clip_coefficient(result.grad_norm, clip_grad_);
    result.learning_rate = learning_rate_at(lr_, steps_done_ + 1);
    AdamConfig adam = adam_;
    adam.lr = result.learning_rate;
    for (size_t i = 0; i < optimizer_->params.size(); ++i) {
        Param& p = *optimizer_->params[i];
        const comm::ShardRange shard = optimizer_->shard[i];
        adam_step_and_zero_grad(
            adam, steps_done_ + 1, p.master.rank() > 1, p.master.data<float>() + shard.begin,
            p.main_grad.data<float>() + shard.begin, clip < 1.0 ? static_cast<float>(clip) : 1.0f,
            AdamState{optimizer_->exp_avg[i].data(), optimizer_->exp_avg_sq[i].data()},
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
    if (distributed_) {
        if (param_gather_overlap_)
            params_pending_ = true;  // the next step's first forward gathers, bucket by bucket
        else
            gather_params(dense, expert, groups);
    }

    // Expert-bias updates from the step's token counts over all data-parallel ranks.
    const model::GptShape& s = model_->shape();
    double aux_sum = 0;
    int64_t num_moe_layers = 0;
    for (int64_t l = 0; l < s.num_layers; ++l) {
        if (!s.moe_layers[static_cast<size_t>(l)])
            continue;
        ++num_moe_layers;
        const model::LayerStepStats& stats = model_->layer_stats()[static_cast<size_t>(l)];
        aux_sum += stats.aux_loss;
        moe::RouterParams& router = model_->layer(static_cast<int>(l)).moe.router;
        if (s.moe.enable_expert_bias && router.expert_bias.defined()) {
            std::vector<int64_t> all(stats.routed_counts.size() *
                                     static_cast<size_t>(groups.dp.size()));
            groups.dp.all_gather(std::span<const int64_t>(stats.routed_counts),
                                 std::span<int64_t>(all));
            std::vector<int64_t> total(stats.routed_counts.size(), 0);
            for (size_t i = 0; i < all.size(); ++i)
                total[i % total.size()] += all[i];
            moe::update_expert_bias(router.expert_bias, total, s.moe.expert_bias_update_rate);
        }
    }

    // Losses: this rank's micro-batch mean, then the mean over data-parallel ranks.
    double lm = 0;
    for (const model::MicroBatchResult& r : model_->results())
        lm += r.lm_loss;
    lm /= static_cast<double>(model_->results().size());
    result.lm_loss = group_sum(groups.dp, lm) / groups.dp.size();
    if (num_moe_layers > 0 && s.moe.aux_loss_coeff > 0) {
        const double local = aux_sum / s.moe.aux_loss_coeff /
                             (static_cast<double>(num_moe_layers) * num_micro_batches_);
        result.load_balancing_loss = group_sum(groups.dp, local) / groups.dp.size();
    }
}

}  // namespace epo::train
