// RMSNorm, rotary embedding, embedding and the LM head with its loss.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "epo/model/embedding.h"
#include "epo/model/lm_head.h"
#include "epo/model/rmsnorm.h"
#include "epo/model/rope.h"
#include "epo/tensor/random.h"
#include "finite_difference.h"

namespace epo::model {
namespace {

using epo::testing::dot;
using epo::testing::expect_gradient_matches;

TEST(RmsNorm, GradientsMatchFiniteDifferences) {
    const int64_t n = 5, d = 7;
    Param w = make_param("norm", {d}, DType::kF32);
    fill_uniform(w.master, 1, 0.5f, 1.5f);
    Tensor x = Tensor::empty({n, d}, DType::kF32), r = Tensor::empty({n, d}, DType::kF32);
    fill_normal(x, 2, 0.0f, 1.0f);
    fill_normal(r, 3, 0.0f, 1.0f);
    auto loss = [&] {
        Tensor y = Tensor::empty({n, d}, DType::kF32), rstd = Tensor::empty({n}, DType::kF32);
        rmsnorm_forward(x, w, 1e-6f, y, rstd);
        return dot(y, r);
    };
    Tensor y = Tensor::empty({n, d}, DType::kF32), rstd = Tensor::empty({n}, DType::kF32);
    rmsnorm_forward(x, w, 1e-6f, y, rstd);
    Tensor dx = Tensor::zeros({n, d}, DType::kF32), ws = Tensor::empty({d}, DType::kF32);
    rmsnorm_backward(x, w, rstd, r, dx, ws);
    Tensor gw = w.main_grad.clone();
    expect_gradient_matches("dx", x.data<float>(), dx.data<float>(), x.numel(), loss, 20, 1e-3f);
    expect_gradient_matches("dw", w.master.data<float>(), gw.data<float>(), d, loss, 7, 1e-3f);
}

TEST(RmsNorm, OutputHasUnitRmsTimesWeight) {
    Param w = make_param("norm", {4}, DType::kF32);
    for (int j = 0; j < 4; ++j)
        w.master.data<float>()[j] = 2.0f;
    Tensor x = Tensor::empty({1, 4}, DType::kF32), y = Tensor::empty({1, 4}, DType::kF32);
    Tensor rstd = Tensor::empty({1}, DType::kF32);
    const float v[4] = {1, -2, 3, -4};
    std::copy(v, v + 4, x.data<float>());
    rmsnorm_forward(x, w, 0.0f, y, rstd);
    const float rms = std::sqrt((1 + 4 + 9 + 16) / 4.0f);
    for (int j = 0; j < 4; ++j)
        EXPECT_NEAR(y.data<float>()[j], 2.0f * v[j] / rms, 1e-6);
}

TEST(Rope, InverseUndoesForwardAndPositionZeroIsIdentity) {
    const RopeTable t = make_rope_table(6, 8, 10000.0);
    std::vector<float> x(12 * 2 * 8), orig;
    for (size_t i = 0; i < x.size(); ++i)
        x[i] = std::sin(0.37f * i);
    orig = x;
    rope_apply(t, x.data(), 12, 16, 0, 2, false);
    for (int j = 0; j < 16; ++j)
        EXPECT_FLOAT_EQ(x[j], orig[j]);  // token 0: position 0
    EXPECT_NE(x[16 + 1], orig[16 + 1]);
    rope_apply(t, x.data(), 12, 16, 0, 2, true);
    for (size_t i = 0; i < x.size(); ++i)
        EXPECT_NEAR(x[i], orig[i], 1e-6);
}

TEST(Rope, PreservesNormsAndRelativePositions) {
    // <rope(q, p), rope(k, p')> depends only on p - p'.
    const RopeTable t = make_rope_table(16, 4, 10000.0);
    auto rotated_dot = [&](int p, int pk) {
        std::vector<float> q(16 * 4, 0.0f), k(16 * 4, 0.0f);
        const float qv[4] = {0.3f, -1.2f, 0.5f, 0.9f}, kv[4] = {1.1f, 0.2f, -0.7f, 0.4f};
        std::copy(qv, qv + 4, q.begin() + p * 4);
        std::copy(kv, kv + 4, k.begin() + pk * 4);
        rope_apply(t, q.data(), 16, 4, 0, 1, false);
        rope_apply(t, k.data(), 16, 4, 0, 1, false);
        float s = 0;
        for (int i = 0; i < 4; ++i)
            s += q[p * 4 + i] * k[pk * 4 + i];
        return s;
    };
    EXPECT_NEAR(rotated_dot(5, 2), rotated_dot(12, 9), 1e-5);
}

TEST(Embedding, ForwardLooksUpAndBackwardAccumulatesRepeatedTokens) {
    Param table = make_param("emb", {5, 3}, DType::kF32);
    fill_normal(table.master, 1, 0.0f, 1.0f);
    const std::vector<int32_t> tokens = {4, 1, 4};
    Tensor x = Tensor::empty({3, 3}, DType::kF32);
    embedding_forward(table, tokens, x);
    for (int j = 0; j < 3; ++j)
        EXPECT_EQ(x.data<float>()[j], table.master.data<float>()[12 + j]);
    Tensor dx = Tensor::empty({3, 3}, DType::kF32);
    for (int i = 0; i < 9; ++i)
        dx.data<float>()[i] = static_cast<float>(i);
    embedding_backward(table, tokens, dx);
    EXPECT_EQ(table.main_grad.data<float>()[12], 0.0f + 6.0f);
    EXPECT_EQ(table.main_grad.data<float>()[3 + 1], 4.0f);
    EXPECT_EQ(table.main_grad.data<float>()[0], 0.0f);
    const std::vector<int32_t> bad = {5};
    Tensor x1 = Tensor::empty({1, 3}, DType::kF32);
    EXPECT_THROW(embedding_forward(table, bad, x1), Error);
}

TEST(LmHead, LossAndGradientsMatchFiniteDifferences) {
    const int64_t T = 6, H = 5, V = 300;  // V > kChunk rows is irrelevant; T spans one chunk
    Param w = make_param("out", {V, H}, DType::kF32);
    fill_normal(w.master, 1, 0.0f, 0.5f);
    Tensor h = Tensor::empty({T, H}, DType::kF32);
    fill_normal(h, 2, 0.0f, 1.0f);
    const std::vector<int32_t> labels = {0, 7, 299, 7, 150, 3};
    Arena saved("saved"), scratch("scratch");
    auto loss = [&] {
        LmHeadContext c;
        saved.reset();
        scratch.reset();
        return lm_head_forward(w, h, labels, 1.0f, c, saved, scratch);
    };
    LmHeadContext ctx;
    const double l = lm_head_forward(w, h, labels, 1.0f, ctx, saved, scratch);
    EXPECT_GT(l, 0.0);
    Tensor dh = Tensor::empty({T, H}, DType::kF32);
    lm_head_backward_dgrad(w, ctx, dh);
    Arena s2("s2");
    lm_head_backward_wgrad(w, false, ctx, s2);
    Tensor dh_copy = dh.clone(), gw = w.main_grad.clone();
    expect_gradient_matches("dh", h.data<float>(), dh_copy.data<float>(), h.numel(), loss, 12,
                            1e-2f);
    expect_gradient_matches("dW", w.master.data<float>(), gw.data<float>(), w.master.numel(), loss,
                            20, 1e-2f);
}

TEST(LmHead, UniformLogitsGiveLogVocab) {
    const int64_t T = 3, H = 4, V = 256;
    Param w = make_param("out", {V, H}, DType::kF32);  // zero weights: uniform prediction
    Tensor h = Tensor::empty({T, H}, DType::kF32);
    fill_normal(h, 2, 0.0f, 1.0f);
    const std::vector<int32_t> labels = {1, 2, 3};
    Arena saved("saved"), scratch("scratch");
    LmHeadContext ctx;
    EXPECT_NEAR(lm_head_forward(w, h, labels, 1.0f, ctx, saved, scratch), std::log(256.0), 1e-6);
}

}  // namespace
}  // namespace epo::model
