#include "epo/train/train_log.h"

#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "epo/train/flops.h"

namespace epo::train {
namespace {

// Regular expressions the reference ecosystem's log parsers use (Megatron-Bridge performance
// tooling and the log parsers built on it).
const std::regex kIteration(R"(\] iteration\s+(\d+)/\s*(\d+)\s*\|)");
const std::regex kElapsed(R"(elapsed time per iteration \(ms\):\s*([\d.]+))");
const std::regex kLmLoss(R"(lm loss:\s*([\d.E+\-]+))");
const std::regex kGradNorm(R"(grad norm:\s*([\d.]+))");
const std::regex kThroughput(R"(throughput per GPU \(TFLOP/s/GPU\):\s*([\d.]+))");
const std::regex kGlobalBatch(R"(global batch size:\s*(\d+))");
const std::regex kStepTime(
    R"(Step Time\s*:\s*([\d.]+)s\s+GPU utilization:\s*([\d.]+)MODEL_TFLOP/s/GPU)");

std::string capture(const std::string& line, const std::regex& re, int group = 1) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(line, m, re)) << line;
    return m.size() > static_cast<size_t>(group) ? m[group].str() : "";
}

TEST(TrainLog, IterationLineMatchesReferenceParsers) {
    IterationLog log{.iteration = 12,
                     .train_iters = 200,
                     .consumed_samples = 768,
                     .elapsed_ms = 812.34,
                     .tflops_per_rank = 0.42,
                     .learning_rate = 3e-4,
                     .global_batch_size = 64,
                     .lm_loss = 5.123456789123,
                     .load_balancing_loss = 1.0001,
                     .grad_norm = 0.0421234567891};
    const std::string line = format_iteration_line(log);
    EXPECT_EQ(capture(line, kIteration, 1), "12");
    EXPECT_EQ(capture(line, kIteration, 2), "200");
    EXPECT_EQ(capture(line, kElapsed), "812.3");
    EXPECT_EQ(capture(line, kThroughput), "0.4");
    EXPECT_EQ(capture(line, kGlobalBatch), "64");
    // At least nine significant digits for exact comparison between runs.
    EXPECT_EQ(capture(line, kLmLoss), "5.123456789E+00");
    EXPECT_EQ(capture(line, kGradNorm), "0.0421234568");
    EXPECT_NE(line.find("load_balancing_loss: 1.000100000E+00 |"), std::string::npos);
    EXPECT_EQ(line.rfind(" [", 0), 0u);
}

// Megatron-Core's MTPLossLoggingHelper adds "mtp_1 loss" to the iteration line; lm loss stays the
// main model's.
TEST(TrainLog, MtpLossFollowsLmLossOnlyWithMtp) {
    IterationLog log{.iteration = 1, .train_iters = 2, .lm_loss = 5.5, .mtp_loss = 6.25};
    const std::string line = format_iteration_line(log);
    EXPECT_EQ(capture(line, kLmLoss), "5.500000000E+00");
    const size_t lm = line.find("lm loss:"), mtp = line.find(" mtp_1 loss: 6.250000000E+00 |");
    ASSERT_NE(mtp, std::string::npos) << line;
    EXPECT_LT(lm, mtp);
    log.mtp_loss.reset();
    EXPECT_EQ(format_iteration_line(log).find("mtp_"), std::string::npos);
}

TEST(TrainLog, StepTimeLineMatchesReferenceParser) {
    const std::string line = format_step_time_line(9.0912, 663.54);
    EXPECT_EQ(line, "Step Time : 9.09s GPU utilization: 663.5MODEL_TFLOP/s/GPU");
    EXPECT_EQ(capture(line, kStepTime, 1), "9.09");
    EXPECT_EQ(capture(line, kStepTime, 2), "663.5");
}

TEST(TrainLog, NanGradNormIsPrintedAsNan) {
    EXPECT_EQ(format_fixed_significant(std::nan(""), 9), "nan");
    EXPECT_EQ(format_fixed_significant(12.3, 9), "12.3000000");
    EXPECT_EQ(format_fixed_significant(0.0, 9), "0.000");
}

TEST(Flops, MatchesHandCountForDenseGpt) {
    // Dense GPT, MHA: 12 L H^2 (1 + 1 + S/(2H)) + 12 L H F g + 6 H V per token... counted by hand
    // for L=2, H=4, F=8, A=2, d=2, S=4, V=10, swiglu (g=1.5), one sample.
    FlopsShape s{.num_layers = 2,
                 .num_moe_layers = 0,
                 .hidden_size = 4,
                 .ffn_hidden_size = 8,
                 .num_attention_heads = 2,
                 .num_query_groups = 2,
                 .kv_channels = 2,
                 .seq_length = 4,
                 .vocab_size = 10};
    const double per_token =
        12.0 * 2 * 4 * 8 * 1.5 + 12.0 * 2 * 16 * (1 + 1 + 4.0 / 8) * 1.0 + 6.0 * 4 * 10;
    EXPECT_DOUBLE_EQ(model_flops(s, 1), 4 * per_token);
}

TEST(Flops, MoeLayersCountTopKExpertsAndSharedExpert) {
    FlopsShape s{.num_layers = 4,
                 .num_moe_layers = 4,
                 .hidden_size = 8,
                 .ffn_hidden_size = 100,
                 .moe_ffn_hidden_size = 6,
                 .moe_shared_expert_intermediate_size = 6,
                 .moe_router_topk = 2,
                 .num_attention_heads = 2,
                 .num_query_groups = 1,
                 .kv_channels = 4,
                 .seq_length = 16,
                 .vocab_size = 32};
    FlopsShape dense_equivalent = s;  // one dense MLP of width (K+1)*F_moe
    dense_equivalent.num_moe_layers = 0;
    dense_equivalent.ffn_hidden_size = 3 * 6;
    EXPECT_DOUBLE_EQ(model_flops(s, 3), model_flops(dense_equivalent, 3));
}

TEST(Flops, MtpAddsItsNormsProjectionAndOutputLayer) {
    // The MTP's transformer layer is one of num_layers; D = 1 adds 6 (3 H + 2 H^2) for its norms
    // and eh_proj and 6 H V for its output layer per token: H 4, V 10, S 4.
    FlopsShape s{.num_layers = 3,
                 .hidden_size = 4,
                 .ffn_hidden_size = 8,
                 .num_attention_heads = 2,
                 .num_query_groups = 2,
                 .kv_channels = 2,
                 .seq_length = 4,
                 .vocab_size = 10};
    const double without = model_flops(s, 2);
    s.mtp_num_layers = 1;
    EXPECT_DOUBLE_EQ(model_flops(s, 2) - without, 2 * 4 * 6.0 * ((3 * 4 + 2 * 16) + 4 * 10));
}

TEST(Flops, MlaCountsItsProjectionsAndCoreAttentionByHand) {
    // One MLA layer, no MLP or vocabulary: H 8, N 2, Rq 4, Rkv 3, Dn 2, Dr 2, Dv 3, S 4.
    // q: 4 (8 + 2 x 4 + 1) = 68; kv: 3 (8 + 2 x 5 + 1) + 8 x 2 = 73; proj: 2 x 3 x 8 = 48;
    // core: 4 (2 x 4 + 2 x 3) / 2 = 28; x 6 = 1302 per token, 4 tokens.
    FlopsShape s{.num_layers = 1,
                 .hidden_size = 8,
                 .num_attention_heads = 2,
                 .seq_length = 4,
                 .multi_latent_attention = true,
                 .q_lora_rank = 4,
                 .kv_lora_rank = 3,
                 .qk_head_dim = 2,
                 .qk_pos_emb_head_dim = 2,
                 .v_head_dim = 3};
    EXPECT_DOUBLE_EQ(model_flops(s, 1), 4 * 6.0 * (68 + 73 + 48 + 28));
    // Without q_lora_rank the query projection is H x N Dq = 64.
    s.q_lora_rank = 0;
    EXPECT_DOUBLE_EQ(model_flops(s, 1), 4 * 6.0 * (64 + 73 + 48 + 28));
}

}  // namespace
}  // namespace epo::train
