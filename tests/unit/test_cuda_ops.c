/* CUDA ops against the CPU's scalar kernels (src/backend/cpu/kernels.h) and
 * an exact double-precision reference (architecture.md §2 numerics): FP8
 * activation quantization (byte for byte), FP8 and MXFP4 GEMMs on every
 * kernel path, over many shapes including odd ones, on fresh random inputs.
 * Outputs are poisoned with NaN before every run so an element the kernel
 * never writes fails the check. Without a GPU (or without CUDA in the build)
 * every test skips with the reason. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "test.h"
#include "test_rng.h"

static int have_gpu = -1;
static char gpu_why[DI_ERR_MSG_MAX];

static int gpu_ready(void) {
    if (have_gpu < 0) {
        di_err err = {0};
        have_gpu = di_cuda_init(0, &err) == DI_OK;
        if (!have_gpu) snprintf(gpu_why, sizeof gpu_why, "%s", err.msg);
    }
    return have_gpu;
}

/* ---- random inputs (tests/unit/test_rng.h; a fresh seed per run, printed first) */

/* Activations; each 32-block gets its own magnitude (2^-20 .. 2^12) so
 * scales vary, and some blocks are all zero or tiny (below the 1e-4 floor).
 * xf holds the values as fp32 (bf16-rounded when xb is given, which receives
 * the bf16 bits). */
static void fill_act(float *xf, uint16_t *xb, int64_t m, int64_t k) {
    for (int64_t r = 0; r < m; r++)
        for (int64_t b = 0; b < k; b += 32) {
            int kind = (int)(rng_next() % 16);
            float mag = ldexpf(1.0f, (int)(rng_next() % 33) - 20);
            for (int64_t i = b; i < b + 32 && i < k; i++) {
                float v = kind == 0 ? 0.0f : kind == 1 ? 1e-6f * rng_normal() : mag * rng_normal();
                if (xb) {
                    xb[r * k + i] = di_f32_to_bf16(v);
                    v = di_bf16_to_f32(xb[r * k + i]);
                }
                xf[r * k + i] = v;
            }
        }
}

static uint8_t rand_e4m3(void) {
    for (;;) {
        uint8_t b = (uint8_t)rng_next();
        if ((b & 0x7f) != 0x7f) return b;
    }
}

/* ---- scalar references */

/* FP8 activation quantization per 32 (architecture.md §2), written out here
 * for any k (the CPU op needs k % 32 == 0; where it applies the two are
 * checked against each other). */
static void ref_act_quant(const float *x, int64_t m, int64_t k, uint8_t *q, float *s) {
    int64_t kbn = (k + 31) / 32;
    for (int64_t r = 0; r < m; r++)
        for (int64_t b = 0; b < kbn; b++) {
            int64_t k0 = b * 32, k1 = k0 + 32 < k ? k0 + 32 : k;
            float amax = 0.0f;
            for (int64_t i = k0; i < k1; i++) amax = fmaxf(amax, fabsf(x[r * k + i]));
            amax = fmaxf(amax, 1e-4f);
            uint32_t bits = di_f32_bits(amax * (1.0f / 448.0f));
            uint32_t e = (bits >> 23) & 0xffu;
            if (bits & 0x7fffffu) e++;
            float sc = di_bits_f32(e << 23);
            s[r * kbn + b] = sc;
            for (int64_t i = k0; i < k1; i++) {
                float v = x[r * k + i] / sc;
                v = fminf(fmaxf(v, -448.0f), 448.0f);
                q[r * k + i] = di_f32_to_e4m3(v);
            }
        }
}

/* Weight element (row j, column i) as a value without its block scale, and
 * that scale. fmt 0: FP8 e4m3 [n, k] + E8M0 [ceil(n/32), kbn]; fmt 1: MXFP4
 * [n, k/2] + E8M0 [n, kbn]. */
static double w_value(int fmt, const uint8_t *w, int64_t k, int64_t j, int64_t i) {
    if (fmt == 0) return di_cpu_e4m3_table()[w[j * k + i]];
    uint8_t byte = w[j * (k / 2) + i / 2];
    return di_e2m1_to_f32((i & 1) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 15));
}
static double w_scale(int fmt, const uint8_t *ws, int64_t kbn, int64_t j, int64_t b) {
    return di_cpu_e8m0_table()[fmt == 0 ? ws[(j / 32) * kbn + b] : ws[j * kbn + b]];
}

/* ref[i, j] = sum_b sa sw (sum_{k in b} qa w), in double: the products are
 * exact and so are the 32-term block sums. bound[i, j] is the rounding budget
 * of the GPU's arithmetic (see check_gemm). */
static void ref_gemm(int fmt, const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                     const uint8_t *w, const uint8_t *ws, int64_t n, double *ref, double *bound,
                     double *abs_sum) {
    int64_t kbn = (k + 31) / 32;
    const float *e4m3 = di_cpu_e4m3_table();
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < n; j++) {
            double acc = 0.0, sum_abs = 0.0, sum_max = 0.0;
            for (int64_t b = 0; b < kbn; b++) {
                double part = 0.0, mx = 0.0, abs_part = 0.0;
                for (int64_t i = b * 32; i < b * 32 + 32 && i < k; i++) {
                    double p = (double)e4m3[qa[r * k + i]] * w_value(fmt, w, k, j, i);
                    part += p;
                    abs_part += fabs(p);
                    if (fabs(p) > mx) mx = fabs(p);
                }
                double sc = (double)sa[r * kbn + b] * w_scale(fmt, ws, kbn, j, b);
                acc += part * sc;
                sum_abs += abs_part * sc;
                sum_max += mx * sc;
            }
            ref[r * n + j] = acc;
            /* FP8 tensor cores add a 32-block's exact products with a short
             * adder (about 13 fraction bits below the largest addend, per
             * DeepGEMM's notes): at most 32 * 2^-13 * max|p| = 2^-8 max|p| per
             * block. The promotion is an fp32 FMA per block: at most
             * kbn * 2^-24 of the running magnitude, bounded by sum|p|. */
            bound[r * n + j] = ldexp(sum_max, -8) + (double)(kbn + 2) * ldexp(sum_abs, -24);
            abs_sum[r * n + j] = sum_abs;
        }
}

/* ---- device buffers */

typedef struct dbuf { void *p; size_t n; } dbuf;
static dbuf dput(const void *host, size_t n) {
    dbuf d = {NULL, n};
    di_err err = {0};
    if (di_cuda_alloc(&d.p, n, &err) != DI_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    if (host && di_cuda_upload(d.p, host, n, &err) != DI_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    return d;
}
static void dget(void *host, dbuf d) {
    di_err err = {0};
    if (di_cuda_download(host, d.p, d.n, &err) != DI_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
}

/* ---- tests */

static void test_act_quant(void) {
    if (!gpu_ready()) SKIP("%s", gpu_why);
    const int64_t shapes[][2] = {{1, 32}, {3, 100}, {7, 5120}, {16, 33}, {5, 1}, {64, 4096},
                                 {2, 31}, {9, 1280}, {1, 8192}};
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++)
        for (int as_bf16 = 0; as_bf16 < 2; as_bf16++) {
            int64_t m = shapes[c][0], k = shapes[c][1], kbn = (k + 31) / 32;
            float *xf = malloc((size_t)(m * k) * 4);
            uint16_t *xb = malloc((size_t)(m * k) * 2);
            uint8_t *q = malloc((size_t)(m * k)), *gq = malloc((size_t)(m * k));
            float *s = malloc((size_t)(m * kbn) * 4), *gs = malloc((size_t)(m * kbn) * 4);
            fill_act(xf, as_bf16 ? xb : NULL, m, k);
            ref_act_quant(xf, m, k, q, s);
            if (k % 32 == 0) { /* the CPU op itself, where its contract allows */
                uint8_t *cq = malloc((size_t)(m * k));
                float *cs = malloc((size_t)(m * kbn) * 4);
                di_act_quant_fp8_scalar(xf, m, k, cq, cs);
                CHECKF(memcmp(cq, q, (size_t)(m * k)) == 0 &&
                           memcmp(cs, s, (size_t)(m * kbn) * 4) == 0,
                       "[%lld, %lld]: CPU op and the reference here disagree", (long long)m,
                       (long long)k);
                free(cq);
                free(cs);
            }
            dbuf dx = as_bf16 ? dput(xb, (size_t)(m * k) * 2) : dput(xf, (size_t)(m * k) * 4);
            dbuf dq = dput(NULL, (size_t)(m * k)), ds = dput(NULL, (size_t)(m * kbn) * 4);
            di_err err = {0};
            CHECK(di_cuda_fill(dq.p, 0xff, dq.n, &err) == DI_OK);
            CHECK(di_cuda_fill(ds.p, 0xff, ds.n, &err) == DI_OK);
            di_status st = di_cuda_act_quant_fp8(dx.p, as_bf16 ? DI_DTYPE_BF16 : DI_DTYPE_F32, m,
                                                 k, dq.p, ds.p, NULL, &err);
            if (st == DI_OK) st = di_cuda_synchronize(&err);
            CHECKF(st == DI_OK, "%s", err.msg);
            dget(gq, dq);
            dget(gs, ds);
            int64_t bad_q = 0, bad_s = 0, first = -1;
            for (int64_t i = 0; i < m * k; i++)
                if (q[i] != gq[i]) { bad_q++; if (first < 0) first = i; }
            for (int64_t i = 0; i < m * kbn; i++)
                if (di_f32_bits(s[i]) != di_f32_bits(gs[i])) bad_s++;
            CHECKF(bad_q == 0 && bad_s == 0,
                   "%s [%lld, %lld]: %lld codes and %lld scales differ (first code %lld: cpu %02x "
                   "gpu %02x)",
                   as_bf16 ? "bf16" : "f32", (long long)m, (long long)k, (long long)bad_q,
                   (long long)bad_s, (long long)first, first >= 0 ? q[first] : 0,
                   first >= 0 ? gq[first] : 0);
            di_cuda_free(dx.p);
            di_cuda_free(dq.p);
            di_cuda_free(ds.p);
            free(xf); free(xb); free(q); free(gq); free(s); free(gs);
        }
}

/* Runs one GEMM on the GPU (fmt 0 FP8, 1 MXFP4) over random inputs and
 * compares every element with the exact result: |gpu - ref| <= bound (+ half
 * a bf16 ulp of |ref| for bf16 output); when k % 32 == 0 also with the CPU's
 * scalar op, which may be off by (k/8 + 6) * 2^-24 * sum|terms| (FP8's bound
 * in backend/cpu/kernels.h; MXFP4's there, (k/32 + 4), is tighter, so the
 * FP8 one holds for both).
 * Returns the largest error / bound seen. */
static double check_gemm(int fmt, int64_t m, int64_t n, int64_t k, di_cuda_gemm_path path,
                         di_dtype out_dtype) {
    int64_t kbn = (k + 31) / 32;
    size_t wbytes = fmt == 0 ? (size_t)(n * k) : (size_t)(n * (k / 2));
    size_t sbytes = fmt == 0 ? (size_t)(((n + 31) / 32) * kbn) : (size_t)(n * kbn);
    float *x = malloc((size_t)(m * k) * 4 + 4);
    uint8_t *qa = malloc((size_t)(m * k) + 1), *w = malloc(wbytes + 1), *ws = malloc(sbytes + 1);
    float *sa = malloc((size_t)(m * kbn) * 4 + 4), *cpu = malloc((size_t)(m * n) * 4 + 4);
    double *ref = malloc((size_t)(m * n) * 8 + 8), *bound = malloc((size_t)(m * n) * 8 + 8);
    double *abs_sum = malloc((size_t)(m * n) * 8 + 8);
    size_t osz = out_dtype == DI_DTYPE_BF16 ? 2 : 4;
    void *out = malloc((size_t)(m * n) * osz + 4);
    fill_act(x, NULL, m, k);
    ref_act_quant(x, m, k, qa, sa);
    for (size_t i = 0; i < wbytes; i++) w[i] = fmt == 0 ? rand_e4m3() : (uint8_t)rng_next();
    for (size_t i = 0; i < sbytes; i++) ws[i] = (uint8_t)(127 - 12 + rng_next() % 20);
    ref_gemm(fmt, qa, sa, m, k, w, ws, n, ref, bound, abs_sum);
    int with_cpu = k % 32 == 0;
    if (with_cpu) {
        if (fmt == 0) di_gemm_fp8_scalar(qa, sa, m, k, w, ws, n, cpu, NULL);
        else di_gemm_mxfp4_scalar(qa, sa, m, k, w, ws, n, cpu, NULL);
    }

    dbuf dqa = dput(qa, (size_t)(m * k)), dsa = dput(sa, (size_t)(m * kbn) * 4),
         dw = dput(w, wbytes), dws = dput(ws, sbytes), dout = dput(NULL, (size_t)(m * n) * osz);
    di_err err = {0};
    CHECK(di_cuda_fill(dout.p, 0xff, dout.n, &err) == DI_OK); /* NaN in f32 and bf16 */
    di_status st = fmt == 0 ? di_cuda_gemm_fp8(dqa.p, dsa.p, m, k, dw.p, dws.p, n, dout.p,
                                               out_dtype, path, NULL, &err)
                            : di_cuda_gemm_mxfp4(dqa.p, dsa.p, m, k, dw.p, dws.p, n, dout.p,
                                                 out_dtype, path, NULL, &err);
    double worst = 0.0;
    if (st == DI_OK) st = di_cuda_synchronize(&err);
    CHECKF(st == DI_OK, "%s m=%lld n=%lld k=%lld: %s", fmt ? "mxfp4" : "fp8", (long long)m,
           (long long)n, (long long)k, err.msg);
    if (st == DI_OK) {
        dget(out, dout);
        int64_t bad = 0, bad_cpu = 0, first = -1;
        double num = 0.0, den = 0.0;
        for (int64_t i = 0; i < m * n; i++) {
            double g = out_dtype == DI_DTYPE_BF16 ? di_bf16_to_f32(((uint16_t *)out)[i])
                                                  : ((float *)out)[i];
            double tol = bound[i] + (out_dtype == DI_DTYPE_BF16 ? ldexp(fabs(ref[i]), -8) : 0.0);
            double e = fabs(g - ref[i]);
            if (!(e <= tol)) { bad++; if (first < 0) first = i; }
            if (tol > 0 && e / tol > worst) worst = e / tol;
            if (with_cpu) {
                double cpu_tol = (double)(k / 8 + 6) * ldexp(abs_sum[i], -24);
                if (!(fabs(g - cpu[i]) <= tol + cpu_tol)) bad_cpu++;
                if (!(fabs(cpu[i] - ref[i]) <= cpu_tol)) bad_cpu++;
            }
            num += e * e;
            den += ref[i] * ref[i];
        }
        CHECKF(bad == 0,
               "%s path %d m=%lld n=%lld k=%lld %s: %lld of %lld wrong; first [%lld, %lld] gpu %.9g "
               "ref %.9g bound %.3g",
               fmt ? "mxfp4" : "fp8", (int)path, (long long)m, (long long)n, (long long)k,
               di_dtype_name(out_dtype), (long long)bad, (long long)(m * n),
               (long long)(first / n), (long long)(first % n),
               out_dtype == DI_DTYPE_BF16 ? di_bf16_to_f32(((uint16_t *)out)[first])
                                          : ((float *)out)[first],
               ref[first], bound[first]);
        /* The per-element bound above is worst-case; on random data the f32
         * output must also be close in aggregate, while one wrong 32-block
         * alone would show as ~1/sqrt(kbn) > 1e-2. */
        double rel = den > 0 ? sqrt(num / den) : 0.0;
        /* wgmma's FP8 adder keeps fewer bits than mma.sync's: measured 1.1e-4
         * (about 2^-13, the "14-bit accumulation" DeepGEMM reports) against
         * ~1e-7 for the mma.sync kernels; the limits leave a 4x margin. FP8
         * runs on wgmma in the tiled kernel and, for decode batches with
         * k % 128 == 0, FP8 and MXFP4 in the matrix-vector kernels too. */
        int tiled = (fmt == 0 && (path == DI_CUDA_GEMM_TILED || (path == DI_CUDA_GEMM_AUTO && m > 16))) ||
                    (m <= 16 && k % 128 == 0);
        /* Only over enough outputs for the mean square to settle: with a
         * handful (m = 5, n = 1) one output whose terms cancel carries the
         * whole ratio (4.96e-4 seen once on wgmma against the 4.88e-4
         * limit, every element inside its own bound); those shapes keep
         * the per-element check above. */
        if (out_dtype == DI_DTYPE_F32 && m * n >= 64)
            CHECKF(rel <= ldexp(1.0, tiled ? -11 : -16), "%s path %d m=%lld n=%lld k=%lld: relative L2 error %.3g",
                   fmt ? "mxfp4" : "fp8", (int)path, (long long)m, (long long)n, (long long)k, rel);
        CHECKF(bad_cpu == 0, "%s path %d m=%lld n=%lld k=%lld: %lld disagreements with the CPU op",
               fmt ? "mxfp4" : "fp8", (int)path, (long long)m, (long long)n, (long long)k,
               (long long)bad_cpu);
        if (getenv("DI_TEST_VERBOSE"))
            fprintf(stderr, "  %s path %d %lldx%lldx%lld %s: max err/bound %.3g, rel L2 %.3g\n",
                    fmt ? "mxfp4" : "fp8", (int)path, (long long)m, (long long)n, (long long)k,
                    di_dtype_name(out_dtype), worst, rel);
    }
    di_cuda_free(dqa.p); di_cuda_free(dsa.p); di_cuda_free(dw.p); di_cuda_free(dws.p);
    di_cuda_free(dout.p);
    free(x); free(qa); free(w); free(ws); free(sa); free(cpu); free(ref); free(bound);
    free(abs_sum); free(out);
    return worst;
}

static void test_gemm_fp8_matvec(void) {
    if (!gpu_ready()) SKIP("%s", gpu_why);
    const int64_t ms[] = {1, 2, 5, 8, 9, 16, 17, 33};
    const int64_t ns[] = {1, 7, 8, 37, 100, 256, 1000};
    const int64_t ks[] = {32, 64, 96, 100, 128, 512, 1280, 5120, 31};
    double worst = 0;
    for (size_t a = 0; a < sizeof ms / sizeof *ms; a++)
        for (size_t b = 0; b < sizeof ns / sizeof *ns; b++) {
            int64_t k = ks[(a * 7 + b * 3) % (sizeof ks / sizeof *ks)];
            if (ms[a] * ns[b] * k > 40000000) k = 512;
            double e = check_gemm(0, ms[a], ns[b], k, DI_CUDA_GEMM_MATVEC,
                                  (a + b) % 2 ? DI_DTYPE_BF16 : DI_DTYPE_F32);
            if (e > worst) worst = e;
        }
    /* 110 row tiles of 64: the wgmma kernel splits k over clusters of 2 */
    double e2 = check_gemm(0, 3, 7000, 256, DI_CUDA_GEMM_MATVEC, DI_DTYPE_F32);
    if (e2 > worst) worst = e2;
    printf("fp8 matvec: largest error / bound %.3g\n", worst);
}

static void test_gemm_fp8_tiled(void) {
    if (!gpu_ready()) SKIP("%s", gpu_why);
    const int64_t shapes[][3] = {{128, 128, 128}, {17, 128, 128}, {1, 37, 256},
                                 {200, 200, 256},  {257, 160, 1280}, {5, 1000, 512},
                                 {150, 130, 5120}, {129, 1, 128},    {64, 96, 384}};
    double worst = 0;
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        double e = check_gemm(0, shapes[c][0], shapes[c][1], shapes[c][2], DI_CUDA_GEMM_TILED,
                              c % 2 ? DI_DTYPE_BF16 : DI_DTYPE_F32);
        if (e > worst) worst = e;
    }
    /* AUTO on a prefill shape takes the tiled kernel */
    double e = check_gemm(0, 96, 160, 640, DI_CUDA_GEMM_AUTO, DI_DTYPE_F32);
    if (e > worst) worst = e;
    printf("fp8 tiled: largest error / bound %.3g\n", worst);
}

/* Which kernel AUTO takes for FP8 past 16 rows (cuda_gemm.cu
 * fp8_tiles_pay): a few rows (<= 64) of a matrix of fewer than 20 tiles of
 * 128 outputs go to the matrix-vector kernels, the rest to the tiles. The
 * two give different bits (the tensor cores' FP8 adder against mma.sync), so
 * AUTO must equal the path the rule names, bit for bit; the bound of the
 * exact sum is checked through AUTO too. */
static void test_gemm_fp8_narrow(void) {
    if (!gpu_ready()) SKIP("%s", gpu_why);
    const struct { int64_t m, n, k; di_cuda_gemm_path same; } cs[] = {
        {40, 512, 1280, DI_CUDA_GEMM_MATVEC}, {64, 2432, 256, DI_CUDA_GEMM_MATVEC},
        {40, 2560, 256, DI_CUDA_GEMM_TILED},  {65, 512, 1280, DI_CUDA_GEMM_TILED}};
    for (size_t c = 0; c < sizeof cs / sizeof *cs; c++) {
        const int64_t m = cs[c].m, n = cs[c].n, k = cs[c].k, kbn = k / 32;
        float *x = malloc((size_t)(m * k) * 4), *sa = malloc((size_t)(m * kbn) * 4);
        uint8_t *qa = malloc((size_t)(m * k)), *w = malloc((size_t)(n * k)), *ws = malloc((size_t)((n + 31) / 32 * kbn));
        float *oa = malloc((size_t)(m * n) * 4), *ob = malloc((size_t)(m * n) * 4);
        fill_act(x, NULL, m, k);
        ref_act_quant(x, m, k, qa, sa);
        for (int64_t i = 0; i < n * k; i++) w[i] = rand_e4m3();
        for (int64_t i = 0; i < (n + 31) / 32 * kbn; i++) ws[i] = (uint8_t)(120 + rng_next() % 10);
        dbuf dqa = dput(qa, (size_t)(m * k)), dsa = dput(sa, (size_t)(m * kbn) * 4), dw = dput(w, (size_t)(n * k)),
             dws = dput(ws, (size_t)((n + 31) / 32 * kbn)), dout = dput(NULL, (size_t)(m * n) * 4);
        di_err err = {0};
        int ok = 1;
        for (int run = 0; run < 2 && ok; run++) {
            ok = di_cuda_fill(dout.p, 0xff, dout.n, &err) == DI_OK &&
                 di_cuda_gemm_fp8(dqa.p, dsa.p, m, k, dw.p, dws.p, n, dout.p, DI_DTYPE_F32,
                                  run ? cs[c].same : DI_CUDA_GEMM_AUTO, NULL, &err) == DI_OK &&
                 di_cuda_synchronize(&err) == DI_OK;
            if (ok) dget(run ? ob : oa, dout);
        }
        CHECKF(ok, "fp8 narrow case %zu: %s", c, err.msg);
        CHECKF(!ok || memcmp(oa, ob, (size_t)(m * n) * 4) == 0, "fp8 %lldx%lldx%lld: AUTO is not the %s path", (long long)m,
               (long long)n, (long long)k, cs[c].same == DI_CUDA_GEMM_TILED ? "tiled" : "matrix-vector");
        dbuf all[] = {dqa, dsa, dw, dws, dout};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) di_cuda_free(all[i].p);
        free(x); free(sa); free(qa); free(w); free(ws); free(oa); free(ob);
    }
    double e = check_gemm(0, 40, 512, 1280, DI_CUDA_GEMM_AUTO, DI_DTYPE_BF16);
    printf("fp8 narrow rows: AUTO takes the named path; largest error / bound %.3g\n", e);
}

static void test_gemm_mxfp4(void) {
    if (!gpu_ready()) SKIP("%s", gpu_why);
    const int64_t ms[] = {1, 3, 8, 16, 20};
    const int64_t ns[] = {1, 9, 64, 300};
    const int64_t ks[] = {2, 30, 32, 64, 100, 128, 2304, 5120};
    double worst = 0;
    for (size_t a = 0; a < sizeof ms / sizeof *ms; a++)
        for (size_t b = 0; b < sizeof ns / sizeof *ns; b++)
            for (size_t c = (a + b) % 2; c < sizeof ks / sizeof *ks; c += 2) {
                if (ms[a] * ns[b] * ks[c] > 20000000) continue;
                double e = check_gemm(1, ms[a], ns[b], ks[c], DI_CUDA_GEMM_AUTO,
                                      c % 3 ? DI_DTYPE_F32 : DI_DTYPE_BF16);
                if (e > worst) worst = e;
            }
    double e2 = check_gemm(1, 2, 7000, 256, DI_CUDA_GEMM_AUTO, DI_DTYPE_BF16); /* clusters of 2 */
    if (e2 > worst) worst = e2;
    printf("mxfp4 matvec: largest error / bound %.3g\n", worst);
}

/* The MoE form: 12 tokens, each routed to expert 0 (one group larger than a
 * token tile) and two other distinct experts out of 5; groups listed in a
 * shuffled expert order. Every (token, expert) output row must equal, bit for
 * bit, the plain product of that token's row with that expert, and both must
 * match the exact reference. */
/* MoE inputs: T activation rows, quantized (qa [T, k], sa [T, k/32]), and E
 * random MXFP4 experts (w [E, n, k/2], ws [E, n, k/32] of 2^-8 .. 2^3). */
static void moe_inputs(int64_t T, int64_t k, int64_t n, int64_t E, float **x, float **sa,
                       uint8_t **qa, uint8_t **w, uint8_t **ws) {
    const int64_t kbn = k / 32;
    const size_t wb = (size_t)(n * k / 2) * (size_t)E, sb = (size_t)(n * kbn) * (size_t)E;
    *x = malloc((size_t)(T * k) * 4);
    *sa = malloc((size_t)(T * kbn) * 4);
    *qa = malloc((size_t)(T * k));
    *w = malloc(wb);
    *ws = malloc(sb);
    fill_act(*x, NULL, T, k);
    ref_act_quant(*x, T, k, *qa, *sa);
    for (size_t i = 0; i < wb; i++) (*w)[i] = (uint8_t)rng_next();
    for (size_t i = 0; i < sb; i++) (*ws)[i] = (uint8_t)(127 - 8 + rng_next() % 12);
}

static void test_gemm_mxfp4_grouped(void) {
    if (!gpu_ready()) SKIP("%s", gpu_why);
    const int64_t E = 5, T = 12, n = 300, k = 640, kbn = k / 32;
    const size_t wb = (size_t)(n * k / 2), sb = (size_t)(n * kbn);
    float *x, *sa;
    uint8_t *qa, *w, *ws;
    moe_inputs(T, k, n, E, &x, &sa, &qa, &w, &ws);
    /* routing: token t -> expert 0 and two distinct others */
    int route[12][3];
    for (int t = 0; t < T; t++) {
        route[t][0] = 0;
        route[t][1] = 1 + (int)(rng_next() % 4);
        do route[t][2] = 1 + (int)(rng_next() % 4); while (route[t][2] == route[t][1]);
    }
    int32_t order[5] = {3, 0, 4, 1, 2}, ids[5], off[6], rows[36], pair_tok[36], pair_exp[36];
    int32_t ng = 0, np = 0, max_rows = 0;
    off[0] = 0;
    for (int oi = 0; oi < E; oi++) {
        int e = order[oi], cnt = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < 3; j++)
                if (route[t][j] == e) { rows[np] = t; pair_tok[np] = t; pair_exp[np] = e; np++; cnt++; }
        if (!cnt) continue;
        ids[ng] = e;
        off[++ng] = np;
        if (cnt > max_rows) max_rows = cnt;
    }
    dbuf dqa = dput(qa, (size_t)(T * k)), dsa = dput(sa, (size_t)(T * kbn) * 4),
         dw = dput(w, wb * E), dws = dput(ws, sb * E), dids = dput(ids, (size_t)ng * 4),
         doff = dput(off, (size_t)(ng + 1) * 4), drows = dput(rows, (size_t)np * 4),
         dout = dput(NULL, (size_t)(np * n) * 4), d1 = dput(NULL, (size_t)n * 4);
    float *out = malloc((size_t)(np * n) * 4), *o1 = malloc((size_t)n * 4);
    double *ref = malloc((size_t)n * 8), *bound = malloc((size_t)n * 8), *abs_sum = malloc((size_t)n * 8);
    di_err err = {0};
    CHECK(di_cuda_fill(dout.p, 0xff, dout.n, &err) == DI_OK);
    di_status st = di_cuda_gemm_mxfp4_grouped(dqa.p, dsa.p, k, dw.p, dws.p, n, dids.p, doff.p, ng,
                                              drows.p, max_rows, dout.p, DI_DTYPE_F32, NULL, &err);
    if (st == DI_OK) st = di_cuda_synchronize(&err);
    CHECKF(st == DI_OK, "%s", err.msg);
    dget(out, dout);
    int64_t bad = 0, differ = 0;
    for (int p = 0; p < np; p++) {
        const uint8_t *we = w + (size_t)pair_exp[p] * wb, *wse = ws + (size_t)pair_exp[p] * sb;
        int t = pair_tok[p];
        ref_gemm(1, qa + (size_t)t * k, sa + (size_t)t * kbn, 1, k, we, wse, n, ref, bound, abs_sum);
        st = di_cuda_gemm_mxfp4((const uint8_t *)dqa.p + (size_t)t * k,
                                (const float *)dsa.p + (size_t)t * kbn, 1, k,
                                (const uint8_t *)dw.p + (size_t)pair_exp[p] * wb,
                                (const uint8_t *)dws.p + (size_t)pair_exp[p] * sb, n, d1.p,
                                DI_DTYPE_F32, DI_CUDA_GEMM_AUTO, NULL, &err);
        if (st == DI_OK) st = di_cuda_synchronize(&err);
        CHECKF(st == DI_OK, "%s", err.msg);
        dget(o1, d1);
        for (int64_t j = 0; j < n; j++) {
            float g = out[(size_t)p * n + j];
            if (!(fabs(g - ref[j]) <= bound[j])) bad++;
            if (memcmp(&g, &o1[j], 4)) differ++;
        }
    }
    CHECKF(bad == 0, "grouped mxfp4: %lld of %lld outputs off the exact result", (long long)bad,
           (long long)(np * n));
    CHECKF(differ == 0, "grouped mxfp4: %lld outputs differ from the plain product", (long long)differ);
    /* a bad k is refused, not run */
    CHECK(di_cuda_gemm_mxfp4_grouped(dqa.p, dsa.p, 100, dw.p, dws.p, n, dids.p, doff.p, ng,
                                     drows.p, max_rows, dout.p, DI_DTYPE_F32, NULL,
                                     &err) == DI_ERR_INVALID_ARG);
    dbuf all[] = {dqa, dsa, dw, dws, dids, doff, drows, dout, d1};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) di_cuda_free(all[i].p);
    free(x); free(sa); free(qa); free(w); free(ws); free(out); free(o1); free(ref); free(bound);
    free(abs_sum);
}

/* A row's result must not depend on the other rows of the batch, nor on the
 * run: m = 1 and m = 13 (other kernel specialisation) agree bit for bit. */
static void test_batch_invariance(void) {
    if (!gpu_ready()) SKIP("%s", gpu_why);
    for (int fmt = 0; fmt < 2; fmt++) {
        int64_t m = 13, n = 200, k = 1280, kbn = k / 32;
        size_t wbytes = fmt == 0 ? (size_t)(n * k) : (size_t)(n * k / 2);
        size_t sbytes = fmt == 0 ? (size_t)(((n + 31) / 32) * kbn) : (size_t)(n * kbn);
        float *x = malloc((size_t)(m * k) * 4);
        uint8_t *qa = malloc((size_t)(m * k)), *w = malloc(wbytes), *ws = malloc(sbytes);
        float *sa = malloc((size_t)(m * kbn) * 4), *o1 = malloc((size_t)n * 4),
              *om = malloc((size_t)(m * n) * 4), *om2 = malloc((size_t)(m * n) * 4);
        fill_act(x, NULL, m, k);
        ref_act_quant(x, m, k, qa, sa);
        for (size_t i = 0; i < wbytes; i++) w[i] = fmt == 0 ? rand_e4m3() : (uint8_t)rng_next();
        for (size_t i = 0; i < sbytes; i++) ws[i] = (uint8_t)(120 + rng_next() % 10);
        dbuf dqa = dput(qa, (size_t)(m * k)), dsa = dput(sa, (size_t)(m * kbn) * 4),
             dw = dput(w, wbytes), dws = dput(ws, sbytes), dout = dput(NULL, (size_t)(m * n) * 4);
        di_err err = {0};
        di_status (*gemm)(const uint8_t *, const float *, int64_t, int64_t, const uint8_t *,
                          const uint8_t *, int64_t, void *, di_dtype, di_cuda_gemm_path, void *,
                          di_err *) = fmt == 0 ? di_cuda_gemm_fp8 : di_cuda_gemm_mxfp4;
        int ok = gemm(dqa.p, dsa.p, m, k, dw.p, dws.p, n, dout.p, DI_DTYPE_F32,
                      DI_CUDA_GEMM_AUTO, NULL, &err) == DI_OK;
        ok = ok && di_cuda_synchronize(&err) == DI_OK;
        dget(om, dout);
        ok = ok && gemm(dqa.p, dsa.p, m, k, dw.p, dws.p, n, dout.p, DI_DTYPE_F32,
                        DI_CUDA_GEMM_AUTO, NULL, &err) == DI_OK;
        ok = ok && di_cuda_synchronize(&err) == DI_OK;
        dget(om2, dout);
        ok = ok && gemm((const uint8_t *)dqa.p + 4 * k, (const float *)dsa.p + 4 * kbn, 1, k,
                        dw.p, dws.p, n, dout.p, DI_DTYPE_F32, DI_CUDA_GEMM_AUTO, NULL,
                        &err) == DI_OK;
        ok = ok && di_cuda_synchronize(&err) == DI_OK;
        CHECKF(ok, "%s", err.msg);
        dbuf d1 = {dout.p, (size_t)n * 4};
        dget(o1, d1);
        CHECKF(memcmp(om, om2, (size_t)(m * n) * 4) == 0, "%s: two runs differ",
               fmt ? "mxfp4" : "fp8");
        CHECKF(memcmp(o1, om + 4 * n, (size_t)n * 4) == 0, "%s: row 4 alone != row 4 of 13",
               fmt ? "mxfp4" : "fp8");
        if (fmt == 0) { /* the tiled kernel: the same bits run after run, too */
            ok = gemm(dqa.p, dsa.p, m, k, dw.p, dws.p, n, dout.p, DI_DTYPE_F32,
                      DI_CUDA_GEMM_TILED, NULL, &err) == DI_OK;
            ok = ok && di_cuda_synchronize(&err) == DI_OK;
            dget(om, dout);
            ok = ok && gemm(dqa.p, dsa.p, m, k, dw.p, dws.p, n, dout.p, DI_DTYPE_F32,
                            DI_CUDA_GEMM_TILED, NULL, &err) == DI_OK;
            ok = ok && di_cuda_synchronize(&err) == DI_OK;
            dget(om2, dout);
            CHECKF(ok, "%s", err.msg);
            CHECKF(memcmp(om, om2, (size_t)(m * n) * 4) == 0, "tiled fp8: two runs differ");
        }
        di_cuda_free(dqa.p); di_cuda_free(dsa.p); di_cuda_free(dw.p); di_cuda_free(dws.p);
        di_cuda_free(dout.p);
        free(x); free(qa); free(w); free(ws); free(sa); free(o1); free(om); free(om2);
    }
}

static void test_bad_arguments(void) {
    di_err err = {0};
    int n = 0;
    if (di_cuda_device_count(&n, &err) != DI_OK) {
        /* without a device the failure must say so (and not crash) */
        CHECK(n == 0);
        CHECK(err.code == DI_ERR_BACKEND || err.code == DI_ERR_UNSUPPORTED);
        CHECK(err.msg[0] != 0);
        SKIP("%s", err.msg);
    }
    CHECK(n > 0);
    if (!gpu_ready()) SKIP("%s", gpu_why);
    uint8_t b = 0;
    float f = 0;
    CHECK(di_cuda_gemm_mxfp4(&b, &f, 1, 33, &b, &b, 1, &f, DI_DTYPE_F32, DI_CUDA_GEMM_AUTO, NULL,
                             &err) == DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(err.msg, "odd");
    CHECK(di_cuda_gemm_fp8(&b, &f, 1, 32, &b, &b, 1, &f, DI_DTYPE_I8, DI_CUDA_GEMM_AUTO, NULL,
                           &err) == DI_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.msg, "output dtype");
    CHECK(di_cuda_gemm_fp8(NULL, &f, 4, 32, &b, &b, 4, &f, DI_DTYPE_F32, DI_CUDA_GEMM_AUTO, NULL,
                           &err) == DI_ERR_INVALID_ARG);
    CHECK(di_cuda_init(n + 5, &err) == DI_ERR_INVALID_ARG);
    CHECK(di_cuda_init(0, &err) == DI_OK);
}

#if defined(DI_HAVE_CUDA)
void cuda_matvec_set_grouped_ks(int ks); /* cuda_matvec.cu: blocks per tile, grouped form */
#endif

/* The grouped MXFP4 form spreads a row's k chunks over 1, 2, 4 or 8 blocks
 * (fewer, longer blocks when the experts give enough of them); whatever the
 * spread, each (token, expert) row must equal the plain product bit for bit.
 * Shapes: k = 1152 (9 stages in 8 chunks of 2: three empty chunks at the
 * end), k = 640 (5 stages in 4 chunks) and k = 2304 over 70 rows (18 stages
 * in 8 chunks of 3, two empty), groups of up to 7 rows (one 8-token tile) or
 * 11 (two 8-token tiles: the grouped form runs 8-token tiles at any
 * capacity, the plain one 16 past 8 tokens), outputs poisoned before every
 * launch. */
static void test_grouped_spread(void) {
    if (!gpu_ready()) SKIP("%s", gpu_why);
#if defined(DI_HAVE_CUDA)
    const int64_t shapes[][2] = {{200, 1152}, {300, 640}, {70, 2304}};
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        const int64_t E = 4, T = c == 1 ? 11 : 7, n = shapes[c][0], k = shapes[c][1], kbn = k / 32;
        const size_t wb = (size_t)(n * k / 2), sb = (size_t)(n * kbn);
        float *x, *sa;
        uint8_t *qa, *w, *ws;
        moe_inputs(T, k, n, E, &x, &sa, &qa, &w, &ws);
        /* expert 2 takes every token, the others a random half */
        int32_t ids[4] = {1, 2, 0, 3}, off[5], rows[44], pair_exp[44];
        int32_t np = 0, max_rows = 0;
        off[0] = 0;
        for (int g = 0; g < E; g++) {
            int cnt = 0;
            for (int t = 0; t < T; t++)
                if (ids[g] == 2 || rng_next() % 2) { rows[np] = t; pair_exp[np] = ids[g]; np++; cnt++; }
            off[g + 1] = np;
            if (cnt > max_rows) max_rows = cnt;
        }
        dbuf dqa = dput(qa, (size_t)(T * k)), dsa = dput(sa, (size_t)(T * kbn) * 4),
             dw = dput(w, wb * E), dws = dput(ws, sb * E), dids = dput(ids, sizeof ids),
             doff = dput(off, sizeof off), drows = dput(rows, (size_t)np * 4),
             dout = dput(NULL, (size_t)(np * n) * 4), d1 = dput(NULL, (size_t)n * 4);
        float *plain = malloc((size_t)(np * n) * 4), *out = malloc((size_t)(np * n) * 4);
        double *ref = malloc((size_t)n * 8), *bound = malloc((size_t)n * 8),
               *abs_sum = malloc((size_t)n * 8);
        di_err err = {0};
        int64_t bad = 0;
        for (int p = 0; p < np; p++) { /* the plain products, and the exact check */
            const int t = rows[p];
            di_status st = di_cuda_fill(d1.p, 0xff, d1.n, &err);
            if (!st)
                st = di_cuda_gemm_mxfp4((const uint8_t *)dqa.p + (size_t)t * k,
                                        (const float *)dsa.p + (size_t)t * kbn, 1, k,
                                        (const uint8_t *)dw.p + (size_t)pair_exp[p] * wb,
                                        (const uint8_t *)dws.p + (size_t)pair_exp[p] * sb, n, d1.p,
                                        DI_DTYPE_F32, DI_CUDA_GEMM_AUTO, NULL, &err);
            if (!st) st = di_cuda_synchronize(&err);
            CHECKF(st == DI_OK, "%s", err.msg);
            dget(plain + (size_t)p * n, d1);
            ref_gemm(1, qa + (size_t)t * k, sa + (size_t)t * kbn, 1, k, w + (size_t)pair_exp[p] * wb,
                     ws + (size_t)pair_exp[p] * sb, n, ref, bound, abs_sum);
            for (int64_t j = 0; j < n; j++)
                if (!(fabs(plain[(size_t)p * n + j] - ref[j]) <= bound[j])) bad++;
        }
        CHECKF(bad == 0, "plain mxfp4 n=%lld k=%lld: %lld outputs off the exact result",
               (long long)n, (long long)k, (long long)bad);
        for (int v = 0; v < 5; v++) { /* spreads 0 (chosen), 1, 2, 4, 8 */
            const int spread = v ? 1 << (v - 1) : 0;
            cuda_matvec_set_grouped_ks(spread);
            di_status st = di_cuda_fill(dout.p, 0xff, dout.n, &err);
            if (!st)
                st = di_cuda_gemm_mxfp4_grouped(dqa.p, dsa.p, k, dw.p, dws.p, n, dids.p, doff.p,
                                                (int32_t)E, drows.p, max_rows, dout.p, DI_DTYPE_F32,
                                                NULL, &err);
            if (!st) st = di_cuda_synchronize(&err);
            CHECKF(st == DI_OK, "%s", err.msg);
            dget(out, dout);
            int64_t differ = 0;
            for (int64_t i = 0; i < np * n; i++) differ += memcmp(&out[i], &plain[i], 4) != 0;
            CHECKF(differ == 0,
                   "grouped mxfp4 n=%lld k=%lld, %d blocks per tile (0 = chosen), %d rows: %lld "
                   "of %lld outputs differ from the plain product",
                   (long long)n, (long long)k, spread, (int)max_rows, (long long)differ,
                   (long long)(np * n));
        }
        cuda_matvec_set_grouped_ks(0);
        dbuf all[] = {dqa, dsa, dw, dws, dids, doff, drows, dout, d1};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) di_cuda_free(all[i].p);
        free(x); free(sa); free(qa); free(w); free(ws); free(plain); free(out);
        free(ref); free(bound); free(abs_sum);
    }
#endif
}

/* More than 16 rows in a group: the grouped form runs the tiled GEMM
 * (cuda_gemm_grouped.cu: 64-row x 128-output tiles, a persistent grid over
 * a tile table built from the offsets) when the groups average four rows
 * or more, else the mma.sync kernel (token tiles of 8); with either, every
 * (token, expert) row must be within the exact result's bound. Shapes: two
 * groups of 20 and 13 rows with an empty group between them (n = 100, k =
 * 256); five groups of up to 150 rows over three row tiles, n = 200 (a
 * partial output tile), k = 288 (a partial last stage), groups listed out
 * of expert order; outputs poisoned before each launch. */
#if defined(DI_HAVE_CUDA)
void cuda_matvec_set_grouped_tiled(int on); /* cuda_matvec.cu: 0 = mma.sync past 16 rows */
void cuda_gemm_grouped_set_form(int form);  /* cuda_gemm_grouped.cu: a form's flags (0 first form, 1 pipelined), -1 choose */
#endif
static void test_grouped_many_rows(void) {
    if (!gpu_ready()) SKIP("%s", gpu_why);
    /* wide: every fifth weight scale 2^-27 or 2^14, outside the window in
     * which the folding forms multiply scales into the f16 codes (their
     * stages promote with the product instead) */
    const struct { int64_t E, T, n, k; int wide; } cs[] = {
        {3, 20, 100, 256, 0}, {5, 150, 200, 288, 0}, {5, 150, 200, 384, 0}, {4, 90, 130, 512, 1},
        {3, 40, 12800, 256, 0}};
    for (size_t c = 0; c < sizeof cs / sizeof *cs; c++) {
        const int64_t E = cs[c].E, T = cs[c].T, n = cs[c].n, k = cs[c].k, kbn = k / 32;
        const size_t wb = (size_t)(n * k / 2), sb = (size_t)(n * kbn);
        float *x, *sa;
        uint8_t *qa, *w, *ws;
        moe_inputs(T, k, n, E, &x, &sa, &qa, &w, &ws);
        for (size_t i = 0; cs[c].wide && i < sb * (size_t)E; i += 5) ws[i] = (uint8_t)(i % 2 ? 100 : 141);
        int32_t ids[5], off[6], *rows = malloc((size_t)(T * E) * 4), *pair_exp = malloc((size_t)(T * E) * 4);
        int32_t np = 0;
        off[0] = 0;
        for (int g = 0; g < E; g++) {
            ids[g] = (int32_t)((E - 1 - g + 2 * (c >= 1)) % E);
            for (int t = 0; t < T && g != 1; t++) {
                int in = g == 0 || (g == 2 && t % 3) || (g == 3 && t % 2 == 0) || (g == 4 && t < 70);
                if (in) { rows[np] = t; pair_exp[np] = ids[g]; np++; }
            }
            off[g + 1] = np;
        }
        dbuf dqa = dput(qa, (size_t)(T * k)), dsa = dput(sa, (size_t)(T * kbn) * 4),
             dw = dput(w, wb * E), dws = dput(ws, sb * E), dids = dput(ids, (size_t)E * 4),
             doff = dput(off, (size_t)(E + 1) * 4), drows = dput(rows, (size_t)np * 4),
             dout = dput(NULL, (size_t)(np * n) * 4);
        float *out = malloc((size_t)(np * n) * 4);
        double *ref = malloc((size_t)n * 8), *bound = malloc((size_t)n * 8), *abs_sum = malloc((size_t)n * 8);
        float *first = malloc((size_t)(np * n) * 4), *wg_rows = malloc((size_t)(np * n) * 4);
        /* the mma.sync tiles of 8 (-1), then the tiled GEMM's forms by
         * flags (cuda_gemm_grouped.cu): the first form (0), the pipelined one
         * (1), with the other staging roles (3), with the weight scales
         * folded into the codes (5), both (7), the wgmma form of
         * cuda_gemm_grouped_wg.cu with its first staging roles (8) and its
         * row-per-thread conversion (9), that with the weights by the bulk
         * copy engine (137, the default: whole output tiles only, so here the
         * last shape; the others run form 9); k not a multiple of 128
         * runs the first form each time. Every mma.sync tiled form bit for
         * bit against the first (the wgmma form adds inside a 32-block in
         * another order: the bound alone). The last shape has more tiles
         * than the GPU has multiprocessors, so the wgmma form's blocks take
         * several tiles each (its ring runs on across them). */
        const int forms[] = {-1, 0, 1, 3, 5, 7, 8, 9, 137};
        for (size_t fi = 0; fi < sizeof forms / sizeof *forms; fi++) {
            const int form = forms[fi], tiled = form >= 0;
#if defined(DI_HAVE_CUDA)
            cuda_matvec_set_grouped_tiled(tiled);
            cuda_gemm_grouped_set_form(form);
#endif
            di_err err = {0};
            di_status st = di_cuda_fill(dout.p, 0xff, dout.n, &err);
            if (!st)
                st = di_cuda_gemm_mxfp4_grouped(dqa.p, dsa.p, k, dw.p, dws.p, n, dids.p, doff.p,
                                                (int32_t)E, drows.p, (int32_t)T, dout.p,
                                                DI_DTYPE_F32, NULL, &err);
            if (!st) st = di_cuda_synchronize(&err);
            CHECKF(st == DI_OK, "%s", err.msg);
            dget(out, dout);
            int64_t bad = 0;
            for (int p = 0; p < np; p++) {
                const int t = rows[p];
                ref_gemm(1, qa + (size_t)t * k, sa + (size_t)t * kbn, 1, k, w + (size_t)pair_exp[p] * wb,
                         ws + (size_t)pair_exp[p] * sb, n, ref, bound, abs_sum);
                for (int64_t j = 0; j < n; j++)
                    if (!(fabs(out[(size_t)p * n + j] - ref[j]) <= bound[j])) bad++;
            }
            CHECKF(bad == 0, "grouped mxfp4 (%s %d), %lld groups, %d pairs, n %lld, k %lld: %lld of %lld "
                   "outputs off the exact result", tiled ? "tiled GEMM form" : "mma.sync tiles of 8", form,
                   (long long)E, (int)np, (long long)n, (long long)k, (long long)bad, (long long)(np * n));
            if (form == 0) memcpy(first, out, (size_t)(np * n) * 4);
            CHECKF(form <= 0 || form >= 8 || memcmp(first, out, (size_t)(np * n) * 4) == 0,
                   "grouped mxfp4, k %lld: the tiled form %d differs from the first form", (long long)k, form);
            /* 137 changes only how the weight bytes reach the staging
             * area: the same bits as 9 */
            if (form == 9) memcpy(wg_rows, out, (size_t)(np * n) * 4);
            CHECKF(form <= 9 || memcmp(wg_rows, out, (size_t)(np * n) * 4) == 0,
                   "grouped mxfp4, n %lld, k %lld: the wgmma form %d differs from form 9", (long long)n,
                   (long long)k, form);
        }
#if defined(DI_HAVE_CUDA)
        cuda_matvec_set_grouped_tiled(1);
        cuda_gemm_grouped_set_form(-1);
#endif
        free(first);
        free(wg_rows);
        dbuf all[] = {dqa, dsa, dw, dws, dids, doff, drows, dout};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) di_cuda_free(all[i].p);
        free(x); free(sa); free(qa); free(w); free(ws); free(out); free(ref); free(bound); free(abs_sum);
        free(rows); free(pair_exp);
    }
}

/* The decode kernels start before the kernel ahead of them ends and fetch
 * their weights early; they must still read the activations that kernel
 * writes, and their stores must land after the earlier product's. Without a
 * synchronization between them: quantize x2 over x1's codes, multiply by W1,
 * then by W2 into the same output. The result must be W2 q(x2), bit for bit
 * what the same product gives when run alone, and within the exact bound. */
static void test_dependent_launches(void) {
    if (!gpu_ready()) SKIP("%s", gpu_why);
    for (int fmt = 0; fmt < 2; fmt++)
        for (int64_t m = 1; m <= 9; m += 8) {
            const int64_t n = 300, k = 2304, kbn = k / 32;
            size_t wbytes = fmt == 0 ? (size_t)(n * k) : (size_t)(n * k / 2);
            size_t sbytes = fmt == 0 ? (size_t)(((n + 31) / 32) * kbn) : (size_t)(n * kbn);
            float *x1 = malloc((size_t)(m * k) * 4), *x2 = malloc((size_t)(m * k) * 4);
            uint16_t *b1 = malloc((size_t)(m * k) * 2), *b2 = malloc((size_t)(m * k) * 2);
            uint8_t *qa = malloc((size_t)(m * k)), *w1 = malloc(wbytes), *w2 = malloc(wbytes);
            uint8_t *ws1 = malloc(sbytes), *ws2 = malloc(sbytes);
            float *sa = malloc((size_t)(m * kbn) * 4), *got = malloc((size_t)(m * n) * 4),
                  *alone = malloc((size_t)(m * n) * 4);
            double *ref = malloc((size_t)(m * n) * 8), *bound = malloc((size_t)(m * n) * 8),
                   *abs_sum = malloc((size_t)(m * n) * 8);
            fill_act(x1, b1, m, k);
            fill_act(x2, b2, m, k);
            for (size_t i = 0; i < wbytes; i++) {
                w1[i] = fmt == 0 ? rand_e4m3() : (uint8_t)rng_next();
                w2[i] = fmt == 0 ? rand_e4m3() : (uint8_t)rng_next();
            }
            for (size_t i = 0; i < sbytes; i++) {
                ws1[i] = (uint8_t)(120 + rng_next() % 10);
                ws2[i] = (uint8_t)(120 + rng_next() % 10);
            }
            ref_act_quant(x2, m, k, qa, sa);
            ref_gemm(fmt, qa, sa, m, k, w2, ws2, n, ref, bound, abs_sum);
            dbuf dx1 = dput(b1, (size_t)(m * k) * 2), dx2 = dput(b2, (size_t)(m * k) * 2),
                 dw1 = dput(w1, wbytes), dw2 = dput(w2, wbytes), dws1 = dput(ws1, sbytes),
                 dws2 = dput(ws2, sbytes), dqa = dput(NULL, (size_t)(m * k)),
                 dsa = dput(NULL, (size_t)(m * kbn) * 4), dout = dput(NULL, (size_t)(m * n) * 4);
            di_err err = {0};
            di_status (*gemm)(const uint8_t *, const float *, int64_t, int64_t, const uint8_t *,
                              const uint8_t *, int64_t, void *, di_dtype, di_cuda_gemm_path, void *,
                              di_err *) = fmt == 0 ? di_cuda_gemm_fp8 : di_cuda_gemm_mxfp4;
            /* x2's product alone, everything synchronized */
            di_status st = di_cuda_act_quant_fp8(dx2.p, DI_DTYPE_BF16, m, k, dqa.p, dsa.p, NULL, &err);
            if (!st) st = di_cuda_synchronize(&err);
            if (!st) st = di_cuda_fill(dout.p, 0xff, dout.n, &err);
            if (!st) st = gemm(dqa.p, dsa.p, m, k, dw2.p, dws2.p, n, dout.p, DI_DTYPE_F32,
                               DI_CUDA_GEMM_AUTO, NULL, &err);
            if (!st) st = di_cuda_synchronize(&err);
            CHECKF(st == DI_OK, "%s", err.msg);
            dget(alone, dout);
            /* x1's codes in place, then the chain with no host wait inside */
            st = di_cuda_act_quant_fp8(dx1.p, DI_DTYPE_BF16, m, k, dqa.p, dsa.p, NULL, &err);
            if (!st) st = di_cuda_synchronize(&err);
            if (!st) st = di_cuda_fill(dout.p, 0xff, dout.n, &err);
            for (int rep = 0; rep < 3 && !st; rep++) {
                st = di_cuda_act_quant_fp8(rep % 2 ? dx1.p : dx2.p, DI_DTYPE_BF16, m, k, dqa.p,
                                           dsa.p, NULL, &err);
                if (!st) st = gemm(dqa.p, dsa.p, m, k, dw1.p, dws1.p, n, dout.p, DI_DTYPE_F32,
                                   DI_CUDA_GEMM_AUTO, NULL, &err);
                if (!st) st = gemm(dqa.p, dsa.p, m, k, dw2.p, dws2.p, n, dout.p, DI_DTYPE_F32,
                                   DI_CUDA_GEMM_AUTO, NULL, &err);
            }
            if (!st) st = di_cuda_synchronize(&err);
            CHECKF(st == DI_OK, "%s", err.msg);
            dget(got, dout);
            int64_t differ = 0, bad = 0;
            for (int64_t i = 0; i < m * n; i++) {
                differ += memcmp(&got[i], &alone[i], 4) != 0;
                bad += !(fabs(got[i] - ref[i]) <= bound[i]);
            }
            CHECKF(differ == 0 && bad == 0,
                   "%s m=%lld chained launches: %lld outputs differ from the lone product, %lld "
                   "off the exact result", fmt ? "mxfp4" : "fp8", (long long)m, (long long)differ,
                   (long long)bad);
            dbuf all[] = {dx1, dx2, dw1, dw2, dws1, dws2, dqa, dsa, dout};
            for (size_t i = 0; i < sizeof all / sizeof *all; i++) di_cuda_free(all[i].p);
            free(x1); free(x2); free(b1); free(b2); free(qa); free(w1); free(w2); free(ws1);
            free(ws2); free(sa); free(got); free(alone); free(ref); free(bound); free(abs_sum);
        }
}

/* The FP8 matrix-vector kernel's k split over clusters of 8 blocks, where
 * the rule allows it (at most 49 row tiles, 16 or more 128-input stages):
 * the shapes of wq_a [1280, 5120] and the shared expert's w1 [2304, 5120],
 * and 1000 x 2176 (16 row tiles, a partial one; 17 stages: ranks of 3, a
 * shorter one, two empty ranks). Each cluster size adds
 * its ranks' partial sums in rank order, so the bits differ from the
 * clusters of 4; every size must stay within the exact result's bound
 * (check_gemm: per 32-block the tensor cores' adder, (kbn + 2) fp32
 * roundings of the running magnitude, which the shorter per-rank chains
 * plus KS - 1 cluster additions do not exceed), and a row must not depend
 * on the batch: m = 1 equals row 4 of m = 13, bit for bit. */
#if defined(DI_HAVE_CUDA)
void cuda_matvec_set_ks(int ks); /* cuda_matvec.cu: the FP8 k split forced */
#endif
static void test_fp8_cluster8(void) {
    if (!gpu_ready()) SKIP("%s", gpu_why);
#if defined(DI_HAVE_CUDA)
    const int64_t shapes[][3] = {{1, 1280, 5120}, {16, 1280, 5120}, {1, 2304, 5120},
                                 {9, 2304, 5120}, {3, 1000, 2176}};
    double worst = 0;
    for (int ks = 4; ks <= 8; ks *= 2) {
        cuda_matvec_set_ks(ks);
        for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
            double e = check_gemm(0, shapes[c][0], shapes[c][1], shapes[c][2], DI_CUDA_GEMM_MATVEC,
                                  c % 2 ? DI_DTYPE_BF16 : DI_DTYPE_F32);
            if (e > worst) worst = e;
        }
        /* batch invariance at this cluster size */
        const int64_t m = 13, n = 1280, k = 5120, kbn = k / 32;
        float *x = malloc((size_t)(m * k) * 4), *sa = malloc((size_t)(m * kbn) * 4);
        float *om = malloc((size_t)(m * n) * 4), *o1 = malloc((size_t)n * 4);
        uint8_t *qa = malloc((size_t)(m * k)), *w = malloc((size_t)(n * k));
        uint8_t *ws = malloc((size_t)(n / 32 * kbn));
        fill_act(x, NULL, m, k);
        ref_act_quant(x, m, k, qa, sa);
        for (int64_t i = 0; i < n * k; i++) w[i] = rand_e4m3();
        for (int64_t i = 0; i < n / 32 * kbn; i++) ws[i] = (uint8_t)(120 + rng_next() % 10);
        dbuf dqa = dput(qa, (size_t)(m * k)), dsa = dput(sa, (size_t)(m * kbn) * 4),
             dw = dput(w, (size_t)(n * k)), dws = dput(ws, (size_t)(n / 32 * kbn)),
             dout = dput(NULL, (size_t)(m * n) * 4), d1 = dput(NULL, (size_t)n * 4);
        di_err err = {0};
        di_status st = di_cuda_gemm_fp8(dqa.p, dsa.p, m, k, dw.p, dws.p, n, dout.p, DI_DTYPE_F32,
                                        DI_CUDA_GEMM_AUTO, NULL, &err);
        if (!st)
            st = di_cuda_gemm_fp8((const uint8_t *)dqa.p + 4 * k, (const float *)dsa.p + 4 * kbn, 1,
                                  k, dw.p, dws.p, n, d1.p, DI_DTYPE_F32, DI_CUDA_GEMM_AUTO, NULL,
                                  &err);
        if (!st) st = di_cuda_synchronize(&err);
        CHECKF(st == DI_OK, "%s", err.msg);
        dget(om, dout);
        dget(o1, d1);
        CHECKF(memcmp(o1, om + 4 * n, (size_t)n * 4) == 0,
               "fp8 clusters of %d: row 4 alone != row 4 of 13", ks);
        dbuf all[] = {dqa, dsa, dw, dws, dout, d1};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) di_cuda_free(all[i].p);
        free(x); free(sa); free(om); free(o1); free(qa); free(w); free(ws);
    }
    cuda_matvec_set_ks(0);
    printf("fp8 matvec, clusters of 4 and 8: largest error / bound %.3g\n", worst);
#endif
}

#if defined(DI_HAVE_CUDA)
/* Random weights [N, K] for the plain product: FP8 codes with E8M0 scales
 * around 1 (2^-12 .. 2^7), or bf16 normals over 8 octaves. */
static void plain_weights(int fmt, int64_t N, int64_t K, uint8_t **w, uint8_t **ws, size_t *wbytes,
                          size_t *sbytes) {
    *wbytes = (size_t)(N * K) * (fmt == DI_WFMT_BF16 ? 2 : 1);
    *sbytes = fmt == DI_WFMT_FP8 ? (size_t)((N + 31) / 32 * (K / 32)) : 1;
    *w = malloc(*wbytes);
    *ws = malloc(*sbytes);
    if (fmt == DI_WFMT_FP8) {
        for (size_t i = 0; i < *wbytes; i++) (*w)[i] = rand_e4m3();
        for (size_t i = 0; i < *sbytes; i++) (*ws)[i] = (uint8_t)(127 - 12 + rng_next() % 20);
    } else {
        uint16_t *wb = (uint16_t *)*w;
        for (size_t i = 0; i < *wbytes / 2; i++) wb[i] = di_f32_to_bf16(ldexpf(rng_normal(), -(int)(rng_next() % 8)));
        (*ws)[0] = 0;
    }
}

/* The plain product's outputs y [m, N] (N = groups · nr, x rows of stride
 * ldx) against the exact sum in double: how many lie outside the kernel's
 * bound (18·n_mma + 3)·2^-23·Σ|w·x|, n_mma = 6·ceil(K/256) (the derivation
 * is at k_mm_tc), plus half a bf16 ulp for bf16 outputs; *worst keeps the
 * largest error / bound. */
static int64_t plain_bound_check(int fmt, const uint8_t *w, const uint8_t *ws, const float *x, int64_t ldx,
                                 const float *y, int64_t m, int64_t N, int64_t nr, int64_t K, int obf16,
                                 double *worst) {
    const float *e4m3 = di_cpu_e4m3_table(), *e8m0 = di_cpu_e8m0_table();
    const int64_t kb = K / 32;
    const double nm = 6.0 * (double)((K + 255) / 256), rb = ldexp(18.0 * nm + 3.0, -23);
    int64_t nbad = 0;
    double *wr = malloc((size_t)K * sizeof(double));
    for (int64_t row = 0; row < N; row++) {
        const int64_t g = row / nr;
        for (int64_t k = 0; k < K; k++)
            wr[k] = fmt == DI_WFMT_FP8 ? (double)e4m3[w[row * K + k]] * e8m0[ws[(row / 32) * kb + k / 32]]
                                       : (double)di_bf16_to_f32(((const uint16_t *)w)[row * K + k]);
        for (int64_t i = 0; i < m; i++) {
            const float *xr = x + i * ldx + g * K;
            double acc = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                double p = wr[k] * xr[k];
                acc += p;
                mag += fabs(p);
            }
            double tol = rb * mag + (obf16 ? ldexp(fabs(acc), -8) : 0.0);
            double e = fabs((double)y[i * N + row] - acc);
            if (!(e <= tol)) nbad++;
            if (tol > 0 && e / tol > *worst) *worst = e / tol;
        }
    }
    free(wr);
    return nbad;
}

#endif
/* The decode form of the plain tensor-core product (cuda_ops_linear.cu,
 * k_mm_dec, m <= 8): the same operations in the same order as k_mm_tc, so
 * every output must equal k_mm_tc's bit for bit — whatever the blocks a row
 * tile's eight chains are spread over (1, 2, 4, 8), including x in phases
 * (m·K large), K shorter than eight chunks, ragged row tiles, groups,
 * bf16-valued x (the split's second and third terms skipped), bf16
 * outputs, and a product of more than 8 row tiles per SM at m <= 2 (the
 * head's case, in this form unless DI_CUDA_HEAD_DEC=0). The FP8 cases
 * also check the decode form's E4M3 conversion inside the kernel: k_mm_tc
 * keeps the reference form. bf16-valued x (the second and third terms
 * neither loaded nor voted on where a whole phase has them zero), also with
 * one value off the bf16 grid (its phase takes the second term). Each is
 * also checked against the exact sum in double within the kernel's bound
 * (18·n_mma + 3)·2^-23·Σ|w·x|, n_mma = 6·ceil(K/256) (the derivation is at
 * the kernel). */
#if defined(DI_HAVE_CUDA)
di_status cuda_op_matmul_plain(int fmt, const void *w, const uint8_t *s, int64_t n_out, int64_t n_in,
                               const float *x, int64_t ldx, int64_t m, int groups, int64_t nr, float *y,
                               int64_t ldy, int out_bf16, di_err *err);
void cuda_matmul_set_decode(int on, int cl); /* cuda_ops_linear.cu: test aids */
#endif
static void test_matmul_decode_form(void) {
    if (!gpu_ready()) SKIP("%s", gpu_why);
#if defined(DI_HAVE_CUDA)
    const struct { int fmt; int64_t nr, k; int groups, xbf16, obf16; const int64_t *ms; } sh[] = {
        {DI_WFMT_FP8, 1024, 4096, 8, 0, 1, (const int64_t[]){1, 2, 5, 8, 0}}, /* wo_a */
        {DI_WFMT_BF16, 384, 5120, 1, 0, 0, (const int64_t[]){1, 8, 0}},      /* router */
        {DI_WFMT_BF16, 32, 5120, 1, 1, 1, (const int64_t[]){1, 3, 0}},       /* indexer weights */
        {DI_WFMT_BF16, 2048, 5120, 1, 0, 0, (const int64_t[]){3, 8, 0}},     /* head slice: phases */
        {DI_WFMT_FP8, 40, 96, 1, 0, 0, (const int64_t[]){1, 7, 0}},          /* 3 chunks, ragged */
        {DI_WFMT_FP8, 48, 160, 3, 1, 0, (const int64_t[]){2, 0}},            /* groups, nr % 32 */
        {DI_WFMT_BF16, 200, 1056, 1, 0, 1, (const int64_t[]){4, 0}},
        {DI_WFMT_BF16, 36000, 512, 1, 1, 1, (const int64_t[]){1, 2, 0}},    /* many waves (the head's form) */
        /* bf16-valued x but one value (a second term, no third) three quarters into K: the phase that
         * holds it loads and votes on the second term, the others on the first alone */
        {DI_WFMT_BF16, 2048, 5120, 1, 2, 0, (const int64_t[]){3, 8, 0}},
        {DI_WFMT_FP8, 1024, 4096, 8, 2, 1, (const int64_t[]){1, 5, 0}},
    };
    double worst = 0;
    for (size_t c = 0; c < sizeof sh / sizeof *sh; c++) {
        const int fmt = sh[c].fmt, G = sh[c].groups;
        const int64_t nr = sh[c].nr, K = sh[c].k, N = nr * G;
        size_t wbytes, sbytes;
        uint8_t *w, *ws;
        plain_weights(fmt, N, K, &w, &ws, &wbytes, &sbytes);
        dbuf dw = dput(w, wbytes), dws = dput(ws, sbytes);
        for (const int64_t *mp = sh[c].ms; *mp; mp++) {
            const int64_t m = *mp, ldx = G * K;
            float *x = malloc((size_t)(m * ldx) * 4), *ya = malloc((size_t)(m * N) * 4), *yb = malloc((size_t)(m * N) * 4);
            uint16_t *xb = sh[c].xbf16 ? malloc((size_t)(m * ldx) * 2) : NULL;
            fill_act(x, xb, m, ldx);
            if (sh[c].xbf16 == 2) { /* one value off the bf16 grid by 2^-10 of itself: h + m exactly, l = 0 */
                const int64_t at = (m - 1) * ldx + 3 * ldx / 4 + 5;
                x[at] = x[at] != 0.0f ? x[at] * (1.0f + 0x1p-10f) : 0x1.004p0f;
            }
            dbuf dx = dput(x, (size_t)(m * ldx) * 4), dy = dput(NULL, (size_t)(m * N) * 4);
            di_err err = {0};
            /* k_mm_tc, then the decode form with the automatic spread and each forced one */
            int bad = 0;
            for (int run = 0; run < 6; run++) {
                cuda_matmul_set_decode(run > 0, run <= 1 ? 0 : 1 << (run - 2));
                di_status st = di_cuda_fill(dy.p, 0xff, dy.n, &err);
                if (!st)
                    st = cuda_op_matmul_plain(fmt, dw.p, fmt == DI_WFMT_FP8 ? dws.p : NULL, N, K, dx.p, ldx, m, G,
                                              nr, dy.p, N, sh[c].obf16, &err);
                if (!st) st = di_cuda_synchronize(&err);
                CHECKF(st == DI_OK, "decode form case %zu m %lld: %s", c, (long long)m, err.msg);
                if (st) break;
                dget(run ? yb : ya, dy);
                if (run && memcmp(ya, yb, (size_t)(m * N) * 4) != 0) {
                    int64_t i = 0;
                    while (memcmp(ya + i, yb + i, 4) == 0) i++;
                    CHECKF(0, "decode form %s %lldx%lldx%lld (%d groups) m %lld, spread %d: [%lld] %.9g != k_mm_tc %.9g",
                           fmt == DI_WFMT_FP8 ? "fp8" : "bf16", (long long)N, (long long)K, (long long)nr, G,
                           (long long)m, run <= 1 ? 0 : 1 << (run - 2), (long long)i, yb[i], ya[i]);
                    bad = 1;
                }
            }
            cuda_matmul_set_decode(1, 0);
            /* the exact sum and the bound, on the decode form's output */
            int64_t nbad = bad ? 0 : plain_bound_check(fmt, w, ws, x, ldx, yb, m, N, nr, K, sh[c].obf16, &worst);
            CHECKF(nbad == 0, "decode form case %zu m %lld: %lld outputs outside the bound", c, (long long)m,
                   (long long)nbad);
            di_cuda_free(dx.p);
            di_cuda_free(dy.p);
            free(x); free(xb); free(ya); free(yb);
        }
        di_cuda_free(dw.p);
        di_cuda_free(dws.p);
        free(w); free(ws);
    }
    printf("decode form: every spread equals k_mm_tc bit for bit; largest error / bound %.3g\n", worst);
#endif
}

/* The prefill form of the plain tensor-core product (cuda_ops_linear.cu,
 * k_mm_pf, from 512 rows): k_mm_tc's operations in k_mm_tc's order on 64 x
 * 64 tiles, so every output must equal k_mm_tc's bit for bit: the grouped
 * wo_a at 600 rows (a ragged row tile), and with the form forced at any m:
 * K of fewer than eight chunks (idle chains), K of 33 chunks (chains of
 * unequal length), ragged output tiles, groups with a half-empty last tile,
 * bf16-valued x (the second and third terms skipped), bf16 outputs. Each
 * case also runs with the scratch of cuda_op_matmul_plain_s: where x is
 * bf16-valued everywhere its bf16 form must run (the flag at the scratch's
 * end 0) and where one value of x is not (the wo_a case with one value
 * moved off the bf16 grid, "bf16 x but one") the fp32 form (flag 1), both
 * again with k_mm_tc's bits. Outputs are poisoned before each run. Where
 * the CPU can afford it the exact sum in double is checked too, within the
 * kernel's bound. */
#if defined(DI_HAVE_CUDA)
void cuda_matmul_set_prefill(int min_rows); /* cuda_ops_linear.cu: test aid, 0 = never */
void cuda_matmul_set_mid(int min_rows);     /* cuda_ops_linear.cu: test aid, 0 = off */
di_status cuda_op_matmul_plain_s(int fmt, const void *w, const uint8_t *s, int64_t n_out, int64_t n_in,
                                 const float *x, int64_t ldx, int64_t m, int groups, int64_t nr, float *y,
                                 int64_t ldy, int out_bf16, void *scratch, size_t scratch_bytes, di_err *err);
size_t cuda_op_matmul_scratch_bytes(int fmt, int64_t n_in, int64_t m, int groups, int64_t nr);
#endif
static void test_matmul_prefill_form(void) {
    if (!gpu_ready()) SKIP("%s", gpu_why);
#if defined(DI_HAVE_CUDA)
    const struct { int fmt; int64_t nr, k; int groups, xbf16, obf16; int64_t m; int force; } sh[] = {
        {DI_WFMT_FP8, 1024, 4096, 8, 0, 1, 600, 0}, /* wo_a at prefill */
        {DI_WFMT_FP8, 1024, 4096, 8, 1, 1, 600, 0}, /* the same, bf16 x (the attention's o) */
        {DI_WFMT_FP8, 1024, 4096, 8, 2, 1, 600, 0}, /* bf16 x but one */
        {DI_WFMT_BF16, 384, 5120, 1, 0, 0, 520, 0}, /* router */
        {DI_WFMT_FP8, 40, 96, 1, 0, 0, 70, 1},      /* 3 chunks, ragged */
        {DI_WFMT_FP8, 96, 160, 3, 1, 0, 130, 1},    /* groups, a half tile */
        {DI_WFMT_BF16, 200, 1056, 1, 0, 1, 130, 1}, /* 33 chunks */
        {DI_WFMT_BF16, 512, 5120, 1, 1, 1, 64, 1},  /* compressor, bf16 x */
        /* decode batches past the decode form, chosen by the rule itself
         * (no force): wo_a at 64 rows, a wide product at 9, the router at 32 */
        {DI_WFMT_FP8, 1024, 4096, 8, 1, 1, 64, 0},
        {DI_WFMT_BF16, 129280 / 16, 5120, 1, 1, 0, 9, 0},
        {DI_WFMT_BF16, 384, 5120, 1, 1, 0, 32, 0},
    };
    double worst = 0;
    int64_t checked = 0;
    for (size_t c = 0; c < sizeof sh / sizeof *sh; c++) {
        const int fmt = sh[c].fmt, G = sh[c].groups;
        const int64_t nr = sh[c].nr, K = sh[c].k, N = nr * G, m = sh[c].m, ldx = G * K;
        size_t wbytes, sbytes;
        uint8_t *w, *ws;
        plain_weights(fmt, N, K, &w, &ws, &wbytes, &sbytes);
        float *x = malloc((size_t)(m * ldx) * 4), *ya = malloc((size_t)(m * N) * 4), *yb = malloc((size_t)(m * N) * 4);
        uint16_t *xb = sh[c].xbf16 ? malloc((size_t)(m * ldx) * 2) : NULL;
        fill_act(x, xb, m, ldx);
        if (sh[c].xbf16 == 2) /* one value off the bf16 grid: a second term in one tile */
            x[(m / 2) * ldx + ldx / 3] = nextafterf(x[(m / 2) * ldx + ldx / 3], INFINITY);
        dbuf dw = dput(w, wbytes), dws = dput(ws, sbytes), dx = dput(x, (size_t)(m * ldx) * 4),
             dy = dput(NULL, (size_t)(m * N) * 4);
        di_err err = {0};
        int ok = 1;
        /* k_mm_tc, then the prefill form, then the prefill form with the scratch */
        for (int run = 0; run < 3 && ok; run++) {
            cuda_matmul_set_prefill(run == 0 ? 0 : sh[c].force ? 1 : 512);
            size_t xs = run == 2 ? cuda_op_matmul_scratch_bytes(fmt, K, m, G, nr) : 0;
            dbuf dscr = dput(NULL, xs ? xs : 16);
            if (xs) di_cuda_fill(dscr.p, 0x5a, xs, &err); /* the flag must be written */
            di_status st = di_cuda_fill(dy.p, 0xff, dy.n, &err);
            if (!st)
                st = cuda_op_matmul_plain_s(fmt, dw.p, fmt == DI_WFMT_FP8 ? dws.p : NULL, N, K, dx.p, ldx, m, G, nr,
                                            dy.p, N, sh[c].obf16, xs ? dscr.p : NULL, xs, &err);
            if (!st) st = di_cuda_synchronize(&err);
            CHECKF(st == DI_OK, "prefill form case %zu run %d: %s", c, run, err.msg);
            ok = st == DI_OK;
            if (ok && run == 2) {
                int flag = -1;
                CHECKF(xs > 0, "prefill form case %zu: no scratch asked for", c);
                if (xs) di_cuda_download(&flag, (uint8_t *)dscr.p + xs - sizeof flag, sizeof flag, &err);
                CHECKF(flag == (sh[c].xbf16 != 1), "prefill form case %zu: x16 flag %d, bf16 x %d", c, flag,
                       sh[c].xbf16);
            }
            di_cuda_free(dscr.p);
            if (ok) dget(run ? yb : ya, dy);
            if (ok && run && memcmp(ya, yb, (size_t)(m * N) * 4) != 0) {
                int64_t i = 0;
                while (memcmp(ya + i, yb + i, 4) == 0) i++;
                CHECKF(0, "prefill form%s %s %lldx%lld (%d groups) m %lld: [%lld] %.9g != k_mm_tc %.9g",
                       run == 2 ? " (scratch)" : "", fmt == DI_WFMT_FP8 ? "fp8" : "bf16", (long long)N,
                       (long long)K, G, (long long)m, (long long)i, yb[i], ya[i]);
                ok = 0;
            }
        }
        cuda_matmul_set_prefill(512);
        if (ok && (double)N * (double)m * (double)K <= 1.1e9) {
            int64_t nbad = plain_bound_check(fmt, w, ws, x, ldx, yb, m, N, nr, K, sh[c].obf16, &worst);
            CHECKF(nbad == 0, "prefill form case %zu: %lld outputs outside the bound", c, (long long)nbad);
            checked++;
        }
        dbuf all[] = {dw, dws, dx, dy};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) di_cuda_free(all[i].p);
        free(w); free(ws); free(x); free(xb); free(ya); free(yb);
    }
    /* the rule itself (cuda_ops_linear.cu pf_applies; the scratch is asked
     * for exactly where the prefill form runs): wide products from 9 rows,
     * narrow ones from 32, never at the decode form's 8 or with the mid rows
     * off */
    CHECK(cuda_op_matmul_scratch_bytes(DI_WFMT_BF16, 5120, 9, 1, 129280) > 0);
    CHECK(cuda_op_matmul_scratch_bytes(DI_WFMT_BF16, 5120, 8, 1, 129280) == 0);
    CHECK(cuda_op_matmul_scratch_bytes(DI_WFMT_BF16, 5120, 16, 1, 384) == 0);
    CHECK(cuda_op_matmul_scratch_bytes(DI_WFMT_BF16, 5120, 32, 1, 384) > 0);
    CHECK(cuda_op_matmul_scratch_bytes(DI_WFMT_FP8, 4096, 16, 8, 1024) > 0);
    cuda_matmul_set_mid(0);
    CHECK(cuda_op_matmul_scratch_bytes(DI_WFMT_BF16, 5120, 64, 1, 129280) == 0);
    CHECK(cuda_op_matmul_scratch_bytes(DI_WFMT_BF16, 5120, 512, 1, 129280) > 0);
    cuda_matmul_set_mid(9);
    printf("prefill form: equals k_mm_tc bit for bit; %lld cases against the exact sum, largest error / bound %.3g\n",
           (long long)checked, worst);
#endif
}

/* The decode form's E4M3 -> bf16 conversion (cuda_mma.cuh: four
 * instructions a pair, the reference form for NaN codes and scales outside
 * its range) against the reference form (e4m3x8_bf16x2, k_mm_tc's): every
 * one of the 256 codes at every one of the 256 E8M0 scale bytes, bit for
 * bit, then random groups crowded with the codes around the edges (0x7e /
 * 0x7f / 0xfe / 0xff side by side: the NaN marks' carries). The fast form
 * alone must equal the exact value code·2^(sb-127) as bf16 (from the CPU's
 * tables) wherever the scale byte is in 10..134 and the code is finite, and
 * its NaN marks must flag exactly the groups that hold a NaN code. */
#if defined(DI_HAVE_CUDA)
di_status cuda_e4m3_forms(const void *codes, const void *sb, int n, void *out, di_err *err);
#endif
static void test_e4m3_forms(void) {
    if (!gpu_ready()) SKIP("%s", gpu_why);
#if defined(DI_HAVE_CUDA)
    enum { EXH = 256 * 8, RND = 8192, N = EXH + RND };
    static const uint8_t edge[] = {0x00, 0x80, 0x01, 0x81, 0x07, 0x87, 0x08, 0x88,
                                   0x7e, 0x7f, 0xfe, 0xff, 0x78, 0xf8, 0x77, 0xf7};
    uint8_t *codes = malloc((size_t)N * 32), *sb = malloc(N);
    uint32_t *out = malloc((size_t)N * 52 * 4);
    for (int i = 0; i < EXH; i++) { /* scale byte i / 8, codes 32·(i % 8) .. + 31 in order */
        sb[i] = (uint8_t)(i / 8);
        for (int k = 0; k < 32; k++) codes[(size_t)i * 32 + k] = (uint8_t)(32 * (i % 8) + k);
    }
    for (int i = EXH; i < N; i++) {
        uint64_t r = rng_next();
        sb[i] = r & 1 ? (uint8_t)(10 + (r >> 1) % 125) : (uint8_t)(r >> 1);
        for (int k = 0; k < 32; k++) {
            uint64_t c = rng_next();
            codes[(size_t)i * 32 + k] = c % 3 ? edge[(c >> 2) % 16] : (uint8_t)(c >> 8);
        }
    }
    dbuf dc = dput(codes, (size_t)N * 32), ds = dput(sb, N), dout = dput(NULL, (size_t)N * 52 * 4);
    di_err err = {0};
    di_status st = cuda_e4m3_forms(dc.p, ds.p, N, dout.p, &err);
    if (!st) st = di_cuda_synchronize(&err);
    CHECKF(st == DI_OK, "%s", err.msg);
    dget(out, dout);
    const float *e4m3 = di_cpu_e4m3_table();
    long long n_guard_bad = 0, n_fast_bad = 0, n_ref_bad = 0, n_mark_bad = 0, n_fast = 0;
    for (int i = 0; i < N; i++) {
        const uint32_t *o = out + (size_t)i * 52;
        const int in_range = sb[i] >= 10 && sb[i] <= 134;
        for (int p = 0; p < 4; p++) {
            const uint8_t *g = codes + (size_t)i * 32 + 8 * p;
            int has_nan = 0;
            for (int k = 0; k < 8; k++) has_nan |= (g[k] & 0x7f) == 0x7f;
            if (((o[48 + p] & 0x80808080u) != 0) != has_nan) n_mark_bad++;
            for (int k = 0; k < 8; k++) {
                const int w = p * 4 + k / 2, sh = 16 * (k & 1);
                const uint16_t fast = (uint16_t)(o[w] >> sh), guarded = (uint16_t)(o[16 + w] >> sh),
                               ref = (uint16_t)(o[32 + w] >> sh);
                if (guarded != ref) {
                    if (!n_guard_bad)
                        fprintf(stderr, "code 0x%02x scale byte %d: decode form 0x%04x, reference 0x%04x\n", g[k],
                                sb[i], guarded, ref);
                    n_guard_bad++;
                }
                if (!in_range || (g[k] & 0x7f) == 0x7f) continue;
                const uint16_t exact = di_f32_to_bf16(ldexpf(e4m3[g[k]], sb[i] - 127));
                n_fast++;
                if (fast != exact) {
                    if (!n_fast_bad)
                        fprintf(stderr, "code 0x%02x scale byte %d: four-instruction form 0x%04x, exact 0x%04x\n",
                                g[k], sb[i], fast, exact);
                    n_fast_bad++;
                }
                if (ref != exact) n_ref_bad++;
            }
        }
    }
    CHECKF(n_guard_bad == 0, "%lld codes: the decode form's conversion differs from the reference form", n_guard_bad);
    CHECKF(n_fast_bad == 0, "%lld of %lld codes: the four-instruction form is not the exact value", n_fast_bad, n_fast);
    CHECKF(n_ref_bad == 0, "%lld codes: the reference form is not the exact value", n_ref_bad);
    CHECKF(n_mark_bad == 0, "%lld groups: NaN marks wrong", n_mark_bad);
    CHECKF(n_fast >= 125 * 254, "only %lld codes checked in the fast form's range", n_fast);
    printf("e4m3 forms: %d codes x 256 scale bytes + %d random groups equal to the reference form; %lld codes "
           "through the four-instruction form exact\n", 256, RND * 4, n_fast);
    di_cuda_free(dc.p); di_cuda_free(ds.p); di_cuda_free(dout.p);
    free(codes); free(sb); free(out);
#endif
}

#if defined(DI_HAVE_CUDA)
void cuda_matvec_set_fp4_dec(int mode); /* cuda_matvec.cu: MXFP4 decode form 0 never, 1 everywhere,
                                          * 2 past 16 rows only, 3 the default; -1 the environment's */
void cuda_fp4_dec_set_mma(int on);      /* cuda_fp4_dec.cu: 0 the CUDA-core kernel only, -1 the
                                          * environment's */
void cuda_fp4_dec_set_places(int sms);  /* cuda_fp4_dec.cu: SMs the tensor-core kernel's blocks plan for, 0 the device's */
void cuda_fp4_dec_set_wg(int on);       /* cuda_fp4_dec.cu: 1 the tensor-core kernel's WG form (wgmma), 0 its
                                          * mma.sync form, -1 the environment's */
#endif

#if defined(DI_HAVE_CUDA)
/* The decode-form tests' inputs: E = 5 experts of n x k, T = 6 tokens, and
 * the groups expert 3 rows {4}, expert 1 rows {0, 5}, expert 4 none,
 * expert 0 rows {1, 2, 3}, expert 2 rows {5, 4, 3, 2, 0} (11 pairs), on the
 * host and the device. */
enum { FD_E = 5, FD_T = 6, FD_NP = 11 };
typedef struct {
    int64_t n, k, kbn;
    size_t wb, sb; /* one expert's codes and scales, bytes */
    float *x, *sa;
    uint8_t *qa, *w, *ws;
    int32_t ids[FD_E], off[FD_E + 1], rows[FD_NP], pexp[FD_NP];
    dbuf dqa, dsa, dw, dws, dids, doff, drows;
} fd_fixture;

static void fd_fixture_make(fd_fixture *f, int64_t n, int64_t k) {
    static const int32_t ids[FD_E] = {3, 1, 4, 0, 2}, off[FD_E + 1] = {0, 1, 3, 3, 6, 11},
                         rows[FD_NP] = {4, 0, 5, 1, 2, 3, 5, 4, 3, 2, 0};
    f->n = n;
    f->k = k;
    f->kbn = k / 32;
    f->wb = (size_t)(n * k / 2);
    f->sb = (size_t)(n * f->kbn);
    moe_inputs(FD_T, k, n, FD_E, &f->x, &f->sa, &f->qa, &f->w, &f->ws);
    memcpy(f->ids, ids, sizeof ids);
    memcpy(f->off, off, sizeof off);
    memcpy(f->rows, rows, sizeof rows);
    for (int g = 0; g < FD_E; g++)
        for (int p = off[g]; p < off[g + 1]; p++) f->pexp[p] = ids[g];
    f->dqa = dput(f->qa, (size_t)(FD_T * k));
    f->dsa = dput(f->sa, (size_t)(FD_T * f->kbn) * 4);
    f->dw = dput(f->w, f->wb * FD_E);
    f->dws = dput(f->ws, f->sb * FD_E);
    f->dids = dput(f->ids, sizeof ids);
    f->doff = dput(f->off, sizeof off);
    f->drows = dput(f->rows, sizeof rows);
}

static void fd_fixture_free(fd_fixture *f) {
    dbuf all[] = {f->dqa, f->dsa, f->dw, f->dws, f->dids, f->doff, f->drows};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) di_cuda_free(all[i].p);
    free(f->x); free(f->sa); free(f->qa); free(f->w); free(f->ws);
}
#endif

/* The MXFP4 decode form (cuda_fp4_dec.cu), its tensor-core kernel and its
 * CUDA-core one, on the model's expert shapes: k = 5120 (160 blocks: 4
 * chunks of 40, row tiles of 32; 32 lanes in the CUDA-core kernel), 2304
 * (72 blocks: one chunk, no barrier, row tiles of 128; 8 lanes), 3200 (100
 * blocks, not a multiple of 8: the CUDA-core kernel in both forms, 32
 * lanes, some idle at the row's end), and the tensor-core kernel's other
 * splits: 1536 (2 chunks of 24, row tiles of 64), 8192 (8 chunks of 32,
 * row tiles of 16); n not a multiple of a block's rows, and w1's 2304 rows
 * at k = 5120 (72 row tiles a group), also with the tensor-core kernel's
 * blocks planned for 9 SMs (more than one wave: each group's tiles dealt
 * into blocks of 8 and 7), which must give the same bits. Groups of 1, 2, 3 and 5 rows and an empty one,
 * max_rows 5 and 1 (token tiles of 5, or of 1 looping over the rows). Every
 * (token, expert) row must be within the exact result's bound (the
 * tensor-core adder's 2^-8 max|p| a block; the CUDA-core kernel's f32 chain
 * of 32 products is at most 31 * 32 * 2^-24 max|p|), equal the plain
 * product of that row alone bit for bit (nothing in either kernel depends
 * on the other rows), and bf16 outputs must be that value rounded. The
 * tensor-core kernel runs in both its forms (mma.sync, and the WG form on
 * the warpgroup tensor cores: row tiles of 64 a warpgroup, k = 5120 and
 * 1536 in 2 chunks, 2304 in one; k = 8192 where two blocks' memory fits);
 * the wgmma kernel runs the same rows: within the same bound. */
static void test_fp4_dec_form(void) {
    if (!gpu_ready()) SKIP("%s", gpu_why);
#if defined(DI_HAVE_CUDA)
    const int64_t shapes[][2] = {{100, 5120}, {150, 2304}, {70, 3200}, {90, 1536}, {40, 8192}, {2304, 5120}};
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        fd_fixture f;
        fd_fixture_make(&f, shapes[c][0], shapes[c][1]);
        const int64_t n = f.n, k = f.k, kbn = f.kbn;
        const size_t wb = f.wb, sb = f.sb;
        const float *sa = f.sa;
        const uint8_t *qa = f.qa, *w = f.w, *ws = f.ws;
        const int32_t *rows = f.rows, *pexp = f.pexp;
        const int np = FD_NP;
        dbuf dqa = f.dqa, dsa = f.dsa, dw = f.dw, dws = f.dws, dids = f.dids, doff = f.doff, drows = f.drows;
        dbuf dout = dput(NULL, (size_t)(np * n) * 4), dob = dput(NULL, (size_t)(np * n) * 2),
             d1 = dput(NULL, (size_t)n * 4);
        float *out = malloc((size_t)(np * n) * 4), *o1 = malloc((size_t)n * 4);
        uint16_t *ob = malloc((size_t)(np * n) * 2);
        double *ref = malloc((size_t)n * 8), *bound = malloc((size_t)n * 8), *abs_sum = malloc((size_t)n * 8);
        di_err err = {0};
        static const char *const fname[] = {"wgmma", "CUDA-core decode", "tensor-core decode",
                                            "tensor-core decode (WG)"};
        for (int form = 3; form >= 0; form--) {
            cuda_matvec_set_fp4_dec(form ? 1 : 0);
            cuda_fp4_dec_set_mma(form >= 2);
            cuda_fp4_dec_set_wg(form == 3);
            for (int mr = 5; mr >= 1; mr -= 4) {
                di_status st = di_cuda_fill(dout.p, 0xff, dout.n, &err);
                if (!st) st = di_cuda_fill(dob.p, 0xff, dob.n, &err);
                if (!st)
                    st = di_cuda_gemm_mxfp4_grouped(dqa.p, dsa.p, k, dw.p, dws.p, n, dids.p, doff.p, 5,
                                                    drows.p, mr, dout.p, DI_DTYPE_F32, NULL, &err);
                if (!st)
                    st = di_cuda_gemm_mxfp4_grouped(dqa.p, dsa.p, k, dw.p, dws.p, n, dids.p, doff.p, 5,
                                                    drows.p, mr, dob.p, DI_DTYPE_BF16, NULL, &err);
                if (!st) st = di_cuda_synchronize(&err);
                CHECKF(st == DI_OK, "%s", err.msg);
                dget(out, dout);
                dget(ob, dob);
                int64_t bad = 0, differ = 0, bfbad = 0;
                for (int p = 0; p < np; p++) {
                    const int t = rows[p];
                    ref_gemm(1, qa + (size_t)t * k, sa + (size_t)t * kbn, 1, k, w + (size_t)pexp[p] * wb,
                             ws + (size_t)pexp[p] * sb, n, ref, bound, abs_sum);
                    st = di_cuda_fill(d1.p, 0xff, d1.n, &err);
                    if (!st)
                        st = di_cuda_gemm_mxfp4((const uint8_t *)dqa.p + (size_t)t * k,
                                                (const float *)dsa.p + (size_t)t * kbn, 1, k,
                                                (const uint8_t *)dw.p + (size_t)pexp[p] * wb,
                                                (const uint8_t *)dws.p + (size_t)pexp[p] * sb, n, d1.p,
                                                DI_DTYPE_F32, DI_CUDA_GEMM_AUTO, NULL, &err);
                    if (!st) st = di_cuda_synchronize(&err);
                    CHECKF(st == DI_OK, "%s", err.msg);
                    dget(o1, d1);
                    for (int64_t j = 0; j < n; j++) {
                        const float g = out[(size_t)p * n + j];
                        if (!(fabs(g - ref[j]) <= bound[j])) bad++;
                        if (memcmp(&g, &o1[j], 4)) differ++;
                        if (ob[(size_t)p * n + j] != di_f32_to_bf16(g)) bfbad++;
                    }
                }
                CHECKF(bad == 0, "mxfp4 %s form n %lld k %lld max_rows %d: %lld of %lld outputs off the exact result",
                       fname[form], (long long)n, (long long)k, mr, (long long)bad, (long long)(np * n));
                CHECKF(differ == 0, "mxfp4 %s form n %lld k %lld max_rows %d: %lld outputs differ from the plain product",
                       fname[form], (long long)n, (long long)k, mr, (long long)differ);
                CHECKF(bfbad == 0, "mxfp4 %s form n %lld k %lld: %lld bf16 outputs are not the f32 ones rounded",
                       fname[form], (long long)n, (long long)k, (long long)bfbad);
                if (form >= 2 && n >= 2304) { /* blocks dealt for 9 SMs: the same bits */
                    cuda_fp4_dec_set_places(9);
                    st = di_cuda_fill(dout.p, 0xff, dout.n, &err);
                    if (!st)
                        st = di_cuda_gemm_mxfp4_grouped(dqa.p, dsa.p, k, dw.p, dws.p, n, dids.p, doff.p, 5,
                                                        drows.p, mr, dout.p, DI_DTYPE_F32, NULL, &err);
                    if (!st) st = di_cuda_synchronize(&err);
                    cuda_fp4_dec_set_places(0);
                    CHECKF(st == DI_OK, "%s", err.msg);
                    float *o2 = malloc((size_t)(np * n) * 4);
                    dget(o2, dout);
                    CHECKF(!memcmp(o2, out, (size_t)(np * n) * 4),
                           "mxfp4 tensor-core form n %lld k %lld max_rows %d: blocks dealt for 9 SMs give "
                           "other bits", (long long)n, (long long)k, mr);
                    free(o2);
                }
                if (!form) break; /* the wgmma form needs the true max_rows */
            }
        }
        cuda_matvec_set_fp4_dec(-1);
        cuda_fp4_dec_set_mma(-1);
        cuda_fp4_dec_set_wg(-1);
        dbuf all[] = {dout, dob, d1};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) di_cuda_free(all[i].p);
        fd_fixture_free(&f);
        free(out); free(o1); free(ob); free(ref); free(bound); free(abs_sum);
    }
#endif
}

/* Two grouped products over the same activations and routing in one call
 * (the MoE's w1 and w3): each output bit for bit what the single grouped
 * call gives for its weights, f32 and bf16, outputs poisoned. The decode
 * form everywhere (mode 1: the tensor-core kernel's pair launch at k =
 * 5120 and 2304, two launches of the CUDA-core one at k = 3200) and the
 * default (the pair launch at 5120 and 2304, two wgmma launches at 3200);
 * max_rows 5 (one token tile) and 1 (a tile a token). The second weights
 * are the first's experts rotated by one, so the halves differ. */
static void test_fp4_dec_pair(void) {
    if (!gpu_ready()) SKIP("%s", gpu_why);
#if defined(DI_HAVE_CUDA)
    const int64_t shapes[][2] = {{100, 5120}, {150, 2304}, {70, 3200}, {90, 1536}, {40, 8192}, {2304, 5120}};
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        fd_fixture f;
        fd_fixture_make(&f, shapes[c][0], shapes[c][1]);
        const int64_t n = f.n, k = f.k;
        const size_t wb = f.wb, sb = f.sb;
        const int np = FD_NP;
        uint8_t *w2 = malloc(wb * FD_E), *ws2 = malloc(sb * FD_E);
        for (int64_t e = 0; e < FD_E; e++) {
            memcpy(w2 + (size_t)e * wb, f.w + (size_t)((e + 1) % FD_E) * wb, wb);
            memcpy(ws2 + (size_t)e * sb, f.ws + (size_t)((e + 1) % FD_E) * sb, sb);
        }
        dbuf dqa = f.dqa, dsa = f.dsa, dw = f.dw, dws = f.dws, dids = f.dids, doff = f.doff, drows = f.drows;
        dbuf dw2 = dput(w2, wb * FD_E), dws2 = dput(ws2, sb * FD_E),
             da = dput(NULL, (size_t)(np * n) * 4), db = dput(NULL, (size_t)(np * n) * 4),
             dpa = dput(NULL, (size_t)(np * n) * 4), dpb = dput(NULL, (size_t)(np * n) * 4);
        float *a = malloc((size_t)(np * n) * 4), *b = malloc((size_t)(np * n) * 4),
              *pa = malloc((size_t)(np * n) * 4), *pb = malloc((size_t)(np * n) * 4);
        di_err err = {0};
        for (int mode = 1; mode >= -2; mode--) {
            /* 1 and 0: the decode form everywhere, its WG form and its
             * mma.sync form; -1 the default, -2 with the mma.sync form */
            if (mode == 0 || mode == -2) cuda_fp4_dec_set_wg(0);
            else cuda_fp4_dec_set_wg(-1);
            cuda_matvec_set_fp4_dec(mode == 0 ? 1 : mode == -2 ? -1 : mode);
            for (int mr = 5; mr >= 1; mr -= 4)
                for (int bf = 0; bf < 2; bf++) {
                    const di_dtype dt = bf ? DI_DTYPE_BF16 : DI_DTYPE_F32;
                    const size_t nb = (size_t)(np * n) * (bf ? 2 : 4);
                    if (mode < 0 && mr == 1) continue; /* the wgmma kernel needs the true max_rows */
                    di_status st = DI_OK;
                    dbuf outs[] = {da, db, dpa, dpb};
                    for (int i = 0; i < 4 && !st; i++) st = di_cuda_fill(outs[i].p, 0xff, outs[i].n, &err);
                    if (!st)
                        st = di_cuda_gemm_mxfp4_grouped(dqa.p, dsa.p, k, dw.p, dws.p, n, dids.p, doff.p, 5,
                                                        drows.p, mr, da.p, dt, NULL, &err);
                    if (!st)
                        st = di_cuda_gemm_mxfp4_grouped(dqa.p, dsa.p, k, dw2.p, dws2.p, n, dids.p, doff.p, 5,
                                                        drows.p, mr, db.p, dt, NULL, &err);
                    if (!st)
                        st = di_cuda_gemm_mxfp4_grouped_pair(dqa.p, dsa.p, k, dw.p, dws.p, dw2.p, dws2.p, n,
                                                             dids.p, doff.p, 5, drows.p, mr, dpa.p, dpb.p, dt,
                                                             NULL, &err);
                    if (!st) st = di_cuda_synchronize(&err);
                    CHECKF(st == DI_OK, "%s", err.msg);
                    dget(a, da);
                    dget(b, db);
                    dget(pa, dpa);
                    dget(pb, dpb);
                    CHECKF(!memcmp(a, pa, nb) && !memcmp(b, pb, nb),
                           "mxfp4 pair n %lld k %lld mode %d max_rows %d %s: differs from the single launches",
                           (long long)n, (long long)k, mode, mr, bf ? "bf16" : "f32");
                    CHECKF(memcmp(a, b, nb), "mxfp4 pair n %lld k %lld: both halves alike (test weights)",
                           (long long)n, (long long)k);
                }
        }
        cuda_matvec_set_fp4_dec(-1);
        cuda_fp4_dec_set_wg(-1);
        dbuf all[] = {dw2, dws2, da, db, dpa, dpb};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) di_cuda_free(all[i].p);
        fd_fixture_free(&f);
        free(w2); free(ws2); free(a); free(b); free(pa); free(pb);
    }
#endif
}

#if defined(DI_HAVE_CUDA)
void cuda_fp4_dec_set_tr(int tr); /* cuda_fp4_dec.cu: token slots a tile (0 chosen) */
void cuda_fp4_dec_set_a8(int on); /* cuda_fp4_dec.cu: 1 the A8 form (e4m3 activations), 0 the f16 one, -1 chosen */
#endif

/* The tensor-core decode kernel's token slots and its two activation forms
 * (cuda_fp4_dec.cu: f16 of a * 64, or the e4m3 codes turned into f16 in the
 * loop with the scales times 64): a row's bits must not depend on either.
 * Groups of 20, 7, 0 and 5 tokens; slots 1 (the reference: every token a
 * pass of its own), 2, 4, 7 and 8 in each form (a group of 20 over three or
 * more tiles, the last partly full), and the chosen ones at max_rows 20,
 * 80 (the f16 form) and 240 (past FM_A8_ROWS = 32 times w1's f16 slots:
 * the A8 form; the tiled GEMM kept off, which groups of this size would
 * take); in the WG form also 12 and 16 slots (its m64n16 wgmma: the group
 * of 20 over two tiles) and the slots chosen at max_rows 600 (16, from
 * FM_WG16_ROWS = 384); outputs poisoned; the reference within the exact
 * result's bound. */
static void test_fp4_dec_slots(void) {
    if (!gpu_ready()) SKIP("%s", gpu_why);
#if defined(DI_HAVE_CUDA)
    const int64_t shapes[][2] = {{100, 5120}, {150, 2304}};
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        const int64_t E = 4, T = 20, n = shapes[c][0], k = shapes[c][1], kbn = k / 32;
        const size_t wb = (size_t)(n * k / 2), sb = (size_t)(n * kbn);
        float *x, *sa;
        uint8_t *qa, *w, *ws;
        moe_inputs(T, k, n, E, &x, &sa, &qa, &w, &ws);
        int32_t ids[4] = {2, 0, 3, 1}, off[5] = {0, 20, 27, 27, 32}, rows[32], pexp[32];
        for (int i = 0; i < 20; i++) rows[i] = 19 - i;
        for (int i = 0; i < 7; i++) rows[20 + i] = (3 * i + 1) % 20;
        for (int i = 0; i < 5; i++) rows[27 + i] = 2 * i;
        for (int g = 0; g < 4; g++)
            for (int p = off[g]; p < off[g + 1]; p++) pexp[p] = ids[g];
        const int np = 32;
        dbuf dqa = dput(qa, (size_t)(T * k)), dsa = dput(sa, (size_t)(T * kbn) * 4),
             dw = dput(w, wb * E), dws = dput(ws, sb * E), dids = dput(ids, sizeof ids),
             doff = dput(off, sizeof off), drows = dput(rows, sizeof rows),
             dout = dput(NULL, (size_t)(np * n) * 4);
        float *ref = malloc((size_t)(np * n) * 4), *out = malloc((size_t)(np * n) * 4);
        double *ex = malloc((size_t)n * 8), *bound = malloc((size_t)n * 8), *abs_sum = malloc((size_t)n * 8);
        di_err err = {0};
        cuda_matvec_set_fp4_dec(1);
        const struct { int tr, a8, max_rows; } vs[] = {{1, 0, 20},  {2, 0, 20},  {4, 0, 20},  {7, 0, 20},
                                                       {8, 0, 20},  {1, 1, 20},  {2, 1, 20},  {4, 1, 20},
                                                       {7, 1, 20},  {8, 1, 20},  {0, -1, 80}, {0, -1, 20},
                                                       {0, -1, 240}, {12, 1, 20}, {16, 1, 20}, {0, -1, 600}};
        /* the mma.sync form, then the WG form (which has one layout: its
         * A8 cases run it again); past 8 slots the WG form only */
        for (int wg = 0; wg < 2; wg++) {
            cuda_fp4_dec_set_wg(wg);
            for (size_t v = 0; v < sizeof vs / sizeof *vs; v++) {
                if (!wg && (vs[v].tr > 8 || vs[v].max_rows > 240)) continue;
                cuda_fp4_dec_set_tr(vs[v].tr);
                cuda_fp4_dec_set_a8(vs[v].a8);
                cuda_matvec_set_grouped_tiled(vs[v].max_rows <= 16);
                di_status st = di_cuda_fill(dout.p, 0xff, dout.n, &err);
                if (!st)
                    st = di_cuda_gemm_mxfp4_grouped(dqa.p, dsa.p, k, dw.p, dws.p, n, dids.p, doff.p, 4, drows.p,
                                                    vs[v].max_rows, dout.p, DI_DTYPE_F32, NULL, &err);
                if (!st) st = di_cuda_synchronize(&err);
                CHECKF(st == DI_OK, "%s", err.msg);
                dget(v ? out : ref, dout);
                if (!v) {
                    int64_t bad = 0;
                    for (int p = 0; p < np; p++) {
                        const int t = rows[p];
                        ref_gemm(1, qa + (size_t)t * k, sa + (size_t)t * kbn, 1, k, w + (size_t)pexp[p] * wb,
                                 ws + (size_t)pexp[p] * sb, n, ex, bound, abs_sum);
                        for (int64_t j = 0; j < n; j++)
                            if (!(fabs(ref[(size_t)p * n + j] - ex[j]) <= bound[j])) bad++;
                    }
                    CHECKF(bad == 0, "mxfp4 slots n %lld k %lld: %lld of %lld outputs off the exact result",
                           (long long)n, (long long)k, (long long)bad, (long long)(np * n));
                    continue;
                }
                int64_t differ = 0;
                for (int64_t i = 0; i < np * n; i++) differ += memcmp(&out[i], &ref[i], 4) != 0;
                CHECKF(differ == 0, "mxfp4 n %lld k %lld, %d slots (0 chosen), %s form%s, max_rows %d: %lld of %lld "
                       "outputs differ from one slot a tile",
                       (long long)n, (long long)k, vs[v].tr, vs[v].a8 < 0 ? "chosen" : vs[v].a8 ? "A8" : "f16",
                       wg ? " (WG)" : "", vs[v].max_rows, (long long)differ, (long long)(np * n));
            }
        }
        cuda_fp4_dec_set_wg(-1);
        cuda_fp4_dec_set_tr(0);
        cuda_fp4_dec_set_a8(-1);
        cuda_matvec_set_grouped_tiled(1);
        cuda_matvec_set_fp4_dec(-1);
        dbuf all[] = {dqa, dsa, dw, dws, dids, doff, drows, dout};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) di_cuda_free(all[i].p);
        free(x); free(sa); free(qa); free(w); free(ws); free(ref); free(out); free(ex); free(bound); free(abs_sum);
    }
#endif
}

int main(void) {
    const char *seed = getenv("DI_TEST_SEED");
    rng_state = seed && *seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL) * 2654435761u; /* empty: the clock */
    printf("seed %llu\n", (unsigned long long)rng_state);
    RUN(test_bad_arguments);
    RUN(test_act_quant);
    RUN(test_gemm_fp8_matvec);
    RUN(test_gemm_fp8_tiled);
    RUN(test_gemm_fp8_narrow);
    RUN(test_gemm_mxfp4);
    RUN(test_gemm_mxfp4_grouped);
    RUN(test_batch_invariance);
    RUN(test_grouped_spread);
    RUN(test_grouped_many_rows);
    RUN(test_dependent_launches);
    RUN(test_fp8_cluster8);
    RUN(test_e4m3_forms);
    RUN(test_matmul_decode_form);
    RUN(test_matmul_prefill_form);
    RUN(test_fp4_dec_form);
    RUN(test_fp4_dec_pair);
    RUN(test_fp4_dec_slots);
#if defined(DI_HAVE_CUDA)
    /* the MXFP4 tests again with the decode form everywhere and with it
     * nowhere (the wgmma / mma.sync kernels); the default runs its
     * tensor-core kernel wherever that applies and its CUDA-core one on
     * grouped products past 16 rows only */
    for (int mode = 1; mode >= 0; mode--) {
        cuda_matvec_set_fp4_dec(mode);
        RUN(test_gemm_mxfp4);
        RUN(test_gemm_mxfp4_grouped);
        RUN(test_grouped_spread);
        RUN(test_grouped_many_rows);
        RUN(test_dependent_launches);
    }
    cuda_matvec_set_fp4_dec(-1);
#endif
    return test_summary();
}
