/* Whole-forward timings of the CPU backend, split by op class
 * (backend/backend.h; architecture.md §3–§10).
 *
 *   build/bench/bench_forward [SHARED_DIR] [REPS] [THREADS] [--narrow]
 *   build/bench/bench_forward --config FILE [--depth N] [REPS] [THREADS]
 *   (--narrow: a CPU with AVX-512 runs the 256-bit kernels, for comparison)
 *
 * --config: one dummy-weight model of that config.json instead (say the
 * real V4.1-Flash cut to a few layers), a prefill of N tokens (default
 * 1,000) and 16 decode steps, without the scalar peer (it would take hours
 * at real shapes); the routed experts run as one moe_experts call a layer,
 * as a decode step does, timed as their own class. The op classes then
 * tell where a real-shape step goes on a many-core machine.
 *
 * Models: the golden tiny V4.1 checkpoint and bench/configs/dummy-100m.json
 * (the tiny config widened to ~100M parameters, DI_LOAD_DUMMY weights).
 * Per model: a prefill of 128 tokens, then 32 decode steps of one token.
 * Every backend op is timed through a wrapping op table, so the report
 * gives each op class's share of the forward. The peer is the same run
 * with the CPU kernels forced onto their scalar path (which also takes the
 * backend's own ops off their AVX2 forms); the ratio column is
 * scalar / run-time choice. Medians of REPS runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/api_model.h"
#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "deepinfer.h"
#include "model/forward.h"

#include "bench_util.h"

enum { PROMPT = 128, DECODE = 32, CONFIG_DECODE = 16, MAX_REPS = 15 };
/* the prompt and decode lengths of a run (PROMPT / DECODE, or --config's) */
static int n_prompt = PROMPT, n_decode = DECODE;

static double median(const double *v, int n) {
    double t[MAX_REPS];
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, bench_cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* ---- op classes and the timing op table ---- */

enum { C_MATMUL, C_GROUPED, C_EXPERTS, C_HC_MIX, C_HC_RW, C_NORM, C_ATTN, C_INDEX, C_ENGRAM, C_MOE_EW,
       C_MISC, C_OTHER, N_CLASS };
static const char *class_name[N_CLASS] = {
    "matmul(_pair)", "matmul_grouped", "moe_experts (routed, one call)", "hc_mix", "hc_collapse(_norm)/expand/mean",
    "rmsnorm/rope/qdq", "sparse_attn(_kv/rows)+pool+pack", "index_scores(_kv)+topk",
    "engram gather/gate/rows", "moe route/swiglu/rows", "embed/add/round/greedy",
    "other (outside ops)"};
static double t_class[N_CLASS];
static const di_backend_ops *inner;

#define TIMED(cls, call)              \
    do {                              \
        double t0_ = bench_now_s();         \
        call;                         \
        t_class[cls] += bench_now_s() - t0_; \
    } while (0)

/* --config: the decode steps' products by weight shape (format, rows of
 * the first weight and of the pair's second, inputs), to tell which
 * weights the matmul class spends its time on */
enum { MAX_SHAPES = 48 };
static struct shape_time {
    int fmt;
    int64_t n, n2, k, calls;
    double t, bytes;
} shapes[MAX_SHAPES];
static int n_shapes, by_shape;

static void shape_add(const di_wmat *w, const di_wmat *w2, double t) {
    if (!by_shape) return;
    const double per = w->fmt == DI_WFMT_FP8 ? 1.0 + 1.0 / 1024 : w->fmt == DI_WFMT_FP4 ? 0.5 + 1.0 / 32
                     : w->fmt == DI_WFMT_BF16 ? 2.0 : 4.0;
    const int64_t n2 = w2 ? w2->n_out : 0;
    int i = 0;
    while (i < n_shapes && !(shapes[i].fmt == (int)w->fmt && shapes[i].n == w->n_out && shapes[i].n2 == n2 &&
                             shapes[i].k == w->n_in))
        i++;
    if (i == MAX_SHAPES) return;
    if (i == n_shapes) shapes[n_shapes++] = (struct shape_time){(int)w->fmt, w->n_out, n2, w->n_in, 0, 0, 0};
    shapes[i].calls++;
    shapes[i].t += t;
    shapes[i].bytes += per * (double)(w->n_out + n2) * (double)w->n_in;
}

static void w_matmul(di_backend *be, const di_wmat *w, const float *x, int64_t m, float *y,
                     unsigned f) {
    const double t0 = bench_now_s();
    TIMED(C_MATMUL, inner->matmul(be, w, x, m, y, f));
    shape_add(w, NULL, bench_now_s() - t0);
}
static void w_matmul_pair(di_backend *be, const di_wmat *wa, const di_wmat *wb, const float *x, int64_t m,
                          float *ya, float *yb, unsigned f) {
    const double t0 = bench_now_s();
    TIMED(C_MATMUL, inner->matmul_pair(be, wa, wb, x, m, ya, yb, f));
    shape_add(wa, wb, bench_now_s() - t0);
}
static void w_collapse_norm(di_backend *be, const float *s, const float *w, int64_t m, int hc, int64_t d,
                            const di_tensor *nw, double eps, float *y) {
    TIMED(C_HC_RW, inner->hc_collapse_norm(be, s, w, m, hc, d, nw, eps, y));
}
static void w_attn_rows(di_backend *be, const float *q, int64_t m, int h, int64_t d, const di_attn_rows *rows,
                        const float *sink, float sc, float *out) {
    TIMED(C_ATTN, inner->sparse_attn_rows(be, q, m, h, d, rows, sink, sc, out));
}
static void w_rope_cs(di_backend *be, float *x, int64_t m, int64_t stride, int heads, int64_t hd, int64_t rd,
                      const float *cs, int inv) {
    TIMED(C_NORM, inner->rope_cs(be, x, m, stride, heads, hd, rd, cs, inv));
}
static void w_qkv(di_backend *be, float *q, int heads, float *kv, int64_t m, int64_t hd, int64_t rd,
                  const di_tensor *nw, double eps, const float *cs, uint8_t *out) {
    TIMED(C_NORM, inner->qkv_rope_pack(be, q, heads, kv, m, hd, rd, nw, eps, cs, out));
}
static void w_engram_rows(di_backend *be, const uint8_t *rows, const uint8_t *sc, int64_t n, int64_t eh,
                          int64_t nb, float *out) {
    TIMED(C_ENGRAM, inner->engram_rows(be, rows, sc, n, eh, nb, out));
}
static void w_embed(di_backend *be, const di_tensor *t, const int32_t *ids, int64_t m, float *out) {
    TIMED(C_MISC, inner->embed(be, t, ids, m, out));
}
static void w_add(di_backend *be, float *y, const float *x, int64_t n) { TIMED(C_MISC, inner->add(be, y, x, n)); }
static void w_add_bf16(di_backend *be, float *y, const float *a, const float *b, int64_t n) {
    TIMED(C_MISC, inner->add_bf16(be, y, a, b, n));
}
static void w_round(di_backend *be, float *x, int64_t n) { TIMED(C_MISC, inner->round_bf16(be, x, n)); }
static void w_scale(di_backend *be, float *x, int64_t n, float c) {
    TIMED(C_MISC, inner->scale_bf16(be, x, n, c));
}
static void w_index_kv_buf(di_backend *be, const float *q, const float *w, int64_t m, int hi, int64_t di,
                           const uint8_t *const *keys, const int32_t *nv, int64_t width, float *out) {
    TIMED(C_INDEX, inner->index_scores_kv_buf(be, q, w, m, hi, di, keys, nv, width, out));
}
static void w_cand_buf(di_backend *be, const float *s, const int32_t *nv, int64_t m, int64_t width, int tb,
                       int bs, int32_t *blocks) {
    TIMED(C_INDEX, inner->candidate_blocks_buf(be, s, nv, m, width, tb, bs, blocks));
}
static void w_restrict_buf(di_backend *be, float *s, const int32_t *b, int64_t m, int64_t width, int tb,
                           int bs) {
    TIMED(C_INDEX, inner->restrict_blocks_buf(be, s, b, m, width, tb, bs));
}
static void w_topk_buf(di_backend *be, const float *s, const int32_t *nv, int64_t m, int64_t width, int k,
                       int32_t *idx) {
    TIMED(C_INDEX, inner->topk_select_buf(be, s, nv, m, width, k, idx));
}
static void w_embed_buf(di_backend *be, const di_tensor *t, const int32_t *ids, int64_t m, float *out) {
    TIMED(C_MISC, inner->embed_buf(be, t, ids, m, out));
}
static void w_gather_buf(di_backend *be, const float *src, const int32_t *rows, int64_t m, int64_t n,
                         float *dst) {
    TIMED(C_MOE_EW, inner->gather_rows_buf(be, src, rows, m, n, dst));
}
static void w_greedy(di_backend *be, const float *x, int64_t m, int64_t V, int64_t lim, const int32_t *ban,
                     di_row_greedy *out) {
    TIMED(C_MISC, inner->logits_greedy(be, x, m, V, lim, ban, out));
}
static void w_grouped(di_backend *be, const di_wmat *w, int g, const float *x, int64_t m, float *y) {
    TIMED(C_GROUPED, inner->matmul_grouped(be, w, g, x, m, y));
}
static void w_rmsnorm(di_backend *be, const float *x, const di_tensor *w, int64_t m, int64_t n,
                      double eps, float *y) {
    TIMED(C_NORM, inner->rmsnorm(be, x, w, m, n, eps, y));
}
static void w_rope(di_backend *be, float *x, int64_t m, int64_t stride, int heads, int64_t hd,
                   int64_t rd, const int32_t *pos, const float *freq, int inv) {
    TIMED(C_NORM, inner->rope(be, x, m, stride, heads, hd, rd, pos, freq, inv));
}
static void w_qdq8(di_backend *be, float *x, int64_t n) { TIMED(C_NORM, inner->qdq_fp8(be, x, n)); }
static void w_qdq4a(di_backend *be, float *x, int64_t n) {
    TIMED(C_NORM, inner->qdq_fp4_e8m0(be, x, n));
}
static void w_qdq4b(di_backend *be, float *x, int64_t n) {
    TIMED(C_NORM, inner->qdq_fp4_e4m3(be, x, n));
}
static void w_engram_gather(di_backend *be, const di_tensor *r, const di_tensor *s,
                            const int32_t *ids, int64_t m, int nc, float *out) {
    TIMED(C_ENGRAM, inner->engram_gather(be, r, s, ids, m, nc, out));
}
static void w_hc_mix(di_backend *be, const float *s, int64_t m, int hc, int64_t d, const float *fn,
                     const float *base, const float *scale, double ne, double he, int it,
                     float *pre, float *post, float *comb) {
    TIMED(C_HC_MIX, inner->hc_mix(be, s, m, hc, d, fn, base, scale, ne, he, it, pre, post, comb));
}
static void w_hc_collapse(di_backend *be, const float *s, const float *w, int64_t m, int hc,
                          int64_t d, float *y) {
    TIMED(C_HC_RW, inner->hc_collapse(be, s, w, m, hc, d, y));
}
static void w_hc_expand(di_backend *be, const float *y, const float *s, const float *post,
                        const float *comb, int64_t m, int hc, int64_t d, float *out) {
    TIMED(C_HC_RW, inner->hc_expand(be, y, s, post, comb, m, hc, d, out));
}
static void w_hc_mean(di_backend *be, const float *s, int64_t m, int hc, int64_t d, float *out,
                      int64_t os) {
    TIMED(C_HC_RW, inner->hc_mean(be, s, m, hc, d, out, os));
}
static void w_engram_gate(di_backend *be, float *s, const float *kv, const di_tensor *qw,
                          const di_tensor *kw, int64_t m, int hc, int64_t d, double eps) {
    TIMED(C_ENGRAM, inner->engram_gate(be, s, kv, qw, kw, m, hc, d, eps));
}
static void w_pool(di_backend *be, const float *a, const float *g, int64_t m, int r, int64_t n,
                   float *out) {
    TIMED(C_ATTN, inner->compress_pool(be, a, g, m, r, n, out));
}
static void w_attn(di_backend *be, const float *q, int64_t m, int h, int64_t d,
                   const di_kvrow *rows, int ns, const float *sink, float sc, float *out) {
    TIMED(C_ATTN, inner->sparse_attn(be, q, m, h, d, rows, ns, sink, sc, out));
}
static void w_index(di_backend *be, const float *q, const float *w, int64_t m, int hi, int64_t di,
                    const float *const *keys, const int32_t *nv, int64_t width, float *out) {
    TIMED(C_INDEX, inner->index_scores(be, q, w, m, hi, di, keys, nv, width, out));
}
static void w_pack(di_backend *be, di_kvq fmt, const float *x, int64_t m, int64_t n, uint8_t *out) {
    TIMED(C_ATTN, inner->kv_pack(be, fmt, x, m, n, out));
}
static void w_attn_kv(di_backend *be, const float *q, int64_t m, int h, int64_t d,
                      const uint8_t *const *rows, int ns, int nw, const float *sink, float sc,
                      float *out) {
    TIMED(C_ATTN, inner->sparse_attn_kv(be, q, m, h, d, rows, ns, nw, sink, sc, out));
}
static void w_index_kv(di_backend *be, const float *q, const float *w, int64_t m, int hi,
                       int64_t di, const uint8_t *const *keys, const int32_t *nv, int64_t width,
                       float *out) {
    TIMED(C_INDEX, inner->index_scores_kv(be, q, w, m, hi, di, keys, nv, width, out));
}
static void w_cand(di_backend *be, const float *s, const int32_t *nv, int64_t m, int64_t width,
                   int tb, int bs, int32_t *blocks) {
    TIMED(C_INDEX, inner->candidate_blocks(be, s, nv, m, width, tb, bs, blocks));
}
static void w_restrict(di_backend *be, float *s, const int32_t *b, int64_t m, int64_t width,
                       int tb, int bs) {
    TIMED(C_INDEX, inner->restrict_blocks(be, s, b, m, width, tb, bs));
}
static void w_topk(di_backend *be, const float *s, const int32_t *nv, int64_t m, int64_t width,
                   int k, int32_t *idx) {
    TIMED(C_INDEX, inner->topk_select(be, s, nv, m, width, k, idx));
}
static void w_route(di_backend *be, const float *l, const float *b, int64_t m, int e, int k,
                    int norm, float rs, int32_t *idx, float *w) {
    TIMED(C_MOE_EW, inner->moe_route(be, l, b, m, e, k, norm, rs, idx, w));
}
static void w_route_buf(di_backend *be, const float *l, const float *b, int64_t m, int e, int k, int norm,
                        float rs, int32_t *idx, float *w) {
    TIMED(C_MOE_EW, inner->moe_route_buf(be, l, b, m, e, k, norm, rs, idx, w));
}
static void w_experts(di_backend *be, const di_moe_experts *ex, const float *x, int64_t m, const int32_t *idx,
                      const float *w, int k, unsigned mm, float limit, float *out) {
    TIMED(C_EXPERTS, inner->moe_experts(be, ex, x, m, idx, w, k, mm, limit, out));
}
static void w_swiglu(di_backend *be, const float *g, const float *u, const float *w, int64_t m,
                     int64_t n, float lim, float *out) {
    TIMED(C_MOE_EW, inner->swiglu(be, g, u, w, m, n, lim, out));
}
static void w_gather(di_backend *be, const float *src, const int32_t *rows, int64_t m, int64_t n,
                     float *dst) {
    TIMED(C_MOE_EW, inner->gather_rows(be, src, rows, m, n, dst));
}
static void w_scatter(di_backend *be, float *dst, const int32_t *rows, const float *src, int64_t m,
                      int64_t n) {
    TIMED(C_MOE_EW, inner->scatter_add_rows(be, dst, rows, src, m, n));
}

static di_backend_ops timed_ops;

/* experts: the routed experts as one moe_experts call (where the backend
 * has it), else the model's per-expert loop, its ops timed by class */
static void timed_ops_init(const di_backend_ops *in, int experts) {
    inner = in;
    timed_ops = *in; /* memory ops and the step metadata's copies stay as they are ("other") */
    timed_ops.matmul = w_matmul;
    /* the optional ops only where the backend has them (NULL selects the
     * model's other path) */
#define WRAP(op, fn) timed_ops.op = in->op ? fn : NULL
    WRAP(matmul_pair, w_matmul_pair);
    WRAP(hc_collapse_norm, w_collapse_norm);
    WRAP(sparse_attn_rows, w_attn_rows);
    WRAP(rope_cs, w_rope_cs);
    WRAP(qkv_rope_pack, w_qkv);
    WRAP(engram_rows, w_engram_rows);
    WRAP(embed, w_embed);
    WRAP(add, w_add);
    WRAP(add_bf16, w_add_bf16);
    WRAP(round_bf16, w_round);
    WRAP(scale_bf16, w_scale);
    WRAP(logits_greedy, w_greedy);
    WRAP(index_scores_kv_buf, w_index_kv_buf);
    WRAP(candidate_blocks_buf, w_cand_buf);
    WRAP(restrict_blocks_buf, w_restrict_buf);
    WRAP(topk_select_buf, w_topk_buf);
    WRAP(embed_buf, w_embed_buf);
    WRAP(gather_rows_buf, w_gather_buf);
#undef WRAP
    timed_ops.matmul_grouped = w_grouped;
    timed_ops.rmsnorm = w_rmsnorm;
    timed_ops.rope = w_rope;
    timed_ops.qdq_fp8 = w_qdq8;
    timed_ops.qdq_fp4_e8m0 = w_qdq4a;
    timed_ops.qdq_fp4_e4m3 = w_qdq4b;
    timed_ops.engram_gather = w_engram_gather;
    timed_ops.hc_mix = w_hc_mix;
    timed_ops.hc_collapse = w_hc_collapse;
    timed_ops.hc_expand = w_hc_expand;
    timed_ops.hc_mean = w_hc_mean;
    timed_ops.engram_gate = w_engram_gate;
    timed_ops.compress_pool = w_pool;
    timed_ops.sparse_attn = w_attn;
    timed_ops.index_scores = w_index;
    timed_ops.kv_pack = w_pack;
    timed_ops.sparse_attn_kv = w_attn_kv;
    timed_ops.index_scores_kv = w_index_kv;
    timed_ops.candidate_blocks = w_cand;
    timed_ops.restrict_blocks = w_restrict;
    timed_ops.topk_select = w_topk;
    timed_ops.moe_route = w_route;
    /* by default the model's per-expert loop (the grouped op gives the same
     * bits), so the MoE's products and elementwise ops are timed by class */
    timed_ops.moe_route_buf = experts && in->moe_route_buf && in->moe_experts ? w_route_buf : NULL;
    timed_ops.moe_experts = experts && in->moe_route_buf && in->moe_experts ? w_experts : NULL;
    timed_ops.swiglu = w_swiglu;
    timed_ops.gather_rows = w_gather;
    timed_ops.scatter_add_rows = w_scatter;
}

/* ---- one measured run ---- */

typedef struct phase {
    double total[MAX_REPS], cls[N_CLASS][MAX_REPS];
} phase;

/* Stores one rep's times, per forward (calls = forwards measured). */
static void take(phase *p, int rep, double total, int calls) {
    total /= calls;
    p->total[rep] = total;
    for (int c = 0; c < N_CLASS - 1; c++) {
        p->cls[c][rep] = t_class[c] / calls;
        total -= t_class[c] / calls;
    }
    p->cls[C_OTHER][rep] = total; /* forward time outside the timed ops */
    memset(t_class, 0, sizeof t_class);
}

static int run_model(const di_lm *lm, int rep, phase *pre, phase *dec) {
    di_err err = {0};
    int64_t V = lm->cfg->vocab_size;
    const int np = n_prompt, nd = n_decode;
    int32_t *ids = malloc((size_t)(np + nd) * sizeof *ids);
    if (!ids) return -1;
    uint32_t r = 12345;
    for (int i = 0; i < np + nd; i++) {
        r = r * 1103515245u + 12345u;
        ids[i] = (int32_t)(3 + (r >> 8) % (uint32_t)(V - 3));
    }
    float *logits = malloc((size_t)V * sizeof(float));
    di_seqstate st;
    if (!logits || di_seqstate_init(&st, lm, np + nd + 1, 0, &err)) {
        fprintf(stderr, "bench_forward: %s\n", logits ? err.msg : "out of memory");
        free(logits);
        free(ids);
        return -1;
    }
    memset(t_class, 0, sizeof t_class);
    di_fwd_seq q = {&st, ids, np};
    double t0 = bench_now_s();
    di_status rc = di_forward(lm, &q, 1, logits, 0, &err);
    take(pre, rep, bench_now_s() - t0, 1);
    t0 = bench_now_s();
    n_shapes = 0;
    by_shape = 1;
    for (int i = 0; i < nd && !rc; i++) {
        di_fwd_seq d = {&st, ids + np + i, 1};
        rc = di_forward(lm, &d, 1, logits, 0, &err);
    }
    take(dec, rep, bench_now_s() - t0, nd);
    by_shape = 0;
    if (rc) fprintf(stderr, "bench_forward: %s\n", err.msg);
    di_seqstate_free(&st);
    free(logits);
    free(ids);
    return rc ? -1 : 0;
}

/* peer NULL: no scalar peer (--config) */
static void report(const char *what, const phase *fast, const phase *peer, int reps, double unit,
                   const char *unit_name) {
    double tf = median(fast->total, reps), tp = peer ? median(peer->total, reps) : 0;
    if (peer) {
        printf("  %s: %.2f %s (scalar peer %.2f %s, ratio %.2fx)\n", what, tf * unit, unit_name, tp * unit,
               unit_name, tp / tf);
        printf("    %-30s %10s %6s %10s %7s\n", "op class", unit_name, "share", "scalar", "ratio");
    } else {
        printf("  %s: %.2f %s\n", what, tf * unit, unit_name);
        printf("    %-30s %10s %6s\n", "op class", unit_name, "share");
    }
    for (int c = 0; c < N_CLASS; c++) {
        double f = median(fast->cls[c], reps), p = peer ? median(peer->cls[c], reps) : 0;
        if (!peer && f == 0) continue;
        if (peer)
            printf("    %-30s %10.3f %5.1f%% %10.3f %6.2fx\n", class_name[c], f * unit, 100 * f / tf, p * unit,
                   f > 0 ? p / f : 0.0);
        else
            printf("    %-30s %10.3f %5.1f%%\n", class_name[c], f * unit, 100 * f / tf);
    }
}

/* peer: also the scalar path's run (and the model's per-expert loop, so
 * its products are timed by class); else the routed experts in one call */
static int bench_model(const char *name, const char *path, int dummy, int reps, int threads, int peer) {
    di_model_options o;
    di_model_options_default(&o);
    o.load_format = dummy ? DI_LOAD_DUMMY : DI_LOAD_AUTO;
    di_model *m = NULL;
    if (di_model_open(path, &o, &m) != DI_OK) {
        fprintf(stderr, "bench_forward: %s: %s\n", name, di_last_error());
        return -1;
    }
    di_err err = {0};
    di_backend *be = NULL;
    if (di_backend_cpu_create(threads, &be, &err)) {
        fprintf(stderr, "bench_forward: %s\n", err.msg);
        di_model_close(m);
        return -1;
    }
    timed_ops_init(be->ops, !peer);
    be->ops = &timed_ops;
    /* any valid Engram token map will do for timings */
    int32_t *cmap = malloc((size_t)m->cfg.vocab_size * sizeof(int32_t));
    for (int64_t i = 0; cmap && i < m->cfg.vocab_size; i++)
        cmap[i] = m->cfg.engram_compressed_vocab > 0 ? (int32_t)(i % m->cfg.engram_compressed_vocab) : 0;
    di_lm lm;
    memset(&lm, 0, sizeof lm);
    int rc = -1;
    if (!cmap || di_lm_init(&lm, &m->cfg, &m->weights, be, DI_NUMERICS_FP8, cmap, &err)) {
        fprintf(stderr, "bench_forward: %s: %s\n", name, err.msg);
        goto done;
    }
    printf("%s (%.1f MB of weights), %d threads, %s kernels%s:\n", name, (double)m->weight_bytes / 1e6,
           be->n_threads, di_cpu_kernels_path(), di_cpu_kernels_wide() ? " on 512-bit vectors" : "");
    phase *p = calloc(4, sizeof *p); /* prefill, decode; scalar prefill, decode */
    if (!p) goto done;
    rc = 0;
    for (int i = 0; i < reps && !rc; i++) {
        rc |= run_model(&lm, i, &p[0], &p[1]);
        if (!peer) continue;
        di_cpu_kernels_force_scalar(1);
        rc |= run_model(&lm, i, &p[2], &p[3]);
        di_cpu_kernels_force_scalar(0);
    }
    if (!rc) {
        char what[64];
        snprintf(what, sizeof what, "prefill of %d tokens", n_prompt);
        report(what, &p[0], peer ? &p[2] : NULL, reps, 1e3, "ms");
        snprintf(what, sizeof what, "decode at depth %d, per token (%d steps)", n_prompt, n_decode);
        report(what, &p[1], peer ? &p[3] : NULL, reps, 1e3, "ms");
        if (!peer) { /* the last run's decode products by shape */
            static const char *fmts[] = {"?", "fp8", "fp4", "bf16", "f32"};
            printf("    %-34s %8s %10s %8s\n", "products (last run), fmt rows x inputs", "calls", "ms/token", "GB/s");
            for (int i = 0; i < n_shapes; i++) {
                char nm[64];
                const char *fn = shapes[i].fmt >= 0 && shapes[i].fmt < 5 ? fmts[shapes[i].fmt] : "?";
                if (shapes[i].n2)
                    snprintf(nm, sizeof nm, "%s (%lld + %lld) x %lld", fn, (long long)shapes[i].n,
                             (long long)shapes[i].n2, (long long)shapes[i].k);
                else
                    snprintf(nm, sizeof nm, "%s %lld x %lld", fn, (long long)shapes[i].n, (long long)shapes[i].k);
                printf("    %-34s %8lld %10.3f %8.1f\n", nm, (long long)shapes[i].calls, shapes[i].t / n_decode * 1e3,
                       shapes[i].bytes / shapes[i].t / 1e9);
            }
        }
    }
    free(p);
done:
    di_lm_free(&lm);
    free(cmap);
    be->ops = inner;
    di_backend_destroy(be);
    di_model_close(m);
    return rc;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[argc - 1], "--narrow")) {
        di_cpu_kernels_force_no_avx512(1);
        argc--;
    }
    if (argc > 2 && !strcmp(argv[1], "--config")) {
        const char *cfg = argv[2];
        argv += 2, argc -= 2;
        n_prompt = 1000, n_decode = CONFIG_DECODE;
        if (argc > 2 && !strcmp(argv[1], "--depth")) {
            n_prompt = atoi(argv[2]);
            argv += 2, argc -= 2;
            if (n_prompt < 1) {
                fprintf(stderr, "bench_forward: --depth wants a positive token count\n");
                return 2;
            }
        }
        int reps = argc > 1 ? atoi(argv[1]) : 3, threads = argc > 2 ? atoi(argv[2]) : 0;
        reps = reps < 1 ? 1 : reps > MAX_REPS ? MAX_REPS : reps;
        printf("bench_forward: medians of %d runs, dummy weights of %s\n", reps, cfg);
        return bench_model(cfg, cfg, 1, reps, threads, 0) ? 1 : 0;
    }
    const char *shared = argc > 1 ? argv[1] : "../shared";
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    int threads = argc > 3 ? atoi(argv[3]) : 0;
    if (reps < 1) reps = 1;
    if (reps > MAX_REPS) reps = MAX_REPS;
    char tiny[4200];
    snprintf(tiny, sizeof tiny, "%s/golden/v41-tiny", shared);
    printf("bench_forward: medians of %d runs (shared 2-core VM: timings are noisy)\n", reps);
    int rc = bench_model("v41-tiny", tiny, 0, reps, threads, 1);
    rc |= bench_model("dummy-100m (bench/configs/dummy-100m.json)", "bench/configs/dummy-100m.json",
                      1, reps, threads, 1);
    return rc ? 1 : 0;
}
