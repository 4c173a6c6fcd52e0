// Training data: sample i of a dataset is a pure function of (dataset, i), so every rank can read
// its own samples without coordination, a resumed run continues exactly where it stopped, and
// the same global batch is the same tokens whatever the number of ranks.
//
//   mock: a seeded sparse Markov chain over the vocabulary (each token has four likely
//         successors), so a model can learn it and the loss falls clearly from ln(V) towards
//         the chain's entropy (~1.1 nats); deterministic, no files.
//   text: a plain file read as bytes (vocabulary 256); non-overlapping windows of seq_length+1
//         bytes, visited in a seeded random order that is reshuffled every epoch.
//
// Which samples a rank reads (Megatron's pretraining sampler): in step s, micro-batch m on
// data-parallel rank r holds samples  s*G + m*B*D + r*B + [0, B)  (G global batch, B micro
// batch, D data-parallel size).
//
// Letters: B micro-batch size, S sequence length, V vocabulary.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace epo::train {

struct DatasetConfig {
    std::string type = "mock";  // "mock" or "text"
    std::string path;           // text only
    int64_t seq_length = 0;
    int64_t vocab_size = 0;
    uint64_t seed = 1234;
};

class Dataset {
public:
    virtual ~Dataset() = default;
    // Writes sample `index`: tokens (S) and their next-token labels (S).
    virtual void read_sample(int64_t index, std::span<int32_t> tokens,
                             std::span<int32_t> labels) const = 0;
};

// Builds the dataset; a bad type, a missing/too-small file or a vocabulary that cannot hold the
// data raise epo::Error naming the field and the fix.
std::unique_ptr<Dataset> make_dataset(const DatasetConfig& config);

struct MicroBatchPosition {
    int64_t step = 0;         // optimizer step, from 0
    int64_t micro_batch = 0;  // index within the step, from 0
    int64_t dp_rank = 0;
    int64_t dp_size = 1;
    int64_t micro_batch_size = 1;
    int64_t global_batch_size = 1;
};

// Index of the first sample of the micro-batch (the following B-1 are consecutive).
int64_t first_sample_index(const MicroBatchPosition& pos);

// Fills tokens and labels (B*S each, row-major (B, S)) for one micro-batch.
void read_micro_batch(const Dataset& dataset, const MicroBatchPosition& pos, int64_t seq_length,
                      std::vector<int32_t>& tokens, std::vector<int32_t>& labels);

}  // namespace epo::train
