#include "epo/train/grad_buckets.h"

#include <stdexcept>

#include "epo/schedule/schedule.h"

namespace epo::train {

std::vector<int> grad_bucket_ends(int num_layers, const std::function<int64_t(int)>& bytes_at,
                                  int64_t bucket_bytes) {
    if (bucket_bytes <= 0) {
        throw std::invalid_argument("grad_bucket_ends: bucket_bytes must be positive");
    }
    std::vector<int> ends;
    int64_t filled = 0;
    for (int position = num_layers; position >= schedule::kEmbeddingPosition; --position) {
        filled += bytes_at(position);
        if (filled >= bucket_bytes || position == schedule::kEmbeddingPosition) {
            ends.push_back(position);
            filled = 0;
        }
    }
    return ends;
}

}  // namespace epo::train
