/* The CUDA backend's op table against the CPU backend's (backend.h; the CPU
 * op is the reference semantics, architecture.md §2–§7): every op on fresh
 * random inputs of many shapes, odd sizes included. Device outputs are
 * poisoned with NaN (all-ones bytes) before each run, so an element the
 * kernel never writes fails the check.
 *
 * Tolerances follow from the arithmetic:
 * - bit-identical where the device does the CPU's very operations in the
 *   same order (the kernels spell out every rounding): RoPE (its cos/sin
 *   come from the host's libm), the quantize-dequantize ops, bf16 rounding
 *   and scaling, gathers, scatter-add, mHC collapse / expand / mean, the
 *   F32-weight matmul (one FMA chain per output), block restriction, packing cache rows (kv_pack), and the host-result ops (top-k, candidate
 *   blocks, routing), which run the CPU op on downloaded inputs;
 * - one bf16 ulp (2^-7 relative, a result rounded to bf16 from an fp32 value
 *   a few ulps off) where only a reduction order or CUDA's expf differs:
 *   RMSNorm, SwiGLU, compression pooling, the Engram gate, sparse attention,
 *   index scores, both also over packed cache rows (plus an absolute term for cancellation and flips of the
 *   intermediate bf16 roundings, scaled by the output's RMS);
 * - the BF16 / FP8 / MXFP4-weight products without activation quantization
 *   (tensor cores over an exact three-term split of x, cuda_ops_linear.cu):
 *   the CPU chain's K·2^-24·Σ|w·x| plus the device's (18·n_mma + 3)·2^-23·
 *   Σ|w·x| with n_mma = 6·ceil(K/256), plus a bf16 ulp when rounded; and a
 *   row's bits must not depend on the rows beside it (batch invariance);
 * - fp32 rounding of reordered sums through the Sinkhorn iterations for
 *   the mHC mixing weights (1e-4 relative);
 * - for the FP8-activation matmuls, kernels.h's bound (31 + K/32)·2^-24·Σ|t|
 *   for the CPU, the GPU's promotion budget (K/32 + 2)·2^-24·Σ|t|, and
 *   2^-8 of each 32-block's largest term for the short adder of the FP8
 *   tensor cores (the wgmma prefill path; see test_cuda_ops.c), plus a bf16
 *   ulp when the output is rounded.
 * Without a GPU (or without CUDA in the build) every test skips. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cuda/cuda_attn_tc.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ops_moe.h"
#include "backend/cuda/cuda_ops_select.h"
#include "core/dtype.h"
#include "core/route_score.h"
#include "moe_ref.h"
#include "test.h"
#include "test_rng.h"
#include "attn_bound.h" /* after test.h: it counts through CHECKF */
#include "index_bound.h"
#include "draw_ref.h"

static di_backend *gpu, *cpu;
static char gpu_why[DI_ERR_MSG_MAX];

/* ---- random inputs (tests/unit/test_rng.h; a fresh seed per run, printed first) */

/* n bf16-exact values of scale `sc` (activations are bf16 in the model) */
static float *rnd(int64_t n, float sc) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = di_round_bf16(sc * rng_normal());
    return x;
}

static di_tensor vec_tensor(int64_t n0, int64_t n1, di_dtype dt) {
    di_tensor t = {0};
    t.dtype = dt;
    t.ndim = n1 ? 2 : 1;
    t.shape[0] = n0;
    t.shape[1] = n1;
    int64_t n = n0 * (n1 ? n1 : 1);
    t.nbytes = (size_t)n * di_dtype_size(dt);
    t.data = malloc(t.nbytes ? t.nbytes : 1);
    for (int64_t i = 0; i < n; i++) {
        float v = 1.0f + 0.5f * rng_normal();
        if (dt == DI_DTYPE_BF16) ((uint16_t *)t.data)[i] = di_f32_to_bf16(v);
        else ((float *)t.data)[i] = v;
    }
    return t;
}

/* ---- device buffers */

static float *dev_up(const void *h, size_t bytes) {
    void *d = gpu->ops->alloc(gpu, bytes);
    if (d && bytes) gpu->ops->upload(gpu, d, h, bytes);
    return d;
}
/* poisoned through the op table: the pool's zero fill of a fresh buffer is
 * queued until the next op, so a raw fill right after alloc would run first */
static float *dev_poison(size_t bytes) {
    void *d = gpu->ops->alloc(gpu, bytes);
    uint8_t *ff = malloc(bytes ? bytes : 1);
    memset(ff, 0xff, bytes);
    if (d && bytes) gpu->ops->upload(gpu, d, ff, bytes);
    free(ff);
    return d;
}
static float *dev_down(const void *d, size_t bytes) {
    float *h = malloc(bytes ? bytes : 1);
    if (bytes) gpu->ops->download(gpu, h, d, bytes);
    return h;
}
static void dev_free(void *d) { gpu->ops->free(gpu, d); }

/* ---- comparisons */

static int same_bits(const float *a, const float *b, int64_t n);

static int status_ok(const char *what) {
    di_err err = {0};
    di_status st = di_backend_cuda_status(gpu, &err);
    CHECKF(st == DI_OK, "%s: backend error: %s", what, err.msg);
    return st == DI_OK;
}

static void cmp_exact(const char *what, const float *g, const float *c, int64_t n) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&g[i], &c[i], 4) && !(g[i] == c[i])) {
            if (first < 0) first = i;
            bad++;
        }
    CHECKF(bad == 0, "%s: %lld of %lld differ, first at %lld: gpu %.9g cpu %.9g", what,
           (long long)bad, (long long)n, (long long)first, first >= 0 ? g[first] : 0.0,
           first >= 0 ? c[first] : 0.0);
}

static double rms(const float *x, int64_t n) {
    double s = 0;
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i])) {
            s += (double)x[i] * x[i];
            k++;
        }
    return k ? sqrt(s / (double)k) : 0;
}

/* |g - c| <= rtol·|c| + atol_rel·rms(c); infinities must match exactly. */
static void cmp_tol(const char *what, const float *g, const float *c, int64_t n, double rtol,
                    double atol_rel) {
    double atol = atol_rel * rms(c, n);
    int64_t bad = 0, first = -1;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        int ok;
        if (isinf(c[i]) || isinf(g[i])) ok = g[i] == c[i];
        else {
            double d = fabs((double)g[i] - c[i]), lim = rtol * fabs(c[i]) + atol;
            ok = d <= lim; /* NaN fails */
            if (ok && lim > 0 && d / lim > worst) worst = d / lim;
        }
        if (!ok) {
            if (first < 0) first = i;
            bad++;
        }
    }
    CHECKF(bad == 0, "%s: %lld of %lld out of tolerance, first at %lld: gpu %.9g cpu %.9g", what,
           (long long)bad, (long long)n, (long long)first, first >= 0 ? g[first] : 0.0,
           first >= 0 ? c[first] : 0.0);
    if (getenv("DI_TEST_VERBOSE")) fprintf(stderr, "  %-40s worst %.3f of tolerance\n", what, worst);
}

#define BF16_ULP 0x1p-7

#define NEED_GPU() \
    if (!gpu) SKIP("%s", gpu_why)

/* ---- tests */

/* W[j, k] of a weight matrix, decoded exactly */
static double w_dec(const di_wmat *w, int64_t j, int64_t k) {
    int64_t K = w->n_in;
    const uint8_t *b = w->w, *s = w->s;
    const float *e4 = di_cpu_e4m3_table(), *e8 = di_cpu_e8m0_table();
    switch (w->fmt) {
    case DI_WFMT_F32: return ((const float *)w->w)[j * K + k];
    case DI_WFMT_BF16: return di_bf16_to_f32(((const uint16_t *)w->w)[j * K + k]);
    case DI_WFMT_FP8: return (double)e4[b[j * K + k]] * e8[s[(j / 32) * ((K + 31) / 32) + k / 32]];
    default:
        return (double)di_e2m1_to_f32((uint8_t)(b[j * (K / 2) + k / 2] >> (4 * (k & 1)))) *
               e8[s[j * (K / 32) + k / 32]];
    }
}

/* The products without activation quantization (matmul without
 * DI_MM_ACT_FP8, matmul_grouped): GPU and CPU each within their bound of the
 * exact sum (cuda_ops_linear.cu): the CPU's chain K·2^-24·Σ|w·x|, the
 * tensor-core sums (18·n_mma + 3)·2^-23·Σ|w·x| with n_mma = 6·ceil(K/256)
 * (cmp_plain; cmp_plain_rel takes the sum of both budgets, rel, as a
 * fraction of Σ|w·x|), a bf16 ulp when the outputs are rounded.
 * Infinities and NaN must match. */
static void cmp_plain_rel(const char *what, const di_wmat *w, int groups, const float *x, int64_t m,
                          const float *yg, const float *yc, int out_bf16, double rel) {
    int64_t N = w->n_out, K = w->n_in, nr = N / groups, bad = 0, first = -1;
    double worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < N; j++) {
            const float *xi = x + (i * groups + j / nr) * K;
            double S = 0;
            for (int64_t k = 0; k < K; k++) S += fabs(w_dec(w, j, k) * xi[k]);
            float g = yg[i * N + j], c = yc[i * N + j];
            int ok;
            if (isnan(c) || isinf(c)) ok = isnan(c) ? isnan(g) : g == c;
            else {
                double lim = rel * S + (out_bf16 ? BF16_ULP * fmax(fabs(g), fabs(c)) : 0) + 1e-37;
                double d = fabs((double)g - c);
                ok = d <= lim;
                if (ok && d / lim > worst) worst = d / lim;
            }
            if (!ok && first < 0) first = i * N + j;
            bad += !ok;
        }
    CHECKF(bad == 0, "%s: %lld of %lld beyond the bound, first at %lld: gpu %.9g cpu %.9g", what,
           (long long)bad, (long long)(m * N), (long long)first, first >= 0 ? yg[first] : 0.0,
           first >= 0 ? yc[first] : 0.0);
    if (getenv("DI_TEST_VERBOSE")) fprintf(stderr, "  %-48s worst %.4f of the bound\n", what, worst);
}
static void cmp_plain(const char *what, const di_wmat *w, int groups, const float *x, int64_t m,
                      const float *yg, const float *yc, int out_bf16) {
    const int64_t K = w->n_in;
    const double n_mma = 6.0 * (double)((K + 255) / 256);
    cmp_plain_rel(what, w, groups, x, m, yg, yc, out_bf16, ((double)K + 2.0 * (18.0 * n_mma + 3.0)) * 0x1p-24);
}

static void test_matmul(void) {
    NEED_GPU();
    const struct { di_wfmt fmt; int64_t m, k, n; unsigned flags; } cs[] = {
        {DI_WFMT_F32, 1, 45, 33, 0},          {DI_WFMT_BF16, 3, 64, 17, DI_MM_OUT_BF16},
        {DI_WFMT_BF16, 7, 129, 1, 0},         {DI_WFMT_FP8, 2, 96, 70, 0},
        {DI_WFMT_FP4, 5, 64, 31, DI_MM_OUT_BF16}, {DI_WFMT_FP8, 1, 64, 33, DI_MM_ACT_FP8},
        {DI_WFMT_FP8, 9, 160, 65, DI_MM_ACT_FP8 | DI_MM_OUT_BF16},
        {DI_WFMT_FP8, 40, 256, 96, DI_MM_ACT_FP8}, {DI_WFMT_FP4, 3, 96, 45, DI_MM_ACT_FP8},
        {DI_WFMT_FP4, 24, 128, 64, DI_MM_ACT_FP8 | DI_MM_OUT_BF16},
        /* more than one tile of 8 rows, 32 outputs and 64 inputs, ragged */
        {DI_WFMT_F32, 19, 200, 70, 0}, {DI_WFMT_FP8, 11, 130, 40, DI_MM_OUT_BF16},
        /* bf16 outputs rounded in the decode kernels' stores (k % 128 == 0:
         * the wgmma forms, one or several blocks along k), and past 16 rows
         * the prefill tiles and a rounding pass after them */
        {DI_WFMT_FP8, 1, 512, 96, DI_MM_ACT_FP8 | DI_MM_OUT_BF16},
        {DI_WFMT_FP8, 16, 2048, 70, DI_MM_ACT_FP8 | DI_MM_OUT_BF16},
        {DI_WFMT_FP4, 2, 256, 64, DI_MM_ACT_FP8 | DI_MM_OUT_BF16},
        {DI_WFMT_FP8, 40, 256, 96, DI_MM_ACT_FP8 | DI_MM_OUT_BF16},
        /* decode rows that quantize inside the product (m <= 8, k % 128 ==
         * 0): one and several cluster ranks, ragged outputs */
        {DI_WFMT_FP8, 5, 1024, 200, DI_MM_ACT_FP8 | DI_MM_OUT_BF16},
        {DI_WFMT_FP8, 8, 4096, 130, DI_MM_ACT_FP8},
        {DI_WFMT_FP8, 3, 2048, 64, DI_MM_ACT_FP8 | DI_MM_OUT_BF16},
    };
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        int64_t m = cs[t].m, K = cs[t].k, N = cs[t].n;
        di_wmat w = {cs[t].fmt, N, K, NULL, NULL};
        size_t wb = 0, sb = 0;
        uint8_t *wbuf = NULL, *sbuf = NULL;
        switch (w.fmt) {
        case DI_WFMT_F32: {
            float *f = rnd(N * K, 0.2f);
            wbuf = (uint8_t *)f;
            break;
        }
        case DI_WFMT_BF16: {
            uint16_t *b = malloc((size_t)(N * K) * 2);
            for (int64_t i = 0; i < N * K; i++) b[i] = di_f32_to_bf16(0.2f * rng_normal());
            wbuf = (uint8_t *)b;
            break;
        }
        case DI_WFMT_FP8:
            wb = (size_t)(N * K);
            sb = (size_t)(((N + 31) / 32) * (K / 32));
            wbuf = rng_e4m3(wb);
            sbuf = rng_e8m0(sb);
            break;
        default:
            wb = (size_t)(N * K / 2);
            sb = (size_t)(N * (K / 32));
            wbuf = rng_bytes(wb);
            sbuf = rng_e8m0(sb);
        }
        w.w = wbuf;
        w.s = sbuf;
        float *x = rnd(m * K, 1.0f);
        float *yc = malloc((size_t)(m * N) * 4);
        cpu->ops->matmul(cpu, &w, x, m, yc, cs[t].flags);
        float *dx = dev_up(x, (size_t)(m * K) * 4), *dy = dev_poison((size_t)(m * N) * 4);
        gpu->ops->matmul(gpu, &w, dx, m, dy, cs[t].flags);
        float *yg = dev_down(dy, (size_t)(m * N) * 4);
        char what[96];
        snprintf(what, sizeof what, "matmul fmt %d m %lld k %lld n %lld flags %u", (int)w.fmt,
                 (long long)m, (long long)K, (long long)N, cs[t].flags);
        if (status_ok(what)) {
            if (!(cs[t].flags & DI_MM_ACT_FP8)) {
                if (w.fmt == DI_WFMT_F32) cmp_exact(what, yg, yc, m * N);
                else cmp_plain(what, &w, 1, x, m, yg, yc, (cs[t].flags & DI_MM_OUT_BF16) != 0);
            } else {
                /* kernels.h's bound from the exact terms t = qa·sa·w·sw */
                uint8_t *q = malloc((size_t)(m * K));
                float *sa = malloc((size_t)(m * K / 32) * 4);
                di_act_quant_fp8(x, m, K, q, sa);
                const float *e4 = di_cpu_e4m3_table(), *e8 = di_cpu_e8m0_table();
                int64_t bad = 0;
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < N; j++) {
                        double S = 0, Smax = 0, bmax = 0;
                        for (int64_t k = 0; k < K; k++) {
                            double wv = w.fmt == DI_WFMT_FP8
                                            ? e4[wbuf[j * K + k]] * e8[sbuf[(j / 32) * (K / 32) + k / 32]]
                                            : di_e2m1_to_f32((uint8_t)(wbuf[j * (K / 2) + k / 2] >> (4 * (k & 1)))) *
                                                  e8[sbuf[j * (K / 32) + k / 32]];
                            double t = fabs(e4[q[i * K + k]] * sa[i * (K / 32) + k / 32] * wv);
                            S += t;
                            bmax = t > bmax ? t : bmax;
                            if (k % 32 == 31) {
                                Smax += bmax;
                                bmax = 0;
                            }
                        }
                        /* the CPU's fp32 budget, the GPU's promotion budget, and
                         * the FP8 tensor cores' short adder inside a 32-block
                         * (about 13 fraction bits below the largest addend:
                         * 2^-8 of each block's largest term, as in
                         * test_cuda_ops.c) */
                        double lim = (31 + 2 * (K / 32) + 2) * 0x1p-24 * S + 0x1p-8 * Smax;
                        if (cs[t].flags & DI_MM_OUT_BF16) lim += BF16_ULP * fabs(yc[i * N + j]) + 1e-30;
                        double d = fabs((double)yg[i * N + j] - yc[i * N + j]);
                        if (!(d <= lim)) bad++;
                    }
                CHECKF(bad == 0, "%s: %lld outputs beyond the kernels.h bound", what, (long long)bad);
                if (cs[t].flags & DI_MM_OUT_BF16) { /* every output a bf16 value, as the CPU's */
                    int64_t odd = 0;
                    for (int64_t i = 0; i < m * N; i++) odd += !isnan(yg[i]) && yg[i] != di_round_bf16(yg[i]);
                    CHECKF(odd == 0, "%s: %lld outputs not rounded to bf16", what, (long long)odd);
                }
                free(q);
                free(sa);
            }
        }
        di_backend_cuda_weights_drop(gpu);
        dev_free(dx);
        dev_free(dy);
        free(x); free(yc); free(yg); free(wbuf); free(sbuf);
    }
}

#if defined(DI_HAVE_CUDA)
long cuda_blas_calls(void); /* cuda_ops_linear.cu: GEMMs of the cuBLAS path so far */
#endif

/* BF16 products on bf16 inputs (DI_MM_ACT_BF16: the head) from 64 rows
 * (DI_CUDA_MM_BLAS) through cuBLAS: within 2K·2^-24·Σ|w·x| of the exact
 * sum (fp32 sums in any order, adds that may truncate) plus the CPU chain's
 * K·2^-24·Σ|w·x|, the GEMM counted (the path ran), bf16 outputs rounded;
 * in batch-invariant mode the flag changes nothing (the prefill form's
 * bits, which do not depend on m), nor below 64 rows. Shapes: 64 rows (the
 * threshold), 200 x 520 -> 333 (ragged), 1,030 rows at the model's 5,120
 * inputs, 63 rows (below). */
static void test_matmul_blas(void) {
    NEED_GPU();
#if defined(DI_HAVE_CUDA)
    const struct { int64_t m, k, n; unsigned out; int blas; } cs[] = {
        {64, 256, 300, 0, 1}, {200, 520, 333, DI_MM_OUT_BF16, 1}, {1030, 5120, 96, 0, 1}, {63, 256, 100, 0, 0}};
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        const int64_t m = cs[t].m, K = cs[t].k, N = cs[t].n;
        uint16_t *wb = malloc((size_t)(N * K) * 2);
        for (int64_t i = 0; i < N * K; i++) wb[i] = di_f32_to_bf16(0.2f * rng_normal());
        di_wmat w = {DI_WFMT_BF16, N, K, wb, NULL};
        float *x = rnd(m * K, 1.0f); /* bf16 values */
        float *yc = malloc((size_t)(m * N) * 4);
        cpu->ops->matmul(cpu, &w, x, m, yc, cs[t].out);
        float *dx = dev_up(x, (size_t)(m * K) * 4), *dy = dev_poison((size_t)(m * N) * 4);
        const long c0 = cuda_blas_calls();
        gpu->ops->matmul(gpu, &w, dx, m, dy, cs[t].out | DI_MM_ACT_BF16);
        const long c1 = cuda_blas_calls();
        float *yg = dev_down(dy, (size_t)(m * N) * 4);
        char what[96];
        snprintf(what, sizeof what, "matmul bf16 x (cuBLAS) m %lld k %lld n %lld%s", (long long)m, (long long)K,
                 (long long)N, cs[t].out ? " bf16 out" : "");
        if (status_ok(what)) {
            CHECKF(c1 - c0 == cs[t].blas, "%s: %ld cuBLAS GEMMs, %d expected", what, c1 - c0, cs[t].blas);
            cmp_plain_rel(what, &w, 1, x, m, yg, yc, cs[t].out != 0, 3.0 * (double)K * 0x1p-24);
            if (cs[t].out) {
                int64_t odd = 0;
                for (int64_t i = 0; i < m * N; i++) odd += !isnan(yg[i]) && yg[i] != di_round_bf16(yg[i]);
                CHECKF(odd == 0, "%s: %lld outputs not rounded to bf16", what, (long long)odd);
            }
            /* without the flag, and with it in batch-invariant mode: the same bits */
            float *dz = dev_poison((size_t)(m * N) * 4), *dz2 = dev_poison((size_t)(m * N) * 4);
            gpu->ops->matmul(gpu, &w, dx, m, dz, cs[t].out);
            gpu->ops->set_batch_invariant(gpu, 1);
            const long c2 = cuda_blas_calls();
            gpu->ops->matmul(gpu, &w, dx, m, dz2, cs[t].out | DI_MM_ACT_BF16);
            const long c3 = cuda_blas_calls();
            gpu->ops->set_batch_invariant(gpu, 0);
            float *y0 = dev_down(dz, (size_t)(m * N) * 4), *y1 = dev_down(dz2, (size_t)(m * N) * 4);
            CHECKF(status_ok(what) && c3 == c2 && !memcmp(y0, y1, (size_t)(m * N) * 4),
                   "%s: batch-invariant mode with the flag differs from the product without it", what);
            if (!cs[t].blas)
                CHECKF(!memcmp(yg, y0, (size_t)(m * N) * 4), "%s: below the cuBLAS rows the flag changed bits", what);
            dev_free(dz); dev_free(dz2);
            free(y0); free(y1);
        }
        di_backend_cuda_weights_drop(gpu);
        dev_free(dx); dev_free(dy);
        free(wb); free(x); free(yc); free(yg);
    }
#endif
}

static void test_matmul_grouped(void) {
    NEED_GPU();
    const struct { di_wfmt fmt; int g; int64_t m, k, r; } cs[] = {
        {DI_WFMT_BF16, 2, 3, 64, 5}, {DI_WFMT_FP8, 4, 5, 64, 32}, {DI_WFMT_FP8, 3, 1, 96, 40}};
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        int g = cs[t].g;
        int64_t m = cs[t].m, K = cs[t].k, N = g * cs[t].r;
        di_wmat w = {cs[t].fmt, N, K, NULL, NULL};
        uint8_t *wbuf, *sbuf = NULL;
        if (w.fmt == DI_WFMT_BF16) {
            uint16_t *b = malloc((size_t)(N * K) * 2);
            for (int64_t i = 0; i < N * K; i++) b[i] = di_f32_to_bf16(0.2f * rng_normal());
            wbuf = (uint8_t *)b;
        } else {
            wbuf = rng_e4m3((size_t)(N * K));
            sbuf = rng_e8m0((size_t)(((N + 31) / 32) * (K / 32)));
        }
        w.w = wbuf;
        w.s = sbuf;
        float *x = rnd(m * g * K, 1.0f), *yc = malloc((size_t)(m * N) * 4);
        cpu->ops->matmul_grouped(cpu, &w, g, x, m, yc);
        float *dx = dev_up(x, (size_t)(m * g * K) * 4), *dy = dev_poison((size_t)(m * N) * 4);
        gpu->ops->matmul_grouped(gpu, &w, g, dx, m, dy);
        float *yg = dev_down(dy, (size_t)(m * N) * 4);
        if (status_ok("matmul_grouped")) cmp_plain("matmul_grouped", &w, g, x, m, yg, yc, 1);
        di_backend_cuda_weights_drop(gpu);
        dev_free(dx); dev_free(dy);
        free(x); free(yc); free(yg); free(wbuf); free(sbuf);
    }
}

static void test_rows_ops(void) {
    NEED_GPU();
    /* rmsnorm's register forms (up to 4, 8 and 24 values a thread) and its
     * loop past 6144 */
    const int64_t shapes[][2] = {{1, 7}, {3, 64}, {5, 257}, {16, 1024}, {2, 1500}, {1, 5120}, {1, 7000}};
    for (size_t t = 0; t < sizeof shapes / sizeof *shapes; t++) {
        int64_t m = shapes[t][0], n = shapes[t][1];
        size_t B = (size_t)(m * n) * 4;
        char what[64];
        /* rmsnorm, both weight dtypes */
        for (int dt = 0; dt < 2; dt++) {
            di_tensor w = vec_tensor(n, 0, dt ? DI_DTYPE_BF16 : DI_DTYPE_F32);
            float *x = rnd(m * n, 3.0f), *yc = malloc(B);
            cpu->ops->rmsnorm(cpu, x, &w, m, n, 1e-6, yc);
            float *dx = dev_up(x, B), *dy = dev_poison(B);
            gpu->ops->rmsnorm(gpu, dx, &w, m, n, 1e-6, dy);
            float *yg = dev_down(dy, B);
            snprintf(what, sizeof what, "rmsnorm %lldx%lld", (long long)m, (long long)n);
            if (status_ok(what)) cmp_tol(what, yg, yc, m * n, BF16_ULP, 0);
            di_backend_cuda_weights_drop(gpu);
            dev_free(dx); dev_free(dy);
            free(x); free(yc); free(yg); free(w.data);
        }
        /* in-place elementwise: qdq (n rounded to the block; the FP4 ones in
         * their lane form, blocks spread over lanes, with a tail of a warp),
         * round, scale, add */
        int64_t nq = (m * n + 31) / 32 * 32;
        for (int op = 0; op < 6; op++) {
            float *x = rnd(nq, op == 3 ? 1.0f : ldexpf(1.0f, rng_int(30) - 15));
            for (int64_t i = 0; i < nq; i++) x[i] = x[i] * (1.0f + 0x1p-12f * (float)rng_int(7));
            if (op <= 2 && nq >= 96) /* the qdq: a zero block, one under the scale floors, one with a zero */
                for (int i = 0; i < 32; i++) {
                    x[i] = 0.0f;
                    x[32 + i] = 0x1p-140f * (float)(i - 16);
                    if (i == 5) x[64 + i] = 0.0f;
                }
            float *y = rnd(nq, 1.0f), *xc = malloc((size_t)nq * 4);
            memcpy(xc, x, (size_t)nq * 4);
            float *dx = dev_up(x, (size_t)nq * 4), *dy = dev_up(y, (size_t)nq * 4);
            static const char *names[] = {"qdq_fp8", "qdq_fp4_e8m0", "qdq_fp4_e4m3", "round_bf16",
                                          "scale_bf16", "add"};
            switch (op) {
            case 0: cpu->ops->qdq_fp8(cpu, xc, nq); gpu->ops->qdq_fp8(gpu, dx, nq); break;
            case 1: cpu->ops->qdq_fp4_e8m0(cpu, xc, nq); gpu->ops->qdq_fp4_e8m0(gpu, dx, nq); break;
            case 2: cpu->ops->qdq_fp4_e4m3(cpu, xc, nq); gpu->ops->qdq_fp4_e4m3(gpu, dx, nq); break;
            case 3: cpu->ops->round_bf16(cpu, xc, nq); gpu->ops->round_bf16(gpu, dx, nq); break;
            case 4: cpu->ops->scale_bf16(cpu, xc, nq, 0.37f); gpu->ops->scale_bf16(gpu, dx, nq, 0.37f); break;
            default: cpu->ops->add(cpu, xc, y, nq); gpu->ops->add(gpu, dx, dy, nq);
            }
            float *xg = dev_down(dx, (size_t)nq * 4);
            snprintf(what, sizeof what, "%s n %lld", names[op], (long long)nq);
            if (status_ok(what)) cmp_exact(what, xg, xc, nq);
            dev_free(dx); dev_free(dy);
            free(x); free(y); free(xc); free(xg);
        }
        /* swiglu with and without per-row weights and limit */
        for (int v = 0; v < 2; v++) {
            float *g = rnd(m * n, 4.0f), *u = rnd(m * n, 4.0f), *w = rnd(m, 1.0f), *oc = malloc(B);
            float lim = v ? 7.0f : 0.f;
            cpu->ops->swiglu(cpu, g, u, v ? w : NULL, m, n, lim, oc);
            float *dg = dev_up(g, B), *du = dev_up(u, B), *dw = dev_up(w, (size_t)m * 4),
                  *dout = dev_poison(B);
            gpu->ops->swiglu(gpu, dg, du, v ? dw : NULL, m, n, lim, dout);
            float *og = dev_down(dout, B);
            snprintf(what, sizeof what, "swiglu %lldx%lld", (long long)m, (long long)n);
            if (status_ok(what)) cmp_tol(what, og, oc, m * n, BF16_ULP, 1e-6);
            dev_free(dg); dev_free(du); dev_free(dw); dev_free(dout);
            free(g); free(u); free(w); free(oc); free(og);
        }
        /* gather / scatter-add with repeated rows */
        {
            int64_t rows_n = 2 * m + 1;
            int32_t *ids = malloc((size_t)m * 4);
            for (int64_t i = 0; i < m; i++) ids[i] = rng_int((int)rows_n);
            if (m > 1) ids[m - 1] = ids[0];
            float *src = rnd(rows_n * n, 1.0f), *gc = malloc(B);
            cpu->ops->gather_rows(cpu, src, ids, m, n, gc);
            float *dsrc = dev_up(src, (size_t)(rows_n * n) * 4), *dg = dev_poison(B);
            gpu->ops->gather_rows(gpu, dsrc, ids, m, n, dg);
            float *gg = dev_down(dg, B);
            if (status_ok("gather_rows")) cmp_exact("gather_rows", gg, gc, m * n);
            cpu->ops->scatter_add_rows(cpu, src, ids, gc, m, n);
            gpu->ops->scatter_add_rows(gpu, dsrc, ids, dg, m, n);
            float *sg = dev_down(dsrc, (size_t)(rows_n * n) * 4);
            if (status_ok("scatter_add_rows")) cmp_exact("scatter_add_rows", sg, src, rows_n * n);
            dev_free(dsrc); dev_free(dg);
            free(ids); free(src); free(gc); free(gg); free(sg);
        }
    }
}

static void test_rope(void) {
    NEED_GPU();
    const struct { int64_t m; int heads; int64_t hd, rd; } cs[] = {
        {1, 1, 64, 64}, {3, 4, 72, 32}, {17, 2, 128, 64}, {5, 3, 40, 6}};
    for (size_t t = 0; t < 4; t++) {
        int64_t m = cs[t].m, hd = cs[t].hd, rd = cs[t].rd, stride = cs[t].heads * hd + 3;
        int32_t *pos = malloc((size_t)m * 4);
        for (int64_t i = 0; i < m; i++) pos[i] = rng_int(70000);
        float *freq = malloc((size_t)(rd / 2) * 4);
        for (int64_t j = 0; j < rd / 2; j++) freq[j] = powf(10000.f, -2.f * (float)j / (float)rd);
        for (int inv = 0; inv < 2; inv++) {
            float *x = rnd(m * stride, 1.0f), *xc = malloc((size_t)(m * stride) * 4);
            memcpy(xc, x, (size_t)(m * stride) * 4);
            float *dx = dev_up(x, (size_t)(m * stride) * 4);
            cpu->ops->rope(cpu, xc, m, stride, cs[t].heads, hd, rd, pos, freq, inv);
            gpu->ops->rope(gpu, dx, m, stride, cs[t].heads, hd, rd, pos, freq, inv);
            float *xg = dev_down(dx, (size_t)(m * stride) * 4);
            if (status_ok("rope")) cmp_exact("rope", xg, xc, m * stride);
            dev_free(dx);
            free(x); free(xc); free(xg);
        }
        free(pos); free(freq);
    }
}

/* Cases 3 and 4 gather 2,100-2,700 Engram rows: the prefill form (a
 * pinned buffer filled by host threads, an asynchronous copy), twice back
 * to back with other ids before anything is read, the first copy queued
 * behind eight 2 GB device fills: the second gather must wait for that
 * copy before it refills the buffer, or the first output gets its rows. */
static void test_gathers(void) {
    NEED_GPU();
    for (int t = 0; t < 5; t++) {
        const int big = t >= 3;
        int64_t V = big ? 3000 + rng_int(1000) : 50 + rng_int(50), n = 32 * (1 + rng_int(5)),
                m = big ? 700 + rng_int(200) : 1 + rng_int(9);
        int32_t *ids = malloc((size_t)(m * 3) * 4);
        for (int64_t i = 0; i < m * 3; i++) ids[i] = rng_int((int)V);
        /* embed (BF16 and F32 tables) */
        di_tensor tab = vec_tensor(V, n, t == 1 ? DI_DTYPE_F32 : DI_DTYPE_BF16);
        size_t B = (size_t)(m * n) * 4;
        float *oc = malloc(B), *d = dev_poison(B);
        cpu->ops->embed(cpu, &tab, ids, m, oc);
        gpu->ops->embed(gpu, &tab, ids, m, d);
        float *og = dev_down(d, B);
        if (status_ok("embed")) cmp_exact("embed", og, oc, m * n);
        dev_free(d); free(oc); free(og); free(tab.data);
        /* Engram gather from a host FP8 table, 3 columns */
        di_tensor rows = {.dtype = DI_DTYPE_F8_E4M3, .ndim = 2, .shape = {V, n}};
        di_tensor sc = {.dtype = DI_DTYPE_F8_E8M0, .ndim = 2, .shape = {V, n / 32}};
        rows.data = rng_e4m3((size_t)(V * n));
        sc.data = rng_e8m0((size_t)(V * n / 32));
        size_t B3 = 3 * B;
        oc = malloc(B3);
        d = dev_poison(B3);
        cpu->ops->engram_gather(cpu, &rows, &sc, ids, m, 3, oc);
        /* the second gather's inputs and references first: nothing that
         * waits for the device may run between the two gathers */
        int32_t *ids2 = NULL;
        float *oc2 = NULL, *d2 = NULL;
        void *slow = NULL;
        di_err ferr = {0};
        if (big) {
            ids2 = malloc((size_t)(m * 3) * 4);
            for (int64_t i = 0; i < m * 3; i++) ids2[i] = (int32_t)((ids[i] + 1 + i) % V);
            oc2 = malloc(B3);
            d2 = dev_poison(B3);
            cpu->ops->engram_gather(cpu, &rows, &sc, ids2, m, 3, oc2);
            /* a gather of this size first, so that neither gather below
             * grows the pinned buffer or the device scratch (freeing the old
             * one waits for the device, which would drain the queue) */
            gpu->ops->engram_gather(gpu, &rows, &sc, ids2, m, 3, d);
            /* ~5 ms of device work ahead of the first copy */
            CHECK(di_cuda_alloc(&slow, (size_t)2 << 30, &ferr) == DI_OK);
            for (int r = 0; r < 8; r++) CHECK(di_cuda_fill(slow, r, (size_t)2 << 30, &ferr) == DI_OK);
        }
        gpu->ops->engram_gather(gpu, &rows, &sc, ids, m, 3, d);
        if (big) { /* a second gather of other rows, queued behind the first */
            gpu->ops->engram_gather(gpu, &rows, &sc, ids2, m, 3, d2);
            float *og2 = dev_down(d2, B3);
            if (status_ok("engram_gather (second, queued)"))
                cmp_exact("engram_gather (second, queued)", og2, oc2, 3 * m * n);
            dev_free(d2); free(oc2); free(og2); free(ids2);
            di_cuda_free(slow);
        }
        og = dev_down(d, B3);
        if (status_ok("engram_gather")) cmp_exact("engram_gather", og, oc, 3 * m * n);
        CHECK(di_backend_cuda_weights_bytes(gpu) > 0); /* the embed table, not the Engram rows */
        CHECK(di_backend_cuda_weights_bytes(gpu) < (size_t)(V * n) * 4 + 1);
        di_backend_cuda_weights_drop(gpu);
        dev_free(d); free(oc); free(og); free(rows.data); free(sc.data); free(ids);
    }
}

/* Engram gate: s [m, hc, d] += gate·value, kv [m, hc+1, d], f32 and bf16
 * weights, against the CPU's. */
static void engram_gate_check(int64_t m, int hc, int64_t d) {
    const size_t SB = (size_t)(m * hc * d) * 4;
    for (int dt = 0; dt < 2; dt++) {
        di_tensor qw = vec_tensor(hc * d, 0, dt ? DI_DTYPE_BF16 : DI_DTYPE_F32);
        di_tensor kw = vec_tensor(hc * d, 0, dt ? DI_DTYPE_BF16 : DI_DTYPE_F32);
        float *kv = rnd(m * (hc + 1) * d, 1.0f), *s3 = rnd(m * hc * d, 1.0f);
        float *dkv = dev_up(kv, (size_t)(m * (hc + 1) * d) * 4), *ds3 = dev_up(s3, SB);
        cpu->ops->engram_gate(cpu, s3, kv, &qw, &kw, m, hc, d, 1e-6);
        gpu->ops->engram_gate(gpu, ds3, dkv, &qw, &kw, m, hc, d, 1e-6);
        float *g3 = dev_down(ds3, SB);
        if (status_ok("engram_gate")) cmp_tol("engram_gate", g3, s3, m * hc * d, BF16_ULP, 1e-4);
        di_backend_cuda_weights_drop(gpu);
        dev_free(dkv); dev_free(ds3);
        free(qw.data); free(kw.data); free(kv); free(s3); free(g3);
    }
}

static void test_hc(void) {
    NEED_GPU();
    /* {1, 4, 64} and {70, 4, 516} take hc_expand's four-column form (a
     * ragged last block), the others its element form */
    const struct { int64_t m; int hc; int64_t d; } cs[] = {{1, 4, 64}, {3, 4, 257}, {6, 2, 100}, {2, 3, 33}, {70, 4, 516}};
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        int64_t m = cs[t].m, d = cs[t].d;
        int hc = cs[t].hc, nmix = (2 + hc) * hc;
        float *s = rnd(m * hc * d, 1.0f), *fn = rnd(nmix * hc * d, 0.05f), *base = rnd(nmix, 0.5f);
        float scale[3] = {0.7f, 1.1f, 0.9f};
        size_t SB = (size_t)(m * hc * d) * 4;
        float *ds = dev_up(s, SB);
        /* mix */
        float *pc = malloc((size_t)(m * hc) * 4), *poc = malloc((size_t)(m * hc) * 4),
              *cc = malloc((size_t)(m * hc * hc) * 4);
        cpu->ops->hc_mix(cpu, s, m, hc, d, fn, base, scale, 1e-6, 1e-6, 20, pc, poc, cc);
        float *dp = dev_poison((size_t)(m * hc) * 4), *dpo = dev_poison((size_t)(m * hc) * 4),
              *dc = dev_poison((size_t)(m * hc * hc) * 4);
        gpu->ops->hc_mix(gpu, ds, m, hc, d, fn, base, scale, 1e-6, 1e-6, 20, dp, dpo, dc);
        float *pg = dev_down(dp, (size_t)(m * hc) * 4), *pog = dev_down(dpo, (size_t)(m * hc) * 4),
              *cg = dev_down(dc, (size_t)(m * hc * hc) * 4);
        if (status_ok("hc_mix")) {
            cmp_tol("hc_mix pre", pg, pc, m * hc, 1e-4, 1e-6);
            cmp_tol("hc_mix post", pog, poc, m * hc, 1e-4, 1e-6);
            cmp_tol("hc_mix comb", cg, cc, m * hc * hc, 1e-4, 1e-6);
        }
        /* collapse with the CPU's pre weights (the same input on both sides) */
        float *yc = malloc((size_t)(m * d) * 4), *dy = dev_poison((size_t)(m * d) * 4);
        float *dpre = dev_up(pc, (size_t)(m * hc) * 4), *dpost = dev_up(poc, (size_t)(m * hc) * 4),
              *dcomb = dev_up(cc, (size_t)(m * hc * hc) * 4);
        cpu->ops->hc_collapse(cpu, s, pc, m, hc, d, yc);
        gpu->ops->hc_collapse(gpu, ds, dpre, m, hc, d, dy);
        float *yg = dev_down(dy, (size_t)(m * d) * 4);
        if (status_ok("hc_collapse")) cmp_exact("hc_collapse", yg, yc, m * d);
        /* mean into a strided output */
        int64_t ost = d + 5;
        float *mc = malloc((size_t)(m * ost) * 4), *dm = dev_poison((size_t)(m * ost) * 4);
        memset(mc, 0xff, (size_t)(m * ost) * 4); /* the gaps keep the device's poison bits */
        cpu->ops->hc_mean(cpu, s, m, hc, d, mc, ost);
        gpu->ops->hc_mean(gpu, ds, m, hc, d, dm, ost);
        float *mg = dev_down(dm, (size_t)(m * ost) * 4);
        if (status_ok("hc_mean")) cmp_exact("hc_mean", mg, mc, m * ost);
        /* expand in place (out aliases s) */
        float *sc2 = malloc(SB);
        memcpy(sc2, s, SB);
        cpu->ops->hc_expand(cpu, yc, sc2, poc, cc, m, hc, d, sc2);
        gpu->ops->hc_expand(gpu, dy, ds, dpost, dcomb, m, hc, d, ds);
        float *eg = dev_down(ds, SB);
        if (status_ok("hc_expand")) cmp_exact("hc_expand in place", eg, sc2, m * hc * d);
        engram_gate_check(m, hc, d);
        di_backend_cuda_weights_drop(gpu);
        dev_free(ds); dev_free(dp); dev_free(dpo); dev_free(dc); dev_free(dy); dev_free(dpre);
        dev_free(dpost); dev_free(dcomb); dev_free(dm);
        free(s); free(fn); free(base); free(pc); free(poc); free(cc); free(pg); free(pog);
        free(cg); free(yc); free(yg); free(mc); free(mg); free(sc2); free(eg);
    }
    engram_gate_check(1, 4, 5120); /* the model's rows: the four-value form */
    engram_gate_check(3, 4, 5120);
}

static void test_attention(void) {
    NEED_GPU();
    const struct { int64_t m; int h; int64_t d; int slots; } cs[] = {
        {1, 1, 64, 5}, {3, 4, 128, 64}, {2, 3, 72, 130}, {5, 2, 512, 200}};
    for (size_t t = 0; t < 4; t++) {
        int64_t m = cs[t].m, d = cs[t].d;
        int h = cs[t].h, ns = cs[t].slots, P = ns + 7;
        float *pool = rnd((int64_t)P * d, 1.0f), *q = rnd(m * h * d, 1.0f), *sink = rnd(h, 1.0f);
        float *dpool = dev_up(pool, (size_t)((int64_t)P * d) * 4), *dq = dev_up(q, (size_t)(m * h * d) * 4);
        di_kvrow *rc = malloc((size_t)(m * ns) * sizeof *rc), *rg = malloc((size_t)(m * ns) * sizeof *rg);
        for (int64_t i = 0; i < m * ns; i++) {
            int r = rng_int(P), empty = rng_int(5) == 0;
            rc[i] = empty ? NULL : pool + (int64_t)r * d;
            rg[i] = empty ? NULL : dpool + (int64_t)r * d;
        }
        size_t OB = (size_t)(m * h * d) * 4;
        float *oc = malloc(OB), *dout = dev_poison(OB);
        float sc = (float)(1.0 / sqrt((double)d));
        cpu->ops->sparse_attn(cpu, q, m, h, d, rc, ns, sink, sc, oc);
        gpu->ops->sparse_attn(gpu, dq, m, h, d, rg, ns, sink, sc, dout);
        float *og = dev_down(dout, OB);
        char what[64];
        snprintf(what, sizeof what, "sparse_attn m %lld h %d d %lld slots %d", (long long)m, h,
                 (long long)d, ns);
        if (status_ok(what)) cmp_tol(what, og, oc, m * h * d, 2 * BF16_ULP, 2e-3);
        di_backend_cuda_weights_drop(gpu);
        dev_free(dpool); dev_free(dq); dev_free(dout);
        free(pool); free(q); free(sink); free(rc); free(rg); free(oc); free(og);
    }
}

static void test_indexer(void) {
    NEED_GPU();
    const struct { int64_t m; int hi; int64_t di, width; int k, bs, tb; } cs[] = {
        {1, 2, 32, 10, 4, 4, 2}, {4, 8, 64, 130, 16, 8, 5}, {3, 3, 128, 300, 64, 16, 4}};
    for (size_t t = 0; t < 3; t++) {
        int64_t m = cs[t].m, di = cs[t].di, W = cs[t].width;
        int hi = cs[t].hi;
        float *keys = rnd(W * di, 1.0f), *q = rnd(m * hi * di, 1.0f), *w = rnd(m * hi, 1.0f);
        float *dkeys = dev_up(keys, (size_t)(W * di) * 4), *dq = dev_up(q, (size_t)(m * hi * di) * 4),
              *dw = dev_up(w, (size_t)(m * hi) * 4);
        const float **kc = malloc((size_t)m * sizeof *kc), **kg = malloc((size_t)m * sizeof *kg);
        int32_t *nv = malloc((size_t)m * 4);
        for (int64_t i = 0; i < m; i++) {
            int64_t off = rng_int((int)(W / 4) + 1);
            nv[i] = (int32_t)(rng_int((int)(W - off)) + (i == 0 ? 0 : 1));
            kc[i] = keys + off * di;
            kg[i] = dkeys + off * di;
        }
        size_t SB = (size_t)(m * W) * 4;
        float *scc = malloc(SB), *dsc = dev_poison(SB);
        cpu->ops->index_scores(cpu, q, w, m, hi, di, kc, nv, W, scc);
        gpu->ops->index_scores(gpu, dq, dw, m, hi, di, kg, nv, W, dsc);
        float *scg = dev_down(dsc, SB);
        if (status_ok("index_scores")) cmp_tol("index_scores", scg, scc, m * W, 2 * BF16_ULP, 0x1p-7);
        /* the selections run on one set of scores (the CPU's) on both sides */
        gpu->ops->upload(gpu, dsc, scc, SB);
        int k = cs[t].k, bs = cs[t].bs, tb = cs[t].tb;
        int32_t *ic = malloc((size_t)(m * k) * 4), *ig = malloc((size_t)(m * k) * 4);
        cpu->ops->topk_select(cpu, scc, nv, m, W, k, ic);
        gpu->ops->topk_select(gpu, dsc, nv, m, W, k, ig);
        CHECKF(status_ok("topk_select") && !memcmp(ic, ig, (size_t)(m * k) * 4), "topk_select");
        int32_t *bc = malloc((size_t)(m * tb) * 4), *bg = malloc((size_t)(m * tb) * 4);
        cpu->ops->candidate_blocks(cpu, scc, nv, m, W, tb, bs, bc);
        gpu->ops->candidate_blocks(gpu, dsc, nv, m, W, tb, bs, bg);
        CHECKF(status_ok("candidate_blocks") && !memcmp(bc, bg, (size_t)(m * tb) * 4),
               "candidate_blocks");
        cpu->ops->restrict_blocks(cpu, scc, bc, m, W, tb, bs);
        gpu->ops->restrict_blocks(gpu, dsc, bc, m, W, tb, bs);
        float *rg = dev_down(dsc, SB);
        if (status_ok("restrict_blocks")) cmp_exact("restrict_blocks", rg, scc, m * W);
        dev_free(dkeys); dev_free(dq); dev_free(dw); dev_free(dsc);
        free(keys); free(q); free(w); free(kc); free(kg); free(nv); free(scc); free(scg);
        free(ic); free(ig); free(bc); free(bg); free(rg);
    }
}

/* restrict_blocks on lists of every kind against the CPU's walk, bit for
 * bit: the model's shape (2,048 blocks of 8 over 8,200 scores: the GPU's
 * row form, a binary search over the list's running maximum), lists
 * ascending with -1 padding, full, empty, with a negative entry in the
 * middle, unsorted, with entries past the row's blocks and repeated ones;
 * small shapes (blocks of 3, a last block cut short) too. Scores are
 * poisoned nowhere: what the op leaves must be the input. */
static void test_restrict_lists(void) {
    NEED_GPU();
    const struct { int64_t m, W; int tb, bs; } cs[] = {{6, 8200, 2048, 8}, {6, 100, 5, 3}, {6, 61, 40, 2}};
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        const int64_t m = cs[t].m, W = cs[t].W, nblk = (W + cs[t].bs - 1) / cs[t].bs;
        const int tb = cs[t].tb, bs = cs[t].bs;
        float *sc = rnd(m * W, 1.0f), *scc = malloc((size_t)(m * W) * 4);
        memcpy(scc, sc, (size_t)(m * W) * 4);
        int32_t *b = malloc((size_t)(m * tb) * 4);
        for (int64_t i = 0; i < m; i++) {
            int32_t *r = b + i * tb;
            int kind = (int)i; /* 0 ascending + padding, 1 full, 2 empty, 3 negative inside, 4 unsorted, 5 repeats / past */
            int64_t v = rng_int(3);
            for (int c = 0; c < tb; c++) {
                v += 1 + rng_int(2);
                r[c] = kind == 0 ? (c < tb / 2 && v < nblk ? (int32_t)v : -1)
                     : kind == 1 ? (int32_t)((c * nblk) / tb)
                     : kind == 2 ? -1
                     : kind == 3 ? (c == tb / 3 ? -1 : (int32_t)(v % nblk))
                     : kind == 4 ? (int32_t)rng_int((int)nblk)
                                 : (int32_t)(rng_int(4) == 0 ? nblk + rng_int(5) : (c / 2) % nblk);
            }
        }
        float *d = dev_up(sc, (size_t)(m * W) * 4);
        cpu->ops->restrict_blocks(cpu, scc, b, m, W, tb, bs);
        gpu->ops->restrict_blocks(gpu, d, b, m, W, tb, bs);
        float *g = dev_down(d, (size_t)(m * W) * 4);
        char what[64];
        snprintf(what, sizeof what, "restrict_blocks %lld x %lld, %d blocks of %d", (long long)m, (long long)W, tb, bs);
        if (status_ok(what)) cmp_exact(what, g, scc, m * W);
        dev_free(d);
        free(sc); free(scc); free(b); free(g);
    }
}

static void test_moe_and_pool(void) {
    NEED_GPU();
    for (int t = 0; t < 3; t++) {
        int64_t m = 1 + rng_int(20);
        int e = t == 0 ? 8 : 64 + rng_int(200), k = t == 0 ? 2 : 6;
        float *lg = rnd(m * e, 2.0f), *bias = rnd(e, 0.1f);
        int32_t *ic = malloc((size_t)(m * k) * 4), *ig = malloc((size_t)(m * k) * 4);
        float *wc = malloc((size_t)(m * k) * 4), *wg = malloc((size_t)(m * k) * 4);
        float *dl = dev_up(lg, (size_t)(m * e) * 4);
        cpu->ops->moe_route(cpu, lg, bias, m, e, k, t != 2, 2.5f, ic, wc);
        gpu->ops->moe_route(gpu, dl, bias, m, e, k, t != 2, 2.5f, ig, wg);
        CHECKF(status_ok("moe_route") && !memcmp(ic, ig, (size_t)(m * k) * 4) &&
                   !memcmp(wc, wg, (size_t)(m * k) * 4),
               "moe_route");
        dev_free(dl);
        free(lg); free(bias); free(ic); free(ig); free(wc); free(wg);
        /* compression pooling, ratio 1..4 */
        int r = 1 + t, n = 33 + 64 * t;
        float *a = rnd(m * r * n, 1.0f), *g = rnd(m * r * n, 2.0f), *oc = malloc((size_t)(m * n) * 4);
        float *da = dev_up(a, (size_t)(m * r * n) * 4), *dg = dev_up(g, (size_t)(m * r * n) * 4),
              *dout = dev_poison((size_t)(m * n) * 4);
        cpu->ops->compress_pool(cpu, a, g, m, r, n, oc);
        gpu->ops->compress_pool(gpu, da, dg, m, r, n, dout);
        float *og = dev_down(dout, (size_t)(m * n) * 4);
        if (status_ok("compress_pool")) cmp_tol("compress_pool", og, oc, m * n, BF16_ULP, 1e-5);
        dev_free(da); dev_free(dg); dev_free(dout);
        free(a); free(g); free(oc); free(og);
    }
}

/* The packed cache forms (backend/kvstore.h): kv_pack byte for byte, and
 * sparse_attn_kv / index_scores_kv on rows packed by the CPU: attention
 * within attn_bound.h's bound (from the rows' decoded values, which both
 * sides use exactly), the index scores within the tolerance of their fp32
 * form. */
static void test_kv(void) {
    NEED_GPU();
    for (int fmt = 0; fmt < DI_KVQ_COUNT; fmt++) {
        int64_t m = 1 + rng_int(7), n = 32 * (1 + rng_int(6));
        float *x = rnd(m * n, ldexpf(1.0f, rng_int(20) - 10));
        size_t rb = di_kvq_row_bytes((di_kvq)fmt, n), B = (size_t)m * rb;
        uint8_t *pc = malloc(B);
        cpu->ops->kv_pack(cpu, (di_kvq)fmt, x, m, n, pc);
        float *dx = dev_up(x, (size_t)(m * n) * 4);
        uint8_t *dp = (uint8_t *)dev_poison(B);
        gpu->ops->kv_pack(gpu, (di_kvq)fmt, dx, m, n, dp);
        uint8_t *pg = (uint8_t *)dev_down(dp, B);
        CHECKF(status_ok("kv_pack") && !memcmp(pc, pg, B), "kv_pack format %d %lldx%lld", fmt,
               (long long)m, (long long)n);
        dev_free(dx); dev_free(dp);
        free(x); free(pc); free(pg);
    }
    const struct { int64_t m; int h; int64_t d; int slots, win; } cs[] = {
        {1, 2, 64, 5, 3}, {3, 4, 128, 130, 70}, {2, 1, 512, 64, 0}};
    for (size_t t = 0; t < 3; t++) {
        int64_t m = cs[t].m, d = cs[t].d;
        int h = cs[t].h, ns = cs[t].slots, P = 20;
        size_t r8 = di_kvq_row_bytes(DI_KVQ_FP8, d), r4 = di_kvq_row_bytes(DI_KVQ_FP4_E4M3, d);
        float *src = rnd(2 * P * d, 1.0f), *dec = malloc((size_t)(2 * P * d) * sizeof(float));
        uint8_t *pool = malloc((size_t)P * (r8 + r4));
        for (int r = 0; r < P; r++) {
            di_kvq_pack(DI_KVQ_FP8, src + r * d, d, pool + (size_t)r * r8);
            di_kvq_pack(DI_KVQ_FP4_E4M3, src + (P + r) * d, d, pool + (size_t)P * r8 + (size_t)r * r4);
            di_kvq_unpack(DI_KVQ_FP8, pool + (size_t)r * r8, d, dec + (int64_t)r * d);
            di_kvq_unpack(DI_KVQ_FP4_E4M3, pool + (size_t)P * r8 + (size_t)r * r4, d, dec + (int64_t)(P + r) * d);
        }
        uint8_t *dpool = (uint8_t *)dev_up(pool, (size_t)P * (r8 + r4));
        const uint8_t **rc = malloc((size_t)(m * ns) * sizeof *rc), **rg = malloc((size_t)(m * ns) * sizeof *rg);
        const float **rd = malloc((size_t)(m * ns) * sizeof *rd);
        for (int64_t i = 0; i < m; i++)
            for (int j = 0; j < ns; j++) {
                int r = rng_int(P), empty = rng_int(6) == 0;
                size_t off = j < cs[t].win ? (size_t)r * r8 : (size_t)P * r8 + (size_t)r * r4;
                rc[i * ns + j] = empty ? NULL : pool + off;
                rg[i * ns + j] = empty ? NULL : dpool + off;
                rd[i * ns + j] = empty ? NULL : dec + (int64_t)(j < cs[t].win ? r : P + r) * d;
            }
        /* q bf16, as the model passes it (the tensor-core kernel takes q as
         * bf16). The fixed tolerance this check had (2 bf16 ulps + 2e-3 of
         * the rms) failed on 1 of 1,536 values in b1 runs 5 and 6
         * (docs/gpu-notes.md): a bf16(p) straddle moves an output by up to
         * 2^-7 of its A_k, which the derived bound allows for. */
        float *q = rnd(m * h * d, 1.0f), *sink = rnd(h, 1.0f);
        for (int64_t e = 0; e < m * h * d; e++) q[e] = di_round_bf16(q[e]);
        float *dq = dev_up(q, (size_t)(m * h * d) * 4);
        size_t OB = (size_t)(m * h * d) * 4;
        float *oc = malloc(OB), *dout = dev_poison(OB), sc = (float)(1.0 / sqrt((double)d));
        cpu->ops->sparse_attn_kv(cpu, q, m, h, d, rc, ns, cs[t].win, sink, sc, oc);
        gpu->ops->sparse_attn_kv(gpu, dq, m, h, d, rg, ns, cs[t].win, sink, sc, dout);
        float *og = dev_down(dout, OB);
        char what[96];
        snprintf(what, sizeof what, "sparse_attn_kv m %lld h %d d %lld slots %d", (long long)m, h, (long long)d, ns);
        if (status_ok(what)) cmp_attn_tc(what, og, oc, q, m, h, d, rd, ns, sink, sc);
        di_backend_cuda_weights_drop(gpu);
        dev_free(dpool); dev_free(dq); dev_free(dout);
        free(src); free(dec); free(pool); free(rc); free(rg); free(rd); free(q); free(sink); free(oc); free(og);
    }
    for (int t = 0; t < 2; t++) {
        int64_t m = 1 + rng_int(4), di = t ? 128 : 64, W = 40 + rng_int(100);
        int hi = 1 + rng_int(8);
        size_t kb = di_kvq_row_bytes(DI_KVQ_FP4_E8M0, di);
        float *src = rnd(W * di, 1.0f), *q = rnd(m * hi * di, 1.0f), *w = rnd(m * hi, 1.0f);
        uint8_t *keys = malloc((size_t)W * kb);
        for (int64_t r = 0; r < W; r++) di_kvq_pack(DI_KVQ_FP4_E8M0, src + r * di, di, keys + (size_t)r * kb);
        uint8_t *dkeys = (uint8_t *)dev_up(keys, (size_t)W * kb);
        float *dq = dev_up(q, (size_t)(m * hi * di) * 4), *dw = dev_up(w, (size_t)(m * hi) * 4);
        const uint8_t **kc = malloc((size_t)m * sizeof *kc), **kg = malloc((size_t)m * sizeof *kg);
        int32_t *nv = malloc((size_t)m * 4);
        for (int64_t i = 0; i < m; i++) {
            int64_t off = rng_int((int)(W / 4) + 1);
            nv[i] = (int32_t)rng_int((int)(W - off) + 1);
            kc[i] = keys + (size_t)off * kb;
            kg[i] = dkeys + (size_t)off * kb;
        }
        size_t SB = (size_t)(m * W) * 4;
        float *scc = malloc(SB), *dsc = dev_poison(SB);
        cpu->ops->index_scores_kv(cpu, q, w, m, hi, di, kc, nv, W, scc);
        gpu->ops->index_scores_kv(gpu, dq, dw, m, hi, di, kg, nv, W, dsc);
        float *scg = dev_down(dsc, SB);
        if (status_ok("index_scores_kv")) cmp_tol("index_scores_kv", scg, scc, m * W, 2 * BF16_ULP, 0x1p-7);
        dev_free(dkeys); dev_free(dq); dev_free(dw); dev_free(dsc);
        free(src); free(q); free(w); free(keys); free(kc); free(kg); free(nv); free(scc); free(scg);
    }
}

/* Kernels launched back to back, each reading what the one before wrote
 * (the small kernels start programmatically, before the one ahead of them
 * ends: cuda_launch_pdl): a chain of 60 adds and queued copies, a += b then
 * b = a, on 2^17 values (many blocks) must give exactly the CPU's values —
 * small integers times powers of two, so every sum is exact and a read of
 * a stale b or a shows. */
static void test_dependent_chain(void) {
    NEED_GPU();
    const int64_t n = (int64_t)1 << 17;
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        a[i] = (float)rng_int(4);
        b[i] = (float)rng_int(4);
    }
    float *da = dev_up(a, (size_t)n * 4), *db = dev_up(b, (size_t)n * 4);
    for (int r = 0; r < 60; r++) {
        for (int64_t i = 0; i < n; i++) a[i] += b[i];
        memcpy(b, a, (size_t)n * 4);
        gpu->ops->add(gpu, da, db, n);
        gpu->ops->copy(gpu, db, da, (size_t)n * 4 / 2); /* two queued copies of half */
        gpu->ops->copy(gpu, db + n / 2, da + n / 2, (size_t)n * 4 / 2);
    }
    float *ga = dev_down(da, (size_t)n * 4), *gb = dev_down(db, (size_t)n * 4);
    if (status_ok("dependent chain"))
        CHECKF(!memcmp(ga, a, (size_t)n * 4) && !memcmp(gb, b, (size_t)n * 4), "dependent chain of adds and copies differs from the CPU");
    dev_free(da); dev_free(db);
    free(a); free(b); free(ga); free(gb);
}

/* alloc zeroes; copy handles overlapping ranges as memmove does */
static void test_memory(void) {
    NEED_GPU();
    int64_t n = 1000 + rng_int(1000);
    float *d = gpu->ops->alloc(gpu, (size_t)n * 4), *x = rnd(n, 1.0f);
    float *z = dev_down(d, (size_t)n * 4);
    int zero = 1;
    for (int64_t i = 0; i < n; i++) zero &= z[i] == 0.f;
    CHECK(zero);
    gpu->ops->upload(gpu, d, x, (size_t)n * 4);
    gpu->ops->copy(gpu, d + 7, d, (size_t)(n - 7) * 4);
    memmove(x + 7, x, (size_t)(n - 7) * 4);
    float *y = dev_down(d, (size_t)n * 4);
    if (status_ok("copy")) cmp_exact("overlapping copy", y, x, n);
    dev_free(d);
    free(x); free(y); free(z);
    /* the logits' host buffer: page-locked, and a download reaches it whole
     * (an odd size; the bytes past it untouched) */
    {
        int64_t nl = 100003;
        float *hl = di_host_alloc(gpu, (size_t)(nl + 16) * 4), *xl = rnd(nl, 1.0f);
        CHECK(hl != NULL && di_cuda_host_pinned(hl));
        memset(hl, 0xff, (size_t)(nl + 16) * 4);
        float *dl = dev_up(xl, (size_t)nl * 4);
        gpu->ops->download(gpu, hl, dl, (size_t)nl * 4);
        if (status_ok("download to page-locked memory")) cmp_exact("download to page-locked memory", hl, xl, nl);
        uint32_t tail = 0xffffffffu;
        for (int i = 0; i < 16; i++) tail &= ((uint32_t *)hl)[nl + i];
        CHECK(tail == 0xffffffffu);
        CHECK(!di_cuda_host_pinned(xl));
        dev_free(dl);
        di_host_free(gpu, hl);
        free(xl);
    }
    /* queued row copies in random order, some reading rows an earlier copy
     * of the same queue wrote: the result must be that of doing them one by
     * one; rows of 37 floats (byte path) and 64 (16-byte path) */
    for (int t = 0; t < 2; t++) {
        int64_t rows = 600, wd = t ? 64 : 37, nc = 300 + rng_int(200);
        float *h = rnd(rows * wd, 1.0f);
        float *dd = dev_up(h, (size_t)(rows * wd) * 4);
        for (int64_t c = 0; c < nc; c++) {
            int64_t a = rng_int((int)rows), b = rng_int((int)rows);
            memmove(h + a * wd, h + b * wd, (size_t)wd * 4);
            gpu->ops->copy(gpu, dd + a * wd, dd + b * wd, (size_t)wd * 4);
        }
        float *got = dev_down(dd, (size_t)(rows * wd) * 4);
        if (status_ok("queued copies")) cmp_exact("queued copies", got, h, rows * wd);
        dev_free(dd);
        free(h); free(got);
    }
    /* what a prefill queues: runs of adjacent rows into two arrays in turn
     * (the compressor's groups: merged in the queue, up to 256 KiB a copy,
     * so these 600 KB runs take several), the embedding's spread of rows to
     * four copies back to front in place (reading rows the runs still read:
     * the queue runs first), then random row copies; rows of 512 floats
     * in four regions A, GA, GG, B of 300 rows */
    {
        const int64_t rows = 300, wd = 512, A = 0, GA = rows, GG = 2 * rows, B = 3 * rows;
        float *h = rnd(4 * rows * wd, 1.0f);
        float *dd = dev_up(h, (size_t)(4 * rows * wd) * 4);
#define ROWCOPY(to, from)                                                                          \
    do {                                                                                           \
        memmove(h + (to) * wd, h + (from) * wd, (size_t)wd * 4);                                   \
        gpu->ops->copy(gpu, dd + (to) * wd, dd + (from) * wd, (size_t)wd * 4);                     \
    } while (0)
        for (int64_t i = 0; i < rows; i++) {
            ROWCOPY(GA + i, A + i);
            ROWCOPY(GG + i, B + i);
        }
        for (int64_t i = rows / 4 - 1; i >= 0; i--)
            for (int k = 3; k >= 0; k--) ROWCOPY(A + 4 * i + k, A + i);
        for (int c = 0; c < 200; c++) {
            const int64_t to = rng_int((int)(4 * rows)), from = rng_int((int)(4 * rows));
            ROWCOPY(to, from);
        }
#undef ROWCOPY
        float *got = dev_down(dd, (size_t)(4 * rows * wd) * 4);
        if (status_ok("queued runs")) cmp_exact("queued runs, spread and row copies", got, h, 4 * rows * wd);
        dev_free(dd);
        free(h); free(got);
    }
}

/* Device selections at the indexer's real sizes, with many ties (scores on
 * a coarse grid), -inf, NaN, both zeros and +inf among them, rows with
 * fewer valid scores than k and empty rows: the CPU's choice, bit for bit. */
static void test_selection_large(void) {
    NEED_GPU();
    /* narrow: scores 1 + N(0, 1)·2^-8, so that every key shares its top
     * bits (the first radix passes' histograms hold one or two bins) and
     * the decisive digits lie in the mantissa; the real b1 shape (one row,
     * ~1,000 ratio-1 entries, top-512) among them */
    const struct { int64_t m, width; int k, bs, tb, narrow; } cs[] = {
        {6, 5000, 512, 8, 64, 0}, {3, 70000, 512, 8, 2048, 0}, {4, 1000, 2048, 8, 200, 0},
        {1, 1000, 512, 8, 64, 1}, {5, 16384, 512, 8, 2048, 1}};
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        int64_t m = cs[t].m, W = cs[t].width;
        int k = cs[t].k, bs = cs[t].bs, tb = cs[t].tb;
        float *sc = malloc((size_t)(m * W) * 4);
        int32_t *nv = malloc((size_t)m * 4);
        for (int64_t i = 0; i < m * W; i++) {
            int r = rng_int(1000);
            if (cs[t].narrow) {
                sc[i] = r < 5 ? -INFINITY : 1.0f + rng_normal() * 0x1p-8f;
                continue;
            }
            sc[i] = r < 20 ? -INFINITY : r < 25 ? NAN : r < 30 ? -0.0f : r < 35 ? 0.0f : r < 37 ? INFINITY
                                                                                          : (float)(rng_int(300) - 150) * 0.25f;
        }
        for (int64_t i = 0; i < m; i++) /* one row: all visible; else row 0 empty, row 1 past the width */
            nv[i] = m == 1 ? (int32_t)W : i == 0 ? 0 : i == 1 ? (int32_t)(W + 5) : (int32_t)rng_int((int)W);
        float *dsc = dev_up(sc, (size_t)(m * W) * 4);
        int32_t *ic = malloc((size_t)(m * k) * 4), *ig = malloc((size_t)(m * k) * 4);
        cpu->ops->topk_select(cpu, sc, nv, m, W, k, ic);
        gpu->ops->topk_select(gpu, dsc, nv, m, W, k, ig);
        CHECKF(status_ok("topk_select") && !memcmp(ic, ig, (size_t)(m * k) * 4), "topk_select width %lld k %d",
               (long long)W, k);
        int32_t *bc = malloc((size_t)(m * tb) * 4), *bg = malloc((size_t)(m * tb) * 4);
        cpu->ops->candidate_blocks(cpu, sc, nv, m, W, tb, bs, bc);
        gpu->ops->candidate_blocks(gpu, dsc, nv, m, W, tb, bs, bg);
        CHECKF(status_ok("candidate_blocks") && !memcmp(bc, bg, (size_t)(m * tb) * 4),
               "candidate_blocks width %lld blocks %d", (long long)W, tb);
        dev_free(dsc);
        free(sc); free(nv); free(ic); free(ig); free(bc); free(bg);
    }
}

/* ---- the device MoE path (cuda_ops_moe.h), not yet in the op table */

/* ||a - b|| / ||b||; NaN or a zero b gives +inf (fails any bound) */
static double rel_l2_f(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 && num == num ? sqrt(num / den) : INFINITY;
}

static int same_or_nan(const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4) && !(isnan(a[i]) && isnan(b[i]))) return 0;
    return 1;
}

/* The router score of core/route_score.h on the device: the host's bits
 * on a million inputs across the whole fp32 range and the special ones. */
static void test_route_score_device(void) {
    NEED_GPU();
    int64_t n = 1 << 20;
    float *x = malloc((size_t)n * 4), *yc = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        uint32_t b = (uint32_t)rng_next();
        if (i % 4 == 0) b = (b & 0x80ffffffu) | (uint32_t)(0x3c + rng_int(10)) << 24; /* |x| in [2^-7, 2^8) */
        memcpy(&x[i], &b, 4);
    }
    const float sp[] = {0.0f, -0.0f, 20.0f, -20.0f, 20.000002f, -87.3365479f, -103.97f, -104.0f,
                        -104.00001f, INFINITY, -INFINITY, NAN, -NAN, 1e-30f, -1e-30f};
    memcpy(x, sp, sizeof sp);
    for (int64_t i = 0; i < n; i++) yc[i] = di_route_score(x[i]);
    float *dx = dev_up(x, (size_t)n * 4), *dy = dev_poison((size_t)n * 4);
    di_err err = {0};
    di_status st = cuda_op_route_score(dx, n, dy, NULL, &err);
    CHECKF(st == DI_OK, "route_score: %s", err.msg);
    float *yg = dev_down(dy, (size_t)n * 4);
    if (status_ok("route_score")) cmp_exact("route_score", yg, yc, n);
    int nan_bits = 1; /* NaN in, the one quiet NaN out, on both */
    for (int i = 11; i <= 12; i++) nan_bits &= !memcmp(&yg[i], &yc[i], 4);
    CHECK(nan_bits);
    dev_free(dx); dev_free(dy);
    free(x); free(yc); free(yg);
}

/* The rows' greedy summaries (logits_greedy, core/row_exp.h) against the
 * CPU op, bit for bit, whole structs: the first maximum under a search
 * bound and a ban (on the first maximum, elsewhere, past the bound, none),
 * the row's maximum and its sum of exponentials (fixed-point terms);
 * vocabularies of the model's size and odd ones (partial chunks, rows
 * shorter than a vector of 8); rows with ties, both zeros, NaN (the sum's
 * NaN), +inf (terms of 1), nothing finite, the ban on the only finite
 * value. The summaries go to poisoned device memory. */
static void test_logits_greedy(void) {
    NEED_GPU();
    const int64_t Vs[] = {129280, 1003, 2049, 7, 8};
    const int64_t Ms[] = {5, 64, 3, 4, 4};
    int rows = 0;
    for (int c = 0; c < 5; c++) {
        const int64_t V = Vs[c], m = Ms[c];
        float *x = malloc((size_t)(m * V) * sizeof *x);
        int32_t *ban = malloc((size_t)m * sizeof *ban);
        for (int64_t i = 0; i < m * V; i++) x[i] = (float)rng_int(48) / 8.0f - 3.0f; /* many ties */
        for (int64_t r = 0; r < m; r++) {
            float *row = x + r * V;
            switch (r % 8) {
            case 1: row[rng_int((int)V)] = NAN; break;
            case 2: row[rng_int((int)V)] = INFINITY; row[V - 1] = INFINITY; break;
            case 3: for (int64_t i = 0; i < V; i++) row[i] = i % 3 ? -INFINITY : NAN; break;
            case 4: for (int64_t i = 0; i < V; i++) row[i] = i % 2 ? 0.0f : -0.0f; break;
            case 5: for (int64_t i = 0; i < V; i++) row[i] = -INFINITY; row[V / 2] = 1.5f; break;
            case 6: row[V - 1] = 7.0f; break; /* the maximum past a bound */
            default: break;
            }
        }
        for (int l = 0; l < 3; l++) {
            const int64_t lim = l == 0 ? V : l == 1 ? V - V / 5 : V + 3; /* past V: V */
            const int64_t lb = lim < V ? lim : V;
            for (int64_t r = 0; r < m; r++) {
                const float *row = x + r * V;
                int32_t first = -1;
                for (int64_t i = 0; i < lb; i++)
                    if (row[i] > -INFINITY && (first < 0 || row[i] > row[first])) first = (int32_t)i;
                const int k = (int)((r + l) % 4);
                ban[r] = k == 0 ? -1 : k == 1 ? (first >= 0 ? first : (int32_t)(V / 2)) : k == 2 ? (int32_t)(V - 1)
                                                                                          : rng_int((int)V);
            }
            di_row_greedy *hc = malloc((size_t)m * sizeof *hc), *hg = malloc((size_t)m * sizeof *hg);
            cpu->ops->logits_greedy(cpu, x, m, V, lim, l == 2 ? NULL : ban, hc);
            float *dx = dev_up(x, (size_t)(m * V) * sizeof *x);
            di_row_greedy *dg = (di_row_greedy *)dev_poison((size_t)m * sizeof *dg);
            gpu->ops->logits_greedy(gpu, dx, m, V, lim, l == 2 ? NULL : ban, dg);
            gpu->ops->download(gpu, hg, dg, (size_t)m * sizeof *hg);
            if (status_ok("logits_greedy"))
                for (int64_t r = 0; r < m; r++) {
                    CHECKF(!memcmp(&hg[r], &hc[r], sizeof hg[r]),
                           "V %lld lim %lld row %lld ban %d: device max %g token %d all %g sum %.17g, "
                           "host %g %d %g %.17g",
                           (long long)V, (long long)lim, (long long)r, l == 2 ? -1 : ban[r], hg[r].max, hg[r].token,
                           hg[r].max_all, hg[r].sum, hc[r].max, hc[r].token, hc[r].max_all, hc[r].sum);
                    rows++;
                }
            dev_free(dx);
            dev_free(dg);
            free(hc);
            free(hg);
        }
        free(x);
        free(ban);
    }
    CHECK_EQ_INT(rows, 3 * (5 + 64 + 3 + 4 + 4));
}

/* Top lists on the device (logits_top), and values at an id a row
 * (logits_pick), against di_row_top_of (the
 * sampler's top logprobs' order, test_sampler.c), bit for bit, ids and
 * values: rows of many ties, NaN, infinities, zeros of both signs, rows of
 * fewer numbers than k, odd widths and the model's, k = 1, 5, 20 and 32,
 * outputs poisoned; and a list longer than DI_ROW_TOP_MAX or the row, or
 * of none, is an error. */
static void test_logits_top(void) {
    NEED_GPU();
    CHECK(gpu->ops->logits_top != NULL);
    if (!gpu->ops->logits_top) return;
    const int64_t Vs[] = {129280, 1003, 33, 257};
    const int64_t Ms[] = {5, 9, 4, 3};
    const int32_t ks[] = {1, 5, 20, 32};
    int rows = 0;
    for (int c = 0; c < 4; c++) {
        const int64_t V = Vs[c], m = Ms[c];
        float *x = malloc((size_t)(m * V) * sizeof *x);
        for (int64_t i = 0; i < m * V; i++) x[i] = (float)rng_int(48) / 8.0f - 3.0f; /* many ties */
        for (int64_t r = 0; r < m; r++) {
            float *row = x + r * V;
            switch (r % 6) {
            case 1: for (int q = 0; q < 9; q++) row[rng_int((int)V)] = NAN; break;
            case 2: row[rng_int((int)V)] = INFINITY; row[V - 1] = INFINITY; row[0] = -INFINITY; break;
            case 3: for (int64_t i = 0; i < V; i++) row[i] = i % 5 ? NAN : -INFINITY; break; /* few numbers */
            case 4: for (int64_t i = 0; i < V; i++) row[i] = i % 2 ? 0.0f : -0.0f; break;
            case 5: for (int64_t i = 0; i < V; i++) row[i] = -(float)(i % 97) / 4.0f; break;
            default: break;
            }
        }
        float *dx = dev_up(x, (size_t)(m * V) * sizeof *x);
        for (int q = 0; q < 4; q++) {
            const int32_t k = ks[q];
            if (k > V) continue;
            di_row_top *dt = (di_row_top *)dev_poison((size_t)(m * k) * sizeof *dt);
            di_row_top *ht = malloc((size_t)(m * k) * sizeof *ht), *ref = malloc((size_t)k * sizeof *ref);
            gpu->ops->logits_top(gpu, dx, m, V, k, dt);
            gpu->ops->download(gpu, ht, dt, (size_t)(m * k) * sizeof *ht);
            if (status_ok("logits_top"))
                for (int64_t r = 0; r < m; r++) {
                    di_row_top_of(x + r * V, V, k, ref);
                    CHECKF(!memcmp(ht + r * k, ref, (size_t)k * sizeof *ref),
                           "V %lld k %d row %lld: the device's top list differs (first: %d %g against %d %g)",
                           (long long)V, (int)k, (long long)r, ht[r * k].id, ht[r * k].x, ref[0].id, ref[0].x);
                    rows++;
                }
            dev_free(dt);
            free(ht);
            free(ref);
        }
        dev_free(dx);
        free(x);
    }
    CHECK_EQ_INT(rows, 5 * 4 + 9 * 4 + 4 * 4 + 3 * 4); /* every k fits every width */
    /* logits_pick: each row's value at its id, bits included (NaN, -0) */
    {
        const int64_t V = 1003, m = 37;
        float *x = malloc((size_t)(m * V) * sizeof *x), got[37];
        int32_t cols[37];
        for (int64_t i = 0; i < m * V; i++) x[i] = (float)rng_int(4096) / 64.0f - 32.0f;
        for (int64_t r = 0; r < m; r++) {
            cols[r] = r == 0 ? 0 : r == 1 ? (int32_t)(V - 1) : rng_int((int)V);
            if (r == 2) x[r * V + cols[r]] = NAN;
            if (r == 3) x[r * V + cols[r]] = -0.0f;
        }
        float *dx = dev_up(x, (size_t)(m * V) * sizeof *x), *dp = dev_poison((size_t)m * sizeof(float));
        gpu->ops->logits_pick(gpu, dx, m, V, cols, dp);
        gpu->ops->download(gpu, got, dp, (size_t)m * sizeof(float));
        if (status_ok("logits_pick")) {
            int ok = 1;
            for (int64_t r = 0; r < m; r++) ok &= !memcmp(&got[r], &x[r * V + cols[r]], 4);
            CHECKF(ok, "logits_pick: a row's value differs");
        }
        dev_free(dx);
        dev_free(dp);
        free(x);
    }
#if defined(DI_HAVE_CUDA)
    /* the launcher's refusals (the backend op would keep the error) */
    float *dx = dev_up((float[40]){0}, 40 * sizeof(float));
    di_row_top *dt = (di_row_top *)dev_poison(64 * sizeof *dt);
    const int32_t bad[] = {0, DI_ROW_TOP_MAX + 1, 41};
    for (int q = 0; q < 3; q++) {
        di_err err = {0};
        CHECKF(cuda_op_logits_top(dx, 1, 40, bad[q], dt, &err) == DI_ERR_INVALID_ARG && err.msg[0],
               "logits_top: a list of %d accepted", (int)bad[q]);
    }
    dev_free(dx);
    dev_free(dt);
#endif
}

/* Draws on the device (logits_draw) against the plain reference
 * (draw_ref.h, the sampler's definition, which test_sampler.c holds to
 * di_sampler_sample bit for bit), temperature draws and greedy ones, with
 * and without edited ids (bias, stop ids, penalties): the same token, its logit and
 * the row's log-sum-exp terms, bit for bit (without a token only the token
 * is read), none left to the host — near sets of up to 4,096 sorted in
 * shared memory, wider ones (flat rows, ties) by radix passes. Rows of
 * every draw_case shape, several to a call, odd widths and search bounds,
 * outputs poisoned. */
static void test_logits_draw(void) {
    NEED_GPU();
    const int64_t Vs[] = {129280, 1003, 50, 7, 129280};
    const int64_t Ms[] = {24, 40, 30, 12, 3};
    int rows = 0, drawn = 0, wide = 0, filtered = 0, edited = 0, greedy = 0;
    for (int c = 0; c < 5; c++) {
        const int64_t V = Vs[c], m = Ms[c];
        const int64_t lim = c == 1 ? V - 17 : c == 3 ? V - 1 : V;
        float *x = malloc((size_t)(m * V) * sizeof *x);
        di_row_draw *d = malloc((size_t)m * sizeof *d);
        di_row_greedy *ref = malloc((size_t)m * sizeof *ref), *got = malloc((size_t)m * sizeof *got);
        di_row_edit *ed = malloc((size_t)m * 128 * sizeof *ed);
        int64_t ne = 0;
        for (int64_t r = 0; r < m; r++) {
            di_sampler_params p;
            di_sample_in in;
            draw_case((int)(r + 7 * c), x + r * V, V, &p, &in);
            if (c == 4) p.top_p = 0.95, p.top_k = 0, p.temperature = 1.0; /* wide nuclei: some left to the host */
            CHECK(di_sampler_draw_spec(&p, &in, &d[r]));
            const int64_t n = di_sampler_needs_edits(&p, &in) ? draw_edits(&p, &in, ed + ne, 128) : 0;
            d[r].e0 = ne, d[r].n_edit = n > 0 ? (int32_t)n : 0; /* no list form: the row unedited */
            ne += d[r].n_edit;
            edited += d[r].n_edit > 0;
            greedy += d[r].greedy;
            CHECK(draw_ref(x + r * V, V, lim, &d[r], ed, 4096, &ref[r]));
            wide += ref[r].pad; /* wider than shared memory sorts: the radix form */
            CHECK(draw_ref(x + r * V, V, lim, &d[r], ed, V, &ref[r]));
        }
        float *dx = dev_up(x, (size_t)(m * V) * sizeof *x);
        di_row_greedy *dg = (di_row_greedy *)dev_poison((size_t)m * sizeof *dg);
        gpu->ops->logits_draw(gpu, dx, m, V, lim, d, ed, dg);
        gpu->ops->download(gpu, got, dg, (size_t)m * sizeof *got);
        if (status_ok("logits_draw"))
            for (int64_t r = 0; r < m; r++) {
                const di_row_greedy *a = &got[r], *b = &ref[r];
                const int same = a->pad == b->pad &&
                                 (b->pad || (a->token == b->token &&
                                             (b->token < 0 || (!memcmp(&a->max, &b->max, sizeof a->max) &&
                                                               !memcmp(&a->max_all, &b->max_all, sizeof a->max_all) &&
                                                               !memcmp(&a->sum, &b->sum, sizeof a->sum)))));
                CHECKF(same, "V %lld lim %lld row %lld (T %g top-k %d top-p %g min-p %g ban %d): device pad %d token %d "
                       "max %g all %g sum %.17g, reference pad %d token %d max %g all %g sum %.17g", (long long)V,
                       (long long)lim, (long long)r, 1.0 / d[r].inv_t, d[r].top_k, d[r].top_p, d[r].min_p, d[r].ban,
                       a->pad, a->token, a->max, a->max_all, a->sum, b->pad, b->token, b->max, b->max_all, b->sum);
                rows++;
                drawn += !b->pad && b->token >= 0;
                filtered += !b->pad && b->token >= 0 && !d[r].greedy && (d[r].top_k > 0 || d[r].top_p < 1);
            }
        dev_free(dx);
        dev_free(dg);
        free(x);
        free(ed);
        free(d);
        free(ref);
        free(got);
    }
    CHECK_EQ_INT(rows, 24 + 40 + 30 + 12 + 3);
    CHECKF(drawn > 60 && wide >= 3 && filtered > 20 && edited > 25 && greedy > 8,
           "%d drawn (%d with top-k / top-p, %d wider than 4,096), %d with edited ids, %d greedy", drawn, filtered,
           wide, edited, greedy);
}

/* Device routing against the CPU op: the same experts and weights, bit for
 * bit (a NaN weight counts as equal to a NaN weight: the device's NaN
 * arithmetic gives another NaN payload), on logits with ties, ±0, ±inf and
 * NaN, biases with ties, up to 1024 experts. */
static void test_moe_route_device(void) {
    NEED_GPU();
    /* nonan: no NaN logit (the model's case: the few-row kernel's
     * reductions then pick), else about one in 200 */
    const struct { int64_t m; int e, k, norm, nonan; } cs[] = {
        {1, 8, 2, 1, 0},     {7, 96, 6, 1, 0}, {64, 384, 6, 1, 0}, {300, 256, 8, 0, 0}, {33, 1024, 6, 1, 0},
        {5, 6, 6, 1, 0},     {1, 384, 6, 1, 1}, {8, 384, 6, 1, 1}, {3, 1024, 8, 0, 1},  {2, 6, 6, 1, 1},
        {64, 384, 6, 1, 1},
    };
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        int64_t m = cs[t].m;
        int e = cs[t].e, k = cs[t].k;
        float *lg = malloc((size_t)(m * e) * 4), *bias = malloc((size_t)e * 4);
        for (int64_t i = 0; i < m * e; i++) {
            int r = cs[t].nonan ? 1 + rng_int(199) : rng_int(200);
            lg[i] = r == 0 ? NAN : r == 1 ? INFINITY : r == 2 ? -INFINITY : r == 3 ? -0.0f : r < 40
                ? (float)(rng_int(9) - 4) * 0.5f : 3.0f * rng_normal();
        }
        for (int j = 0; j < e; j++) bias[j] = j % 5 == 0 ? 0.0f : di_round_bf16(0.1f * rng_normal());
        int32_t *ic = malloc((size_t)(m * k) * 4), *ig = malloc((size_t)(m * k) * 4);
        float *wc = malloc((size_t)(m * k) * 4);
        cpu->ops->moe_route(cpu, lg, bias, m, e, k, cs[t].norm, 1.5f, ic, wc);
        float *dl = dev_up(lg, (size_t)(m * e) * 4), *db = dev_up(bias, (size_t)e * 4);
        int32_t *didx = (int32_t *)dev_poison((size_t)(m * k) * 4);
        float *dw = dev_poison((size_t)(m * k) * 4);
        di_err err = {0};
        di_status st = cuda_op_moe_route(dl, db, m, e, k, cs[t].norm, 1.5f, didx, dw, NULL, &err);
        CHECKF(st == DI_OK, "moe_route (device): %s", err.msg);
        int32_t *igd = (int32_t *)dev_down(didx, (size_t)(m * k) * 4);
        float *wg = dev_down(dw, (size_t)(m * k) * 4);
        memcpy(ig, igd, (size_t)(m * k) * 4);
        if (status_ok("moe_route (device)"))
            CHECKF(!memcmp(ic, ig, (size_t)(m * k) * 4) && same_or_nan(wc, wg, m * k),
                   "moe_route (device) m %lld e %d k %d differs from the CPU op", (long long)m, e, k);
        dev_free(dl); dev_free(db); dev_free(didx); dev_free(dw);
        free(lg); free(bias); free(ic); free(ig); free(igd); free(wc); free(wg);
    }
}

/* The grouped experts on the device (routing from the device router)
 * against the CUDA backend's own per-expert loop — gather, matmul, swiglu,
 * matmul, scatter-add through the op table, as moe.c runs it — bit for bit
 * up to 16 rows (both take the products' decode kernel), and against the
 * CPU op within the FP8 linears' spread: relative L2 below one bf16 ulp
 * (2^-7; the per-element differences are bf16 flips of the expert outputs
 * and, rarely, an FP8 code flip of SwiGLU's output; test_matmul bounds the
 * products themselves). Outputs poisoned; experts with no rows, rows
 * sharing experts. */
static void test_moe_experts_device(void) {
    NEED_GPU();
    const struct { int64_t m, D, I; int E, k, a8; } cs[] = {
        {1, 256, 128, 9, 3, 0}, {5, 256, 128, 9, 3, 0}, {16, 512, 256, 12, 6, 0}, {40, 256, 128, 7, 2, 0},
        {700, 256, 128, 9, 3, 0}, /* 2,100 pairs: the plan's rounds of 1,024, one partly full */
        {3, 256, 128, 16, 10, 0}, /* the combine's second batch of loads (more than 8 a row) */
        /* I % 256 == 0: w2 on the tensor-core decode kernel, which forms its
         * SwiGLU input itself where the pair is one wave (the case of 16 rows
         * above too): f16 slots, groups past a token tile (300 rows), the A8
         * form (forced: the model's w2 never takes it); and a pair of several
         * waves (I 5,120, 64 experts), where w2 reads the quantization's
         * output */
        {1, 512, 512, 16, 6, 0}, {8, 256, 768, 24, 6, 0}, {300, 256, 512, 96, 6, 0}, {8, 256, 512, 24, 6, 1},
        {4, 256, 2304, 16, 6, 0}, /* the model's I: a fill of two rounds a thread */
        {40, 256, 5120, 64, 6, 0},
        /* 160 experts, at least half the H200's 264 block places: the
         * decode kernel's WG form, with 16 token slots from 384 rows (groups
         * of ~22 tokens: two tiles); at I 256 the pair is one wave, so w2
         * forms its SwiGLU input on 16 slots too */
        {600, 256, 512, 160, 6, 0}, {600, 256, 256, 160, 6, 0},
    };
    const long sw0 = cuda_moe_swiglu_w2_calls();
#if defined(DI_HAVE_CUDA)
    void cuda_fp4_dec_set_a8(int on); /* cuda_fp4_dec.cu: 1 the A8 form, 0 the f16 one, -1 chosen */
#endif
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        int64_t m = cs[t].m, D = cs[t].D, I = cs[t].I;
        int E = cs[t].E, k = cs[t].k;
#if defined(DI_HAVE_CUDA)
        cuda_fp4_dec_set_a8(cs[t].a8 ? 1 : -1);
#endif
        const unsigned mm = DI_MM_ACT_FP8 | DI_MM_OUT_BF16;
        const float limit = 10.0f;
        size_t wb1 = (size_t)(I * D / 2), sb1 = (size_t)(I * (D / 32)), wb2 = (size_t)(D * I / 2),
               sb2 = (size_t)(D * (I / 32));
        struct { di_wmat w1, w2, w3; } *ex = calloc((size_t)E, sizeof *ex);
        const void **hw[3], **hs[3];
        for (int q = 0; q < 3; q++) {
            hw[q] = calloc((size_t)E, sizeof(void *));
            hs[q] = calloc((size_t)E, sizeof(void *));
        }
        for (int e = 0; e < E; e++) {
            for (int q = 0; q < 3; q++) { /* q: w1, w3, w2 */
                size_t wb = q == 2 ? wb2 : wb1, sb = q == 2 ? sb2 : sb1;
                uint8_t *s8 = malloc(sb);
                for (size_t i = 0; i < sb; i++) s8[i] = (uint8_t)(121 + rng_int(6));
                hw[q][e] = rng_bytes(wb);
                hs[q][e] = s8;
            }
            ex[e].w1 = (di_wmat){DI_WFMT_FP4, I, D, hw[0][e], hs[0][e]};
            ex[e].w3 = (di_wmat){DI_WFMT_FP4, I, D, hw[1][e], hs[1][e]};
            ex[e].w2 = (di_wmat){DI_WFMT_FP4, D, I, hw[2][e], hs[2][e]};
        }
        void *dwt[3] = {0}, *dsc[3] = {0};
        di_err err = {0};
        di_status st = DI_OK;
        for (int q = 0; q < 3 && !st; q++) {
            size_t wb = q == 2 ? wb2 : wb1, sb = q == 2 ? sb2 : sb1;
            st = di_cuda_alloc(&dwt[q], wb * (size_t)E, &err);
            if (!st) st = di_cuda_alloc(&dsc[q], sb * (size_t)E, &err);
            if (!st) st = cuda_moe_stack(E, hw[q], hs[q], wb, sb, dwt[q], dsc[q], &err);
        }
        CHECKF(st == DI_OK, "stacking the experts: %s", err.msg);
        cuda_moe_weights W = {E, D, I, dwt[0], dsc[0], dwt[1], dsc[1], dwt[2], dsc[2]};
        /* routing from logits on the device, the CPU's copy for the references */
        float *x = rnd(m * D, 1.0f), *lg = rnd(m * E, 2.0f), *bias = rnd(E, 0.1f);
        for (int64_t i = 0; i < m; i++) lg[i * E + 1] = -30.0f; /* expert 1 never picked... */
        for (int64_t i = 0; i < m; i++) lg[i * E] = 8.0f;       /* ...expert 0 by every row */
        int32_t *idx = malloc((size_t)(m * k) * 4);
        float *wt = malloc((size_t)(m * k) * 4);
        cpu->ops->moe_route(cpu, lg, bias, m, E, k, 1, 1.5f, idx, wt);
        float *dx = dev_up(x, (size_t)(m * D) * 4), *dl = dev_up(lg, (size_t)(m * E) * 4),
              *db = dev_up(bias, (size_t)E * 4);
        int32_t *didx = (int32_t *)dev_poison((size_t)(m * k) * 4);
        float *dw = dev_poison((size_t)(m * k) * 4), *dout = dev_poison((size_t)(m * D) * 4);
        size_t sbytes = cuda_moe_experts_scratch(m, k, E, D, I);
        void *scr = NULL;
        if (!st) st = di_cuda_alloc(&scr, sbytes, &err);
        if (!st) st = cuda_op_moe_route(dl, db, m, E, k, 1, 1.5f, didx, dw, NULL, &err);
        if (!st)
            st = cuda_op_moe_experts(&W, dx, m, didx, dw, k, 1, limit, scr, sbytes, dout, NULL, &err);
        CHECKF(st == DI_OK, "moe_experts (device): %s", err.msg);
        float *got = dev_down(dout, (size_t)(m * D) * 4);
        /* the plan, the quantizations and SwiGLU as separate launches give
         * the fused launches' bits */
        cuda_moe_set_fused(0);
        float *dsep = dev_poison((size_t)(m * D) * 4);
        if (!st)
            st = cuda_op_moe_experts(&W, dx, m, didx, dw, k, 1, limit, scr, sbytes, dsep, NULL, &err);
        cuda_moe_set_fused(1);
        float *sep = dev_down(dsep, (size_t)(m * D) * 4);
        CHECKF(st == DI_OK && same_bits(got, sep, m * D),
               "moe_experts m %lld: fused and separate launches differ", (long long)m);
        /* and with f32 terms (out_bf16 = 0: SwiGLU's inputs and the combine's terms not rounded to bf16) */
        float *df0 = dev_poison((size_t)(m * D) * 4);
        if (!st) st = cuda_op_moe_experts(&W, dx, m, didx, dw, k, 0, limit, scr, sbytes, df0, NULL, &err);
        cuda_moe_set_fused(0);
        if (!st) st = cuda_op_moe_experts(&W, dx, m, didx, dw, k, 0, limit, scr, sbytes, dsep, NULL, &err);
        cuda_moe_set_fused(1);
        float *f0 = dev_down(df0, (size_t)(m * D) * 4), *s0 = dev_down(dsep, (size_t)(m * D) * 4);
        CHECKF(st == DI_OK && same_bits(f0, s0, m * D) && !same_bits(f0, got, m * D),
               "moe_experts m %lld, f32 terms: fused and separate launches differ (or equal the bf16 ones)",
               (long long)m);
        dev_free(df0);
        free(f0);
        free(s0);
        dev_free(dsep);
        free(sep);
        /* the backend's loop on the device */
        di_moe_experts me = {E, &ex[0].w1, &ex[0].w3, &ex[0].w2, sizeof *ex};
        float *dacc = dev_poison((size_t)(m * D) * 4);
        moe_loop_ref(gpu, &me, dx, m, idx, wt, k, mm, limit, dacc);
        float *loop = dev_down(dacc, (size_t)(m * D) * 4);
        float *ref = malloc((size_t)(m * D) * 4);
        cpu->ops->moe_experts(cpu, &me, x, m, idx, wt, k, mm, limit, ref);
        char what[96];
        snprintf(what, sizeof what, "moe_experts m %lld D %lld I %lld E %d k %d", (long long)m,
                 (long long)D, (long long)I, E, k);
        if (status_ok(what) && st == DI_OK) {
            /* past 16 rows the grouped product may take the other decode
             * kernel than an expert's own few rows: then within the spread */
            if (m <= 16) cmp_exact(what, got, loop, m * D);
            double el = rel_l2_f(got, loop, m * D), ec = rel_l2_f(got, ref, m * D);
            CHECKF(el <= BF16_ULP, "%s: relative L2 %.3g against the device loop", what, el);
            CHECKF(ec <= BF16_ULP, "%s: relative L2 %.3g against the CPU op", what, ec);
            if (getenv("DI_TEST_VERBOSE"))
                fprintf(stderr, "  %-40s rel L2 vs loop %.3g, vs CPU %.3g\n", what, el, ec);
        }
        dev_free(dx); dev_free(dl); dev_free(db); dev_free(didx); dev_free(dw); dev_free(dout);
        dev_free(dacc);
        di_cuda_free(scr);
        /* the loop's weights are cached by host address and size: the next
         * case's malloc may return the same addresses */
        di_backend_cuda_weights_drop(gpu);
        for (int q = 0; q < 3; q++) {
            di_cuda_free(dwt[q]);
            di_cuda_free(dsc[q]);
            for (int e = 0; e < E; e++) {
                free((void *)hw[q][e]);
                free((void *)hs[q][e]);
            }
            free(hw[q]);
            free(hs[q]);
        }
        free(ex); free(x); free(lg); free(bias); free(idx); free(wt); free(got); free(loop);
        free(ref);
    }
#if defined(DI_HAVE_CUDA)
    cuda_fp4_dec_set_a8(-1);
#endif
    CHECKF(cuda_moe_swiglu_w2_calls() - sw0 >= 6, "w2 formed its own SwiGLU input in %ld calls (6 cases take it)",
           cuda_moe_swiglu_w2_calls() - sw0);
}

/* moe_route_buf and moe_experts through the op table: the grouped op on
 * the layer's stacked experts equals the table's own per-expert loop bit
 * for bit up to 16 rows, whichever ran first; the stack is the only device
 * copy of the experts (the weight bytes are the experts' bytes once,
 * whether the loop uploaded single experts before or reads the stack
 * after), di_backend_cuda_weights_drop forgets it; the per-expert fallback
 * (no FP8 activations: the bf16 numerics) equals the loop; routing with
 * more active experts than experts comes from the host op. */
static void test_moe_op_table(void) {
    NEED_GPU();
    const struct { int64_t m, D, I; int E, k; unsigned mm; int loop_first; } cs[] = {
        {1, 256, 64, 8, 2, DI_MM_ACT_FP8 | DI_MM_OUT_BF16, 0},
        {6, 256, 128, 9, 3, DI_MM_ACT_FP8 | DI_MM_OUT_BF16, 1},
        {16, 128, 96, 12, 4, DI_MM_ACT_FP8 | DI_MM_OUT_BF16, 0},
        {5, 128, 64, 6, 2, DI_MM_OUT_BF16, 0},
    };
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        int64_t m = cs[t].m, D = cs[t].D, I = cs[t].I;
        int E = cs[t].E, k = cs[t].k;
        unsigned mm = cs[t].mm;
        const float limit = 10.0f;
        size_t wb1 = (size_t)(I * D / 2), sb1 = (size_t)(I * (D / 32)), wb2 = (size_t)(D * I / 2),
               sb2 = (size_t)(D * (I / 32));
        struct { di_wmat w1, w2, w3; } *ex = calloc((size_t)E, sizeof *ex);
        void **mem = calloc((size_t)(6 * E), sizeof(void *));
        for (int e = 0; e < E; e++) {
            for (int q = 0; q < 3; q++) { /* q: w1, w3, w2 */
                size_t wb = q == 2 ? wb2 : wb1, sb = q == 2 ? sb2 : sb1;
                uint8_t *s8 = malloc(sb);
                for (size_t i = 0; i < sb; i++) s8[i] = (uint8_t)(121 + rng_int(6));
                mem[6 * e + 2 * q] = rng_bytes(wb);
                mem[6 * e + 2 * q + 1] = s8;
            }
            ex[e].w1 = (di_wmat){DI_WFMT_FP4, I, D, mem[6 * e], mem[6 * e + 1]};
            ex[e].w3 = (di_wmat){DI_WFMT_FP4, I, D, mem[6 * e + 2], mem[6 * e + 3]};
            ex[e].w2 = (di_wmat){DI_WFMT_FP4, D, I, mem[6 * e + 4], mem[6 * e + 5]};
        }
        di_moe_experts me = {E, &ex[0].w1, &ex[0].w3, &ex[0].w2, sizeof *ex};
        float *x = rnd(m * D, 1.0f), *lg = rnd(m * E, 2.0f), *bias = rnd(E, 0.1f);
        for (int64_t i = 0; i < m; i++) lg[i * E + 1] = -30.0f; /* expert 1 never picked */
        int32_t *idx = malloc((size_t)(m * k) * 4), *gidx = malloc((size_t)(m * k) * 4);
        float *wt = malloc((size_t)(m * k) * 4), *gwt = malloc((size_t)(m * k) * 4);
        cpu->ops->moe_route(cpu, lg, bias, m, E, k, 1, 1.5f, idx, wt);
        float *dx = dev_up(x, (size_t)(m * D) * 4), *dl = dev_up(lg, (size_t)(m * E) * 4);
        int32_t *didx = (int32_t *)dev_poison((size_t)(m * k) * 4);
        float *dw = dev_poison((size_t)(m * k) * 4), *dout = dev_poison((size_t)(m * D) * 4);
        float *dloop = dev_poison((size_t)(m * D) * 4);
        di_backend_cuda_weights_drop(gpu);
        CHECK(gpu->ops->moe_route_buf && gpu->ops->moe_experts);
        gpu->ops->moe_route_buf(gpu, dl, bias, m, E, k, 1, 1.5f, didx, dw);
        gpu->ops->download(gpu, gidx, didx, (size_t)(m * k) * 4);
        gpu->ops->download(gpu, gwt, dw, (size_t)(m * k) * 4);
        char what[112];
        snprintf(what, sizeof what, "moe op table m %lld D %lld I %lld E %d k %d mm %u%s",
                 (long long)m, (long long)D, (long long)I, E, k, mm,
                 cs[t].loop_first ? " (loop first)" : "");
        CHECKF(!memcmp(idx, gidx, (size_t)(m * k) * 4) && !memcmp(wt, gwt, (size_t)(m * k) * 4),
               "%s: moe_route_buf differs from the CPU op", what);
        size_t experts_bytes = (size_t)E * (2 * (wb1 + sb1) + wb2 + sb2), bias_bytes = (size_t)E * 4;
        if (cs[t].loop_first) moe_loop_ref(gpu, &me, dx, m, idx, wt, k, mm, limit, dloop);
        gpu->ops->moe_experts(gpu, &me, dx, m, didx, dw, k, mm, limit, dout);
        size_t after = di_backend_cuda_weights_bytes(gpu);
        if (!cs[t].loop_first) moe_loop_ref(gpu, &me, dx, m, idx, wt, k, mm, limit, dloop);
        float *got = dev_down(dout, (size_t)(m * D) * 4), *loop = dev_down(dloop, (size_t)(m * D) * 4);
        float *ref = malloc((size_t)(m * D) * 4);
        cpu->ops->moe_experts(cpu, &me, x, m, idx, wt, k, mm, limit, ref);
        if (status_ok(what)) {
            cmp_exact(what, got, loop, m * D);
            double ec = rel_l2_f(got, ref, m * D);
            CHECKF(ec <= BF16_ULP, "%s: relative L2 %.3g against the CPU op", what, ec);
            if (mm & DI_MM_ACT_FP8) { /* stacked: each expert once, before and after the loop */
                CHECKF(after == experts_bytes + bias_bytes, "%s: %zu weight bytes after the grouped op, %zu expected",
                       what, after, experts_bytes + bias_bytes);
                CHECKF(di_backend_cuda_weights_bytes(gpu) == after, "%s: the loop added %zu bytes to the stack's",
                       what, di_backend_cuda_weights_bytes(gpu) - after);
            }
        }
        di_backend_cuda_weights_drop(gpu);
        CHECK_EQ_INT(di_backend_cuda_weights_bytes(gpu), 0);
        dev_free(dx); dev_free(dl); dev_free(didx); dev_free(dw); dev_free(dout); dev_free(dloop);
        for (int i = 0; i < 6 * E; i++) free(mem[i]);
        free(mem); free(ex); free(x); free(lg); free(bias); free(idx); free(gidx); free(wt);
        free(gwt); free(got); free(loop); free(ref);
    }
    /* more active experts than experts (ranks past e pick -1): the host op's results */
    {
        int64_t m = 3;
        int E = 3, k = 4;
        float *lg = rnd(m * E, 2.0f), *bias = rnd(E, 0.1f);
        int32_t *idx = malloc((size_t)(m * k) * 4), *gidx = malloc((size_t)(m * k) * 4);
        float *wt = malloc((size_t)(m * k) * 4), *gwt = malloc((size_t)(m * k) * 4);
        cpu->ops->moe_route(cpu, lg, bias, m, E, k, 1, 2.5f, idx, wt);
        float *dl = dev_up(lg, (size_t)(m * E) * 4), *dw = dev_poison((size_t)(m * k) * 4);
        int32_t *didx = (int32_t *)dev_poison((size_t)(m * k) * 4);
        gpu->ops->moe_route_buf(gpu, dl, bias, m, E, k, 1, 2.5f, didx, dw);
        gpu->ops->download(gpu, gidx, didx, (size_t)(m * k) * 4);
        gpu->ops->download(gpu, gwt, dw, (size_t)(m * k) * 4);
        if (status_ok("moe_route_buf, top-4 of 3 experts"))
            CHECKF(!memcmp(idx, gidx, (size_t)(m * k) * 4) && !memcmp(wt, gwt, (size_t)(m * k) * 4),
                   "moe_route_buf with %d experts differs from the CPU op", E);
        di_backend_cuda_weights_drop(gpu);
        dev_free(dl); dev_free(dw); dev_free(didx);
        free(lg); free(bias); free(idx); free(gidx); free(wt); free(gwt);
    }
}

/* ---- sparse attention on the tensor cores (cuda_attn_tc.h); the bound:
 * attn_bound.h */

/* Packed rows for attention: P window rows (DI_KVQ_FP8) then P compressed
 * rows (DI_KVQ_FP4_E4M3) of d values from N(0, 1) values, scaled per row by
 * 2^(-3..3); their decoded fp32 forms in dec [2P, d]. */
typedef struct attn_pool {
    int P;
    int64_t d;
    size_t r8, r4;
    uint8_t *host, *dev;
    float *dec;
} attn_pool;

static void attn_pool_init(attn_pool *ap, int P, int64_t d) {
    ap->P = P;
    ap->d = d;
    ap->r8 = di_kvq_row_bytes(DI_KVQ_FP8, d);
    ap->r4 = di_kvq_row_bytes(DI_KVQ_FP4_E4M3, d);
    size_t bytes = (size_t)P * (ap->r8 + ap->r4);
    ap->host = malloc(bytes);
    ap->dec = malloc((size_t)(2 * P * d) * sizeof(float));
    float *x = malloc((size_t)d * sizeof(float));
    for (int r = 0; r < 2 * P; r++) {
        float sc = ldexpf(1.0f, rng_int(7) - 3);
        if (r == 1) sc = 0x1p-115f; /* E8M0 scales near 2^-122: past the fast key decode's range */
        for (int64_t k = 0; k < d; k++) x[k] = sc * rng_normal();
        di_kvq f = r < P ? DI_KVQ_FP8 : DI_KVQ_FP4_E4M3;
        uint8_t *row = ap->host + (r < P ? (size_t)r * ap->r8 : (size_t)P * ap->r8 + (size_t)(r - P) * ap->r4);
        di_kvq_pack(f, x, d, row);
        di_kvq_unpack(f, row, d, ap->dec + (int64_t)r * d);
    }
    free(x);
    ap->dev = (uint8_t *)dev_up(ap->host, bytes);
}

static size_t attn_pool_off(const attn_pool *ap, int r) {
    return r < ap->P ? (size_t)r * ap->r8 : (size_t)ap->P * ap->r8 + (size_t)(r - ap->P) * ap->r4;
}

static void attn_pool_free(attn_pool *ap) {
    dev_free(ap->dev);
    free(ap->host);
    free(ap->dec);
}

/* The tensor-core form on odd shapes through its launcher (any m): h below
 * 16, past 64 (a second head tile) and not a multiple of 16; d = 32·odd;
 * one slot, a partial last block, several blocks; a row with no slot, a
 * row with one, sinks far above and below the scores, peaked softmaxes
 * (large q) whose running maximum moves between blocks. Outputs start
 * poisoned (NaN). Then the dispatch of the op table at the model's shape:
 * sparse_attn_kv over 128 window + 512 compressed slots, and
 * sparse_attn_rows over device tables of window codes (ring
 * slots, this call's chunk rows, empty) and a selection with -1 padding. */
static void test_attention_tc(void) {
    NEED_GPU();
    const struct { int64_t m; int h; int64_t d; int slots, win; float qs; int via_table; } cs[] = {
        {3, 5, 64, 1, 1, 1.0f, 0},     {2, 16, 96, 63, 20, 1.0f, 0},  {4, 70, 128, 130, 64, 1.0f, 0},
        {5, 24, 160, 200, 0, 4.0f, 0}, {3, 64, 512, 640, 128, 2.0f, 0},
        {9, 64, 512, 640, 128, 1.0f, 1}};
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        int64_t m = cs[t].m, d = cs[t].d;
        int h = cs[t].h, ns = cs[t].slots, nw = cs[t].win, P = 48;
        attn_pool ap;
        attn_pool_init(&ap, P, d);
        const uint8_t **rc = malloc((size_t)(m * ns) * sizeof *rc), **rg = malloc((size_t)(m * ns) * sizeof *rg);
        const float **rd = malloc((size_t)(m * ns) * sizeof *rd);
        for (int64_t i = 0; i < m; i++)
            for (int j = 0; j < ns; j++) {
                /* row 0 empty when m > 1, row 1 one slot, else 1 in 6 empty */
                int empty = (m > 1 && i == 0) || (i == 1 && j != ns / 2) || (i > 1 && rng_int(6) == 0);
                int r = j < nw ? rng_int(P) : P + rng_int(P);
                size_t off = attn_pool_off(&ap, r);
                rc[i * ns + j] = empty ? NULL : ap.host + off;
                rg[i * ns + j] = empty ? NULL : ap.dev + off;
                rd[i * ns + j] = empty ? NULL : ap.dec + (int64_t)r * d;
            }
        float *q = rnd(m * h * d, cs[t].qs), *sink = rnd(h, 2.0f);
        sink[0] = 60.0f; /* the sink outweighs every slot */
        if (h > 1) sink[1] = -60.0f;
        size_t OB = (size_t)(m * h * d) * 4;
        float *dq = dev_up(q, OB), *dsink = dev_up(sink, (size_t)h * 4), *oc = malloc(OB), *dout = dev_poison(OB);
        const uint8_t **drows = (const uint8_t **)dev_up(rg, (size_t)(m * ns) * sizeof *rg);
        float sc = (float)(1.0 / sqrt((double)d));
        cpu->ops->sparse_attn_kv(cpu, q, m, h, d, rc, ns, nw, sink, sc, oc);
        char what[96];
        di_err err = {0};
        di_status st;
        if (cs[t].via_table) {
            gpu->ops->sparse_attn_kv(gpu, dq, m, h, d, rg, ns, nw, sink, sc, dout);
            st = di_backend_cuda_status(gpu, &err);
        } else {
            st = cuda_op_sparse_attn_kv_tc(dq, m, h, d, drows, ns, nw, dsink, sc, dout, &err);
            if (!st) st = di_cuda_synchronize(&err);
        }
        snprintf(what, sizeof what, "attn tc%s m %lld h %d d %lld slots %d", cs[t].via_table ? " (op)" : "",
                 (long long)m, h, (long long)d, ns);
        CHECKF(st == DI_OK, "%s: %s", what, err.msg);
        float *og = dev_down(dout, OB);
        if (st == DI_OK) cmp_attn_tc(what, og, oc, q, m, h, d, rd, ns, sink, sc);
        di_backend_cuda_weights_drop(gpu);
        dev_free(dq); dev_free(dsink); dev_free(dout); dev_free((void *)drows);
        attn_pool_free(&ap);
        free(rc); free(rg); free(rd); free(q); free(sink); free(oc); free(og);
    }
    /* the row-table form, as the model's prefill calls it */
    setenv("DI_CUDA_DEVICE_SELECT", "1", 1);
    di_backend *gsel = NULL;
    di_err err = {0};
    di_status st = di_backend_cuda_create(0, &gsel, &err);
    unsetenv("DI_CUDA_DEVICE_SELECT");
    CHECKF(st == DI_OK && gsel->ops->sparse_attn_rows, "device-select backend: %s", err.msg);
    if (st) return;
    int64_t m = 11, d = 512;
    int h = 32, nw = 128, nsel = 200, ns = nw + nsel, R = 128, E = 300;
    size_t wb = di_kvq_row_bytes(DI_KVQ_FP8, d), cb = di_kvq_row_bytes(DI_KVQ_FP4_E4M3, d);
    /* window rows: a ring of R rows, then the chunk's m rows; E cache entries */
    attn_pool win, cache;
    attn_pool_init(&win, R + (int)m, d); /* only its FP8 half is used */
    attn_pool_init(&cache, E, d);        /* only its FP4 half is used */
    int32_t *wc = malloc((size_t)(m * nw) * 4), *sel = malloc((size_t)(m * nsel) * 4);
    const float **rd = malloc((size_t)(m * ns) * sizeof *rd);
    for (int64_t i = 0; i < m; i++) {
        for (int j = 0; j < nw; j++) {
            int kind = rng_int(8), c = kind == 0 ? -1 : kind < 3 ? -2 - rng_int((int)m) : rng_int(R);
            wc[i * nw + j] = c;
            rd[i * ns + j] = c == -1 ? NULL : win.dec + (int64_t)(c >= 0 ? c : R + (-2 - c)) * d;
        }
        for (int j = 0; j < nsel; j++) {
            int e = j >= nsel - (int)i ? -1 : rng_int(E); /* row i: i entries of padding */
            sel[i * nsel + j] = e;
            rd[i * ns + nw + j] = e < 0 ? NULL : cache.dec + (int64_t)(E + e) * d;
        }
    }
    const uint8_t **ring_h = malloc((size_t)m * sizeof *ring_h), **ring_d = malloc((size_t)m * sizeof *ring_d);
    const uint8_t **cache_h = malloc((size_t)m * sizeof *cache_h), **cache_d = malloc((size_t)m * sizeof *cache_d);
    for (int64_t i = 0; i < m; i++) {
        ring_h[i] = win.host;
        ring_d[i] = win.dev;
        cache_h[i] = cache.host + (size_t)E * cache.r8;
        cache_d[i] = cache.dev + (size_t)E * cache.r8;
    }
    di_attn_rows th = {nw, wc, ring_h, win.host + (size_t)R * wb, wb, nsel, sel, cache_h, cb};
    di_attn_rows td = {nw, (const int32_t *)dev_up(wc, (size_t)(m * nw) * 4),
                       (const uint8_t *const *)dev_up(ring_d, (size_t)m * sizeof *ring_d),
                       win.dev + (size_t)R * wb, wb, nsel,
                       (const int32_t *)dev_up(sel, (size_t)(m * nsel) * 4),
                       (const uint8_t *const *)dev_up(cache_d, (size_t)m * sizeof *cache_d), cb};
    float *q = rnd(m * h * d, 1.0f), *sink = rnd(h, 2.0f);
    size_t OB = (size_t)(m * h * d) * 4;
    float *oc = malloc(OB), *dq = (float *)gsel->ops->alloc(gsel, OB), *dout = (float *)gsel->ops->alloc(gsel, OB);
    gsel->ops->upload(gsel, dq, q, OB);
    di_cuda_fill(dout, 0xff, OB, &err);
    float sc = (float)(1.0 / sqrt((double)d));
    cpu->ops->sparse_attn_rows(cpu, q, m, h, d, &th, sink, sc, oc);
    gsel->ops->sparse_attn_rows(gsel, dq, m, h, d, &td, sink, sc, dout);
    float *og = malloc(OB);
    gsel->ops->download(gsel, og, dout, OB);
    st = di_backend_cuda_status(gsel, &err);
    CHECKF(st == DI_OK, "sparse_attn_rows: %s", err.msg);
    if (st == DI_OK) cmp_attn_tc("attn tc rows m 11 h 32 d 512", og, oc, q, m, h, d, rd, ns, sink, sc);
    gsel->ops->free(gsel, dq);
    gsel->ops->free(gsel, dout);
    dev_free((void *)td.win); dev_free((void *)td.ring); dev_free((void *)td.sel); dev_free((void *)td.cache);
    di_backend_destroy(gsel);
    attn_pool_free(&win);
    attn_pool_free(&cache);
    free(wc); free(sel); free(rd); free(ring_h); free(ring_d); free(cache_h); free(cache_d);
    free(q); free(sink); free(oc); free(og);
}

/* A random weight matrix of the format: BF16 of scale 0.05, FP8 / MXFP4
 * codes with scales near 2^0 (kept in *wbuf / *sbuf for freeing). */
static di_wmat rnd_wmat(di_wfmt fmt, int64_t N, int64_t K, uint8_t **wbuf, uint8_t **sbuf) {
    di_wmat w = {fmt, N, K, NULL, NULL};
    *sbuf = NULL;
    if (fmt == DI_WFMT_BF16) {
        uint16_t *b = malloc((size_t)(N * K) * 2);
        for (int64_t i = 0; i < N * K; i++) b[i] = di_f32_to_bf16(0.05f * rng_normal());
        *wbuf = (uint8_t *)b;
    } else if (fmt == DI_WFMT_FP8) {
        *wbuf = rng_e4m3((size_t)(N * K));
        *sbuf = rng_e8m0((size_t)(((N + 31) / 32) * ((K + 31) / 32)));
    } else {
        *wbuf = rng_bytes((size_t)(N * K / 2));
        *sbuf = rng_e8m0((size_t)(N * (K / 32)));
    }
    w.w = *wbuf;
    w.s = *sbuf;
    return w;
}

/* Activations of both kinds the model has: bf16-exact rows (even i) and
 * full fp32 rows (odd i), which take all three split terms. */
static float *rnd_act(int64_t m, int64_t K) {
    float *x = malloc((size_t)(m * K > 0 ? m * K : 1) * sizeof(float));
    for (int64_t i = 0; i < m; i++)
        for (int64_t k = 0; k < K; k++) {
            float v = rng_normal();
            x[i * K + k] = i % 2 ? v : di_round_bf16(v);
        }
    return x;
}

/* The product without activation quantization on both backends: yc the
 * CPU's [m, n], the returned array the GPU's (downloaded from dy); G > 1:
 * the grouped product over G groups of K inputs. */
static float *plain_gpu(const di_wmat *w, int G, const float *dx, int64_t m, unsigned flags, float *dy) {
    if (G > 1) gpu->ops->matmul_grouped(gpu, w, G, dx, m, dy);
    else gpu->ops->matmul(gpu, w, dx, m, dy, flags);
    return dev_down(dy, (size_t)(m * w->n_out) * 4);
}

static float *plain_both(const di_wmat *w, int G, const float *x, const float *dx, int64_t m,
                         unsigned flags, float *yc, float *dy) {
    if (G > 1) cpu->ops->matmul_grouped(cpu, w, G, x, m, yc);
    else cpu->ops->matmul(cpu, w, x, m, yc, flags);
    return plain_gpu(w, G, dx, m, flags, dy);
}

/* The decode products (no activation quantization) on the tensor-core
 * path: m = 1..130 around every tile boundary, ragged K (scalar loads),
 * the real V4.1-Flash shapes (router gate, compressor, indexer weights, a
 * slice of the head, the grouped wo_a), against the CPU within the bound
 * of cmp_plain; then batch invariance: rows computed alone (m = 1, same
 * buffers) give the bits they have inside the batch. Non-finite inputs:
 * an inf in x gives the chain's inf or NaN. */
static void test_matmul_decode(void) {
    NEED_GPU();
    const struct { di_wfmt fmt; int64_t n, k; int groups; unsigned flags; const char *name; } sh[] = {
        {DI_WFMT_BF16, 70, 200, 1, 0, "bf16 70x200"},
        {DI_WFMT_BF16, 45, 203, 1, DI_MM_OUT_BF16, "bf16 45x203 (K % 8 != 0)"},
        {DI_WFMT_FP8, 96, 256, 1, DI_MM_OUT_BF16, "fp8 96x256"},
        {DI_WFMT_FP8, 66, 100, 1, 0, "fp8 66x100"},
        {DI_WFMT_FP4, 40, 128, 1, 0, "mxfp4 40x128"},
        {DI_WFMT_FP8, 4 * 48, 160, 4, 0, "grouped fp8 4x48x160"},
    };
    const int64_t ms[] = {1, 2, 3, 5, 8, 9, 13, 16, 17, 31, 33, 47, 64, 65, 130};
    for (size_t t = 0; t < sizeof sh / sizeof *sh; t++)
        for (size_t q = 0; q < sizeof ms / sizeof *ms; q++) {
            int64_t m = ms[q], N = sh[t].n, K = sh[t].k;
            int G = sh[t].groups;
            uint8_t *wbuf, *sbuf;
            di_wmat w = rnd_wmat(sh[t].fmt, N, K, &wbuf, &sbuf);
            float *x = rnd_act(m * G, K), *yc = malloc((size_t)(m * N) * 4);
            float *dx = dev_up(x, (size_t)(m * G * K) * 4), *dy = dev_poison((size_t)(m * N) * 4);
            int ob = G > 1 || (sh[t].flags & DI_MM_OUT_BF16);
            float *yg = plain_both(&w, G, x, dx, m, sh[t].flags, yc, dy);
            char what[96];
            snprintf(what, sizeof what, "decode %s m %lld", sh[t].name, (long long)m);
            if (status_ok(what)) cmp_plain(what, &w, G, x, m, yg, yc, ob);
            /* rows alone: the same bits */
            if (m > 1 && status_ok(what)) {
                int64_t rows[3] = {0, m / 2, m - 1};
                int64_t bad = 0;
                float *d1 = dev_poison((size_t)N * 4);
                for (int r = 0; r < 3; r++) {
                    int64_t i = rows[r];
                    if (G > 1) gpu->ops->matmul_grouped(gpu, &w, G, dx + i * G * K, 1, d1);
                    else gpu->ops->matmul(gpu, &w, dx + i * K, 1, d1, sh[t].flags);
                    float *y1 = dev_down(d1, (size_t)N * 4);
                    bad += memcmp(y1, yg + i * N, (size_t)N * 4) != 0;
                    free(y1);
                }
                CHECKF(bad == 0, "%s: %lld of 3 rows alone differ from the batch", what, (long long)bad);
                dev_free(d1);
            }
            di_backend_cuda_weights_drop(gpu);
            dev_free(dx); dev_free(dy);
            free(x); free(yc); free(yg); free(wbuf); free(sbuf);
        }
    /* the real shapes (V4.1-Flash: dim 5120, head_dim 512, 32 index heads of
     * 128, 384 experts, 8 output groups of 1024 over 4096 inputs) */
    const struct { di_wfmt fmt; int64_t n, k; int groups; unsigned flags; int64_t m; const char *name; } rs[] = {
        {DI_WFMT_BF16, 384, 5120, 1, 0, 8, "ffn.gate 384x5120"},
        {DI_WFMT_BF16, 384, 5120, 1, 0, 1, "ffn.gate 384x5120"},
        {DI_WFMT_BF16, 512, 5120, 1, 0, 8, "compressor.wkv 512x5120"},
        {DI_WFMT_BF16, 512, 5120, 1, DI_MM_OUT_BF16, 64, "compressor.wkv 512x5120 bf16 out"},
        {DI_WFMT_BF16, 32, 5120, 1, DI_MM_OUT_BF16, 8, "indexer.weights_proj 32x5120"},
        {DI_WFMT_BF16, 128, 512, 1, DI_MM_OUT_BF16, 8, "indexer.wk 128x512"},
        {DI_WFMT_BF16, 2048, 5120, 1, 0, 8, "head slice 2048x5120"},
        {DI_WFMT_FP8, 8 * 1024, 4096, 8, 0, 8, "wo_a grouped 8x1024x4096"},
        {DI_WFMT_FP8, 8 * 1024, 4096, 8, 0, 1, "wo_a grouped 8x1024x4096"},
        {DI_WFMT_BF16, 200, 203, 1, 0, 5, "ragged 200x203"},
    };
#if defined(DI_HAVE_CUDA)
    void cuda_matmul_set_tiles(int t); /* cuda_ops_linear.cu: 16-output tiles a warp, 0 = choose */
#endif
    for (size_t t = 0; t < sizeof rs / sizeof *rs; t++) {
        int64_t m = rs[t].m, N = rs[t].n, K = rs[t].k;
        int G = rs[t].groups;
        uint8_t *wbuf, *sbuf;
        di_wmat w = rnd_wmat(rs[t].fmt, N, K, &wbuf, &sbuf);
        float *x = rnd_act(m * G, K), *yc = malloc((size_t)(m * N) * 4);
        float *dx = dev_up(x, (size_t)(m * G * K) * 4), *dy = dev_poison((size_t)(m * N) * 4);
        float *yg = plain_both(&w, G, x, dx, m, rs[t].flags, yc, dy);
        char what[96];
        snprintf(what, sizeof what, "real %s m %lld", rs[t].name, (long long)m);
        if (status_ok(what)) cmp_plain(what, &w, G, x, m, yg, yc, G > 1 || (rs[t].flags & DI_MM_OUT_BF16));
#if defined(DI_HAVE_CUDA)
        /* one 16-output tile a warp or two (the choice follows the output
         * count): the same bits */
        for (int tiles = 1; tiles <= 2; tiles++) {
            cuda_matmul_set_tiles(tiles);
            float *yt = plain_gpu(&w, G, dx, m, rs[t].flags, dy);
            CHECKF(!status_ok(what) || memcmp(yt, yg, (size_t)(m * N) * 4) == 0, "%s: %d tile(s) a warp differ", what,
                   tiles);
            free(yt);
        }
        cuda_matmul_set_tiles(0);
#endif
        di_backend_cuda_weights_drop(gpu);
        dev_free(dx); dev_free(dy);
        free(x); free(yc); free(yg); free(wbuf); free(sbuf);
    }
    /* an infinity in x: the chain's inf / NaN per output */
    {
        int64_t m = 3, N = 40, K = 64;
        uint8_t *wbuf, *sbuf;
        di_wmat w = rnd_wmat(DI_WFMT_BF16, N, K, &wbuf, &sbuf);
        float *x = rnd_act(m, K), *yc = malloc((size_t)(m * N) * 4);
        x[1 * K + 17] = INFINITY;
        x[2 * K + 5] = -INFINITY;
        ((uint16_t *)wbuf)[3 * K + 5] = 0; /* 0 · inf: NaN in output 3 of row 2 */
        float *dx = dev_up(x, (size_t)(m * K) * 4), *dy = dev_poison((size_t)(m * N) * 4);
        cpu->ops->matmul(cpu, &w, x, m, yc, 0);
        gpu->ops->matmul(gpu, &w, dx, m, dy, 0);
        float *yg = dev_down(dy, (size_t)(m * N) * 4);
        CHECK(isnan(yc[2 * N + 3]));
        if (status_ok("decode inf")) cmp_plain("decode inf in x", &w, 1, x, m, yg, yc, 0);
        di_backend_cuda_weights_drop(gpu);
        dev_free(dx); dev_free(dy);
        free(x); free(yc); free(yg); free(wbuf); free(sbuf);
    }
}

/* The pool's zero fills ride in the copy queue (backend_cuda.c, pool_zero):
 * a block freed while a queued copy still reads it and handed out again
 * must read as zero only after that copy has read its old contents; one
 * handed out twice before any op must read as zero; a burst
 * of reused dirty blocks (more than one queue's worth, some larger than the
 * zero source) must all read as zero. */
/* FP8 decode products quantize their own activations inside the kernel
 * (m <= 8, k % 128 == 0) instead of after a separate act_quant_fp8 pass:
 * the same codes, scales and sums, so every output must keep its bits. x
 * holds blocks of zeros (the 1e-4 amax floor), of large and tiny values
 * (scale extremes) and of ordinary ones; real shapes (wq_a 1024x5120, wkv
 * 512x5120, wo_b 5120x8192: the cluster splits 8, 8 and 4) and small ragged
 * ones; outputs poisoned before each run. */
static void test_matmul_fused_quant(void) {
    NEED_GPU();
#if defined(DI_HAVE_CUDA)
    void cuda_matvec_set_fused_quant(int on); /* cuda_matvec.cu: 0 = quantize by its own kernel */
    const struct { int64_t n, k; } sh[] = {{96, 512}, {200, 1024}, {130, 4096},
                                           {1024, 5120}, {512, 5120}, {5120, 8192}};
    const int64_t ms[] = {1, 2, 5, 8};
    const unsigned fl[] = {DI_MM_ACT_FP8, DI_MM_ACT_FP8 | DI_MM_OUT_BF16};
    for (size_t t = 0; t < sizeof sh / sizeof *sh; t++)
        for (size_t q = 0; q < sizeof ms / sizeof *ms; q++) {
            int64_t m = ms[q], N = sh[t].n, K = sh[t].k;
            if (N * K > 5120 * 1024 && m != 1 && m != 8) continue; /* the big one at m = 1, 8 only */
            uint8_t *wbuf, *sbuf;
            di_wmat w = rnd_wmat(DI_WFMT_FP8, N, K, &wbuf, &sbuf);
            float *x = rnd(m * K, 1.0f);
            for (int64_t i = 0; i < m; i++)
                for (int64_t k = 0; k < 32; k++) {
                    x[i * K + k] = 0.0f;
                    x[i * K + 32 + k] *= 1e30f;
                    x[i * K + 64 + k] *= 1e-30f;
                }
            float *dx = dev_up(x, (size_t)(m * K) * 4);
            for (size_t f = 0; f < sizeof fl / sizeof *fl; f++) {
                float *y[2];
                for (int on = 0; on < 2; on++) {
                    cuda_matvec_set_fused_quant(on);
                    float *dy = dev_poison((size_t)(m * N) * 4);
                    gpu->ops->matmul(gpu, &w, dx, m, dy, fl[f]);
                    y[on] = dev_down(dy, (size_t)(m * N) * 4);
                    dev_free(dy);
                }
                cuda_matvec_set_fused_quant(1);
                char what[96];
                snprintf(what, sizeof what, "fused quant fp8 m %lld n %lld k %lld flags %u", (long long)m,
                         (long long)N, (long long)K, fl[f]);
                if (status_ok(what)) {
                    int64_t bad = 0, first = -1;
                    for (int64_t i = 0; i < m * N; i++)
                        if (memcmp(&y[0][i], &y[1][i], 4)) {
                            if (first < 0) first = i;
                            bad++;
                        }
                    CHECKF(bad == 0, "%s: %lld of %lld outputs differ from the separate quantization, first at %lld: %.9g vs %.9g",
                           what, (long long)bad, (long long)(m * N), (long long)first,
                           first >= 0 ? y[1][first] : 0.0, first >= 0 ? y[0][first] : 0.0);
                }
                free(y[0]);
                free(y[1]);
            }
            di_backend_cuda_weights_drop(gpu);
            dev_free(dx);
            free(x); free(wbuf); free(sbuf);
        }
#endif
}

/* matmul_pair (an expert's w1 and w3, attention's wq_a and wkv, in one
 * launch) against two matmul calls on the GPU with the pair's k split
 * forced (cuda_matvec_pair_ks: the pair counts both matrices' blocks, so
 * the shared expert's shape takes 4 ranks where one matrix takes 8), bit
 * for bit, into poisoned outputs: decode rows that quantize inside (m <= 8:
 * one launch of depth 2), one and several cluster ranks, ragged outputs,
 * matrices of different heights; 12 rows (two matmul calls inside the op,
 * their own split); both output forms. The split at the shared expert's
 * shape is checked too, so a rule that drifts back to 1.45 waves fails
 * here. */
#if defined(DI_HAVE_CUDA)
int cuda_matvec_pair_ks(int64_t m, int64_t n, int64_t n2, int64_t k); /* cuda_matvec.cu, test aid */
void cuda_matvec_set_ks(int ks);                                      /* cuda_matvec.cu: the FP8 k split forced */
int cuda_batch_invariant(void);                                       /* cuda_device.cu */

/* One case: fresh weights of fmt ([n, k] and [n2, k]) and x; two matmul
 * calls (the FP8 k split forced to ks where ks > 0) against matmul_pair,
 * bit for bit, for each of the flags. ks < 0 marks a plain pair, whose x
 * has rnd_act's two kinds of rows; the quantizing pairs take random fp32. */
static void pair_case(di_wfmt fmt, int64_t m, int64_t N, int64_t N2, int64_t K, int ks, const unsigned *fl,
                      size_t nfl) {
    uint8_t *wb1, *sb1, *wb3, *sb3;
    di_wmat w1 = rnd_wmat(fmt, N, K, &wb1, &sb1), w3 = rnd_wmat(fmt, N2, K, &wb3, &sb3);
    float *x = fmt == DI_WFMT_FP8 && ks >= 0 ? rnd(m * K, 1.0f) : rnd_act(m, K);
    float *dx = dev_up(x, (size_t)(m * K) * 4);
    for (size_t f = 0; f < nfl; f++) {
        const size_t yb = (size_t)(m * N) * 4, yb2 = (size_t)(m * N2) * 4;
        float *d1 = dev_poison(yb), *d3 = dev_poison(yb2), *e1 = dev_poison(yb), *e3 = dev_poison(yb2);
        cuda_matvec_set_ks(ks > 0 ? ks : 0);
        gpu->ops->matmul(gpu, &w1, dx, m, d1, fl[f]);
        gpu->ops->matmul(gpu, &w3, dx, m, d3, fl[f]);
        cuda_matvec_set_ks(0);
        gpu->ops->matmul_pair(gpu, &w1, &w3, dx, m, e1, e3, fl[f]);
        float *y1 = dev_down(d1, yb), *y3 = dev_down(d3, yb2), *z1 = dev_down(e1, yb), *z3 = dev_down(e3, yb2);
        char what[112];
        snprintf(what, sizeof what, "matmul_pair %s m %lld n %lld / %lld k %lld flags %u",
                 fmt == DI_WFMT_BF16 ? "bf16" : "fp8", (long long)m, (long long)N, (long long)N2, (long long)K, fl[f]);
        if (status_ok(what)) {
            CHECKF(!memcmp(y1, z1, yb), "%s: the first product differs from matmul alone", what);
            CHECKF(!memcmp(y3, z3, yb2), "%s: the second product differs from matmul alone", what);
        }
        free(y1); free(y3); free(z1); free(z3);
        dev_free(d1); dev_free(d3); dev_free(e1); dev_free(e3);
    }
    di_backend_cuda_weights_drop(gpu);
    dev_free(dx);
    free(x); free(wb1); free(sb1); free(wb3); free(sb3);
}

static void test_matmul_pair(void) {
    NEED_GPU();
    const struct { int64_t m, n, n2, k; } cs[] = {{1, 2304, 2304, 5120}, {8, 2304, 2304, 5120}, {3, 200, 200, 1024},
                                                  {5, 130, 130, 4096},   {1, 96, 96, 512},       {12, 64, 64, 2048},
                                                  {1, 1280, 512, 5120},  {6, 1280, 512, 5120},   {2, 130, 320, 1024}};
    const unsigned fl[] = {DI_MM_ACT_FP8, DI_MM_ACT_FP8 | DI_MM_OUT_BF16};
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        const int ks = cuda_matvec_pair_ks(cs[t].m, cs[t].n, cs[t].n2, cs[t].k);
        if (cs[t].n == 2304 && cs[t].n2 == 2304 && cs[t].k == 5120 && cs[t].m <= 8 && !cuda_batch_invariant())
            CHECKF(ks == 4, "matmul_pair m %lld n 2304 k 5120: k split %d, expected 4 (one wave)", (long long)cs[t].m,
                   ks);
        pair_case(DI_WFMT_FP8, cs[t].m, cs[t].n, cs[t].n2, cs[t].k, ks, fl, 2);
    }
    /* plain pairs (x not quantized, x of both kinds: the compressor's wkv
     * and wgate): one launch of the decode form at m <= 8, the bits of each
     * product alone whatever the spread; 12 rows run the two products */
    const struct { di_wfmt fmt; int64_t m, n, k; } ps[] = {{DI_WFMT_BF16, 1, 512, 5120}, {DI_WFMT_BF16, 3, 512, 5120},
                                                          {DI_WFMT_BF16, 8, 200, 1056}, {DI_WFMT_BF16, 12, 64, 512},
                                                          {DI_WFMT_FP8, 2, 1024, 4096}, {DI_WFMT_BF16, 1, 32, 5120}};
    const unsigned pfl[] = {0, DI_MM_OUT_BF16};
    for (size_t t = 0; t < sizeof ps / sizeof *ps; t++) pair_case(ps[t].fmt, ps[t].m, ps[t].n, ps[t].n, ps[t].k, -1, pfl, 2);
}

/* swiglu_matmul_add (the shared expert's tail in one op) against the three
 * ops it replaces on the GPU (swiglu, matmul, add_bf16), bit for bit: the
 * model's shape (5120 × 2304) at 1, 2 and 8 rows (one launch of the
 * quantizing decode kernel) and 9 rows (the three ops inside), a narrow
 * matrix, K not a multiple of 128 (the three ops), with and without the
 * clamp and the bf16 output flag, into a third buffer and in place over a;
 * g and u as the pair leaves them (bf16 values), some beyond the clamp. */
static void test_swiglu_matmul_add(void) {
    NEED_GPU();
    CHECK(gpu->ops->swiglu_matmul_add != NULL);
    if (!gpu->ops->swiglu_matmul_add) return;
    const struct { int64_t m, n, k; float limit; } cs[] = {{1, 5120, 2304, 10.0f}, {2, 5120, 2304, 10.0f},
                                                           {8, 5120, 2304, 10.0f}, {9, 5120, 2304, 10.0f},
                                                           {3, 200, 1024, 0.0f},   {2, 96, 160, 10.0f}};
    const unsigned fl[] = {DI_MM_ACT_FP8 | DI_MM_OUT_BF16, DI_MM_ACT_FP8};
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        const int64_t m = cs[t].m, N = cs[t].n, K = cs[t].k;
        uint8_t *wb, *sb;
        di_wmat w2 = rnd_wmat(DI_WFMT_FP8, N, K, &wb, &sb);
        float *g = malloc((size_t)(m * K) * 4), *u = malloc((size_t)(m * K) * 4), *a = malloc((size_t)(m * N) * 4);
        for (int64_t i = 0; i < m * K; i++) {
            g[i] = di_round_bf16(4.0f * rng_normal());
            u[i] = di_round_bf16((rng_int(10) ? 3.0f : 12.0f) * rng_normal());
        }
        for (int64_t i = 0; i < m * N; i++) a[i] = di_round_bf16(rng_normal());
        const size_t GB = (size_t)(m * K) * 4, YB = (size_t)(m * N) * 4;
        float *dg = dev_up(g, GB), *du = dev_up(u, GB);
        for (size_t f = 0; f < sizeof fl / sizeof *fl; f++)
            for (int inplace = 0; inplace < 2; inplace++) {
                float *da = dev_up(a, YB), *dx = dev_poison(GB), *dz = dev_poison(YB), *dr = dev_poison(YB);
                gpu->ops->swiglu(gpu, dg, du, NULL, m, K, cs[t].limit, dx);
                gpu->ops->matmul(gpu, &w2, dx, m, dz, fl[f]);
                gpu->ops->add_bf16(gpu, dr, da, dz, m * N);
                float *dy = inplace ? da : dev_poison(YB);
                gpu->ops->swiglu_matmul_add(gpu, &w2, dg, du, m, cs[t].limit, da, dy, fl[f]);
                float *ref = dev_down(dr, YB), *got = dev_down(dy, YB);
                char what[112];
                snprintf(what, sizeof what, "swiglu_matmul_add m %lld n %lld k %lld limit %g flags %u%s", (long long)m,
                         (long long)N, (long long)K, cs[t].limit, fl[f], inplace ? " in place" : "");
                if (status_ok(what)) CHECKF(same_bits(got, ref, m * N), "%s: differs from swiglu, matmul, add_bf16", what);
                free(ref); free(got);
                if (!inplace) dev_free(dy);
                dev_free(da); dev_free(dx); dev_free(dz); dev_free(dr);
            }
        di_backend_cuda_weights_drop(gpu);
        dev_free(dg); dev_free(du);
        free(g); free(u); free(a); free(wb); free(sb);
    }
}
#else
static void test_matmul_pair(void) { NEED_GPU(); }
static void test_swiglu_matmul_add(void) { NEED_GPU(); }
#endif

static void test_pool_fills(void) {
    NEED_GPU();
    int64_t n = 4096 + rng_int(512);
    float *x = rnd(n, 1.0f);
    for (int64_t i = 0; i < n; i++)
        if (x[i] == 0.f) x[i] = 1.f;
    float *a = dev_up(x, (size_t)n * 4), *b = gpu->ops->alloc(gpu, (size_t)n * 4);
    gpu->ops->copy(gpu, b, a, (size_t)n * 4); /* queued */
    gpu->ops->free(gpu, a);
    float *c = gpu->ops->alloc(gpu, (size_t)n * 4);
    CHECK(c == a); /* the freed block again: the case under test */
    float *hb = dev_down(b, (size_t)n * 4), *hc = dev_down(c, (size_t)n * 4);
    if (status_ok("pool fill after queued copy")) cmp_exact("queued copy before the fill", hb, x, n);
    int64_t nz = 0;
    for (int64_t i = 0; i < n; i++) nz += hc[i] != 0.f;
    CHECKF(nz == 0, "reused block: %lld of %lld not zero", (long long)nz, (long long)n);
    dev_free(b); dev_free(c);
    free(hb); free(hc);
    /* a dirty block handed out, freed and handed out again before any op:
     * the second fill is the queued first one */
    float *e = dev_up(x, (size_t)n * 4);
    dev_free(e);
    float *f = gpu->ops->alloc(gpu, (size_t)n * 4);
    dev_free(f);
    float *h = gpu->ops->alloc(gpu, (size_t)n * 4);
    CHECK(e == f && f == h);
    float *hh = dev_down(h, (size_t)n * 4);
    nz = 0;
    for (int64_t i = 0; i < n; i++) nz += hh[i] != 0.f;
    CHECKF(nz == 0, "block handed out twice before an op: %lld of %lld not zero", (long long)nz, (long long)n);
    dev_free(h);
    free(hh); free(x);
    enum { NB = 300 };
    size_t sz[NB];
    float *d[NB];
    uint8_t *ones = malloc((size_t)3 << 20);
    memset(ones, 0x3f, (size_t)3 << 20);
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < NB; i++) {
            if (!r) sz[i] = i % 50 == 7 ? ((size_t)1 << 20) + 4 * (size_t)rng_int(1 << 18) : 4 * (size_t)(1 + rng_int(40000));
            d[i] = gpu->ops->alloc(gpu, sz[i]);
        }
        if (r) break;
        for (int i = 0; i < NB; i++) gpu->ops->upload(gpu, d[i], ones, sz[i]);
        for (int i = 0; i < NB; i++) gpu->ops->free(gpu, d[i]);
    }
    int64_t bad = 0;
    for (int i = 0; i < NB; i++) {
        uint8_t *h = (uint8_t *)dev_down(d[i], sz[i]);
        for (size_t k = 0; k < sz[i]; k++) bad += h[k] != 0;
        free(h);
        dev_free(d[i]);
    }
    CHECKF(status_ok("pool burst") && bad == 0, "%lld bytes of reused blocks not zero", (long long)bad);
    free(ones);
}

/* index_scores_kv on the tensor cores (cuda_ops_select.cu) at the model's
 * indexer shape (32 heads of 128) and at small odd ones, through the op
 * table. With the model's q — FP4 quantize-dequantized per 32 with an E8M0
 * scale, so the dots are exact sums — the scores must be the CPU's bit for
 * bit, and so must the top-k picked from them; rows share one key cache
 * with growing visible counts (a prefill) and later rows switch to another
 * cache (the fragments reload). With general fp32 q (three bf16 terms) the
 * two sides' dots differ by fp32 roundings, which the bf16 rounding of a
 * dot near a rounding boundary can turn into a whole bf16 step; under the
 * head sum's cancellation one such step of a large term is a large part of
 * a small score (a relative tolerance once failed: GPU -15.9375, CPU
 * -15.4375). So each side's score must lie in the interval idx_admissible
 * derives from exact dots. */
static uint8_t *index_keys_packed(const float *src, int64_t W, int64_t di) {
    size_t kb = di_kvq_row_bytes(DI_KVQ_FP4_E8M0, di);
    uint8_t *keys = malloc((size_t)W * kb);
    for (int64_t r = 0; r < W; r++) di_kvq_pack(DI_KVQ_FP4_E8M0, src + r * di, di, keys + (size_t)r * kb);
    return keys;
}

/* Every visible score of both sides within its idx_admissible interval,
 * the invisible ones -inf on both. */
static void idx_check_admissible(const char *what, const float *q, const float *w, int64_t m, int hi, int64_t di,
                                 const uint8_t *const *kc, const int32_t *nv, int64_t W, const float *scg,
                                 const float *scc) {
    float *kd = malloc((size_t)di * sizeof(float));
    const size_t kb = di_kvq_row_bytes(DI_KVQ_FP4_E8M0, di);
    int64_t bad_g = 0, bad_c = 0, wide = 0, first = -1;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < W; j++) {
            const int64_t e = i * W + j;
            if (j >= nv[i]) {
                const int ok = isinf(scg[e]) && scg[e] < 0 && isinf(scc[e]) && scc[e] < 0;
                if (!ok && first < 0) first = e;
                bad_g += !ok;
                continue;
            }
            di_kvq_unpack(DI_KVQ_FP4_E8M0, kc[i] + (size_t)j * kb, di, kd);
            float lo, hv;
            idx_admissible(q + i * hi * di, w + i * hi, hi, di, kd, &lo, &hv);
            const int og = scg[e] >= lo && scg[e] <= hv, oc = scc[e] >= lo && scc[e] <= hv;
            if (!og && first < 0) first = e;
            bad_g += !og;
            bad_c += !oc;
            wide += lo != hv;
        }
    CHECKF(bad_g == 0 && bad_c == 0, "%s: %lld GPU and %lld CPU scores outside their interval of %lld, first at %lld: gpu %.9g cpu %.9g",
           what, (long long)bad_g, (long long)bad_c, (long long)(m * W), (long long)first, first >= 0 ? scg[first] : 0.0,
           first >= 0 ? scc[first] : 0.0);
    if (getenv("DI_TEST_VERBOSE"))
        fprintf(stderr, "  %-48s %lld of %lld intervals wider than one value\n", what, (long long)wide, (long long)(m * W));
    free(kd);
}

static void test_index_scores_tc(void) {
    NEED_GPU();
    const struct { int64_t m; int hi; int64_t di, width; int qdq; } cs[] = {
        {200, 32, 128, 260, 1}, {70, 5, 64, 150, 0}, {9, 8, 32, 70, 1}, {130, 32, 128, 200, 0}};
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        int64_t m = cs[t].m, di = cs[t].di, W = cs[t].width;
        int hi = cs[t].hi;
        size_t kb = di_kvq_row_bytes(DI_KVQ_FP4_E8M0, di);
        float *src = rnd(W * di, 1.0f), *w = rnd(m * hi, 1.0f);
        float *q = malloc((size_t)(m * hi * di) * sizeof(float));
        uint8_t *row = malloc(kb);
        for (int64_t r = 0; r < m * hi; r++) {
            for (int64_t c = 0; c < di; c++) q[r * di + c] = (float)rng_normal() * 0.7f;
            if (cs[t].qdq) { /* the model's q: FP4-QDQ(32, e8m0) */
                di_kvq_pack(DI_KVQ_FP4_E8M0, q + r * di, di, row);
                di_kvq_unpack(DI_KVQ_FP4_E8M0, row, di, q + r * di);
            }
        }
        uint8_t *keys = index_keys_packed(src, W, di);
        uint8_t *dkeys = (uint8_t *)dev_up(keys, (size_t)W * kb);
        float *dq = dev_up(q, (size_t)(m * hi * di) * 4), *dw = dev_up(w, (size_t)(m * hi) * 4);
        const uint8_t **kc = malloc((size_t)m * sizeof *kc), **kg = malloc((size_t)m * sizeof *kg);
        int32_t *nv = malloc((size_t)m * 4);
        for (int64_t i = 0; i < m; i++) {
            int64_t off = i < m - m / 8 ? 0 : 7; /* the last rows: another cache */
            nv[i] = off ? (int32_t)rng_int((int)(W - off) + 1) : (int32_t)(W - m + i + 1 > 0 ? W - m + i + 1 : 0);
            if (i % 17 == 3) nv[i] = 0;
            kc[i] = keys + (size_t)off * kb;
            kg[i] = dkeys + (size_t)off * kb;
        }
        CHECK(cuda_index_tc_fits(hi, di, dq));
        size_t SB = (size_t)(m * W) * 4;
        float *scc = malloc(SB), *dsc = dev_poison(SB);
        cpu->ops->index_scores_kv(cpu, q, w, m, hi, di, kc, nv, W, scc);
        gpu->ops->index_scores_kv(gpu, dq, dw, m, hi, di, kg, nv, W, dsc);
        float *scg = dev_down(dsc, SB);
        char what[96];
        snprintf(what, sizeof what, "index_scores_kv tc m %lld hi %d di %lld W %lld%s", (long long)m,
                 hi, (long long)di, (long long)W, cs[t].qdq ? " (FP4 q)" : "");
        if (status_ok(what)) {
            if (cs[t].qdq) {
                cmp_exact(what, scg, scc, m * W);
                int k = 16;
                int32_t *ic = malloc((size_t)(m * k) * 4), *ig = malloc((size_t)(m * k) * 4);
                cpu->ops->topk_select(cpu, scc, nv, m, W, k, ic);
                cpu->ops->topk_select(cpu, scg, nv, m, W, k, ig);
                CHECKF(!memcmp(ic, ig, (size_t)(m * k) * 4), "%s: top-%d differs", what, k);
                free(ic);
                free(ig);
            } else {
                idx_check_admissible(what, q, w, m, hi, di, kc, nv, W, scg, scc);
            }
        }
        dev_free(dkeys); dev_free(dq); dev_free(dw); dev_free(dsc);
        free(src); free(q); free(w); free(row); free(keys); free(kc); free(kg); free(nv);
        free(scc); free(scg);
    }
}

/* ---- the split-slot attention and the split mHC product (few rows) */

static int same_bits(const float *a, const float *b, int64_t n) {
    return !memcmp(a, b, (size_t)n * sizeof(float));
}

/* One slot of the three row tables (host rows, device rows, decoded
 * values): a random pool row of the slot's kind, or empty. */
static void attn_slot_set(const attn_pool *ap, int win, int empty, const uint8_t **rc, const uint8_t **rg,
                          const float **rd) {
    int r = win ? rng_int(ap->P) : ap->P + rng_int(ap->P);
    size_t off = attn_pool_off(ap, r);
    *rc = empty ? NULL : ap->host + off;
    *rg = empty ? NULL : ap->dev + off;
    *rd = empty ? NULL : ap->dec + (int64_t)r * ap->d;
}

/* The split-slot form of the tensor-core attention through its launcher
 * against the CPU op within attn_bound.h's bound (which counts the
 * combine's rescales): S = 1 .. 16 blocks per row (past 8 a non-portable
 * cluster), spans of one and of several 64-slot blocks, a partial last
 * block; a row with no slot, a row whose only slots lie in the last block
 * (every other block of the cluster empty: max -1e30, denominator 0), a
 * row with one slot in the first block; sinks far above and below the
 * scores; peaked softmaxes (large q) whose maximum lies in any block (the
 * combine rescales the others down). Then: two runs give the same bits (the combine's order is fixed), S = 1
 * gives the unsplit kernel's bits, and the op table's dispatch at the
 * decode shape (one row, 128 window + 512 compressed slots, 64 heads) is
 * within the same bound. */
static void test_attention_split(void) {
    NEED_GPU();
    const struct { int64_t m; int h; int64_t d; int slots, win; float qs; int splits; } cs[] = {
        {1, 64, 512, 640, 128, 1.0f, 5}, {4, 64, 512, 640, 128, 2.0f, 8}, {5, 70, 128, 300, 64, 1.0f, 3},
        {4, 16, 96, 130, 20, 4.0f, 2},   {5, 24, 160, 581, 0, 1.0f, 8},   {4, 64, 512, 640, 128, 1.0f, 1},
        {5, 32, 64, 1000, 100, 3.0f, 7}, {1, 64, 512, 640, 128, 1.0f, 10}, {2, 64, 512, 1024, 128, 2.0f, 16},
        {4, 64, 512, 1000, 128, 1.0f, 12}};
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        int64_t m = cs[t].m, d = cs[t].d;
        int h = cs[t].h, ns = cs[t].slots, nw = cs[t].win, P = 48;
        attn_pool ap;
        attn_pool_init(&ap, P, d);
        const uint8_t **rc = malloc((size_t)(m * ns) * sizeof *rc), **rg = malloc((size_t)(m * ns) * sizeof *rg);
        const float **rd = malloc((size_t)(m * ns) * sizeof *rd);
        /* rows 0-2 are special when m > 2, the rest random: every case has one */
        int last0 = (ns - 1) / 64 * 64; /* the first slot of the last 64-slot block */
        for (int64_t i = 0; i < m; i++)
            for (int j = 0; j < ns; j++) {
                /* m > 2: row 0 empty, row 1 only the last block, row 2 one slot */
                int empty = (m > 2 && i == 0) || (m > 2 && i == 1 && j < last0) || (m > 2 && i == 2 && j != 3) ||
                            (i > 2 && rng_int(6) == 0);
                attn_slot_set(&ap, j < nw, empty, rc + i * ns + j, rg + i * ns + j, rd + i * ns + j);
            }
        float *q = rnd(m * h * d, cs[t].qs), *sink = rnd(h, 2.0f);
        sink[0] = 60.0f;
        if (h > 1) sink[1] = -60.0f;
        size_t OB = (size_t)(m * h * d) * 4;
        float *dq = dev_up(q, OB), *dsink = dev_up(sink, (size_t)h * 4), *oc = malloc(OB);
        float *d1 = dev_poison(OB), *d2 = dev_poison(OB), *d0 = dev_poison(OB);
        const uint8_t **drows = (const uint8_t **)dev_up(rg, (size_t)(m * ns) * sizeof *rg);
        float sc = (float)(1.0 / sqrt((double)d));
        cpu->ops->sparse_attn_kv(cpu, q, m, h, d, rc, ns, nw, sink, sc, oc);
        di_err err = {0};
        int sp = cs[t].splits;
        di_status st = cuda_op_sparse_attn_kv_tc_split(dq, m, h, d, drows, ns, nw, dsink, sc, sp, d1, &err);
        if (!st) st = cuda_op_sparse_attn_kv_tc_split(dq, m, h, d, drows, ns, nw, dsink, sc, sp, d2, &err);
        if (!st) st = cuda_op_sparse_attn_kv_tc(dq, m, h, d, drows, ns, nw, dsink, sc, d0, &err);
        if (!st) st = di_cuda_synchronize(&err);
        char what[96];
        snprintf(what, sizeof what, "attn split %d m %lld h %d d %lld slots %d", sp, (long long)m, h,
                 (long long)d, ns);
        CHECKF(st == DI_OK, "%s: %s", what, err.msg);
        float *o1 = dev_down(d1, OB), *o2 = dev_down(d2, OB), *o0 = dev_down(d0, OB);
        if (st == DI_OK) {
            cmp_attn_tc(what, o1, oc, q, m, h, d, rd, ns, sink, sc);
            CHECKF(same_bits(o1, o2, m * h * d), "%s: two runs differ", what);
            if (sp == 1) CHECKF(same_bits(o1, o0, m * h * d), "%s: S = 1 differs from the unsplit form", what);
            /* blocks of 16 heads or of 64 (d % 128 == 0; else both 64),
             * split and unsplit: each form's bits must not depend on it */
            for (int split = 0; split < 2; split++) {
                float *oh[2];
                for (int f = 0; f < 2; f++) {
                    cuda_attn_tc_set_head_groups(f ? 4 : 1);
                    float *dd = dev_poison(OB);
                    st = split ? cuda_op_sparse_attn_kv_tc_split(dq, m, h, d, drows, ns, nw, dsink, sc, sp, dd, &err)
                               : cuda_op_sparse_attn_kv_tc(dq, m, h, d, drows, ns, nw, dsink, sc, dd, &err);
                    if (!st) st = di_cuda_synchronize(&err);
                    oh[f] = dev_down(dd, OB);
                    dev_free(dd);
                }
                cuda_attn_tc_set_head_groups(0);
                CHECKF(st == DI_OK && same_bits(oh[0], oh[1], m * h * d), "%s%s: 16 and 64 heads a block differ (%s)",
                       what, split ? "" : " unsplit", err.msg);
                CHECKF(same_bits(oh[0], split ? o1 : o0, m * h * d), "%s%s: a forced head grouping differs from the chosen one",
                       what, split ? "" : " unsplit");
                free(oh[0]);
                free(oh[1]);
            }
            /* the general key decode alone (the fast one off): the same
             * bits; the pool's scales 2^(-3..3) put compressed rows on
             * both sides of the fast form's range, so blocks mix lanes
             * that keep the fast result and lanes that redo it */
            for (int split = 0; split < 2; split++) {
                cuda_attn_tc_set_fast_decode(0);
                float *dd = dev_poison(OB);
                st = split ? cuda_op_sparse_attn_kv_tc_split(dq, m, h, d, drows, ns, nw, dsink, sc, sp, dd, &err)
                           : cuda_op_sparse_attn_kv_tc(dq, m, h, d, drows, ns, nw, dsink, sc, dd, &err);
                if (!st) st = di_cuda_synchronize(&err);
                cuda_attn_tc_set_fast_decode(3);
                float *og = dev_down(dd, OB);
                dev_free(dd);
                CHECKF(st == DI_OK && same_bits(og, split ? o1 : o0, m * h * d),
                       "%s%s: the general key decode alone differs (%s)", what, split ? "" : " unsplit", err.msg);
                free(og);
            }
        }
        dev_free(dq); dev_free(dsink); dev_free(d0); dev_free(d1); dev_free(d2); dev_free((void *)drows);
        attn_pool_free(&ap);
        free(rc); free(rg); free(rd); free(q); free(sink); free(oc); free(o0); free(o1); free(o2);
    }
    CHECK(cuda_attn_tc_splits(640, 8) == 5 && cuda_attn_tc_splits(64, 8) == 1 && cuda_attn_tc_splits(65, 8) == 2 &&
          cuda_attn_tc_splits(512, 8) == 8 && cuda_attn_tc_splits(513, 8) == 5);
    CHECK(cuda_attn_tc_splits(640, 16) == 10 && cuda_attn_tc_splits(1024, 16) == 16 &&
          cuda_attn_tc_splits(1025, 16) == 9 && cuda_attn_tc_splits(640, 1) == 1 && cuda_attn_tc_splits(640, 99) == 10);
    /* the op table at the decode shape (the dispatcher takes the split form) */
    int64_t m = 1, d = 512;
    int h = 64, nw = 128, ns = 640, P = 64;
    attn_pool ap;
    attn_pool_init(&ap, P, d);
    const uint8_t **rc = malloc((size_t)ns * sizeof *rc), **rg = malloc((size_t)ns * sizeof *rg);
    const float **rd = malloc((size_t)ns * sizeof *rd);
    for (int j = 0; j < ns; j++) attn_slot_set(&ap, j < nw, j >= nw && rng_int(5) == 0, rc + j, rg + j, rd + j);
    float *q = rnd(m * h * d, 1.5f), *sink = rnd(h, 2.0f);
    size_t OB = (size_t)(m * h * d) * 4;
    float *dq = dev_up(q, OB), *oc = malloc(OB), *dout = dev_poison(OB);
    float sc = (float)(1.0 / sqrt((double)d));
    cpu->ops->sparse_attn_kv(cpu, q, m, h, d, rc, ns, nw, sink, sc, oc);
    gpu->ops->sparse_attn_kv(gpu, dq, m, h, d, rg, ns, nw, sink, sc, dout);
    float *og = dev_down(dout, OB);
    if (status_ok("sparse_attn_kv decode shape"))
        cmp_attn_tc("attn (op) m 1 h 64 d 512 slots 640", og, oc, q, m, h, d, rd, ns, sink, sc);
    di_backend_cuda_weights_drop(gpu);
    dev_free(dq); dev_free(dout);
    attn_pool_free(&ap);
    free(rc); free(rg); free(rd); free(q); free(sink); free(oc); free(og);
}

/* hc_mix at the model's shape (hc 4, d 5120: n = 20,480, the product over
 * 80 blocks of 256 columns) at 1 and 8 rows, past the split's 64 rows
 * (the cluster of 8 blocks per row) and past 256 (the rows form, a ragged
 * last row group, and n = 384, a last block of columns not whole: the
 * backend lends it the scratch), against the CPU within test_hc's
 * tolerance: the split sums each block's 256 products by a fixed tree and
 * the 80 block sums in order, a tree no deeper than the cluster's (the
 * CPU's sequential sum over 20,480 terms dominates the difference), so the
 * tolerance stays. Then: the same bits on a second run, and a row alone
 * (m = 1) gives the bits it has inside the batch of 8 (the blocks and their
 * order follow from n alone). */
static void test_hc_split(void) {
    NEED_GPU();
    const struct { int64_t m; int64_t d; } cs[] = {{1, 5120}, {8, 5120}, {70, 512}, {300, 5120}, {257, 96}};
    const int hc = 4, nmix = 24;
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        int64_t m = cs[t].m, d = cs[t].d;
        float *s = rnd(m * hc * d, 1.0f), *fn = rnd(nmix * hc * d, 0.02f), *base = rnd(nmix, 0.5f);
        float scale[3] = {0.7f, 1.1f, 0.9f};
        float *pc = malloc((size_t)(m * hc) * 4), *poc = malloc((size_t)(m * hc) * 4),
              *cc = malloc((size_t)(m * hc * hc) * 4);
        cpu->ops->hc_mix(cpu, s, m, hc, d, fn, base, scale, 1e-6, 1e-6, 20, pc, poc, cc);
        float *ds = dev_up(s, (size_t)(m * hc * d) * 4);
        float *dp = dev_poison((size_t)(m * hc) * 4), *dpo = dev_poison((size_t)(m * hc) * 4),
              *dc = dev_poison((size_t)(m * hc * hc) * 4), *dc2 = dev_poison((size_t)(m * hc * hc) * 4);
        gpu->ops->hc_mix(gpu, ds, m, hc, d, fn, base, scale, 1e-6, 1e-6, 20, dp, dpo, dc);
        float *pg = dev_down(dp, (size_t)(m * hc) * 4), *pog = dev_down(dpo, (size_t)(m * hc) * 4),
              *cg = dev_down(dc, (size_t)(m * hc * hc) * 4);
        gpu->ops->hc_mix(gpu, ds, m, hc, d, fn, base, scale, 1e-6, 1e-6, 20, dp, dpo, dc2);
        float *cg2 = dev_down(dc2, (size_t)(m * hc * hc) * 4);
        char what[64];
        snprintf(what, sizeof what, "hc_mix m %lld d %lld", (long long)m, (long long)d);
        if (status_ok(what)) {
            cmp_tol(what, pg, pc, m * hc, 1e-4, 1e-6);
            cmp_tol(what, pog, poc, m * hc, 1e-4, 1e-6);
            cmp_tol(what, cg, cc, m * hc * hc, 1e-4, 1e-6);
            CHECKF(same_bits(cg, cg2, m * hc * hc), "%s: two runs differ", what);
        }
        if (m == 8) { /* row 5 alone */
            float *dp1 = dev_poison(hc * 4), *dpo1 = dev_poison(hc * 4), *dc1 = dev_poison(hc * hc * 4);
            gpu->ops->hc_mix(gpu, ds + 5 * hc * d, 1, hc, d, fn, base, scale, 1e-6, 1e-6, 20, dp1, dpo1, dc1);
            float *c1 = dev_down(dc1, hc * hc * 4), *p1 = dev_down(dp1, hc * 4);
            if (status_ok("hc_mix row alone"))
                CHECKF(same_bits(c1, cg + 5 * hc * hc, hc * hc) && same_bits(p1, pg + 5 * hc, hc),
                       "hc_mix: row 5 alone differs from row 5 of the batch");
            dev_free(dp1); dev_free(dpo1); dev_free(dc1);
            free(c1); free(p1);
        }
        di_backend_cuda_weights_drop(gpu);
        dev_free(ds); dev_free(dp); dev_free(dpo); dev_free(dc); dev_free(dc2);
        free(s); free(fn); free(base); free(pc); free(poc); free(cc); free(pg); free(pog); free(cg); free(cg2);
    }
}

/* The fused ops against the sequences they replace, on the GPU bit for
 * bit, and against the CPU backend's (the composition) within the bounds
 * of the unfused ops' own tests: hc_collapse_norm = hc_collapse, rmsnorm
 * (with the collapse weights of a real hc_mix, as a site uses them);
 * add_bf16 = add, round_bf16, copy. Shapes: the model's (hc 4, d 5120) at
 * 1 and 8 rows, ragged d, many rows, d 6144 (the kernel's largest), hc 2
 * and d 7000 (the two launches inside the op), both norm weight dtypes. */
static void test_fused_ops(void) {
    NEED_GPU();
    const struct { int64_t m; int hc; int64_t d; } cs[] = {
        {1, 4, 5120}, {8, 4, 5120}, {3, 4, 257}, {2, 4, 6144}, {70, 4, 512}, {3, 2, 100}, {1, 4, 7000}};
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        int64_t m = cs[t].m, d = cs[t].d;
        int hc = cs[t].hc, nmix = (2 + hc) * hc;
        size_t SB = (size_t)(m * hc * d) * 4, XB = (size_t)(m * d) * 4, PB = (size_t)(m * hc) * 4,
               CB = (size_t)(m * hc * hc) * 4;
        float *s = rnd(m * hc * d, 1.0f), *fn = rnd(nmix * hc * d, 0.02f), *base = rnd(nmix, 0.5f);
        float scale[3] = {0.7f, 1.1f, 0.9f};
        di_tensor nw = vec_tensor(d, 0, t % 2 ? DI_DTYPE_BF16 : DI_DTYPE_F32);
        float *ds = dev_up(s, SB);
        char what[96];
        snprintf(what, sizeof what, "hc_collapse_norm m %lld hc %d d %lld", (long long)m, hc, (long long)d);
        /* the site's collapse weights from hc_mix on the GPU */
        float *dpin = dev_poison(PB), *dpo = dev_poison(PB), *dc = dev_poison(CB);
        gpu->ops->hc_mix(gpu, ds, m, hc, d, fn, base, scale, 1e-6, 1e-6, 20, dpin, dpo, dc);
        float *pin = dev_down(dpin, PB);
        /* unfused, fused, the CPU's */
        float *dx1 = dev_poison(XB), *dx3 = dev_poison(XB);
        gpu->ops->hc_collapse(gpu, ds, dpin, m, hc, d, dx1);
        gpu->ops->rmsnorm(gpu, dx1, &nw, m, d, 1e-6, dx1);
        gpu->ops->hc_collapse_norm(gpu, ds, dpin, m, hc, d, &nw, 1e-6, dx3);
        float *x1 = dev_down(dx1, XB), *x3 = dev_down(dx3, XB), *xc = malloc(XB), *xc3 = malloc(XB);
        cpu->ops->hc_collapse(cpu, s, pin, m, hc, d, xc);
        cpu->ops->rmsnorm(cpu, xc, &nw, m, d, 1e-6, xc);
        cpu->ops->hc_collapse_norm(cpu, s, pin, m, hc, d, &nw, 1e-6, xc3);
        if (status_ok(what)) {
            CHECKF(same_bits(x1, x3, m * d), "%s: differs from hc_collapse + rmsnorm", what);
            CHECKF(same_bits(xc, xc3, m * d), "%s: the CPU's differs from its two ops", what);
            cmp_tol(what, x3, xc3, m * d, BF16_ULP, 0);
        }
        /* add_bf16 into a third buffer and in place over either input */
        float *a = rnd(m * d, 3.0f), *b = rnd(m * d, 1.0f);
        for (int64_t i = 0; i < m * d; i++) a[i] *= 1.0f + 0x1p-10f * (float)rng_int(9);
        float *ref = malloc(XB);
        memcpy(ref, a, XB);
        cpu->ops->add(cpu, ref, b, m * d);
        cpu->ops->round_bf16(cpu, ref, m * d);
        for (int al = 0; al < 3; al++) {
            float *da = dev_up(a, XB), *db = dev_up(b, XB), *dy = al == 0 ? dev_poison(XB) : al == 1 ? da : db;
            gpu->ops->add_bf16(gpu, dy, da, db, m * d);
            float *yg = dev_down(dy, XB), *yc = malloc(XB), *ca = malloc(XB), *cb = malloc(XB);
            memcpy(ca, a, XB);
            memcpy(cb, b, XB);
            cpu->ops->add_bf16(cpu, al == 0 ? yc : al == 1 ? ca : cb, ca, cb, m * d);
            snprintf(what, sizeof what, "add_bf16 n %lld (output %s)", (long long)(m * d),
                     al == 0 ? "apart" : al == 1 ? "over a" : "over b");
            if (status_ok(what)) {
                cmp_exact(what, yg, ref, m * d);
                cmp_exact(what, al == 0 ? yc : al == 1 ? ca : cb, ref, m * d);
            }
            if (al == 0) dev_free(dy);
            dev_free(da); dev_free(db);
            free(yg); free(yc); free(ca); free(cb);
        }
        di_backend_cuda_weights_drop(gpu);
        dev_free(ds); dev_free(dpin); dev_free(dpo); dev_free(dc); dev_free(dx1); dev_free(dx3);
        free(s); free(fn); free(base); free(pin); free(nw.data); free(x1); free(x3); free(xc); free(xc3);
        free(a); free(b); free(ref);
    }
}

/* qkv_rope_pack against rmsnorm, rope_cs (q), rope_cs (kv) and kv_pack
 * FP8 on the GPU, bit for bit (q, kv and the packed rows), and against
 * the CPU's (the composition): q exactly (the rotation is the CPU's), kv
 * within rmsnorm's bound. The model's shape (64 heads of 512, 64 rope
 * dims) at 1 and 4 rows, a small ragged one, and past the fused kernel's
 * 2048 (the four launches inside the op). */
static void test_qkv_rope_pack(void) {
    NEED_GPU();
    const struct { int64_t m; int h; int64_t hd, rd; } cs_[] = {
        {1, 64, 512, 64}, {4, 64, 512, 64}, {3, 3, 96, 32}, {2, 2, 2560, 64}};
    for (size_t t = 0; t < sizeof cs_ / sizeof *cs_; t++) {
        int64_t m = cs_[t].m, hd = cs_[t].hd, rd = cs_[t].rd, half = rd / 2;
        int h = cs_[t].h;
        size_t QB = (size_t)(m * h * hd) * 4, KB = (size_t)(m * hd) * 4,
               PB = (size_t)m * di_kvq_row_bytes(DI_KVQ_FP8, hd), CB = (size_t)(m * half * 2) * 4;
        float *q = rnd(m * h * hd, 1.0f), *kv = rnd(m * hd, 2.0f), *cs = malloc(CB);
        for (int64_t i = 0; i < m * half; i++) {
            float a = 6.2831853f * (float)rng_int(100000) / 100000.0f;
            cs[2 * i] = cosf(a);
            cs[2 * i + 1] = sinf(a);
        }
        di_tensor nw = vec_tensor(hd, 0, t % 2 ? DI_DTYPE_BF16 : DI_DTYPE_F32);
        float *dcs = dev_up(cs, CB);
        /* unfused */
        float *dq1 = dev_up(q, QB), *dk1 = dev_up(kv, KB);
        uint8_t *dp1 = (uint8_t *)dev_poison(PB);
        gpu->ops->rmsnorm(gpu, dk1, &nw, m, hd, 1e-6, dk1);
        gpu->ops->rope_cs(gpu, dq1, m, h * hd, h, hd, rd, dcs, 0);
        gpu->ops->rope_cs(gpu, dk1, m, hd, 1, hd, rd, dcs, 0);
        gpu->ops->kv_pack(gpu, DI_KVQ_FP8, dk1, m, hd, dp1);
        /* fused */
        float *dq2 = dev_up(q, QB), *dk2 = dev_up(kv, KB);
        uint8_t *dp2 = (uint8_t *)dev_poison(PB);
        gpu->ops->qkv_rope_pack(gpu, dq2, h, dk2, m, hd, rd, &nw, 1e-6, dcs, dp2);
        float *q1 = dev_down(dq1, QB), *k1 = dev_down(dk1, KB), *q2 = dev_down(dq2, QB), *k2 = dev_down(dk2, KB);
        uint8_t *p1 = (uint8_t *)dev_down(dp1, PB), *p2 = (uint8_t *)dev_down(dp2, PB);
        /* the CPU's */
        uint8_t *pc = malloc(PB);
        cpu->ops->qkv_rope_pack(cpu, q, h, kv, m, hd, rd, &nw, 1e-6, cs, pc);
        char what[96];
        snprintf(what, sizeof what, "qkv_rope_pack m %lld heads %d hd %lld rd %lld", (long long)m, h,
                 (long long)hd, (long long)rd);
        if (status_ok(what)) {
            CHECKF(same_bits(q1, q2, m * h * hd) && same_bits(k1, k2, m * hd) && !memcmp(p1, p2, PB),
                   "%s: differs from rmsnorm + rope_cs + kv_pack", what);
            cmp_exact(what, q2, q, m * h * hd);
            cmp_tol(what, k2, kv, m * hd, BF16_ULP, 2 * BF16_ULP); /* a rotation of two near values */
        }
        di_backend_cuda_weights_drop(gpu);
        dev_free(dcs); dev_free(dq1); dev_free(dk1); dev_free(dp1); dev_free(dq2); dev_free(dk2); dev_free(dp2);
        free(q); free(kv); free(cs); free(nw.data); free(q1); free(k1); free(q2); free(k2); free(p1); free(p2);
        free(pc);
    }
}

#if defined(DI_HAVE_CUDA)
void cuda_matvec_set_fp4_dec(int mode); /* cuda_matvec.cu: MXFP4 decode form 0 never, 1 everywhere, -1 the environment's */
#endif

int main(void) {
    const char *seed = getenv("DI_TEST_SEED");
    rng_state = seed && *seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL) * 2654435761u; /* empty: the clock */
    printf("seed %llu\n", (unsigned long long)rng_state);
    di_err err = {0};
    if (di_backend_cuda_create(0, &gpu, &err)) {
        /* no device (or no CUDA in the build): the failure must say so */
        CHECK(gpu == NULL);
        CHECK(err.code == DI_ERR_BACKEND || err.code == DI_ERR_UNSUPPORTED);
        snprintf(gpu_why, sizeof gpu_why, "%s", err.msg[0] ? err.msg : "no CUDA device");
    } else {
        CHECK(!strcmp(gpu->ops->name, "cuda"));
    }
    if (di_backend_cpu_create(2, &cpu, &err)) {
        fprintf(stderr, "cpu backend: %s\n", err.msg);
        return 1;
    }
    RUN(test_memory);
    RUN(test_dependent_chain);
    RUN(test_pool_fills);
    RUN(test_matmul);
    RUN(test_matmul_blas);
    RUN(test_matmul_fused_quant);
    RUN(test_matmul_pair);
    RUN(test_swiglu_matmul_add);
    RUN(test_matmul_grouped);
    RUN(test_matmul_decode);
    RUN(test_rows_ops);
    RUN(test_rope);
    RUN(test_gathers);
    RUN(test_hc);
    RUN(test_attention);
    RUN(test_indexer);
    RUN(test_selection_large);
    RUN(test_moe_and_pool);
    RUN(test_kv);
    RUN(test_index_scores_tc);
    RUN(test_attention_tc);
    RUN(test_route_score_device);
    RUN(test_moe_route_device);
    RUN(test_moe_experts_device);
#if defined(DI_HAVE_CUDA)
    /* the MXFP4 decode form at every batch: w1 and w3 in one launch of its
     * tensor-core kernel (the cases of k % 256 == 0), against the separate
     * launches and the table's loop */
    cuda_matvec_set_fp4_dec(1);
    RUN(test_moe_experts_device);
    cuda_matvec_set_fp4_dec(-1);
#endif
    RUN(test_moe_op_table);
    RUN(test_attention_split);
    RUN(test_hc_split);
    RUN(test_restrict_lists);
    RUN(test_fused_ops);
    RUN(test_qkv_rope_pack);
    RUN(test_logits_greedy);
    RUN(test_logits_draw);
    RUN(test_logits_top);
    di_backend_destroy(gpu);
    di_backend_destroy(cpu);
    return test_summary();
}
