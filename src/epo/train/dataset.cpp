#include "epo/train/dataset.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <mutex>
#include <numeric>

#include "epo/core/error.h"

namespace epo::train {
namespace {

// splitmix64: a small, well-mixed, seedable generator; all randomness here derives from it.
uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t mix(uint64_t a, uint64_t b) {
    uint64_t s = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
    return splitmix64(s);
}

class MockDataset : public Dataset {
public:
    explicit MockDataset(const DatasetConfig& c) : config_(c) {}

    void read_sample(int64_t index, std::span<int32_t> tokens,
                     std::span<int32_t> labels) const override {
        const int64_t s_len = config_.seq_length;
        const uint64_t vocab = static_cast<uint64_t>(config_.vocab_size);
        uint64_t rng = mix(config_.seed, static_cast<uint64_t>(index));
        uint64_t token = splitmix64(rng) % vocab;
        // Successor k of token v is mix(seed, v*4+k) mod V, drawn with probability
        // kSuccessorWeights[k] / 100.
        static constexpr uint64_t kSuccessorCumulative[4] = {55, 80, 95, 100};
        for (int64_t t = 0; t <= s_len; ++t) {
            if (t < s_len)
                tokens[t] = static_cast<int32_t>(token);
            if (t > 0)
                labels[t - 1] = static_cast<int32_t>(token);
            const uint64_t draw = splitmix64(rng) % 100;
            uint64_t k = 0;
            while (draw >= kSuccessorCumulative[k])
                ++k;
            token = mix(config_.seed, token * 4 + k) % vocab;
        }
    }

private:
    DatasetConfig config_;
};

class TextDataset : public Dataset {
public:
    explicit TextDataset(const DatasetConfig& c) : config_(c) {
        std::ifstream in(c.path, std::ios::binary);
        if (!in) {
            throw Error(ErrorKind::kIo,
                        fmt::format("dataset.path: cannot open '{}' for reading; give an existing "
                                    "text file (dataset.type=text reads it as bytes)",
                                    c.path));
        }
        bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        num_windows_ =
            bytes_.empty() ? 0 : (static_cast<int64_t>(bytes_.size()) - 1) / c.seq_length;
        if (num_windows_ < 1) {
            throw Error(ErrorKind::kConfig,
                        fmt::format("dataset.path: '{}' has {} bytes; a sample needs "
                                    "seq_length+1 = {} bytes; use a longer file or a shorter "
                                    "model.seq_length",
                                    c.path, bytes_.size(), c.seq_length + 1));
        }
    }

    void read_sample(int64_t index, std::span<int32_t> tokens,
                     std::span<int32_t> labels) const override {
        const int64_t epoch = index / num_windows_;
        const int64_t window = epoch_order(epoch)[index % num_windows_];
        const int64_t start = window * config_.seq_length;
        for (int64_t t = 0; t < config_.seq_length; ++t) {
            tokens[t] = static_cast<unsigned char>(bytes_[start + t]);
            labels[t] = static_cast<unsigned char>(bytes_[start + t + 1]);
        }
    }

private:
    // The window order of one epoch: a Fisher-Yates shuffle seeded by (seed, epoch). The last
    // epoch's order is cached: reads walk forward through epochs.
    const std::vector<int64_t>& epoch_order(int64_t epoch) const {
        std::lock_guard<std::mutex> lock(mutex_);
        if (cached_epoch_ != epoch) {
            order_.resize(num_windows_);
            std::iota(order_.begin(), order_.end(), 0);
            uint64_t rng = mix(config_.seed, static_cast<uint64_t>(epoch) + 0x5EED);
            for (int64_t i = num_windows_ - 1; i > 0; --i) {
                const auto j = static_cast<int64_t>(splitmix64(rng) % static_cast<uint64_t>(i + 1));
                std::swap(order_[i], order_[j]);
            }
            cached_epoch_ = epoch;
        }
        return order_;
    }

    DatasetConfig config_;
    std::string bytes_;
    int64_t num_windows_ = 0;
    mutable std::mutex mutex_;
    mutable int64_t cached_epoch_ = -1;
    mutable std::vector<int64_t> order_;
};

}  // namespace

std::unique_ptr<Dataset> make_dataset(const DatasetConfig& config) {
    if (config.seq_length < 1) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("model.seq_length = {}: must be at least 1", config.seq_length));
    }
    if (config.type == "mock") {
        if (config.vocab_size < 2) {
            throw Error(ErrorKind::kConfig,
                        fmt::format("model.vocab_size = {}: the mock dataset needs at least 2 "
                                    "tokens",
                                    config.vocab_size));
        }
        return std::make_unique<MockDataset>(config);
    }
    if (config.type == "text") {
        if (config.vocab_size < 256) {
            throw Error(ErrorKind::kConfig,
                        fmt::format("model.vocab_size = {}: dataset.type=text reads bytes and "
                                    "needs a vocabulary of at least 256; set model.vocab_size=256",
                                    config.vocab_size));
        }
        if (config.path.empty()) {
            throw Error(ErrorKind::kConfig,
                        "dataset.path is not set: dataset.type=text needs a file to read; set "
                        "dataset.path=FILE");
        }
        return std::make_unique<TextDataset>(config);
    }
    throw Error(ErrorKind::kConfig,
                fmt::format("dataset.type = '{}': unknown; use mock or text", config.type));
}

int64_t first_sample_index(const MicroBatchPosition& pos) {
    return pos.step * pos.global_batch_size + pos.micro_batch * pos.micro_batch_size * pos.dp_size +
           pos.dp_rank * pos.micro_batch_size;
}

void read_micro_batch(const Dataset& dataset, const MicroBatchPosition& pos, int64_t seq_length,
                      std::vector<int32_t>& tokens, std::vector<int32_t>& labels) {
    const size_t n = static_cast<size_t>(pos.micro_batch_size * seq_length);
    tokens.resize(n);
    labels.resize(n);
    const int64_t first = first_sample_index(pos);
    for (int64_t b = 0; b < pos.micro_batch_size; ++b) {
        dataset.read_sample(first + b, std::span(tokens).subspan(b * seq_length, seq_length),
                            std::span(labels).subspan(b * seq_length, seq_length));
    }
}

}  // namespace epo::train
