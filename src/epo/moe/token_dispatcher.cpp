#include "epo/moe/token_dispatcher.h"

#include "epo/moe/alltoall_dispatcher.h"
#include "epo/moe/flex_dispatcher.h"

namespace epo::moe {

ExpertRange expert_group_range(std::int64_t num_local_experts, ExpertGroup g) {
    EPO_CHECK(g.count >= 1 && g.index >= 0 && g.index < g.count && g.count <= num_local_experts,
              "expert group {} of {} over {} local expert(s): every group needs an expert "
              "(moe_ep_overlap_num_chunks at most the experts per EP rank)",
              g.index, g.count, num_local_experts);
    return {g.index * num_local_experts / g.count, (g.index + 1) * num_local_experts / g.count};
}

std::unique_ptr<TokenDispatcher> make_token_dispatcher(const MoeConfig& cfg, int ep_size,
                                                       int ep_rank, int ep_ranks_per_node,
                                                       int etp_size) {
    EPO_CHECK(etp_size == 1 || cfg.dispatcher == DispatcherKind::kAlltoall,
              "the flex dispatcher with expert tensor parallelism {} (RT044: use "
              "moe_token_dispatcher_type=alltoall)",
              etp_size);
    switch (cfg.dispatcher) {
        case DispatcherKind::kAlltoall:
            return std::make_unique<AlltoallDispatcher>(cfg, ep_size, ep_rank, etp_size);
        case DispatcherKind::kFlexDeepep:
            return std::make_unique<FlexDispatcher>(cfg, FlexBackend::kDeepep, ep_size, ep_rank,
                                                    ep_ranks_per_node);
        case DispatcherKind::kFlexHybridep:
            return std::make_unique<FlexDispatcher>(cfg, FlexBackend::kHybridep, ep_size, ep_rank,
                                                    ep_ranks_per_node);
    }
    EPO_CHECK(false, "unknown token dispatcher {}", static_cast<int>(cfg.dispatcher));
    return nullptr;
}

}  // namespace epo::moe
