#include "epo/moe/layer_dump.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "epo/config/recipes.h"
#include "epo/io/safetensors.h"
#include "moe/moe_test_util.h"

namespace epo::moe {
namespace {

std::string temp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() /
            ("epo_dump_" + std::to_string(::getpid()) + "_" + name))
        .string();
}

MoeConfig dump_config(Precision p) {
    MoeConfig c;
    c.hidden_size = 16;
    c.num_experts = 6;
    c.topk = 2;
    c.ffn_hidden_size = 12;
    c.score_function = ScoreFunction::kSigmoid;
    c.enable_expert_bias = true;
    c.load_balancing_type = LoadBalancing::kSeqAuxLoss;
    c.aux_loss_coeff = 0.01;
    c.z_loss_coeff = 0.001;
    c.shared_expert_size = 8;
    c.precision = p;
    return c;
}

// The dump holds exactly the values the layer used: loading its weights and inputs into a fresh
// layer and running it again reproduces its outputs and gradients bit for bit.
TEST(LayerDump, NamesShapesAndReproducibleValues) {
    for (Precision prec : {Precision::kFp32, Precision::kBf16}) {
        MoeLayerDumpOptions o;
        o.cfg = dump_config(prec);
        o.tokens = 20;
        o.num_sequences = 2;
        o.seed = 5;
        o.path = temp_path(std::string("layer_") + precision_name(prec) + ".safetensors");
        o.metadata["model"] = "test";
        const MoeLayerDumpResult r = run_moe_layer_dump(o);
        const io::SafetensorsFile f = io::read_safetensors(o.path);
        EXPECT_EQ(r.num_tensors, static_cast<int>(f.tensors.size()));
        EXPECT_EQ(f.metadata.at("model"), "test");
        const std::int64_t t = 20, h = 16, e = 6, ff = 12, s = 8;
        const std::pair<const char*, Shape> expected[] = {
            {"x", {t, h}},
            {"dy", {t, h}},
            {"router.weight", {e, h}},
            {"router.expert_bias", {e}},
            {"experts.fc1.weight", {e, 2 * ff, h}},
            {"experts.fc2.weight", {e, h, ff}},
            {"shared.fc1.weight", {2 * s, h}},
            {"shared.fc2.weight", {h, s}},
            {"y", {t, h}},
            {"aux_loss", {}},
            {"z_loss", {}},
            {"dx", {t, h}},
            {"router.weight.grad", {e, h}},
            {"experts.fc1.weight.grad", {e, 2 * ff, h}},
            {"experts.fc2.weight.grad", {e, h, ff}},
            {"shared.fc1.weight.grad", {2 * s, h}},
            {"shared.fc2.weight.grad", {h, s}},
        };
        EXPECT_EQ(f.tensors.size(), std::size(expected));
        for (const auto& [name, shape] : expected) {
            ASSERT_NE(f.find(name), nullptr) << name;
            EXPECT_EQ(f.at(name).shape(), shape) << name;
            EXPECT_EQ(f.at(name).dtype(), DType::kF32) << name;
        }

        MoeLayerParams p = make_moe_layer_params(o.cfg);
        for (Param* q : moe_layer_param_list(p)) {
            q->master.copy_from(f.at(q->name));
            refresh_compute(*q);
        }
        p.router.expert_bias.copy_from(f.at("router.expert_bias"));
        const DType dt = compute_dtype(o.cfg);
        Tensor x = testing::to_dtype(f.at("x"), dt), dy = testing::to_dtype(f.at("dy"), dt);
        Tensor y = Tensor::empty(x.shape(), dt), dx = Tensor::empty(x.shape(), dt);
        MoeContext ctx;
        const MoeLosses l = moe_forward(o.cfg, p, x, 2, ctx, y);
        moe_backward(o.cfg, p, dy, 1.0f, ctx, dx);
        EXPECT_TRUE(testing::same_bits(testing::to_f32(y), f.at("y")));
        EXPECT_TRUE(testing::same_bits(testing::to_f32(dx), f.at("dx")));
        EXPECT_EQ(l.aux_loss, f.at("aux_loss").data<float>()[0]);
        EXPECT_EQ(l.z_loss, f.at("z_loss").data<float>()[0]);
        EXPECT_GT(l.aux_loss, 0.0f);
        for (Param* q : moe_layer_param_list(p)) {
            EXPECT_TRUE(testing::same_bits(q->main_grad, f.at(q->name + ".grad"))) << q->name;
        }
        std::remove(o.path.c_str());
    }
}

TEST(LayerDump, SameSeedSameFile) {
    MoeLayerDumpOptions o;
    o.cfg = dump_config(Precision::kBf16);
    o.tokens = 9;
    o.seed = 3;
    o.path = temp_path("a.safetensors");
    run_moe_layer_dump(o);
    const std::string first = o.path;
    o.path = temp_path("b.safetensors");
    run_moe_layer_dump(o);
    std::ifstream a(first, std::ios::binary), b(o.path, std::ios::binary);
    const std::string sa((std::istreambuf_iterator<char>(a)), std::istreambuf_iterator<char>());
    const std::string sb((std::istreambuf_iterator<char>(b)), std::istreambuf_iterator<char>());
    EXPECT_EQ(sa, sb);
    EXPECT_GT(sa.size(), 1000u);
    std::remove(first.c_str());
    std::remove(o.path.c_str());
    o.tokens = 0;
    EXPECT_THROW(run_moe_layer_dump(o), Error);
    o.tokens = 9;
    o.num_sequences = 2;
    EXPECT_THROW(run_moe_layer_dump(o), Error);
}

TEST(MoeConfigFrom, RecipesMapToTheLayer) {
    const MoeConfig q = moe_config_from(config::make_recipe("qwen3-30b-a3b").model);
    EXPECT_EQ(q.hidden_size, 2048);
    EXPECT_EQ(q.num_experts, 128);
    EXPECT_EQ(q.topk, 8);
    EXPECT_EQ(q.ffn_hidden_size, 768);
    EXPECT_EQ(q.score_function, ScoreFunction::kSoftmax);
    EXPECT_EQ(q.load_balancing_type, LoadBalancing::kAuxLoss);
    EXPECT_DOUBLE_EQ(q.aux_loss_coeff, 1e-3);
    EXPECT_EQ(q.shared_expert_size, 0);
    EXPECT_EQ(q.precision, Precision::kBf16);

    const MoeConfig d = moe_config_from(config::make_recipe("deepseek-v3").model);
    EXPECT_EQ(d.score_function, ScoreFunction::kSigmoid);
    EXPECT_TRUE(d.enable_expert_bias);
    EXPECT_EQ(d.num_groups, 8);
    EXPECT_EQ(d.group_topk, 4);
    EXPECT_DOUBLE_EQ(*d.topk_scaling_factor, 2.5);
    EXPECT_EQ(d.load_balancing_type, LoadBalancing::kSeqAuxLoss);
    EXPECT_TRUE(d.router_fp32);
    EXPECT_EQ(d.shared_expert_size, 2048);

    config::ModelConfig dense = config::make_recipe("tiny-moe").model;
    dense.num_moe_experts.reset();
    EXPECT_THROW(moe_config_from(dense), Error);
    config::ModelConfig m = config::make_recipe("tiny-moe").model;
    m.moe_router_load_balancing_type = config::LoadBalancingType::kSinkhorn;
    try {
        moe_config_from(m);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kConfig);
        EXPECT_NE(std::string(e.what()).find("sinkhorn"), std::string::npos);
    }
    // Chunks by tokens were removed; a model that asks for them, even past the rules, is refused
    // with the reason and the fix.
    config::ModelConfig tokens = config::make_recipe("tiny-moe").model;
    tokens.moe_ep_overlap_chunk_by = config::ChunkSplit::kTokens;
    try {
        moe_config_from(tokens);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kConfig);
        const std::string what = e.what();
        EXPECT_NE(what.find("model.moe_ep_overlap_chunk_by=tokens"), std::string::npos) << what;
        EXPECT_NE(what.find("docs/measurements.md"), std::string::npos) << what;
        EXPECT_NE(what.find("set model.moe_ep_overlap_chunk_by=experts"), std::string::npos)
            << what;
    }
}

// An fp32 router in bf16 mode computes exactly what an fp32 layer's router computes on the
// widened input with the fp32 master weight.
TEST(MoeConfigFrom, Fp32RouterUsesTheMasterWeightInF32) {
    MoeConfig c16 = dump_config(Precision::kBf16);
    c16.router_fp32 = true;
    MoeConfig c32 = c16;
    c32.precision = Precision::kFp32;
    RouterParams p16 = make_router_params(c16), p32 = make_router_params(c32);
    fill_normal(p16.weight.master, 1, 0.0f, 1.0f);
    p32.weight.master.copy_from(p16.weight.master);
    refresh_compute(p16.weight);
    refresh_compute(p32.weight);
    fill_normal(p16.expert_bias, 2, 0.0f, 0.1f);
    p32.expert_bias.copy_from(p16.expert_bias);
    Tensor x16 = testing::random_tensor({10, 16}, DType::kBF16, 3);
    Tensor x32 = testing::to_f32(x16);
    Arena a16, a32;
    RouterOutput r16 = router_forward(c16, p16, x16, 2, a16);
    RouterOutput r32 = router_forward(c32, p32, x32, 2, a32);
    EXPECT_TRUE(testing::same_bits(r16.logits, r32.logits));
    EXPECT_TRUE(testing::same_bits(r16.topk_weight, r32.topk_weight));
    Tensor g = testing::random_tensor({10, 2}, DType::kF32, 4);
    Tensor dx16 = Tensor::zeros({10, 16}, DType::kF32), dx32 = Tensor::zeros({10, 16}, DType::kF32);
    router_backward_dgrad(c16, p16, g, 1.0f, r16, dx16, a16);
    router_backward_dgrad(c32, p32, g, 1.0f, r32, dx32, a32);
    router_backward_wgrad(c16, p16, r16, a16);
    router_backward_wgrad(c32, p32, r32, a32);
    EXPECT_TRUE(testing::same_bits(dx16, dx32));
    EXPECT_TRUE(testing::same_bits(p16.weight.main_grad, p32.weight.main_grad));
}

}  // namespace
}  // namespace epo::moe
