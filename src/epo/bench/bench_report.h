// What `epo bench` leaves behind and prints: metrics.json, the Chrome trace of one measured step
// per schedule (trace.json), report.html, and the comparison table.
//
// metrics.json (version 1):
//   runs[]: name, overlap_moe_expert_parallel_comm, delay_wgrad_compute,
//           step_time_s {median, min, max}, step_times_s[], tokens_per_s, tflops_per_rank,
//           compute_s, comm_s, exposed_comm_s, comm_cpu_s (medians over measured steps of the
//           largest over ranks), peak_rss_bytes, peak_activation_bytes, losses[], grad_norms[]
//           (first repeat), param_checksum (train/param_checksum.h, first repeat),
//           param_checksums[] (every repeat), steps_planned, steps_completed, repeats_identical
//           (losses, grad norms and checksums), losses_match_baseline, grad_norms_match_baseline,
//           params_match_baseline, baseline_differences ("" or what differs),
//           critical_path_bound_s, overlap_efficiency, speedup_vs_baseline,
//           nodes {kind: {stream, calls_per_step, seconds_per_step[rank],
//           bytes_sent_per_step[rank], bytes_received_per_step[rank],
//           inter_node_bytes_sent_per_step[rank]}},
//           inter_node (flex runs, else null) {ep_nodes, tokens_per_step, flex_copies_per_token,
//           alltoall_copies_per_token (alltoall on the same routing),
//           uniform_flex_copies_per_token, uniform_alltoall_copies_per_token,
//           dispatch_combine_bytes_per_step (all ranks)}
//   overlap_speedup, overlap_efficiency (the "overlap" run's), loss_bitwise_identical (losses
//   only), bitwise_identical (losses, grad norms and final parameters of every run),
//   link {inter_node_gbps, intra_node_gbps, latency_us}, calibration (or null; bytes per step
//   of the all-to-alls, gradient reductions, parameter gathers and optimizer-step reductions),
//   expert_load (or null: no MoE layer, or PP > 1) {layers[] {layer, rows_per_ep_rank[],
//   imbalance}, mean_imbalance}: the baseline's routing over its measured steps
//   (plan/expert_load.h),
//   run {command_line, commit (git describe at build time, "unknown" outside a checkout),
//   epo_version, host, cpu_model, cpu_features, avx512_bf16, amx_bf16, date_utc} (run_info.h),
//   schedule_options {schedules[], overlap_moe_expert_parallel_comm, delay_wgrad_compute (the
//   subject's), dispatcher, flex_backend (null unless flex), num_chunks, pair_edges,
//   pipeline_model_parallel_size, virtual_pipeline_model_parallel_size (or null),
//   num_micro_batches, micro_batch_size, link_model (link_label)},
//   model, proxy, world_size, num_nodes, gpus_per_node, num_micro_batches, steps_per_run,
//   warmup_steps, repeats, wall_time_s, completed
//
// report.html is one self-contained file (inline SVG and CSS, no scripts, no network): a header
// with the run's command, commit, host, CPU, date and schedule options, the table, a chart of
// compute, hidden and exposed communication per schedule, the loss curves of every run, and a
// timeline of both streams of every rank for one measured step of each schedule, all on one
// time scale.
#pragma once

#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>

#include "epo/bench/bench_run.h"

namespace epo::bench {

// Collective over MPI_COMM_WORLD: gathers the per-rank parts (node statistics, trace records),
// then rank 0 writes metrics.json, trace.json and report.html into result.run_dir and prints
// the table to `out`.
void write_bench_outputs(const BenchResult& result, std::ostream& out);

// A calibrated run whose baseline's comm/compute misses the target by more than this fraction
// gets a warning under the table.
inline constexpr double kAchievedRatioTolerance = 0.25;

// The comparison table of a metrics.json document, as printed.
std::string format_table(const nlohmann::json& metrics);

// One line per flex run: its inter-node token copies per token against alltoall's on the same
// routing and against uniform routing, and its dispatch + combine bytes across nodes per step;
// "" without flex runs.
std::string format_inter_node(const nlohmann::json& metrics);

// An overlap efficiency as shown: "-" when there is none (null), "n/a (overlap slower)" (or
// "n/a" where `narrow`, a table column) when it is negative: the overlap run was slower than the
// baseline, and a negative fraction of the possible gain reads as a figure it is not.
std::string format_efficiency(const nlohmann::json& efficiency, bool narrow = false);

// The link model as a label that says what is true: "link model off (this machine's own MPI
// transfers)" when every figure is 0, else each bandwidth, 0 shown as "not modelled" (a 0 there
// leaves that path infinitely fast, comm/link_model.h), and the latency.
std::string link_label(const nlohmann::json& link);

// report.html from metrics.json and trace.json documents.
std::string report_html(const nlohmann::json& metrics, const nlohmann::json& trace);

}  // namespace epo::bench
