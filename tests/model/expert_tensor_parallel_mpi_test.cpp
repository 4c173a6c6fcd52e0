// Expert tensor parallelism at model level (GptShape::etp_size; moe/alltoall_dispatcher.h): the
// job's n ranks are one ETP group (TP 1, EP 1), each rank's experts the 1/n shard of every
// expert's FFN, and each rank runs its own micro-batches (as n data-parallel ranks would). Against
// ETP 1 on one rank, the same seed, each rank's tokens: the initial expert weights are ETP 1's
// slices bit for bit (the rest equal), the losses and the dense gradients agree, and each rank's
// expert-shard gradient equals the slice of the ETP 1 gradients summed over the ranks (every
// shard computes on every rank's rows, which ETP's gather brings it). Runs under the model area's
// TensorParallel filter (ctest model_mpi_tensor_parallel_np2/np4) and at 1 rank.
//
// Letters: n ranks (the ETP group), L local experts, F expert FFN width, H hidden.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "epo/comm/process_groups.h"
#include "epo/core/error.h"
#include "epo/model/gpt_model.h"
#include "epo/model/tensor_parallel.h"
#include "epo/tensor/random.h"
#include "tensor_parallel_test_util.h"

namespace epo::model {
namespace {

// Rank r's ETP shard of an ETP 1 expert tensor `whole` (f32): fc1 (L, 2F, H) by its gate and up
// row blocks, fc2 (L, H, F) by columns; `like` gives the shard's shape.
Tensor etp_slice(const Tensor& whole, const Param& like, int64_t F, int n, int r) {
    Tensor t = Tensor::empty(like.master.shape(), DType::kF32);
    const int64_t L = whole.dim(0);
    const bool fc1 = like.name.find("linear_fc1") != std::string::npos;
    const int64_t cols = whole.numel() / whole.dim(0) / whole.dim(1);
    const Tensor whole2d = whole.view({whole.numel() / cols, cols});
    const Tensor t2d = t.view({t.numel() / like.master.shape()[2], like.master.shape()[2]});
    if (fc1)
        tp_copy_row_shard(whole2d, std::vector<int64_t>(static_cast<size_t>(2 * L), F), n, r, t2d);
    else
        tp_copy_column_shard(whole2d, n, r, t2d);
    return t;
}

TEST(ExpertTensorParallel, GptModelMatchesOneRank) {
    auto groups = make_groups_spanning_job(comm::GroupKind::kExpertTensorParallel);
    comm::Communicator& etp = groups->etp;
    const int n = etp.size(), r = etp.rank();
    ASSERT_EQ(groups->ep.size(), 1);
    const int64_t H = 16, S = 6, V = 32, F = 8;
    GptShape full{.num_layers = 2,
                  .hidden = H,
                  .vocab = V,
                  .seq_length = S,
                  .micro_batch_size = 2,
                  .attn = {.hidden = H,
                           .num_heads = 4,
                           .num_groups = 2,
                           .head_dim = 4,
                           .seq_length = S,
                           .norm_eps = 1e-6f},
                  .init_std = 0.2f,
                  .ffn_hidden = 12,
                  .moe_layers = {true, true},
                  .compute_dtype = DType::kF32};
    full.moe.hidden_size = H;
    full.moe.num_experts = 4;
    full.moe.topk = 2;
    full.moe.ffn_hidden_size = F;
    full.moe.shared_expert_size = 8;
    full.moe.precision = moe::Precision::kFp32;
    GptShape mine = full;
    mine.etp_size = n;
    mine.etp_rank = r;
    GptModel one(full), many(mine);
    one.init_weights(7);
    many.init_weights(7);
    // Dense parameters whole and equal; the experts ETP 1's slices, bit for bit.
    ASSERT_EQ(one.dense_params().size(), many.dense_params().size());
    for (size_t i = 0; i < one.dense_params().size(); ++i) {
        const Param &w = *one.dense_params()[i], &g = *many.dense_params()[i];
        ASSERT_EQ(g.master.nbytes(), w.master.nbytes()) << g.name;
        EXPECT_EQ(0, std::memcmp(g.master.raw(), w.master.raw(), g.master.nbytes())) << g.name;
    }
    const std::vector<Param*>&want_e = one.expert_params(), &got_e = many.expert_params();
    ASSERT_EQ(want_e.size(), got_e.size());
    ASSERT_EQ(want_e.size(), 4u);  // fc1, fc2 of two MoE layers
    for (size_t i = 0; i < want_e.size(); ++i) {
        ASSERT_EQ(got_e[i]->name, want_e[i]->name);
        EXPECT_EQ(got_e[i]->master.numel() * n, want_e[i]->master.numel()) << got_e[i]->name;
        const Tensor s = etp_slice(want_e[i]->master, *got_e[i], F, n, r);
        EXPECT_EQ(0, std::memcmp(got_e[i]->master.raw(), s.raw(), s.nbytes())) << got_e[i]->name;
    }

    // Each rank's own two micro-batches.
    std::vector<std::vector<int32_t>> tokens(2), labels(2);
    for (size_t mb = 0; mb < 2; ++mb) {
        for (int64_t t = 0; t < 2 * S; ++t) {
            tokens[mb].push_back(static_cast<int32_t>(random_bits(60 + mb + 10 * r, t) % V));
            labels[mb].push_back(static_cast<int32_t>(random_bits(70 + mb + 10 * r, t) % V));
        }
    }
    moe::DispatchComms alone(groups->ep), comms(groups->ep);
    comms.etp = &etp;
    step_expecting_equal_losses(one, alone, many, comms, tokens, labels);
    // Seen at 2 and 4 ranks: below 1e-6 (f32; only the ETP sums' order changes the rounding).
    for (size_t i = 0; i < one.dense_params().size(); ++i) {
        const Param& p = *many.dense_params()[i];
        EXPECT_LT(worst_difference(p.main_grad, one.dense_params()[i]->main_grad), 1e-5) << p.name;
    }
    for (size_t i = 0; i < want_e.size(); ++i) {
        // ETP 1's gradient of every rank's tokens: the sum over the ranks, then rank r's slice.
        Param& w = *want_e[i];
        etp.all_reduce_sum(std::span<float>(w.main_grad.data<float>(), w.main_grad.numel()));
        const Tensor s = etp_slice(w.main_grad, *got_e[i], F, n, r);
        const double worst = worst_difference(got_e[i]->main_grad, s);
        EXPECT_LT(worst, 1e-5) << got_e[i]->name;
        double norm = 0;
        for (int64_t k = 0; k < s.numel(); ++k)
            norm += std::abs(s.data<float>()[k]);
        EXPECT_GT(norm, 0) << got_e[i]->name << ": the experts saw no rows";
    }
}

// The ETP split of the experts' FFN must divide it, named in the error.
TEST(ExpertTensorParallelShape, RefusesAnFfnTheGroupDoesNotDivide) {
    GptShape s{
        .num_layers = 1,
        .hidden = 8,
        .vocab = 16,
        .seq_length = 4,
        .micro_batch_size = 1,
        .attn = {.hidden = 8, .num_heads = 2, .num_groups = 1, .head_dim = 4, .seq_length = 4},
        .ffn_hidden = 8,
        .moe_layers = {true},
        .compute_dtype = DType::kF32};
    s.moe.hidden_size = 8;
    s.moe.num_experts = 2;
    s.moe.topk = 1;
    s.moe.ffn_hidden_size = 6;
    s.etp_size = 4;
    try {
        GptModel m(s);
        ADD_FAILURE() << "an FFN of 6 split over ETP 4";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("model.moe_ffn_hidden_size=6"), std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace epo::model
