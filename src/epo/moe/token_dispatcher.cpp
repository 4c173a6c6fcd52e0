#include "epo/moe/token_dispatcher.h"

#include "epo/moe/alltoall_dispatcher.h"

namespace epo::moe {

std::unique_ptr<TokenDispatcher> make_token_dispatcher(const MoeConfig& cfg, int ep_size,
                                                       int ep_rank) {
    switch (cfg.dispatcher) {
        case DispatcherKind::kAlltoall:
            return std::make_unique<AlltoallDispatcher>(cfg, ep_size, ep_rank);
    }
    EPO_CHECK(false, "unknown token dispatcher {}", static_cast<int>(cfg.dispatcher));
    return nullptr;
}

}  // namespace epo::moe
