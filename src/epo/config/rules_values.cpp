// Value checks: every numeric field against the limits its section declares (VA001), values a
// run cannot do without (VA002), the env section (EN001-EN003), the learning-rate schedule
// (TR001/TR002) and a checkpoint interval with nowhere to save (W013).
#include "epo/config/rules.h"
#include "epo/config/tree_walk.h"

namespace epo::config {
namespace {

template <class T>
std::optional<double> numeric(const T& field) {
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
        return static_cast<double>(field);
    } else if constexpr (IsOptional<T>::value) {
        if (field.has_value()) {
            return numeric(*field);
        }
    }
    return std::nullopt;
}

}  // namespace

void check_values(const RuleContext& ctx) {
    for_each_leaf(ctx.user, [&](std::string_view key, const auto& field, const Limits& limits) {
        const std::optional<double> value = numeric(field);
        if (value && !limits.contains(*value)) {
            ctx.error("VA001", std::string(key), show(*value),
                      fmt::format("{} must be {}", key, limits.describe()),
                      fmt::format("set {} to a value {}", key, limits.describe()));
        }
    });

    const ModelConfig& m = ctx.user.model;
    if (!m.vocab_size) {
        ctx.error("VA002", "model.vocab_size", "null",
                  "model.vocab_size is not set: the embedding and output layer need it",
                  "set model.vocab_size (256 for byte-level text)");
    }

    const EnvConfig& env = ctx.user.env;
    if (!find_device(env.gpu)) {
        ctx.error(
            "EN001", "env.gpu", env.gpu,
            fmt::format("env.gpu names no known device; known devices: {}", known_device_list()),
            "set env.gpu to a known device id, a full device name, or cpu");
    }
    const auto check_version = [&](const char* id, const char* key,
                                   const std::optional<std::string>& version) {
        if (version && !parse_version(*version)) {
            ctx.error(id, key, *version, fmt::format("{} '{}' is not a version", key, *version),
                      fmt::format("write {} like 2.6.0 (or null for the epo runtime)", key));
        }
    };
    check_version("EN002", "env.torch_version", env.torch_version);
    check_version("EN003", "env.te_version", env.te_version);

    const TrainConfig& t = ctx.user.train;
    const int decay = lr_decay_iters(ctx.user);
    if (t.lr_warmup_iters > 0 && t.lr_warmup_iters >= decay) {
        ctx.error("TR001", "train.lr_warmup_iters", show(t.lr_warmup_iters),
                  fmt::format("the warm-up ({} iterations) must end before the decay does ({})",
                              t.lr_warmup_iters, decay),
                  "make train.lr_warmup_iters smaller than train.lr_decay_iters");
    }
    const OptimizerConfig& o = ctx.user.optimizer;
    if (o.min_lr > o.lr) {
        ctx.error(
            "TR002", "optimizer.min_lr", show(o.min_lr),
            fmt::format("optimizer.min_lr {} is above optimizer.lr {}", show(o.min_lr), show(o.lr)),
            "make optimizer.min_lr at most optimizer.lr");
    }
    const CheckpointConfig& ck = ctx.user.checkpoint;
    if (ck.save_interval && !ck.save) {
        ctx.warn("W013", "checkpoint.save_interval", show(ck.save_interval),
                 "checkpoint.save_interval is set but checkpoint.save is null: nothing is saved",
                 "set checkpoint.save to a directory");
    }
}

}  // namespace epo::config
