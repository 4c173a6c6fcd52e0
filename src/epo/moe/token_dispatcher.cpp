#include "epo/moe/token_dispatcher.h"

#include "epo/moe/alltoall_dispatcher.h"
#include "epo/moe/flex_dispatcher.h"

namespace epo::moe {

std::unique_ptr<TokenDispatcher> make_token_dispatcher(const MoeConfig& cfg, int ep_size,
                                                       int ep_rank, int ep_ranks_per_node) {
    switch (cfg.dispatcher) {
        case DispatcherKind::kAlltoall:
            return std::make_unique<AlltoallDispatcher>(cfg, ep_size, ep_rank);
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
