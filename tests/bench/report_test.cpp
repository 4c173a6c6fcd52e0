// What a shared report records and shows (bench_report.h, run_info.h): the command, the commit,
// the host, CPU and date, the schedule options; labels that say what is true; the chart of
// compute, hidden and exposed communication; a loss plot that reads for a handful of steps.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "epo/bench/bench_report.h"
#include "epo/bench/run_info.h"

namespace epo::bench {
namespace {

namespace fs = std::filesystem;

// stdout of a shell command, trailing newline removed; "" when it fails.
std::string shell(const std::string& command) {
    FILE* p = popen(command.c_str(), "r");
    if (!p)
        return "";
    std::string out;
    char buf[256];
    while (fgets(buf, sizeof buf, p))
        out += buf;
    if (pclose(p) != 0)
        return "";
    while (!out.empty() && out.back() == '\n')
        out.pop_back();
    return out;
}

size_t count(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1))
        ++n;
    return n;
}

// A metrics.json document as `epo bench` writes it, with what the report reads: runs with the
// given stream times (compute, comm, exposed, step) and losses.
struct RunTimes {
    std::string name;
    double compute, comm, exposed, step;
};
nlohmann::json metrics_doc(const std::vector<RunTimes>& runs, int steps) {
    nlohmann::json out = nlohmann::json::array();
    for (size_t i = 0; i < runs.size(); ++i) {
        const RunTimes& r = runs[i];
        std::vector<double> losses;
        for (int s = 0; s < steps; ++s)
            losses.push_back(6.0 - 0.25 * s);
        out.push_back({{"name", r.name},
                       {"step_time_s", {{"median", r.step}, {"min", r.step}, {"max", r.step}}},
                       {"tokens_per_s", 1.0},
                       {"tflops_per_rank", 1.0},
                       {"compute_s", r.compute},
                       {"comm_s", r.comm},
                       {"exposed_comm_s", r.exposed},
                       {"speedup_vs_baseline",
                        i == 0 ? nlohmann::json(1.0) : nlohmann::json(runs[0].step / r.step)},
                       {"overlap_efficiency", nullptr},
                       {"critical_path_bound_s", nullptr},
                       {"peak_rss_bytes", 1.0},
                       {"peak_activation_bytes", 1.0},
                       {"losses_match_baseline", true},
                       {"grad_norms_match_baseline", true},
                       {"params_match_baseline", true},
                       {"baseline_differences", ""},
                       {"losses", losses}});
    }
    return {{"model", "qwen3-30b-a3b (bench proxy)"},
            {"run",
             {{"command_line", "epo bench --compare 'model.seq_length=512' -gb <16>"},
              {"commit", "v1.2-3-gabc1234-dirty"},
              {"epo_version", "0.1.0"},
              {"host", "node-17"},
              {"cpu_model", "AMD EPYC 9654 96-Core Processor"},
              {"cpu_features", "avx2 fma avx512f avx512_bf16"},
              {"avx512_bf16", true},
              {"amx_bf16", false},
              {"date_utc", "2026-12-04T04:15:12Z"}}},
            {"schedule_options",
             {{"schedules", {"baseline", "overlap", "overlap+delay_wgrad"}},
              {"overlap_moe_expert_parallel_comm", true},
              {"delay_wgrad_compute", true},
              {"dispatcher", "flex"},
              {"flex_backend", "deepep"},
              {"num_chunks", 2},
              {"pair_edges", true},
              {"pipeline_model_parallel_size", 2},
              {"virtual_pipeline_model_parallel_size", 2},
              {"num_micro_batches", 8},
              {"micro_batch_size", 1},
              {"link_model", "link model off (this machine's own MPI transfers)"}}},
            {"world_size", 2},
            {"num_nodes", 2},
            {"gpus_per_node", 1},
            {"expert_model_parallel_size", 2},
            {"num_micro_batches", 8},
            {"global_batch_size", 16},
            {"seq_length", 512},
            {"steps_per_run", steps},
            {"warmup_steps", 1},
            {"repeats", 2},
            {"link", {{"inter_node_gbps", 0.0}, {"intra_node_gbps", 0.0}, {"latency_us", 0.0}}},
            {"calibration", nullptr},
            {"runs", out},
            {"overlap_speedup", nullptr},
            {"overlap_efficiency", nullptr},
            {"loss_bitwise_identical", true},
            {"bitwise_identical", true}};
}

const nlohmann::json kNoTrace = {{"traceEvents", nlohmann::json::array()}};

std::vector<RunTimes> three_runs() {
    return {{"baseline", 3.0, 3.2, 2.9, 6.0},
            {"overlap", 3.0, 3.3, 1.2, 4.3},
            {"overlap+delay_wgrad", 2.9, 3.1, 1.0, 4.0}};
}

TEST(RunInfo, ShellJoinQuotesOnlyWhatTheShellWouldSplitOrExpand) {
    EXPECT_EQ(shell_join({"epo", "bench", "--compare", "-gb", "32", "model.seq_length=512", "--out",
                          "/tmp/a-b_c.d"}),
              "epo bench --compare -gb 32 model.seq_length=512 --out /tmp/a-b_c.d");
    EXPECT_EQ(shell_join({"epo", "a b", "it's", "", "$HOME", "x;y"}),
              "epo 'a b' 'it'\\''s' '' '$HOME' 'x;y'");
}

TEST(RunInfo, CpuModelIsTheFirstProcessorsModelName) {
    std::istringstream two(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core "
        "Processor\nflags\t\t: avx512_bf16\n\nprocessor\t: 1\nmodel name\t: other\n");
    EXPECT_EQ(cpu_model_name(two), "AMD EPYC 9654 96-Core Processor");
    std::istringstream none("processor\t: 0\nCPU implementer\t: 0x41\n");  // no model name
    EXPECT_EQ(cpu_model_name(none), "unknown");
}

TEST(RunInfo, RecordsThisHostItsCpuAndTheDateInUtc) {
    const RunInfo info = collect_run_info("epo bench --compare");
    char host[256] = {};
    ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
    EXPECT_EQ(info.host, host);
    std::ifstream cpuinfo("/proc/cpuinfo");
    EXPECT_EQ(info.cpu_model, cpu_model_name(cpuinfo));
    EXPECT_FALSE(info.cpu_features.empty());
    EXPECT_EQ(info.cpu_features.find("avx512_bf16") != std::string::npos, info.avx512_bf16);
    EXPECT_EQ(info.cpu_features.find("amx_bf16") != std::string::npos, info.amx_bf16);
    EXPECT_TRUE(std::regex_match(info.date_utc,
                                 std::regex("20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:"
                                            "[0-6][0-9]Z")))
        << info.date_utc;
    const nlohmann::json j = run_info_json(info);
    for (const char* key : {"command_line", "commit", "epo_version", "host", "cpu_model",
                            "cpu_features", "avx512_bf16", "amx_bf16", "date_utc"})
        EXPECT_TRUE(j.contains(key)) << key;
    EXPECT_EQ(j.at("command_line"), "epo bench --compare");
}

// The build's commit is the source tree's `git describe` (the header is regenerated before every
// build; "-dirty" depends on the tree's state at build time, so only the commit is compared).
TEST(RunInfo, CommitIsTheSourceTreesGitDescribe) {
    const std::string src = EPO_SOURCE_DIR;
    const std::string top = shell("git -C '" + src + "' rev-parse --show-toplevel 2>/dev/null");
    if (top.empty() || fs::canonical(top) != fs::canonical(src)) {
        EXPECT_EQ(build_commit(), "unknown");
        return;
    }
    std::string commit = build_commit();
    if (commit.size() > 6 && commit.ends_with("-dirty"))
        commit.resize(commit.size() - 6);
    EXPECT_EQ(commit, shell("git -C '" + src + "' describe --always"))
        << "rebuild after a commit regenerates the header";
}

// cmake/BuildCommit.cmake outside a git checkout, and in a folder inside another repository
// (a tarball unpacked there): "unknown"; at a checkout's top: its describe.
TEST(RunInfo, CommitIsUnknownOutsideAGitCheckout) {
    if (shell("command -v git").empty() || shell("command -v cmake").empty())
        GTEST_SKIP() << "needs git and cmake";
    const fs::path dir = fs::temp_directory_path() / ("epo_commit_" + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir / "repo" / "unpacked");
    const std::string script = std::string(EPO_SOURCE_DIR) + "/cmake/BuildCommit.cmake";
    const auto generate = [&](const fs::path& source) {
        const fs::path out = dir / "build_commit.h";
        fs::remove(out);
        shell("cmake -DSOURCE_DIR='" + source.string() + "' -DOUTPUT='" + out.string() + "' -P '" +
              script + "'");
        std::ifstream in(out);
        std::stringstream s;
        s << in.rdbuf();
        return s.str();
    };
    EXPECT_NE(generate(dir / "repo").find("#define EPO_BUILD_COMMIT \"unknown\""),
              std::string::npos);
    const std::string git = "git -C '" + (dir / "repo").string() +
                            "' -c user.name=t -c user.email=t@t -c init.defaultBranch=main ";
    shell(git + "init -q && " + git + "commit -q --allow-empty -m first");
    const std::string head = shell(git + "rev-parse --short HEAD");
    ASSERT_FALSE(head.empty());
    EXPECT_NE(generate(dir / "repo").find("\"" + head), std::string::npos);
    EXPECT_NE(generate(dir / "repo" / "unpacked").find("\"unknown\""), std::string::npos);
    fs::remove_all(dir);
}

TEST(Report, HeaderShowsHowTheRunWasMadeAndTheScheduleOptions) {
    const std::string html = report_html(metrics_doc(three_runs(), 4), kNoTrace);
    for (const char* shown :
         {"<code>epo bench --compare &#39;model.seq_length=512&#39; -gb &lt;16&gt;</code>",
          "v1.2-3-gabc1234-dirty (epo 0.1.0)", "node-17", "AMD EPYC 9654 96-Core Processor",
          "AVX-512 bf16: yes, AMX: no", "2026-12-04T04:15:12Z",
          "baseline, overlap, overlap+delay_wgrad",
          "overlap_moe_expert_parallel_comm true, delay_wgrad_compute true", "flex (deepep)",
          "<th>overlap chunks</th><td>2 by experts</td>", "<th>paired edges</th><td>on</td>",
          "PP 2, VPP 2", "8 of size 1 per step (global batch 16, sequence 512)"}) {
        EXPECT_NE(html.find(shown), std::string::npos) << shown;
    }
    // The header comes first, before the summary.
    EXPECT_LT(html.find("id='run-info'"), html.find("id='summary'"));
}

TEST(Report, LinkLabelsSayWhatIsTrue) {
    const nlohmann::json off = {
        {"inter_node_gbps", 0.0}, {"intra_node_gbps", 0.0}, {"latency_us", 0.0}};
    EXPECT_EQ(link_label(off), "link model off (this machine's own MPI transfers)");
    const nlohmann::json inter = {
        {"inter_node_gbps", 0.5006}, {"intra_node_gbps", 0.0}, {"latency_us", 0.0}};
    EXPECT_EQ(link_label(inter),
              "link model: inter-node 0.5006 Gbit/s, intra-node not modelled, latency 0 us");
    const nlohmann::json latency = {
        {"inter_node_gbps", 0.0}, {"intra_node_gbps", 0.0}, {"latency_us", 20.0}};
    EXPECT_EQ(link_label(latency),
              "link model: inter-node not modelled, intra-node not modelled, latency 20 us");

    nlohmann::json m = metrics_doc(three_runs(), 4);
    for (const std::string& text : {report_html(m, kNoTrace), format_table(m)}) {
        EXPECT_NE(text.find("link model off"), std::string::npos) << text;
        EXPECT_EQ(text.find(" 0 Gbit/s"), std::string::npos) << text;
    }
    m["link"] = inter;
    for (const std::string& text : {report_html(m, kNoTrace), format_table(m)})
        EXPECT_NE(text.find("intra-node not modelled"), std::string::npos) << text;
}

TEST(Report, ChartShowsComputeHiddenAndExposedCommunicationPerSchedule) {
    const std::vector<RunTimes> runs = three_runs();
    const std::string html = report_html(metrics_doc(runs, 4), kNoTrace);
    const size_t start = html.find("id='comm-chart'");
    ASSERT_NE(start, std::string::npos);
    const std::string chart = html.substr(start, html.find("</svg>", start) - start);
    EXPECT_EQ(count(chart, "class='bar-compute'"), 3u);
    EXPECT_EQ(count(chart, "class='bar-exposed'"), 3u);
    EXPECT_EQ(count(chart, "class='bar-hidden'"), 3u);
    // One scale: the longest of compute + exposed, comm and the step is 6.0 s (the baseline's
    // step) over 720 - 150 - 20 px; hidden = comm - exposed.
    const double px = 550.0 / 6.0;
    for (const RunTimes& r : runs) {
        const double hidden = r.comm - r.exposed;
        EXPECT_NE(chart.find(fmt::format("<title>{}: hidden communication {:.3f} s</title>", r.name,
                                         hidden)),
                  std::string::npos)
            << r.name;
        EXPECT_NE(chart.find(fmt::format("width='{:.2f}' height='10'", hidden * px)),
                  std::string::npos)
            << r.name;
        EXPECT_NE(
            chart.find(fmt::format("width='{:.2f}' height='18' fill='#d62728'", r.exposed * px)),
            std::string::npos)
            << r.name;
        EXPECT_NE(chart.find(fmt::format("compute {:.3f} s + exposed {:.3f} s; hidden {:.3f} s; "
                                         "step {:.3f} s",
                                         r.compute, r.exposed, hidden, r.step)),
                  std::string::npos)
            << r.name;
    }
    // Exposed longer than the comm stream's busy time (waits for a late peer count as exposed)
    // hides nothing, rather than a negative bar.
    nlohmann::json m = metrics_doc(runs, 4);
    m["runs"][0]["exposed_comm_s"] = 3.5;
    EXPECT_NE(report_html(m, kNoTrace).find("baseline: hidden communication 0.000 s"),
              std::string::npos);
}

TEST(Report, LossPlotMarksEveryStepAndItsLegendSitsOutsideThePlot) {
    for (int steps : {1, 3, 5}) {
        const std::string html = report_html(metrics_doc(three_runs(), steps), kNoTrace);
        const size_t plot = html.find("id='loss-plot'");
        ASSERT_NE(plot, std::string::npos);
        const size_t plot_end = html.find("</svg>", plot);
        const std::string svg = html.substr(plot, plot_end - plot);
        // A ring per run and step, and every step labelled on the axis.
        EXPECT_EQ(count(svg, "class='loss-point'"), static_cast<size_t>(3 * steps)) << steps;
        for (int s = 1; s <= steps; ++s)
            EXPECT_NE(svg.find(fmt::format("class='tick'>{}</text>", s)), std::string::npos) << s;
        // Nothing of the plot lies outside its width: the legend is HTML after it, naming
        // every run.
        EXPECT_EQ(svg.find("overlap+delay_wgrad</text>"), std::string::npos);
        const size_t legend = html.find("id='loss-legend'");
        ASSERT_NE(legend, std::string::npos);
        EXPECT_GT(legend, plot_end);
        const std::string entries = html.substr(legend, html.find("</p>", legend) - legend);
        for (const char* name : {"baseline", "overlap", "overlap+delay_wgrad"})
            EXPECT_NE(entries.find(std::string("</svg> ") + name + "</span>"), std::string::npos)
                << name;
        std::smatch cx;
        std::string rest = svg;
        while (std::regex_search(rest, cx, std::regex("cx='([0-9.]+)'"))) {
            const double x = std::stod(cx[1].str());
            EXPECT_GT(x, 70.0);
            EXPECT_LT(x, 700.0);
            rest = cx.suffix();
        }
    }
}

// A configuration that overlaps its shared expert runs it so in the baseline only (EP overlap
// excludes it): the table says which rows ran it and which did not; nothing when all agree.
TEST(Report, TableSaysWhichRowsRanSharedExpertOverlap) {
    nlohmann::json m = metrics_doc(three_runs(), 3);
    EXPECT_EQ(format_table(m).find("shared-expert overlap"), std::string::npos);
    m["runs"][0]["moe_shared_expert_overlap"] = true;
    m["runs"][1]["moe_shared_expert_overlap"] = false;
    m["runs"][2]["moe_shared_expert_overlap"] = false;
    EXPECT_NE(format_table(m).find("note: shared-expert overlap (model.moe_shared_expert_overlap) "
                                   "ran in baseline and was turned off in overlap, "
                                   "overlap+delay_wgrad: EP overlap excludes it"),
              std::string::npos)
        << format_table(m);
}

TEST(Report, EverySectionHasItsId) {
    const std::string html = report_html(metrics_doc(three_runs(), 4), kNoTrace);
    for (const char* id : {"id='run'", "id='summary'", "id='communication'", "id='loss'",
                           "id='timelines'", "id='comm-chart'", "id='loss-plot'"})
        EXPECT_NE(html.find(id), std::string::npos) << id;
    EXPECT_EQ(html.find("<script"), std::string::npos);
}

}  // namespace
}  // namespace epo::bench
