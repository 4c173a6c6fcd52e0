#include "epo/checkpoint/stop_signal.h"

#include <gtest/gtest.h>

#include <csignal>

namespace epo::checkpoint {
namespace {

TEST(StopSignals, FirstSignalIsAPendingRequest) {
    StopSignals signals(3, 4);
    EXPECT_EQ(signals.pending(), 0);
    ASSERT_EQ(std::raise(SIGINT), 0);
    EXPECT_EQ(signals.pending(), SIGINT);
}

TEST(StopSignals, PreviousHandlersComeBackAfterwards) {
    { StopSignals signals(0, 1); }
    struct sigaction now {};
    sigaction(SIGTERM, nullptr, &now);
    EXPECT_EQ(now.sa_handler, SIG_DFL);
    // And a new one starts with nothing pending.
    StopSignals again(0, 1);
    EXPECT_EQ(again.pending(), 0);
}

TEST(StopSignalsDeathTest, SecondSignalExitsAtOnce) {
    EXPECT_EXIT(
        {
            StopSignals signals(1, 2);
            std::raise(SIGTERM);
            std::raise(SIGTERM);
            std::_Exit(0);  // not reached
        },
        ::testing::ExitedWithCode(128 + SIGTERM),
        "rank 1 of 2 received SIGTERM: stopping after the current step(.|\n)*rank 1 of 2 "
        "received a second SIGTERM: exiting at once without saving");
}

}  // namespace
}  // namespace epo::checkpoint
