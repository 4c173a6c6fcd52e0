#include "epo/runtime/rank_streams.h"

#include "epo/comm/process_groups.h"
#include "epo/comm/rank_runner.h"

namespace epo::runtime {

RankStreams make_rank_streams(const comm::ParallelLayout& layout, const comm::CommOptions& options,
                              MPI_Comm parent) {
    auto watchdog = std::make_shared<comm::Watchdog>();
    auto make = [&](const char* name) {
        StreamOptions so;
        so.groups = comm::ProcessGroups::create(layout, options, name, watchdog, parent);
        so.on_failure = [](const std::exception_ptr& e) { comm::abort_job(e); };
        return std::make_unique<Stream>(name, std::move(so));
    };
    RankStreams streams;
    streams.compute = make("compute");  // creation order is collective: compute first, then comm
    streams.comm = make("comm");
    return streams;
}

}  // namespace epo::runtime
