// Tensor parallelism's pieces (model/tensor_parallel.h) on TP = every rank of the job, against
// the single-rank path: a column-parallel then row-parallel linear pair (the shape of attention's
// QKV/output projection and the MLP's fc1/fc2) against a float64 product, forward and backward,
// with and without sequence parallelism; the layer's own grouped-query attention and SwiGLU MLP
// on their weight shards against the whole layer; the vocabulary-parallel embedding and
// cross-entropy output layer against embedding.h and lm_head.h on the whole table (bit for bit at
// TP = 1, where only the communicator's one-rank sums sit between them; within 1e-5 otherwise: only
// where the sums over the vocabulary and the hidden are split changes). Runs under model_mpi_test
// at 1 rank and, filtered to these tests, at 2 and 4 ranks (tests/CMakeLists.txt).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>

#include "epo/comm/process_groups.h"
#include "epo/kernels/gemm.h"
#include "epo/model/attention.h"
#include "epo/model/embedding.h"
#include "epo/model/gpt_model.h"
#include "epo/model/tensor_parallel.h"
#include "epo/model/transformer_layer.h"
#include "epo/moe/experts.h"
#include "epo/tensor/random.h"

namespace epo::model {
namespace {

std::unique_ptr<comm::ProcessGroups> make_tp_groups() {
    int n = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    comm::ParallelLayout layout{n, 1, 8, 1};
    layout.tensor_model_parallel_size = n;
    return comm::ProcessGroups::create(layout, comm::CommOptions{.timeout_s = 120}, "test",
                                       nullptr);
}

Tensor filled(const Shape& shape, uint64_t seed) {
    Tensor t = Tensor::empty(shape, DType::kF32);
    fill_normal(t, seed, 0.0f, 1.0f);
    return t;
}

// C = op(A) op(B) in float64 (row-major, f32 operands).
std::vector<double> product(const Tensor& a, bool ta, const Tensor& b, bool tb) {
    const int64_t M = ta ? a.dim(1) : a.dim(0), K = ta ? a.dim(0) : a.dim(1);
    const int64_t N = tb ? b.dim(0) : b.dim(1);
    std::vector<double> c(static_cast<size_t>(M * N));
    for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
            double s = 0;
            for (int64_t k = 0; k < K; ++k) {
                const float x =
                    ta ? a.data<float>()[k * a.dim(1) + i] : a.data<float>()[i * a.dim(1) + k];
                const float y =
                    tb ? b.data<float>()[j * b.dim(1) + k] : b.data<float>()[k * b.dim(1) + j];
                s += static_cast<double>(x) * y;
            }
            c[static_cast<size_t>(i * N + j)] = s;
        }
    }
    return c;
}

Tensor as_f32(const std::vector<double>& v, const Shape& shape) {
    Tensor t = Tensor::empty(shape, DType::kF32);
    for (size_t i = 0; i < v.size(); ++i)
        t.data<float>()[i] = static_cast<float>(v[i]);
    return t;
}

// Columns [begin, end) of a row-major (R, C) tensor, as a new (R, end - begin) tensor.
Tensor columns(const Tensor& t, int64_t begin, int64_t end) {
    Tensor out = Tensor::empty({t.dim(0), end - begin}, DType::kF32);
    for (int64_t r = 0; r < t.dim(0); ++r) {
        for (int64_t c = begin; c < end; ++c)
            out.data<float>()[r * (end - begin) + c - begin] = t.data<float>()[r * t.dim(1) + c];
    }
    return out;
}

void expect_near(const Tensor& got, const Tensor& want, double tol, const char* what) {
    ASSERT_EQ(got.numel(), want.numel()) << what;
    double worst = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
        const double g = got.data<float>()[i], w = want.data<float>()[i];
        worst = std::max(worst, std::abs(g - w) / std::max(1.0, std::abs(w)));
    }
    EXPECT_LT(worst, tol) << what;
}

void expect_bits(const Tensor& got, const Tensor& want, const char* what) {
    ASSERT_EQ(got.nbytes(), want.nbytes()) << what;
    EXPECT_EQ(std::memcmp(got.raw(), want.raw(), got.nbytes()), 0) << what;
}

void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c) {
    kernels::gemm(kernels::as_matrix(a), kernels::as_matrix(b), kernels::as_matrix(c),
                  {.trans_a = ta, .trans_b = tb});
}

class TensorParallel : public testing::TestWithParam<bool> {};  // sequence parallel

// Y = X W1^T (column-parallel: rank r holds rows [r F/n, (r+1) F/n) of W1), Z = Y W2^T
// (row-parallel: columns of W2), with tp_gather before and tp_reduce after; backward the mirror.
TEST_P(TensorParallel, ColumnThenRowLinearMatchesOneRank) {
    const bool sp = GetParam();
    auto groups = make_tp_groups();
    comm::Communicator& tp = groups->tp;
    const int n = tp.size(), r = tp.rank();
    const int64_t T = 8, H = 8, F = 12;
    const Tensor X = filled({T, H}, 1), W1 = filled({F, H}, 2), W2 = filled({H, F}, 3);
    const Tensor dZ = filled({T, H}, 4);
    // Reference, float64.
    const Tensor Y = as_f32(product(X, false, W1, true), {T, F});
    const auto Z = product(Y, false, W2, true);
    const Tensor dY = as_f32(product(dZ, false, W2, false), {T, F});
    const auto dX = product(dY, false, W1, false);
    const auto dW1 = product(dY, true, X, false);
    const auto dW2 = product(dZ, true, Y, false);

    const TpRange f = tp_range(F, n, r, "ffn_hidden_size");
    const TpRange seq = sp ? tp_range(T, n, r, "tokens") : TpRange{0, T};
    const Tensor w1 = W1.rows(f.begin, f.end).clone(), w2 = columns(W2, f.begin, f.end);
    // Forward.
    const Tensor x_in = X.rows(seq.begin, seq.end).clone();
    Tensor x = Tensor::empty({T, H}, DType::kF32);
    tp_gather(tp, sp, x_in, x);
    Tensor y = Tensor::empty({T, f.size()}, DType::kF32);
    gemm(x, false, w1, true, y);
    Tensor z_partial = Tensor::empty({T, H}, DType::kF32);
    gemm(y, false, w2, true, z_partial);
    Tensor z = Tensor::empty({seq.size(), H}, DType::kF32);
    tp_reduce(tp, sp, z_partial, z);
    expect_near(z, as_f32(Z, {T, H}).rows(seq.begin, seq.end), 1e-5, "Z");
    // Backward.
    const Tensor dz_in = dZ.rows(seq.begin, seq.end).clone();
    Tensor dz = Tensor::empty({T, H}, DType::kF32);
    tp_gather(tp, sp, dz_in, dz);
    Tensor dy = Tensor::empty({T, f.size()}, DType::kF32);
    gemm(dz, false, w2, false, dy);
    Tensor dw2 = Tensor::empty({H, f.size()}, DType::kF32);
    gemm(dz, true, y, false, dw2);
    Tensor dx_partial = Tensor::empty({T, H}, DType::kF32);
    gemm(dy, false, w1, false, dx_partial);
    Tensor dx = Tensor::empty({seq.size(), H}, DType::kF32);
    tp_reduce(tp, sp, dx_partial, dx);
    Tensor dw1 = Tensor::empty({f.size(), H}, DType::kF32);
    gemm(dy, true, x, false, dw1);
    expect_near(dx, as_f32(dX, {T, H}).rows(seq.begin, seq.end), 1e-5, "dX");
    expect_near(dw1, as_f32(dW1, {F, H}).rows(f.begin, f.end), 1e-5, "dW1");
    expect_near(dw2, columns(as_f32(dW2, {H, F}), f.begin, f.end), 1e-5, "dW2");
}

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
    auto groups = make_tp_groups();
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
    auto groups = make_tp_groups();
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

void fill_param(Param& p, uint64_t seed, float mean = 0.0f, float std = 0.3f) {
    fill_normal(p.master, seed, mean, std);
    refresh_compute(p);
}

Param row_shard(const Param& full, std::vector<int64_t> blocks, int n, int r) {
    int64_t rows = 0;
    for (int64_t& b : blocks)
        rows += b / n;
    Param p = make_param(full.name, {rows, full.master.dim(1)}, DType::kF32);
    tp_copy_row_shard(full.master, blocks, n, r, p.master);
    refresh_compute(p);
    return p;
}

Param column_shard(const Param& full, int n, int r) {
    Param p = make_param(full.name, {full.master.dim(0), full.master.dim(1) / n}, DType::kF32);
    tp_copy_column_shard(full.master, n, r, p.master);
    refresh_compute(p);
    return p;
}

// Grouped-query attention (attention.h, unchanged) on A / n heads and G / n groups of the
// block-split qkv weight and the column-split projection, between tp_gather and tp_reduce,
// against the whole layer: the output, the input gradient, every weight gradient (the q/k norm
// weights' summed over the TP group, as finalize_model_grads sums them).
TEST_P(TensorParallel, AttentionOnHeadShardsMatchesOneRank) {
    const bool sp = GetParam();
    auto groups = make_tp_groups();
    comm::Communicator& tp = groups->tp;
    const int n = tp.size(), r = tp.rank();
    const int64_t H = 16, A = 8, G = 4, d = 4, S = 6, T = 12;
    const AttentionShape full_shape{.hidden = H,
                                    .num_heads = A,
                                    .num_groups = G,
                                    .head_dim = d,
                                    .seq_length = S,
                                    .qk_layernorm = true,
                                    .norm_eps = 1e-6f};
    AttentionShape shape = full_shape;
    shape.num_heads = A / n;
    shape.num_groups = G / n;
    const RopeTable rope = make_rope_table(S, d, 10000.0);
    AttentionParams full = make_attention_params(full_shape, DType::kF32, "");
    fill_param(full.qkv, 21);
    fill_param(full.proj, 22);
    fill_param(full.q_norm, 23, 1.0f, 0.1f);
    fill_param(full.k_norm, 24, 1.0f, 0.1f);
    AttentionParams mine;
    mine.qkv = row_shard(full.qkv, {A * d, G * d, G * d}, n, r);
    mine.proj = column_shard(full.proj, n, r);
    mine.q_norm = make_param("q_norm", {d}, DType::kF32);
    mine.q_norm.master.copy_from(full.q_norm.master);
    refresh_compute(mine.q_norm);
    mine.k_norm = make_param("k_norm", {d}, DType::kF32);
    mine.k_norm.master.copy_from(full.k_norm.master);
    refresh_compute(mine.k_norm);

    const Tensor x = filled({T, H}, 25), dout = filled({T, H}, 26);
    Arena saved_a{"saved"}, scratch_a{"scratch"}, saved_b{"saved"}, scratch_b{"scratch"};
    AttentionContext want_ctx, ctx;
    Tensor want_out = Tensor::zeros({T, H}, DType::kF32);
    attention_forward(full_shape, full, rope, x, want_out, want_ctx, saved_a, scratch_a);
    Tensor want_dx = Tensor::empty({T, H}, DType::kF32);
    attention_backward_dgrad(full_shape, full, rope, dout, want_dx, want_ctx, saved_a, scratch_a);
    attention_backward_wgrad(full, false, want_ctx, scratch_a);

    const TpRange seq = sp ? tp_range(T, n, r, "tokens") : TpRange{0, T};
    Tensor x_full = Tensor::empty({T, H}, DType::kF32);
    tp_gather(tp, sp, x.rows(seq.begin, seq.end).clone(), x_full);
    Tensor partial = Tensor::zeros({T, H}, DType::kF32);
    attention_forward(shape, mine, rope, x_full, partial, ctx, saved_b, scratch_b);
    Tensor out = Tensor::empty({seq.size(), H}, DType::kF32);
    tp_reduce(tp, sp, partial, out);
    expect_near(out, want_out.rows(seq.begin, seq.end).clone(), 1e-5, "out");

    Tensor dout_full = Tensor::empty({T, H}, DType::kF32);
    tp_gather(tp, sp, dout.rows(seq.begin, seq.end).clone(), dout_full);
    Tensor dx_partial = Tensor::empty({T, H}, DType::kF32);
    attention_backward_dgrad(shape, mine, rope, dout_full, dx_partial, ctx, saved_b, scratch_b);
    attention_backward_wgrad(mine, false, ctx, scratch_b);
    Tensor dx = Tensor::empty({seq.size(), H}, DType::kF32);
    tp_reduce(tp, sp, dx_partial, dx);
    expect_near(dx, want_dx.rows(seq.begin, seq.end).clone(), 1e-5, "dx");

    Tensor want_dqkv = Tensor::empty(mine.qkv.main_grad.shape(), DType::kF32);
    tp_copy_row_shard(full.qkv.main_grad, std::vector<int64_t>{A * d, G * d, G * d}, n, r,
                      want_dqkv);
    expect_near(mine.qkv.main_grad, want_dqkv, 1e-5, "dWqkv");
    Tensor want_dproj = Tensor::empty(mine.proj.main_grad.shape(), DType::kF32);
    tp_copy_column_shard(full.proj.main_grad, n, r, want_dproj);
    expect_near(mine.proj.main_grad, want_dproj, 1e-5, "dWproj");
    for (auto [got, want] :
         {std::pair{&mine.q_norm, &full.q_norm}, std::pair{&mine.k_norm, &full.k_norm}}) {
        tp.all_reduce_sum(std::span<float>(got->main_grad.data<float>(), d));
        expect_near(got->main_grad, want->main_grad, 1e-5, got->name.c_str());
    }
}

// The dense MLP (experts.h's SwiGLU FFN, unchanged): fc1 split block by block (gate, up), fc2
// by columns, between tp_gather and tp_reduce, against the whole FFN.
TEST_P(TensorParallel, SwigluMlpOnFfnShardsMatchesOneRank) {
    const bool sp = GetParam();
    auto groups = make_tp_groups();
    comm::Communicator& tp = groups->tp;
    const int n = tp.size(), r = tp.rank();
    const int64_t H = 8, F = 12, T = 8;
    moe::SharedExpertWeights full = moe::make_shared_expert_weights(H, F, DType::kF32);
    fill_param(full.fc1, 31);
    fill_param(full.fc2, 32);
    moe::SharedExpertWeights mine{row_shard(full.fc1, {F, F}, n, r), column_shard(full.fc2, n, r)};
    const Tensor x = filled({T, H}, 33), dy = filled({T, H}, 34);
    Arena arena_a{"a"}, arena_b{"b"};
    moe::ExpertsContext want_ctx, ctx;
    Tensor want_y = Tensor::empty({T, H}, DType::kF32);
    moe::shared_expert_forward(full, x, want_y, want_ctx, arena_a);
    Tensor want_dx = Tensor::zeros({T, H}, DType::kF32);
    moe::shared_expert_backward_dgrad(full, dy, want_dx, want_ctx, arena_a);
    moe::shared_expert_backward_wgrad(full, false, want_ctx, arena_a);

    const TpRange seq = sp ? tp_range(T, n, r, "tokens") : TpRange{0, T};
    Tensor x_full = Tensor::empty({T, H}, DType::kF32);
    tp_gather(tp, sp, x.rows(seq.begin, seq.end).clone(), x_full);
    Tensor partial = Tensor::empty({T, H}, DType::kF32);
    moe::shared_expert_forward(mine, x_full, partial, ctx, arena_b);
    Tensor y = Tensor::empty({seq.size(), H}, DType::kF32);
    tp_reduce(tp, sp, partial, y);
    expect_near(y, want_y.rows(seq.begin, seq.end).clone(), 1e-5, "y");
    Tensor dy_full = Tensor::empty({T, H}, DType::kF32);
    tp_gather(tp, sp, dy.rows(seq.begin, seq.end).clone(), dy_full);
    Tensor dx_partial = Tensor::zeros({T, H}, DType::kF32);
    moe::shared_expert_backward_dgrad(mine, dy_full, dx_partial, ctx, arena_b);
    moe::shared_expert_backward_wgrad(mine, false, ctx, arena_b);
    Tensor dx = Tensor::empty({seq.size(), H}, DType::kF32);
    tp_reduce(tp, sp, dx_partial, dx);
    expect_near(dx, want_dx.rows(seq.begin, seq.end).clone(), 1e-5, "dx");
    Tensor want_d1 = Tensor::empty(mine.fc1.main_grad.shape(), DType::kF32);
    tp_copy_row_shard(full.fc1.main_grad, std::vector<int64_t>{F, F}, n, r, want_d1);
    expect_near(mine.fc1.main_grad, want_d1, 1e-5, "dW1");
    Tensor want_d2 = Tensor::empty(mine.fc2.main_grad.shape(), DType::kF32);
    tp_copy_column_shard(full.fc2.main_grad, n, r, want_d2);
    expect_near(mine.fc2.main_grad, want_d2, 1e-5, "dW2");
}

// A whole dense transformer layer (transformer_layer.h's nodes with LayerShape::tp_size = n):
// norms and residual on the rank's rows, attention and the MLP on all tokens between the gather
// and the reduce of the stream's tp communicator, against the same layer at TP 1 on the whole
// weights: the output, the input gradient and every weight gradient. The norm weights see the
// rank's tokens under SP (their gradients summed over the TP group match TP 1's) and all tokens
// without it (equal as they are); the q/k norms see the rank's heads (summed either way).
TEST_P(TensorParallel, DenseTransformerLayerMatchesOneRank) {
    const bool sp = GetParam();
    auto groups = make_tp_groups();
    comm::Communicator& tp = groups->tp;
    const int n = tp.size(), r = tp.rank();
    const int64_t H = 16, A = 8, G = 4, d = 4, S = 6, B = 2, T = B * S, F = 12;
    LayerShape full{.hidden = H,
                    .tokens = T,
                    .num_sequences = B,
                    .attn = {.hidden = H,
                             .num_heads = A,
                             .num_groups = G,
                             .head_dim = d,
                             .seq_length = S,
                             .qk_layernorm = true,
                             .norm_eps = 1e-6f},
                    .norm_eps = 1e-6f,
                    .is_moe = false,
                    .ffn_hidden = F,
                    .compute_dtype = DType::kF32};
    LayerShape mine = full;
    mine.attn.num_heads = A / n;
    mine.attn.num_groups = G / n;
    mine.ffn_hidden = F / n;
    mine.tp_size = n;
    mine.sequence_parallel = sp;
    const TpRange seq = sp ? tp_range(T, n, r, "tokens") : TpRange{0, T};
    mine.tokens = seq.size();
    const RopeTable rope = make_rope_table(S, d, 10000.0);

    LayerParams pf = make_layer_params(full, "l.");
    fill_param(pf.input_norm, 41, 1.0f, 0.1f);
    fill_param(pf.attn.qkv, 42);
    fill_param(pf.attn.proj, 43);
    fill_param(pf.attn.q_norm, 44, 1.0f, 0.1f);
    fill_param(pf.attn.k_norm, 45, 1.0f, 0.1f);
    fill_param(pf.pre_mlp_norm, 46, 1.0f, 0.1f);
    fill_param(pf.dense.fc1, 47);
    fill_param(pf.dense.fc2, 48);
    LayerParams pm = make_layer_params(mine, "l.");
    for (auto [m, f] :
         {std::pair{&pm.input_norm, &pf.input_norm}, std::pair{&pm.attn.q_norm, &pf.attn.q_norm},
          std::pair{&pm.attn.k_norm, &pf.attn.k_norm},
          std::pair{&pm.pre_mlp_norm, &pf.pre_mlp_norm}})
        m->master.copy_from(f->master);
    tp_copy_row_shard(pf.attn.qkv.master, std::vector<int64_t>{A * d, G * d, G * d}, n, r,
                      pm.attn.qkv.master);
    tp_copy_column_shard(pf.attn.proj.master, n, r, pm.attn.proj.master);
    tp_copy_row_shard(pf.dense.fc1.master, std::vector<int64_t>{F, F}, n, r, pm.dense.fc1.master);
    tp_copy_column_shard(pf.dense.fc2.master, n, r, pm.dense.fc2.master);
    for (Param* p : {&pm.input_norm, &pm.attn.qkv, &pm.attn.proj, &pm.attn.q_norm, &pm.attn.k_norm,
                     &pm.pre_mlp_norm, &pm.dense.fc1, &pm.dense.fc2})
        refresh_compute(*p);

    const Tensor x = filled({T, H}, 49), d_out = filled({T, H}, 50);
    // Runs the layer's nodes forward then backward (weight gradients in the nodes).
    auto run = [&](const LayerShape& s, LayerParams& p, const Tensor& x_in, const Tensor& dy,
                   moe::DispatchComms& comms, Tensor& out, Tensor& dx) {
        Arena scratch{"scratch"};
        LayerState st;
        LayerStepStats stats;
        const NodeArgs args{.comms = &comms, .scratch = &scratch};
        st.x = st.arena.alloc({s.tokens, H}, DType::kF32);
        st.x.copy_from(x_in);
        out = Tensor::empty({s.tokens, H}, DType::kF32);
        dx = Tensor::empty({s.tokens, H}, DType::kF32);
        pre_dispatch_forward(s, p, rope, st, stats, args);
        mlp_forward(s, p, st, out, args);
        mlp_backward(s, p, st, dy, true, args);
        pre_dispatch_backward(s, p, rope, st, dy, dx, true, args);
    };
    moe::DispatchComms one(tp);
    Tensor want_out, want_dx, out, dx;
    run(full, pf, x, d_out, one, want_out, want_dx);
    moe::DispatchComms comms(tp);
    comms.tp = &tp;
    run(mine, pm, x.rows(seq.begin, seq.end).clone(), d_out.rows(seq.begin, seq.end).clone(), comms,
        out, dx);
    expect_near(out, want_out.rows(seq.begin, seq.end).clone(), 1e-5, "out");
    expect_near(dx, want_dx.rows(seq.begin, seq.end).clone(), 1e-5, "dx");

    auto want_rows = [&](const Param& f, std::vector<int64_t> blocks, const Param& m) {
        Tensor w = Tensor::empty(m.main_grad.shape(), DType::kF32);
        tp_copy_row_shard(f.main_grad, blocks, n, r, w);
        return w;
    };
    auto want_cols = [&](const Param& f, const Param& m) {
        Tensor w = Tensor::empty(m.main_grad.shape(), DType::kF32);
        tp_copy_column_shard(f.main_grad, n, r, w);
        return w;
    };
    expect_near(pm.attn.qkv.main_grad, want_rows(pf.attn.qkv, {A * d, G * d, G * d}, pm.attn.qkv),
                1e-5, "dWqkv");
    expect_near(pm.attn.proj.main_grad, want_cols(pf.attn.proj, pm.attn.proj), 1e-5, "dWproj");
    expect_near(pm.dense.fc1.main_grad, want_rows(pf.dense.fc1, {F, F}, pm.dense.fc1), 1e-5, "dW1");
    expect_near(pm.dense.fc2.main_grad, want_cols(pf.dense.fc2, pm.dense.fc2), 1e-5, "dW2");
    for (auto [m, f, summed] : {std::tuple{&pm.input_norm, &pf.input_norm, sp},
                                std::tuple{&pm.pre_mlp_norm, &pf.pre_mlp_norm, sp},
                                std::tuple{&pm.attn.q_norm, &pf.attn.q_norm, true},
                                std::tuple{&pm.attn.k_norm, &pf.attn.k_norm, true}}) {
        if (summed)
            tp.all_reduce_sum(std::span<float>(m->main_grad.data<float>(), m->main_grad.numel()));
        expect_near(m->main_grad, f->main_grad, 1e-5, m->name.c_str());
    }
}

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
    auto groups = make_tp_groups();
    comm::Communicator& tp = groups->tp;
    const int n = tp.size(), r = tp.rank();
    const int64_t H = 16, A = 8, G = 4, d = 4, V = 32, F = 12;
    GptShape full{.num_layers = 2,
                  .hidden = H,
                  .vocab = V,
                  .seq_length = S,
                  .micro_batch_size = micro_batch_size,
                  .attn = {.hidden = H,
                           .num_heads = A,
                           .num_groups = G,
                           .head_dim = d,
                           .seq_length = S,
                           .qk_layernorm = true,
                           .norm_eps = 1e-6f},
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
    one.begin_step(tokens, labels, 0.5f);
    many.begin_step(tokens, labels, 0.5f);
    moe::DispatchComms alone(groups->ep), comms(groups->ep);  // EP 1
    comms.tp = &tp;
    Arena scratch_a{"scratch"}, scratch_b{"scratch"};
    for (int mb = 0; mb < 2; ++mb) {
        one.forward_backward(mb, alone, scratch_a);
        many.forward_backward(mb, comms, scratch_b);
        const double w = one.results()[static_cast<size_t>(mb)].lm_loss;
        EXPECT_NEAR(many.results()[static_cast<size_t>(mb)].lm_loss, w, 1e-6 * std::abs(w));
    }
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

TEST(TensorParallelRange, RefusesAnUnevenSplitNamingTheField) {
    EXPECT_EQ(tp_range(16, 4, 3, "model.vocab_size").begin, 12);
    try {
        tp_range(10, 4, 0, "model.vocab_size");
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("model.vocab_size=10 is not divisible by "
                                             "tensor_model_parallel_size=4"),
                  std::string::npos)
            << e.what();
    }
}

INSTANTIATE_TEST_SUITE_P(Model, TensorParallel, testing::Bool(),
                         [](const auto& info) { return info.param ? "sp" : "no_sp"; });

}  // namespace
}  // namespace epo::model
