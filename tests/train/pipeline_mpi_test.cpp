// Pipeline parallelism (docs/pipeline.md), trained end to end: with the same data-parallel size, a
// PP = 2 run (VPP 1 and 2) gives the PP = 1 run's losses, grad norms and final parameters bit for
// bit, and with VPP the overlap schedule (and overlap + delayed wgrad) the interleaved baseline's.
// Every run happens inside this one MPI job: the PP = 1 reference runs on each half of the world
// (half h is the ranks of stage h in the PP = 2 run, with the same place inside it, so the same
// EP and DP ranks), and each rank compares the parameters its stage holds with the reference's of
// the same name.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "epo/checkpoint/rank_agreement.h"
#include "epo/comm/mpi_runtime.h"
#include "epo/train/trainer.h"
#include "train/shared_temp_dir.h"
#include "train_test_util.h"

namespace epo::train {
namespace {

struct Record {
    std::vector<double> losses, grad_norms;
    std::map<std::string, std::vector<float>> params;  // name -> fp32 master
};

Record run_on(const config::Config& cfg, MPI_Comm comm, int steps) {
    Trainer trainer(cfg, TrainerOptions{.comm = comm});
    Record r;
    for (int i = 0; i < steps; ++i) {
        const StepResult s = trainer.step();
        r.losses.push_back(s.lm_loss);
        r.grad_norms.push_back(s.grad_norm);
    }
    trainer.sync_params();
    for (Param* p : trainer.model().all_params()) {
        const float* d = p->master.data<float>();
        r.params[p->name].assign(d, d + p->master.numel());
    }
    return r;
}

struct Case {
    int layers;
    int vpp;  // 0: unset
    bool capacity;
    std::string layout = "";  // model.pipeline_model_parallel_layout with stages; "": even
};

// tiny-moe on `ranks` ranks with PP `pp`; EP = ranks / PP, 4 micro-batches of 2 sequences.
config::Config pipeline_config(const Case& c, int ranks, int pp, std::vector<std::string> extra) {
    const int ep = ranks / pp;
    std::vector<std::string> o = {"model.num_layers=" + std::to_string(c.layers),
                                  "model.hidden_size=64",
                                  "model.kv_channels=16",
                                  "model.ffn_hidden_size=128",
                                  "model.moe_ffn_hidden_size=64",
                                  "model.seq_length=32",
                                  "train.micro_batch_size=2",
                                  "train.global_batch_size=" + std::to_string(2 * ep * 4),
                                  "comm.gpus_per_node=" + std::to_string(ranks),
                                  "model.expert_model_parallel_size=" + std::to_string(ep),
                                  "model.pipeline_model_parallel_size=" + std::to_string(pp)};
    if (pp > 1 && c.vpp > 0)
        o.push_back("model.virtual_pipeline_model_parallel_size=" + std::to_string(c.vpp));
    if (pp > 1 && !c.layout.empty())
        o.push_back("model.pipeline_model_parallel_layout=" + c.layout);
    if (c.capacity) {
        o.insert(o.end(),
                 {"model.moe_expert_capacity_factor=1.0", "model.moe_token_drop_policy=probs",
                  "model.moe_pad_expert_input_to_capacity=true"});
    }
    o.insert(o.end(), extra.begin(), extra.end());
    return epo::testing::run_config("tiny-moe", o);
}

// Losses and grad norms equal; every parameter of `staged` equal to the reference's of its name.
void expect_same_bits(const Record& reference, const Record& staged, const std::string& what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(reference.losses, staged.losses);
    EXPECT_EQ(reference.grad_norms, staged.grad_norms);
    EXPECT_FALSE(staged.params.empty());
    for (const auto& [name, values] : staged.params) {
        const auto it = reference.params.find(name);
        ASSERT_NE(it, reference.params.end()) << name;
        ASSERT_EQ(it->second.size(), values.size()) << name;
        EXPECT_EQ(0, std::memcmp(it->second.data(), values.data(), values.size() * sizeof(float)))
            << name;
    }
}

class PipelineMatrix : public ::testing::TestWithParam<Case> {};

// PP `pp` on the world against PP 1 on each block of world / pp ranks (the ranks of one stage).
void check_stages(const Case& c, int pp) {
    constexpr int kSteps = 4;
    const int world = comm::current_world_size(), rank = comm::current_world_rank();
    ASSERT_EQ(world % pp, 0);
    const int stage_size = world / pp;
    const std::string label = "PP " + std::to_string(pp);
    const std::vector<std::string> overlap = {"comm_overlap.overlap_moe_expert_parallel_comm=true",
                                              "comm_overlap.delay_wgrad_compute=false"};
    const std::vector<std::string> delayed = {"comm_overlap.overlap_moe_expert_parallel_comm=true",
                                              "comm_overlap.delay_wgrad_compute=true"};
    MPI_Comm block = MPI_COMM_NULL;
    comm::check_mpi(MPI_Comm_split(MPI_COMM_WORLD, rank / stage_size, rank, &block),
                    "MPI_Comm_split");
    const Record reference = run_on(pipeline_config(c, stage_size, 1, {}), block, kSteps);
    MPI_Comm_free(&block);
    EXPECT_LT(reference.losses.back(), reference.losses.front());

    const Record baseline = run_on(pipeline_config(c, world, pp, {}), MPI_COMM_WORLD, kSteps);
    expect_same_bits(reference, baseline, label + " baseline vs PP 1");
    // The stage holds only its own positions.
    const int stage = rank / stage_size;
    EXPECT_EQ(baseline.params.count("embedding.word_embeddings.weight"), stage == 0 ? 1u : 0u);
    EXPECT_EQ(baseline.params.count("output_layer.weight"), stage == pp - 1 ? 1u : 0u);
    // EP overlap needs EP > 1 (EP001). Every way the one emitter runs a step, with stages: the
    // combined steps, delayed wgrad, MoE chunks, paired edges, and bucketed reductions and
    // gathers (DP 2 at 4 ranks), each bit-identical to the baseline.
    if (c.vpp > 1 && stage_size >= 2) {
        const config::Config o = pipeline_config(c, world, pp, overlap);
        const config::Config d = pipeline_config(c, world, pp, delayed);
        ASSERT_TRUE(o.model.overlap_moe_expert_parallel_comm);
        ASSERT_TRUE(d.model.delay_wgrad_compute);
        expect_same_bits(baseline, run_on(o, MPI_COMM_WORLD, kSteps), label + " overlap");
        expect_same_bits(baseline, run_on(d, MPI_COMM_WORLD, kSteps), label + " overlap + delay");
        const std::vector<std::pair<std::string, std::vector<std::string>>> variants = {
            {"chunks", {"model.moe_ep_overlap_num_chunks=2"}},
            {"paired edges", {"model.moe_ep_overlap_pair_edges=true"}},
            {"paired edges + chunks + delay",
             {"model.moe_ep_overlap_pair_edges=true", "model.moe_ep_overlap_num_chunks=2",
              "comm_overlap.delay_wgrad_compute=true"}},
            {"buckets",
             {"ddp.overlap_grad_reduce=true", "ddp.use_distributed_optimizer=true",
              "ddp.overlap_param_gather=true", "ddp.bucket_size=40000"}}};
        for (const auto& [name, extra] : variants) {
            std::vector<std::string> v = overlap;
            v.insert(v.end(), extra.begin(), extra.end());
            const config::Config cfg = pipeline_config(c, world, pp, v);
            if (name == "buckets") {
                ASSERT_TRUE(cfg.ddp.overlap_grad_reduce);
            }
            expect_same_bits(baseline, run_on(cfg, MPI_COMM_WORLD, kSteps), label + " " + name);
        }
    }
}

// PP 2 at every rank count (2: EP 1, 4: EP 2, 8: EP 4), and PP 4 x EP 2 at 8 ranks.
TEST_P(PipelineMatrix, BitIdenticalToOneStageAndOverlapToBaseline) {
    const int world = comm::current_world_size();
    check_stages(GetParam(), 2);
    const Case c = GetParam();
    if (world >= 8 && world % 4 == 0 && c.layout.empty() &&
        c.layers % (4 * std::max(c.vpp, 1)) == 0)
        check_stages(c, 4);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
    return std::to_string(info.param.layers) + "layers_vpp" + std::to_string(info.param.vpp) +
           (info.param.capacity ? "_capacity" : "_dropless") +
           (info.param.layout.empty() ? "" : "_uneven");
}

INSTANTIATE_TEST_SUITE_P(Pipeline, PipelineMatrix,
                         ::testing::Values(Case{4, 0, false}, Case{4, 2, false}, Case{4, 2, true},
                                           Case{8, 2, false}, Case{8, 0, true},
                                           Case{6, 2, false, "Et|tt|tt|tL"}),
                         case_name);

// The trace of an overlap run with stages: on every rank, a comm slice of one (micro-batch,
// chunk) runs while a compute slice of another (micro-batch, chunk) is running, and slice names
// carry the stage and chunk.
TEST(Pipeline, OverlapTraceShowsOneUnitsCommUnderAnothersCompute) {
    const int world = comm::current_world_size();
    if (world < 4)
        GTEST_SKIP() << "EP overlap needs EP > 1: PP 2 needs 4 ranks";
    const config::Config cfg = pipeline_config(
        Case{4, 2, false}, world, 2,
        {"comm_overlap.overlap_moe_expert_parallel_comm=true", "comm.link.latency_us=300"});
    Trainer trainer(cfg, TrainerOptions{.keep_records = true});
    trainer.step();
    const StepResult r = trainer.step();
    // "stage0.chunk1.mb2.layer..." -> "stage0.chunk1.mb2"
    const auto unit = [](const std::string& name) {
        size_t dots = 0, i = 0;
        for (; i < name.size() && dots < 3; ++i)
            dots += name[i] == '.';
        return name.substr(0, i);
    };
    const std::string stage = "stage" + std::to_string(trainer.stage()) + ".";
    bool under = false;
    for (const runtime::TaskRecord& c : r.records) {
        if (c.kind != runtime::RecordKind::kTask || c.stream != "comm" ||
            c.name.rfind(stage, 0) != 0)
            continue;
        for (const runtime::TaskRecord& k : r.records) {
            if (k.kind == runtime::RecordKind::kTask && k.stream == "compute" &&
                k.name.rfind(stage, 0) == 0 && unit(k.name) != unit(c.name) &&
                k.start_ns < c.end_ns && c.start_ns < k.end_ns)
                under = true;
        }
    }
    EXPECT_TRUE(under) << "rank " << trainer.world_rank();
}

// A resume under another pipeline layout is refused, naming both layouts.
TEST(Pipeline, ResumeAcrossPipelineLayoutsIsRefusedNamingBoth) {
    const int world = comm::current_world_size();
    const config::Config one = pipeline_config(Case{4, 0, false}, world, 1, {});
    const config::Config two = pipeline_config(Case{4, 2, false}, world, 2, {});
    const std::filesystem::path dir = testing::shared_temp_dir("epo_pipeline_resume_");
    comm::Communicator control = checkpoint::make_control_communicator(
        {.world_size = world, .expert_model_parallel_size = world, .gpus_per_node = world}, 30);
    std::filesystem::path saved;
    {
        Trainer t(one);
        t.step();
        saved = t.save_checkpoint(dir, control);
    }
    Trainer staged(two);
    try {
        staged.load_checkpoint(saved, control);
        ADD_FAILURE() << "a PP 1 checkpoint loaded into a PP 2 job";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("model.pipeline_model_parallel_size 1 in the checkpoint, 2 in this job"),
                  std::string::npos)
            << m;
        EXPECT_NE(
            m.find("model.virtual_pipeline_model_parallel_size 1 in the checkpoint, 2 in this job"),
            std::string::npos)
            << m;
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace epo::train
