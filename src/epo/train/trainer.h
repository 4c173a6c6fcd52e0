// The training loop of one rank: data for each micro-batch, the step's schedule (baseline, or
// the combined-1F1B overlap schedule when overlap_moe_expert_parallel_comm is on) issued to the
// compute and comm streams, then on the compute stream: gradient reduction over data-parallel
// groups (unless ddp.overlap_grad_reduce already reduced the gradients bucket by bucket on the
// comm stream during the last backward), global gradient norm and clipping, AdamW on fp32
// masters, fresh compute copies, expert-bias updates and the step's loss reduction.
//
// With the distributed optimizer (ddp.use_distributed_optimizer, ZeRO-1 as in Megatron-Core)
// every parameter's elements are split into one shard per rank of its data-parallel group
// (communicator.h's shard_of): gradients are reduce-scattered instead of all-reduced, each rank
// keeps Adam moments and updates masters for its shard only, and the updated compute copies are
// all-gathered: at the end of the optimizer step, or, with ddp.overlap_param_gather, bucket by
// bucket on the comm stream during the next step's first forward. The sums, the norm and the
// updates are the same operations on the same values, so the distributed optimizer is bit-for-bit
// the plain one (docs/design.md).
//
// Every rank runs the same Trainer; collectives go through each stream's own communicators.
// Both schedules run the same nodes, kernels and collectives in the same per-parameter order, so
// losses and parameters are bit-identical between them (docs/design.md).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "epo/config/config.h"
#include "epo/model/gpt_model.h"
#include "epo/runtime/rank_streams.h"
#include "epo/schedule/schedule.h"
#include "epo/train/adam.h"
#include "epo/train/dataset.h"
#include "epo/train/flops.h"
#include "epo/train/lr_schedule.h"

namespace epo::train {

struct StepResult {
    int64_t step = 0;                           // optimizer step just done, from 1
    double lm_loss = 0;                         // mean over micro-batches and data-parallel ranks
    std::optional<double> load_balancing_loss;  // mean aux loss / coeff over MoE layers
    double grad_norm = 0;                       // before clipping
    double learning_rate = 0;
    double step_time_s = 0;     // issue of the first node to the end of the optimizer step
    double compute_busy_s = 0;  // this rank's streams
    double comm_busy_s = 0;
    double exposed_comm_s = 0;  // time the compute stream waited for the comm stream
    double comm_cpu_s = 0;      // CPU time of the comm stream's thread in its tasks
    int64_t peak_activation_bytes = 0;
    std::vector<runtime::TaskRecord> records;  // both streams' tasks and waits (this rank)
    // When grad_norm is not finite: this rank's first parameter whose gradient holds a NaN or an
    // Inf ("" when none does), found before the gradients are cleared.
    std::string first_nonfinite_grad;
};

struct TrainerOptions {
    bool keep_records = false;  // fill StepResult::records (for traces)
    // The job's ranks: the config's world. A sub-communicator lets one MPI job run several
    // trainers side by side (tests comparing world sizes, a harness's reference run).
    MPI_Comm comm = MPI_COMM_WORLD;
};

// Fault injection for failure tests: the environment variable EPO_INJECT_FAILURE=RANK:STEP:CALL
// (CALL a schedule::call_name such as "mb1.layer0.combine.forward") makes that node throw on
// that rank in that step, so tests can check that one failing rank ends the whole job with a
// message. Unset (the normal case), nothing is checked.
struct InjectedFailure {
    int rank = -1;
    int64_t step = 0;
    std::string call;
};
// The parsed variable, or nullopt when unset. A malformed value is an epo::Error (kUsage).
std::optional<InjectedFailure> injected_failure_from_env();

class Trainer {
public:
    // `cfg` must be finalized and valid for the runtime; MPI must be running. Collective: every
    // rank constructs its Trainer at the same point.
    Trainer(const config::Config& cfg, TrainerOptions options = {});
    ~Trainer();
    Trainer(const Trainer&) = delete;
    Trainer& operator=(const Trainer&) = delete;

    StepResult step();

    int64_t steps_done() const { return steps_done_; }
    bool overlap() const { return overlap_; }
    model::GptModel& model() { return *model_; }
    const model::GptShape& shape() const { return model_->shape(); }
    int world_rank() const { return world_rank_; }
    int world_size() const { return world_size_; }
    int64_t num_micro_batches() const { return num_micro_batches_; }
    // Model FLOPs of one step over all ranks (reference formula).
    double step_flops() const { return step_flops_; }
    // The node calls one step issues (for traces and the critical-path bound).
    const std::vector<schedule::NodeCall>& schedule_calls() const { return calls_; }

    // Between steps, the distributed optimizer leaves each rank the current fp32 masters of its
    // own shards only, and (with ddp.overlap_param_gather) the other shards' compute copies for
    // the next step to gather. After sync_params() every rank holds every master and compute
    // copy in full. Collective (every rank, between steps); a no-op without the distributed
    // optimizer.
    void sync_params();
    bool distributed_optimizer() const { return distributed_; }

    // Checkpoints (trainer_state.cpp, format in checkpoint/checkpoint.h). Both are collective
    // over `world` (every rank, between steps, on the thread that calls step()).
    // Saves fp32 masters, Adam moments, expert biases, the step and the data position to
    // <save_dir>/iter_<steps_done()>, and returns that directory. The files hold whole tensors
    // whether or not the optimizer is distributed (its shards are gathered first), so either
    // kind of run resumes from either kind of checkpoint.
    std::filesystem::path save_checkpoint(const std::filesystem::path& save_dir,
                                          comm::Communicator& world);
    // Restores a state saved by save_checkpoint() (`checkpoint_dir` is one iter_* directory), so
    // that the following steps are bit-identical to those of the run that saved it. Refuses, on
    // every rank and before changing anything, a checkpoint of another layout or configuration
    // and a missing, truncated or corrupt file.
    void load_checkpoint(const std::filesystem::path& checkpoint_dir, comm::Communicator& world);

private:
    struct OptimizerState {
        std::vector<Param*> params;  // dense, then expert
        size_t num_dense = 0;        // params[i] is an expert parameter (group edp) from here on
        comm::Communicator& group_of(size_t i, comm::ProcessGroups& groups) const {
            return i >= num_dense ? groups.edp : groups.dp;
        }
        // The elements this rank updates: its shard when the optimizer is distributed over a
        // group of 2 or more, else all of them.
        std::vector<comm::ShardRange> shard;
        std::vector<std::vector<float>> exp_avg, exp_avg_sq;  // [param](shard size) Adam m, v
    };
    struct GradBucket {
        std::vector<Param*> dense, expert;
    };
    void finish_step(runtime::StreamContext& ctx, StepResult& result);
    void plan_grad_buckets(schedule::ScheduleShape& sched);
    void reduce_grads(const std::vector<Param*>& dense, const std::vector<Param*>& expert,
                      comm::ProcessGroups& groups);
    // Sum of squares of the gradients of params[begin, end) (one group), scaled by `factor`,
    // added in (parameter, shard) order so that both optimizers get the same bits.
    double sum_squares(size_t begin, size_t end, comm::Communicator& group, float factor);
    // Distributed optimizer: the compute copies of `dense` / `expert` gathered from every shard.
    void gather_params(const std::vector<Param*>& dense, const std::vector<Param*>& expert,
                       comm::ProcessGroups& groups);
    // Whole-tensor Adam moments for a checkpoint: the state itself, or every shard gathered.
    std::vector<std::vector<float>> full_moments(bool second, comm::ProcessGroups& groups) const;

    config::Config cfg_;
    TrainerOptions options_;
    int world_rank_ = 0;
    int world_size_ = 1;
    int ep_size_ = 1;
    int dp_size_ = 1;
    int64_t num_micro_batches_ = 1;
    bool overlap_ = false;
    bool distributed_ = false;           // distributed optimizer over a group of 2 or more
    bool param_gather_overlap_ = false;  // gathers run in the next step's first forward
    bool params_pending_ = false;        // compute copies wait for that gather
    int64_t steps_done_ = 0;
    double step_flops_ = 0;

    runtime::RankStreams streams_;
    Arena compute_scratch_{"compute scratch"};
    Arena comm_scratch_{"comm scratch"};
    std::unique_ptr<model::GptModel> model_;
    std::unique_ptr<OptimizerState> optimizer_;
    std::unique_ptr<Dataset> dataset_;
    LrScheduleConfig lr_;
    AdamConfig adam_;
    double clip_grad_ = 1.0;
    std::vector<schedule::NodeCall> calls_;
    std::vector<GradBucket> buckets_;  // in backward order (ScheduleShape::bucket_ends)
    bool reduce_in_buckets_ = false;   // else the optimizer step reduces the gradients
    std::optional<InjectedFailure> injected_failure_;
};

}  // namespace epo::train
