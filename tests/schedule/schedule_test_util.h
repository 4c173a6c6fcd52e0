// Helpers of the schedule tests (tests/schedule/*_test.cpp): call lists as names, and the shapes
// the tests build.
#pragma once

#include "epo/schedule/schedule.h"

#include <string>
#include <vector>

namespace epo::schedule::test_util {

inline std::vector<std::string> names(const std::vector<NodeCall>& calls) {
    std::vector<std::string> out;
    for (const auto& c : calls)
        out.push_back(call_name(c));
    return out;
}

inline ScheduleShape moe_shape(int mbs, int layers, bool delay) {
    return ScheduleShape{mbs, std::vector<bool>(static_cast<size_t>(layers), true), delay};
}

}  // namespace epo::schedule::test_util
