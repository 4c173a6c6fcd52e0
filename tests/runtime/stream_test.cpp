// Streams and events without MPI: issue order per stream, issuing never blocks, cross-stream
// order only through events with CUDA's binding rule (a wait binds to the most recent record
// issued before it, also for an event recorded alternately on two streams), sticky failures that
// never leave another stream waiting, and the per-task records.
#include "epo/runtime/stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <future>
#include <thread>

#include "epo/core/error.h"

namespace epo::runtime {
namespace {

using namespace std::chrono_literals;

// A gate a task blocks on until the test opens it.
struct Gate {
    std::promise<void> promise;
    std::shared_future<void> future = promise.get_future().share();
    void open() { promise.set_value(); }
    Task blocker() {
        auto f = future;
        return [f](StreamContext&) { f.wait(); };
    }
};

// Waits up to `limit` for `flag`; true if it became set.
bool eventually(const std::atomic<bool>& flag, std::chrono::milliseconds limit = 10s) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!flag && std::chrono::steady_clock::now() < end)
        std::this_thread::sleep_for(1ms);
    return flag;
}

TEST(Stream, RunsTasksInIssueOrderOnItsOwnThread) {
    Stream s("compute");
    std::vector<int> order;
    std::thread::id worker;
    for (int i = 0; i < 100; ++i) {
        s.enqueue("t", [&, i](StreamContext&) {
            order.push_back(i);
            worker = std::this_thread::get_id();
        });
    }
    s.synchronize();
    ASSERT_EQ(order.size(), 100u);
    for (int i = 0; i < 100; ++i)
        EXPECT_EQ(order[i], i);
    EXPECT_NE(worker, std::this_thread::get_id());
}

TEST(Stream, IssuingNeverWaitsForWork) {
    Stream s("compute");
    Gate gate;
    s.enqueue("blocked", gate.blocker());
    std::atomic<bool> ran{false};
    s.enqueue("after", [&](StreamContext&) { ran = true; });  // returns although work is stuck
    EXPECT_FALSE(ran);
    gate.open();
    s.synchronize();
    EXPECT_TRUE(ran);
}

TEST(Event, WaitOrdersWorkAcrossStreams) {
    Stream a("compute"), b("comm");
    Event e("mb0");
    int value = 0;
    a.enqueue("produce", [&](StreamContext&) {
        std::this_thread::sleep_for(50ms);
        value = 42;
    });
    a.record(e);
    b.wait(e);
    int seen = -1;
    b.enqueue("consume", [&](StreamContext&) { seen = value; });
    b.synchronize();
    EXPECT_EQ(seen, 42);
    a.synchronize();
    // The blocked time is recorded as a wait on stream b.
    EXPECT_GE(b.stats().event_wait_s, 0.030);
    const auto records = b.take_records();
    ASSERT_EQ(records.size(), 2u);
    EXPECT_EQ(records[0].name, "wait mb0");
    EXPECT_EQ(records[0].kind, RecordKind::kWait);
    EXPECT_EQ(records[1].name, "consume");
    EXPECT_EQ(records[1].stream, "comm");
}

TEST(Event, WaitBindsToTheRecordIssuedBeforeIt) {
    Stream a("compute"), b("comm");
    Event e("mb");
    Gate first, second;
    a.enqueue("first", first.blocker());
    a.record(e);  // record 1
    b.wait(e);    // binds to record 1, not to the re-record below
    std::atomic<bool> ran{false};
    b.enqueue("after record 1", [&](StreamContext&) { ran = true; });
    a.enqueue("second", second.blocker());
    a.record(e);  // record 2
    EXPECT_FALSE(ran);
    first.open();
    EXPECT_TRUE(eventually(ran)) << "the wait must not depend on the later record";
    second.open();
    a.synchronize();
    b.synchronize();
}

TEST(Event, WaitIssuedAfterReRecordWaitsForTheNewRecord) {
    Stream a("compute"), b("comm");
    Event e("mb");
    Gate first, second;
    a.enqueue("first", first.blocker());
    a.record(e);
    a.enqueue("second", second.blocker());
    a.record(e);
    b.wait(e);  // binds to record 2
    std::atomic<bool> ran{false};
    b.enqueue("after record 2", [&](StreamContext&) { ran = true; });
    first.open();
    EXPECT_FALSE(eventually(ran, 100ms)) << "ran before the most recent record completed";
    second.open();
    b.synchronize();
    EXPECT_TRUE(ran);
}

TEST(Event, RecordedAlternatelyOnTwoStreams) {
    // One event per micro-batch, as in the overlap schedule: consecutive pieces of the same
    // micro-batch serialize across the two streams through the one event.
    Stream a("compute"), b("comm");
    Event e("mb0");
    std::vector<std::string> log;
    std::mutex m;
    auto step = [&](std::string name, std::chrono::milliseconds sleep) {
        return [&, name, sleep](StreamContext&) {
            std::this_thread::sleep_for(sleep);
            std::lock_guard lock(m);
            log.push_back(name);
        };
    };
    a.enqueue("pre_dispatch", step("pre_dispatch", 30ms));
    a.record(e);
    b.wait(e);
    b.enqueue("dispatch", step("dispatch", 30ms));
    b.record(e);
    a.wait(e);  // binds to b's record
    a.enqueue("mlp", step("mlp", 0ms));
    a.record(e);
    b.wait(e);  // binds to a's second record
    b.enqueue("combine", step("combine", 0ms));
    a.synchronize();
    b.synchronize();
    EXPECT_EQ(log, (std::vector<std::string>{"pre_dispatch", "dispatch", "mlp", "combine"}));
}

TEST(Event, NeverRecordedIsANoOpAndHostSyncWorks) {
    Stream a("compute");
    Event never("never");
    a.wait(never);
    a.synchronize();
    EXPECT_TRUE(never.query());
    never.synchronize();

    Event e("done");
    Gate gate;
    a.enqueue("work", gate.blocker());
    a.record(e);
    EXPECT_FALSE(e.query());
    gate.open();
    e.synchronize();
    EXPECT_TRUE(e.query());
}

TEST(Stream, FailureIsStickyAndReachesWaitingStreams) {
    std::atomic<int> failures{0};
    StreamOptions options;
    options.on_failure = [&](const std::exception_ptr&) { ++failures; };
    Stream a("comm", std::move(options));
    Stream b("compute");
    Event e("mb1");
    a.enqueue("dispatch", [](StreamContext&) { throw Error(ErrorKind::kComm, "peer 3 is gone"); });
    std::atomic<bool> skipped_ran{false};
    a.enqueue("skipped", [&](StreamContext&) { skipped_ran = true; });
    a.record(e);  // after the failure: completes as failed instead of never
    b.wait(e);
    std::atomic<bool> after_wait_ran{false};
    b.enqueue("after wait", [&](StreamContext&) { after_wait_ran = true; });

    auto expect_original = [](Stream& s) {
        try {
            s.synchronize();
            ADD_FAILURE() << "no error from " << s.name();
        } catch (const Error& err) {
            EXPECT_EQ(err.kind(), ErrorKind::kComm);
            EXPECT_STREQ(err.what(), "peer 3 is gone");
        }
    };
    expect_original(a);
    expect_original(b);
    expect_original(a);  // sticky
    EXPECT_FALSE(skipped_ran);
    EXPECT_FALSE(after_wait_ran);
    EXPECT_EQ(failures, 1);
    EXPECT_THROW(e.synchronize(), Error);
}

TEST(Stream, TaskWithoutCommunicatorsGetsAClearError) {
    Stream a("compute");
    a.enqueue("collective", [](StreamContext& ctx) { ctx.comm(); });
    try {
        a.synchronize();
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("stream compute has no communicators"),
                  std::string::npos);
    }
}

TEST(Stream, RecordsNameStreamAndTimes) {
    Stream a("compute");
    a.enqueue("gemm", [](StreamContext&) { std::this_thread::sleep_for(5ms); });
    a.enqueue("norm", [](StreamContext&) {});
    a.synchronize();
    const auto r = a.take_records();
    ASSERT_EQ(r.size(), 2u);
    EXPECT_EQ(r[0].name, "gemm");
    EXPECT_EQ(r[0].stream, "compute");
    EXPECT_GE(r[0].end_ns - r[0].start_ns, 5'000'000);
    EXPECT_LE(r[0].end_ns, r[1].start_ns);
    EXPECT_EQ(a.stats().num_tasks, 2);
    EXPECT_GE(a.stats().busy_s, 0.005);
    EXPECT_TRUE(a.take_records().empty());
}

TEST(Stream, RecordsTheCpuTimeOfItsThread) {
    // A task that computes until its thread has used 20 ms of CPU (however long a loaded
    // machine makes that take) is recorded with at least those 20 ms and no more than its wall
    // time; one that sleeps uses almost none.
    const auto thread_cpu_ns = [] {
        timespec ts{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
    };
    Stream a("comm");
    a.enqueue("spin", [&](StreamContext&) {
        const int64_t end = thread_cpu_ns() + 20'000'000;
        volatile uint64_t x = 0;
        while (thread_cpu_ns() < end)
            x = x + 1;
    });
    a.enqueue("sleep", [](StreamContext&) { std::this_thread::sleep_for(30ms); });
    a.synchronize();
    const auto r = a.take_records();
    ASSERT_EQ(r.size(), 2u);
    EXPECT_GE(r[0].cpu_ns, 20'000'000) << "spinning for 20 ms of CPU";
    EXPECT_LE(r[0].cpu_ns, r[0].end_ns - r[0].start_ns + 1'000'000);
    EXPECT_LT(r[1].cpu_ns, 5'000'000) << "sleeping for 30 ms";
}

TEST(Stream, DestructorFinishesIssuedWork) {
    std::atomic<int> done{0};
    {
        Stream a("compute");
        for (int i = 0; i < 10; ++i) {
            a.enqueue("t", [&](StreamContext&) {
                std::this_thread::sleep_for(1ms);
                ++done;
            });
        }
    }
    EXPECT_EQ(done, 10);
}

}  // namespace
}  // namespace epo::runtime

namespace epo::runtime {
namespace {

TEST(Stream, DestroyedWhileUnwindingSkipsQueuedWork) {
    std::atomic<int> ran{0};
    std::atomic<bool> started{false};
    Event e("never reached");
    Stream waiter("compute");
    try {
        Stream s("comm");
        s.enqueue("running", [&](StreamContext&) {
            started = true;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            ++ran;
        });
        for (int i = 0; i < 5; ++i) {
            s.enqueue("queued", [&](StreamContext&) {
                std::this_thread::sleep_for(std::chrono::seconds(5));  // stand-in for a collective
                ++ran;
            });
        }
        s.record(e);
        waiter.wait(e);
        while (!started)
            std::this_thread::yield();
        throw std::runtime_error("the rank fails");
    } catch (const std::runtime_error&) {
    }
    EXPECT_EQ(ran, 1);  // the running task finished, the queued ones were skipped
    EXPECT_THROW(waiter.synchronize(), Error);  // and nobody waits forever on their records
}

}  // namespace
}  // namespace epo::runtime
