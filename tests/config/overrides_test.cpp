#include "epo/config/overrides.h"

#include <gtest/gtest.h>

#include "config_test_util.h"

namespace epo::config {
namespace {

using testing::expect_error;

Config with(std::vector<std::string> args, Config base = make_recipe("tiny-moe")) {
    apply_overrides(base, args);
    return base;
}

void expect_override_error(const std::string& arg, const std::vector<std::string>& parts) {
    expect_error([&] { with({arg}); }, ErrorKind::kUsage, parts);
}

TEST(Overrides, TypedScalarsNullsAndLists) {
    const Config c = with({"model.num_moe_experts=64", "model.bf16=false", "optimizer.lr=1e-3",
                           "model.moe_token_dispatcher_type=flex", "env.gpu=h100",
                           "model.moe_z_loss_coeff=0.001", "model.moe_z_loss_coeff=null",
                           "model.recompute_modules=[moe, mlp]", "model.moe_layer_freq=[0,1]",
                           "model.cuda_graph_modules=[]", "dataset.path='/data/a b.txt'"});
    EXPECT_EQ(c.model.num_moe_experts, 64);
    EXPECT_FALSE(c.model.bf16);
    EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
    EXPECT_EQ(c.model.moe_token_dispatcher_type, DispatcherType::kFlex);
    EXPECT_EQ(c.env.gpu, "h100");
    EXPECT_FALSE(c.model.moe_z_loss_coeff.has_value());  // later override wins
    EXPECT_EQ(c.model.recompute_modules,
              (std::vector<RecomputeModule>{RecomputeModule::kMoe, RecomputeModule::kMlp}));
    EXPECT_EQ(c.model.moe_layer_freq, MoeLayerFreq(std::vector<int>{0, 1}));
    EXPECT_TRUE(c.model.cuda_graph_modules.empty());
    EXPECT_EQ(c.dataset.path, "/data/a b.txt");
}

TEST(Overrides, CreateAndDropTheOptionalSection) {
    Config c = with({"comm_overlap.delay_wgrad_compute=true"});
    ASSERT_TRUE(c.comm_overlap.has_value());
    EXPECT_EQ(c.comm_overlap->delay_wgrad_compute, true);
    EXPECT_EQ(c.comm_overlap->tp_comm_overlap, std::nullopt);  // the rest starts at its defaults
    EXPECT_EQ(c.comm_overlap->tp_comm_bootstrap_backend, "nccl");
    c = with({"comm_overlap=null"}, c);
    EXPECT_FALSE(c.comm_overlap.has_value());
    c = with({"comm_overlap={overlap_moe_expert_parallel_comm: true}"}, c);
    EXPECT_EQ(c.comm_overlap->overlap_moe_expert_parallel_comm, true);
    c = with({"comm.link={inter_node_gbps: 100, latency_us: 2}"}, c);
    EXPECT_EQ(c.comm.link.inter_node_gbps, 100.0);
}

TEST(Overrides, UnknownKeysSuggestTheClosest) {
    expect_override_error("model.hiden_size=3",
                          {"override 'model.hiden_size=3'", "did you mean 'model.hidden_size'"});
    expect_override_error("hidden_size=3", {"did you mean 'model.hidden_size'"});
    expect_override_error("model.hidden_size.x=3",
                          {"model.hidden_size", "expected an integer, got a mapping"});
    expect_override_error("nonsense.zzzz=1", {"unknown key 'nonsense'"});
}

TEST(Overrides, WrongTypesNameKeyValueAndType) {
    expect_override_error("model.hidden_size=abc",
                          {"model.hidden_size", "expected an integer", "'abc'"});
    expect_override_error("model.hidden_size=null", {"model.hidden_size", "null is not allowed"});
    expect_override_error("model.hidden_size=99999999999", {"out of range"});
    expect_override_error("model.bf16=maybe", {"model.bf16", "true or false", "'maybe'"});
    expect_override_error("model.moe_flex_dispatcher_backend=ncclep",
                          {"'ncclep'", "deepep or hybridep"});
    expect_override_error("model.recompute_modules=[moe", {"cannot read the value"});
}

TEST(Overrides, ShapeErrors) {
    expect_override_error("model.hidden_size=", {"has no value", "model.hidden_size=null"});
    expect_override_error("=3", {"is not an override"});
    expect_override_error("model..x=3", {"is not an override"});
    expect_override_error("recipe=tiny-moe", {"--model"});
    EXPECT_TRUE(looks_like_override("a.b=c"));
    EXPECT_TRUE(looks_like_override("model.x=[1,2]"));
    EXPECT_FALSE(looks_like_override("config.yaml"));
    EXPECT_FALSE(looks_like_override("./dir=x/config.yaml"));
    EXPECT_FALSE(looks_like_override("-tp=2"));
}

}  // namespace
}  // namespace epo::config

namespace epo::config {
namespace {

// Several mistyped keys on one command line are reported together (only the first was); one
// keeps its own message.
TEST(Overrides, EveryBadOverrideIsReportedAtOnce) {
    Config c = make_recipe("tiny-moe");
    const std::vector<std::string> args = {"model.num_layrs=4", "model.hidden_size=64",
                                           "train.global_bach_size=8"};
    try {
        apply_overrides(c, args);
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_EQ(e.kind(), ErrorKind::kUsage);
        EXPECT_NE(what.find("2 of the overrides cannot be applied"), std::string::npos) << what;
        EXPECT_NE(what.find("model.num_layrs"), std::string::npos) << what;
        EXPECT_NE(what.find("train.global_bach_size"), std::string::npos) << what;
    }
    const std::vector<std::string> one = {"model.num_layrs=4"};
    try {
        apply_overrides(c, one);
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()).find("of the overrides"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace epo::config
