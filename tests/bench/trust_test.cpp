// The bench's trust flags (trust.h): a speedup above its schedule's cap, from too few steps, or
// within the noise is flagged, on the metrics.json document as check-run reads it.
#include "epo/bench/trust.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "epo/bench/check_run.h"

namespace epo::bench {
namespace {

nlohmann::json run(const std::string& name, std::vector<double> step_times) {
    return {{"name", name}, {"step_times_s", step_times}};
}

nlohmann::json metrics(std::vector<double> base, std::vector<double> overlap, double cap,
                       int pp = 1) {
    return {{"theoretical_cap", cap},
            {"pipeline_model_parallel_size", pp},
            {"runs", {run("baseline", base), run("overlap", overlap)}}};
}

std::vector<std::string> ids(const std::vector<TrustFlag>& flags) {
    std::vector<std::string> out;
    for (const TrustFlag& f : flags)
        out.push_back(f.id);
    return out;
}

TEST(Trust, ASeparatedSpeedupUnderItsCapIsTrusted) {
    // 8 micro-batches: cap 16/9 = 1.78x; medians 10 s and 6.5 s (1.54x), ranges apart.
    const auto flags = trust_flags(metrics({10, 10.2, 9.9, 10.1}, {6.5, 6.4, 6.6, 6.5}, 16.0 / 9));
    EXPECT_TRUE(flags.empty()) << format_trust(flags);
    EXPECT_TRUE(trust_json(flags).at("ok").get<bool>());
}

TEST(Trust, ASpeedupAboveTheCapIsFlagged) {
    // One micro-batch: the overlap schedule is the baseline (cap 1.00x), yet 1.14x was printed.
    const auto flags = trust_flags(metrics({1.14, 1.15, 1.13}, {1.0, 1.01, 0.99}, 1.0));
    EXPECT_EQ(ids(flags), std::vector<std::string>{"above_cap"});
    EXPECT_TRUE(flags[0].fatal);
    EXPECT_NE(flags[0].message.find("speedup 1.14x is above the schedule's theoretical cap 1.00x"),
              std::string::npos)
        << flags[0].message;
    EXPECT_FALSE(trust_json(flags).at("ok").get<bool>());
    // Within the tolerance of the cap: not flagged.
    EXPECT_TRUE(trust_flags(metrics({1.04, 1.04, 1.04}, {1.0, 1.0, 1.0}, 1.0)).empty());
    // A pipeline's cap is not 2NC/(NC+1): not judged against it.
    EXPECT_TRUE(trust_flags(metrics({1.14, 1.15, 1.13}, {1.0, 1.01, 0.99}, 1.0, 2)).empty());
}

TEST(Trust, TooFewStepsAndTheNoiseAreFlagged) {
    // The tiny, noisy bench that printed 2.99x against a 1.33x cap from 2 samples.
    auto flags = trust_flags(metrics({0.275, 0.057}, {0.056, 0.055}, 4.0 / 3));
    EXPECT_EQ(ids(flags), (std::vector<std::string>{"too_few_steps", "above_cap"}));
    // Ranges that overlap past the medians' difference: a warning, not fatal.
    flags = trust_flags(metrics({10, 9, 11}, {9.5, 9.4, 9.6}, 16.0 / 9));
    EXPECT_EQ(ids(flags), std::vector<std::string>{"within_noise"});
    EXPECT_FALSE(flags[0].fatal);
    EXPECT_TRUE(trust_json(flags).at("ok").get<bool>());
    EXPECT_NE(
        format_trust(flags).find("warning (within_noise): overlap: 1.05x is within the noise"),
        std::string::npos)
        << format_trust(flags);
}

TEST(Trust, AMalformedDocumentIsNotJudged) {
    EXPECT_TRUE(trust_flags(nlohmann::json::parse("[1, 2]")).empty());
    EXPECT_TRUE(trust_flags({{"runs", {run("overlap", {1.0, 1.0, 1.0})}}}).empty());  // no baseline
    nlohmann::json m = metrics({1, 1, 1}, {1, 1, 1}, 2);
    m["runs"][1]["step_times_s"] = {1.0, "x"};
    EXPECT_TRUE(trust_flags(m).empty());
}

}  // namespace
}  // namespace epo::bench
