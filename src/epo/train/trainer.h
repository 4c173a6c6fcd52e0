// The training loop of one rank, each step: the micro-batches' data, the step plan
// (step_plan.h: baseline, or the combined-1F1B overlap schedule when
// overlap_moe_expert_parallel_comm is on) issued to the compute and comm streams, then the
// optimizer step's pieces in the order of optimizer_schedule.h (optimizer.h: reduction, norm,
// clipping, AdamW, gathers; each bucket's squares as soon as its reduction is done, each bucket's
// gather right after its update with overlap_param_gather_with_optimizer_step), then on the
// compute stream the expert-bias update and the step's loss reduction.
//
// Every rank runs the same Trainer; collectives go through each stream's own communicators. With
// pipeline parallelism (docs/pipeline.md) a rank runs its stage's part of the model and of the
// schedule; losses come from the last stage and the grad norm is summed over the whole model in
// one order, so the results equal PP = 1's with the same data-parallel size, bit for bit.
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
#include "epo/schedule/executor.h"
#include "epo/schedule/schedule.h"
#include "epo/train/dataset.h"
#include "epo/train/fault_injection.h"
#include "epo/train/flops.h"
#include "epo/train/optimizer.h"
#include "epo/train/optimizer_schedule.h"
#include "epo/train/run_plan.h"
#include "epo/train/step_plan.h"

namespace epo::train {

struct StepResult {
    int64_t step = 0;                           // optimizer step just done, from 1
    double lm_loss = 0;                         // mean over micro-batches and data-parallel ranks
    std::optional<double> mtp_loss;             // the MTP head's loss, averaged as lm_loss
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

class Trainer {
public:
    // `cfg` must be finalized and valid for the runtime; MPI must be running. Collective: every
    // rank constructs its Trainer at the same point.
    Trainer(const config::Config& cfg, TrainerOptions options = {});
    // A run resolved ahead (run_plan.h) for this rank of options.comm.
    Trainer(const RunPlan& run, TrainerOptions options = {});
    ~Trainer();
    Trainer(const Trainer&) = delete;
    Trainer& operator=(const Trainer&) = delete;

    StepResult step();

    int64_t steps_done() const { return steps_done_; }
    bool overlap() const { return plan_.overlap; }
    model::GptModel& model() { return *model_; }
    const model::GptShape& shape() const { return model_->shape(); }
    int world_rank() const { return world_rank_; }
    int world_size() const { return world_size_; }
    // Pipeline parallelism: this rank's stage (0 without PP) and its place inside the stage (its
    // data-parallel rank at TP 1; the world rank without PP).
    int stage() const { return stage_; }
    int rank_in_stage() const { return rank_in_stage_; }
    int64_t num_micro_batches() const { return num_micro_batches_; }
    // Model FLOPs of one step over all ranks (reference formula).
    double step_flops() const { return step_flops_; }
    // The node calls one step issues (for traces and the critical-path bound).
    const std::vector<schedule::NodeCall>& schedule_calls() const { return plan_.calls; }
    const StepPlan& plan() const { return plan_; }
    // The optimizer step's pieces in issue order (optimizer_schedule.h).
    const std::vector<OptimizerOp>& optimizer_ops() const { return optimizer_ops_; }

    // Between steps, the distributed optimizer leaves each rank the current fp32 masters of its
    // own shards only, and (with ddp.overlap_param_gather) the other shards' compute copies for
    // the next step to gather. After sync_params() every rank holds every master and compute
    // copy in full. Collective (every rank, between steps); a no-op without the distributed
    // optimizer.
    void sync_params();
    bool distributed_optimizer() const { return optimizer_.distributed; }

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
    // A resolved bucket of the plan: the parameters its reduction / gather covers, and their
    // indices in the optimizer's parameter list.
    struct ParamBucket {
        std::vector<Param*> dense, expert;
        std::vector<size_t> params;
    };
    void issue_optimizer_step(const schedule::IssuedEvents& issued, StepResult& result);
    const std::vector<size_t>& unit_params(int unit) const;
    void finish_step(runtime::StreamContext& ctx, StepResult& result);
    schedule::NodeBody node_body(bool gather_pending);
    void add_stream_records(StepResult& result);
    void transfer(const schedule::NodeCall& call, comm::ProcessGroups& groups);
    void set_norm_slots();
    double load_balancing_sum(comm::ProcessGroups& groups) const;

    config::Config cfg_;
    TrainerOptions options_;
    int world_rank_ = 0;
    int world_size_ = 1;
    int stage_ = 0;
    int rank_in_stage_ = 0;
    int dp_rank_ = 0;  // the DP coordinate (groups.dp's rank): which micro-batches it reads
    int64_t num_micro_batches_ = 1;
    int64_t steps_done_ = 0;
    double step_flops_ = 0;

    StepPlan plan_;
    std::vector<ParamBucket> buckets_;        // plan_.buckets with their parameters
    std::vector<size_t> unbucketed_;          // optimizer parameters in no bucket
    std::vector<OptimizerOp> optimizer_ops_;  // the optimizer step, in issue order
    runtime::RankStreams streams_;
    Arena compute_scratch_{"compute scratch"};
    Arena comm_scratch_{"comm scratch"};
    std::unique_ptr<model::GptModel> model_;
    OptimizerConfig optimizer_config_;
    OptimizerState optimizer_;
    std::unique_ptr<Dataset> dataset_;
    std::optional<InjectedFailure> injected_failure_;
};

}  // namespace epo::train
