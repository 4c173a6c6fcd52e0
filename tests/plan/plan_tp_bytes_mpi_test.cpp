// The plan's TP bytes against the runtime's (issue #42): tiny-moe at TP 2 with sequence
// parallelism (TP 2 x EP 2 on 2 ranks, DP 1; TP 2 x EP 4 on 4 ranks, DP 2) trains one step with
// the baseline and with overlap, and the bytes each rank's compute nodes moved (their TP
// collectives: the gathers, reduce-scatters and the loss's, counted by the communicator) equal
// the plan's TP bytes of the same calls for env.gpu=cpu, which plans the epo runtime's dtypes (the
// forward's gathers in bf16, its reductions and every backward collective in fp32). At DP 1 the
// step moves nothing else but the dispatches and combines and the TP sums of the replicated
// parameters' gradients, so the whole step's bytes outside the all-to-alls equal the plan's
// tp_bytes_per_step, but for the gradient norm's two scalar gathers (16 bytes, not a term of the
// plan).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "epo/comm/mpi_runtime.h"
#include "epo/plan/cost_model.h"
#include "epo/plan/hardware.h"
#include "epo/plan/plan.h"
#include "epo/train/trainer.h"
#include "train/train_test_util.h"

namespace epo::plan {
namespace {

config::Config tp_bytes_config(int world, bool overlap) {
    std::vector<std::string> o = testing::tiny_shape_overrides();
    o.insert(o.end(), {"comm.gpus_per_node=" + std::to_string(world),
                       "model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
                       "model.expert_model_parallel_size=" + std::to_string(world),
                       "model.moe_aux_loss_coeff=0",
                       // Two micro-batches per data-parallel rank.
                       "train.global_batch_size=" + std::to_string(2 * 2 * (world / 2))});
    if (overlap)
        o.push_back("comm_overlap.overlap_moe_expert_parallel_comm=true");
    return testing::run_config("tiny-moe", o);
}

bool is_all_to_all(const std::string& name) {
    return name.find(".dispatch.") != std::string::npos ||
           name.find(".combine.") != std::string::npos;
}

class PlanTpBytes : public ::testing::TestWithParam<bool> {};

TEST_P(PlanTpBytes, EqualTheRuntimesCountedTpBytes) {
    const int world = comm::current_world_size();
    const config::Config cfg = tp_bytes_config(world, GetParam());
    train::Trainer t(cfg, {.keep_records = true});
    const train::StepResult r = t.step();
    int64_t compute_sent = 0, compute_received = 0, other_sent = 0;
    for (const runtime::TaskRecord& rec : r.records) {
        if (rec.stream == "compute" && rec.name.rfind("mb", 0) == 0) {
            compute_sent += rec.bytes.sent();
            compute_received += rec.bytes.received();
        } else if (!is_all_to_all(rec.name)) {
            other_sent += rec.bytes.sent();
        }
    }
    // The plan of the same configuration, for this machine (the epo runtime's TP).
    const Hardware hw = resolve_hardware("cpu", {});
    const PlanModel pm = make_plan_model(cfg, t.plan(), hw.device, false);
    double planned_compute = 0;
    for (const schedule::NodeCall& c : t.plan().calls) {
        if (schedule::stream_of(c.node) == schedule::StreamId::kCompute)
            planned_compute += node_work(pm, c).tp_bytes;
    }
    EXPECT_GT(compute_sent, 0);
    EXPECT_EQ(compute_sent, static_cast<int64_t>(planned_compute));
    EXPECT_EQ(compute_received, compute_sent);  // every TP collective is symmetric
    const ScheduleEstimate e = estimate_schedule(cfg, hw, default_params(hw.device), false);
    const OptimizerWork opt = optimizer_work(pm, t.plan());
    EXPECT_GT(opt.tp_bytes, 0);
    EXPECT_DOUBLE_EQ(e.tp_bytes_per_step, planned_compute + opt.tp_bytes);
    if (comm::current_world_rank() == 0) {
        std::printf(
            "[tp bytes] %d ranks, %s: compute nodes %lld B sent (planned %.0f), gradient "
            "sums planned %.0f B, other non-EP bytes counted %lld B\n",
            world, GetParam() ? "overlap" : "baseline", static_cast<long long>(compute_sent),
            planned_compute, opt.tp_bytes, static_cast<long long>(other_sent));
    }
    if (world == 2) {
        // DP 1 and EDP 1: outside the compute nodes and the all-to-alls, only the TP group's
        // gradient sums move bytes, and the gradient norm's two scalar gathers (its sharded
        // part over TP, the experts' squares over EP: 8 bytes each to the one other rank).
        EXPECT_EQ(other_sent, static_cast<int64_t>(opt.tp_bytes) + 16);
    }
}

INSTANTIATE_TEST_SUITE_P(Plan, PlanTpBytes, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                             return i.param ? std::string("overlap") : std::string("baseline");
                         });

}  // namespace
}  // namespace epo::plan
