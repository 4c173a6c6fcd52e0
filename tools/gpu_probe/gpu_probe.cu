// epo-gpu-probe: measures, on one NVIDIA GPU, the kernel rates `epo plan`'s cost model takes
// from its calibration (docs/plan.md "Calibration"), and writes them as a probe file that
// `epo plan --calibrate gpu-probe --probe FILE --out CAL` turns into a calibration file.
//
// Measured (each the median over rounds; one round times everything once, so a change of the
// GPU's clocks between rounds hits all alike):
//   - bf16 matrix products through cuBLAS (f32 accumulation), in the three layouts training runs
//     them in: forward Y = X W^T, input gradient dX = dY W, and weight gradient dW += dY^T X into
//     an f32 gradient (Megatron-Core's gradient_accumulation_fusion), at the widths of an MoE
//     expert (n, k = 4096, 7168) with the token dimension m from 64 to 8192;
//   - a streaming loop a = b + s c over f32 arrays far beyond the caches (the optimizer's kind);
//   - SwiGLU forward and backward over bf16 (rows, 2F) (the element-wise kernels' kind);
//   - the host's cost of one kernel launch, and of one CUDA graph replay of 20 kernels;
//   - compute beside communication: a product's slowdown while a copy kernel of 32 (NCCL's
//     channels) or 24 (DeepEP's SMs) blocks runs on another stream, and the copy's beside
//     products. A local copy runs at HBM speed, far above a link's, so this bounds the memory
//     contention from above; it is recorded, and the planner does not take it for
//     overlap_slowdown (that needs the real collective on several GPUs).
// Nothing here is fitted or judged: the planner does that from the file (plan/gpu_probe.h).
//
// Build: cmake -DEPO_GPU_PROBE=ON (needs the CUDA toolkit), or
//   nvcc -O2 -std=c++17 -o epo-gpu-probe tools/gpu_probe/gpu_probe.cu -lcublas
// Run:   epo-gpu-probe --out probe.json [--seconds S]   (S: per measurement and round)
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void check_cuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
        std::fprintf(stderr, "epo-gpu-probe: %s failed: %s\n", what, cudaGetErrorString(e));
        std::exit(1);
    }
}

void check_cublas(cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "epo-gpu-probe: %s failed: cuBLAS status %d\n", what,
                     static_cast<int>(s));
        std::exit(1);
    }
}

__global__ void fill_kernel(__nv_bfloat16* p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
         i += size_t{gridDim.x} * blockDim.x) {
        unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        h ^= h >> 15;
        p[i] = __float2bfloat16((static_cast<float>(h & 0xffff) / 65535.0f - 0.5f));
    }
}

__global__ void stream_kernel(float* a, const float* b, const float* c, size_t n, float s) {
    for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
         i += size_t{gridDim.x} * blockDim.x)
        a[i] = b[i] + s * c[i];
}

// h: (rows, 2F) [gate | up]; a = silu(gate) * up * prob (the expert activation with the router's
// probability folded in, as the runtime's swiglu does).
__global__ void swiglu_forward(const __nv_bfloat16* h, const float* probs, __nv_bfloat16* a,
                               int64_t rows, int64_t F) {
    const size_t n = static_cast<size_t>(rows * F);
    for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
         i += size_t{gridDim.x} * blockDim.x) {
        const int64_t r = static_cast<int64_t>(i) / F, c = static_cast<int64_t>(i) % F;
        const float g = __bfloat162float(h[r * 2 * F + c]);
        const float u = __bfloat162float(h[r * 2 * F + F + c]);
        const float sg = 1.0f / (1.0f + __expf(-g));
        a[i] = __float2bfloat16(g * sg * u * probs[r]);
    }
}

__global__ void swiglu_backward(const __nv_bfloat16* h, const float* probs, const __nv_bfloat16* da,
                                __nv_bfloat16* dh, int64_t rows, int64_t F) {
    const size_t n = static_cast<size_t>(rows * F);
    for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
         i += size_t{gridDim.x} * blockDim.x) {
        const int64_t r = static_cast<int64_t>(i) / F, c = static_cast<int64_t>(i) % F;
        const float g = __bfloat162float(h[r * 2 * F + c]);
        const float u = __bfloat162float(h[r * 2 * F + F + c]);
        const float d = __bfloat162float(da[i]) * probs[r];
        const float sg = 1.0f / (1.0f + __expf(-g));
        dh[r * 2 * F + c] = __float2bfloat16(d * u * sg * (1.0f + g * (1.0f - sg)));
        dh[r * 2 * F + F + c] = __float2bfloat16(d * g * sg);
    }
}

__global__ void empty_kernel() {}

// A communication kernel's stand-in: `blocks` thread blocks (NCCL's channels, DeepEP's SMs)
// copying `n` 16-byte words `passes` times through device memory.
__global__ void copy_kernel(int4* dst, const int4* src, size_t n, int passes) {
    for (int p = 0; p < passes; ++p) {
        for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
             i += size_t{gridDim.x} * blockDim.x)
            dst[i] = src[i];
    }
}

struct Shape {
    int m, n, k;
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Seconds per call of `fn` (enqueued on the default stream): GPU time between events over as many
// calls as fill about `budget_s`, after a warm-up call.
template <typename Fn>
double gpu_seconds_per_call(Fn&& fn, double budget_s) {
    cudaEvent_t start, stop;
    check_cuda(cudaEventCreate(&start), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
    fn();
    check_cuda(cudaEventRecord(start), "cudaEventRecord");
    fn();
    check_cuda(cudaEventRecord(stop), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    const int calls = std::max(3, static_cast<int>(budget_s * 1e3 / std::max(ms, 1e-3f)));
    check_cuda(cudaEventRecord(start), "cudaEventRecord");
    for (int i = 0; i < calls; ++i)
        fn();
    check_cuda(cudaEventRecord(stop), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return ms * 1e-3 / calls;
}

template <typename T>
T* device_alloc(size_t count, const char* what) {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, count * sizeof(T)), what);
    return static_cast<T*>(p);
}

void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
    fill_kernel<<<1024, 256>>>(p, n, seed);
    check_cuda(cudaGetLastError(), "fill_kernel");
}

std::string json_list(const std::vector<double>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
        char b[64];
        std::snprintf(b, sizeof b, "%s%.6g", i ? ", " : "", v[i]);
        s += b;
    }
    return s + "]";
}

}  // namespace

int main(int argc, char** argv) {
    std::string out;
    double seconds = 0.05;
    int rounds = 5;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--out" && i + 1 < argc) {
            out = argv[++i];
        } else if (a == "--seconds" && i + 1 < argc) {
            seconds = std::atof(argv[++i]);
        } else if (a == "--rounds" && i + 1 < argc) {
            rounds = std::atoi(argv[++i]);
        } else {
            std::fprintf(stderr,
                         "usage: epo-gpu-probe --out FILE [--seconds S (per measurement and "
                         "round, default 0.05)] [--rounds R (default 5)]\n");
            return 2;
        }
    }
    if (out.empty() || !(seconds > 0 && seconds <= 10) || rounds < 1 || rounds > 100) {
        std::fprintf(stderr,
                     "epo-gpu-probe: give --out FILE, --seconds in (0, 10], --rounds in 1..100\n");
        return 2;
    }
    // Before any measurement: the result must have somewhere to go.
    if (FILE* f = std::fopen(out.c_str(), "a")) {
        std::fclose(f);
    } else {
        std::fprintf(stderr, "epo-gpu-probe: --out %s: cannot write there: %s\n", out.c_str(),
                     std::strerror(errno));
        return 1;
    }
    int device = 0;
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    std::printf("[probe] %s, %d SMs, compute capability %d.%d, %.0f GiB, driver %d, runtime %d\n",
                prop.name, prop.multiProcessorCount, prop.major, prop.minor,
                static_cast<double>(prop.totalGlobalMem) / (1 << 30), driver, runtime);

    cublasHandle_t handle;
    check_cublas(cublasCreate(&handle), "cublasCreate");

    const int N = 4096, K = 7168;
    std::vector<Shape> shapes;
    for (int m : {64, 128, 256, 512, 1024, 2048, 4096, 8192})
        shapes.push_back({m, N, K});
    const int max_m = 8192;
    // Operands of the largest shape; the smaller ones use their leading rows.
    __nv_bfloat16* x = device_alloc<__nv_bfloat16>(size_t{max_m} * K, "cudaMalloc x");
    __nv_bfloat16* w = device_alloc<__nv_bfloat16>(size_t{N} * K, "cudaMalloc w");
    __nv_bfloat16* dy = device_alloc<__nv_bfloat16>(size_t{max_m} * N, "cudaMalloc dy");
    __nv_bfloat16* y = device_alloc<__nv_bfloat16>(size_t{max_m} * N, "cudaMalloc y");
    __nv_bfloat16* dx = device_alloc<__nv_bfloat16>(size_t{max_m} * K, "cudaMalloc dx");
    float* dw = device_alloc<float>(size_t{N} * K, "cudaMalloc dw");
    fill(x, size_t{max_m} * K, 1);
    fill(w, size_t{N} * K, 2);
    fill(dy, size_t{max_m} * N, 3);
    check_cuda(cudaMemset(dw, 0, size_t{N} * K * sizeof(float)), "cudaMemset");

    const float one = 1.0f, zero = 0.0f;
    // Row-major products as cuBLAS's column-major ones: a row-major (r, c) matrix is a
    // column-major (c, r) one.
    auto forward = [&](const Shape& s) {  // Y(m,n) = X(m,k) W(n,k)^T  <=>  Y^T = W X^T
        check_cublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, s.n, s.m, s.k, &one, w,
                                  CUDA_R_16BF, s.k, x, CUDA_R_16BF, s.k, &zero, y, CUDA_R_16BF, s.n,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "forward product");
    };
    auto dgrad = [&](const Shape& s) {  // dX(m,k) = dY(m,n) W(n,k)  <=>  dX^T = W^T dY^T
        check_cublas(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, s.k, s.m, s.n, &one, w,
                                  CUDA_R_16BF, s.k, dy, CUDA_R_16BF, s.n, &zero, dx, CUDA_R_16BF,
                                  s.k, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "input-gradient product");
    };
    auto wgrad = [&](const Shape& s) {  // dW(n,k) += dY(m,n)^T X(m,k)  <=>  dW^T += X^T dY
        check_cublas(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, s.k, s.n, s.m, &one, x,
                                  CUDA_R_16BF, s.k, dy, CUDA_R_16BF, s.n, &one, dw, CUDA_R_32F, s.k,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "weight-gradient product");
    };

    // Streaming loop: three f32 arrays of 256 Mi elements (3 GiB), far beyond the L2.
    const size_t sn = size_t{256} << 20;
    float* sa = device_alloc<float>(sn, "cudaMalloc stream a");
    float* sb = device_alloc<float>(sn, "cudaMalloc stream b");
    float* sc = device_alloc<float>(sn, "cudaMalloc stream c");
    check_cuda(cudaMemset(sb, 0, sn * sizeof(float)), "cudaMemset");
    check_cuda(cudaMemset(sc, 0, sn * sizeof(float)), "cudaMemset");
    const int blocks = prop.multiProcessorCount * 8;
    auto stream = [&] { stream_kernel<<<blocks, 256>>>(sa, sb, sc, sn, 0.5f); };
    const double stream_bytes = 12.0 * static_cast<double>(sn);

    // SwiGLU over (rows, 2F): rows 65536, F 2048 (an expert's width in DeepSeek-V3).
    const int64_t rows = 65536, F = 2048;
    __nv_bfloat16* h =
        device_alloc<__nv_bfloat16>(static_cast<size_t>(rows * 2 * F), "cudaMalloc h");
    __nv_bfloat16* act = device_alloc<__nv_bfloat16>(static_cast<size_t>(rows * F), "cudaMalloc a");
    __nv_bfloat16* dh =
        device_alloc<__nv_bfloat16>(static_cast<size_t>(rows * 2 * F), "cudaMalloc dh");
    float* probs = device_alloc<float>(static_cast<size_t>(rows), "cudaMalloc probs");
    fill(h, static_cast<size_t>(rows * 2 * F), 4);
    check_cuda(cudaMemset(probs, 0, rows * sizeof(float)), "cudaMemset");
    auto swiglu = [&] {
        swiglu_forward<<<blocks, 256>>>(h, probs, act, rows, F);
        swiglu_backward<<<blocks, 256>>>(h, probs, act, dh, rows, F);
    };
    // Bytes read and written (bf16 2 bytes; probs are negligible): forward reads 2F writes F,
    // backward reads 2F + F and writes 2F, per row.
    const double swiglu_bytes = 2.0 * static_cast<double>(rows) * (2 * F + F + 2 * F + F + 2 * F);
    check_cuda(cudaDeviceSynchronize(), "set-up");

    std::vector<std::vector<std::vector<double>>> rates(
        3, std::vector<std::vector<double>>(shapes.size()));
    std::vector<double> stream_bps, swiglu_bps;
    for (int r = 0; r < rounds; ++r) {
        for (size_t i = 0; i < shapes.size(); ++i) {
            const Shape& s = shapes[i];
            const double flops = 2.0 * s.m * static_cast<double>(s.n) * s.k;
            rates[0][i].push_back(flops / gpu_seconds_per_call([&] { forward(s); }, seconds));
            rates[1][i].push_back(flops / gpu_seconds_per_call([&] { dgrad(s); }, seconds));
            rates[2][i].push_back(flops / gpu_seconds_per_call([&] { wgrad(s); }, seconds));
        }
        stream_bps.push_back(stream_bytes / gpu_seconds_per_call(stream, seconds));
        swiglu_bps.push_back(swiglu_bytes / gpu_seconds_per_call(swiglu, seconds));
        check_cuda(cudaGetLastError(), "a measured kernel");
    }

    // The host's launch cost: the time the host spends in cudaLaunchKernel, in batches short
    // enough that the launch queue never fills (a full queue would time the GPU instead).
    using Clock = std::chrono::steady_clock;
    std::vector<double> launch_us;
    for (int r = 0; r < 20; ++r) {
        const int batch = 200;
        const auto t0 = Clock::now();
        for (int i = 0; i < batch; ++i)
            empty_kernel<<<1, 32>>>();
        launch_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                            batch);
        check_cuda(cudaDeviceSynchronize(), "empty kernels");
    }
    // One replay of a captured graph of 20 kernels: the host's cost of cudaGraphLaunch.
    cudaStream_t capture;
    check_cuda(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    check_cuda(cudaStreamBeginCapture(capture, cudaStreamCaptureModeGlobal), "capture");
    for (int i = 0; i < 20; ++i)
        empty_kernel<<<1, 32, 0, capture>>>();
    check_cuda(cudaStreamEndCapture(capture, &graph), "capture");
    check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    std::vector<double> graph_us;
    for (int r = 0; r < 20; ++r) {
        const int batch = 20;
        const auto t0 = Clock::now();
        for (int i = 0; i < batch; ++i)
            check_cuda(cudaGraphLaunch(exec, capture), "cudaGraphLaunch");
        graph_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                           batch);
        check_cuda(cudaStreamSynchronize(capture), "graph replays");
    }

    // Compute beside communication: a forward product at m = 4096 alone and while a copy kernel
    // of `blocks` blocks runs on another stream (as NCCL's all-to-all holds 32 SMs inside a node,
    // DeepEP's kernels 24), and the copy alone and beside a stream of products. Each side's
    // slowdown is its time beside the other over its time alone, minus one.
    const size_t copy_words = size_t{64} << 20;  // 1 GiB each way
    int4* copy_dst = device_alloc<int4>(copy_words, "cudaMalloc copy dst");
    int4* copy_src = device_alloc<int4>(copy_words, "cudaMalloc copy src");
    check_cuda(cudaMemset(copy_src, 0, copy_words * sizeof(int4)), "cudaMemset");
    cudaStream_t side;
    check_cuda(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cudaStreamCreate");
    const Shape big{4096, N, K};
    auto events_ms = [](cudaStream_t st, auto&& enqueue) {
        cudaEvent_t a, b;
        check_cuda(cudaEventCreate(&a), "cudaEventCreate");
        check_cuda(cudaEventCreate(&b), "cudaEventCreate");
        check_cuda(cudaEventRecord(a, st), "cudaEventRecord");
        enqueue();
        check_cuda(cudaEventRecord(b, st), "cudaEventRecord");
        check_cuda(cudaEventSynchronize(b), "cudaEventSynchronize");
        float ms = 0;
        check_cuda(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
        cudaEventDestroy(a);
        cudaEventDestroy(b);
        return static_cast<double>(ms);
    };
    check_cublas(cublasSetStream(handle, 0), "cublasSetStream");
    auto gemms = [&](int count) {
        for (int i = 0; i < count; ++i)
            forward(big);
    };
    std::vector<double> compute_slowdown[2], comm_slowdown[2];
    const int block_counts[2] = {32, 24};
    for (int r = 0; r < rounds; ++r) {
        for (int b = 0; b < 2; ++b) {
            const int blocks_b = block_counts[b];
            const int count = 20;
            const double gemm_alone = events_ms(0, [&] { gemms(count); });
            // The copy, long enough to cover the products: sized from its own time alone.
            const double copy_one = events_ms(side, [&] {
                copy_kernel<<<blocks_b, 1024, 0, side>>>(copy_dst, copy_src, copy_words, 1);
            });
            const int passes = std::max(1, static_cast<int>(3 * gemm_alone / copy_one) + 1);
            copy_kernel<<<blocks_b, 1024, 0, side>>>(copy_dst, copy_src, copy_words, passes);
            const double gemm_beside = events_ms(0, [&] { gemms(count); });
            check_cuda(cudaStreamSynchronize(side), "copy beside products");
            compute_slowdown[b].push_back(gemm_beside / gemm_alone - 1);
            // The copy beside a stream of products that outlasts it.
            const double copy_alone = events_ms(side, [&] {
                copy_kernel<<<blocks_b, 1024, 0, side>>>(copy_dst, copy_src, copy_words, 2);
            });
            gemms(std::max(1, static_cast<int>(3 * copy_alone / (gemm_alone / count)) + 1));
            const double copy_beside = events_ms(side, [&] {
                copy_kernel<<<blocks_b, 1024, 0, side>>>(copy_dst, copy_src, copy_words, 2);
            });
            check_cuda(cudaDeviceSynchronize(), "products beside a copy");
            comm_slowdown[b].push_back(copy_beside / copy_alone - 1);
        }
    }
    check_cuda(cudaGetLastError(), "the overlap kernels");
    const double slow_compute32 = median(compute_slowdown[0]),
                 slow_comm32 = median(comm_slowdown[0]);
    const double slow_compute24 = median(compute_slowdown[1]),
                 slow_comm24 = median(comm_slowdown[1]);
    std::printf(
        "[probe] beside a 32-block copy: products %+.0f%%, the copy beside products %+.0f%%; "
        "24 blocks: %+.0f%%, %+.0f%%\n",
        100 * slow_compute32, 100 * slow_comm32, 100 * slow_compute24, 100 * slow_comm24);

    std::string shape_list = "[";
    for (size_t i = 0; i < shapes.size(); ++i) {
        char b[64];
        std::snprintf(b, sizeof b, "%s[%d, %d, %d]", i ? ", " : "", shapes[i].m, shapes[i].n,
                      shapes[i].k);
        shape_list += b;
    }
    shape_list += "]";
    std::vector<double> med[3];
    const char* names[3] = {"forward", "dgrad", "wgrad"};
    for (int p = 0; p < 3; ++p) {
        std::printf("[probe] %-8s TFLOP/s:", names[p]);
        for (size_t i = 0; i < shapes.size(); ++i) {
            med[p].push_back(median(rates[p][i]) / 1e12);
            std::printf(" m=%d:%.0f", shapes[i].m, med[p].back());
        }
        std::printf("\n");
    }
    const double stream_tbps = median(stream_bps) / 1e12, swiglu_tbps = median(swiglu_bps) / 1e12;
    const double launch = median(launch_us), graph_launch = median(graph_us);
    std::printf(
        "[probe] streaming loop %.2f TB/s, SwiGLU forward + backward %.2f TB/s, kernel launch "
        "%.2f us, graph replay (20 kernels) %.2f us\n",
        stream_tbps, swiglu_tbps, launch, graph_launch);

    FILE* f = std::fopen(out.c_str(), "w");
    if (!f) {
        std::fprintf(stderr, "epo-gpu-probe: --out %s: %s\n", out.c_str(), std::strerror(errno));
        return 1;
    }
    std::fprintf(
        f,
        "{\n  \"epo_gpu_probe\": 1,\n  \"device_name\": \"%s\",\n  \"num_sms\": %d,\n"
        "  \"compute_capability\": \"%d.%d\",\n  \"cuda_driver\": %d,\n"
        "  \"cuda_runtime\": %d,\n  \"rounds\": %d,\n  \"seconds_per_measure\": %g,\n"
        "  \"gemm_shapes\": %s,\n  \"forward_tflops\": %s,\n  \"dgrad_tflops\": %s,\n"
        "  \"wgrad_tflops\": %s,\n  \"stream_tbps\": %.6g,\n"
        "  \"elementwise_tbps\": %.6g,\n  \"kernel_launch_us\": %.6g,\n"
        "  \"graph_launch_us\": %.6g,\n"
        "  \"overlap_32_blocks\": {\"compute_slowdown\": %.6g, \"comm_slowdown\": %.6g},\n"
        "  \"overlap_24_blocks\": {\"compute_slowdown\": %.6g, \"comm_slowdown\": %.6g}\n}\n",
        prop.name, prop.multiProcessorCount, prop.major, prop.minor, driver, runtime, rounds,
        seconds, shape_list.c_str(), json_list(med[0]).c_str(), json_list(med[1]).c_str(),
        json_list(med[2]).c_str(), stream_tbps, swiglu_tbps, launch, graph_launch, slow_compute32,
        slow_comm32, slow_compute24, slow_comm24);
    if (std::fclose(f) != 0) {
        std::fprintf(stderr, "epo-gpu-probe: writing %s failed\n", out.c_str());
        return 1;
    }
    std::printf("[probe] wrote %s\n", out.c_str());
    return 0;
}
