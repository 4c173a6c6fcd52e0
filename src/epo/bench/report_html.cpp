// report.html: one self-contained page (inline CSS and SVG; no script, no network) from
// metrics.json and trace.json. See bench_report.h for what it shows. Every section has an id
// (run, summary, warnings, communication, inter-node, loss, timelines) that the browser test
// (tests/bench/report_browser_test.sh) looks for.
#include <algorithm>
#include <limits>
#include <map>

#include "epo/bench/bench_report.h"
#include "epo/bench/trust.h"

namespace epo::bench {
namespace {

std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&quot;";
                break;
            case '\'':  // the page quotes its attributes with '
                out += "&#39;";
                break;
            default:
                out += c;
        }
    }
    return out;
}

const char* const kRunColors[] = {"#444444", "#1f77b4", "#d62728", "#2ca02c"};
const char* const kRunDashes[] = {"", "8 4", "2 3", "12 3 2 3"};
const char* const kComputeColor = "#2ca02c";
const char* const kExposedColor = "#d62728";
const char* const kHiddenColor = "#1f77b4";

// Colour of a slice by the node it ran ("mlp.forward" -> mlp).
const char* node_color(const std::string& node) {
    static const std::map<std::string, const char*> colors = {
        {"embedding", "#9467bd"},   {"pre_dispatch", "#1f77b4"}, {"dispatch", "#ff7f0e"},
        {"mlp", "#2ca02c"},         {"combine", "#d62728"},      {"output", "#8c564b"},
        {"grad_reduce", "#17becf"}, {"param_gather", "#e377c2"}, {"optimizer_step", "#7f7f7f"}};
    const std::string head = node.substr(0, node.find('.'));
    const auto it = colors.find(head);
    return it == colors.end() ? "#bcbd22" : it->second;
}

// The loss per step of every run: lines with a marker at every step, so that a run of a handful
// of steps still reads (each run's marker a size smaller than the one before, so identical
// trajectories, which lie on top of each other, stay visible as nested rings); the legend is
// HTML below the plot, never clipped by it.
std::string loss_svg(const nlohmann::json& runs) {
    constexpr double kW = 720, kH = 280, kL = 70, kR = 20, kT = 15, kB = 35;
    double lo = std::numeric_limits<double>::max(), hi = std::numeric_limits<double>::lowest();
    size_t steps = 0;
    for (const auto& r : runs) {
        for (double v : r.at("losses")) {
            lo = std::min(lo, v);
            hi = std::max(hi, v);
        }
        steps = std::max(steps, r.at("losses").size());
    }
    if (steps == 0) {
        return "<p>No losses recorded.</p>";
    }
    if (hi - lo < 1e-9) {
        lo -= 0.5;
        hi += 0.5;
    }
    // A margin of half a step either side, so the first and last markers sit inside the axes.
    const auto x = [&](size_t i) {
        return kL + (kW - kL - kR) * (static_cast<double>(i) + 0.5) / static_cast<double>(steps);
    };
    const auto y = [&](double v) { return kT + (kH - kT - kB) * (hi - v) / (hi - lo); };
    std::string svg = fmt::format(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' class='plot' "
        "id='loss-plot'>\n",
        kW, kH);
    svg += fmt::format("<line x1='{}' y1='{}' x2='{}' y2='{}' stroke='#000'/>", kL, kH - kB,
                       kW - kR, kH - kB);
    svg +=
        fmt::format("<line x1='{}' y1='{}' x2='{}' y2='{}' stroke='#000'/>\n", kL, kT, kL, kH - kB);
    for (int t = 0; t <= 4; ++t) {
        const double v = lo + (hi - lo) * t / 4;
        svg += fmt::format("<text x='{}' y='{}' text-anchor='end' class='tick'>{:.4f}</text>",
                           kL - 4, y(v) + 4, v);
    }
    // Every step labelled up to 20 steps, then every k-th.
    const size_t every = std::max<size_t>(1, (steps + 19) / 20);
    for (size_t i = 0; i < steps; i += every) {
        svg += fmt::format("<text x='{:.1f}' y='{}' text-anchor='middle' class='tick'>{}</text>",
                           x(i), kH - kB + 15, i + 1);
    }
    svg += fmt::format("<text x='{}' y='{}' text-anchor='middle'>step</text>\n", (kL + kW - kR) / 2,
                       kH - 3);
    std::string legend = "<p class='legend' id='loss-legend'>";
    size_t k = 0;
    for (const auto& r : runs) {
        std::string points, markers;
        const auto& losses = r.at("losses");
        const size_t c = k % 4;
        const double radius = std::max(1.5, 6.0 - 1.5 * static_cast<double>(k));
        for (size_t i = 0; i < losses.size(); ++i) {
            const double v = losses[i].get<double>();
            points += fmt::format("{:.1f},{:.1f} ", x(i), y(v));
            markers += fmt::format(
                "<circle cx='{:.1f}' cy='{:.1f}' r='{}' fill='none' stroke='{}' "
                "stroke-width='1.5' class='loss-point'><title>{} step {}: {:.6f}</title>"
                "</circle>",
                x(i), y(v), radius, kRunColors[c], escape(r.at("name")), i + 1, v);
        }
        svg += fmt::format(
            "<polyline fill='none' stroke='{}' stroke-width='2' stroke-dasharray='{}' "
            "points='{}'><title>{}</title></polyline>\n{}\n",
            kRunColors[c], kRunDashes[c], points, escape(r.at("name")), markers);
        legend += fmt::format(
            "<span class='entry'><svg xmlns='http://www.w3.org/2000/svg' width='44' height='14'>"
            "<line x1='2' y1='7' x2='42' y2='7' stroke='{}' stroke-width='2' "
            "stroke-dasharray='{}'/><circle cx='22' cy='7' r='{}' fill='#fff' stroke='{}' "
            "stroke-width='1.5'/></svg> {}</span>",
            kRunColors[c], kRunDashes[c], radius, kRunColors[c], escape(r.at("name")));
        ++k;
    }
    return svg + "</svg>\n" + legend + "</p>\n";
}

// Per schedule, the compute stream's time as compute then exposed communication (the compute
// stream waiting for the comm stream), and under it the communication the schedule hid: the
// comm stream's busy time less the exposed part. Medians over the measured steps (of the largest
// rank), so the three need not add up to the step time, which is marked.
std::string comm_chart_svg(const nlohmann::json& runs) {
    constexpr double kW = 720, kL = 150, kR = 20, kRow = 52, kT = 10, kAxis = 30;
    const double h = kT + kRow * static_cast<double>(runs.size()) + kAxis;
    double scale = 0;
    for (const auto& r : runs) {
        const double compute = r.at("compute_s").get<double>();
        const double exposed = r.at("exposed_comm_s").get<double>();
        scale = std::max({scale, compute + exposed, r.at("comm_s").get<double>(),
                          r.at("step_time_s").at("median").get<double>()});
    }
    if (scale <= 0)
        return "<p>No stream times recorded.</p>";
    const double px = (kW - kL - kR) / scale;
    std::string svg = fmt::format(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' class='plot' "
        "id='comm-chart'>\n",
        kW, h);
    double top = kT;
    for (const auto& r : runs) {
        const double compute = r.at("compute_s").get<double>();
        const double exposed = r.at("exposed_comm_s").get<double>();
        const double hidden = std::max(0.0, r.at("comm_s").get<double>() - exposed);
        const double step = r.at("step_time_s").at("median").get<double>();
        const std::string name = escape(r.at("name"));
        svg += fmt::format("<text x='4' y='{}' class='lane'>{}</text>", top + 15, name);
        svg += fmt::format(
            "<rect x='{}' y='{}' width='{:.2f}' height='18' fill='{}' class='bar-compute'>"
            "<title>{}: compute {:.3f} s</title></rect>",
            kL, top + 2, compute * px, kComputeColor, name, compute);
        svg += fmt::format(
            "<rect x='{:.2f}' y='{}' width='{:.2f}' height='18' fill='{}' class='bar-exposed'>"
            "<title>{}: exposed communication {:.3f} s</title></rect>",
            kL + compute * px, top + 2, exposed * px, kExposedColor, name, exposed);
        svg += fmt::format(
            "<rect x='{}' y='{}' width='{:.2f}' height='10' fill='{}' class='bar-hidden'>"
            "<title>{}: hidden communication {:.3f} s</title></rect>",
            kL, top + 22, hidden * px, kHiddenColor, name, hidden);
        svg += fmt::format(
            "<line x1='{:.2f}' y1='{}' x2='{:.2f}' y2='{}' stroke='#000' stroke-width='2'>"
            "<title>{}: step time {:.3f} s (median)</title></line>",
            kL + step * px, top, kL + step * px, top + 34, name, step);
        svg += fmt::format(
            "<text x='{}' y='{}' class='tick'>compute {:.3f} s + exposed {:.3f} s; hidden "
            "{:.3f} s; step {:.3f} s</text>\n",
            kL, top + 45, compute, exposed, hidden, step);
        top += kRow;
    }
    for (int t = 0; t <= 5; ++t) {
        const double v = scale * t / 5;
        svg +=
            fmt::format("<text x='{:.1f}' y='{}' text-anchor='middle' class='tick'>{:.2f} s</text>",
                        kL + v * px, h - 8, v);
    }
    svg += "</svg>\n";
    svg += fmt::format(
        "<p class='legend' id='comm-legend'><span style='background:{}'>&nbsp;&nbsp;&nbsp;</span> "
        "compute (compute stream busy) &nbsp; <span style='background:{}'>&nbsp;&nbsp;&nbsp;"
        "</span> exposed communication (compute stream waiting for the comm stream) &nbsp; "
        "<span style='background:{}'>&nbsp;&nbsp;&nbsp;</span> hidden communication (comm "
        "stream busy while compute ran: its busy time less the exposed part) &nbsp; "
        "<b>|</b> step time (median)</p>\n",
        kComputeColor, kExposedColor, kHiddenColor);
    return svg;
}

struct Slice {
    std::string name, node, cat;
    int tid = 0;
    double ts = 0, dur = 0;
};

struct Process {
    std::string name;
    std::vector<Slice> slices;
};

std::map<int, Process> processes_of(const nlohmann::json& trace) {
    std::map<int, Process> out;
    for (const auto& e : trace.at("traceEvents")) {
        const int pid = e.at("pid");
        if (e.at("ph") == "M" && e.at("name") == "process_name") {
            out[pid].name = e.at("args").at("name");
        } else if (e.at("ph") == "X") {
            const auto& args = e.value("args", nlohmann::json::object());
            out[pid].slices.push_back({e.at("name"), args.value("node", ""), e.value("cat", ""),
                                       e.at("tid"), e.at("ts"), e.at("dur")});
        }
    }
    return out;
}

std::string timeline_svg(const std::vector<const Process*>& ranks, double t0, double scale_us) {
    constexpr double kW = 960, kL = 120, kLane = 20, kGap = 6;
    const double lanes = 2.0 * static_cast<double>(ranks.size());
    const double h = lanes * kLane + static_cast<double>(ranks.size()) * kGap + 25;
    std::string svg = fmt::format(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' class='plot'>\n", kW, h);
    const double px_per_us = (kW - kL - 10) / scale_us;
    for (size_t r = 0; r < ranks.size(); ++r) {
        const double base = static_cast<double>(r) * (2 * kLane + kGap);
        const std::string rank_label = ranks[r]->name.substr(ranks[r]->name.rfind("rank"));
        for (int tid = 0; tid < 2; ++tid) {
            svg += fmt::format("<text x='4' y='{}' class='lane'>{} {}</text>",
                               base + tid * kLane + 14, rank_label, tid == 0 ? "compute" : "comm");
            svg += fmt::format("<rect x='{}' y='{}' width='{}' height='{}' fill='#f4f4f4'/>\n", kL,
                               base + tid * kLane + 1, kW - kL - 10, kLane - 2);
        }
        for (const Slice& s : ranks[r]->slices) {
            if (s.tid > 1) {
                continue;
            }
            const bool wait = s.cat == "wait";
            const double x = kL + (s.ts - t0) * px_per_us;
            const double w = std::max(0.5, s.dur * px_per_us);
            const double y = base + s.tid * kLane + (wait ? 8 : 2);
            svg += fmt::format(
                "<rect x='{:.2f}' y='{:.1f}' width='{:.2f}' height='{}' fill='{}'{}><title>{} "
                "({:.2f} ms)</title></rect>\n",
                x, y, w, wait ? 4 : kLane - 4, wait ? "#bbbbbb" : node_color(s.node),
                wait ? "" : " stroke='#fff' stroke-width='0.3'", escape(s.name), s.dur / 1e3);
        }
    }
    const double axis_y = h - 8;
    for (int t = 0; t <= 5; ++t) {
        const double us = scale_us * t / 5;
        // The last label ends at the axis' end (centred there, it was cut by the plot's edge).
        svg += fmt::format("<text x='{:.1f}' y='{}' text-anchor='{}' class='tick'>{:.0f} ms</text>",
                           kL + us * px_per_us, axis_y, t == 5 ? "end" : "middle", us / 1e3);
    }
    return svg + "</svg>\n";
}

std::string timelines(const nlohmann::json& metrics, const nlohmann::json& trace) {
    const std::map<int, Process> procs = processes_of(trace);
    struct Group {
        std::string name;
        std::vector<const Process*> ranks;
        double t0 = 0, t1 = 0;
    };
    std::vector<Group> groups;
    double scale = 1;
    for (const auto& r : metrics.at("runs")) {
        // The span is this schedule's own first start to last end (t1 started at 0 once, so a
        // trace with negative timestamps headed a 9 s step "64429.9 ms").
        Group g{r.at("name"),
                {},
                std::numeric_limits<double>::max(),
                std::numeric_limits<double>::lowest()};
        for (const auto& [pid, p] : procs) {
            if (p.name.rfind(g.name + " rank ", 0) != 0) {
                continue;
            }
            g.ranks.push_back(&p);
            for (const Slice& s : p.slices) {
                g.t0 = std::min(g.t0, s.ts);
                g.t1 = std::max(g.t1, s.ts + s.dur);
            }
        }
        if (g.ranks.empty() || g.t1 < g.t0) {
            continue;
        }
        scale = std::max(scale, g.t1 - g.t0);
        groups.push_back(std::move(g));
    }
    std::string html;
    for (const Group& g : groups) {
        html += fmt::format("<h3>{}: {:.1f} ms</h3>\n", escape(g.name), (g.t1 - g.t0) / 1e3);
        html += timeline_svg(g.ranks, g.t0, scale);
    }
    html += "<p class='legend'>";
    for (const char* node : {"embedding", "pre_dispatch", "dispatch", "mlp", "combine", "output",
                             "grad_reduce", "param_gather", "optimizer_step"}) {
        html += fmt::format("<span style='background:{}'>&nbsp;&nbsp;&nbsp;</span> {} &nbsp; ",
                            node_color(node), node);
    }
    html +=
        "<span style='background:#bbbbbb'>&nbsp;&nbsp;&nbsp;</span> stream waiting on the "
        "other stream (exposed communication on the compute track)</p>\n";
    return html;
}

std::string summary_table(const nlohmann::json& m) {
    std::string t =
        "<table class='summary'><tr><th>schedule</th><th>step time s<br>median [min, "
        "max]</th><th>tokens/s</th>"
        "<th>TFLOP/s<br>per rank</th><th>compute s</th><th>comm s</th><th>exposed comm s</th>"
        "<th>speedup</th><th>overlap<br>efficiency</th><th>critical-path<br>bound s</th>"
        "<th>peak RSS<br>GiB</th><th>peak activations<br>MiB</th><th>losses</th></tr>\n";
    const auto opt = [](const nlohmann::json& v, const char* spec) {
        return v.is_null() ? std::string("-") : fmt::format(fmt::runtime(spec), v.get<double>());
    };
    for (const auto& r : m.at("runs")) {
        const auto& st = r.at("step_time_s");
        const std::string name = r.at("name");
        t += fmt::format(
            "<tr><td>{}</td><td>{:.3f} [{:.3f}, {:.3f}]</td><td>{:.0f}</td><td>{:.3g}</td>"
            "<td>{:.3f}</td><td>{:.3f}</td><td>{:.3f}</td><td>{}</td><td>{}</td><td>{}</td>"
            "<td>{:.2f}</td><td>{:.1f}</td><td>{}</td></tr>\n",
            escape(name), st.at("median").get<double>(), st.at("min").get<double>(),
            st.at("max").get<double>(), r.at("tokens_per_s").get<double>(),
            r.at("tflops_per_rank").get<double>(), r.at("compute_s").get<double>(),
            r.at("comm_s").get<double>(), r.at("exposed_comm_s").get<double>(),
            opt(r.at("speedup_vs_baseline"), "{:.2f}x"),
            format_efficiency(r.at("overlap_efficiency")),
            opt(r.at("critical_path_bound_s"), "{:.3f}"),
            r.at("peak_rss_bytes").get<double>() / (1024.0 * 1024 * 1024),
            r.at("peak_activation_bytes").get<double>() / (1024.0 * 1024),
            name == "baseline" ? "reference"
            : r.at("losses_match_baseline").get<bool>() &&
                    r.at("grad_norms_match_baseline").get<bool>() &&
                    r.at("params_match_baseline").get<bool>()
                ? "bit-identical"
                : "<b>different</b>: " + escape(r.at("baseline_differences")));
    }
    return t + "</table>\n";
}

// The header's table: how the run was made (metrics.json `run`) and the options that explain
// its result (`schedule_options`); documents written before these existed show what they have.
std::string run_table(const nlohmann::json& m) {
    std::string t = "<table class='run' id='run-info'>\n";
    const auto row = [&t](const char* name, const std::string& value) {
        t += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", name, value);
    };
    const auto text = [](const nlohmann::json& doc, const char* key) {
        const auto it = doc.find(key);
        return it == doc.end() || it->is_null()
                   ? std::string("not recorded")
                   : escape(it->is_string() ? it->get<std::string>() : it->dump());
    };
    if (const auto run = m.find("run"); run != m.end()) {
        row("command", "<code>" + text(*run, "command_line") + "</code>");
        row("commit", text(*run, "commit") + " (epo " + text(*run, "epo_version") + ")");
        row("host", text(*run, "host"));
        row("CPU",
            fmt::format("{}; AVX-512 bf16: {}, AMX: {}; features: {}", text(*run, "cpu_model"),
                        run->value("avx512_bf16", false) ? "yes" : "no",
                        run->value("amx_bf16", false) ? "yes" : "no", text(*run, "cpu_features")));
        row("date (UTC)", text(*run, "date_utc"));
    }
    row("ranks",
        fmt::format("{} ({} nodes x {}), expert parallel {}", m.at("world_size").get<int>(),
                    m.at("num_nodes").get<int>(), m.at("gpus_per_node").get<int>(),
                    m.at("expert_model_parallel_size").get<int>()));
    if (const auto o = m.find("schedule_options"); o != m.end()) {
        std::string schedules;
        for (const auto& n : o->at("schedules"))
            schedules += (schedules.empty() ? "" : ", ") + escape(n.get<std::string>());
        row("schedules", schedules);
        row("overlap (subject run)",
            fmt::format("overlap_moe_expert_parallel_comm {}, delay_wgrad_compute {}",
                        o->at("overlap_moe_expert_parallel_comm").get<bool>(),
                        o->at("delay_wgrad_compute").get<bool>()));
        const std::string dispatcher = o->at("dispatcher");
        row("dispatcher",
            o->at("flex_backend").is_null()
                ? escape(dispatcher)
                : escape(dispatcher + " (" + o->at("flex_backend").get<std::string>() + ")"));
        const int chunks = o->at("num_chunks").get<int>();
        row("overlap chunks", chunks > 1 ? fmt::format("{} by experts", chunks) : "1 (none)");
        row("paired edges", o->at("pair_edges").get<bool>() ? "on" : "off");
        const auto& vpp = o->at("virtual_pipeline_model_parallel_size");
        row("pipeline",
            fmt::format("PP {}, VPP {}", o->at("pipeline_model_parallel_size").get<int>(),
                        vpp.is_null() ? std::string("none") : vpp.dump()));
        row("micro-batches", fmt::format("{} of size {} per step (global batch {}, sequence {})",
                                         o->at("num_micro_batches").get<int64_t>(),
                                         o->at("micro_batch_size").get<int64_t>(),
                                         m.at("global_batch_size").get<int64_t>(),
                                         m.at("seq_length").get<int64_t>()));
    } else {
        row("micro-batches", fmt::format("{} (global batch {}, sequence {})",
                                         m.at("num_micro_batches").get<int64_t>(),
                                         m.at("global_batch_size").get<int64_t>(),
                                         m.at("seq_length").get<int64_t>()));
    }
    row("link", escape(link_label(m.at("link"))) +
                    (m.at("calibration").is_null()
                         ? std::string()
                         : fmt::format(" (calibrated so the baseline's communication is {} x its "
                                       "compute)",
                                       m.at("calibration").at("target_ratio").get<double>())));
    row("steps",
        fmt::format("{} per run ({} warm-up), {} repeat(s)", m.at("steps_per_run").get<int64_t>(),
                    m.at("warmup_steps").get<int>(), m.at("repeats").get<int>()));
    return t + "</table>\n";
}

}  // namespace

std::string report_html(const nlohmann::json& m, const nlohmann::json& trace) {
    std::string html =
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>\n<title>epo bench: " +
        escape(m.at("model")) +
        "</title>\n<style>body{font-family:sans-serif;margin:2em;max-width:1100px}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right}td:first-child{text-align:left}.plot{border:1px solid #ddd}"
        "table.run th{text-align:left;background:#f4f4f4}table.run td{text-align:left}"
        "table.summary{font-size:12px}"
        ".tick{font-size:10px}.lane{font-size:11px}.legend{font-size:12px}"
        ".legend .entry{margin-right:1.5em;white-space:nowrap}"
        ".legend svg{vertical-align:middle}</style>\n"
        "</head><body>\n";
    html += "<h1>epo bench: " + escape(m.at("model")) + "</h1>\n";
    html += "<h2 id='run'>Run</h2>\n" + run_table(m);
    html += "<h2 id='summary'>Summary</h2>\n" + summary_table(m);
    const auto opt = [](const nlohmann::json& v, const char* spec) {
        return v.is_null() ? std::string("-") : fmt::format(fmt::runtime(spec), v.get<double>());
    };
    html += fmt::format(
        "<p><b>Overlap speedup {}</b> (baseline over overlap, median step times); overlap "
        "efficiency {} against the critical-path bound; losses, grad norms and final parameters "
        "bit-identical: <b>{}</b>.</p>\n",
        opt(m.at("overlap_speedup"), "{:.2f}x"), format_efficiency(m.at("overlap_efficiency")),
        m.at("bitwise_identical").get<bool>() ? "yes" : "NO");
    // What the speedups above cannot be trusted for (trust.h), where the reader looks first.
    if (const auto flags = trust_flags(m); !flags.empty()) {
        html += "<h2 id='warnings'>Warnings</h2>\n<ul class='warnings'>\n";
        for (const TrustFlag& f : flags)
            html += fmt::format("<li><b>{}</b>{}: {}</li>\n", escape(f.id),
                                f.fatal ? " (speedup not usable)" : "", escape(f.message));
        html += "</ul>\n";
    }
    html +=
        "<h2 id='communication'>Compute, hidden and exposed communication</h2>\n<p>Per schedule: "
        "the compute stream's busy time and its waits for the communication stream (exposed), "
        "and below them the communication that ran while compute did (hidden). Medians over "
        "the measured steps of the slowest rank.</p>\n" +
        comm_chart_svg(m.at("runs"));
    if (const std::string inter = format_inter_node(m); !inter.empty()) {
        html += "<h2 id='inter-node'>Inter-node traffic (flex)</h2>\n<pre>" + escape(inter) +
                "</pre>\n";
    }
    html +=
        "<h2 id='loss'>Loss per step</h2>\n<p>Every run's training loss (first repeat), a ring "
        "at every step; identical trajectories lie on top of each other, as nested rings.</p>\n" +
        loss_svg(m.at("runs"));
    html +=
        "<h2 id='timelines'>One measured step of each schedule</h2>\n<p>Both streams of every "
        "rank, one time scale for all schedules. Hover a slice for its node, layer and "
        "micro-batch.</p>\n" +
        timelines(m, trace);
    return html + "</body></html>\n";
}

}  // namespace epo::bench
