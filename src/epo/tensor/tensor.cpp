#include "epo/tensor/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

namespace epo {

std::size_t dtype_size(DType dtype) {
    switch (dtype) {
        case DType::kF32:
            return 4;
        case DType::kBF16:
            return 2;
        case DType::kI32:
            return 4;
        case DType::kI64:
            return 8;
    }
    return 0;
}

const char* dtype_name(DType dtype) {
    switch (dtype) {
        case DType::kF32:
            return "f32";
        case DType::kBF16:
            return "bf16";
        case DType::kI32:
            return "i32";
        case DType::kI64:
            return "i64";
    }
    return "?";
}

Shape::Shape(std::initializer_list<std::int64_t> d) {
    EPO_CHECK_LE(d.size(), static_cast<std::size_t>(kMaxTensorRank));
    for (std::int64_t v : d) {
        EPO_CHECK(v >= 0, "negative dimension {} in a shape", v);
        dims[static_cast<std::size_t>(rank++)] = v;
    }
}

std::int64_t Shape::numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i) {
        n *= dims[static_cast<std::size_t>(i)];
    }
    return n;
}

bool Shape::operator==(const Shape& other) const {
    if (rank != other.rank) {
        return false;
    }
    for (int i = 0; i < rank; ++i) {
        if ((*this)[i] != other[i]) {
            return false;
        }
    }
    return true;
}

std::string Shape::str() const {
    std::string s = "[";
    for (int i = 0; i < rank; ++i) {
        if (i) {
            s += ", ";
        }
        s += std::to_string((*this)[i]);
    }
    return s + "]";
}

namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;

// Large tensors (weights, gradients, optimizer state: gigabytes for a real model) get their own
// mapping on 2 MiB boundaries with transparent huge pages requested: in a VM a page fault costs
// 10-25 us, and first-touching a 1 GiB tensor in 4 KiB pages would take seconds of every start.
std::shared_ptr<void> map_huge(std::size_t bytes) {
    const std::size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    const std::size_t mapped = size + kHugePage;  // room to align the start
    void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        throw std::bad_alloc();
    }
    const auto start = (reinterpret_cast<std::uintptr_t>(base) + kHugePage - 1) & ~(kHugePage - 1);
    void* p = reinterpret_cast<void*>(start);
    madvise(p, size, MADV_HUGEPAGE);
    return std::shared_ptr<void>(p, [base, mapped](void*) { munmap(base, mapped); });
}

}  // namespace

std::shared_ptr<void> allocate_storage(std::size_t bytes) {
    // Round up to the alignment so aligned_alloc's size rule holds; at least one line so that
    // zero bytes still get a distinct, valid pointer.
    bytes = std::max<std::size_t>((bytes + 63) / 64 * 64, 64);
    if (bytes >= kHugePage) {
        return map_huge(bytes);
    }
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) {
        throw std::bad_alloc();
    }
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
    Tensor t;
    t.shape_ = shape;
    t.dtype_ = dtype;
    t.owner_ = allocate_storage(t.nbytes());
    t.data_ = t.owner_.get();
    return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
    Tensor t = empty(shape, dtype);
    if (t.nbytes() < kHugePage) {  // a fresh mapping reads as zeros already
        t.fill_zero();
    }
    return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype) {
    EPO_CHECK(data != nullptr || shape.numel() == 0, "Tensor::wrap of a null pointer");
    Tensor t;
    t.data_ = data;
    t.shape_ = shape;
    t.dtype_ = dtype;
    return t;
}

std::int64_t Tensor::dim(int i) const {
    if (i < 0) {
        i += shape_.rank;
    }
    EPO_CHECK(i >= 0 && i < shape_.rank, "dimension {} of a rank-{} tensor", i, shape_.rank);
    return shape_[i];
}

std::int64_t Tensor::row_size() const {
    EPO_CHECK(shape_.rank >= 1, "row_size of a scalar tensor");
    std::int64_t n = 1;
    for (int i = 1; i < shape_.rank; ++i) {
        n *= shape_[i];
    }
    return n;
}

Tensor Tensor::rows(std::int64_t begin, std::int64_t end) const {
    EPO_CHECK(shape_.rank >= 1, "rows() of a scalar tensor");
    EPO_CHECK(begin >= 0 && begin <= end && end <= shape_[0], "rows [{}, {}) of a tensor {}", begin,
              end, shape_.str());
    Tensor t = *this;
    t.shape_.dims[0] = end - begin;
    t.data_ = static_cast<char*>(data_) +
              static_cast<std::size_t>(begin * row_size()) * dtype_size(dtype_);
    return t;
}

Tensor Tensor::view(const Shape& shape) const {
    EPO_CHECK(shape.numel() == numel(), "view {} of a tensor {}", shape.str(), shape_.str());
    Tensor t = *this;
    t.shape_ = shape;
    return t;
}

Tensor Tensor::clone() const {
    Tensor t = empty(shape_, dtype_);
    if (nbytes()) {
        std::memcpy(t.data_, data_, nbytes());
    }
    return t;
}

void Tensor::copy_from(const Tensor& src) const {
    EPO_CHECK(src.dtype_ == dtype_ && src.numel() == numel(), "copy {} {} into {} {}",
              dtype_name(src.dtype_), src.shape_.str(), dtype_name(dtype_), shape_.str());
    if (nbytes()) {
        std::memmove(data_, src.data_, nbytes());
    }
}

void Tensor::fill_zero() const {
    if (nbytes()) {
        std::memset(data_, 0, nbytes());
    }
}

void Tensor::check_dtype(DType want) const {
    EPO_CHECK(dtype_ == want, "tensor {} holds {}, accessed as {}", shape_.str(),
              dtype_name(dtype_), dtype_name(want));
}

void check_tensor(const Tensor& t, const Shape& shape, DType dtype, const char* what) {
    EPO_CHECK(t.shape() == shape && t.dtype() == dtype, "{} is {} {}, expected {} {}", what,
              dtype_name(t.dtype()), t.shape().str(), dtype_name(dtype), shape.str());
}

}  // namespace epo
