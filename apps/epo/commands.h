// The `epo` subcommands. Each lives in its own cmd_<name>.cpp, parses its flags with CLI11 and
// calls into the library; no subcommand holds logic a test could not reach through the library.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace epo::cli {

// Harness flags spelled with one dash and several letters (`-ep 4`, as in the reference
// harness). CLI11 reads a single dash as a bundle of one-letter flags, so these are rewritten to
// their two-dash form before parsing.
std::vector<std::string> normalize_harness_flags(std::vector<std::string> args);

// Registration: each adds its subcommand to `app`.
void add_validate_command(CLI::App& app);   // cmd_validate.cpp
void add_moe_layer_command(CLI::App& app);  // cmd_moe_layer.cpp
void add_launch_command(CLI::App& app);     // cmd_launch.cpp
void add_train_command(CLI::App& app);      // cmd_train.cpp
void add_bench_command(CLI::App& app);      // cmd_bench.cpp
void add_check_run_command(CLI::App& app);  // cmd_check_run.cpp
void add_plan_command(CLI::App& app);       // cmd_plan.cpp

}  // namespace epo::cli
