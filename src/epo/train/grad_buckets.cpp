#include "epo/train/grad_buckets.h"

#include <stdexcept>

#include "epo/schedule/schedule.h"

namespace epo::train {

std::vector<int> grad_bucket_ends(const std::vector<int>& positions,
                                  const std::function<int64_t(int)>& bytes_at,
                                  int64_t bucket_bytes) {
    if (bucket_bytes <= 0) {
        throw std::invalid_argument("grad_bucket_ends: bucket_bytes must be positive");
    }
    std::vector<int> ends;
    int64_t filled = 0;
    for (size_t i = 0; i < positions.size(); ++i) {
        filled += bytes_at(positions[i]);
        if (filled >= bucket_bytes || i + 1 == positions.size()) {
            ends.push_back(positions[i]);
            filled = 0;
        }
    }
    return ends;
}

std::vector<int> grad_bucket_ends(int num_layers, const std::function<int64_t(int)>& bytes_at,
                                  int64_t bucket_bytes) {
    std::vector<int> positions;
    for (int position = num_layers; position >= schedule::kEmbeddingPosition; --position)
        positions.push_back(position);
    return grad_bucket_ends(positions, bytes_at, bucket_bytes);
}

}  // namespace epo::train
