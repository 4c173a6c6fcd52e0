#include "epo/schedule/executor.h"

#include <fmt/format.h>

#include <memory>

namespace epo::schedule {

void issue_schedule(const std::vector<NodeCall>& calls, int num_micro_batches,
                    runtime::RankStreams& streams, NodeBody body) {
    std::vector<runtime::Event> events;
    events.reserve(static_cast<size_t>(num_micro_batches));
    for (int mb = 0; mb < num_micro_batches; ++mb) {
        events.emplace_back(fmt::format("mb{}", mb));
    }
    // One event per parameter bucket gather (schedule.h): recorded by the gather, waited for by
    // the first forward call that reads the bucket's weights.
    std::vector<runtime::Event> gathered;
    for (const NodeCall& call : calls) {
        // Each its own event (a copy would share the original's state).
        while (call.node == NodeKind::kParamGather &&
               call.layer >= static_cast<int>(gathered.size()))
            gathered.emplace_back(fmt::format("bucket{}.param_gather", gathered.size()));
    }
    // Every task shares one copy of the body, alive until the last task has run.
    auto shared_body = std::make_shared<const NodeBody>(std::move(body));
    for (const NodeCall& call : calls) {
        runtime::Stream& stream =
            stream_of(call.node) == StreamId::kCompute ? *streams.compute : *streams.comm;
        runtime::Event& event = events[static_cast<size_t>(call.micro_batch)];
        // Why: the previous call of this micro-batch may be on the other stream; this wait
        // binds to its record, so the call starts only when its inputs exist.
        if (waits_for_micro_batch(call.node))
            stream.wait(event);
        if (call.wait_bucket >= 0)
            stream.wait(gathered.at(static_cast<size_t>(call.wait_bucket)));
        stream.enqueue(call_name(call), [shared_body, call](runtime::StreamContext& ctx) {
            (*shared_body)(call, ctx);
        });
        if (call.node == NodeKind::kParamGather)
            stream.record(gathered[static_cast<size_t>(call.layer)]);
        // Side branches (gradient reduction, parameter gather): nothing of the micro-batch waits
        // for them through its event.
        if (!is_side_branch(call.node)) {
            stream.record(event);
        }
    }
}

}  // namespace epo::schedule
