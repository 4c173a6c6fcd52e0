// The data phase's sleep schedule and observed rate: sleeps grow to a fraction of the expected
// transfer time, never below the first sleep or above the cap; the rate follows what was
// measured and ignores transfers too small to measure.
#include "epo/comm/progress_loop.h"

#include <gtest/gtest.h>

#include "epo/comm/communicator.h"
#include "epo/core/error.h"

namespace epo::comm {
namespace {

TEST(DataSleepSchedule, CapIsAFractionOfTheExpectedTimeWithinBounds) {
    const WaitPolicy arrival;   // spin 20 us, first sleep 50 us
    const DataWaitPolicy data;  // 1/8 of the expected time, at most 2 ms
    const auto fast = data_sleep_schedule(arrival, data, 100e-6);  // 100 us: floor
    EXPECT_EQ(fast.spin_us, arrival.spin_us);
    EXPECT_EQ(fast.first_sleep_us, arrival.min_sleep_us);
    EXPECT_EQ(fast.max_sleep_us, arrival.min_sleep_us);
    EXPECT_DOUBLE_EQ(data_sleep_schedule(arrival, data, 8e-3).max_sleep_us, 1000);  // 8 ms / 8
    EXPECT_EQ(data_sleep_schedule(arrival, data, 10.0).max_sleep_us, data.max_sleep_us);
}

// A sleep ends before the observed rate has moved bytes_per_sleep (128 KiB): 2 ms binds at
// 500 Mbit/s (62.5 MB/s: 2.1 ms), 128 KiB does at 2 Gbit/s (250 MB/s: 0.52 ms), and no rate
// takes a sleep below the first one.
TEST(DataSleepSchedule, CapShrinksWithTheObservedRate) {
    const WaitPolicy arrival;
    const DataWaitPolicy data;
    EXPECT_EQ(data_sleep_schedule(arrival, data, 10.0, 62.5e6).max_sleep_us, data.max_sleep_us);
    EXPECT_DOUBLE_EQ(data_sleep_schedule(arrival, data, 10.0, 250e6).max_sleep_us,
                     data.bytes_per_sleep / 250e6 * 1e6);
    EXPECT_EQ(data_sleep_schedule(arrival, data, 10.0, 1e12).max_sleep_us, arrival.min_sleep_us);
    EXPECT_EQ(data_sleep_schedule(arrival, data, 10.0, 0).max_sleep_us, data.max_sleep_us);
}

TEST(TransferRate, FirstMeasurementReplacesTheGuessLaterOnesAverage) {
    TransferRate rate;
    EXPECT_EQ(rate.bytes_per_s(), TransferRate::kInitialBytesPerS);
    rate.observe(1000, 1e-3);  // under kMinBytes: latency, not rate
    EXPECT_EQ(rate.bytes_per_s(), TransferRate::kInitialBytesPerS);
    rate.observe(int64_t{8} << 20, 0.1);  // 8 MiB in 100 ms
    EXPECT_DOUBLE_EQ(rate.bytes_per_s(), (8 << 20) / 0.1);
    EXPECT_DOUBLE_EQ(rate.expected_s(int64_t{8} << 20), 0.1);
    rate.observe(int64_t{8} << 20, 0.05);  // twice as fast: a quarter of the way there
    EXPECT_DOUBLE_EQ(rate.bytes_per_s(), 0.75 * (8 << 20) / 0.1 + 0.25 * (8 << 20) / 0.05);
}

TEST(DataSleepSchedule, InvalidPolicyIsAConfigErrorNamingTheValues) {
    CommOptions options;
    options.data_wait.sleep_fraction = 0;
    try {
        validate_comm_options(options);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("sleep_fraction=0"), std::string::npos) << e.what();
    }
    options.data_wait = {};
    options.data_wait.max_sleep_us = 10;  // below the first sleep (50 us)
    EXPECT_THROW(validate_comm_options(options), Error);
}

}  // namespace
}  // namespace epo::comm
