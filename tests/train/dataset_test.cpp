#include "epo/train/dataset.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "epo/core/error.h"

namespace epo::train {
namespace {

DatasetConfig mock_config() {
    return DatasetConfig{.type = "mock", .seq_length = 16, .vocab_size = 256, .seed = 7};
}

TEST(Dataset, MockSampleIsDeterministicAndLabelsAreNextTokens) {
    auto ds = make_dataset(mock_config());
    std::vector<int32_t> t1(16), l1(16), t2(16), l2(16);
    ds->read_sample(42, t1, l1);
    ds->read_sample(42, t2, l2);
    EXPECT_EQ(t1, t2);
    EXPECT_EQ(l1, l2);
    for (int i = 0; i + 1 < 16; ++i)
        EXPECT_EQ(l1[i], t1[i + 1]);
    ds->read_sample(43, t2, l2);
    EXPECT_NE(t1, t2);
    for (int32_t v : t1)
        EXPECT_TRUE(v >= 0 && v < 256);
}

TEST(Dataset, MockChainIsLearnable) {
    // The conditional entropy of next token given current must be far below ln(V): the
    // structure a model can learn.
    auto ds = make_dataset(mock_config());
    std::map<int32_t, std::map<int32_t, int>> counts;
    std::vector<int32_t> t(16), l(16);
    for (int i = 0; i < 4000; ++i) {
        ds->read_sample(i, t, l);
        for (int j = 0; j < 16; ++j)
            counts[t[j]][l[j]]++;
    }
    double h = 0, total = 0;
    for (auto& [from, next] : counts) {
        double n = 0;
        for (auto& [to, c] : next)
            n += c;
        for (auto& [to, c] : next)
            h -= c * std::log(c / n);
        total += n;
    }
    EXPECT_LT(h / total, 1.3);
    EXPECT_GT(h / total, 0.8);
}

TEST(Dataset, SamplePartitionDoesNotDependOnRankCount) {
    // One rank with 4 micro-batches reads the same samples, grouped the same way, as 4 ranks
    // with one micro-batch each.
    std::set<int64_t> one_rank, four_ranks;
    for (int64_t m = 0; m < 4; ++m) {
        MicroBatchPosition p{.step = 3,
                             .micro_batch = m,
                             .dp_rank = 0,
                             .dp_size = 1,
                             .micro_batch_size = 2,
                             .global_batch_size = 8};
        one_rank.insert(first_sample_index(p));
    }
    for (int64_t r = 0; r < 4; ++r) {
        MicroBatchPosition p{.step = 3,
                             .micro_batch = 0,
                             .dp_rank = r,
                             .dp_size = 4,
                             .micro_batch_size = 2,
                             .global_batch_size = 8};
        four_ranks.insert(first_sample_index(p));
    }
    EXPECT_EQ(one_rank, four_ranks);
    EXPECT_EQ(*one_rank.begin(), 24);
}

TEST(Dataset, TextReadsBytesInShuffledNonOverlappingWindows) {
    const std::string path = ::testing::TempDir() + "/epo_text_dataset.txt";
    std::string text;
    for (int i = 0; i < 41; ++i)
        text.push_back(static_cast<char>('a' + i % 26));
    std::ofstream(path, std::ios::binary) << text;
    DatasetConfig c{.type = "text", .path = path, .seq_length = 10, .vocab_size = 256, .seed = 1};
    auto ds = make_dataset(c);
    std::vector<int32_t> t(10), l(10);
    std::set<int32_t> starts;
    for (int i = 0; i < 4; ++i) {  // one epoch: 4 windows of 10 (+1) bytes
        ds->read_sample(i, t, l);
        starts.insert(t[0]);
        for (int j = 0; j < 10; ++j)
            EXPECT_EQ(l[j] - t[j] == 1 || l[j] - t[j] == -25, true);
    }
    EXPECT_EQ(starts.size(), 4u);  // every window once per epoch
    std::remove(path.c_str());
}

TEST(Dataset, BadInputNamesFieldAndFix) {
    DatasetConfig c = mock_config();
    c.type = "parquet";
    try {
        make_dataset(c);
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("dataset.type = 'parquet'"), std::string::npos);
    }
    c.type = "text";
    c.path = "/nonexistent/epo.txt";
    EXPECT_THROW(make_dataset(c), Error);
    c.vocab_size = 100;
    try {
        make_dataset(c);
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("model.vocab_size=256"), std::string::npos);
    }
    const std::string path = ::testing::TempDir() + "/epo_tiny.txt";
    std::ofstream(path) << "abc";
    c = DatasetConfig{.type = "text", .path = path, .seq_length = 16, .vocab_size = 256};
    EXPECT_THROW(make_dataset(c), Error);
    std::remove(path.c_str());
}

}  // namespace
}  // namespace epo::train
