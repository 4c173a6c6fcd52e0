// The "identical to the baseline" judgement of epo bench and epo check-run: losses, grad norms
// and the final parameters' checksum, each able to fail a run on its own (losses alone kept a
// planted reordering of gradient accumulation bit-identical at 2 micro-batches).
#include "epo/bench/check_run.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "epo/bench/metrics.h"

namespace epo::bench {
namespace {

nlohmann::json run(const std::string& name) {
    return {{"name", name},
            {"losses", {2.5, 2.25, 2.125}},
            {"grad_norms", {1.5, 1.25, 1.0}},
            {"param_checksum", "fnv1a64:0123456789abcdef"},
            {"repeats_identical", true}};
}

nlohmann::json metrics_of(nlohmann::json overlap) {
    return {{"runs", {run("baseline"), std::move(overlap)}}};
}

TEST(CompareBits, EachRecordCanDifferAlone) {
    const RunBits a{{2.5, 2.25}, {1.5, 1.25}, "fnv1a64:1"};
    EXPECT_TRUE(compare_bits(a, a).all());
    EXPECT_EQ(compare_bits(a, a).differences, "");
    RunBits b = a;
    b.grad_norms[1] = std::nextafter(b.grad_norms[1], 0.0);
    BitComparison c = compare_bits(a, b);
    EXPECT_TRUE(c.losses);
    EXPECT_FALSE(c.grad_norms);
    EXPECT_TRUE(c.params);
    EXPECT_EQ(c.differences, "grad norms (first at step 2)");
    b = a;
    b.param_checksum = "fnv1a64:2";
    c = compare_bits(a, b);
    EXPECT_TRUE(c.losses && c.grad_norms);
    EXPECT_FALSE(c.params);
    EXPECT_EQ(c.differences, "final parameters (fnv1a64:1 vs fnv1a64:2)");
    b = a;
    b.losses.pop_back();  // a shorter trajectory
    EXPECT_FALSE(compare_bits(a, b).losses);
    // Nothing recorded never counts as identical.
    EXPECT_FALSE(compare_bits(RunBits{}, RunBits{}).all());
    EXPECT_EQ(compare_bits(RunBits{a.losses, a.grad_norms, ""}, a).differences,
              "final parameters (no checksum recorded)");
    // -0.0 == 0.0 as doubles, not as bits.
    EXPECT_FALSE(compare_bits(RunBits{{0.0}, {1.0}, "x"}, RunBits{{-0.0}, {1.0}, "x"}).losses);
}

TEST(IdenticalToBaseline, PassesIdenticalRuns) {
    const Criterion c = identical_to_baseline(metrics_of(run("overlap")));
    EXPECT_TRUE(c.pass) << c.detail;
    EXPECT_EQ(c.name, kIdenticalCriterion);
    EXPECT_NE(c.detail.find("2 run(s) bit-identical over 3 steps"), std::string::npos) << c.detail;
}

TEST(IdenticalToBaseline, FailsAPlantedDifferenceInTheGradNormsOnly) {
    nlohmann::json r = run("overlap");
    r["grad_norms"][2] = std::nextafter(1.0, 2.0);
    const Criterion c = identical_to_baseline(metrics_of(r));
    EXPECT_FALSE(c.pass);
    EXPECT_EQ(c.detail, "run overlap differs from the baseline in grad norms (first at step 3)");
}

TEST(IdenticalToBaseline, FailsAPlantedDifferenceInTheChecksumOnly) {
    nlohmann::json r = run("overlap+delay_wgrad");
    r["param_checksum"] = "fnv1a64:fedcba9876543210";
    const Criterion c = identical_to_baseline(metrics_of(r));
    EXPECT_FALSE(c.pass);
    EXPECT_NE(c.detail.find("run overlap+delay_wgrad differs from the baseline in final "
                            "parameters"),
              std::string::npos)
        << c.detail;
}

TEST(IdenticalToBaseline, FailsMissingRecordsAndDifferingRepeats) {
    nlohmann::json r = run("overlap");
    r.erase("param_checksum");  // an older metrics.json
    EXPECT_FALSE(identical_to_baseline(metrics_of(r)).pass);
    r = run("overlap");
    r["grad_norms"] = "oops";
    EXPECT_FALSE(identical_to_baseline(metrics_of(r)).pass);
    r = run("overlap");
    r["repeats_identical"] = false;
    EXPECT_FALSE(identical_to_baseline(metrics_of(r)).pass);
    EXPECT_FALSE(identical_to_baseline({{"runs", {run("overlap")}}}).pass);  // no baseline
}

}  // namespace
}  // namespace epo::bench
