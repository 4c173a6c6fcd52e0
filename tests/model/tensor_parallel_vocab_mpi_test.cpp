// Tensor parallelism's vocabulary-parallel embedding and cross-entropy output layer
// (model/tensor_parallel.h) on TP = every rank of the job, against embedding.h and lm_head.h on
// the whole table, with and without sequence parallelism (bit for bit at TP = 1, where only the
// communicator's one-rank sums sit between them; within 1e-5 otherwise: only where the sums over
// the vocabulary and the hidden are split changes). Runs with the TensorParallel suite
// (tensor_parallel_test_util.h, instantiated in tensor_parallel_mpi_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "epo/comm/process_groups.h"
#include "epo/model/embedding.h"
#include "epo/model/tensor_parallel.h"
#include "epo/tensor/random.h"
#include "tensor_parallel_test_util.h"

namespace epo::model {
namespace {

Param table_param(const char* name, int64_t rows, int64_t cols, uint64_t seed) {
    Param p = make_param(name, {rows, cols}, DType::kF32);
    fill_normal(p.master, seed, 0.0f, 1.0f);
    refresh_compute(p);
    return p;
}

// This rank's rows [begin, end) of a full parameter, as a parameter of its own.
Param shard_param(const Param& full, TpRange rows) {
    Param p = make_param(full.name, {rows.size(), full.master.dim(1)}, DType::kF32);
    p.master.copy_from(full.master.rows(rows.begin, rows.end));
    refresh_compute(p);
    return p;
}

TEST_P(TensorParallel, VocabParallelEmbeddingMatchesOneRank) {
    const bool sp = GetParam();
    auto groups = make_groups_spanning_job(comm::GroupKind::kTensorParallel);
    comm::Communicator& tp = groups->tp;
    const int n = tp.size(), r = tp.rank();
    const int64_t V = 16, H = 8, T = 12;
    std::vector<int32_t> tokens;
    for (int64_t t = 0; t < T; ++t)  // repeats, and tokens of every rank's range
        tokens.push_back(static_cast<int32_t>(random_bits(5, static_cast<uint64_t>(t)) % V));
    tokens[3] = tokens[7];
    Param full = table_param("embedding", V, H, 6);
    const TpRange vocab = tp_range(V, n, r, "model.vocab_size");
    Param mine = shard_param(full, vocab);
    const TpRange seq = sp ? tp_range(T, n, r, "tokens") : TpRange{0, T};
    Arena scratch{"scratch"};

    Tensor want = Tensor::empty({T, H}, DType::kF32);
    embedding_forward(full, tokens, want);
    Tensor x = Tensor::empty({seq.size(), H}, DType::kF32);
    vocab_parallel_embedding_forward(tp, sp, mine, V, tokens, x, scratch);
    // Each row is one rank's row plus zeros: exact at any TP.
    expect_bits(x, want.rows(seq.begin, seq.end).clone(), "x");

    const Tensor dx_full = filled({T, H}, 8);
    embedding_backward(full, tokens, dx_full);
    scratch.reset();
    vocab_parallel_embedding_backward(tp, sp, mine, tokens,
                                      dx_full.rows(seq.begin, seq.end).clone(), scratch);
    expect_bits(mine.main_grad, full.main_grad.rows(vocab.begin, vocab.end).clone(), "dW");

    // A token outside the vocabulary is refused, naming it.
    std::vector<int32_t> bad = tokens;
    bad[2] = static_cast<int32_t>(V);
    scratch.reset();
    try {
        vocab_parallel_embedding_forward(tp, sp, mine, V, bad, x, scratch);
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("token 16 at position 2 is outside the vocabulary"),
                  std::string::npos)
            << e.what();
    }
}

// Loss, dlogits (this rank's vocabulary columns), dh (after tp_reduce) and dW against
// lm_head.h on the whole output layer; T = 130 crosses the 128-row logit chunk; with and without
// a loss mask.
TEST_P(TensorParallel, VocabParallelCrossEntropyMatchesOneRank) {
    const bool sp = GetParam();
    auto groups = make_groups_spanning_job(comm::GroupKind::kTensorParallel);
    comm::Communicator& tp = groups->tp;
    const int n = tp.size(), r = tp.rank();
    const int64_t V = 16, H = 8, T = 132;
    const Tensor h = filled({T, H}, 9);
    std::vector<int32_t> labels;
    std::vector<uint8_t> mask;
    for (int64_t t = 0; t < T; ++t) {
        labels.push_back(static_cast<int32_t>(random_bits(10, static_cast<uint64_t>(t)) % V));
        mask.push_back(t % 5 != 0);
    }
    const TpRange vocab = tp_range(V, n, r, "model.vocab_size");
    const TpRange seq = sp ? tp_range(T, n, r, "tokens") : TpRange{0, T};
    for (bool masked : {false, true}) {
        SCOPED_TRACE(masked ? "loss mask" : "no mask");
        const std::span<const uint8_t> m =
            masked ? std::span<const uint8_t>(mask) : std::span<const uint8_t>();
        Param full = table_param("output_layer", V, H, 11);
        Param mine = shard_param(full, vocab);
        Arena saved_a{"saved"}, scratch_a{"scratch"}, saved_b{"saved"}, scratch_b{"scratch"};
        LmHeadContext want_ctx, ctx;
        const double want = lm_head_forward(full, h, labels, 0.5f, want_ctx, saved_a, scratch_a, m);
        const double loss =
            vocab_parallel_lm_head_forward(tp, mine, h, labels, 0.5f, ctx, saved_b, scratch_b, m);
        Tensor dh_want = Tensor::empty({T, H}, DType::kF32);
        lm_head_backward_dgrad(full, want_ctx, dh_want);
        lm_head_backward_wgrad(full, false, want_ctx, scratch_a);
        Tensor dh_partial = Tensor::empty({T, H}, DType::kF32);
        lm_head_backward_dgrad(mine, ctx, dh_partial);
        Tensor dh = Tensor::empty({seq.size(), H}, DType::kF32);
        tp_reduce(tp, sp, dh_partial, dh);
        lm_head_backward_wgrad(mine, false, ctx, scratch_b);
        const Tensor dlogits_want = columns(want_ctx.dlogits, vocab.begin, vocab.end);
        const Tensor dh_rows = dh_want.rows(seq.begin, seq.end).clone();
        const Tensor dw_rows = full.main_grad.rows(vocab.begin, vocab.end).clone();
        if (n == 1) {
            EXPECT_EQ(loss, want);
            expect_bits(ctx.dlogits, dlogits_want, "dlogits");
            expect_bits(dh, dh_rows, "dh");
            expect_bits(mine.main_grad, dw_rows, "dW");
        } else {
            EXPECT_NEAR(loss, want, 1e-6 * std::abs(want));
            expect_near(ctx.dlogits, dlogits_want, 1e-6, "dlogits");
            expect_near(dh, dh_rows, 1e-5, "dh");
            expect_near(mine.main_grad, dw_rows, 1e-5, "dW");
        }
        // Every TP rank computed the same loss.
        std::vector<double> all(static_cast<size_t>(n));
        tp.all_gather(std::span<const double>(&loss, 1), std::span<double>(all));
        for (double l : all)
            EXPECT_EQ(l, loss);
    }
}

}  // namespace
}  // namespace epo::model
