// Helpers shared by the configuration tests: small configs that pass, and finding lookups.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "epo/config/config.h"
#include "epo/config/recipes.h"
#include "epo/config/report.h"
#include "epo/core/error.h"

namespace epo::config::testing {

// The reference suites' passing EP-overlap config: EP 2, 2 experts, alltoall, bf16, no
// recompute, shared-expert overlap off, mtp_num_layers null, top-1 with the softmax before top-k;
// two ranks, two micro-batches.
inline Config ep_overlap_config() {
    Config c = make_recipe("tiny-moe");
    c.model.expert_model_parallel_size = 2;
    c.model.num_moe_experts = 2;
    c.model.moe_router_topk = 1;
    c.model.moe_router_pre_softmax = true;  // top-1 softmax needs it (MC004)
    c.model.moe_token_dispatcher_type = DispatcherType::kAlltoall;
    c.comm.gpus_per_node = 2;
    c.train.micro_batch_size = 1;
    c.train.global_batch_size = 4;
    c.comm_overlap.emplace();
    c.comm_overlap->tp_comm_overlap = false;
    c.comm_overlap->overlap_moe_expert_parallel_comm = true;
    return c;
}

// The same with delayed weight-gradient compute on.
inline Config delay_wgrad_config() {
    Config c = ep_overlap_config();
    c.comm_overlap->delay_wgrad_compute = true;
    return c;
}

// tiny-moe on four ranks with EP 4, micro-batch 1, global batch 8: passes every rule family.
inline Config four_rank_config() {
    Config c = make_recipe("tiny-moe");
    c.comm.gpus_per_node = 4;
    c.model.expert_model_parallel_size = 4;
    c.train.micro_batch_size = 1;
    c.train.global_batch_size = 8;
    return c;
}

inline std::vector<std::string> ids(const std::vector<Finding>& findings) {
    std::vector<std::string> out;
    for (const auto& f : findings) {
        out.push_back(f.id);
    }
    return out;
}

inline bool has(const std::vector<Finding>& findings, const std::string& id) {
    return std::any_of(findings.begin(), findings.end(),
                       [&](const Finding& f) { return f.id == id; });
}

inline const Finding& get(const std::vector<Finding>& findings, const std::string& id) {
    for (const auto& f : findings) {
        if (f.id == id) {
            return f;
        }
    }
    ADD_FAILURE() << "no finding " << id;
    static const Finding none;
    return none;
}

// Runs `fn`, expects an epo::Error of `kind` whose message contains every one of `parts`.
template <class Fn>
void expect_error(Fn&& fn, ErrorKind kind, const std::vector<std::string>& parts) {
    try {
        fn();
        ADD_FAILURE() << "no error raised";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), kind) << e.what();
        for (const auto& part : parts) {
            EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
                << "'" << part << "' not in: " << e.what();
        }
    }
}

}  // namespace epo::config::testing
