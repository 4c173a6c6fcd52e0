// Value checks: every numeric field against the limits its section declares (VA001), values a
// run cannot do without (VA002), the env section (EN001-EN003), the learning-rate schedule
// (TR001/TR002), a checkpoint interval with nowhere to save (W013), and the link model: values
// out of the range it can model (VA003) and a link too slow for one all-to-all to finish within
// comm.timeout_s (VA004).
#include <cmath>

#include "epo/comm/link_limits.h"
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

// VA003, VA004. The dispatch all-to-all of one micro-batch sends, from each rank,
//     bytes = micro_batch_size * seq_length * moe_router_topk * hidden_size * 2 (bf16 rows)
//             * (EP - 1) / EP                  (uniform routing: 1/EP of the rows stay local)
// and the link model holds it latency + bytes * 8 / (gbps * 1e9) seconds on the slowest path it
// models. A step runs several of them; if one alone outlasts comm.timeout_s, no step can finish,
// and the run would only find out after the first hold (formerly: it held for years).
void check_link(const RuleContext& ctx) {
    const LinkConfig& link = ctx.user.comm.link;
    const struct {
        const char* key;
        std::optional<double> value;
    } fields[] = {{"comm.link.inter_node_gbps", link.inter_node_gbps},
                  {"comm.link.intra_node_gbps", link.intra_node_gbps},
                  {"comm.link.latency_us", link.latency_us}};
    bool ok = true;
    for (const auto& f : fields) {
        if (!f.value)
            continue;
        const std::string problem = comm::link_value_problem(f.key, *f.value);
        if (!problem.empty() && *f.value >= 0 && std::isfinite(*f.value)) {  // else VA001
            ctx.error("VA003", f.key, show(*f.value), problem,
                      fmt::format("set {} to 0 or a value in range", f.key));
            ok = false;
        }
    }
    const ModelConfig& m = ctx.fin.model;
    const int ep = m.expert_model_parallel_size;
    if (!ok || ep <= 1 || !m.num_moe_experts || *m.num_moe_experts <= 0)
        return;
    const double bytes = static_cast<double>(ctx.fin.train.micro_batch_size) * m.seq_length *
                         m.moe_router_topk * m.hidden_size * 2.0 * (ep - 1) / ep;
    for (const auto& f : {fields[0], fields[1]}) {
        const double gbps = f.value.value_or(0);
        if (gbps <= 0)
            continue;
        const double seconds = link.latency_us.value_or(0) * 1e-6 + bytes * 8 / (gbps * 1e9);
        if (seconds > ctx.user.comm.timeout_s) {
            ctx.error("VA004", f.key, show(gbps),
                      fmt::format("at {} Gbit/s one micro-batch's dispatch all-to-all ({:.3g} MB "
                                  "per rank) is held {:.3g} s, more than comm.timeout_s = {} s: "
                                  "no step could finish",
                                  gbps, bytes / 1e6, seconds, ctx.user.comm.timeout_s),
                      fmt::format("raise {} to at least {:.3g}, or raise comm.timeout_s", f.key,
                                  bytes * 8 / (ctx.user.comm.timeout_s * 1e9)));
        }
    }
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
        // The decay's end is often not a value the user set (it defaults to train_iters, which
        // --max_steps sets, while a recipe sets the warm-up): name where each number comes from.
        ctx.error("TR001", "train.lr_warmup_iters", show(t.lr_warmup_iters),
                  fmt::format("the warm-up ({} iterations) must end before the decay does (at "
                              "iteration {}: {})",
                              t.lr_warmup_iters, decay,
                              t.lr_decay_iters ? "train.lr_decay_iters"
                                               : "train.lr_decay_iters is null, so "
                                                 "train.train_iters, which --max_steps sets"),
                  fmt::format("lower train.lr_warmup_iters below {} (train.lr_warmup_iters=0 for "
                              "a short test run), or raise {}",
                              decay,
                              t.lr_decay_iters ? "train.lr_decay_iters"
                                               : "train.train_iters (--max_steps)"));
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
    // Checked here, not by the field's limits: beyond 1e7 s the deadline in nanoseconds
    // overflowed into an immediate false timeout.
    if (ctx.user.comm.timeout_s > comm::kMaxTimeoutS) {
        ctx.error(
            "VA001", "comm.timeout_s", show(ctx.user.comm.timeout_s),
            fmt::format("comm.timeout_s must be at most {:g} s", comm::kMaxTimeoutS),
            fmt::format("set comm.timeout_s to a value up to {:g}, e.g. 300", comm::kMaxTimeoutS));
    }
    check_link(ctx);
}

}  // namespace epo::config
