// Matrix products through oneDNN (the library behind PyTorch's CPU matmul).
//
//   C[M,N] = op(A)[M,K] · op(B)[K,N]        op(X) = X or X^T as the options say
//   C[M,N] += op(A) · op(B)                 accumulate: C is f32 (gradient-accumulation fusion:
//                                           a weight gradient lands straight in main_grad)
//
// Operands are f32 x f32 or bf16 x bf16; products accumulate in f32; C is f32, or bf16 (rounded
// once at the end, not with accumulate). Matrices are row-major views with a leading dimension,
// so a column block of a wider matrix (e.g. the gate half of [R, 2F]) is a valid operand.
//
// Primitives are created once per distinct call shape and cached (creating one costs ~0.5-1 ms).
// Callers whose row count M changes every call (routed rows per expert) set row_tiles: the rows
// are then computed as fixed-size tiles (kGemmRowTile rows) plus a remainder split into powers of
// two down to 16 rows and a final tail below 16, so any M reuses at most
// 1 + log2(kGemmRowTile / 16) + 15 primitives per (K, N, layout) and no new primitive is ever
// created in steady state (docs/numerics.md gives the measurements behind this choice).
//
// Weights used many times can be packed once into oneDNN's blocked layout (PackedMatrix,
// +4-10% on this machine); a packed B serves every M and row tile.
//
// Determinism: for a fixed OMP thread count, every call with the same shapes gives the same bits.
// Thread safety: calls from several threads are safe (the cache is locked; each thread has its
// own oneDNN stream and scratchpad).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "epo/tensor/tensor.h"

namespace epo::kernels {

// A row-major matrix view: element (i, j) is at data + i * ld + j (in elements).
struct Matrix {
    void* data = nullptr;
    DType dtype = DType::kF32;
    std::int64_t rows = 0;
    std::int64_t cols = 0;
    std::int64_t ld = 0;
};

// A tensor as a matrix: rank 2 as is; rank 1 as one row; higher ranks as [dim0, rest].
Matrix as_matrix(const Tensor& t);
// The storage of `t` viewed as [rows, cols] (rows * cols must equal its element count).
Matrix as_matrix(const Tensor& t, std::int64_t rows, std::int64_t cols);
Matrix sub_rows(const Matrix& m, std::int64_t begin, std::int64_t count);
Matrix sub_cols(const Matrix& m, std::int64_t begin, std::int64_t count);

inline constexpr std::int64_t kGemmRowTile = 256;

// The row pieces a row_tiles product of M rows is computed in, in order: fn(m0, rows) for each.
// A product over one piece with row_tiles set is that piece alone, so a caller can run several
// products tile by tile (e.g. an FFN with its activation between them, the tile still in cache)
// and get exactly the calls, and the bits, of the whole-M products.
template <typename Fn>
void for_each_row_tile(std::int64_t m, Fn&& fn) {
    std::int64_t m0 = 0;
    for (; m - m0 >= kGemmRowTile; m0 += kGemmRowTile) {
        fn(m0, kGemmRowTile);
    }
    for (std::int64_t piece = kGemmRowTile / 2; piece >= 16; piece /= 2) {
        if (m - m0 >= piece) {
            fn(m0, piece);
            m0 += piece;
        }
    }
    if (m0 < m) {
        fn(m0, m - m0);
    }
}

struct GemmOptions {
    bool trans_a = false;     // A is stored as op(A)^T: [K, M]
    bool trans_b = false;     // B is stored as op(B)^T: [N, K]
    bool accumulate = false;  // C += product (C must be f32)
    bool row_tiles = false;   // M varies between calls: compute in cached row-tile sizes
};

// oneDNN's blocked copy of a B operand [K, N], made once and reused by many products.
class PackedMatrix {
public:
    PackedMatrix();
    ~PackedMatrix();
    PackedMatrix(PackedMatrix&&) noexcept;
    PackedMatrix& operator=(PackedMatrix&&) noexcept;

    bool empty() const;
    std::int64_t k() const;
    std::int64_t n() const;
    DType dtype() const;
    std::size_t nbytes() const;
    const void* data() const;  // the blocked buffer (huge-page storage when 2 MiB or larger)

    // Implementation detail (oneDNN descriptor and buffer), made by pack_b().
    struct Impl;
    explicit PackedMatrix(std::unique_ptr<Impl> impl);
    Impl* impl() const { return impl_.get(); }

private:
    std::unique_ptr<Impl> impl_;
};

// Packs op(B) (B stored [K,N], or [N,K] with trans_b). Allocates once.
PackedMatrix pack_b(const Matrix& b, bool trans_b);
// Repacks new values of the same shape and layout into `packed` without allocating.
void repack_b(PackedMatrix& packed, const Matrix& b, bool trans_b);

void gemm(const Matrix& a, const Matrix& b, const Matrix& c, const GemmOptions& opts = {});
// B packed; opts.trans_b must be false (the packing already applied it).
void gemm(const Matrix& a, const PackedMatrix& b, const Matrix& c, const GemmOptions& opts = {});

struct GemmCacheStats {
    std::int64_t calls = 0;      // oneDNN primitive executions
    std::int64_t creations = 0;  // primitives created (cache misses)
    std::int64_t entries = 0;    // primitives held now
    double create_seconds = 0;   // total time spent creating primitives
    double exec_seconds = 0;     // total time inside oneDNN executions (all threads)
    double flops = 0;            // 2 * M * N * K summed over those executions
};
GemmCacheStats gemm_cache_stats();
void gemm_cache_clear();

// oneDNN's name for the implementation a call with these operands uses (e.g.
// "brg:avx512_core_bf16"), for tests and reports. Uses the same cache as gemm().
std::string gemm_impl_name(const Matrix& a, const Matrix& b, const Matrix& c,
                           const GemmOptions& opts = {});
std::string gemm_impl_name(const Matrix& a, const PackedMatrix& b, const Matrix& c,
                           const GemmOptions& opts = {});

}  // namespace epo::kernels
