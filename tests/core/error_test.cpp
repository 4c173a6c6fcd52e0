#include "epo/core/error.h"

#include <gtest/gtest.h>

namespace epo {
namespace {

TEST(Error, CheckEqNamesExpressionAndBothValues) {
    try {
        const int num_experts = 6;
        EPO_CHECK_EQ(num_experts % 4, 0);
        FAIL() << "EPO_CHECK_EQ did not throw";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInternal);
        EXPECT_NE(std::string(e.what()).find("num_experts % 4 == 0"), std::string::npos);
        EXPECT_NE(std::string(e.what()).find("2 vs 0"), std::string::npos);
        EXPECT_NE(e.where().find("error_test.cpp:"), std::string::npos);
    }
}

TEST(Error, PassingCheckDoesNotThrow) {
    EXPECT_NO_THROW(EPO_CHECK(1 + 1 == 2, "arithmetic"));
    EXPECT_NO_THROW(EPO_CHECK_LE(3, 3));
}

TEST(Error, UsageErrorsExitTwoOthersOne) {
    EXPECT_EQ(exit_status_for(ErrorKind::kUsage), 2);
    EXPECT_EQ(exit_status_for(ErrorKind::kConfig), 1);
    EXPECT_EQ(exit_status_for(ErrorKind::kComm), 1);
}

}  // namespace
}  // namespace epo
