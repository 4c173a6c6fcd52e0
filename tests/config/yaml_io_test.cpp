#include "epo/config/yaml_io.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "config_test_util.h"
#include "epo/config/finalize.h"
#include "epo/config/harness.h"
#include "epo/config/recipes.h"

namespace epo::config {
namespace {

using testing::expect_error;

const YamlSource kSource{"test.yaml"};

Config load(const std::string& text) {
    return config_from_yaml(text, kSource);
}

void expect_load_error(const std::string& text, const std::vector<std::string>& parts) {
    expect_error([&] { load(text); }, ErrorKind::kUsage, parts);
}

TEST(YamlRoundTrip, FinalizedRecipesLoadBackIdentical) {
    for (auto name : recipe_names()) {
        Config c = make_recipe(name);
        HarnessOverrides h;
        h.moe_a2a_overlap = true;
        apply_harness_overrides(c, h);
        finalize(c);
        const Config back = load(to_yaml(c));
        EXPECT_EQ(back, c) << name << ":\n" << ::testing::PrintToString(diff_configs(c, back));
    }
}

TEST(YamlRoundTrip, UnusualValuesSurvive) {
    Config c = make_recipe("tiny-moe");
    c.recipe.reset();
    c.env.gpu = "NVIDIA H100 80GB HBM3";
    c.env.torch_version = "2.6.0a0+ecf3bae";
    c.dataset.path = "null";  // a string that spells null
    c.checkpoint.save = "- dir: with # chars";
    c.logger.log_dir = "true";
    c.optimizer.lr = 0.1 + 0.2;  // needs all 17 digits
    c.model.layernorm_epsilon = 1e-300;
    c.model.moe_layer_freq = std::vector<int>{0, 1};
    c.model.cuda_graph_scope = std::string("attn,moe_router");
    c.model.recompute_modules = std::vector<RecomputeModule>{};
    c.comm_overlap.emplace();
    c.comm_overlap->bucket_size = std::int64_t{1} << 40;
    c.comm_overlap->tp_comm_bootstrap_backend.reset();
    const Config back = load(to_yaml(c));
    EXPECT_EQ(back, c) << ::testing::PrintToString(diff_configs(c, back));
}

TEST(YamlRoundTrip, DumpIsGreppableAsARunLogs) {
    Config c = testing::ep_overlap_config();
    c.model.moe_token_dispatcher_type = DispatcherType::kFlex;
    c.model.moe_flex_dispatcher_backend = FlexBackend::kDeepep;
    finalize(c);
    const std::string yaml = to_yaml(c);
    EXPECT_NE(yaml.find("  overlap_moe_expert_parallel_comm: true\n"), std::string::npos);
    EXPECT_NE(yaml.find("  moe_token_dispatcher_type: flex\n"), std::string::npos);
    EXPECT_NE(yaml.find("  moe_flex_dispatcher_backend: deepep\n"), std::string::npos);
    EXPECT_NE(yaml.find("  layernorm_epsilon: 1e-05\n"), std::string::npos);
}

TEST(YamlRoundTrip, SaveWritesALoadableFile) {
    const auto path = std::filesystem::temp_directory_path() / "epo_yaml_io_test_config.yaml";
    const Config c = make_recipe("mixtral-8x7b");
    save_yaml(c, path);
    EXPECT_EQ(load(read_text_file(path)), c);
    std::filesystem::remove(path);
    expect_error([&] { save_yaml(c, "/nonexistent-dir/x.yaml"); }, ErrorKind::kIo,
                 {"cannot write"});
}

TEST(YamlLayering, AbsentKeepsNullSetsFalseStaysFalse) {
    const Config c = load(
        "recipe: deepseek-v3\n"
        "model:\n"
        "  mtp_num_layers: null\n"
        "  moe_shared_expert_overlap: false\n"
        "  num_layers: 8\n"
        "comm_overlap:\n"
        "  delay_wgrad_compute: false\n");
    const Config recipe = make_recipe("deepseek-v3");
    EXPECT_EQ(c.recipe, "deepseek-v3");
    EXPECT_EQ(c.model.hidden_size, recipe.model.hidden_size);  // absent: the recipe's value
    EXPECT_FALSE(c.model.mtp_num_layers.has_value());          // explicit null
    EXPECT_FALSE(c.model.moe_shared_expert_overlap);           // explicit false
    EXPECT_EQ(c.model.num_layers, 8);
    ASSERT_TRUE(c.comm_overlap.has_value());  // given: the section exists
    EXPECT_EQ(c.comm_overlap->delay_wgrad_compute, std::optional<bool>(false));
    EXPECT_EQ(c.comm_overlap->overlap_moe_expert_parallel_comm, std::nullopt);  // not given
    EXPECT_EQ(c.comm_overlap->tp_comm_bootstrap_backend, "nccl");               // default
    EXPECT_FALSE(load("model:\n  num_layers: 2\ncomm_overlap: null\n").comm_overlap.has_value());
    EXPECT_TRUE(load("comm_overlap: {}\n").comm_overlap.has_value());
}

TEST(YamlLayering, WithoutRecipeStartsFromDefaults) {
    const Config c = load("model:\n  num_layers: 3\n");
    EXPECT_FALSE(c.recipe.has_value());
    EXPECT_EQ(c.model.num_layers, 3);
    EXPECT_EQ(c.model.hidden_size, 0);
}

TEST(YamlErrors, MalformedYamlGivesLineAndColumn) {
    expect_load_error("model:\n  hidden_size: [1, 2\ntrain: {}\n",
                      {"test.yaml:", "malformed YAML"});
    expect_load_error("model:\n  num_layers: 2\n    hidden_size: 3\n",
                      {"test.yaml:3:", "malformed"});
    expect_load_error("model: {num_layers: 2\n", {"test.yaml:", "malformed YAML"});
    expect_load_error(std::string(5000, '[') + std::string(5000, ']'), {"nesting too deep"});
}

TEST(YamlErrors, UnknownKeysSuggestTheClosest) {
    expect_load_error(
        "model:\n  hidden_size: 12\n  hidden_sise: 3\n",
        {"test.yaml:3:3:", "unknown key 'model.hidden_sise'", "did you mean 'model.hidden_size'"});
    expect_load_error("modle:\n  num_layers: 2\n", {"test.yaml:1:1:", "did you mean 'model"});
    expect_load_error("hidden_size: 2\n", {"did you mean 'model.hidden_size'"});
    expect_load_error("comm:\n  link:\n    latency: 3\n", {"did you mean 'comm.link.latency_us'"});
}

TEST(YamlErrors, WrongTypesNameKeyValueAndExpectedType) {
    expect_load_error("model:\n  hidden_size: abc\n",
                      {"test.yaml:2:3:", "model.hidden_size", "expected an integer", "'abc'"});
    expect_load_error("model:\n  hidden_size: 2.5\n", {"expected an integer", "'2.5'"});
    expect_load_error("model:\n  bf16: yes\n", {"model.bf16", "expected true or false", "'yes'"});
    expect_load_error(
        "model:\n  moe_token_dispatcher_type: all2all\n",
        {"model.moe_token_dispatcher_type", "'all2all'", "allgather, alltoall or flex"});
    expect_load_error("model:\n  hidden_size: [1]\n", {"expected an integer, got a list"});
    expect_load_error("model: 3\n", {"model", "expected a mapping of keys"});
    expect_load_error("model:\n  recompute_modules: moe\n",
                      {"model.recompute_modules", "expected a list"});
    expect_load_error("model:\n  recompute_modules: [moe, mpl]\n",
                      {"model.recompute_modules[1]", "'mpl'"});
    expect_load_error("optimizer:\n  lr: fast\n", {"optimizer.lr", "expected a finite number"});
    expect_load_error("optimizer:\n  lr: .inf\n", {"expected a finite number"});
    expect_load_error("optimizer:\n  lr: nan\n", {"expected a finite number"});
    expect_load_error("env:\n  gpu: [h100]\n", {"env.gpu", "expected a string, got a list"});
    expect_load_error("model:\n  moe_layer_freq: {a: 1}\n", {"model.moe_layer_freq"});
    expect_load_error("recipe: [tiny-moe]\n", {"recipe", "expected a string"});
}

TEST(YamlErrors, NullWhereANumberIsNeeded) {
    expect_load_error("model:\n  num_layers: null\n",
                      {"test.yaml:2:3:", "model.num_layers", "null is not allowed", "an integer"});
    expect_load_error("model:\n  num_layers:\n", {"model.num_layers", "null is not allowed"});
    expect_load_error("model: null\n", {"model", "null is not allowed"});
    expect_load_error("train:\n  seed: ~\n", {"train.seed", "null is not allowed"});
}

TEST(YamlErrors, HugeValuesAreRangeErrorsNotCrashes) {
    expect_load_error("model:\n  hidden_size: 99999999999999999999999\n",
                      {"model.hidden_size", "out of range", "2147483647"});
    expect_load_error("comm_overlap:\n  bucket_size: 99999999999999999999\n",
                      {"comm_overlap.bucket_size", "out of range"});
    expect_load_error("optimizer:\n  lr: 1e999\n", {"optimizer.lr", "out of the range"});
    EXPECT_EQ(load("model:\n  hidden_size: 2147483647\n").model.hidden_size, 2147483647);
    EXPECT_EQ(load("model:\n  hidden_size: -3\n").model.hidden_size, -3);  // VA001 judges it
    EXPECT_EQ(load("model:\n  hidden_size: +3\n").model.hidden_size, 3);
}

TEST(YamlErrors, EmptyMultipleAndNonMappingDocuments) {
    expect_load_error("", {"test.yaml", "empty"});
    expect_load_error("# only a comment\n\n", {"empty"});
    expect_load_error("---\nmodel: {}\n---\nmodel: {}\n", {"2 YAML documents"});
    expect_load_error("- model\n", {"top level", "mapping"});
    expect_load_error("just text\n", {"top level", "mapping"});
    expect_load_error("model: {}\nmodel: {}\n", {"test.yaml:2:1:", "key given twice"});
    expect_load_error("? [a, b]\n: 1\n", {"keys must be plain names"});
}

TEST(YamlErrors, UnknownRecipeAndMissingFile) {
    expect_error([] { load("recipe: tiny\n"); }, ErrorKind::kUsage,
                 {"unknown recipe 'tiny'", "tiny-moe"});
    expect_error([] { read_text_file("/nonexistent/config.yaml"); }, ErrorKind::kUsage,
                 {"/nonexistent/config.yaml", "no such file"});
    expect_error([] { parse_yaml(std::string(17u << 20, ' '), kSource); }, ErrorKind::kUsage,
                 {"too large"});
}

}  // namespace
}  // namespace epo::config
