/* CPU backend: the op table of backend.h in portable C (architecture.md
 * §2–§10). Every op follows the reference's rounding points exactly as
 * written in docs/numerics.md; the matmuls accumulate each 32-input block in
 * fp32 and add the scaled block partials in K order, as the reference GEMMs
 * do. Work is split over rows (or output columns) across threads. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/rope_angles.h"
#include "backend/cpu/cpu_ops_avx2.h"
#include "backend/cpu/cpu_quant.h"
#include "backend/cpu/kernels.h"
#include "core/cpu_features.h"
#include "core/route_score.h"
#include "core/row_exp.h"
#include "core/threadpool.h"

/* ------------------------------------------------------------ the backend */

/* Large buffers handed out (live) and freed ones kept for reuse. A prefill
 * chunk's activations are tens to hundreds of MB (q and o of 1,000 tokens:
 * 131 MB each), allocated and freed in every layer; from the C library
 * each is a fresh mapping whose pages the kernel clears on first touch,
 * then zeroed again: ~11 % of a 1,000-token prefill of two real-shape
 * layers on two Zen 4 threads went there (perf: the kernel's page clearing
 * under the attention's buffers). Freed blocks of at least KEEP_MIN bytes
 * are kept, up to KEEP_N blocks and KEEP_BYTES in all, and handed out again
 * for a request of at least half their size; pointers the backend did not
 * hand out (or no longer tracks: more than LIVE_N large ones at once) are
 * freed as before. Sanitizer builds keep nothing, so a use after free is
 * still caught. */
enum { KEEP_MIN = 1 << 20, KEEP_N = 16, LIVE_N = 256 };
#define KEEP_BYTES ((size_t)1 << 30)
typedef struct cpu_block {
    void *p;
    size_t n;
} cpu_block;
typedef struct cpu_impl {
    di_threadpool *tp;
    pthread_mutex_t mu;
    cpu_block live[LIVE_N], keep[KEEP_N];
    int n_live, n_keep;
    size_t kept; /* bytes in keep */
} cpu_impl;

static di_threadpool *pool_of(const di_backend *be) { return be->impl ? ((cpu_impl *)be->impl)->tp : NULL; }

/* ------------------------------------------------------------ threads */

typedef void (*range_fn)(void *ctx, int64_t lo, int64_t hi);

typedef struct par_ctx {
    range_fn fn;
    void *ctx;
} par_ctx;

static void par_body(void *p, int64_t begin, int64_t end, int thread) {
    (void)thread;
    par_ctx *c = p;
    c->fn(c->ctx, begin, end);
}

/* Runs fn over [0, n) on the backend's pool; `work` is a rough cost used to
 * stay on the calling thread for small calls. Each index is handled by one
 * thread from start to end, so results never depend on the split. */
static void par_for(di_backend *be, int64_t n, double work, range_fn fn, void *ctx) {
    di_threadpool *tp = pool_of(be);
    if (!tp || work < 2e5 || n < 2) {
        fn(ctx, 0, n);
        return;
    }
    par_ctx c = {fn, ctx};
    int64_t nt = di_threadpool_size(tp), grain = n / (4 * nt);
    di_threadpool_for(tp, n, grain > 0 ? grain : 1, par_body, &c);
}

/* The AVX2 forms of this file's own ops follow the kernels' path, so forcing
 * the kernels scalar (tests, benchmarks) takes these ops scalar too. */
static int ops_avx2(void) {
#if defined(DI_HAVE_AVX2_OPS)
    return di_cpu_kernels_path()[0] == 'a';
#else
    return 0;
#endif
}

/* One packed cache row decoded (di_kvq_unpack's values, on 8 lanes where
 * the CPU's own ops run AVX2). */
static void kvq_unpack(di_kvq f, const uint8_t *row, int64_t n, float *x) {
#if defined(DI_HAVE_AVX2_OPS)
    if (ops_avx2()) {
        di_cpu_kvq_unpack_avx2(f, row, n, x);
        return;
    }
#endif
    di_kvq_unpack(f, row, n, x);
}

/* x[i] = bf16(x[i]) for i < n: the products' and ops' whole outputs (the
 * 1 GB dummy's 512-token prefill rounds ~10^8 values; the scalar loop,
 * which the compiler does not vectorize, took ~0.2 s of its ~2.2 on the
 * calling thread alone), on 8 lanes, in pieces of ROUND_PIECE values over
 * the pool where there are many. */
enum { ROUND_PIECE = 4096 };
/* The end of pieces [.., p) of `piece` values each among n (n at most). */
static inline int64_t piece_end(int64_t p, int64_t piece, int64_t n) { return p * piece < n ? p * piece : n; }
typedef struct round_ctx {
    float *x;
    int64_t n;
} round_ctx;
static void round_range(void *ctx, int64_t p0, int64_t p1) {
    const round_ctx *c = ctx;
    float *x = c->x;
    const int64_t i0 = p0 * ROUND_PIECE, i1 = piece_end(p1, ROUND_PIECE, c->n);
#if defined(DI_HAVE_AVX2_OPS)
    if (ops_avx2()) {
        di_cpu_round_bf16_avx2(x + i0, i1 - i0);
        return;
    }
#endif
    for (int64_t i = i0; i < i1; i++) x[i] = di_round_bf16(x[i]);
}
static void round_bf16_n(di_backend *be, float *x, int64_t n) {
    round_ctx c = {x, n};
    par_for(be, (n + ROUND_PIECE - 1) / ROUND_PIECE, (double)n, round_range, &c);
}

/* di_act_quant_fp8 of m rows, over the pool where there are many (a row's
 * codes and scale depend on that row alone) */
typedef struct quant_ctx {
    const float *x;
    int64_t K;
    uint8_t *q;
    float *s;
} quant_ctx;
static void quant_range(void *ctx, int64_t i0, int64_t i1) {
    const quant_ctx *c = ctx;
    di_act_quant_fp8(c->x + i0 * c->K, i1 - i0, c->K, c->q + i0 * c->K, c->s + i0 * (c->K / 32));
}
static void act_quant(di_backend *be, const float *x, int64_t m, int64_t K, uint8_t *q, float *s) {
    quant_ctx c = {x, K, q, s};
    par_for(be, m, 4.0 * (double)m * (double)K, quant_range, &c);
}

/* E4M3 / E8M0 byte values (tables shared with the kernels). */
#define E8M0(b) (di_cpu_e8m0_table()[(b)])

/* ------------------------------------------------------------ memory */

/* A block of at least `bytes` (64-byte aligned), a kept one where one
 * fits; large ones are tracked as live. */
static void *cpu_alloc_block(di_backend *be, size_t bytes) {
    cpu_impl *im = be ? be->impl : NULL;
    if (bytes == 0) bytes = 1;
    const size_t n = (bytes + 63) & ~(size_t)63;
    void *p = NULL;
    if (im && n >= KEEP_MIN) {
        pthread_mutex_lock(&im->mu);
        int best = -1;
        for (int i = 0; i < im->n_keep; i++) /* the smallest that fits, at most twice the request */
            if (im->keep[i].n >= n && im->keep[i].n / 2 <= n && (best < 0 || im->keep[i].n < im->keep[best].n))
                best = i;
        cpu_block b = {NULL, n};
        if (best >= 0) {
            b = im->keep[best];
            im->keep[best] = im->keep[--im->n_keep];
            im->kept -= b.n;
        } else if (posix_memalign(&b.p, 64, n)) {
            b.p = NULL;
        }
        if (b.p && im->n_live < LIVE_N) im->live[im->n_live++] = b;
        pthread_mutex_unlock(&im->mu);
        return b.p;
    }
    return posix_memalign(&p, 64, n) ? NULL : p;
}
static void *cpu_alloc(di_backend *be, size_t bytes) {
    void *p = cpu_alloc_block(be, bytes);
    if (p) memset(p, 0, bytes ? bytes : 1);
    return p;
}
/* backend.h's alloc_raw: the same without the zero fill (a kept block
 * holds what its last user left). Sanitizer builds fill it with NaN bytes
 * instead, so that reading what no op wrote shows in the tests. */
static void *cpu_alloc_raw(di_backend *be, size_t bytes) {
    void *p = cpu_alloc_block(be, bytes);
#if defined(DI_SANITIZE)
    if (p) memset(p, 0xff, bytes ? bytes : 1);
#endif
    return p;
}
static void cpu_free(di_backend *be, void *p) {
    cpu_impl *im = be ? be->impl : NULL;
    if (!p) return;
    if (im) {
        pthread_mutex_lock(&im->mu);
        for (int i = im->n_live - 1; i >= 0; i--)
            if (im->live[i].p == p) {
                const cpu_block b = im->live[i];
                im->live[i] = im->live[--im->n_live];
#if defined(DI_SANITIZE)
                (void)b;
#else
                if (im->n_keep < KEEP_N && im->kept + b.n <= KEEP_BYTES) {
                    im->keep[im->n_keep++] = b;
                    im->kept += b.n;
                    p = NULL;
                }
#endif
                break;
            }
        pthread_mutex_unlock(&im->mu);
    }
    free(p);
}
static void cpu_copy(di_backend *be, void *dst, const void *src, size_t n) {
    (void)be;
    if (n) memmove(dst, src, n);
}

/* ------------------------------------------------------------ matmul */

/* Dequantized weight row n into buf [K] (exact: every format times a power
 * of two fits fp32). */
static void w_row(const di_wmat *w, int64_t n, float *buf) {
    int64_t K = w->n_in;
    switch (w->fmt) {
    case DI_WFMT_FP8: {
        const uint8_t *row = (const uint8_t *)w->w + n * K;
        int64_t kb = (K + 31) / 32;
        const uint8_t *s = w->s + (n / 32) * kb;
        const float *e4m3 = di_cpu_e4m3_table(), *e8m0 = di_cpu_e8m0_table();
        for (int64_t k = 0; k < K; k++) buf[k] = e4m3[row[k]] * e8m0[s[k / 32]];
        break;
    }
    case DI_WFMT_FP4: {
        const uint8_t *row = (const uint8_t *)w->w + n * (K / 2);
        const uint8_t *s = w->s + n * (K / 32);
        for (int64_t k = 0; k < K; k += 2) {
            float sc = E8M0(s[k / 32]);
            buf[k] = di_e2m1_to_f32(row[k / 2] & 15) * sc;
            buf[k + 1] = di_e2m1_to_f32(row[k / 2] >> 4) * sc;
        }
        break;
    }
    case DI_WFMT_BF16: {
        const uint16_t *row = (const uint16_t *)w->w + n * K;
        for (int64_t k = 0; k < K; k++) buf[k] = di_bf16_to_f32(row[k]);
        break;
    }
    case DI_WFMT_F32:
        memcpy(buf, (const float *)w->w + n * K, (size_t)K * sizeof(float));
        break;
    default:
        memset(buf, 0, (size_t)K * sizeof(float));
    }
}

/* Rows [r0, r0+nr) of a weight in a format without a kernel of its own
 * (FP8/FP4 without activation quantization, i.e. bf16 mode, and the grouped
 * wo_a): their exact values are decoded 64 rows at a time into a small fp32
 * panel for the fp32 kernel, never into a copy of the whole matrix.
 * y[i, j] (row stride ldy) = x[i] · W[r0 + j]. */
static int mm_decoded(di_threadpool *tp, const di_wmat *w, int64_t r0, int64_t nr, const float *x,
                      int64_t m, float *y, int64_t ldy) {
    enum { NB = 64 };
    int64_t K = w->n_in;
    float *panel = malloc((size_t)(NB * K) * sizeof(float));
    float *yt = malloc((size_t)(m * NB) * sizeof(float));
    if (!panel || !yt) {
        free(panel);
        free(yt);
        return -1;
    }
    for (int64_t n0 = 0; n0 < nr; n0 += NB) {
        int64_t nb = nr - n0 < NB ? nr - n0 : NB;
        for (int64_t j = 0; j < nb; j++) w_row(w, r0 + n0 + j, panel + j * K);
        di_gemm_f32(x, m, K, panel, nb, yt, tp);
        for (int64_t i = 0; i < m; i++) memcpy(y + i * ldy + n0, yt + i * nb, (size_t)nb * sizeof(float));
    }
    free(panel);
    free(yt);
    return 0;
}

/* Bytes of a weight's codes (and scales) that a product reads. */
static double wmat_bytes(const di_wmat *w) {
    const double nk = (double)w->n_out * (double)w->n_in;
    switch (w->fmt) {
    case DI_WFMT_FP8: return nk * (1.0 + 1.0 / 1024);
    case DI_WFMT_FP4: return nk * (0.5 + 1.0 / 32);
    case DI_WFMT_BF16: return 2 * nk;
    default: return 4 * nk;
    }
}

/* The pool for a product of `macs` multiply-adds reading `bytes` of
 * weights, or NULL (the calling thread alone). Handing work to the pool
 * costs a few microseconds (its workers spin between a step's jobs), more
 * than a small product; but a decode row's product is bound by reading its
 * weights, ~40 µs a half MB on one core, whatever its MAC count: by MACs
 * alone (4e6) the router (bf16 384 × 5,120: 3.9 MB, 2 M MACs), wkv (FP8,
 * 2.6 MB) and the compressor's bf16 pair (5.2 MB each) ran on one thread at
 * batch 1 (bench_decode_passes on 16 threads: wq_a and wkv as two calls,
 * wkv on one thread, 0.34–0.42 ms; as one pass on the pool 0.12). */
static di_threadpool *mm_pool(di_backend *be, double macs, double bytes) {
    return macs >= 4e6 || bytes >= 512.0 * 1024 ? pool_of(be) : NULL;
}

/* Products of x on FP8 activations with n (1 or 2) weights of one format
 * (FP8 or MXFP4) and input size: x quantized once, the products in one
 * pass over the pool (di_gemm_fp8_many / di_gemm_mxfp4_many), each with
 * the bits of its own call; zeros where memory runs out. */
static void mm_quant(di_backend *be, const di_wmat *const w[2], float *const y[2], int n, const float *x,
                     int64_t m) {
    const int64_t K = w[0]->n_in;
    double macs = 0, bytes = 0;
    di_gemm_part parts[2];
    uint8_t *q = malloc((size_t)(m * K) + 1);
    float *s = malloc((size_t)(m * (K / 32) + 1) * sizeof(float));
    for (int i = 0; i < n; i++) {
        macs += (double)m * (double)w[i]->n_out * (double)K;
        bytes += wmat_bytes(w[i]);
        parts[i] = (di_gemm_part){q, s, m, w[i]->w, w[i]->s, w[i]->n_out, y[i]};
        if (!q || !s) memset(y[i], 0, (size_t)(m * w[i]->n_out) * sizeof(float));
    }
    if (q && s) {
        act_quant(be, x, m, K, q, s);
        if (w[0]->fmt == DI_WFMT_FP8) di_gemm_fp8_many(parts, n, K, mm_pool(be, macs, bytes));
        else di_gemm_mxfp4_many(parts, n, K, mm_pool(be, macs, bytes));
    }
    free(q);
    free(s);
}

static void cpu_matmul(di_backend *be, const di_wmat *w, const float *x, int64_t m, float *y,
                       unsigned flags) {
    int64_t K = w->n_in, N = w->n_out;
    di_threadpool *tp = mm_pool(be, (double)m * (double)N * (double)K, wmat_bytes(w));
    if ((flags & DI_MM_ACT_FP8) && (w->fmt == DI_WFMT_FP8 || w->fmt == DI_WFMT_FP4)) {
        mm_quant(be, (const di_wmat *const[2]){w, NULL}, (float *const[2]){y, NULL}, 1, x, m);
    } else if (w->fmt == DI_WFMT_BF16) {
        di_gemm_bf16(x, m, K, w->w, N, y, tp);
    } else if (w->fmt == DI_WFMT_F32) {
        di_gemm_f32(x, m, K, w->w, N, y, tp);
    } else if (mm_decoded(tp, w, 0, N, x, m, y, N)) {
        memset(y, 0, (size_t)(m * N) * sizeof(float));
    }
    if (flags & DI_MM_OUT_BF16)
        round_bf16_n(be, y, m * N);
}

/* backend.h matmul_pair: with FP8 activations on FP8 or MXFP4 weights, x
 * quantized once and both products in one pass over the pool (mm_quant),
 * each with matmul's bits; else matmul twice. At decode the pair
 * (attention's wq_a and wkv, 6.5 and 2.6 MB; the shared expert's w1 and
 * w3) is two small products, each of which paid a hand-off to the pool and
 * a wait for its slowest thread. */
static void cpu_matmul_pair(di_backend *be, const di_wmat *wa, const di_wmat *wb, const float *x, int64_t m,
                            float *ya, float *yb, unsigned flags) {
    const di_wfmt fmt = wa->fmt;
    if (!(flags & DI_MM_ACT_FP8) || wb->fmt != fmt || wb->n_in != wa->n_in ||
        (fmt != DI_WFMT_FP8 && fmt != DI_WFMT_FP4) || m <= 0) {
        cpu_matmul(be, wa, x, m, ya, flags);
        cpu_matmul(be, wb, x, m, yb, flags);
        return;
    }
    mm_quant(be, (const di_wmat *const[2]){wa, wb}, (float *const[2]){ya, yb}, 2, x, m);
    if (flags & DI_MM_OUT_BF16) {
        round_bf16_n(be, ya, m * wa->n_out);
        round_bf16_n(be, yb, m * wb->n_out);
    }
}

#if defined(DI_HAVE_AVX2_OPS)
/* AVX2 products over decoded weights: tasks of 8 weight rows, each decoded
 * once into a transposed panel [K, 8] and multiplied with every row of its
 * group, spread over the pool. Every output is the fused chain of
 * di_gemm_f32 (kernels.h), so the bits equal the panel path's. */
typedef struct panel_ctx {
    const di_wmat *w;
    int groups;
    int64_t rpg; /* weight rows per group */
    const float *x;
    int64_t m;
    float *y;
} panel_ctx;

/* Below 4 activation rows a panel's product is one chain of FMAs per
 * output, each waiting on the last, so PB panels go through together
 * (di_cpu_panels8_f32_avx2: the same chains side by side). */
enum { PB = 4 };

static void panel_range(void *p, int64_t lo, int64_t hi) {
    const panel_ctx *c = p;
    int64_t K = c->w->n_in, N = c->w->n_out, tpg = (c->rpg + 7) / 8;
    const int batch = c->m < 4 ? PB : 1;
    float *rows = malloc((size_t)(8 * K) * sizeof(float));
    float *pt = NULL;
    if (rows && posix_memalign((void **)&pt, 32, (size_t)(batch * 8 * K) * sizeof(float))) pt = NULL;
    for (int64_t t0 = lo; t0 < hi && pt; t0 += batch) {
        const int np = hi - t0 < batch ? (int)(hi - t0) : batch;
        const float *pts[PB], *xs[PB];
        float *ys[PB];
        int nbs[PB];
        for (int q = 0; q < np; q++) {
            const int64_t t = t0 + q, g = t / tpg, j0 = (t % tpg) * 8, r0 = g * c->rpg + j0;
            const int nb = c->rpg - j0 < 8 ? (int)(c->rpg - j0) : 8;
            float *ptq = pt + (int64_t)q * 8 * K;
            if (c->w->fmt == DI_WFMT_FP8) {
                di_cpu_fp8_panel8_avx2(c->w->w, c->w->s, K, r0, nb, ptq);
            } else {
                for (int j = 0; j < 8; j++) {
                    if (j < nb) w_row(c->w, r0 + j, rows + j * K);
                    else memset(rows + j * K, 0, (size_t)K * sizeof(float));
                }
                for (int64_t k = 0; k < K; k++)
                    for (int j = 0; j < 8; j++) ptq[k * 8 + j] = rows[j * K + k];
            }
            pts[q] = ptq, xs[q] = c->x + g * K, ys[q] = c->y + r0, nbs[q] = nb;
        }
        if (np == 1) di_cpu_panel8_f32_avx2(pts[0], K, xs[0], c->groups * K, c->m, ys[0], N, nbs[0]);
        else di_cpu_panels8_f32_avx2(np, pts, K, xs, c->groups * K, c->m, ys, N, nbs);
    }
    if (!pt) /* out of memory: zeros, as the panel path gives */
        for (int64_t t = lo; t < hi; t++) {
            int64_t g = t / tpg, j0 = (t % tpg) * 8, r0 = g * c->rpg + j0;
            int nb = c->rpg - j0 < 8 ? (int)(c->rpg - j0) : 8;
            for (int64_t i = 0; i < c->m; i++) memset(c->y + i * N + r0, 0, (size_t)nb * sizeof(float));
        }
    free(rows);
    free(pt);
}

/* FP8 weights at up to DI_FP8_F32ROWS_M activation rows
 * (DI_FP8_F32ROWS_M_NARROW without AVX-512): units of 32 weight rows (a
 * scale tile) straight from the codes
 * (di_cpu_fp8_f32rows: the panels' chains, the same bits, without
 * their decoding through memory: wo_a at one row ~5x faster on a Zen 4
 * core, 4x on 16 Xeon threads); a unit it declines (a NaN code) goes
 * through the panels. */
static void unit_range(void *p, int64_t lo, int64_t hi) {
    const panel_ctx *c = p;
    const int64_t K = c->w->n_in, N = c->w->n_out, upg = c->rpg / 32;
    for (int64_t u = lo; u < hi; u++) {
        const int64_t g = u / upg, r0 = g * c->rpg + (u % upg) * 32;
        if (di_cpu_fp8_f32rows(c->w->w, c->w->s, K, N, r0, c->x + g * K, c->groups * K, c->m, c->y + r0, N)) {
            const int64_t t0 = g * (c->rpg / 8) + (u % upg) * 4; /* its four panels of 8 rows */
            panel_range(p, t0, t0 + 4);
        }
    }
}

static atomic_int f32rows_forced_off;
void di_backend_cpu_force_no_f32rows(int on) { atomic_store(&f32rows_forced_off, on != 0); }

static void mm_panels(di_backend *be, const di_wmat *w, int groups, const float *x, int64_t m,
                      float *y) {
    int64_t rpg = w->n_out / groups, tasks = groups * ((rpg + 7) / 8);
    panel_ctx c = {w, groups, rpg, x, m, y};
    double work = (double)(m + 8) * (double)w->n_out * (double)w->n_in;
    void (*range)(void *, int64_t, int64_t) = panel_range;
    const int units_m = di_cpu_kernels_wide() ? DI_FP8_F32ROWS_M : DI_FP8_F32ROWS_M_NARROW;
    if (w->fmt == DI_WFMT_FP8 && m >= 1 && m <= units_m && rpg % 32 == 0 && w->n_in % 64 == 0 &&
        !atomic_load(&f32rows_forced_off)) {
        range = unit_range;
        tasks = groups * (rpg / 32);
    }
    if (!mm_pool(be, work, wmat_bytes(w))) /* as cpu_matmul */
        range(&c, 0, tasks);
    else
        par_for(be, tasks, work, range, &c);
}
#endif

/* Group g of x [m, groups, K] times rows g·R .. g·R+R-1 of the weight. */
static void cpu_matmul_grouped(di_backend *be, const di_wmat *w, int groups, const float *x,
                               int64_t m, float *y) {
    int64_t K = w->n_in, N = w->n_out, R = N / groups;
#if defined(DI_HAVE_AVX2_OPS)
    if (ops_avx2()) {
        mm_panels(be, w, groups, x, m, y);
        round_bf16_n(be, y, m * N);
        return;
    }
#endif
    di_threadpool *tp = mm_pool(be, (double)m * (double)N * (double)K, wmat_bytes(w));
    float *xg = malloc((size_t)(m * K) * sizeof(float));
    if (!xg) {
        memset(y, 0, (size_t)(m * N) * sizeof(float));
        return;
    }
    for (int g = 0; g < groups; g++) {
        for (int64_t i = 0; i < m; i++)
            memcpy(xg + i * K, x + (i * groups + g) * K, (size_t)K * sizeof(float));
        if (mm_decoded(tp, w, g * R, R, xg, m, y + g * R, N))
            for (int64_t i = 0; i < m; i++) memset(y + i * N + g * R, 0, (size_t)R * sizeof(float));
    }
    free(xg);
    round_bf16_n(be, y, m * N);
}

/* ------------------------------------------------------------ elementwise */

static float tensor_f32(const di_tensor *t, int64_t i) {
    if (t->dtype == DI_DTYPE_BF16) return di_bf16_to_f32(((const uint16_t *)t->data)[i]);
    if (t->dtype == DI_DTYPE_F32) return ((const float *)t->data)[i];
    return 0.f;
}

typedef struct norm_ctx {
    const float *x;
    const di_tensor *w;
    int64_t n;
    double eps;
    float *y;
} norm_ctx;

/* Each row's sum of squares is one sequential chain (docs/numerics.md),
 * ~4 cycles an element on its own; the AVX2 form runs 8 rows' chains side
 * by side (the same bits), and the scaling of a row on 8 lanes. */
static void norm_range(void *p, int64_t lo, int64_t hi) {
    const norm_ctx *c = p;
    int64_t n = c->n;
    float *wf = malloc((size_t)n * sizeof(float)); /* the weight widened once per range */
    for (int64_t k = 0; wf && k < n; k++) wf[k] = tensor_f32(c->w, k);
    int64_t i = lo;
#if defined(DI_HAVE_AVX2_OPS)
    if (ops_avx2() && wf) {
        for (; i + 8 <= hi; i += 8) {
            float ss[8];
            di_cpu_sumsq_rows8_avx2(c->x + i * n, n, n, ss);
            for (int r = 0; r < 8; r++)
                di_cpu_norm_scale_avx2(c->x + (i + r) * n, wf, n, 1.0f / sqrtf(ss[r] / (float)n + (float)c->eps),
                                       c->y + (i + r) * n);
        }
    }
#endif
    for (; i < hi; i++) {
        const float *xi = c->x + i * n;
        float ss = 0.f;
        for (int64_t k = 0; k < n; k++) { /* the square rounded, then added: no contraction into an FMA */
            const float q = xi[k] * xi[k];
            ss = ss + q;
        }
        float r = 1.0f / sqrtf(ss / (float)n + (float)c->eps);
        for (int64_t k = 0; k < n; k++)
            c->y[i * n + k] = di_round_bf16((wf ? wf[k] : tensor_f32(c->w, k)) * (xi[k] * r));
    }
    free(wf);
}

static void cpu_rmsnorm(di_backend *be, const float *x, const di_tensor *w, int64_t m, int64_t n,
                        double eps, float *y) {
    norm_ctx c = {x, w, n, eps, y};
    par_for(be, m, (double)m * (double)n * 8, norm_range, &c);
}

/* The angles' cosines and sines depend on the row and pair only, so they
 * are computed once per row for all heads. */
/* Rotates pairs j0 .. j0+nj-1 of every head of one row by cs (cos, sin of
 * each pair's angle; the sine negated for the inverse). */
static void rope_rotate(float *row, int heads, int64_t hd, int64_t rd, int64_t j0, int64_t nj,
                        const float *cs, int inverse) {
    for (int h = 0; h < heads; h++) {
        float *v = row + h * hd + (hd - rd) + 2 * j0;
        for (int64_t j = 0; j < nj; j++) {
            float c = cs[2 * j], s = inverse ? -cs[2 * j + 1] : cs[2 * j + 1];
            float re = v[2 * j], im = v[2 * j + 1];
            v[2 * j] = di_round_bf16(re * c - im * s);
            v[2 * j + 1] = di_round_bf16(re * s + im * c);
        }
    }
}

/* Rows are rotated independently: the rope ops split them over the pool
 * (each row's arithmetic unchanged, so any split gives the same bits). */
typedef struct rope_ctx {
    float *x;
    int64_t stride, hd, rd;
    int heads, inverse;
    const int32_t *pos; /* rope: positions and frequencies */
    const float *freq;
    const float *cs;    /* rope_cs: each row's cosines and sines */
} rope_ctx;

static void rope_range(void *p, int64_t lo, int64_t hi) {
    const rope_ctx *c = p;
    enum { CH = 128 };
    float cs[2 * CH]; /* cos, sin of pairs j0 .. j0+CH-1 */
    for (int64_t i = lo; i < hi; i++) {
        for (int64_t j0 = 0; j0 < c->rd / 2; j0 += CH) {
            int64_t nj = c->rd / 2 - j0 < CH ? c->rd / 2 - j0 : CH;
            di_rope_angles(c->pos + i, 1, c->freq + j0, nj, cs);
            rope_rotate(c->x + i * c->stride, c->heads, c->hd, c->rd, j0, nj, cs, c->inverse);
        }
    }
}

static void cpu_rope(di_backend *be, float *x, int64_t m, int64_t stride, int heads, int64_t hd,
                     int64_t rd, const int32_t *pos, const float *freq, int inverse) {
    rope_ctx c = {.x = x, .stride = stride, .hd = hd, .rd = rd, .heads = heads, .inverse = inverse,
                  .pos = pos, .freq = freq};
    par_for(be, m, (double)m * (double)(heads * rd + rd * 20), rope_range, &c);
}

static void rope_cs_range(void *p, int64_t lo, int64_t hi) {
    const rope_ctx *c = p;
    for (int64_t i = lo; i < hi; i++)
        rope_rotate(c->x + i * c->stride, c->heads, c->hd, c->rd, 0, c->rd / 2, c->cs + i * c->rd, c->inverse);
}

/* rope with the angles' cosines and sines given (backend.h rope_cs). */
static void cpu_rope_cs(di_backend *be, float *x, int64_t m, int64_t stride, int heads,
                        int64_t hd, int64_t rd, const float *cs, int inverse) {
    rope_ctx c = {.x = x, .stride = stride, .hd = hd, .rd = rd, .heads = heads, .inverse = inverse, .cs = cs};
    par_for(be, m, (double)m * (double)(heads * rd) * 2, rope_cs_range, &c);
}

/* The quantize-dequantize steps work block by block (32 values for FP8 and
 * the indexer's FP4, 16 for the FP4 cache's): blocks split over the pool. */
typedef struct qdq_ctx {
    float *x;
    int bl, e4m3;
} qdq_ctx;

static void qdq_fp8_range(void *p, int64_t lo, int64_t hi) {
    const qdq_ctx *c = p;
    di_act_qdq_fp8(c->x + lo * c->bl, (hi - lo) * c->bl, c->x + lo * c->bl);
}

static void cpu_qdq_fp8(di_backend *be, float *x, int64_t n) {
    qdq_ctx c = {.x = x, .bl = 32};
    par_for(be, n / c.bl, (double)n * 8, qdq_fp8_range, &c);
}

static void qdq_fp4_range(void *p, int64_t lo, int64_t hi) {
    const qdq_ctx *c = p;
#if defined(DI_HAVE_AVX2_OPS)
    if (ops_avx2()) {
        di_cpu_qdq_fp4_avx2(c->x + lo * c->bl, hi - lo, c->bl, c->e4m3);
        return;
    }
#endif
    for (int64_t b = lo; b < hi; b++) di_cpu_qdq_fp4(c->x + b * c->bl, c->bl, c->e4m3);
}

static void cpu_qdq_fp4_e8m0(di_backend *be, float *x, int64_t n) {
    qdq_ctx c = {.x = x, .bl = 32, .e4m3 = 0};
    par_for(be, n / 32, (double)n * 10, qdq_fp4_range, &c);
}

static void cpu_qdq_fp4_e4m3(di_backend *be, float *x, int64_t n) {
    qdq_ctx c = {.x = x, .bl = 16, .e4m3 = 1};
    par_for(be, n / 16, (double)n * 10, qdq_fp4_range, &c);
}

static void cpu_round_bf16(di_backend *be, float *x, int64_t n) {
    round_bf16_n(be, x, n);
}

static void cpu_scale_bf16(di_backend *be, float *x, int64_t n, float c) {
    (void)be;
#if defined(DI_HAVE_AVX2_OPS)
    if (ops_avx2()) {
        di_cpu_scale_bf16_avx2(x, n, c);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) x[i] = di_round_bf16(x[i] * c);
}

/* ------------------------------------------------------------ gathers */

static void cpu_embed(di_backend *be, const di_tensor *table, const int32_t *ids, int64_t m,
                      float *out) {
    (void)be;
    int64_t n = table->shape[1];
    for (int64_t i = 0; i < m; i++)
        for (int64_t k = 0; k < n; k++) out[i * n + k] = tensor_f32(table, (int64_t)ids[i] * n + k);
}

/* One Engram row: eh FP8 codes r with E8M0 scales s per 32 → bf16 values. */
static void engram_row(float *o, const uint8_t *r, const uint8_t *s, int64_t eh) {
    const float *e4m3 = di_cpu_e4m3_table();
    for (int64_t k = 0; k < eh; k++) o[k] = di_round_bf16(e4m3[r[k]] * E8M0(s[k / 32]));
}

static void cpu_engram_gather(di_backend *be, const di_tensor *rows, const di_tensor *scales,
                              const int32_t *ids, int64_t m, int ncols, float *out) {
    (void)be;
    int64_t eh = rows->shape[1], nb = scales->shape[1];
    const uint8_t *r = rows->data, *s = scales->data;
    for (int64_t i = 0; i < m * ncols; i++) {
        int64_t row = ids[i];
        engram_row(out + i * eh, r + row * eh, s + row * nb, eh);
    }
}

/* backend.h engram_rows: the rows already gathered. */
static void cpu_engram_rows(di_backend *be, const uint8_t *rows, const uint8_t *scales, int64_t n,
                            int64_t eh, int64_t nb, float *out) {
    (void)be;
    for (int64_t i = 0; i < n; i++) engram_row(out + i * eh, rows + i * eh, scales + i * nb, eh);
}

/* ------------------------------------------------------------ mHC */

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

typedef struct mix_ctx {
    const float *s, *fn, *base, *scale;
    int hc;
    int64_t d;
    double norm_eps, hc_eps;
    int iters;
    float *pre, *post, *comb;
} mix_ctx;

/* Sinkhorn of one comb matrix [hc, hc]: a column normalisation, then
 * `iters - 1` rounds of row + column normalisation (the AVX2 form runs
 * the same steps with 8 matrices side by side in the lanes). */
static void sinkhorn(float *c, int hc, float eps, int iters) {
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int a = 0; a < hc; a++) {
                float sum = 0.f;
                for (int b = 0; b < hc; b++) sum += c[a * hc + b];
                for (int b = 0; b < hc; b++) c[a * hc + b] /= sum + eps;
            }
        for (int b = 0; b < hc; b++) {
            float sum = 0.f;
            for (int a = 0; a < hc; a++) sum += c[a * hc + b];
            for (int a = 0; a < hc; a++) c[a * hc + b] /= sum + eps;
        }
    }
}

/* Row i's gates from its projections mix [nmix] and its sum of squares
 * ss; comb gets the row softmax, not yet the Sinkhorn rounds. */
static void mix_gates(const mix_ctx *x, int64_t i, float *mix, float ss) {
    int hc = x->hc;
    int64_t n = (int64_t)hc * x->d;
    int nmix = (2 + hc) * hc;
    float eps = (float)x->hc_eps;
    const float *scale = x->scale, *base = x->base;
    float r = 1.0f / sqrtf(ss / (float)n + (float)x->norm_eps);
    for (int o = 0; o < nmix; o++) mix[o] = mix[o] * r;
    float *pr = x->pre + i * hc, *po = x->post + i * hc, *c = x->comb + i * hc * hc;
    for (int k = 0; k < hc; k++) {
        pr[k] = sigmoidf_(mix[k] * scale[0] + base[k]) + eps;
        po[k] = 2.0f * sigmoidf_(mix[hc + k] * scale[1] + base[hc + k]);
    }
    for (int k = 0; k < hc * hc; k++) c[k] = mix[2 * hc + k] * scale[2] + base[2 * hc + k];
    for (int a = 0; a < hc; a++) { /* row softmax + eps */
        float mx = c[a * hc];
        for (int b = 1; b < hc; b++) mx = fmaxf(mx, c[a * hc + b]);
        float sum = 0.f;
        for (int b = 0; b < hc; b++) {
            c[a * hc + b] = expf(c[a * hc + b] - mx);
            sum += c[a * hc + b];
        }
        for (int b = 0; b < hc; b++) c[a * hc + b] = c[a * hc + b] / sum + eps;
    }
}

/* Blocks of up to 8 rows: their sums of squares side by side (each row's
 * chain still in k order), the projections Σ_k u[k]·fn[o,k] 4 rows at a
 * time (the AVX2 form shares each weight load between them), the gates,
 * then the Sinkhorn rounds of the block. */
static void mix_range(void *p, int64_t lo, int64_t hi) {
    enum { RB = 8 };
    const mix_ctx *x = p;
    int hc = x->hc;
    int64_t n = (int64_t)hc * x->d;
    int nmix = (2 + hc) * hc;
    float mix[RB][(2 + 16) * 16];
    float eps = (float)x->hc_eps;
    int vec = ops_avx2();
    for (int64_t i0 = lo; i0 < hi; i0 += RB) {
        int R = hi - i0 < RB ? (int)(hi - i0) : RB;
        const float *u0 = x->s + i0 * n;
        float ss[RB] = {0};
        if (!vec) /* the AVX2 projections run these chains beside theirs */
            for (int64_t k = 0; k < n; k++)
                for (int r = 0; r < R; r++) ss[r] += u0[r * n + k] * u0[r * n + k];
        for (int r0 = 0; r0 < R; r0 += 4) {
#if defined(DI_HAVE_AVX2_OPS)
            if (vec) {
                float tmp[4 * (2 + 16) * 16];
                int rr = R - r0 < 4 ? R - r0 : 4;
                di_cpu_hc_project_avx2(u0 + r0 * n, n, rr, n, x->fn, nmix, tmp, ss + r0);
                for (int r = 0; r < rr; r++) memcpy(mix[r0 + r], tmp + r * nmix, (size_t)nmix * sizeof(float));
                continue;
            }
#endif
            for (int r = r0; r < R && r < r0 + 4; r++)
                for (int o = 0; o < nmix; o++) {
                    const float *u = u0 + r * n, *f = x->fn + (int64_t)o * n;
                    float acc = 0.f;
                    for (int64_t k = 0; k < n; k++) acc += u[k] * f[k];
                    mix[r][o] = acc;
                }
        }
        for (int r = 0; r < R; r++) mix_gates(x, i0 + r, mix[r], ss[r]);
        float *c = x->comb + i0 * hc * hc;
#if defined(DI_HAVE_AVX2_OPS)
        if (vec) {
            di_cpu_hc_sinkhorn_avx2(c, R, hc, eps, x->iters);
            continue;
        }
#endif
        for (int r = 0; r < R; r++) sinkhorn(c + r * hc * hc, hc, eps, x->iters);
    }
}

/* Far fewer rows than threads (decode): a row a thread left one core to
 * walk the row's (2 + hc)·hc projections over hc·d inputs, each a chain
 * of dependent adds (~0.29 ms a call at one row on a 16-thread Xeon, twice
 * a layer; a chain of 20,480 adds alone is ~27 µs there). Where every
 * piece gets a thread of its own, each row's work is split: task 0 its sum
 * of squares, task 1 + q its outputs 2q and 2q + 1 (two chains side by
 * side), every chain the scalar one in k order; then the gates and the
 * Sinkhorn rounds of each row on the calling thread. The same bits
 * (test_cpu_ops). With fewer threads the rows' AVX2 form stays ahead
 * (one row on one Zen 4 core: 0.16 ms, split over two threads 0.22), so
 * there a row's outputs go in slices of that form instead, one a thread
 * (mix_parts_range: one row of 24 × 8,192 on two threads of the 2-vCPU
 * Xeon VM 23 µs against 26 with the weights in cache; the 1 GB dummy's
 * decode, weights from DRAM, 1.0 against 1.6 ms of hc_mix a token). */
enum { MIX_OUT = 2 };
typedef struct mix_split {
    const mix_ctx *x;
    int tasks;   /* a row's: 1 + ceil(nmix / MIX_OUT) */
    float *mix;  /* [m][nmix] */
    float *ss;   /* [m] */
} mix_split;

static void mix_split_range(void *p, int64_t lo, int64_t hi) {
    const mix_split *c = p;
    const mix_ctx *x = c->x;
    const int hc = x->hc, nmix = (2 + hc) * hc;
    const int64_t n = (int64_t)hc * x->d;
    for (int64_t t = lo; t < hi; t++) {
        const int64_t i = t / c->tasks;
        const int q = (int)(t % c->tasks);
        const float *u = x->s + i * n;
        if (q == 0) {
            float ss = 0.f;
            for (int64_t k = 0; k < n; k++) ss += u[k] * u[k];
            c->ss[i] = ss;
            continue;
        }
        const int o0 = (q - 1) * MIX_OUT, no = nmix - o0 < MIX_OUT ? nmix - o0 : MIX_OUT;
        const float *f[MIX_OUT];
        float acc[MIX_OUT] = {0.f, 0.f};
        for (int j = 0; j < MIX_OUT; j++) f[j] = x->fn + (int64_t)(o0 + (j < no ? j : 0)) * n;
        for (int64_t k = 0; k < n; k++)
            for (int j = 0; j < MIX_OUT; j++) acc[j] += u[k] * f[j][k];
        for (int j = 0; j < no; j++) c->mix[i * nmix + o0 + j] = acc[j];
    }
}

/* Fewer rows than threads, too few threads for mix_split: each row's
 * outputs in `tasks` slices through the AVX2 projections (the first slice
 * also the row's sum of squares), each output's chain the same. */
static void mix_parts_range(void *p, int64_t lo, int64_t hi) {
#if defined(DI_HAVE_AVX2_OPS)
    const mix_split *c = p;
    const mix_ctx *x = c->x;
    const int hc = x->hc, nmix = (2 + hc) * hc, per = (nmix + c->tasks - 1) / c->tasks;
    const int64_t n = (int64_t)hc * x->d;
    for (int64_t t = lo; t < hi; t++) {
        const int64_t i = t / c->tasks;
        const int o0 = (int)(t % c->tasks) * per, no = nmix - o0 < per ? nmix - o0 : per;
        if (no > 0)
            di_cpu_hc_project_avx2(x->s + i * n, n, 1, n, x->fn + (int64_t)o0 * n, no, c->mix + i * nmix + o0,
                                   o0 == 0 ? c->ss + i : NULL);
    }
#else
    (void)p, (void)lo, (void)hi;
#endif
}

static void cpu_hc_mix(di_backend *be, const float *s, int64_t m, int hc, int64_t d,
                       const float *fn, const float *base, const float *scale, double norm_eps,
                       double hc_eps, int iters, float *pre, float *post, float *comb) {
    mix_ctx x = {s, fn, base, scale, hc, d, norm_eps, hc_eps, iters, pre, post, comb};
    const double work = (double)m * (2 + hc) * hc * hc * (double)d;
    const int nmix = (2 + hc) * hc, threads = pool_of(be) ? di_threadpool_size(pool_of(be)) : 1;
    const int split = 1 + (nmix + MIX_OUT - 1) / MIX_OUT, vparts = ops_avx2() && m < threads ? (int)(threads / m) : 1;
    const int tasks = m * split <= threads ? split : vparts < nmix / 8 ? vparts : nmix / 8;
    /* the slices' work: four units a multiply-add, as they transpose the
     * weights on the way (one row of 24 × 8,192 takes 26 µs on one core:
     * worth two threads) */
    const double twork = tasks == split ? work : 4 * work;
    if (m >= 1 && tasks > 1 && twork >= 2e5) {
        mix_split c = {&x, tasks, malloc(sizeof(float) * (size_t)(m * nmix)), malloc(sizeof(float) * (size_t)m)};
        if (c.mix && c.ss) {
            par_for(be, m * c.tasks, twork, tasks == split ? mix_split_range : mix_parts_range, &c);
            for (int64_t i = 0; i < m; i++) {
                mix_gates(&x, i, c.mix + i * nmix, c.ss[i]);
                sinkhorn(comb + i * hc * hc, hc, (float)hc_eps, iters);
            }
            free(c.mix), free(c.ss);
            return;
        }
        free(c.mix), free(c.ss);
    }
    par_for(be, m, work, mix_range, &x);
}

/* The stream ops run row-parallel; each row's channels go through the
 * AVX2 forms (cpu_ops_avx2.h) or the loops below, which state the order. */
typedef struct hc_ctx {
    const float *s, *w, *y, *post, *comb;
    int hc;
    int64_t d, out_stride;
    float *out;
} hc_ctx;

static void collapse_range(void *p, int64_t lo, int64_t hi) {
    const hc_ctx *c = p;
    int hc = c->hc;
    int64_t d = c->d;
    for (int64_t i = lo; i < hi; i++) {
        const float *s = c->s + i * hc * d, *w = c->w + i * hc;
#if defined(DI_HAVE_AVX2_OPS)
        if (ops_avx2()) {
            di_cpu_hc_collapse_avx2(s, w, hc, d, c->out + i * d);
            continue;
        }
#endif
        for (int64_t k = 0; k < d; k++) {
            float acc = 0.f;
            for (int j = 0; j < hc; j++) acc += w[j] * s[j * d + k];
            c->out[i * d + k] = di_round_bf16(acc);
        }
    }
}

static void cpu_hc_collapse(di_backend *be, const float *s, const float *w, int64_t m, int hc,
                            int64_t d, float *y) {
    hc_ctx c = {s, w, NULL, NULL, NULL, hc, d, d, y};
    par_for(be, m, (double)m * hc * (double)d * 2, collapse_range, &c);
}

/* backend.h's hc_collapse_norm, as the composition it is defined by. */
static void cpu_hc_collapse_norm(di_backend *be, const float *s, const float *w, int64_t m,
                                 int hc, int64_t d, const di_tensor *nw, double eps, float *y) {
    cpu_hc_collapse(be, s, w, m, hc, d, y);
    cpu_rmsnorm(be, y, nw, m, d, eps, y);
}

/* The forward expands in place (out = s): the AVX2 form reads every
 * stream's channels of a group before it writes theirs, so it writes out
 * directly; the loops go through tmp. */
static void expand_range(void *p, int64_t lo, int64_t hi) {
    const hc_ctx *c = p;
    int hc = c->hc;
    int64_t d = c->d;
#if defined(DI_HAVE_AVX2_OPS)
    if (ops_avx2() && hc <= DI_HC_EXPAND_MAX) {
        for (int64_t i = lo; i < hi; i++)
            di_cpu_hc_expand_avx2(c->y + i * d, c->s + i * hc * d, c->post + i * hc, c->comb + i * hc * hc, hc, d,
                                  c->out + i * hc * d);
        return;
    }
#endif
    float *tmp = malloc((size_t)(hc * d) * sizeof(float));
    if (!tmp) return;
    for (int64_t i = lo; i < hi; i++) {
        const float *cb = c->comb + i * hc * hc, *s = c->s + i * hc * d, *y = c->y + i * d;
        const float *post = c->post + i * hc;
        for (int b = 0; b < hc; b++)
            for (int64_t k = 0; k < d; k++) {
                float acc = 0.f;
                for (int a = 0; a < hc; a++) acc += cb[a * hc + b] * s[a * d + k];
                tmp[b * d + k] = di_round_bf16(post[b] * y[k] + acc);
            }
        memcpy(c->out + i * hc * d, tmp, (size_t)(hc * d) * sizeof(float));
    }
    free(tmp);
}

static void cpu_hc_expand(di_backend *be, const float *y, const float *s, const float *post,
                          const float *comb, int64_t m, int hc, int64_t d, float *out) {
    hc_ctx c = {s, NULL, y, post, comb, hc, d, hc * d, out};
    par_for(be, m, (double)m * hc * hc * (double)d * 2, expand_range, &c);
}

static void mean_range(void *p, int64_t lo, int64_t hi) {
    const hc_ctx *c = p;
    int hc = c->hc;
    int64_t d = c->d;
    for (int64_t i = lo; i < hi; i++) {
        const float *s = c->s + i * hc * d;
        float *o = c->out + i * c->out_stride;
#if defined(DI_HAVE_AVX2_OPS)
        if (ops_avx2()) {
            di_cpu_hc_mean_avx2(s, hc, d, o);
            continue;
        }
#endif
        for (int64_t k = 0; k < d; k++) {
            float acc = 0.f;
            for (int j = 0; j < hc; j++) acc += s[j * d + k];
            o[k] = di_round_bf16(acc / (float)hc);
        }
    }
}

static void cpu_hc_mean(di_backend *be, const float *s, int64_t m, int hc, int64_t d, float *out,
                        int64_t out_stride) {
    hc_ctx c = {s, NULL, NULL, NULL, NULL, hc, d, out_stride, out};
    par_for(be, m, (double)m * hc * (double)d, mean_range, &c);
}

/* ------------------------------------------------------------ Engram */

/* Rows are independent: over the pool by rows, the gate weights' products
 * qw·kw widened once a range (the values tensor_f32 gives, multiplied as
 * the loop did). */
typedef struct engram_gate_ctx {
    float *s;
    const float *kv;
    const di_tensor *qw, *kw;
    int hc;
    int64_t d;
    double eps;
} engram_gate_ctx;

static void engram_gate_range(void *p, int64_t lo, int64_t hi) {
    const engram_gate_ctx *g = p;
    const int hc = g->hc;
    const int64_t d = g->d;
    float *s = g->s;
    const float *kv = g->kv;
    const double eps = g->eps;
    float inv_sqrt_d = (float)(1.0 / sqrt((double)d));
    float *wgts = malloc((size_t)(hc * d) * sizeof(float));
    for (int64_t k = 0; wgts && k < hc * d; k++) wgts[k] = tensor_f32(g->qw, k) * tensor_f32(g->kw, k);
    for (int64_t i = lo; i < hi; i++) {
        const float *value = kv + (i * (hc + 1) + hc) * d;
        for (int c = 0; c < hc; c++) {
            float *h = s + (i * hc + c) * d;
            const float *key = kv + (i * (hc + 1) + c) * d;
            float sh = 0.f, sk = 0.f, dot = 0.f;
            for (int64_t k = 0; k < d; k++) {
                sh += h[k] * h[k];
                sk += key[k] * key[k];
                float wgt = wgts ? wgts[c * d + k] : tensor_f32(g->qw, c * d + k) * tensor_f32(g->kw, c * d + k);
                dot += h[k] * wgt * key[k];
            }
            float rstd = (1.0f / sqrtf(sh / (float)d + (float)eps)) *
                         (1.0f / sqrtf(sk / (float)d + (float)eps));
            dot = dot * rstd * inv_sqrt_d;
            float a = sqrtf(fmaxf(fabsf(dot), 1e-6f));
            float gate = sigmoidf_(copysignf(a, dot));
            for (int64_t k = 0; k < d; k++) h[k] = di_round_bf16(h[k] + gate * value[k]);
        }
    }
    free(wgts);
}

static void cpu_engram_gate(di_backend *be, float *s, const float *kv, const di_tensor *qw,
                            const di_tensor *kw, int64_t m, int hc, int64_t d, double eps) {
    engram_gate_ctx g = {s, kv, qw, kw, hc, d, eps};
    par_for(be, m, (double)m * hc * (double)d * 12, engram_gate_range, &g);
}

/* ------------------------------------------------------------ attention */

static void cpu_compress_pool(di_backend *be, const float *a, const float *g, int64_t m, int r,
                              int64_t n, float *out) {
    (void)be;
    for (int64_t i = 0; i < m; i++)
        for (int64_t k = 0; k < n; k++) {
            const float *gi = g + i * r * n + k, *ai = a + i * r * n + k;
            float mx = -INFINITY, sum = 0.f, acc = 0.f;
            for (int t = 0; t < r; t++) mx = fmaxf(mx, gi[t * n]);
            for (int t = 0; t < r; t++) sum += expf(gi[t * n] - mx);
            for (int t = 0; t < r; t++) acc += ai[t * n] * (expf(gi[t * n] - mx) / sum);
            out[i * n + k] = di_round_bf16(acc);
        }
}

typedef struct attn_ctx {
    const float *q;
    int h;
    int64_t d;
    const di_kvrow *rows;        /* fp32 rows (sparse_attn) */
    const uint8_t *const *prows; /* packed rows (sparse_attn_kv) */
    int n_slots, n_win;
    const float *sink;
    float scale;
    float *out;
    const di_attn_rows *tabs;    /* row tables (sparse_attn_rows), else NULL */
} attn_ctx;

/* Scratch floats attn_row needs: acc [h, d], scores [h, 64], dots
 * [h, 8], running max and sum [h] each. */
static size_t attn_scratch_bytes(const attn_ctx *c) {
    return (size_t)c->h * (size_t)(c->d + 64 + 8 + 2) * sizeof(float);
}

#if defined(DI_HAVE_AVX2_OPS)
/* attn_row with the heads side by side: the slot·q dot products of 8
 * slots for every head at once (one transposed tile of the rows), then
 * each head's softmax steps exactly as below, with P·V and the rescale in
 * AVX2 lanes over the d channels. */
static void attn_row_avx2(const attn_ctx *c, int64_t i, int h0, int h1, const float *const *rows, float *scr) {
    int64_t d = c->d;
    const int h = h1 - h0; /* the heads of this call: h0 + hh */
    float *acc = scr, *sc = acc + h * d, *dots = sc + h * 64, *mx = dots + h * 8, *sum = mx + h;
    const float *q = c->q + (i * c->h + h0) * d;
    memset(acc, 0, (size_t)(h * d) * sizeof(float));
    for (int hh = 0; hh < h; hh++) {
        mx[hh] = -1e30f;
        sum[hh] = 0.f;
    }
    for (int b0 = 0; b0 < c->n_slots; b0 += 64) {
        int b1 = b0 + 64 < c->n_slots ? b0 + 64 : c->n_slots;
        for (int j0 = b0; j0 < b1; j0 += 8) {
            const float *r8[8];
            for (int u = 0; u < 8; u++) r8[u] = j0 + u < b1 && rows[j0 + u] ? rows[j0 + u] : q;
            di_cpu_dots8_avx2(q, h, d, r8, dots);
            for (int hh = 0; hh < h; hh++)
                for (int u = 0; u < 8 && j0 + u < b1; u++)
                    sc[hh * 64 + j0 + u - b0] = rows[j0 + u] ? dots[hh * 8 + u] * c->scale : -INFINITY;
        }
        for (int hh = 0; hh < h; hh++) {
            const float *sch = sc + hh * 64;
            float *acch = acc + hh * d;
            float bmax = -INFINITY;
            for (int j = b0; j < b1; j++)
                if (rows[j]) bmax = fmaxf(bmax, sch[j - b0]);
            float nmx = fmaxf(mx[hh], bmax);
            float rescale = expf(mx[hh] - nmx);
            float psum = 0.f, pb[64];
            for (int j = b0; j < b1; j++) {
                if (!rows[j]) continue;
                float pj = expf(sch[j - b0] - nmx);
                psum += pj;
                pb[j - b0] = di_round_bf16(pj);
            }
            di_cpu_pv_avx2(acch, rescale, pb, rows + b0, b1 - b0, d);
            sum[hh] = sum[hh] * rescale + psum;
            mx[hh] = nmx;
        }
    }
    for (int hh = 0; hh < h; hh++) {
        float s = sum[hh] + expf(c->sink[h0 + hh] - mx[hh]);
        di_cpu_div_bf16_avx2(acc + hh * d, s, d, c->out + (i * c->h + h0 + hh) * d);
    }
}
#endif

/* Attention of heads [h0, h1) of one query row over its n_slots rows:
 * online softmax over blocks of 64 slots with the probabilities rounded to
 * bf16 before P·V and fp32 in the denominator (§5.5). Each head's steps
 * are its own (the AVX2 form's dot products of several heads at once add
 * each head's terms in the same order whatever the heads beside it), so
 * any split of the heads gives the same bits. acc (attn_scratch_bytes) is
 * scratch. */
static void attn_row(const attn_ctx *c, int64_t i, int h0, int h1, const float *const *rows, float *acc) {
    int64_t d = c->d;
#if defined(DI_HAVE_AVX2_OPS)
    if (d % 8 == 0 && ops_avx2()) {
        attn_row_avx2(c, i, h0, h1, rows, acc);
        return;
    }
#endif
    for (int hh = h0; hh < h1; hh++) {
        const float *q = c->q + (i * c->h + hh) * d;
        float mx = -1e30f, sum = 0.f;
        memset(acc, 0, (size_t)d * sizeof(float));
        for (int b0 = 0; b0 < c->n_slots; b0 += 64) {
            int b1 = b0 + 64 < c->n_slots ? b0 + 64 : c->n_slots;
            float sc[64];
            float bmax = -INFINITY;
            for (int j = b0; j < b1; j++) {
                if (!rows[j]) {
                    sc[j - b0] = -INFINITY;
                    continue;
                }
                float dot = 0.f;
                for (int64_t k = 0; k < d; k++) dot += q[k] * rows[j][k];
                sc[j - b0] = dot * c->scale;
                bmax = fmaxf(bmax, sc[j - b0]);
            }
            float nmx = fmaxf(mx, bmax);
            float rescale = expf(mx - nmx);
            float psum = 0.f;
            for (int64_t k = 0; k < d; k++) acc[k] *= rescale;
            for (int j = b0; j < b1; j++) {
                if (!rows[j]) continue;
                float pj = expf(sc[j - b0] - nmx);
                psum += pj;
                float pb = di_round_bf16(pj);
                for (int64_t k = 0; k < d; k++) acc[k] += pb * rows[j][k];
            }
            sum = sum * rescale + psum;
            mx = nmx;
        }
        sum += expf(c->sink[hh] - mx);
        float *o = c->out + (i * c->h + hh) * d;
        for (int64_t k = 0; k < d; k++) o[k] = di_round_bf16(acc[k] / sum);
    }
}

static void attn_range(void *p, int64_t lo, int64_t hi) {
    attn_ctx *c = p;
    float *acc = malloc(attn_scratch_bytes(c));
    if (!acc) return;
    for (int64_t i = lo; i < hi; i++) attn_row(c, i, 0, c->h, c->rows + i * c->n_slots, acc);
    free(acc);
}

/* Row i's packed row pointers from the tables of sparse_attn_rows, into
 * out [n_win + n_sel] (backend memory is host memory here). */
static const uint8_t *const *attn_rows_of(const di_attn_rows *t, int64_t i, const uint8_t **out) {
    const int32_t *win = t->win + i * t->n_win;
    for (int j = 0; j < t->n_win; j++)
        out[j] = win[j] >= 0    ? t->ring[i] + (size_t)win[j] * t->win_bytes
                 : win[j] <= -2 ? t->chunk + (size_t)(-2 - win[j]) * t->win_bytes
                                : NULL;
    const int32_t *sel = t->sel ? t->sel + i * t->n_sel : NULL;
    for (int j = 0; j < t->n_sel; j++)
        out[t->n_win + j] = sel[j] >= 0 ? t->cache[i] + (size_t)sel[j] * t->cache_bytes : NULL;
    return out;
}

/* Packed rows: each query's rows are decoded once into a working set
 * [n_slots, d] and then read by every head, so the decoding costs 1/h of
 * the attention and the arithmetic is that of the fp32 op. */
static void attn_kv_range(void *p, int64_t lo, int64_t hi) {
    attn_ctx *c = p;
    int64_t d = c->d;
    float *acc = malloc(attn_scratch_bytes(c));
    float *ws = malloc((size_t)(c->n_slots * d) * sizeof(float));
    const float **rows = malloc((size_t)c->n_slots * sizeof(float *));
    const uint8_t **tab = c->tabs ? malloc((size_t)c->n_slots * sizeof(uint8_t *)) : NULL;
    if (acc && ws && rows && (tab || !c->tabs))
        for (int64_t i = lo; i < hi; i++) {
            const uint8_t *const *pr = c->tabs ? attn_rows_of(c->tabs, i, tab) : c->prows + i * c->n_slots;
            for (int j = 0; j < c->n_slots; j++) {
                rows[j] = pr[j] ? ws + j * d : NULL;
                if (pr[j]) kvq_unpack(j < c->n_win ? DI_KVQ_FP8 : DI_KVQ_FP4_E4M3, pr[j], d, ws + j * d);
            }
            attn_row(c, i, 0, c->h, rows, acc);
        }
    free(acc);
    free(ws);
    free(rows);
    free(tab);
}

/* Fewer query rows than threads (a decode step of a few sequences): the
 * rows of every query decoded once, slots spread over the pool, then tasks
 * of (query, group of heads) spread over it; a row a thread would leave
 * the others idle through the layer's largest op. */
typedef struct attn_split {
    const attn_ctx *c;
    float *ws;                /* [m][n_slots][d] the decoded rows (packed forms) */
    const float **rows;       /* [m][n_slots] each query's rows */
    const uint8_t **tab;      /* [m][n_slots] packed row pointers (tables form) */
    int groups, per;          /* head groups a query, heads a group */
} attn_split;

static void attn_unpack_range(void *p, int64_t lo, int64_t hi) {
    const attn_split *a = p;
    const attn_ctx *c = a->c;
    for (int64_t t = lo; t < hi; t++) {
        const int64_t i = t / c->n_slots;
        const int j = (int)(t - i * c->n_slots);
        const uint8_t *pr = c->tabs ? a->tab[i * c->n_slots + j] : c->prows[i * c->n_slots + j];
        float *dst = a->ws + t * c->d;
        a->rows[t] = pr ? dst : NULL;
        if (pr) kvq_unpack(j < c->n_win ? DI_KVQ_FP8 : DI_KVQ_FP4_E4M3, pr, c->d, dst);
    }
}

static void attn_heads_range(void *p, int64_t lo, int64_t hi) {
    const attn_split *a = p;
    const attn_ctx *c = a->c;
    float *acc = malloc(attn_scratch_bytes(c));
    if (!acc) return;
    for (int64_t t = lo; t < hi; t++) {
        const int64_t i = t / a->groups;
        const int h0 = (int)(t - i * a->groups) * a->per, h1 = h0 + a->per < c->h ? h0 + a->per : c->h;
        if (h0 < h1) attn_row(c, i, h0, h1, a->rows + i * c->n_slots, acc);
    }
    free(acc);
}

/* Runs the attention of m query rows: by rows (row_fn over the pool), or
 * split by heads where there are fewer rows than threads; the same bits. */
static void attn_run(di_backend *be, const attn_ctx *c, int64_t m, range_fn row_fn) {
    const double work = (double)m * c->h * c->n_slots * (double)c->d * 2;
    const int nt = pool_of(be) ? di_threadpool_size(pool_of(be)) : 1;
    if (m >= nt || work < 2e5 || c->h < 2) {
        par_for(be, m, work, row_fn, (void *)c);
        return;
    }
    attn_split a = {c, NULL, NULL, NULL, 0, 0};
    const int64_t ns = m * c->n_slots;
    const int packed = !c->rows;
    a.rows = malloc(sizeof(float *) * (size_t)(ns ? ns : 1));
    a.ws = packed ? malloc(sizeof(float) * (size_t)(ns * c->d + 1)) : NULL;
    a.tab = c->tabs ? malloc(sizeof(uint8_t *) * (size_t)(ns ? ns : 1)) : NULL;
    if (!a.rows || (packed && !a.ws) || (c->tabs && !a.tab)) {
        free(a.rows), free(a.ws), free(a.tab);
        par_for(be, m, work, row_fn, (void *)c);
        return;
    }
    if (packed) {
        if (c->tabs)
            for (int64_t i = 0; i < m; i++) attn_rows_of(c->tabs, i, a.tab + i * c->n_slots);
        par_for(be, ns, (double)ns * (double)c->d * 4, attn_unpack_range, &a);
    } else {
        for (int64_t t = 0; t < ns; t++) a.rows[t] = c->rows[t];
    }
    /* about two tasks a thread */
    const int64_t want = (2 * nt + m - 1) / m;
    a.groups = (int)(want < c->h ? want : c->h);
    a.per = (c->h + a.groups - 1) / a.groups;
    par_for(be, m * a.groups, work, attn_heads_range, &a);
    free(a.rows), free(a.ws), free(a.tab);
}

static void cpu_sparse_attn(di_backend *be, const float *q, int64_t m, int h, int64_t d,
                            const di_kvrow *rows, int n_slots, const float *sink, float scale,
                            float *out) {
    attn_ctx c = {q, h, d, rows, NULL, n_slots, n_slots, sink, scale, out, NULL};
    attn_run(be, &c, m, attn_range);
}

static void cpu_sparse_attn_kv(di_backend *be, const float *q, int64_t m, int h, int64_t d,
                               const uint8_t *const *rows, int n_slots, int n_win,
                               const float *sink, float scale, float *out) {
    attn_ctx c = {q, h, d, NULL, rows, n_slots, n_win, sink, scale, out, NULL};
    attn_run(be, &c, m, attn_kv_range);
}

static void cpu_sparse_attn_rows(di_backend *be, const float *q, int64_t m, int h, int64_t d,
                                 const di_attn_rows *rows, const float *sink, float scale,
                                 float *out) {
    int n_slots = rows->n_win + rows->n_sel;
    attn_ctx c = {q, h, d, NULL, NULL, n_slots, rows->n_win, sink, scale, out, rows};
    attn_run(be, &c, m, attn_kv_range);
}

typedef struct idx_ctx {
    const float *q, *w;
    int hi;
    int64_t di;
    const float *const *keys;
    const uint8_t *const *pkeys; /* packed (index_scores_kv) */
    const int32_t *n_vis;
    int64_t width;
    float *out;
} idx_ctx;

/* Score of key k [di] for query row i (the reference's bf16 points). */
static float idx_score(const idx_ctx *x, int64_t i, const float *k) {
    int hi = x->hi;
    int64_t di = x->di;
    float total = 0.f;
    for (int h = 0; h < hi; h++) {
        const float *qh = x->q + (i * hi + h) * di;
        float dot = 0.f;
        for (int64_t t = 0; t < di; t++) dot += qh[t] * k[t];
        dot = di_round_bf16(dot);
        if (dot < 0.f) dot = 0.f;
        total += di_round_bf16(dot * x->w[i * hi + h]);
    }
    return di_round_bf16(total);
}

#if defined(DI_HAVE_AVX2_OPS)
/* Row i's scores 8 keys at a time: every head's dots with one transposed
 * tile of the keys, then the bf16 steps of idx_score in lanes. Packed keys
 * are decoded 8 at a time into kbuf [8, di]. */
static void idx_row_avx2(const idx_ctx *x, int64_t i, int64_t ja, int64_t jb, float *kbuf, float *dots) {
    int64_t di = x->di, nv = x->n_vis[i] < jb ? x->n_vis[i] : jb;
    size_t kb = di_kvq_row_bytes(DI_KVQ_FP4_E8M0, di);
    const float *q = x->q + i * x->hi * di;
    float *o = x->out + i * x->width, s8[8];
    for (int64_t j0 = ja; j0 < nv; j0 += 8) {
        int nk = nv - j0 < 8 ? (int)(nv - j0) : 8;
        const float *k8[8];
        for (int u = 0; u < 8; u++) {
            if (u >= nk) {
                k8[u] = k8[0]; /* a stand-in for the lanes past the end */
            } else if (x->pkeys) {
                kvq_unpack(DI_KVQ_FP4_E8M0, x->pkeys[i] + (size_t)(j0 + u) * kb, di, kbuf + u * di);
                k8[u] = kbuf + u * di;
            } else {
                k8[u] = x->keys[i] + (j0 + u) * di;
            }
        }
        di_cpu_dots8_avx2(q, x->hi, di, k8, dots);
        di_cpu_index_combine8_avx2(dots, x->w + i * x->hi, x->hi, s8);
        memcpy(o + j0, s8, (size_t)nk * sizeof(float));
    }
    for (int64_t j = nv > ja ? nv : ja; j < jb; j++) o[j] = -INFINITY;
}
#endif

/* Scores of keys [ja, jb) of query row i (ja a multiple of 8); every key's
 * score is its own, so any split of the keys gives the same bits. */
static void idx_keys(const idx_ctx *x, int64_t i, int64_t ja, int64_t jb, float *buf) {
    int64_t di = x->di;
    size_t kb = di_kvq_row_bytes(DI_KVQ_FP4_E8M0, di);
#if defined(DI_HAVE_AVX2_OPS)
    if (di % 8 == 0 && ops_avx2()) {
        idx_row_avx2(x, i, ja, jb, buf, buf + 8 * di);
        return;
    }
#endif
    float *o = x->out + i * x->width;
    for (int64_t j = ja; j < jb; j++) {
        if (j >= x->n_vis[i]) {
            o[j] = -INFINITY;
            continue;
        }
        if (x->pkeys) { /* one key decoded, read by every head */
            kvq_unpack(DI_KVQ_FP4_E8M0, x->pkeys[i] + (size_t)j * kb, di, buf);
            o[j] = idx_score(x, i, buf);
        } else {
            o[j] = idx_score(x, i, x->keys[i] + j * di);
        }
    }
}

static void idx_range(void *p, int64_t lo, int64_t hi_row) {
    const idx_ctx *x = p;
    float *buf = malloc((size_t)(8 * x->di + 8 * x->hi) * sizeof(float));
    for (int64_t i = lo; i < hi_row && buf; i++) idx_keys(x, i, 0, x->width, buf);
    free(buf);
}

/* Fewer query rows than threads (a decode step of a few sequences): tasks
 * of (row, IDX_KEYS keys) over the pool; the keys of a long context are
 * most of a ratio-1 layer's work, which a row a thread left on one core. */
enum { IDX_KEYS = 256 };
typedef struct idx_split {
    const idx_ctx *x;
    int64_t chunks; /* of IDX_KEYS keys a row */
} idx_split;

static void idx_chunk_range(void *p, int64_t lo, int64_t hi) {
    const idx_split *a = p;
    const idx_ctx *x = a->x;
    float *buf = malloc((size_t)(8 * x->di + 8 * x->hi) * sizeof(float));
    for (int64_t t = lo; t < hi && buf; t++) {
        const int64_t i = t / a->chunks, ja = (t - i * a->chunks) * IDX_KEYS;
        idx_keys(x, i, ja, ja + IDX_KEYS < x->width ? ja + IDX_KEYS : x->width, buf);
    }
    free(buf);
}

static void idx_run(di_backend *be, const idx_ctx *x, int64_t m) {
    const double work = (double)m * (double)x->width * x->hi * (double)x->di;
    const int nt = pool_of(be) ? di_threadpool_size(pool_of(be)) : 1;
    if (m >= nt || x->width <= IDX_KEYS) {
        par_for(be, m, work, idx_range, (void *)x);
        return;
    }
    idx_split a = {x, (x->width + IDX_KEYS - 1) / IDX_KEYS};
    par_for(be, m * a.chunks, work, idx_chunk_range, &a);
}

static void cpu_index_scores(di_backend *be, const float *q, const float *w, int64_t m, int hi,
                             int64_t di, const float *const *keys, const int32_t *n_vis,
                             int64_t width, float *out) {
    idx_ctx x = {q, w, hi, di, keys, NULL, n_vis, width, out};
    idx_run(be, &x, m);
}

static void cpu_index_scores_kv(di_backend *be, const float *q, const float *w, int64_t m,
                                int hi, int64_t di, const uint8_t *const *keys,
                                const int32_t *n_vis, int64_t width, float *out) {
    idx_ctx x = {q, w, hi, di, NULL, keys, n_vis, width, out};
    idx_run(be, &x, m);
}

typedef struct pack_ctx {
    di_kvq fmt;
    const float *x;
    int64_t n;
    uint8_t *out;
} pack_ctx;

static void pack_range(void *p, int64_t lo, int64_t hi) {
    const pack_ctx *c = p;
    size_t rb = di_kvq_row_bytes(c->fmt, c->n);
    for (int64_t i = lo; i < hi; i++) di_kvq_pack(c->fmt, c->x + i * c->n, c->n, c->out + (size_t)i * rb);
}

static void cpu_kv_pack(di_backend *be, di_kvq fmt, const float *x, int64_t m, int64_t n,
                        uint8_t *out) {
    pack_ctx c = {fmt, x, n, out};
    par_for(be, m, (double)m * (double)n * 8, pack_range, &c);
}

/* Index of the best `k` of n scores (ties: lower index), written in
 * ascending index order; returns how many were found (> -inf only). */
static int select_topk(const float *sc, int64_t n, int k, int32_t *out) {
    /* insertion into a small sorted list: k is small (≤ index_topk) */
    int cnt = 0;
    for (int64_t j = 0; j < n; j++) {
        float v = sc[j];
        if (v == -INFINITY || v != v) continue;
        if (cnt == k && !(v > sc[out[cnt - 1]])) continue;
        int pos = cnt < k ? cnt++ : k - 1;
        while (pos > 0 && v > sc[out[pos - 1]]) {
            out[pos] = out[pos - 1];
            pos--;
        }
        out[pos] = (int32_t)j;
    }
    /* ascending index order */
    for (int a = 1; a < cnt; a++) {
        int32_t v = out[a];
        int b = a;
        while (b > 0 && out[b - 1] > v) {
            out[b] = out[b - 1];
            b--;
        }
        out[b] = v;
    }
    return cnt;
}

static void cpu_topk_select(di_backend *be, const float *scores, const int32_t *n_vis, int64_t m,
                            int64_t width, int k, int32_t *idx) {
    (void)be;
    for (int64_t i = 0; i < m; i++) {
        int64_t n = n_vis[i] < width ? n_vis[i] : width;
        int32_t *o = idx + i * k;
        int cnt = k > 0 ? select_topk(scores + i * width, n, k, o) : 0;
        for (int j = cnt; j < k; j++) o[j] = -1;
    }
}

static void cpu_candidate_blocks(di_backend *be, const float *src, const int32_t *n_vis,
                                 int64_t m, int64_t width, int topk_blocks, int bs,
                                 int32_t *blocks) {
    (void)be;
    int64_t nb = (width + bs - 1) / bs;
    float *bsc = malloc((size_t)(nb + 1) * sizeof(float));
    if (!bsc) {
        for (int64_t i = 0; i < m * topk_blocks; i++) blocks[i] = -1;
        return;
    }
    for (int64_t i = 0; i < m; i++) {
        const float *s = src + i * width;
        for (int64_t b = 0; b < nb; b++) {
            float mx = -INFINITY;
            for (int64_t j = b * bs; j < (b + 1) * bs && j < width; j++) mx = fmaxf(mx, s[j]);
            bsc[b] = mx;
        }
        /* the block holding the newest visible entry is always kept */
        int64_t last = n_vis[i] > 0 ? (n_vis[i] - 1) / bs : -1;
        if (last >= 0 && last < nb) bsc[last] = INFINITY;
        int kk = topk_blocks < nb ? topk_blocks : (int)nb;
        int32_t *o = blocks + i * topk_blocks;
        int cnt = select_topk(bsc, nb, kk, o);
        for (int c = cnt; c < topk_blocks; c++) o[c] = -1;
    }
    free(bsc);
}

static void cpu_restrict_blocks(di_backend *be, float *scores, const int32_t *blocks, int64_t m,
                                int64_t width, int topk_blocks, int bs) {
    (void)be;
    for (int64_t i = 0; i < m; i++) {
        float *s = scores + i * width;
        const int32_t *b = blocks + i * topk_blocks;
        int c = 0; /* blocks are ascending: walk them alongside the positions */
        for (int64_t j = 0; j < width; j++) {
            int64_t blk = j / bs;
            while (c < topk_blocks && b[c] >= 0 && b[c] < blk) c++;
            if (!(c < topk_blocks && b[c] == blk)) s[j] = -INFINITY;
        }
    }
}

/* ------------------------------------------------------------ MoE */

/* One router row's scores and biased scores (core/route_score.h). Its
 * fused multiply-adds are calls into libm on baseline x86-64; where the CPU
 * has FMA the same code is also compiled for it, fmaf becoming one
 * instruction with the same correctly rounded result (~5x faster). */
DI_HD void route_row_body(const float *x, const float *bias, int e, float *sc, float *biased) {
    for (int j = 0; j < e; j++) {
        sc[j] = di_route_score(x[j]);
        biased[j] = sc[j] + bias[j];
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("fma"))) static void route_row_fma(const float *x, const float *bias, int e,
                                                         float *sc, float *biased) {
    route_row_body(x, bias, e, sc, biased);
}
#endif

static void route_row(const float *x, const float *bias, int e, float *sc, float *biased) {
#if defined(__x86_64__) && defined(__GNUC__)
    static int fma = -1;
    if (fma < 0) fma = di_cpu_has_avx2();
    if (fma) {
        route_row_fma(x, bias, e, sc, biased);
        return;
    }
#endif
    route_row_body(x, bias, e, sc, biased);
}

static void cpu_moe_route(di_backend *be, const float *logits, const float *bias, int64_t m,
                          int e, int k, int normalize, float route_scale, int32_t *idx, float *w) {
    (void)be;
    float sc[1024], biased[1024];
    int32_t pick[64];
    unsigned char taken[1024];
    for (int64_t i = 0; i < m; i++) {
        route_row(logits + i * e, bias, e, sc, biased);
        /* best k by biased score, in rank order (ties: lower expert) */
        memset(taken, 0, (size_t)e);
        for (int r = 0; r < k; r++) {
            di_route_pick p = di_route_pick_empty();
            for (int j = 0; j < e; j++)
                if (!taken[j]) di_route_pick_add(&p, j, biased[j]);
            pick[r] = di_route_pick_id(p);
            if (pick[r] >= 0) taken[pick[r]] = 1;
        }
        float *wr = w + i * k;
        for (int r = 0; r < k; r++) {
            idx[i * k + r] = pick[r];
            wr[r] = pick[r] >= 0 ? sc[pick[r]] : 0.0f; /* -1: fewer experts than k */
        }
        di_route_weights(wr, k, normalize, route_scale);
    }
}

typedef struct swiglu_ctx {
    const float *g, *u, *w;
    int64_t n;
    float limit;
    float *out;
} swiglu_ctx;

/* silu(g)·u with the sigmoid from the router's exponential (core/row_exp.h:
 * the same operations 8 lanes at a time or one by one, so any CPU gives
 * the same bits): t = e^-|g|, sigmoid(g) = 1/(1 + t) for g >= 0 and
 * t/(1 + t) below; within an ulp or two of libm's 1/(1 + expf(-g))
 * (docs/numerics.md). The clamps are spelled as comparisons with fminf /
 * fmaxf's NaN rule (a NaN input gives the bound), which the compiler
 * vectorizes where the libm calls it would not. Chunks of SW_CHUNK values
 * keep the buffers on the stack. */
enum { SW_CHUNK = 512 };

static void swiglu_range(void *p, int64_t lo, int64_t hi) {
    const swiglu_ctx *c = p;
    const float *g = c->g, *u = c->u, *w = c->w;
    int64_t n = c->n;
    float limit = c->limit, *out = c->out;
    float gb[SW_CHUNK], t[SW_CHUNK];
    for (int64_t i = lo; i < hi; i++)
        for (int64_t k0 = 0; k0 < n; k0 += SW_CHUNK) {
            const int64_t kn = n - k0 < SW_CHUNK ? n - k0 : SW_CHUNK;
            const float *gr = g + i * n + k0, *ur = u + i * n + k0;
            float *o = out + i * n + k0;
            const int clamp = limit > 0.f;
            for (int64_t k = 0; k < kn; k++) {
                const float x = gr[k];
                gb[k] = clamp ? (x < limit ? x : limit) : x; /* fminf(x, limit) */
                t[k] = -fabsf(gb[k]);
            }
            di_row_exp(t, kn, 0.0f, 1.0f, t);
            const float wi = w ? w[i] : 1.0f;
#if defined(DI_HAVE_AVX2_OPS)
            if (ops_avx2()) { /* the loop below on 8 lanes: the same operations */
                di_cpu_swiglu_out_avx2(gb, t, ur, kn, limit, clamp, w ? &wi : NULL, o);
                continue;
            }
#endif
            for (int64_t k = 0; k < kn; k++) {
                float uv = ur[k];
                if (clamp) {
                    uv = uv > -limit ? uv : -limit; /* fmaxf(uv, -limit) */
                    uv = uv < limit ? uv : limit;   /* fminf(., limit) */
                }
                const float gv = gb[k], s = (gv >= 0.0f ? 1.0f : t[k]) / (1.0f + t[k]);
                const float v = gv * s * uv;
                o[k] = di_round_bf16(w ? wi * v : v);
            }
        }
}

/* Row-parallel: the exponentials make this the costliest elementwise op. */
static void cpu_swiglu(di_backend *be, const float *g, const float *u, const float *w, int64_t m,
                       int64_t n, float limit, float *out) {
    swiglu_ctx c = {g, u, w, n, limit, out};
    par_for(be, m, (double)m * (double)n * 20, swiglu_range, &c);
}

/* Row gathers and scatter-adds (a routed expert's rows at prefill: tens
 * of rows of the model width each), over the pool where they are large:
 * the gather by rows; the scatter-add by pieces of ROW_PIECE columns, every
 * piece adding the rows in their order, as one destination row may come
 * several times (the batched experts' call) and its sums must keep it. */
enum { ROW_PIECE = 512 };
typedef struct rows_ctx {
    float *dst;
    const float *src;
    const int32_t *rows;
    int64_t m, n;
} rows_ctx;
static void gather_range(void *ctx, int64_t i0, int64_t i1) {
    const rows_ctx *c = ctx;
    for (int64_t i = i0; i < i1; i++)
        memcpy(c->dst + i * c->n, c->src + (int64_t)c->rows[i] * c->n, (size_t)c->n * sizeof(float));
}
static void scatter_add_range(void *ctx, int64_t p0, int64_t p1) {
    const rows_ctx *c = ctx;
    const int64_t k0 = p0 * ROW_PIECE, k1 = piece_end(p1, ROW_PIECE, c->n);
    for (int64_t i = 0; i < c->m; i++) {
        float *d = c->dst + (int64_t)c->rows[i] * c->n + k0;
        const float *x = c->src + i * c->n + k0;
#if defined(DI_HAVE_AVX2_OPS)
        if (ops_avx2()) {
            di_cpu_add_avx2(d, x, k1 - k0);
            continue;
        }
#endif
        for (int64_t k = 0; k < k1 - k0; k++) d[k] += x[k];
    }
}

static void cpu_gather_rows(di_backend *be, const float *src, const int32_t *rows, int64_t m,
                            int64_t n, float *dst) {
    rows_ctx c = {dst, src, rows, m, n};
    par_for(be, m, (double)m * (double)n, gather_range, &c);
}

static void cpu_scatter_add_rows(di_backend *be, float *dst, const int32_t *rows, const float *src,
                                 int64_t m, int64_t n) {
    rows_ctx c = {dst, src, rows, m, n};
    par_for(be, (n + ROW_PIECE - 1) / ROW_PIECE, 2.0 * (double)m * (double)n, scatter_add_range, &c);
}

/* backend.h scatter_rows_to: base and slot are host memory here. */
static void cpu_scatter_rows_to(di_backend *be, const void *src, size_t src_stride, int64_t m,
                                const uint8_t *const *base, const int32_t *slot, size_t dst_off,
                                size_t dst_stride, size_t bytes) {
    (void)be;
    for (int64_t i = 0; i < m; i++)
        if (slot[i] >= 0 && base[i])
            memcpy((uint8_t *)(uintptr_t)base[i] + dst_off + (size_t)slot[i] * dst_stride,
                   (const uint8_t *)src + (size_t)i * src_stride, bytes);
}

/* backend.h gather_rows_from: base and slot are host memory here. */
static void cpu_gather_rows_from(di_backend *be, void *dst, size_t dst_stride, int64_t m,
                                 const uint8_t *const *base, const int32_t *slot, size_t src_off,
                                 size_t src_stride, size_t bytes) {
    (void)be;
    for (int64_t i = 0; i < m; i++)
        memcpy((uint8_t *)dst + (size_t)i * dst_stride,
               base[i] + src_off + (size_t)slot[i] * src_stride, bytes);
}

/* The routed experts of a decode step (few rows an expert, MXFP4 weights
 * of one shape, FP8 activations): the loop's ops on the same rows in the
 * same order — quantization and the products of every row as cpu_matmul
 * does them, SwiGLU, the scatter-adds expert after expert —
 * but the products of all the experts in two hand-offs to the thread pool
 * (w1 and w3 of every expert, then w2 of every expert: di_gemm_mxfp4_many)
 * instead of three an expert, whose parts each give their own call's bits.
 * At one row a product is a few MB, which many threads read in tens of
 * microseconds: each hand-off and the pool's wait for its last thread
 * weighed as much as the work. Returns 0, having written nothing, where it
 * does not apply or memory runs out (the loop then runs). */
enum { MOE_BATCH_ROWS = 16, MOE_BATCH_P = 1024 };
static atomic_int moe_loop_forced;
void di_backend_cpu_force_moe_loop(int on) { atomic_store(&moe_loop_forced, on != 0); }
static int moe_experts_batched(di_backend *be, const di_moe_experts *ex, const float *x, int64_t m, const int64_t *off,
                               const int32_t *rows, const float *rw, unsigned mm, float limit, float *out) {
    const int E = ex->n;
    const int64_t D = ex->w1->n_in, np = off[E];
    int64_t I = -1;
    int ne = 0;
    if (!(mm & DI_MM_ACT_FP8) || np <= 0 || np > MOE_BATCH_P || D % 32 || atomic_load(&moe_loop_forced)) return 0;
    for (int e = 0; e < E; e++) {
        const int64_t n = off[e + 1] - off[e];
        if (!n) continue;
        const di_wmat *w1 = di_moe_wmat(ex->w1, ex->stride, e), *w3 = di_moe_wmat(ex->w3, ex->stride, e);
        const di_wmat *w2 = di_moe_wmat(ex->w2, ex->stride, e);
        if (I < 0) I = w1->n_out;
        if (n > MOE_BATCH_ROWS || w1->fmt != DI_WFMT_FP4 || w3->fmt != DI_WFMT_FP4 || w2->fmt != DI_WFMT_FP4 ||
            w1->n_in != D || w3->n_in != D || w1->n_out != I || w3->n_out != I || w2->n_in != I || w2->n_out != D)
            return 0;
        ne++;
    }
    if (I <= 0 || I % 32) return 0;
    float *ye = malloc((size_t)(np * D) * sizeof(float));
    float *g = malloc((size_t)(np * I) * sizeof(float)), *u = malloc((size_t)(np * I) * sizeof(float));
    uint8_t *qt = malloc((size_t)(m * D)), *qx = malloc((size_t)(np * D)), *qh = malloc((size_t)(np * I));
    float *st = malloc((size_t)(m * D / 32) * sizeof(float)), *sx = malloc((size_t)(np * D / 32) * sizeof(float));
    float *sh = malloc((size_t)(np * I / 32) * sizeof(float));
    di_gemm_part *parts = malloc(sizeof *parts * (size_t)(2 * ne));
    const int ok = ye && g && u && qt && qx && qh && st && sx && sh && parts;
    if (ok) {
        /* cpu_matmul's rule on the passes' whole work (the w1 / w3 pass: 2·ne·I·D codes) */
        di_threadpool *tp = mm_pool(be, (double)np * (double)I * (double)D * 2, (double)ne * (double)I * (double)D);
        /* each token quantized once (row by row, as the loop's gathered rows
         * are): an expert of one row reads its token's codes where they are,
         * so at batch 1 the six experts share one activation layout; one of
         * several rows gets them gathered */
        act_quant(be, x, m, D, qt, st);
        int j = 0;
        for (int e = 0; e < E; e++) {
            const int64_t n = off[e + 1] - off[e], r = off[e];
            if (!n) continue;
            const uint8_t *qa = qt + (int64_t)rows[r] * D;
            const float *sa = st + (int64_t)rows[r] * (D / 32);
            if (n > 1) {
                for (int64_t i = 0; i < n; i++) {
                    memcpy(qx + (r + i) * D, qt + (int64_t)rows[r + i] * D, (size_t)D);
                    memcpy(sx + (r + i) * (D / 32), st + (int64_t)rows[r + i] * (D / 32),
                           sizeof(float) * (size_t)(D / 32));
                }
                qa = qx + r * D;
                sa = sx + r * (D / 32);
            }
            const di_wmat *w1 = di_moe_wmat(ex->w1, ex->stride, e), *w3 = di_moe_wmat(ex->w3, ex->stride, e);
            parts[j++] = (di_gemm_part){qa, sa, n, w1->w, w1->s, I, g + r * I};
            parts[j++] = (di_gemm_part){qa, sa, n, w3->w, w3->s, I, u + r * I};
        }
        di_gemm_mxfp4_many(parts, j, D, tp);
        if (mm & DI_MM_OUT_BF16)
            round_bf16_n(be, g, np * I), round_bf16_n(be, u, np * I);
        cpu_swiglu(be, g, u, rw, np, I, limit, g);
        act_quant(be, g, np, I, qh, sh);
        j = 0;
        for (int e = 0; e < E; e++) {
            const int64_t n = off[e + 1] - off[e], r = off[e];
            if (!n) continue;
            const di_wmat *w2 = di_moe_wmat(ex->w2, ex->stride, e);
            parts[j++] = (di_gemm_part){qh + r * I, sh + r * (I / 32), n, w2->w, w2->s, D, ye + r * D};
        }
        di_gemm_mxfp4_many(parts, j, I, tp);
        if (mm & DI_MM_OUT_BF16)
            round_bf16_n(be, ye, np * D);
        cpu_scatter_add_rows(be, out, rows, ye, np, D); /* expert after expert, rows ascending in each */
    }
    free(ye), free(g), free(u), free(qt), free(qx), free(qh), free(st), free(sx), free(sh), free(parts);
    return ok;
}

/* The routed experts of a layer (backend.h moe_experts): the model's
 * per-expert loop — gather the expert's rows, w1 and w3, SwiGLU with the
 * routing weights, w2, scatter-add — run here with the very same ops, so
 * the bits are the loop's. The rows of every expert come from one counting
 * pass over the routing (rows ascending within an expert) instead of one
 * scan of the routing per expert. */
static void cpu_moe_experts(di_backend *be, const di_moe_experts *ex, const float *x, int64_t m,
                            const int32_t *idx, const float *w, int k, unsigned mm, float limit,
                            float *out) {
    int E = ex->n;
    int64_t D = ex->w1->n_in, P = m * k;
    if (m <= 0) return;
    memset(out, 0, (size_t)(m * D) * sizeof(float));
    if (k <= 0 || E <= 0) return;
    int64_t *off = calloc((size_t)E + 1, sizeof *off), *cur = malloc((size_t)E * sizeof *cur);
    int32_t *rows = malloc((size_t)P * sizeof *rows);
    float *rw = malloc((size_t)P * sizeof *rw);
    float *xe = NULL, *g = NULL, *u = NULL, *ye = NULL;
    int64_t nmax = 0, imax = 0;
    if (!off || !cur || !rows || !rw) goto out;
    for (int64_t p = 0; p < P; p++)
        if (idx[p] >= 0 && idx[p] < E) off[idx[p] + 1]++;
    for (int e = 0; e < E; e++) {
        if (off[e + 1] > nmax) nmax = off[e + 1];
        if (off[e + 1] && di_moe_wmat(ex->w1, ex->stride, e)->n_out > imax)
            imax = di_moe_wmat(ex->w1, ex->stride, e)->n_out;
        off[e + 1] += off[e];
        cur[e] = off[e];
    }
    for (int64_t p = 0; p < P; p++) /* p = i·k + r: rows ascending per expert */
        if (idx[p] >= 0 && idx[p] < E) {
            int64_t q = cur[idx[p]]++;
            rows[q] = (int32_t)(p / k);
            rw[q] = w[p];
        }
    if (moe_experts_batched(be, ex, x, m, off, rows, rw, mm, limit, out)) goto out;
    xe = malloc((size_t)(nmax * D) * sizeof(float) + 1);
    ye = malloc((size_t)(nmax * D) * sizeof(float) + 1);
    g = malloc((size_t)(nmax * imax) * sizeof(float) + 1);
    u = malloc((size_t)(nmax * imax) * sizeof(float) + 1);
    if (!xe || !ye || !g || !u) goto out;
    for (int e = 0; e < E; e++) {
        int64_t n = off[e + 1] - off[e];
        if (n == 0) continue;
        const di_wmat *w1 = di_moe_wmat(ex->w1, ex->stride, e);
        int64_t I = w1->n_out;
        cpu_gather_rows(be, x, rows + off[e], n, D, xe);
        cpu_matmul(be, w1, xe, n, g, mm);
        cpu_matmul(be, di_moe_wmat(ex->w3, ex->stride, e), xe, n, u, mm);
        cpu_swiglu(be, g, u, rw + off[e], n, I, limit, g);
        cpu_matmul(be, di_moe_wmat(ex->w2, ex->stride, e), g, n, ye, mm);
        cpu_scatter_add_rows(be, out, rows + off[e], ye, n, D);
    }
out:
    free(off);
    free(cur);
    free(rows);
    free(rw);
    free(xe);
    free(ye);
    free(g);
    free(u);
}

/* y += x in pieces of ROUND_PIECE over the pool where there are many (the
 * residual adds of a prefill: the scalar loop, which the compiler does not
 * vectorize as x may alias y, ran on the calling thread alone) */
typedef struct add_ctx {
    float *y;
    const float *x;
    int64_t n;
} add_ctx;
static void add_range(void *ctx, int64_t p0, int64_t p1) {
    const add_ctx *c = ctx;
    const int64_t i0 = p0 * ROUND_PIECE, i1 = piece_end(p1, ROUND_PIECE, c->n);
#if defined(DI_HAVE_AVX2_OPS)
    if (ops_avx2()) {
        di_cpu_add_avx2(c->y + i0, c->x + i0, i1 - i0);
        return;
    }
#endif
    for (int64_t i = i0; i < i1; i++) c->y[i] += c->x[i];
}
static void cpu_add(di_backend *be, float *y, const float *x, int64_t n) {
    add_ctx c = {y, x, n};
    par_for(be, (n + ROUND_PIECE - 1) / ROUND_PIECE, (double)n, add_range, &c);
}

static void cpu_qkv_rope_pack(di_backend *be, float *q, int heads, float *kv, int64_t m,
                              int64_t hd, int64_t rd, const di_tensor *nw, double eps,
                              const float *cs, uint8_t *out) {
    cpu_rmsnorm(be, kv, nw, m, hd, eps, kv);
    cpu_rope_cs(be, q, m, heads * hd, heads, hd, rd, cs, 0);
    cpu_rope_cs(be, kv, m, hd, 1, hd, rd, cs, 0);
    cpu_kv_pack(be, DI_KVQ_FP8, kv, m, hd, out);
}

static void cpu_add_bf16(di_backend *be, float *y, const float *a, const float *b, int64_t n) {
    if (y == b) { /* a + b and b + a are the same fp32 sum */
        cpu_add(be, y, a, n);
    } else {
        if (y != a) cpu_copy(be, y, a, (size_t)n * sizeof(float));
        cpu_add(be, y, b, n);
    }
    cpu_round_bf16(be, y, n);
}

typedef struct greedy_ctx {
    const float *x;
    int64_t V, lim;
    const int32_t *ban;
    di_row_greedy *out;
} greedy_ctx;

static void greedy_range(void *p, int64_t b, int64_t e) {
    const greedy_ctx *c = p;
    for (int64_t i = b; i < e; i++)
        di_row_greedy_of(c->x + i * c->V, c->V, c->lim, c->ban ? c->ban[i] : -1, c->out + i);
}

static void cpu_logits_greedy(di_backend *be, const float *x, int64_t m, int64_t V, int64_t lim,
                              const int32_t *ban, di_row_greedy *out) {
    greedy_ctx c = {x, V, lim, ban, out};
    par_for(be, m, (double)m * (double)V * 8, greedy_range, &c);
}

static const di_backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .alloc_raw = cpu_alloc_raw,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .matmul = cpu_matmul,
    .matmul_pair = cpu_matmul_pair,
    .matmul_grouped = cpu_matmul_grouped,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .rope_cs = cpu_rope_cs,
    .qkv_rope_pack = cpu_qkv_rope_pack,
    .qdq_fp8 = cpu_qdq_fp8,
    .qdq_fp4_e8m0 = cpu_qdq_fp4_e8m0,
    .qdq_fp4_e4m3 = cpu_qdq_fp4_e4m3,
    .round_bf16 = cpu_round_bf16,
    .scale_bf16 = cpu_scale_bf16,
    .embed = cpu_embed,
    .embed_buf = cpu_embed, /* backend memory is host memory */
    .engram_gather = cpu_engram_gather,
    .hc_mix = cpu_hc_mix,
    .hc_collapse = cpu_hc_collapse,
    .hc_collapse_norm = cpu_hc_collapse_norm,
    .hc_expand = cpu_hc_expand,
    .hc_mean = cpu_hc_mean,
    .engram_gate = cpu_engram_gate,
    .compress_pool = cpu_compress_pool,
    .sparse_attn = cpu_sparse_attn,
    .index_scores = cpu_index_scores,
    .kv_pack = cpu_kv_pack,
    .sparse_attn_kv = cpu_sparse_attn_kv,
    .index_scores_kv = cpu_index_scores_kv,
    .candidate_blocks = cpu_candidate_blocks,
    .restrict_blocks = cpu_restrict_blocks,
    .topk_select = cpu_topk_select,
    /* backend memory is host memory: the backend-memory forms are the same functions */
    .index_scores_kv_buf = cpu_index_scores_kv,
    .candidate_blocks_buf = cpu_candidate_blocks,
    .restrict_blocks_buf = cpu_restrict_blocks,
    .topk_select_buf = cpu_topk_select,
    .sparse_attn_rows = cpu_sparse_attn_rows,
    .moe_route = cpu_moe_route,
    .moe_route_buf = cpu_moe_route, /* backend memory is host memory */
    .moe_experts = cpu_moe_experts,
    .swiglu = cpu_swiglu,
    .gather_rows = cpu_gather_rows,
    .gather_rows_buf = cpu_gather_rows,
    .engram_rows = cpu_engram_rows,
    .scatter_rows_to = cpu_scatter_rows_to,
    .gather_rows_from = cpu_gather_rows_from,
    .scatter_add_rows = cpu_scatter_add_rows,
    .add = cpu_add,
    .add_bf16 = cpu_add_bf16,
    .logits_greedy = cpu_logits_greedy,
};

di_status di_backend_cpu_create(int n_threads, di_backend **out, di_err *err) {
    di_backend *be = calloc(1, sizeof *be);
    if (!be) return di_err_set(err, DI_ERR_NOMEM, "cpu backend: out of memory");
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    be->ops = &cpu_ops;
    be->n_threads = n_threads;
    di_threadpool *tp = NULL;
    di_status st = di_threadpool_create(n_threads, &tp, err);
    if (st) {
        free(be);
        return st;
    }
    cpu_impl *im = calloc(1, sizeof *im);
    if (!im || pthread_mutex_init(&im->mu, NULL)) {
        free(im);
        di_threadpool_destroy(tp);
        free(be);
        return di_err_set(err, DI_ERR_NOMEM, "cpu backend: out of memory");
    }
    im->tp = tp;
    be->impl = im;
    *out = be;
    return DI_OK;
}

void di_backend_destroy(di_backend *be) {
    if (!be) return;
    if (be->ops && be->ops->destroy) { /* another backend's own teardown */
        be->ops->destroy(be);
        return;
    }
    cpu_impl *im = be->impl;
    if (im) {
        di_threadpool_destroy(im->tp);
        for (int i = 0; i < im->n_keep; i++) free(im->keep[i].p);
        pthread_mutex_destroy(&im->mu);
        free(im);
    }
    free(be);
}

di_status di_wmat_from(di_wmat *out, const di_tensor *w, const di_tensor *s, di_err *err) {
    memset(out, 0, sizeof *out);
    if (!w || !w->data || w->ndim != 2)
        return di_err_set(err, DI_ERR_INVALID_ARG, "weight matrix missing or not 2-D");
    out->n_out = w->shape[0];
    out->w = w->data;
    switch (w->dtype) {
    case DI_DTYPE_F8_E4M3:
        out->fmt = DI_WFMT_FP8;
        out->n_in = w->shape[1];
        break;
    case DI_DTYPE_I8:
    case DI_DTYPE_U8:
        out->fmt = DI_WFMT_FP4;
        out->n_in = w->shape[1] * 2;
        break;
    case DI_DTYPE_BF16:
        out->fmt = DI_WFMT_BF16;
        out->n_in = w->shape[1];
        return DI_OK;
    case DI_DTYPE_F32:
        out->fmt = DI_WFMT_F32;
        out->n_in = w->shape[1];
        return DI_OK;
    default:
        return di_err_set(err, DI_ERR_UNSUPPORTED, "weight dtype %s not supported for a matmul",
                          di_dtype_name(w->dtype));
    }
    if (!s || !s->data || s->dtype != DI_DTYPE_F8_E8M0)
        return di_err_set(err, DI_ERR_INVALID_ARG, "quantized weight without an E8M0 scale");
    if (out->n_in % 32)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "input width %lld is not a multiple of 32",
                          (long long)out->n_in);
    out->s = s->data;
    return DI_OK;
}
