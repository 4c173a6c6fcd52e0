// Helpers for training tests: a finalized, runtime-valid configuration from a recipe and
// overrides; tiny-moe's test shape; a run's losses, grad norms and final parameters, and their
// bit-for-bit comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "epo/config/builder.h"
#include "epo/config/validate.h"
#include "epo/train/trainer.h"

namespace epo::testing {

inline config::Config run_config(const std::string& recipe, std::vector<std::string> overrides) {
    config::ConfigSources sources;
    sources.model = recipe;
    sources.overrides = std::move(overrides);
    const config::ValidationReport report =
        config::validate_for_run(config::build_config(sources).config);
    for (const auto& e : report.errors)
        ADD_FAILURE() << e.id << " " << e.message;
    return report.config;
}

// tiny-moe shrunk for the multi-rank trainer tests: 2 layers, hidden 64, 2 sequences of 32 tokens
// per micro-batch. The topology, EP size and batch are each test's own.
inline std::vector<std::string> tiny_shape_overrides() {
    return {"model.num_layers=2",        "model.hidden_size=64",         "model.kv_channels=16",
            "model.ffn_hidden_size=128", "model.moe_ffn_hidden_size=64", "model.seq_length=32",
            "train.micro_batch_size=2"};
}

// What the trainer tests compare between runs.
struct RunRecord {
    std::vector<double> losses, grad_norms;
    std::vector<double> mtp_losses;          // 0 per step without multi-token prediction
    std::vector<std::vector<float>> params;  // final fp32 master weights, whole on every rank
    int64_t peak_activation_bytes = 0;       // largest over the steps
};

// `steps` steps of `trainer`, then its parameters (the distributed optimizer's shards gathered).
inline RunRecord record_run(train::Trainer& trainer, int steps) {
    RunRecord r;
    for (int i = 0; i < steps; ++i) {
        const train::StepResult s = trainer.step();
        r.losses.push_back(s.lm_loss);
        r.mtp_losses.push_back(s.mtp_loss.value_or(0.0));
        r.grad_norms.push_back(s.grad_norm);
        r.peak_activation_bytes = std::max(r.peak_activation_bytes, s.peak_activation_bytes);
    }
    trainer.sync_params();
    for (Param* p : trainer.model().all_params()) {
        const float* d = p->master.data<float>();
        r.params.emplace_back(d, d + p->master.numel());
    }
    return r;
}

// A fresh Trainer of `cfg`; `prepare` may change the initialized model (every rank the same way).
inline RunRecord record_run(const config::Config& cfg, int steps,
                            const std::function<void(train::Trainer&)>& prepare = {}) {
    train::Trainer trainer(cfg);
    if (prepare)
        prepare(trainer);
    return record_run(trainer, steps);
}

// Losses, grad norms and final fp32 parameters equal bit for bit.
inline void expect_bit_identical(const RunRecord& a, const RunRecord& b) {
    EXPECT_EQ(a.losses, b.losses);
    EXPECT_EQ(a.mtp_losses, b.mtp_losses);
    EXPECT_EQ(a.grad_norms, b.grad_norms);
    ASSERT_EQ(a.params.size(), b.params.size());
    for (size_t i = 0; i < a.params.size(); ++i) {
        EXPECT_EQ(0, std::memcmp(a.params[i].data(), b.params[i].data(),
                                 a.params[i].size() * sizeof(float)))
            << "parameter " << i;
    }
}

}  // namespace epo::testing
