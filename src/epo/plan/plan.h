// `epo plan` as a library function: the predicted step of each schedule of a finalized
// configuration on given hardware, before anything runs (docs/plan.md).
//
// For each schedule (baseline, overlap, overlap+delay_wgrad as `epo bench` names them, and, with
// the flex dispatcher selected, flex and flex+overlap+delay_wgrad): the runtime's own step plan
// (train/step_plan.h: the node calls in issue order and the gradient / parameter buckets), each
// call's duration from the cost model (cost_model.h), and the runtime's two-stream replay
// (schedule/critical_path.h) for the step:
//
//   step     = max(replay end, the host's launches of every call) + optimizer step
//   compute  = sum of compute-call durations + the optimizer step (the compute stream's busy time)
//   comm     = sum of comm-call durations
//   exposed  = step - compute (the compute stream waiting for the comm stream)
//
// Compute and communication sharing the device: each call takes base * (1 + overlap_slowdown *
// the share of its span the other stream is busy), found by replaying three times (the spans
// move as calls lengthen).
//
// Flex (docs/flex.md) is planned from its deduplicated inter-node bytes, as the flex dispatcher
// sends them.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "epo/config/config.h"
#include "epo/plan/cost_model.h"
#include "epo/plan/expert_load.h"
#include "epo/plan/gpu_memory.h"
#include "epo/plan/hardware.h"

namespace epo::plan {

struct PlanOptions {
    Hardware hardware;
    CostParams params;
    // Set the network as `epo bench --comm_compute_ratio R` sets its link model: one bandwidth
    // (inter-node; intra-node on one node) so that the baseline's communication takes R times
    // its compute.
    std::optional<double> comm_compute_ratio;
    // The routing's expert load (expert_load.h): balanced unless given.
    ExpertLoadImbalance expert_load;
};

struct ScheduleEstimate {
    std::string name;  // "baseline", "overlap", "overlap+delay_wgrad", "flex", ...
    bool overlap = false, delay_wgrad = false, flex = false;
    double step_time_s = 0;
    double compute_s = 0, comm_s = 0, exposed_comm_s = 0;
    double alltoall_s = 0;   // of comm_s: dispatch and combine
    double optimizer_s = 0;  // of compute_s
    double tokens_per_s = 0, tflops_per_gpu = 0;
    // Per rank: on a GPU Megatron-Core's layout at its busiest stage (gpu_memory.h), on cpu the
    // epo runtime's (config/memory_estimate.h).
    int64_t peak_memory_bytes = 0;
    StageMemory memory_stage;        // GPU: the busiest stage's parts
    bool fits = true;                // within the device's memory less the plan's headroom
    int64_t extra_memory_bytes = 0;  // over the baseline's
    std::optional<double> speedup;   // baseline step / this step
    size_t num_calls = 0;
    int busiest_stage = 0;         // PP > 1: the stage whose step is the longest
    double host_launch_s = 0;      // the host's launches of every call of the step
    bool host_bound = false;       // they, not the GPU, end the step
    double pipeline_bubble_s = 0;  // of step_time_s: the pipeline's fill and drain
    // Bytes this rank sends over its TP group per step: the gathers, reduce-scatters (or
    // all-reduces) and the loss's collectives of the compute calls, and the TP sums of the
    // replicated parameters' gradients (what `epo bench` counts on the tp communicator).
    double tp_bytes_per_step = 0;
    // Seconds per step by node kind ("mlp.backward", "grad_reduce", ...: epo bench's `nodes`).
    std::map<std::string, double> node_seconds;
};

struct PlanResult {
    std::string model;  // recipe name or "config"
    int64_t world_size = 0;
    int num_nodes = 1, gpus_per_node = 1, ep_size = 1, dp_size = 1;
    int tp_size = 1, num_stages = 1, num_model_chunks = 1;  // TP, PP, VPP
    int64_t num_micro_batches = 0;
    double step_flops = 0, step_tokens = 0;
    Hardware hardware;  // as used (the ratio's bandwidth set)
    CostParams params;
    std::vector<ScheduleEstimate> runs;
    bool pair_edges = false;                // the overlap schedules pair the step's edges
    ExpertLoadImbalance expert_load;        // as used
    std::vector<double> load_imbalance;     // per MoE layer, as used
    std::optional<double> overlap_speedup;  // baseline / "overlap"
    std::string verdict;                    // "pays", "marginal", "does not pay"
    // Share of the device's memory kept for what the memory model does not count (CUDA
    // context, NCCL / DeepEP buffers, allocator fragmentation).
    double memory_headroom = 0.10;
    std::string reason;
    std::vector<std::string> notes;  // memory that does not fit, flex runtime, ratio calibration
};

// The replay with the slowdown applied (the formulas above, before the optimizer step):
// `base_s(call)` the call's duration alone.
struct Replay {
    double end_s = 0;      // the last call's end
    double compute_s = 0;  // compute-call durations, slowed
    double comm_s = 0;
    std::vector<double> durations_s;  // per call, slowed
};
Replay replay_schedule(const std::vector<schedule::NodeCall>& calls,
                       const std::function<double(const schedule::NodeCall&)>& base_s,
                       double overlap_slowdown);

struct Calibration;

// The hardware and efficiencies `epo plan` (and Python's epo.plan) plan `cfg` with: the device of
// env.gpu with `overrides` applied, the family's default efficiencies or `calibration`'s, and on
// env.gpu=cpu without a network in `overrides`, the configuration's link model (comm.link.*) as
// the network, which holds exactly its time (link efficiency 1).
PlanOptions plan_options(const config::Config& cfg, const HardwareOverrides& overrides = {},
                         const Calibration* calibration = nullptr);

// `cfg` finalized and valid for its target, topology stated. kConfig for a model without
// experts (nothing to overlap), naming the field and the fix, and for a measured expert load that
// does not fit the model (another count of MoE layers, an imbalance above the EP size).
PlanResult make_plan(const config::Config& cfg, const PlanOptions& options);

// One schedule of `cfg` as it stands (its overlap flags as set), for tests and make_plan.
ScheduleEstimate estimate_schedule(const config::Config& cfg, const Hardware& hardware,
                                   const CostParams& params, bool flex,
                                   const ExpertLoadImbalance& load = {});

}  // namespace epo::plan
