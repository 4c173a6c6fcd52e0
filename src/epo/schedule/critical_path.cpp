#include "epo/schedule/critical_path.h"

#include <algorithm>
#include <map>
#include <utility>

namespace epo::schedule {

std::vector<CallSpan> critical_path_spans(
    const std::vector<NodeCall>& calls, const std::function<double(const NodeCall&)>& duration_s) {
    double stream_free[2] = {0.0, 0.0};
    // Done time per (micro-batch, token chunk) (the executor's events); a whole call waits for
    // every chunk of its micro-batch and every chunk then waits for it.
    const int num_chunks = num_moe_chunks(calls);
    std::map<std::pair<int, int>, double> micro_batch_done;
    std::map<int, double> bucket_gathered;
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
        const double end = start + duration_s(c);
        free = end;
        if (c.node == NodeKind::kParamGather)
            bucket_gathered[c.layer] = end;
        if (!is_side_branch(c.node)) {
            for (int k = first; k < last; ++k)
                micro_batch_done[{c.micro_batch, k}] = end;
        }
        spans.push_back({start, end});
    }
    return spans;
}

double critical_path_seconds(const std::vector<NodeCall>& calls,
                             const std::function<double(const NodeCall&)>& duration_s) {
    double last = 0.0;
    for (const CallSpan& span : critical_path_spans(calls, duration_s))
        last = std::max(last, span.end);
    return last;
}

}  // namespace epo::schedule
