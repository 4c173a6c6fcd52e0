#include "epo/bench/trace.h"

#include <mpi.h>

#include <algorithm>
#include <fstream>
#include <limits>

#include "epo/bench/metrics.h"
#include "epo/comm/mpi_runtime.h"
#include "epo/comm/rank_runner.h"
#include "epo/core/error.h"

namespace epo::bench {
namespace {

// Fixed track ids so every rank's compute stream is tid 0 and its comm stream tid 1.
int track_of(const std::string& stream) {
    if (stream == "compute") {
        return 0;
    }
    if (stream == "comm") {
        return 1;
    }
    return 2;
}

nlohmann::json records_to_json(const std::vector<runtime::TaskRecord>& records) {
    nlohmann::json out = nlohmann::json::array();
    for (const runtime::TaskRecord& r : records) {
        out.push_back({r.name, r.stream, r.kind == runtime::RecordKind::kWait ? 1 : 0, r.start_ns,
                       r.end_ns, r.bytes.intra_sent, r.bytes.intra_recv, r.bytes.inter_sent,
                       r.bytes.inter_recv});
    }
    return out;
}

nlohmann::json metadata(const char* name, int pid, int tid, const std::string& value) {
    return {{"name", name}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", value}}}};
}

}  // namespace

std::vector<std::string> gather_strings_to_root(const std::string& mine, double timeout_s) {
    const int world = comm::current_world_size();
    const int rank = comm::current_world_rank();
    int length = static_cast<int>(mine.size());
    std::vector<int> lengths(static_cast<size_t>(world));
    comm::watched_world_call("gathering trace sizes", timeout_s, [&] {
        comm::check_mpi(
            MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD),
            "gathering trace sizes");
    });
    std::vector<int> offsets(static_cast<size_t>(world), 0);
    int total = 0;
    for (int r = 0; r < world; ++r) {
        offsets[static_cast<size_t>(r)] = total;
        total += lengths[static_cast<size_t>(r)];
    }
    std::string all(rank == 0 ? static_cast<size_t>(total) : 0, '\0');
    comm::watched_world_call("gathering trace records", timeout_s, [&] {
        comm::check_mpi(MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(),
                                    offsets.data(), MPI_CHAR, 0, MPI_COMM_WORLD),
                        "gathering trace records");
    });
    std::vector<std::string> out;
    if (rank == 0) {
        for (int r = 0; r < world; ++r) {
            out.push_back(all.substr(static_cast<size_t>(offsets[static_cast<size_t>(r)]),
                                     static_cast<size_t>(lengths[static_cast<size_t>(r)])));
        }
    }
    return out;
}

void gather_trace(Trace& trace, const std::vector<runtime::TaskRecord>& records, double timeout_s,
                  const std::string& label) {
    const std::vector<std::string> parts =
        gather_strings_to_root(records_to_json(records).dump(), timeout_s);
    if (comm::current_world_rank() != 0) {
        return;
    }
    std::vector<nlohmann::json> ranks;
    int64_t earliest = std::numeric_limits<int64_t>::max();
    for (const std::string& part : parts) {
        ranks.push_back(nlohmann::json::parse(part));
        for (const auto& r : ranks.back()) {
            earliest = std::min(earliest, r[3].get<int64_t>());
        }
    }
    if (earliest != std::numeric_limits<int64_t>::max()) {
        trace.origin_ns = std::min(trace.origin_ns.value_or(earliest), earliest);
    }
    for (size_t rank = 0; rank < ranks.size(); ++rank) {
        const int pid = trace.next_pid++;
        const std::string process =
            (label.empty() ? "" : label + " ") + "rank " + std::to_string(rank);
        trace.events.push_back(metadata("process_name", pid, 0, process));
        trace.events.push_back({{"name", "process_sort_index"},
                                {"ph", "M"},
                                {"pid", pid},
                                {"args", {{"sort_index", pid}}}});
        trace.events.push_back(metadata("thread_name", pid, 0, "compute"));
        trace.events.push_back(metadata("thread_name", pid, 1, "comm"));
        for (const auto& r : ranks[rank]) {
            const std::string name = r[0].get<std::string>();
            const bool wait = r[2].get<int>() == 1;
            const int64_t start = r[3].get<int64_t>(), end = r[4].get<int64_t>();
            nlohmann::json args = {{"node", node_kind_of(name)}};
            const int64_t sent = r[5].get<int64_t>() + r[7].get<int64_t>();
            const int64_t received = r[6].get<int64_t>() + r[8].get<int64_t>();
            if (sent + received > 0) {
                args["bytes_sent"] = sent;
                args["bytes_received"] = received;
                args["inter_node_bytes_sent"] = r[7].get<int64_t>();
            }
            trace.events.push_back({{"name", name},
                                    {"cat", wait ? "wait" : "task"},
                                    {"ph", "X"},
                                    {"pid", pid},
                                    {"tid", track_of(r[1].get<std::string>())},
                                    {"ts_ns", start},
                                    {"dur", static_cast<double>(end - start) * 1e-3},
                                    {"args", args}});
        }
    }
}

nlohmann::json trace_json(const Trace& trace) {
    // Shifted here, once every gather is in: only then is the earliest record known.
    const int64_t origin = trace.origin_ns.value_or(0);
    nlohmann::json events = trace.events;
    for (auto& e : events) {
        if (const auto it = e.find("ts_ns"); it != e.end()) {
            e["ts"] = static_cast<double>(it->get<int64_t>() - origin) * 1e-3;
            e.erase("ts_ns");
        }
    }
    return {{"traceEvents", events},
            {"displayTimeUnit", "ms"},
            {"otherData", {{"producer", "epo"}, {"clock", "CLOCK_MONOTONIC"}}}};
}

void write_trace(const Trace& trace, const std::filesystem::path& path) {
    std::ofstream out(path);
    out << trace_json(trace).dump() << "\n";
    out.close();
    if (!out) {
        throw Error(ErrorKind::kIo,
                    fmt::format("cannot write the trace to '{}'; give a writable path to --trace",
                                path.string()));
    }
}

}  // namespace epo::bench
