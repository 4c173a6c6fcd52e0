// Measurements of a training run (docs/bench.md "What it measures"), aggregated over the ranks of
// the MPI job: per step the step time (the slowest rank's), stream busy times, exposed
// communication, tokens/s, model TFLOP/s per rank, peak memory; per node kind the durations and
// bytes of its tasks; and the critical-path bound with the overlap efficiency measured against it.
//
// What it deliberately does not do: time anything itself. Every number comes from the Trainer's
// StepResult and the stream task records (start/end on CLOCK_MONOTONIC, bytes moved by the
// task's collectives), or from the kernel (/proc/self/status for resident memory).
//
//   tokens/s        = global_batch_size * seq_length / step_time
//   TFLOP/s / rank  = model FLOPs of the step (train/flops.h) / step_time / ranks / 1e12
//   efficiency      = (T_base - T_overlap) / (T_base - T_bound)
//
// T_bound is the time the overlap schedule would take with perfect concurrency and no
// contention, given node durations measured in a baseline run (schedule/critical_path.h), plus
// the baseline's optimizer step, which no schedule overlaps.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "epo/comm/link_model.h"
#include "epo/runtime/stream.h"
#include "epo/schedule/schedule.h"
#include "epo/train/trainer.h"

namespace epo::bench {

// Peak resident set size of this process so far (VmHWM), in bytes; 0 where the kernel does not
// say.
int64_t peak_rss_bytes();
// Current resident set size (VmRSS), in bytes; 0 where unknown.
int64_t current_rss_bytes();
// Restarts the peak at the current size (writes "5" to /proc/self/clear_refs), so that the next
// peak_rss_bytes() covers only what follows. False where the kernel refuses.
bool reset_peak_rss();

// One rank's numbers for one step.
struct RankStepMetrics {
    double step_time_s = 0;
    double compute_busy_s = 0;
    double comm_busy_s = 0;
    double exposed_comm_s = 0;
    double comm_cpu_s = 0;  // CPU time of the comm stream's thread in its tasks
    int64_t peak_activation_bytes = 0;
    int64_t peak_rss_bytes = 0;
};

// One step over all ranks. Times are the slowest rank's (the step ends when the last rank's
// optimizer step does), busy times and memory the largest over ranks.
struct StepMetrics {
    int64_t step = 0;
    double lm_loss = 0;
    double grad_norm = 0;
    double step_time_s = 0;
    double compute_busy_s = 0;
    double comm_busy_s = 0;
    double exposed_comm_s = 0;
    double comm_cpu_s = 0;
    int64_t peak_activation_bytes = 0;
    int64_t peak_rss_bytes = 0;
    double tokens_per_s = 0;
    double tflops_per_rank = 0;
    std::vector<RankStepMetrics> ranks;  // index = world rank
};

// The work of one optimizer step over all ranks.
struct StepWork {
    double tokens = 0;       // global_batch_size * seq_length
    double flops = 0;        // model FLOPs (Trainer::step_flops)
    double timeout_s = 300;  // comm.timeout_s: the bound on gathering the step's metrics
};
StepWork step_work(const config::Config& cfg, const train::Trainer& trainer);

// Collective over MPI_COMM_WORLD: every rank passes its own step; all get the same result. A
// gather that outlives work.timeout_s ends the job (comm::watched_world_call).
StepMetrics gather_step_metrics(const StepWork& work, const train::StepResult& result);

// "mb3.layer1.dispatch.forward" -> "dispatch.forward"; "mb7.bucket0.grad_reduce" ->
// "grad_reduce"; "wait mb3" -> "wait"; a MoE chunk's "mb0.layer1.mlp.forward.chunk2" ->
// "mlp.forward"; "optimizer_step" and its pieces ("optimizer_step.update.bucket2") ->
// "optimizer_step".
std::string node_kind_of(const std::string& record_name);

// Per node kind: how many tasks, how long, how many bytes.
struct NodeStats {
    std::string stream;
    int64_t count = 0;
    double total_s = 0;
    comm::ByteCounts bytes;
};
using NodeStatsMap = std::map<std::string, NodeStats>;  // key: node kind

// Adds one step's records of this rank to `stats`.
void add_node_stats(NodeStatsMap& stats, const std::vector<runtime::TaskRecord>& records);

// Per call name ("mb0.layer1.mlp.forward"), the median duration in seconds over the steps given
// (each a step's records of this rank). Waits are left out.
using CallDurations = std::map<std::string, double>;
CallDurations median_call_durations(const std::vector<std::vector<runtime::TaskRecord>>& steps);

// The critical-path bound of `calls` on this rank: each call takes the shorter of its median
// duration in the baseline run and in the run itself (`own`); the baseline's has no contention,
// but a communication call there also holds the wait for the slowest rank to enter, which the
// overlap run partly hides. A call the baseline does not have (the input-gradient half of a
// delayed weight gradient, and the delayed weight gradient itself) gets the shorter of the whole
// backward of that node (baseline) and its two halves together (own), split in the proportion
// the run itself measured. A chunk call where the baseline ran its layer whole (chunks by
// experts run whole without overlap, W014) gets its share of the whole call's baseline time,
// in the proportion this run measured across the chunks.
//
// The optimizer step: with `optimizer` (the run's pieces, Trainer::optimizer_ops()) each piece is
// replayed where it runs (critical_path.h "tail"), at the shorter of its two medians, and
// "optimizer_step.end" after them on the compute stream: the squares of a bucket right after its
// reduction, the distributed optimizer's gathers on the comm stream after their bucket's update
// (under the optimizer step) or at the end (a compute-stream piece); a gather in the next forward
// is a call of `calls`. Without `optimizer`, the shorter of the two runs' sums of every
// "optimizer_step*" record is added at the end. Raises epo::Error (kInternal) if a duration is
// missing (a piece's in both runs).
double critical_path_bound_s(const std::vector<schedule::NodeCall>& calls,
                             const CallDurations& baseline, const CallDurations& own,
                             const std::vector<train::OptimizerOp>& optimizer = {});

// The largest `v` over the world's ranks. Collective; bounded by comm.timeout_s (`timeout_s`)
// as every wait on the other ranks.
double max_over_ranks(double v, double timeout_s);

// (T_base - T_overlap) / (T_base - T_bound); none when the bound leaves no room (T_base <=
// T_bound).
std::optional<double> overlap_efficiency(double t_base, double t_overlap, double t_bound);

struct Summary {
    double median = 0, min = 0, max = 0;
};
Summary summarize(std::vector<double> values);  // empty -> zeros

// What "identical to the baseline" is judged on: the losses alone can pass a wrong run (a
// planted reordering of gradient accumulation in overlap runs kept all 20 losses bit-identical
// at 2 micro-batches while the grad norms and the weights differed), so the grad norms of every
// step and the final parameters' checksum (train/param_checksum.h) are compared too.
struct RunBits {
    std::vector<double> losses, grad_norms;  // per step
    std::string param_checksum;              // "" when not recorded
};
struct BitComparison {
    bool losses = false, grad_norms = false, params = false;
    bool all() const { return losses && grad_norms && params; }
    // "" when all match, else what differs: "grad norms (first at step 3), final parameters".
    std::string differences;
};
// Bit for bit (memcmp of each double); an empty record or a missing checksum never matches.
BitComparison compare_bits(const RunBits& a, const RunBits& b);

}  // namespace epo::bench
