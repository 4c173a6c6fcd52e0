// `epo validate`: build a configuration from a recipe, a YAML file, harness flags and dotted
// overrides, finalize it, check every rule, and print the finalized configuration (as a run
// logs it) followed by every error and warning. Exit status 0 valid, 1 invalid, 2 usage error.
#include <cstdio>
#include <iostream>
#include <memory>

#include "commands.h"
#include "epo/config/builder.h"
#include "epo/config/overrides.h"
#include "epo/config/recipes.h"
#include "epo/config/validate.h"
#include "epo/core/error.h"
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

config::ConfigSources sources_from(const ValidateArgs& args) {
    config::ConfigSources sources;
    if (args.cmd->count("--model") > 0) {
        sources.model = args.model;
    }
    for (const auto& arg : args.positional) {
        if (config::looks_like_override(arg)) {
            sources.overrides.push_back(arg);
        } else if (sources.config_path) {
            throw Error(ErrorKind::kUsage,
                        fmt::format("two configuration files given ('{}' and '{}'); give one, "
                                    "and overrides as KEY=VALUE",
                                    sources.config_path->string(), arg));
        } else {
            sources.config_path = arg;
        }
    }
    sources.harness = harness_overrides(args.harness);
    return sources;
}

void run_validate(const ValidateArgs& args) {
    const config::BuiltConfig built = config::build_config(sources_from(args));
    const config::ValidationReport report = config::validate(built);
    if (args.json) {
        // Invalid UTF-8 cannot come from a file (the reader refuses it); replace, never throw.
        std::cout << config::report_to_json(report).dump(2, ' ', false,
                                                         nlohmann::json::error_handler_t::replace)
                  << "\n";
    } else {
        std::cout << config::format_run_log(report) << config::format_findings(report);
    }
    std::cout.flush();
    if (!report.ok()) {
        throw CLI::RuntimeError(1);  // main turns this into the exit status
    }
}

}  // namespace

void add_validate_command(CLI::App& app) {
    auto args = std::make_shared<ValidateArgs>();
    std::string recipes;
    for (auto name : config::recipe_names()) {
        recipes += (recipes.empty() ? "" : ", ") + std::string(name);
    }
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
