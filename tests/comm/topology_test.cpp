// Process-group membership for many world / EP / ranks-per-node combinations: every kind of group
// partitions the world, EP groups are consecutive blocks, EDP groups have stride EP, nodes are
// blocks of gpus_per_node ranks; with TP, ETP and PP the groups of small worlds listed by hand
// from Megatron-Core's RankGenerator (orders tp-cp-dp-pp and etp-ep-edp-pp); bad layouts name
// the field.
#include "epo/comm/topology.h"

#include <gtest/gtest.h>

#include <set>

#include "epo/core/error.h"

namespace epo::comm {
namespace {

const GroupKind kAllKinds[] = {GroupKind::kWorld,
                               GroupKind::kExpertParallel,
                               GroupKind::kDataParallel,
                               GroupKind::kExpertDataParallel,
                               GroupKind::kNode,
                               GroupKind::kTensorParallel,
                               GroupKind::kExpertTensorParallel,
                               GroupKind::kPipeline};

using Groups = std::vector<std::vector<int>>;

// Every group of `kind`, each listed once, in the order of their first rank.
Groups all_groups(const ParallelLayout& layout, GroupKind kind) {
    Groups groups;
    for (int r = 0; r < layout.world_size; ++r) {
        auto members = group_members(layout, kind, r);
        if (members.front() == r)
            groups.push_back(std::move(members));
    }
    return groups;
}

TEST(Topology, MegatronOrderingExamples) {
    const ParallelLayout layout{8, 4, 2};
    EXPECT_EQ(group_members(layout, GroupKind::kExpertParallel, 5), (std::vector<int>{4, 5, 6, 7}));
    EXPECT_EQ(group_members(layout, GroupKind::kExpertDataParallel, 5), (std::vector<int>{1, 5}));
    EXPECT_EQ(group_members(layout, GroupKind::kDataParallel, 5),
              (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
    EXPECT_EQ(group_members(layout, GroupKind::kNode, 5), (std::vector<int>{4, 5}));
    EXPECT_EQ(node_of(layout, 5), 2);
    EXPECT_EQ(num_nodes(layout), 4);

    const ParallelLayout partial{7, 7, 3};  // last node holds one rank
    EXPECT_EQ(group_members(partial, GroupKind::kNode, 6), (std::vector<int>{6}));
    EXPECT_EQ(group_members(partial, GroupKind::kNode, 4), (std::vector<int>{3, 4, 5}));
    EXPECT_EQ(num_nodes(partial), 3);
}

// Megatron-Core's groups for world 8, TP 2, EP 2, PP 2 (initialize_model_parallel with
// order tp-cp-ep-dp-pp): dense RankGenerator(tp 2, dp 2, pp 2), expert RankGenerator(etp 1, ep 2,
// edp 2, pp 2). Worked by hand: dense coordinates (tp, dp, pp) = (r % 2, r / 2 % 2, r / 4).
TEST(Topology, TensorExpertPipelineGroupsOfEightRanks) {
    ParallelLayout l{8, 2, 8, 2};
    l.tensor_model_parallel_size = 2;
    EXPECT_EQ(all_groups(l, GroupKind::kTensorParallel), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
    EXPECT_EQ(all_groups(l, GroupKind::kDataParallel), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
    EXPECT_EQ(all_groups(l, GroupKind::kPipeline), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
    EXPECT_EQ(all_groups(l, GroupKind::kExpertTensorParallel),
              (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
    EXPECT_EQ(all_groups(l, GroupKind::kExpertParallel), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
    EXPECT_EQ(all_groups(l, GroupKind::kExpertDataParallel),
              (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));

    // TP 2, EP 4, PP 1 on 8 ranks: an EP group spans two TP groups; DP has stride TP.
    ParallelLayout m{8, 4, 8, 1};
    m.tensor_model_parallel_size = 2;
    EXPECT_EQ(all_groups(m, GroupKind::kTensorParallel), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
    EXPECT_EQ(all_groups(m, GroupKind::kDataParallel), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
    EXPECT_EQ(all_groups(m, GroupKind::kExpertParallel), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
    EXPECT_EQ(all_groups(m, GroupKind::kExpertDataParallel),
              (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
    EXPECT_EQ(all_groups(m, GroupKind::kPipeline),
              (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));

    // TP 2, ETP 2, EP 2, PP 2 on 16 ranks: expert coordinates (etp, ep, edp, pp) =
    // (r % 2, r / 2 % 2, r / 4 % 2, r / 8).
    ParallelLayout e{16, 2, 8, 2};
    e.tensor_model_parallel_size = 2;
    e.expert_tensor_parallel_size = 2;
    EXPECT_EQ(all_groups(e, GroupKind::kExpertTensorParallel),
              (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
    EXPECT_EQ(all_groups(e, GroupKind::kExpertParallel),
              (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
    EXPECT_EQ(all_groups(e, GroupKind::kExpertDataParallel),
              (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
    EXPECT_EQ(all_groups(e, GroupKind::kDataParallel),
              (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
    EXPECT_EQ(all_groups(e, GroupKind::kPipeline),
              (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
}

// Every kind partitions the world for every TP, ETP, EP, PP that tile it, and a group's members
// differ from each other only in its own coordinate.
TEST(Topology, TensorAndPipelineLayoutsPartitionTheWorld) {
    for (int world : {1, 2, 4, 6, 8, 12, 16}) {
        for (int tp = 1; tp <= world; ++tp) {
            for (int pp = 1; pp <= world; ++pp) {
                for (int etp = 1; etp <= world; ++etp) {
                    for (int ep = 1; ep <= world; ++ep) {
                        if (world % (tp * pp) != 0 || world % (etp * ep * pp) != 0)
                            continue;
                        ParallelLayout l{world, ep, 4, pp};
                        l.tensor_model_parallel_size = tp;
                        l.expert_tensor_parallel_size = etp;
                        SCOPED_TRACE(testing::Message()
                                     << "world " << world << " tp " << tp << " pp " << pp << " etp "
                                     << etp << " ep " << ep);
                        const std::pair<GroupKind, int> sizes[] = {
                            {GroupKind::kTensorParallel, tp},
                            {GroupKind::kDataParallel, world / (tp * pp)},
                            {GroupKind::kPipeline, pp},
                            {GroupKind::kExpertTensorParallel, etp},
                            {GroupKind::kExpertParallel, ep},
                            {GroupKind::kExpertDataParallel, world / (etp * ep * pp)}};
                        for (const auto& [kind, size] : sizes) {
                            std::set<int> covered, indices;
                            for (const auto& g : all_groups(l, kind)) {
                                ASSERT_EQ(static_cast<int>(g.size()), size) << group_name(kind);
                                for (int m : g) {
                                    ASSERT_TRUE(covered.insert(m).second) << group_name(kind);
                                    ASSERT_EQ(group_members(l, kind, m), g);
                                    ASSERT_EQ(group_index(l, kind, m), group_index(l, kind, g[0]));
                                }
                                indices.insert(group_index(l, kind, g[0]));
                            }
                            ASSERT_EQ(static_cast<int>(covered.size()), world);
                            ASSERT_EQ(*indices.rbegin(), static_cast<int>(indices.size()) - 1);
                        }
                        // Every group but pp lies inside one pipeline stage.
                        for (int r = 0; r < world; ++r) {
                            for (GroupKind k :
                                 {GroupKind::kTensorParallel, GroupKind::kDataParallel,
                                  GroupKind::kExpertParallel, GroupKind::kExpertDataParallel}) {
                                for (int m : group_members(l, k, r))
                                    ASSERT_EQ(m / (world / pp), r / (world / pp));
                            }
                        }
                    }
                }
            }
        }
    }
}

TEST(Topology, EveryKindPartitionsTheWorld) {
    for (int world = 1; world <= 12; ++world) {
        for (int ep = 1; ep <= world; ++ep) {
            if (world % ep != 0)
                continue;
            for (int gpn = 1; gpn <= 9; ++gpn) {
                const ParallelLayout layout{world, ep, gpn};
                for (GroupKind kind : kAllKinds) {
                    SCOPED_TRACE(testing::Message() << "world " << world << " ep " << ep << " gpn "
                                                    << gpn << " " << group_name(kind));
                    std::set<int> covered;
                    std::set<int> indices;
                    for (int r = 0; r < world; ++r) {
                        const auto members = group_members(layout, kind, r);
                        ASSERT_TRUE(std::is_sorted(members.begin(), members.end()));
                        ASSERT_NE(std::find(members.begin(), members.end(), r), members.end());
                        // Every member computes the same group and the same index.
                        for (int m : members) {
                            ASSERT_EQ(group_members(layout, kind, m), members);
                            ASSERT_EQ(group_index(layout, kind, m), group_index(layout, kind, r));
                        }
                        if (members.front() == r) {
                            for (int m : members)
                                ASSERT_TRUE(covered.insert(m).second);
                            indices.insert(group_index(layout, kind, r));
                        }
                    }
                    EXPECT_EQ(static_cast<int>(covered.size()), world);
                    // Indices number the groups 0..count-1.
                    EXPECT_EQ(*indices.rbegin(), static_cast<int>(indices.size()) - 1);
                }
                for (int r = 0; r < world; ++r) {
                    const auto ep_group = group_members(layout, GroupKind::kExpertParallel, r);
                    ASSERT_EQ(static_cast<int>(ep_group.size()), ep);
                    ASSERT_EQ(ep_group.back() - ep_group.front(), ep - 1);  // consecutive
                    const auto edp = group_members(layout, GroupKind::kExpertDataParallel, r);
                    ASSERT_EQ(static_cast<int>(edp.size()), world / ep);
                    for (size_t i = 1; i < edp.size(); ++i)
                        ASSERT_EQ(edp[i] - edp[i - 1], ep);
                    for (int m : group_members(layout, GroupKind::kNode, r)) {
                        ASSERT_EQ(node_of(layout, m), r / gpn);
                    }
                }
            }
        }
    }
}

TEST(Topology, BadLayoutsNameTheField) {
    auto message_of = [](const ParallelLayout& layout) {
        try {
            validate_layout(layout);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(message_of({4, 3, 8}).find("expert_model_parallel_size=3 does not divide the world "
                                         "size 4"),
              std::string::npos);
    EXPECT_NE(message_of({4, 0, 8}).find("expert_model_parallel_size=0"), std::string::npos);
    EXPECT_NE(message_of({4, 2, 0}).find("gpus_per_node=0"), std::string::npos);
    EXPECT_EQ(message_of({6, 3, 4}), "no error");
    ParallelLayout tp3{4, 1, 8};
    tp3.tensor_model_parallel_size = 3;
    EXPECT_NE(message_of(tp3).find("tensor_model_parallel_size=3 x pipeline_model_parallel_size=1 "
                                   "= 3 does not divide the world size 4"),
              std::string::npos)
        << message_of(tp3);
    ParallelLayout etp{4, 2, 8, 1};
    etp.expert_tensor_parallel_size = 4;
    EXPECT_NE(message_of(etp).find("expert_tensor_parallel_size=4 x expert_model_parallel_size=2 x "
                                   "pipeline_model_parallel_size=1 = 8 does not divide the world "
                                   "size 4"),
              std::string::npos)
        << message_of(etp);
    ParallelLayout tp0{4, 1, 8};
    tp0.tensor_model_parallel_size = 0;
    EXPECT_NE(message_of(tp0).find("tensor_model_parallel_size=0 is not positive"),
              std::string::npos);
    EXPECT_THROW(group_members({4, 3, 8}, GroupKind::kExpertParallel, 0), Error);
}

}  // namespace
}  // namespace epo::comm
