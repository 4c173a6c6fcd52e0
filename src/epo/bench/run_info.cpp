#include "epo/bench/run_info.h"

#include <unistd.h>

#include <ctime>
#include <fstream>
#include <istream>

#include "epo/build_commit.h"  // generated: EPO_BUILD_COMMIT
#include "epo/kernels/cpu_features.h"

namespace epo::bench {

std::string build_commit() {
    return EPO_BUILD_COMMIT;
}

std::string shell_join(const std::vector<std::string>& argv) {
    // Characters a POSIX shell takes literally outside quotes.
    const auto plain = [](const std::string& a) {
        if (a.empty())
            return false;
        for (char c : a) {
            const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                            (c >= '0' && c <= '9') ||
                            std::string_view("-_./=:,+@%").find(c) != std::string_view::npos;
            if (!ok)
                return false;
        }
        return true;
    };
    std::string out;
    for (const std::string& a : argv) {
        if (!out.empty())
            out += ' ';
        if (plain(a)) {
            out += a;
            continue;
        }
        out += '\'';
        for (char c : a)
            out += c == '\'' ? std::string("'\\''") : std::string(1, c);
        out += '\'';
    }
    return out;
}

std::string cpu_model_name(std::istream& cpuinfo) {
    std::string line;
    while (std::getline(cpuinfo, line)) {
        if (line.rfind("model name", 0) != 0)
            continue;
        const size_t colon = line.find(':');
        if (colon == std::string::npos)
            continue;
        const size_t start = line.find_first_not_of(" \t", colon + 1);
        if (start != std::string::npos)
            return line.substr(start);
    }
    return "unknown";
}

std::vector<std::string> own_argv() {
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    std::vector<std::string> out;
    std::string arg;
    while (std::getline(in, arg, '\0'))
        out.push_back(arg);
    return out;
}

RunInfo collect_run_info(const std::string& command_line) {
    RunInfo info;
    info.command_line = command_line;
    info.commit = build_commit();
    info.epo_version = EPO_VERSION;
    char host[256] = {};
    info.host = gethostname(host, sizeof host - 1) == 0 && host[0] ? host : "unknown";
    std::ifstream cpuinfo("/proc/cpuinfo");
    info.cpu_model = cpu_model_name(cpuinfo);
    info.cpu_features = kernels::cpu_features_string();
    info.avx512_bf16 = kernels::cpu_features().avx512_bf16;
    info.amx_bf16 = kernels::cpu_features().amx_bf16;
    const std::time_t now = std::time(nullptr);
    std::tm utc{};
    gmtime_r(&now, &utc);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &utc);
    info.date_utc = stamp;
    return info;
}

nlohmann::json run_info_json(const RunInfo& i) {
    return {{"command_line", i.command_line}, {"commit", i.commit},
            {"epo_version", i.epo_version},   {"host", i.host},
            {"cpu_model", i.cpu_model},       {"cpu_features", i.cpu_features},
            {"avx512_bf16", i.avx512_bf16},   {"amx_bf16", i.amx_bf16},
            {"date_utc", i.date_utc}};
}

}  // namespace epo::bench
