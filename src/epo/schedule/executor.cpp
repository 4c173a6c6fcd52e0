#include "epo/schedule/executor.h"

#include <fmt/format.h>

#include <memory>
#include <stdexcept>

namespace epo::schedule {

IssuedEvents issue_schedule(const std::vector<NodeCall>& calls, int num_micro_batches,
                            runtime::RankStreams& streams, NodeBody body) {
    // One event per (micro-batch, MoE chunk): events[mb * C + c]. With C = 1 one per
    // micro-batch, named as before.
    const int num_chunks = num_moe_chunks(calls);
    std::vector<runtime::Event> events;
    events.reserve(static_cast<size_t>(num_micro_batches * num_chunks));
    for (int mb = 0; mb < num_micro_batches; ++mb) {
        for (int c = 0; c < num_chunks; ++c) {
            events.emplace_back(num_chunks == 1 ? fmt::format("mb{}", mb)
                                                : fmt::format("mb{}.chunk{}", mb, c));
        }
    }
    // The events a call waits for and records: its chunk's, or every chunk's for a whole call
    // (a whole call joins the chunks: it needs all of them, and each needs it).
    const auto chunk_events = [&](const NodeCall& call) {
        const int first = call.moe_chunk >= 0 ? call.moe_chunk : 0;
        const int last = call.moe_chunk >= 0 ? call.moe_chunk + 1 : num_chunks;
        std::vector<runtime::Event*> out;
        for (int c = first; c < last; ++c)
            out.push_back(&events[static_cast<size_t>(call.micro_batch * num_chunks + c)]);
        return out;
    };
    // One event per micro-batch for its delayed weight gradients (off the chain, schedule.h
    // runs_off_chain): recorded by each, on the compute stream in order, so the latest record
    // covers them all; a gradient reduction of the micro-batch waits for it.
    std::vector<runtime::Event> wgrads;
    wgrads.reserve(static_cast<size_t>(num_micro_batches));
    for (int mb = 0; mb < num_micro_batches; ++mb)
        wgrads.emplace_back(fmt::format("mb{}.wgrad", mb));
    // One event per parameter bucket gather (schedule.h): recorded by the gather, waited for by
    // the first forward call that reads the bucket's weights.
    std::vector<runtime::Event> gathered;
    IssuedEvents issued;
    for (const NodeCall& call : calls) {
        // Each its own event (a copy would share the original's state).
        while (call.node == NodeKind::kParamGather &&
               call.layer >= static_cast<int>(gathered.size()))
            gathered.emplace_back(fmt::format("bucket{}.param_gather", gathered.size()));
        while (call.node == NodeKind::kGradReduce &&
               call.layer >= static_cast<int>(issued.reduced.size()))
            issued.reduced.emplace_back(fmt::format("bucket{}.grad_reduce", issued.reduced.size()));
    }
    // Every task shares one copy of the body, alive until the last task has run.
    auto shared_body = std::make_shared<const NodeBody>(std::move(body));
    const auto stream_for = [&](const NodeCall& call) -> runtime::Stream& {
        return stream_of(call.node) == StreamId::kCompute ? *streams.compute : *streams.comm;
    };
    for (size_t i = 0; i < calls.size(); ++i) {
        const NodeCall& call = calls[i];
        runtime::Stream& stream = stream_for(call);
        const std::vector<runtime::Event*> chain = chunk_events(call);
        if (runs_beside_previous(call.node)) {
            if (i == 0)
                throw std::logic_error(fmt::format(
                    "{} runs beside the previous call, but comes first", call_name(call)));
            // Its waits were issued with the previous call's (below); it records nothing.
            stream.enqueue(call_name(call), [shared_body, call](runtime::StreamContext& ctx) {
                (*shared_body)(call, ctx);
            });
            continue;
        }
        // Why: the previous call of this micro-batch (of this chunk) may be on the other
        // stream; this wait binds to its record, so the call starts only when its inputs exist.
        if (waits_for_micro_batch(call.node)) {
            for (runtime::Event* e : chain)
                stream.wait(*e);
        }
        // A call that runs beside this one waits for what this one waits for: issued now, its
        // wait binds to the records before this call's (CUDA semantics), so it does not wait for
        // this call. A whole call: every chunk's event.
        if (i + 1 < calls.size() && runs_beside_previous(calls[i + 1].node)) {
            const NodeCall& beside = calls[i + 1];
            if (beside.micro_batch != call.micro_batch ||
                stream_of(beside.node) == stream_of(call.node))
                throw std::logic_error(fmt::format(
                    "{} runs beside {}, which is not a call of its micro-batch on the other stream",
                    call_name(beside), call_name(call)));
            for (runtime::Event* e : chunk_events(beside))
                stream_for(beside).wait(*e);
        }
        if (call.wait_bucket >= 0)
            stream.wait(gathered.at(static_cast<size_t>(call.wait_bucket)));
        // A bucket's gradients are whole once every weight gradient of the bucket is, the
        // delayed ones too (a never-recorded event is no wait).
        if (call.node == NodeKind::kGradReduce)
            stream.wait(wgrads.at(static_cast<size_t>(call.micro_batch)));
        stream.enqueue(call_name(call), [shared_body, call](runtime::StreamContext& ctx) {
            (*shared_body)(call, ctx);
        });
        if (call.node == NodeKind::kParamGather)
            stream.record(gathered[static_cast<size_t>(call.layer)]);
        if (call.node == NodeKind::kGradReduce)
            stream.record(issued.reduced[static_cast<size_t>(call.layer)]);
        // Off the chain (side branches, delayed weight gradients): nothing of the micro-batch
        // waits for them through its event.
        if (call.phase == Phase::kBackwardDw)
            stream.record(wgrads.at(static_cast<size_t>(call.micro_batch)));
        if (!runs_off_chain(call)) {
            for (runtime::Event* e : chain)
                stream.record(*e);
        }
    }
    return issued;
}

}  // namespace epo::schedule
