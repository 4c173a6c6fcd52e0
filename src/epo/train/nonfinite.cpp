#include "epo/train/nonfinite.h"

#include <cmath>

namespace epo::train {

std::string first_nonfinite_grad(const std::vector<Param*>& params,
                                 const std::vector<comm::ShardRange>& reduced) {
    for (size_t k = 0; k < params.size(); ++k) {
        const float* g = params[k]->main_grad.data<float>();
        for (int64_t i = reduced[k].begin; i < reduced[k].end; ++i) {
            if (!std::isfinite(g[i]))
                return params[k]->name;
        }
    }
    return "";
}

Error nonfinite_step_error(int64_t step, double lm_loss, double grad_norm,
                           const std::vector<std::string>& grad_names) {
    std::string where;
    for (size_t r = 0; r < grad_names.size(); ++r) {
        if (!grad_names[r].empty())
            where += fmt::format("{}{} (rank {})", where.empty() ? "" : ", ", grad_names[r], r);
    }
    if (where.empty()) {
        where = std::isfinite(grad_norm)
                    ? "every gradient is finite: the loss itself overflowed"
                    : "no single gradient holds one: their sum of squares overflowed";
    } else {
        where = "first non-finite gradient: " + where;
    }
    return Error(ErrorKind::kNumerics,
                 fmt::format("iteration {}: lm loss {} / grad norm {} is not finite; {}. the run "
                             "stops here and saves nothing (the last checkpoint is intact); lower "
                             "optimizer.lr, set optimizer.clip_grad, or inspect "
                             "that parameter's inputs",
                             step, lm_loss, grad_norm, where));
}

}  // namespace epo::train
