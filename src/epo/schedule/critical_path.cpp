#include "epo/schedule/critical_path.h"

#include <algorithm>
#include <map>
#include <utility>

#include "epo/core/error.h"

namespace epo::schedule {

std::vector<CallSpan> critical_path_spans(
    const std::vector<NodeCall>& calls, const std::function<double(const NodeCall&)>& duration_s) {
    double stream_free[2] = {0.0, 0.0};
    // Done time per (micro-batch, MoE chunk) (the executor's events); a whole call waits for
    // every chunk of its micro-batch and every chunk then waits for it.
    const int num_chunks = num_moe_chunks(calls);
    std::map<std::pair<int, int>, double> micro_batch_done;
    std::map<int, double> bucket_gathered;
    // When each micro-batch's delayed weight gradients are done (off the chain; a gradient
    // reduction waits for them).
    std::map<int, double> wgrad_done;
    std::vector<CallSpan> spans;
    spans.reserve(calls.size());
    // What a call beside the previous one waits for (executor.h): the previous call's micro-batch,
    // every chunk, as it was before that call.
    double beside_ready = 0.0;
    for (const NodeCall& c : calls) {
        double& free = stream_free[stream_of(c.node) == StreamId::kCompute ? 0 : 1];
        double start = free;
        if (runs_beside_previous(c.node)) {
            start = std::max(start, beside_ready);
            free = start + duration_s(c);
            spans.push_back({start, free});
            continue;
        }
        beside_ready = 0.0;
        for (int k = 0; k < num_chunks; ++k)
            beside_ready = std::max(beside_ready, micro_batch_done[{c.micro_batch, k}]);
        const int first = c.moe_chunk >= 0 ? c.moe_chunk : 0;
        const int last = c.moe_chunk >= 0 ? c.moe_chunk + 1 : num_chunks;
        if (waits_for_micro_batch(c.node)) {
            for (int k = first; k < last; ++k)
                start = std::max(start, micro_batch_done[{c.micro_batch, k}]);
        }
        if (c.wait_bucket >= 0)
            start = std::max(start, bucket_gathered[c.wait_bucket]);
        if (c.node == NodeKind::kGradReduce)
            start = std::max(start, wgrad_done[c.micro_batch]);
        const double end = start + duration_s(c);
        free = end;
        if (c.node == NodeKind::kParamGather)
            bucket_gathered[c.layer] = end;
        if (c.phase == Phase::kBackwardDw)
            wgrad_done[c.micro_batch] = end;
        if (!runs_off_chain(c)) {
            for (int k = first; k < last; ++k)
                micro_batch_done[{c.micro_batch, k}] = end;
        }
        spans.push_back({start, end});
    }
    return spans;
}

double critical_path_seconds(const std::vector<NodeCall>& calls,
                             const std::function<double(const NodeCall&)>& duration_s) {
    return critical_path_seconds(calls, duration_s, {});
}

double critical_path_seconds(const std::vector<NodeCall>& calls,
                             const std::function<double(const NodeCall&)>& duration_s,
                             const std::vector<TailCall>& tail) {
    const std::vector<CallSpan> spans = critical_path_spans(calls, duration_s);
    // Where the schedule leaves each stream, and when each bucket's reduction ends.
    double stream_free[2] = {0.0, 0.0};
    std::map<int, double> reduced;
    for (size_t i = 0; i < calls.size(); ++i) {
        double& free = stream_free[stream_of(calls[i].node) == StreamId::kCompute ? 0 : 1];
        free = std::max(free, spans[i].end);
        if (calls[i].node == NodeKind::kGradReduce)
            reduced[calls[i].layer] = spans[i].end;
    }
    const double schedule_comm_done = stream_free[1];
    double last = std::max(stream_free[0], stream_free[1]);
    std::vector<double> tail_end;
    tail_end.reserve(tail.size());
    for (const TailCall& t : tail) {
        double& free = stream_free[t.stream == StreamId::kCompute ? 0 : 1];
        double start = free;
        if (t.waits_for_reduction >= 0) {
            const auto it = reduced.find(t.waits_for_reduction);
            EPO_CHECK(it != reduced.end(),
                      "an optimizer piece waits for bucket {}'s reduction, which the schedule "
                      "does not hold",
                      t.waits_for_reduction);
            start = std::max(start, it->second);
        }
        if (t.waits_for_schedule)
            start = std::max(start, schedule_comm_done);
        if (t.waits_for >= 0) {
            EPO_CHECK(static_cast<size_t>(t.waits_for) < tail_end.size(),
                      "optimizer piece {} waits for piece {}, which is not before it",
                      tail_end.size(), t.waits_for);
            start = std::max(start, tail_end[static_cast<size_t>(t.waits_for)]);
        }
        free = start + t.duration_s;
        tail_end.push_back(free);
        last = std::max(last, free);
    }
    return last;
}

}  // namespace epo::schedule
