// The step plan of every shipped recipe, built without MPI and without a model, for the
// baseline, overlap and overlap + delayed wgrad schedules, checked against the invariants the
// Trainer relies on: every micro-batch runs every node of every layer forward and backward
// exactly once, in layer order; overlap and baseline hold the same compute calls; the buckets
// cover every model position exactly once, in backward order, closing as grad_buckets.h says.
// A second test checks the plan's parameter sizes against a live model's.
#include "epo/train/step_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "epo/config/builder.h"
#include "epo/config/finalize.h"
#include "epo/config/recipes.h"
#include "epo/train/memory_plan.h"

namespace epo::train {
namespace {

using schedule::NodeCall;
using schedule::NodeKind;
using schedule::Phase;

// A topology and EP size each recipe admits (experts divisible by EP, world by EP), and for
// tiny-moe a global batch that gives more than one micro-batch per step on 4 ranks. The
// recipes' own features are kept; the CPU runtime would refuse to run the large ones (their
// sizes), the plan does not care.
struct RecipeTopology {
    std::string recipe;
    int num_nodes, gpus_per_node, ep;
    std::vector<std::string> overrides = {};
};
const std::vector<RecipeTopology> kTopologies = {
    {"qwen3-30b-a3b", 2, 8, 8},
    {"qwen3-235b-a22b", 4, 8, 16},
    {"deepseek-v3", 8, 8, 64},
    {"mixtral-8x7b", 2, 8, 8},
    {"tiny-moe", 1, 4, 2, {"train.global_batch_size=32"}}};

enum class Kind { kBaseline, kOverlap, kDelayed };

config::Config finalized(const RecipeTopology& t, Kind kind, std::vector<std::string> extra) {
    config::ConfigSources sources;
    sources.model = t.recipe;
    sources.harness.num_nodes = t.num_nodes;
    sources.harness.gpus_per_node = t.gpus_per_node;
    sources.harness.expert_model_parallel_size = t.ep;
    sources.harness.moe_a2a_overlap = kind != Kind::kBaseline;
    sources.overrides = {"ddp.use_distributed_optimizer=true", "ddp.overlap_grad_reduce=true",
                         "ddp.overlap_param_gather=true",
                         std::string("comm_overlap.delay_wgrad_compute=") +
                             (kind == Kind::kDelayed ? "true" : "false")};
    sources.overrides.insert(sources.overrides.end(), t.overrides.begin(), t.overrides.end());
    sources.overrides.insert(sources.overrides.end(), extra.begin(), extra.end());
    config::Config c = config::build_config(sources).config;
    config::finalize(c);
    return c;
}

StepPlan plan_of(const config::Config& c) {
    return make_step_plan(c,
                          model::gpt_shape_from_config(c, c.model.expert_model_parallel_size, 0));
}

// (micro-batch, layer, node, phase): a call's identity, without its flags.
using CallKey = std::tuple<int, int, NodeKind, Phase>;
CallKey key_of(const NodeCall& c) {
    return {c.micro_batch, c.layer, c.node, c.phase};
}

// Compute calls (model nodes), each with its count; weight-gradient calls apart.
std::map<CallKey, int> model_calls(const std::vector<NodeCall>& calls, bool with_dw) {
    std::map<CallKey, int> m;
    for (const NodeCall& c : calls) {
        if (schedule::is_side_branch(c.node) || (!with_dw && c.phase == Phase::kBackwardDw))
            continue;
        ++m[key_of(c)];
    }
    return m;
}

int count_of(const std::map<CallKey, int>& m, const CallKey& k) {
    const auto it = m.find(k);
    return it == m.end() ? 0 : it->second;
}

// With shared-expert overlap (the deepseek-v3 recipe's baseline) a MoE layer's shared expert is
// a node of its own.
std::vector<NodeKind> layer_nodes(bool is_moe, bool shared_node) {
    if (!is_moe)
        return {NodeKind::kPreDispatch, NodeKind::kMlp};
    if (shared_node)
        return {NodeKind::kPreDispatch, NodeKind::kDispatch, NodeKind::kSharedExpert,
                NodeKind::kMlp, NodeKind::kCombine};
    return {NodeKind::kPreDispatch, NodeKind::kDispatch, NodeKind::kMlp, NodeKind::kCombine};
}

// The compute calls of a plan with the shared expert's own calls taken out: pre_dispatch runs
// them without shared-expert overlap (two schedules of one recipe compare with this).
std::map<CallKey, int> without_shared_calls(std::map<CallKey, int> m) {
    std::erase_if(m,
                  [](const auto& kv) { return std::get<2>(kv.first) == NodeKind::kSharedExpert; });
    return m;
}

// Every micro-batch: embedding, every layer's nodes and the output, forward and backward,
// exactly once; a micro-batch's forwards in layer order before its backwards in reverse order.
void expect_every_node_once(const StepPlan& plan, const std::string& what) {
    const int n = plan.shape.num_micro_batches;
    const int num_layers = static_cast<int>(plan.shape.moe_layers.size());
    const std::map<CallKey, int> m = model_calls(plan.calls, false);
    size_t expected = 0;
    for (int mb = 0; mb < n; ++mb) {
        for (Phase phase : {Phase::kForward, Phase::kBackward}) {
            for (NodeKind node : {NodeKind::kEmbedding, NodeKind::kOutput}) {
                ++expected;
                EXPECT_EQ(count_of(m, CallKey{mb, -1, node, phase}), 1)
                    << what << " mb" << mb << " " << schedule::node_name(node);
            }
            for (int l = 0; l < num_layers; ++l) {
                for (NodeKind node : layer_nodes(plan.shape.moe_layers[static_cast<size_t>(l)],
                                                 plan.shape.shared_expert_overlap)) {
                    ++expected;
                    const CallKey k{mb, l, node, phase};
                    ASSERT_EQ(count_of(m, k), 1)
                        << what << " mb" << mb << " layer" << l << " " << schedule::node_name(node)
                        << " " << schedule::phase_name(phase);
                }
            }
        }
    }
    EXPECT_EQ(m.size(), expected) << what << ": calls beyond the model's nodes";
    // Order within each micro-batch: a running index over (phase, layer) that only grows.
    std::vector<int> last(static_cast<size_t>(n), -1000000);
    for (const NodeCall& c : plan.calls) {
        if (schedule::is_side_branch(c.node) || c.phase == Phase::kBackwardDw)
            continue;
        const int layer = c.node == NodeKind::kEmbedding ? -1
                          : c.node == NodeKind::kOutput  ? num_layers
                                                         : c.layer;
        const int index = c.phase == Phase::kForward ? layer : 2 * num_layers + 4 - layer;
        int& prev = last[static_cast<size_t>(c.micro_batch)];
        ASSERT_GE(index, prev) << what << ": " << schedule::call_name(c) << " out of order";
        prev = index;
    }
}

// Delayed weight gradients: each backward_dw follows its own (wgrad_delayed) backward.
void expect_weight_grads_after_dgrads(const StepPlan& plan, const std::string& what) {
    std::map<CallKey, int> seen;
    int delayed = 0, dw = 0;
    for (const NodeCall& c : plan.calls) {
        if (c.phase == Phase::kBackward && c.wgrad_delayed) {
            ++delayed;
            ++seen[{c.micro_batch, c.layer, c.node, Phase::kBackward}];
        }
        if (c.phase == Phase::kBackwardDw) {
            ++dw;
            const CallKey dgrad{c.micro_batch, c.layer, c.node, Phase::kBackward};
            EXPECT_EQ(seen[dgrad], 1)
                << what << ": " << schedule::call_name(c) << " before its backward";
        }
    }
    EXPECT_GT(dw, 0) << what;
    EXPECT_EQ(delayed, dw) << what;
}

// Buckets: every position -1..L once, descending; each closes at its last position, the last at
// the embedding; every bucket but the last holds at least `bucket_size` bytes; one reduction per
// bucket in firing order in the last micro-batch, one gather per bucket in micro-batch 0.
void expect_buckets_cover_every_position(const StepPlan& plan, int64_t bucket_size,
                                         const std::string& what) {
    const int num_layers = static_cast<int>(plan.shape.moe_layers.size());
    ASSERT_FALSE(plan.buckets.empty()) << what;
    std::vector<int> positions, ends;
    for (size_t b = 0; b < plan.buckets.size(); ++b) {
        const PlanBucket& bucket = plan.buckets[b];
        ASSERT_FALSE(bucket.positions.empty()) << what;
        positions.insert(positions.end(), bucket.positions.begin(), bucket.positions.end());
        ends.push_back(bucket.positions.back());
        if (b + 1 < plan.buckets.size()) {
            EXPECT_GE(bucket.bytes, bucket_size) << what << " bucket " << b;
        }
    }
    std::vector<int> expected;
    for (int p = num_layers; p >= schedule::kEmbeddingPosition; --p)
        expected.push_back(p);
    EXPECT_EQ(positions, expected) << what;
    EXPECT_EQ(ends.back(), schedule::kEmbeddingPosition) << what;
    EXPECT_EQ(plan.shape.grad_bucket_ends, ends) << what;
    EXPECT_EQ(plan.shape.param_bucket_ends, ends) << what;
    std::vector<int> reduces, gathers;
    for (const NodeCall& c : plan.calls) {
        if (c.node == NodeKind::kGradReduce) {
            EXPECT_EQ(c.micro_batch, plan.shape.num_micro_batches - 1) << what;
            reduces.push_back(c.layer);
        }
        if (c.node == NodeKind::kParamGather) {
            EXPECT_EQ(c.micro_batch, 0) << what;
            gathers.push_back(c.layer);
        }
    }
    std::vector<int> firing(plan.buckets.size());
    for (size_t b = 0; b < firing.size(); ++b)
        firing[b] = static_cast<int>(b);
    EXPECT_EQ(reduces, firing) << what;
    std::sort(gathers.begin(), gathers.end());
    EXPECT_EQ(gathers, firing) << what;
}

TEST(StepPlan, EveryRecipeSchedulesEveryNodeOnceAndBucketsEveryPosition) {
    for (const RecipeTopology& t : kTopologies) {
        // The default bucket size (128 MiB) and one position per bucket.
        for (const std::string& size : {std::string(), std::string("ddp.bucket_size=1")}) {
            std::vector<std::string> extra;
            if (!size.empty())
                extra.push_back(size);
            const config::Config base_cfg = finalized(t, Kind::kBaseline, extra);
            const config::Config overlap_cfg = finalized(t, Kind::kOverlap, extra);
            const config::Config delayed_cfg = finalized(t, Kind::kDelayed, extra);
            const StepPlan base = plan_of(base_cfg), overlap = plan_of(overlap_cfg),
                           delayed = plan_of(delayed_cfg);
            const std::string what = t.recipe + (size.empty() ? "" : " " + size);
            ASSERT_FALSE(base.overlap) << what;
            ASSERT_TRUE(overlap.overlap) << what;
            ASSERT_TRUE(delayed.shape.delay_wgrad) << what;
            EXPECT_EQ(base.dp_size, t.num_nodes * t.gpus_per_node) << what;
            EXPECT_EQ(base.edp_size, t.num_nodes * t.gpus_per_node / t.ep) << what;
            ASSERT_TRUE(base.reduce_in_buckets && base.param_gather_overlap) << what;
            const int64_t bucket_size = size.empty() ? config::kDefaultBucketSize : int64_t{1};
            for (const auto& [plan, name] :
                 {std::pair{&base, "baseline"}, std::pair{&overlap, "overlap"},
                  std::pair{&delayed, "overlap+delayed"}}) {
                const std::string w = what + " " + name;
                EXPECT_GT(plan->shape.num_micro_batches, 1) << w;
                expect_every_node_once(*plan, w);
                expect_buckets_cover_every_position(*plan, bucket_size, w);
                // The buckets depend on the model and the groups only, not on the schedule.
                ASSERT_EQ(plan->buckets.size(), base.buckets.size()) << w;
                for (size_t b = 0; b < base.buckets.size(); ++b) {
                    EXPECT_EQ(plan->buckets[b].positions, base.buckets[b].positions) << w;
                    EXPECT_EQ(plan->buckets[b].bytes, base.buckets[b].bytes) << w;
                }
            }
            // The same compute calls in both schedules (weight gradients apart; the baseline
            // of a recipe with shared-expert overlap, which EP overlap turns off, runs the shared
            // expert in calls of its own).
            EXPECT_EQ(base.shape.shared_expert_overlap, t.recipe == "deepseek-v3") << what;
            EXPECT_FALSE(overlap.shape.shared_expert_overlap || delayed.shape.shared_expert_overlap)
                << what;
            EXPECT_EQ(without_shared_calls(model_calls(base.calls, true)),
                      model_calls(overlap.calls, true))
                << what;
            EXPECT_EQ(without_shared_calls(model_calls(base.calls, false)),
                      model_calls(delayed.calls, false))
                << what;
            expect_weight_grads_after_dgrads(delayed, what);
        }
    }
}

// Without data-parallel groups (EP = world: experts have no EDP group) the expert parameters
// take no part in the buckets; without any group the plan has no buckets at all.
TEST(StepPlan, BucketsHoldOnlyParametersWithAGroupToReduceOver) {
    const RecipeTopology ep_world{"tiny-moe", 1, 4, 4};
    const StepPlan plan = plan_of(finalized(ep_world, Kind::kOverlap, {"ddp.bucket_size=1"}));
    EXPECT_EQ(plan.edp_size, 1);
    const model::GptShape shape =
        model::gpt_shape_from_config(finalized(ep_world, Kind::kOverlap, {}), ep_world.ep, 0);
    int64_t dense_bytes = 0;
    for (const PlanBucket& b : plan.buckets)
        for (int p : b.positions)
            for (int64_t n : param_sizes_at(shape, p).dense)
                dense_bytes += n * 4;
    int64_t bucket_bytes = 0;
    for (const PlanBucket& b : plan.buckets)
        bucket_bytes += b.bytes;
    EXPECT_EQ(bucket_bytes, dense_bytes);

    const RecipeTopology one_rank{"tiny-moe", 1, 1, 1};
    const StepPlan alone = plan_of(finalized(one_rank, Kind::kBaseline, {}));
    EXPECT_FALSE(alone.reduce_in_buckets);
    EXPECT_FALSE(alone.distributed_optimizer);
    EXPECT_TRUE(alone.buckets.empty());
    EXPECT_TRUE(alone.shape.grad_bucket_ends.empty());
}

// param_sizes_at agrees with what the model allocates, position by position, for tiny-moe and
// variants with q/k norms, shared experts, a dense layer and tied embeddings.
// optimizer.overlap_param_gather_with_optimizer_step: the same buckets, the same compute calls,
// but no gather (and no wait for one) in the schedule: the optimizer step issues them.
TEST(StepPlan, GathersUnderTheOptimizerStepLeaveTheScheduleWithoutGathers) {
    const RecipeTopology& t = kTopologies.back();
    for (Kind kind : {Kind::kBaseline, Kind::kOverlap}) {
        const StepPlan in_forward = plan_of(finalized(t, kind, {}));
        // In comm_overlap: the harness's EP-overlap flag creates that section, whose values
        // finalization copies into the optimizer section.
        const StepPlan in_step = plan_of(
            finalized(t, kind, {"comm_overlap.overlap_param_gather_with_optimizer_step=true"}));
        ASSERT_FALSE(in_forward.param_gather_in_optimizer);
        ASSERT_TRUE(in_step.param_gather_in_optimizer);
        EXPECT_TRUE(in_step.param_gather_overlap);
        EXPECT_EQ(in_step.buckets.size(), in_forward.buckets.size());
        EXPECT_TRUE(in_step.shape.param_bucket_ends.empty());
        EXPECT_EQ(in_step.shape.grad_bucket_ends, in_forward.shape.grad_bucket_ends);
        std::vector<NodeCall> without;
        for (NodeCall c : in_forward.calls) {
            if (c.node == NodeKind::kParamGather)
                continue;
            c.wait_bucket = -1;
            without.push_back(c);
        }
        EXPECT_LT(without.size(), in_forward.calls.size());
        EXPECT_EQ(in_step.calls, without);
    }
}

TEST(StepPlan, ParameterSizesMatchALiveModel) {
    const std::vector<std::vector<std::string>> variants = {
        {},
        {"model.qk_layernorm=true", "model.moe_shared_expert_intermediate_size=32",
         "model.moe_layer_freq=[0,1]", "model.share_embeddings_and_output_weights=true"}};
    for (const std::vector<std::string>& v : variants) {
        std::vector<std::string> o = {"model.num_layers=2",           "model.hidden_size=64",
                                      "model.kv_channels=16",         "model.ffn_hidden_size=128",
                                      "model.moe_ffn_hidden_size=64", "model.seq_length=32"};
        o.insert(o.end(), v.begin(), v.end());
        const RecipeTopology t{"tiny-moe", 1, 2, 2};
        const config::Config c = finalized(t, Kind::kBaseline, o);
        const model::GptShape shape = model::gpt_shape_from_config(c, 2, 1);
        model::GptModel live(shape);
        for (int p = schedule::kEmbeddingPosition; p <= shape.num_layers; ++p) {
            const model::GptModel::PositionParams params = live.params_at(p);
            const PositionParamSizes sizes = param_sizes_at(shape, p);
            std::vector<int64_t> dense, expert;
            for (const Param* x : params.dense)
                dense.push_back(x->main_grad.numel());
            for (const Param* x : params.expert)
                expert.push_back(x->main_grad.numel());
            EXPECT_EQ(sizes.dense, dense) << "position " << p;
            EXPECT_EQ(sizes.expert, expert) << "position " << p;
        }
    }
}

// With stages, multi-token prediction and tied embeddings put a copy of the word embedding on the
// last stage (model/gpt_model.h): listed last at the MTP layer's position (else the output's),
// the same in param_sizes_at and in the live model of each stage, counted by the memory plan.
TEST(StepPlan, TheLastStageListsItsEmbeddingCopy) {
    const std::vector<std::vector<std::string>> variants = {
        {"model.mtp_num_layers=1"},
        {"model.mtp_num_layers=1", "model.share_embeddings_and_output_weights=true"},
        {"model.share_embeddings_and_output_weights=true"}};
    for (const std::vector<std::string>& v : variants) {
        const RecipeTopology t{"tiny-moe", 1, 4, 2};
        config::Config c = finalized(t, Kind::kBaseline, v);
        c.model.pipeline_model_parallel_size = 2;
        c.model.num_layers = 4;
        c.model.expert_model_parallel_size = 2;
        for (int stage : {0, 1}) {
            SCOPED_TRACE(v.back() + " stage " + std::to_string(stage));
            const model::GptShape shape = model::gpt_shape_from_config(c, 2, 0, stage);
            ASSERT_TRUE(shape.has_embedding_copies());
            model::GptModel live(shape);
            int64_t planned = 0;
            int embeddings = 0;
            for (int p = schedule::kEmbeddingPosition; p <= shape.num_layers; ++p) {
                if (!shape.holds(p))
                    continue;
                const model::GptModel::PositionParams params = live.params_at(p);
                std::vector<int64_t> dense;
                for (const Param* x : params.dense) {
                    dense.push_back(x->main_grad.numel());
                    embeddings += x->name == "embedding.word_embeddings.weight";
                }
                EXPECT_EQ(param_sizes_at(shape, p).dense, dense) << "position " << p;
                for (int64_t n : param_sizes_at(shape, p).dense)
                    planned += n;
                for (int64_t n : param_sizes_at(shape, p).expert)
                    planned += n;
            }
            EXPECT_EQ(embeddings, 1);
            EXPECT_NE(live.embedding_copy(), nullptr);
            const int64_t copy_position =
                shape.mtp_num_layers > 0 ? shape.num_layers - 1 : shape.num_layers;
            EXPECT_EQ(shape.embedding_copy_position(), copy_position);
            if (stage == 1) {
                const auto& last = live.params_at(static_cast<int>(copy_position)).dense;
                ASSERT_FALSE(last.empty());
                EXPECT_EQ(last.back(), live.embedding_copy());
            }
            const StepPlan plan = make_step_plan(c, shape);
            EXPECT_EQ(estimate_stage_memory(c, plan, shape).gradients, planned * 4);
        }
    }
}

TEST(StepPlan, RefusesATopologyWithoutWholeGroups) {
    const RecipeTopology t{"tiny-moe", 1, 4, 2};
    config::Config c = finalized(t, Kind::kBaseline, {});
    const model::GptShape shape = model::gpt_shape_from_config(c, 2, 0);
    c.comm.gpus_per_node = 3;  // 3 ranks: EP 2 leaves no whole expert data-parallel group
    EXPECT_THROW(make_step_plan(c, shape), Error);
}

// PP 2 on 4 ranks: per-stage groups (DP 2, EDP 1 with EP 2), the stage's pipeline lists, and
// buckets over the stage's own positions, reduced in its lists; a micro-batch count the
// interleaved schedule cannot group is refused naming it.
TEST(StepPlan, PipelineStagesPlanTheirOwnLists) {
    const RecipeTopology t{"tiny-moe", 1, 4, 2};
    config::Config c = finalized(t, Kind::kBaseline, {"ddp.overlap_grad_reduce=true"});
    c.model.pipeline_model_parallel_size = 2;
    c.model.virtual_pipeline_model_parallel_size = 1;
    c.model.num_layers = 4;
    c.model.expert_model_parallel_size = 2;
    const model::GptShape shape = model::gpt_shape_from_config(c, 2, 0, 1);
    const StepPlan plan = make_step_plan(c, shape);
    EXPECT_EQ(plan.dp_size, 2);
    EXPECT_EQ(plan.edp_size, 1);
    EXPECT_TRUE(plan.reduce_in_buckets);
    ASSERT_FALSE(plan.buckets.empty());
    std::vector<int> positions;
    for (const PlanBucket& b : plan.buckets)
        positions.insert(positions.end(), b.positions.begin(), b.positions.end());
    EXPECT_EQ(positions, (std::vector<int>{4, 3, 2}));  // the output position, layers 3 and 2
    ASSERT_EQ(plan.stage_calls.size(), 2u);
    EXPECT_EQ(plan.calls, plan.stage_calls[1]);
    int reductions = 0;
    for (const schedule::NodeCall& call : plan.calls) {
        EXPECT_EQ(call.stage, 1);
        if (call.node == schedule::NodeKind::kGradReduce)
            ++reductions;
        if (schedule::is_side_branch(call.node))
            continue;
        EXPECT_TRUE(call.layer < 0 || call.layer >= 2 || schedule::is_pipeline_transfer(call.node))
            << schedule::call_name(call);
    }
    EXPECT_EQ(reductions, static_cast<int>(plan.buckets.size()));
    c.model.virtual_pipeline_model_parallel_size = 2;
    c.train.global_batch_size = 3 * c.train.micro_batch_size * 2;  // 3 micro-batches at DP 2
    ASSERT_EQ(config::num_microbatches(c), 3);
    EXPECT_THROW(make_step_plan(c, model::gpt_shape_from_config(c, 2, 0, 1)), Error);
}

}  // namespace
}  // namespace epo::train
