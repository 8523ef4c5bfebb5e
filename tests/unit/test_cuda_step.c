/* The CUDA backend's backend-memory selection forms (DI_CUDA_DEVICE_SELECT=1,
 * backend.h): the golden tiny model prefilled, then decode steps alone and
 * two sequences batched past the window's wrap, once on the default op
 * table and once with the device forms. The logits must be the same bits
 * (the forms run the same kernels on tables built on the device instead of
 * uploaded), and the profile of the device-form steps must show the
 * attention over device row tables and no call of the host-result or
 * host-table forms (topk_select, candidate_blocks, restrict_blocks,
 * index_scores_kv, sparse_attn_kv). Skips without a GPU or ../shared. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "golden_util.h"
#include "test.h"

/* Calls of op `name` in a profile table (0 when absent). */
static long prof_calls(const char *tab, const char *name) {
    size_t n = strlen(name);
    for (const char *l = tab; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, name, n) || l[n] != ' ') continue;
        double ms = 0;
        long calls = 0;
        if (sscanf(l + n, "%lf %ld", &ms, &calls) == 2) return calls;
    }
    return 0;
}

/* Prefill P tokens into a and Q into b, then `steps` decode steps of a
 * alone and `steps` of a and b batched; logits of every pass into lg.
 * Profiles the decode steps into tab. Returns the rows written. */
static int64_t run(gold_model *g, di_backend *be, int64_t P, int64_t Q, int steps, float *lg,
                   char *tab, size_t cap) {
    const int32_t *ids = gold_i32(g, "long.prompt_ids", NULL);
    int64_t V = g->cfg.vocab_size, rows = 0;
    di_err err = {0};
    di_backend *saved = g->lm.be;
    g->lm.be = be;
    di_seqstate a, b;
    CHECK(di_seqstate_init(&a, &g->lm, P + 2 * steps + 8, 0, &err) == DI_OK);
    CHECK(di_seqstate_init(&b, &g->lm, Q + steps + 16, 0, &err) == DI_OK);
    di_fwd_seq qa = {&a, ids, P}, qb = {&b, ids + 7, Q};
    CHECKF(di_forward(&g->lm, &qa, 1, lg, 0, &err) == DI_OK, "%s", err.msg);
    CHECKF(di_forward(&g->lm, &qb, 1, lg + V, 0, &err) == DI_OK, "%s", err.msg);
    rows = 2;
    di_backend_cuda_profile_start(be, 1);
    for (int s = 0; s < steps; s++) {
        di_fwd_seq d = {&a, ids + P + s, 1};
        CHECKF(di_forward(&g->lm, &d, 1, lg + rows * V, 0, &err) == DI_OK, "%s", err.msg);
        rows++;
    }
    for (int s = 0; s < steps; s++) {
        di_fwd_seq two[2] = {{&a, ids + P + steps + s, 1}, {&b, ids + 7 + Q + s, 1}};
        CHECKF(di_forward(&g->lm, two, 2, lg + rows * V, 0, &err) == DI_OK, "%s", err.msg);
        rows += 2;
    }
    di_backend_cuda_profile(be, tab, cap);
    di_backend_cuda_profile_start(be, 0);
    di_seqstate_free(&a);
    di_seqstate_free(&b);
    g->lm.be = saved;
    return rows;
}

static void test_device_select_same_bits(void) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    di_err err = {0};
    di_backend *eager = NULL, *dev = NULL;
    unsetenv("DI_CUDA_DEVICE_SELECT");
    if (di_backend_cuda_create(0, &eager, &err)) SKIP("%s", err.msg);
    setenv("DI_CUDA_DEVICE_SELECT", "1", 1);
    di_status st = di_backend_cuda_create(0, &dev, &err);
    unsetenv("DI_CUDA_DEVICE_SELECT");
    CHECKF(st == DI_OK, "%s", err.msg);
    gold_model g;
    if (st || gold_open(&g, shared, "v41-tiny")) {
        CHECK(0);
        di_backend_destroy(eager);
        if (dev) di_backend_destroy(dev);
        return;
    }
    CHECK(dev->ops->sparse_attn_rows != NULL && eager->ops->sparse_attn_rows == NULL);
    int64_t V = g.cfg.vocab_size, P = 120, Q = 40;
    int steps = 8;
    size_t cap = (size_t)(2 + 3 * steps) * (size_t)V;
    float *l0 = malloc(cap * sizeof(float)), *l1 = malloc(cap * sizeof(float));
    static char t0[8192], t1[8192];
    int64_t n0 = run(&g, eager, P, Q, steps, l0, t0, sizeof t0);
    int64_t n1 = run(&g, dev, P, Q, steps, l1, t1, sizeof t1);
    CHECK_EQ_INT(n0, n1);
    int64_t diff = 0;
    for (int64_t i = 0; i < n0 * V; i++) diff += memcmp(&l0[i], &l1[i], sizeof(float)) != 0;
    CHECKF(diff == 0, "%lld logits differ between the device forms and the host forms", (long long)diff);
    static const char *const host_forms[] = {"topk_select", "candidate_blocks", "restrict_blocks",
                                             "index_scores_kv", "sparse_attn_kv"};
    for (size_t i = 0; i < sizeof host_forms / sizeof *host_forms; i++) {
        CHECKF(prof_calls(t1, host_forms[i]) == 0, "device forms: %ld calls of %s",
               prof_calls(t1, host_forms[i]), host_forms[i]);
        CHECKF(prof_calls(t0, host_forms[i]) > 0 || i == 2, "host forms: no call of %s", host_forms[i]);
    }
    CHECK(prof_calls(t1, "sparse_attn_rows") > 0 && prof_calls(t1, "topk_select_buf") > 0);
    if (getenv("DI_TEST_VERBOSE")) fprintf(stderr, "host forms:\n%s\ndevice forms:\n%s\n", t0, t1);
    free(l0);
    free(l1);
    gold_close(&g);
    di_backend_destroy(eager);
    di_backend_destroy(dev);
}

/* sparse_attn_rows on random tables (every slot kind: ring slot, this
 * call's row, empty window slot, selected entry, -1) against the same
 * backend's sparse_attn_kv on the row pointers built on the host: the same
 * kernel, so the same bits; and against the CPU backend's sparse_attn_rows
 * within the op-table bound (q·k reduced in another order, CUDA's expf). */
static void test_attn_rows_op(void) {
    di_err err = {0};
    di_backend *gpu = NULL, *cpu = NULL;
    setenv("DI_CUDA_DEVICE_SELECT", "1", 1);
    di_status st = di_backend_cuda_create(0, &gpu, &err);
    unsetenv("DI_CUDA_DEVICE_SELECT");
    if (st) SKIP("%s", err.msg);
    CHECK(di_backend_cpu_create(1, &cpu, &err) == DI_OK);
    enum { M = 5, H = 3, D = 64, NW = 7, NS = 9, RING = 11, ENT = 13 };
    size_t wb = di_kvq_row_bytes(DI_KVQ_FP8, D), cb = di_kvq_row_bytes(DI_KVQ_FP4_E4M3, D);
    uint32_t rng = 12345u;
#define RNDF() ((float)((rng = rng * 1664525u + 1013904223u) >> 8) / 16777216.0f * 2.f - 1.f)
#define RNDI(n) ((int)((rng = rng * 1664525u + 1013904223u) >> 8) % (n))
    float *x = malloc((size_t)(RING + M + ENT) * D * sizeof(float)), q[M * H * D], sink[H];
    for (int i = 0; i < (RING + M + ENT) * D; i++) x[i] = RNDF();
    for (int i = 0; i < M * H * D; i++) q[i] = RNDF();
    for (int i = 0; i < H; i++) sink[i] = RNDF();
    int32_t win[M * NW], sel[M * NS];
    for (int i = 0; i < M * NW; i++) {
        int k = RNDI(4);
        win[i] = k == 0 ? -1 : k == 1 ? -2 - RNDI(M) : RNDI(RING);
    }
    for (int i = 0; i < M * NS; i++) sel[i] = RNDI(4) == 0 ? -1 : RNDI(ENT);
    float out_c[M * H * D], out_g[M * H * D], out_k[M * H * D];
    for (int side = 0; side < 2; side++) {
        di_backend *be = side ? gpu : cpu;
        const di_backend_ops *o = be->ops;
        uint8_t *ring = o->alloc(be, RING * wb), *chunk = o->alloc(be, M * wb), *cache = o->alloc(be, ENT * cb);
        float *dx = o->alloc(be, (size_t)(RING + M + ENT) * D * sizeof(float));
        float *dq = o->alloc(be, sizeof q), *dout = o->alloc(be, sizeof q);
        int32_t *dwin = o->alloc(be, sizeof win), *dsel = o->alloc(be, sizeof sel);
        const uint8_t **dring = o->alloc(be, M * sizeof(void *)), **dcache = o->alloc(be, M * sizeof(void *));
        const uint8_t *hr[M], *hc[M];
        for (int i = 0; i < M; i++) {
            hr[i] = ring;
            hc[i] = cache;
        }
        o->upload(be, dx, x, (size_t)(RING + M + ENT) * D * sizeof(float));
        o->kv_pack(be, DI_KVQ_FP8, dx, RING, D, ring);
        o->kv_pack(be, DI_KVQ_FP8, dx + RING * D, M, D, chunk);
        o->kv_pack(be, DI_KVQ_FP4_E4M3, dx + (RING + M) * D, ENT, D, cache);
        o->upload(be, dq, q, sizeof q);
        o->upload(be, dwin, win, sizeof win);
        o->upload(be, dsel, sel, sizeof sel);
        o->upload(be, dring, hr, sizeof hr);
        o->upload(be, dcache, hc, sizeof hc);
        di_attn_rows t = {NW, dwin, dring, chunk, wb, NS, dsel, dcache, cb};
        o->sparse_attn_rows(be, dq, M, H, D, &t, sink, 0.125f, dout);
        o->download(be, side ? out_g : out_c, dout, sizeof q);
        if (side) { /* the host-built table through sparse_attn_kv */
            const uint8_t *tab[M * (NW + NS)];
            for (int i = 0; i < M; i++) {
                for (int j = 0; j < NW; j++) {
                    int32_t c = win[i * NW + j];
                    tab[i * (NW + NS) + j] = c >= 0 ? ring + c * wb : c <= -2 ? chunk + (-2 - c) * wb : NULL;
                }
                for (int j = 0; j < NS; j++) {
                    int32_t e = sel[i * NS + j];
                    tab[i * (NW + NS) + NW + j] = e >= 0 ? cache + e * cb : NULL;
                }
            }
            o->sparse_attn_kv(be, dq, M, H, D, tab, NW + NS, NW, sink, 0.125f, dout);
            o->download(be, out_k, dout, sizeof q);
        }
        o->free(be, ring);
        o->free(be, chunk);
        o->free(be, cache);
        o->free(be, dx);
        o->free(be, dq);
        o->free(be, dout);
        o->free(be, dwin);
        o->free(be, dsel);
        o->free(be, dring);
        o->free(be, dcache);
    }
    CHECK(di_backend_cuda_status(gpu, &err) == DI_OK);
    CHECK(memcmp(out_g, out_k, sizeof out_g) == 0);
    /* the op table's bound for sparse_attn_kv (test_cuda_backend.c): two
     * bf16 ulps of the value plus 2e-3 of the outputs' rms */
    double ss = 0;
    for (int i = 0; i < M * H * D; i++) ss += (double)out_c[i] * out_c[i];
    double atol = 2e-3 * sqrt(ss / (M * H * D));
    int bad = 0;
    for (int i = 0; i < M * H * D; i++)
        bad += !(fabs((double)out_g[i] - out_c[i]) <= 0x1p-6 * fabs(out_c[i]) + atol);
    CHECKF(bad == 0, "%d of %d outputs outside the bound against the CPU", bad, M * H * D);
#undef RNDF
#undef RNDI
    free(x);
    di_backend_destroy(cpu);
    di_backend_destroy(gpu);
}

int main(void) {
    RUN(test_attn_rows_op);
    RUN(test_device_select_same_bits);
    return test_summary();
}
