#include "epo/kernels/gemm.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "epo/kernels/cpu_features.h"
#include "epo/kernels/gemm_reference.h"
#include "epo/tensor/random.h"
#include "tensor/mapping_test_util.h"

namespace epo::kernels {
namespace {

struct Case {
    std::int64_t m, k, n;
    DType ab;
    DType c;
    bool trans_a, trans_b, accumulate;
};

// Operands with a leading dimension wider than the matrix, to exercise sub-matrix views.
Tensor make_operand(std::int64_t rows, std::int64_t cols, DType dt, std::uint64_t seed) {
    Tensor t = Tensor::empty({rows, cols + 3}, dt);
    fill_normal(t, seed, 0.0f, 1.0f);
    return t;
}

Matrix view(const Tensor& t, std::int64_t rows, std::int64_t cols) {
    return Matrix{t.raw(), t.dtype(), rows, cols, t.dim(1)};
}

float get(const Matrix& m, std::int64_t i, std::int64_t j) {
    const std::size_t off = static_cast<std::size_t>(i * m.ld + j);
    return m.dtype == DType::kBF16 ? bf16_to_float(static_cast<BF16*>(m.data)[off])
                                   : static_cast<float*>(m.data)[off];
}

void run_case(const Case& cs, bool row_tiles, bool packed) {
    SCOPED_TRACE(::testing::Message()
                 << cs.m << "x" << cs.k << "x" << cs.n << " " << dtype_name(cs.ab) << "->"
                 << dtype_name(cs.c) << " ta=" << cs.trans_a << " tb=" << cs.trans_b
                 << " acc=" << cs.accumulate << " tiles=" << row_tiles << " packed=" << packed);
    Tensor ta =
        cs.trans_a ? make_operand(cs.k, cs.m, cs.ab, 1) : make_operand(cs.m, cs.k, cs.ab, 1);
    Tensor tb =
        cs.trans_b ? make_operand(cs.n, cs.k, cs.ab, 2) : make_operand(cs.k, cs.n, cs.ab, 2);
    Tensor tc = make_operand(cs.m, cs.n, cs.c, 3);
    Tensor tr = tc.clone();
    const Matrix a = cs.trans_a ? view(ta, cs.k, cs.m) : view(ta, cs.m, cs.k);
    const Matrix b = cs.trans_b ? view(tb, cs.n, cs.k) : view(tb, cs.k, cs.n);
    const Matrix c = view(tc, cs.m, cs.n);
    const Matrix r = view(tr, cs.m, cs.n);
    GemmOptions o{cs.trans_a, cs.trans_b, cs.accumulate, row_tiles};
    if (packed) {
        PackedMatrix p = pack_b(b, cs.trans_b);
        GemmOptions po = o;
        po.trans_b = false;
        gemm(a, p, c, po);
    } else {
        gemm(a, b, c, o);
    }
    gemm_reference(a, b, r, o);
    // f32 accumulation of K products of N(0,1) values vs a double reference; bf16 results also
    // carry one rounding (relative 2^-9).
    const double abs_tol = 2e-6 * static_cast<double>(cs.k) + 1e-5;
    for (std::int64_t i = 0; i < cs.m; ++i) {
        for (std::int64_t j = 0; j < cs.n; ++j) {
            const double want = get(r, i, j), have = get(c, i, j);
            const double tol = abs_tol + (cs.c == DType::kBF16 ? std::fabs(want) / 128 : 0);
            ASSERT_NEAR(have, want, tol) << "at " << i << "," << j;
        }
    }
    // The padding columns beyond the view are untouched.
    for (std::int64_t i = 0; i < cs.m; ++i) {
        for (std::int64_t j = cs.n; j < cs.n + 3; ++j) {
            const std::size_t off = static_cast<std::size_t>(i * tc.dim(1) + j);
            ASSERT_EQ(std::memcmp(static_cast<char*>(tc.raw()) + off * dtype_size(cs.c),
                                  static_cast<char*>(tr.raw()) + off * dtype_size(cs.c),
                                  dtype_size(cs.c)),
                      0);
        }
    }
}

TEST(Gemm, MatchesReferenceForEveryLayoutAndType) {
    for (DType ab : {DType::kF32, DType::kBF16}) {
        for (bool ta : {false, true}) {
            for (bool tb : {false, true}) {
                run_case({37, 29, 23, ab, DType::kF32, ta, tb, false}, false, false);
                run_case({37, 29, 23, ab, DType::kF32, ta, tb, true}, false, false);
            }
        }
    }
    run_case({19, 64, 40, DType::kBF16, DType::kBF16, false, true, false}, false, false);
    run_case({19, 64, 40, DType::kBF16, DType::kBF16, true, false, false}, true, true);
}

TEST(Gemm, RowTilesMatchReferenceForAwkwardRowCounts) {
    for (std::int64_t m : {1, 15, 16, 17, 255, 256, 257, 300, 529}) {
        run_case({m, 48, 32, DType::kBF16, DType::kF32, false, true, false}, true, false);
        run_case({m, 48, 32, DType::kBF16, DType::kF32, false, false, true}, true, true);
        run_case({m, 48, 32, DType::kF32, DType::kF32, false, true, false}, true, true);
    }
}

TEST(Gemm, PackedWeightsMatchReference) {
    for (DType ab : {DType::kF32, DType::kBF16}) {
        for (bool tb : {false, true}) {
            run_case({70, 96, 50, ab, DType::kF32, false, tb, false}, false, true);
            run_case({70, 96, 50, ab, DType::kF32, true, tb, true}, false, true);
        }
    }
}

TEST(Gemm, RowTilesBoundThePrimitivesCreated) {
    const std::int64_t k = 32, n = 24;
    Tensor a = Tensor::zeros({700, k}, DType::kBF16);
    Tensor b = Tensor::zeros({n, k}, DType::kBF16);
    Tensor c = Tensor::zeros({700, n}, DType::kF32);
    const GemmOptions o{false, true, false, true};
    const auto before = gemm_cache_stats().creations;
    for (std::int64_t m = 1; m <= 700; ++m) {
        gemm(sub_rows(as_matrix(a), 0, m), as_matrix(b), sub_rows(as_matrix(c), 0, m), o);
    }
    // One full tile, four power-of-two pieces (128..16) and at most 15 tails.
    EXPECT_LE(gemm_cache_stats().creations - before, 20);
}

// The execution totals count every oneDNN call a product makes: its FLOPs exactly (2 M N K over
// the row pieces, packed or plain B) and some time.
TEST(Gemm, StatsCountTheFlopsAndTimeOfEveryExecution) {
    const std::int64_t m = 300, k = 64, n = 48;  // 300 rows: a tile and pieces with row_tiles
    Tensor a = Tensor::zeros({m, k}, DType::kBF16);
    Tensor b = Tensor::zeros({n, k}, DType::kBF16);
    Tensor c = Tensor::zeros({m, n}, DType::kF32);
    const PackedMatrix packed = pack_b(as_matrix(b), true);
    const GemmCacheStats before = gemm_cache_stats();
    gemm(as_matrix(a), as_matrix(b), as_matrix(c), {false, true, false, false});
    gemm(as_matrix(a), as_matrix(b), as_matrix(c), {false, true, false, true});
    gemm(as_matrix(a), packed, as_matrix(c), {false, false, true, true});
    const GemmCacheStats after = gemm_cache_stats();
    EXPECT_EQ(after.flops - before.flops, 3.0 * 2 * m * n * k);
    EXPECT_GT(after.exec_seconds, before.exec_seconds);
    EXPECT_EQ(after.calls - before.calls, 1 + 2 * 3);  // whole; 256 + 32 + 12 rows, twice
}

long minor_faults() {
    rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

// oneDNN's weight-gradient kernel mallocs megabytes of packing buffers on every call and frees
// them after. With glibc's defaults, whether such a block comes back without page faults depends
// on the process's history (its thresholds adapt; a heap top over the trim threshold goes back to
// the OS): in the benchmark layer the same step faulted ~1,200 pages back in every time. Once a
// product has run, freed memory is kept: the next block of that size reuses the same pages.
TEST(Gemm, FreedMemoryIsReusedWithoutPageFaultsOnceProductsRun) {
#if defined(__SANITIZE_ADDRESS__)
    GTEST_SKIP() << "AddressSanitizer has its own allocator";
#endif
    Tensor a = Tensor::zeros({16, 16}, DType::kF32), c = Tensor::zeros({16, 16}, DType::kF32);
    gemm(as_matrix(a), as_matrix(a), as_matrix(c));
    const std::size_t bytes = std::size_t{24} << 20;  // larger than any block freed before
    auto touch = [&] {
        char* p = static_cast<char*>(std::malloc(bytes));
        ASSERT_NE(p, nullptr);
        std::memset(p, 1, bytes);
        std::free(p);
    };
    touch();
    const long before = minor_faults();
    touch();
    EXPECT_EQ(minor_faults() - before, 0);
}

// for_each_row_tile is the decomposition row_tiles products use: its pieces cover [0, M) in
// order, and a product run piece by piece gives the bits of the whole row-tiled product (the
// experts rely on this to run fc1, the activation and fc2 one tile at a time).
TEST(Gemm, RowTilePiecesCoverTheRowsAndGiveTheWholeProductsBits) {
    Tensor w = make_operand(40, 48, DType::kBF16, 8);
    PackedMatrix p = pack_b(view(w, 40, 48), true);
    const GemmOptions tiles{false, false, false, true};
    for (std::int64_t m : {std::int64_t{1}, std::int64_t{15}, std::int64_t{16}, std::int64_t{31},
                           std::int64_t{256}, std::int64_t{257}, 2 * kGemmRowTile + 100}) {
        SCOPED_TRACE(m);
        std::int64_t next = 0;
        for_each_row_tile(m, [&](std::int64_t m0, std::int64_t rows) {
            EXPECT_EQ(m0, next);
            EXPECT_GT(rows, 0);
            EXPECT_LE(rows, kGemmRowTile);
            next = m0 + rows;
        });
        EXPECT_EQ(next, m);
        Tensor a = make_operand(m, 48, DType::kBF16, 9);
        Tensor whole = Tensor::zeros({m, 40}, DType::kF32), pieces = whole.clone();
        gemm(view(a, m, 48), p, as_matrix(whole), tiles);
        for_each_row_tile(m, [&](std::int64_t m0, std::int64_t rows) {
            gemm(sub_rows(view(a, m, 48), m0, rows), p, sub_rows(as_matrix(pieces), m0, rows),
                 tiles);
        });
        EXPECT_EQ(std::memcmp(whole.raw(), pieces.raw(), whole.nbytes()), 0);
    }
}

TEST(Gemm, DeterministicRunToRun) {
    Tensor a = make_operand(300, 200, DType::kBF16, 4);
    Tensor b = make_operand(150, 200, DType::kBF16, 5);
    Tensor c1 = Tensor::zeros({300, 150}, DType::kF32);
    Tensor c2 = Tensor::zeros({300, 150}, DType::kF32);
    const GemmOptions o{false, true, false, true};
    gemm(view(a, 300, 200), view(b, 150, 200), as_matrix(c1), o);
    gemm(view(a, 300, 200), view(b, 150, 200), as_matrix(c2), o);
    EXPECT_EQ(std::memcmp(c1.raw(), c2.raw(), c1.nbytes()), 0);
}

TEST(Gemm, EmptyDimensions) {
    Tensor a = Tensor::zeros({4, 0}, DType::kF32);
    Tensor b = Tensor::zeros({0, 3}, DType::kF32);
    Tensor c = Tensor::empty({4, 3}, DType::kF32);
    for (int i = 0; i < 12; ++i) {
        c.data<float>()[i] = 7;
    }
    gemm(as_matrix(a, 4, 0), as_matrix(b, 0, 3), as_matrix(c), {false, false, true, false});
    EXPECT_EQ(c.data<float>()[5], 7.0f);  // accumulate of an empty sum leaves C
    gemm(as_matrix(a, 4, 0), as_matrix(b, 0, 3), as_matrix(c));
    EXPECT_EQ(c.data<float>()[5], 0.0f);  // overwrite with an empty sum is zero
    Tensor z = Tensor::zeros({0, 3}, DType::kF32);
    gemm(as_matrix(Tensor::zeros({0, 5}, DType::kF32), 0, 5),
         as_matrix(Tensor::zeros({5, 3}, DType::kF32)), as_matrix(z, 0, 3));
}

TEST(Gemm, BadOperandsAreErrors) {
    Tensor a = Tensor::zeros({4, 5}, DType::kF32);
    Tensor b = Tensor::zeros({6, 3}, DType::kF32);
    Tensor bb = Tensor::zeros({5, 3}, DType::kBF16);
    Tensor c = Tensor::zeros({4, 3}, DType::kF32);
    Tensor cb = Tensor::zeros({4, 3}, DType::kBF16);
    EXPECT_THROW(gemm(as_matrix(a), as_matrix(b), as_matrix(c)), Error);
    EXPECT_THROW(gemm(as_matrix(a), as_matrix(bb), as_matrix(c)), Error);
    Tensor b5 = Tensor::zeros({5, 3}, DType::kF32);
    EXPECT_THROW(gemm(as_matrix(a), as_matrix(b5), as_matrix(cb)), Error);  // f32 x f32 -> bf16
}

// On CPUs with AVX512-BF16, packed bf16 weights must run oneDNN's fast kernel for every row
// piece the tiling produces (a reference fallback would be ~100x slower).
TEST(Gemm, PackedBf16UsesTheFastKernelForEveryRowPiece) {
    if (!cpu_features().avx512_bf16) {
        GTEST_SKIP() << "no AVX512-BF16 on this CPU";
    }
    Tensor w = make_operand(768, 256, DType::kBF16, 6);
    PackedMatrix p = pack_b(view(w, 768, 256), true);
    Tensor a = Tensor::zeros({kGemmRowTile, 256}, DType::kBF16);
    Tensor c = Tensor::zeros({kGemmRowTile, 768}, DType::kF32);
    for (std::int64_t m = 1; m <= kGemmRowTile; ++m) {
        const std::string impl =
            gemm_impl_name(sub_rows(as_matrix(a), 0, m), p, sub_rows(as_matrix(c), 0, m));
        ASSERT_EQ(impl.rfind("brg", 0), 0u) << "rows " << m << ": " << impl;
    }
}

// Packed expert weights (tens of MB over the experts) are read by every product: 4 KiB pages made
// the grouped experts 20% slower than plain weights (moe_bench BM_ExpertFfn), so large packed
// buffers are in huge-page storage like tensors.
TEST(Gemm, LargePackedWeightsGetHugePages) {
    Tensor w = make_operand(1536, 2048, DType::kBF16, 7);
    PackedMatrix p = pack_b(view(w, 1536, 2048), true);
    ASSERT_GE(p.nbytes(), std::size_t{2} << 20);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p.data()) % (std::uintptr_t{2} << 20), 0u);
    const int eligible = test::thp_eligible(p.data());
    if (eligible >= 0 && test::thp_enabled()) {
        EXPECT_EQ(eligible, 1);
    }
}

TEST(CpuFeatures, ReportsSomething) {
    EXPECT_FALSE(cpu_features_string().empty());
}

}  // namespace
}  // namespace epo::kernels
