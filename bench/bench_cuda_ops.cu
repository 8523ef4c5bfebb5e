/* GPU benchmark of the CUDA backend's weight-format kernels against the
 * machine's own ceilings, measured in the same run (performance.md §1.2-1.4,
 * METHOD.md): device-to-device copy bandwidth (bytes read + written) is the
 * floor for the memory-bound decode kernels; the FP8 GEMM's peer is
 * torch._scaled_mm, timed by bench_cuda_torch.py in the same scripts/gpu-suite
 * call.
 *
 * Weights are rotated over enough copies to exceed the L2 several times, and
 * launches are captured in a CUDA graph (as decode steps will be) so that
 * launch gaps do not count. Times are medians over repeated graph replays.
 * Output: one "RESULT name value unit [extra]" line per number, then a table. */
#include <cuda_runtime.h>

#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ops.h"
#include <time.h>
extern "C" {
#include "backend/backend.h"
}

#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)
#define DK(x)                                                                              \
    do {                                                                                   \
        di_err err_ = {};                                                                  \
        di_err *err = &err_;                                                               \
        if ((x) != DI_OK) {                                                                \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, err_.msg);                  \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static double g_copy_bw = 0; /* bytes/s, measured first */

/* Random bytes on the device (a hash per byte). kind 0: any byte; 1: e4m3
 * without the NaN codes; 2: E8M0 scales 2^-7 .. 2^0. */
__global__ void fill_random(uint8_t *p, size_t n, uint32_t seed, int kind) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
        uint8_t b = (uint8_t)h;
        if (kind == 1 && (b & 0x7f) == 0x7f) b ^= 1;
        if (kind == 2) b = (uint8_t)(120 + (h & 7));
        p[i] = b;
    }
}
__global__ void fill_scales(float *p, size_t n, uint32_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = ldexpf(1.0f, (int)(((uint32_t)i * 2654435761u ^ seed) >> 28) - 12);
}
static void rnd(void *p, size_t n, uint32_t seed, int kind = 0) {
    fill_random<<<1024, 256>>>((uint8_t *)p, n, seed, kind);
    CK(cudaGetLastError());
}

static void *dalloc(size_t n) {
    void *p = NULL;
    DK(di_cuda_alloc(&p, n, err));
    return p;
}

/* Median time (seconds) of `run()` between two events on the default
 * stream, divided by the `per` operations it does. */
template <typename F> static double time_events(F run, int per, int reps) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(a, 0));
        run();
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        float t = 0;
        CK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return ms[ms.size() / 2] * 1e-3 / per;
}

/* Median time (seconds) of one replay of `graph`, each replay doing `per`
 * operations: returns seconds per operation. */
static double time_graph(cudaGraphExec_t exec, int per, int reps) {
    for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(exec, 0));
    CK(cudaDeviceSynchronize());
    return time_events([&] { CK(cudaGraphLaunch(exec, 0)); }, per, reps);
}

template <typename F> static double time_ops(F op, int per, int reps) {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < per; i++) op(i, s);
    CK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, g, 0));
    double t = time_graph(exec, per, reps);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(s));
    return t;
}

/* Plain streaming copy: 16-byte accesses, four loads in flight per thread. */
__global__ void copy_kernel(const uint4 *__restrict__ src, uint4 *__restrict__ dst, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride), c = __ldcs(src + i + 2 * stride),
              d = __ldcs(src + i + 3 * stride);
        __stcs(dst + i, a); __stcs(dst + i + stride, b);
        __stcs(dst + i + 2 * stride, c); __stcs(dst + i + 3 * stride, d);
    }
    for (; i < n; i += stride) dst[i] = src[i];
}

/* The bandwidth ceiling: the faster of the copy engine (cudaMemcpyAsync) and
 * a copy kernel, bytes read + written. */
static void bench_copy(void) {
    size_t n = (size_t)2 << 30;
    void *a = dalloc(n), *b = dalloc(n);
    rnd(a, n, 1);
    double t1 = time_ops([&](int, cudaStream_t s) {
        CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s)); }, 1, 20);
    int sms = 132;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    double t2 = time_ops([&](int, cudaStream_t s) {
        copy_kernel<<<sms * 8, 256, 0, s>>>((const uint4 *)a, (uint4 *)b, n / 16); }, 1, 20);
    CK(cudaGetLastError());
    g_copy_bw = 2.0 * n / std::min(t1, t2);
    printf("RESULT copy_bw %.1f GB/s (2 GiB device-to-device, read+write; memcpy %.0f, kernel %.0f)\n",
           g_copy_bw / 1e9, 2.0 * n / t1 / 1e9, 2.0 * n / t2 / 1e9);
    di_cuda_free(a);
    di_cuda_free(b);
}

static void bench_act_quant(void) {
    int64_t m = 8192, k = 5120;
    void *x = dalloc((size_t)(m * k) * 2), *q = dalloc((size_t)(m * k));
    void *s = dalloc((size_t)(m * k / 32) * 4);
    rnd(x, (size_t)(m * k) * 2, 2);
    double t = time_ops([&](int, cudaStream_t st) {
        DK(di_cuda_act_quant_fp8(x, DI_DTYPE_BF16, m, k, (uint8_t *)q, (float *)s, st, err)); },
        10, 20);
    double bytes = (double)m * k * 3 + m * k / 32 * 4;
    printf("RESULT act_quant_8192x5120 %.2f us %.0f GB/s %.0f%% of copy\n", t * 1e6,
           bytes / t / 1e9, 100 * bytes / t / g_copy_bw);
    di_cuda_free(x); di_cuda_free(q); di_cuda_free(s);
}

/* How many copies of a weight of per_copy bytes to rotate over so that
 * every call reads cold weights from HBM (at least 512 MB, 2 to 64). */
static int weight_copies(size_t per_copy) {
    int copies = (int)std::max<size_t>(2, ((size_t)512 << 20) / per_copy + 1);
    return copies > 64 ? 64 : copies;
}

/* Decode matrix-vector: weight copies rotated so that every call reads
 * cold weights from HBM. */
static void bench_matvec(int fmt, const char *name, int64_t n, int64_t k, int64_t m) {
    int64_t kbn = k / 32;
    size_t wb = fmt == 0 ? (size_t)(n * k) : (size_t)(n * k / 2);
    size_t sb = fmt == 0 ? (size_t)(((n + 31) / 32) * kbn) : (size_t)(n * kbn);
    size_t per_copy = wb + sb;
    int copies = weight_copies(per_copy);
    std::vector<void *> w(copies), ws(copies);
    for (int c = 0; c < copies; c++) {
        w[c] = dalloc(wb);
        ws[c] = dalloc(sb);
        rnd(w[c], wb, 100 + c, fmt == 0 ? 1 : 0);
        rnd(ws[c], sb, 200 + c, 2);
    }
    void *qa = dalloc((size_t)(m * k)), *sa = dalloc((size_t)(m * kbn) * 4);
    void *out = dalloc((size_t)(m * n) * 4);
    rnd(qa, (size_t)(m * k), 3, 1);
    fill_scales<<<256, 256>>>((float *)sa, (size_t)(m * kbn), 4);
    double t = time_ops([&](int i, cudaStream_t s) {
        int c = i % copies;
        if (fmt == 0)
            DK(di_cuda_gemm_fp8((uint8_t *)qa, (float *)sa, m, k, (uint8_t *)w[c], (uint8_t *)ws[c],
                                n, out, DI_DTYPE_F32, DI_CUDA_GEMM_MATVEC, s, err));
        else
            DK(di_cuda_gemm_mxfp4((uint8_t *)qa, (float *)sa, m, k, (uint8_t *)w[c], (uint8_t *)ws[c],
                                  n, out, DI_DTYPE_F32, DI_CUDA_GEMM_MATVEC, s, err));
    }, copies, 15);
    double bytes = (double)per_copy + m * k + m * kbn * 4 + m * n * 4;
    printf("RESULT %s_%s_%lldx%lld_m%lld %.2f us %.0f GB/s %.0f%% of copy (floor %.2f us)\n",
           fmt ? "mxfp4" : "fp8", name, (long long)n, (long long)k, (long long)m, t * 1e6,
           bytes / t / 1e9, 100 * bytes / t / g_copy_bw, bytes / g_copy_bw * 1e6);
    for (int c = 0; c < copies; c++) { di_cuda_free(w[c]); di_cuda_free(ws[c]); }
    di_cuda_free(qa); di_cuda_free(sa); di_cuda_free(out);
}

/* MoE decode step, up-projection only (w1 of every routed expert): batch
 * tokens, top-6 of 384 experts, uniform random routing; one grouped launch
 * per step. Each replay of the graph runs `reps` steps with different
 * routings so the experts read are cold (~0.5 GB or more per replay). Bytes
 * counted: the distinct experts' weights + scales, the activations, the
 * outputs. */
/* proj / n / k: the projection timed (w1 [moe_inter, dim] by default, w2
 * [dim, moe_inter]); op_form: the call as the moe_experts op makes it (every
 * group's token capacity = the batch, min(E, 6 tokens) groups, the empty ones
 * last), else the tightest capacity and only the non-empty groups. */
/* pair: a second weight set beside the first (the MoE's w1 and w3), both
 * products by di_cuda_gemm_mxfp4_grouped_pair, bytes counted for both */
static void bench_moe_grouped(int tokens, const char *suffix = "", const char *proj = "w1",
                              int64_t n = 2304, int64_t k = 5120, bool op_form = false, bool pair = false) {
    const int64_t E = 384, kbn = k / 32, topk = 6;
    const size_t wb = (size_t)(n * k / 2), sb = (size_t)(n * kbn);
    const int halves = pair ? 2 : 1;
    void *w = dalloc(wb * E), *ws = dalloc(sb * E);
    void *w_b = pair ? dalloc(wb * E) : NULL, *ws_b = pair ? dalloc(sb * E) : NULL;
    rnd(w, wb * E, 300);
    rnd(ws, sb * E, 301, 2);
    if (pair) {
        rnd(w_b, wb * E, 304);
        rnd(ws_b, sb * E, 305, 2);
    }
    void *qa = dalloc((size_t)(tokens * k)), *sa = dalloc((size_t)(tokens * kbn) * 4);
    rnd(qa, (size_t)(tokens * k), 302, 1);
    fill_scales<<<256, 256>>>((float *)sa, (size_t)(tokens * kbn), 303);
    const int npairs = (int)(tokens * topk);
    void *out = dalloc((size_t)npairs * n * 4), *out_b = pair ? dalloc((size_t)npairs * n * 4) : NULL;
    int reps = 1;
    uint32_t seed = 12345;
    auto next = [&]() { seed = seed * 1664525u + 1013904223u; return seed >> 8; };
    struct Step { void *ids, *off, *rows; int ng, max_rows, distinct; };
    std::vector<Step> steps;
    double bytes_total = 0;
    while (bytes_total < 512e6 || (int)steps.size() < 2) {
        std::vector<std::vector<int32_t>> by(E);
        for (int t = 0; t < tokens; t++) {
            int32_t pick[6];
            for (int j = 0; j < topk; j++) {
                bool dup;
                do {
                    pick[j] = (int32_t)(next() % E);
                    dup = false;
                    for (int i = 0; i < j; i++) dup |= pick[i] == pick[j];
                } while (dup);
                by[pick[j]].push_back(t);
            }
        }
        std::vector<int32_t> ids, off{0}, rows;
        int max_rows = 0;
        for (int e = 0; e < E; e++) {
            if (by[e].empty()) continue;
            ids.push_back(e);
            rows.insert(rows.end(), by[e].begin(), by[e].end());
            off.push_back((int32_t)rows.size());
            max_rows = std::max(max_rows, (int)by[e].size());
        }
        const int nonempty = (int)ids.size();
        if (op_form) {
            while ((int64_t)ids.size() < std::min<int64_t>(E, tokens * topk)) {
                ids.push_back(0);
                off.push_back((int32_t)rows.size());
            }
            max_rows = tokens;
        }
        Step st;
        st.ng = (int)ids.size();
        st.max_rows = max_rows;
        st.distinct = nonempty;
        st.ids = dalloc(ids.size() * 4);
        st.off = dalloc(off.size() * 4);
        st.rows = dalloc(rows.size() * 4);
        CK(cudaMemcpy(st.ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(st.off, off.data(), off.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(st.rows, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
        steps.push_back(st);
        bytes_total += (double)st.distinct * (wb + sb) * halves;
    }
    reps = (int)steps.size();
    double t = time_ops([&](int i, cudaStream_t s) {
        const Step &st = steps[i];
        if (pair)
            DK(di_cuda_gemm_mxfp4_grouped_pair((uint8_t *)qa, (float *)sa, k, (uint8_t *)w, (uint8_t *)ws,
                                               (uint8_t *)w_b, (uint8_t *)ws_b, n, (int32_t *)st.ids,
                                               (int32_t *)st.off, st.ng, (int32_t *)st.rows, st.max_rows, out,
                                               out_b, DI_DTYPE_F32, s, err));
        else
            DK(di_cuda_gemm_mxfp4_grouped((uint8_t *)qa, (float *)sa, k, (uint8_t *)w, (uint8_t *)ws,
                                          n, (int32_t *)st.ids, (int32_t *)st.off, st.ng,
                                          (int32_t *)st.rows, st.max_rows, out, DI_DTYPE_F32, s, err));
    }, reps, 15);
    double bytes = bytes_total / reps + (double)tokens * k + npairs * n * 4.0 * halves;
    printf("RESULT moe_%s_grouped_b%d%s %.2f us %.0f GB/s %.0f%% of copy (%.0f experts/step, floor %.2f us, "
           "%.1f TFLOP/s)\n",
           proj, tokens, suffix, t * 1e6, bytes / t / 1e9, 100 * bytes / t / g_copy_bw,
           bytes_total / reps / (wb + sb) / halves, bytes / g_copy_bw * 1e6,
           2.0 * halves * npairs * n * k / t / 1e12);
    for (auto &st : steps) { di_cuda_free(st.ids); di_cuda_free(st.off); di_cuda_free(st.rows); }
    di_cuda_free(w); di_cuda_free(ws); di_cuda_free(qa); di_cuda_free(sa); di_cuda_free(out);
    if (pair) { di_cuda_free(w_b); di_cuda_free(ws_b); di_cuda_free(out_b); }
}

extern "C" void cuda_tiled_set_variant(int v); /* measuring aid in cuda_gemm_tiled.cu */
extern "C" void cuda_matvec_set_ks(int ks);     /* measuring aid in cuda_matvec.cu */

/* The wgmma matvec kernels' k split (clusters of 1-8 blocks) forced on the
 * shapes whose choice is least clear. */
static void bench_ks_sweep(void) {
    static const char *names[] = {"wo_b_ks1", "wo_b_ks2", "wo_b_ks4", "wo_b_ks8"};
    static const char *names2[] = {"shared_w2_ks1", "shared_w2_ks2", "shared_w2_ks4", "shared_w2_ks8"};
    static const char *names4[] = {"expert_w1_ks1", "expert_w1_ks2", "expert_w1_ks4", "expert_w1_ks8"};
    static const char *moe[] = {"_ks1", "_ks2", "_ks4", "_ks8"};
    for (int i = 0; i < 4; i++) {
        cuda_matvec_set_ks(1 << i);
        bench_matvec(0, names[i], 5120, 8192, 1);
        bench_matvec(0, names2[i], 5120, 2304, 1);
        bench_matvec(1, names4[i], 2304, 5120, 1);
        bench_moe_grouped(1, moe[i]);
    }
    cuda_matvec_set_ks(0);
}

static void bench_gemm(int64_t m, int64_t n, int64_t k, di_cuda_gemm_path path,
                       int variant = -1) {
    int64_t kbn = k / 32;
    void *qa = dalloc((size_t)(m * k)), *sa = dalloc((size_t)(m * kbn) * 4);
    void *w = dalloc((size_t)(n * k)), *ws = dalloc((size_t)(((n + 31) / 32) * kbn));
    void *out = dalloc((size_t)(m * n) * 2);
    rnd(qa, (size_t)(m * k), 5, 1);
    rnd(w, (size_t)(n * k), 6, 1);
    rnd(ws, (size_t)(((n + 31) / 32) * kbn), 7, 2);
    fill_scales<<<256, 256>>>((float *)sa, (size_t)(m * kbn), 8);
    int per = std::max(1, (int)(2e11 / (2.0 * m * n * k)));
    if (variant >= 0) cuda_tiled_set_variant(variant);
    double t = time_ops([&](int, cudaStream_t s) {
        DK(di_cuda_gemm_fp8((uint8_t *)qa, (float *)sa, m, k, (uint8_t *)w, (uint8_t *)ws, n, out,
                            DI_DTYPE_BF16, path, s, err)); }, per, 10);
    double tflops = 2.0 * m * n * k / t / 1e12;
    if (variant >= 0) {
        printf("RESULT gemm_fp8_variant%d_%lldx%lldx%lld %.1f TFLOP/s (%.3f ms)\n", variant,
               (long long)m, (long long)n, (long long)k, tflops, t * 1e3);
        cuda_tiled_set_variant(-1);
    } else {
        printf("RESULT gemm_fp8_%s_%lldx%lldx%lld %.1f TFLOP/s (%.3f ms)\n",
               path == DI_CUDA_GEMM_TILED ? "tiled" : path == DI_CUDA_GEMM_AUTO ? "auto" : "matvec",
               (long long)m, (long long)n,
               (long long)k, tflops, t * 1e3);
    }
    di_cuda_free(qa); di_cuda_free(sa); di_cuda_free(w); di_cuda_free(ws); di_cuda_free(out);
}

/* Peak of FP8 mma.sync m16n8k32 on this GPU: 8 independent chains per warp,
 * operands in registers; with promote, each result starts from zero and is
 * added into an fp32 accumulator with an FMA (the per-32 promotion). */
__global__ void mma_sync_peak(float *out, int iters, int promote) {
    uint32_t a = 0x38383838u ^ threadIdx.x, b = 0x30303030u ^ (threadIdx.x << 8);
    float acc[8][4] = {};
    for (int it = 0; it < iters; it++) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (promote) {
                float d[4];
                asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
                             "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
                             : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                             : "r"(a), "r"(a + j), "r"(b), "r"(b + j), "r"(a ^ b), "r"(b), "f"(0.0f));
#pragma unroll
                for (int i = 0; i < 4; i++) acc[j][i] = fmaf(d[i], 0.5f, acc[j][i]);
            } else {
                asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
                             "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                             : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                             : "r"(a), "r"(a + j), "r"(b), "r"(b + j), "r"(a ^ b), "r"(b));
            }
        }
    }
    float s = 0;
    for (int j = 0; j < 8; j++) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

static void bench_mma_sync(void) {
    int sms = 132;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    int blocks = sms * 4, threads = 256, iters = 2048;
    float *out = (float *)dalloc((size_t)blocks * threads * 4);
    for (int promote = 0; promote < 2; promote++) {
        double t = time_ops([&](int, cudaStream_t s) {
            mma_sync_peak<<<blocks, threads, 0, s>>>(out, iters, promote); }, 1, 5);
        double flops = (double)blocks * (threads / 32) * iters * 8 * (16.0 * 8 * 32 * 2);
        printf("RESULT mma_sync_fp8_peak%s %.1f TFLOP/s\n", promote ? "_promoted" : "",
               flops / t / 1e12);
    }
    di_cuda_free(out);
}

/* Every structure of the tiled kernel must give the same bits, run after
 * run (the block sums and their promotion order are the same). */
static void check_variants(void) {
    int64_t m = 300, n = 640, k = 1280, kbn = k / 32;
    void *qa = dalloc((size_t)(m * k)), *sa = dalloc((size_t)(m * kbn) * 4);
    void *w = dalloc((size_t)(n * k)), *ws = dalloc((size_t)(((n + 31) / 32) * kbn));
    void *o = dalloc((size_t)(m * n) * 4);
    rnd(qa, (size_t)(m * k), 15, 1);
    rnd(w, (size_t)(n * k), 16, 1);
    rnd(ws, (size_t)(((n + 31) / 32) * kbn), 17, 2);
    fill_scales<<<256, 256>>>((float *)sa, (size_t)(m * kbn), 18);
    const int vs[] = {8, 8, 16, 19, 18, 10};
    std::vector<std::vector<float>> h(6, std::vector<float>(m * n));
    for (int i = 0; i < 6; i++) {
        cuda_tiled_set_variant(vs[i]);
        DK(di_cuda_gemm_fp8((uint8_t *)qa, (float *)sa, m, k, (uint8_t *)w, (uint8_t *)ws, n, o,
                            DI_DTYPE_F32, DI_CUDA_GEMM_TILED, NULL, err));
        CK(cudaMemcpy(h[i].data(), o, m * n * 4, cudaMemcpyDeviceToHost));
    }
    cuda_tiled_set_variant(-1);
    for (int i = 1; i < 6; i++) {
        int64_t diff = 0;
        double worst = 0;
        for (int64_t j = 0; j < m * n; j++)
            if (memcmp(&h[i][j], &h[0][j], 4)) {
                diff++;
                double r = fabs(h[i][j] - h[0][j]) / (fabs(h[0][j]) + 1e-30);
                if (r > worst) worst = r;
            }
        printf("RESULT variant_%d_run%d_vs_8 %lld elements differ (largest relative %.3g)\n",
               vs[i], i, (long long)diff, worst);
    }
    di_cuda_free(qa); di_cuda_free(sa); di_cuda_free(w); di_cuda_free(ws); di_cuda_free(o);
}

/* --profile: one plain launch (no graph) of each decode shape that matters,
 * for `ncu -k regex:matvec` to read the counters of exactly these kernels:
 * FP8 wq_b, FP8 wo_b, one MXFP4 expert w1, all at m = 1. */
static void profile_once(void) {
    struct { int fmt; int64_t n, k; } cases[] = {{0, 32768, 1280}, {0, 5120, 8192}, {1, 2304, 5120}};
    for (auto &c : cases) {
        int64_t kbn = c.k / 32;
        size_t wb = c.fmt == 0 ? (size_t)(c.n * c.k) : (size_t)(c.n * c.k / 2);
        size_t sb = c.fmt == 0 ? (size_t)(((c.n + 31) / 32) * kbn) : (size_t)(c.n * kbn);
        void *w = dalloc(wb), *ws = dalloc(sb), *qa = dalloc((size_t)c.k), *sa = dalloc((size_t)kbn * 4);
        void *out = dalloc((size_t)c.n * 4);
        rnd(w, wb, 400, c.fmt == 0 ? 1 : 0);
        rnd(ws, sb, 401, 2);
        rnd(qa, (size_t)c.k, 402, 1);
        fill_scales<<<64, 256>>>((float *)sa, (size_t)kbn, 403);
        if (c.fmt == 0)
            DK(di_cuda_gemm_fp8((uint8_t *)qa, (float *)sa, 1, c.k, (uint8_t *)w, (uint8_t *)ws, c.n,
                                out, DI_DTYPE_F32, DI_CUDA_GEMM_MATVEC, NULL, err));
        else
            DK(di_cuda_gemm_mxfp4((uint8_t *)qa, (float *)sa, 1, c.k, (uint8_t *)w, (uint8_t *)ws,
                                  c.n, out, DI_DTYPE_F32, DI_CUDA_GEMM_MATVEC, NULL, err));
        CK(cudaDeviceSynchronize());
        di_cuda_free(w); di_cuda_free(ws); di_cuda_free(qa); di_cuda_free(sa); di_cuda_free(out);
    }
}

extern "C" void cuda_matvec_set_pdl(int on);          /* measuring aids in cuda_matvec.cu */
extern "C" void cuda_matvec_set_grouped_ks(int ks);

/* --decode: the decode kernels that issue #7's goal names (the small FP8
 * matrices, single MXFP4 experts, the grouped MoE projections as the
 * moe_experts op calls them at batch 1, 8, 16), with the measuring aids:
 * programmatic launch off, the FP8 k split and the grouped form's blocks per
 * tile forced. */
static void bench_decode(void) {
    struct { int fmt; const char *name; int64_t n, k; } cs[] = {
        {0, "wq_a", 1280, 5120},       {0, "shared_w1", 2304, 5120}, {0, "shared_w2", 5120, 2304},
        {0, "wo_b", 5120, 8192},       {0, "wq_b", 32768, 1280},     {1, "expert_w1", 2304, 5120},
        {1, "expert_w2", 5120, 2304}};
    for (int64_t m : {1, 8, 16})
        for (auto &c : cs) bench_matvec(c.fmt, c.name, c.n, c.k, m);
    for (int b : {1, 8, 16}) {
        bench_moe_grouped(b, "", "w1", 2304, 5120, true);
        bench_moe_grouped(b, "", "w2", 5120, 2304, true);
    }
    char name[64];
    cuda_matvec_set_pdl(0);
    for (auto &c : cs) {
        snprintf(name, sizeof name, "%s_nopdl", c.name);
        bench_matvec(c.fmt, name, c.n, c.k, 1);
    }
    bench_moe_grouped(1, "_nopdl", "w1", 2304, 5120, true);
    bench_moe_grouped(8, "_nopdl", "w1", 2304, 5120, true);
    cuda_matvec_set_pdl(1);
    for (int ks : {1, 2, 4, 8}) {
        cuda_matvec_set_ks(ks);
        snprintf(name, sizeof name, "wq_a_ks%d", ks);
        bench_matvec(0, name, 1280, 5120, 1);
        snprintf(name, sizeof name, "shared_w1_ks%d", ks);
        bench_matvec(0, name, 2304, 5120, 1);
    }
    cuda_matvec_set_ks(0);
    for (int g : {1, 2, 4, 8}) {
        cuda_matvec_set_grouped_ks(g);
        snprintf(name, sizeof name, "_gks%d", g);
        bench_moe_grouped(1, name, "w1", 2304, 5120, true);
        bench_moe_grouped(8, name, "w1", 2304, 5120, true);
        bench_moe_grouped(1, name, "w2", 5120, 2304, true);
    }
    cuda_matvec_set_grouped_ks(0);
    /* the FP8 clusters of 4 and 8 at 8 and 16 tokens too (the k split is
     * chosen from n and k alone, so it holds for every batch) */
    for (int ks : {4, 8})
        for (int64_t m : {8, 16}) {
            cuda_matvec_set_ks(ks);
            snprintf(name, sizeof name, "wq_a_ks%d", ks);
            bench_matvec(0, name, 1280, 5120, m);
            snprintf(name, sizeof name, "shared_w1_ks%d", ks);
            bench_matvec(0, name, 2304, 5120, m);
        }
    cuda_matvec_set_ks(0);
}

/* ---- --plain: the decode products without activation quantization
 * (cuda_ops_linear.cu's tensor-core kernel), mHC mixing, the buffer pool.
 * Peers: bench_cuda_torch.py --plain (bf16 weights through torch.matmul, the
 * mixing in torch ops), the copy floor of this run. The backend's launchers
 * use the legacy default stream, which a graph capture does not record, so
 * these are timed as back-to-back launches on it between two events (for
 * kernels shorter than a launch, the launch rate shows). */
template <typename F> static double time_stream0(F op, int per, int reps) {
    for (int i = 0; i < per; i++) op(i);
    CK(cudaDeviceSynchronize());
    return time_events([&] { for (int i = 0; i < per; i++) op(i); }, per, reps);
}

/* V4.1-Flash shapes: fmt 3 = BF16 weights, 1 = FP8 (wo_a, grouped) */
/* x of full fp32 values (not bf16-exact: all three split terms) */
__global__ void fill_full(float *p, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = 1.0f + (float)((uint32_t)i * 2654435761u) * 0x1p-32f;
}

/* weights: random bytes without 0x7f / 0xff (finite e4m3, and as bf16 no
 * inf / NaN); x powers of two (bf16-exact, as the model's activations), or
 * full fp32 values with full_x */
static void bench_plain_one(int fmt, const char *name, int64_t n, int64_t k, int groups, int64_t m,
                            int full_x = 0, const char *tag = "", int x16 = 0) {
    size_t wb = fmt == DI_WFMT_BF16 ? (size_t)(n * k) * 2 : (size_t)(n * k);
    size_t sb = fmt == DI_WFMT_FP8 ? (size_t)(((n + 31) / 32) * (k / 32)) : 0;
    size_t per_copy = wb + sb;
    int copies = weight_copies(per_copy);
    std::vector<void *> w(copies), ws(copies);
    for (int c = 0; c < copies; c++) {
        w[c] = dalloc(wb);
        rnd(w[c], wb, 300 + c, 1);
        ws[c] = sb ? dalloc(sb) : NULL;
        if (sb) rnd(ws[c], sb, 400 + c, 2);
    }
    int64_t kx = k * groups, nr = n / groups;
    float *x = (float *)dalloc((size_t)(m * kx) * 4), *y = (float *)dalloc((size_t)(m * n) * 4);
    if (full_x) fill_full<<<256, 256>>>(x, (size_t)(m * kx));
    else fill_scales<<<256, 256>>>(x, (size_t)(m * kx), 5);
    /* x16: the scratch of the prefill form's bf16 copy of x */
    size_t xs = x16 ? cuda_op_matmul_scratch_bytes(fmt, k, m, groups, nr) : 0;
    void *scr = xs ? dalloc(xs) : NULL;
    int per = std::max(copies, 20 / copies * copies);
    double t = time_stream0([&](int i) {
        int c = i % copies;
        DK(cuda_op_matmul_plain_s(fmt, w[c], (const uint8_t *)ws[c], n, k, x, kx, m, groups, nr, y, n,
                                  groups > 1, scr, xs, err));
    }, per, 15);
    if (scr) di_cuda_free(scr);
    double bytes = (double)per_copy + m * kx * 4.0 + m * n * 4.0;
    printf("RESULT plain_%s%s%s_%lldx%lld_m%lld %.2f us %.0f GB/s %.0f%% of copy (floor %.2f us)\n", name,
           full_x ? "_fp32x" : "", tag, (long long)n, (long long)k, (long long)m, t * 1e6, bytes / t / 1e9, 100 * bytes / t / g_copy_bw,
           bytes / g_copy_bw * 1e6);
    for (int c = 0; c < copies; c++) { di_cuda_free(w[c]); if (ws[c]) di_cuda_free(ws[c]); }
    di_cuda_free(x); di_cuda_free(y);
}

static void bench_hc_mix(int64_t m, int rows_form = 0) {
    const int hc = 4, nm = (2 + hc) * hc;
    const int64_t d = 5120, n = hc * d;
    float *s = (float *)dalloc((size_t)(m * n) * 4), *fn = (float *)dalloc((size_t)(nm * n) * 4);
    float *base = (float *)dalloc(nm * 4), *sc = (float *)dalloc(3 * 4);
    float *pre = (float *)dalloc((size_t)(m * hc) * 4), *post = (float *)dalloc((size_t)(m * hc) * 4);
    float *comb = (float *)dalloc((size_t)(m * hc * hc) * 4);
    fill_scales<<<256, 256>>>(s, (size_t)(m * n), 6);
    fill_scales<<<256, 256>>>(fn, (size_t)(nm * n), 7);
    fill_scales<<<1, 32>>>(base, nm, 8);
    fill_scales<<<1, 32>>>(sc, 3, 9);
    size_t xs = rows_form ? cuda_op_hc_mix_scratch_bytes(m, hc, d) : 0; /* the rows form's partial sums */
    void *scr = xs ? dalloc(xs) : NULL;
    double t = time_stream0([&](int) {
        DK(cuda_op_hc_mix_s(s, m, hc, d, fn, base, sc, 1e-6f, 1e-6f, 20, pre, post, comb, scr, xs, err));
    }, 20, 15);
    if (scr) di_cuda_free(scr);
    double bytes = (double)(nm * n) * 4 + (double)(m * n) * 4;
    printf("RESULT hc_mix%s_m%lld %.2f us (floor %.2f us: fn + rows once)\n", xs ? "_rows" : "", (long long)m,
           t * 1e6, bytes / g_copy_bw * 1e6);
    di_cuda_free(s); di_cuda_free(fn); di_cuda_free(base); di_cuda_free(sc);
    di_cuda_free(pre); di_cuda_free(post); di_cuda_free(comb);
}

static double host_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The pool's alloc + free on the host, the decode step's mix of sizes, in
 * bursts of 8 allocations, one op (a 4-byte upload: it runs the queued
 * fills, and does not wait for the device) and 8 frees, as the forward
 * allocates around its ops; per allocation. Peer: the host time of one
 * cudaMemsetAsync, what each allocation cost before on top of the pool's
 * bookkeeping. */
static void bench_pool(void) {
    di_backend *be = NULL;
    DK(di_backend_cuda_create(0, &be, err));
    const size_t sizes[8] = {160 << 10, 20 << 10, 640 << 10, 4 << 10, 128, 80 << 10, 160 << 10, 2 << 10};
    void *p[8];
    float one = 1.f;
    const int N = 2000;
    std::vector<double> ts;
    for (int rep = 0; rep < 6; rep++) {
        double t0 = host_now();
        for (int it = 0; it < N; it++) {
            for (int i = 0; i < 8; i++) p[i] = be->ops->alloc(be, sizes[i]);
            be->ops->upload(be, p[0], &one, 4);
            for (int i = 0; i < 8; i++) be->ops->free(be, p[i]);
        }
        if (rep) ts.push_back((host_now() - t0) / (8.0 * N));
        CK(cudaDeviceSynchronize());
    }
    std::sort(ts.begin(), ts.end());
    double t0 = host_now();
    for (int it = 0; it < N; it++) be->ops->upload(be, p[0], &one, 4);
    double tu = (host_now() - t0) / N;
    CK(cudaDeviceSynchronize());
    void *q = dalloc(1 << 20);
    std::vector<double> tm;
    for (int rep = 0; rep < 5; rep++) {
        t0 = host_now();
        for (int it = 0; it < N; it++)
            for (int i = 0; i < 8; i++) CK(cudaMemsetAsync(q, 0, sizes[i], 0));
        tm.push_back((host_now() - t0) / (8.0 * N));
        CK(cudaDeviceSynchronize());
    }
    std::sort(tm.begin(), tm.end());
    printf("RESULT pool_alloc_free %.3f us per alloc + free (host; with 1/8 of a 4-byte upload, %.3f us "
           "alone, in it); cudaMemsetAsync alone %.3f us per call\n", ts[2] * 1e6, tu * 1e6 / 8, tm[2] * 1e6);
    di_cuda_free(q);
    di_backend_destroy(be);
}

static void bench_plain(void) {
    struct { int fmt; const char *name; int64_t n, k; int groups; } cs[] = {
        {DI_WFMT_BF16, "head", 129280, 5120, 1},         {DI_WFMT_BF16, "gate", 384, 5120, 1},
        {DI_WFMT_BF16, "cmp_wkv", 512, 5120, 1},         {DI_WFMT_BF16, "idx_wp", 32, 5120, 1},
        {DI_WFMT_BF16, "idx_wk", 128, 512, 1},           {DI_WFMT_FP8, "wo_a", 8 * 1024, 4096, 8}};
    for (auto &c : cs)
        for (int64_t m : {1, 8, 16, 64}) bench_plain_one(c.fmt, c.name, c.n, c.k, c.groups, m);
    bench_plain_one(DI_WFMT_BF16, "head", 129280, 5120, 1, 8, 1);
    bench_plain_one(DI_WFMT_BF16, "head", 129280, 5120, 1, 64, 1);
    for (int64_t m : {1, 8, 64}) bench_hc_mix(m);
    bench_pool();
}

/* --plaindec: the decode form of the plain product (k_mm_dec, m <= 8)
 * against k_mm_tc on the same weights in the same run, x of full fp32
 * values (the attention output wo_a reads), the head with bf16-valued x,
 * then the spreads forced */
extern "C" void cuda_matmul_set_decode(int on, int cl); /* cuda_ops_linear.cu: measuring aids */
/* the decode form's products of a step: the grouped wo_a, the bf16 ones
 * (router, compressor, indexer), then the head */
static const struct plain_shape { int fmt; const char *name; int64_t n, k; int groups; } dec_shapes[] = {
    {DI_WFMT_FP8, "wo_a", 8 * 1024, 4096, 8}, {DI_WFMT_BF16, "gate", 384, 5120, 1},
    {DI_WFMT_BF16, "cmp_wkv", 512, 5120, 1},  {DI_WFMT_BF16, "idx_wp", 32, 5120, 1},
    {DI_WFMT_BF16, "idx_wk", 128, 512, 1},    {DI_WFMT_BF16, "head", 129280, 5120, 1}};
static const int dec_shapes_small = 5; /* all but the head */
static void bench_plain_dec(void) {
    for (auto &c : dec_shapes)
        for (int64_t m : {1, 8}) {
            cuda_matmul_set_decode(0, 0);
            bench_plain_one(c.fmt, c.name, c.n, c.k, c.groups, m, 1, "_mmtc");
            cuda_matmul_set_decode(1, 0);
            bench_plain_one(c.fmt, c.name, c.n, c.k, c.groups, m, 1, "_dec");
        }
    /* the head as the step runs it: x bf16-valued (the final norm rounds
     * its output), so both forms multiply h alone; the decode form applies
     * to it at m <= 2 (DI_CUDA_HEAD_DEC) */
    for (int64_t m : {1, 2}) {
        cuda_matmul_set_decode(0, 0);
        bench_plain_one(DI_WFMT_BF16, "head", 129280, 5120, 1, m, 0, "_mmtc");
        cuda_matmul_set_decode(1, 0);
        bench_plain_one(DI_WFMT_BF16, "head", 129280, 5120, 1, m, 0, "_dec");
    }
    for (int cl : {1, 2, 4, 8}) {
        char tag[16];
        snprintf(tag, sizeof tag, "_dec_cl%d", cl);
        cuda_matmul_set_decode(1, cl);
        bench_plain_one(DI_WFMT_BF16, "gate", 384, 5120, 1, 1, 1, tag);
        bench_plain_one(DI_WFMT_FP8, "wo_a", 8 * 1024, 4096, 8, 1, 1, tag);
    }
    cuda_matmul_set_decode(1, 0);
}

extern "C" void cuda_matvec_set_fp4_dec(int mode); /* cuda_matvec.cu: 0 never, 1 everywhere, -1 env */
extern "C" void cuda_fp4_dec_set_mma(int on);      /* cuda_fp4_dec.cu: 0 the CUDA-core kernel, -1 env */
extern "C" void cuda_fp4_dec_set_tr(int tr);       /* cuda_fp4_dec.cu: token slots a tile, 0 chosen */
extern "C" void cuda_fp4_dec_set_nt(int nt);       /* cuda_fp4_dec.cu: row tiles a block, 0 chosen */
extern "C" void cuda_fp4_dec_set_a8(int on);       /* cuda_fp4_dec.cu: 1 e4m3 activations, 0 f16, -1 chosen */

/* --fp4dec: the MXFP4 expert products in the decode form's two kernels
 * (tensor-core *_mma, CUDA-core *_dec) and in the wgmma / mma.sync kernels
 * (*_wg), in the same process: one expert at 1 and 2 tokens, the grouped
 * projections as the moe_experts op calls them at batch 1, 8, 64, 256
 * (max_rows = the batch; weights rotated over > 512 MB), w1 and w3 as one
 * pair call (moe_w13pair_*: the tensor-core form at every batch, then
 * mode 2), then the tensor-core form with token tiles of 1, 2, 4
 * and 8 slots forced at batch 8, 64 and 256 (8 slots of w1 leave one block
 * an SM), and with 1, 2 and 8 row tiles a block forced at batch 1, 8, 64
 * (at batch 1 also 3-6, and the w1 + w3 pair);
 * before those, the f16 and A8 activation forms at batch 64 and 256. */
static void bench_fp4_dec(void) {
    const struct { int dec, mma; const char *sfx; } forms[] = {{1, 1, "_mma"}, {1, 0, "_dec"}, {0, 1, "_wg"}};
    for (auto &f : forms) {
        cuda_matvec_set_fp4_dec(f.dec);
        cuda_fp4_dec_set_mma(f.mma);
        char name[64];
        for (int64_t m : {1, 2}) {
            snprintf(name, sizeof name, "expert_w1%s", f.sfx);
            bench_matvec(1, name, 2304, 5120, m);
            snprintf(name, sizeof name, "expert_w2%s", f.sfx);
            bench_matvec(1, name, 5120, 2304, m);
        }
        for (int b : {1, 8, 64, 256}) {
            bench_moe_grouped(b, f.sfx, "w1", 2304, 5120, true);
            bench_moe_grouped(b, f.sfx, "w2", 5120, 2304, true);
        }
    }
    /* w1 and w3 as the op calls them: one pair launch where the tensor-core
     * kernel runs (mode 1 at every batch, as the default mode 3 on these
     * shapes; mode 2, the default before, past 16 rows only: two wgmma
     * launches at batch 1 and 8) */
    for (int mode : {1, 2}) {
        cuda_matvec_set_fp4_dec(mode);
        for (int b : {1, 8, 64, 256})
            bench_moe_grouped(b, mode == 1 ? "_mma" : "_mode2", "w13pair", 2304, 5120, true, true);
    }
    cuda_matvec_set_fp4_dec(1);
    cuda_fp4_dec_set_mma(1);
    /* the two activation forms at their chosen slots (f16: w1 4, w2 8; A8:
     * w1 7, w2 8) past 16 rows */
    for (int a8 : {0, 1}) {
        cuda_fp4_dec_set_a8(a8);
        for (int b : {64, 256}) {
            bench_moe_grouped(b, a8 ? "_mma_a8" : "_mma_f16", "w1", 2304, 5120, true);
            bench_moe_grouped(b, a8 ? "_mma_a8" : "_mma_f16", "w2", 5120, 2304, true);
        }
    }
    cuda_fp4_dec_set_a8(0); /* the slot sweep in the f16 form */
    char sfx[32];
    for (int tr : {1, 2, 4, 8}) {
        snprintf(sfx, sizeof sfx, "_mma_tr%d", tr);
        cuda_fp4_dec_set_tr(tr);
        for (int b : {8, 64, 256}) {
            bench_moe_grouped(b, sfx, "w1", 2304, 5120, true);
            bench_moe_grouped(b, sfx, "w2", 5120, 2304, true);
        }
    }
    cuda_fp4_dec_set_tr(0);
    for (int nt : {1, 2, 3, 4, 5, 6, 8}) {
        snprintf(sfx, sizeof sfx, "_mma_nt%d", nt);
        cuda_fp4_dec_set_nt(nt);
        for (int b : {1, 8, 64}) {
            if (b > 1 && nt != 1 && nt != 2 && nt != 8) continue;
            bench_moe_grouped(b, sfx, "w1", 2304, 5120, true);
            bench_moe_grouped(b, sfx, "w2", 5120, 2304, true);
            if (b == 1) bench_moe_grouped(b, sfx, "w13pair", 2304, 5120, true, true);
        }
    }
    cuda_fp4_dec_set_nt(0);
    cuda_fp4_dec_set_a8(-1);
    cuda_fp4_dec_set_mma(-1);
    cuda_matvec_set_fp4_dec(-1);
}

/* hc_expand at m rows (hc 4, d 5120), in place as the model calls it;
 * bytes: s read and written, y read */
static void bench_hc_expand(int64_t m) {
    const int hc = 4;
    const int64_t d = 5120;
    float *s = (float *)dalloc((size_t)(m * hc * d) * 4), *y = (float *)dalloc((size_t)(m * d) * 4);
    float *post = (float *)dalloc((size_t)(m * hc) * 4), *comb = (float *)dalloc((size_t)(m * hc * hc) * 4);
    fill_scales<<<256, 256>>>(s, (size_t)(m * hc * d), 10);
    fill_scales<<<256, 256>>>(y, (size_t)(m * d), 11);
    fill_scales<<<64, 256>>>(post, (size_t)(m * hc), 12);
    fill_scales<<<64, 256>>>(comb, (size_t)(m * hc * hc), 13);
    double t = time_stream0([&](int) { DK(cuda_op_hc_expand(y, s, post, comb, m, hc, d, s, err)); }, 20, 15);
    double bytes = (double)(m * d) * 4 * (2 * hc + 1);
    printf("RESULT hc_expand_m%lld %.2f us %.0f GB/s %.0f%% of copy\n", (long long)m, t * 1e6, bytes / t / 1e9,
           100 * bytes / t / g_copy_bw);
    di_cuda_free(s); di_cuda_free(y); di_cuda_free(post); di_cuda_free(comb);
}

/* --x16: wo_a at an 8,192-token prefill (FP8 8 x 1024 x 4096, grouped) in
 * the prefill form without the scratch (x split in every block) and with
 * it (x16 written once, the bf16 form), x bf16-valued as the attention's o
 * is; then x of full fp32 values with the scratch (the copy and the flag
 * made, the fp32 form runs); then hc_mix at 8,192 rows, in the cluster
 * form and the rows form, and the rows form at 512; hc_expand at 8,192
 * rows and at 1 */
static void bench_x16(void) {
    bench_plain_one(DI_WFMT_FP8, "wo_a", 8 * 1024, 4096, 8, 8192, 0, "_split");
    bench_plain_one(DI_WFMT_FP8, "wo_a", 8 * 1024, 4096, 8, 8192, 0, "_x16", 1);
    bench_plain_one(DI_WFMT_FP8, "wo_a", 8 * 1024, 4096, 8, 8192, 1, "_split");
    bench_plain_one(DI_WFMT_FP8, "wo_a", 8 * 1024, 4096, 8, 8192, 1, "_x16", 1);
    bench_hc_mix(8192);
    bench_hc_mix(8192, 1);
    bench_hc_mix(512, 1);
    bench_hc_expand(8192);
    bench_hc_expand(1);
}

/* --midm: the plain products at decode batches past the decode form (9 to
 * 256 rows, x bf16-valued as the model's), k_mm_tc against the prefill
 * form with its bf16 copy of x (the same bits; cuda_ops_linear.cu's
 * pf_applies chooses between them), then as the automatic path chooses */
extern "C" void cuda_matmul_set_prefill(int min_rows); /* cuda_ops_linear.cu: 0 = never, 1 = always */
static void bench_mid_m(void) {
    struct { int fmt; const char *name; int64_t n, k; int groups; } cs[] = {
        {DI_WFMT_BF16, "head", 129280, 5120, 1}, {DI_WFMT_FP8, "wo_a", 8 * 1024, 4096, 8},
        {DI_WFMT_BF16, "gate", 384, 5120, 1},    {DI_WFMT_BF16, "cmp_wkv", 512, 5120, 1},
        {DI_WFMT_BF16, "idx_wp", 32, 5120, 1}};
    for (auto &c : cs)
        for (int64_t m : {9, 16, 32, 64, 128, 256}) {
            cuda_matmul_set_prefill(0);
            bench_plain_one(c.fmt, c.name, c.n, c.k, c.groups, m, 0, "_mmtc");
            cuda_matmul_set_prefill(1);
            bench_plain_one(c.fmt, c.name, c.n, c.k, c.groups, m, 0, "_pf", 1);
            cuda_matmul_set_prefill(512);
            bench_plain_one(c.fmt, c.name, c.n, c.k, c.groups, m, 0, "_auto", 1);
        }
    cuda_matmul_set_prefill(512);
}

/* --greedy: the rows' greedy summaries (cuda_ops_logits.cu) at the model's
 * vocabulary, 1 to 256 rows, against downloading the rows to page-locked
 * memory (what a greedy draw needed before, plus the host's passes), and
 * the summaries against the host's (core/row_exp.c) */
static void bench_greedy(void) {
    const int64_t V = 129280;
    for (int64_t m : {1, 8, 64, 256}) {
        float *x = (float *)dalloc((size_t)(m * V) * 4);
        di_row_greedy *g = (di_row_greedy *)dalloc((size_t)m * sizeof *g);
        void *scr = dalloc(cuda_op_logits_greedy_scratch_bytes(m, V));
        fill_scales<<<1024, 256>>>(x, (size_t)(m * V), 7);
        void *h = NULL;
        CK(cudaMallocHost(&h, (size_t)(m * V) * 4));
        const double ts = time_events([&] { DK(cuda_op_logits_greedy(x, m, V, V, NULL, g, scr, err)); }, 1, 9);
        const double td = time_events([&] { CK(cudaMemcpyAsync(h, x, (size_t)(m * V) * 4, cudaMemcpyDeviceToHost, 0)); },
                                      1, 9);
        std::vector<di_row_greedy> hd((size_t)m);
        CK(cudaMemcpy(hd.data(), g, (size_t)m * sizeof *g, cudaMemcpyDeviceToHost));
        int same = 0;
        for (int64_t r = 0; r < m; r++) {
            di_row_greedy hc;
            di_row_greedy_of((const float *)h + r * V, V, V, -1, &hc);
            same += !memcmp(&hc, &hd[(size_t)r], sizeof hc);
        }
        printf("greedy rows m=%lld V=%lld: summaries %.1f us, rows' download %.1f us (%.1f GB/s); "
               "%d of %lld summaries the host's bits\n",
               (long long)m, (long long)V, ts * 1e6, td * 1e6, (double)(m * V) * 4 / td * 1e-9, same, (long long)m);
        CK(cudaFreeHost(h));
        di_cuda_free(x);
        di_cuda_free(g);
        di_cuda_free(scr);
    }
}

/* --pair: an expert's w1 and w3 (FP8, the shared expert's 2304 x 5120) on
 * one x at decode, two launches of the quantizing decode kernel against one
 * launch of depth 2 (cuda_op_gemm_fp8_x_pair), weights rotated so that every
 * call reads them from HBM; the outputs compared bit for bit */
static void bench_pair(void) {
    const int64_t n = 2304, k = 5120, kbn = k / 32;
    const size_t wb = (size_t)(n * k), sb = (size_t)(((n + 31) / 32) * kbn);
    const int copies = weight_copies(2 * (wb + sb));
    std::vector<void *> w(2 * copies), ws(2 * copies);
    for (int c = 0; c < 2 * copies; c++) {
        w[c] = dalloc(wb);
        ws[c] = dalloc(sb);
        rnd(w[c], wb, 300 + c, 1);
        rnd(ws[c], sb, 400 + c, 2);
    }
    for (int ks : {0, 2, 4, 8})
    for (int64_t m : {1, 4, 8}) {
        if (ks && m == 4) continue;
        /* 0: each form's own split (two launches 8, the pair 4 at this
         * shape): their sums then group differently, and "same bits" holds
         * there only because x's powers of two make every sum exact */
        cuda_matvec_set_ks(ks);
        float *x = (float *)dalloc((size_t)(m * k) * 4);
        fill_scales<<<256, 256>>>(x, (size_t)(m * k), 5);
        float *y[4];
        for (int j = 0; j < 4; j++) y[j] = (float *)dalloc((size_t)(m * n) * 4);
        int done = 0;
        const double t2 = time_events([&] {
            for (int c = 0; c < copies; c++) {
                DK(cuda_op_gemm_fp8_x(x, m, k, (uint8_t *)w[2 * c], (uint8_t *)ws[2 * c], n, y[0], 1, &done, err));
                DK(cuda_op_gemm_fp8_x(x, m, k, (uint8_t *)w[2 * c + 1], (uint8_t *)ws[2 * c + 1], n, y[1], 1, &done, err));
            }
        }, copies, 9);
        const double t1 = time_events([&] {
            for (int c = 0; c < copies; c++)
                DK(cuda_op_gemm_fp8_x_pair(x, m, k, (uint8_t *)w[2 * c], (uint8_t *)ws[2 * c], (uint8_t *)w[2 * c + 1],
                                           (uint8_t *)ws[2 * c + 1], n, n, y[2], y[3], 1, &done, err));
        }, copies, 9);
        std::vector<float> h[4];
        for (int j = 0; j < 4; j++) {
            h[j].resize((size_t)(m * n));
            CK(cudaMemcpy(h[j].data(), y[j], (size_t)(m * n) * 4, cudaMemcpyDeviceToHost));
        }
        const bool same = done && h[0] == h[2] && h[1] == h[3];
        const double bytes = 2.0 * (double)(wb + sb);
        printf("RESULT fp8_pair_%lldx%lld_m%lld%s%s: two launches %.2f us (%.0f%% of copy), one launch %.2f us (%.0f%%), "
               "%s\n", (long long)n, (long long)k, (long long)m, ks ? "_ks" : "", ks ? std::to_string(ks).c_str() : "",
               t2 * 1e6, 100 * bytes / t2 / g_copy_bw, t1 * 1e6, 100 * bytes / t1 / g_copy_bw,
               same ? "same bits" : "OTHER BITS");
        for (int j = 0; j < 4; j++) di_cuda_free(y[j]);
        di_cuda_free(x);
    }
    cuda_matvec_set_ks(0);
    for (int c = 0; c < 2 * copies; c++) { di_cuda_free(w[c]); di_cuda_free(ws[c]); }
}

/* --l2pf: what a decode product at one row gains when its weights are
 * already in L2. Each model shape three ways, per-op events around the
 * product alone: cold (copies rotated over > 512 MB, as the model reads
 * them), prefetched (the copy's bytes sent to L2 by bulk prefetches, a
 * pause standing for the latency-bound work that would hide them, then
 * the product), hot (one copy, read again and again). Also the prefetch
 * launch's own time and the time for the bytes to arrive (a prefetch
 * straight before the product, no pause). */
__global__ void k_l2_prefetch(const uint8_t *p, size_t n) {
    const size_t chunk = 65536;
    for (size_t off = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * chunk; off < n;
         off += (size_t)gridDim.x * blockDim.x * chunk) {
        uint32_t sz = (uint32_t)(n - off < chunk ? n - off : chunk) & ~15u;
        if (sz) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p + off), "r"(sz) : "memory");
    }
}
__global__ void k_pause(long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while ((long long)(t - t0) < ns);
}
struct l2_buf { void *p; size_t n; };
typedef std::vector<std::vector<l2_buf>> l2_copies; /* [copy][buffer] */
/* mode 0 cold, 1 prefetch + a pause of pause_ns, 2 prefetch then at once,
 * 3 hot; returns the µs of the product between its own events, the mean of
 * a pass over `iters` calls, the best of three passes */
template <typename F>
static double l2_time(int mode, long long pause_ns, int copies, const l2_copies &bufs, F op, int iters) {
    std::vector<cudaEvent_t> ev(2 * iters);
    for (auto &e : ev) CK(cudaEventCreate(&e));
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        for (int it = 0; it < iters; it++) {
            int c = mode == 3 ? 0 : it % copies;
            if (mode == 1 || mode == 2)
                for (auto &b : bufs[c]) /* one 64 KB prefetch a thread */
                    k_l2_prefetch<<<(unsigned)((b.n + (32u << 16) - 1) / (32u << 16)), 32>>>((const uint8_t *)b.p, b.n);
            if (mode == 1) k_pause<<<1, 32>>>(pause_ns);
            if (mode == 3 && it == 0) op(c); /* warm */
            CK(cudaEventRecord(ev[2 * it], 0));
            op(c);
            CK(cudaEventRecord(ev[2 * it + 1], 0));
        }
        CK(cudaDeviceSynchronize());
        double tot = 0;
        for (int it = 0; it < iters; it++) {
            float t = 0;
            CK(cudaEventElapsedTime(&t, ev[2 * it], ev[2 * it + 1]));
            tot += t;
        }
        best = std::min(best, tot * 1e3 / iters);
    }
    for (auto &e : ev) CK(cudaEventDestroy(e));
    return best;
}
/* One product's RESULT line (the four modes, 60 µs pauses; with pauses
 * also 10 and 20 µs), then its weight copies freed. */
template <typename F>
static void l2_report(const char *name, l2_copies &bufs, F op, bool pauses) {
    const char *mname[] = {"cold", "prefetched", "prefetch-at-once", "hot"};
    const int copies = (int)bufs.size();
    size_t bytes = 0;
    for (auto &b : bufs[0]) bytes += b.n;
    printf("RESULT l2pf %s (%.1f MiB):", name, (double)bytes / 1048576.0);
    for (int mode = 0; mode < 4; mode++)
        printf(" %s %.2f us%s", mname[mode], l2_time(mode, 60000, copies, bufs, op, 2 * copies), mode < 3 ? "," : "");
    if (pauses)
        for (long long ns : {10000LL, 20000LL})
            printf(", pause %lld us %.2f us", ns / 1000, l2_time(1, ns, copies, bufs, op, 2 * copies));
    printf("\n");
    fflush(stdout);
    for (auto &v : bufs)
        for (auto &b : v) di_cuda_free(b.p);
}
static void bench_l2pf(void) {
    /* FP8 products through the quantizing decode kernel, one or two matrices */
    struct { const char *name; int64_t n, k; int pair; } fp8[] = {
        {"wq_a+wkv", 1280, 5120, 512}, {"wq_b", 32768, 1280, 0}, {"wo_b", 5120, 8192, 0},
        {"shared_w13", 2304, 5120, 2304}, {"shared_w2", 5120, 2304, 0}};
    for (auto &s : fp8) {
        const int64_t kbn = s.k / 32;
        const size_t wb = (size_t)(s.n * s.k), sb = (size_t)(((s.n + 31) / 32) * kbn);
        const size_t wb2 = (size_t)(s.pair * s.k), sb2 = (size_t)(((s.pair + 31) / 32) * kbn);
        const int copies = weight_copies(wb + sb + wb2 + sb2);
        l2_copies bufs(copies);
        for (int c = 0; c < copies; c++) {
            bufs[c].push_back({dalloc(wb), wb});
            bufs[c].push_back({dalloc(sb), sb});
            rnd(bufs[c][0].p, wb, 300 + c, 1);
            rnd(bufs[c][1].p, sb, 400 + c, 2);
            if (s.pair) {
                bufs[c].push_back({dalloc(wb2), wb2});
                bufs[c].push_back({dalloc(sb2), sb2});
                rnd(bufs[c][2].p, wb2, 500 + c, 1);
                rnd(bufs[c][3].p, sb2, 600 + c, 2);
            }
        }
        float *x = (float *)dalloc((size_t)s.k * 4), *y = (float *)dalloc((size_t)s.n * 4),
              *y2 = (float *)dalloc((size_t)std::max<int64_t>(s.pair, 1) * 4);
        fill_scales<<<256, 256>>>(x, (size_t)s.k, 5);
        int done = 0;
        auto op = [&](int c) {
            auto &b = bufs[c];
            if (s.pair)
                DK(cuda_op_gemm_fp8_x_pair(x, 1, s.k, (uint8_t *)b[0].p, (uint8_t *)b[1].p, (uint8_t *)b[2].p,
                                           (uint8_t *)b[3].p, s.n, s.pair, y, y2, 1, &done, err));
            else
                DK(cuda_op_gemm_fp8_x(x, 1, s.k, (uint8_t *)b[0].p, (uint8_t *)b[1].p, s.n, y, 1, &done, err));
        };
        l2_report(s.name, bufs, op, true);
        di_cuda_free(x); di_cuda_free(y); di_cuda_free(y2);
    }
    /* plain products: wo_a (FP8, 8 groups) and the bf16 router / compressor */
    struct { int fmt; const char *name; int64_t n, k; int groups; } pl[] = {
        {DI_WFMT_FP8, "wo_a", 8 * 1024, 4096, 8}, {DI_WFMT_BF16, "gate", 384, 5120, 1},
        {DI_WFMT_BF16, "cmp_wkv", 512, 5120, 1}};
    for (auto &s : pl) {
        const size_t wb = s.fmt == DI_WFMT_BF16 ? (size_t)(s.n * s.k) * 2 : (size_t)(s.n * s.k);
        const size_t sb = s.fmt == DI_WFMT_FP8 ? (size_t)(((s.n + 31) / 32) * (s.k / 32)) : 0;
        const int copies = weight_copies(wb + sb);
        l2_copies bufs(copies);
        for (int c = 0; c < copies; c++) {
            bufs[c].push_back({dalloc(wb), wb});
            rnd(bufs[c][0].p, wb, 300 + c, 1);
            if (sb) {
                bufs[c].push_back({dalloc(sb), sb});
                rnd(bufs[c][1].p, sb, 400 + c, 2);
            }
        }
        const int64_t kx = s.k * s.groups, nr = s.n / s.groups;
        float *x = (float *)dalloc((size_t)kx * 4), *y = (float *)dalloc((size_t)s.n * 4);
        fill_full<<<256, 256>>>(x, (size_t)kx);
        auto op = [&](int c) {
            auto &b = bufs[c];
            DK(cuda_op_matmul_plain_s(s.fmt, b[0].p, sb ? (const uint8_t *)b[1].p : NULL, s.n, s.k, x, kx, 1,
                                      s.groups, nr, y, s.n, s.groups > 1, NULL, 0, err));
        };
        l2_report(s.name, bufs, op, false);
        di_cuda_free(x); di_cuda_free(y);
    }
    /* the prefetch launch alone: 32 MB from one block and from 16 */
    void *big = dalloc((size_t)32 << 20);
    double tl = time_events([&] { k_l2_prefetch<<<1, 64>>>((const uint8_t *)big, (size_t)32 << 20); }, 1, 21);
    double tw = time_events([&] { k_l2_prefetch<<<16, 32>>>((const uint8_t *)big, (size_t)32 << 20); }, 1, 21);
    printf("RESULT l2pf prefetch launch of 32 MiB: one block of 64 threads %.2f us, 16 blocks of 32 %.2f us\n",
           tl * 1e6, tw * 1e6);
    di_cuda_free(big);
}

/* --moepf: the routed experts at batch 1 as the step runs them, w1 + w3
 * (one pair launch) then w2, with w2's weights of the step's experts sent
 * to L2 by bulk prefetches issued before the pair (mode 1; mode 2 the same
 * with an evict_last policy) or not (mode 0): the pair leaves HBM ~40 %
 * idle at one row, which the prefetches could fill. Per step, six experts
 * of 384 drawn anew (the weights cold), graph launches back to back, three
 * alternations; then the parts alone, and the pair and w2 side by side on
 * two streams. */
__global__ void k_moe_w2_prefetch(const int32_t *ids, int ng, const uint8_t *w, size_t wbytes, const uint8_t *ws,
                                  size_t sbytes, int mode) {
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
    const size_t chunk = 65536;
    const int z = blockIdx.y;
    if (z >= ng) return;
    const size_t e = (size_t)ids[z];
    const size_t per = wbytes + sbytes, nck = (per + chunk - 1) / chunk;
    for (size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x; c < nck; c += (size_t)gridDim.x * blockDim.x) {
        size_t off = c * chunk;
        const uint8_t *p;
        size_t n;
        if (off < wbytes) {
            p = w + e * wbytes + off;
            n = wbytes - off < chunk ? wbytes - off : chunk;
        } else {
            p = ws + e * sbytes + (off - wbytes);
            n = sbytes - (off - wbytes) < chunk ? sbytes - (off - wbytes) : chunk;
        }
        const uint32_t sz = (uint32_t)n & ~15u;
        if (!sz) continue;
        if (mode == 2)
            asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;\n" ::"l"(p), "r"(sz), "l"(pol)
                         : "memory");
        else
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(sz) : "memory");
    }
}
static void bench_moe_pf(void) {
    const int64_t E = 384, D = 5120, I = 2304, topk = 6;
    const size_t w13b = (size_t)(I * D / 2), s13b = (size_t)(I * (D / 32)), w2b = (size_t)(D * I / 2),
                 s2b = (size_t)(D * (I / 32));
    void *w1 = dalloc(w13b * E), *s1 = dalloc(s13b * E), *w3 = dalloc(w13b * E), *s3 = dalloc(s13b * E);
    void *w2 = dalloc(w2b * E), *s2 = dalloc(s2b * E);
    rnd(w1, w13b * E, 300); rnd(s1, s13b * E, 301, 2); rnd(w3, w13b * E, 302); rnd(s3, s13b * E, 303, 2);
    rnd(w2, w2b * E, 304); rnd(s2, s2b * E, 305, 2);
    void *qa = dalloc((size_t)D), *sa = dalloc((size_t)(D / 32) * 4);
    void *qh = dalloc((size_t)(topk * I)), *sh = dalloc((size_t)(topk * (I / 32)) * 4);
    rnd(qa, (size_t)D, 306, 1);
    rnd(qh, (size_t)(topk * I), 307, 1);
    fill_scales<<<256, 256>>>((float *)sa, (size_t)(D / 32), 308);
    fill_scales<<<256, 256>>>((float *)sh, (size_t)(topk * (I / 32)), 309);
    void *g = dalloc((size_t)(topk * I) * 4), *u = dalloc((size_t)(topk * I) * 4), *y = dalloc((size_t)(topk * D) * 4);
    const int steps = 40;
    uint32_t seed = 777;
    auto next = [&]() { seed = seed * 1664525u + 1013904223u; return seed >> 8; };
    std::vector<void *> idsv, offv;
    std::vector<int32_t> off{0, 1, 2, 3, 4, 5, 6}, zero(6, 0), iota{0, 1, 2, 3, 4, 5};
    void *rows0 = dalloc(6 * 4), *rowsi = dalloc(6 * 4), *offd = dalloc(7 * 4);
    CK(cudaMemcpy(rows0, zero.data(), 24, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(rowsi, iota.data(), 24, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(offd, off.data(), 28, cudaMemcpyHostToDevice));
    for (int i = 0; i < steps; i++) {
        std::vector<int32_t> ids;
        while ((int)ids.size() < topk) {
            int32_t e = (int32_t)(next() % E);
            if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
        }
        std::sort(ids.begin(), ids.end());
        void *d = dalloc(24);
        CK(cudaMemcpy(d, ids.data(), 24, cudaMemcpyHostToDevice));
        idsv.push_back(d);
    }
    /* a step's launches: the pair (w1 + w3) and w2 of step i's experts */
    auto pair = [&](int i, cudaStream_t st) {
        DK(di_cuda_gemm_mxfp4_grouped_pair((uint8_t *)qa, (float *)sa, D, (uint8_t *)w1, (uint8_t *)s1, (uint8_t *)w3,
                                           (uint8_t *)s3, I, (int32_t *)idsv[i], (int32_t *)offd, 6, (int32_t *)rows0,
                                           1, g, u, DI_DTYPE_F32, st, err));
    };
    auto down = [&](int i, cudaStream_t st) {
        DK(di_cuda_gemm_mxfp4_grouped((uint8_t *)qh, (float *)sh, I, (uint8_t *)w2, (uint8_t *)s2, D,
                                      (int32_t *)idsv[i], (int32_t *)offd, 6, (int32_t *)rowsi, 1, y, DI_DTYPE_F32, st,
                                      err));
    };
    const double bytes = 6.0 * (2 * (w13b + s13b) + w2b + s2b); /* a step's weights and scales */
    for (int rep = 0; rep < 3; rep++)
        for (int mode : {0, 1, 2}) {
            double t = time_ops([&](int i, cudaStream_t st) {
                if (mode)
                    k_moe_w2_prefetch<<<dim3(4, 6), 32, 0, st>>>((const int32_t *)idsv[i], 6, (const uint8_t *)w2, w2b,
                                                               (const uint8_t *)s2, s2b, mode);
                pair(i, st);
                down(i, st);
            }, steps, 10);
            printf("RESULT moepf b1 pair+w2 mode %d (%s): %.2f us a step, %.0f%% of copy (floor %.2f us)\n", mode,
                   mode == 0 ? "no prefetch" : mode == 1 ? "w2 prefetched" : "w2 prefetched, evict_last",
                   t * 1e6, 100 * bytes / t / g_copy_bw, bytes / g_copy_bw * 1e6);
            fflush(stdout);
        }
    /* the parts alone, cold: pair, w2, prefetch launch */
    double tp = time_ops(pair, steps, 10);
    double tw = time_ops(down, steps, 10);
    double tf = time_ops([&](int i, cudaStream_t st) {
        k_moe_w2_prefetch<<<dim3(4, 6), 32, 0, st>>>((const int32_t *)idsv[i], 6, (const uint8_t *)w2, w2b,
                                                   (const uint8_t *)s2, s2b, 1);
    }, steps, 10);
    printf("RESULT moepf parts b1: pair %.2f us, w2 %.2f us, prefetch launch %.2f us\n", tp * 1e6, tw * 1e6, tf * 1e6);
    /* The pair and w2 side by side (w2 of the step before on a second
     * stream, forked and joined inside the graph): how far a step's two
     * products can overlap at all, the bound of any form that runs w2's
     * tiles while the pair's last ones finish (one persistent launch). */
    cudaStream_t st2;
    cudaEvent_t fork, join;
    CK(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    for (int rep = 0; rep < 3; rep++) {
        const double ts = time_ops([&](int i, cudaStream_t st) {
            CK(cudaEventRecord(fork, st));
            CK(cudaStreamWaitEvent(st2, fork, 0));
            down((i + steps - 1) % steps, st2);
            pair(i, st);
            CK(cudaEventRecord(join, st2));
            CK(cudaStreamWaitEvent(st, join, 0));
        }, steps, 10);
        printf("RESULT moepf b1 pair || w2 (two streams): %.2f us a step, %.0f%% of copy (in series %.2f)\n",
               ts * 1e6, 100 * bytes / ts / g_copy_bw, (tp + tw) * 1e6);
        fflush(stdout);
    }
    CK(cudaEventDestroy(fork));
    CK(cudaEventDestroy(join));
    CK(cudaStreamDestroy(st2));
    for (void *d : idsv) di_cuda_free(d);
    for (void *d : {w1, s1, w3, s3, w2, s2, qa, sa, qh, sh, g, u, y, rows0, rowsi, offd}) di_cuda_free(d);
}

/* --topk: the indexer's top-512 of one row (cuda_op_topk_select, as
 * topk_select runs it at decode) over widths from a ratio-1 layer at a
 * short context to the candidate pool's 16,384 and past it; scores of a
 * narrow range (1 + N(0, 1)·2^-8: every key shares its top bits) and of a
 * coarse grid with ties. Stream launches, back to back. */
__global__ void fill_topk_scores(float *p, size_t n, int narrow) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
        /* a sum of four uniforms: roughly normal */
        float u = ((h & 255u) + ((h >> 8) & 255u) + ((h >> 16) & 255u) + (h >> 24)) / 256.0f - 2.0f;
        p[i] = narrow ? 1.0f + u * 0x1p-8f : (float)((int)(h % 300u) - 150) * 0.25f;
    }
}
static void bench_topk(void) {
    for (int narrow : {1, 0})
        for (int64_t w : {1000, 4096, 16384, 65536}) {
            float *sc = (float *)dalloc((size_t)w * 4);
            int32_t *idx = (int32_t *)dalloc(512 * 4);
            fill_topk_scores<<<256, 256>>>(sc, (size_t)w, narrow);
            const double t = time_stream0([&](int) { DK(cuda_op_topk_select(sc, NULL, 1, w, 512, 512, idx, err)); },
                                          50, 9);
            printf("RESULT topk_%s_w%lld_k512 %.2f us\n", narrow ? "narrow" : "grid", (long long)w, t * 1e6);
            di_cuda_free(sc);
            di_cuda_free(idx);
        }
}

/* --fp8mid: the FP8 products of a decode step at batches past the decode
 * kernels (m > 16: the wgmma tiles), the model's shapes [n x k], by the
 * automatic path and by the matrix-vector kernels, same call */
static void bench_fp8_mid(void) {
    const int64_t sh[][2] = {{1280, 5120}, {32768, 1280}, {512, 5120}, {5120, 8192},
                             {2304, 5120}, {5120, 2304}, {4096, 1280}};
    for (int64_t m : {32, 64, 256})
        for (auto &s : sh) {
            bench_gemm(m, s[0], s[1], DI_CUDA_GEMM_AUTO);
            bench_gemm(m, s[0], s[1], DI_CUDA_GEMM_MATVEC);
        }
}

/* --pfshapes: the FP8 products of an 8K-token prefill at the model's
 * shapes [n x k], as the model calls them (the automatic path): wq_a,
 * wq_b, wkv, wo_b, the shared expert's w1 / w3 and w2, the indexer's
 * wq_b */
static void bench_pf_shapes(void) {
    const int64_t sh[][2] = {{1280, 5120}, {32768, 1280}, {512, 5120}, {5120, 8192},
                             {2304, 5120}, {5120, 2304}, {4096, 1280}};
    for (auto &s : sh) bench_gemm(8192, s[0], s[1], DI_CUDA_GEMM_AUTO);
}

/* --fp4st: the tensor-core decode kernel's ring depth (stages a warp)
 * forced to 2 and 3 alternately three times, then 4, then as chosen (0;
 * the token slots follow the stages: what two blocks an SM leave), on the w1 + w3 pair and w2 at batch
 * 1, 8, 64 and 256, the projections as moe_experts calls them */
extern "C" void cuda_fp4_dec_set_st(int st); /* cuda_fp4_dec.cu: ring stages, 0 chosen */
static void bench_fp4_st(void) {
    cuda_matvec_set_fp4_dec(1);
    cuda_fp4_dec_set_mma(1);
    char sfx[32];
    for (int st : {2, 3, 2, 3, 2, 3, 4, 0}) {
        snprintf(sfx, sizeof sfx, st ? "_mma_st%d" : "_mma_st_chosen", st);
        cuda_fp4_dec_set_st(st);
        for (int b : {1, 8, 64, 256}) {
            bench_moe_grouped(b, sfx, "w13pair", 2304, 5120, true, true);
            bench_moe_grouped(b, sfx, "w2", 5120, 2304, true);
        }
    }
    cuda_fp4_dec_set_st(0);
    cuda_fp4_dec_set_mma(-1);
    cuda_matvec_set_fp4_dec(-1);
}

/* --fp4a8: where the A8 activation form pays: the w1 + w3 pair and w1 as
 * moe_experts calls them at batch 96 to 320, in the f16 form (w1: 5 token
 * slots) and the A8 form (8), alternated three times, then as chosen */
static void bench_fp4_a8(void) {
    cuda_matvec_set_fp4_dec(1);
    cuda_fp4_dec_set_mma(1);
    for (int a8 : {0, 1, 0, 1, 0, 1, -1}) {
        cuda_fp4_dec_set_a8(a8);
        const char *sfx = a8 < 0 ? "_mma_chosen" : a8 ? "_mma_a8" : "_mma_f16";
        for (int b : {96, 128, 160, 192, 224, 256, 320}) {
            bench_moe_grouped(b, sfx, "w13pair", 2304, 5120, true, true);
            bench_moe_grouped(b, sfx, "w1", 2304, 5120, true);
        }
    }
    cuda_fp4_dec_set_a8(-1);
    cuda_fp4_dec_set_mma(-1);
    cuda_matvec_set_fp4_dec(-1);
}

/* --fp4wg: the tensor-core decode kernel's WG form (wgmma, weights from
 * registers) against its mma.sync form, alternated three times, on the
 * w1 + w3 pair and w2 as moe_experts calls them at batch 1, 8, 64 and 256;
 * then --wgtiled's check */
extern "C" void cuda_fp4_dec_set_wg(int on); /* cuda_fp4_dec.cu: 1 the WG form, 0 mma.sync, -1 env */
extern "C" void cuda_matvec_set_grouped_tiled(int on); /* cuda_matvec.cu: 0 never the tiled grouped GEMM */
static void bench_wg_tiled(void);
static void bench_fp4_wg(void) {
    cuda_matvec_set_fp4_dec(1);
    cuda_fp4_dec_set_mma(1);
    for (int wg : {0, 1, 0, 1, 0, 1}) {
        cuda_fp4_dec_set_wg(wg);
        const char *sfx = wg ? "_mma_wg" : "_mma_sync";
        for (int b : {1, 8, 64, 256}) {
            bench_moe_grouped(b, sfx, "w13pair", 2304, 5120, true, true);
            bench_moe_grouped(b, sfx, "w2", 5120, 2304, true);
        }
    }
    cuda_fp4_dec_set_wg(-1);
    cuda_fp4_dec_set_mma(-1);
    cuda_matvec_set_fp4_dec(-1);
    bench_wg_tiled();
}

/* --wgtiled: how often the WG decode form and the tiled prefill form
 * (cuda_gemm_grouped_wg.cu: the same FP8 tensor-core adder a 32-block, the
 * same ascending promotion, but the block's elements in their own order
 * there and even-then-odd here) give other bits: one grouped product of 48
 * tokens over 8 experts at the expert shapes, both ways; prints the count
 * (run 140: 0 of 2.1 M; a test's inputs later gave 2 of 24,000, so
 * batch-invariant mode cannot mix the two) */
static void bench_wg_tiled(void) {
    const int E = 8, T = 48, topk = 6;
    for (int shape = 0; shape < 2; shape++) {
        const int64_t n = shape ? 5120 : 2304, k = shape ? 2304 : 5120, kbn = k / 32;
        const size_t wb = (size_t)(n * k / 2), sb = (size_t)(n * kbn);
        void *w = dalloc(wb * E), *ws = dalloc(sb * E);
        void *qa = dalloc((size_t)(T * k)), *sa = dalloc((size_t)(T * kbn) * 4);
        rnd(w, wb * E, 500);
        rnd(ws, sb * E, 501, 2);
        rnd(qa, (size_t)(T * k), 502, 1);
        fill_scales<<<256, 256>>>((float *)sa, (size_t)(T * kbn), 503);
        std::vector<int32_t> ids, off{0}, rows;
        for (int e = 0; e < E; e++) {
            ids.push_back(e);
            for (int t = 0; t < T; t++)
                if ((t + e) % E < topk) rows.push_back(t);
            off.push_back((int32_t)rows.size());
        }
        const size_t np = rows.size();
        void *dids = dalloc(ids.size() * 4), *doff = dalloc(off.size() * 4), *drows = dalloc(rows.size() * 4);
        CK(cudaMemcpy(dids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(doff, off.data(), off.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(drows, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
        void *o1 = dalloc(np * n * 4), *o2 = dalloc(np * n * 4);
        cuda_fp4_dec_set_wg(1);
        cuda_matvec_set_fp4_dec(1);
        DK(di_cuda_gemm_mxfp4_grouped((const uint8_t *)qa, (const float *)sa, k, (const uint8_t *)w,
                                      (const uint8_t *)ws, n, (const int32_t *)dids, (const int32_t *)doff, E,
                                      (const int32_t *)drows, T, o1, DI_DTYPE_F32, NULL, err));
        cuda_matvec_set_fp4_dec(0);
        cuda_matvec_set_grouped_tiled(1);
        DK(di_cuda_gemm_mxfp4_grouped((const uint8_t *)qa, (const float *)sa, k, (const uint8_t *)w,
                                      (const uint8_t *)ws, n, (const int32_t *)dids, (const int32_t *)doff, E,
                                      (const int32_t *)drows, T, o2, DI_DTYPE_F32, NULL, err));
        CK(cudaDeviceSynchronize());
        cuda_matvec_set_fp4_dec(-1);
        cuda_fp4_dec_set_wg(-1);
        std::vector<float> h1(np * n), h2(np * n);
        CK(cudaMemcpy(h1.data(), o1, np * n * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(h2.data(), o2, np * n * 4, cudaMemcpyDeviceToHost));
        size_t differ = 0;
        double worst = 0;
        for (size_t i = 0; i < np * n; i++) {
            if (memcmp(&h1[i], &h2[i], 4)) differ++;
            const double d = fabs((double)h1[i] - h2[i]) / (fabs((double)h2[i]) + 1e-30);
            if (d > worst && std::isfinite(d)) worst = d;
        }
        printf("RESULT wgtiled_%s_differ %zu of %zu (largest relative difference %.3g)\n", shape ? "w2" : "w1", differ,
               np * n, worst);
        for (void *p : {w, ws, qa, sa, dids, doff, drows, o1, o2}) CK(cudaFree(p));
    }
}

/* --xskip: the decode form of the bf16-numerics products (k_mm_dec) with x
 * bf16-valued, as the step's inputs are: its second and third terms
 * skipped for the whole phase (1) or loaded and voted on every round (0),
 * alternated three times, m = 1 and 8, dec_shapes but the head */
extern "C" void cuda_matmul_set_xskip(int on); /* cuda_ops_linear.cu: measuring aid, -1 the default */
static void bench_xskip(void) {
    cuda_matmul_set_decode(1, 0);
    for (int on : {0, 1, 0, 1, 0, 1}) {
        cuda_matmul_set_xskip(on);
        for (int i = 0; i < dec_shapes_small; i++)
            for (int64_t m : {1, 8}) {
                const plain_shape &c = dec_shapes[i];
                bench_plain_one(c.fmt, c.name, c.n, c.k, c.groups, m, 0, on ? "_xskip1" : "_xskip0");
            }
    }
    cuda_matmul_set_xskip(-1);
}

/* --fp4aid [B]: the tensor-core decode kernel (f16 form) with its
 * measuring aids (cuda_fp4_dec.cu FM_F_*: 1 no conversion, 2 no scales, 3
 * neither, 4 copies only; 8 the chunk rule before), then as built, on the
 * w1 + w3 pair and w2 as moe_experts calls them, at batch 1, 8 and 64 (B
 * alone when given: the profiler's run, as built) */
extern "C" void cuda_fp4_dec_set_aid(int flags); /* cuda_fp4_dec.cu: FM_F_* (0 none) */
static void bench_fp4_aid(int only) {
    cuda_matvec_set_fp4_dec(1);
    cuda_fp4_dec_set_mma(1);
    cuda_fp4_dec_set_a8(0);
    char sfx[32];
    for (int aid : {0, 8, 1, 2, 3, 4, 0, 8}) {
        if (only && aid) continue;
        snprintf(sfx, sizeof sfx, "_mma_aid%d", aid);
        cuda_fp4_dec_set_aid(aid);
        for (int b : {1, 8, 64}) {
            if (only && b != only) continue;
            bench_moe_grouped(b, sfx, "w13pair", 2304, 5120, true, true);
            bench_moe_grouped(b, sfx, "w2", 5120, 2304, true);
        }
        if (only) break;
    }
    cuda_fp4_dec_set_aid(0);
    cuda_fp4_dec_set_a8(-1);
    cuda_fp4_dec_set_mma(-1);
    cuda_matvec_set_fp4_dec(-1);
}

/* --fp4bal [B]: the tensor-core decode kernel's blocks, the tiles dealt
 * evenly (the default) against blocks of ceil(tiles / places) tiles as
 * before, alternating twice, on the w1 + w3 pair, w1 and w2 as moe_experts
 * calls them at batch 1, 8, 64 and 256; then where the block scheduler puts
 * a launch's blocks (the probe below). B given: that batch alone, as built
 * (the profiler's run). */
extern "C" void cuda_fp4_dec_set_bal(int on); /* cuda_fp4_dec.cu: 0 the blocks before */
__global__ void __launch_bounds__(256, 2) k_smid_probe(int *smid, long long spin) {
    extern __shared__ int probe_raw[];
    int id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    if (threadIdx.x == 0) {
        probe_raw[0] = id;
        smid[blockIdx.x] = id;
    }
    const long long t0 = clock64();
    while (clock64() - t0 < spin) { /* stay resident: the whole grid is one wave */
    }
}
/* 264 blocks (two an SM) of the kernel's size (256 threads, 100 KB of
 * shared memory: two fit an SM, not three): how many SMs got two of the
 * first `first` blocks in launch order (0 if the scheduler spreads a wave's
 * first blocks over distinct SMs), and the most blocks an SM got */
static void probe_smid(int first) {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int nb = 2 * sms;
    int *d = (int *)dalloc((size_t)nb * 4);
    const int smem = 100 * 1024;
    CK(cudaFuncSetAttribute(k_smid_probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    std::vector<int> h(nb);
    for (int rep = 0; rep < 3; rep++) {
        k_smid_probe<<<nb, 256, smem>>>(d, 200000);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h.data(), d, (size_t)nb * 4, cudaMemcpyDeviceToHost));
        std::vector<int> all(1024, 0), head(1024, 0);
        int twice = 0, most = 0;
        for (int i = 0; i < nb; i++) {
            most = std::max(most, ++all[h[i] & 1023]);
            if (i < first && ++head[h[i] & 1023] == 2) twice++;
        }
        printf("RESULT smid_probe rep %d: %d blocks, %d SMs got two of the first %d, at most %d an SM; first 8 "
               "blocks on SMs %d %d %d %d %d %d %d %d\n",
               rep, nb, twice, first, most, h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
    }
    di_cuda_free(d);
}
static void bench_fp4_bal(int only) {
    cuda_matvec_set_fp4_dec(1);
    cuda_fp4_dec_set_mma(1);
    char sfx[32];
    for (int bal : {0, 1, 0, 1}) {
        if (only && !bal) continue;
        snprintf(sfx, sizeof sfx, "_mma_bal%d", bal);
        cuda_fp4_dec_set_bal(bal);
        for (int b : {1, 8, 64, 256}) {
            if (only && b != only) continue;
            bench_moe_grouped(b, sfx, "w13pair", 2304, 5120, true, true);
            bench_moe_grouped(b, sfx, "w2", 5120, 2304, true);
            if (b <= 8) bench_moe_grouped(b, sfx, "w1", 2304, 5120, true);
        }
        if (only) break;
    }
    cuda_fp4_dec_set_bal(1);
    cuda_fp4_dec_set_mma(-1);
    cuda_matvec_set_fp4_dec(-1);
    if (!only) probe_smid(72);
}

/* --gg [f,f,...]: the grouped MXFP4 GEMM of the prefill's routed experts
 * (cuda_gemm_grouped.cu) at 8,192 tokens x top-6 over 384 experts, w1
 * [2304 x 5120] and w2 [5120 x 2304], in each of the kernel's forms by
 * flags (default: all built, the default form first: 137, the wgmma form
 * of cuda_gemm_grouped_wg.cu with the weights by the bulk copy engine; 8 +
 * v its variant v: 9 the weights by the producer's copies, 10 and 12
 * measuring aids). */
extern "C" void cuda_gemm_grouped_set_form(int form);
static void bench_gg(const char *list) {
    int forms[16], nf = 0;
    if (list) {
        for (const char *p = list; *p && nf < 16;) {
            forms[nf++] = atoi(p);
            while (*p && *p != ',') p++;
            if (*p) p++;
        }
    } else {
        const int all[] = {137, 9, 8, 7, 1, 0, 3, 5};
        for (int f : all) forms[nf++] = f;
    }
    char sfx[32];
    for (int i = 0; i < nf; i++) {
        cuda_gemm_grouped_set_form(forms[i]);
        snprintf(sfx, sizeof sfx, "_f%d", forms[i]);
        bench_moe_grouped(8192, sfx, "w1", 2304, 5120, true);
        bench_moe_grouped(8192, sfx, "w2", 5120, 2304, true);
    }
    cuda_gemm_grouped_set_form(-1);
}

int main(int argc, char **argv) {
    /* --quick: shorter; --gemm / --matvec: only that half (plus the copy
     * ceiling), so a run that changes one kernel family spends less time;
     * --decode: bench_decode only */
    int quick = 0, gemm = 1, matvec = 1, decode = 0, plain = 0;
    const char *gg_list = NULL;
    int aid_batch = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--gemm")) matvec = 0;
        else if (!strcmp(argv[i], "--matvec")) gemm = 0;
        else if (!strcmp(argv[i], "--decode")) gemm = matvec = 0, decode = 1;
        else if (!strcmp(argv[i], "--plain")) gemm = matvec = 0, plain = 1; /* bench_plain only */
        else if (!strcmp(argv[i], "--plaindec")) gemm = matvec = 0, plain = 2; /* bench_plain_dec only */
        else if (!strcmp(argv[i], "--fp4dec")) gemm = matvec = 0, plain = 3; /* bench_fp4_dec only */
        else if (!strcmp(argv[i], "--fp4st")) gemm = matvec = 0, plain = 5; /* bench_fp4_st only */
        else if (!strcmp(argv[i], "--fp4a8")) gemm = matvec = 0, plain = 16; /* bench_fp4_a8 only */
        else if (!strcmp(argv[i], "--fp4wg")) gemm = matvec = 0, plain = 20; /* bench_fp4_wg only */
        else if (!strcmp(argv[i], "--wgtiled")) gemm = matvec = 0, plain = 21; /* bench_wg_tiled only */
        else if (!strcmp(argv[i], "--xskip")) gemm = matvec = 0, plain = 17; /* bench_xskip only */
        else if (!strcmp(argv[i], "--x16")) gemm = matvec = 0, plain = 6; /* bench_x16 only */
        else if (!strcmp(argv[i], "--pfshapes")) gemm = matvec = 0, plain = 7; /* bench_pf_shapes only */
        else if (!strcmp(argv[i], "--midm")) gemm = matvec = 0, plain = 9; /* bench_mid_m only */
        else if (!strcmp(argv[i], "--fp8mid")) gemm = matvec = 0, plain = 10; /* bench_fp8_mid only */
        else if (!strcmp(argv[i], "--greedy")) gemm = matvec = 0, plain = 12; /* bench_greedy only */
        else if (!strcmp(argv[i], "--pair")) gemm = matvec = 0, plain = 13; /* bench_pair only */
        else if (!strcmp(argv[i], "--l2pf")) gemm = matvec = 0, plain = 14; /* bench_l2pf only */
        else if (!strcmp(argv[i], "--moepf")) gemm = matvec = 0, plain = 19; /* bench_moe_pf only */
        else if (!strcmp(argv[i], "--topk")) gemm = matvec = 0, plain = 15; /* bench_topk only */
        else if (!strcmp(argv[i], "--fp4bal")) { /* bench_fp4_bal only, a batch optional */
            gemm = matvec = 0, plain = 11;
            aid_batch = i + 1 < argc && argv[i + 1][0] != '-' ? atoi(argv[++i]) : 0;
        }
        else if (!strcmp(argv[i], "--fp4aid")) { /* bench_fp4_aid only, a batch optional */
            gemm = matvec = 0, plain = 8;
            aid_batch = i + 1 < argc && argv[i + 1][0] != '-' ? atoi(argv[++i]) : 0;
        }
        else if (!strcmp(argv[i], "--gg")) { /* bench_gg only, forms optional */
            gemm = matvec = 0, plain = 4;
            gg_list = i + 1 < argc && argv[i + 1][0] != '-' ? argv[++i] : NULL;
        }
        else if (!strcmp(argv[i], "--profile")) {
            DK(di_cuda_init(0, err));
            profile_once();
            return 0;
        }
    }
    DK(di_cuda_init(0, err));
    di_cuda_device_info info;
    DK(di_cuda_device_info_get(0, &info, err));
    printf("device: %s, %d SMs, %.1f GiB, L2 %.0f MiB, cc %d.%d\n", info.name, info.sm_count,
           info.total_mem / 1073741824.0, info.l2_bytes / 1048576.0, info.cc_major, info.cc_minor);
    bench_copy();
    if (decode) bench_decode();
    if (plain == 1) bench_plain();
    if (plain == 2) bench_plain_dec();
    if (plain == 3) bench_fp4_dec();
    if (plain == 4) bench_gg(gg_list);
    if (plain == 5) bench_fp4_st();
    if (plain == 16) bench_fp4_a8();
    if (plain == 20) bench_fp4_wg();
    if (plain == 21) bench_wg_tiled();
    if (plain == 17) bench_xskip();
    if (plain == 6) bench_x16();
    if (plain == 7) bench_pf_shapes();
    if (plain == 8) bench_fp4_aid(aid_batch);
    if (plain == 9) bench_mid_m();
    if (plain == 10) bench_fp8_mid();
    if (plain == 11) bench_fp4_bal(aid_batch);
    if (plain == 12) bench_greedy();
    if (plain == 13) bench_pair();
    if (plain == 14) bench_l2pf();
    if (plain == 19) bench_moe_pf();
    if (plain == 15) bench_topk();
    if (matvec) {
        bench_act_quant();
        /* V4.1-Flash linear shapes [out, in] (architecture.md §1.1, §8.2) */
        struct { const char *name; int64_t n, k; } fp8[] = {
            {"wq_b", 32768, 1280}, {"wq_a", 1280, 5120}, {"wo_b", 5120, 8192},
            {"shared_w1", 2304, 5120}, {"shared_w2", 5120, 2304}};
        int64_t ms[] = {1, 8, 16};
        for (auto &s : fp8)
            for (int64_t m : ms) bench_matvec(0, s.name, s.n, s.k, m);
        struct { const char *name; int64_t n, k; } fp4[] = {
            {"expert_w1", 2304, 5120}, {"expert_w2", 5120, 2304}, {"experts16_w1", 16 * 2304, 5120}};
        for (auto &s : fp4)
            for (int64_t m : ms) bench_matvec(1, s.name, s.n, s.k, m);
        for (int b : {1, 8, 64}) bench_moe_grouped(b);
        if (!quick) bench_ks_sweep();
    }
    if (gemm) {
        int64_t shapes[][3] = {{8192, 8192, 8192}, {8192, 5120, 5120}, {8192, 32768, 1280},
                               {4096, 5120, 2304}, {4096, 2304, 5120}};
        for (auto &s : shapes) bench_gemm(s[0], s[1], s[2], DI_CUDA_GEMM_TILED);
        if (!quick) bench_gemm(4096, 5120, 5120, DI_CUDA_GEMM_MATVEC);
        /* tiled-kernel variants (see cuda_gemm_tiled.cu): 16 warp-specialized
         * (the default), 19 one result set; measuring aids: 17 without the
         * promotion, 20 / 21 that plus the promotion's FFMA count (all / half)
         * on independent registers; 8 the cp.async kernel */
        const int variants[] = {16, 19, 17, 20, 21, 8};
        for (int v : variants) bench_gemm(8192, 8192, 8192, DI_CUDA_GEMM_TILED, v);
        for (int v : variants) bench_gemm(4096, 5120, 2304, DI_CUDA_GEMM_TILED, v);
        check_variants();
        if (!quick) bench_mma_sync();
    }
    return 0;
}
