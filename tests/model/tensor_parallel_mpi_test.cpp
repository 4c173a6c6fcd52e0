// Tensor parallelism's layers (model/tensor_parallel.h) on TP = every rank of the job, against
// the single-rank path: a column-parallel then row-parallel linear pair (the shape of attention's
// QKV/output projection and the MLP's fc1/fc2) against a float64 product, forward and backward,
// with and without sequence parallelism; the layer's own grouped-query attention and SwiGLU MLP
// on their weight shards, and a whole dense transformer layer, against the whole layer; the
// refusal of an uneven split. The vocabulary-parallel embedding and output layer are in
// tensor_parallel_vocab_mpi_test.cpp, the whole model in tensor_parallel_model_mpi_test.cpp.
// Runs under model_mpi_test at 1 rank and, filtered to these tests, at 2 and 4 ranks
// (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "epo/comm/process_groups.h"
#include "epo/kernels/gemm.h"
#include "epo/model/attention.h"
#include "epo/model/tensor_parallel.h"
#include "epo/model/transformer_layer.h"
#include "epo/moe/experts.h"
#include "epo/tensor/random.h"
#include "tensor_parallel_test_util.h"

namespace epo::model {
namespace {

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

void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c) {
    kernels::gemm(kernels::as_matrix(a), kernels::as_matrix(b), kernels::as_matrix(c),
                  {.trans_a = ta, .trans_b = tb});
}

// Y = X W1^T (column-parallel: rank r holds rows [r F/n, (r+1) F/n) of W1), Z = Y W2^T
// (row-parallel: columns of W2), with tp_gather before and tp_reduce after; backward the mirror.
TEST_P(TensorParallel, ColumnThenRowLinearMatchesOneRank) {
    const bool sp = GetParam();
    auto groups = make_groups_spanning_job(comm::GroupKind::kTensorParallel);
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
    auto groups = make_groups_spanning_job(comm::GroupKind::kTensorParallel);
    comm::Communicator& tp = groups->tp;
    const int n = tp.size(), r = tp.rank();
    const int64_t H = 16, A = 8, G = 4, d = 4, S = 6, T = 12;
    const AttentionShape full_shape = qk_norm_attention(H, A, G, d, S);
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
    auto groups = make_groups_spanning_job(comm::GroupKind::kTensorParallel);
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
    auto groups = make_groups_spanning_job(comm::GroupKind::kTensorParallel);
    comm::Communicator& tp = groups->tp;
    const int n = tp.size(), r = tp.rank();
    const int64_t H = 16, A = 8, G = 4, d = 4, S = 6, B = 2, T = B * S, F = 12;
    LayerShape full{.hidden = H,
                    .tokens = T,
                    .num_sequences = B,
                    .attn = qk_norm_attention(H, A, G, d, S),
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

// The suite's one instantiation: it runs the TensorParallel tests of all three files.
INSTANTIATE_TEST_SUITE_P(Model, TensorParallel, testing::Bool(),
                         [](const auto& info) { return info.param ? "sp" : "no_sp"; });

}  // namespace
}  // namespace epo::model
