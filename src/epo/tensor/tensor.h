// Tensor: a shape (up to 4 dimensions), an element type and a pointer to contiguous row-major
// storage, either owned (shared by copies of the handle) or a view into memory someone else owns
// (an Arena, a file buffer, a sub-range of another tensor).
//
// Deliberately not a tensor framework: no strides, no broadcasting, no autograd, no operator
// overloading. Kernels take raw pointers and sizes; Tensor only carries them around with their
// shape and dtype and checks that callers agree on both. Copying a Tensor copies the handle (the
// storage is shared, as with a pointer); clone() copies the data.
//
// Dimension letters used across the project: T tokens, H hidden, E experts, K top-k,
// F expert FFN, S shared-expert FFN, R routed rows.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "epo/core/error.h"
#include "epo/tensor/bf16.h"

namespace epo {

enum class DType : std::uint8_t { kF32, kBF16, kI32, kI64 };

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "f32", "bf16", "i32", "i64"

// The C++ element type of each dtype, for Tensor::data<T>() checks.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
    return DType::kF32;
}
template <>
constexpr DType dtype_of<BF16>() {
    return DType::kBF16;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
    return DType::kI32;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
    return DType::kI64;
}

inline constexpr int kMaxTensorRank = 4;

struct Shape {
    std::array<std::int64_t, kMaxTensorRank> dims{};
    int rank = 0;

    Shape() = default;
    Shape(std::initializer_list<std::int64_t> d);  // Shape{T, H}; every size must be >= 0

    std::int64_t operator[](int i) const { return dims[static_cast<std::size_t>(i)]; }
    std::int64_t numel() const;
    bool operator==(const Shape& other) const;
    bool operator!=(const Shape& other) const { return !(*this == other); }
    std::string str() const;  // "[4, 2048]"; "[]" for a scalar
};

// Owned, 64-byte aligned storage of `bytes` (at least one line), as Tensor::empty allocates it:
// 2 MiB and larger blocks get their own mapping on 2 MiB boundaries with transparent huge pages
// requested. Also for derived buffers that large kernels stream through (oneDNN-packed weights).
std::shared_ptr<void> allocate_storage(std::size_t bytes);

class Tensor {
public:
    Tensor() = default;  // undefined: no storage, defined() is false

    // Owned, 64-byte aligned storage. empty() leaves the contents uninitialized.
    static Tensor empty(const Shape& shape, DType dtype);
    static Tensor zeros(const Shape& shape, DType dtype);
    // A view of memory the caller keeps alive for as long as the tensor is used.
    static Tensor wrap(void* data, const Shape& shape, DType dtype);

    bool defined() const { return data_ != nullptr || shape_.numel() == 0; }
    DType dtype() const { return dtype_; }
    const Shape& shape() const { return shape_; }
    int rank() const { return shape_.rank; }
    std::int64_t dim(int i) const;  // negative i counts from the end
    std::int64_t numel() const { return shape_.numel(); }
    std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
    // Elements per index of dimension 0 (the product of the other dimensions).
    std::int64_t row_size() const;

    void* raw() const { return data_; }
    template <typename T>
    T* data() const {
        check_dtype(dtype_of<T>());
        return static_cast<T*>(data_);
    }

    // View of rows [begin, end) along dimension 0; shares storage.
    Tensor rows(std::int64_t begin, std::int64_t end) const;
    // View with another shape of the same number of elements; shares storage.
    Tensor view(const Shape& shape) const;
    // A deep copy with owned storage.
    Tensor clone() const;
    // Copies the elements of `src` (same dtype and number of elements) into this tensor.
    void copy_from(const Tensor& src) const;
    void fill_zero() const;

private:
    void check_dtype(DType want) const;

    std::shared_ptr<void> owner_;  // null for views
    void* data_ = nullptr;
    Shape shape_;
    DType dtype_ = DType::kF32;
};

// Both tensors have this shape and dtype, or an epo::Error (kInternal) names `what`.
void check_tensor(const Tensor& t, const Shape& shape, DType dtype, const char* what);

}  // namespace epo
