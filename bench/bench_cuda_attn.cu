/* Sparse attention with sink at prefill shapes (architecture.md §5.5): the
 * backend's sparse_attn_rows as the model calls it for a prefill chunk of
 * P queries (64 heads of 512, one kv head), on the two layer kinds of the
 * cut model: window only (each query over the 128 window rows of the chunk,
 * the first ones partly empty) and window + 512 selected compressed entries
 * (a ratio-1 source: the entries a query sees are 0..i; 512 spread over
 * them). The dispatch's tensor-core form against the block per (row, head)
 * form on the same row table, in the same run, their agreement on the
 * full chunk, and the two forms at small m (decode batches: why the
 * dispatch takes the tensor-core form at every m).
 * torch's peer (gather + batched matmuls + softmax with the sink) is
 * bench/bench_cuda_layer_torch.py --attn P, run beside this one.
 *
 *   bench_cuda_attn [P]        (default 8192)
 *
 * Lines starting with RESULT are the machine-readable numbers (ms, and
 * TFLOP/s counting q·k and p·v over every slot, empty ones included). */
#include <cuda_runtime.h>

#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/cuda/cuda_attn_tc.h"
#include "backend/cuda/cuda_ops.h"
extern "C" {
#include "backend/kvstore.h"
}

/* Exits with the failing call named: a benchmark has no use for a partial run. */
static void ck_at(cudaError_t e, const char *what, int line) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "bench_cuda_attn.cu:%d: %s: %s\n", line, what, cudaGetErrorString(e));
    exit(1);
}
static void dk_at(di_status st, const di_err *e, int line) {
    if (st == DI_OK) return;
    fprintf(stderr, "bench_cuda_attn.cu:%d: %s\n", line, e->msg);
    exit(1);
}
#define CK(x) ck_at((x), #x, __LINE__)
/* x may use `err`, a fresh di_err */
#define DK(x)                                  \
    do {                                       \
        di_err err_ = {};                      \
        di_err *err = &err_;                   \
        dk_at((x), err, __LINE__);             \
    } while (0)

enum { H = 64, D = 512, WIN = 128, SEL = 512 };

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd32() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float rnd_normal() {
    double u = (rnd32() + 1.0) / 4294967297.0, v = (rnd32() + 1.0) / 4294967297.0;
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}
static float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

template <class F> static double time_ms(F fn, int reps) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> t;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(a));
        fn();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return t[t.size() / 2];
}

int main(int argc, char **argv) {
    int64_t P = argc > 1 ? atoll(argv[1]) : 8192;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs; prefill chunk of %lld queries, %d heads of %d\n", prop.name,
           prop.multiProcessorCount, (long long)P, H, D);
    size_t wb = di_kvq_row_bytes(DI_KVQ_FP8, D), cb = di_kvq_row_bytes(DI_KVQ_FP4_E4M3, D);
    /* the chunk's window KV and the compressed cache (ratio 1: P entries),
     * packed by the CPU from N(0, 1) values */
    std::vector<uint8_t> chunk((size_t)P * wb), cache((size_t)P * cb);
    std::vector<float> x(D);
    for (int64_t r = 0; r < P; r++) {
        for (int k = 0; k < D; k++) x[k] = rnd_normal();
        di_kvq_pack(DI_KVQ_FP8, x.data(), D, chunk.data() + (size_t)r * wb);
        for (int k = 0; k < D; k++) x[k] = rnd_normal();
        di_kvq_pack(DI_KVQ_FP4_E4M3, x.data(), D, cache.data() + (size_t)r * cb);
    }
    std::vector<float> q((size_t)P * H * D), sink(H);
    for (auto &v : q) v = bf16_round(rnd_normal());
    for (auto &v : sink) v = rnd_normal();
    /* window codes: query i sees chunk rows i-127 .. i (-1 before row 0);
     * selection: 512 entries spread over 0..i, ascending, -1 padding */
    std::vector<int32_t> win((size_t)P * WIN), sel((size_t)P * SEL);
    for (int64_t i = 0; i < P; i++) {
        for (int j = 0; j < WIN; j++) {
            int64_t r = i - (WIN - 1) + j;
            win[i * WIN + j] = r >= 0 ? (int32_t)(-2 - r) : -1;
        }
        for (int j = 0; j < SEL; j++)
            sel[i * SEL + j] = i + 1 >= SEL ? (int32_t)((int64_t)j * (i + 1) / SEL) : j <= i ? j : -1;
    }
    uint8_t *dchunk, *dcache;
    float *dq, *dsink, *dout, *dref;
    int32_t *dwin, *dsel;
    const uint8_t **dring, **dcaches, **dtab;
    CK(cudaMalloc(&dchunk, chunk.size()));
    CK(cudaMalloc(&dcache, cache.size()));
    CK(cudaMalloc(&dq, q.size() * 4));
    CK(cudaMalloc(&dsink, H * 4));
    CK(cudaMalloc(&dout, q.size() * 4));
    CK(cudaMalloc(&dref, q.size() * 4));
    CK(cudaMalloc(&dwin, win.size() * 4));
    CK(cudaMalloc(&dsel, sel.size() * 4));
    CK(cudaMalloc(&dring, P * sizeof(void *)));
    CK(cudaMalloc(&dcaches, P * sizeof(void *)));
    CK(cudaMalloc(&dtab, (size_t)P * (WIN + SEL) * sizeof(void *)));
    CK(cudaMemcpy(dchunk, chunk.data(), chunk.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dcache, cache.data(), cache.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dsink, sink.data(), H * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dwin, win.data(), win.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dsel, sel.data(), sel.size() * 4, cudaMemcpyHostToDevice));
    std::vector<const uint8_t *> ptr(P, dchunk);
    CK(cudaMemcpy(dring, ptr.data(), P * sizeof(void *), cudaMemcpyHostToDevice));
    std::fill(ptr.begin(), ptr.end(), dcache);
    CK(cudaMemcpy(dcaches, ptr.data(), P * sizeof(void *), cudaMemcpyHostToDevice));
    const float scale = 1.0f / sqrtf((float)D);

    for (int kind = 0; kind < 2; kind++) {
        const char *name = kind ? "source" : "window";
        int nsel = kind ? SEL : 0, ns = WIN + nsel;
        double flops = 4.0 * H * D * (double)ns * (double)P;
        auto rows_op = [&](int64_t m0, int64_t m) {
            DK(cuda_op_sparse_attn_rows(dq + m0 * H * D, m, H, D, WIN, dwin + m0 * WIN, dring + m0, dchunk, wb,
                                        nsel, dsel + m0 * SEL, dcaches + m0, cb, dtab, dsink, scale,
                                        dout + m0 * H * D, err));
        };
        rows_op(0, P); /* warm-up; leaves the table of the whole chunk in dtab */
        CK(cudaDeviceSynchronize());
        double t_tc = time_ms([&] { rows_op(0, P); }, 5);
        double t_rw = time_ms([&] {
            DK(cuda_op_sparse_attn_kv_rowwise(dq, P, H, D, dtab, ns, WIN, dsink, scale, dref, err));
        }, 1);
        printf("RESULT attn_%s_prefill%lld %.3f ms %.1f TFLOP/s (tensor cores, sparse_attn_rows)\n", name,
               (long long)P, t_tc, flops / t_tc / 1e9);
        printf("RESULT attn_rowwise_%s_prefill%lld %.3f ms %.1f TFLOP/s (block per row and head)\n", name,
               (long long)P, t_rw, flops / t_rw / 1e9);
        printf("  %s: tensor cores %.2fx the block per (row, head)\n", name, t_rw / t_tc);
        /* agreement of the two forms on the whole chunk */
        std::vector<float> a(q.size()), b(q.size());
        CK(cudaMemcpy(a.data(), dout, a.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(b.data(), dref, b.size() * 4, cudaMemcpyDeviceToHost));
        double se = 0, sr = 0, mx = 0;
        int64_t nonfinite = 0, differ = 0;
        for (size_t e = 0; e < a.size(); e++) {
            if (!std::isfinite(a[e]) || !std::isfinite(b[e])) nonfinite++;
            double df = fabs((double)a[e] - b[e]);
            se += df * df;
            sr += (double)b[e] * b[e];
            mx = std::max(mx, df);
            differ += a[e] != b[e];
        }
        printf("  %s: forms agree to rel L2 %.2e, max |diff| %.3g (rms %.3g), %.2f %% of outputs differ, %lld non-finite\n",
               name, sqrt(se / sr), mx, sqrt(sr / (double)a.size()), 100.0 * differ / (double)a.size(),
               (long long)nonfinite);
        /* small m: full-width rows from the end of the chunk */
        if (kind == 1)
            for (int64_t m : {1, 2, 4, 8, 16, 64, 256}) {
                int64_t m0 = P - m;
                rows_op(m0, m); /* table rows 0..m-1 of dtab now hold rows m0.. */
                double tt = time_ms([&] {
                    DK(cuda_op_sparse_attn_kv_tc(dq + m0 * H * D, m, H, D, dtab, ns, WIN, dsink, scale,
                                                 dout + m0 * H * D, err));
                }, 5);
                double tr = time_ms([&] {
                    DK(cuda_op_sparse_attn_kv_rowwise(dq + m0 * H * D, m, H, D, dtab, ns, WIN, dsink, scale,
                                                      dref + m0 * H * D, err));
                }, 5);
                printf("RESULT attn_small_m%lld %.4f ms tensor cores, %.4f ms rowwise\n", (long long)m, tt, tr);
            }
    }
    CK(cudaDeviceSynchronize());
    return 0;
}
