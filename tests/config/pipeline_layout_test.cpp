// The pipeline split (src/epo/config/pipeline_layout.h): layers per (stage, model chunk) for each
// of the reference's four ways, and every rule, with bad input (negative, missing, contradictory
// layouts) named by field and value; and the fp8 settings' rules (fp8_rules.h).
#include "epo/config/pipeline_layout.h"

#include <gtest/gtest.h>

#include "epo/config/fp8_rules.h"
#include "epo/core/error.h"

namespace epo::config {
namespace {

ModelConfig model(int layers, int pp, std::optional<int> vpp = std::nullopt) {
    ModelConfig m;
    m.num_layers = layers;
    m.pipeline_model_parallel_size = pp;
    m.virtual_pipeline_model_parallel_size = vpp;
    return m;
}

std::vector<std::vector<int>> counts(const PipelineLayout& l) {
    std::vector<std::vector<int>> out;
    for (const auto& stage : l.chunks) {
        out.emplace_back();
        for (const ModelChunk& c : stage)
            out.back().push_back(c.num_layers);
    }
    return out;
}

std::string error_of(const ModelConfig& m) {
    const std::optional<Finding> f = check_pipeline_layout(m);
    EXPECT_TRUE(f.has_value());
    if (!f)
        return "";
    EXPECT_EQ(f->id, "LY005");
    return f->field + " = " + f->value + ": " + f->message + "; " + f->fix;
}

TEST(PipelineLayout, EvenSplitGivesEachChunkItsBlockInChunkMajorOrder) {
    const PipelineLayout l = pipeline_layout(model(16, 4, 2));
    EXPECT_TRUE(l.even);
    EXPECT_EQ(counts(l), (std::vector<std::vector<int>>(4, {2, 2})));
    // Chunk c of stage s holds block c P + s: stage 1's chunk 1 starts at layer (4 + 1) x 2.
    EXPECT_EQ(l.chunks[1][1].first_layer, 10);
    EXPECT_TRUE(l.chunks[0][0].embedding);
    EXPECT_TRUE(l.chunks[3][1].loss);
    // LY005 as the reference rules it: L divisible by PP x VPP, with the ways out named.
    const std::string e = error_of(model(94, 8, 4));
    EXPECT_NE(e.find("model.num_layers = 94"), std::string::npos) << e;
    EXPECT_NE(e.find("account_for_embedding_in_pipeline_split"), std::string::npos) << e;
}

TEST(PipelineLayout, AccountingForEmbeddingAndLossSplitsQwen3_235B) {
    // 94 layers + embedding + loss = 96 slots over PP 8 x VPP 4: 3 a chunk, the first chunk 2
    // layers and the embedding, the last 2 layers and the loss.
    ModelConfig m = model(94, 8, 4);
    m.account_for_embedding_in_pipeline_split = true;
    m.account_for_loss_in_pipeline_split = true;
    const PipelineLayout l = pipeline_layout(m);
    EXPECT_FALSE(l.even);
    EXPECT_EQ(l.chunks[0][0].num_layers, 2);
    EXPECT_EQ(l.chunks[7][3].num_layers, 2);
    EXPECT_EQ(l.chunks[3][2].num_layers, 3);
    EXPECT_EQ(l.stage_layers(0), 11);
    EXPECT_EQ(l.stage_layers(4), 12);
    EXPECT_EQ(l.chunks[7][3].first_layer + l.chunks[7][3].num_layers, 94);
    // Only the embedding: 95 slots do not split over 32 chunks.
    m.account_for_loss_in_pipeline_split = false;
    EXPECT_NE(error_of(m).find("(95)"), std::string::npos) << error_of(m);
}

TEST(PipelineLayout, FirstAndLastStageSizesLeaveTheMiddleEven) {
    ModelConfig m = model(94, 8);
    m.num_layers_in_first_pipeline_stage = 10;
    m.num_layers_in_last_pipeline_stage = 12;
    const PipelineLayout l = pipeline_layout(m);
    EXPECT_EQ(l.stage_layers(0), 10);
    EXPECT_EQ(l.stage_layers(7), 12);
    EXPECT_EQ(l.stage_layers(3), 12);  // (94 - 22) / 6
    // With VPP the edge sizes must divide by it, and so must each middle stage's.
    ModelConfig v = model(94, 8, 4);
    v.num_layers_in_first_pipeline_stage = 10;
    v.num_layers_in_last_pipeline_stage = 12;
    const std::string e = error_of(v);
    EXPECT_NE(e.find("model.num_layers_in_first_pipeline_stage = 10"), std::string::npos) << e;
    EXPECT_NE(e.find("divisible by the virtual pipeline size 4"), std::string::npos) << e;
    // The middle stages must share the rest evenly.
    m.num_layers_in_first_pipeline_stage = 11;
    EXPECT_NE(error_of(m).find("leaving 71 for 6 middle stage(s)"), std::string::npos)
        << error_of(m);
}

TEST(PipelineLayout, RefusesNegativeMissingAndContradictorySplits) {
    ModelConfig neg = model(16, 4);
    neg.num_layers_in_last_pipeline_stage = -2;
    const std::string n = error_of(neg);
    EXPECT_NE(n.find("model.num_layers_in_last_pipeline_stage = -2: must be larger than 0"),
              std::string::npos)
        << n;
    ModelConfig no_pp = model(16, 1);
    no_pp.num_layers_in_first_pipeline_stage = 4;
    EXPECT_NE(error_of(no_pp).find("needs pipeline parallelism"), std::string::npos);
    ModelConfig both = model(16, 4);
    both.num_layers_in_first_pipeline_stage = 4;
    both.account_for_loss_in_pipeline_split = true;
    EXPECT_NE(error_of(both).find("cannot be set together"), std::string::npos);
    ModelConfig layout_and_first = model(14, 4);
    layout_and_first.pipeline_model_parallel_layout = "Ett|(tt|)*6L";
    layout_and_first.num_layers_in_first_pipeline_stage = 2;
    EXPECT_NE(error_of(layout_and_first).find("cannot be combined"), std::string::npos);
    // More model chunks than layers, and a repetition that would expand without bound.
    EXPECT_NE(error_of(model(16, 1 << 30, 4)).find("model chunks for 16 layers"),
              std::string::npos);
    ModelConfig huge = model(14, 4);
    huge.pipeline_model_parallel_layout = "((((t)*99999)*99999)*99999)";
    EXPECT_NE(error_of(huge).find("expands to more than"), std::string::npos);
    // pipeline_layout() raises the same as an Error naming the field.
    try {
        pipeline_layout(neg);
        FAIL() << "a negative stage size was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kConfig);
        EXPECT_NE(std::string(e.what()).find("num_layers_in_last_pipeline_stage"),
                  std::string::npos);
    }
}

TEST(PipelineLayout, LayoutStringOfTheDeepSeekV3Proxy) {
    // Ett|(tt|)*6mL over PP 4: 8 segments, so VPP 2; segment i is chunk i / 4 of stage i % 4.
    ModelConfig m = model(14, 4);
    m.mtp_num_layers = 1;
    m.pipeline_model_parallel_layout = "Ett|(tt|)*6mL";
    const PipelineLayout l = pipeline_layout(m);
    EXPECT_EQ(l.num_chunks, 2);
    EXPECT_EQ(counts(l), (std::vector<std::vector<int>>{{2, 2}, {2, 2}, {2, 2}, {2, 0}}));
    EXPECT_TRUE(l.chunks[0][0].embedding);
    EXPECT_TRUE(l.chunks[3][1].loss);
    EXPECT_EQ(l.chunks[3][1].num_mtp_layers, 1);
    EXPECT_EQ(l.chunks[0][1].first_layer, 8);  // after the 4 stages' first chunks
}

TEST(PipelineLayout, RefusesMalformedLayoutStrings) {
    const auto bad = [](int layers, int pp, const char* text, std::optional<int> mtp = 1) {
        ModelConfig m = model(layers, pp);
        m.mtp_num_layers = mtp;
        m.pipeline_model_parallel_layout = text;
        return error_of(m);
    };
    EXPECT_NE(bad(14, 4, "Ett|(tt|mL").find("never closed"), std::string::npos);
    EXPECT_NE(bad(14, 4, "Ett|tt)|mL").find("closes no group"), std::string::npos);
    EXPECT_NE(bad(14, 4, "Ett|(tt|)*mL").find("count of 1 or more"), std::string::npos);
    EXPECT_NE(bad(14, 4, "Ext|(tt|)*6mL").find("'x' at 1"), std::string::npos);
    EXPECT_NE(bad(14, 3, "Ett|(tt|)*6mL").find("8 segments do not split over PP 3"),
              std::string::npos);
    EXPECT_NE(bad(12, 4, "Ett|(tt|)*6mL").find("holds 14 transformer layers"), std::string::npos);
    EXPECT_NE(bad(14, 4, "Ett|(tt|)*6mL", std::nullopt).find("1 MTP layers (m)"),
              std::string::npos);
    EXPECT_NE(bad(14, 4, "tt|E(tt|)*6mL").find("embedding (E) in segment 1"), std::string::npos);
    EXPECT_NE(bad(14, 4, "Ett|(tt|)*6m").find("0 loss(es)"), std::string::npos);
    EXPECT_NE(bad(14, 4, "Etmt|(tt|)*6L").find("MTP layers belong to the last stage"),
              std::string::npos);
    // A VPP that contradicts the layout's.
    ModelConfig m = model(14, 4, 4);
    m.mtp_num_layers = 1;
    m.pipeline_model_parallel_layout = "Ett|(tt|)*6mL";
    const std::optional<Finding> f = check_pipeline_layout(m);
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->field, "model.virtual_pipeline_model_parallel_size");
    EXPECT_NE(f->fix.find("virtual_pipeline_model_parallel_size=2"), std::string::npos);
}

}  // namespace
}  // namespace epo::config

namespace epo::config {
namespace {

std::vector<std::string> fp8_ids(const ModelConfig& m, const char* gpu) {
    std::vector<std::string> out;
    for (const Finding& f : check_fp8(m, gpu))
        out.push_back(f.id);
    return out;
}

TEST(Fp8Rules, FormatRecipeDeviceAndPrecision) {
    ModelConfig m;
    m.bf16 = true;
    EXPECT_TRUE(fp8_ids(m, "h100").empty());  // no fp8, the default recipe
    m.fp8 = "e4m3";
    EXPECT_TRUE(fp8_ids(m, "h100").empty());
    m.fp8 = "e5m2";
    EXPECT_EQ(fp8_ids(m, "h100"), std::vector<std::string>{"FP001"});
    m.fp8 = "hybrid";
    m.fp8_recipe = "blockwise";
    EXPECT_TRUE(fp8_ids(m, "h100").empty());
    m.fp8_recipe = "nvfp4";
    EXPECT_EQ(fp8_ids(m, "b200"), std::vector<std::string>{"FP002"});
    m.fp8_recipe = "mxfp8";
    EXPECT_EQ(fp8_ids(m, "h200"), std::vector<std::string>{"FP003"});
    EXPECT_TRUE(fp8_ids(m, "b200").empty());
    m.bf16 = false;
    const std::vector<Finding> f = check_fp8(m, "gb200");
    ASSERT_EQ(f.size(), 1u);
    EXPECT_EQ(f[0].id, "FP004");
    EXPECT_EQ(f[0].field, "model.fp8");
    EXPECT_NE(f[0].fix.find("model.bf16=true"), std::string::npos);
}

}  // namespace
}  // namespace epo::config
