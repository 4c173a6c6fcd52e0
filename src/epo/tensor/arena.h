// Arena: memory for tensors whose lifetime is one step (or one micro-batch), handed out by
// bumping an offset and taken back all at once by reset().
//
// Why: in this VM a first-touch page fault costs 10-25 us, and an allocator that returns large
// blocks to the OS faults on every step. An arena maps its memory once, pre-faults it
// (MAP_POPULATE, transparent huge pages where the kernel allows), and reuses it: after the
// first step a steady-state step takes no page faults. If a step needs more than the arena holds,
// it maps another chunk (a quarter of what is mapped, or more if asked; faulting once); the next
// reset() merges the chunks into one that holds the most any cycle has taken plus an eighth, so
// the step after that fits again without growing, and what stays mapped (and resident: the
// memory is pre-faulted) is the need, not the sum of the growth steps.
//
// Tensors from alloc() are views; they are invalid after reset() (under AddressSanitizer the
// released memory is poisoned, so a stale view is reported). One owner (typically one per
// micro-batch context) resets it; allocation and the byte counts are thread-safe (a mutex),
// because with MoE chunks (docs/chunked-overlap.md) two nodes of one micro-batch, one per
// stream, allocate from its layer's arena at once. Uncontended, the lock costs tens of ns per
// allocation, next to the microseconds of the node that allocates.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "epo/tensor/tensor.h"

namespace epo {

class Arena {
public:
    explicit Arena(std::string name = "arena", std::size_t initial_bytes = 0);
    ~Arena();
    Arena(const Arena&) = delete;
    Arena& operator=(const Arena&) = delete;
    Arena(Arena&& other) noexcept;
    Arena& operator=(Arena&& other) noexcept;

    // A 64-byte aligned, uninitialized tensor valid until the next reset().
    Tensor alloc(const Shape& shape, DType dtype);
    Tensor alloc_zeros(const Shape& shape, DType dtype);

    // Releases every allocation at once (merging chunks, see above).
    void reset();
    // Makes sure `bytes` more can be allocated without mapping memory later.
    void reserve(std::size_t bytes);

    const std::string& name() const { return name_; }
    std::size_t bytes_in_use() const;  // since the last reset(), including alignment padding
    std::size_t capacity() const;      // mapped bytes
    std::size_t high_water() const;
    int num_chunks() const { return static_cast<int>(chunks_.size()); }
    int num_maps() const { return num_maps_; }  // chunk mappings made so far (growths + 1)

private:
    struct Chunk {
        char* base = nullptr;
        std::size_t size = 0;
    };
    void add_chunk(std::size_t min_bytes);  // the callers hold mutex_ (both)
    void map_chunk(std::size_t size);       // exactly `size` bytes (a multiple of 2 MiB)
    void release_all();
    std::size_t bytes_in_use_locked() const;
    std::size_t capacity_locked() const;

    std::string name_;
    std::vector<Chunk> chunks_;
    std::size_t current_ = 0;  // chunk being bumped
    std::size_t offset_ = 0;   // in the current chunk
    std::size_t used_before_current_ = 0;
    std::size_t high_water_ = 0;
    int num_maps_ = 0;
    std::size_t demand_ = 0;       // bytes taken since the last reset(), without chunk tails
    std::size_t peak_demand_ = 0;  // the most demand_ has been in any cycle
    mutable std::mutex mutex_;     // not moved: each arena has its own
};

}  // namespace epo
