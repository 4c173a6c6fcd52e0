// The collectives of a Communicator, each built from the phases in communicator_phases.cpp:
// begin, arrive, queue the transfers, move_data, finish.
#include <algorithm>
#include <cstring>

#include "epo/comm/communicator.h"
#include "epo/comm/communicator_internal.h"
#include "epo/core/error.h"

namespace epo::comm {

OpStats Communicator::all_to_all_v(const void* send, void* recv, const AllToAllLayout& layout,
                                   size_t elem_bytes) {
    const Op op = begin(OpKind::kAllToAll);
    const size_t n = static_cast<size_t>(size_);
    if (layout.send_counts.size() != n || layout.send_offsets.size() != n ||
        layout.recv_counts.size() != n || layout.recv_offsets.size() != n) {
        fail(
            fmt::format("{}: the layout has {}/{} send and {}/{} recv counts/offsets, the group "
                        "has {} ranks",
                        describe(op), layout.send_counts.size(), layout.send_offsets.size(),
                        layout.recv_counts.size(), layout.recv_offsets.size(), n));
    }
    for (size_t p = 0; p < n; ++p) {
        detail::to_int(layout.send_counts[p], fmt::format("send_counts[{}]", p));
        detail::to_int(layout.send_offsets[p], fmt::format("send_offsets[{}]", p));
        detail::to_int(layout.recv_counts[p], fmt::format("recv_counts[{}]", p));
        detail::to_int(layout.recv_offsets[p], fmt::format("recv_offsets[{}]", p));
    }
    const Clock::time_point last_entry =
        arrive(op, layout.send_counts, layout.recv_counts, static_cast<int64_t>(elem_bytes));
    const MPI_Datatype type = item_type(elem_bytes);
    const auto eb = static_cast<int64_t>(elem_bytes);
    const auto* in = static_cast<const char*>(send);
    auto* out = static_cast<char*>(recv);
    for (int p = 0; p < size_; ++p) {
        add_recv(p, out + layout.recv_offsets[p] * eb, layout.recv_counts[p], type,
                 layout.recv_counts[p] * eb);
        add_send(p, in + layout.send_offsets[p] * eb, layout.send_counts[p], type,
                 layout.send_counts[p] * eb);
    }
    // This rank's own rows while the others are in flight (the arrival phase checked that the
    // counts agree).
    if (layout.send_counts[rank_] > 0) {
        std::memcpy(out + layout.recv_offsets[rank_] * eb, in + layout.send_offsets[rank_] * eb,
                    static_cast<size_t>(layout.send_counts[rank_] * eb));
    }
    OpStats s;
    move_data(op, s);
    ByteCounts bytes;
    for (int p = 0; p < size_; ++p) {
        add_peer_bytes(bytes, p, layout.send_counts[p] * eb, layout.recv_counts[p] * eb);
    }
    return finish(op, last_entry, bytes, s);
}

OpStats Communicator::all_gather(const void* send, void* recv, size_t bytes_per_rank) {
    const Op op = begin(OpKind::kAllGather);
    const auto b = static_cast<int64_t>(bytes_per_rank);
    const int count = detail::to_int(b, "all_gather bytes per rank");
    sizes_a_.assign(size_, b);
    const Clock::time_point last_entry = arrive(op, sizes_a_, sizes_a_, 0);
    auto* out = static_cast<char*>(recv);
    for (int p = 0; p < size_; ++p) {
        add_recv(p, out + p * b, count, MPI_BYTE, b);
        add_send(p, send, count, MPI_BYTE, b);
    }
    if (b > 0)
        std::memmove(out + rank_ * b, send, static_cast<size_t>(b));
    OpStats s;
    move_data(op, s);
    ByteCounts bytes;
    for (int p = 0; p < size_; ++p)
        add_peer_bytes(bytes, p, b, b);
    return finish(op, last_entry, bytes, s);
}

ShardRange shard_of(int64_t total, int group_size, int group_rank) {
    return ShardRange{group_rank * total / group_size, (group_rank + 1) * total / group_size};
}

// Rank r receives every rank's part of shard r into row r of the scratch, in group-rank order:
// (n, mine) for this rank.
void Communicator::sum_my_shard(const Op& op, std::span<float> data, OpStats& stats) {
    const int n = size_;
    const auto total = static_cast<int64_t>(data.size());
    const ShardRange mine = shard_of(total, n, rank_);
    const int64_t mine_count = mine.size();
    reduce_scratch_.resize(static_cast<size_t>(n * mine_count));  // (n, mine): my shard of each
    constexpr int64_t kFloat = sizeof(float);
    for (int r = 0; r < n; ++r) {
        const ShardRange theirs = shard_of(total, n, r);
        add_recv(r, reduce_scratch_.data() + r * mine_count, mine_count, MPI_FLOAT,
                 mine_count * kFloat);
        add_send(r, data.data() + theirs.begin, theirs.size(), MPI_FLOAT, theirs.size() * kFloat);
    }
    std::copy(data.begin() + mine.begin, data.begin() + mine.end,
              reduce_scratch_.begin() + rank_ * mine_count);
    move_data(op, stats);
    // Sum in group-rank order: the order, and so the rounding, never depends on timing.
    float* out = data.data() + mine.begin;
    for (int64_t i = 0; i < mine_count; ++i)
        out[i] = reduce_scratch_[i];
    for (int r = 1; r < n; ++r) {
        const float* in = reduce_scratch_.data() + r * mine_count;
        for (int64_t i = 0; i < mine_count; ++i)
            out[i] += in[i];
    }
}

// In place: this rank's shard to every peer, every peer's shard into its place.
void Communicator::gather_shards(const Op& op, void* data, int64_t total, size_t elem_bytes,
                                 OpStats& stats) {
    const int n = size_;
    const MPI_Datatype type = item_type(elem_bytes);
    const auto eb = static_cast<int64_t>(elem_bytes);
    auto* bytes = static_cast<char*>(data);
    const ShardRange mine = shard_of(total, n, rank_);
    for (int r = 0; r < n; ++r) {
        const ShardRange theirs = shard_of(total, n, r);
        add_recv(r, bytes + theirs.begin * eb, theirs.size(), type, theirs.size() * eb);
        add_send(r, bytes + mine.begin * eb, mine.size(), type, mine.size() * eb);
    }
    move_data(op, stats);
}

// Bytes of a reduce-scatter (scatter = true) or a shard all-gather of `total` items: each rank
// sends peer p its part of p's shard (reduce-scatter) or its own shard (all-gather).
void Communicator::add_shard_bytes(ByteCounts& bytes, int64_t total, int64_t item_bytes,
                                   bool scatter) const {
    const int64_t mine = shard_of(total, size_, rank_).size() * item_bytes;
    for (int p = 0; p < size_; ++p) {
        const int64_t theirs = shard_of(total, size_, p).size() * item_bytes;
        if (scatter)
            add_peer_bytes(bytes, p, theirs, mine);
        else
            add_peer_bytes(bytes, p, mine, theirs);
    }
}

// The all-reduce and the reduce-scatter: the same shard sums, then (all-reduce) the gather.
OpStats Communicator::shard_sum(OpKind kind, std::span<float> data, bool gather) {
    const Op op = begin(kind);
    const auto total = static_cast<int64_t>(data.size());
    detail::to_int(total,
                   fmt::format("{} element count", detail::op_name(static_cast<uint32_t>(kind))));
    sizes_a_.assign(size_, total);
    const Clock::time_point last_entry = arrive(op, sizes_a_, sizes_a_, 0);
    OpStats s;
    sum_my_shard(op, data, s);
    if (gather)
        gather_shards(op, data.data(), total, sizeof(float), s);
    ByteCounts bytes;
    add_shard_bytes(bytes, total, sizeof(float), true);
    if (gather)
        add_shard_bytes(bytes, total, sizeof(float), false);
    return finish(op, last_entry, bytes, s);
}

OpStats Communicator::all_reduce_sum(std::span<float> data) {
    return shard_sum(OpKind::kAllReduce, data, true);
}

OpStats Communicator::reduce_scatter_sum(std::span<float> data) {
    return shard_sum(OpKind::kReduceScatter, data, false);
}

OpStats Communicator::all_gather_shards(void* data, int64_t total, size_t elem_bytes) {
    const Op op = begin(OpKind::kAllGatherShards);
    detail::to_int(total, "all_gather_shards item count");
    sizes_a_.assign(size_, total);
    const Clock::time_point last_entry =
        arrive(op, sizes_a_, sizes_a_, static_cast<int64_t>(elem_bytes));
    OpStats s;
    gather_shards(op, data, total, elem_bytes, s);
    ByteCounts bytes;
    add_shard_bytes(bytes, total, static_cast<int64_t>(elem_bytes), false);
    return finish(op, last_entry, bytes, s);
}

OpStats Communicator::broadcast(void* data, size_t bytes_total, int root) {
    const Op op = begin(OpKind::kBroadcast);
    if (root < 0 || root >= size_) {
        fail(fmt::format("{}: root {} is not a rank of the group (size {})", describe(op), root,
                         size_));
    }
    const auto b = static_cast<int64_t>(bytes_total);
    const int count = detail::to_int(b, "broadcast bytes");
    sizes_a_.assign(size_, b);
    const Clock::time_point last_entry = arrive(op, sizes_a_, sizes_a_, root);
    // Straight from the root to every rank: broadcasts here are small agreements (checkpoint
    // names), where a tree would only add latency.
    for (int p = 0; p < size_; ++p) {
        if (rank_ == root)
            add_send(p, data, count, MPI_BYTE, b);
        else if (p == root)
            add_recv(p, data, count, MPI_BYTE, b);
    }
    OpStats s;
    move_data(op, s);
    ByteCounts bytes;
    for (int p = 0; p < size_; ++p) {
        if (rank_ == root)
            add_peer_bytes(bytes, p, b, 0);
        else if (p == root)
            add_peer_bytes(bytes, p, 0, b);
    }
    return finish(op, last_entry, bytes, s);
}

OpStats Communicator::barrier() {
    const Op op = begin(OpKind::kBarrier);
    sizes_a_.assign(size_, 0);
    const Clock::time_point last_entry = arrive(op, sizes_a_, sizes_a_, 0);
    return finish(op, last_entry, ByteCounts{});
}

}  // namespace epo::comm
