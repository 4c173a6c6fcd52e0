#include "epo/tensor/arena.h"

#include <sanitizer/asan_interface.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace epo {
namespace {

constexpr std::size_t kAlign = 64;
constexpr std::size_t kChunkGranule = std::size_t{2} << 20;  // 2 MiB: one huge page

std::size_t round_up(std::size_t n, std::size_t to) {
    return (n + to - 1) / to * to;
}

}  // namespace

Arena::Arena(std::string name, std::size_t initial_bytes) : name_(std::move(name)) {
    if (initial_bytes) {
        map_chunk(round_up(initial_bytes, kChunkGranule));
    }
}

Arena::~Arena() {
    release_all();
}

Arena::Arena(Arena&& other) noexcept {
    *this = std::move(other);
}

Arena& Arena::operator=(Arena&& other) noexcept {
    if (this != &other) {
        release_all();
        name_ = std::move(other.name_);
        chunks_ = std::move(other.chunks_);
        current_ = other.current_;
        offset_ = other.offset_;
        used_before_current_ = other.used_before_current_;
        high_water_ = other.high_water_;
        num_maps_ = other.num_maps_;
        demand_ = other.demand_;
        peak_demand_ = other.peak_demand_;
        other.chunks_.clear();
        other.current_ = other.offset_ = other.used_before_current_ = 0;
    }
    return *this;
}

void Arena::add_chunk(std::size_t min_bytes) {
    // Grow by a quarter of what is mapped (at least what is asked): a growing workload maps
    // O(log) chunks, while what a cycle maps beyond its need stays within about a quarter (a
    // doubling growth left up to twice the need mapped, and resident, for good).
    const std::size_t size = round_up(std::max(min_bytes, capacity_locked() / 4), kChunkGranule);
    map_chunk(size);
}

void Arena::map_chunk(std::size_t size) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        throw Error(ErrorKind::kInternal, fmt::format("arena '{}': cannot map {} MiB: {}", name_,
                                                      size >> 20, std::strerror(errno)));
    }
    // Huge pages where allowed (fewer faults and TLB misses), then touch every page now so the
    // step that uses the memory does not fault.
    madvise(p, size, MADV_HUGEPAGE);
    std::memset(p, 0, size);
    ASAN_POISON_MEMORY_REGION(p, size);
    chunks_.push_back(Chunk{static_cast<char*>(p), size});
    ++num_maps_;
}

void Arena::release_all() {
    for (const Chunk& c : chunks_) {
        ASAN_UNPOISON_MEMORY_REGION(c.base, c.size);
        munmap(c.base, c.size);
    }
    chunks_.clear();
    current_ = offset_ = used_before_current_ = 0;
}

Tensor Arena::alloc(const Shape& shape, DType dtype) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t bytes =
        round_up(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype), kAlign);
    const std::size_t take = std::max(bytes, kAlign);  // distinct pointers for empty tensors
    demand_ += take;
    peak_demand_ = std::max(peak_demand_, demand_);
    while (current_ < chunks_.size() && offset_ + take > chunks_[current_].size) {
        used_before_current_ += chunks_[current_].size;
        ++current_;
        offset_ = 0;
    }
    if (current_ == chunks_.size()) {
        add_chunk(take);
    }
    char* p = chunks_[current_].base + offset_;
    offset_ += take;
    high_water_ = std::max(high_water_, bytes_in_use_locked());
    ASAN_UNPOISON_MEMORY_REGION(p, take);
    return Tensor::wrap(p, shape, dtype);
}

Tensor Arena::alloc_zeros(const Shape& shape, DType dtype) {
    Tensor t = alloc(shape, dtype);
    t.fill_zero();
    return t;
}

void Arena::reset() {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (chunks_.size() > 1) {
        // The last cycle needed more than one chunk: replace them by one chunk that holds the
        // most any cycle has asked for, plus an eighth for cycles that ask a little more (a MoE
        // layer's rows vary with the routing). Unmapped first, so the two never coexist.
        const std::size_t size = round_up(peak_demand_ + peak_demand_ / 8, kChunkGranule);
        release_all();
        map_chunk(size);
    } else if (!chunks_.empty()) {
        ASAN_POISON_MEMORY_REGION(chunks_[0].base, chunks_[0].size);
    }
    current_ = offset_ = used_before_current_ = 0;
    demand_ = 0;
}

void Arena::reserve(std::size_t bytes) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (capacity_locked() - bytes_in_use_locked() >= bytes) {
        return;
    }
    if (bytes_in_use_locked() == 0) {
        release_all();
        map_chunk(round_up(bytes, kChunkGranule));
    } else {
        add_chunk(bytes);
    }
}

std::size_t Arena::bytes_in_use() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return bytes_in_use_locked();
}

std::size_t Arena::capacity() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return capacity_locked();
}

std::size_t Arena::high_water() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return high_water_;
}

std::size_t Arena::bytes_in_use_locked() const {
    return used_before_current_ + offset_;
}

std::size_t Arena::capacity_locked() const {
    std::size_t c = 0;
    for (const Chunk& ch : chunks_) {
        c += ch.size;
    }
    return c;
}

}  // namespace epo
