#include "epo/schedule/critical_path.h"

#include <algorithm>
#include <map>

namespace epo::schedule {

double critical_path_seconds(const std::vector<NodeCall>& calls,
                             const std::function<double(const NodeCall&)>& duration_s) {
    double stream_free[2] = {0.0, 0.0};
    std::map<int, double> micro_batch_done;
    double last = 0.0;
    for (const NodeCall& c : calls) {
        double& free = stream_free[stream_of(c.node) == StreamId::kCompute ? 0 : 1];
        const double start = std::max(free, micro_batch_done[c.micro_batch]);
        const double end = start + duration_s(c);
        free = end;
        if (!is_side_branch(c.node))
            micro_batch_done[c.micro_batch] = end;
        last = std::max(last, end);
    }
    return last;
}

}  // namespace epo::schedule
