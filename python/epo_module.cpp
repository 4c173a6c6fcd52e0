// `import epo`: EPO's validator and planner for a Python launch script (a Megatron-Bridge script
// that checks its configuration before it submits a job). Configurations come as a dict
// (ConfigContainer.to_dict(), or EPO's own tree), a path to a YAML file, or YAML text; results
// come back as dicts with the keys of `epo validate --json` / `epo plan --json`. An error raises
// epo.Error (a ValueError) whose message is the CLI's. Not here: bench and train (they run MPI
// jobs; launch them with the `epo` command).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "epo/config/builder.h"
#include "epo/config/report.h"
#include "epo/config/validate.h"
#include "epo/core/error.h"
#include "epo/plan/cost_model.h"
#include "epo/plan/hardware.h"
#include "epo/plan/plan.h"
#include "epo/plan/plan_report.h"

namespace py = pybind11;

namespace {

// JSON text -> Python objects (and back) through Python's json module: the dicts a script gets
// are exactly the CLI's JSON.
py::object from_json(const nlohmann::ordered_json& j) {
    return py::module_::import("json").attr("loads")(
        j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

// A dict, a path (str or os.PathLike naming an existing file) or YAML text, as sources.
epo::config::ConfigSources sources_of(const py::object& config) {
    epo::config::ConfigSources s;
    if (py::isinstance<py::dict>(config)) {
        // JSON is YAML: the dict's JSON text is read like a file (Bridge's tags and all).
        s.config_text = py::module_::import("json")
                            .attr("dumps")(config, py::arg("default") =
                                                       py::module_::import("builtins").attr("str"))
                            .cast<std::string>();
        return s;
    }
    if (py::hasattr(config, "__fspath__")) {
        s.config_path = std::filesystem::path(
            py::module_::import("os").attr("fspath")(config).cast<std::string>());
        return s;
    }
    if (py::isinstance<py::str>(config)) {
        const std::string text = config.cast<std::string>();
        std::error_code ec;
        if (text.find('\n') == std::string::npos && std::filesystem::is_regular_file(text, ec)) {
            s.config_path = text;
        } else if (text.find(':') == std::string::npos) {
            throw epo::Error(epo::ErrorKind::kUsage,
                             "'" + text + "' is neither a file nor YAML text (a mapping)");
        } else {
            s.config_text = text;
        }
        return s;
    }
    throw epo::Error(epo::ErrorKind::kUsage, "config must be a dict, a path or YAML text, got " +
                                                 py::str(py::type::of(config)).cast<std::string>());
}

void add_launch(epo::config::ConfigSources& s, const std::optional<std::string>& gpu,
                const std::optional<int>& num_gpus, const std::optional<int>& gpus_per_node,
                const std::vector<std::string>& overrides) {
    s.harness.gpu = gpu;
    s.harness.num_gpus = num_gpus;
    s.harness.gpus_per_node = gpus_per_node;
    s.overrides = overrides;
}

py::list validate(const py::object& config, const std::optional<std::string>& gpu,
                  const std::optional<int>& num_gpus, const std::optional<int>& gpus_per_node,
                  const std::vector<std::string>& overrides) {
    epo::config::ConfigSources s = sources_of(config);
    add_launch(s, gpu, num_gpus, gpus_per_node, overrides);
    const epo::config::ValidationReport report =
        epo::config::validate(epo::config::build_config(s));
    // Every finding with all its parts (the CLI's JSON gives warnings without field and value).
    py::list findings;
    const auto add = [&](const std::vector<epo::config::Finding>& list, const char* severity) {
        for (const epo::config::Finding& f : list) {
            py::dict d;
            d["id"] = f.id;
            d["field"] = f.field;
            d["value"] = f.value;
            d["message"] = f.message;
            d["fix"] = f.fix;
            d["severity"] = severity;
            findings.append(d);
        }
    };
    add(report.errors, "error");
    add(report.warnings, "warning");
    return findings;
}

py::object plan(const py::object& config, const std::optional<std::string>& gpu,
                const std::optional<int>& num_gpus, const std::optional<int>& gpus_per_node,
                const std::vector<std::string>& overrides) {
    epo::config::ConfigSources s = sources_of(config);
    add_launch(s, gpu, num_gpus, gpus_per_node, overrides);
    epo::config::ValidationReport report = epo::config::validate(epo::config::build_config(s));
    // As `epo plan` judges it: what only the epo CPU runtime lacks is one note, never a refusal.
    const epo::plan::RuntimeGaps gaps = epo::plan::retarget_for_plan(report);
    if (!report.ok()) {
        throw epo::Error(epo::ErrorKind::kConfig,
                         "the configuration is invalid:\n" + epo::config::format_findings(report));
    }
    // As `epo plan --json` without hardware flags.
    return from_json(epo::plan::plan_to_json(
        epo::plan::make_plan(report.config, epo::plan::plan_options(report.config)), report, gaps));
}

py::object load_run(const py::object& run_dir) {
    const std::filesystem::path dir(
        py::module_::import("os").attr("fspath")(run_dir).cast<std::string>());
    const std::filesystem::path file =
        std::filesystem::is_directory(dir) ? dir / "metrics.json" : dir;
    std::ifstream in(file);
    if (!in) {
        throw epo::Error(epo::ErrorKind::kUsage,
                         file.string() +
                             ": no metrics.json here (give an `epo bench --out` run "
                             "directory)");
    }
    std::stringstream text;
    text << in.rdbuf();
    return py::module_::import("json").attr("loads")(text.str());
}

}  // namespace

PYBIND11_MODULE(epo, m) {
    m.doc() = "EPO: validate and plan Megatron-Core / Megatron-Bridge MoE configurations";
    static py::exception<epo::Error> error(m, "Error", PyExc_ValueError);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) {
                std::rethrow_exception(p);
            }
        } catch (const epo::Error& e) {
            PyErr_SetString(
                error.ptr(),
                (std::string(epo::error_kind_name(e.kind())) + ": " + e.what()).c_str());
        }
    });
    m.def("validate", &validate, py::arg("config"), py::kw_only(), py::arg("gpu") = py::none(),
          py::arg("num_gpus") = py::none(), py::arg("gpus_per_node") = py::none(),
          py::arg("overrides") = std::vector<std::string>{},
          "Findings (errors and warnings, each a dict with id, field, value, message, fix and "
          "severity) of a configuration: a dict, a path or YAML text. gpu / num_gpus / "
          "gpus_per_node are -g / -ng / -gn; overrides are KEY=VALUE strings.");
    m.def("plan", &plan, py::arg("config"), py::kw_only(), py::arg("gpu") = py::none(),
          py::arg("num_gpus") = py::none(), py::arg("gpus_per_node") = py::none(),
          py::arg("overrides") = std::vector<std::string>{},
          "The plan as `epo plan --json` gives it; raises epo.Error for an invalid "
          "configuration.");
    m.def("load_run", &load_run, py::arg("run_dir"),
          "metrics.json of an `epo bench --out` run directory, as a dict.");
}
