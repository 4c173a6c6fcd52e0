// The whole model (gpt_model.h) at TP = every rank of the job against TP 1, with and without
// sequence parallelism: initial weights, losses, every gradient, and the router's aux and z
// losses. Runs with the TensorParallel suite (tensor_parallel_test_util.h, instantiated in
// tensor_parallel_mpi_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "epo/comm/process_groups.h"
#include "epo/model/gpt_model.h"
#include "epo/model/tensor_parallel.h"
#include "epo/tensor/random.h"
#include "tensor_parallel_test_util.h"

namespace epo::model {
namespace {

// The whole model (gpt_model.h), a dense layer then a MoE layer with a shared expert, at TP n
// (GptShape::tp_size) against TP 1 with the same seed: the initial weights are TP 1's slices bit
// for bit; after two micro-batches' forward and backward the losses and every gradient agree
// within 1e-5: sharded ones against TP 1's slices; replicated ones (norms, router, experts and
// the shared expert, which run on the rank's rows) summed over the TP group under SP, as they
// are without it (every rank saw every token); the q/k norms (the rank's heads) summed always.
// `router` sets the MoE layer's router (its losses, score function, expert bias); the layer's
// aux and z losses (summed over the TP group under SP: each rank's is its share) agree with TP 1's
// within 1e-5 too, and the router weight's gradient within 1e-5 (relative, L2).
void expect_gpt_model_matches_one_rank(bool sp, int64_t micro_batch_size, int64_t S,
                                       const std::function<void(moe::MoeConfig&)>& router) {
    auto groups = make_groups_spanning_job(comm::GroupKind::kTensorParallel);
    comm::Communicator& tp = groups->tp;
    const int n = tp.size(), r = tp.rank();
    const int64_t H = 16, A = 8, G = 4, d = 4, V = 32, F = 12;
    GptShape full{.num_layers = 2,
                  .hidden = H,
                  .vocab = V,
                  .seq_length = S,
                  .micro_batch_size = micro_batch_size,
                  .attn = qk_norm_attention(H, A, G, d, S),
                  .init_std = 0.2f,
                  .ffn_hidden = F,
                  .moe_layers = {false, true},
                  .compute_dtype = DType::kF32};
    full.moe.hidden_size = H;
    full.moe.num_experts = 4;
    full.moe.topk = 2;
    full.moe.ffn_hidden_size = 8;
    full.moe.shared_expert_size = 8;
    full.moe.precision = moe::Precision::kFp32;
    router(full.moe);
    GptShape mine = full;
    mine.tp_size = n;
    mine.tp_rank = r;
    mine.sequence_parallel = sp;
    GptModel one(full), many(mine);
    one.init_weights(7);
    many.init_weights(7);
    if (full.moe.enable_expert_bias) {  // a bias that changes the choices (0 after init)
        fill_normal(one.layer(1).moe.router.expert_bias, 17, 0.0f, 0.3f);
        fill_normal(many.layer(1).moe.router.expert_bias, 17, 0.0f, 0.3f);
    }
    std::vector<Param*> want = one.dense_params(), got = many.dense_params();
    want.insert(want.end(), one.expert_params().begin(), one.expert_params().end());
    got.insert(got.end(), many.expert_params().begin(), many.expert_params().end());
    ASSERT_EQ(want.size(), got.size());
    // How rank r's shard is cut from the TP 1 tensor: row blocks, columns (empty), or whole.
    auto cut = [&](const std::string& name) -> std::pair<int, std::vector<int64_t>> {
        if (name.find("word_embeddings") != std::string::npos || name == "output_layer.weight")
            return {1, {V}};
        if (name.find("linear_qkv") != std::string::npos)
            return {1, {A * d, G * d, G * d}};
        if (name.find(".mlp.linear_fc1") != std::string::npos)
            return {1, {F, F}};
        if (name.find("linear_proj") != std::string::npos ||
            name.find(".mlp.linear_fc2") != std::string::npos)
            return {2, {}};
        return {0, {}};
    };
    auto slice = [&](const Tensor& whole, const Param& like) {
        const auto [kind, blocks] = cut(like.name);
        Tensor t = Tensor::empty(like.master.shape(), DType::kF32);
        if (kind == 1)
            tp_copy_row_shard(whole, blocks, n, r, t);
        else if (kind == 2)
            tp_copy_column_shard(whole, n, r, t);
        else
            t.copy_from(whole);
        return t;
    };
    for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i]->name, want[i]->name);
        expect_bits(got[i]->master, slice(want[i]->master, *got[i]), got[i]->name.c_str());
    }

    std::vector<std::vector<int32_t>> tokens(2), labels(2);
    for (size_t mb = 0; mb < 2; ++mb) {
        for (int64_t t = 0; t < micro_batch_size * S; ++t) {
            tokens[mb].push_back(static_cast<int32_t>(random_bits(60 + mb, t) % V));
            labels[mb].push_back(static_cast<int32_t>(random_bits(70 + mb, t) % V));
        }
    }
    moe::DispatchComms alone(groups->ep), comms(groups->ep);  // EP 1
    comms.tp = &tp;
    step_expecting_equal_losses(one, alone, many, comms, tokens, labels);
    // The MoE layer's losses: under SP each rank's share, summed over the group.
    const LayerStepStats &stats_one = one.layer_stats()[1], &stats_many = many.layer_stats()[1];
    const auto group_total = [&](double v) {
        if (!sp || n == 1)
            return v;
        float f = static_cast<float>(v);
        tp.all_reduce_sum(std::span<float>(&f, 1));
        return static_cast<double>(f);
    };
    const double aux = group_total(stats_many.aux_loss), z = group_total(stats_many.z_loss);
    if (r == 0 && (stats_one.aux_loss > 0 || stats_one.z_loss > 0)) {
        std::printf("TP %d%s vs TP 1: aux loss %.3g, z loss %.3g (relative)\n", n,
                    sp ? " + SP" : "", std::abs(aux - stats_one.aux_loss) / stats_one.aux_loss,
                    std::abs(z - stats_one.z_loss) / stats_one.z_loss);
    }
    EXPECT_NEAR(aux, stats_one.aux_loss, 1e-5 * std::abs(stats_one.aux_loss)) << "aux loss";
    EXPECT_NEAR(z, stats_one.z_loss, 1e-5 * std::abs(stats_one.z_loss)) << "z loss";
    EXPECT_EQ(
        full.moe.aux_loss_coeff > 0 && full.moe.load_balancing_type != moe::LoadBalancing::kNone,
        stats_one.aux_loss > 0);
    EXPECT_EQ(full.moe.z_loss_coeff > 0, stats_one.z_loss > 0);
    // The model's list of TP-summed parameters is exactly the dense replicated ones under SP,
    // and the q/k norms alone without it.
    const std::vector<Param*>& summed = many.tp_summed_params();
    const auto is_summed = [&](const Param* p) {
        return std::find(summed.begin(), summed.end(), p) != summed.end();
    };
    size_t want_summed = 0;
    for (Param* p : many.dense_params()) {
        const bool heads = p->name.find("q_layernorm") != std::string::npos ||
                           p->name.find("k_layernorm") != std::string::npos;
        const bool expect = n > 1 && (heads || (cut(p->name).first == 0 && sp));
        EXPECT_EQ(is_summed(p), expect) << p->name;
        want_summed += expect;
    }
    EXPECT_EQ(summed.size(), want_summed);
    for (size_t i = 0; i < want.size(); ++i) {
        Param& p = *got[i];
        // The experts' gradients: summed by the EDP group (here the TP group) under SP.
        const bool expert = p.name.find(".mlp.experts.") != std::string::npos;
        if (is_summed(&p) || (expert && sp))
            tp.all_reduce_sum(std::span<float>(p.main_grad.data<float>(), p.main_grad.numel()));
        expect_near(p.main_grad, slice(want[i]->main_grad, p), 1e-5, p.name.c_str());
        if (p.name.find("router.weight") != std::string::npos) {
            const Tensor& w = want[i]->main_grad;
            double diff_sq = 0, ref_sq = 0;
            for (int64_t j = 0; j < w.numel(); ++j) {
                const double d = p.main_grad.data<float>()[j] - w.data<float>()[j];
                diff_sq += d * d;
                ref_sq += static_cast<double>(w.data<float>()[j]) * w.data<float>()[j];
            }
            ASSERT_GT(ref_sq, 0);
            if (r == 0)
                std::printf("TP %d%s vs TP 1: router weight gradient %.3g (relative, L2)\n", n,
                            sp ? " + SP" : "", std::sqrt(diff_sq / ref_sq));
            EXPECT_LT(std::sqrt(diff_sq / ref_sq), 1e-5) << p.name;
        }
    }
}

TEST_P(TensorParallel, GptModelMatchesOneRank) {
    expect_gpt_model_matches_one_rank(GetParam(), 2, 6, [](moe::MoeConfig&) {});
}

// The router's aux loss and z loss with TP (issue #42, RT042): under SP each rank routes its rows
// and takes the load-balancing counts over the TP group. Three sequences of 4 tokens over TP 2
// and 4, so shards (6 or 3 rows) straddle sequences.
TEST_P(TensorParallel, GptModelRouterLossesMatchOneRank) {
    {
        SCOPED_TRACE("softmax router, aux_loss, z loss");
        expect_gpt_model_matches_one_rank(GetParam(), 3, 4, [](moe::MoeConfig& m) {
            m.load_balancing_type = moe::LoadBalancing::kAuxLoss;
            m.aux_loss_coeff = 1.0;
            m.z_loss_coeff = 0.1;
        });
    }
    {
        SCOPED_TRACE("sigmoid router with expert bias, seq_aux_loss, z loss");
        expect_gpt_model_matches_one_rank(GetParam(), 3, 4, [](moe::MoeConfig& m) {
            m.score_function = moe::ScoreFunction::kSigmoid;
            m.enable_expert_bias = true;
            m.load_balancing_type = moe::LoadBalancing::kSeqAuxLoss;
            m.aux_loss_coeff = 1.0;
            m.z_loss_coeff = 0.1;
        });
    }
}
}  // namespace
}  // namespace epo::model
