#include "epo/bench/bench_run.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <ostream>

#include "epo/bench/trace.h"
#include "epo/checkpoint/stop_signal.h"
#include "epo/comm/launch.h"
#include "epo/comm/link_limits.h"
#include "epo/comm/mpi_runtime.h"
#include "epo/comm/rank_runner.h"
#include "epo/config/memory_estimate.h"
#include "epo/config/report.h"
#include "epo/config/yaml_io.h"
#include "epo/core/error.h"
#include "epo/moe/flex_dispatcher.h"
#include "epo/schedule/pipeline_schedule.h"
#include "epo/schedule/schedule.h"
#include "epo/train/memory_plan.h"
#include "epo/train/param_checksum.h"
#include "epo/train/train_run.h"
#include "epo/train/trainer.h"

namespace epo::bench {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string format_duration(double s) {
    const int total = static_cast<int>(std::lround(std::max(0.0, s)));
    return total >= 60 ? fmt::format("{}m{:02d}s", total / 60, total % 60)
                       : fmt::format("{}s", total);
}

// Collective; bounded by comm.timeout_s (`timeout_s`) as every wait on the other ranks.
double max_over_ranks(double v, double timeout_s) {
    double out = v;
    comm::watched_world_call("reducing a benchmark metric", timeout_s, [&] {
        comm::check_mpi(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD),
                        "reducing a benchmark metric");
    });
    return out;
}

config::ConfigSources sources_for(const BenchOptions& options, const BenchSchedule* schedule,
                                  const std::vector<std::string>& extra) {
    config::ConfigSources s = with_bench_model(options.sources);
    if (schedule) {
        // Last, so the schedule under comparison wins over the user's own overlap settings.
        s.overrides.push_back(fmt::format("comm_overlap.overlap_moe_expert_parallel_comm={}",
                                          schedule->overlap ? "true" : "false"));
        s.overrides.push_back(fmt::format("comm_overlap.delay_wgrad_compute={}",
                                          schedule->delay_wgrad ? "true" : "false"));
        // The reference's rule (EP011): EP overlap excludes shared-expert overlap, so the
        // overlap rows run the shared expert inside pre_dispatch; the report says so when the
        // configuration asked for it (format_table's shared-expert note).
        if (schedule->overlap)
            s.overrides.push_back("model.moe_shared_expert_overlap=false");
    }
    s.overrides.insert(s.overrides.end(), extra.begin(), extra.end());
    return s;
}

config::Config finalized_or_throw(const config::ConfigSources& sources, const comm::JobShape& job,
                                  const std::string& what) {
    const config::ValidationReport report = train::prepare_run_config(sources, job);
    if (!report.ok()) {
        std::string ids;
        for (const auto& e : report.errors) {
            ids += (ids.empty() ? "" : ", ") + e.id;
        }
        throw Error(
            ErrorKind::kConfig,
            fmt::format("{}the configuration cannot run on this runtime ({}):\n{}",
                        what.empty() ? "" : what + ": ", ids, config::format_findings(report)));
    }
    return report.config;
}

std::string schedule_name_of(const config::Config& cfg) {
    if (!cfg.model.overlap_moe_expert_parallel_comm) {
        return "baseline";
    }
    return cfg.model.delay_wgrad_compute ? "overlap+delay_wgrad" : "overlap";
}

std::vector<std::string> link_overrides(const LinkCalibration& c) {
    return {fmt::format("comm.link.inter_node_gbps={:.6g}", c.inter_node_gbps),
            fmt::format("comm.link.intra_node_gbps={:.6g}", c.intra_node_gbps),
            fmt::format("comm.link.latency_us={:.6g}", c.latency_us)};
}

// One rank's log file and, on rank 0, the progress stream.
struct Logs {
    std::ofstream rank_file;
    std::ostream* progress = nullptr;  // rank 0 only

    void both(const std::string& line) {
        rank_file << line << "\n" << std::flush;
        if (progress) {
            *progress << line << "\n" << std::flush;
        }
    }
};

}  // namespace

std::optional<double> calibration_ratio(const BenchOptions& options, bool proxy) {
    if (options.comm_compute_ratio || !proxy) {
        return options.comm_compute_ratio;
    }
    const auto& overrides = options.sources.overrides;
    const bool link_given =
        std::any_of(overrides.begin(), overrides.end(),
                    [](const std::string& o) { return o.rfind("comm.link.", 0) == 0; });
    if (link_given) {
        return std::nullopt;
    }
    return 1.0;  // the embedded default studies a balanced cluster
}

namespace {

// The step's routing (bench_run.h ScheduleRun::routed_counts). With PP > 1 each stage holds its
// own layers; the expert load is then not recorded.
void add_routed_counts(ScheduleRun& run, train::Trainer& trainer) {
    if (run.config.model.pipeline_model_parallel_size > 1)
        return;
    const std::vector<model::LayerStepStats>& stats = trainer.model().layer_stats();
    const std::vector<bool>& moe = trainer.shape().moe_layers;
    run.routed_counts.resize(stats.size());
    for (size_t l = 0; l < stats.size(); ++l) {
        if (l >= moe.size() || !moe[l])
            continue;
        const std::vector<int64_t>& c = stats[l].routed_counts;
        std::vector<int64_t>& sum = run.routed_counts[l];
        sum.resize(c.size(), 0);
        for (size_t e = 0; e < c.size(); ++e)
            sum[e] += c[e];
    }
}

LinkCalibration calibrate(const BenchOptions& options, double ratio, const comm::JobShape& job,
                          Logs& logs) {
    const BenchSchedule base{"baseline", false, false};
    const config::Config cfg =
        finalized_or_throw(sources_for(options, &base,
                                       {"comm.link.inter_node_gbps=0",
                                        "comm.link.intra_node_gbps=0", "comm.link.latency_us=0"}),
                           job, "calibration");
    logs.both(
        fmt::format("[bench] calibrating the link model to comm/compute = {}: baseline "
                    "with the link model off",
                    ratio));
    train::Trainer trainer(cfg, {.keep_records = true});
    const int steps = options.warmup_steps + 2;
    std::vector<double> compute, comm_s, a2a_bytes, reduce_bytes, gather_bytes, other_bytes,
        collectives;
    const bool inter = config::num_nodes(cfg.comm) > 1;
    for (int i = 0; i < steps; ++i) {
        const train::StepResult r = trainer.step();
        if (i < options.warmup_steps) {
            continue;
        }
        compute.push_back(r.compute_busy_s);
        comm_s.push_back(r.comm_busy_s);
        double a2a = 0, reduce = 0, gather = 0, other = 0, n = 0;
        for (const runtime::TaskRecord& t : r.records) {
            const int64_t sent = inter ? t.bytes.inter_sent : t.bytes.intra_sent;
            const int64_t recv = inter ? t.bytes.inter_recv : t.bytes.intra_recv;
            if (t.kind != runtime::RecordKind::kTask || sent + recv == 0) {
                continue;
            }
            const std::string kind = node_kind_of(t.name);
            (t.stream != "comm"                                              ? other
             : kind == schedule::node_name(schedule::NodeKind::kGradReduce)  ? reduce
             : kind == schedule::node_name(schedule::NodeKind::kParamGather) ? gather
                                                                             : a2a) +=
                static_cast<double>(std::max(sent, recv));
            n += 1;
        }
        a2a_bytes.push_back(a2a);
        reduce_bytes.push_back(reduce);
        gather_bytes.push_back(gather);
        other_bytes.push_back(other);
        collectives.push_back(n);
    }
    LinkCalibration c;
    c.target_ratio = ratio;
    c.compute_s = max_over_ranks(summarize(compute).median, cfg.comm.timeout_s);
    c.comm_s_unmodelled = max_over_ranks(summarize(comm_s).median, cfg.comm.timeout_s);
    c.alltoall_bytes = max_over_ranks(summarize(a2a_bytes).median, cfg.comm.timeout_s);
    c.grad_reduce_bytes = max_over_ranks(summarize(reduce_bytes).median, cfg.comm.timeout_s);
    c.param_gather_bytes = max_over_ranks(summarize(gather_bytes).median, cfg.comm.timeout_s);
    c.compute_stream_bytes = max_over_ranks(summarize(other_bytes).median, cfg.comm.timeout_s);
    c.num_collectives =
        static_cast<int64_t>(max_over_ranks(summarize(collectives).median, cfg.comm.timeout_s));
    c.inter_node = inter;
    const config::Config user = finalized_or_throw(sources_for(options, &base, {}), job, "run");
    c.latency_us = user.comm.link.latency_us.value_or(0.0);
    const double optimizer_bytes =
        c.grad_reduce_bytes + c.param_gather_bytes + c.compute_stream_bytes;
    const double bytes = c.alltoall_bytes + optimizer_bytes;
    // The comm stream's busy time with the link model off (waiting for the other ranks to enter
    // each all-to-all, then the copies) stays when the link model is on: the model holds a
    // collective from the moment the last rank entered it. Leave it out of the modelled time so
    // the calibrated baseline's communication comes out at R x C, not R x C plus that.
    const double link_time =
        ratio * c.compute_s - c.num_collectives * c.latency_us * 1e-6 - c.comm_s_unmodelled;
    if (c.alltoall_bytes <= 0 || link_time <= 0) {
        throw Error(
            ErrorKind::kConfig,
            fmt::format("--comm_compute_ratio {}: cannot calibrate: {} collectives moving "
                        "{:.0f} bytes per step with comm.link.latency_us={} already take "
                        "more than {:.3f} s, of which {:.3f} s is the all-to-alls' own time "
                        "without the link model (or there is no all-to-all: is the model MoE "
                        "with expert parallel > 1?); lower comm.link.latency_us or raise "
                        "the ratio",
                        ratio, c.num_collectives, bytes, c.latency_us, ratio * c.compute_s,
                        c.comm_s_unmodelled));
    }
    const double gbps = bytes * 8.0 / link_time / 1e9;
    // The calibrated link holds one step's collectives about ratio x compute seconds; past
    // comm.timeout_s no step could finish, so say so now instead of starting runs that time out
    // (or, before the hold was bounded, slept for years).
    if (link_time > user.comm.timeout_s || gbps < comm::kMinLinkGbps) {
        throw Error(
            ErrorKind::kUsage,
            fmt::format("--comm_compute_ratio {}: the link this calibrates to ({:.3g} "
                        "Gbit/s) holds one step's {} collectives {:.3g} s, beyond "
                        "comm.timeout_s = {} s (or below the {:g} Gbit/s the link model "
                        "accepts); give a ratio of at most {:.3g}, or raise "
                        "comm.timeout_s",
                        ratio, gbps, c.num_collectives, link_time, user.comm.timeout_s,
                        comm::kMinLinkGbps,
                        std::min(user.comm.timeout_s, bytes * 8.0 / (comm::kMinLinkGbps * 1e9)) /
                            c.compute_s));
    }
    (c.inter_node ? c.inter_node_gbps : c.intra_node_gbps) = gbps;
    c.compute_stream_comm_s = c.compute_stream_bytes * 8.0 / (gbps * 1e9);
    logs.both(fmt::format(
        "[bench] link model: compute {:.3f} s/step; per step {:.1f} MB of all-to-alls and "
        "{:.1f} MB of data-parallel gradient/parameter traffic and loss reductions -> "
        "comm.link.{}_node_gbps={:.4g} latency_us={}",
        c.compute_s, c.alltoall_bytes / 1e6, optimizer_bytes / 1e6,
        c.inter_node ? "inter" : "intra", gbps, c.latency_us));
    return c;
}

// With pipeline stages: each schedule's bubble, the compute stream's idle time per step (step
// time minus its busy time, averaged over ranks; medians over the measured steps), as a fraction
// of the busy time next to the interleaved schedule's ideal (p - 1) / (v m). The idle time also
// holds any exposed communication, so at PP = 1 it is not zero either.
void log_pipeline_bubbles(const BenchResult& result, Logs& logs) {
    for (const ScheduleRun& r : result.runs) {
        const config::ModelConfig& m = r.config.model;
        if (m.pipeline_model_parallel_size <= 1 || r.measured.empty())
            continue;
        std::vector<double> idle, busy;
        for (const StepMetrics& step : r.measured) {
            double i = 0, b = 0;
            for (const RankStepMetrics& rank : step.ranks) {
                i += rank.step_time_s - rank.compute_busy_s;
                b += rank.compute_busy_s;
            }
            const auto n = static_cast<double>(std::max<size_t>(step.ranks.size(), 1));
            idle.push_back(i / n);
            busy.push_back(b / n);
        }
        const schedule::PipelineShape shape{
            .num_stages = m.pipeline_model_parallel_size,
            .num_chunks = config::virtual_pipeline_size(m),
            .num_micro_batches = static_cast<int>(config::num_microbatches(r.config))};
        const double idle_s = summarize(idle).median, busy_s = summarize(busy).median;
        logs.both(fmt::format(
            "[bench] pipeline bubble, {} (PP {}, VPP {}, {} micro-batches): compute idle {:.3f} "
            "s/step = {:.3f} of its busy {:.3f} s; ideal (p - 1) / (v m) = {:.3f}",
            r.schedule.name, shape.num_stages, shape.num_chunks, shape.num_micro_batches, idle_s,
            busy_s > 0 ? idle_s / busy_s : 0.0, busy_s, schedule::ideal_bubble_fraction(shape)));
    }
}

// Fills the derived fields of every run once all are measured. Collective (bound, node stats).
void derive(BenchResult& result) {
    const ScheduleRun* base = nullptr;
    for (const ScheduleRun& r : result.runs) {
        if (r.schedule.name == "baseline") {
            base = &r;
        }
    }
    for (ScheduleRun& r : result.runs) {
        std::vector<double> step, compute, comm_s, exposed, comm_cpu;
        for (const StepMetrics& m : r.measured) {
            step.push_back(m.step_time_s);
            compute.push_back(m.compute_busy_s);
            comm_s.push_back(m.comm_busy_s);
            exposed.push_back(m.exposed_comm_s);
            comm_cpu.push_back(m.comm_cpu_s);
            r.peak_activation_bytes = std::max(r.peak_activation_bytes, m.peak_activation_bytes);
        }
        r.step_time_s = summarize(step);
        r.compute_s = summarize(compute).median;
        r.comm_s = summarize(comm_s).median;
        r.exposed_comm_s = summarize(exposed).median;
        r.comm_cpu_s = summarize(comm_cpu).median;
        if (r.step_time_s.median > 0 && !r.measured.empty()) {
            const StepMetrics& m = r.measured.front();
            r.tokens_per_s = m.tokens_per_s * m.step_time_s / r.step_time_s.median;
            r.tflops_per_rank = m.tflops_per_rank * m.step_time_s / r.step_time_s.median;
        }
        // Bit for bit, on the losses, the grad norms and the final parameters (metrics.h).
        const auto bits_of = [](const ScheduleRun& run, size_t rep) {
            return RunBits{run.losses[rep], run.grad_norms[rep],
                           rep < run.param_checksums.size() ? run.param_checksums[rep] : ""};
        };
        for (size_t rep = 1; rep < r.losses.size(); ++rep) {
            r.repeats_identical =
                r.repeats_identical && compare_bits(bits_of(r, 0), bits_of(r, rep)).all();
        }
        if (base && !base->losses.empty() && !r.losses.empty()) {
            const BitComparison c = compare_bits(bits_of(*base, 0), bits_of(r, 0));
            r.losses_match_baseline = c.losses;
            r.grad_norms_match_baseline = c.grad_norms;
            r.params_match_baseline = c.params;
            r.baseline_differences = c.differences;
        }
        if (base && &r != base && r.schedule.overlap && !r.durations.empty()) {
            r.critical_path_bound_s =
                max_over_ranks(critical_path_bound_s(r.calls, base->durations, r.durations),
                               result.config.comm.timeout_s);
            r.overlap_efficiency = overlap_efficiency(
                base->step_time_s.median, r.step_time_s.median, *r.critical_path_bound_s);
        }
        if (base && r.step_time_s.median > 0) {
            r.speedup_vs_baseline = base->step_time_s.median / r.step_time_s.median;
        }
    }
    for (const ScheduleRun& r : result.runs) {
        result.loss_bitwise_identical =
            result.loss_bitwise_identical && r.losses_match_baseline && r.repeats_identical;
        result.bitwise_identical = result.bitwise_identical && r.losses_match_baseline &&
                                   r.grad_norms_match_baseline && r.params_match_baseline &&
                                   r.repeats_identical;
        if (r.schedule.name == "overlap" && base) {
            result.overlap_speedup = r.speedup_vs_baseline;
            result.overlap_efficiency = r.overlap_efficiency;
        }
    }
}

}  // namespace

const char* const kProxyRecipe = "qwen3-30b-a3b";

namespace {

// What both proxies run as their recipes do: the distributed optimizer with bucketed
// grad-reduce and param-gather overlap (set in comm_overlap, which finalization copies into
// ddp), 8 MiB buckets, TP comm overlap stated off (a comm_overlap section must state it), and 2
// ranks as 2 nodes of 1, so all expert traffic crosses the modelled NIC.
constexpr const char* kProxyRunSections = R"(ddp:
  use_distributed_optimizer: true
comm_overlap:
  tp_comm_overlap: false
  overlap_grad_reduce: true
  overlap_param_gather: true
  bucket_size: 8388608
comm:
  num_nodes: 2
  gpus_per_node: 1
)";

}  // namespace

const std::string& proxy_yaml() {
    // Real widths of qwen3-30b-a3b (expert FFN 768, head dim 128); hidden 1024 with the heads
    // scaled from 32 query / 4 key-value heads at hidden 2048; 16 experts with top-4 routing
    // (qwen3: 128, top-8), so two CPU ranks finish a step in seconds; 2 layers, sequence 512,
    // vocabulary 2048 (a small vocabulary keeps the dense gradient all-reduce, which can hide
    // only behind the last backward, below the all-to-all traffic); 2 ranks as 2 nodes of 1
    // (all expert traffic crosses the modelled NIC); 8 micro-batches per step. As in the
    // recipe, the distributed optimizer with bucketed grad-reduce and param-gather overlap
    // (set in comm_overlap, which finalization copies into ddp), with 8 MiB buckets: each of the 2
    // layers, the output layer and the embedding is a bucket of its own, as a 48-layer model's 128
    // MiB buckets hold a few of its layers each.
    static const std::string yaml = R"(model:
  num_layers: 2
  hidden_size: 1024
  num_attention_heads: 16
  num_query_groups: 2
  kv_channels: 128
  ffn_hidden_size: 3072
  moe_ffn_hidden_size: 768
  num_moe_experts: 16
  moe_router_topk: 4
  seq_length: 512
  vocab_size: 2048
  expert_model_parallel_size: 2
train:
  micro_batch_size: 1
  global_batch_size: 16
  train_iters: 3
  lr_warmup_iters: 1
)" + std::string(kProxyRunSections);
    return yaml;
}

const std::string& deepseek_v3_proxy_yaml() {
    // Over the deepseek-v3 recipe, which keeps what the runtime runs: MLA with its real widths
    // (q_lora_rank 1536, kv_lora_rank 512, qk_head_dim 128, qk_pos_emb_head_dim 64, v_head_dim
    // 128, the latent norms), sigmoid routing with expert bias, group-limited top-k and the
    // recipe's scaling factor 2.5, the fp32 router, the sequence aux loss, a shared expert of
    // the real FFN 2048 with shared-expert overlap, the real expert FFN 2048, one MTP layer.
    // Shrunk so that two CPU ranks finish a step in seconds (docs/bench.md gives the reasons):
    // - hidden 1024 (7168), 16 heads (128; the same heads per hidden width);
    // - 2 decoder layers, the first dense as the recipe's first 3 of 61 (moe_layer_freq), plus
    //   the MTP layer (MoE, as the last decoder layer): one dense and two MoE layers;
    // - the dense FFN 2688, the recipe's 18432 scaled as the hidden size (x 1024 / 7168, to a
    //   multiple of 128; a first try with 10240 = (top-4 + 1 shared) x 2048 took 16 s a step
    //   here and added 31 M dense parameters to a gradient traffic that already dwarfs the
    //   all-to-alls, docs/bench.md);
    // - 16 experts with top-4 (256, top-8), in 8 groups of which each token keeps 4 (the
    //   recipe's 8 and 4), so group-limited routing still limits a token to half the groups;
    // - sequence 256 (4096), 4 micro-batches per step, vocabulary 2048 (129280: a small
    //   vocabulary keeps the dense gradient reduction below the all-to-all traffic);
    // - 2 ranks as 2 nodes of 1 (all expert traffic crosses the modelled NIC), the distributed
    //   optimizer with bucketed overlap and 8 MiB buckets, as the qwen3-30b-a3b proxy.
    static const std::string yaml = R"(model:
  num_layers: 2
  moe_layer_freq: [0, 1]
  hidden_size: 1024
  num_attention_heads: 16
  num_query_groups: 16
  ffn_hidden_size: 2688
  num_moe_experts: 16
  moe_router_topk: 4
  moe_router_num_groups: 8
  moe_router_group_topk: 4
  seq_length: 256
  vocab_size: 2048
  expert_model_parallel_size: 2
train:
  micro_batch_size: 1
  global_batch_size: 8
  train_iters: 3
  lr_warmup_iters: 1
)" + std::string(kProxyRunSections);
    return yaml;
}

const std::string* bench_proxy_yaml(const std::string& recipe) {
    if (recipe == kProxyRecipe)
        return &proxy_yaml();
    if (recipe == "deepseek-v3")
        return &deepseek_v3_proxy_yaml();
    return nullptr;
}

int launch_world_size(const config::Config& built) {
    const config::CommConfig& comm = built.comm;
    const std::int64_t nodes = comm.num_nodes.value_or(1);
    std::int64_t per_node = 0;
    if (comm.gpus_per_node) {
        per_node = *comm.gpus_per_node;
    } else {
        const std::int64_t least =
            std::max<std::int64_t>(1, config::model_parallel_size(built.model)) *
            std::max(1, built.model.expert_model_parallel_size);
        per_node =
            (least + std::max<std::int64_t>(1, nodes) - 1) / std::max<std::int64_t>(1, nodes);
    }
    const std::int64_t world = nodes * per_node;  // each factor is a validated int or derived
    if (nodes < 1 || per_node < 1 || world > kMaxLocalRanks) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("comm.num_nodes {} x comm.gpus_per_node {} = {} ranks: epo bench "
                                "starts its ranks on this host and takes 1 to {}; set "
                                "--num_nodes and --gpus_per_node (or run epo bench inside your "
                                "own mpirun / srun job for more)",
                                nodes, per_node, world, kMaxLocalRanks));
    }
    return static_cast<int>(world);
}

config::ConfigSources with_default_model(config::ConfigSources sources, bool* is_proxy) {
    const bool proxy = !sources.model && !sources.config_path && !sources.config_text;
    if (proxy) {
        sources.model = kProxyRecipe;
        sources.config_text = proxy_yaml();
    }
    if (is_proxy) {
        *is_proxy = proxy;
    }
    return sources;
}

config::ConfigSources with_bench_model(config::ConfigSources sources, bool* is_proxy) {
    const bool no_file = !sources.config_path && !sources.config_text;
    const std::string* yaml = no_file && sources.model ? bench_proxy_yaml(*sources.model) : nullptr;
    if (!yaml)
        return with_default_model(std::move(sources), is_proxy);
    sources.config_text = *yaml;
    if (is_proxy)
        *is_proxy = true;
    return sources;
}

const std::vector<BenchSchedule>& compare_schedules() {
    static const std::vector<BenchSchedule> s = {
        {"baseline", false, false}, {"overlap", true, false}, {"overlap+delay_wgrad", true, true}};
    return s;
}

config::Config check_bench_config(const BenchOptions& options, const comm::JobShape& job) {
    comm::check_omp_num_threads(std::getenv("OMP_NUM_THREADS"));  // before any kernel runs
    if (const auto& r = options.comm_compute_ratio; r && (!(*r >= 0) || !std::isfinite(*r))) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("--comm_compute_ratio {}: give a positive number (1 = the "
                                "baseline's communication as long as its compute) or 0 (link "
                                "model off: communication as this machine does it)",
                                *r));
    }
    if (options.repeats < 0 || options.warmup_steps < 0) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("--repeats {} / --warmup_steps {}: give 0 or more", options.repeats,
                                options.warmup_steps));
    }
    const config::Config cfg = finalized_or_throw(sources_for(options, nullptr, {}), job, "");
    // A flex benchmark that fell back to alltoall (a device whose gating refuses the backend,
    // W007) would measure alltoall under flex's name: refused.
    const auto& flex = options.sources.harness.moe_flex_dispatcher_backend;
    if (flex && flex->has_value() &&
        cfg.model.moe_token_dispatcher_type != config::DispatcherType::kFlex) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("--moe_flex_dispatcher_backend {}: the target device does not "
                                "admit this flex backend, so the run would fall back to alltoall "
                                "and measure alltoall under flex's name; choose a device that "
                                "admits it (env.gpu, e.g. cpu) or drop the flag",
                                **flex));
    }
    if (options.warmup_steps >= cfg.train.train_iters) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("--warmup_steps {} leaves none of the {} steps "
                                "(train.train_iters / --max_steps) to measure; raise --max_steps "
                                "or lower --warmup_steps",
                                options.warmup_steps, cfg.train.train_iters));
    }
    if (options.compare) {
        for (const BenchSchedule& s : compare_schedules()) {
            finalized_or_throw(sources_for(options, &s, {}), job, s.name);
        }
    }
    // Before any allocation, and in the launcher before any rank starts: the overlap schedule of
    // --compare holds two micro-batches' activations.
    config::Config memory_cfg = cfg;
    memory_cfg.model.overlap_moe_expert_parallel_comm |= options.compare;
    config::check_memory_fits(train::estimate_run_memory(memory_cfg),
                              job.ranks_per_host > 0 ? job.ranks_per_host : job.world_size,
                              config::available_memory_bytes());
    return cfg;
}

std::string bench_warnings(const BenchOptions& options, const comm::JobShape& job) {
    std::vector<BenchSchedule> schedules = compare_schedules();
    if (!options.compare)
        schedules.clear();
    config::ValidationReport all;
    all.target = "epo cpu runtime, the schedules this bench runs";
    const auto add = [&](const config::ConfigSources& sources) {
        const config::ValidationReport report = train::prepare_run_config(sources, job);
        for (const config::Finding& w : report.warnings) {
            const bool seen = std::any_of(
                all.warnings.begin(), all.warnings.end(),
                [&](const config::Finding& f) { return f.id == w.id && f.field == w.field; });
            if (!seen)
                all.warnings.push_back(w);
        }
    };
    add(sources_for(options, nullptr, {}));
    for (const BenchSchedule& s : schedules)
        add(sources_for(options, &s, {}));
    return all.warnings.empty() ? "" : config::format_findings(all);
}

void check_out_dir_unused(const std::filesystem::path& dir) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::exists(dir, ec)) {
        // A symlink whose target is gone cannot be created as a directory: say so now, not
        // after the ranks have started.
        if (fs::is_symlink(fs::symlink_status(dir, ec))) {
            throw Error(ErrorKind::kUsage,
                        fmt::format("--out {}: it is a symbolic link to '{}', which does not "
                                    "exist; create that directory, or give another path",
                                    dir.string(), fs::read_symlink(dir, ec).string()));
        }
        // The nearest existing ancestor must be a directory this user can write into.
        fs::path parent = fs::absolute(dir, ec).parent_path();
        while (!parent.empty() && !fs::exists(parent, ec) && parent != parent.root_path())
            parent = parent.parent_path();
        if (!parent.empty() &&
            (!fs::is_directory(parent, ec) || ::access(parent.c_str(), W_OK | X_OK) != 0)) {
            throw Error(ErrorKind::kUsage,
                        fmt::format("--out {}: cannot create it: '{}' is not a directory this "
                                    "user can write into; give a path under a writable directory",
                                    dir.string(), parent.string()));
        }
        return;
    }
    if (!std::filesystem::is_directory(dir, ec)) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("--out {}: it is a file, not a directory; give a new directory "
                                "(it is created)",
                                dir.string()));
    }
    if (!std::filesystem::is_empty(dir, ec)) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("--out {}: the directory is not empty (another run's results?); "
                                "a run never writes into another's: give a new directory, or "
                                "remove this one first",
                                dir.string()));
    }
}

bool mark_run_stopped(const std::filesystem::path& dir, int signal, int status) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec))
        return false;
    const std::time_t now = std::time(nullptr);
    char stamp[32] = "";
    std::tm utc{};
    if (gmtime_r(&now, &utc))
        std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &utc);
    std::ofstream out(dir / kStoppedMarker);
    out << fmt::format(
        "stopped by {} at {} before the run finished (launcher exit status {}): metrics.json, "
        "report.html and trace.json are missing or partial; rerun to measure\n",
        checkpoint::signal_name(signal), stamp, status);
    out.close();
    return static_cast<bool>(out);
}

BenchResult run_bench(const BenchOptions& options, std::ostream& log) {
    const auto t0 = Clock::now();
    const int rank = comm::current_world_rank();
    const comm::JobShape job = comm::current_job_shape();
    if (rank == 0) {
        if (const std::string w = comm::omp_oversubscription_warning(job.ranks_per_host);
            !w.empty())
            log << w << "\n" << std::flush;
    }
    BenchResult result;
    result.config = check_bench_config(options, job);
    // What `epo validate` warns of for the same flags (W012: nothing to overlap), before the
    // numbers it qualifies.
    if (rank == 0) {
        if (const std::string w = bench_warnings(options, job); !w.empty())
            log << w << std::flush;
    }
    with_bench_model(options.sources, &result.proxy);
    // Every rank looks before any creates anything (the reduction orders the two), so all reach
    // the same verdict on --out and none waits alone.
    int out_in_use = 0;
    std::string out_problem;
    if (options.out_dir) {
        try {
            check_out_dir_unused(*options.out_dir);
        } catch (const Error& e) {
            out_in_use = 1;
            out_problem = e.what();
        }
    }
    comm::watched_world_call("agreeing on --out", result.config.comm.timeout_s, [&] {
        comm::check_mpi(
            MPI_Allreduce(MPI_IN_PLACE, &out_in_use, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD),
            "agreeing on --out");
    });
    if (out_in_use) {
        throw Error(ErrorKind::kUsage,
                    out_problem.empty() ? fmt::format("--out {}: not a new or empty directory on "
                                                      "another rank",
                                                      options.out_dir->string())
                                        : out_problem);
    }
    result.run_dir = train::agree_on_run_dir(options.out_dir, result.config, "bench-");
    if (rank == 0) {
        std::filesystem::create_directories(result.run_dir / "logs");
    }
    comm::watched_world_call(
        "waiting for rank 0 to create the run directory", result.config.comm.timeout_s,
        [] { comm::check_mpi(MPI_Barrier(MPI_COMM_WORLD), "waiting for the run directory"); });
    Logs logs;
    logs.rank_file.open(result.run_dir / "logs" / fmt::format("rank-{}.log", rank));
    if (!logs.rank_file) {
        throw Error(ErrorKind::kIo, fmt::format("cannot write logs under '{}'; give a writable "
                                                "--out directory",
                                                result.run_dir.string()));
    }
    if (rank == 0) {
        logs.progress = &log;
    }

    const std::optional<double> ratio = calibration_ratio(options, result.proxy);
    std::vector<std::string> link;
    if (ratio && *ratio > 0) {
        result.calibration = calibrate(options, *ratio, job, logs);
        link = link_overrides(*result.calibration);
    } else if (ratio) {
        // --comm_compute_ratio 0: the link model off, whatever the configuration says.
        link = link_overrides(LinkCalibration{});
    }

    std::vector<BenchSchedule> schedules;
    if (options.compare) {
        schedules = compare_schedules();
    } else {
        const std::string name = schedule_name_of(result.config);
        for (const BenchSchedule& s : compare_schedules()) {
            if (s.name == name) {
                schedules.push_back(s);
            }
        }
    }
    for (const BenchSchedule& s : schedules) {
        ScheduleRun run;
        run.schedule = s;
        run.config = finalized_or_throw(sources_for(options, &s, link), job, s.name);
        if (rank == 0) {
            config::ValidationReport report;
            report.config = run.config;
            report.target = "epo cpu runtime";
            logs.rank_file << "# run: " << s.name << "\n" << config::format_run_log(report);
            std::filesystem::create_directories(result.run_dir / "configs");
            config::save_yaml(run.config, result.run_dir / "configs" / (s.name + ".yaml"));
        }
        result.runs.push_back(std::move(run));
    }
    // The subject's finalized configuration, with the link settings the runs used.
    result.config = result.runs.back().config;
    if (rank == 0) {
        config::save_yaml(result.config, result.run_dir / "config.yaml");
    }

    result.command_line = options.command_line;
    result.repeats = options.repeats > 0 ? options.repeats : (options.compare ? 2 : 1);
    result.warmup_steps = options.warmup_steps;
    const int64_t steps = result.config.train.train_iters;
    const int64_t total_steps = steps * result.repeats * static_cast<int64_t>(result.runs.size());
    int64_t steps_done = 0;
    const auto measure_t0 = Clock::now();
    const size_t n = result.runs.size();
    for (int rep = 0; rep < result.repeats; ++rep) {
        for (size_t k = 0; k < n; ++k) {
            // Rotate the order so no schedule always runs first (or right after another).
            ScheduleRun& run = result.runs[(k + static_cast<size_t>(rep)) % n];
            reset_peak_rss();
            train::Trainer trainer(run.config, {.keep_records = true});
            run.calls = trainer.schedule_calls();
            const StepWork work = step_work(run.config, trainer);
            run.losses.emplace_back();
            run.grad_norms.emplace_back();
            run.steps_planned += steps;
            for (int64_t i = 0; i < steps; ++i) {
                const moe::flex::InterNodeCopies copies0 = moe::inter_node_copies_total();
                train::StepResult r = trainer.step();
                const moe::flex::InterNodeCopies copies = moe::inter_node_copies_total() - copies0;
                const StepMetrics m = gather_step_metrics(work, r);
                run.losses.back().push_back(r.lm_loss);
                run.grad_norms.back().push_back(r.grad_norm);
                run.steps_completed += 1;
                run.peak_rss_bytes = std::max(run.peak_rss_bytes, m.peak_rss_bytes);
                ++steps_done;
                const bool warm_up = i < options.warmup_steps;
                if (!warm_up) {
                    run.measured.push_back(m);
                    add_node_stats(run.nodes, r.records);
                    run.inter_node_copies += copies;
                    add_routed_counts(run, trainer);
                    run.measured_records.push_back(std::move(r.records));
                }
                const double elapsed = since(measure_t0);
                const double left = elapsed / static_cast<double>(steps_done) *
                                    static_cast<double>(total_steps - steps_done);
                logs.rank_file << fmt::format(
                    "{} repeat {} step {}: {:.4f} s (this rank {:.4f} s, compute {:.4f}, comm "
                    "{:.4f}, exposed {:.4f}, comm thread CPU {:.4f}), loss {:.6f}{}\n",
                    run.schedule.name, rep + 1, i + 1, m.step_time_s,
                    m.ranks[static_cast<size_t>(rank)].step_time_s,
                    m.ranks[static_cast<size_t>(rank)].compute_busy_s,
                    m.ranks[static_cast<size_t>(rank)].comm_busy_s,
                    m.ranks[static_cast<size_t>(rank)].exposed_comm_s,
                    m.ranks[static_cast<size_t>(rank)].comm_cpu_s, r.lm_loss,
                    warm_up ? " (warm-up)" : "");
                if (logs.progress) {
                    *logs.progress
                        << fmt::format(
                               "[bench] {:<20} repeat {}/{} step {}/{}: {:.3f} s{}  ({}/{} steps, "
                               "elapsed {}, about {} left)\n",
                               run.schedule.name, rep + 1, result.repeats, i + 1, steps,
                               m.step_time_s, warm_up ? " (warm-up)" : "", steps_done, total_steps,
                               format_duration(elapsed), format_duration(left))
                        << std::flush;
                }
            }
            // Collective; after the steps, outside every timing.
            run.param_checksums.push_back(
                train::final_param_checksum(trainer, run.config.comm.timeout_s));
        }
    }
    for (ScheduleRun& run : result.runs) {
        run.durations = median_call_durations(run.measured_records);
    }
    derive(result);
    log_pipeline_bubbles(result, logs);
    result.wall_s = since(t0);
    logs.rank_file << fmt::format("rank {} done: {} steps in {:.1f} s\n", rank, steps_done,
                                  result.wall_s)
                   << std::flush;
    return result;
}

}  // namespace epo::bench
