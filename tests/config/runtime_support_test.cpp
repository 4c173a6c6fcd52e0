// RT ids (one per feature the epo runtime does not execute yet), their promotion to errors for
// runs, and the start-up checks (MPI thread level, world size).
#include "epo/config/runtime_support.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <functional>
#include <map>
#include <set>

#include "config_test_util.h"
#include "epo/config/validate.h"

namespace epo::config {
namespace {

using testing::has;
using testing::ids;

// A change that makes tiny-moe use exactly the feature of each RT id.
const std::map<std::string, std::function<void(Config&)>>& uses() {
    static const std::map<std::string, std::function<void(Config&)>> table = {
        // A dense model: MoE layers with TP have RT040 / RT042.
        {"RT001",
         [](Config& c) {
             c.model.tensor_model_parallel_size = 2;
             c.model.num_moe_experts.reset();
         }},
        {"RT002", [](Config& c) { c.model.pipeline_model_parallel_size = 2; }},
        {"RT003", [](Config& c) { c.model.context_parallel_size = 2; }},
        {"RT004", [](Config& c) { c.model.expert_tensor_parallel_size = 2; }},
        {"RT005", [](Config& c) { c.model.sequence_parallel = true; }},
        {"RT006", [](Config& c) { c.model.mtp_num_layers = 2; }},
        {"RT007", [](Config& c) { c.model.multi_latent_attention = true; }},
        {"RT008", [](Config& c) { c.model.recompute_granularity = RecomputeGranularity::kFull; }},
        {"RT009",
         [](Config& c) {
             c.model.fp16 = true;
             c.model.bf16 = false;
         }},
        {"RT010", [](Config& c) { c.model.bf16 = false; }},
        {"RT011", [](Config& c) { c.model.moe_shared_expert_overlap = true; }},
        {"RT012", [](Config& c) { c.ddp.overlap_param_gather = true; }},
        {"RT013", [](Config& c) { c.ddp.use_distributed_optimizer = true; }},
        {"RT014", [](Config& c) { c.model.tp_comm_overlap = true; }},
        {"RT015", [](Config& c) { c.model.cuda_graph_impl = CudaGraphImpl::kLocal; }},
        {"RT016",
         [](Config& c) { c.model.moe_token_dispatcher_type = DispatcherType::kAllgather; }},
        {"RT018",
         [](Config& c) { c.model.moe_router_load_balancing_type = LoadBalancingType::kSinkhorn; }},
        {"RT019", [](Config& c) { c.model.add_qkv_bias = true; }},
        {"RT020", [](Config& c) { c.model.qk_layernorm = true; }},
        {"RT021", [](Config& c) { c.model.normalization = Normalization::kLayerNorm; }},
        {"RT022", [](Config& c) { c.model.gated_linear_unit = false; }},
        {"RT023", [](Config& c) { c.model.position_embedding_type = PositionEmbedding::kNone; }},
        {"RT024", [](Config& c) { c.model.share_embeddings_and_output_weights = true; }},
        {"RT025",
         [](Config& c) {
             c.comm_overlap.emplace();
             c.comm_overlap->tp_comm_overlap = false;
             c.comm_overlap->defer_embedding_wgrad_compute = true;
         }},
        {"RT027", [](Config& c) { c.model.virtual_pipeline_model_parallel_size = 2; }},
        {"RT028",
         [](Config& c) {
             c.model.pipeline_model_parallel_size = 2;
             c.model.share_embeddings_and_output_weights = true;
         }},
        {"RT031", [](Config& c) { c.model.account_for_loss_in_pipeline_split = true; }},
        {"RT032", [](Config& c) { c.model.fp8 = "e4m3"; }},
        {"RT033",
         [](Config& c) {
             // PP 2 x VPP 2 on 2 ranks (DP 1): 3 micro-batches leave a partial group of PP.
             c.model.pipeline_model_parallel_size = 2;
             c.model.virtual_pipeline_model_parallel_size = 2;
             c.comm.num_nodes = 1;
             c.comm.gpus_per_node = 2;
             c.train.global_batch_size = 3 * c.train.micro_batch_size;
         }},
        {"RT034",
         [](Config& c) {
             c.model.recompute_granularity = RecomputeGranularity::kSelective;
             c.model.recompute_modules = {RecomputeModule::kCoreAttn, RecomputeModule::kMoe};
         }},
        {"RT035",
         [](Config& c) {
             c.model.multi_latent_attention = true;
             c.model.rope_type = "yarn";
         }},
        {"RT037",
         [](Config& c) {
             c.model.pipeline_model_parallel_size = 2;
             c.model.mtp_num_layers = 1;
         }},
        {"RT038",
         [](Config& c) {
             c.model.mtp_num_layers = 1;
             c.model.recompute_granularity = RecomputeGranularity::kFull;
             c.model.recompute_method = RecomputeMethod::kUniform;
             c.model.recompute_num_layers = 1;
         }},
        {"RT039",
         [](Config& c) {
             c.model.tensor_model_parallel_size = 2;
             c.model.multi_latent_attention = true;
         }},
        {"RT040",
         [](Config& c) {
             c.model.tensor_model_parallel_size = 2;
             c.model.moe_aux_loss_coeff = 0;
         }},
        {"RT041",
         [](Config& c) {
             c.model.tensor_model_parallel_size = 2;
             c.model.mtp_num_layers = 1;
         }},
        // tiny-moe's aux loss, with sequence parallelism (without it RT040 comes first).
        {"RT042",
         [](Config& c) {
             c.model.tensor_model_parallel_size = 2;
             c.model.sequence_parallel = true;
         }},
        {"RT043",
         [](Config& c) {
             c.model.tensor_model_parallel_size = 2;
             c.model.pipeline_model_parallel_size = 2;
             c.model.num_moe_experts.reset();
         }},
        {"RT044",
         [](Config& c) {
             c.model.expert_tensor_parallel_size = 2;
             c.model.moe_token_dispatcher_type = DispatcherType::kFlex;
             c.model.moe_flex_dispatcher_backend = FlexBackend::kDeepep;
             c.model.expert_model_parallel_size = 2;
         }},
        {"RT045",
         [](Config& c) {
             c.model.expert_tensor_parallel_size = 2;
             c.model.overlap_moe_expert_parallel_comm = true;
             c.model.moe_ep_overlap_num_chunks = 2;
         }},
        {"RT046",
         [](Config& c) {
             c.model.expert_tensor_parallel_size = 2;
             c.model.pipeline_model_parallel_size = 2;
         }},
        {"RT047", [](Config& c) { c.ddp.grad_reduce_in_fp32 = false; }},
        {"RT026",
         [](Config& c) {
             c.model.moe_token_dispatcher_type = DispatcherType::kFlex;
             c.model.moe_flex_dispatcher_backend = FlexBackend::kDeepep;
             c.model.expert_model_parallel_size = 2;
             c.comm.gpus_per_node = 3;
         }},
    };
    return table;
}

std::vector<std::string> runtime_ids(const std::vector<Finding>& findings) {
    std::vector<std::string> out;
    for (const auto& f : findings) {
        if (f.id.rfind("RT", 0) == 0) {
            out.push_back(f.id);
        }
    }
    return out;
}

TEST(RuntimeSupport, EveryFeatureHasItsOwnIdAndATest) {
    std::set<std::string> seen;
    for (const auto& feature : runtime_features()) {
        EXPECT_TRUE(seen.insert(std::string(feature.id)).second) << feature.id;
        EXPECT_TRUE(uses().count(std::string(feature.id))) << feature.id << " has no test case";
    }
    EXPECT_EQ(seen.size(), uses().size());
}

TEST(RuntimeSupport, EachIdFiresOnItsFeatureAndOnlyThere) {
    // Against a runtime that executes none of the features, so every id is exercised whatever
    // the current runtime has gained.
    const RuntimeCapabilities none{};
    const Config base = make_recipe("tiny-moe");
    EXPECT_TRUE(runtime_findings(base, none).empty());
    for (const auto& [id, use] : uses()) {
        SCOPED_TRACE(id);
        Config c = base;
        use(c);
        const auto findings = runtime_findings(c, none);
        EXPECT_EQ(runtime_ids(findings), std::vector<std::string>{id});
        ASSERT_FALSE(findings.empty());
        EXPECT_FALSE(findings[0].field.empty());
        EXPECT_FALSE(findings[0].fix.empty());
        EXPECT_NE(findings[0].message.find("does not execute"), std::string::npos);
    }
}

TEST(RuntimeSupport, ACapabilityThatLandsDropsItsId) {
    for (const auto& feature : runtime_features()) {
        SCOPED_TRACE(std::string(feature.id));
        Config c = make_recipe("tiny-moe");
        uses().at(std::string(feature.id))(c);
        RuntimeCapabilities caps{};
        EXPECT_FALSE(runtime_findings(c, caps).empty());
        caps.*(feature.supported) = true;
        EXPECT_TRUE(runtime_findings(c, caps).empty());
    }
}

TEST(RuntimeSupport, CurrentRuntimeRunsQkLayernormTiedEmbeddingsFp32PipelinesAndMla) {
    for (const char* id : {"RT002", "RT007", "RT010", "RT020", "RT024", "RT031"}) {
        SCOPED_TRACE(id);
        Config c = make_recipe("tiny-moe");
        uses().at(id)(c);
        EXPECT_TRUE(runtime_findings(c, RuntimeCapabilities::current()).empty());
    }
}

// schedule.h "Shared-expert overlap"; the deepseek-v3 recipe, which sets it, has no RT id left.
TEST(RuntimeSupport, CurrentRuntimeRunsSharedExpertOverlap) {
    Config c = make_recipe("tiny-moe");
    uses().at("RT011")(c);
    EXPECT_TRUE(runtime_findings(c, RuntimeCapabilities::current()).empty());
    const Config ds = make_recipe("deepseek-v3");
    ASSERT_TRUE(ds.model.moe_shared_expert_overlap);
    EXPECT_EQ(runtime_ids(runtime_findings(ds, RuntimeCapabilities::current())),
              std::vector<std::string>{});
}

TEST(RuntimeSupport, CurrentRuntimeRunsFullAndSelectiveRecomputeButNotTheMoeModule) {
    const auto findings = [](std::optional<RecomputeGranularity> granularity,
                             std::optional<std::vector<RecomputeModule>> modules,
                             bool mla = false) {
        Config c = make_recipe("tiny-moe");
        c.model.recompute_granularity = granularity;
        c.model.recompute_modules = std::move(modules);
        c.model.multi_latent_attention = mla;
        return runtime_findings(c, RuntimeCapabilities::current());
    };
    using M = RecomputeModule;
    const auto selective = RecomputeGranularity::kSelective;
    // Null modules are Megatron-Core's default, [core_attn].
    EXPECT_TRUE(findings(selective, std::nullopt).empty());
    for (M m : {M::kCoreAttn, M::kLayernorm, M::kMoeAct, M::kMlp, M::kSharedExperts}) {
        SCOPED_TRACE(std::string(enum_name(m)));
        EXPECT_TRUE(findings(selective, std::vector<M>{m}).empty());
    }
    // With multi-latent attention, what MLA keeps is refused, the rest runs.
    for (M m : {M::kMoeAct, M::kMlp, M::kSharedExperts})
        EXPECT_TRUE(findings(selective, std::vector<M>{m}, true).empty());
    for (const auto& [m, mla] : {std::pair{M::kMoe, false}, std::pair{M::kMlaUpProj, true},
                                 std::pair{M::kCoreAttn, true}, std::pair{M::kLayernorm, true}}) {
        SCOPED_TRACE(std::string(enum_name(m)));
        const auto f = findings(selective, std::vector<M>{M::kMoeAct, m}, mla);
        ASSERT_EQ(runtime_ids(f), std::vector<std::string>{"RT034"});
        EXPECT_EQ(f[0].field, "model.recompute_modules");
        EXPECT_EQ(f[0].value.rfind(std::string(enum_name(m)), 0), 0u) << f[0].value;
    }
    // Full recompute runs (RT008 is for a runtime without it).
    EXPECT_TRUE(findings(RecomputeGranularity::kFull, std::nullopt).empty());
    EXPECT_TRUE(findings(RecomputeGranularity::kFull, std::nullopt, true).empty());
    // Modules without selective granularity recompute nothing (and ask for nothing).
    EXPECT_TRUE(findings(std::nullopt, std::vector<M>{M::kMoe}).empty());
}

TEST(RuntimeSupport, CurrentRuntimeRunsOneMtpLayerAndTiedEmbeddingsWithPipelineStages) {
    Config c = make_recipe("tiny-moe");
    c.model.mtp_num_layers = 1;
    EXPECT_TRUE(runtime_findings(c, RuntimeCapabilities::current()).empty());
    // With stages the last stage holds a copy of the embedding (RT037, RT028 run).
    for (const char* id : {"RT028", "RT037"}) {
        SCOPED_TRACE(id);
        Config staged = make_recipe("tiny-moe");
        uses().at(id)(staged);
        EXPECT_TRUE(runtime_findings(staged, RuntimeCapabilities::current()).empty());
    }
    c.model.mtp_num_layers = 2;
    const auto two = runtime_findings(c, RuntimeCapabilities::current());
    ASSERT_EQ(runtime_ids(two), std::vector<std::string>{"RT006"});
    EXPECT_EQ(two[0].field, "model.mtp_num_layers");
    EXPECT_EQ(two[0].value, "2");
}

TEST(RuntimeSupport, CurrentRuntimeRefusesAVirtualPipelineOfOneStageAndYarn) {
    for (const char* id : {"RT027", "RT033", "RT035", "RT038"}) {
        SCOPED_TRACE(id);
        Config c = make_recipe("tiny-moe");
        uses().at(id)(c);
        EXPECT_EQ(runtime_ids(runtime_findings(c, RuntimeCapabilities::current())),
                  std::vector<std::string>{id});
    }
}

TEST(RuntimeSupport, ValidateWarnsRunsRefuse) {
    // tiny-moe (aux loss on) at TP 2 with sequence parallelism on a runtime without the router's
    // TP-group statistics (RT042); the current runtime runs it.
    Config c = make_recipe("tiny-moe");
    c.model.tensor_model_parallel_size = 2;
    c.model.sequence_parallel = true;
    c.comm.gpus_per_node = 2;
    ValidateOptions older;
    older.runtime.tp_router_losses = false;
    const ValidationReport check = validate(c, older);
    EXPECT_TRUE(check.ok());
    EXPECT_EQ(runtime_ids(check.warnings), std::vector<std::string>{"RT042"});
    const ValidationReport run = validate_for_run(c, older);
    EXPECT_FALSE(run.ok());
    EXPECT_EQ(ids(run.errors), std::vector<std::string>{"RT042"});
    EXPECT_TRUE(runtime_ids(run.warnings).empty());
    EXPECT_TRUE(validate_for_run(c).ok());
    EXPECT_TRUE(runtime_ids(validate(c).warnings).empty());
}

// Expert tensor parallelism runs (RT004 lifted) with the alltoall dispatcher, at TP 1 and with TP;
// with pipeline stages too (RT046); its combinations with the flex dispatcher and MoE chunks stay
// refused (RT044, RT045), each naming the field and a fix that keeps or drops ETP.
TEST(RuntimeSupport, CurrentRuntimeRunsExpertTensorParallelButNotItsCombinations) {
    Config c = make_recipe("tiny-moe");
    uses().at("RT004")(c);
    EXPECT_TRUE(runtime_findings(c, RuntimeCapabilities::current()).empty());
    c.model.overlap_moe_expert_parallel_comm = true;  // one chunk: runs
    EXPECT_TRUE(runtime_findings(c, RuntimeCapabilities::current()).empty());
    // With pipeline stages it runs too (RT046 is for a runtime without that).
    Config staged = make_recipe("tiny-moe");
    uses().at("RT046")(staged);
    EXPECT_TRUE(runtime_findings(staged, RuntimeCapabilities::current()).empty());
    for (const char* id : {"RT044", "RT045"}) {
        SCOPED_TRACE(id);
        Config refused = make_recipe("tiny-moe");
        uses().at(id)(refused);
        const auto f = runtime_findings(refused, RuntimeCapabilities::current());
        ASSERT_EQ(runtime_ids(f), std::vector<std::string>{id});
        EXPECT_NE(f[0].fix.find("expert_tensor_parallel_size=1"), std::string::npos) << f[0].fix;
        EXPECT_EQ(f[0].field, id == std::string("RT045")   ? "model.moe_ep_overlap_num_chunks"
                              : id == std::string("RT046") ? "model.pipeline_model_parallel_size"
                                                           : "model.expert_tensor_parallel_size");
    }
}

// TP with sequence parallelism runs (RT001, RT005 lifted) for MoE at ETP 1, with the router's
// aux loss, z loss and expert bias (RT042 lifted: their statistics over the TP group) and with
// pipeline stages (RT043); its combinations RT039-RT041 stay refused, one id each.
TEST(RuntimeSupport, CurrentRuntimeRunsTensorAndSequenceParallelButNotItsCombinations) {
    Config c = make_recipe("tiny-moe");
    c.model.tensor_model_parallel_size = 2;
    c.model.sequence_parallel = true;
    ASSERT_GT(c.model.moe_aux_loss_coeff, 0);
    EXPECT_TRUE(runtime_findings(c, RuntimeCapabilities::current()).empty());
    // The z loss and the expert bias (a sigmoid router) run too.
    Config router = c;
    router.model.moe_z_loss_coeff = 1e-3;
    router.model.moe_router_score_function = ScoreFunction::kSigmoid;
    router.model.moe_router_enable_expert_bias = true;
    EXPECT_TRUE(runtime_findings(router, RuntimeCapabilities::current()).empty());
    // With ETP 2 too (RT004 lifted: tests/train/expert_tensor_parallel_mpi_test.cpp).
    c.model.expert_tensor_parallel_size = 2;
    EXPECT_TRUE(runtime_findings(c, RuntimeCapabilities::current()).empty());
    // With pipeline stages it runs too (RT043 is for a runtime without that).
    Config staged = make_recipe("tiny-moe");
    uses().at("RT043")(staged);
    EXPECT_TRUE(runtime_findings(staged, RuntimeCapabilities::current()).empty());
    for (const char* id : {"RT039", "RT040", "RT041"}) {
        SCOPED_TRACE(id);
        Config refused = make_recipe("tiny-moe");
        uses().at(id)(refused);
        const auto f = runtime_findings(refused, RuntimeCapabilities::current());
        ASSERT_EQ(runtime_ids(f), std::vector<std::string>{id});
        EXPECT_NE(f[0].fix.find("tensor_model_parallel_size"), std::string::npos) << f[0].fix;
    }
    // The aux loss without sequence parallelism is RT040's (the MoE layer needs SP), not hidden
    // behind the lifted RT042.
    Config no_sp = make_recipe("tiny-moe");
    no_sp.model.tensor_model_parallel_size = 2;
    EXPECT_EQ(runtime_ids(runtime_findings(no_sp, RuntimeCapabilities::current())),
              std::vector<std::string>{"RT040"});
    // A runtime without the TP-group statistics names the field it cannot honour.
    RuntimeCapabilities older = RuntimeCapabilities::current();
    older.tp_router_losses = false;
    Config z = make_recipe("tiny-moe");
    z.model.tensor_model_parallel_size = 2;
    z.model.sequence_parallel = true;
    z.model.moe_aux_loss_coeff = 0;
    z.model.moe_z_loss_coeff = 1e-3;
    const auto f = runtime_findings(z, older);
    ASSERT_EQ(runtime_ids(f), std::vector<std::string>{"RT042"});
    EXPECT_EQ(f[0].field, "model.moe_z_loss_coeff");
}

TEST(RuntimeSupport, ReadsTheFinalizedConfig) {
    // DP 4 with a distributed optimizer: finalization turns bucketed overlap on.
    Config c = make_recipe("tiny-moe");
    c.comm.gpus_per_node = 4;
    c.ddp.use_distributed_optimizer = true;
    c.comm_overlap.emplace();
    c.comm_overlap->tp_comm_overlap = false;
    // This runtime executes the distributed optimizer and its param-gather overlap.
    EXPECT_TRUE(validate(c).ok());
    EXPECT_FALSE(has(validate(c).warnings, "RT012"));
    EXPECT_FALSE(has(validate(c).warnings, "RT013"));
    ValidateOptions none;
    none.runtime = RuntimeCapabilities{};
    EXPECT_TRUE(has(validate(c, none).warnings, "RT013"));
    // Param-gather overlap asked for without a distributed optimizer: nothing to gather.
    c.comm_overlap.reset();
    c.ddp.use_distributed_optimizer = false;
    c.ddp.overlap_param_gather = true;
    const ValidationReport run = validate_for_run(c);
    ASSERT_TRUE(has(run.errors, "RT012"));
    for (const Finding& f : run.errors) {
        if (f.id == "RT012") {
            EXPECT_NE(f.fix.find("ddp.use_distributed_optimizer=true"), std::string::npos) << f.fix;
        }
    }
}

TEST(StartupChecks, MpiThreadLevel) {
    EXPECT_FALSE(check_mpi_thread_level(MPI_THREAD_MULTIPLE).has_value());
    for (int level : {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED}) {
        const auto finding = check_mpi_thread_level(level);
        ASSERT_TRUE(finding.has_value());
        EXPECT_EQ(finding->id, "EP005");
        EXPECT_NE(finding->message.find("MPI_THREAD_MULTIPLE"), std::string::npos);
    }
    EXPECT_EQ(check_mpi_thread_level(MPI_THREAD_FUNNELED)->value, "MPI_THREAD_FUNNELED");
}

TEST(StartupChecks, WorldSize) {
    Config c = make_recipe("tiny-moe");
    c.comm.num_nodes = 2;
    c.comm.gpus_per_node = 2;
    EXPECT_FALSE(check_world_size(c, 4).has_value());
    const auto finding = check_world_size(c, 3);
    ASSERT_TRUE(finding.has_value());
    EXPECT_EQ(finding->id, "LY009");
    EXPECT_NE(finding->message.find("3 ranks"), std::string::npos);
    EXPECT_NE(finding->fix.find("mpirun -np 4"), std::string::npos);
}

// What a run fills in when the configuration leaves the topology to the launcher.
TEST(RuntimeSupport, ResolveTopologyFromTheJob) {
    CommConfig neither;
    EXPECT_FALSE(resolve_topology(neither, 8, 4).has_value());  // 2 hosts of 4 ranks
    EXPECT_EQ(neither.num_nodes, 2);
    EXPECT_EQ(neither.gpus_per_node, 4);

    CommConfig uneven;
    const auto refused = resolve_topology(uneven, 5, 0);
    ASSERT_TRUE(refused.has_value());
    EXPECT_EQ(refused->id, "LY009");
    EXPECT_NE(refused->message.find("different numbers of ranks"), std::string::npos);

    CommConfig nodes_only;
    nodes_only.num_nodes = 2;
    EXPECT_FALSE(resolve_topology(nodes_only, 6, 6).has_value());
    EXPECT_EQ(nodes_only.gpus_per_node, 3);
    CommConfig nodes_uneven;
    nodes_uneven.num_nodes = 4;
    ASSERT_TRUE(resolve_topology(nodes_uneven, 6, 6).has_value());
    EXPECT_EQ(resolve_topology(nodes_uneven, 6, 6)->field, "comm.num_nodes");

    // A stated gpus_per_node is one node, as validation took it; the job is then checked.
    CommConfig ranks_only;
    ranks_only.gpus_per_node = 4;
    EXPECT_FALSE(resolve_topology(ranks_only, 8, 4).has_value());
    EXPECT_EQ(ranks_only.num_nodes, 1);

    CommConfig both;
    both.num_nodes = 2;
    both.gpus_per_node = 1;
    EXPECT_FALSE(resolve_topology(both, 2, 2).has_value());  // kept: 2 nodes on one host
    EXPECT_EQ(both.num_nodes, 2);
    EXPECT_EQ(both.gpus_per_node, 1);
}

}  // namespace
}  // namespace epo::config
