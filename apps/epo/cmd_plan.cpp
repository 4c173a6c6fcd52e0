// `epo plan`: predict, before launch, the step time of the baseline and the EP-overlap
// schedules of a configuration on a GPU cluster (or this machine), and whether overlap pays
// (docs/plan.md). Takes the configuration sources and harness flags of `epo validate` / `epo
// bench`, validates first, then plans; `--calibrate kernels --out FILE` measures this machine's
// kernels and writes a calibration file that `--calibration FILE` loads. Exit status: 0 planned,
// 1 invalid configuration or hardware, 2 usage error.
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>

#include "commands.h"
#include "epo/bench/bench_run.h"
#include "epo/config/builder.h"
#include "epo/config/validate.h"
#include "epo/core/error.h"
#include "epo/io/files.h"
#include "epo/plan/calibration.h"
#include "epo/plan/gpu_probe.h"
#include "epo/plan/plan.h"
#include "epo/plan/plan_report.h"
#include "epo/plan/plan_target.h"
#include "harness_flags.h"

namespace epo::cli {
namespace {

struct PlanArgs {
    std::vector<std::string> positional;
    std::string model;
    bool json = false;
    double intra_node_gbps = 0, inter_node_gbps = 0, latency_us = 0;
    double peak_bf16_tflops = 0, memory_tbps = 0, memory_gb = 0;
    double comm_compute_ratio = 0;
    std::string calibration;
    std::string expert_load_imbalance;
    std::string calibrate;
    std::string probe;
    std::string out;
    int calibrate_threads = 2;
    HarnessFlags harness;
    CLI::App* cmd = nullptr;
};

std::optional<double> given(const PlanArgs& a, const char* flag, double value) {
    return a.cmd->count(flag) > 0 ? std::optional<double>(value) : std::nullopt;
}

// A GPU's calibration from the measurements epo-gpu-probe wrote on it.
void run_calibrate_gpu_probe(const PlanArgs& args) {
    if (args.probe.empty()) {
        throw Error(ErrorKind::kUsage,
                    "--calibrate gpu-probe needs --probe FILE (what epo-gpu-probe --out FILE "
                    "wrote on the GPU)");
    }
    io::require_writable_file(args.out, "--out");
    const plan::GpuProbe probe = plan::read_gpu_probe(args.probe);
    const plan::Calibration c = plan::calibration_from_gpu_probe(probe, args.probe);
    plan::write_calibration(args.out, c);
    const plan::CostParams& p = c.params;
    std::cout << fmt::format(
        "[plan] {}: products {:.2f} / dgrad {:.2f} / wgrad {:.2f} of the datasheet peak, half "
        "at {:.0f} tokens (wgrad {:.0f}), memory {:.2f} / element-wise {:.2f} of the datasheet "
        "bandwidth, graph replay {:.2f} us\n[plan] wrote {} ({})\n",
        c.device, p.gemm_efficiency, p.dgrad_efficiency, p.wgrad_efficiency, p.gemm_half_dim,
        p.wgrad_half_dim, p.memory_efficiency, p.elementwise_efficiency, p.graph_launch_us,
        args.out, c.how);
}

void run_calibrate(const PlanArgs& args) {
    if (args.calibrate != "kernels" && args.calibrate != "gpu-probe") {
        throw Error(ErrorKind::kUsage,
                    fmt::format("--calibrate {}: the planner calibrates from kernel "
                                "measurements on this machine (--calibrate kernels) or from a "
                                "GPU's (--calibrate gpu-probe --probe FILE)",
                                args.calibrate));
    }
    if (args.out.empty()) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("--calibrate {} needs --out FILE (the calibration file to write)",
                                args.calibrate));
    }
    if (args.calibrate == "gpu-probe") {
        run_calibrate_gpu_probe(args);
        return;
    }
    if (!args.probe.empty()) {
        throw Error(ErrorKind::kUsage,
                    "--probe is read by --calibrate gpu-probe only; drop it, or use --calibrate "
                    "gpu-probe");
    }
    if (args.calibrate_threads < 1 || args.calibrate_threads > 256) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("--calibrate_threads {} is outside 1..256: give the ranks per "
                                "host of the job the plan is for",
                                args.calibrate_threads));
    }
    // Before the measurement: its result must have somewhere to go.
    io::require_writable_file(args.out, "--out");
    // One OpenMP thread per measuring thread, as every rank runs (set before oneDNN starts).
    setenv("OMP_NUM_THREADS", "1", 0);
    const plan::Calibration c =
        plan::calibrate_kernels({.num_threads = args.calibrate_threads}, std::cout);
    plan::write_calibration(args.out, c);
    std::cout << fmt::format(
        "[plan] cpu: peak {:.3g} TFLOP/s, dgrad {:.2f}, wgrad {:.2f} of it, half at {:.0f} "
        "(wgrad {:.0f}), memory {:.3g} GB/s, element-wise kernels {:.2f} of it\n[plan] wrote {} "
        "({})\n",
        *c.peak_bf16_tflops, c.params.dgrad_efficiency, c.params.wgrad_efficiency,
        c.params.gemm_half_dim, c.params.wgrad_half_dim, *c.memory_tbps * 1e3,
        c.params.elementwise_efficiency, args.out, c.how);
}

void run_plan(const PlanArgs& args) {
    if (!args.calibrate.empty()) {
        run_calibrate(args);
        return;
    }
    // Usage errors before any work.
    if (const auto r = given(args, "--comm_compute_ratio", args.comm_compute_ratio);
        r && !(std::isfinite(*r) && *r > 0)) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("--comm_compute_ratio {}: give a positive number (1 = the "
                                "baseline's communication as long as its compute)",
                                *r));
    }
    const plan::ExpertLoadImbalance expert_load =
        args.expert_load_imbalance.empty()
            ? plan::ExpertLoadImbalance{}
            : plan::parse_expert_load_imbalance(args.expert_load_imbalance);
    bool proxy = false;
    const config::ConfigSources sources = bench::with_default_model(
        config_sources(*args.cmd, args.model, args.positional, args.harness), &proxy);
    const config::BuiltConfig built = config::build_config(sources);
    // Errors before any work: the configuration as `epo validate` judges it for its target;
    // what only the epo CPU runtime lacks (RT ids) is one note, never a refusal.
    config::ValidationReport report = config::validate(built);
    const plan::RuntimeGaps gaps = plan::retarget_for_plan(report);
    if (!report.ok()) {
        if (args.json) {
            std::cout << config::report_to_json(report).dump(
                             2, ' ', false, nlohmann::json::error_handler_t::replace)
                      << "\n";
        } else {
            std::cerr << "epo plan: the configuration is invalid:\n"
                      << config::format_findings(report);
        }
        throw CLI::RuntimeError(1);
    }
    const config::Config& cfg = report.config;
    plan::HardwareOverrides o{given(args, "--peak_bf16_tflops", args.peak_bf16_tflops),
                              given(args, "--memory_tbps", args.memory_tbps),
                              given(args, "--memory_gb", args.memory_gb),
                              given(args, "--intra_node_gbps", args.intra_node_gbps),
                              given(args, "--inter_node_gbps", args.inter_node_gbps),
                              given(args, "--latency_us", args.latency_us)};
    const bool network_given = o.intra_node_gbps || o.inter_node_gbps || o.latency_us;
    const std::optional<plan::Calibration> calibration =
        args.calibration.empty() ? std::nullopt
                                 : std::optional(plan::read_calibration(args.calibration));
    plan::PlanOptions options = plan::plan_options(cfg, o, calibration ? &*calibration : nullptr);
    options.expert_load = expert_load;
    options.comm_compute_ratio = given(args, "--comm_compute_ratio", args.comm_compute_ratio);
    if (!options.comm_compute_ratio && proxy && !network_given)
        options.comm_compute_ratio = 1;  // as epo bench calibrates its embedded proxy
    const plan::PlanResult result = plan::make_plan(cfg, options);
    if (args.json) {
        // The runtime note and the validation's warnings too, as the text output prints them.
        std::cout << plan::plan_to_json(result, report, gaps)
                         .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
                  << "\n";
    } else {
        std::cout << config::format_findings(report) << plan::format_plan(result);
    }
    std::cout.flush();
}

}  // namespace

void add_plan_command(CLI::App& app) {
    auto args = std::make_shared<PlanArgs>();
    CLI::App* cmd = app.add_subcommand(
        "plan",
        "Predict, before launch, the step time of the baseline, overlap and overlap + delayed "
        "wgrad schedules on a GPU cluster (env.gpu, network flags) or this machine, and whether "
        "EP overlap pays. Uses the runtime's own schedules and two-stream replay. Without "
        "--model: epo bench's embedded proxy. Exit status: 0 planned, 1 invalid, 2 usage error.");
    args->cmd = cmd;
    cmd->add_option("config_and_overrides", args->positional,
                    "CONFIG.yaml, then KEY=VALUE overrides (env.gpu=h100, ...); later ones win");
    cmd->add_option("--model", args->model, "start from a recipe: " + recipe_list());
    cmd->add_flag("--json", args->json,
                  "print one JSON object: runs, overlap_speedup, verdict (as epo bench's "
                  "metrics.json where they overlap)");
    cmd->add_option("--intra_node_gbps", args->intra_node_gbps,
                    "per-GPU bandwidth inside a node, Gbit/s each way (default per device: "
                    "NVLink)");
    cmd->add_option("--inter_node_gbps", args->inter_node_gbps,
                    "per-GPU NIC bandwidth between nodes, Gbit/s each way (default 400)");
    cmd->add_option("--latency_us", args->latency_us, "per-collective latency, us (default 10)");
    cmd->add_option("--peak_bf16_tflops", args->peak_bf16_tflops,
                    "the device's dense bf16 TFLOP/s (default: its datasheet figure)");
    cmd->add_option("--memory_tbps", args->memory_tbps, "the device's memory bandwidth, TB/s");
    cmd->add_option("--memory_gb", args->memory_gb, "the device's memory, GB");
    cmd->add_option("--comm_compute_ratio", args->comm_compute_ratio,
                    "set the network so the baseline's communication takes R times its compute, "
                    "as epo bench --comm_compute_ratio does (default 1 for the embedded proxy)");
    cmd->add_option("--calibration", args->calibration,
                    "load the efficiency parameters (and cpu figures) from FILE");
    cmd->add_option("--expert_load_imbalance", args->expert_load_imbalance,
                    "the busiest EP rank's routed rows over the mean: a number >= 1 for every "
                    "MoE layer, or an epo bench run directory (its measured expert_load); "
                    "default 1, balanced");
    cmd->add_option("--calibrate", args->calibrate,
                    "kernels: measure this machine's products and element-wise kernels; "
                    "gpu-probe: convert what epo-gpu-probe measured on a GPU (--probe FILE); "
                    "either writes --out FILE and plans nothing");
    cmd->add_option("--probe", args->probe,
                    "the file epo-gpu-probe --out wrote on a GPU (for --calibrate gpu-probe)");
    cmd->add_option("--out", args->out, "the calibration file --calibrate writes");
    cmd->add_option("--calibrate_threads", args->calibrate_threads,
                    "threads measuring at once (the ranks per host of the planned job; default "
                    "2)");
    add_harness_flags(*cmd, args->harness);
    cmd->footer(
        "Examples:\n"
        "  epo plan --model qwen3-30b-a3b -ep 16 --num_nodes 2 --gpus_per_node 8 env.gpu=h100\n"
        "  epo plan --model qwen3-30b-a3b -ep 16 --num_nodes 2 --gpus_per_node 8 env.gpu=b200 "
        "--inter_node_gbps 800 --json\n"
        "  epo plan --calibrate kernels --out cpu.json && epo plan --calibration cpu.json "
        "--comm_compute_ratio 2\n"
        "  epo plan --calibrate gpu-probe --probe probe.json --out h200.json && epo plan "
        "--calibration h200.json --model qwen3-30b-a3b -ep 16 --num_nodes 2 --gpus_per_node 8 "
        "env.gpu=h200");
    cmd->callback([args] { run_plan(*args); });
}

}  // namespace epo::cli
