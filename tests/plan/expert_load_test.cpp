// The expert load (plan/expert_load.h): from routed-row counts to the busiest EP rank over the
// mean, and `--expert_load_imbalance` VALUE as a number or an epo bench run directory.
#include "epo/plan/expert_load.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "epo/core/error.h"

namespace epo::plan {
namespace {

TEST(ExpertLoad, IsTheBusiestRanksRowsOverTheMean) {
    // Layer 0: 4 experts on 2 EP ranks, (10 + 30) against (20 + 20) rows: balanced. Layer 1
    // dense. Layer 2: (60 + 20) against (10 + 10): the busiest 80 over the mean 50.
    // Summed over 2 EP groups and 2 steps: per step and group a quarter.
    const auto load = expert_load({{10, 30, 20, 20}, {}, {60, 20, 10, 10}}, 2, 2, 2);
    ASSERT_EQ(load.size(), 2u);
    EXPECT_EQ(load[0].layer, 0);
    EXPECT_DOUBLE_EQ(load[0].imbalance, 1.0);
    EXPECT_EQ(load[1].layer, 2);
    EXPECT_DOUBLE_EQ(load[1].imbalance, 80.0 / 50.0);
    ASSERT_EQ(load[1].rows_per_ep_rank.size(), 2u);
    EXPECT_DOUBLE_EQ(load[1].rows_per_ep_rank[0], 80.0 / 4);
    EXPECT_DOUBLE_EQ(load[1].rows_per_ep_rank[1], 20.0 / 4);
    const nlohmann::json j = expert_load_json(load);
    EXPECT_DOUBLE_EQ(j.at("mean_imbalance").get<double>(), (1.0 + 1.6) / 2);
    EXPECT_EQ(j.at("layers").size(), 2u);
    EXPECT_TRUE(expert_load_json({}).is_null());
    // Nothing routed (a layer that never ran): balanced, not a division by zero.
    EXPECT_DOUBLE_EQ(expert_load({{0, 0}}, 2, 1, 1).at(0).imbalance, 1.0);
}

std::string usage_error(const std::string& value) {
    try {
        parse_expert_load_imbalance(value);
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kUsage);
        return e.what();
    }
    ADD_FAILURE() << value << " was accepted";
    return "";
}

TEST(ExpertLoad, ANumberAppliesToEveryMoeLayer) {
    const ExpertLoadImbalance one = parse_expert_load_imbalance("1.25");
    EXPECT_TRUE(one.per_moe_layer.empty());
    EXPECT_DOUBLE_EQ(one.of(0), 1.25);
    EXPECT_DOUBLE_EQ(one.of(47), 1.25);
    EXPECT_NE(one.source.find("--expert_load_imbalance"), std::string::npos);
    EXPECT_DOUBLE_EQ(ExpertLoadImbalance{}.of(3), 1.0);  // balanced unless given
}

TEST(ExpertLoad, BadValuesNameTheFlagTheValueAndTheFix) {
    for (const char* v : {"0.9", "-1", "nan", "inf"}) {
        const std::string e = usage_error(v);
        EXPECT_NE(e.find(std::string("--expert_load_imbalance ") + v), std::string::npos) << e;
        EXPECT_NE(e.find("at least 1"), std::string::npos) << e;
    }
    const std::string e = usage_error("/nonexistent/run");
    EXPECT_NE(e.find("neither a number nor a readable file"), std::string::npos) << e;
    EXPECT_NE(e.find("give a number >= 1"), std::string::npos) << e;
}

TEST(ExpertLoad, ARunDirectoryGivesItsMeasuredLayers) {
    const auto dir = std::filesystem::temp_directory_path() / "epo_expert_load_test";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const auto write = [&](const std::string& text) {
        std::ofstream(dir / "metrics.json") << text;
    };
    write(R"({"expert_load": {"layers": [{"layer": 0, "imbalance": 1.28},
              {"layer": 1, "imbalance": 1.1}], "mean_imbalance": 1.19}})");
    const ExpertLoadImbalance run = parse_expert_load_imbalance(dir.string());
    ASSERT_EQ(run.per_moe_layer.size(), 2u);
    EXPECT_DOUBLE_EQ(run.of(0), 1.28);
    EXPECT_DOUBLE_EQ(run.of(1), 1.1);
    EXPECT_NE(run.source.find("1.280, 1.100 per MoE layer, measured by epo bench"),
              std::string::npos)
        << run.source;
    // The file itself works too.
    EXPECT_EQ(parse_expert_load_imbalance((dir / "metrics.json").string()).per_moe_layer.size(),
              2u);
    // A run from before the bench measured expert load, a broken file, a bad figure.
    write(R"({"runs": []})");
    EXPECT_NE(usage_error(dir.string()).find("has no expert_load section"), std::string::npos);
    write(R"({"expert_load": nul)");
    EXPECT_NE(usage_error(dir.string()).find("is not JSON"), std::string::npos);
    write(R"({"expert_load": {"layers": [{"layer": 3, "imbalance": 0.5}]}})");
    EXPECT_NE(usage_error(dir.string()).find("layer 3 has imbalance 0.5, below 1"),
              std::string::npos);
    write(R"({"expert_load": {"layers": [{"layer": 3}]}})");
    EXPECT_NE(usage_error(dir.string()).find("malformed expert_load"), std::string::npos);
    write(R"({"expert_load": {"layers": []}})");
    EXPECT_NE(usage_error(dir.string()).find("lists no MoE layer"), std::string::npos);
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace epo::plan
