// `epo moe-layer`: run one MoE layer (router, experts, shared expert if any) forward and backward
// on one rank from seeded random weights, input and output gradient, and dump every input,
// weight, output and gradient to a safetensors file (epo/moe/layer_dump.h says what is in it),
// so the numbers can be checked against another framework.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "epo/config/builder.h"
#include "epo/config/overrides.h"
#include "epo/config/recipes.h"
#include "epo/core/error.h"
#include "epo/moe/layer_dump.h"
#include "harness_flags.h"

namespace epo::cli {
namespace {

struct MoeLayerArgs {
    std::string model;
    std::vector<std::string> overrides;
    std::int64_t tokens = 0;
    std::uint64_t seed = 0;
    std::string precision;
    std::int64_t sequences = 1;
    std::string dump;
};

void run_moe_layer(const MoeLayerArgs& args) {
    config::ConfigSources sources;
    sources.model = args.model;
    for (const std::string& o : args.overrides) {
        if (!config::looks_like_override(o)) {
            throw Error(ErrorKind::kUsage, fmt::format("'{}' is not a KEY=VALUE override (e.g. "
                                                       "model.num_moe_experts=8)",
                                                       o));
        }
        sources.overrides.push_back(o);
    }
    const config::BuiltConfig built = config::build_config(sources);
    moe::MoeLayerDumpOptions opts;
    opts.cfg = moe::moe_config_from(built.config.model);
    if (args.precision == "fp32") {
        opts.cfg.precision = moe::Precision::kFp32;
    } else if (args.precision == "bf16") {
        opts.cfg.precision = moe::Precision::kBf16;
    }
    opts.tokens = args.tokens;
    opts.num_sequences = args.sequences;
    opts.seed = args.seed;
    opts.init_std = static_cast<float>(built.config.model.init_method_std);
    opts.path = args.dump;
    opts.metadata["model"] = args.model;
    for (std::size_t i = 0; i < args.overrides.size(); ++i) {
        opts.metadata["override." + std::to_string(i)] = args.overrides[i];
    }
    const moe::MoeLayerDumpResult r = moe::run_moe_layer_dump(opts);
    const moe::MoeConfig& c = opts.cfg;
    std::printf(
        "epo moe-layer: %s, %lld tokens, %s, hidden %lld, %lld experts top-%lld, expert FFN %lld, "
        "shared expert %lld: aux_loss %.9g z_loss %.9g, %lld slots dropped; wrote %d tensors to "
        "%s\n",
        args.model.c_str(), static_cast<long long>(args.tokens), moe::precision_name(c.precision),
        static_cast<long long>(c.hidden_size), static_cast<long long>(c.num_experts),
        static_cast<long long>(c.topk), static_cast<long long>(c.ffn_hidden_size),
        static_cast<long long>(c.shared_expert_size), static_cast<double>(r.losses.aux_loss),
        static_cast<double>(r.losses.z_loss), static_cast<long long>(r.num_dropped), r.num_tensors,
        args.dump.c_str());
}

}  // namespace

void add_moe_layer_command(CLI::App& app) {
    auto args = std::make_shared<MoeLayerArgs>();
    const std::string recipes = recipe_list();
    CLI::App* cmd = app.add_subcommand(
        "moe-layer",
        "Run one MoE layer forward and backward on one rank from seeded random weights, input "
        "and output gradient (loss = sum(y * dy) + aux_loss + z_loss), and write inputs, weights, "
        "outputs and gradients as fp32 tensors to a safetensors file.");
    cmd->add_option("--model", args->model, "the recipe: " + recipes)->required();
    cmd->add_option("overrides", args->overrides,
                    "KEY=VALUE overrides of the recipe (model.num_moe_experts=8, ...)");
    cmd->add_option("--tokens", args->tokens, "tokens T of the micro-batch")->required();
    cmd->add_option("--seed", args->seed, "seed of the weights, x and dy (default 0)");
    cmd->add_option("--precision", args->precision,
                    "fp32 or bf16 (default: bf16 when model.bf16 is true)")
        ->check(CLI::IsMember({"fp32", "bf16"}));
    cmd->add_option("--sequences", args->sequences,
                    "sequences the tokens form, for seq_aux_loss (default 1)");
    cmd->add_option("--dump", args->dump, "the safetensors file to write")->required();
    cmd->footer(
        "Example:\n"
        "  epo moe-layer --model qwen3-30b-a3b model.num_moe_experts=8 --tokens 256 --seed 1 "
        "--precision bf16 --dump layer.safetensors");
    cmd->callback([args] { run_moe_layer(*args); });
}

}  // namespace epo::cli
