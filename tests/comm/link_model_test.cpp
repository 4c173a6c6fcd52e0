// The link model's formula (docs/runtime.md "Link model"), its validation, and sleeping to an
// absolute deadline.
#include "epo/comm/link_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <thread>

#include "epo/comm/link_limits.h"
#include "epo/core/error.h"
#include "epo/core/stop_flag.h"

namespace epo::comm {
namespace {

TEST(LinkModel, OffByDefault) {
    const LinkModel off;
    EXPECT_FALSE(off.enabled());
    EXPECT_EQ(modelled_seconds(off, ByteCounts{1 << 20, 1 << 20, 1 << 20, 1 << 20}), 0.0);
}

TEST(LinkModel, LatencyPlusTheSlowerDirectionOfTheSlowerPath) {
    // 8 Gbit/s = 1e9 bytes/s inter-node, 80 Gbit/s = 1e10 bytes/s intra-node, 50 us latency.
    const LinkModel model{8, 80, 50};
    // Inter: max(2e6 sent, 3e6 received) / 1e9 = 3 ms; intra: max(1e7, 0) / 1e10 = 1 ms.
    ByteCounts b{10'000'000, 0, 2'000'000, 3'000'000};
    EXPECT_DOUBLE_EQ(modelled_seconds(model, b), 50e-6 + 3e-3);
    // Intra larger: 5e7 / 1e10 = 5 ms beats inter 3 ms.
    b.intra_recv = 50'000'000;
    EXPECT_DOUBLE_EQ(modelled_seconds(model, b), 50e-6 + 5e-3);
    // No bytes: latency only.
    EXPECT_DOUBLE_EQ(modelled_seconds(model, ByteCounts{}), 50e-6);
}

TEST(LinkModel, ZeroBandwidthLeavesThatPathUnmodelled) {
    const LinkModel inter_only{8, 0, 0};
    EXPECT_DOUBLE_EQ(modelled_seconds(inter_only, ByteCounts{999'999'999, 999'999'999, 1000, 0}),
                     1e-6);
    const LinkModel latency_only{0, 0, 20};
    EXPECT_TRUE(latency_only.enabled());
    EXPECT_DOUBLE_EQ(modelled_seconds(latency_only, ByteCounts{0, 0, 1 << 30, 1 << 30}), 20e-6);
}

TEST(LinkModel, ValidationNamesTheKey) {
    try {
        validate_link_model(LinkModel{-1, 0, 0});
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("comm.link.inter_node_gbps=-1"), std::string::npos);
    }
    EXPECT_THROW(validate_link_model(LinkModel{0, NAN, 0}), Error);
    EXPECT_THROW(validate_link_model(LinkModel{0, 0, -5}), Error);
    EXPECT_NO_THROW(validate_link_model(LinkModel{400, 3200, 5}));
}

// Values the model cannot honour are refused with the key and the fix: 1e-300 Gbit/s used to
// overflow the deadline into no hold at all, 1e-6 to hold each collective for days.
TEST(LinkModel, ValidationRefusesAbsurdValues) {
    for (double gbps : {1e-300, 4.9e-324, 1e-6, 1e12}) {
        try {
            validate_link_model(LinkModel{gbps, 0, 0});
            FAIL() << gbps << ": no error";
        } catch (const Error& e) {
            const std::string m = e.what();
            EXPECT_NE(m.find("comm.link.inter_node_gbps="), std::string::npos) << m;
            EXPECT_NE(m.find("set it to 0"), std::string::npos) << m;
        }
    }
    EXPECT_THROW(validate_link_model(LinkModel{0, 1e-9, 0}), Error);
    EXPECT_THROW(validate_link_model(LinkModel{0, 0, 1e8}), Error);  // 100 s per collective
    EXPECT_NO_THROW(validate_link_model(LinkModel{kMinLinkGbps, kMaxLinkGbps, kMaxLatencyUs}));
}

TEST(LinkModel, HoldReachesItsDeadline) {
    const auto t0 = Clock::now();
    EXPECT_TRUE(hold_until(t0 + std::chrono::milliseconds(30)));
    EXPECT_GE(seconds_between(t0, Clock::now()), 0.03);
}

TEST(LinkModel, HoldEndsOnAStopRequest) {
    std::thread stopper([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        request_stop(SIGTERM);
    });
    const auto t0 = Clock::now();
    const bool reached = hold_until(t0 + std::chrono::seconds(30));
    const double elapsed = seconds_between(t0, Clock::now());
    stopper.join();
    clear_stop_request();
    EXPECT_FALSE(reached);
    EXPECT_LT(elapsed, 1.0);
}

TEST(LinkModel, ByteCountsArithmetic) {
    ByteCounts a{1, 2, 3, 4};
    a += ByteCounts{10, 20, 30, 40};
    EXPECT_EQ(a, (ByteCounts{11, 22, 33, 44}));
    EXPECT_EQ((a - ByteCounts{1, 2, 3, 4}), (ByteCounts{10, 20, 30, 40}));
    EXPECT_EQ(a.sent(), 44);
    EXPECT_EQ(a.received(), 66);
}

TEST(LinkModel, SleepUntilNeverWakesEarly) {
    for (int i = 0; i < 20; ++i) {
        const auto deadline = Clock::now() + std::chrono::microseconds(300 + 100 * i);
        sleep_until(deadline);
        EXPECT_GE(Clock::now(), deadline);
    }
    sleep_until(Clock::now() - std::chrono::seconds(1));  // past deadline: returns at once
}

}  // namespace
}  // namespace epo::comm
