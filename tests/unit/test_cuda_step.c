/* The CUDA backend's backend-memory forms (backend.h; the default,
 * DI_CUDA_DEVICE_SELECT=0 leaves them out): the golden tiny model
 * prefilled, then decode steps alone and two sequences batched past the
 * window's wrap, once with the host forms and once with the device forms.
 * The logits must be the same bits (the forms run the same kernels on
 * tables built on the device or carried by the step metadata instead of
 * uploaded per call), and the profile of the device-form steps must show
 * the attention over device row tables, no call of the host-result or
 * host-table forms (topk_select, candidate_blocks, restrict_blocks,
 * index_scores_kv, sparse_attn_kv) nor of the forms taking per-row host
 * arrays (rope, embed, gather_rows, engram_gather), the ring and cache
 * writes as scatters, and one upload per pass. The grouped MoE op against
 * the per-expert loop the same way (same bits, no routing read back).
 * Skips without a GPU or ../shared. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_graph.h"
#include "core/dtype.h"
#include "golden_util.h"
#include "test.h"
#include "attn_bound.h"

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

/* Whether run() profiles the decode steps (profiling drains the device at
 * every op, which recording a step cannot have). */
static int PROFILE = 1;

/* Prefill P tokens into a and Q into b (in pieces of `chunk` tokens, 0:
 * whole), then `steps` decode steps of a alone and `steps` of a and b
 * batched; logits of every pass's last rows into lg. Profiles the decode
 * steps into tab. Returns the rows written. */
static int64_t run(gold_model *g, di_backend *be, int64_t P, int64_t Q, int steps, int64_t chunk,
                   float *lg, char *tab, size_t cap) {
    const int32_t *ids = gold_i32(g, "long.prompt_ids", NULL);
    int64_t V = g->cfg.vocab_size, rows = 0;
    di_err err = {0};
    di_backend *saved = g->lm.be;
    g->lm.be = be;
    di_seqstate a, b;
    CHECK(di_seqstate_init(&a, &g->lm, P + 2 * steps + 8, 0, &err) == DI_OK);
    CHECK(di_seqstate_init(&b, &g->lm, Q + steps + 16, 0, &err) == DI_OK);
    for (int64_t i = 0; i < P;) {
        int64_t n = chunk > 0 && P - i > chunk ? chunk : P - i;
        di_fwd_seq qa = {&a, ids + i, n};
        CHECKF(di_forward(&g->lm, &qa, 1, lg, 0, &err) == DI_OK, "%s", err.msg);
        i += n;
    }
    for (int64_t i = 0; i < Q;) {
        int64_t n = chunk > 0 && Q - i > chunk ? chunk : Q - i;
        di_fwd_seq qb = {&b, ids + 7 + i, n};
        CHECKF(di_forward(&g->lm, &qb, 1, lg + V, 0, &err) == DI_OK, "%s", err.msg);
        i += n;
    }
    rows = 2;
    if (PROFILE) di_backend_cuda_profile_start(be, 1);
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
    if (PROFILE) {
        di_backend_cuda_profile(be, tab, cap);
        di_backend_cuda_profile_start(be, 0);
    }
    di_seqstate_free(&a);
    di_seqstate_free(&b);
    g->lm.be = saved;
    return rows;
}

/* A CUDA backend with DI_CUDA_DEVICE_SELECT, DI_CUDA_MOE_GROUPED,
 * DI_CUDA_GRAPH and DI_CUDA_HC_SIDE set to sw[0..3] (NULL: unset) when it
 * is created. */
enum { NSW = 4 };
static const char *const SWITCHES[NSW] = {"DI_CUDA_DEVICE_SELECT", "DI_CUDA_MOE_GROUPED", "DI_CUDA_GRAPH",
                                          "DI_CUDA_HC_SIDE"};

static di_status cuda_with(const char *const sw[NSW], di_backend **be, di_err *err) {
    for (int i = 0; i < NSW; i++) {
        if (sw[i]) setenv(SWITCHES[i], sw[i], 1);
        else unsetenv(SWITCHES[i]);
    }
    di_status st = di_backend_cuda_create(0, be, err);
    for (int i = 0; i < NSW; i++) unsetenv(SWITCHES[i]);
    return st;
}

/* Two backends (switches sw[0], sw[1]) and the golden tiny model, run the
 * same way; logits of both into l[0], l[1], profiles into t[0], t[1]. */
typedef struct pair {
    di_backend *be[2];
    gold_model g;
    int64_t rows, diff; /* rows of logits, how many values differ */
    float *l[2];
    char t[2][8192];
} pair;

/* 1: ran; 0: skipped (no device); -1: failed to set up. */
static int pair_run(pair *p, const char *const sw[2][NSW], int64_t P, int64_t Q, int steps,
                    int64_t chunk) {
    const char *shared = test_shared_dir();
    di_err err = {0};
    memset(p, 0, sizeof *p);
    if (!shared || cuda_with(sw[0], &p->be[0], &err)) return 0;
    if (cuda_with(sw[1], &p->be[1], &err) || gold_open(&p->g, shared, "v41-tiny")) {
        CHECKF(0, "%s", err.msg);
        di_backend_destroy(p->be[0]);
        di_backend_destroy(p->be[1]);
        return -1;
    }
    int64_t V = p->g.cfg.vocab_size, n[2];
    size_t cap = (size_t)(2 + 3 * steps) * (size_t)V;
    for (int i = 0; i < 2; i++) {
        p->l[i] = malloc(cap * sizeof(float));
        n[i] = run(&p->g, p->be[i], P, Q, steps, chunk, p->l[i], p->t[i], sizeof p->t[i]);
    }
    CHECK_EQ_INT(n[0], n[1]);
    p->rows = n[0];
    for (int64_t i = 0; i < n[0] * V; i++) p->diff += memcmp(&p->l[0][i], &p->l[1][i], sizeof(float)) != 0;
    if (getenv("DI_TEST_VERBOSE")) fprintf(stderr, "first:\n%s\nsecond:\n%s\n", p->t[0], p->t[1]);
    return 1;
}

static void pair_close(pair *p) {
    free(p->l[0]);
    free(p->l[1]);
    gold_close(&p->g);
    di_backend_destroy(p->be[0]);
    di_backend_destroy(p->be[1]);
}

static void test_device_select_same_bits(void) {
    static pair p;
    static const char *const sw[2][NSW] = {{"0", NULL, NULL}, {"1", NULL, NULL}};
    int rc = pair_run(&p, sw, 120, 40, 8, 0);
    if (rc == 0) SKIP("no CUDA device or ../shared not found (set DEEPINFER_SHARED_DIR)");
    if (rc < 0) return;
    const char *t0 = p.t[0], *t1 = p.t[1];
    CHECK(p.be[1]->ops->sparse_attn_rows != NULL && p.be[0]->ops->sparse_attn_rows == NULL);
    CHECKF(p.diff == 0, "%lld logits differ between the device forms and the host forms", (long long)p.diff);
    static const char *const host_forms[] = {"topk_select", "candidate_blocks", "restrict_blocks",
                                             "index_scores_kv", "sparse_attn_kv"};
    for (size_t i = 0; i < sizeof host_forms / sizeof *host_forms; i++) {
        CHECKF(prof_calls(t1, host_forms[i]) == 0, "device forms: %ld calls of %s",
               prof_calls(t1, host_forms[i]), host_forms[i]);
        CHECKF(prof_calls(t0, host_forms[i]) > 0 || i == 2, "host forms: no call of %s", host_forms[i]);
    }
    CHECK(prof_calls(t1, "sparse_attn_rows") > 0 && prof_calls(t1, "topk_select_buf") > 0);
    /* the per-row host arrays come from the step metadata: one upload per pass */
    static const char *const host_arrays[] = {"rope", "embed", "gather_rows", "engram_gather"};
    for (size_t i = 0; i < sizeof host_arrays / sizeof *host_arrays; i++) {
        CHECKF(prof_calls(t1, host_arrays[i]) == 0, "device forms: %ld calls of %s",
               prof_calls(t1, host_arrays[i]), host_arrays[i]);
        CHECKF(prof_calls(t0, host_arrays[i]) > 0, "host forms: no call of %s", host_arrays[i]);
    }
    CHECK(prof_calls(t1, "rope_cs") > 0 && prof_calls(t1, "embed_buf") > 0);
    /* ring and cache writes to the metadata's slots: fewer copies than rows written */
    CHECK(prof_calls(t1, "scatter_rows_to") > 0 && prof_calls(t0, "scatter_rows_to") == 0);
    CHECK(prof_calls(t1, "gather_rows_from") > 0);
    CHECK(prof_calls(t1, "engram_rows") > 0);
    CHECKF(prof_calls(t1, "copy") < prof_calls(t0, "copy"), "device forms: %ld copies, host forms %ld",
           prof_calls(t1, "copy"), prof_calls(t0, "copy"));
    CHECKF(prof_calls(t1, "upload") == 16, "device forms: %ld uploads in 16 passes",
           prof_calls(t1, "upload"));
    pair_close(&p);
}

/* sparse_attn_rows on random tables (every slot kind: ring slot, this
 * call's row, empty window slot, selected entry, -1) against the same
 * backend's sparse_attn_kv on the row pointers built on the host: the same
 * kernel, so the same bits; and against the CPU backend's sparse_attn_rows
 * within the tensor-core kernel's bound (attn_bound.h: q·k and p·v reduced
 * in another order, CUDA's expf, bf16 roundings of p). */
static void test_attn_rows_op(void) {
    di_err err = {0};
    di_backend *gpu = NULL, *cpu = NULL;
    static const char *const sw[NSW] = {NULL, NULL, NULL, NULL};
    if (cuda_with(sw, &gpu, &err)) SKIP("%s", err.msg);
    CHECK(di_backend_cpu_create(1, &cpu, &err) == DI_OK);
    enum { M = 5, H = 3, D = 64, NW = 7, NS = 9, RING = 11, ENT = 13 };
    size_t wb = di_kvq_row_bytes(DI_KVQ_FP8, D), cb = di_kvq_row_bytes(DI_KVQ_FP4_E4M3, D);
    uint32_t rng = 12345u;
#define RNDF() ((float)((rng = rng * 1664525u + 1013904223u) >> 8) / 16777216.0f * 2.f - 1.f)
#define RNDI(n) ((int)((rng = rng * 1664525u + 1013904223u) >> 8) % (n))
    float *x = malloc((size_t)(RING + M + ENT) * D * sizeof(float)), q[M * H * D], sink[H];
    for (int i = 0; i < (RING + M + ENT) * D; i++) x[i] = RNDF();
    /* q holds bf16 values, as the model passes it (the tensor-core kernel
     * reads it as bf16) */
    for (int i = 0; i < M * H * D; i++) q[i] = di_round_bf16(RNDF());
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
    /* against the CPU within the tensor-core kernel's bound (attn_bound.h)
     * on the decoded rows each slot names */
    float dec[(RING + M + ENT) * D];
    uint8_t *pk = malloc(wb > cb ? wb : cb);
    for (int r = 0; r < RING + M + ENT; r++) {
        di_kvq f = r < RING + M ? DI_KVQ_FP8 : DI_KVQ_FP4_E4M3;
        di_kvq_pack(f, x + r * D, D, pk);
        di_kvq_unpack(f, pk, D, dec + r * D);
    }
    const float *rd[M * (NW + NS)];
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < NW; j++) {
            int32_t c = win[i * NW + j];
            rd[i * (NW + NS) + j] = c >= 0 ? dec + c * D : c <= -2 ? dec + (RING + (-2 - c)) * D : NULL;
        }
        for (int j = 0; j < NS; j++) {
            int32_t e = sel[i * NS + j];
            rd[i * (NW + NS) + NW + j] = e >= 0 ? dec + (RING + M + e) * D : NULL;
        }
    }
    cmp_attn_tc("sparse_attn_rows vs cpu", out_g, out_c, q, M, H, D, rd, NW + NS, sink, 0.125f);
    free(pk);
#undef RNDF
#undef RNDI
    free(x);
    di_backend_destroy(cpu);
    di_backend_destroy(gpu);
}

/* The routed experts through the grouped op (moe_route_buf + moe_experts on
 * the stacked experts) against the model's per-expert loop with host
 * routing (DI_CUDA_MOE_GROUPED=0) on the golden model: the same logits
 * bits, every pass at most 16 rows (prefill in pieces of 16: up to 16 rows
 * both take the products' decode kernel, test_cuda_backend.c). The grouped
 * decode steps call neither moe_route nor an MXFP4 matmul (the shared
 * expert is FP8) and download once per pass (the logits). */
static void test_moe_grouped_same_bits(void) {
    static pair p;
    static const char *const sw[2][NSW] = {{NULL, "0", NULL}, {NULL, NULL, NULL}};
    const int steps = 6;
    int rc = pair_run(&p, sw, 120, 40, steps, 16);
    if (rc == 0) SKIP("no CUDA device or ../shared not found (set DEEPINFER_SHARED_DIR)");
    if (rc < 0) return;
    const char *t0 = p.t[0], *t1 = p.t[1];
    CHECK(p.be[1]->ops->moe_experts != NULL && p.be[0]->ops->moe_experts == NULL);
    CHECKF(p.diff == 0, "%lld logits differ between the grouped op and the per-expert loop", (long long)p.diff);
    CHECK(prof_calls(t1, "moe_experts") > 0 && prof_calls(t1, "moe_route_buf") > 0);
    CHECKF(prof_calls(t1, "moe_route") == 0 && prof_calls(t1, "matmul (mxfp4)") == 0,
           "grouped: %ld moe_route, %ld mxfp4 matmul calls", prof_calls(t1, "moe_route"),
           prof_calls(t1, "matmul (mxfp4)"));
    CHECK(prof_calls(t0, "moe_route") > 0 && prof_calls(t0, "matmul (mxfp4)") > 0);
    CHECKF(prof_calls(t1, "download") == 2 * steps, "grouped: %ld downloads in %d passes",
           prof_calls(t1, "download"), 2 * steps);
    pair_close(&p);
}

/* Decode steps recorded as CUDA graphs and replayed (DI_CUDA_GRAPH=1)
 * against the same steps run op by op: the same logits bits, with steps
 * replayed (each key's first step runs eagerly, the second is recorded,
 * later ones replay: 8 decode steps alone and 8 batched, the ratio-2 groups
 * alternating two keys). Skips when no step could be recorded (kernels
 * built for the legacy default stream: see cuda_graph.h). */
static void test_graph_replay_same_bits(void) {
    static pair p;
    static const char *const sw[2][NSW] = {{NULL, NULL, NULL}, {NULL, NULL, "1"}};
    PROFILE = 0;
    int rc = pair_run(&p, sw, 120, 40, 8, 0);
    PROFILE = 1;
    if (rc == 0) SKIP("no CUDA device or ../shared not found (set DEEPINFER_SHARED_DIR)");
    if (rc < 0) return;
    long recorded = 0, replayed = 0, failed = 0;
    di_backend_cuda_graph_stats(p.be[1], &recorded, &replayed, &failed);
    CHECKF(p.diff == 0, "%lld logits differ between replayed and eager steps", (long long)p.diff);
    CHECK(p.be[1]->ops->graph_replay != NULL && p.be[0]->ops->graph_replay == NULL);
    pair_close(&p);
    if (recorded == 0) SKIP("no step recorded (%ld keys failed): kernels on the legacy stream?", failed);
    CHECKF(replayed > 0 && failed == 0, "%ld steps recorded, %ld replayed, %ld keys failed", recorded,
           replayed, failed);
    if (getenv("DI_TEST_VERBOSE"))
        fprintf(stderr, "graphs: %ld recorded, %ld replayed\n", recorded, replayed);
}

/* hc_mix on the backend's second stream (the default) against the main
 * stream (DI_CUDA_HC_SIDE=0), op by op and with graphs (recorded steps keep
 * it on the main stream, the eager first step of each key does not): the
 * same logits bits (the same kernels; a missing join would let the
 * sublayer or hc_expand read pre, post or comb before they are written,
 * or the next site's hc_mix overwrite them), and the side stream used at
 * every site of the decode passes (two per block a pass, 1 or 2 rows). */
static void test_hc_side_same_bits(void) {
    for (int graph = 0; graph < 2; graph++) {
        static pair p;
        const char *g = graph ? "1" : NULL;
        const char *const sw[2][NSW] = {{NULL, NULL, g, "0"}, {NULL, NULL, g, NULL}};
        PROFILE = 0;
        int rc = pair_run(&p, sw, 120, 40, 8, 0);
        PROFILE = 1;
        if (rc == 0) SKIP("no CUDA device or ../shared not found (set DEEPINFER_SHARED_DIR)");
        if (rc < 0) return;
        const long n0 = di_backend_cuda_side_count(p.be[0]), n1 = di_backend_cuda_side_count(p.be[1]);
        CHECKF(p.diff == 0, "graphs %d: %lld logits differ with hc_mix on the second stream", graph,
               (long long)p.diff);
        const int64_t sites = 2 * p.g.cfg.n_layers * (8 + 8); /* decode passes; replays count once */
        CHECKF(n0 == 0 && (graph ? n1 > 0 : n1 >= sites), "graphs %d: %ld / %ld hc_mix calls on the side stream",
               graph, n0, n1);
        pair_close(&p);
    }
}

int main(void) {
    RUN(test_hc_side_same_bits);
    RUN(test_attn_rows_op);
    RUN(test_moe_grouped_same_bits);
    RUN(test_device_select_same_bits);
    RUN(test_graph_replay_same_bits);
    return test_summary();
}
