// The memory estimate's formulas (config/memory_estimate.h) on hand-counted shapes, and the
// refusal a run gets when the estimate does not fit the machine.
#include "epo/config/memory_estimate.h"

#include <gtest/gtest.h>

#include "epo/config/recipes.h"
#include "epo/config/validate.h"
#include "epo/core/error.h"
#include "epo/model/mla_attention.h"

namespace epo::config {
namespace {

Config tiny(int ep) {
    Config c = make_recipe("tiny-moe");
    c.comm.gpus_per_node = ep;
    c.model.expert_model_parallel_size = ep;
    c.train.global_batch_size = 8;
    return validate(c).config;
}

TEST(MemoryEstimate, ParametersOfTinyMoeCountedByHand) {
    // tiny-moe: V 256, H 256, 4 heads of 64, 2 groups, 8 experts of F 512 (SwiGLU), 2 layers.
    // Dense: 2 VH + H + 2 * (2H + H(4 + 4)64 + 4*64*H + 8H) = 529,664; experts on each of 2 EP
    // ranks: 2 * 4 * (H * 1024 + 512 H) = 3,145,728.
    const int64_t dense = 529'664, expert = 3'145'728;
    const MemoryEstimate m = estimate_rank_memory(tiny(2), 2);
    EXPECT_EQ(m.parameters, (dense + expert) * (4 + 2));  // fp32 master + bf16 compute
    EXPECT_EQ(m.gradients, (dense + expert) * 4);
    EXPECT_EQ(m.optimizer, (dense + expert) * 8);  // not distributed: whole Adam m, v
    EXPECT_EQ(m.packed, expert * 2 * 2);
    EXPECT_EQ(m.runtime, kRuntimeBaseBytes);
}

// tiny-moe with multi-latent attention: Rq 32, Rkv 16, Dn 16, Dr 8, Dv 16, with the latent norms.
Config tiny_mla(bool q_lora) {
    Config c = make_recipe("tiny-moe");
    c.comm.gpus_per_node = 2;
    c.model.expert_model_parallel_size = 2;
    c.train.global_batch_size = 8;
    c.model.multi_latent_attention = true;
    c.model.qk_layernorm = true;
    c.model.q_lora_rank = q_lora ? std::optional<int>(32) : std::nullopt;
    c.model.kv_lora_rank = 16;
    c.model.qk_head_dim = 16;
    c.model.qk_pos_emb_head_dim = 8;
    c.model.v_head_dim = 16;
    return validate(c).config;
}

TEST(MemoryEstimate, MlaParametersCountedByHand) {
    // Per layer: q_down 32 x 256 + q_up (4 x 24) x 32 + kv_down 24 x 256 + kv_up (4 x 32) x 16
    // + proj 256 x 64 + norms 32 + 16 = 35,888 (GQA's qkv and proj: 196,608). Dense:
    // 2 VH + H + 2 * (2H + 35,888 + 8H) = 208,224; without q lora q_proj (4 x 24) x 256 and its
    // norm 256 replace q_down, q_up and the 32-wide norm: 24,576 + 256 - 8,192 - 3,072 - 32 =
    // +13,536 per layer.
    const int64_t expert = 3'145'728;
    EXPECT_EQ(estimate_rank_memory(tiny_mla(true), 2).gradients, (208'224 + expert) * 4);
    EXPECT_EQ(estimate_rank_memory(tiny_mla(false), 2).gradients,
              (208'224 + 2 * 13'536 + expert) * 4);
}

TEST(MemoryEstimate, MlaActivationsAreWhatTheLayerSaves) {
    // The estimate swaps GQA's saved tensors for MLA's, which the layer's own count gives
    // (model::mla_saved_bytes, itself checked against the layer's arena in the model tests).
    // GQA on tiny-moe (T 256 = 2 x 128, c 2): q,k,v,ctx cT(W + Ad) = 393,216, probs cBAS^2 =
    // 262,144 (forward), dout + dqkv cT(H + W) = 393,216 (dgrad); the qk norms 4T(A + G)(d + 1)
    // = 399,360.
    for (bool q_lora : {true, false}) {
        const Config mla = tiny_mla(q_lora);
        Config gqa = mla;
        gqa.model.multi_latent_attention = false;
        const model::MlaShape shape{.hidden = 256,
                                    .num_heads = 4,
                                    .q_lora_rank = q_lora ? 32 : 0,
                                    .kv_lora_rank = 16,
                                    .qk_head_dim = 16,
                                    .qk_pos_emb_head_dim = 8,
                                    .v_head_dim = 16,
                                    .seq_length = 128,
                                    .qk_layernorm = true};
        const model::MlaSavedBytes saved = model::mla_saved_bytes(shape, 2, 2);
        const int64_t layers = 2, gqa_bytes = 393'216 + 262'144 + 393'216 + 399'360;
        EXPECT_EQ(
            estimate_rank_memory(mla, 2).activations - estimate_rank_memory(gqa, 2).activations,
            layers * (saved.forward + saved.dgrad - gqa_bytes))
            << "q lora " << q_lora;
    }
}

TEST(MemoryEstimate, OverlapHoldsTwoMicroBatches) {
    Config base = tiny(2);
    Config overlap = base;
    overlap.model.overlap_moe_expert_parallel_comm = true;
    const MemoryEstimate b = estimate_rank_memory(base, 2), o = estimate_rank_memory(overlap, 2);
    EXPECT_EQ(b.micro_batches_in_flight, 1);
    EXPECT_EQ(o.micro_batches_in_flight, 2);
    EXPECT_EQ(o.activations, 2 * b.activations);
}

TEST(MemoryEstimate, PairedEdgesHoldAThirdMicroBatchFromThreePerStep) {
    Config paired = tiny(2);
    paired.model.overlap_moe_expert_parallel_comm = true;
    paired.model.moe_ep_overlap_pair_edges = true;
    const MemoryEstimate b = estimate_rank_memory(tiny(2), 2);
    for (int mbs : {1, 2, 3, 8}) {
        paired.train.global_batch_size = static_cast<int>(mbs * config::samples_per_step(paired));
        ASSERT_EQ(config::num_microbatches(paired), mbs);
        const MemoryEstimate p = estimate_rank_memory(paired, 2);
        EXPECT_EQ(p.micro_batches_in_flight, mbs >= 3 ? 3 : 2) << mbs;
        EXPECT_EQ(p.activations, p.micro_batches_in_flight * b.activations) << mbs;
    }
}

TEST(MemoryEstimate, SelectiveRecomputeSubtractsWhatEachModuleDoesNotKeep) {
    // tiny-moe with a dense first layer and a shared expert of 128: T = 2 x 128 = 256 tokens,
    // H 256, B 2 sequences of S 128, A 4 heads, top-2 (R = 512 rows), expert F 512, dense F 1024,
    // bf16 (c = 2). Per module, over the two layers:
    //   layernorm       2 layers x 2cTH = 2 x 2 x 2 x 256 x 256       =   524,288
    //   core_attn       2 layers x cBAS^2 = 2 x 2 x 2 x 4 x 128^2     =   524,288
    //   moe_act         1 MoE layer x cRF = 2 x 512 x 512             =   524,288
    //   mlp             1 dense layer x cT(2F + F) = 2 x 256 x 3072   = 1,572,864
    //   shared_experts  1 MoE layer x cT(2Fs + Fs) = 2 x 256 x 384    =   196,608
    Config base = tiny(2);
    base.model.moe_layer_freq = std::vector<int>{0, 1};
    base.model.moe_shared_expert_intermediate_size = 128;
    const MemoryEstimate off = estimate_rank_memory(base, 2);
    const std::vector<std::pair<RecomputeModule, int64_t>> cases = {
        {RecomputeModule::kLayernorm, 524'288},
        {RecomputeModule::kCoreAttn, 524'288},
        {RecomputeModule::kMoeAct, 524'288},
        {RecomputeModule::kMlp, 1'572'864},
        {RecomputeModule::kSharedExperts, 196'608}};
    int64_t all = 0;
    std::vector<RecomputeModule> every;
    for (const auto& [module, saving] : cases) {
        SCOPED_TRACE(std::string(enum_name(module)));
        Config c = base;
        c.model.recompute_granularity = RecomputeGranularity::kSelective;
        c.model.recompute_modules = std::vector<RecomputeModule>{module};
        const MemoryEstimate on = estimate_rank_memory(c, 2);
        EXPECT_EQ(off.activations - on.activations, saving);
        EXPECT_GT(on.scratch, off.scratch);  // recomputed in the backward's scratch
        all += saving;
        every.push_back(module);
    }
    Config c = base;
    c.model.recompute_granularity = RecomputeGranularity::kSelective;
    c.model.recompute_modules = every;
    EXPECT_EQ(off.activations - estimate_rank_memory(c, 2).activations, all);
    // Null modules are [core_attn]; modules without selective granularity recompute nothing.
    c.model.recompute_modules.reset();
    EXPECT_EQ(off.activations - estimate_rank_memory(c, 2).activations, 524'288);
    c.model.recompute_granularity.reset();
    c.model.recompute_modules = every;
    EXPECT_EQ(estimate_rank_memory(c, 2).activations, off.activations);
    // Two micro-batches in flight save twice.
    c = base;
    c.model.overlap_moe_expert_parallel_comm = true;
    const int64_t overlap_off = estimate_rank_memory(c, 2).activations;
    c.model.recompute_granularity = RecomputeGranularity::kSelective;
    c.model.recompute_modules = every;
    EXPECT_EQ(overlap_off - estimate_rank_memory(c, 2).activations, 2 * all);
}

TEST(MemoryEstimate, DistributedOptimizerShardsTheMoments) {
    Config c = tiny(1);
    c.comm.gpus_per_node = 2;  // EP 1 over 2 ranks: dense and experts both replicated twice
    const int64_t whole = estimate_rank_memory(c, 2).optimizer;
    c.ddp.use_distributed_optimizer = true;
    EXPECT_EQ(estimate_rank_memory(c, 2).optimizer, whole / 2);
}

// The example: hidden 65536 validated and died in std::bad_alloc.
TEST(MemoryEstimate, ARunThatCannotFitIsRefusedWithBothNumbersAndTheFields) {
    Config c = tiny(2);
    c.model.hidden_size = 65536;
    const MemoryEstimate m = estimate_rank_memory(c, 2);
    EXPECT_GT(m.total(), int64_t{10} << 30);
    try {
        check_memory_fits(m, 2, int64_t{8} << 30);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kConfig);
        const std::string msg = e.what();
        EXPECT_NE(msg.find("this machine has 8.00 GiB available"), std::string::npos) << msg;
        EXPECT_NE(msg.find("2 ranks on this host"), std::string::npos) << msg;
        EXPECT_NE(msg.find("model.hidden_size"), std::string::npos) << msg;
    }
    EXPECT_NO_THROW(check_memory_fits(m, 2, std::nullopt));  // unknown: not refused
    EXPECT_NO_THROW(check_memory_fits(estimate_rank_memory(tiny(2), 2), 2, int64_t{8} << 30));
}

TEST(MemoryEstimate, AvailableMemoryIsReadFromThisMachine) {
    const std::optional<int64_t> available = available_memory_bytes();
    ASSERT_TRUE(available.has_value());
    EXPECT_GT(*available, 0);
}

}  // namespace
}  // namespace epo::config
