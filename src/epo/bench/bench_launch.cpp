#include "epo/bench/bench_launch.h"

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <fstream>

#include "epo/checkpoint/stop_signal.h"
#include "epo/core/error.h"

namespace epo::bench {

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

}  // namespace epo::bench
