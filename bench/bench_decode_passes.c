/* CPU decode products that share one pass over the thread pool, against
 * the form before, alternated in one process (same bits either way):
 * - the routed experts (backend.h moe_experts; the real V4.1-Flash expert
 *   shape): all the experts' products in two passes (moe_experts_batched in
 *   backend_cpu.c) against the per-expert loop (three passes an expert;
 *   test_moe_grouped checks the bits);
 * - matmul_pair (x quantized once, both products in one pass) against
 *   matmul twice, on attention's wq_a + wkv (1,280 and 512 x 5,120 FP8) and
 *   the shared expert's w1 + w3 (2 x 2,304 x 5,120 FP8) at one row
 *   (test_cpu_ops checks the bits);
 * - wo_a's grouped product at one row (FP8 weights on fp32 activations)
 *   in 32-row units straight from the codes against the decoded panels
 *   (test_cpu_ops checks the bits);
 * - BF16 products at one row (the head, the router) in 32-row units
 *   straight from the rows against the tiles (test_cpu_kernels checks the
 *   bits);
 * - hc_mix of one row split by outputs over the pool against one thread
 *   (test_cpu_ops checks the bits);
 * - and, as a record, products of a few MB at one row (the router, wkv,
 *   the compressor's projection), which take the pool by their bytes;
 * - the attention of one query row (64 heads of 512, 640 packed slots)
 *   split by heads over the pool against one thread (a row a thread, as
 *   it ran before; test_cpu_ops checks the bits), and the indexer's scores
 *   of one row over 4K and 16K keys split by keys likewise.
 *
 *   build/bench/bench_decode_passes [THREADS] [ROUNDS]
 *
 * Experts: 24 of w1 / w3 2,304 x 5,120 and w2 5,120 x 2,304 MXFP4 (17.7 MB
 * each, 425 MB in all), top-6 routing; batches of 1, 2 and 4 tokens, the
 * calls cycling through four groups of six experts so that each reads its
 * experts from DRAM (more than a 300 MB last-level cache holds); pairs:
 * copies cycled likewise (over 400 MB). GB/s counts the weight bytes a call
 * reads; the peer figure is the read bandwidth of the same threads over a
 * 512 MB buffer, measured in the same run. Best and median of ROUNDS
 * (default 15) calls of each form. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "backend/kvstore.h"
#include "core/threadpool.h"
#include "bench_util.h"

enum { E = 24, K = 6, GROUPS = E / K, D = 5120, I = 2304, MAXR = 31 };

typedef struct expert {
    di_wmat w1, w2, w3; /* the model's layout */
} expert;

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

static void fp4_mat(di_wmat *m, int64_t n, int64_t k) {
    uint8_t *w = malloc((size_t)(n * k / 2)), *s = malloc((size_t)(n * k / 32));
    if (!w || !s) {
        fprintf(stderr, "bench_decode_passes: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n * k / 2; i++) w[i] = (uint8_t)next();
    for (int64_t i = 0; i < n * k / 32; i++) s[i] = (uint8_t)(118 + next() % 6);
    *m = (di_wmat){DI_WFMT_FP4, n, k, w, s};
}

/* the threads' read rate over a buffer larger than the caches */
typedef struct rd_ctx {
    const uint64_t *p;
    int64_t n;
    uint64_t sum[64];
} rd_ctx;
static void rd_part(void *ctx, int64_t i0, int64_t i1, int thread) {
    rd_ctx *c = ctx;
    const int64_t a = i0 * 4096, b = i1 * 4096 < c->n ? i1 * 4096 : c->n;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0; /* independent sums: the loop vectorizes */
    for (int64_t i = a; i + 4 <= b; i += 4) s0 += c->p[i], s1 += c->p[i + 1], s2 += c->p[i + 2], s3 += c->p[i + 3];
    c->sum[thread & 63] += s0 + s1 + s2 + s3;
}

static int cmp_d(const void *a, const void *b) { return bench_cmp_double(a, b); }

/* FP8 [n, k] with random codes (no NaN) and scales around 2^-6; normal:
 * no codes of exponent 0 either (a checkpoint's weights rarely have them,
 * and the 512-bit decoding takes a table for them) */
static void fp8_mat(di_wmat *m, int64_t n, int64_t k, int normal) {
    uint8_t *w = malloc((size_t)(n * k)), *s = malloc((size_t)(((n + 31) / 32) * (k / 32)));
    if (!w || !s) {
        fprintf(stderr, "bench_decode_passes: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n * k; i++) {
        w[i] = (uint8_t)next();
        if ((w[i] & 0x7f) == 0x7f) w[i] ^= 1;
        if (normal && !(w[i] & 0x78)) w[i] |= 0x08;
    }
    for (int64_t i = 0; i < ((n + 31) / 32) * (k / 32); i++) s[i] = (uint8_t)(118 + next() % 6);
    *m = (di_wmat){DI_WFMT_FP8, n, k, w, s};
}

/* BF16 [n, k], values around 0.05 */
static void bf16_mat(di_wmat *m, int64_t n, int64_t k) {
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)(n * k));
    if (!w) {
        fprintf(stderr, "bench_decode_passes: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n * k; i++) w[i] = (uint16_t)(0x3d00 + next() % 0x100 + (next() % 2) * 0x8000);
    *m = (di_wmat){DI_WFMT_BF16, n, k, w, NULL};
}

/* Products of a few MB at one row (no form to alternate: a record of what
 * the pool rule gives them), copies cycled */
static void smalls(di_backend *be, int rounds, double bw) {
    static const struct { const char *name; di_wfmt fmt; int64_t n; int copies; unsigned flags; } P[] = {
        {"router (bf16 384)", DI_WFMT_BF16, 384, 100, DI_MM_OUT_BF16},
        {"wkv (fp8 512)", DI_WFMT_FP8, 512, 150, DI_MM_ACT_FP8},
        {"compressor (bf16 512)", DI_WFMT_BF16, 512, 80, 0}};
    printf("# one product, one row   best ms   median ms   GB/s (best)   vs read bw\n");
    for (size_t pi = 0; pi < sizeof P / sizeof *P; pi++) {
        const int nc = P[pi].copies;
        di_wmat *w = malloc(sizeof *w * (size_t)nc);
        for (int c = 0; c < nc; c++) {
            if (P[pi].fmt == DI_WFMT_BF16) bf16_mat(&w[c], P[pi].n, D);
            else fp8_mat(&w[c], P[pi].n, D, 0);
        }
        float *x = malloc(sizeof(float) * D), *y = malloc(sizeof(float) * P[pi].n);
        for (int64_t i = 0; i < D; i++) x[i] = (float)((int64_t)(next() % 2001) - 1000) / 500.0f;
        double t[MAXR];
        for (int r = 0; r < rounds; r++) {
            const double t0 = bench_now_s();
            be->ops->matmul(be, &w[r % nc], x, 1, y, P[pi].flags);
            t[r] = bench_now_s() - t0;
        }
        qsort(t, (size_t)rounds, sizeof(double), cmp_d);
        const double bytes = (double)P[pi].n * D * (P[pi].fmt == DI_WFMT_BF16 ? 2.0 : 1.0 + 1.0 / 1024);
        printf("%-24s %8.3f   %9.3f   %11.1f   %9.2f\n", P[pi].name, t[0] * 1e3, t[rounds / 2] * 1e3,
               bytes / t[0] / 1e9, bytes / t[0] / 1e9 / bw);
        for (int c = 0; c < nc; c++) free((void *)w[c].w), free((void *)w[c].s);
        free(w), free(x), free(y);
    }
}

/* Decode attention of one query row (64 heads of 512 over 128 window slots
 * of FP8 rows and 512 selected FP4 rows): split by heads over the pool
 * against one thread, which is how one row ran before (a row a thread) */
static void attention(di_backend *be, int rounds) {
    enum { H = 64, HD = 512, NW = 128, NS = 640, NR = 1024 };
    di_backend *one = NULL;
    di_err err;
    if (di_backend_cpu_create(1, &one, &err) != DI_OK) return;
    const size_t wb = di_kvq_row_bytes(DI_KVQ_FP8, HD), cb = di_kvq_row_bytes(DI_KVQ_FP4_E4M3, HD);
    uint8_t *pw = malloc((size_t)NR * wb), *pc = malloc((size_t)NR * cb);
    float *row = malloc(sizeof(float) * HD), *q = malloc(sizeof(float) * H * HD), *out = malloc(sizeof(float) * H * HD);
    const uint8_t **rows = malloc(sizeof(uint8_t *) * NS);
    float sink[H];
    for (int r = 0; r < NR; r++) {
        for (int k = 0; k < HD; k++) row[k] = (float)((int64_t)(next() % 2001) - 1000) / 1000.0f;
        di_kvq_pack(DI_KVQ_FP8, row, HD, pw + (size_t)r * wb);
        di_kvq_pack(DI_KVQ_FP4_E4M3, row, HD, pc + (size_t)r * cb);
    }
    for (int i = 0; i < H * HD; i++) q[i] = (float)((int64_t)(next() % 2001) - 1000) / 1000.0f;
    for (int i = 0; i < H; i++) sink[i] = 0.5f;
    double t[2][MAXR];
    for (int r = 0; r < rounds; r++) {
        for (int j = 0; j < NS; j++) rows[j] = j < NW ? pw + (size_t)(next() % NR) * wb : pc + (size_t)(next() % NR) * cb;
        for (int form = 0; form < 2; form++) {
            di_backend *b = form ? one : be;
            const double t0 = bench_now_s();
            b->ops->sparse_attn_kv(b, q, 1, H, HD, rows, NS, NW, sink, 0.044f, out);
            t[form][r] = bench_now_s() - t0;
        }
    }
    printf("# attention, one row     best ms   median ms\n");
    for (int form = 0; form < 2; form++) {
        qsort(t[form], (size_t)rounds, sizeof(double), cmp_d);
        printf("%-24s %8.3f   %9.3f\n", form ? "one thread" : "split by heads", t[form][0] * 1e3, t[form][rounds / 2] * 1e3);
    }
    free(pw), free(pc), free(row), free(q), free(out), free(rows);
    di_backend_destroy(one);
}

/* The indexer's scores of one query row (32 heads of 128 over a context's
 * packed FP4 keys): split by keys over the pool against one thread, which
 * is how one row ran before */
static void index_scores(di_backend *be, int rounds) {
    enum { HI = 32, DI = 128 };
    static const int64_t widths[] = {4096, 16384};
    di_backend *one = NULL;
    di_err err;
    if (di_backend_cpu_create(1, &one, &err) != DI_OK) return;
    printf("# index scores, one row  best ms   median ms\n");
    for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
        const int64_t W = widths[wi];
        const size_t kb = di_kvq_row_bytes(DI_KVQ_FP4_E8M0, DI);
        uint8_t *keys = malloc((size_t)W * kb);
        float *row = malloc(sizeof(float) * DI), *q = malloc(sizeof(float) * HI * DI), *w = malloc(sizeof(float) * HI);
        float *out = malloc(sizeof(float) * (size_t)W);
        for (int64_t r = 0; r < W; r++) {
            for (int k = 0; k < DI; k++) row[k] = (float)((int64_t)(next() % 2001) - 1000) / 1000.0f;
            di_kvq_pack(DI_KVQ_FP4_E8M0, row, DI, keys + (size_t)r * kb);
        }
        for (int i = 0; i < HI * DI; i++) q[i] = (float)((int64_t)(next() % 2001) - 1000) / 1000.0f;
        for (int i = 0; i < HI; i++) w[i] = 0.1f;
        const uint8_t *kp[1] = {keys};
        const int32_t nv[1] = {(int32_t)W};
        double t[2][MAXR];
        for (int r = 0; r < rounds; r++)
            for (int form = 0; form < 2; form++) {
                di_backend *b = form ? one : be;
                const double t0 = bench_now_s();
                b->ops->index_scores_kv(b, q, w, 1, HI, DI, kp, nv, W, out);
                t[form][r] = bench_now_s() - t0;
            }
        for (int form = 0; form < 2; form++) {
            qsort(t[form], (size_t)rounds, sizeof(double), cmp_d);
            printf("%6lld keys, %-11s %8.3f   %9.3f\n", (long long)W, form ? "one thread" : "split",
                   t[form][0] * 1e3, t[form][rounds / 2] * 1e3);
        }
        free(keys), free(row), free(q), free(w), free(out);
    }
    di_backend_destroy(one);
}

/* matmul_pair against matmul twice at one row, copies cycled */
static void pairs(di_backend *be, int rounds, double bw) {
    static const struct { const char *name; int64_t na, nb; int copies; } P[] = {
        {"wq_a + wkv", 1280, 512, 48}, {"shared w1 + w3", 2304, 2304, 20}};
    printf("# pair at one row      form             best ms   median ms   GB/s (best)   vs read bw\n");
    for (size_t pi = 0; pi < sizeof P / sizeof *P; pi++) {
        const int nc = P[pi].copies;
        di_wmat *wa = malloc(sizeof *wa * (size_t)nc), *wb = malloc(sizeof *wb * (size_t)nc);
        for (int c = 0; c < nc; c++) {
            fp8_mat(&wa[c], P[pi].na, D, 0);
            fp8_mat(&wb[c], P[pi].nb, D, 0);
        }
        float *x = malloc(sizeof(float) * D), *ya = malloc(sizeof(float) * P[pi].na), *yb = malloc(sizeof(float) * P[pi].nb);
        for (int64_t i = 0; i < D; i++) x[i] = (float)((int64_t)(next() % 2001) - 1000) / 500.0f;
        double t[2][MAXR];
        for (int r = 0; r < rounds; r++)
            for (int form = 0; form < 2; form++) {
                const int c = (2 * r + form) % nc;
                const double t0 = bench_now_s();
                if (form == 0) {
                    be->ops->matmul_pair(be, &wa[c], &wb[c], x, 1, ya, yb, DI_MM_ACT_FP8);
                } else {
                    be->ops->matmul(be, &wa[c], x, 1, ya, DI_MM_ACT_FP8);
                    be->ops->matmul(be, &wb[c], x, 1, yb, DI_MM_ACT_FP8);
                }
                t[form][r] = bench_now_s() - t0;
            }
        const double bytes = (double)(P[pi].na + P[pi].nb) * D * (1.0 + 1.0 / 1024);
        for (int form = 0; form < 2; form++) {
            qsort(t[form], (size_t)rounds, sizeof(double), cmp_d);
            printf("%-22s %-15s %8.3f   %9.3f   %11.1f   %9.2f\n", P[pi].name, form ? "matmul twice" : "one pass",
                   t[form][0] * 1e3, t[form][rounds / 2] * 1e3, bytes / t[form][0] / 1e9, bytes / t[form][0] / 1e9 / bw);
        }
        for (int c = 0; c < nc; c++) {
            free((void *)wa[c].w), free((void *)wa[c].s), free((void *)wb[c].w), free((void *)wb[c].s);
        }
        free(wa), free(wb), free(x), free(ya), free(yb);
    }
}

/* wo_a at one row (matmul_grouped: 8 groups of 1,024 rows x 4,096, FP8
 * weights on fp32 activations, 33.5 MB): the 32-row units straight from
 * the codes against the decoded panels (di_backend_cpu_force_no_f32rows;
 * test_cpu_ops checks the bits), checkpoint-like codes, copies cycled */
static void grouped(di_backend *be, int rounds, double bw) {
    enum { G = 8, RG = 1024, KG = 4096, NC = 12 };
    di_wmat *w = malloc(sizeof *w * NC);
    for (int c = 0; c < NC; c++) fp8_mat(&w[c], G * RG, KG, 1);
    float *x = malloc(sizeof(float) * G * KG), *y = malloc(sizeof(float) * G * RG);
    for (int64_t i = 0; i < G * KG; i++) x[i] = (float)((int64_t)(next() % 2001) - 1000) / 500.0f;
    double t[2][MAXR];
    for (int r = 0; r < rounds; r++)
        for (int form = 0; form < 2; form++) {
            di_backend_cpu_force_no_f32rows(form);
            const double t0 = bench_now_s();
            be->ops->matmul_grouped(be, &w[(2 * r + form) % NC], G, x, 1, y);
            t[form][r] = bench_now_s() - t0;
        }
    di_backend_cpu_force_no_f32rows(0);
    const double bytes = (double)G * RG * KG * (1.0 + 1.0 / 1024);
    printf("# wo_a at one row      form             best ms   median ms   GB/s (best)   vs read bw\n");
    for (int form = 0; form < 2; form++) {
        qsort(t[form], (size_t)rounds, sizeof(double), cmp_d);
        printf("%-22s %-15s %8.3f   %9.3f   %11.1f   %9.2f\n", "wo_a (fp8 8 x 1024)", form ? "decoded panels" : "units",
               t[form][0] * 1e3, t[form][rounds / 2] * 1e3, bytes / t[form][0] / 1e9, bytes / t[form][0] / 1e9 / bw);
    }
    for (int c = 0; c < NC; c++) free((void *)w[c].w), free((void *)w[c].s);
    free(w), free(x), free(y);
}

/* BF16 products at one row (the head, 129,280 x 5,120, 1.3 GB; the
 * router, 384 x 5,120): 32-row units straight from the rows against the
 * tiles they replaced, which are what the 256-bit path runs
 * (di_cpu_kernels_force_no_avx512; test_cpu_kernels checks the bits) */
static void bf16_rows(di_backend *be, int rounds, double bw) {
    static const struct { const char *name; int64_t n; int copies; } P[] = {
        {"head (bf16 129280)", 129280, 1}, {"router (bf16 384)", 384, 100}};
    printf("# bf16 at one row      form             best ms   median ms   GB/s (best)   vs read bw\n");
    for (size_t pi = 0; pi < sizeof P / sizeof *P; pi++) {
        const int nc = P[pi].copies;
        di_wmat *w = malloc(sizeof *w * (size_t)nc);
        for (int c = 0; c < nc; c++) bf16_mat(&w[c], P[pi].n, D);
        float *x = malloc(sizeof(float) * D), *y = malloc(sizeof(float) * P[pi].n);
        for (int64_t i = 0; i < D; i++) x[i] = (float)((int64_t)(next() % 2001) - 1000) / 500.0f;
        double t[2][MAXR];
        for (int r = 0; r < rounds; r++)
            for (int form = 0; form < 2; form++) {
                di_cpu_kernels_force_no_avx512(form);
                const double t0 = bench_now_s();
                be->ops->matmul(be, &w[(2 * r + form) % nc], x, 1, y, 0);
                t[form][r] = bench_now_s() - t0;
            }
        di_cpu_kernels_force_no_avx512(0);
        const double bytes = 2.0 * (double)P[pi].n * D;
        for (int form = 0; form < 2; form++) {
            qsort(t[form], (size_t)rounds, sizeof(double), cmp_d);
            printf("%-22s %-15s %8.3f   %9.3f   %11.1f   %9.2f\n", P[pi].name, form ? "tiles (256-bit)" : "units",
                   t[form][0] * 1e3, t[form][rounds / 2] * 1e3, bytes / t[form][0] / 1e9, bytes / t[form][0] / 1e9 / bw);
        }
        for (int c = 0; c < nc; c++) free((void *)w[c].w);
        free(w), free(x), free(y);
    }
}

/* hc_mix of one row at the real shape (hc 4, d 5,120: 24 projections
 * over 20,480 inputs, then the gates and 20 Sinkhorn rounds): split by
 * outputs over the pool against one thread, which is how one row ran
 * before (a row a thread; test_cpu_ops checks the bits) */
static void mix(di_backend *be, int rounds) {
    enum { HC = 4, DM = 5120, NMIX = (2 + HC) * HC };
    di_backend *one = NULL;
    di_err err;
    if (di_backend_cpu_create(1, &one, &err) != DI_OK) return;
    float *s = malloc(sizeof(float) * HC * DM), *fn = malloc(sizeof(float) * NMIX * HC * DM);
    for (int i = 0; i < HC * DM; i++) s[i] = (float)((int64_t)(next() % 2001) - 1000) / 1000.0f;
    for (int i = 0; i < NMIX * HC * DM; i++) fn[i] = (float)((int64_t)(next() % 2001) - 1000) / 100000.0f;
    float base[NMIX], scale[3] = {0.5f, 0.5f, 0.5f}, pre[HC], post[HC], comb[HC * HC];
    for (int i = 0; i < NMIX; i++) base[i] = 0.1f;
    double t[2][MAXR];
    for (int r = 0; r < rounds; r++)
        for (int form = 0; form < 2; form++) {
            di_backend *b = form ? one : be;
            const double t0 = bench_now_s();
            b->ops->hc_mix(b, s, 1, HC, DM, fn, base, scale, 1e-6, 1e-6, 20, pre, post, comb);
            t[form][r] = bench_now_s() - t0;
        }
    printf("# hc_mix, one row        best ms   median ms\n");
    for (int form = 0; form < 2; form++) {
        qsort(t[form], (size_t)rounds, sizeof(double), cmp_d);
        printf("%-24s %8.3f   %9.3f\n", form ? "one thread" : "split by outputs", t[form][0] * 1e3, t[form][rounds / 2] * 1e3);
    }
    free(s), free(fn);
    di_backend_destroy(one);
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 0, rounds = argc > 2 ? atoi(argv[2]) : 15;
    if (rounds < 1 || rounds > MAXR) {
        fprintf(stderr, "bench_decode_passes: ROUNDS from 1 to %d\n", MAXR);
        return 2;
    }
    di_err err;
    di_backend *be = NULL;
    if (di_backend_cpu_create(threads, &be, &err) != DI_OK) {
        fprintf(stderr, "bench_decode_passes: %s\n", err.msg);
        return 1;
    }
    expert ex[E];
    for (int e = 0; e < E; e++) {
        fp4_mat(&ex[e].w1, I, D);
        fp4_mat(&ex[e].w3, I, D);
        fp4_mat(&ex[e].w2, D, I);
    }
    const di_moe_experts me = {E, &ex[0].w1, &ex[0].w3, &ex[0].w2, sizeof *ex};
    const double expert_bytes = 3.0 * (I * D / 2 + I * D / 32);

    /* read bandwidth of the pool's threads */
    di_threadpool *tp = NULL;
    if (di_threadpool_create(threads, &tp, &err) != DI_OK) return 1;
    const int64_t nw = (512ll << 20) / 8;
    uint64_t *buf = malloc((size_t)nw * 8);
    for (int64_t i = 0; i < nw; i++) buf[i] = (uint64_t)i;
    rd_ctx rc = {buf, nw, {0}};
    double bw = 0;
    for (int r = 0; r < 5; r++) {
        const double t0 = bench_now_s();
        di_threadpool_for(tp, nw / 4096, 16, rd_part, &rc);
        const double g = nw * 8 / (bench_now_s() - t0) / 1e9;
        bw = g > bw ? g : bw;
    }
    printf("# routed experts at decode, %d threads: read bandwidth %.1f GB/s (best of 5, %llu)\n",
           di_threadpool_size(tp), bw, (unsigned long long)(rc.sum[0] & 1));
    printf("# batch  form             best ms   median ms   GB/s (best)   vs read bw\n");
    free(buf);
    di_threadpool_destroy(tp);

    static const int batches[] = {1, 2, 4};
    for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++) {
        const int m = batches[bi];
        float *x = malloc(sizeof(float) * m * D), *out = malloc(sizeof(float) * m * D), *w = malloc(sizeof(float) * m * K);
        int32_t *idx = malloc(sizeof(int32_t) * m * K);
        for (int64_t i = 0; i < (int64_t)m * D; i++) x[i] = (float)((int64_t)(next() % 2001) - 1000) / 500.0f;
        double t[2][MAXR];
        for (int r = 0; r < rounds; r++)
            for (int form = 0; form < 2; form++) {
                /* token i of call c takes group (c·m + i) % 4 */
                const int call = 2 * r + form;
                for (int i = 0; i < m; i++)
                    for (int j = 0; j < K; j++) {
                        idx[i * K + j] = ((call * m + i) % GROUPS) * K + j;
                        w[i * K + j] = 0.1f + (float)(next() % 100) / 100.0f;
                    }
                di_backend_cpu_force_moe_loop(form);
                const double t0 = bench_now_s();
                be->ops->moe_experts(be, &me, x, m, idx, w, K, DI_MM_ACT_FP8 | DI_MM_OUT_BF16, 10.0f, out);
                t[form][r] = bench_now_s() - t0;
            }
        di_backend_cpu_force_moe_loop(0);
        const double bytes = expert_bytes * K * (m < GROUPS ? m : GROUPS);
        for (int form = 0; form < 2; form++) {
            qsort(t[form], (size_t)rounds, sizeof(double), cmp_d);
            printf("%6d  %-15s %8.3f   %9.3f   %11.1f   %9.2f\n", m, form ? "per-expert loop" : "two passes",
                   t[form][0] * 1e3, t[form][rounds / 2] * 1e3, bytes / t[form][0] / 1e9, bytes / t[form][0] / 1e9 / bw);
        }
        free(x), free(out), free(w), free(idx);
    }
    grouped(be, rounds, bw);
    bf16_rows(be, rounds, bw);
    mix(be, rounds);
    pairs(be, rounds, bw);
    smalls(be, rounds, bw);
    attention(be, rounds);
    index_scores(be, rounds);
    di_backend_destroy(be);
    return 0;
}
