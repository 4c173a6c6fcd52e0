// Process-group membership for many world / EP / ranks-per-node combinations: every kind of group
// partitions the world, EP groups are consecutive blocks, EDP groups have stride EP, nodes are
// blocks of gpus_per_node ranks; bad layouts name the field.
#include "epo/comm/topology.h"

#include <gtest/gtest.h>

#include <set>

#include "epo/core/error.h"

namespace epo::comm {
namespace {

const GroupKind kAllKinds[] = {GroupKind::kWorld, GroupKind::kExpertParallel,
                               GroupKind::kDataParallel, GroupKind::kExpertDataParallel,
                               GroupKind::kNode};

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
    EXPECT_THROW(group_members({4, 3, 8}, GroupKind::kExpertParallel, 0), Error);
}

}  // namespace
}  // namespace epo::comm
