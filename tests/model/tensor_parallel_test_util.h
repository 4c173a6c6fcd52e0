// Helpers shared by the model area's tensor-parallel tests (tensor_parallel_mpi_test.cpp,
// tensor_parallel_vocab_mpi_test.cpp, tensor_parallel_model_mpi_test.cpp,
// expert_tensor_parallel_mpi_test.cpp): the process groups with TP or ETP over every rank of the
// job, the value-parameterized TensorParallel suite (its parameter: sequence parallelism), random
// tensors, column slices, their attention shape, the comparisons (within a tolerance, bit for bit),
// and a step of a parallel model next to the single-rank one.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "epo/comm/process_groups.h"
#include "epo/core/error.h"
#include "epo/model/attention.h"
#include "epo/model/gpt_model.h"
#include "epo/tensor/random.h"
#include "epo/tensor/tensor.h"

namespace epo::model {

// The job's process groups with `group` (kTensorParallel or kExpertTensorParallel) spanning every
// rank: world n, EP 1, 8 ranks a node, PP 1, comm.timeout_s = 120.
inline std::unique_ptr<comm::ProcessGroups> make_groups_spanning_job(comm::GroupKind group) {
    int n = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    comm::ParallelLayout layout{n, 1, 8, 1};
    if (group == comm::GroupKind::kTensorParallel)
        layout.tensor_model_parallel_size = n;
    else if (group == comm::GroupKind::kExpertTensorParallel)
        layout.expert_tensor_parallel_size = n;
    else
        EPO_CHECK(false, "make_groups_spanning_job takes the TP or the ETP group");
    return comm::ProcessGroups::create(layout, comm::CommOptions{.timeout_s = 120}, "test",
                                       nullptr);
}

// The parameter: sequence parallelism. The suite's tests are in three files, instantiated once
// (tensor_parallel_mpi_test.cpp); ctest's model_mpi_tensor_parallel_np2/np4 run them.
class TensorParallel : public testing::TestWithParam<bool> {};

inline Tensor filled(const Shape& shape, uint64_t seed) {
    Tensor t = Tensor::empty(shape, DType::kF32);
    fill_normal(t, seed, 0.0f, 1.0f);
    return t;
}

// Columns [begin, end) of a row-major (R, C) tensor, as a new (R, end - begin) tensor.
inline Tensor columns(const Tensor& t, int64_t begin, int64_t end) {
    Tensor out = Tensor::empty({t.dim(0), end - begin}, DType::kF32);
    for (int64_t r = 0; r < t.dim(0); ++r) {
        for (int64_t c = begin; c < end; ++c)
            out.data<float>()[r * (end - begin) + c - begin] = t.data<float>()[r * t.dim(1) + c];
    }
    return out;
}

// Largest |got - want| / max(1, |want|).
inline double worst_difference(const Tensor& got, const Tensor& want) {
    EXPECT_EQ(got.numel(), want.numel());
    double worst = 0;
    for (int64_t i = 0; i < std::min(got.numel(), want.numel()); ++i) {
        const double g = got.data<float>()[i], w = want.data<float>()[i];
        worst = std::max(worst, std::abs(g - w) / std::max(1.0, std::abs(w)));
    }
    return worst;
}

inline void expect_near(const Tensor& got, const Tensor& want, double tol, const char* what) {
    ASSERT_EQ(got.numel(), want.numel()) << what;
    EXPECT_LT(worst_difference(got, want), tol) << what;
}

inline void expect_bits(const Tensor& got, const Tensor& want, const char* what) {
    ASSERT_EQ(got.nbytes(), want.nbytes()) << what;
    EXPECT_EQ(std::memcmp(got.raw(), want.raw(), got.nbytes()), 0) << what;
}

// The TP tests' attention: H hidden, A query heads in G groups of head dimension d, sequences of
// S, q/k layer norms (eps 1e-6).
inline AttentionShape qk_norm_attention(int64_t H, int64_t A, int64_t G, int64_t d, int64_t S) {
    return AttentionShape{.hidden = H,
                          .num_heads = A,
                          .num_groups = G,
                          .head_dim = d,
                          .seq_length = S,
                          .qk_layernorm = true,
                          .norm_eps = 1e-6f};
}

// One step of the micro-batches `tokens` / `labels` (loss scale 0.5) on the single-rank model `one`
// (over `one_comms`) and the parallel model `many` (over `many_comms`), forward then backward
// each micro-batch: every micro-batch's LM loss agrees within 1e-6 (relative).
inline void step_expecting_equal_losses(GptModel& one, const moe::DispatchComms& one_comms,
                                        GptModel& many, const moe::DispatchComms& many_comms,
                                        const std::vector<std::vector<int32_t>>& tokens,
                                        const std::vector<std::vector<int32_t>>& labels) {
    one.begin_step(tokens, labels, 0.5f);
    many.begin_step(tokens, labels, 0.5f);
    Arena scratch_a{"scratch"}, scratch_b{"scratch"};
    for (int mb = 0; mb < static_cast<int>(tokens.size()); ++mb) {
        one.forward_backward(mb, one_comms, scratch_a);
        many.forward_backward(mb, many_comms, scratch_b);
        const double w = one.results()[static_cast<size_t>(mb)].lm_loss;
        EXPECT_NEAR(many.results()[static_cast<size_t>(mb)].lm_loss, w, 1e-6 * std::abs(w));
    }
}

}  // namespace epo::model
