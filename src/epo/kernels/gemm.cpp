// oneDNN matmul with a process-wide primitive cache.
//
// Why a cache of our own: oneDNN's creation of a matmul primitive JIT-compiles kernels (~0.5-1 ms
// here); the cache maps every call shape (sizes, leading dimensions, dtypes, transposes,
// accumulate, weight layout) to a ready primitive. Scratchpads are user-managed from a growing
// per-thread buffer, so executions allocate nothing once warm (no page faults in steady state).
#include "epo/kernels/gemm.h"

#include <malloc.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <list>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

namespace epo::kernels {
namespace {

using dnnl::memory;

// oneDNN's weight-gradient kernel (gemm:jit) mallocs its packing buffers (~1-4 MiB) on every
// call and frees them after. With glibc's defaults such a block may come from mmap or sit at the
// top of the heap, and free() then returns it to the OS, so the next call faults its pages in
// again: ~1,200 page faults per MoE layer step at 4096 tokens, 10-25 us each on this machine,
// depending only on the order of the calls. Keeping freed memory (heap blocks up to 32 MiB, no
// trimming) makes every call reuse the same pages: zero faults in steady state. Set once, before
// the first product.
void keep_freed_memory() {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum; larger blocks are still mapped
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

dnnl::engine& cpu_engine() {
    static dnnl::engine engine = [] {
        keep_freed_memory();
        return dnnl::engine(dnnl::engine::kind::cpu, 0);
    }();
    return engine;
}

dnnl::stream& thread_stream() {
    thread_local dnnl::stream stream(cpu_engine());
    return stream;
}

// Scratch memory for oneDNN (packing buffers of the operands), grown on demand and kept.
void* thread_scratchpad(std::size_t bytes) {
    struct Buffer {
        void* p = nullptr;
        std::size_t size = 0;
        ~Buffer() { std::free(p); }
    };
    thread_local Buffer buf;
    if (bytes > buf.size) {
        std::free(buf.p);
        const std::size_t size = (bytes + 4095) / 4096 * 4096;
        buf.p = std::aligned_alloc(4096, size);
        if (buf.p == nullptr) {
            throw std::bad_alloc();
        }
        std::memset(buf.p, 0, size);  // fault the pages now, not inside a timed step
        buf.size = size;
    }
    return buf.p;
}

memory::data_type dnnl_type(DType t) {
    switch (t) {
        case DType::kF32:
            return memory::data_type::f32;
        case DType::kBF16:
            return memory::data_type::bf16;
        default:
            break;
    }
    throw Error(ErrorKind::kInternal,
                fmt::format("gemm: operands of type {} are not supported", dtype_name(t)));
}

// Distinct packed weight layouts, so the cache key can name one with a small integer.
struct PackedFormats {
    std::mutex mu;
    std::vector<memory::desc> descs;
    int id_of(const memory::desc& d) {
        std::lock_guard<std::mutex> lock(mu);
        for (std::size_t i = 0; i < descs.size(); ++i) {
            if (descs[i] == d) {
                return static_cast<int>(i);
            }
        }
        descs.push_back(d);
        return static_cast<int>(descs.size() - 1);
    }
    memory::desc get(int id) {
        std::lock_guard<std::mutex> lock(mu);
        return descs[static_cast<std::size_t>(id)];
    }
};

PackedFormats& packed_formats() {
    static PackedFormats formats;
    return formats;
}

struct Key {
    std::int64_t m, k, n, lda, ldb, ldc;
    DType ab_type, c_type;
    bool trans_a, trans_b, accumulate;
    int b_format;  // -1: plain B with ldb/trans_b; otherwise a packed layout id

    bool operator==(const Key& o) const {
        return m == o.m && k == o.k && n == o.n && lda == o.lda && ldb == o.ldb && ldc == o.ldc &&
               ab_type == o.ab_type && c_type == o.c_type && trans_a == o.trans_a &&
               trans_b == o.trans_b && accumulate == o.accumulate && b_format == o.b_format;
    }
};

struct KeyHash {
    std::size_t operator()(const Key& k) const {
        std::uint64_t h = 1469598103934665603ull;
        auto mix = [&](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
        mix(static_cast<std::uint64_t>(k.m));
        mix(static_cast<std::uint64_t>(k.k));
        mix(static_cast<std::uint64_t>(k.n));
        mix(static_cast<std::uint64_t>(k.lda));
        mix(static_cast<std::uint64_t>(k.ldb));
        mix(static_cast<std::uint64_t>(k.ldc));
        mix(static_cast<std::uint64_t>(k.ab_type) | static_cast<std::uint64_t>(k.c_type) << 8 |
            static_cast<std::uint64_t>(k.trans_a) << 16 |
            static_cast<std::uint64_t>(k.trans_b) << 17 |
            static_cast<std::uint64_t>(k.accumulate) << 18);
        mix(static_cast<std::uint64_t>(k.b_format + 1));
        return static_cast<std::size_t>(h);
    }
};

struct Prim {
    dnnl::matmul matmul;
    memory::desc a_md, b_md, c_md;
    std::size_t scratch_bytes = 0;
    std::string impl;
};

memory::desc a_desc(const Key& k) {
    return k.trans_a ? memory::desc({k.m, k.k}, dnnl_type(k.ab_type), memory::dims{1, k.lda})
                     : memory::desc({k.m, k.k}, dnnl_type(k.ab_type), memory::dims{k.lda, 1});
}

memory::desc b_desc(const Key& k) {
    if (k.b_format >= 0) {
        return packed_formats().get(k.b_format);
    }
    return k.trans_b ? memory::desc({k.k, k.n}, dnnl_type(k.ab_type), memory::dims{1, k.ldb})
                     : memory::desc({k.k, k.n}, dnnl_type(k.ab_type), memory::dims{k.ldb, 1});
}

memory::desc c_desc(const Key& k) {
    return memory::desc({k.m, k.n}, dnnl_type(k.c_type), memory::dims{k.ldc, 1});
}

// LRU cache of primitives. Entries are shared so an eviction never frees a running primitive.
class PrimitiveCache {
public:
    static constexpr std::size_t kCapacity = 4096;

    std::shared_ptr<const Prim> get(const Key& key) {
        ++calls_;
        {
            std::lock_guard<std::mutex> lock(mu_);
            auto it = map_.find(key);
            if (it != map_.end()) {
                lru_.splice(lru_.begin(), lru_, it->second);
                return it->second->second;
            }
        }
        // Create outside the lock (it takes ~1 ms); a racing thread may create the same one,
        // in which case the first inserted wins.
        const auto t0 = std::chrono::steady_clock::now();
        auto prim = create(key);
        const double dt =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::lock_guard<std::mutex> lock(mu_);
        ++creations_;
        create_seconds_ += dt;
        auto it = map_.find(key);
        if (it != map_.end()) {
            return it->second->second;
        }
        lru_.emplace_front(key, prim);
        map_.emplace(key, lru_.begin());
        if (lru_.size() > kCapacity) {
            map_.erase(lru_.back().first);
            lru_.pop_back();
        }
        return prim;
    }

    GemmCacheStats stats() {
        std::lock_guard<std::mutex> lock(mu_);
        GemmCacheStats s;
        s.calls = calls_.load();
        s.creations = creations_;
        s.entries = static_cast<std::int64_t>(lru_.size());
        s.create_seconds = create_seconds_;
        return s;
    }

    void clear() {
        std::lock_guard<std::mutex> lock(mu_);
        map_.clear();
        lru_.clear();
    }

private:
    static std::shared_ptr<const Prim> create(const Key& key) {
        auto p = std::make_shared<Prim>();
        p->a_md = a_desc(key);
        p->b_md = b_desc(key);
        p->c_md = c_desc(key);
        dnnl::primitive_attr attr;
        attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        if (key.accumulate) {
            dnnl::post_ops ops;
            ops.append_sum(1.0f);
            attr.set_post_ops(ops);
        }
        dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p->a_md, p->b_md, p->c_md), attr,
                                        cpu_engine());
        p->scratch_bytes = pd.scratchpad_desc().get_size();
        p->impl = pd.impl_info_str();
        p->matmul = dnnl::matmul(pd);
        return p;
    }

    std::mutex mu_;
    std::list<std::pair<Key, std::shared_ptr<const Prim>>> lru_;
    std::unordered_map<Key, decltype(lru_)::iterator, KeyHash> map_;
    std::atomic<std::int64_t> calls_{0};
    std::int64_t creations_ = 0;
    double create_seconds_ = 0;
};

PrimitiveCache& cache() {
    static PrimitiveCache c;
    return c;
}

void execute(const Prim& p, const void* a, const void* b, void* c) {
    dnnl::engine& eng = cpu_engine();
    memory am(p.a_md, eng, const_cast<void*>(a));
    memory bm(p.b_md, eng, const_cast<void*>(b));
    memory cm(p.c_md, eng, c);
    if (p.scratch_bytes) {
        memory sm(memory::desc({static_cast<memory::dim>(p.scratch_bytes)}, memory::data_type::u8,
                               memory::dims{1}),
                  eng, thread_scratchpad(p.scratch_bytes));
        p.matmul.execute(thread_stream(), {{DNNL_ARG_SRC, am},
                                           {DNNL_ARG_WEIGHTS, bm},
                                           {DNNL_ARG_DST, cm},
                                           {DNNL_ARG_SCRATCHPAD, sm}});
    } else {
        p.matmul.execute(thread_stream(),
                         {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    }
}

// Execution totals for GemmCacheStats: what the products cost where they run (a benchmark of a
// whole layer reads its GEMM rate from them). Two clock reads per call, ~40 ns.
struct ExecTotals {
    std::atomic<std::int64_t> nanoseconds{0};
    std::atomic<std::int64_t> flops{0};
};

ExecTotals& exec_totals() {
    static ExecTotals t;
    return t;
}

void timed_execute(const Prim& p, const Key& key, const void* a, const void* b, void* c) {
    const auto t0 = std::chrono::steady_clock::now();
    execute(p, a, b, c);
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    ExecTotals& t = exec_totals();
    t.nanoseconds.fetch_add(ns, std::memory_order_relaxed);
    t.flops.fetch_add(2 * key.m * key.n * key.k, std::memory_order_relaxed);
}

struct Dims {
    std::int64_t m, k, n;
};

void check_matrix(const Matrix& x, const char* what) {
    EPO_CHECK(x.rows >= 0 && x.cols >= 0 && x.ld >= x.cols,
              "gemm: {} is {}x{} with leading dimension {}", what, x.rows, x.cols, x.ld);
    EPO_CHECK(x.data != nullptr || x.rows * x.cols == 0, "gemm: {} has no data", what);
}

Dims check_args(const Matrix& a, std::int64_t b_rows, std::int64_t b_cols, DType b_type,
                const Matrix& c, const GemmOptions& o) {
    check_matrix(a, "A");
    check_matrix(c, "C");
    const std::int64_t m = o.trans_a ? a.cols : a.rows;
    const std::int64_t k = o.trans_a ? a.rows : a.cols;
    const std::int64_t kb = o.trans_b ? b_cols : b_rows;
    const std::int64_t n = o.trans_b ? b_rows : b_cols;
    EPO_CHECK(k == kb && c.rows == m && c.cols == n,
              "gemm: op(A) is {}x{}, op(B) is {}x{}, C is {}x{}", m, k, kb, n, c.rows, c.cols);
    EPO_CHECK(a.dtype == b_type && (a.dtype == DType::kF32 || a.dtype == DType::kBF16),
              "gemm: A is {} and B is {} (both f32 or both bf16)", dtype_name(a.dtype),
              dtype_name(b_type));
    EPO_CHECK(c.dtype == DType::kF32 ||
                  (c.dtype == DType::kBF16 && a.dtype == DType::kBF16 && !o.accumulate),
              "gemm: C is {} with {} operands{} (bf16 C needs bf16 operands, no accumulate)",
              dtype_name(c.dtype), dtype_name(a.dtype), o.accumulate ? " and accumulate" : "");
    return Dims{m, k, n};
}

void zero_c(const Matrix& c) {
    const std::size_t row_bytes = static_cast<std::size_t>(c.cols) * dtype_size(c.dtype);
    for (std::int64_t i = 0; i < c.rows; ++i) {
        std::memset(
            static_cast<char*>(c.data) + static_cast<std::size_t>(i * c.ld) * dtype_size(c.dtype),
            0, row_bytes);
    }
}

// Runs the product over the rows of A/C, whole or as cached row tiles.
template <typename RunRows>
void for_each_row_piece(std::int64_t m, bool row_tiles, RunRows run) {
    if (!row_tiles) {
        run(0, m);
        return;
    }
    for_each_row_tile(m, run);
}

Key make_key(const Matrix& a, const Matrix& c, Dims d, std::int64_t ldb, int b_format,
             const GemmOptions& o) {
    return Key{d.m,     d.k,     d.n,       a.ld,      ldb,          c.ld,
               a.dtype, c.dtype, o.trans_a, o.trans_b, o.accumulate, b_format};
}

const void* a_rows(const Matrix& a, bool trans_a, std::int64_t m0) {
    const std::size_t off = static_cast<std::size_t>(trans_a ? m0 : m0 * a.ld);
    return static_cast<const char*>(a.data) + off * dtype_size(a.dtype);
}

void* c_rows(const Matrix& c, std::int64_t m0) {
    return static_cast<char*>(c.data) + static_cast<std::size_t>(m0 * c.ld) * dtype_size(c.dtype);
}

}  // namespace

struct PackedMatrix::Impl {
    memory::desc desc;
    int format_id = -1;
    std::int64_t k = 0, n = 0;
    DType dtype = DType::kF32;
    std::size_t bytes = 0;
    std::shared_ptr<void> storage;  // huge-page backed when large (allocate_storage)
};

PackedMatrix::PackedMatrix() = default;
PackedMatrix::PackedMatrix(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PackedMatrix::~PackedMatrix() = default;
PackedMatrix::PackedMatrix(PackedMatrix&&) noexcept = default;
PackedMatrix& PackedMatrix::operator=(PackedMatrix&&) noexcept = default;
const void* PackedMatrix::data() const {
    return impl_ ? impl_->storage.get() : nullptr;
}
bool PackedMatrix::empty() const {
    return impl_ == nullptr;
}
std::int64_t PackedMatrix::k() const {
    return impl_ ? impl_->k : 0;
}
std::int64_t PackedMatrix::n() const {
    return impl_ ? impl_->n : 0;
}
DType PackedMatrix::dtype() const {
    return impl_ ? impl_->dtype : DType::kF32;
}
std::size_t PackedMatrix::nbytes() const {
    return impl_ ? impl_->bytes : 0;
}

Matrix as_matrix(const Tensor& t) {
    if (t.rank() == 1) {
        return Matrix{t.raw(), t.dtype(), 1, t.dim(0), t.dim(0)};
    }
    EPO_CHECK(t.rank() >= 2, "as_matrix of a rank-{} tensor", t.rank());
    return Matrix{t.raw(), t.dtype(), t.dim(0), t.row_size(), t.row_size()};
}

Matrix as_matrix(const Tensor& t, std::int64_t rows, std::int64_t cols) {
    EPO_CHECK(rows * cols == t.numel(), "as_matrix {}x{} of a tensor {}", rows, cols,
              t.shape().str());
    return Matrix{t.raw(), t.dtype(), rows, cols, cols};
}

Matrix sub_rows(const Matrix& m, std::int64_t begin, std::int64_t count) {
    EPO_CHECK(begin >= 0 && count >= 0 && begin + count <= m.rows, "rows [{}, +{}) of {} rows",
              begin, count, m.rows);
    Matrix r = m;
    r.data =
        static_cast<char*>(m.data) + static_cast<std::size_t>(begin * m.ld) * dtype_size(m.dtype);
    r.rows = count;
    return r;
}

Matrix sub_cols(const Matrix& m, std::int64_t begin, std::int64_t count) {
    EPO_CHECK(begin >= 0 && count >= 0 && begin + count <= m.cols, "cols [{}, +{}) of {} cols",
              begin, count, m.cols);
    Matrix r = m;
    r.data = static_cast<char*>(m.data) + static_cast<std::size_t>(begin) * dtype_size(m.dtype);
    r.cols = count;
    return r;
}

PackedMatrix pack_b(const Matrix& b, bool trans_b) {
    check_matrix(b, "B");
    const std::int64_t k = trans_b ? b.cols : b.rows;
    const std::int64_t n = trans_b ? b.rows : b.cols;
    EPO_CHECK(k > 0 && n > 0, "pack_b of an empty {}x{} matrix", k, n);
    // Ask oneDNN which weight layout it wants for these sizes (the same for every row count:
    // checked by the tests for each row-tile size).
    const memory::data_type t = dnnl_type(b.dtype);
    memory::desc a_md({kGemmRowTile, k}, t, memory::dims{k, 1});
    memory::desc any_md({k, n}, t, memory::format_tag::any);
    memory::desc c_md({kGemmRowTile, n}, memory::data_type::f32, memory::dims{n, 1});
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, any_md, c_md), cpu_engine());

    auto impl = std::make_unique<PackedMatrix::Impl>();
    impl->desc = pd.weights_desc();
    impl->format_id = packed_formats().id_of(impl->desc);
    impl->k = k;
    impl->n = n;
    impl->dtype = b.dtype;
    impl->bytes = impl->desc.get_size();
    // Packed weights are streamed by every product of every expert: 4 KiB pages would cost TLB
    // misses across the experts' copies (tens of MB), so they get huge pages like tensors do.
    impl->storage = allocate_storage(impl->bytes);
    std::memset(impl->storage.get(), 0, impl->bytes);
    PackedMatrix packed(std::move(impl));
    repack_b(packed, b, trans_b);
    return packed;
}

void repack_b(PackedMatrix& packed, const Matrix& b, bool trans_b) {
    EPO_CHECK(!packed.empty(), "repack_b into an empty PackedMatrix");
    PackedMatrix::Impl& p = *packed.impl();
    const std::int64_t k = trans_b ? b.cols : b.rows;
    const std::int64_t n = trans_b ? b.rows : b.cols;
    EPO_CHECK(k == p.k && n == p.n && b.dtype == p.dtype, "repack_b: {}x{} {} into {}x{} {}", k, n,
              dtype_name(b.dtype), p.k, p.n, dtype_name(p.dtype));
    const memory::data_type t = dnnl_type(b.dtype);
    memory::desc src_md = trans_b ? memory::desc({k, n}, t, memory::dims{1, b.ld})
                                  : memory::desc({k, n}, t, memory::dims{b.ld, 1});
    dnnl::engine& eng = cpu_engine();
    memory src(src_md, eng, b.data);
    memory dst(p.desc, eng, p.storage.get());
    dnnl::reorder(src, dst).execute(thread_stream(), src, dst);
}

void gemm(const Matrix& a, const Matrix& b, const Matrix& c, const GemmOptions& opts) {
    check_matrix(b, "B");
    const Dims d = check_args(a, b.rows, b.cols, b.dtype, c, opts);
    if (d.m == 0 || d.n == 0) {
        return;
    }
    if (d.k == 0) {
        if (!opts.accumulate) {
            zero_c(c);
        }
        return;
    }
    for_each_row_piece(d.m, opts.row_tiles, [&](std::int64_t m0, std::int64_t rows) {
        Key key = make_key(a, c, Dims{rows, d.k, d.n}, b.ld, -1, opts);
        auto prim = cache().get(key);
        timed_execute(*prim, key, a_rows(a, opts.trans_a, m0), b.data, c_rows(c, m0));
    });
}

void gemm(const Matrix& a, const PackedMatrix& b, const Matrix& c, const GemmOptions& opts) {
    EPO_CHECK(!b.empty(), "gemm with an empty PackedMatrix");
    EPO_CHECK(!opts.trans_b, "gemm: trans_b with a packed B (packing applies the transpose)");
    const Dims d = check_args(a, b.k(), b.n(), b.dtype(), c, opts);
    if (d.m == 0) {
        return;
    }
    const int format = b.impl()->format_id;
    for_each_row_piece(d.m, opts.row_tiles, [&](std::int64_t m0, std::int64_t rows) {
        Key key = make_key(a, c, Dims{rows, d.k, d.n}, 0, format, opts);
        auto prim = cache().get(key);
        timed_execute(*prim, key, a_rows(a, opts.trans_a, m0), b.impl()->storage.get(),
                      c_rows(c, m0));
    });
}

GemmCacheStats gemm_cache_stats() {
    GemmCacheStats s = cache().stats();
    s.exec_seconds = static_cast<double>(exec_totals().nanoseconds.load()) * 1e-9;
    s.flops = static_cast<double>(exec_totals().flops.load());
    return s;
}
void gemm_cache_clear() {
    cache().clear();
}

std::string gemm_impl_name(const Matrix& a, const Matrix& b, const Matrix& c,
                           const GemmOptions& opts) {
    const Dims d = check_args(a, b.rows, b.cols, b.dtype, c, opts);
    return cache().get(make_key(a, c, d, b.ld, -1, opts))->impl;
}

std::string gemm_impl_name(const Matrix& a, const PackedMatrix& b, const Matrix& c,
                           const GemmOptions& opts) {
    const Dims d = check_args(a, b.k(), b.n(), b.dtype(), c, opts);
    return cache().get(make_key(a, c, d, 0, b.impl()->format_id, opts))->impl;
}

}  // namespace epo::kernels
