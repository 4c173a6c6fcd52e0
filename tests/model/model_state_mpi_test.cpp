// The model's states for any number of micro-batches in flight, and the schedules against the
// straight reference: a micro-batch's forward and backward as one list of calls
// (GptModel::forward_backward), one micro-batch after another. Same bits required: losses,
// router statistics and every weight gradient.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>

#include "epo/comm/process_groups.h"
#include "epo/model/gpt_model.h"
#include "epo/tensor/random.h"

namespace epo::model {
namespace {

GptShape shape_with(bool shared_expert, DType dtype) {
    GptShape s;
    s.num_layers = 3;
    s.hidden = 16;
    s.vocab = 24;
    s.seq_length = 6;
    s.micro_batch_size = 2;
    s.attn = AttentionShape{.hidden = 16,
                            .num_heads = 4,
                            .num_groups = 2,
                            .head_dim = 4,
                            .seq_length = 6,
                            .qk_layernorm = true,
                            .norm_eps = 1e-6f};
    s.init_std = 0.3f;
    s.ffn_hidden = 24;
    s.moe_layers = {true, false, true};
    s.moe.hidden_size = 16;
    s.moe.num_experts = 4;
    s.moe.topk = 2;
    s.moe.ffn_hidden_size = 8;
    s.moe.aux_loss_coeff = 0.1;
    s.moe.z_loss_coeff = 0.01;
    s.moe.shared_expert_size = shared_expert ? 8 : 0;
    s.moe.precision = dtype == DType::kBF16 ? moe::Precision::kBf16 : moe::Precision::kFp32;
    s.compute_dtype = dtype;
    return s;
}

// A model, its data for `num_mb` micro-batches, and what one step left behind.
struct StepRun {
    GptModel model;
    std::unique_ptr<comm::ProcessGroups> groups;
    Arena scratch{"scratch"};
    int num_mb;

    StepRun(const GptShape& s, int micro_batches) : model(s), num_mb(micro_batches) {
        model.init_weights(5);
        groups = comm::ProcessGroups::create(comm::ParallelLayout{1, 1, 1}, comm::CommOptions{},
                                             "test", nullptr, MPI_COMM_SELF);
        std::vector<std::vector<int32_t>> tokens, labels;
        for (int mb = 0; mb < num_mb; ++mb) {
            std::vector<int32_t> t, l;
            for (int64_t i = 0; i < s.tokens(); ++i) {
                t.push_back(static_cast<int32_t>(random_bits(21, mb * 100 + i) % s.vocab));
                l.push_back(static_cast<int32_t>(random_bits(22, mb * 100 + i) % s.vocab));
            }
            tokens.push_back(t);
            labels.push_back(l);
        }
        for (Param* p : model.all_params())
            zero_grad(*p);
        model.begin_step(tokens, labels, 1.0f / static_cast<float>(num_mb));
    }
    comm::Communicator& ep() { return groups->ep; }
};

void expect_same(StepRun& got, StepRun& want, const std::string& what) {
    SCOPED_TRACE(what);
    ASSERT_EQ(got.model.results().size(), want.model.results().size());
    for (size_t mb = 0; mb < want.model.results().size(); ++mb) {
        EXPECT_EQ(got.model.results()[mb].lm_loss, want.model.results()[mb].lm_loss) << mb;
    }
    for (size_t l = 0; l < want.model.layer_stats().size(); ++l) {
        EXPECT_EQ(got.model.layer_stats()[l].aux_loss, want.model.layer_stats()[l].aux_loss);
        EXPECT_EQ(got.model.layer_stats()[l].routed_counts,
                  want.model.layer_stats()[l].routed_counts);
    }
    const auto a = got.model.all_params(), b = want.model.all_params();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(
            std::memcmp(a[i]->main_grad.raw(), b[i]->main_grad.raw(), a[i]->main_grad.nbytes()), 0)
            << a[i]->name;
    }
    EXPECT_EQ(got.model.num_in_flight(), 0);
    EXPECT_EQ(got.model.activation_bytes(), 0) << "every state went back to its pool";
}

// The straight reference: one micro-batch's whole forward and backward after another.
void one_at_a_time(StepRun& r) {
    for (int mb = 0; mb < r.num_mb; ++mb)
        r.model.forward_backward(mb, r.ep(), r.scratch);
}

TEST(ModelState, FiveMicroBatchesInFlightMatchOneAtATime) {
    for (bool shared : {false, true}) {
        for (DType dt : {DType::kF32, DType::kBF16}) {
            const GptShape s = shape_with(shared, dt);
            StepRun want(s, 5);
            one_at_a_time(want);
            StepRun got(s, 5);
            for (int mb = 0; mb < 5; ++mb)
                got.model.forward(mb, got.ep(), got.scratch);
            EXPECT_EQ(got.model.num_in_flight(), 5);
            for (int mb = 0; mb < 5; ++mb)
                got.model.backward(mb, got.ep(), got.scratch);
            expect_same(
                got, want,
                std::string("5 in flight, ") + dtype_name(dt) + (shared ? ", shared expert" : ""));
        }
    }
}

TEST(ModelState, ThreeMicroBatchesInFlightInASteadyStateMatchOneAtATime) {
    // Forwards run ahead of backwards by three, as a pipeline's warm-up and steady state do.
    const GptShape s = shape_with(true, DType::kBF16);
    StepRun want(s, 5);
    one_at_a_time(want);
    StepRun got(s, 5);
    int peak = 0;
    for (int mb = 0; mb < 3; ++mb)
        got.model.forward(mb, got.ep(), got.scratch);
    for (int mb = 0; mb < 5; ++mb) {
        peak = std::max(peak, got.model.num_in_flight());
        got.model.backward(mb, got.ep(), got.scratch);
        if (mb + 3 < 5)
            got.model.forward(mb + 3, got.ep(), got.scratch);
    }
    EXPECT_EQ(peak, 3);
    expect_same(got, want, "3 in flight");
}

// Both schedules' call lists, run in issue order on one thread (a valid order of their two
// streams), against the straight reference.
TEST(ModelState, SchedulesMatchTheStraightReference) {
    const GptShape s = shape_with(true, DType::kBF16);
    for (int num_mb : {1, 2, 3}) {
        for (int variant = 0; variant < 3; ++variant) {
            StepRun want(s, num_mb);
            one_at_a_time(want);
            StepRun got(s, num_mb);
            schedule::ScheduleShape sched{num_mb, s.moe_layers, /*delay_wgrad=*/variant == 2};
            const auto calls = variant == 0 ? schedule::baseline_schedule(sched)
                                            : schedule::overlap_schedule(sched);
            for (const schedule::NodeCall& c : calls)
                got.model.run(c, got.ep(), got.scratch);
            expect_same(got, want,
                        fmt::format("{} micro-batches, {}", num_mb,
                                    variant == 0   ? "baseline"
                                    : variant == 1 ? "overlap"
                                                   : "overlap + delayed wgrad"));
        }
    }
}

// The paired-edges overlap schedule (schedule.h "Paired edges") in issue order against the
// straight reference; it holds a third micro-batch in flight from 3 per step on, where the
// unpaired one holds two.
TEST(ModelState, PairedEdgesMatchTheStraightReferenceWithOneMoreInFlight) {
    const GptShape s = shape_with(true, DType::kBF16);
    for (int num_mb : {2, 3, 4}) {
        for (bool paired : {false, true}) {
            StepRun want(s, num_mb);
            one_at_a_time(want);
            StepRun got(s, num_mb);
            schedule::ScheduleShape sched{num_mb, s.moe_layers, /*delay_wgrad=*/true};
            sched.pair_edges = paired;
            int peak = 0;
            for (const schedule::NodeCall& c : schedule::overlap_schedule(sched)) {
                got.model.run(c, got.ep(), got.scratch);
                peak = std::max(peak, got.model.num_in_flight());
            }
            const std::string what =
                fmt::format("{} micro-batches, {}", num_mb, paired ? "paired" : "unpaired");
            expect_same(got, want, what);
            EXPECT_EQ(peak, paired && num_mb >= 3 ? 3 : 2) << what;
        }
    }
}

TEST(ModelState, AStepCannotBeginWhileMicroBatchesAreInFlight) {
    StepRun r(shape_with(false, DType::kF32), 2);
    r.model.forward(0, r.ep(), r.scratch);
    EXPECT_THROW(r.model.begin_step({{1}}, {{1}}, 1.0f), Error);
    r.model.backward(0, r.ep(), r.scratch);
    EXPECT_EQ(r.model.num_in_flight(), 0);
}

}  // namespace
}  // namespace epo::model
