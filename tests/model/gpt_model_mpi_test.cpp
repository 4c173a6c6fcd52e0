// The whole model, run node by node on one rank in fp32: analytic gradients of every parameter
// against finite differences of the training objective.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include "epo/comm/process_groups.h"
#include "epo/model/gpt_model.h"
#include "epo/tensor/random.h"
#include "finite_difference.h"

namespace epo::model {
namespace {

GptShape tiny_shape(bool moe_first, bool shared_expert, bool tie, bool mtp = false,
                    bool moe_last = true) {
    GptShape s;
    s.num_layers = 2;
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
    s.norm_eps = 1e-6f;
    s.init_std = 0.3f;
    s.ffn_hidden = 24;
    s.moe_layers = {moe_first, moe_last};
    s.moe.hidden_size = 16;
    s.moe.num_experts = 4;
    s.moe.topk = 2;
    s.moe.ffn_hidden_size = 8;
    s.moe.aux_loss_coeff = 0.1;
    s.moe.z_loss_coeff = 0.01;
    s.moe.shared_expert_size = shared_expert ? 8 : 0;
    s.moe.precision = moe::Precision::kFp32;
    s.tie_embeddings = tie;
    s.compute_dtype = DType::kF32;
    if (mtp) {
        // The MTP layer (layer 2) takes the decoder's last layer's kind.
        s.num_layers = 3;
        s.moe_layers.push_back(moe_last);
        s.mtp_num_layers = 1;
        s.mtp_loss_scale = 0.3f;
    }
    return s;
}

struct Harness {
    GptModel model;
    std::unique_ptr<comm::ProcessGroups> groups;
    Arena scratch{"scratch"};
    std::vector<std::vector<int32_t>> tokens, labels;
    int num_mb = 2;

    explicit Harness(const GptShape& s) : model(s) {
        model.init_weights(7);
        groups = comm::ProcessGroups::create(comm::ParallelLayout{1, 1, 1}, comm::CommOptions{},
                                             "test", nullptr, MPI_COMM_SELF);
        for (int mb = 0; mb < num_mb; ++mb) {
            std::vector<int32_t> t, l;
            for (int64_t i = 0; i < s.tokens(); ++i) {
                t.push_back(static_cast<int32_t>(random_bits(11, mb * 100 + i) % s.vocab));
                l.push_back(static_cast<int32_t>(random_bits(12, mb * 100 + i) % s.vocab));
            }
            tokens.push_back(t);
            labels.push_back(l);
        }
    }

    // One step's objective: sum over micro-batches of (lm loss + aux + z losses) / N, with
    // every gradient accumulated into main_grad.
    double step() {
        for (Param* p : model.all_params())
            zero_grad(*p);
        model.begin_step(tokens, labels, 1.0f / num_mb);
        schedule::ScheduleShape sched{num_mb, model.shape().moe_layers, false};
        for (const schedule::NodeCall& c : schedule::baseline_schedule(sched)) {
            model.run(c, groups->ep, scratch);
        }
        double objective = 0;
        for (const MicroBatchResult& r : model.results())
            objective += (r.lm_loss + model.shape().mtp_loss_scale * r.mtp_loss) / num_mb;
        for (const LayerStepStats& s : model.layer_stats()) {
            objective += (s.aux_loss + s.z_loss) / num_mb;
        }
        return objective;
    }
};

void check_all_gradients(const GptShape& shape) {
    Harness h(shape);
    h.step();
    std::vector<Tensor> grads;
    for (Param* p : h.model.all_params())
        grads.push_back(p->main_grad.clone());
    const auto params = h.model.all_params();
    for (size_t i = 0; i < params.size(); ++i) {
        Param& p = *params[i];
        epo::testing::expect_gradient_matches(
            p.name, p.master.data<float>(), grads[i].data<float>(), p.master.numel(),
            [&] {
                for (Param* q : params)
                    refresh_compute(*q);
                return h.step();
            },
            6, 1e-3f, 3e-2, 1e-4);
    }
}

TEST(GptModel, GradientsMatchFiniteDifferencesDenseAndMoeLayers) {
    check_all_gradients(tiny_shape(/*moe_first=*/false, /*shared=*/true, /*tie=*/false));
}

// Multi-token prediction: every gradient (the prologue's, the MTP layer's, the shared embedding's
// and output layer's) is that of lm loss + mtp_loss_scale * mtp loss.
TEST(GptModel, GradientsMatchFiniteDifferencesWithDenseMtp) {
    check_all_gradients(tiny_shape(/*moe_first=*/true, /*shared=*/true, /*tie=*/false, true,
                                   /*moe_last=*/false));
}

TEST(GptModel, GradientsMatchFiniteDifferencesWithMtpTiedEmbeddings) {
    check_all_gradients(tiny_shape(/*moe_first=*/true, /*shared=*/false, /*tie=*/true, true));
}

TEST(GptModel, GradientsMatchFiniteDifferencesAllMoeTiedEmbeddings) {
    check_all_gradients(tiny_shape(/*moe_first=*/true, /*shared=*/false, /*tie=*/true));
}

}  // namespace
}  // namespace epo::model
