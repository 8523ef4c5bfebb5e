/* CPU kernels (src/backend/cpu/kernels.h; architecture.md §2, §8.3): the
 * scalar path against double-precision references built from the exact
 * conversions of core/dtype.h, the AVX2 path bit for bit against the scalar
 * one (kernels.h documents why the two orders give identical bits), and the
 * batch-invariance properties the engine relies on. Plus the thread pool. */
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "test.h"
#include "backend/cpu/kernels.h"
#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/threadpool.h"

/* ---- deterministic inputs ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rnd_unit(void) { return (float)((rnd() & 0xffffff) / 16777216.0) * 2.0f - 1.0f; }

/* Activations whose 32-blocks have very different magnitudes, with zeros. */
static void fill_act(float *x, int64_t n) {
    for (int64_t b = 0; b < n; b += 32) {
        float mag = ldexpf(1.0f, (int)(rnd() % 30) - 15);
        for (int i = 0; i < 32 && b + i < n; i++)
            x[b + i] = (rnd() % 16 == 0) ? 0.0f : di_round_bf16(rnd_unit() * mag);
    }
}
static uint8_t rnd_e4m3(void) {
    uint8_t b;
    do b = (uint8_t)rnd(); while ((b & 0x7f) == 0x7f);
    return b;
}

/* ---- references ---- */

/* The block scale by a route independent of the kernels' bit tricks. */
static float ref_scale(const float *x) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    amax = fmaxf(amax, 1e-4f);
    float t = amax * (float)(1.0 / 448.0);
    int e;
    float m = frexpf(t, &e); /* t = m·2^e, m in [0.5, 1) */
    return ldexpf(1.0f, m == 0.5f ? e - 1 : e);
}

/* Σ_kb (Σ_k qa·qw)·sa·sw in double (exact block sums), and Σ |terms| for the
 * error bound. fp4 selects the MXFP4 weight layout. */
static void ref_block_gemm(int fp4, const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                           const uint8_t *w, const uint8_t *ws, int64_t N, double *ref,
                           double *mag) {
    int64_t KB = K / 32;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0, abs_acc = 0;
            for (int64_t kb = 0; kb < KB; kb++) {
                double blk = 0, abs_blk = 0;
                for (int i = 0; i < 32; i++) {
                    int64_t k = kb * 32 + i;
                    double a = di_e4m3_to_f32(qa[m * K + k]);
                    double v = fp4 ? di_e2m1_to_f32((uint8_t)(w[n * (K / 2) + k / 2] >> (4 * (k & 1))))
                                   : di_e4m3_to_f32(w[n * K + k]);
                    blk += a * v;
                    abs_blk += fabs(a * v);
                }
                double s = (double)sa[m * KB + kb] *
                           di_e8m0_to_f32(fp4 ? ws[n * KB + kb] : ws[(n / 32) * KB + kb]);
                acc += blk * s;
                abs_acc += abs_blk * s;
            }
            ref[m * N + n] = acc;
            mag[m * N + n] = abs_acc;
        }
}

/* Max over elements of |got - ref| / (bound_terms · 2^-24 · mag): ≤ 1 passes.
 * A sequential fp32 sum of terms t_i has |error| ≤ (depth)·u·Σ|t_i|(1+O(u)),
 * the depth being the number of roundings a term goes through. */
static double err_ratio(const float *got, const double *ref, const double *mag, int64_t n,
                        double depth) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double bound = depth * 0x1p-24 * mag[i] * 1.001 + 1e-300;
        double r = fabs((double)got[i] - ref[i]) / bound;
        if (!(r <= worst)) worst = r; /* NaN counts as worst */
    }
    return worst;
}

/* ---- act quant ---- */

static void check_act_quant_path(int avx2) {
    enum { M = 3, K = 32 * 9 };
    float x[M * K];
    fill_act(x, M * K);
    /* Special blocks: all zeros (amax floor), tiny values below the floor,
     * huge values, negative zero, exact powers of two at the 448 boundary. */
    for (int i = 0; i < 32; i++) x[i] = 0.0f;
    for (int i = 0; i < 32; i++) x[32 + i] = (i & 1 ? -1 : 1) * 3e-6f * (float)i;
    for (int i = 0; i < 32; i++) x[64 + i] = (i & 1 ? -3e38f : 1.5e38f) / (float)(i + 1);
    for (int i = 0; i < 32; i++) x[96 + i] = (i % 3 == 0) ? -0.0f : 0.25f * (float)(i % 5);
    for (int i = 0; i < 32; i++) x[128 + i] = (i == 7) ? -448.0f : 1.0f / (float)(i + 1);
    for (int i = 0; i < 32; i++) x[160 + i] = (i == 0) ? 896.0f * 1.0000001f : 0.001f * (float)i;
    uint8_t q[M * K];
    float s[M * K / 32];
    if (avx2) {
#ifdef DI_HAVE_AVX2_KERNELS
        di_act_quant_fp8_avx2(x, M, K, q, s);
#endif
    } else {
        di_act_quant_fp8_scalar(x, M, K, q, s);
    }
    int bad_s = 0, bad_q = 0;
    for (int b = 0; b < M * K / 32; b++) {
        float rs = ref_scale(x + b * 32);
        if (di_f32_bits(rs) != di_f32_bits(s[b])) bad_s++;
        for (int i = 0; i < 32; i++) {
            float v = fminf(fmaxf(x[b * 32 + i] / rs, -448.0f), 448.0f);
            if (q[b * 32 + i] != di_f32_to_e4m3(v)) bad_q++;
        }
    }
    CHECKF(bad_s == 0, "%d scales differ (avx2=%d)", bad_s, avx2);
    CHECKF(bad_q == 0, "%d codes differ (avx2=%d)", bad_q, avx2);
    /* fixed points of the rule, independent of the reference above */
    CHECK(s[0] == 0x1p-22f);                    /* 1e-4/448 = 2.2e-7 -> 2^-22 */
    CHECK(s[4] == 1.0f);                         /* amax 448 -> exactly 1 */
    CHECK(q[128 + 7] == 0xfe);                   /* -448 */
    CHECK(s[5] == 4.0f);                         /* just above 896 -> 4 */
    CHECK(q[96] == 0x80 && q[99] == 0x80);       /* -0 keeps its sign */
    CHECK(q[97] == di_f32_to_e4m3(0.25f / s[3]));
    for (int i = 0; i < 32; i++) CHECK(q[i] == 0);

    /* QDQ = dequantized codes, also in place */
    float y[M * K], y2[M * K];
    memcpy(y2, x, sizeof x);
    if (avx2) {
#ifdef DI_HAVE_AVX2_KERNELS
        di_act_qdq_fp8_avx2(x, M * K, y);
        di_act_qdq_fp8_avx2(y2, M * K, y2);
#endif
    } else {
        di_act_qdq_fp8_scalar(x, M * K, y);
        di_act_qdq_fp8_scalar(y2, M * K, y2);
    }
    int bad_y = 0;
    for (int i = 0; i < M * K; i++) {
        float want = di_e4m3_to_f32(q[i]) * s[i / 32];
        if (di_f32_bits(want) != di_f32_bits(y[i]) || di_f32_bits(want) != di_f32_bits(y2[i])) bad_y++;
    }
    CHECKF(bad_y == 0, "%d QDQ values differ (avx2=%d)", bad_y, avx2);
}

static void test_act_quant_scalar(void) { check_act_quant_path(0); }
static void test_act_quant_avx2(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
    check_act_quant_path(1);
}

/* ---- GEMMs ---- */

enum { FMT_FP8, FMT_FP4, FMT_BF16, FMT_F32 };
static const char *fmt_name[] = {"fp8", "mxfp4", "bf16", "f32"};

typedef struct problem {
    int fmt;
    int64_t M, K, N;
    float *x;      /* [M,K] activations */
    uint8_t *qa;   /* [M,K] */
    float *sa;     /* [M,K/32] */
    void *w;       /* weights */
    uint8_t *ws;   /* scales */
} problem;

static void problem_init(problem *p, int fmt, int64_t M, int64_t K, int64_t N) {
    p->fmt = fmt;
    p->M = M, p->K = K, p->N = N;
    p->x = malloc(sizeof(float) * M * K);
    fill_act(p->x, M * K);
    p->qa = NULL, p->sa = NULL, p->ws = NULL;
    if (fmt == FMT_FP8 || fmt == FMT_FP4) {
        p->qa = malloc(M * K);
        p->sa = malloc(sizeof(float) * M * (K / 32));
        di_act_quant_fp8_scalar(p->x, M, K, p->qa, p->sa);
    }
    if (fmt == FMT_FP8) {
        uint8_t *w = malloc(N * K);
        for (int64_t i = 0; i < N * K; i++) w[i] = rnd_e4m3();
        int64_t nb = (N + 31) / 32;
        p->ws = malloc(nb * (K / 32));
        for (int64_t i = 0; i < nb * (K / 32); i++) p->ws[i] = (uint8_t)(112 + rnd() % 20);
        p->w = w;
    } else if (fmt == FMT_FP4) {
        uint8_t *w = malloc(N * K / 2);
        for (int64_t i = 0; i < N * K / 2; i++) w[i] = (uint8_t)rnd();
        p->ws = malloc(N * (K / 32));
        for (int64_t i = 0; i < N * (K / 32); i++) p->ws[i] = (uint8_t)(115 + rnd() % 20);
        p->w = w;
    } else if (fmt == FMT_BF16) {
        uint16_t *w = malloc(sizeof(uint16_t) * N * K);
        for (int64_t i = 0; i < N * K; i++) w[i] = di_f32_to_bf16(rnd_unit() * 0.05f);
        p->w = w;
    } else {
        float *w = malloc(sizeof(float) * N * K);
        for (int64_t i = 0; i < N * K; i++) w[i] = rnd_unit() * 0.05f;
        p->w = w;
    }
}

static void problem_free(problem *p) {
    free(p->x), free(p->qa), free(p->sa), free(p->w), free(p->ws);
}

/* Runs rows [m0, m0+M) of p on the chosen path. */
static void run_gemm(const problem *p, int avx2, int64_t m0, int64_t M, float *out,
                     di_threadpool *tp) {
    int64_t K = p->K;
    const float *x = p->x + m0 * K;
    const uint8_t *qa = p->qa ? p->qa + m0 * K : NULL;
    const float *sa = p->sa ? p->sa + m0 * (K / 32) : NULL;
#ifdef DI_HAVE_AVX2_KERNELS
    if (avx2) {
        switch (p->fmt) {
        case FMT_FP8: di_gemm_fp8_avx2(qa, sa, M, K, p->w, p->ws, p->N, out, tp); break;
        case FMT_FP4: di_gemm_mxfp4_avx2(qa, sa, M, K, p->w, p->ws, p->N, out, tp); break;
        case FMT_BF16: di_gemm_bf16_avx2(x, M, K, p->w, p->N, out, tp); break;
        default: di_gemm_f32_avx2(x, M, K, p->w, p->N, out, tp); break;
        }
        return;
    }
#endif
    switch (p->fmt) {
    case FMT_FP8: di_gemm_fp8_scalar(qa, sa, M, K, p->w, p->ws, p->N, out, tp); break;
    case FMT_FP4: di_gemm_mxfp4_scalar(qa, sa, M, K, p->w, p->ws, p->N, out, tp); break;
    case FMT_BF16: di_gemm_bf16_scalar(x, M, K, p->w, p->N, out, tp); break;
    default: di_gemm_f32_scalar(x, M, K, p->w, p->N, out, tp); break;
    }
}

/* The scalar result against the double reference, within the rounding bound. */
static void check_against_reference(const problem *p, const float *got) {
    int64_t M = p->M, K = p->K, N = p->N;
    double *ref = malloc(sizeof(double) * M * N), *mag = malloc(sizeof(double) * M * N);
    double depth;
    if (p->fmt == FMT_FP8 || p->fmt == FMT_FP4) {
        ref_block_gemm(p->fmt == FMT_FP4, p->qa, p->sa, M, K, p->w, p->ws, N, ref, mag);
        /* FP8: <= K/8 + 3 additions in a lane, 3 in the tree; MXFP4: two
         * roundings per block of a chain, 1 to join the chains */
        depth = p->fmt == FMT_FP4 ? (double)(K / 32) + 4 : (double)(K / 8) + 6;
    } else {
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double acc = 0, a = 0;
                for (int64_t k = 0; k < K; k++) {
                    double wv = p->fmt == FMT_BF16 ? di_bf16_to_f32(((const uint16_t *)p->w)[n * K + k])
                                                   : ((const float *)p->w)[n * K + k];
                    acc += (double)p->x[m * K + k] * wv;
                    a += fabs((double)p->x[m * K + k] * wv);
                }
                ref[m * N + n] = acc;
                mag[m * N + n] = a;
            }
        depth = (double)K; /* one rounding per fused step */
    }
    double r = err_ratio(got, ref, mag, M * N, depth);
    CHECKF(r <= 1.0, "%s M=%lld K=%lld N=%lld: error %.3g x the rounding bound", fmt_name[p->fmt],
           (long long)M, (long long)K, (long long)N, r);
    free(ref), free(mag);
}

static int count_diff_bits(const float *a, const float *b, int64_t n) {
    int d = 0;
    for (int64_t i = 0; i < n; i++) d += di_f32_bits(a[i]) != di_f32_bits(b[i]);
    return d;
}

/* The same, a NaN on both sides counting as equal (its payload is not part of
 * the contract). */
static int count_diff_bits_nan(const float *a, const float *b, int64_t n) {
    int d = 0;
    for (int64_t i = 0; i < n; i++) d += !(isnan(a[i]) && isnan(b[i])) && di_f32_bits(a[i]) != di_f32_bits(b[i]);
    return d;
}

static const int64_t Ms[] = {1, 3, 7, 33};
static const int64_t Ks[][2] = {{32, 45}, {96, 100}, {256, 17}, {4096, 33}}; /* {K, N} */

/* One shape of one format: the scalar path within the rounding bound, the
 * AVX2 path (where the CPU has it) within it too and on the scalar bits. */
static void check_shape(int fmt, int64_t M, int64_t K, int64_t N) {
    problem p;
    problem_init(&p, fmt, M, K, N);
    float *o_s = malloc(sizeof(float) * M * N), *o_v = malloc(sizeof(float) * M * N);
    run_gemm(&p, 0, 0, M, o_s, NULL);
    check_against_reference(&p, o_s);
    if (di_cpu_has_avx2()) {
        run_gemm(&p, 1, 0, M, o_v, NULL);
        check_against_reference(&p, o_v);
        int d = count_diff_bits(o_s, o_v, M * N);
        CHECKF(d == 0, "%s M=%lld K=%lld N=%lld: %d outputs differ from scalar", fmt_name[fmt], (long long)M,
               (long long)K, (long long)N, d);
    }
    free(o_s), free(o_v);
    problem_free(&p);
}

static void check_format(int fmt) {
    for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++) {
        for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++) {
            int64_t M = Ms[mi], K = Ks[ki][0], N = Ks[ki][1];
            if (K >= 4096 && M > 7) continue; /* keeps the ASan run short */
            check_shape(fmt, M, K, N);
        }
    }
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C: only the scalar %s path checked", fmt_name[fmt]);
}

static void test_gemm_fp8(void) { check_format(FMT_FP8); }
static void test_gemm_mxfp4(void) { check_format(FMT_FP4); }
static void test_gemm_bf16(void) { check_format(FMT_BF16); }
/* BF16 at 1-4 rows on AVX-512 CPUs: whole units of 32 rows, rows past the
 * last unit, K of one and of many steps (the shapes above reach them at 1
 * and 3 rows), and that the units ran */
static void test_gemm_bf16_rows(void) {
    const long before = di_cpu_bf16rows_units();
    static const int64_t shapes[][3] = {{2, 64, 64}, {4, 160, 96}, {2, 5120, 40}, {4, 32, 33}, {1, 512, 256}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) check_shape(FMT_BF16, shapes[i][0], shapes[i][1], shapes[i][2]);
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C: only the scalar path checked");
    if (di_cpu_kernels_wide()) CHECKF(di_cpu_bf16rows_units() > before, "the units never ran");
}
static void test_gemm_f32(void) { check_format(FMT_F32); }

/* FP8 prefill shapes that the general table does not reach, on both prefill
 * forms (dot products below 32 rows, lane by lane from 32): lanes of several
 * runs of the lane-by-lane kernel (K = 4160: 3 runs of 176 and 168 steps;
 * K = 8192: 4 of 256), rows past a pass of activation rows (M = 1040, with
 * a last panel of 2 rows) and weight rows past a column block (N = 600), a
 * single output column, an M just past the decode rows. The AVX2 path must
 * give the scalar bits, and the scalar path stay within the rounding
 * bound. */
static void test_gemm_fp8_prefill_shapes(void) {
    static const int64_t shapes[][3] = {{23, 4160, 37}, {40, 4160, 37}, {1040, 64, 19}, {17, 32, 1},
                                        {30, 8192, 16}, {33, 8192, 16}, {35, 96, 600}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        check_shape(FMT_FP8, shapes[i][0], shapes[i][1], shapes[i][2]);
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C: only the scalar path checked");
}

/* The FP8 prefill lane by lane on one and several threads, in both its
 * forms. The one-pass form runs each unit (a group of panels and a block
 * of rows) from its first step to its tree (lg_fused_units): several runs
 * of the lanes (K = 4160: 3, K = 8192: 4), weight rows past the last whole
 * panel, one and two panels a unit (the 3-thread pool gets two where 300
 * rows give 10 panels or more; past 516 rows one), one block of rows or
 * several (one thread: 1,032 rows in one block, 1,100 in two of 552; on
 * 12 threads few panels split the rows further, 200 and 1,040 rows down to
 * blocks of 96-104), a last block shorter than the others. The passes of
 * decoding and units (forced): several runs and column blocks (200 × 4160
 * × 300, 200 × 1056 × 600), passes of rows (1,040), one row past a row
 * block (97). The AVX2 path must give the scalar bits. */
static void test_gemm_fp8_prefill_threads(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
    static const int64_t shapes[][3] = {{40, 4160, 37}, {35, 96, 300}, {90, 8192, 70}, {96, 1056, 333}, {33, 64, 8},
                                        {200, 4160, 300}, {200, 1056, 600}, {1040, 64, 19}, {97, 96, 45},
                                        {1032, 64, 130}, {1100, 96, 200}};
    /* one thread: the blocks as rows alone choose them (one panel a unit past
     * 516 rows: 1,032 rows in one block, 1,100 in two of 552) */
    static const int sizes[3] = {1, 3, 12};
    di_err err;
    for (int t = 0; t < 3; t++) {
        di_threadpool *tp = NULL;
        if (sizes[t] > 1) CHECK(di_threadpool_create(sizes[t], &tp, &err) == DI_OK);
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
            const int64_t M = shapes[i][0], K = shapes[i][1], N = shapes[i][2];
            problem p;
            problem_init(&p, FMT_FP8, M, K, N);
            float *o_s = malloc(sizeof(float) * M * N), *o_v = malloc(sizeof(float) * M * N);
            run_gemm(&p, 0, 0, M, o_s, NULL);
            for (int passes = 0; passes < 2; passes++) { /* both forms */
                di_cpu_kernels_force_no_lg_fused(passes);
                run_gemm(&p, 1, 0, M, o_v, tp);
                const int d = count_diff_bits(o_s, o_v, M * N);
                CHECKF(d == 0, "M=%lld K=%lld N=%lld on %d threads%s: %d outputs differ from scalar", (long long)M,
                       (long long)K, (long long)N, sizes[t], passes ? " (passes)" : "", d);
            }
            di_cpu_kernels_force_no_lg_fused(0);
            free(o_s), free(o_v);
            problem_free(&p);
        }
        if (tp) di_threadpool_destroy(tp);
    }
}

/* BF16 / FP32 products of few panels and many rows (an indexer's head
 * weights, a compressor's gates at prefill), which split rows as well as
 * panels over the pool: 1-4 panels, a partial last panel, row counts that
 * end inside a block of 6, on 2-4 threads. The AVX2 path must give the
 * scalar bits. */
static void test_gemm_plain_row_split(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
    static const int64_t shapes[][3] = {{200, 96, 16}, {97, 256, 40}, {130, 64, 8}, {50, 320, 33}, {512, 64, 64},
                                        {101, 48, 1}};
    di_err err;
    for (int threads = 2; threads <= 4; threads++) {
        di_threadpool *tp = NULL;
        CHECK(di_threadpool_create(threads, &tp, &err) == DI_OK);
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
            for (int fmt = FMT_BF16; fmt <= FMT_F32; fmt++) {
                const int64_t M = shapes[i][0], K = shapes[i][1], N = shapes[i][2];
                problem p;
                problem_init(&p, fmt, M, K, N);
                float *o_s = malloc(sizeof(float) * M * N), *o_v = malloc(sizeof(float) * M * N);
                run_gemm(&p, 0, 0, M, o_s, NULL);
                run_gemm(&p, 1, 0, M, o_v, tp);
                const int d = count_diff_bits(o_s, o_v, M * N);
                CHECKF(d == 0, "%s M=%lld K=%lld N=%lld on %d threads: %d outputs differ from scalar",
                       fmt == FMT_BF16 ? "bf16" : "f32", (long long)M, (long long)K, (long long)N, threads, d);
                free(o_s), free(o_v);
                problem_free(&p);
            }
        di_threadpool_destroy(tp);
    }
}

/* MXFP4 prefill shapes (batches past the integer kernels' 128 rows, or 24
 * on 512-bit vectors without VNNI: 40 and 97 rows take the integer kernels
 * elsewhere; with VNNI and no AMX the batches past 128 rows go to them in
 * pieces of at most 64 rows, 129 as three of 43, and of fewer where a
 * core's L2 holds less than 4·64·K bytes: at K 16,384 on a 2 MB L2 at
 * most 32, 130 rows as five of 26):
 * weight rows past the last whole panel (N = 37, 45, 300: neither 16 nor 32
 * divides them), K with a last half 64-code chunk (96, 4160) and of several
 * k-chunks, a last row block of 1-5 rows. The AVX2 path must give the
 * scalar bits. */
static void test_gemm_mxfp4_prefill_shapes(void) {
    static const int64_t shapes[][3] = {{129, 96, 45}, {131, 4160, 37}, {200, 64, 300}, {134, 2112, 33},
                                        {40, 96, 45},  {97, 4160, 37},  {130, 16384, 9}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        check_shape(FMT_FP4, shapes[i][0], shapes[i][1], shapes[i][2]);
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C: only the scalar path checked");
}

/* Scales far outside what checkpoints hold (weight scales over the whole E8M0
 * range, activations from 1e-30 to 1e30) and NaN activation codes: decode
 * rows and prefill-sized batches must still give the scalar bits (the kernels
 * fall back from their shortcuts), NaN where the scalar path has NaN. */
static void test_gemm_extreme_scales(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
    static const int Mv[] = {1, 40, 130}; /* MXFP4 above 128 rows: the prefill tiles or pieces */
    for (int fmt = FMT_FP8; fmt <= FMT_FP4; fmt++) {
        for (size_t mi = 0; mi < sizeof Mv / sizeof *Mv; mi++) {
            const int M = Mv[mi];
            problem p;
            problem_init(&p, fmt, M, 96, 40);
            for (int64_t i = 0; i < M * 96; i++)
                p.x[i] *= (i / 32) % 3 == 0 ? 1e30f : ((i / 32) % 3 == 1 ? 1e-30f : 1.0f);
            di_act_quant_fp8_scalar(p.x, M, 96, p.qa, p.sa);
            int64_t nws = fmt == FMT_FP8 ? 2 * 3 : 40 * 3;
            for (int64_t i = 0; i < nws; i++) p.ws[i] = (uint8_t)(rnd() % 255);
            /* NaN activation codes (not produced by the quantizer) in the last row */
            p.qa[(M - 1) * 96 + 90] = 0x7f, p.qa[(M - 1) * 96 + 70] = 0xff;
            float *a = malloc(sizeof(float) * M * 40), *b = malloc(sizeof(float) * M * 40);
            run_gemm(&p, 0, 0, M, a, NULL);
            run_gemm(&p, 1, 0, M, b, NULL);
            const int d = count_diff_bits_nan(a, b, M * 40);
            CHECKF(d == 0, "%s M=%d: %d outputs differ from scalar", fmt_name[fmt], M, d);
            free(a), free(b);
            problem_free(&p);
        }
    }
}

/* Decode-sized batches (FP8: M <= 16 take their own AVX2 path, in blocks of
 * activation rows times groups of 8, 4 or 2 weight rows, M = 17 the prefill
 * tiles; MXFP4: groups of 4 weight rows for 1, 2 or a sweep of up to 16
 * activation rows): K with MXFP4 rows ending on half a 32-byte chunk (K % 64 = 32),
 * output counts around the weight-row groups and the 32-row FP8 scale tiles,
 * E4M3 weights that are all subnormal or zero (the lanes hold them as fp32
 * subnormals) and both signs of zero, on one thread and on two. Bits against
 * the scalar path, which is itself checked against the double reference. */
static void test_gemm_decode_rows(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
    static const int64_t shapes[][2] = {{32, 1}, {96, 9}, {160, 40}, {224, 7}, {288, 69}, {512, 8}};
    static const int64_t batch[] = {1, 2, 3, 4, 5, 6, 8, 9, 13, 16, 17};
    di_threadpool *tp = NULL;
    di_err err;
    CHECK(di_threadpool_create(2, &tp, &err) == DI_OK);
    for (int fmt = FMT_FP8; fmt <= FMT_FP4; fmt++)
        for (int sub = 0; sub < (fmt == FMT_FP8 ? 2 : 1); sub++)
            for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
                for (size_t bi = 0; bi < sizeof batch / sizeof *batch; bi++) {
                    const int64_t M = batch[bi], K = shapes[si][0], N = shapes[si][1];
                    problem p;
                    problem_init(&p, fmt, M, K, N);
                    uint8_t *w = p.w;
                    if (fmt == FMT_FP8 && sub)
                        for (int64_t i = 0; i < N * K; i++) w[i] &= 0x87; /* exponent 0 */
                    if (fmt == FMT_FP8) w[0] = 0x80, w[N * K - 1] = 0x00; /* -0, +0 */
                    float *o_s = malloc(sizeof(float) * M * N), *o_v = malloc(sizeof(float) * M * N);
                    run_gemm(&p, 0, 0, M, o_s, NULL);
                    check_against_reference(&p, o_s);
                    for (int t = 0; t < 2; t++) {
                        run_gemm(&p, 1, 0, M, o_v, t ? tp : NULL);
                        int d = count_diff_bits(o_s, o_v, M * N);
                        CHECKF(d == 0, "%s%s M=%lld K=%lld N=%lld threads=%d: %d outputs differ from scalar",
                               fmt_name[fmt], sub ? " subnormal" : "", (long long)M, (long long)K,
                               (long long)N, t + 1, d);
                    }
                    free(o_s), free(o_v);
                    problem_free(&p);
                }
    di_threadpool_destroy(tp);
}

/* p on the vector path, on one thread and on tp's two, against the scalar
 * bits: how many outputs differ (the larger count of the two). */
static int vector_vs_scalar(const problem *p, di_threadpool *tp) {
    const int64_t n = p->M * p->N;
    float *o_s = malloc(sizeof(float) * n), *o_v = malloc(sizeof(float) * n);
    run_gemm(p, 0, 0, p->M, o_s, NULL);
    int worst = 0;
    for (int t = 0; t < 2; t++) {
        run_gemm(p, 1, 0, p->M, o_v, t ? tp : NULL);
        const int d = count_diff_bits(o_s, o_v, n);
        if (d > worst) worst = d;
    }
    free(o_s), free(o_v);
    return worst;
}

/* The span checks of one route: each shape (K, N) at one and two
 * activation rows, as drawn and with a NaN weight scale at byte bad of the
 * scales (inside the first span), against the scalar bits. FP8 scales are
 * drawn from 2^-15 .. 2^-7, which every tile can fold (fill_act's blocks
 * reach 2^14; dec_fold_scales). */
static void check_spans(int fmt, const int64_t (*shapes)[2], int nshapes, int64_t (*bad)(int64_t K),
                        di_threadpool *tp, const char *route) {
    for (int si = 0; si < nshapes; si++)
        for (int64_t M = 1; M <= 2; M++)
            for (int nan = 0; nan < 2; nan++) {
                const int64_t K = shapes[si][0], N = shapes[si][1];
                problem p;
                problem_init(&p, fmt, M, K, N);
                if (fmt == FMT_FP8)
                    for (int64_t i = 0; i < (N + 31) / 32 * (K / 32); i++) p.ws[i] = (uint8_t)(112 + rnd() % 9);
                if (nan) p.ws[bad(K)] = 0xff;
                const int d = vector_vs_scalar(&p, tp);
                CHECKF(d == 0, "%s %s M=%lld K=%lld N=%lld NaN scale %d: %d outputs differ from scalar",
                       fmt_name[fmt], route, (long long)M, (long long)K, (long long)N, nan, d);
                problem_free(&p);
            }
}
static int64_t fp8_bad_scale(int64_t K) { return 1 * (K / 32) + 3; } /* tile 1, block 3 */
static int64_t fp4_bad_scale(int64_t K) { return 40 * (K / 32) + 2; } /* row 40, block 2 */

/* FP8 decode rows of long rows without the prefetches (dec_units): at one
 * activation row spans of 4 scale tiles, whose pairs of rows read their
 * own tile's folded activations, spans of 2 and 1 where the range (or the
 * pool's chunk) ends sooner, then a partial tile, on one and two threads; a
 * tile whose scales cannot be folded (a NaN scale) inside a span sends the
 * span's tiles one by one. Two activation rows: rows spread within each
 * tile. Each route; the weight scales differ tile by tile. */
static void test_gemm_decode_spans(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
#ifdef DI_HAVE_AVX2_KERNELS
    di_threadpool *tp = NULL;
    di_err err;
    CHECK(di_threadpool_create(2, &tp, &err) == DI_OK);
    di_cpu_kernels_force_dec_prefetch(-1);
    static const int64_t shapes[][2] = {{1024, 32 * 7 + 17}, {2048, 32 * 4}, {1056, 32 * 6}};
    static const char *route_name[5] = {"default", "F16C", "shifts", "256-bit F16C", "256-bit shifts"};
    /* one thread: spans of 4, 2 and 1 tiles through the range */
    check_spans(FMT_FP8, shapes, 3, fp8_bad_scale, NULL, "default, one thread");
    /* the routes: as chosen, F16C instead of the exponent bias, the shifts
     * of AMD cores, and the 256-bit kernels (CPUs without AVX-512) of
     * either decoding; each must take spans, short ones included (on a CPU
     * without AVX-512 the first three are the 256-bit F16C route again) */
    for (int route = 0; route < 5; route++) {
        const long s0 = di_cpu_kernels_span_units(), h0 = di_cpu_kernels_short_span_units();
        di_cpu_kernels_force_no_bias(route == 1);
        di_cpu_kernels_force_fp8_half(route == 1 || route == 3 ? 1 : route == 2 || route == 4 ? -1 : 0);
        di_cpu_kernels_force_no_avx512(route >= 3);
        check_spans(FMT_FP8, shapes, 3, fp8_bad_scale, tp, route_name[route]);
        CHECKF(di_cpu_kernels_span_units() > s0, "%s: units in spans: %ld", route_name[route],
               di_cpu_kernels_span_units() - s0);
        CHECKF(di_cpu_kernels_short_span_units() > h0, "%s: units in spans of 2 or 1 tiles: %ld", route_name[route],
               di_cpu_kernels_short_span_units() - h0);
    }
    di_cpu_kernels_force_no_bias(0);
    di_cpu_kernels_force_fp8_half(0);
    di_cpu_kernels_force_no_avx512(0);
    di_cpu_kernels_force_dec_prefetch(0);
    di_threadpool_destroy(tp);
#endif
}

/* MXFP4 decode rows of one and two activation rows in spans of 8 units
 * (dec4_units: on 512-bit vectors each register slot streams 32
 * consecutive rows, on 256-bit ones 64; one activation row in the byte
 * form: 4 slots of 64 rows a line at a time): two spans, then spans of
 * 4, 2 and 1 units where the range (or the pool's chunk) ends sooner, and
 * a partial unit, on one and two threads; a NaN scale in a span's rows
 * sends its units one by one; K with an odd chunk count and with a half
 * last chunk. The VNNI byte form with and without vpermb, the 16-bit VNNI
 * sums, the plain sums, and the 256-bit kernels with and without
 * AVX-VNNI's byte sums. */
static void test_gemm_mxfp4_decode_spans(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
#ifdef DI_HAVE_AVX2_KERNELS
    di_threadpool *tp = NULL;
    di_err err;
    CHECK(di_threadpool_create(2, &tp, &err) == DI_OK);
    /* K 1,024: whole steps of two chunks; 1,088: an odd chunk count (the
     * last line half read); 2,336: a half chunk last (16 bytes of the
     * last line) and a partial group of E8M0 bytes */
    static const int64_t shapes[][2] = {{1024, 256 * 2 + 32 * 3 + 17}, {1088, 256 + 64 + 5}, {2336, 256 + 40}};
    static const char *form_name[6] = {"VNNI bytes",  "VNNI bytes, no vpermb", "VNNI 16-bit",
                                       "plain sums",  "256-bit (AVX-VNNI bytes where the CPU has them)",
                                       "256-bit 16-bit sums"};
    const long l0 = di_cpu_kernels_mxfp4_line_units();
    /* one thread: spans of 8, 4, 2 and 1 units through the range */
    check_spans(FMT_FP4, shapes, 3, fp4_bad_scale, NULL, "VNNI bytes, one thread");
    /* each form must take spans, short ones included (the 256-bit ones are
     * what CPUs without AVX-512 run; on such a CPU every form is one) */
    for (int form = 0; form < 6; form++) {
        const long s0 = di_cpu_kernels_mxfp4_span_units(), h0 = di_cpu_kernels_mxfp4_short_span_units();
        const long b0 = di_cpu_kernels_avx_vnni_byte_calls();
        di_cpu_kernels_force_no_vbmi(form == 1);
        di_cpu_kernels_force_no_vnni_bytes(form >= 2 && form != 4);
        di_cpu_kernels_force_no_vnni(form == 3);
        di_cpu_kernels_force_no_avx512(form >= 4);
        check_spans(FMT_FP4, shapes, 3, fp4_bad_scale, tp, form_name[form]);
        CHECKF(di_cpu_kernels_mxfp4_span_units() > s0, "%s: units in spans: %ld", form_name[form],
               di_cpu_kernels_mxfp4_span_units() - s0);
        CHECKF(di_cpu_kernels_mxfp4_short_span_units() > h0, "%s: units in spans of 4 or fewer: %ld",
               form_name[form], di_cpu_kernels_mxfp4_short_span_units() - h0);
        if (form == 4 && di_cpu_kernels_avx_vnni()) /* the gate: DI_CPU_AVX_VNNI=0 turns it off */
            CHECKF(di_cpu_kernels_avx_vnni_byte_calls() > b0, "%s: calls in the AVX-VNNI byte form: %ld",
                   form_name[form], di_cpu_kernels_avx_vnni_byte_calls() - b0);
        if (form == 5)
            CHECKF(di_cpu_kernels_avx_vnni_byte_calls() == b0, "%s: %ld calls in the AVX-VNNI byte form",
                   form_name[form], di_cpu_kernels_avx_vnni_byte_calls() - b0);
    }
    di_cpu_kernels_force_no_vbmi(0);
    di_cpu_kernels_force_no_vnni_bytes(0);
    di_cpu_kernels_force_no_vnni(0);
    di_cpu_kernels_force_no_avx512(0);
    if (di_cpu_kernels_vnni())
        CHECKF(di_cpu_kernels_mxfp4_line_units() > l0, "units in spans of lines: %ld",
               di_cpu_kernels_mxfp4_line_units() - l0);
    di_threadpool_destroy(tp);
#endif
}

/* Every E8M0 weight scale, 0 (2^-127, subnormal) and 255 (NaN) included, on
 * enough blocks (K/32 >= 32) that decode rows convert them as vectors. */
static void test_gemm_decode_all_scales(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
    enum { K = 32 * 45, N = 200 }; /* >= 256 scales in either layout */
    for (int fmt = FMT_FP8; fmt <= FMT_FP4; fmt++)
        for (int64_t M = 1; M <= 2; M++) {
            problem p;
            problem_init(&p, fmt, M, K, N);
            int64_t nws = fmt == FMT_FP8 ? ((N + 31) / 32) * (K / 32) : N * (K / 32);
            for (int64_t i = 0; i < nws; i++) p.ws[i] = (uint8_t)(i % 256);
            /* rows 192.. (their own FP8 tile) scaled by 2^-127 alone: visible in the sums */
            int64_t zrow = fmt == FMT_FP8 ? 6 : 192;
            for (int64_t kb = 0; kb < K / 32; kb++) p.ws[zrow * (K / 32) + kb] = 0;
            float *a = malloc(sizeof(float) * M * N), *b = malloc(sizeof(float) * M * N);
            run_gemm(&p, 0, 0, M, a, NULL);
            run_gemm(&p, 1, 0, M, b, NULL);
            const int d = count_diff_bits_nan(a, b, M * N);
            int nans = 0;
            for (int64_t i = 0; i < M * N; i++) nans += isnan(a[i]) != 0;
            CHECKF(d == 0, "%s M=%lld: %d outputs differ from scalar", fmt_name[fmt], (long long)M, d);
            CHECKF(a[192] != 0.0f, "%s M=%lld: the 2^-127 row is zero", fmt_name[fmt], (long long)M);
            /* the rows with a 255 scale are NaN, the others not: both exercised */
            CHECKF(nans > 0 && nans < M * N, "%s M=%lld: %d of %lld outputs NaN", fmt_name[fmt],
                   (long long)M, nans, (long long)(M * N));
            free(a), free(b);
            problem_free(&p);
        }
}

/* The FP8 decode rows fold a tile's weight scales into the activations only
 * where every block of it allows (sw in 2^-117 .. 2^7, |a|·sw < 2^7), the
 * blocks checked eight at a time and the rest one by one. One tile has
 * every scale 2^0 but one at an edge (E8M0 9, 10, 134, 135, 255, 0) in a
 * block of the vectors or of the rest, the activations zero but in that
 * block, ~4 or ~1/4 there: a block let through that should not be (135:
 * sw·2^120 overflows; 134 with ~4: |a|·sw past 2^7, the folded activations
 * overflow; 0: 2^-127 read as zero, the only terms of the sums) gives bits
 * other than the scalar code's; the other tile is ordinary. */
static void test_gemm_fp8_fold_edges(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
    enum { K = 32 * 20, N = 64, KB = K / 32 };
    static const int edge[] = {9, 10, 134, 135, 255, 0};
    static const int at[] = {3, 7, 17}; /* inside the first vector, its last lane, the rest */
    static const int64_t Mv[] = {1, 2, 5}; /* 5: the segmented form */
    for (size_t mi = 0; mi < sizeof Mv / sizeof *Mv; mi++)
        for (size_t e = 0; e < sizeof edge / sizeof *edge; e++)
            for (size_t ai = 0; ai < sizeof at / sizeof *at; ai++)
                for (int big = 0; big <= 1; big++) {
                    const int64_t M = Mv[mi];
                    problem p;
                    problem_init(&p, FMT_FP8, M, K, N);
                    for (int64_t m = 0; m < M; m++)
                        for (int64_t i = 0; i < K; i++)
                            p.x[m * K + i] = i / 32 != at[ai] ? 0.0f
                                                              : (i % 5 == 1 ? 4.0f : -3.0f) * (big ? 1.0f : 0.0625f);
                    di_act_quant_fp8_scalar(p.x, M, K, p.qa, p.sa);
                    for (int64_t i = 0; i < 2 * KB; i++) p.ws[i] = 127;
                    p.ws[at[ai]] = (uint8_t)edge[e];
                    float *a = malloc(sizeof(float) * M * N), *b = malloc(sizeof(float) * M * N);
                    run_gemm(&p, 0, 0, M, a, NULL);
                    run_gemm(&p, 1, 0, M, b, NULL);
                    const int d = count_diff_bits_nan(a, b, M * N);
                    CHECKF(d == 0, "M=%lld scale %d at block %d, activations ~%s: %d outputs differ from scalar",
                           (long long)M, edge[e], at[ai], big ? "4" : "1/4", d);
                    free(a), free(b);
                    problem_free(&p);
                }
}

/* FP8 decode rows with the activation and weight scales' product near the
 * bottom of the fp32 range: the F16C route folds sw·2^8 into the
 * activations, which must stay normal numbers (a·sw·2^8 >= 2^-126, guarded
 * by sa·sw >= 2^-124), or the folded activations lose bits the scalar
 * products keep. Every block of a row at one product of scales 2^-x (sw =
 * 2^-40), x from 100 to 153: past x = 149 the folded smallest codes would
 * round on the subnormal grid while the outputs (~2^(17-x)) still show it. Both
 * routes run it (test_half_route). */
static void test_gemm_fp8_tiny_scales(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
    enum { K = 32 * 8, N = 64, KB = K / 32 };
    static const int xs[] = {100, 124, 125, 140, 148, 150, 151, 152, 153};
    for (size_t xi = 0; xi < sizeof xs / sizeof *xs; xi++)
        for (int64_t M = 1; M <= 5; M += 2) {
            problem p;
            problem_init(&p, FMT_FP8, M, K, N);
            for (int64_t i = 0; i < M * KB; i++) p.sa[i] = ldexpf(1.0f, 40 - xs[xi]);
            /* every other code one of the smallest (+-2^-9 .. 2^-6 + 7·2^-9): their
             * folded values are the first to leave the grid */
            for (int64_t i = 1; i < M * K; i += 2) p.qa[i] = (uint8_t)(1 + (i / 2) % 15) | (i & 4 ? 0x80 : 0);
            for (int64_t i = 0; i < (N / 32) * KB; i++) p.ws[i] = 127 - 40;
            float *a = malloc(sizeof(float) * M * N), *b = malloc(sizeof(float) * M * N);
            run_gemm(&p, 0, 0, M, a, NULL);
            run_gemm(&p, 1, 0, M, b, NULL);
            int d = count_diff_bits(a, b, M * N), zeros = 0;
            for (int64_t i = 0; i < M * N; i++) zeros += a[i] == 0.0f;
            CHECKF(d == 0, "2^-%d M=%lld: %d outputs differ from scalar", xs[xi], (long long)M, d);
            CHECKF(zeros < M * N / 4, "2^-%d M=%lld: %d of %lld outputs zero", xs[xi], (long long)M,
                   zeros, (long long)(M * N));
            free(a), free(b);
            problem_free(&p);
        }
}

/* kernels.h's MXFP4 order rests on one fact: the 32 products of a block,
 * split at |qa| = 2^-3, sum exactly in fp32 in any order (which is what
 * lets the decode rows sum them as integers and prefill in any order).
 * Checked on the extremes: blocks drawn from the largest products (448·6,
 * of both signs) and those on the finest grid of the part (9·2^-6 · 1/2,
 * 2^-9 · 1/2), and on random blocks, against double sums, forwards and
 * backwards. */
static void test_mxfp4_group_sums_exact(void) {
    const float *e4m3 = di_cpu_e4m3_table();
    int groups = 0, inexact = 0;
    for (int part = 0; part < 2; part++)
        for (int trial = 0; trial < 20000; trial++) {
            float t[32];
            for (int i = 0; i < 32; i++) {
                float a;
                uint8_t code;
                do a = e4m3[rnd() % 256]; while (isnan(a) || (part ? fabsf(a) >= 0.125f : fabsf(a) < 0.125f));
                code = (uint8_t)(rnd() % 16);
                if (trial < 4000) { /* extremes: the largest, or the finest grid with 1/2 */
                    const int fine = rnd() % 4 == 0;
                    a = (rnd() % 2 ? 1.0f : -1.0f) * (fine ? (part ? 0x1p-9f : 0.140625f) : (part ? 0.1171875f : 448.0f));
                    code = fine ? 1 : (trial < 2000 ? 7 : (uint8_t)(rnd() % 2 ? 7 : 15));
                }
                t[i] = a * di_e2m1_to_f32(code);
            }
            double d = 0;
            float f = 0.0f, b = 0.0f;
            for (int i = 0; i < 32; i++) d += t[i], f += t[i], b += t[31 - i];
            inexact += (double)f != d || (double)b != d;
            groups++;
        }
    CHECKF(inexact == 0, "%d of %d block sums not exact in fp32", inexact, groups);
}

/* Activations whose blocks hold codes below 2^-3 (one large value per block
 * sets the scale; the rest about 2^-10 .. 2^-13 of it): the second block sum
 * of kernels.h carries them, in decode rows (its own integer pass) and
 * prefill (its own fp32 pass). Scalar within the bound, every path the scalar bits,
 * and the small codes visibly count (dropping them changes most outputs). */
static void test_gemm_mxfp4_small_codes(void) {
    static const int64_t Mv[] = {1, 2, 3, 5, 16, 17, 40, 130};
    for (size_t mi = 0; mi < sizeof Mv / sizeof *Mv; mi++) {
        const int64_t M = Mv[mi], K = 544, N = 37, KB = K / 32;
        problem p;
        problem_init(&p, FMT_FP4, M, K, N);
        for (int64_t i = 0; i < M * K; i++)
            p.x[i] = i % 32 == 5 ? 3.0f : di_round_bf16(rnd_unit() * (i % 3 ? 0x1p-9f : 0x1p-11f));
        di_act_quant_fp8_scalar(p.x, M, K, p.qa, p.sa);
        const float *e4m3 = di_cpu_e4m3_table();
        int small = 0;
        for (int64_t i = 0; i < M * K; i++) small += e4m3[p.qa[i]] != 0.0f && fabsf(e4m3[p.qa[i]]) < 0.125f;
        CHECKF(small > M * K / 2, "M=%lld: %d small codes", (long long)M, small);
        float *a = malloc(sizeof(float) * M * N), *b = malloc(sizeof(float) * M * N);
        run_gemm(&p, 0, 0, M, a, NULL);
        check_against_reference(&p, a);
        if (di_cpu_has_avx2()) {
            run_gemm(&p, 1, 0, M, b, NULL);
            CHECKF(count_diff_bits(a, b, M * N) == 0, "M=%lld: %d outputs differ from scalar",
                   (long long)M, count_diff_bits(a, b, M * N));
            /* every row alone (the decode rows) against the batch (above 128 rows: prefill tiles) */
            int rows = 0;
            for (int64_t m = 0; m < M; m += M > 40 ? 7 : 1) {
                run_gemm(&p, 1, m, 1, b, NULL);
                rows += count_diff_bits(a + m * N, b, N) != 0;
            }
            CHECKF(rows == 0, "M=%lld: %d rows alone differ from the batch", (long long)M, rows);
        }
        /* the same without the small codes */
        for (int64_t i = 0; i < M * K; i++)
            if (fabsf(e4m3[p.qa[i]]) < 0.125f) p.qa[i] = 0;
        run_gemm(&p, 0, 0, M, b, NULL);
        CHECKF(count_diff_bits(a, b, M * N) > M * N / 2, "M=%lld: small codes changed only %d outputs",
               (long long)M, count_diff_bits(a, b, M * N));
        (void)KB;
        free(a), free(b);
        problem_free(&p);
    }
}

/* The fast MXFP4 routes need every scale product sa·sw of a row group inside
 * their exact range (decode rows: sa·sw·2^-7 normal at the bottom, sa·sw
 * normal at the top; prefill: 2^-139 <= sa·sw <= 2^100); a group outside
 * takes the scalar code. Activations scaled 2^-22 (the 1e-4 floor) in block
 * 0 (alone in half the rows' sums) and exactly 2^40 in block 1, small codes
 * everywhere, weight scales at each edge and one past it: every path must
 * give the scalar bits (a guard one too lax loses or rounds the small
 * codes' sums at the bottom, or misses the scalar's infinite product at
 * the top). */
static void test_gemm_mxfp4_scale_edges(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
    static const int ew[] = {9, 10, 29, 30, 31, 100, 187, 188, 214, 215, 254};
    static const int64_t Mv[] = {1, 17, 129};
    for (size_t mi = 0; mi < sizeof Mv / sizeof *Mv; mi++)
        for (size_t e = 0; e < sizeof ew / sizeof *ew; e++) {
            const int64_t M = Mv[mi];
            const int64_t K = 256, N = 24, KB = K / 32;
            problem p;
            problem_init(&p, FMT_FP4, M, K, N);
            for (int64_t i = 0; i < M * K; i++) {
                const int64_t kb = (i % K) / 32;
                p.x[i] = kb == 0 ? di_round_bf16(rnd_unit() * 2e-9f) : (i % 32 == 3 ? 2.0f : p.x[i] * 0x1p-13f);
                if (kb == 1) /* scale exactly 2^40: the top edges */
                    p.x[i] = i % 32 == 3 ? 448.0f * 0x1p40f : di_round_bf16(rnd_unit() * 0x1p45f);
            }
            di_act_quant_fp8_scalar(p.x, M, K, p.qa, p.sa);
            for (int64_t i = 0; i < N * KB; i++) p.ws[i] = (uint8_t)ew[e];
            /* half the rows see block 0 alone: its sums are not lost in larger ones */
            for (int64_t n = 0; n < N / 2; n++) memset((uint8_t *)p.w + n * (K / 2) + 16, 0, K / 2 - 16);
            float *a = malloc(sizeof(float) * M * N), *b = malloc(sizeof(float) * M * N);
            run_gemm(&p, 0, 0, M, a, NULL);
            run_gemm(&p, 1, 0, M, b, NULL);
            const int d = count_diff_bits_nan(a, b, M * N);
            CHECKF(d == 0, "M=%lld E8M0 %d: %d outputs differ from scalar", (long long)M, ew[e], d);
            free(a), free(b);
            problem_free(&p);
        }
}
/* Weight scales near the top of E8M0 (2^123 .. 2^127) with activation scales
 * far below what the quantizer gives (2^-40, still powers of two): sa·sw
 * is ordinary, but w·sw alone (|w| up to 6) overflows at 2^127 in the
 * prefill tiles' decoded weights, which must therefore not take such rows. */
static void test_gemm_mxfp4_large_weight_scales(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
    static const int ew[] = {227, 228, 250, 254};
    for (size_t e = 0; e < sizeof ew / sizeof *ew; e++) {
        const int64_t M = 130, K = 128, N = 20, KB = K / 32;
        problem p;
        problem_init(&p, FMT_FP4, M, K, N);
        for (int64_t i = 0; i < M * KB; i++) p.sa[i] = 0x1p-40f;
        for (int64_t i = 0; i < N * KB; i++) p.ws[i] = (uint8_t)ew[e];
        float *a = malloc(sizeof(float) * M * N), *b = malloc(sizeof(float) * M * N);
        run_gemm(&p, 0, 0, M, a, NULL);
        run_gemm(&p, 1, 0, M, b, NULL);
        const int d = count_diff_bits_nan(a, b, M * N);
        int inf = 0;
        for (int64_t i = 0; i < M * N; i++) inf += isinf(a[i]) || isnan(a[i]);
        CHECKF(d == 0, "E8M0 %d: %d outputs differ from scalar", ew[e], d);
        CHECKF(inf == 0, "E8M0 %d: %d scalar outputs not finite", ew[e], inf);
        free(a), free(b);
        problem_free(&p);
    }
}

/* Scales near the bottom: weight scales at the bottom of E8M0 (2^-127 ..
 * 2^-124: a weight value 0.5·sw is then an fp32 subnormal for the first
 * two) against activation scales of 2^60; activation scales of 2^-121 ..
 * 2^-114 (the small codes' products then below 2^-126 for the first ones)
 * against weight scales of 2^-8; activation scales of 2^-110 against
 * weight scales that put sa·sw at 2^-157 .. 2^-133 (below 2^-149 the
 * scalar code's fp32 product is 0); and activation scales of 2^-126 ..
 * 2^-118 (an activation value qa·sa then subnormal for the small codes)
 * against weight scales of 2^50. The prefill forms that decode w·sw or
 * qa·sa into vectors or tiles (and the AMX tiles, which read subnormal
 * operands and sums as zero) must keep what they cannot take exactly on
 * exact code: the scalar bits everywhere, and outside the third case not
 * all zero. */
static void test_gemm_mxfp4_tiny_scales(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
    static const int ew[] = {0, 1, 2, 3};
    static const int ea[] = {-121, -117, -116, -114};
    static const int ew_low[] = {80, 88, 96, 104};
    static const int ea_low[] = {-126, -122, -119, -118};
    static const int64_t Mv[] = {20, 40, 130};
    for (int part = 0; part < 4; part++)
        for (size_t mi = 0; mi < sizeof Mv / sizeof *Mv; mi++)
            for (size_t e = 0; e < 4; e++) {
                const int64_t M = Mv[mi], K = 128, N = 40, KB = K / 32;
                problem p;
                problem_init(&p, FMT_FP4, M, K, N);
                if (part == 1) /* small codes in every block */
                    for (int64_t i = 0; i < M * K; i++)
                        p.qa[i] = i % 32 == 7 ? 0x70 : (uint8_t)((p.qa[i] & 0x80) | (p.qa[i] & 0x1f));
                static const int ws_of[] = {0, 119, 0, 177};
                const float sa = part == 3   ? ldexpf(1.0f, ea_low[e])
                                 : part == 2 ? 0x1p-110f
                                 : part      ? ldexpf(1.0f, ea[e])
                                             : 0x1p60f;
                for (int64_t i = 0; i < M * KB; i++) p.sa[i] = sa;
                for (int64_t i = 0; i < N * KB; i++) p.ws[i] = (uint8_t)(part == 2 ? ew_low[e] : part ? ws_of[part] : ew[e]);
                float *a = malloc(sizeof(float) * M * N), *b = malloc(sizeof(float) * M * N);
                run_gemm(&p, 0, 0, M, a, NULL);
                run_gemm(&p, 1, 0, M, b, NULL);
                int nonzero = 0;
                for (int64_t i = 0; i < M * N; i++) nonzero += a[i] != 0.0f;
                const int d = count_diff_bits(a, b, M * N);
                CHECKF(d == 0, "M=%lld part %d case %zu: %d outputs differ from scalar", (long long)M, part, e, d);
                CHECKF(part == 2 || nonzero > M * N / 2, "M=%lld part %d case %zu: %d nonzero outputs", (long long)M,
                       part, e, nonzero);
                free(a), free(b);
                problem_free(&p);
            }
}

/* The largest block sums the integer kernels can meet: every activation
 * code ±448, every weight code 6 of one sign, so a block's 32 products sum
 * to 86,016 (lanes of 2^15·8·2688 before the shift, two of them just below
 * 2^31): decode rows, batches of 3+ and prefill tiles must give the scalar
 * bits. */
static void test_gemm_mxfp4_largest_sums(void) {
    static const int64_t Mv[] = {1, 2, 5, 130};
    for (size_t mi = 0; mi < sizeof Mv / sizeof *Mv; mi++)
        for (int sign = 0; sign < 2; sign++) {
            const int64_t M = Mv[mi], K = 160, N = 12, KB = K / 32;
            problem p;
            problem_init(&p, FMT_FP4, M, K, N);
            for (int64_t i = 0; i < M * K; i++) p.qa[i] = sign ? 0xfe : 0x7e; /* ∓448 */
            for (int64_t i = 0; i < M * KB; i++) p.sa[i] = 0x1p-8f;
            for (int64_t i = 0; i < N * K / 2; i++) ((uint8_t *)p.w)[i] = 0x77; /* 6, 6 */
            float *a = malloc(sizeof(float) * M * N), *b = malloc(sizeof(float) * M * N);
            run_gemm(&p, 0, 0, M, a, NULL);
            CHECKF(a[0] != 0.0f && !isinf(a[0]), "M=%lld: scalar %g", (long long)M, a[0]);
            if (di_cpu_has_avx2()) {
                run_gemm(&p, 1, 0, M, b, NULL);
                CHECKF(count_diff_bits(a, b, M * N) == 0, "M=%lld sign %d: %d outputs differ from scalar",
                       (long long)M, sign, count_diff_bits(a, b, M * N));
            }
            free(a), free(b);
            problem_free(&p);
        }
}

/* The MXFP4 kernels scan the activations for what they cannot hold (a NaN
 * code: no 16-bit integer in the decode rows, read as 480 by the prefill
 * tiles' shift decoding) and then run the scalar code, and take a block of
 * large activations (scale ~2^62) as any other: one such value alone, at
 * the start, the middle or the last block of the last row, must still give
 * the scalar bits, in decode rows and in prefill tiles. */
static void test_gemm_mxfp4_decode_act_limits(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
    enum { K = 256, N = 24 };
    static const int64_t at[] = {0, 131, K - 1};
    static const int64_t Mv[] = {1, 2, 130}; /* 130: the prefill tiles */
    for (size_t mi = 0; mi < sizeof Mv / sizeof *Mv; mi++)
        for (int big = 0; big <= 1; big++)
            for (int i = 0; i < 3; i++) {
                const int64_t M = Mv[mi];
                problem p;
                problem_init(&p, FMT_FP4, M, K, N);
                const int64_t k = (M - 1) * K + at[i];
                if (big) { /* one block of magnitude ~2^70: a·2^63 overflows */
                    for (int64_t j = k / 32 * 32; j < k / 32 * 32 + 32; j++) p.x[j] *= 0x1p70f;
                    di_act_quant_fp8_scalar(p.x, M, K, p.qa, p.sa);
                } else {
                    p.qa[k] = 0x7f;
                }
                float *a = malloc(sizeof(float) * M * N), *b = malloc(sizeof(float) * M * N);
                run_gemm(&p, 0, 0, M, a, NULL);
                run_gemm(&p, 1, 0, M, b, NULL);
                const int d = count_diff_bits_nan(a, b, M * N);
                int inf = 0;
                for (int64_t j = 0; j < M * N; j++) inf += isinf(a[j]);
                CHECKF(d == 0, "M=%lld %s at %lld: %d outputs differ from scalar", (long long)M,
                       big ? "large block" : "NaN code", (long long)at[i], d);
                CHECKF(big ? inf == 0 : 1, "M=%lld large block: %d scalar outputs infinite", (long long)M, inf);
                free(a), free(b);
                problem_free(&p);
            }
}

/* Prefill products large enough (M·K >= 2^18) that the activations are
 * packed by the thread pool too, on 2 and 3 threads against the scalar
 * bits: M not a multiple of the 6-row panels, K / 32 odd (a padding block
 * after the last), N past a whole panel. */
static void test_prefill_threaded_pack(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
    enum { M = 131, K = 2080, N = 70 };
    di_threadpool *pools[2] = {NULL, NULL};
    di_err err;
    for (int t = 0; t < 2; t++) CHECK(di_threadpool_create(t + 2, &pools[t], &err) == DI_OK);
    for (int fmt = FMT_FP8; fmt <= FMT_FP4; fmt++) {
        problem p;
        problem_init(&p, fmt, M, K, N);
        float *want = malloc(sizeof(float) * M * N), *got = malloc(sizeof(float) * M * N);
        run_gemm(&p, 0, 0, M, want, NULL);
        for (int t = 0; t < 2; t++) {
            run_gemm(&p, 1, 0, M, got, pools[t]);
            CHECKF(count_diff_bits(want, got, M * N) == 0, "%s on %d threads: %d outputs differ from scalar",
                   fmt_name[fmt], t + 2, count_diff_bits(want, got, M * N));
        }
        free(want), free(got);
        problem_free(&p);
    }
    for (int t = 0; t < 2; t++) di_threadpool_destroy(pools[t]);
}

/* Row m's bits do not depend on M, on the row's position in the batch, or on
 * the number of threads; checked on both paths for every format. */
static void test_batch_and_thread_invariance(void) {
    /* 12 threads: more than a column block's panels, so the prefill splits
     * its decoding and its row blocks further */
    enum { NP = 4 };
    static const int sizes[NP] = {1, 2, 3, 12};
    di_threadpool *pools[NP] = {NULL};
    di_err err;
    for (int t = 0; t < NP; t++) CHECK(di_threadpool_create(sizes[t], &pools[t], &err) == DI_OK);
    /* 19 panels and 3 prefill chunks of N; K: 3 prefill chunks, the last half a
     * 32-byte MXFP4 chunk */
    enum { M = 33, K = 1056, N = 300 };
    for (int fmt = FMT_FP8; fmt <= FMT_F32; fmt++) {
        problem p;
        problem_init(&p, fmt, M, K, N);
        for (int avx2 = 0; avx2 <= di_cpu_has_avx2(); avx2++) {
            float *full = malloc(sizeof(float) * M * N), *o = malloc(sizeof(float) * M * N);
            run_gemm(&p, avx2, 0, M, full, pools[0]);
            for (int t = 1; t < NP; t++) {
                run_gemm(&p, avx2, 0, M, o, pools[t]);
                CHECKF(count_diff_bits(full, o, M * N) == 0, "%s avx2=%d: %d threads differ",
                       fmt_name[fmt], avx2, sizes[t]);
            }
            int bad = 0;
            for (int64_t m = 0; m < M; m++) {
                run_gemm(&p, avx2, m, 1, o, pools[1]);
                bad += count_diff_bits(full + m * N, o, N) != 0;
            }
            /* a batch of 5 starting at an odd row */
            run_gemm(&p, avx2, 11, 5, o, pools[2]);
            bad += count_diff_bits(full + 11 * N, o, 5 * N) != 0;
            CHECKF(bad == 0, "%s avx2=%d: %d rows depend on the batch", fmt_name[fmt], avx2, bad);
            free(full), free(o);
        }
        problem_free(&p);
    }
    for (int t = 0; t < NP; t++) di_threadpool_destroy(pools[t]);
}

static void check_all_paths(void);
static void check_no_amx_prefill(void);
static void test_gemm_mxfp4_many(void);

/* The route CPUs with slow subnormals take (E4M3 codes through F16C, in the
 * decode rows and the prefill tiles) gives the scalar bits too: the checks
 * above, forced onto it. */
static void test_half_route(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
#ifdef DI_HAVE_AVX2_KERNELS
    di_cpu_kernels_force_fp8_half(1);
    check_all_paths();
    di_cpu_kernels_force_fp8_half(0);
#endif
}

/* The shift route AMD cores take (E4M3 codes to fp32 subnormals by shifts;
 * on AVX-512 its segmented decode rows on 512-bit vectors) gives the scalar
 * bits too: the checks above forced onto it, so that other CPUs check it
 * (slowly: their subnormal arithmetic takes assists). */
static void test_shift_route(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
#ifdef DI_HAVE_AVX2_KERNELS
    di_cpu_kernels_force_fp8_half(-1);
    CHECK(!di_cpu_kernels_fp8_half());
    const long s0 = di_cpu_kernels_seg_units();
    check_all_paths();
    CHECKF(di_cpu_kernels_seg_units() > s0, "the segmented decode rows ran %ld units",
           di_cpu_kernels_seg_units() - s0);
    di_cpu_kernels_force_fp8_half(0);
#endif
}

/* The FP8 decode rows prefetch the row group two ahead or not
 * (kernels.c, di_cpu_kernels_dec_prefetch: fixed by DI_CPU_PREFETCH, else
 * measured, and the tests' small calls, which never measure, take the
 * prefetches), in a loop of its own: the checks above again with the other
 * choice forced, so that both loops are checked whatever the environment. */
static void test_dec_prefetch_route(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
#ifdef DI_HAVE_AVX2_KERNELS
    const int was = di_cpu_kernels_dec_prefetch();
    di_cpu_kernels_force_dec_prefetch(was == 0 ? 1 : -1);
    CHECK(di_cpu_kernels_dec_prefetch() == (was == 0));
    const long s0 = di_cpu_kernels_spread_units();
    check_all_paths();
    /* without the prefetches whole units take their rows spread (dec_units) */
    if (was != 0)
        CHECKF(di_cpu_kernels_spread_units() > s0, "units with spread rows: %ld", di_cpu_kernels_spread_units() - s0);
    di_cpu_kernels_force_dec_prefetch(0);
    CHECK(di_cpu_kernels_dec_prefetch() == was);
#endif
}

/* The measured choice's decision (kernels.h, di_cpu_pf_decide): medians, a
 * margin, and the prefetches where no clear difference shows. */
static void test_pf_decide(void) {
    double off[12], on[12];
    for (int i = 0; i < 12; i++) off[i] = 1.0, on[i] = 1.2;
    CHECK(di_cpu_pf_decide(off, on, 12) == 0); /* without: 17 % faster */
    CHECK(di_cpu_pf_decide(on, off, 12) == 1); /* with: faster */
    for (int i = 0; i < 12; i++) off[i] = 1.0, on[i] = 1.02;
    CHECK(di_cpu_pf_decide(off, on, 12) == 1); /* within the margin: the prefetches */
    for (int i = 0; i < 12; i++) off[i] = 1.0, on[i] = 1.0 / (1.0 - 2 * DI_PF_MARGIN);
    CHECK(di_cpu_pf_decide(off, on, 12) == 0); /* past it */
    /* medians: a few slow calls (another process, a page fault) do not decide */
    for (int i = 0; i < 12; i++) off[i] = 1.0, on[i] = 1.2;
    off[0] = off[5] = off[7] = 50.0;
    CHECK(di_cpu_pf_decide(off, on, 12) == 0);
    on[1] = on[2] = 0.01;
    CHECK(di_cpu_pf_decide(off, on, 12) == 0);
    /* even counts take the middle pair's mean (2.0 against 2.5); no samples: the prefetches */
    const double a[2] = {1.0, 3.0}, b[2] = {2.5, 2.5};
    CHECK(di_cpu_pf_decide(a, b, 2) == 0);
    CHECK(di_cpu_pf_decide(b, a, 2) == 1);
    CHECK(di_cpu_pf_decide(a, b, 0) == 1);
}

/* The measured choice per batch class (kernels.c, di_cpu_pf_for_call /
 * di_cpu_pf_record): large calls alternate the two until each has its
 * samples, small ones take the prefetches and are not timed, the decision
 * then holds for that class only, and a reset measures again. Driven here
 * with made-up times, then by real calls of 1 MiB of weights, which must
 * give the same bits whichever way each ran. */
static void test_pf_measured(void) {
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
#ifdef DI_HAVE_AVX2_KERNELS
    if (di_cpu_kernels_dec_prefetch() >= 0) SKIP("DI_CPU_PREFETCH fixes the choice in this environment");
    di_cpu_kernels_reset_dec_prefetch();
    int timed, n[2] = {0, 0}, last = -1, alternated = 1;
    for (int i = 0; i < 100 && di_cpu_kernels_dec_prefetch_measured(0) < 0; i++) {
        CHECK(di_cpu_pf_for_call(0, 0, &timed) == 1 && !timed); /* small: never timed */
        const int pf = di_cpu_pf_for_call(0, 1, &timed);
        CHECK(timed);
        if (pf == last) alternated = 0;
        last = pf;
        n[pf]++;
        di_cpu_pf_record(0, pf, pf ? 2.0 : 1.0); /* without: twice as fast */
    }
    CHECKF(n[0] == 12 && n[1] == 12 && alternated, "timed calls without / with: %d / %d, alternated %d", n[0],
           n[1], alternated);
    CHECK(di_cpu_kernels_dec_prefetch_measured(0) == 0);
    CHECK(di_cpu_pf_for_call(0, 1, &timed) == 0 && !timed);
    CHECK(di_cpu_pf_for_call(0, 0, &timed) == 0 && !timed);
    CHECK(di_cpu_kernels_dec_prefetch_measured(1) == -1 && di_cpu_kernels_dec_prefetch_measured(2) == -1);
    di_cpu_pf_record(0, 1, 0.001); /* after the decision: ignored */
    CHECK(di_cpu_kernels_dec_prefetch_measured(0) == 0);
    /* the other way round in class 2 */
    for (int i = 0; i < 24; i++) {
        const int pf = di_cpu_pf_for_call(2, 1, &timed);
        di_cpu_pf_record(2, pf, pf ? 1.0 : 2.0);
    }
    CHECK(di_cpu_kernels_dec_prefetch_measured(2) == 1);
    /* forcing still wins over a measured choice */
    di_cpu_kernels_force_dec_prefetch(1);
    CHECK(di_cpu_pf_for_call(0, 1, &timed) == 1 && !timed);
    di_cpu_kernels_force_dec_prefetch(0);
    di_cpu_kernels_reset_dec_prefetch();
    CHECK(di_cpu_kernels_dec_prefetch_measured(0) == -1 && di_cpu_kernels_dec_prefetch_measured(2) == -1);

    /* real calls: one row, 1,024 × 1,024 codes (1 MiB, the least that measures) */
    problem p;
    problem_init(&p, FMT_FP8, 1, 1024, 1024);
    float *first = malloc(sizeof(float) * 1024), *out = malloc(sizeof(float) * 1024);
    di_gemm_fp8(p.qa, p.sa, 1, 1024, p.w, p.ws, 1024, first, NULL);
    int calls = 1, same = 1;
    for (; calls < 100 && di_cpu_kernels_dec_prefetch_measured(0) < 0; calls++) {
        di_gemm_fp8(p.qa, p.sa, 1, 1024, p.w, p.ws, 1024, out, NULL);
        same &= count_diff_bits(first, out, 1024) == 0;
    }
    CHECKF(calls == 24, "the choice took %d calls (24: 12 each way)", calls);
    CHECK(same);
    CHECK(di_cpu_kernels_dec_prefetch_measured(0) >= 0 && di_cpu_kernels_dec_prefetch_measured(1) == -1);
    float ref[1024];
    di_gemm_fp8_scalar(p.qa, p.sa, 1, 1024, p.w, p.ws, 1024, ref, NULL);
    CHECK(count_diff_bits(first, ref, 1024) == 0);
    di_cpu_kernels_reset_dec_prefetch();
    free(first), free(out);
    problem_free(&p);

    /* rows shorter than DI_DEC_LONG_ROW measure in their own class (3 for
     * one row): 2,048 × 512 codes */
    problem_init(&p, FMT_FP8, 1, 512, 2048);
    first = malloc(sizeof(float) * 2048), out = malloc(sizeof(float) * 2048);
    di_gemm_fp8(p.qa, p.sa, 1, 512, p.w, p.ws, 2048, first, NULL);
    calls = 1, same = 1;
    for (; calls < 100 && di_cpu_kernels_dec_prefetch_measured(3) < 0; calls++) {
        di_gemm_fp8(p.qa, p.sa, 1, 512, p.w, p.ws, 2048, out, NULL);
        same &= count_diff_bits(first, out, 2048) == 0;
    }
    CHECKF(calls == 24, "the short rows' choice took %d calls (24: 12 each way)", calls);
    CHECK(same && di_cpu_kernels_dec_prefetch_measured(0) == -1);
    float *ref2 = malloc(sizeof(float) * 2048);
    di_gemm_fp8_scalar(p.qa, p.sa, 1, 512, p.w, p.ws, 2048, ref2, NULL);
    CHECK(count_diff_bits(first, ref2, 2048) == 0);
    di_cpu_kernels_reset_dec_prefetch();
    CHECK(di_cpu_kernels_dec_prefetch_measured(3) == -1);
    free(first), free(out), free(ref2);
    problem_free(&p);
#endif
}

/* On a CPU with AVX-512 the prefill micro-kernels and the decode rows (FP8
 * on either route, MXFP4) run on 512-bit vectors (every check above took
 * them); the 256-bit ones, which other CPUs take, must give the same
 * scalar bits there too: the checks again with the wide kernels switched
 * off. */
static void test_narrow_route(void) {
    if (!di_cpu_kernels_wide()) SKIP("no AVX-512 F/DQ/BW/VL: the 256-bit kernels are the ones checked above");
#ifdef DI_HAVE_AVX2_KERNELS
    di_cpu_kernels_force_no_avx512(1);
    CHECK(!di_cpu_kernels_wide());
    const long b0 = di_cpu_kernels_avx_vnni_byte_calls(), v0 = di_cpu_kernels_avx_vnni_wide_calls();
    check_all_paths();
    /* one MXFP4 activation row in the AVX-VNNI byte form where the CPU
     * has it, batches of 3-16 rows with its vpdpwssd; the 16-bit sums
     * without it (AMD Zen 2-3, older Intel cores) as well */
    if (di_cpu_kernels_avx_vnni()) { /* the gate: DI_CPU_AVX_VNNI=0 turns it off */
        CHECKF(di_cpu_kernels_avx_vnni_byte_calls() > b0, "%ld calls in the AVX-VNNI byte form",
               di_cpu_kernels_avx_vnni_byte_calls() - b0);
        CHECKF(di_cpu_kernels_avx_vnni_wide_calls() > v0, "%ld calls of 3-16 rows by AVX-VNNI",
               di_cpu_kernels_avx_vnni_wide_calls() - v0);
    }
    di_cpu_kernels_force_no_avx_vnni(1);
    const long v1 = di_cpu_kernels_avx_vnni_wide_calls();
    check_format(FMT_FP4);
    test_gemm_decode_rows();
    test_gemm_mxfp4_small_codes();
    test_gemm_mxfp4_scale_edges();
    test_gemm_mxfp4_many();
    CHECKF(di_cpu_kernels_avx_vnni_wide_calls() == v1, "forced off, AVX-VNNI still ran");
    di_cpu_kernels_force_no_avx_vnni(0);
    /* past 128 rows: pieces with AVX-VNNI, the tiles without */
    check_no_amx_prefill();
    /* the prefill's one-pass form on 256-bit vectors past LG_MC rows
     * (where the core's L2 holds a unit's scratch) and its passes */
    test_gemm_fp8_prefill_threads();
    di_cpu_kernels_force_no_avx512(0);
    CHECK(di_cpu_kernels_wide());
#endif
}

/* Several MXFP4 products in one call (di_gemm_mxfp4_many, the routed
 * experts of a decode step): every part's outputs equal its own
 * di_gemm_mxfp4 call bit for bit, on one thread and on a pool: one part;
 * six of one to 17 rows (decode rows), some sharing activations, one whose
 * activations hold a NaN code (the scalar code for that part alone); and
 * the eight with two of 130 rows on the same activations (prefill: each
 * part on its own, or with VNNI and no AMX all in pieces in one call). */
static void test_gemm_mxfp4_many(void) {
    enum { K = 320, NP = 8 };
    static const int64_t Mv[NP] = {1, 1, 2, 1, 17, 1, 130, 130}, Nv[NP] = {96, 40, 70, 33, 64, 8, 50, 24};
    /* activations of parts 1 and 3 are part 0's, part 7's part 6's; part
     * 5's hold a NaN code */
    problem pr[NP];
    di_gemm_part parts[NP];
    float *want[NP];
    for (int i = 0; i < NP; i++) {
        problem_init(&pr[i], FMT_FP4, Mv[i], K, Nv[i]);
        if (i == 5) pr[i].qa[77] = 0x7f;
        const problem *a = i == 1 || i == 3 ? &pr[0] : i == 7 ? &pr[6] : &pr[i];
        const int64_t M = Mv[i];
        parts[i] = (di_gemm_part){a->qa, a->sa, M, pr[i].w, pr[i].ws, Nv[i], malloc(sizeof(float) * M * Nv[i])};
        want[i] = malloc(sizeof(float) * M * Nv[i]);
        di_gemm_mxfp4(a->qa, a->sa, M, K, pr[i].w, pr[i].ws, Nv[i], want[i], NULL);
    }
    di_threadpool *tp = NULL;
    di_err err;
    CHECK(di_threadpool_create(3, &tp, &err) == DI_OK);
    static const int counts[3] = {1, 6, 8};
    for (int pool = 0; pool < 2; pool++)
        for (int c = 0; c < 3; c++) {
            const int n = counts[c];
            for (int i = 0; i < n; i++) memset(parts[i].out, 0x55, sizeof(float) * parts[i].M * parts[i].N);
            di_gemm_mxfp4_many(parts, n, K, pool ? tp : NULL);
            for (int i = 0; i < n; i++)
                CHECKF(count_diff_bits_nan(want[i], parts[i].out, parts[i].M * parts[i].N) == 0,
                       "pool %d, %d parts: part %d differs from its own call", pool, n, i);
        }
    di_threadpool_destroy(tp);
    for (int i = 0; i < NP; i++) {
        free(parts[i].out), free(want[i]);
        problem_free(&pr[i]);
    }
}

/* FP8 products on the same activations in one call (di_gemm_fp8_many:
 * attention's wq_a and wkv, the shared expert's w1 and w3): each part's
 * outputs equal its own di_gemm_fp8 call bit for bit, for decode rows of
 * one to 16 activation rows (the segmented form from 3), for 24 rows
 * (prefill: one call a part), and parts of other activations (one call a
 * part), on one thread and on a pool. */
static void test_gemm_fp8_many(void) {
    enum { K = 320, NP = 3 };
    static const int64_t Mv[] = {1, 2, 5, 16, 24}, Nv[NP] = {96, 40, 70};
    di_threadpool *tp = NULL;
    di_err err;
    CHECK(di_threadpool_create(3, &tp, &err) == DI_OK);
    for (size_t mi = 0; mi < sizeof Mv / sizeof *Mv; mi++)
        for (int other = 0; other < 2; other++) {
            const int64_t M = Mv[mi];
            problem pr[NP];
            di_gemm_part parts[NP];
            float *want[NP];
            for (int i = 0; i < NP; i++) {
                problem_init(&pr[i], FMT_FP8, M, K, Nv[i]);
                /* part 2 on its own activations when `other`, else all on part 0's */
                const problem *a = other && i == 2 ? &pr[2] : &pr[0];
                parts[i] = (di_gemm_part){a->qa, a->sa, M, pr[i].w, pr[i].ws, Nv[i], malloc(sizeof(float) * M * Nv[i])};
                want[i] = malloc(sizeof(float) * M * Nv[i]);
                di_gemm_fp8(a->qa, a->sa, M, K, pr[i].w, pr[i].ws, Nv[i], want[i], NULL);
            }
            for (int pool = 0; pool < 2; pool++) {
                for (int i = 0; i < NP; i++) memset(parts[i].out, 0x55, sizeof(float) * M * Nv[i]);
                di_gemm_fp8_many(parts, NP, K, pool ? tp : NULL);
                for (int i = 0; i < NP; i++)
                    CHECKF(count_diff_bits(want[i], parts[i].out, M * Nv[i]) == 0,
                           "M=%lld other=%d pool %d: part %d differs from its own call", (long long)M, other, pool, i);
            }
            for (int i = 0; i < NP; i++) {
                free(parts[i].out), free(want[i]);
                problem_free(&pr[i]);
            }
        }
    di_threadpool_destroy(tp);
}

#ifdef DI_HAVE_AVX2_KERNELS
/* The MXFP4 checks the VNNI route below runs under each of its settings. */
static void check_mxfp4_decode(void) {
    check_format(FMT_FP4);
    test_gemm_decode_rows();
    test_gemm_mxfp4_small_codes();
    test_gemm_mxfp4_scale_edges();
    test_gemm_mxfp4_largest_sums();
    test_gemm_mxfp4_decode_act_limits();
    test_gemm_mxfp4_many();
}
#endif

/* On a CPU with AVX-512 VNNI the MXFP4 decode rows on 512-bit vectors add
 * their 16-bit products with vpdpwssd, and calls of one activation row
 * their byte products with vpdpbusd (every check above took them; with
 * AVX-512 VBMI looking the codes up by vpermb); the checks must have run
 * them, and pass again with vpermb off (vpshufb), with the byte form off
 * and with VNNI off (vpmaddwd then vpaddd, what other AVX-512 CPUs run). */
static void test_vnni_route(void) {
#ifdef DI_HAVE_AVX2_KERNELS
    if (!di_cpu_kernels_vnni()) SKIP("no AVX-512 VNNI (or not on the 512-bit kernels)");
    const long n0 = di_cpu_kernels_vnni_units(), b0 = di_cpu_kernels_vnni_byte_calls();
    const long v0 = di_cpu_kernels_vbmi_byte_calls();
    check_mxfp4_decode();
    const long n1 = di_cpu_kernels_vnni_units();
    CHECKF(n1 > n0, "the VNNI sums ran %ld units", n1 - n0);
    /* one activation row's calls took the byte form (dec8_1b); the 16-bit
     * sums, which two rows and more take, must give the same bits there */
    const long b1 = di_cpu_kernels_vnni_byte_calls();
    CHECKF(b1 > b0, "the byte form ran %ld calls", b1 - b0);
    /* with VBMI those calls looked the codes up by vpermb; again on vpshufb */
    if (di_cpu_kernels_vbmi()) {
        CHECKF(di_cpu_kernels_vbmi_byte_calls() > v0, "vpermb ran %ld calls", di_cpu_kernels_vbmi_byte_calls() - v0);
        const long v1 = di_cpu_kernels_vbmi_byte_calls();
        di_cpu_kernels_force_no_vbmi(1);
        CHECK(!di_cpu_kernels_vbmi());
        check_mxfp4_decode();
        CHECKF(di_cpu_kernels_vbmi_byte_calls() == v1, "forced off, vpermb still ran");
        CHECKF(di_cpu_kernels_vnni_byte_calls() > b1, "the byte form on vpshufb ran %ld calls",
               di_cpu_kernels_vnni_byte_calls() - b1);
        di_cpu_kernels_force_no_vbmi(0);
    }
    const long b2 = di_cpu_kernels_vnni_byte_calls();
    di_cpu_kernels_force_no_vnni_bytes(1);
    check_mxfp4_decode();
    CHECKF(di_cpu_kernels_vnni_byte_calls() == b2, "forced off, the byte form still ran");
    di_cpu_kernels_force_no_vnni_bytes(0);
    const long n2 = di_cpu_kernels_vnni_units();
    di_cpu_kernels_force_no_vnni(1);
    CHECK(!di_cpu_kernels_vnni());
    check_mxfp4_decode();
    CHECKF(di_cpu_kernels_vnni_units() == n2, "forced off, the VNNI sums still ran");
    di_cpu_kernels_force_no_vnni(0);
    CHECK(di_cpu_kernels_vnni());
#endif
}

/* The MXFP4 checks that reach the prefill (the AMX tiles from 17 rows, the
 * AVX-512 tiles above DEC_M: the shapes, small codes, scale edges, weight
 * scales near the top and the bottom, the largest sums, NaN and huge
 * activations, several parts, many threads) run under each AMX setting
 * below. */
static void check_mxfp4_prefill(void) {
    check_format(FMT_FP4);
    test_gemm_mxfp4_prefill_shapes();
    test_gemm_extreme_scales();
    test_gemm_mxfp4_small_codes();
    test_gemm_mxfp4_scale_edges();
    test_gemm_mxfp4_large_weight_scales();
    test_gemm_mxfp4_tiny_scales();
    test_gemm_mxfp4_largest_sums();
    test_gemm_mxfp4_decode_act_limits();
    test_gemm_mxfp4_many();
    test_batch_and_thread_invariance();
}

/* Without AMX (a CPU without it, or test_amx_route's forced-off run):
 * with VNNI's sums (AVX-512 VNNI on the 512-bit kernels, AVX-VNNI on the
 * 256-bit ones) the batches past 128 rows go to the integer kernels in
 * pieces; the checks must have run them (the count of pieces) and none of
 * the FMA tiles, and must pass again with those sums off, on the tiles.
 * Elsewhere the tiles take them. */
static void check_no_amx_prefill(void) {
#ifdef DI_HAVE_AVX2_KERNELS
    const int wide = di_cpu_kernels_wide();
    const int pieces = wide ? di_cpu_kernels_vnni() : di_cpu_kernels_avx_vnni();
    const long p0 = di_cpu_kernels_mxfp4_pieces(), t0 = di_cpu_kernels_mxfp4_tile_calls();
    check_mxfp4_prefill();
    if (!pieces) {
        CHECKF(di_cpu_kernels_mxfp4_tile_calls() > t0, "the tiles ran %ld calls",
               di_cpu_kernels_mxfp4_tile_calls() - t0);
        return;
    }
    CHECKF(di_cpu_kernels_mxfp4_pieces() > p0, "the integer kernels ran %ld pieces",
           di_cpu_kernels_mxfp4_pieces() - p0);
    CHECKF(di_cpu_kernels_mxfp4_tile_calls() == t0, "with VNNI, the tiles still ran %ld calls",
           di_cpu_kernels_mxfp4_tile_calls() - t0);
    const long p1 = di_cpu_kernels_mxfp4_pieces();
    (wide ? di_cpu_kernels_force_no_vnni : di_cpu_kernels_force_no_avx_vnni)(1);
    check_mxfp4_prefill();
    CHECKF(di_cpu_kernels_mxfp4_tile_calls() > t0, "VNNI off: the tiles ran %ld calls",
           di_cpu_kernels_mxfp4_tile_calls() - t0);
    CHECKF(di_cpu_kernels_mxfp4_pieces() == p1, "VNNI off, the pieces still ran");
    (wide ? di_cpu_kernels_force_no_vnni : di_cpu_kernels_force_no_avx_vnni)(0);
#endif
}

/* On a CPU with AMX-BF16 the MXFP4 prefill runs on tiles
 * (kernels_amx_mxfp4.c): its exact block sums must give the scalar bits in
 * every check above (which must have run it: the count of panels), and the
 * checks must pass again with it forced off (with AVX-512 VNNI the integer
 * kernels in pieces of 64 rows, then with VNNI off too the AVX-512 tiles;
 * the counts must show each ran). Panels
 * whose scales leave the tiles' range (test_gemm_mxfp4_scale_edges: weight
 * scales of 2^-118 and below against activations of 2^-22) take the
 * scalar code: the count must show some panels run and the checks still
 * give the scalar bits there. */
static void test_amx_route(void) {
#ifdef DI_HAVE_AVX2_KERNELS
    if (!di_cpu_kernels_amx()) SKIP("no AMX-BF16 (or not granted, or not on the 512-bit kernels)");
    const long u0 = di_cpu_kernels_amx_units();
    check_mxfp4_prefill();
    const long u1 = di_cpu_kernels_amx_units();
    CHECKF(u1 > u0, "the AMX tiles ran %ld panels", u1 - u0);
    di_cpu_kernels_force_no_amx(1);
    CHECK(!di_cpu_kernels_amx());
    check_no_amx_prefill();
    CHECKF(di_cpu_kernels_amx_units() == u1, "forced off, the AMX tiles still ran");
    di_cpu_kernels_force_no_amx(0);
    CHECK(di_cpu_kernels_amx());
#endif
}

/* A CPU without AMX runs check_no_amx_prefill as it stands. */
static void test_no_amx_route(void) {
#ifdef DI_HAVE_AVX2_KERNELS
    if (di_cpu_kernels_amx()) SKIP("AMX: test_amx_route runs these checks with it forced off");
    check_no_amx_prefill();
#endif
}

/* On a CPU with AVX-512 the FP8 decode rows decode their codes by the
 * exponent bias (kernels_avx2_block.c, dec_bias_wide), the codes of
 * exponent 0 through a table where a chunk pair holds one, and products
 * whose codes take that table often go on through F16C. The decoding must be taken by the checks above (every
 * E4M3 code, the exponent-0 ones, both zeros, the tiny scales), give the
 * scalar bits, step over to F16C where the codes call for it, and the
 * checks must pass again with it forced off (F16C throughout). */
static void test_bias_route(void) {
#ifdef DI_HAVE_AVX2_KERNELS
    if (!di_cpu_kernels_wide()) SKIP("no AVX-512 F/DQ/BW/VL: no decode rows on 512-bit vectors");
    if (!di_cpu_kernels_fp8_half())
        SKIP("the shift route's CPU: its decode rows decode by shifts (test_half_route takes this route)");
    long n0 = di_cpu_kernels_bias_units();
    test_gemm_decode_rows();
    test_gemm_fp8_tiny_scales();
    CHECKF(di_cpu_kernels_bias_units() > n0, "the decoding ran %ld units", di_cpu_kernels_bias_units() - n0);
    /* every finite code in every position class of a chunk, both rows of a
     * pair, M = 1, 2 and 5: two units of 32 rows, the second through F16C (an
     * eighth of the first's chunk pairs and more took the table); then
     * codes of exponent 1 and up, and codes of exponent 0 in one chunk pair
     * of 36 (rows 1, 5, ..: pairs 0 and 2 of a group), or in the last pair
     * of each group only (rows 7, 15, ..: at one activation row the four
     * pairs' codes are tested together): both units by the bias */
    for (int64_t v = 0; v < 12; v++) {
        static const int64_t ms[3] = {1, 2, 5}; /* 8 rows a group; 8; 4 in blocks of 4 and 1 */
        const int64_t M = ms[v % 3], kind = v / 3;
        enum { K = 32 * 9, N = 37 };
        problem p;
        problem_init(&p, FMT_FP8, M, K, N);
        /* activations of one magnitude (fill_act's span of 2^29 sends some units to the scalar rows) */
        for (int64_t i = 0; i < M * K; i++) p.x[i] = di_round_bf16(rnd_unit());
        di_act_quant_fp8_scalar(p.x, M, K, p.qa, p.sa);
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) {
                uint8_t b = (uint8_t)((n * 7 + k * 13) & 0xff);
                if (kind && !(b & 0x78)) b |= 0x08;
                if (kind == 2 && n % 4 == 1 && k / 32 == 3 && (k % 32) % 5 == 0) b &= 0x87; /* rows 1, 5, ..: one chunk */
                if (kind == 3 && n % 8 == 7 && k / 32 == 3 && (k % 32) % 5 == 0) b &= 0x87; /* rows 7, 15, .. */
                ((uint8_t *)p.w)[n * K + k] = (b & 0x7f) != 0x7f ? b : kind ? 0x08 : 0x00;
            }
        float *a = malloc(sizeof(float) * M * N), *b = malloc(sizeof(float) * M * N);
        n0 = di_cpu_kernels_bias_units();
        run_gemm(&p, 0, 0, M, a, NULL);
        run_gemm(&p, 1, 0, M, b, NULL);
        CHECKF(count_diff_bits(a, b, M * N) == 0, "codes %lld, M=%lld: outputs differ from scalar", (long long)kind,
               (long long)M);
        CHECKF(di_cpu_kernels_bias_units() == n0 + 1 + (kind > 0), "codes %lld, M=%lld: %ld units by the bias",
               (long long)kind, (long long)M, di_cpu_kernels_bias_units() - n0);
        free(a), free(b);
        problem_free(&p);
    }
    /* one span of 4 tiles (long rows, no prefetches): codes of exponent 0
     * only in slot 7's rows (pair 3), the others' of exponent 1 and up */
    {
        enum { K = 1024, N = 128 };
        problem p;
        problem_init(&p, FMT_FP8, 1, K, N);
        for (int64_t i = 0; i < K; i++) p.x[i] = di_round_bf16(rnd_unit());
        di_act_quant_fp8_scalar(p.x, 1, K, p.qa, p.sa);
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) {
                uint8_t b = (uint8_t)((n * 7 + k * 13) & 0xff);
                if (!(b & 0x78)) b |= 0x08;
                if (n >= 7 * 16 && k / 32 == 5 && k % 3 == 0) b &= 0x87;
                ((uint8_t *)p.w)[n * K + k] = (b & 0x7f) != 0x7f ? b : 0x08;
            }
        float *a = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N);
        di_cpu_kernels_force_dec_prefetch(-1);
        const long s0 = di_cpu_kernels_span_units();
        run_gemm(&p, 0, 0, 1, a, NULL);
        run_gemm(&p, 1, 0, 1, b, NULL);
        CHECKF(count_diff_bits(a, b, N) == 0, "a span with codes of exponent 0 in pair 3 only: outputs differ");
        CHECKF(di_cpu_kernels_span_units() == s0 + 4, "%ld units in spans", di_cpu_kernels_span_units() - s0);
        di_cpu_kernels_force_dec_prefetch(0);
        free(a), free(b);
        problem_free(&p);
    }
    di_cpu_kernels_force_no_bias(1);
    n0 = di_cpu_kernels_bias_units();
    check_all_paths();
    CHECK(di_cpu_kernels_bias_units() == n0);
    di_cpu_kernels_force_no_bias(0);
#endif
}

/* The FP8 decode rows of 3 to 16 activation rows go through K in segments,
 * the chains paused in a buffer between them (kernels_avx2_block.c,
 * seg_units: 4 weight rows × blocks of up to 8 rows on 512-bit vectors, 2 ×
 * 4 on 256-bit ones). With activations of one magnitude (so no unit falls
 * back to the scalar rows) and K = 4,160 (130 chunks: 4 to 17 segments, of
 * unequal length where they do not divide it), 70 weight rows (a last unit
 * of 6: a part group), one and three threads, codes of every exponent
 * (with AVX-512: the bias's table, then F16C for the rest of the product)
 * and of exponent 1 and up (the bias throughout): the scalar bits, and the
 * same bits with the segments forced off; on the 256-bit kernels too where
 * the CPU has AVX-512. */
static void seg_checks(di_threadpool *tp, const char *route) {
    static const int64_t ms[] = {3, 4, 5, 8, 9, 13, 16};
    enum { K = 4160, N = 70 };
    for (int kind = 0; kind < 2; kind++)
        for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
            const int64_t M = ms[mi];
            problem p;
            problem_init(&p, FMT_FP8, M, K, N);
            for (int64_t i = 0; i < M * K; i++) p.x[i] = di_round_bf16(rnd_unit());
            di_act_quant_fp8_scalar(p.x, M, K, p.qa, p.sa);
            if (kind)
                for (int64_t i = 0; i < N * K; i++)
                    if (!(((uint8_t *)p.w)[i] & 0x78)) ((uint8_t *)p.w)[i] |= 0x08;
            float *a = malloc(sizeof(float) * M * N), *b = malloc(sizeof(float) * M * N);
            run_gemm(&p, 0, 0, M, a, NULL);
            for (int t = 0; t < 2; t++)
                for (int off = 0; off < 2; off++) {
                    di_cpu_kernels_force_no_seg(off);
                    const long n0 = di_cpu_kernels_seg_units();
                    run_gemm(&p, 1, 0, M, b, t ? tp : NULL);
                    CHECKF(count_diff_bits(a, b, M * N) == 0,
                           "%s, codes %d, M=%lld, %d thread(s)%s: outputs differ from scalar", route, kind,
                           (long long)M, t ? 3 : 1, off ? ", no segments" : "");
                    CHECKF(di_cpu_kernels_seg_units() - n0 == (off ? 0 : (N + 31) / 32),
                           "%s, M=%lld: %ld units in segments", route, (long long)M, di_cpu_kernels_seg_units() - n0);
                }
            di_cpu_kernels_force_no_seg(0);
            free(a), free(b);
            problem_free(&p);
        }
}

static void test_seg_route(void) {
#ifdef DI_HAVE_AVX2_KERNELS
    if (!di_cpu_has_avx2()) SKIP("no AVX2/FMA/F16C on this CPU");
    di_threadpool *tp = NULL;
    di_err err;
    CHECK(di_threadpool_create(3, &tp, &err) == DI_OK);
    const int wide = di_cpu_kernels_wide();
    seg_checks(tp, wide ? "512-bit" : "256-bit");
    if (wide) {
        di_cpu_kernels_force_no_avx512(1);
        seg_checks(tp, "256-bit");
        di_cpu_kernels_force_no_avx512(0);
    }
    di_threadpool_destroy(tp);
#endif
}

/* The checks above that reach the AVX2 kernels' forms, for the routes that
 * tests force. */
static void check_all_paths(void) {
    check_format(FMT_FP8);
    test_gemm_fp8_prefill_shapes();
    check_format(FMT_FP4);
    test_gemm_mxfp4_prefill_shapes();
    test_gemm_extreme_scales();
    test_gemm_decode_rows();
    test_gemm_decode_all_scales();
    test_gemm_fp8_fold_edges();
    test_gemm_fp8_tiny_scales();
    test_gemm_mxfp4_small_codes();
    test_gemm_mxfp4_scale_edges();
    test_batch_and_thread_invariance();
    test_gemm_fp8_many();
    test_gemm_mxfp4_many();
}

/* The public entry points follow di_cpu_kernels_force_scalar. */
static void test_dispatch(void) {
    di_cpu_kernels_force_scalar(1);
    CHECK(strcmp(di_cpu_kernels_path(), "scalar") == 0);
    problem p;
    problem_init(&p, FMT_FP8, 2, 64, 40);
    float a[80], b[80];
    di_gemm_fp8(p.qa, p.sa, 2, 64, p.w, p.ws, 40, a, NULL);
    di_gemm_fp8_scalar(p.qa, p.sa, 2, 64, p.w, p.ws, 40, b, NULL);
    CHECK(count_diff_bits(a, b, 80) == 0);
    /* the many-part forms too: one scalar call a part */
    problem p4;
    problem_init(&p4, FMT_FP4, 2, 64, 40);
    float c[80], d[80];
    const di_gemm_part fp8[2] = {{p.qa, p.sa, 2, p.w, p.ws, 40, a}, {p.qa, p.sa, 1, p.w, p.ws, 40, c}};
    di_gemm_fp8_many(fp8, 2, 64, NULL);
    CHECK(count_diff_bits(a, b, 80) == 0 && count_diff_bits(c, b, 40) == 0);
    const di_gemm_part fp4[2] = {{p4.qa, p4.sa, 2, p4.w, p4.ws, 40, a}, {p4.qa, p4.sa, 1, p4.w, p4.ws, 40, c}};
    di_gemm_mxfp4_many(fp4, 2, 64, NULL);
    di_gemm_mxfp4_scalar(p4.qa, p4.sa, 2, 64, p4.w, p4.ws, 40, d, NULL);
    CHECK(count_diff_bits(a, d, 80) == 0 && count_diff_bits(c, d, 40) == 0);
    problem_free(&p4);
    di_cpu_kernels_force_scalar(0);
    CHECK(strcmp(di_cpu_kernels_path(), di_cpu_has_avx2() ? "avx2" : "scalar") == 0);
    problem_free(&p);
}

/* ---- thread pool ---- */

typedef struct count_ctx {
    atomic_int *hits;
    atomic_int calls;
    di_threadpool *tp;
    int bad_thread;
} count_ctx;

static void count_body(void *ctx, int64_t b, int64_t e, int thread) {
    count_ctx *c = ctx;
    if (thread < 0 || thread >= di_threadpool_size(c->tp)) c->bad_thread = 1;
    for (int64_t i = b; i < e; i++) atomic_fetch_add(&c->hits[i], 1);
    atomic_fetch_add(&c->calls, 1);
}

static void nested_body(void *ctx, int64_t b, int64_t e, int thread) {
    count_ctx *c = ctx;
    /* a nested loop on the same pool runs inline on this thread */
    for (int64_t i = b; i < e; i++) di_threadpool_for(c->tp, 1, 1, count_body, ctx);
}

static void test_threadpool(void) {
    di_err err;
    di_threadpool *tp = NULL;
    CHECK(di_threadpool_create(-1, &tp, &err) == DI_ERR_INVALID_ARG && tp == NULL);
    CHECK_STR_CONTAINS(err.msg, "thread count -1");
    CHECK(di_threadpool_create(0, &tp, &err) == DI_OK);
    CHECK_EQ_INT(di_threadpool_size(tp), di_cpu_count());
    di_threadpool_destroy(tp);
    CHECK(di_threadpool_create(3, &tp, &err) == DI_OK);
    CHECK_EQ_INT(di_threadpool_size(tp), 3);
    enum { N = 1000 };
    static atomic_int hits[N];
    for (int rep = 0; rep < 50; rep++) {
        for (int i = 0; i < N; i++) atomic_store(&hits[i], 0);
        count_ctx c = {hits, 0, tp, 0};
        di_threadpool_for(tp, N, 1 + rep % 7, count_body, &c);
        int bad = 0;
        for (int i = 0; i < N; i++) bad += atomic_load(&hits[i]) != 1;
        CHECK_EQ_INT(bad, 0);
        CHECK(!c.bad_thread);
    }
    {
        for (int i = 0; i < N; i++) atomic_store(&hits[i], 0);
        count_ctx c = {hits, 0, tp, 0};
        di_threadpool_for(tp, 10, 1, nested_body, &c);
        CHECK_EQ_INT(atomic_load(&hits[0]), 10);
        CHECK_EQ_INT(atomic_load(&c.calls), 10);
    }
    {
        count_ctx c = {hits, 0, NULL, 0};
        for (int i = 0; i < N; i++) atomic_store(&hits[i], 0);
        di_threadpool_for(NULL, N, 8, count_body, &c);
        CHECK_EQ_INT(atomic_load(&c.calls), 1);
        CHECK_EQ_INT(atomic_load(&hits[N - 1]), 1);
    }
    { /* jobs laid end to end (one empty): every index of every job once, in its own numbering */
        enum { J = 4 };
        static atomic_int jh[J][N];
        static const int64_t len[J] = {300, 0, 1, 699}; /* 1,000 in all */
        int64_t first[J + 1] = {0};
        count_ctx cs[J];
        for (int j = 0; j < J; j++) {
            first[j + 1] = first[j] + len[j];
            cs[j] = (count_ctx){jh[j], 0, tp, 0};
            for (int i = 0; i < N; i++) atomic_store(&jh[j][i], 0);
        }
        for (int rep = 0; rep < 20; rep++) {
            for (int j = 0; j < J; j++)
                for (int i = 0; i < N; i++) atomic_store(&jh[j][i], 0);
            di_threadpool_for_parts(rep % 2 ? tp : NULL, J, first, 1 + rep % 9, count_body, cs, sizeof *cs);
            int bad = 0;
            for (int j = 0; j < J; j++)
                for (int i = 0; i < N; i++) bad += atomic_load(&jh[j][i]) != (i < len[j]);
            CHECKF(bad == 0, "rep %d: %d indices of the jobs run other than once", rep, bad);
        }
        CHECK(!cs[0].bad_thread && !cs[3].bad_thread);
        CHECK_EQ_INT(atomic_load(&cs[1].calls), 0);
    }
    di_threadpool_destroy(tp);
    di_threadpool_destroy(NULL);
}

/* di_threadpool_for_stretches: every index of every job once, in its own
 * numbering, on pools of 1-5 threads, spans of 1-8 and shortest chunks of
 * 1-4; no chunk longer than span (one thread: one call a job); and a
 * thread slowed down (the caller, sleeping in each chunk) has the end of
 * its stretch taken by the other. */
typedef struct stretch_ctx {
    atomic_int *hits, *by1; /* hits per index; indices run on thread 1 */
    atomic_int calls, too_long, bad_thread;
    int64_t span;
    int threads, slow0;
} stretch_ctx;

static void stretch_body(void *ctx, int64_t b, int64_t e, int thread) {
    stretch_ctx *c = ctx;
    if (thread < 0 || thread >= c->threads) atomic_store(&c->bad_thread, 1);
    if (e - b > c->span && c->threads > 1) atomic_store(&c->too_long, 1); /* one thread: one call */
    for (int64_t i = b; i < e; i++) {
        atomic_fetch_add(&c->hits[i], 1);
        if (thread == 1) atomic_fetch_add(&c->by1[i], 1);
    }
    atomic_fetch_add(&c->calls, 1);
    if (c->slow0 && thread == 0) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
}

static void test_threadpool_stretches(void) {
    enum { N = 1000, J = 4 };
    static atomic_int jh[J][N], j1[J][N];
    static const int64_t len[][J] = {{300, 0, 1, 699}, {1, 0, 0, 0}, {7, 0, 0, 0}, {64, 8, 0, 1}, {999, 1, 0, 0}};
    static const int sizes[] = {1, 2, 3, 5};
    static const int64_t spans[][2] = {{8, 1}, {4, 1}, {1, 1}, {8, 2}, {4, 4}};
    di_err err;
    for (size_t t = 0; t < sizeof sizes / sizeof *sizes; t++) {
        di_threadpool *tp = NULL;
        if (sizes[t] > 1) CHECK(di_threadpool_create(sizes[t], &tp, &err) == DI_OK);
        for (size_t l = 0; l < sizeof len / sizeof *len; l++)
            for (size_t sp = 0; sp < sizeof spans / sizeof *spans; sp++)
                for (int rep = 0; rep < 3; rep++) {
                    int64_t first[J + 1] = {0};
                    stretch_ctx cs[J];
                    for (int j = 0; j < J; j++) {
                        first[j + 1] = first[j] + len[l][j];
                        cs[j] = (stretch_ctx){.hits = jh[j], .by1 = j1[j], .span = spans[sp][0], .threads = sizes[t]};
                        for (int i = 0; i < N; i++) atomic_store(&jh[j][i], 0);
                    }
                    di_threadpool_for_stretches(tp, J, first, spans[sp][0], spans[sp][1], stretch_body, cs,
                                                sizeof *cs);
                    int bad = 0, odd = 0;
                    for (int j = 0; j < J; j++) {
                        for (int i = 0; i < N; i++) bad += atomic_load(&jh[j][i]) != (i < len[l][j]);
                        odd += atomic_load(&cs[j].too_long) + atomic_load(&cs[j].bad_thread);
                        if (!len[l][j] || sizes[t] == 1) odd += atomic_load(&cs[j].calls) != (len[l][j] > 0);
                    }
                    CHECKF(bad == 0 && odd == 0,
                           "%d threads, jobs %lld+%lld+%lld+%lld, span %lld (least %lld): %d indices run other "
                           "than once, %d chunks too long, on a bad thread or of an empty job",
                           sizes[t], (long long)len[l][0], (long long)len[l][1], (long long)len[l][2],
                           (long long)len[l][3], (long long)spans[sp][0], (long long)spans[sp][1], bad, odd);
                }
        if (tp) di_threadpool_destroy(tp);
    }
    /* the caller sleeps 2 ms in each chunk: its stretch's end goes to the worker */
    di_threadpool *tp = NULL;
    CHECK(di_threadpool_create(2, &tp, &err) == DI_OK);
    for (int i = 0; i < 64; i++) atomic_store(&jh[0][i], 0), atomic_store(&j1[0][i], 0);
    int64_t first[2] = {0, 64};
    stretch_ctx c = {.hits = jh[0], .by1 = j1[0], .span = 4, .threads = 2, .slow0 = 1};
    di_threadpool_for_stretches(tp, 1, first, 4, 1, stretch_body, &c, sizeof c);
    int once = 0, taken = 0, own = 0;
    for (int i = 0; i < 64; i++) {
        once += atomic_load(&jh[0][i]) == 1;
        if (i < 32) taken += atomic_load(&j1[0][i]);
        else own += atomic_load(&j1[0][i]);
    }
    CHECK_EQ_INT(once, 64);
    CHECKF(taken > 0 && own > 16, "worker ran %d of the caller's stretch and %d of its own", taken, own);
    di_threadpool_destroy(tp);
}

int main(void) {
    /* a kernel that reads scratch it did not write this call gives NaN,
     * not the (often equal) values a previous call left there */
    di_cpu_kernels_poison_buffers(1);
    RUN(test_threadpool);
    RUN(test_threadpool_stretches);
    RUN(test_act_quant_scalar);
    RUN(test_act_quant_avx2);
    RUN(test_gemm_fp8);
    RUN(test_gemm_fp8_prefill_shapes);
    RUN(test_gemm_fp8_prefill_threads);
    RUN(test_gemm_plain_row_split);
    RUN(test_gemm_mxfp4);
    RUN(test_gemm_mxfp4_prefill_shapes);
    RUN(test_prefill_threaded_pack);
    RUN(test_gemm_bf16);
    RUN(test_gemm_bf16_rows);
    RUN(test_gemm_f32);
    RUN(test_gemm_extreme_scales);
    RUN(test_gemm_decode_rows);
    RUN(test_gemm_decode_all_scales);
    RUN(test_gemm_fp8_fold_edges);
    RUN(test_gemm_fp8_tiny_scales);
    RUN(test_mxfp4_group_sums_exact);
    RUN(test_gemm_mxfp4_small_codes);
    RUN(test_gemm_mxfp4_scale_edges);
    RUN(test_gemm_mxfp4_large_weight_scales);
    RUN(test_gemm_mxfp4_tiny_scales);
    RUN(test_gemm_mxfp4_largest_sums);
    RUN(test_gemm_mxfp4_decode_act_limits);
    RUN(test_batch_and_thread_invariance);
    RUN(test_half_route);
    RUN(test_shift_route);
    RUN(test_dec_prefetch_route);
    RUN(test_pf_decide);
    RUN(test_pf_measured);
    RUN(test_gemm_decode_spans);
    RUN(test_gemm_mxfp4_decode_spans);
    RUN(test_narrow_route);
    RUN(test_bias_route);
    RUN(test_seg_route);
    RUN(test_gemm_mxfp4_many);
    RUN(test_gemm_fp8_many);
    RUN(test_vnni_route);
    RUN(test_amx_route);
    RUN(test_no_amx_route);
    RUN(test_dispatch);
    return test_summary();
}
