// Chunks (docs/chunked-overlap.md) through the whole trainer: the overlap schedule with C expert
// chunks against the (unchunked) baseline, bit for bit, and against unchunked overlap.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "epo/comm/mpi_runtime.h"
#include "epo/train/trainer.h"
#include "train_test_util.h"

namespace epo::train {
namespace {

using testing::expect_bit_identical;

struct ChunkRun : testing::RunRecord {
    std::vector<schedule::NodeCall> calls;
};

ChunkRun run_chunked(const config::Config& cfg, int steps) {
    Trainer trainer(cfg);
    ChunkRun r;
    r.calls = trainer.schedule_calls();
    static_cast<testing::RunRecord&>(r) = testing::record_run(trainer, steps);
    return r;
}

// tiny-moe: 2 MoE layers, 64 tokens per micro-batch on a rank (2 sequences of 32), 8 experts,
// EP = world (so 8 / world local experts).
int local_experts() {
    return 8 / comm::current_world_size();
}

config::Config chunk_config(int micro_batches, int chunks, bool overlap, bool delay, bool fused,
                            std::vector<std::string> extra = {}) {
    const int world = comm::current_world_size();
    std::vector<std::string> o = testing::tiny_shape_overrides();
    o.push_back("comm.gpus_per_node=" + std::to_string(world));
    o.push_back("model.expert_model_parallel_size=" + std::to_string(world));
    o.push_back("train.global_batch_size=" + std::to_string(2 * world * micro_batches));
    o.push_back("model.moe_ep_overlap_num_chunks=" + std::to_string(chunks));
    o.push_back(std::string("model.gradient_accumulation_fusion=") + (fused ? "true" : "false"));
    if (overlap) {
        o.push_back("comm_overlap.overlap_moe_expert_parallel_comm=true");
        o.push_back(std::string("comm_overlap.delay_wgrad_compute=") + (delay ? "true" : "false"));
    }
    o.insert(o.end(), extra.begin(), extra.end());
    return epo::testing::run_config("tiny-moe", o);
}

struct ChunkCase {
    int micro_batches;
    int chunks;  // 0: one chunk per local expert
    bool fused = false;
    int resolved_chunks() const { return chunks > 0 ? chunks : local_experts(); }
};

std::string chunk_case_name(const ::testing::TestParamInfo<ChunkCase>& info) {
    const ChunkCase& k = info.param;
    return std::to_string(k.micro_batches) + "mb_" +
           (k.chunks > 0 ? std::to_string(k.chunks) : std::string("per_expert")) +
           "_expert_chunks" + (k.fused ? "_fused" : "");
}

class ChunkedOverlap : public ::testing::TestWithParam<ChunkCase> {};

// Baseline, overlap and overlap + delayed wgrad with the same chunk settings: bit-identical
// losses, grad norms and final parameters (one micro-batch included: there only the chunks
// overlap). The baseline runs whole (W014).
TEST_P(ChunkedOverlap, BitIdenticalToBaseline) {
    constexpr int kSteps = 6;
    const ChunkCase k = GetParam();
    const int n = k.resolved_chunks();
    const auto config = [&](bool overlap, bool delay) {
        return chunk_config(k.micro_batches, n, overlap, delay, k.fused);
    };
    const config::Config base = config(false, false), overlap = config(true, false),
                         delayed = config(true, true);
    ASSERT_EQ(base.model.moe_ep_overlap_num_chunks, 1);
    ASSERT_TRUE(delayed.model.delay_wgrad_compute);
    const ChunkRun a = run_chunked(base, kSteps), b = run_chunked(overlap, kSteps),
                   c = run_chunked(delayed, kSteps);
    EXPECT_EQ(schedule::num_moe_chunks(a.calls), 1);
    EXPECT_EQ(schedule::num_moe_chunks(b.calls), n);
    expect_bit_identical(a, b);
    expect_bit_identical(a, c);
    EXPECT_LT(a.losses.back(), a.losses.front());
    // Chunks add no micro-batch in flight: the overlap's peak stays within the unchunked
    // matrix's bounds (trainer_mpi_test.cpp: 1.5x, delayed 1.6x).
    EXPECT_LE(static_cast<double>(b.peak_activation_bytes),
              1.5 * static_cast<double>(a.peak_activation_bytes));
    EXPECT_LE(static_cast<double>(c.peak_activation_bytes),
              1.6 * static_cast<double>(a.peak_activation_bytes));
    if (comm::current_world_rank() == 0) {
        std::printf("peak activation bytes: baseline %lld, overlap %lld, overlap+delayed %lld\n",
                    static_cast<long long>(a.peak_activation_bytes),
                    static_cast<long long>(b.peak_activation_bytes),
                    static_cast<long long>(c.peak_activation_bytes));
    }
}

INSTANTIATE_TEST_SUITE_P(Trainer, ChunkedOverlap,
                         ::testing::Values(ChunkCase{1, 2}, ChunkCase{2, 2, true}, ChunkCase{3, 0},
                                           ChunkCase{1, 0, true}),
                         chunk_case_name);

// Chunks by experts move and compute every row where the unchunked block does (moe_block.h): the
// whole run, from the first loss to the final parameters, is the unchunked baseline's bit for bit,
// overlap with or without delayed wgrad, fused or not, and with a capacity.
TEST(ChunkedOverlap, ExpertChunksAreBitIdenticalToUnchunked) {
    constexpr int kSteps = 4;
    for (bool fused : {false, true}) {
        const ChunkRun whole = run_chunked(chunk_config(2, 1, false, false, fused), kSteps);
        for (int chunks : {2, local_experts()}) {
            // Overlap only: without it the chunks run whole (W014).
            for (bool delay : {false, true}) {
                const ChunkRun part =
                    run_chunked(chunk_config(2, chunks, true, delay, fused), kSteps);
                SCOPED_TRACE(::testing::Message() << chunks << " expert chunks, delayed wgrad "
                                                  << delay << ", fused " << fused);
                EXPECT_EQ(schedule::num_moe_chunks(part.calls), chunks);
                expect_bit_identical(whole, part);
            }
        }
    }
    const std::vector<std::string> capacity = {"model.moe_expert_capacity_factor=1.0"};
    const ChunkRun whole = run_chunked(chunk_config(2, 1, false, false, false, capacity), kSteps);
    const ChunkRun part = run_chunked(chunk_config(2, 2, true, true, false, capacity), kSteps);
    SCOPED_TRACE("2 expert chunks with moe_expert_capacity_factor=1.0");
    expect_bit_identical(whole, part);
}

}  // namespace
}  // namespace epo::train
