// Selective recompute (model.recompute_granularity=selective, model.recompute_modules): each
// module, and all of them together, gives the bits of the run without recompute (losses, grad
// norms, every parameter) in the baseline, the overlap and the overlap + delayed-wgrad
// schedules; and the recomputed tensors are really not held between forward and backward: the
// peak activation meter drops by the hand-counted bytes of what each module recomputes.
//
// The model is tiny-moe's test shape with a dense first layer (so `mlp` has a dense MLP) and a
// shared expert (so `shared_experts` has one), with EP = world: the bit-identity runs at 2
// ranks, the memory check at every rank count this binary runs at, on that shape and on tiny-moe
// as the recipe has it.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "epo/comm/mpi_runtime.h"
#include "epo/config/memory_estimate.h"
#include "epo/train/memory_plan.h"
#include "train_test_util.h"

namespace epo::train {
namespace {

using testing::expect_bit_identical;
using testing::RunRecord;

// A model shape and what the hand counts read from it. Layer 0 dense, layer 1 MoE with a
// shared expert; capacity mode (factor 1, padded): each rank sends every expert exactly its
// capacity, so the expert rows, and with them the moe_act bytes, are fixed.
struct Shape {
    const char* name;
    std::vector<std::string> overrides;
    int64_t tokens, hidden, heads, seq, seqs;  // T = seqs x seq
    int64_t ffn, experts, topk, expert_ffn, shared_ffn;
};

// tiny-moe's test shape: T = 2 sequences x 32 = 64 tokens, H 64, 4 heads of 16 in 2 groups,
// dense FFN 128, 8 experts of FFN 64 (top-2), a shared expert of 64.
const Shape& test_shape() {
    static const Shape s = [] {
        Shape t{"tiny-moe test shape",
                testing::tiny_shape_overrides(),
                64,
                64,
                4,
                32,
                2,
                128,
                8,
                2,
                64,
                64};
        t.overrides.push_back("model.moe_shared_expert_intermediate_size=64");
        return t;
    }();
    return s;
}

// tiny-moe as the recipe has it: T = 2 x 128 = 256 tokens, H 256, 4 heads of 64, dense FFN
// 1024, 8 experts of FFN 512 (top-2), here with a shared expert of 128.
const Shape& recipe_shape() {
    static const Shape s{"tiny-moe", {"model.moe_shared_expert_intermediate_size=128"},
                         256,        256,
                         4,          128,
                         2,          1024,
                         8,          2,
                         512,        128};
    return s;
}
constexpr int64_t kBf16 = 2;

std::vector<std::string> overrides(const Shape& shape, int micro_batches,
                                   std::vector<std::string> extra, bool capacity) {
    const int world = comm::current_world_size();
    std::vector<std::string> o = shape.overrides;
    o.insert(o.end(), {"comm.gpus_per_node=" + std::to_string(world),
                       "model.expert_model_parallel_size=" + std::to_string(world),
                       "train.global_batch_size=" + std::to_string(2 * world * micro_batches),
                       "model.moe_layer_freq=[0,1]"});
    if (capacity) {
        o.insert(o.end(),
                 {"model.moe_expert_capacity_factor=1.0", "model.moe_token_drop_policy=probs",
                  "model.moe_pad_expert_input_to_capacity=true"});
    }
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
}

// Capacity mode unless `capacity` is false (dropless).
config::Config make(int micro_batches, std::vector<std::string> extra, bool capacity = true,
                    const Shape& shape = test_shape()) {
    return epo::testing::run_config("tiny-moe",
                                    overrides(shape, micro_batches, std::move(extra), capacity));
}

std::vector<std::string> selective(const std::string& modules) {
    return {"model.recompute_granularity=selective", "model.recompute_modules=[" + modules + "]"};
}

const std::vector<std::string> kModules = {
    "core_attn", "layernorm",      "moe_act",
    "mlp",       "shared_experts", "core_attn,layernorm,moe_act,mlp,shared_experts"};

struct Schedule {
    const char* name;
    std::vector<std::string> overrides;
};

const std::vector<Schedule>& schedules() {
    static const std::vector<Schedule> all = {
        {"baseline", {}},
        {"overlap",
         {"comm_overlap.overlap_moe_expert_parallel_comm=true",
          "comm_overlap.delay_wgrad_compute=false"}},
        {"overlap+delay_wgrad",
         {"comm_overlap.overlap_moe_expert_parallel_comm=true",
          "comm_overlap.delay_wgrad_compute=true"}},
    };
    return all;
}

std::vector<std::string> joined(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

// The bit-identity runs (22 and 4 trainings) run at 2 ranks, EP 2: at 4 ranks on this 2-core
// machine they take minutes of the binary's 900 s budget, and a rank count changes no code path
// of recompute (it is local to each rank's nodes).
bool two_ranks() {
    return comm::current_world_size() == 2;
}

TEST(Recompute, EachModuleIsBitIdenticalToNoRecomputeInEverySchedule) {
    if (!two_ranks())
        GTEST_SKIP() << "runs at 2 ranks (see two_ranks())";
    constexpr int kSteps = 4, kMicroBatches = 2;
    const RunRecord plain = testing::record_run(make(kMicroBatches, {}), kSteps);
    EXPECT_LT(plain.losses.back(), plain.losses.front());
    for (const Schedule& schedule : schedules()) {
        for (const std::string& modules : kModules) {
            SCOPED_TRACE(std::string(schedule.name) + " [" + modules + "]");
            const config::Config cfg =
                make(kMicroBatches, joined(schedule.overrides, selective(modules)));
            ASSERT_EQ(cfg.model.recompute_granularity, config::RecomputeGranularity::kSelective);
            expect_bit_identical(plain, testing::record_run(cfg, kSteps));
        }
    }
}

// In fp32 (baseline only: EP overlap needs bf16, EP004) a recomputed tensor is not rounded to
// bf16 before its use, so a recompute that differs from the forward by one f32 rounding shows.
TEST(Recompute, AllModulesAreBitIdenticalInFp32) {
    if (!two_ranks())
        GTEST_SKIP() << "runs at 2 ranks (see two_ranks())";
    constexpr int kSteps = 4, kMicroBatches = 2;
    const RunRecord plain = testing::record_run(make(kMicroBatches, {"model.bf16=false"}), kSteps);
    for (const std::string& modules : kModules) {
        SCOPED_TRACE(modules);
        expect_bit_identical(
            plain,
            testing::record_run(
                make(kMicroBatches, joined({"model.bf16=false"}, selective(modules))), kSteps));
    }
}

// Expert chunks run the experts (and their activation's recompute) one group at a time, with
// a capacity and dropless; recompute keeps the bits of each.
TEST(Recompute, AllModulesWithMoeChunksAreBitIdentical) {
    if (!two_ranks())
        GTEST_SKIP() << "runs at 2 ranks (see two_ranks())";
    constexpr int kSteps = 3, kMicroBatches = 2;
    for (const bool capacity : {true, false}) {
        SCOPED_TRACE(capacity ? "capacity" : "dropless");
        const std::vector<std::string> chunks =
            joined(schedules()[2].overrides, {"model.moe_ep_overlap_num_chunks=2"});
        const config::Config off = make(kMicroBatches, chunks, capacity);
        const config::Config on =
            make(kMicroBatches, joined(chunks, selective(kModules.back())), capacity);
        ASSERT_EQ(on.model.moe_ep_overlap_num_chunks, 2);
        expect_bit_identical(testing::record_run(off, kSteps), testing::record_run(on, kSteps));
    }
}

// What each module stops keeping, per micro-batch, by hand (bf16, every tensor a multiple of 64
// bytes, so the arena adds no padding):
//   core_attn       the probabilities of both layers: 2 x B A S^2 x 2 bytes
//   layernorm       n1 and n2 of both layers: 2 x 2 T H x 2 bytes
//   mlp             the dense layer's fc1 output and activation: T (2F + F) x 2 bytes
//   shared_experts  the MoE layer's shared expert, the same: T (2Fs + Fs) x 2 bytes
//   moe_act         the experts' activation: Rp F x 2 bytes, Rp the rows this rank's experts
//                   receive: with capacity C = T k / E (factor 1) from each of the EP ranks,
//                   E / EP experts x EP x C rows (padded to 32 per expert: 32 at 2 ranks)
int64_t expected_saving(const Shape& s, const std::string& module, int ep) {
    const int64_t per_expert_rows = ep * (s.tokens * s.topk / s.experts);
    const int64_t padded = (per_expert_rows + 31) / 32 * 32;
    const int64_t rp = s.experts / ep * padded;
    if (module == "core_attn")
        return 2 * s.seqs * s.heads * s.seq * s.seq * kBf16;
    if (module == "layernorm")
        return 2 * 2 * s.tokens * s.hidden * kBf16;
    if (module == "mlp")
        return s.tokens * 3 * s.ffn * kBf16;
    if (module == "shared_experts")
        return s.tokens * 3 * s.shared_ffn * kBf16;
    if (module == "moe_act")
        return rp * s.expert_ffn * kBf16;
    ADD_FAILURE() << module;
    return 0;
}

// One micro-batch through the baseline: every layer's forward activations are held together
// from the output layer until the last layer's backward, which is where the peak is, so the
// peak drops by exactly what the modules do not keep. The memory estimate (memory_estimate.h)
// subtracts the same bytes; its total is an upper bound of the peak (it adds up every layer's
// backward tensors, which the runtime frees layer by layer).
TEST(Recompute, PeakActivationsDropByWhatEachModuleDoesNotKeep) {
    constexpr int kSteps = 2;
    const int ep = comm::current_world_size();
    for (const Shape* shape : {&test_shape(), &recipe_shape()}) {
        SCOPED_TRACE(shape->name);
        if (shape == &recipe_shape() && !two_ranks())
            continue;  // the larger shape at 2 ranks only, as the bit-identity runs
        // The last step's peak: in the first one an arena that grows counts the unused tail
        // of the chunk it outgrew; steady-state steps (the arenas merged) hold exactly their
        // tensors.
        const auto measure = [&](std::vector<std::string> extra) {
            const config::Config cfg = make(1, std::move(extra), true, *shape);
            Trainer trainer(cfg);
            int64_t peak = 0;
            for (int i = 0; i < kSteps; ++i)
                peak = trainer.step().peak_activation_bytes;
            return std::pair<int64_t, int64_t>{
                peak, config::estimate_rank_memory(cfg, comm::current_world_size()).activations};
        };
        const auto [off, estimate_off] = measure({});
        int64_t all = 0;
        for (const std::string& modules : kModules) {
            SCOPED_TRACE(modules);
            const bool every = modules == kModules.back();
            const auto [on, estimate_on] = measure(selective(modules));
            const int64_t expected = every ? all : expected_saving(*shape, modules, ep);
            EXPECT_EQ(off - on, expected);
            EXPECT_EQ(estimate_off - estimate_on, expected);
            all += expected;
            if (comm::current_world_rank() == 0) {
                std::printf(
                    "%s, recompute [%s]: peak activation bytes %lld -> %lld (saves %lld); "
                    "estimate %lld -> %lld (saves %lld)\n",
                    shape->name, modules.c_str(), static_cast<long long>(off),
                    static_cast<long long>(on), static_cast<long long>(off - on),
                    static_cast<long long>(estimate_off), static_cast<long long>(estimate_on),
                    static_cast<long long>(estimate_off - estimate_on));
            }
        }
    }
}

// ---- Full recompute (model.recompute_granularity=full; schedule.h "Full recompute") ----

// Four layers, the first dense: uniform groups of 1, 2 and 3 (the last one shorter), and block
// recomputing the first 2 layers of the 4.
std::vector<std::string> four_layers(std::vector<std::string> extra) {
    return joined({"model.num_layers=4", "model.moe_layer_freq=[0,1,1,1]"}, extra);
}

std::vector<std::string> full(const std::string& method, int layers) {
    return {"model.recompute_granularity=full", "model.recompute_method=" + method,
            "model.recompute_num_layers=" + std::to_string(layers)};
}

const std::vector<std::pair<std::string, int>> kFullMethods = {
    {"uniform", 1}, {"uniform", 2}, {"uniform", 3}, {"block", 2}};

TEST(FullRecompute, UniformAndBlockAreBitIdenticalToNoRecomputeInEverySchedule) {
    if (!two_ranks())
        GTEST_SKIP() << "runs at 2 ranks (see two_ranks())";
    constexpr int kSteps = 3, kMicroBatches = 3;
    const RunRecord plain = testing::record_run(make(kMicroBatches, four_layers({})), kSteps);
    EXPECT_LT(plain.losses.back(), plain.losses.front());
    for (const Schedule& schedule : schedules()) {
        for (const auto& [method, layers] : kFullMethods) {
            SCOPED_TRACE(std::string(schedule.name) + " " + method + " " + std::to_string(layers));
            const config::Config cfg =
                make(kMicroBatches, four_layers(joined(schedule.overrides, full(method, layers))));
            ASSERT_EQ(cfg.model.recompute_granularity, config::RecomputeGranularity::kFull);
            expect_bit_identical(plain, testing::record_run(cfg, kSteps));
        }
    }
}

// A run's record and its load-balancing loss per step (the routing tallies of the step, which a
// recompute must not count again).
std::pair<RunRecord, std::vector<double>> record_with_aux(const config::Config& cfg, int steps) {
    Trainer trainer(cfg);
    RunRecord r;
    std::vector<double> aux;
    for (int i = 0; i < steps; ++i) {
        const StepResult s = trainer.step();
        r.losses.push_back(s.lm_loss);
        r.grad_norms.push_back(s.grad_norm);
        aux.push_back(s.load_balancing_loss.value_or(-1.0));
    }
    r.params = testing::record_run(trainer, 0).params;
    return {r, aux};
}

// MoE chunks (with a capacity and dropless), paired edges and multi-latent attention with
// DeepSeek-V3's router under full recompute, each against the same run without it (overlap with
// delayed wgrad).
TEST(FullRecompute, ChunksPairedEdgesAndMlaAreBitIdentical) {
    if (!two_ranks())
        GTEST_SKIP() << "runs at 2 ranks (see two_ranks())";
    constexpr int kSteps = 2, kMicroBatches = 3;
    const std::vector<std::string> delayed = schedules()[2].overrides;
    struct Variant {
        const char* name;
        std::vector<std::string> overrides;
        bool capacity = true;
    };
    const std::vector<Variant> variants = {
        {"chunks", joined(delayed, {"model.moe_ep_overlap_num_chunks=2"})},
        {"chunks, dropless", joined(delayed, {"model.moe_ep_overlap_num_chunks=2"}), false},
        {"paired edges", joined(delayed, {"model.moe_ep_overlap_pair_edges=true"})},
        {"mla",
         joined(delayed,
                {"model.multi_latent_attention=true", "model.q_lora_rank=32",
                 "model.kv_lora_rank=32", "model.qk_head_dim=16", "model.qk_pos_emb_head_dim=8",
                 "model.v_head_dim=16", "model.rope_type=rope",
                 // DeepSeek-V3's router: the expert bias moves with the step's
                 // routing tallies, which a recompute must not count again.
                 "model.moe_router_score_function=sigmoid",
                 "model.moe_router_enable_expert_bias=true", "model.moe_router_num_groups=4",
                 "model.moe_router_group_topk=2", "model.moe_router_topk_scaling_factor=2.5",
                 "model.moe_router_dtype=fp32", "model.moe_router_load_balancing_type=seq_aux_loss",
                 "model.moe_aux_loss_coeff=1e-4"})},
    };
    for (const Variant& v : variants) {
        for (const auto& [method, layers] :
             {std::pair<std::string, int>{"uniform", 2}, {"block", 1}}) {
            SCOPED_TRACE(std::string(v.name) + " " + method + " " + std::to_string(layers));
            const config::Config off = make(kMicroBatches, four_layers(v.overrides), v.capacity);
            const config::Config on = make(
                kMicroBatches, four_layers(joined(v.overrides, full(method, layers))), v.capacity);
            const auto [a, aux_a] = record_with_aux(off, kSteps);
            const auto [b, aux_b] = record_with_aux(on, kSteps);
            expect_bit_identical(a, b);
            EXPECT_EQ(aux_a, aux_b);
        }
    }
}

// PP 2 on 2 ranks (EP 1, so the baseline schedule), with an interleaved VPP 2: groups per model
// chunk, against the same pipeline without recompute.
TEST(FullRecompute, PipelineStagesAreBitIdentical) {
    if (!two_ranks())
        GTEST_SKIP() << "runs at 2 ranks (see two_ranks())";
    constexpr int kSteps = 2;
    const auto pp = [](std::vector<std::string> extra) {
        std::vector<std::string> o = testing::tiny_shape_overrides();
        o.insert(o.end(),
                 {"model.num_layers=4", "model.moe_layer_freq=[0,1,1,1]", "comm.gpus_per_node=2",
                  "model.expert_model_parallel_size=1", "model.pipeline_model_parallel_size=2",
                  "model.virtual_pipeline_model_parallel_size=2", "train.global_batch_size=8"});
        o.insert(o.end(), extra.begin(), extra.end());
        return epo::testing::run_config("tiny-moe", o);
    };
    const RunRecord off = testing::record_run(pp({}), kSteps);
    for (const auto& [method, layers] : {std::pair<std::string, int>{"uniform", 1}, {"block", 1}}) {
        SCOPED_TRACE(method);
        expect_bit_identical(off, testing::record_run(pp(full(method, layers)), kSteps));
    }
}

// One micro-batch through the baseline: full recompute of every layer leaves the peak at one
// layer's activations plus the layers' inputs, measured by the model's meter; the memory plan
// (train::estimate_run_memory, the estimate epo train checks) drops by about as much.
TEST(FullRecompute, PeakActivationsDropAsTheMemoryPlanEstimates) {
    constexpr int kSteps = 2;
    const auto measure = [&](std::vector<std::string> extra) {
        const config::Config cfg = make(1, four_layers(std::move(extra)));
        Trainer trainer(cfg);
        int64_t peak = 0;
        for (int i = 0; i < kSteps; ++i)
            peak = trainer.step().peak_activation_bytes;
        return std::pair<int64_t, int64_t>{peak, estimate_run_memory(cfg).activations};
    };
    const auto [off, estimate_off] = measure({});
    for (const auto& [method, layers] : kFullMethods) {
        SCOPED_TRACE(method + " " + std::to_string(layers));
        const auto [on, estimate_on] = measure(full(method, layers));
        const double measured = static_cast<double>(off - on);
        const double estimated = static_cast<double>(estimate_off - estimate_on);
        if (comm::current_world_rank() == 0) {
            std::printf(
                "full recompute %s %d: peak activation bytes %lld -> %lld (saves %lld); "
                "estimate %lld -> %lld (saves %lld)\n",
                method.c_str(), layers, static_cast<long long>(off), static_cast<long long>(on),
                static_cast<long long>(off - on), static_cast<long long>(estimate_off),
                static_cast<long long>(estimate_on),
                static_cast<long long>(estimate_off - estimate_on));
        }
        // The estimate's per-layer bytes hold every backward tensor at once (0.68x the peak
        // without recompute here), so it saves a little more than is measured; it stays an
        // upper bound of the peak.
        EXPECT_GT(measured, 0.0);
        EXPECT_GT(estimated, 0.0);
        EXPECT_NEAR(measured / estimated, 0.8, 0.25);
        EXPECT_GE(estimate_on, on);
    }
}

}  // namespace
}  // namespace epo::train
