// The executor (executor.h) lets what the schedule says may overlap actually overlap. The results
// of a chunked run are bit-identical whether its chunks overlap or run one after another, so only
// the streams' timing can show it: here each pair of calls that the chunk pipeline puts side by
// side must be running at the same moment (a rendezvous with a deadline), which fails as soon as
// the executor chains a micro-batch's chunks.
#include "epo/schedule/executor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "epo/runtime/stream.h"
#include "epo/schedule/pipeline_schedule.h"
#include "schedule/schedule_test_util.h"

namespace epo::schedule {
namespace {

// Calls named in `pairs` wait, up to a deadline, until their partner has started too.
class Rendezvous {
public:
    Rendezvous(std::map<std::string, std::string> pairs, std::chrono::seconds deadline)
        : pairs_(std::move(pairs)), deadline_(deadline) {}

    void arrive(const std::string& name) {
        const auto it = pairs_.find(name);
        if (it == pairs_.end())
            return;
        std::unique_lock lock(mutex_);
        started_.insert(name);
        cv_.notify_all();
        if (!cv_.wait_for(lock, deadline_, [&] { return started_.count(it->second) > 0; }))
            missed_.insert(name + " never ran alongside " + it->second);
    }
    std::set<std::string> missed() const {
        std::lock_guard lock(mutex_);
        return missed_;
    }

private:
    const std::map<std::string, std::string> pairs_;
    const std::chrono::seconds deadline_;
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::set<std::string> started_, missed_;
};

std::set<std::string> run(const std::vector<NodeCall>& calls, int num_micro_batches,
                          std::map<std::string, std::string> pairs,
                          std::chrono::seconds deadline = std::chrono::seconds(10)) {
    // A pair naming a call the schedule does not hold would never wait, and pass.
    const std::vector<std::string> issued = test_util::names(calls);
    for (const auto& [name, partner] : pairs)
        test_util::position_of(issued, name);  // fails the test when missing
    Rendezvous rv(std::move(pairs), deadline);
    runtime::RankStreams streams{std::make_unique<runtime::Stream>("compute"),
                                 std::make_unique<runtime::Stream>("comm")};
    issue_schedule(
        calls, num_micro_batches, streams,
        [&](const NodeCall& call, runtime::StreamContext&) { rv.arrive(call_name(call)); });
    streams.synchronize();
    return rv.missed();
}

// Runs `calls` on two streams and returns each call's "start NAME" and "end NAME" in the order
// they happened; the calls `slow` names sleep 50 ms between the two.
std::vector<std::string> run_logged(const std::vector<NodeCall>& calls, int num_micro_batches,
                                    const std::function<bool(const NodeCall&)>& slow) {
    std::mutex mutex;
    std::vector<std::string> log;
    const auto note = [&](const std::string& what) {
        std::lock_guard lock(mutex);
        log.push_back(what);
    };
    runtime::RankStreams streams{std::make_unique<runtime::Stream>("compute"),
                                 std::make_unique<runtime::Stream>("comm")};
    issue_schedule(calls, num_micro_batches, streams,
                   [&](const NodeCall& call, runtime::StreamContext&) {
                       note("start " + call_name(call));
                       if (slow(call))
                           std::this_thread::sleep_for(std::chrono::milliseconds(50));
                       note("end " + call_name(call));
                   });
    streams.synchronize();
    return log;
}

ScheduleShape one_moe_layer(int micro_batches, int chunks) {
    ScheduleShape s{micro_batches, {true}};
    s.num_moe_chunks = chunks;
    return s;
}

// A micro-batch alone runs a layer's chunks as a pipeline (schedule.h): chunk 0's combine runs
// under chunk 1's experts, forward and backward.
TEST(Executor, ChunksOfAMicroBatchRunSideBySide) {
    const std::set<std::string> missed =
        run(overlap_schedule(one_moe_layer(1, 2)), 1,
            {{"mb0.layer0.combine.forward.chunk0", "mb0.layer0.mlp.forward.chunk1"},
             {"mb0.layer0.mlp.forward.chunk1", "mb0.layer0.combine.forward.chunk0"},
             {"mb0.layer0.dispatch.backward.chunk0", "mb0.layer0.mlp.backward.chunk1"},
             {"mb0.layer0.mlp.backward.chunk1", "mb0.layer0.dispatch.backward.chunk0"}});
    EXPECT_TRUE(missed.empty()) << *missed.begin();
}

// Two micro-batches of the combined step: one's dispatch runs under the other's compute.
TEST(Executor, MicroBatchesOfACombinedStepRunSideBySide) {
    const std::set<std::string> missed =
        run(overlap_schedule(one_moe_layer(2, 1)), 2,
            {{"mb1.layer0.dispatch.forward", "mb0.layer0.mlp.backward"},
             {"mb0.layer0.mlp.backward", "mb1.layer0.dispatch.forward"}});
    EXPECT_TRUE(missed.empty()) << *missed.begin();
}

// The check itself: calls the schedule orders one after the other never meet.
TEST(Executor, CallsInOrderOnOneChainNeverMeet) {
    const std::set<std::string> missed =
        run(baseline_schedule(one_moe_layer(1, 1)), 1,
            {{"mb0.layer0.dispatch.forward", "mb0.layer0.mlp.forward"},
             {"mb0.layer0.mlp.forward", "mb0.layer0.dispatch.forward"}},
            std::chrono::seconds(1));
    EXPECT_EQ(missed.size(), 1u);
}

// Delayed weight gradients (schedule.h): the expert wgrad computes while the dispatch backward's
// all-to-all is in flight, and a layer's attention wgrad while the next layer's combine backward's
// is, as the reference runs them; chained behind them (the micro-batch's event recorded by the
// wgrad) neither pair meets.
TEST(Executor, DelayedWeightGradientsRunBesideTheBackwardsAllToAlls) {
    ScheduleShape s{2, {true, true}};
    s.delay_wgrad = true;
    const std::set<std::string> missed =
        run(overlap_schedule(s), 2,
            {{"mb0.layer1.mlp.backward_dw", "mb0.layer1.dispatch.backward"},
             {"mb0.layer1.dispatch.backward", "mb0.layer1.mlp.backward_dw"},
             {"mb0.layer1.pre_dispatch.backward_dw", "mb0.layer0.combine.backward"},
             {"mb0.layer0.combine.backward", "mb0.layer1.pre_dispatch.backward_dw"}});
    EXPECT_TRUE(missed.empty()) << *missed.begin();
}

// ... and what reads the weight gradients still waits for them: a gradient reduction of the
// micro-batch starts only after its delayed weight gradients end (one slowed here, so that a
// reduction waiting only for the micro-batch's chain would start first).
TEST(Executor, GradientReductionWaitsForTheDelayedWeightGradients) {
    const std::vector<std::string> log =
        run_logged(test_util::delayed_expert_backward(), 1,
                   [](const NodeCall& c) { return c.phase == Phase::kBackwardDw; });
    const auto at = [&](const std::string& what) { return test_util::position_of(log, what); };
    EXPECT_LT(at("end mb0.layer0.mlp.backward_dw"), at("start mb0.bucket0.grad_reduce"));
}

ScheduleShape shared_overlap_layer(int chunks) {
    ScheduleShape s = one_moe_layer(1, chunks);
    s.shared_expert_overlap = true;
    return s;
}

// Shared-expert overlap (schedule.h): the shared expert computes while the dispatch's all-to-all
// is in flight, and its backward while the combine backward's is; a shared expert chained behind
// the all-to-all (or one issued ahead of it, waiting for the call before) never meets it.
TEST(Executor, SharedExpertRunsBesideTheDispatchAndTheCombineBackward) {
    for (int chunks : {1, 2}) {
        const std::string c0 = chunks > 1 ? ".chunk0" : "";
        const std::set<std::string> missed =
            run(baseline_schedule(shared_overlap_layer(chunks)), 1,
                {{"mb0.layer0.shared_expert.forward", "mb0.layer0.dispatch.forward" + c0},
                 {"mb0.layer0.dispatch.forward" + c0, "mb0.layer0.shared_expert.forward"},
                 {"mb0.layer0.shared_expert.backward", "mb0.layer0.combine.backward" + c0},
                 {"mb0.layer0.combine.backward" + c0, "mb0.layer0.shared_expert.backward"}});
        EXPECT_TRUE(missed.empty()) << chunks << " chunk(s): " << *missed.begin();
    }
}

// ... and it still runs after what it reads exists and before what reads it: after the
// pre_dispatch (n2) and, on a pipeline stage, after the received output gradient (a comm call,
// slowed here so that a shared expert not waiting for it would start first); the mlp after both
// the dispatch and the shared expert, and the combine (which adds the shared output) after it.
TEST(Executor, SharedExpertWaitsForItsInputsAndIsWaitedFor) {
    PipelineShape p{.num_stages = 2,
                    .num_micro_batches = 1,
                    .moe_layers = {true, true},
                    .shared_expert_overlap = true};
    const std::vector<NodeCall> stage0 = pipeline_schedules(p)[0];
    const std::vector<std::string> log = run_logged(stage0, 1, [](const NodeCall& c) {
        return c.node == NodeKind::kRecvBackward || c.node == NodeKind::kDispatch;
    });
    const auto at = [&](const std::string& what) { return test_util::position_of(log, what); };
    const std::string l = "stage0.chunk0.mb0.layer0.";
    EXPECT_LT(at("end " + l + "pre_dispatch.forward"), at("start " + l + "shared_expert.forward"));
    EXPECT_LT(at("end " + l + "shared_expert.forward"), at("start " + l + "mlp.forward"));
    EXPECT_LT(at("end " + l + "dispatch.forward"), at("start " + l + "mlp.forward"));
    EXPECT_LT(at("end " + l + "shared_expert.forward"), at("start " + l + "combine.forward"));
    EXPECT_LT(at("end stage0.chunk0.mb0.x1.recv_backward"),
              at("start " + l + "shared_expert.backward"));
    EXPECT_LT(at("end " + l + "shared_expert.backward"), at("start " + l + "mlp.backward"));
    EXPECT_LT(at("end " + l + "shared_expert.backward"),
              at("start " + l + "pre_dispatch.backward"));
}

}  // namespace
}  // namespace epo::schedule
