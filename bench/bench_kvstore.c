/* Packed per-sequence caches (backend/kvstore.h) on the CPU backend: the
 * attention and index-score ops over packed rows (decoded on the fly)
 * against the same ops over fp32 rows, at the real V4.1 shapes (64 heads,
 * Dh 512, 128 window + 512 compressed slots; 32 index heads, Di 128),
 * median of several runs, and the bytes per cached row of each form; and
 * the rows' decoding itself, di_kvq_unpack's scalar loop against the CPU
 * ops' 8-lane form (cpu_ops_avx2.h), alternated in one process.
 *
 *   build/bench/bench_kvstore [threads]                                  */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops_avx2.h"
#include "backend/cpu/kernels.h"

#include "bench_util.h"

enum { RUNS = 5, H = 64, D = 512, W = 128, K = 512, NS = W + K, HI = 32, DI = 128, NK = 8192 };

static float frand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xFFFF) / 32768.f - 1.f;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    di_backend *be = NULL;
    di_err err = {0};
    if (di_backend_cpu_create(threads, &be, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    unsigned seed = 1;
    size_t wb = di_kvq_row_bytes(DI_KVQ_FP8, D), cb = di_kvq_row_bytes(DI_KVQ_FP4_E4M3, D);
    size_t kb = di_kvq_row_bytes(DI_KVQ_FP4_E8M0, DI);
    printf("bytes per row: window %zu (fp32 %d), compressed %zu (fp32 %d), index key %zu (fp32 %d)\n",
           wb, D * 4, cb, D * 4, kb, DI * 4);
    int64_t mmax = 16;
    float *src = malloc(sizeof(float) * NS * D), *dec = malloc(sizeof(float) * NS * D);
    float *q = malloc(sizeof(float) * mmax * H * D), *out = malloc(sizeof(float) * mmax * H * D);
    uint8_t *pw = malloc(W * wb), *pc = malloc(K * cb);
    const uint8_t **prow = malloc(sizeof(uint8_t *) * mmax * NS);
    di_kvrow *frow = malloc(sizeof(di_kvrow) * mmax * NS);
    float sink[H];
    for (int i = 0; i < NS * D; i++) src[i] = frand(&seed) * 2;
    for (int64_t i = 0; i < mmax * H * D; i++) q[i] = frand(&seed);
    for (int h = 0; h < H; h++) sink[h] = frand(&seed);
    be->ops->kv_pack(be, DI_KVQ_FP8, src, W, D, pw);
    be->ops->kv_pack(be, DI_KVQ_FP4_E4M3, src + W * D, K, D, pc);
    for (int j = 0; j < W; j++) di_kvq_unpack(DI_KVQ_FP8, pw + j * wb, D, dec + j * D);
    for (int j = 0; j < K; j++) di_kvq_unpack(DI_KVQ_FP4_E4M3, pc + j * cb, D, dec + (W + j) * D);
    for (int64_t i = 0; i < mmax; i++)
        for (int j = 0; j < NS; j++) {
            prow[i * NS + j] = j < W ? pw + j * wb : pc + (j - W) * cb;
            frow[i * NS + j] = dec + j * D;
        }
#if defined(DI_HAVE_AVX2_OPS)
    if (!strcmp(di_cpu_kernels_path(), "avx2")) {
        printf("row decoding, one thread (best of %d alternations, ns a row of %d values): scalar / 8 lanes\n", 15, D);
        const struct { di_kvq f; const uint8_t *rows; size_t rb; int n; const char *name; } fs[] = {
            {DI_KVQ_FP8, pw, wb, W, "window (FP8)"}, {DI_KVQ_FP4_E4M3, pc, cb, K, "compressed (FP4, E4M3 scales)"}};
        for (int f = 0; f < 2; f++) {
            double best[2] = {1e30, 1e30};
            for (int r = 0; r < 15; r++)
                for (int form = 0; form < 2; form++) {
                    double t0 = bench_now_s();
                    for (int j = 0; j < fs[f].n; j++) {
                        if (form) di_cpu_kvq_unpack_avx2(fs[f].f, fs[f].rows + j * fs[f].rb, D, dec + j * D);
                        else di_kvq_unpack(fs[f].f, fs[f].rows + j * fs[f].rb, D, dec + j * D);
                    }
                    double t = (bench_now_s() - t0) / fs[f].n;
                    best[form] = t < best[form] ? t : best[form];
                }
            printf("  %-30s %8.0f / %6.0f  (%.1fx)\n", fs[f].name, best[0] * 1e9, best[1] * 1e9, best[0] / best[1]);
        }
        for (int j = 0; j < W; j++) di_kvq_unpack(DI_KVQ_FP8, pw + j * wb, D, dec + j * D);
        for (int j = 0; j < K; j++) di_kvq_unpack(DI_KVQ_FP4_E4M3, pc + j * cb, D, dec + (W + j) * D);
    }
#endif
    printf("sparse attention, %d threads (median of %d, ms):\n", threads, RUNS);
    int64_t ms[] = {1, 16};
    for (int t = 0; t < 2; t++) {
        int64_t m = ms[t];
        double tf[RUNS], tp[RUNS];
        for (int r = 0; r < RUNS; r++) {
            double t0 = bench_now_s();
            be->ops->sparse_attn(be, q, m, H, D, frow, NS, sink, 0.044f, out);
            double t1 = bench_now_s();
            be->ops->sparse_attn_kv(be, q, m, H, D, prow, NS, W, sink, 0.044f, out);
            tf[r] = t1 - t0;
            tp[r] = bench_now_s() - t1;
        }
        qsort(tf, RUNS, sizeof(double), bench_cmp_double);
        qsort(tp, RUNS, sizeof(double), bench_cmp_double);
        printf("  m=%-3lld fp32 rows %8.2f   packed rows %8.2f   packed/fp32 %.3f\n", (long long)m,
               tf[RUNS / 2] * 1e3, tp[RUNS / 2] * 1e3, tp[RUNS / 2] / tf[RUNS / 2]);
    }
    /* index scores over NK keys */
    float *keys = malloc(sizeof(float) * NK * DI), *iq = malloc(sizeof(float) * mmax * HI * DI);
    float *w = malloc(sizeof(float) * mmax * HI), *sc = malloc(sizeof(float) * mmax * NK);
    uint8_t *pk = malloc(NK * kb);
    for (int i = 0; i < NK * DI; i++) keys[i] = frand(&seed);
    for (int64_t i = 0; i < mmax * HI * DI; i++) iq[i] = frand(&seed);
    for (int64_t i = 0; i < mmax * HI; i++) w[i] = frand(&seed);
    be->ops->kv_pack(be, DI_KVQ_FP4_E8M0, keys, NK, DI, pk);
    const float **fk = malloc(sizeof(float *) * mmax);
    const uint8_t **pks = malloc(sizeof(uint8_t *) * mmax);
    int32_t *nvis = malloc(sizeof(int32_t) * mmax);
    for (int64_t i = 0; i < mmax; i++) {
        fk[i] = keys;
        pks[i] = pk;
        nvis[i] = NK;
    }
    printf("index scores over %d keys (median of %d, ms):\n", NK, RUNS);
    for (int t = 0; t < 2; t++) {
        int64_t m = t ? 16 : 1;
        double tf[RUNS], tp[RUNS];
        for (int r = 0; r < RUNS; r++) {
            double t0 = bench_now_s();
            be->ops->index_scores(be, iq, w, m, HI, DI, fk, nvis, NK, sc);
            double t1 = bench_now_s();
            be->ops->index_scores_kv(be, iq, w, m, HI, DI, pks, nvis, NK, sc);
            tf[r] = t1 - t0;
            tp[r] = bench_now_s() - t1;
        }
        qsort(tf, RUNS, sizeof(double), bench_cmp_double);
        qsort(tp, RUNS, sizeof(double), bench_cmp_double);
        printf("  m=%-3lld fp32 keys %8.2f   packed keys %8.2f   packed/fp32 %.3f\n", (long long)m,
               tf[RUNS / 2] * 1e3, tp[RUNS / 2] * 1e3, tp[RUNS / 2] / tf[RUNS / 2]);
    }
    free(src), free(dec), free(q), free(out), free(pw), free(pc), free(prow), free(frow);
    free(keys), free(iq), free(w), free(sc), free(pk), free(fk), free(pks), free(nvis);
    di_backend_destroy(be);
    return 0;
}
