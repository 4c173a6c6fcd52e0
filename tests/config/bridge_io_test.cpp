// Reading a Megatron-Bridge run_config.yaml (bridge_io.h): tags, callables and enums, the section
// layout, ignored keys listed once, unhonoured keys refused with the reason, the overlap
// reconciliation, and the two realistic files in tests/data.
#include "epo/config/bridge_io.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "config_test_util.h"
#include "epo/config/builder.h"
#include "epo/config/validate.h"

namespace epo::config {
namespace {

using testing::expect_error;
using testing::has;
using testing::ids;

const YamlSource kSource{"run_config.yaml"};

BuiltConfig build_text(const std::string& text) {
    ConfigSources s;
    s.config_text = text;
    return build_config(s);
}

const char* kSmall = R"(_target_: megatron.bridge.training.config.ConfigContainer
comm_overlap:
  _target_: megatron.bridge.training.comm_overlap.CommOverlapConfig
  delay_wgrad_compute: null
  overlap_moe_expert_parallel_comm: true
  tp_comm_overlap: false
dist:
  _target_: megatron.bridge.training.config.DistributedInitConfig
  distributed_backend: nccl
logger:
  _target_: megatron.bridge.training.config.LoggerConfig
  log_interval: 7
  tensorboard_dir: /results/tb
mixed_precision:
  _target_: megatron.bridge.training.mixed_precision.MixedPrecisionConfig
  bf16: true
  fp16: false
  fp8: null
  grad_reduce_in_fp32: false
model:
  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider
  activation_func:
    _call_: false
    _target_: torch.nn.functional.silu
  cuda_graph_modules:
  - _args_: [attn]
    _call_: true
    _name_: attn
    _target_: megatron.core.transformer.enums.CudaGraphModule
  expert_model_parallel_size: 2
  fp8: null
  hidden_size: 256
  moe_grouped_gemm: true
  num_attention_heads: 4
  num_layers: 2
  num_moe_experts: 4
  overlap_moe_expert_parallel_comm: false
  params_dtype:
    _call_: false
    _target_: torch.bfloat16
  vocab_size: 256
optimizer:
  _target_: megatron.bridge.training.config.OptimizerConfig
  lr: 0.0003
  optimizer: adam
  use_distributed_optimizer: true
rng:
  _target_: megatron.training.config.common_config.RNGConfig
  seed: 99
  te_rng_tracker: false
scheduler:
  _target_: megatron.bridge.training.config.SchedulerConfig
  lr_decay_iters: 50
  lr_decay_style: cosine
  lr_warmup_iters: 5
  start_weight_decay: 0.033
train:
  _target_: megatron.bridge.training.config.TrainingConfig
  global_batch_size: 8
  manual_gc: true
  micro_batch_size: 1
  train_iters: 60
)";

TEST(BridgeIo, RecognizesTaggedDocuments) {
    EXPECT_TRUE(is_bridge_document(parse_yaml(kSmall, kSource)));
    EXPECT_FALSE(is_bridge_document(parse_yaml("model:\n  num_layers: 2\n", kSource)));
}

TEST(BridgeIo, TagsCallablesAndEnumsMapToEposValues) {
    const Config c = build_text(kSmall).config;
    EXPECT_EQ(c.model.activation_func, ActivationFunc::kSilu);
    EXPECT_EQ(c.model.cuda_graph_modules, std::vector<CudaGraphModule>{CudaGraphModule::kAttn});
    EXPECT_EQ(c.model.num_moe_experts, 4);
    EXPECT_EQ(c.model.expert_model_parallel_size, 2);
}

TEST(BridgeIo, SectionLayoutMapsToEposTree) {
    const Config c = build_text(kSmall).config;
    EXPECT_EQ(c.train.seed, 99);            // rng.seed
    EXPECT_EQ(c.train.log_interval, 7);     // logger.log_interval
    EXPECT_EQ(c.train.lr_warmup_iters, 5);  // scheduler.*
    EXPECT_EQ(c.train.lr_decay_iters, 50);
    EXPECT_EQ(c.train.lr_decay_style, LrDecayStyle::kCosine);
    EXPECT_TRUE(c.model.bf16);  // mixed_precision.bf16
    EXPECT_EQ(c.optimizer.lr, 0.0003);
    EXPECT_EQ(c.train.train_iters, 60);
    ASSERT_TRUE(c.comm_overlap.has_value());
    EXPECT_EQ(c.comm_overlap->overlap_moe_expert_parallel_comm, true);
}

TEST(BridgeIo, UnusedKeysAreListedOnceInANote) {
    const BridgeTranslation t = translate_bridge(parse_yaml(kSmall, kSource), kSource);
    const std::vector<std::string> expected = {"dist.*",
                                               "logger.tensorboard_dir",
                                               "mixed_precision.fp8",
                                               "model.moe_grouped_gemm",
                                               "model.params_dtype",
                                               "optimizer.use_distributed_optimizer",
                                               "rng.te_rng_tracker",
                                               "scheduler.start_weight_decay",
                                               "train.manual_gc"};
    EXPECT_EQ(t.ignored, expected);
    const BuiltConfig built = build_text(kSmall);
    int listed = 0;
    for (const std::string& note : built.notes) {
        listed += note.find("Megatron-Bridge keys EPO does not use") != std::string::npos;
    }
    EXPECT_EQ(listed, 1);
}

// Bridge's performance recipes reduce gradients in bf16: read, so that the plan charges it and
// a run is refused (RT047) instead of reducing in fp32. mixed_precision's value wins over ddp's
// (Bridge's set-up copies it over); a recipe name sets it as the recipe does.
TEST(BridgeIo, GradReduceDtypeIsReadAndMixedPrecisionWins) {
    EXPECT_FALSE(build_text(kSmall).config.ddp.grad_reduce_in_fp32);  // mixed_precision's false
    const std::string ddp_true = std::string(kSmall) +
                                 "ddp:\n  _target_: megatron.bridge.training.config."
                                 "DistributedDataParallelConfig\n  grad_reduce_in_fp32: true\n";
    EXPECT_FALSE(build_text(ddp_true).config.ddp.grad_reduce_in_fp32);
    const auto with_mixed = [](const std::string& mixed) {
        return std::string(
                   "_target_: megatron.bridge.training.config.ConfigContainer\n"
                   "ddp:\n  _target_: x.DistributedDataParallelConfig\n"
                   "  grad_reduce_in_fp32: false\n"
                   "model:\n  _target_: x.GPTModelProvider\n  num_layers: 2\n") +
               mixed;
    };
    EXPECT_FALSE(build_text(with_mixed("")).config.ddp.grad_reduce_in_fp32);  // ddp's alone
    EXPECT_TRUE(
        build_text(with_mixed("mixed_precision: bf16_mixed\n")).config.ddp.grad_reduce_in_fp32);
    EXPECT_FALSE(
        build_text(with_mixed("mixed_precision: fp16_mixed\n")).config.ddp.grad_reduce_in_fp32);
    const ValidationReport r = validate(build_text(kSmall));
    EXPECT_TRUE(has(r.warnings, "RT047")) << ::testing::PrintToString(ids(r.warnings));
}

TEST(BridgeIo, RequestedOverlapWinsOverTheModelsAsBridgeDoes) {
    const BuiltConfig built = build_text(kSmall);
    bool noted = false;
    for (const std::string& note : built.notes) {
        noted |= note.find(
                     "comm_overlap.overlap_moe_expert_parallel_comm (requested: true) and "
                     "model.overlap_moe_expert_parallel_comm (false) differ") != std::string::npos;
    }
    EXPECT_TRUE(noted);
    const ValidationReport r = validate(built);
    EXPECT_TRUE(r.config.model.overlap_moe_expert_parallel_comm);
    EXPECT_FALSE(r.config.model.delay_wgrad_compute);  // null request: off, as Bridge's setup
}

TEST(BridgeIo, KeysThatWouldChangeTheResultAreRefusedWithTheReason) {
    // fp8 is a field of EPO's now: read like any other (epo plan models it, the CPU runtime
    // refuses it with RT032).
    std::string fp8 = kSmall;
    fp8.replace(fp8.find("  fp8: null\n  hidden_size"), 11, "  fp8: hybrid");
    EXPECT_EQ(build_text(fp8).config.model.fp8, "hybrid");
    std::string fp4 = kSmall;
    fp4.replace(fp4.find("  fp8: null\n  hidden_size"), 11, "  fp4: e2m1\n  fp8: null");
    expect_error([&] { build_text(fp4); }, ErrorKind::kUsage,
                 {"model.fp4 = e2m1 would change the result", "does not model FP4"});
    // MLA's YaRN softmax scale applies with any rope type: refused unless zero (the Bridge
    // DeepSeek-V3 file's 0.0 reads, see DeepseekRunConfigValidatesWithItsPipelineLayout).
    std::string mscale = kSmall;
    mscale.replace(mscale.find("  fp8: null\n  hidden_size"), 11,
                   "  fp8: null\n  mscale_all_dim: 1.0");
    expect_error([&] { build_text(mscale); }, ErrorKind::kUsage,
                 {"model.mscale_all_dim = 1.0 would change the result", "softmax mscale"});
    mscale.replace(mscale.find("mscale_all_dim: 1.0"), 19, "mscale_all_dim: 0.0");
    EXPECT_NO_THROW(build_text(mscale));
    std::string sgd = kSmall;
    sgd.replace(sgd.find("optimizer: adam"), 15, "optimizer: sgd");
    expect_error([&] { build_text(sgd); }, ErrorKind::kUsage,
                 {"optimizer.optimizer = sgd", "EPO models Adam"});
    std::string relu = kSmall;
    relu.replace(relu.find("torch.nn.functional.silu"), 24, "torch.nn.functional.relu");
    expect_error([&] { build_text(relu); }, ErrorKind::kUsage,
                 {"model.activation_func", "torch.nn.functional.relu", "silu and gelu"});
}

TEST(BridgeIo, SuggestionsDoNotPointTheWrongWay) {
    // A file in EPO's own layout (no tags) that carries Bridge's names.
    expect_error([] { build_text("rng:\n  seed: 3\n"); }, ErrorKind::kUsage,
                 {"'rng' is a Megatron-Bridge section"});
    expect_error([] { build_text("model:\n  fp4: e2m1\n"); }, ErrorKind::kUsage,
                 {"EPO does not model FP4 compute"});
    expect_error([] { build_text("logger:\n  log_interval: 3\n"); }, ErrorKind::kUsage,
                 {"Megatron-Bridge's name, which EPO's own layout calls 'train.log_interval'"});
    for (const char* text : {"rng:\n  seed: 3\n", "model:\n  fp4: e2m1\n"}) {
        try {
            build_text(text);
        } catch (const Error& e) {
            EXPECT_EQ(std::string(e.what()).find("did you mean"), std::string::npos) << e.what();
        }
    }
}

std::string data(const char* name) {
    return std::string(EPO_SOURCE_DIR) + "/tests/data/" + name;
}

TEST(BridgeIo, Qwen3RunConfigValidatesAsWritten) {
    ConfigSources s;
    s.config_path = data("bridge-qwen3-30b-a3b-run_config.yaml");
    const ValidationReport r = validate(build_config(s));
    EXPECT_TRUE(r.ok()) << ::testing::PrintToString(ids(r.errors));
    EXPECT_EQ(r.config.model.num_moe_experts, 128);
    EXPECT_EQ(r.config.model.expert_model_parallel_size, 16);
    EXPECT_TRUE(r.config.model.overlap_moe_expert_parallel_comm);
    EXPECT_TRUE(r.config.model.delay_wgrad_compute);
    EXPECT_EQ(r.config.model.activation_func, ActivationFunc::kSilu);
}

// Bridge's DeepSeek-V3 recipe splits 61 layers over PP 8 with an explicit layout, written in
// Megatron-Core's list form: read into EPO's string form, and the file validates as written.
TEST(BridgeIo, DeepseekRunConfigValidatesWithItsPipelineLayout) {
    ConfigSources s;
    s.config_path = data("bridge-deepseek-v3-run_config.yaml");
    const BuiltConfig built = build_config(s);
    ASSERT_TRUE(built.config.model.pipeline_model_parallel_layout.has_value());
    const std::string& layout = *built.config.model.pipeline_model_parallel_layout;
    EXPECT_EQ(layout.substr(0, 10), "Etttttttt|");
    EXPECT_EQ(std::count(layout.begin(), layout.end(), 't'), 61);
    EXPECT_EQ(layout.substr(layout.size() - 3), "tmL") << layout;
    // MLA with its norms and YaRN rope: read, so that a run is refused (RT035) instead of
    // running plain rope.
    EXPECT_TRUE(built.config.model.multi_latent_attention);
    EXPECT_TRUE(built.config.model.qk_layernorm);
    EXPECT_EQ(built.config.model.rope_type, "yarn");
}

// A Megatron-LM checkpoint's arguments (vars(args) as YAML): Megatron-LM's names mapped, the
// rest listed once.
TEST(BridgeIo, MegatronArgsDumpIsReadWithItsNames) {
    ConfigSources s;
    s.config_path = data("megatron-args-qwen3-30b-a3b.yaml");
    const BuiltConfig built = build_config(s);
    const ModelConfig& m = built.config.model;
    EXPECT_EQ(m.num_moe_experts, 128);  // num_experts
    EXPECT_EQ(m.expert_model_parallel_size, 16);
    EXPECT_EQ(m.activation_func, ActivationFunc::kSilu);  // swiglu
    EXPECT_TRUE(m.gated_linear_unit);
    EXPECT_FALSE(m.add_bias_linear);                      // disable_bias_linear
    EXPECT_FALSE(m.share_embeddings_and_output_weights);  // untie_embeddings_and_output_weights
    EXPECT_EQ(m.layernorm_epsilon, 1e-6);                 // norm_epsilon
    EXPECT_EQ(m.vocab_size, 151936);                      // padded_vocab_size
    EXPECT_EQ(built.config.train.global_batch_size, 1024);
    EXPECT_EQ(built.config.train.lr_warmup_iters, 40);
    EXPECT_EQ(built.config.optimizer.adam_beta2, 0.95);
    ASSERT_EQ(built.notes.size(), 1u);
    EXPECT_NE(built.notes[0].find("Megatron-LM arguments EPO does not use"), std::string::npos);
    EXPECT_NE(built.notes[0].find("moe_grouped_gemm"), std::string::npos);
    const ValidationReport r = validate(built);
    EXPECT_TRUE(r.ok()) << ::testing::PrintToString(ids(r.errors));
    EXPECT_TRUE(r.config.model.overlap_moe_expert_parallel_comm);
    expect_error([] { build_text("num_experts: 8\nfp4: e2m1\n"); }, ErrorKind::kUsage,
                 {"fp4 = e2m1 would change the result"});
}

}  // namespace
}  // namespace epo::config
