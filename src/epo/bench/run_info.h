// Where and how a bench run was made, so that a report can be shared and read on its own: the
// command line, the commit the build came from, the host and its CPU, the date. metrics.json
// keeps it as `run` and report.html shows it in its header (bench_report.h).
//
// What it deliberately does not record: the environment, user names, paths other than those on
// the command line (a report is meant to be passed around).
#pragma once

#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace epo::bench {

struct RunInfo {
    std::string command_line;  // as started, shell-quoted
    std::string commit;        // build_commit()
    std::string epo_version;
    std::string host;          // gethostname()
    std::string cpu_model;     // /proc/cpuinfo "model name" ("unknown" where it says none)
    std::string cpu_features;  // kernels::cpu_features_string(): "avx2 fma avx512f ..."
    bool avx512_bf16 = false;
    bool amx_bf16 = false;
    std::string date_utc;  // when the outputs were written, "2026-12-04T04:15:12Z"
};

// `git describe --always --dirty` of the source tree when the library was built (a header that
// cmake/BuildCommit.cmake regenerates before every build), "unknown" outside a git checkout.
std::string build_commit();

// One word per argument, quoted for a POSIX shell where it needs it ('a b', 'it'\''s'), so the
// line can be pasted back.
std::string shell_join(const std::vector<std::string>& argv);

// The "model name" of the first processor in /proc/cpuinfo's text; "unknown" without one.
std::string cpu_model_name(std::istream& cpuinfo);

// This process's own command line (/proc/self/cmdline), one element per argument.
std::vector<std::string> own_argv();

// This process's host, CPU and the time now, with `command_line` as given.
RunInfo collect_run_info(const std::string& command_line);

nlohmann::json run_info_json(const RunInfo& info);

}  // namespace epo::bench
