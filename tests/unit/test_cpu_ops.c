/* The CPU backend's own ops on their AVX2 forms (backend/cpu/cpu_ops_avx2.h)
 * give the bits of their scalar forms (the statement of each op's order,
 * docs/numerics.md), on 1 and 2 threads, for shapes with remainders: mHC
 * mixing (architecture.md §4) and the grouped wo_a projection (§5.6). The
 * scalar forms are also checked against a double-precision reference. Its
 * matmul_pair (two products in one pass) gives matmul's bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/kvstore.h"
#include "backend/cpu/cpu_ops_avx2.h"
#include "backend/cpu/cpu_quant.h"
#include "backend/cpu/kernels.h"
#include "core/dtype.h"
#include "core/route_score.h"
#include "test.h"
#include "index_bound.h"

static uint32_t rng = 2463534242u;
static uint32_t rbits(void) { /* 32 random bits */
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}
static float frand(void) { /* uniform in [-1, 1) */
    return (float)(rbits() >> 8) / 8388608.0f - 1.0f;
}

static di_backend *backend(int threads) {
    di_backend *be = NULL;
    di_err e = {0};
    return di_backend_cpu_create(threads, &be, &e) == DI_OK ? be : NULL;
}

typedef struct mix_out {
    float *pre, *post, *comb;
} mix_out;

static void run_mix(di_backend *be, int scalar, const float *s, int64_t m, int hc, int64_t d,
                    const float *fn, const float *base, const float *scale, mix_out *o) {
    di_cpu_kernels_force_scalar(scalar);
    be->ops->hc_mix(be, s, m, hc, d, fn, base, scale, 1e-6, 1e-6, 20, o->pre, o->post, o->comb);
    di_cpu_kernels_force_scalar(0);
}

/* threads of the second backend: 16 puts a row's pieces on threads of
 * their own (cpu_hc_mix's split, however many cores run them) */
static int mix_threads = 2;
/* streams of any fp32 values rather than bf16 ones (the model's), whose
 * squares are exact: the sums of squares then round at every step (a last
 * bit of the sum rarely reaches the outputs through 1 / sqrt, so this
 * mostly widens the inputs the chains are compared on) */
static int mix_full = 0;

static void check_mix(int hc, int64_t d, int64_t m) {
    int nmix = (2 + hc) * hc;
    int64_t n = hc * d;
    float *s = malloc((size_t)(m * n) * sizeof(float)), *fn = malloc((size_t)(nmix * n) * sizeof(float));
    float base[(2 + 16) * 16], scale[3] = {0.5f, 0.75f, 1.25f};
    for (int64_t i = 0; i < m * n; i++) s[i] = mix_full ? 4.0f * frand() : di_round_bf16(4.0f * frand());
    for (int64_t i = 0; i < nmix * n; i++) fn[i] = 0.05f * frand();
    for (int i = 0; i < nmix; i++) base[i] = frand();
    mix_out o[3];
    for (int k = 0; k < 3; k++) {
        o[k].pre = malloc((size_t)(m * hc) * sizeof(float));
        o[k].post = malloc((size_t)(m * hc) * sizeof(float));
        o[k].comb = malloc((size_t)(m * hc * hc) * sizeof(float));
    }
    di_backend *b1 = backend(1), *b2 = backend(mix_threads);
    CHECK(b1 && b2);
    if (b1 && b2) {
        run_mix(b1, 1, s, m, hc, d, fn, base, scale, &o[0]);
        run_mix(b1, 0, s, m, hc, d, fn, base, scale, &o[1]);
        run_mix(b2, 0, s, m, hc, d, fn, base, scale, &o[2]);
        for (int k = 1; k < 3; k++) {
            CHECKF(!memcmp(o[0].pre, o[k].pre, (size_t)(m * hc) * sizeof(float)),
                   "hc=%d d=%lld m=%lld run %d: pre differs from the scalar bits", hc, (long long)d,
                   (long long)m, k);
            CHECKF(!memcmp(o[0].post, o[k].post, (size_t)(m * hc) * sizeof(float)),
                   "hc=%d d=%lld m=%lld run %d: post differs", hc, (long long)d, (long long)m, k);
            CHECKF(!memcmp(o[0].comb, o[k].comb, (size_t)(m * hc * hc) * sizeof(float)),
                   "hc=%d d=%lld m=%lld run %d: comb differs", hc, (long long)d, (long long)m, k);
        }
        /* pre against a double reference: sigmoid(rms-normalised projection) */
        double worst = 0;
        for (int64_t i = 0; i < m; i++) {
            double ss = 0;
            for (int64_t k = 0; k < n; k++) ss += (double)s[i * n + k] * s[i * n + k];
            double r = 1.0 / sqrt(ss / (double)n + 1e-6);
            for (int c = 0; c < hc; c++) {
                double acc = 0;
                for (int64_t k = 0; k < n; k++) acc += (double)s[i * n + k] * fn[c * n + k];
                double want = 1.0 / (1.0 + exp(-(acc * r * scale[0] + base[c]))) + 1e-6;
                double err = fabs(want - o[0].pre[i * hc + c]);
                if (err > worst) worst = err;
            }
        }
        CHECKF(worst < 1e-5, "hc=%d d=%lld: pre off the double reference by %g", hc, (long long)d, worst);
    }
    di_backend_destroy(b1);
    di_backend_destroy(b2);
    for (int k = 0; k < 3; k++) {
        free(o[k].pre);
        free(o[k].post);
        free(o[k].comb);
    }
    free(s);
    free(fn);
}

static void test_hc_mix(void) {
    check_mix(4, 128, 1);
    check_mix(4, 128, 33); /* 2 threads, a block of 1 row at the end */
    check_mix(4, 64, 12);  /* a full block of 8 rows and a partial one */
    check_mix(4, 37, 6);   /* k remainder */
    check_mix(3, 24, 5);   /* 15 outputs: a partial vector */
    check_mix(8, 16, 7);   /* 80 outputs: several passes */
    mix_full = 1;
    check_mix(4, 37, 6);
    check_mix(4, 512, 1);
    mix_full = 0;
    /* rows on 16 threads, large enough to split by outputs (cpu_hc_mix) */
    mix_threads = 16;
    check_mix(4, 4096, 1);
    check_mix(3, 8192, 1); /* 15 outputs: a partial pair */
    check_mix(2, 8192, 2); /* two rows of 5 tasks */
    /* one or two rows on 2-4 threads: each row's outputs in slices of the
     * vector projections (cpu_hc_mix's mix_parts_range) */
    mix_threads = 2;
    check_mix(4, 2048, 1); /* 2 slices of 12 */
    check_mix(8, 1024, 1); /* 80 outputs: 2 slices of 40 */
    mix_threads = 4;
    check_mix(4, 2048, 1); /* 3 slices of 8 */
    check_mix(4, 2048, 2); /* two rows of 2 slices */
    mix_threads = 2;
}

/* Packed cache rows decoded on 8 lanes (cpu_ops_avx2.h) give di_kvq_unpack's
 * bits: every format, rows of random bytes (NaN codes, every scale byte:
 * E8M0's 2^-127 .. 2^127 and NaN, E4M3 scales subnormal to 448 and NaN),
 * 32 to 512 values; a NaN code under a NaN scale is NaN either way, its
 * sign the one operand's or the other's. */
static void test_kvq_unpack(void) {
#if defined(DI_HAVE_AVX2_OPS)
    if (strcmp(di_cpu_kernels_path(), "avx2") != 0) SKIP("no AVX2 path on this CPU");
    const int64_t ns[] = {512, 64, 32};
    for (int half = 0; half < 2; half++) { /* the FP8 rows' decoding by vendor, then through F16C */
        di_cpu_kernels_force_fp8_half(half);
        for (int f = 0; f < DI_KVQ_COUNT; f++)
            for (size_t c = 0; c < sizeof ns / sizeof *ns; c++)
                for (int rep = 0; rep < 40; rep++) {
                    const int64_t n = ns[c];
                    const size_t rb = di_kvq_row_bytes((di_kvq)f, n);
                    uint8_t row[600];
                    for (size_t i = 0; i < rb; i++) row[i] = (uint8_t)(frand() * 128.0f + 128.0f);
                    float a[512], b[512];
                    di_kvq_unpack((di_kvq)f, row, n, a);
                    di_cpu_kvq_unpack_avx2((di_kvq)f, row, n, b);
                    int64_t differ = 0;
                    /* NaN times NaN: which operand's sign the NaN keeps is the compiler's */
                    for (int64_t i = 0; i < n; i++)
                        differ += memcmp(&a[i], &b[i], 4) && !(isnan(a[i]) && isnan(b[i]));
                    CHECKF(differ == 0, "kvq format %d, n %lld, %s decoding: %lld of the 8-lane values differ", f,
                           (long long)n, di_cpu_kernels_fp8_half() ? "F16C" : "shift", (long long)differ);
                }
    }
    di_cpu_kernels_force_fp8_half(0);
#else
    SKIP("x86-64 only");
#endif
}

/* Grouped projection of x [m, g, K] with an FP8 or BF16 weight [g·R, K].
 * cancel: each weight row one code (one value) along k and x alternating
 * ±4096 on top of its random part, so the fp32 partial sums stand far above
 * the result and their order shows through the bf16 output (with plain
 * random inputs it would only at a bf16 rounding boundary). */
/* The scales' lowest E8M0 byte (8 values up from it) and a NaN code at
 * (row, k) of the weight (row < 0: none), for the cases below. */
static int grouped_sbase = 122;
static int64_t grouped_nan_row = -1, grouped_nan_k = 0;

static void check_grouped_x(di_wfmt fmt, int groups, int64_t R, int64_t K, int64_t m, int cancel) {
    int64_t N = groups * R, kb = K / 32;
    uint8_t *w8 = malloc((size_t)(N * K)), *s8 = malloc((size_t)(((N + 31) / 32) * kb));
    uint16_t *w16 = malloc((size_t)(N * K) * sizeof(uint16_t));
    float *x = malloc((size_t)(m * groups * K) * sizeof(float)), *y[3];
    double *wd = malloc((size_t)(N * K) * sizeof(double));
    for (int k = 0; k < 3; k++) y[k] = malloc((size_t)(m * N) * sizeof(float));
    for (int64_t i = 0; i < ((N + 31) / 32) * kb; i++)
        s8[i] = (uint8_t)(grouped_sbase + (rng = rng * 1664525u + 1013904223u) % 8);
    for (int64_t i = 0; i < N * K; i++) {
        rng = rng * 1664525u + 1013904223u;
        uint8_t c = (uint8_t)(rng >> 24);
        if ((c & 0x7F) == 0x7F) c ^= 1; /* no NaN codes */
        w8[i] = cancel && i % K ? w8[i - 1] : c;
        w16[i] = cancel && i % K ? w16[i - 1] : di_f32_to_bf16(frand());
    }
    if (cancel) /* one scale per row: the row's value constant along k */
        for (int64_t i = 0; i < ((N + 31) / 32) * kb; i++) s8[i] = s8[i - i % kb];
    if (grouped_nan_row >= 0) w8[grouped_nan_row * K + grouped_nan_k] = 0xff;
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++)
            wd[n * K + k] = fmt == DI_WFMT_FP8
                                ? (double)di_e4m3_to_f32(w8[n * K + k]) * di_e8m0_to_f32(s8[(n / 32) * kb + k / 32])
                                : (double)di_bf16_to_f32(w16[n * K + k]);
    /* full fp32 inputs: inexact products, so a fused and an unfused step differ */
    for (int64_t i = 0; i < m * groups * K; i++) x[i] = frand() + (cancel ? (i % 2 ? 4096.0f : -4096.0f) : 0.0f);
    di_wmat wm = {fmt, N, K, fmt == DI_WFMT_FP8 ? (const void *)w8 : (const void *)w16,
                  fmt == DI_WFMT_FP8 ? s8 : NULL};
    di_backend *b1 = backend(1), *b2 = backend(2);
    CHECK(b1 && b2);
    if (b1 && b2) {
        di_cpu_kernels_force_scalar(1);
        b1->ops->matmul_grouped(b1, &wm, groups, x, m, y[0]);
        di_cpu_kernels_force_scalar(0);
        b1->ops->matmul_grouped(b1, &wm, groups, x, m, y[1]);
        b2->ops->matmul_grouped(b2, &wm, groups, x, m, y[2]);
        for (int k = 1; k < 3; k++)
            CHECKF(!memcmp(y[0], y[k], (size_t)(m * N) * sizeof(float)),
                   "fmt %d R=%lld K=%lld m=%lld run %d: differs from the scalar bits", (int)fmt,
                   (long long)R, (long long)K, (long long)m, k);
        /* bf16 output of the fp32 dot: within a bf16 step of the exact value */
        int bad = 0;
        for (int64_t i = 0; i < m; i++)
            for (int64_t n = 0; n < N; n++) {
                int64_t g = n / R;
                double acc = 0, mag = 0;
                for (int64_t k = 0; k < K; k++) {
                    double t = (double)x[(i * groups + g) * K + k] * wd[n * K + k];
                    acc += t;
                    mag += fabs(t);
                }
                double tol = fabs(acc) * 0x1p-8 + (double)K * 0x1p-24 * mag;
                if (n == grouped_nan_row ? !isnan(y[0][i * N + n]) : fabs(y[0][i * N + n] - acc) > tol) bad++;
            }
        CHECKF(bad == 0, "%d outputs off the double reference", bad);
    }
    di_backend_destroy(b1);
    di_backend_destroy(b2);
    for (int k = 0; k < 3; k++) free(y[k]);
    free(w8);
    free(s8);
    free(w16);
    free(x);
    free(wd);
}

static void check_grouped(di_wfmt fmt, int groups, int64_t R, int64_t K, int64_t m) {
    check_grouped_x(fmt, groups, R, K, m, 0);
    check_grouped_x(fmt, groups, R, K, m, 1);
}

/* The FP8 units straight from the codes at 1-4 rows (AVX-512 CPUs,
 * di_cpu_fp8_f32rows): the cases above compare them with the scalar
 * bits; here shapes of whole 32-row tiles, wo_a's K of 4,096 (rows one L1
 * set apart), scales where w·sw needs the second factor, a NaN code (its
 * unit redone by the panels) and the units' count. */
static void grouped_units_cases(void) {
    check_grouped(DI_WFMT_FP8, 3, 32, 256, 2);
    check_grouped(DI_WFMT_FP8, 2, 96, 192, 3);
    check_grouped(DI_WFMT_FP8, 2, 64, 128, 4);
    check_grouped(DI_WFMT_FP8, 2, 32, 4096, 1);
    check_grouped(DI_WFMT_FP8, 2, 64, 160, 2); /* K % 64 == 32: the panels */
    grouped_sbase = 226;                        /* 2^99 .. 2^106: sw·2^8 not exact past 2^100 */
    check_grouped(DI_WFMT_FP8, 2, 32, 128, 1);
    grouped_sbase = 122;
    grouped_nan_row = 37, grouped_nan_k = 70; /* the second unit of group 0 */
    check_grouped(DI_WFMT_FP8, 2, 64, 128, 2);
    grouped_nan_row = -1;
}

static void test_matmul_grouped_units(void) {
    long before = di_cpu_fp8_f32rows_units();
    grouped_units_cases();
    const int avx2 = !strcmp(di_cpu_kernels_path(), "avx2");
    if (avx2) CHECKF(di_cpu_fp8_f32rows_units() > before, "the units never ran (%ld)", di_cpu_fp8_f32rows_units() - before);
    /* the 256-bit units (one and two rows), where the CPU has the 512-bit ones */
    if (di_cpu_kernels_wide()) {
        di_cpu_kernels_force_no_avx512(1);
        before = di_cpu_fp8_f32rows_units();
        grouped_units_cases();
        check_grouped(DI_WFMT_FP8, 3, 32, 128, 1);
        CHECKF(di_cpu_fp8_f32rows_units() > before, "the 256-bit units never ran");
        di_cpu_kernels_force_no_avx512(0);
    }
    /* forced onto the panels: the same bits */
    di_backend_cpu_force_no_f32rows(1);
    const long off0 = di_cpu_fp8_f32rows_units();
    check_grouped(DI_WFMT_FP8, 2, 64, 256, 1);
    CHECK(di_cpu_fp8_f32rows_units() == off0);
    di_backend_cpu_force_no_f32rows(0);
}

static void test_matmul_grouped(void) {
    /* below 4 rows the panels go 4 at a time: 10 panels (4, 4, 2), 9 (4, 4, 1), 12 */
    check_grouped(DI_WFMT_FP8, 2, 36, 128, 1);
    check_grouped(DI_WFMT_FP8, 3, 20, 96, 2);
    check_grouped(DI_WFMT_FP8, 2, 44, 256, 3);
    check_grouped(DI_WFMT_BF16, 2, 36, 64, 2);
    check_grouped(DI_WFMT_FP8, 2, 64, 128, 1);
    check_grouped(DI_WFMT_FP8, 2, 44, 256, 9);
    check_grouped(DI_WFMT_FP8, 2, 60, 512, 62); /* partial panel, large enough for 2 threads */
    check_grouped(DI_WFMT_FP8, 4, 20, 64, 6);
    check_grouped(DI_WFMT_BF16, 2, 44, 72, 5);
}

/* matmul_pair (both products in one pass, x quantized once) gives the bits
 * of matmul twice, for FP8 and MXFP4 weights of two sizes on one x, with
 * and without bf16 outputs, at decode rows and past them (prefill), on 1
 * and 3 threads; without FP8 activations (bf16 numerics) it is matmul
 * twice. */
static void check_pair(di_wfmt fmt, int64_t m, int64_t K, int64_t na, int64_t nb, unsigned flags, int threads) {
    di_backend *be = backend(threads);
    CHECK(be);
    if (!be) return;
    uint8_t *w[2], *sc[2];
    di_wmat wm[2];
    const int64_t n[2] = {na, nb};
    for (int i = 0; i < 2; i++) {
        const size_t wb = fmt == DI_WFMT_FP8 ? (size_t)(n[i] * K) : (size_t)(n[i] * K / 2);
        const size_t sb = fmt == DI_WFMT_FP8 ? (size_t)(((n[i] + 31) / 32) * (K / 32)) : (size_t)(n[i] * (K / 32));
        w[i] = malloc(wb), sc[i] = malloc(sb);
        for (size_t j = 0; j < wb; j++) {
            w[i][j] = (uint8_t)(frand() * 128.0f + 128.0f);
            if (fmt == DI_WFMT_FP8 && (w[i][j] & 0x7f) == 0x7f) w[i][j] ^= 1; /* no NaN codes */
        }
        for (size_t j = 0; j < sb; j++) sc[i][j] = (uint8_t)(120 + (int)((frand() + 1.0f) * 3.0f));
        wm[i] = (di_wmat){fmt, n[i], K, w[i], sc[i]};
    }
    float *x = malloc(sizeof(float) * (size_t)(m * K)), *y[4];
    for (int64_t i = 0; i < m * K; i++) x[i] = 4.0f * frand();
    for (int i = 0; i < 4; i++) {
        y[i] = malloc(sizeof(float) * (size_t)(m * n[i % 2]));
        memset(y[i], 0x55, sizeof(float) * (size_t)(m * n[i % 2]));
    }
    be->ops->matmul(be, &wm[0], x, m, y[0], flags);
    be->ops->matmul(be, &wm[1], x, m, y[1], flags);
    be->ops->matmul_pair(be, &wm[0], &wm[1], x, m, y[2], y[3], flags);
    for (int i = 0; i < 2; i++)
        CHECKF(!memcmp(y[i], y[i + 2], sizeof(float) * (size_t)(m * n[i])),
               "matmul_pair fmt %d m=%lld K=%lld flags %u threads %d: product %d differs from matmul", (int)fmt,
               (long long)m, (long long)K, flags, threads, i);
    if (flags & DI_MM_ACT_FP8) { /* and matmul's bits are the kernels' on the calling thread alone: the
                                  * backend's quantization and rounding (over the pool where the work is
                                  * large) change nothing */
        uint8_t *qa = malloc((size_t)(m * K));
        float *sa = malloc(sizeof(float) * (size_t)(m * K / 32));
        for (int i = 0; i < 2; i++) {
            float *ref = malloc(sizeof(float) * (size_t)(m * n[i]));
            di_act_quant_fp8(x, m, K, qa, sa);
            if (fmt == DI_WFMT_FP8) di_gemm_fp8(qa, sa, m, K, w[i], sc[i], n[i], ref, NULL);
            else di_gemm_mxfp4(qa, sa, m, K, w[i], sc[i], n[i], ref, NULL);
            if (flags & DI_MM_OUT_BF16)
                for (int64_t j = 0; j < m * n[i]; j++) ref[j] = di_round_bf16(ref[j]);
            CHECKF(!memcmp(y[i], ref, sizeof(float) * (size_t)(m * n[i])),
                   "matmul fmt %d m=%lld K=%lld n=%lld flags %u threads %d: differs from the kernels' call", (int)fmt,
                   (long long)m, (long long)K, (long long)n[i], flags, threads);
            free(ref);
        }
        free(qa), free(sa);
    }
    for (int i = 0; i < 4; i++) free(y[i]);
    for (int i = 0; i < 2; i++) free(w[i]), free(sc[i]);
    free(x);
    di_backend_destroy(be);
}

static void test_matmul_pair(void) {
    const unsigned q = DI_MM_ACT_FP8, qb = DI_MM_ACT_FP8 | DI_MM_OUT_BF16;
    for (int threads = 1; threads <= 3; threads += 2) {
        check_pair(DI_WFMT_FP8, 1, 512, 1280 / 4, 512 / 4, qb, threads);
        check_pair(DI_WFMT_FP8, 3, 256, 100, 64, q, threads);
        check_pair(DI_WFMT_FP8, 24, 256, 96, 40, qb, threads); /* prefill: one call each */
        check_pair(DI_WFMT_FP4, 1, 512, 288, 288, qb, threads);
        check_pair(DI_WFMT_FP4, 5, 256, 70, 33, q, threads);
        check_pair(DI_WFMT_FP4, 140, 256, 64, 40, qb, threads); /* prefill */
        check_pair(DI_WFMT_FP8, 2, 256, 64, 40, DI_MM_OUT_BF16, threads); /* bf16 numerics: matmul twice */
        check_pair(DI_WFMT_FP8, 1, 2048, 1536, 512, qb, threads); /* work enough for the pool */
        check_pair(DI_WFMT_FP4, 1, 2048, 1024, 1024, qb, threads);
        /* prefill work enough for the quantization and the rounding to go
         * over the pool (cpu_matmul's act_quant and round_bf16_n) */
        check_pair(DI_WFMT_FP8, 300, 1024, 2688, 64, qb, threads);
        check_pair(DI_WFMT_FP4, 300, 1024, 2688, 64, qb, threads);
    }
}

/* collapse / expand (in place, as the forward calls it) / mean on both
 * paths and 1 or 2 threads; one NaN and one infinity among the streams
 * must pass through both forms alike. */
static void check_streams(int hc, int64_t d, int64_t m) {
    size_t ns = (size_t)(m * hc * d);
    float *s = malloc(ns * sizeof(float)), *w = malloc((size_t)(m * hc) * sizeof(float));
    float *post = malloc((size_t)(m * hc) * sizeof(float)), *comb = malloc((size_t)(m * hc * hc) * sizeof(float));
    float *y[3], *e[3], *mean[3];
    for (size_t i = 0; i < ns; i++) s[i] = di_round_bf16(8.0f * frand());
    s[ns / 3] = NAN;
    s[ns / 2] = INFINITY;
    for (int64_t i = 0; i < m * hc; i++) {
        w[i] = frand();
        post[i] = 2.0f * frand();
    }
    for (int64_t i = 0; i < m * hc * hc; i++) comb[i] = frand();
    di_backend *b1 = backend(1), *b2 = backend(2), *bs[3] = {b1, b1, b2};
    CHECK(b1 && b2);
    for (int k = 0; k < 3 && b1 && b2; k++) {
        y[k] = malloc((size_t)(m * d) * sizeof(float));
        e[k] = malloc(ns * sizeof(float));
        mean[k] = malloc((size_t)(m * (d + 3)) * sizeof(float));
        di_cpu_kernels_force_scalar(k == 0);
        bs[k]->ops->hc_collapse(bs[k], s, w, m, hc, d, y[k]);
        memcpy(e[k], s, ns * sizeof(float));
        bs[k]->ops->hc_expand(bs[k], y[k], e[k], post, comb, m, hc, d, e[k]);
        bs[k]->ops->hc_mean(bs[k], s, m, hc, d, mean[k], d + 3);
        di_cpu_kernels_force_scalar(0);
    }
    for (int k = 1; k < 3 && b1 && b2; k++) {
        CHECKF(!memcmp(y[0], y[k], (size_t)(m * d) * sizeof(float)), "hc_collapse d=%lld run %d differs", (long long)d, k);
        CHECKF(!memcmp(e[0], e[k], ns * sizeof(float)), "hc_expand d=%lld run %d differs", (long long)d, k);
        int bad = 0;
        for (int64_t i = 0; i < m; i++) bad += memcmp(mean[0] + i * (d + 3), mean[k] + i * (d + 3), (size_t)d * sizeof(float)) != 0;
        CHECKF(bad == 0, "hc_mean d=%lld run %d: %d rows differ", (long long)d, k, bad);
    }
    if (b1 && b2) { /* the scalar collapse against a double sum, away from the special values */
        int bad = 0;
        for (int64_t i = 0; i < m; i++)
            for (int64_t k = 0; k < d; k++) {
                double acc = 0;
                for (int c = 0; c < hc; c++) acc += (double)w[i * hc + c] * s[(i * hc + c) * d + k];
                if (isfinite(acc) && fabs(y[0][i * d + k] - acc) > fabs(acc) * 0x1p-8 + 1e-5) bad++;
            }
        CHECKF(bad == 0, "hc_collapse: %d values off the double reference", bad);
        for (int k = 0; k < 3; k++) {
            free(y[k]);
            free(e[k]);
            free(mean[k]);
        }
    }
    di_backend_destroy(b1);
    di_backend_destroy(b2);
    free(s);
    free(w);
    free(post);
    free(comb);
}

static void test_hc_streams(void) {
    check_streams(4, 512, 9);
    check_streams(4, 37, 5); /* channel remainder */
    check_streams(3, 8, 2);
    check_streams(8, 40, 3);
    check_streams(16, 24, 2); /* the widest hc the AVX2 expand takes */
    check_streams(17, 16, 2); /* wider: the loops on every path */
}

/* Sparse attention over fp32 rows (empty slots, a partial 64-slot block,
 * a partial 8-slot tile) and the index scores over fp32 and packed keys
 * (visible counts below and at the width): both paths, 1 and 2 threads. */
/* attn_cancel: rows in pairs that agree in channel 0 (the only one q
 * reads: equal scores within a pair, inexact bf16 probabilities) and are
 * opposite in the others, in consecutive slots: P·V's separate products
 * then cancel to exactly 0 in those channels, where a fused step would
 * leave each product's rounding error (invisible through the bf16 output
 * otherwise). */
static int attn_cancel;

static void check_attention(int h, int64_t d, int n_slots, int64_t m) {
    int n_rows = 50;
    float *pool = malloc((size_t)(n_rows * d) * sizeof(float)), *q = malloc((size_t)(m * h * d) * sizeof(float));
    float sink[64], *out[3];
    const float **rows = malloc((size_t)(m * n_slots) * sizeof(float *));
    /* full fp32 values: inexact products, so fused steps would show */
    for (int64_t i = 0; i < n_rows * d; i++) pool[i] = frand();
    for (int64_t i = 0; i < m * h * d; i++) q[i] = 2.0f * frand();
    for (int i = 0; i < h; i++) sink[i] = frand();
    for (int64_t i = 0; i < m * n_slots; i++) {
        rng = rng * 1664525u + 1013904223u;
        rows[i] = (rng >> 28) < 3 ? NULL : pool + (int64_t)((rng >> 8) % (uint32_t)n_rows) * d;
    }
    if (attn_cancel) {
        for (int r = 0; r < n_rows; r += 2)
            for (int64_t k = 0; k < d; k++)
                pool[(r + 1) * d + k] = k == 0 ? pool[r * d] : -pool[r * d + k];
        for (int64_t i = 0; i < m * h * d; i++)
            if (i % d) q[i] = 0.0f;
        for (int64_t i = 0; i < m * n_slots; i++) rows[i] = pool + (i % n_slots % n_rows) * d;
    }
    di_backend *b1 = backend(1), *b2 = backend(2), *bs[3] = {b1, b1, b2};
    CHECK(b1 && b2);
    for (int k = 0; k < 3 && b1 && b2; k++) {
        out[k] = malloc((size_t)(m * h * d) * sizeof(float));
        di_cpu_kernels_force_scalar(k == 0);
        bs[k]->ops->sparse_attn(bs[k], q, m, h, d, rows, n_slots, sink, 0.125f, out[k]);
        di_cpu_kernels_force_scalar(0);
    }
    for (int k = 1; k < 3 && b1 && b2; k++)
        CHECKF(!memcmp(out[0], out[k], (size_t)(m * h * d) * sizeof(float)),
               "sparse_attn h=%d d=%lld slots=%d run %d differs from the scalar bits", h, (long long)d,
               n_slots, k);
    for (int k = 0; k < 3 && b1 && b2; k++) free(out[k]);
    di_backend_destroy(b1);
    di_backend_destroy(b2);
    free(pool);
    free(q);
    free(rows);
}

static void check_index(int hi, int64_t di, int64_t width, int64_t m) {
    float *keys = malloc((size_t)(m * width * di) * sizeof(float)), *q = malloc((size_t)(m * hi * di) * sizeof(float));
    float *w = malloc((size_t)(m * hi) * sizeof(float)), *out[8];
    size_t kb = di_kvq_row_bytes(DI_KVQ_FP4_E8M0, di);
    uint8_t *packed = malloc((size_t)(m * width) * kb);
    const float **kp = malloc((size_t)m * sizeof(float *));
    const uint8_t **pp = malloc((size_t)m * sizeof(uint8_t *));
    int32_t *n_vis = malloc((size_t)m * sizeof(int32_t));
    for (int64_t i = 0; i < m * width * di; i++) keys[i] = frand();
    for (int64_t i = 0; i < m * hi * di; i++) q[i] = di_round_bf16(frand());
    for (int64_t i = 0; i < m * hi; i++) w[i] = di_round_bf16(frand());
    for (int64_t i = 0; i < m; i++) {
        kp[i] = keys + i * width * di;
        pp[i] = packed + (size_t)(i * width) * kb;
        n_vis[i] = (int32_t)(i % 3 == 0 ? width : (i * 7 + 3) % width);
    }
    /* scalar and AVX2 on one thread, AVX2 and scalar on three (fewer rows
     * than threads: the keys split over the pool) */
    di_backend *b1 = backend(1), *b2 = backend(3), *bs[4] = {b1, b1, b2, b2};
    CHECK(b1 && b2);
    if (b1 && b2) b1->ops->kv_pack(b1, DI_KVQ_FP4_E8M0, keys, m * width, di, packed);
    for (int k = 0; k < 4 && b1 && b2; k++) {
        out[k] = malloc((size_t)(m * width) * sizeof(float));
        out[k + 4] = malloc((size_t)(m * width) * sizeof(float));
        di_cpu_kernels_force_scalar(k == 0 || k == 3);
        bs[k]->ops->index_scores(bs[k], q, w, m, hi, di, kp, n_vis, width, out[k]);
        bs[k]->ops->index_scores_kv(bs[k], q, w, m, hi, di, pp, n_vis, width, out[k + 4]);
        di_cpu_kernels_force_scalar(0);
    }
    for (int k = 1; k < 4 && b1 && b2; k++) {
        CHECKF(!memcmp(out[0], out[k], (size_t)(m * width) * sizeof(float)),
               "index_scores hi=%d di=%lld m=%lld run %d differs from the scalar bits", hi, (long long)di,
               (long long)m, k);
        CHECKF(!memcmp(out[4], out[k + 4], (size_t)(m * width) * sizeof(float)),
               "index_scores_kv hi=%d di=%lld m=%lld run %d differs from the scalar bits", hi, (long long)di,
               (long long)m, k);
    }
    if (b1 && b2) {
        /* the scalar scores against the definition: each within the interval
         * its rounding points give over every fp32 form of its dots
         * (index_bound.h), for the fp32 keys and for the packed ones (their
         * decoded values); and a score moved one bf16 step up must fall
         * outside some of those intervals (the check can fail) */
        int bad = 0, bad_kv = 0, caught = 0, moved = 0;
        float *kd = malloc((size_t)di * sizeof(float));
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < width; j++) {
                const float got = out[0][i * width + j], got_kv = out[4][i * width + j];
                if (j >= n_vis[i]) {
                    bad += got != -INFINITY;
                    bad_kv += got_kv != -INFINITY;
                    continue;
                }
                float lo, hv;
                idx_admissible(q + i * hi * di, w + i * hi, hi, di, keys + (i * width + j) * di, &lo, &hv);
                bad += !(got >= lo && got <= hv);
                const float up = di_round_bf16(got + fmaxf(fabsf(got), 0x1p-100f) * 0x1p-7f);
                moved++;
                caught += !(up >= lo && up <= hv);
                di_kvq_unpack(DI_KVQ_FP4_E8M0, packed + (size_t)(i * width + j) * kb, di, kd);
                idx_admissible(q + i * hi * di, w + i * hi, hi, di, kd, &lo, &hv);
                bad_kv += !(got_kv >= lo && got_kv <= hv);
            }
        CHECKF(bad == 0 && bad_kv == 0, "index_scores hi=%d di=%lld: %d (fp32 keys) and %d (packed) scores outside "
               "their interval", hi, (long long)di, bad, bad_kv);
        CHECKF(moved == 0 || caught * 2 > moved, "index_scores hi=%d di=%lld: only %d of %d scores moved a bf16 step "
               "left their interval", hi, (long long)di, caught, moved);
        free(kd);
    }
    for (int k = 0; k < 8 && b1 && b2; k++) free(out[k]);
    di_backend_destroy(b1);
    di_backend_destroy(b2);
    free(keys);
    free(q);
    free(w);
    free(packed);
    free(kp);
    free(pp);
    free(n_vis);
}

/* Fewer query rows than threads: the attention split by heads (and, for
 * packed rows, their decoding spread by slots) gives the bits of the row
 * by row form on one thread, for fp32 rows and for packed FP8 window / FP4
 * compressed rows, on the AVX2 form and the scalar one (forced). */
static void check_attention_heads(int h, int64_t d, int n_slots, int n_win, int64_t m, int scalar) {
    const int n_rows = 40;
    float *pool = malloc((size_t)(n_rows * d) * sizeof(float)), *q = malloc((size_t)(m * h * d) * sizeof(float));
    const size_t wb = di_kvq_row_bytes(DI_KVQ_FP8, d), cb = di_kvq_row_bytes(DI_KVQ_FP4_E4M3, d);
    uint8_t *pw = malloc((size_t)n_rows * wb), *pc = malloc((size_t)n_rows * cb);
    float sink[64], *out[4];
    const float **rows = malloc((size_t)(m * n_slots) * sizeof(float *));
    const uint8_t **prows = malloc((size_t)(m * n_slots) * sizeof(uint8_t *));
    for (int64_t i = 0; i < n_rows * d; i++) pool[i] = frand();
    for (int r = 0; r < n_rows; r++) {
        di_kvq_pack(DI_KVQ_FP8, pool + r * d, d, pw + (size_t)r * wb);
        di_kvq_pack(DI_KVQ_FP4_E4M3, pool + r * d, d, pc + (size_t)r * cb);
    }
    for (int64_t i = 0; i < m * h * d; i++) q[i] = 2.0f * frand();
    for (int i = 0; i < h; i++) sink[i] = frand();
    for (int64_t i = 0; i < m * n_slots; i++) {
        rng = rng * 1664525u + 1013904223u;
        const int r = (int)((rng >> 8) % (uint32_t)n_rows), j = (int)(i % n_slots);
        const int empty = (rng >> 28) < 3;
        rows[i] = empty ? NULL : pool + (int64_t)r * d;
        prows[i] = empty ? NULL : j < n_win ? pw + (size_t)r * wb : pc + (size_t)r * cb;
    }
    di_backend *b1 = backend(1), *b3 = backend(3);
    CHECK(b1 && b3);
    di_cpu_kernels_force_scalar(scalar);
    for (int k = 0; k < 4 && b1 && b3; k++) {
        di_backend *be = k % 2 ? b3 : b1;
        out[k] = malloc((size_t)(m * h * d) * sizeof(float));
        if (k < 2) be->ops->sparse_attn(be, q, m, h, d, rows, n_slots, sink, 0.125f, out[k]);
        else be->ops->sparse_attn_kv(be, q, m, h, d, prows, n_slots, n_win, sink, 0.125f, out[k]);
    }
    di_cpu_kernels_force_scalar(0);
    if (b1 && b3) {
        CHECKF(!memcmp(out[0], out[1], (size_t)(m * h * d) * sizeof(float)),
               "sparse_attn h=%d d=%lld m=%lld: split by heads differs from rows", h, (long long)d, (long long)m);
        CHECKF(!memcmp(out[2], out[3], (size_t)(m * h * d) * sizeof(float)),
               "sparse_attn_kv h=%d d=%lld m=%lld: split by heads differs from rows", h, (long long)d, (long long)m);
        for (int k = 0; k < 4; k++) free(out[k]);
    }
    di_backend_destroy(b1);
    di_backend_destroy(b3);
    free(pool), free(q), free(pw), free(pc), free(rows), free(prows);
}

static void test_attention(void) {
    check_attention(4, 64, 150, 5);
    check_attention(8, 32, 61, 17); /* 2 threads */
    check_attention(3, 24, 9, 2);
    check_attention(2, 20, 70, 3);  /* d % 8 != 0: the scalar form on both paths */
    attn_cancel = 1;
    check_attention(4, 128, 100, 1); /* P·V's separate products, 64-channel blocks */
    check_attention(4, 72, 40, 2);   /* and the 8-channel remainder */
    attn_cancel = 0;
    check_attention_heads(16, 128, 150, 64, 1, 0);
    check_attention_heads(13, 64, 200, 100, 2, 0); /* heads not a multiple of the groups */
    check_attention_heads(6, 64, 500, 128, 1, 1);  /* the scalar form */
}

static void test_index(void) {
    check_index(4, 64, 77, 6);
    check_index(8, 32, 130, 20); /* 3 threads */
    check_index(3, 64, 5, 2);
    check_index(4, 64, 700, 1); /* fewer rows than threads: keys split */
    check_index(5, 32, 1000, 2); /* the second row sees 10 keys */
}

/* RMSNorm (row-parallel, bf16 weight) and RoPE (angles shared by the
 * heads) against the formulas of docs/numerics.md, in the same fp32
 * order, so bit for bit, on 1 and 2 threads. */
static void test_norm_rope(void) {
    enum { M = 64, N = 512 };
    float *x = malloc(M * N * sizeof(float)), *y1 = malloc(M * N * sizeof(float));
    float *y2 = malloc(M * N * sizeof(float)), *want = malloc(M * N * sizeof(float));
    uint16_t wb[N];
    for (int i = 0; i < M * N; i++) x[i] = di_round_bf16(3.0f * frand());
    for (int k = 0; k < N; k++) wb[k] = di_f32_to_bf16(1.0f + frand());
    di_tensor w = {0};
    w.dtype = DI_DTYPE_BF16;
    w.ndim = 1;
    w.shape[0] = N;
    w.data = wb;
    for (int i = 0; i < M; i++) {
        float ss = 0.f;
        for (int k = 0; k < N; k++) {
            volatile float sq = x[i * N + k] * x[i * N + k];
            ss += sq;
        }
        float r = 1.0f / sqrtf(ss / (float)N + 1e-6f);
        for (int k = 0; k < N; k++) {
            volatile float xr = x[i * N + k] * r;
            want[i * N + k] = di_round_bf16(di_bf16_to_f32(wb[k]) * xr);
        }
    }
    di_backend *b1 = backend(1), *b2 = backend(2);
    CHECK(b1 && b2);
    if (b1 && b2) {
        b1->ops->rmsnorm(b1, x, &w, M, N, 1e-6, y1);
        b2->ops->rmsnorm(b2, x, &w, M, N, 1e-6, y2);
        CHECK(!memcmp(y1, want, M * N * sizeof(float)));
        CHECK(!memcmp(y2, want, M * N * sizeof(float)));
        /* 3 heads of 48 rotating 16; 1 head of 288 rotating 272 (more pairs
         * than the op's chunk of angles) */
        static const int cfg[2][3] = {{3, 48, 16}, {1, 288, 272}};
        float freq[136];
        int32_t pos[M];
        for (int i = 0; i < M; i++) pos[i] = i * 37 + 5;
        for (int ci = 0; ci < 4; ci++) {
            int H = cfg[ci / 2][0], HD = cfg[ci / 2][1], RD = cfg[ci / 2][2], inv = ci % 2;
            for (int j = 0; j < RD / 2; j++) freq[j] = powf(10000.f, -2.0f * j / RD);
            int64_t stride = H * HD + 5;
            memcpy(y1, x, M * N * sizeof(float));
            memcpy(want, x, M * N * sizeof(float));
            b1->ops->rope(b1, y1, M, stride, H, HD, RD, pos, freq, inv);
            memcpy(y2, x, M * N * sizeof(float)); /* rows split over two threads (the larger heads) */
            b2->ops->rope(b2, y2, M, stride, H, HD, RD, pos, freq, inv);
            CHECKF(!memcmp(y1, y2, M * N * sizeof(float)), "rope %d/%d inverse=%d: 2 threads differ from 1", HD,
                   RD, inv);
            for (int i = 0; i < M; i++)
                for (int h = 0; h < H; h++)
                    for (int j = 0; j < RD / 2; j++) {
                        float *v = want + i * stride + h * HD + (HD - RD) + 2 * j;
                        float ang = (float)pos[i] * freq[j], c = cosf(ang), sn = inv ? -sinf(ang) : sinf(ang);
                        volatile float a = v[0] * c, b = v[1] * sn, e = v[0] * sn, f = v[1] * c;
                        v[0] = di_round_bf16(a - b);
                        v[1] = di_round_bf16(e + f);
                    }
            CHECKF(!memcmp(y1, want, M * N * sizeof(float)), "rope %d/%d inverse=%d differs from the formula",
                   HD, RD, inv);
        }
    }
    if (b1 && b2) { /* SwiGLU, row-parallel: 1 and 2 threads against the formula */
        float rw[M];
        for (int i = 0; i < M; i++) rw[i] = frand();
        for (int t = 0; t < 2; t++) {
            di_backend *be = t ? b2 : b1;
            be->ops->swiglu(be, x, x + 17, rw, M - 1, N, 2.5f, y1);
            int bad = 0;
            for (int i = 0; i < M - 1; i++)
                for (int k = 0; k < N; k++) {
                    float gv = fminf(x[i * N + k], 2.5f), uv = fminf(fmaxf(x[17 + i * N + k], -2.5f), 2.5f);
                    const float t = di_rs_exp_nonpos(-fabsf(gv));
                    volatile float sg = (gv >= 0.0f ? 1.0f : t) / (1.0f + t), a = gv * sg, v = a * uv,
                                   wv = rw[i] * v;
                    float want_v = di_round_bf16(wv);
                    bad += memcmp(&want_v, &y1[i * N + k], sizeof want_v) != 0;
                }
            CHECKF(bad == 0, "swiglu on %d thread(s): %d values differ from the formula", t + 1, bad);
        }
        /* the vector form against the loops: with and without row weights
         * and the clamp, a tail of 5 past the lanes, NaN and infinities */
        enum { SM = 3, SN = 37 };
        float gs[SM * SN], us[SM * SN], o[2][SM * SN];
        for (int k = 0; k < SM * SN; k++) gs[k] = 4.0f * frand(), us[k] = 4.0f * frand();
        gs[5] = NAN, us[7] = NAN, gs[9] = INFINITY, us[11] = -INFINITY, gs[13] = -INFINITY, us[40] = INFINITY;
        for (int v = 0; v < 4; v++) {
            for (int sc = 0; sc < 2; sc++) {
                di_cpu_kernels_force_scalar(sc);
                b1->ops->swiglu(b1, gs, us, v & 1 ? rw : NULL, SM, SN, v & 2 ? 2.5f : 0.0f, o[sc]);
                di_cpu_kernels_force_scalar(0);
            }
            int bad = 0;
            for (int k = 0; k < SM * SN; k++) bad += memcmp(&o[0][k], &o[1][k], sizeof(float)) != 0;
            CHECKF(bad == 0, "swiglu weights %d clamp %d: %d values differ between the loops and the lanes", v & 1,
                   v >> 1, bad);
        }
    }
    di_backend_destroy(b1);
    di_backend_destroy(b2);
    free(x);
    free(y1);
    free(y2);
    free(want);
}

/* The FP4 quantize-dequantize ops (the indexer's per 32 with a power-of-two
 * scale, the cache's per 16 with an E4M3 scale) on their AVX2 form and on 1
 * and 2 threads give di_cpu_qdq_fp4's bits, block by block: random values,
 * the grid's midpoints (ties to the even code), values past the clamp,
 * zeros of both signs, NaN (clamped to -6), an infinity (the block's scale
 * is then infinite and its outputs NaN or infinite, as the scalar code's;
 * NaNs compare equal whatever their payload), blocks under the scale's
 * floor. */
static void test_qdq_fp4(void) {
    enum { NB = 4096 };
    float *x = malloc(NB * 32 * sizeof(float)), *want = malloc(NB * 32 * sizeof(float));
    float *got = malloc(NB * 32 * sizeof(float));
    static const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    di_backend *b1 = backend(1), *b2 = backend(2);
    CHECK(b1 && b2);
    for (int e4m3 = 0; b1 && b2 && e4m3 <= 1; e4m3++) {
        const int bl = e4m3 ? 16 : 32;
        const int64_t n = (int64_t)NB * 32;
        for (int64_t i = 0; i < n; i++) {
            const int64_t blk = i / bl, k = i % bl;
            float v = 4.0f * frand();
            switch (blk % 8) {
            case 1: /* amax 6: scale 1, the midpoints exactly */
                v = k == 0 ? 6.0f : (k % 2 ? -1.0f : 1.0f) * mids[k % 7];
                break;
            case 2: v = 100.0f * frand(); break; /* a wide block */
            case 3: v = k % 3 == 0 ? 0.0f : k % 3 == 1 ? -0.0f : 1e-3f * frand(); break;
            case 4: v = k == 5 ? NAN : v; break;
            case 5: v = k == 7 ? (blk % 16 == 5 ? INFINITY : -INFINITY) : v; break;
            case 6: v = 1e-38f * frand(); break; /* under the e8m0 scale's floor */
            case 7: v = di_round_bf16(v * 0x1p-7f); break;
            }
            x[i] = v;
        }
        memcpy(want, x, n * sizeof(float));
        for (int64_t b = 0; b < n / bl; b++) di_cpu_qdq_fp4(want + b * bl, bl, e4m3);
        for (int t = 0; t < 2; t++) {
            di_backend *be = t ? b2 : b1;
            for (int scalar = 0; scalar <= 1; scalar++) {
                memcpy(got, x, n * sizeof(float));
                di_cpu_kernels_force_scalar(scalar);
                if (e4m3) be->ops->qdq_fp4_e4m3(be, got, n);
                else be->ops->qdq_fp4_e8m0(be, got, n);
                di_cpu_kernels_force_scalar(0);
                int bad = 0;
                for (int64_t i = 0; i < n; i++)
                    bad += !(isnan(got[i]) && isnan(want[i])) && memcmp(&got[i], &want[i], sizeof(float)) != 0;
                CHECKF(bad == 0, "qdq_fp4 e4m3=%d on %d thread(s), scalar=%d: %d values differ", e4m3, t + 1, scalar,
                       bad);
            }
        }
    }
    di_backend_destroy(b1);
    di_backend_destroy(b2);
    free(x), free(want), free(got);
}

/* The backend's round_bf16 and scale_bf16 ops (whole outputs of the
 * products and the mHC ops go through the same vector rounding) give
 * di_round_bf16's bits on any fp32 pattern: NaN payloads (kept, quieted),
 * infinities, signed zeros, subnormals, the largest finite values (which
 * round to infinity), ties at bit 16 with either parity, random bit
 * patterns; lengths with every remainder of 8 and unaligned starts. */
static void test_round_bf16(void) {
    enum { N = 1031 };
    static const uint32_t special[] = {0x7fc00000u, 0x7f800001u, 0xffa5a5a5u, 0x7f800000u, 0xff800000u,
                                       0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu,
                                       0xff7fffffu, 0x3f808000u, 0x3f818000u, 0x3f807fffu, 0xbf818000u,
                                       0x00008000u, 0x00018000u, 0x7f7f8000u};
    static const float cs[] = {1.0f, 0.5f, -3.0f, 0x1p100f, 0x1p-100f};
    const size_t nc = sizeof cs / sizeof *cs; /* cs[ci] for ci < nc: scale_bf16; ci = nc: round_bf16 */
    float *x = malloc((N + 3) * sizeof(float)), *got = malloc((N + 3) * sizeof(float));
    di_backend *be = backend(2);
    CHECK(be != NULL);
    for (int i = 0; i < N + 3; i++) {
        uint32_t u = i < (int)(sizeof special / sizeof *special) ? special[i] : rbits();
        if (i % 5 == 1) u = (u & 0xffff0000u) | 0x8000u; /* a tie */
        if (i % 7 == 2) u ^= 0x80000000u;
        memcpy(&x[i], &u, 4);
    }
    for (int scalar = 0; be && scalar <= 1; scalar++)
        for (size_t ci = 0; ci <= nc; ci++)
            for (int64_t n = 0; n <= N; n += n < 40 ? 1 : 991) {
                const int64_t at = n % 3; /* unaligned starts */
                memcpy(got, x, (N + 3) * sizeof(float));
                di_cpu_kernels_force_scalar(scalar);
                if (ci < nc) be->ops->scale_bf16(be, got + at, n, cs[ci]);
                else be->ops->round_bf16(be, got + at, n);
                di_cpu_kernels_force_scalar(0);
                int bad = 0;
                for (int64_t i = 0; i < N + 3; i++) {
                    const int in = i >= at && i < at + n;
                    const float want = !in ? x[i] : ci < nc ? di_round_bf16(x[i] * cs[ci]) : di_round_bf16(x[i]);
                    bad += memcmp(&got[i], &want, sizeof(float)) != 0;
                }
                CHECKF(bad == 0, "%s n=%lld at %lld (c #%zu), scalar=%d: %d values differ",
                       ci < nc ? "scale_bf16" : "round_bf16", (long long)n, (long long)at, ci,
                       scalar, bad);
            }
    di_backend_destroy(be);
    free(x), free(got);
}

/* The backend's add and add_bf16 (over the pool past ~200K values, on 8
 * lanes): each value the scalar fp32 sum (rounded to bf16 for add_bf16),
 * NaN and infinities included, x equal to y too, lengths short and long. */
static void test_add(void) {
    enum { N = 600011 };
    float *y = malloc(N * sizeof(float)), *x = malloc(N * sizeof(float)), *y0 = malloc(N * sizeof(float));
    di_backend *be = backend(2);
    CHECK(be != NULL);
    for (int i = 0; i < N; i++) {
        uint32_t a = rbits(), b = rbits();
        if (i % 3) a = (a & 0x807fffffu) | (uint32_t)(100 + i % 56) << 23; /* mostly ordinary magnitudes */
        if (i % 5) b = (b & 0x807fffffu) | (uint32_t)(100 + i % 56) << 23;
        memcpy(&y0[i], &a, 4), memcpy(&x[i], &b, 4);
    }
    static const int64_t ns[] = {1, 7, 8, 9, 4097, N};
    for (int scalar = 0; be && scalar <= 1; scalar++)
        for (size_t t = 0; t < sizeof ns / sizeof *ns; t++)
            for (int op = 0; op < 3; op++) { /* add; add_bf16; add of y to itself */
                const int64_t n = ns[t];
                memcpy(y, y0, N * sizeof(float));
                di_cpu_kernels_force_scalar(scalar);
                if (op == 0) be->ops->add(be, y, x, n);
                else if (op == 1) be->ops->add_bf16(be, y, y, x, n);
                else be->ops->add(be, y, y, n);
                di_cpu_kernels_force_scalar(0);
                int bad = 0;
                for (int64_t i = 0; i < N; i++) {
                    float w = y0[i];
                    if (i < n) w = op == 0 ? y0[i] + x[i] : op == 1 ? di_round_bf16(y0[i] + x[i]) : y0[i] + y0[i];
                    bad += !(isnan(w) && isnan(y[i])) && memcmp(&w, &y[i], sizeof(float)) != 0;
                }
                CHECKF(bad == 0, "%s n=%lld scalar=%d: %d values differ", op == 1 ? "add_bf16" : "add",
                       (long long)n, scalar, bad);
            }
    di_backend_destroy(be);
    free(y), free(x), free(y0);
}

/* The Engram gate over the pool by rows (bf16 gate weights): one and two
 * threads against the formula of backend.h, computed here as the op's loop
 * states it, bit for bit. */
static void test_engram_gate(void) {
    enum { M = 21, HC = 4, D = 512 };
    static float s0[M * HC * D], s1[M * HC * D], s2[M * HC * D], kv[M * (HC + 1) * D];
    static uint16_t qb[HC * D], kb[HC * D];
    for (int i = 0; i < M * HC * D; i++) s0[i] = di_round_bf16(2.0f * frand());
    for (int i = 0; i < M * (HC + 1) * D; i++) kv[i] = di_round_bf16(2.0f * frand());
    for (int i = 0; i < HC * D; i++) qb[i] = di_f32_to_bf16(1.0f + 0.5f * frand()), kb[i] = di_f32_to_bf16(1.0f + 0.5f * frand());
    di_tensor qw = {0}, kw = {0};
    qw.dtype = kw.dtype = DI_DTYPE_BF16, qw.ndim = kw.ndim = 2, qw.shape[0] = kw.shape[0] = HC,
    qw.shape[1] = kw.shape[1] = D, qw.data = qb, kw.data = kb;
    memcpy(s1, s0, sizeof s0), memcpy(s2, s0, sizeof s0);
    di_backend *b1 = backend(1), *b2 = backend(2);
    CHECK(b1 && b2);
    if (b1 && b2) {
        b1->ops->engram_gate(b1, s1, kv, &qw, &kw, M, HC, D, 1e-6);
        b2->ops->engram_gate(b2, s2, kv, &qw, &kw, M, HC, D, 1e-6);
        const float inv_sqrt_d = (float)(1.0 / sqrt((double)D));
        int bad = 0;
        for (int i = 0; i < M; i++)
            for (int c = 0; c < HC; c++) {
                const float *h = s0 + (i * HC + c) * D, *key = kv + (i * (HC + 1) + c) * D;
                const float *value = kv + (i * (HC + 1) + HC) * D;
                float sh = 0.f, sk = 0.f, dot = 0.f;
                for (int k = 0; k < D; k++) {
                    volatile float a = h[k] * h[k], b = key[k] * key[k];
                    sh = sh + a, sk = sk + b;
                    volatile float wgt = di_bf16_to_f32(qb[c * D + k]) * di_bf16_to_f32(kb[c * D + k]);
                    volatile float hw = h[k] * wgt, t = hw * key[k];
                    dot = dot + t;
                }
                volatile float r1 = 1.0f / sqrtf(sh / (float)D + 1e-6f), r2 = 1.0f / sqrtf(sk / (float)D + 1e-6f);
                volatile float rstd = r1 * r2, d1 = dot * rstd, d2 = d1 * inv_sqrt_d;
                const float a = sqrtf(fmaxf(fabsf(d2), 1e-6f));
                const float gate = 1.0f / (1.0f + expf(-copysignf(a, d2)));
                for (int k = 0; k < D; k++) {
                    volatile float gv = gate * value[k];
                    const float want = di_round_bf16(h[k] + gv);
                    const int at = (i * HC + c) * D + k;
                    bad += memcmp(&want, &s1[at], sizeof want) != 0 || memcmp(&want, &s2[at], sizeof want) != 0;
                }
            }
        CHECKF(bad == 0, "engram_gate: %d values differ from the formula on 1 or 2 threads", bad);
    }
    di_backend_destroy(b1);
    di_backend_destroy(b2);
}

/* gather_rows and scatter_add_rows on two threads (past their pool
 * thresholds) give the sequential loops' bits; the scatter-add's
 * destination rows repeat (as the batched experts' call has them), so
 * each row's sums must keep the rows' order. */
static void test_rows(void) {
    enum { M = 150, N = 2053, R = 40 };
    float *src = malloc(sizeof(float) * M * N), *dst = malloc(sizeof(float) * R * N);
    float *want = malloc(sizeof(float) * R * N), *g = malloc(sizeof(float) * M * N);
    int32_t rows[M];
    di_backend *be = backend(2);
    CHECK(be != NULL);
    for (int i = 0; i < M; i++) rows[i] = (int32_t)(rbits() % R);
    for (int64_t i = 0; i < (int64_t)M * N; i++) src[i] = 4.0f * frand();
    for (int64_t i = 0; i < (int64_t)R * N; i++) dst[i] = want[i] = frand();
    for (int i = 0; i < M; i++)
        for (int64_t k = 0; k < N; k++) want[rows[i] * N + k] += src[i * N + k];
    if (be) {
        be->ops->scatter_add_rows(be, dst, rows, src, M, N);
        CHECK(!memcmp(dst, want, sizeof(float) * R * N));
        be->ops->gather_rows(be, src, rows, M, N, g); /* rows < R index src's first R rows */
        int bad = 0;
        for (int i = 0; i < M; i++) bad += memcmp(g + (int64_t)i * N, src + (int64_t)rows[i] * N, sizeof(float) * N) != 0;
        CHECKF(bad == 0, "gather_rows: %d rows differ", bad);
    }
    di_backend_destroy(be);
    free(src), free(dst), free(want), free(g);
}

/* RMSNorm's sums of squares, 8 rows side by side, before the bf16 output
 * hides their last bits: each row's one sequential chain (square rounded,
 * then added), on full fp32 values whose sums round (squares of like size,
 * or over 2^±24), at lengths with every tail; then the whole op on such
 * rows, row counts that leave rows past the blocks of 8, in place, against
 * the loops. */
static void test_sum_squares(void) {
#if defined(DI_HAVE_AVX2_OPS)
    if (strcmp(di_cpu_kernels_path(), "avx2")) SKIP("no AVX2 on this machine");
    enum { LD = 5128 };
    static float x[8 * LD];
    static const int ns[] = {1, 2, 7, 8, 9, 15, 16, 17, 100, 509, 2048, 5120};
    for (size_t t = 0; t < 2 * sizeof ns / sizeof *ns; t++) {
        const int n = ns[t % (sizeof ns / sizeof *ns)], wide = t >= sizeof ns / sizeof *ns;
        for (int i = 0; i < 8 * LD; i++) x[i] = ldexpf(frand(), wide ? (int)(frand() * 12.0f) : 0);
        float got[8];
        di_cpu_sumsq_rows8_avx2(x, LD, n, got);
        int bad = 0;
        for (int r = 0; r < 8; r++) {
            float want = 0.f;
            for (int k = 0; k < n; k++) {
                volatile float sq = x[r * LD + k] * x[r * LD + k];
                want = want + sq;
            }
            bad += memcmp(&got[r], &want, sizeof want) != 0;
        }
        CHECKF(bad == 0, "n %d%s: %d of 8 rows differ", n, wide ? " (wide)" : "", bad);
    }
    static const int shapes[][2] = {{8, 512}, {19, 100}, {3, 7}, {17, 2048}};
    static uint16_t wb[2048];
    for (int k = 0; k < 2048; k++) wb[k] = di_f32_to_bf16(1.0f + frand());
    di_backend *b1 = backend(1), *b2 = backend(2);
    CHECK(b1 && b2);
    for (size_t t = 0; t < sizeof shapes / sizeof *shapes && b1 && b2; t++) {
        const int m = shapes[t][0], n = shapes[t][1];
        di_tensor w = {0};
        w.dtype = DI_DTYPE_BF16, w.ndim = 1, w.shape[0] = n, w.data = wb;
        float *xs = malloc((size_t)(m * n) * sizeof(float)), *y[3];
        for (int i = 0; i < m * n; i++) xs[i] = ldexpf(frand(), (int)(frand() * 8.0f));
        for (int k = 0; k < 3; k++) {
            y[k] = malloc((size_t)(m * n) * sizeof(float));
            memcpy(y[k], xs, (size_t)(m * n) * sizeof(float));
            di_cpu_kernels_force_scalar(k == 0);
            di_backend *b = k == 2 ? b2 : b1;
            b->ops->rmsnorm(b, y[k], &w, m, n, 1e-6, y[k]);
            di_cpu_kernels_force_scalar(0);
        }
        for (int k = 1; k < 3; k++)
            CHECKF(!memcmp(y[0], y[k], (size_t)(m * n) * sizeof(float)), "rmsnorm %dx%d: run %d differs from the loops", m, n, k);
        for (int k = 0; k < 3; k++) free(y[k]);
        free(xs);
    }
    di_backend_destroy(b1);
    di_backend_destroy(b2);
#else
    SKIP("no AVX2 forms on this architecture");
#endif
}

/* The panel kernel itself, before any bf16 rounding: each output is the
 * fmaf chain over k (a mul-then-add step would differ in the last bits). */
static void test_panel_kernel(void) {
#if defined(DI_HAVE_AVX2_OPS)
    if (strcmp(di_cpu_kernels_path(), "avx2")) SKIP("no AVX2 on this machine");
    enum { K = 96, M = 7, N = 8 };
    static uint8_t w[N * K], sc[K / 32];
    static float x[M * K], pt[K * 8] __attribute__((aligned(32))), y[M * 8], want[M * 8];
    for (int i = 0; i < N * K; i++) {
        rng = rng * 1664525u + 1013904223u;
        w[i] = (uint8_t)(rng >> 24);
        if ((w[i] & 0x7F) == 0x7F) w[i] ^= 1;
    }
    for (int i = 0; i < K / 32; i++) sc[i] = (uint8_t)(124 + i);
    for (int i = 0; i < 256; i++) w[i] = (uint8_t)i; /* every code once, NaN codes included */
    for (int i = 0; i < M * K; i++) x[i] = frand();
    for (int nb = 8; nb >= 5; nb -= 3) {
        di_cpu_fp8_panel8_avx2(w, sc, K, 0, nb, pt);
        int bad_dec = 0;
        for (int k = 0; k < K; k++)
            for (int j = 0; j < 8; j++) {
                float v = j < nb ? di_e4m3_to_f32(w[j * K + k]) * di_e8m0_to_f32(sc[k / 32]) : 0.f;
                bad_dec += memcmp(&v, &pt[k * 8 + j], sizeof v) != 0 && !(v != v && pt[k * 8 + j] != pt[k * 8 + j]);
                bad_dec += v != v && signbit(v) != signbit(pt[k * 8 + j]);
            }
        CHECKF(bad_dec == 0, "nb=%d: %d decoded weights differ", nb, bad_dec);
        di_cpu_panel8_f32_avx2(pt, K, x, K, M, y, 8, nb);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < nb; j++) {
                float acc = 0.f;
                for (int k = 0; k < K; k++) acc = fmaf(x[i * K + k], pt[k * 8 + j], acc);
                want[i * 8 + j] = acc;
            }
        int bad = 0;
        for (int i = 0; i < M; i++) bad += memcmp(y + i * 8, want + i * 8, (size_t)nb * sizeof(float)) != 0;
        CHECKF(bad == 0, "nb=%d: %d rows differ from the fmaf chains", nb, bad);
    }
#else
    SKIP("no AVX2 forms on this architecture");
#endif
}

/* The panel decoding against e4m3 · e8m0 in fp32 (one rounding) for every
 * code under scale bytes across the E8M0 range (a subnormal 2^-127, the
 * largest scales past 2^119 that take the two-step scaling, the NaN byte),
 * through F16C (forced, so AMD machines check it too) and the CPU's own
 * route. */
static void test_panel_decode_scales(void) {
#if defined(DI_HAVE_AVX2_OPS)
    if (strcmp(di_cpu_kernels_path(), "avx2")) SKIP("no AVX2 on this machine");
    enum { K = 256 };
    static const uint8_t sb[K / 32] = {0, 1, 60, 127, 200, 247, 254, 255};
    static uint8_t w[8 * K];
    static float pt[K * 8] __attribute__((aligned(32)));
    for (int i = 0; i < 8 * K; i++) w[i] = (uint8_t)(i * 37 + i / K); /* every code in each row */
    for (int forced = 1; forced >= 0; forced--) {
        di_cpu_kernels_force_fp8_half(forced);
        di_cpu_fp8_panel8_avx2(w, sb, K, 0, 8, pt);
        int bad = 0;
        for (int k = 0; k < K; k++)
            for (int j = 0; j < 8; j++) {
                const float v = di_e4m3_to_f32(w[j * K + k]) * di_e8m0_to_f32(sb[k / 32]), got = pt[k * 8 + j];
                /* a NaN code's sign is kept; a NaN code times a NaN scale may give either NaN */
                if (v != v) bad += got == got || (sb[k / 32] != 255 && signbit(v) != signbit(got));
                else bad += memcmp(&v, &got, sizeof v) != 0;
            }
        CHECKF(bad == 0, "F16C forced=%d: %d decoded weights differ", forced, bad);
    }
    di_cpu_kernels_force_fp8_half(0);
#else
    SKIP("no AVX2 forms on this architecture");
#endif
}

/* The lane kernels of the attention before any rounding: every lane the
 * scalar step. */
static void test_dots_kernel(void) {
#if defined(DI_HAVE_AVX2_OPS)
    if (strcmp(di_cpu_kernels_path(), "avx2")) SKIP("no AVX2 on this machine");
    enum { NQ = 11, N = 40 };
    static float q[NQ * N], rows[8 * N], out[NQ * 8];
    const float *r8[8];
    for (int i = 0; i < NQ * N; i++) q[i] = frand();
    for (int i = 0; i < 8 * N; i++) rows[i] = frand();
    for (int j = 0; j < 8; j++) r8[j] = rows + j * N;
    di_cpu_dots8_avx2(q, NQ, N, r8, out);
    int bad = 0;
    for (int v = 0; v < NQ; v++)
        for (int j = 0; j < 8; j++) {
            float acc = 0.f;
            for (int t = 0; t < N; t++) {
                volatile float p = q[v * N + t] * rows[j * N + t]; /* rounded product, never fused */
                acc += p;
            }
            bad += memcmp(&acc, &out[v * 8 + j], sizeof acc) != 0;
        }
    CHECKF(bad == 0, "%d of %d dots differ from the scalar chains", bad, NQ * 8);
    /* the P·V step: acc·rescale, then acc + p[j]·rows[j] in j order (empty
     * slots skipped), over a 64-channel block and an 8-channel remainder */
    enum { PN = 72, PJ = 6 };
    static float acc[PN], want[PN], prow[PJ][PN];
    const float *pr[PJ];
    float pp[PJ];
    for (int j = 0; j < PJ; j++) {
        for (int k = 0; k < PN; k++) prow[j][k] = frand();
        pr[j] = j == 2 ? NULL : prow[j];
        pp[j] = di_round_bf16(frand());
    }
    for (int k = 0; k < PN; k++) acc[k] = want[k] = frand();
    di_cpu_pv_avx2(acc, 0.8125001f, pp, pr, PJ, PN);
    for (int k = 0; k < PN; k++) {
        want[k] *= 0.8125001f;
        for (int j = 0; j < PJ; j++) {
            if (!pr[j]) continue;
            volatile float p = pp[j] * prow[j][k];
            want[k] += p;
        }
    }
    CHECK(!memcmp(acc, want, sizeof acc));
#else
    SKIP("no AVX2 forms on this architecture");
#endif
}

/* The backend's large blocks: a freed one comes back for a request of
 * its size (not in sanitizer builds, which keep nothing), zeroed by alloc
 * whatever its last user left; more large blocks at once than it tracks,
 * frees past what it keeps, and a pointer it never handed out all free
 * cleanly (the sanitizer and leak checks watch these). */
static void test_block_reuse(void) {
    di_backend *be = backend(2);
    CHECK(be != NULL);
    if (!be) return;
    const size_t big = (size_t)3 << 20;
    unsigned char *a = be->ops->alloc(be, big);
    CHECK(a != NULL);
    if (!a) return;
    memset(a, 0x5a, big);
    be->ops->free(be, a);
    unsigned char *b = be->ops->alloc(be, big - 4096);
#if !defined(DI_SANITIZE)
    CHECKF(b == a, "a freed block of the same size was not handed out again");
#endif
    int dirty = 0;
    for (size_t i = 0; b && i < big - 4096; i++) dirty += b[i] != 0;
    CHECKF(dirty == 0, "%d bytes of a reused block not zeroed", dirty);
    be->ops->free(be, b);
    unsigned char *r = di_alloc_raw(be, big); /* raw: whatever is there, but writable */
    CHECK(r != NULL);
    if (r) memset(r, 1, big), be->ops->free(be, r);
    enum { MANY = 300 };
    void **p = malloc(sizeof(void *) * MANY);
    for (int i = 0; i < MANY; i++) p[i] = be->ops->alloc(be, ((size_t)1 << 20) + (size_t)i * 64);
    int missing = 0;
    for (int i = 0; i < MANY; i++) missing += p[i] == NULL;
    CHECK(missing == 0);
    for (int i = 0; i < MANY; i++) be->ops->free(be, p[i]);
    free(p);
    void *m = malloc(big); /* not the backend's: freed as it is */
    be->ops->free(be, m);
    di_backend_destroy(be);
}

int main(void) {
    /* the CPU kernels' kept scratch filled with NaN before every use: a read
     * of a part a call did not write shows as NaN, not as a previous call's
     * values */
    di_cpu_kernels_poison_buffers(1);
    RUN(test_block_reuse);
    RUN(test_hc_mix);
    RUN(test_kvq_unpack);
    RUN(test_hc_streams);
    RUN(test_matmul_grouped);
    RUN(test_matmul_grouped_units);
    RUN(test_matmul_pair);
    RUN(test_attention);
    RUN(test_norm_rope);
    RUN(test_sum_squares);
    RUN(test_qdq_fp4);
    RUN(test_round_bf16);
    RUN(test_add);
    RUN(test_rows);
    RUN(test_engram_gate);
    RUN(test_index);
    RUN(test_panel_kernel);
    RUN(test_panel_decode_scales);
    RUN(test_dots_kernel);
    return test_summary();
}
