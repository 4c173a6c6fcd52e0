#include "epo/checkpoint/rank_agreement.h"

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <memory>

#include "epo/comm/mpi_runtime.h"
#include "epo/comm/rank_runner.h"
#include "epo/core/error.h"

namespace epo::checkpoint {

comm::Communicator make_control_communicator(const comm::ParallelLayout& layout, double timeout_s) {
    comm::validate_layout(layout);
    comm::Communicator::Members members;
    for (int r = 0; r < layout.world_size; ++r) {
        members.world_ranks.push_back(r);
        members.nodes.push_back(comm::node_of(layout, r));
    }
    MPI_Comm dup = MPI_COMM_NULL;
    comm::watched_world_call("creating the run-control communicator", timeout_s, [&] {
        comm::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup for the control channel");
    });
    comm::CommOptions options;
    options.timeout_s = timeout_s;
    return comm::Communicator(dup, "world (run control)", std::move(members), options,
                              std::make_shared<comm::Watchdog>());
}

std::vector<std::string> all_gather_strings(comm::Communicator& world, const std::string& local) {
    const auto n = static_cast<size_t>(world.size());
    const int64_t length = static_cast<int64_t>(local.size());
    std::vector<int64_t> lengths(n);
    world.all_gather(std::span<const int64_t>(&length, 1), std::span<int64_t>(lengths));
    const int64_t longest = std::max<int64_t>(1, *std::max_element(lengths.begin(), lengths.end()));
    std::string padded = local;
    padded.resize(static_cast<size_t>(longest));
    std::string all(n * static_cast<size_t>(longest), '\0');
    world.all_gather(padded.data(), all.data(), static_cast<size_t>(longest));
    std::vector<std::string> out(n);
    for (size_t r = 0; r < n; ++r)
        out[r] = all.substr(r * static_cast<size_t>(longest), static_cast<size_t>(lengths[r]));
    return out;
}

std::string broadcast_string(comm::Communicator& world, const std::string& value, int root) {
    int64_t length = static_cast<int64_t>(value.size());
    world.broadcast(&length, sizeof length, root);
    std::string out = value;
    out.resize(static_cast<size_t>(length));
    if (length > 0)
        world.broadcast(out.data(), out.size(), root);
    return out;
}

void agree_on_success(comm::Communicator& world, const std::exception_ptr& local_failure) {
    // Each rank's verdict as "<kind digit><message>"; empty = success.
    std::string mine;
    if (local_failure) {
        ErrorKind kind = ErrorKind::kInternal;
        try {
            std::rethrow_exception(local_failure);
        } catch (const Error& e) {
            kind = e.kind();
            mine = e.what();
        } catch (const std::exception& e) {
            mine = e.what();
        } catch (...) {
            mine = "unknown exception";
        }
        mine.insert(mine.begin(), static_cast<char>('0' + static_cast<int>(kind)));
    }
    const std::vector<std::string> all = all_gather_strings(world, mine);
    for (size_t r = 0; r < all.size(); ++r) {
        if (all[r].empty())
            continue;
        const auto kind = static_cast<ErrorKind>(all[r][0] - '0');
        throw Error(kind, fmt::format("rank {} of {}: {}", r, all.size(),
                                      std::string_view(all[r]).substr(1)));
    }
}

StopRequest agree_on_stop(comm::Communicator& world, int local_signal) {
    const int64_t mine = local_signal;
    std::vector<int64_t> all(static_cast<size_t>(world.size()));
    world.all_gather(std::span<const int64_t>(&mine, 1), std::span<int64_t>(all));
    for (size_t r = 0; r < all.size(); ++r) {
        if (all[r] != 0)
            return StopRequest{.rank = static_cast<int>(r), .signal = static_cast<int>(all[r])};
    }
    return {};
}

}  // namespace epo::checkpoint
