// The memory estimate (config/memory_estimate.h) against the peak RSS (VmHWM) of real trainers:
// tiny-moe and a mid-size shape (sequence 1024, four times tiny-moe's activations), baseline and
// overlap schedules, within 25%. Every rank builds its trainer, runs two steps, and compares its
// own peak to the estimate. (The bench proxy, qwen3 widths, takes minutes: measured by hand in
// docs/runtime.md "Memory".)
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>

#include "epo/bench/metrics.h"
#include "epo/config/builder.h"
#include "epo/config/memory_estimate.h"
#include "epo/config/validate.h"
#include "epo/train/trainer.h"

namespace epo::config {
namespace {

// A sanitizer build's peak is not the one the estimate is for: ASan's shadow memory, redzones and
// quarantine (or TSan's shadow) multiply what the allocator holds. The release suite measures.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizedBuild = true;
#else
constexpr bool kSanitizedBuild = false;
#endif

int world_ranks() {
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return size;
}

Config tiny_moe(int ranks, std::vector<std::string> overrides) {
    ConfigSources sources;
    sources.model = "tiny-moe";
    sources.harness.gpus_per_node = ranks;
    sources.harness.expert_model_parallel_size = ranks;
    sources.harness.global_batch_size = 4 * ranks;
    sources.overrides = std::move(overrides);
    const ValidationReport report = validate_for_run(build_config(sources));
    EXPECT_TRUE(report.ok()) << format_findings(report);
    return report.config;
}

// Measured peak of a trainer built and stepped twice, and the estimate, in bytes.
void expect_estimate_near_peak(const std::vector<std::string>& overrides) {
    if (kSanitizedBuild)
        GTEST_SKIP() << "a sanitizer build's peak memory is not a release build's";
    const int ranks = world_ranks();
    const Config cfg = tiny_moe(ranks, overrides);
    const MemoryEstimate estimate = estimate_rank_memory(cfg, ranks);
    MPI_Barrier(MPI_COMM_WORLD);
    ASSERT_TRUE(bench::reset_peak_rss());
    int64_t peak = 0;
    {
        train::Trainer trainer(cfg);
        trainer.step();
        trainer.step();
        peak = bench::peak_rss_bytes();
    }
    const double ratio = static_cast<double>(estimate.total()) / static_cast<double>(peak);
    EXPECT_NEAR(ratio, 1.0, 0.25) << "estimate " << format_memory_estimate(estimate)
                                  << ", measured peak " << peak / 1e9 << " GB";
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST(MemoryEstimate, TinyMoeWithinAQuarterOfThePeak) {
    if (8 % world_ranks() != 0)
        GTEST_SKIP() << "tiny-moe's 8 experts do not split over " << world_ranks() << " ranks";
    expect_estimate_near_peak({});
}

TEST(MemoryEstimate, TinyMoeOverlapWithinAQuarterOfThePeak) {
    if (world_ranks() != 2 && world_ranks() != 4)
        GTEST_SKIP() << "the overlap needs EP > 1 over tiny-moe's 8 experts";
    expect_estimate_near_peak({"model.overlap_moe_expert_parallel_comm=true"});
}

TEST(MemoryEstimate, TinyMoeMlaWithinAQuarterOfThePeak) {
    if (world_ranks() != 2 && world_ranks() != 4)
        GTEST_SKIP() << "the overlap needs EP > 1 over tiny-moe's 8 experts";
    expect_estimate_near_peak(
        {"model.multi_latent_attention=true", "model.qk_layernorm=true", "model.q_lora_rank=64",
         "model.kv_lora_rank=32", "model.qk_head_dim=32", "model.qk_pos_emb_head_dim=16",
         "model.v_head_dim=32", "model.overlap_moe_expert_parallel_comm=true"});
}

// On 2 ranks only: at initialization the router is far from uniform, and over 4 ranks the rank
// that receives the most rows peaked 1.2x above the others (433 vs 534 MB), which an estimate
// of the average rank cannot follow (docs/runtime.md "Memory").
TEST(MemoryEstimate, MidSizeWithinAQuarterOfThePeak) {
    if (world_ranks() != 2)
        GTEST_SKIP() << "measured on 2 ranks";
    expect_estimate_near_peak({"model.seq_length=1024", "model.num_layers=3"});
}

}  // namespace
}  // namespace epo::config
