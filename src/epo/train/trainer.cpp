#include "epo/train/trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <memory>
#include <span>
#include <unordered_map>

#include "epo/comm/mpi_runtime.h"
#include "epo/config/finalize.h"
#include "epo/schedule/executor.h"
#include "epo/train/expert_bias_update.h"

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

}  // namespace

namespace {

RunPlan resolve_for(const config::Config& cfg, MPI_Comm comm) {
    int rank = 0, size = 0;
    comm::check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
    comm::check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
    return resolve_run(cfg, size, rank);
}

}  // namespace

Trainer::Trainer(const config::Config& cfg, TrainerOptions options)
    : Trainer(resolve_for(cfg, options.comm), options) {}

Trainer::Trainer(const RunPlan& run, TrainerOptions options)
    : cfg_(run.cfg),
      options_(options),
      world_rank_(run.world_rank),
      world_size_(run.world_size),
      stage_(run.stage),
      rank_in_stage_(run.rank_in_stage),
      num_micro_batches_(run.num_micro_batches),
      step_flops_(run.step_flops),
      plan_(run.step),
      optimizer_config_(run.optimizer) {
    // The injection check before any collective work, so a refusal happens on every rank.
    injected_failure_ = injected_failure_from_env();
    if (injected_failure_) {
        // Checked against the targeted rank's stage's calls, identically on every rank.
        const int target = injected_failure_->rank;
        const bool staged =
            run.groups.pipeline_model_parallel_size > 1 && target >= 0 && target < world_size_;
        check_injected_failure(
            *injected_failure_, world_size_, cfg_.train.train_iters,
            staged ? plan_.stage_calls[static_cast<size_t>(target / run.stage_size)] : plan_.calls);
    }
    streams_ = runtime::make_rank_streams(run.groups, run.comm, options_.comm);
    const comm::ProcessGroups& groups = *streams_.comm->groups();
    EPO_CHECK(plan_.dp_size == groups.dp.size() && plan_.edp_size == groups.edp.size(),
              "the step plan's DP {} / EDP {} are the groups' {} / {}", plan_.dp_size,
              plan_.edp_size, groups.dp.size(), groups.edp.size());

    // The data rank is the DP coordinate: the TP ranks of a DP rank read the same micro-batches.
    dp_rank_ = groups.dp.rank();

    model_ = std::make_unique<model::GptModel>(run.shape);
    model_->init_weights(static_cast<uint64_t>(cfg_.train.seed));
    optimizer_ = make_optimizer_state(model_->dense_params(), model_->expert_params(), groups,
                                      optimizer_config_);
    set_tensor_parallel(optimizer_, model_->tp_summed_params(), model_->tp_replicated_params());
    EPO_CHECK_EQ(optimizer_.distributed, plan_.distributed_optimizer);
    if (run.groups.pipeline_model_parallel_size > 1)
        set_norm_slots();
    // The plan's buckets with this model's parameters, position by position in backward order;
    // only those with a group to reduce over take part.
    std::unordered_map<const Param*, size_t> index_of;
    for (size_t i = 0; i < optimizer_.params.size(); ++i)
        index_of[optimizer_.params[i]] = i;
    std::vector<bool> in_bucket(optimizer_.params.size(), false);
    for (const PlanBucket& planned : plan_.buckets) {
        ParamBucket& b = buckets_.emplace_back();
        for (int position : planned.positions) {
            const model::GptModel::PositionParams p = model_->params_at(position);
            // At DP 1 a bucket still takes the gradients the TP group sums (reduce_grads).
            for (Param* d : p.dense) {
                if (plan_.dp_size > 1 || optimizer_.tp_summed_param(d))
                    b.dense.push_back(d);
            }
            if (plan_.edp_size > 1)
                b.expert.insert(b.expert.end(), p.expert.begin(), p.expert.end());
        }
        for (const std::vector<Param*>* group : {&b.dense, &b.expert}) {
            for (const Param* p : *group) {
                b.params.push_back(index_of.at(p));
                in_bucket[b.params.back()] = true;
            }
        }
    }
    for (size_t i = 0; i < in_bucket.size(); ++i) {
        if (!in_bucket[i])
            unbucketed_.push_back(i);
    }
    optimizer_ops_ = train::optimizer_ops(OptimizerShape{
        .num_buckets = static_cast<int>(buckets_.size()),
        .has_unbucketed = !unbucketed_.empty(),
        .buckets_reduced = plan_.reduce_in_buckets,
        .clip = optimizer_config_.clip_grad > 0,
        .gather_each_bucket = optimizer_.distributed && plan_.param_gather_in_optimizer,
        .gather_at_end = optimizer_.distributed && !plan_.param_gather_overlap,
        .embedding_grads = model_->embedding_copy() != nullptr});

    dataset_ = make_dataset(run.data);
}

Trainer::~Trainer() = default;

// Each parameter's index in the whole model's dense / expert order (optimizer.h): positions -1
// to L in turn, each with as many parameters as step_plan's param_sizes_at lists for it.
void Trainer::set_norm_slots() {
    const model::GptShape& s = model_->shape();
    std::unordered_map<const Param*, int> slot_of;
    int dense = 0, expert = 0;
    for (int position = schedule::kEmbeddingPosition; position <= s.num_layers; ++position) {
        const PositionParamSizes sizes = param_sizes_at(s, position);
        const model::GptModel::PositionParams held = model_->params_at(position);
        if (s.holds(position)) {
            EPO_CHECK(held.dense.size() == sizes.dense.size() &&
                          held.expert.size() == sizes.expert.size(),
                      "position {} holds {} + {} parameters, the plan counts {} + {}", position,
                      held.dense.size(), held.expert.size(), sizes.dense.size(),
                      sizes.expert.size());
            for (size_t i = 0; i < held.dense.size(); ++i)
                slot_of[held.dense[i]] = dense + static_cast<int>(i);
            for (size_t i = 0; i < held.expert.size(); ++i)
                slot_of[held.expert[i]] = expert + static_cast<int>(i);
        }
        dense += static_cast<int>(sizes.dense.size());
        expert += static_cast<int>(sizes.expert.size());
    }
    optimizer_.norm_slots.clear();
    for (const Param* p : optimizer_.params)
        optimizer_.norm_slots.push_back(slot_of.at(p));
    // The last stage's embedding copy stays out of the norm: stage 0's embedding counts it.
    if (s.holds_embedding_copy()) {
        for (size_t i = 0; i < optimizer_.params.size(); ++i) {
            if (optimizer_.params[i] == model_->embedding_copy())
                optimizer_.norm_slots[i] = -1;
        }
    }
    optimizer_.num_model_dense = dense;
    optimizer_.num_model_expert = expert;
}

// A pipeline transfer: a broadcast from the sender on the link between the two stages
// (process_groups.h). Forward transfers travel on the sender's link (group rank 0 sends),
// backward ones on the receiver's (group rank 1, the later stage, sends).
void Trainer::transfer(const schedule::NodeCall& call, comm::ProcessGroups& groups) {
    using schedule::NodeKind;
    const bool forward = call.node == NodeKind::kSendForward || call.node == NodeKind::kRecvForward;
    const bool send = call.node == NodeKind::kSendForward || call.node == NodeKind::kSendBackward;
    std::optional<comm::Communicator>& link = forward == send ? groups.pp_next : groups.pp_prev;
    EPO_CHECK(link.has_value(), "{} without pipeline stages", schedule::call_name(call));
    const Tensor t = model_->transfer_tensor(call);
    link->broadcast(t.data<float>(), t.nbytes(), forward ? 0 : 1);
    model_->transfer_done(call);
}

void Trainer::sync_params() {
    if (!optimizer_.distributed)
        return;
    // On the comm stream, whose communicators the in-schedule gathers use.
    streams_.comm->enqueue("sync_params", [this](runtime::StreamContext& ctx) {
        train::sync_params(optimizer_, model_->dense_params(), model_->expert_params(), ctx.comm());
    });
    streams_.synchronize();
}

// What the executor runs for each call of the plan: a bucket's reduction or gather, or a model
// node on its stream's scratch arena.
schedule::NodeBody Trainer::node_body(bool gather_pending) {
    return [this, gather_pending](const schedule::NodeCall& call, runtime::StreamContext& ctx) {
        if (call.node == schedule::NodeKind::kGradReduce) {
            const ParamBucket& b = buckets_[static_cast<size_t>(call.layer)];
            reduce_grads(optimizer_, b.dense, b.expert, ctx.comm());
            return;
        }
        if (schedule::is_pipeline_transfer(call.node)) {
            transfer(call, ctx.comm());
            return;
        }
        if (call.node == schedule::NodeKind::kParamGather) {
            // Every rank agrees whether the last step left a gather (the first step and one
            // after a checkpoint load have nothing to gather).
            if (gather_pending) {
                const ParamBucket& b = buckets_[static_cast<size_t>(call.layer)];
                gather_params(b.dense, b.expert, ctx.comm());
            }
            return;
        }
        Arena& scratch = schedule::stream_of(call.node) == schedule::StreamId::kCompute
                             ? compute_scratch_
                             : comm_scratch_;
        model_->run(call, ctx.comm(), scratch);
    };
}

StepResult Trainer::step() {
    const model::GptShape& s = model_->shape();
    const int n = static_cast<int>(num_micro_batches_);
    const int64_t step = steps_done_ + 1;
    std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(n)),
        labels(static_cast<size_t>(n));
    for (int mb = 0; mb < n; ++mb) {
        const MicroBatchPosition pos{.step = steps_done_,
                                     .micro_batch = mb,
                                     .dp_rank = dp_rank_,
                                     .dp_size = plan_.dp_size,
                                     .micro_batch_size = s.micro_batch_size,
                                     .global_batch_size = config::global_batch_size(cfg_)};
        read_micro_batch(*dataset_, pos, s.seq_length, tokens[mb], labels[mb]);
    }
    model_->begin_step(std::move(tokens), std::move(labels), 1.0f / static_cast<float>(n));
    model_->reset_activation_peak();

    StepResult result;
    result.step = step;
    const bool gather_pending = optimizer_.params_pending;
    optimizer_.params_pending = false;
    const int64_t start = now_ns();
    const schedule::IssuedEvents issued = schedule::issue_schedule(
        plan_.calls, n, streams_,
        with_injected_failure(node_body(gather_pending), injected_failure_, world_rank_, step));
    issue_optimizer_step(issued, result);
    streams_.compute->enqueue("optimizer_step.end", [this, &result](runtime::StreamContext& ctx) {
        finish_step(ctx, result);
    });
    streams_.synchronize();
    // The next step's first forward gathers the weights bucket by bucket.
    optimizer_.params_pending = optimizer_.param_gather_overlap;
    result.step_time_s = seconds_between(start, now_ns());
    add_stream_records(result);
    result.peak_activation_bytes = model_->peak_activation_bytes();
    ++steps_done_;
    return result;
}

// Busy, exposed-wait and CPU times per stream, and (keep_records) the records themselves.
void Trainer::add_stream_records(StepResult& result) {
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
}

const std::vector<size_t>& Trainer::unit_params(int unit) const {
    return unit == kUnbucketed ? unbucketed_ : buckets_.at(static_cast<size_t>(unit)).params;
}

// The optimizer step's pieces in optimizer_ops_'s order (optimizer_schedule.h), issued like the
// schedule's calls: the issuing thread only enqueues, events order the two streams.
void Trainer::issue_optimizer_step(const schedule::IssuedEvents& issued, StepResult& result) {
    runtime::Stream& compute = *streams_.compute;
    runtime::Stream& comm = *streams_.comm;
    const int64_t step = steps_done_ + 1;
    AdamConfig adam = optimizer_config_.adam;
    adam.lr = learning_rate_at(optimizer_config_.lr, step);
    result.learning_rate = adam.lr;
    // Set by the norm's task before any update that needs it runs (the same stream, in order).
    auto clip = std::make_shared<double>(1.0);
    // Why: the norm and what follows it run after every call of the schedule on the comm stream
    // (the last reductions, transfers), as a step without bucketed work would; only the squares of
    // the buckets already reduced (and, without clipping, their updates) run before.
    runtime::Event schedule_done("schedule done");
    comm.record(schedule_done);
    std::vector<runtime::Event> updated;
    for (size_t b = 0; b < buckets_.size(); ++b)
        updated.emplace_back(fmt::format("bucket{}.updated", b));
    for (const OptimizerOp& op : optimizer_ops_) {
        const std::string name = op_name(op);
        const int unit = op.unit;
        switch (op.kind) {
            case OptimizerOpKind::kReduce:
                compute.enqueue(name, [this](runtime::StreamContext& ctx) {
                    reduce_grads(optimizer_, model_->dense_params(), model_->expert_params(),
                                 ctx.comm());
                });
                break;
            case OptimizerOpKind::kEmbeddingGrads:
                // Why: the sum reads both copies' reduced gradients; the schedule's last
                // reductions (and this stage's embedding's) are on the comm stream.
                compute.wait(schedule_done);
                compute.enqueue(name, [this](runtime::StreamContext& ctx) {
                    const Param* copy = model_->embedding_copy();
                    for (size_t i = 0; i < optimizer_.params.size(); ++i) {
                        if (optimizer_.params[i] == copy)
                            sum_embedding_grads(optimizer_, i, ctx.comm());
                    }
                });
                break;
            case OptimizerOpKind::kSquares:
                // Why: the bucket's gradients are final only once its reduction has run.
                if (op.waits_for_reduction)
                    compute.wait(issued.reduced.at(static_cast<size_t>(unit)));
                compute.enqueue(name, [this, unit](runtime::StreamContext& ctx) {
                    square_grads(optimizer_, unit_params(unit), ctx.comm());
                });
                break;
            case OptimizerOpKind::kGradNorm:
                compute.wait(schedule_done);
                compute.enqueue(name, [this, &result, clip](runtime::StreamContext& ctx) {
                    OptimizerStepResult r;
                    finish_grad_norm(optimizer_, ctx.comm(), r);
                    result.grad_norm = r.grad_norm;
                    result.first_nonfinite_grad = r.first_nonfinite_grad;
                    *clip = clip_coefficient(r.grad_norm, optimizer_config_.clip_grad);
                });
                break;
            case OptimizerOpKind::kUpdate:
                compute.enqueue(name, [this, unit, adam, step, clip](runtime::StreamContext&) {
                    update_params(optimizer_, adam, step, *clip, unit_params(unit));
                });
                if (unit != kUnbucketed)
                    compute.record(updated[static_cast<size_t>(unit)]);
                break;
            case OptimizerOpKind::kGather:
                // Why: the gather sends this rank's freshly updated shard; it waits for that
                // update only, not for the rest of the optimizer step.
                comm.wait(updated.at(static_cast<size_t>(unit)));
                comm.enqueue(name, [this, unit](runtime::StreamContext& ctx) {
                    const ParamBucket& b = buckets_[static_cast<size_t>(unit)];
                    gather_params(b.dense, b.expert, ctx.comm());
                });
                break;
            case OptimizerOpKind::kGatherAll:
                compute.enqueue(name, [this](runtime::StreamContext& ctx) {
                    gather_params(model_->dense_params(), model_->expert_params(), ctx.comm());
                });
                break;
        }
    }
}

// Runs on the compute stream after the optimizer step's updates.
void Trainer::finish_step(runtime::StreamContext& ctx, StepResult& result) {
    comm::ProcessGroups& groups = ctx.comm();
    update_expert_biases(*model_, groups.tp, groups.dp);

    // Losses: this rank's micro-batch mean, then the mean over data-parallel ranks; the
    // load-balancing loss as the mean over MoE layers and micro-batches of aux loss / coeff (under
    // sequence parallelism a rank's aux loss is its share of the micro-batch's: the TP group's
    // sum is the micro-batch's, as Megatron-Core's tracker sums over tp_cp before the DP mean).
    // With stages only the last one has losses; the pipeline group's sum adds exact zeros to
    // them, so every rank gets the last stage's bits.
    const model::GptShape& s = model_->shape();
    double lm = 0, mtp = 0;
    if (s.holds(s.num_layers)) {
        for (const model::MicroBatchResult& r : model_->results()) {
            lm += r.lm_loss;
            mtp += r.mtp_loss;
        }
        lm /= static_cast<double>(model_->results().size());
        mtp /= static_cast<double>(model_->results().size());
    }
    result.lm_loss = group_sum(groups.dp, lm) / groups.dp.size();
    if (groups.pp.size() > 1)
        result.lm_loss = group_sum(groups.pp, result.lm_loss);
    // As Megatron-Core's MTPLossLoggingHelper: the micro-batch mean, averaged over DP.
    if (s.mtp_num_layers > 0) {
        result.mtp_loss = group_sum(groups.dp, mtp) / groups.dp.size();
        if (groups.pp.size() > 1)
            result.mtp_loss = group_sum(groups.pp, *result.mtp_loss);
    }
    int64_t num_moe_layers = 0;
    for (int64_t l = 0; l < s.num_layers; ++l)
        num_moe_layers += s.moe_layers[static_cast<size_t>(l)];
    if (num_moe_layers > 0 && s.moe.aux_loss_coeff > 0) {
        double local = load_balancing_sum(groups) / s.moe.aux_loss_coeff /
                       (static_cast<double>(num_moe_layers) * num_micro_batches_);
        if (s.tp_size > 1 && s.sequence_parallel)
            local = group_sum(groups.tp, local);
        result.load_balancing_loss = group_sum(groups.dp, local) / groups.dp.size();
    }
}

// Sum over MoE layers, in layer order, of the step's aux loss; with stages each layer's value
// comes from the stage holding it (gathered over the pipeline group), so the order is PP = 1's.
double Trainer::load_balancing_sum(comm::ProcessGroups& groups) const {
    const model::GptShape& s = model_->shape();
    const auto L = static_cast<size_t>(s.num_layers);
    std::vector<double> mine(L, 0.0), all(L * static_cast<size_t>(groups.pp.size()));
    for (size_t l = 0; l < L; ++l) {
        if (s.moe_layers[l] && s.holds(static_cast<int64_t>(l)))
            mine[l] = model_->layer_stats()[l].aux_loss;
    }
    if (groups.pp.size() > 1) {
        groups.pp.all_gather(std::span<const double>(mine), std::span<double>(all));
        for (size_t l = 0; l < L; ++l)
            mine[l] = all[static_cast<size_t>(s.stage_of_layer(static_cast<int64_t>(l))) * L + l];
    }
    double sum = 0;
    for (size_t l = 0; l < L; ++l) {
        if (s.moe_layers[l])
            sum += mine[l];
    }
    return sum;
}

}  // namespace epo::train
