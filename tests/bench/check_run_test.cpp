// The "identical to the baseline" judgement of epo bench and epo check-run: losses, grad norms
// and the final parameters' checksum, each able to fail a run on its own (losses alone kept a
// planted reordering of gradient accumulation bit-identical at 2 micro-batches).
#include "epo/bench/check_run.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
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

// A whole metrics.json as check-run reads it: two runs of three measured steps.
nlohmann::json full_metrics() {
    nlohmann::json base = run("baseline"), overlap = run("overlap");
    base["step_time_s"] = {{"median", 2.0}, {"min", 1.9}, {"max", 2.1}};
    base["step_times_s"] = {1.9, 2.0, 2.1};
    overlap["step_time_s"] = {{"median", 1.5}, {"min", 1.45}, {"max", 1.55}};
    overlap["step_times_s"] = {1.45, 1.5, 1.55};
    for (nlohmann::json* r : {&base, &overlap}) {
        (*r)["steps_planned"] = 3;
        (*r)["steps_completed"] = 3;
    }
    return {{"completed", true},
            {"world_size", 2},
            {"steps_per_run", 3},
            {"theoretical_cap", 16.0 / 9},
            {"runs", {base, overlap}}};
}

std::string verdicts_for(const nlohmann::json& metrics) {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("epo_check_run_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "metrics.json") << metrics.dump();
    const std::string out = format_verdicts(check_run_dir(dir));
    std::filesystem::remove_all(dir);
    return out;
}

TEST(CheckRun, AMistypedFieldFailsNamingIt) {
    nlohmann::json m = full_metrics();
    EXPECT_NE(verdicts_for(m).find("PASS  throughput improved or not reduced: overlap 1.33x"),
              std::string::npos)
        << verdicts_for(m);
    m["runs"][1]["step_time_s"]["median"] = "1.5";
    const std::string out = verdicts_for(m);
    // No "internal error: [json.exception.type_error.306]": the field, its type, what it needs.
    EXPECT_NE(out.find("FAIL  throughput improved or not reduced: metrics.json is malformed: "
                       "runs[1].step_time_s.median is a string, expected a number"),
              std::string::npos)
        << out;
    m = full_metrics();
    m["runs"][0].erase("step_times_s");
    EXPECT_NE(verdicts_for(m).find("runs[0].step_times_s is missing"), std::string::npos);
}

TEST(CheckRun, TheMedianIsRecomputedFromTheStepTimes) {
    nlohmann::json m = full_metrics();
    m["runs"][1]["step_time_s"]["median"] = 1.0;  // an edited summary: 2x instead of 1.33x
    const std::string out = verdicts_for(m);
    EXPECT_NE(out.find("FAIL  throughput improved or not reduced: run overlap: the stored median "
                       "step time 1 s is not the median of its step times (1.5 s)"),
              std::string::npos)
        << out;
}

TEST(CheckRun, SpeedupsAboveTheCapOrFromTooFewStepsFail) {
    nlohmann::json m = full_metrics();
    EXPECT_NE(verdicts_for(m).find("PASS  speedups measured, not claimed"), std::string::npos);
    m["theoretical_cap"] = 1.0;  // one micro-batch
    EXPECT_NE(verdicts_for(m).find("FAIL  speedups measured, not claimed: overlap: speedup 1.33x "
                                   "is above the schedule's theoretical cap 1.00x"),
              std::string::npos)
        << verdicts_for(m);
    m = full_metrics();
    m["runs"][0]["step_times_s"] = {1.5, 2.5};
    m["runs"][0]["step_time_s"]["median"] = 2.0;
    EXPECT_NE(verdicts_for(m).find("FAIL  speedups measured, not claimed: overlap: 3 measured "
                                   "step(s) against the baseline's 2"),
              std::string::npos)
        << verdicts_for(m);
    m = full_metrics();
    m["runs"][0]["step_times_s"] = {1.4, 2.0, 2.1};  // the baseline's fastest beats 1.5 s
    m["runs"][0]["step_time_s"]["min"] = 1.4;
    const std::string noisy = verdicts_for(m);
    EXPECT_NE(
        noisy.find("WARN  speedups measured, not claimed: overlap: 1.33x is within the noise"),
        std::string::npos)
        << noisy;
}

}  // namespace
}  // namespace epo::bench
