// `epo validate`: build a configuration from a recipe, a YAML file, harness flags and dotted
// overrides, finalize it, check every rule, and print the finalized configuration (as a run
// logs it) followed by every error and warning. Exit status 0 valid, 1 invalid, 2 usage error.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>

#include "commands.h"
#include "epo/config/builder.h"
#include "epo/config/memory_estimate.h"
#include "epo/config/overrides.h"
#include "epo/config/recipes.h"
#include "epo/config/validate.h"
#include "epo/core/error.h"
#include "epo/train/memory_plan.h"
#include "harness_flags.h"

namespace epo::cli {
namespace {

struct ValidateArgs {
    std::vector<std::string> positional;  // CONFIG.yaml and KEY=VALUE overrides
    std::string model;
    bool json = false;
    HarnessFlags harness;
    CLI::App* cmd = nullptr;
};

void run_validate(const ValidateArgs& args) {
    const config::BuiltConfig built =
        config::build_config(config_sources(*args.cmd, args.model, args.positional, args.harness));
    const config::ValidationReport report = config::validate(built);
    // The memory a rank needs (an invalid configuration has no meaningful one). With a stated
    // topology, the step plan's estimate of the largest pipeline stage (train/memory_plan.h);
    // without one, or when no plan can be made for it (the runtime refuses the layout, reported
    // above), every layer on one rank of the smallest job the layout allows (one rank per EP
    // rank).
    std::optional<config::MemoryEstimate> memory;
    if (report.ok()) {
        const int64_t stated = config::world_size(report.config);
        try {
            if (stated > 0)
                memory = train::estimate_run_memory(report.config);
        } catch (const Error&) {
        }
        if (!memory) {
            memory = config::estimate_rank_memory(
                report.config,
                stated > 0 ? stated : std::max(1, report.config.model.expert_model_parallel_size));
        }
    }
    if (args.json) {
        nlohmann::ordered_json j = config::report_to_json(report);
        j["memory_estimate"] = nullptr;
        if (memory) {
            j["memory_estimate"] = {
                {"total_bytes", memory->total()},       {"parameters_bytes", memory->parameters},
                {"gradients_bytes", memory->gradients}, {"optimizer_bytes", memory->optimizer},
                {"packed_bytes", memory->packed},       {"activations_bytes", memory->activations},
                {"scratch_bytes", memory->scratch},     {"runtime_bytes", memory->runtime}};
        }
        // Invalid UTF-8 cannot come from a file (the reader refuses it); replace, never throw.
        std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else {
        std::cout << config::format_run_log(report) << config::format_findings(report);
        if (memory)
            std::cout << "memory (estimate): " << config::format_memory_estimate(*memory) << "\n";
    }
    std::cout.flush();
    if (!report.ok()) {
        throw CLI::RuntimeError(1);  // main turns this into the exit status
    }
}

}  // namespace

void add_validate_command(CLI::App& app) {
    auto args = std::make_shared<ValidateArgs>();
    const std::string recipes = recipe_list();
    CLI::App* cmd = app.add_subcommand(
        "validate",
        "Finalize a configuration and check every EP-overlap rule; prints the finalized "
        "configuration, then errors and warnings with their ids and fixes. Exit status: 0 valid, "
        "1 invalid, 2 usage error.");
    args->cmd = cmd;
    cmd->add_option("config_and_overrides", args->positional,
                    "CONFIG.yaml, then KEY=VALUE overrides (model.num_moe_experts=64, a.b=null, "
                    "a.b=[x,y]); later ones win");
    cmd->add_option("--model", args->model, "start from a recipe: " + recipes);
    cmd->add_flag("--json", args->json,
                  "print one JSON object: ok, target, errors, warnings, notes, config");
    add_harness_flags(*cmd, args->harness);
    cmd->footer(
        "Precedence: recipe < YAML file < harness flags < KEY=VALUE overrides.\n"
        "Examples:\n"
        "  epo validate --model qwen3-30b-a3b -ep 16 --num_nodes 2 --gpus_per_node 8 "
        "--moe_a2a_overlap true\n"
        "  epo validate examples/tiny-moe-cpu.yaml model.num_moe_experts=16 --json");
    cmd->callback([args] { run_validate(*args); });
}

}  // namespace epo::cli
