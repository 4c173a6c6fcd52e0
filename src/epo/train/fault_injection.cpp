#include "epo/train/fault_injection.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "epo/core/error.h"

namespace epo::train {
namespace {

constexpr const char* kVariable = "EPO_INJECT_FAILURE";

std::string value_text(const InjectedFailure& f) {
    return fmt::format("{}:{}:{}", f.rank, f.step, f.call);
}

// The whole of `text` as a decimal integer (std::stoi would accept "1x" as 1).
template <class Int>
std::optional<Int> parse_whole(std::string_view text) {
    Int value{};
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, value);
    if (text.empty() || ec != std::errc() || ptr != end)
        return std::nullopt;
    return value;
}

}  // namespace

std::optional<InjectedFailure> injected_failure_from_env() {
    const char* value = std::getenv(kVariable);
    if (value == nullptr || *value == '\0')
        return std::nullopt;
    const std::string_view text = value;
    const size_t a = text.find(':');
    const size_t b = a == std::string_view::npos ? a : text.find(':', a + 1);
    std::optional<int> rank;
    std::optional<int64_t> step;
    if (b != std::string_view::npos) {
        rank = parse_whole<int>(text.substr(0, a));
        step = parse_whole<int64_t>(text.substr(a + 1, b - a - 1));
    }
    if (!rank || !step || b + 1 >= text.size()) {
        throw Error(
            ErrorKind::kUsage,
            fmt::format("{}='{}' is not RANK:STEP:CALL with decimal RANK and STEP (for "
                        "example 1:2:mb1.layer0.combine.forward); unset it for a normal run",
                        kVariable, text));
    }
    return InjectedFailure{.rank = *rank, .step = *step, .call = std::string(text.substr(b + 1))};
}

void check_injected_failure(const InjectedFailure& f, int world_size, int64_t train_iters,
                            const std::vector<schedule::NodeCall>& calls) {
    if (f.rank < 0 || f.rank >= world_size) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("{}='{}' names rank {}, but the job has ranks 0..{}; name one of "
                                "them, or unset it for a normal run",
                                kVariable, value_text(f), f.rank, world_size - 1));
    }
    if (f.step < 1 || f.step > train_iters) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("{}='{}' names step {}, but the run has steps 1..{} "
                                "(train.train_iters); name one of them, or unset it for a normal "
                                "run",
                                kVariable, value_text(f), f.step, train_iters));
    }
    if (std::none_of(calls.begin(), calls.end(), [&](const schedule::NodeCall& c) {
            return schedule::call_name(c) == f.call;
        })) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("{} names call '{}', which this step's schedule does not have "
                                "(names look like mb0.layer1.dispatch.forward)",
                                kVariable, f.call));
    }
}

schedule::NodeBody with_injected_failure(schedule::NodeBody body,
                                         const std::optional<InjectedFailure>& failure, int rank,
                                         int64_t step) {
    if (!failure || failure->rank != rank || failure->step != step)
        return body;
    return [body = std::move(body), target = failure->call, step](const schedule::NodeCall& call,
                                                                  runtime::StreamContext& ctx) {
        if (schedule::call_name(call) == target) {
            throw Error(ErrorKind::kCompute,
                        fmt::format("injected failure ({}) in {} of step {}: the node's own "
                                    "work failed, no peer was involved",
                                    kVariable, target, step));
        }
        body(call, ctx);
    };
}

}  // namespace epo::train
