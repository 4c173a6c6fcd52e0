// EPO_INJECT_FAILURE: parsed strictly, refused at start-up when it could never fire, and, when it
// fires, a failure of the node's own body (not a communication error) wrapped around the body
// the executor runs.
#include "epo/train/fault_injection.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "epo/core/error.h"
#include "epo/runtime/stream.h"

namespace epo::train {
namespace {

// Sets the variable for one test and restores "unset" after it.
class InjectEnv {
public:
    explicit InjectEnv(const char* value) { setenv("EPO_INJECT_FAILURE", value, 1); }
    ~InjectEnv() { unsetenv("EPO_INJECT_FAILURE"); }
};

// The kUsage error `f` raises; fails the test when it raises none.
Error usage_error(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
        return e;
    }
    ADD_FAILURE() << "no error";
    return Error(ErrorKind::kInternal, "");
}

std::vector<schedule::NodeCall> two_micro_batches() {
    return schedule::overlap_schedule(
        schedule::ScheduleShape{.num_micro_batches = 2, .moe_layers = {true, true}});
}

TEST(FaultInjection, ParsesRankStepAndCall) {
    const InjectEnv env("1:2:mb1.layer0.combine.forward");
    const std::optional<InjectedFailure> f = injected_failure_from_env();
    ASSERT_TRUE(f);
    EXPECT_EQ(f->rank, 1);
    EXPECT_EQ(f->step, 2);
    EXPECT_EQ(f->call, "mb1.layer0.combine.forward");
}

TEST(FaultInjection, UnsetOrEmptyInjectsNothing) {
    unsetenv("EPO_INJECT_FAILURE");
    EXPECT_FALSE(injected_failure_from_env());
    const InjectEnv env("");
    EXPECT_FALSE(injected_failure_from_env());
}

// std::stoi read "1x" as 1: trailing garbage, signs in odd places and missing fields are refused,
// naming the variable and the value.
TEST(FaultInjection, RefusesMalformedValues) {
    for (const char* bad : {"1x:2y:mb0.layer0.mlp.forward", "1x:2y", "oops", "1:2",
                            "1:2:", ":2:mb0.layer0.mlp.forward", "1: 2:mb0.layer0.mlp.forward",
                            "0x1:2:mb0.layer0.mlp.forward", "99999999999:1:x"}) {
        const InjectEnv env(bad);
        const Error e = usage_error([] { injected_failure_from_env(); });
        const std::string what = e.what();
        EXPECT_NE(what.find(std::string("EPO_INJECT_FAILURE='") + bad + "'"), std::string::npos)
            << what;
        EXPECT_NE(what.find("unset it"), std::string::npos) << what;
    }
}

// An injection that could never fire was silently ignored (the run exited 0): a rank outside the
// job, a step outside 1..train_iters, a call the schedule does not have.
TEST(FaultInjection, RefusesTargetsOutsideTheRun) {
    const std::vector<schedule::NodeCall> calls = two_micro_batches();
    const InjectedFailure ok{.rank = 1, .step = 20, .call = "mb1.layer0.combine.forward"};
    check_injected_failure(ok, 2, 20, calls);
    struct Case {
        InjectedFailure f;
        std::string needle;
    };
    for (const Case& c : {Case{{2, 1, ok.call}, "names rank 2, but the job has ranks 0..1"},
                          Case{{-1, 1, ok.call}, "names rank -1"},
                          Case{{0, 0, ok.call}, "names step 0, but the run has steps 1..20"},
                          Case{{0, 21, ok.call}, "names step 21"},
                          Case{{0, 1, "mb2.layer0.combine.forward"}, "does not have"}}) {
        const Error e = usage_error([&] { check_injected_failure(c.f, 2, 20, calls); });
        const std::string what = e.what();
        EXPECT_NE(what.find("EPO_INJECT_FAILURE"), std::string::npos) << what;
        EXPECT_NE(what.find(c.needle), std::string::npos) << what;
    }
}

// The wrapper runs every other call through the body, and makes the target call fail as a
// compute failure of that node (kCompute), even on the comm stream.
TEST(FaultInjection, TheTargetNodeFailsAsAComputeFailure) {
    const std::vector<schedule::NodeCall> calls = two_micro_batches();
    const std::optional<InjectedFailure> f =
        InjectedFailure{.rank = 1, .step = 2, .call = "mb1.layer1.dispatch.forward"};
    std::vector<std::string> ran;
    const schedule::NodeBody body = [&](const schedule::NodeCall& c, runtime::StreamContext&) {
        ran.push_back(schedule::call_name(c));
    };
    runtime::Stream stream("test", {});
    runtime::StreamContext context(stream, nullptr);
    // Another rank or step: the body itself, unwrapped.
    for (auto [rank, step] : {std::pair{0, int64_t{2}}, std::pair{1, int64_t{1}}}) {
        const schedule::NodeBody same = with_injected_failure(body, f, rank, step);
        for (const schedule::NodeCall& c : calls)
            same(c, context);
    }
    EXPECT_EQ(ran.size(), 2 * calls.size());
    ran.clear();
    const schedule::NodeBody wrapped = with_injected_failure(body, f, 1, 2);
    bool failed = false;
    for (const schedule::NodeCall& c : calls) {
        if (schedule::call_name(c) != f->call) {
            wrapped(c, context);
            continue;
        }
        ASSERT_EQ(schedule::stream_of(c.node), schedule::StreamId::kComm);
        try {
            wrapped(c, context);
        } catch (const Error& e) {
            failed = true;
            EXPECT_EQ(e.kind(), ErrorKind::kCompute) << e.what();
            EXPECT_STREQ(error_kind_name(e.kind()), "compute failure");
            EXPECT_NE(e.kind(), ErrorKind::kComm);
            EXPECT_NE(std::string(e.what()).find("injected failure (EPO_INJECT_FAILURE) in "
                                                 "mb1.layer1.dispatch.forward of step 2"),
                      std::string::npos)
                << e.what();
        }
    }
    EXPECT_TRUE(failed);
    EXPECT_EQ(ran.size(), calls.size() - 1);
}

}  // namespace
}  // namespace epo::train
