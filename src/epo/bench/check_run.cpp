#include "epo/bench/check_run.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "epo/bench/bench_run.h"
#include "epo/bench/metrics.h"
#include "epo/bench/trust.h"
#include "epo/config/validate.h"
#include "epo/config/yaml_io.h"
#include "epo/core/error.h"

namespace epo::bench {
namespace {

std::string read_all(const std::filesystem::path& path) {
    std::ifstream in(path);
    if (!in) {
        return {};
    }
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

int count_of(const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) {
        ++n;
    }
    return n;
}

// The first field check-run reads that is missing or of the wrong type, as
// "runs[1].step_time_s.median is a string, expected a number"; "" when every one is right.
std::string shape_problem(const nlohmann::json& m) {
    using Type = nlohmann::json::value_t;
    const auto kind = [](const nlohmann::json& v) -> std::string {
        return v.is_number() ? "a number" : std::string("a ") + v.type_name();
    };
    const auto need = [&](const nlohmann::json& parent, const std::string& at, const char* key,
                          const char* expected, auto&& ok) -> std::string {
        const auto it = parent.find(key);
        if (it == parent.end())
            return fmt::format("{}{} is missing", at, key);
        if (!ok(*it))
            return fmt::format("{}{} is {}, expected {}", at, key, kind(*it), expected);
        return "";
    };
    const auto number = [](const nlohmann::json& v) { return v.is_number(); };
    const auto integer = [](const nlohmann::json& v) { return v.is_number_integer(); };
    const auto numbers = [](const nlohmann::json& v) {
        if (!v.is_array())
            return false;
        for (const auto& x : v) {
            if (!x.is_number())
                return false;
        }
        return true;
    };
    for (const auto& [key, expected, ok] :
         {std::tuple<const char*, const char*, std::function<bool(const nlohmann::json&)>>{
              "completed", "true or false", [](const nlohmann::json& v) { return v.is_boolean(); }},
          {"world_size", "an integer", integer},
          {"steps_per_run", "an integer", integer}}) {
        if (std::string p = need(m, "", key, expected, ok); !p.empty())
            return p;
    }
    for (size_t i = 0; i < m.at("runs").size(); ++i) {
        const nlohmann::json& r = m.at("runs")[i];
        const std::string at = fmt::format("runs[{}].", i);
        if (!r.is_object())
            return fmt::format("runs[{}] is {}, expected an object", i, kind(r));
        std::string p =
            need(r, at, "name", "a string", [](const nlohmann::json& v) { return v.is_string(); });
        if (p.empty())
            p = need(r, at, "step_time_s", "an object",
                     [](const nlohmann::json& v) { return v.type() == Type::object; });
        for (const char* stat : {"median", "min", "max"}) {
            if (p.empty())
                p = need(r.at("step_time_s"), at + "step_time_s.", stat, "a number", number);
        }
        for (const char* key : {"step_times_s", "losses", "grad_norms"}) {
            if (p.empty())
                p = need(r, at, key, "an array of numbers", numbers);
        }
        for (const char* key : {"steps_planned", "steps_completed"}) {
            if (p.empty())
                p = need(r, at, key, "an integer", integer);
        }
        if (!p.empty())
            return p;
    }
    return "";
}

struct RunDir {
    std::filesystem::path dir;
    nlohmann::json metrics;  // null if missing or malformed
    std::string metrics_problem;
    std::string rank0_log;
};

Criterion finalized(const RunDir& d, std::optional<config::Config>& cfg) {
    Criterion c{"configuration finalized without errors", false, ""};
    try {
        cfg = config::config_from_yaml(config::read_text_file(d.dir / "config.yaml"),
                                       {(d.dir / "config.yaml").string()});
    } catch (const Error& e) {
        c.detail = fmt::format("config.yaml does not load: {}", e.what());
        return c;
    }
    const config::ValidationReport report = config::validate_for_run(*cfg);
    if (!report.ok()) {
        c.detail = fmt::format("config.yaml fails validation with {} error(s), first {}: {}",
                               report.errors.size(), report.errors[0].id, report.errors[0].message);
        return c;
    }
    const int runs = d.metrics.is_object() ? static_cast<int>(d.metrics["runs"].size()) : 1;
    const int ok = count_of(d.rank0_log, "# epo: configuration finalized, no error");
    const int bad = count_of(d.rank0_log, "# epo: configuration finalized with");
    if (ok < runs || bad > 0) {
        c.detail = fmt::format(
            "logs/rank-0.log has {} clean finalization(s) for {} run(s) and "
            "{} with errors",
            ok, runs, bad);
        return c;
    }
    c.pass = true;
    c.detail = fmt::format("config.yaml valid; {} run(s) logged as finalized with no error", ok);
    return c;
}

Criterion overlap_flags(const RunDir& d, const std::optional<config::Config>& cfg) {
    Criterion c{"overlap flags true in the logged config", false, ""};
    if (!cfg) {
        c.detail = "no loadable config.yaml";
        return c;
    }
    const bool yaml_ok =
        cfg->model.overlap_moe_expert_parallel_comm && cfg->model.delay_wgrad_compute;
    const bool log_ok = count_of(d.rank0_log, "overlap_moe_expert_parallel_comm: true") > 0 &&
                        count_of(d.rank0_log, "delay_wgrad_compute: true") > 0;
    c.pass = yaml_ok && log_ok;
    c.detail = fmt::format(
        "config.yaml: overlap_moe_expert_parallel_comm={}, "
        "delay_wgrad_compute={}; rank-0 log {}",
        cfg->model.overlap_moe_expert_parallel_comm, cfg->model.delay_wgrad_compute,
        log_ok ? "shows both true" : "does not show both true");
    return c;
}

Criterion flex_logged(const RunDir& d, const std::optional<config::Config>& cfg) {
    Criterion c{"dispatcher type and backend logged when flex is used", false, ""};
    if (!cfg) {
        c.detail = "no loadable config.yaml";
        return c;
    }
    if (cfg->model.moe_token_dispatcher_type != config::DispatcherType::kFlex) {
        c.pass = true;
        c.detail = "flex not used";
        return c;
    }
    c.pass = count_of(d.rank0_log, "moe_token_dispatcher_type: flex") > 0 &&
             (count_of(d.rank0_log, "moe_flex_dispatcher_backend: deepep") > 0 ||
              count_of(d.rank0_log, "moe_flex_dispatcher_backend: hybridep") > 0);
    c.detail = c.pass ? "logged" : "flex in config.yaml but type/backend missing from the log";
    return c;
}

Criterion steps_completed(const RunDir& d) {
    Criterion c{"every step completed", false, ""};
    if (!d.metrics.is_object()) {
        c.detail = d.metrics_problem;
        return c;
    }
    const int64_t per_run = d.metrics.value("steps_per_run", int64_t{0});
    for (const auto& r : d.metrics["runs"]) {
        const int64_t planned = r.value("steps_planned", int64_t{-1});
        const int64_t done = r.value("steps_completed", int64_t{-2});
        const auto& losses = r["losses"];
        bool finite = losses.is_array() && static_cast<int64_t>(losses.size()) == per_run;
        if (finite) {
            for (const auto& l : losses) {
                finite = finite && l.is_number() && std::isfinite(l.get<double>());
            }
        }
        if (planned <= 0 || done != planned || !finite) {
            c.detail = fmt::format("run {}: {} of {} steps, {} losses for {} steps per run{}",
                                   r.value("name", "?"), done, planned,
                                   losses.is_array() ? losses.size() : 0, per_run,
                                   finite ? "" : " (missing or not finite)");
            return c;
        }
    }
    c.pass = !d.metrics["runs"].empty();
    c.detail =
        c.pass ? fmt::format("{} run(s) x {} steps", d.metrics["runs"].size(), per_run) : "no runs";
    return c;
}

Criterion no_hang(const RunDir& d) {
    Criterion c{"no hang", false, ""};
    if (!d.metrics.is_object() || !d.metrics.value("completed", false)) {
        c.detail =
            d.metrics.is_object() ? "metrics.json does not say completed" : d.metrics_problem;
        return c;
    }
    const int world = d.metrics.value("world_size", 0);
    for (int r = 0; r < world; ++r) {
        const std::string log = read_all(d.dir / "logs" / fmt::format("rank-{}.log", r));
        if (log.find(fmt::format("rank {} done:", r)) == std::string::npos) {
            c.detail = fmt::format("logs/rank-{}.log does not end with rank {} done", r, r);
            return c;
        }
    }
    c.pass = world > 0;
    c.detail = fmt::format("all {} ranks finished in {:.1f} s", world,
                           d.metrics.value("wall_time_s", 0.0));
    return c;
}

const nlohmann::json* find_run(const nlohmann::json& m, const std::string& name) {
    for (const auto& r : m["runs"]) {
        if (r.value("name", "") == name) {
            return &r;
        }
    }
    return nullptr;
}

// The baseline run of d's metrics.json, or nullptr with c.detail saying why there is none.
const nlohmann::json* baseline_or_explain(const RunDir& d, Criterion& c) {
    if (!d.metrics.is_object()) {
        c.detail = d.metrics_problem;
        return nullptr;
    }
    const nlohmann::json* base = find_run(d.metrics, "baseline");
    if (!base) {
        c.detail = "no baseline run to compare with (run epo bench --compare)";
    }
    return base;
}

// A run's losses, grad norms and final-parameter checksum as metrics.json holds them (first
// repeat); what is missing or not a number stays empty, so it never matches.
RunBits bits_of(const nlohmann::json& run) {
    RunBits bits;
    for (const auto& [key, out] :
         {std::pair{"losses", &bits.losses}, std::pair{"grad_norms", &bits.grad_norms}}) {
        const auto it = run.find(key);
        if (it == run.end() || !it->is_array())
            continue;
        for (const auto& v : *it) {
            if (!v.is_number()) {
                out->clear();
                break;
            }
            out->push_back(v.get<double>());
        }
    }
    const auto it = run.find("param_checksum");
    if (it != run.end() && it->is_string())
        bits.param_checksum = it->get<std::string>();
    return bits;
}

Criterion throughput(const RunDir& d) {
    Criterion c{"throughput improved or not reduced", false, ""};
    const nlohmann::json* base = baseline_or_explain(d, c);
    if (!base) {
        return c;
    }
    // The medians of the step times the document holds, not its stored medians: a stored median
    // that disagrees with them fails the run (an edited or corrupt metrics.json).
    const auto median_of = [&](const nlohmann::json& r, double& t) {
        t = summarize(r.at("step_times_s").get<std::vector<double>>()).median;
        const double stored = r.at("step_time_s").at("median").get<double>();
        if (std::fabs(stored - t) > 1e-9 * std::max(1.0, std::fabs(t))) {
            c.detail = fmt::format(
                "run {}: the stored median step time {} s is not the median of its step times "
                "({} s): metrics.json was edited or is corrupt",
                r.at("name").get<std::string>(), stored, t);
            return false;
        }
        return true;
    };
    double t_base = 0;
    if (!median_of(*base, t_base))
        return c;
    std::string detail;
    bool pass = t_base > 0, any = false;
    for (const auto& r : d.metrics["runs"]) {
        if (r.value("name", "") == "baseline") {
            continue;
        }
        any = true;
        double t = 0;
        if (!median_of(r, t))
            return c;
        const bool ok = t > 0 && t <= t_base * (1 + kThroughputTolerance);
        pass = pass && ok;
        detail += fmt::format("{}{} {:.2f}x", detail.empty() ? "" : ", ", r.value("name", "?"),
                              t > 0 ? t_base / t : 0.0);
    }
    c.pass = pass && any;
    c.detail = any ? detail + fmt::format(" of the baseline's speed (at least {:.2f}x needed)",
                                          1 / (1 + kThroughputTolerance))
                   : "no overlap run";
    return c;
}

Criterion measured_not_claimed(const RunDir& d) {
    Criterion c{"speedups measured, not claimed", false, ""};
    if (!baseline_or_explain(d, c))
        return c;
    std::string fatal, warnings;
    for (const TrustFlag& f : trust_flags(d.metrics)) {
        (f.fatal ? fatal : warnings) += (f.fatal ? fatal : warnings).empty() ? "" : "; ";
        (f.fatal ? fatal : warnings) += f.message;
    }
    c.pass = fatal.empty();
    c.warning = c.pass && !warnings.empty();
    c.detail = !fatal.empty()      ? fatal
               : !warnings.empty() ? warnings
                                   : fmt::format(
                                         "every speedup within its schedule's cap, from "
                                         "at least {} steps of each run",
                                         kMinStepsPerRun);
    return c;
}

}  // namespace

Criterion identical_to_baseline(const nlohmann::json& metrics) {
    Criterion c{kIdenticalCriterion, false, ""};
    const nlohmann::json* base = metrics.is_object() ? find_run(metrics, "baseline") : nullptr;
    if (!base) {
        c.detail = "no baseline run to compare with (run epo bench --compare)";
        return c;
    }
    const RunBits reference = bits_of(*base);
    for (const auto& r : metrics["runs"]) {
        const std::string name = r.value("name", "?");
        const BitComparison cmp = compare_bits(reference, bits_of(r));
        if (!cmp.all()) {
            c.detail = fmt::format("run {} differs from the baseline in {}", name, cmp.differences);
            return c;
        }
        if (!r.value("repeats_identical", false)) {
            c.detail = fmt::format(
                "run {}: repeats gave different losses, grad norms or final parameters", name);
            return c;
        }
    }
    c.pass = true;
    c.detail = fmt::format(
        "{} run(s) bit-identical over {} steps (losses, grad norms) and in their final "
        "parameters ({})",
        metrics["runs"].size(), reference.losses.size(), reference.param_checksum);
    return c;
}

std::vector<Criterion> check_run_dir(const std::filesystem::path& dir) {
    RunDir d;
    d.dir = dir;
    const std::string text = read_all(dir / "metrics.json");
    if (text.empty()) {
        d.metrics_problem = fmt::format("no metrics.json in '{}'", dir.string());
    } else {
        d.metrics = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (!d.metrics.is_object() || !d.metrics["runs"].is_array()) {
            d.metrics = nullptr;
            d.metrics_problem = "metrics.json is malformed (not a JSON object with a runs array)";
        } else if (const std::string p = shape_problem(d.metrics); !p.empty()) {
            d.metrics = nullptr;
            d.metrics_problem = "metrics.json is malformed: " + p;
        }
    }
    // A run its user stopped (epo bench marks it): whatever it left is not a finished run.
    if (const std::string stopped = read_all(dir / kStoppedMarker); !stopped.empty()) {
        d.metrics = nullptr;
        d.metrics_problem = fmt::format("the run did not finish: {} says it was {}", kStoppedMarker,
                                        stopped.substr(0, stopped.find('\n')));
    }
    d.rank0_log = read_all(dir / "logs" / "rank-0.log");
    std::optional<config::Config> cfg;
    std::vector<Criterion> out;
    out.push_back(finalized(d, cfg));
    out.push_back(overlap_flags(d, cfg));
    out.push_back(flex_logged(d, cfg));
    out.push_back(steps_completed(d));
    out.push_back(no_hang(d));
    Criterion identical{kIdenticalCriterion, false, ""};
    if (!d.metrics.is_object())
        identical.detail = d.metrics_problem;
    else
        identical = identical_to_baseline(d.metrics);
    out.push_back(identical);
    out.push_back(throughput(d));
    out.push_back(measured_not_claimed(d));
    return out;
}

std::string format_verdicts(const std::vector<Criterion>& criteria) {
    std::string out;
    int failed = 0;
    for (const Criterion& c : criteria) {
        out += fmt::format("{}  {}: {}\n",
                           !c.pass     ? "FAIL"
                           : c.warning ? "WARN"
                                       : "PASS",
                           c.name, c.detail);
        failed += !c.pass;
    }
    out += failed == 0 ? "verdict: PASS (every criterion met)\n"
                       : fmt::format("verdict: FAIL ({} of {} criteria not met)\n", failed,
                                     criteria.size());
    return out;
}

}  // namespace epo::bench
