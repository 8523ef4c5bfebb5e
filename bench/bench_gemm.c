/* CPU kernel benchmark (architecture.md §2; performance.md §4.3): FP8 and
 * MXFP4 linears on real V4.1-Flash shapes against OpenBLAS sgemm on the same
 * weights dequantized to fp32 (same thread count, same run), and the decode
 * path against the memory bandwidth measured in the same run.
 *
 *   build/bench/bench_gemm [--quick] [--threads N] [--only WEIGHT] [--ms M,M,..] [--cputime] [--rounds R]
 *   build/bench/bench_gemm --decode [--rounds R] [--quick] [--only WEIGHT]
 *   (either form: --half forces the FP8 route of CPUs with slow subnormals,
 *   E4M3 codes through F16C, which non-AMD CPUs take anyway; --narrow keeps
 *   a CPU with AVX-512 on the 256-bit kernels; --no-amx keeps a CPU with
 *   AMX-BF16 off the MXFP4 prefill's tiles; --cold reads the prefill
 *   products' weights from rotating copies (from DRAM, as the decode rows
 *   always do, and as a model's experts do) rather than one copy that the
 *   cache may hold; --no-vnni keeps a CPU with
 *   AVX-512 VNNI off the MXFP4 decode rows' VNNI sums; --no-bytes keeps
 *   their calls of one or two rows on the 16-bit sums rather than the byte
 *   form (either width); --no-avx-vnni keeps the 256-bit kernels (a CPU
 *   without AVX-512, or --narrow) off AVX-VNNI's byte sums; --no-bias keeps the
 *   512-bit FP8 decode rows on F16C rather than the exponent bias; --no-seg
 *   keeps their batches of 3-16 rows on blocks of 4 rows over all of K
 *   rather than in K segments; --pf / --no-pf force the FP8 decode rows'
 *   software prefetches on or off (by default measured on the first large
 *   calls of each batch class, or fixed by DI_CPU_PREFETCH=1 / 0; the
 *   choice is printed after the table); --layout mapped puts the weights
 *   16 bytes past a cache line on 4 KB pages, as a checkpoint's mapping
 *   holds them, rather than as the engine copies them on the CPU (64-byte
 *   aligned, on 2 MB pages; model/weights_memory.h); the FP8 codes are
 *   drawn as a checkpoint's (--weights normal, the default, see
 *   normal_codes); --weights random draws uniformly random bytes instead,
 *   whose many subnormal codes take the decode rows' slower table fix)
 *   (--quick: shorter timing, skips the largest prefill)
 *
 * The peer is OpenBLAS at its best on this CPU: a build that does not know
 * the CPU model (Debian's 0.3.21 on recent Xeons, common in VMs) falls back
 * to its generic SSE3 kernels ("Prescott", several times slower), so when
 * OPENBLAS_CORETYPE is unset and OpenBLAS reports such a core, the program
 * runs itself again with the core type the CPU's vector units call for
 * (SkylakeX with AVX-512, Haswell with AVX2) and prints which one it used.
 *
 * --decode compares decode rows (M = 1, 2 and 4) with the read bandwidth side
 * by side: each of R rounds (default 3) measures, in this order, the read
 * bandwidth on one thread, every weight's product on one thread, the read
 * bandwidth on all threads and every product on all threads; one-thread
 * timings use the thread's CPU-time clock, all-thread ones the wall clock.
 * The table gives, per weight, the medians over the rounds of GB/s and of
 * the per-round ratio GB/s / bandwidth. The machine is shared and its read
 * bandwidth moves from minute to minute (12.5 to 17.5 GB/s on one thread
 * of a 2-vCPU VM within an hour), so each product's ratio uses the mean of
 * a shorter read probe taken just before it and one just after (the probe
 * after one weight is the probe before the next); the header's bandwidth
 * is the round's first, full probe. Each round also times a loop of
 * independent 8-lane FMAs on one thread and on all: kernels.h gives every
 * FP8 weight code one FMA lane per activation row, so fma/s · 8 / M codes
 * per second is as fast as any FP8 kernel can read weights; the `ceil`
 * columns state it as a ratio to the same round's bandwidth (MXFP4 decode
 * rows sum by integers: no such ceiling).
 *
 * Times are medians of several runs. Prefill products (M > 16) alternate
 * with OpenBLAS R times (--rounds, default 3), each with a third of the
 * time budget: GFLOP/s are the medians over the rounds, vs_sg the median
 * of the rounds' ratios. Decode (M <= 16) streams rotating copies
 * of the weights, more than the last-level cache holds, so every call reads
 * its weights from DRAM as a real decode step does; prefill uses one copy.
 * GB/s counts the weight bytes (codes + scales) read per call. For M <= 4
 * hot GB/s is the same kernel on the first rows of one copy (<= 512 KB,
 * so they stay in the L2 cache): the rate the kernel's arithmetic allows,
 * which the DRAM figure can at best reach. */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/cpu/kernels.h"
#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/huge_alloc.h"
#include "core/threadpool.h"

void openblas_set_num_threads(int);
char *openblas_get_corename(void);

/* The generic cores OpenBLAS falls back to for a CPU model it does not
 * know; see the header. Returns only if no better core applies. */
static void openblas_best_core(char **argv) {
    const char *core = openblas_get_corename();
    if (getenv("OPENBLAS_CORETYPE") || !core) return;
    if (strcasecmp(core, "prescott") && strcasecmp(core, "core2") && strcasecmp(core, "nehalem") &&
        strcasecmp(core, "sandybridge"))
        return;
    const char *want = di_cpu_has_avx512() ? "SkylakeX" : di_cpu_has_avx2() ? "Haswell" : NULL;
    if (!want) return;
    setenv("OPENBLAS_CORETYPE", want, 1);
    execv("/proc/self/exe", argv); /* returns only on failure: keep the generic core */
    unsetenv("OPENBLAS_CORETYPE");
}

/* How the FP8 decode rows ran their software prefetches (kernels.h:
 * fixed, or measured per batch and row class on the first large calls). */
static void print_prefetch_choice(void) {
    const int fixed = di_cpu_kernels_dec_prefetch();
    if (strcmp(di_cpu_kernels_path(), "avx2")) return;
    if (fixed >= 0) {
        printf("# FP8 decode rows' software prefetch: %s (fixed)\n", fixed ? "on" : "off");
        return;
    }
    static const char *cls[3] = {"1 row", "2 rows", "3-16 rows"};
    printf("# FP8 decode rows' software prefetch, measured on the first calls:");
    for (int c = 0; c < DI_PF_CLASSES; c++) {
        const int d = di_cpu_kernels_dec_prefetch_measured(c);
        printf("%s %s%s %s", c ? "," : "", cls[c % 3], c >= 3 ? " (short rows)" : "",
               d < 0 ? "not decided" : d ? "on" : "off");
    }
    printf("\n");
}

/* CLOCK_THREAD_CPUTIME_ID with --cputime (one thread only): time this thread
 * actually ran, a proxy that other processes on a shared machine do not
 * inflate (their memory traffic still counts). */
static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now(void) {
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 20);
}

/* ---- memory bandwidth: threads read disjoint parts of a large buffer ---- */

typedef struct bw_ctx {
    const uint64_t *buf;
    int64_t words;
    volatile uint64_t sink[64];
} bw_ctx;

static void bw_read(void *ctx, int64_t b, int64_t e, int thread) {
    bw_ctx *c = ctx;
    int64_t per = c->words / 64;
    for (int64_t part = b; part < e; part++) {
        const uint64_t *p = c->buf + part * per;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (int64_t i = 0; i < per; i += 4) s0 ^= p[i], s1 ^= p[i + 1], s2 ^= p[i + 2], s3 ^= p[i + 3];
        c->sink[part] = s0 ^ s1 ^ s2 ^ s3;
    }
}

static double median_of(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return t[n / 2];
}

/* Median read rate over reps passes of a 512 MB buffer on 2 MB pages, as
 * the weights are: on the 2-vCPU Xeon VM the same read of a buffer on 4 KB
 * pages runs ~15 % slower (page walks), and measured so the probe would
 * flatter every product read from huge pages. One buffer for the whole
 * run: a fresh 512 MB of huge pages for every probe had the kernel
 * compacting memory (moving the weights' pages too) while the products
 * ran, some of them 2x slower. */
static double measure_read_bw_reps(di_threadpool *tp, int reps) {
    const int64_t bytes = (int64_t)512 << 20;
    bw_ctx c = {.words = bytes / 8};
    static uint64_t *buf;
    if (!buf) {
        buf = di_huge_alloc((size_t)bytes);
        if (!buf) {
            fprintf(stderr, "bench_gemm: out of memory for the read probe\n");
            exit(1);
        }
        for (int64_t i = 0; i < c.words; i++) buf[i] = (uint64_t)i * 0x9e3779b97f4a7c15ull;
    }
    c.buf = buf;
    double t[7];
    if (reps > 7) reps = 7;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        di_threadpool_for(tp, 64, 1, bw_read, &c);
        t[r] = now() - t0;
    }
    return bytes / median_of(t, reps) / 1e9;
}
static double measure_read_bw(di_threadpool *tp) { return measure_read_bw_reps(tp, 7); }

/* The same read with the clock chosen for it (CPU time needs tp == NULL). */
static double measure_read_bw_clock(di_threadpool *tp, clockid_t clk, int reps) {
    clockid_t saved = bench_clock;
    bench_clock = clk;
    double bw = measure_read_bw_reps(tp, reps);
    bench_clock = saved;
    return bw;
}

static double measure_memcpy_bw(void) {
    const size_t bytes = (size_t)512 << 20;
    char *a = malloc(bytes), *b = malloc(bytes);
    memset(a, 1, bytes), memset(b, 2, bytes);
    double t[5];
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        memcpy(b, a, bytes);
        t[r] = now() - t0;
    }
    free(a), free(b);
    return 2.0 * bytes / median_of(t, 5) / 1e9; /* read + write */
}

/* ---- the FMA rate: what the lane contract of kernels.h allows ----
 * Every weight code of a decode row becomes one fp32 lane of one FMA per
 * activation row (eight lanes per instruction), so a core cannot read more
 * than fma/s · 8 / M codes per second, whatever the decoding costs on top. */

enum { FMA_ITERS = 20000000 };

static void fma_spin(void *ctx, int64_t b, int64_t e, int thread) {
    for (int64_t part = b; part < e; part++) {
#if defined(__x86_64__) && defined(__FMA__)
        /* 10 independent chains: enough to cover the FMA latency on both
         * pipes. The registers start at zero inside the same statement: left
         * as they were, they could hold subnormals, which Intel cores take
         * through microcode assists (a rate 50x too low there). */
        long iters = FMA_ITERS;
        __asm__ volatile("vxorps %%ymm0,%%ymm0,%%ymm0\n\tvxorps %%ymm1,%%ymm1,%%ymm1\n\t"
                         "vxorps %%ymm2,%%ymm2,%%ymm2\n\tvxorps %%ymm3,%%ymm3,%%ymm3\n\t"
                         "vxorps %%ymm4,%%ymm4,%%ymm4\n\tvxorps %%ymm5,%%ymm5,%%ymm5\n\t"
                         "vxorps %%ymm6,%%ymm6,%%ymm6\n\tvxorps %%ymm7,%%ymm7,%%ymm7\n\t"
                         "vxorps %%ymm8,%%ymm8,%%ymm8\n\tvxorps %%ymm9,%%ymm9,%%ymm9\n\t"
                         "vxorps %%ymm14,%%ymm14,%%ymm14\n\tvxorps %%ymm15,%%ymm15,%%ymm15\n"
                         "1:\n\t"
                         "vfmadd231ps %%ymm15,%%ymm14,%%ymm0\n\tvfmadd231ps %%ymm15,%%ymm14,%%ymm1\n\t"
                         "vfmadd231ps %%ymm15,%%ymm14,%%ymm2\n\tvfmadd231ps %%ymm15,%%ymm14,%%ymm3\n\t"
                         "vfmadd231ps %%ymm15,%%ymm14,%%ymm4\n\tvfmadd231ps %%ymm15,%%ymm14,%%ymm5\n\t"
                         "vfmadd231ps %%ymm15,%%ymm14,%%ymm6\n\tvfmadd231ps %%ymm15,%%ymm14,%%ymm7\n\t"
                         "vfmadd231ps %%ymm15,%%ymm14,%%ymm8\n\tvfmadd231ps %%ymm15,%%ymm14,%%ymm9\n\t"
                         "dec %0\n\tjnz 1b"
                         : "+r"(iters)
                         :
                         : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                           "xmm14", "xmm15", "cc");
#endif
    }
}

/* 8-lane FMAs per second on the pool's threads together (0 where the
 * benchmark was built without FMA). */
static double measure_fma_rate(di_threadpool *tp) {
#if defined(__x86_64__) && defined(__FMA__)
    const int n = di_threadpool_size(tp);
    double t0 = now();
    di_threadpool_for(tp, n, 1, fma_spin, NULL);
    return (double)n * FMA_ITERS * 10 / (now() - t0);
#else
    (void)tp;
    return 0;
#endif
}

/* ---- one weight matrix in its checkpoint format ---- */

typedef struct wmat {
    const char *name;
    int fp4;
    int64_t N, K;
} wmat;

typedef struct wcopy {
    uint8_t *w, *ws;
    void *wb, *wsb; /* the blocks w and ws lie in (free() them) */
} wcopy;

static size_t w_bytes(const wmat *m) { return (size_t)(m->fp4 ? m->N * m->K / 2 : m->N * m->K); }
static size_t ws_bytes(const wmat *m) {
    return (size_t)(m->fp4 ? m->N * (m->K / 32) : ((m->N + 31) / 32) * (m->K / 32));
}

/* --weights normal: FP8 codes of normally distributed weights quantized as a
 * checkpoint's 32x32 blocks are (the block's largest, ~3.3 sigma of 1,024
 * values, at 448), through a table of 65,536 quantiles: codes of exponent 0
 * (below 2^-6 of 448) come up a few times in 10^4, where uniformly random
 * bytes (--weights random) give 7 in 128: almost every 64-code chunk of a
 * decode row then holds one and takes the exponent-bias decoding's table
 * fix (kernels_avx2_block.c), which a checkpoint's rows take in ~6 chunk
 * pairs of 1,000 (one FP8 row on the 2-vCPU Xeon VM: 0.66 of the read
 * bandwidth on random bytes, 0.77 on these codes, 2026-12-05). MXFP4 codes
 * stay random (every E2M1 code is as likely in a checkpoint). */
static uint8_t *normal_codes;
static void normal_codes_init(void) {
    normal_codes = malloc(65536);
    for (int u = 0; u < 65536; u++) {
        const double p = (u + 0.5) / 65536.0;
        double lo = -8, hi = 8; /* the quantile by bisection on the normal CDF */
        for (int it = 0; it < 60; it++) {
            const double mid = 0.5 * (lo + hi);
            if (0.5 * erfc(-mid / sqrt(2.0)) < p) lo = mid;
            else hi = mid;
        }
        double v = 0.5 * (lo + hi) / 3.3 * 448.0;
        if (v > 448) v = 448;
        if (v < -448) v = -448;
        normal_codes[u] = di_f32_to_e4m3((float)v);
    }
}

/* Where the weights lie (--layout): by default as the engine holds them on
 * the CPU (a checkpoint's weights copied into memory, or dummy weights:
 * 64-byte aligned, on 2 MB pages; model/weights_memory.h); `--layout
 * mapped` as a checkpoint's mapping gives them: 16 bytes past a 64-byte
 * line (a safetensors data section starts wherever its header's length
 * leaves it; the golden fixtures' 16 and 56 bytes past one) on 4 KB pages. */
static int layout_mapped;
static uint8_t *weight_block(size_t n, void **block) {
    if (!layout_mapped) return *block = di_huge_alloc(n);
    uint8_t *p = NULL;
    if (posix_memalign((void **)&p, 4096, n + 64)) return *block = NULL;
#ifdef MADV_NOHUGEPAGE
    (void)madvise(p, n + 64, MADV_NOHUGEPAGE);
#endif
    *block = p;
    return p + 16;
}

static void wcopy_fill(const wmat *m, wcopy *c) {
    c->w = weight_block(w_bytes(m), &c->wb);
    c->ws = weight_block(ws_bytes(m), &c->wsb);
    if (!c->w || !c->ws) {
        fprintf(stderr, "bench_gemm: out of memory for the weights\n");
        exit(1);
    }
    for (size_t i = 0; i < w_bytes(m); i++) {
        uint8_t b = (uint8_t)rnd();
        if (!m->fp4 && normal_codes) b = normal_codes[rnd() & 0xffff];
        if (!m->fp4 && (b & 0x7f) == 0x7f) b = 0x30;
        c->w[i] = b;
    }
    for (size_t i = 0; i < ws_bytes(m); i++) c->ws[i] = (uint8_t)(118 + rnd() % 8);
}

static float *dequant(const wmat *m, const wcopy *c) {
    float *d = malloc(sizeof(float) * m->N * m->K);
    int64_t KB = m->K / 32;
    for (int64_t n = 0; n < m->N; n++)
        for (int64_t k = 0; k < m->K; k++) {
            float v, s;
            if (m->fp4) {
                v = di_e2m1_to_f32((uint8_t)(c->w[n * (m->K / 2) + k / 2] >> (4 * (k & 1))));
                s = di_e8m0_to_f32(c->ws[n * KB + k / 32]);
            } else {
                v = di_e4m3_to_f32(c->w[n * m->K + k]);
                s = di_e8m0_to_f32(c->ws[(n / 32) * KB + k / 32]);
            }
            d[n * m->K + k] = v * s;
        }
    return d;
}

/* Runs fn until ~budget seconds or max_reps, at least 3 times; median. */
#define TIME_MEDIAN(result, budget, stmt)                                   \
    do {                                                                    \
        double ts_[15];                                                     \
        int n_ = 0;                                                         \
        double start_ = now();                                              \
        while (n_ < 15 && (n_ < 3 || now() - start_ < (budget))) {          \
            double t0_ = now();                                             \
            stmt;                                                           \
            ts_[n_++] = now() - t0_;                                        \
        }                                                                   \
        result = median_of(ts_, n_);                                        \
    } while (0)

/* ---- --decode: decode rows against the bandwidth, one thread and all ---- */

enum { MAX_ROUNDS = 15, MAX_MS = 16 };

typedef struct dec_row {
    const wmat *m;
    int64_t M;
    double gbs[2][MAX_ROUNDS], ratio[2][MAX_ROUNDS]; /* [one thread, all threads][round] */
    double ceil_ratio[2][MAX_ROUNDS]; /* FMA-rate ceiling / read bw */
    double hot;
} dec_row;

/* Random bf16 activations in [-1, 1], quantized as the engine does. */
static void quant_random_act(int64_t M, int64_t K, uint8_t *qa, float *sa) {
    float *x = malloc(sizeof(float) * M * K);
    for (int64_t i = 0; i < M * K; i++) x[i] = di_round_bf16(((int)(rnd() % 2001) - 1000) * 1e-3f);
    di_act_quant_fp8(x, M, K, qa, sa);
    free(x);
}

/* Median GB/s of the product over rotating weight copies. */
static double time_decode(const wmat *m, wcopy *cp, int ncopy, const uint8_t *qa, const float *sa,
                          int64_t M, float *out, di_threadpool *tp, clockid_t clk,
                          double budget) {
    clockid_t saved = bench_clock;
    bench_clock = clk;
    int rot = 0;
    double t;
    TIME_MEDIAN(t, budget, {
        wcopy *c = &cp[rot++ % ncopy];
        if (m->fp4) di_gemm_mxfp4(qa, sa, M, m->K, c->w, c->ws, m->N, out, tp);
        else di_gemm_fp8(qa, sa, M, m->K, c->w, c->ws, m->N, out, tp);
    });
    bench_clock = saved;
    return (double)(w_bytes(m) + ws_bytes(m)) / t / 1e9;
}

static int run_decode_pairs(const wmat *mats, size_t nmats, const char *only, int rounds, int quick,
                            di_threadpool *tp) {
    const double budget = quick ? 0.2 : 0.5;
    enum { NM = 3 };
    const int64_t Ms[NM] = {1, 2, 4};
    dec_row rows[32];
    int nrows = 0;
    double bw[2][MAX_ROUNDS], fma[2][MAX_ROUNDS];
    /* weights and activations made once, reused by every round */
    wcopy *copies[8] = {0};
    int ncopies[8] = {0};
    uint8_t *qa[NM];
    float *sa[NM], *out = NULL;
    int64_t kmax = 0, nmax = 0;
    for (size_t mi = 0; mi < nmats; mi++) {
        if (only && strcmp(only, mats[mi].name) != 0) continue;
        const wmat *m = &mats[mi];
        size_t bytes = w_bytes(m) + ws_bytes(m);
        int ncopy = (int)((256u << 20) / bytes) + 1;
        if (ncopy > 64) ncopy = 64;
        ncopies[mi] = ncopy;
        copies[mi] = calloc((size_t)ncopy, sizeof(wcopy));
        for (int c = 0; c < ncopy; c++) wcopy_fill(m, &copies[mi][c]);
        if (m->K > kmax) kmax = m->K;
        if (m->N > nmax) nmax = m->N;
        for (size_t xi = 0; xi < NM; xi++) rows[nrows++] = (dec_row){m, Ms[xi], {{0}}, {{0}}, {{0}}, 0};
    }
    if (!nrows) return 1;
    for (int xi = 0; xi < NM; xi++) {
        qa[xi] = malloc((size_t)(Ms[xi] * kmax));
        sa[xi] = malloc(sizeof(float) * Ms[xi] * (kmax / 32));
    }
    out = malloc(sizeof(float) * 4 * nmax);
    /* hot: the first rows of one copy (<= 512 KB, L2), one thread; the
     * first row measured twice and the first reading dropped: its ~1 ms of
     * calls otherwise ran on a core still leaving an idle clock (the first
     * weight's hot figure read 3-4 GB/s against 13-15 for the others) */
    for (int r = -1; r < nrows; r++) {
        const int rr = r < 0 ? 0 : r;
        const wmat *m = rows[rr].m;
        const int xi = rows[rr].M == 1 ? 0 : rows[rr].M == 2 ? 1 : 2;
        quant_random_act(rows[rr].M, m->K, qa[xi], sa[xi]);
        int64_t nh = (512 << 10) / (m->fp4 ? m->K / 2 + m->K / 32 : m->K + m->K / 32 / 32) / 32 * 32;
        if (nh > m->N) nh = m->N;
        wmat mh = *m;
        mh.N = nh;
        rows[rr].hot = time_decode(&mh, &copies[m - mats][0], 1, qa[xi], sa[xi], rows[rr].M, out, NULL,
                                   CLOCK_THREAD_CPUTIME_ID, r < 0 ? budget : budget / 2);
    }
    for (int round = 0; round < rounds; round++) {
        for (int all = 0; all < 2; all++) {
            di_threadpool *p = all ? tp : NULL;
            clockid_t clk = all ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID;
            bw[all][round] = measure_read_bw_clock(p, clk, 7);
            {
                clockid_t saved = bench_clock;
                bench_clock = clk;
                fma[all][round] = measure_fma_rate(p);
                bench_clock = saved;
            }
            /* A dropped warm-up of the first row: the first product timed
             * after the two probes read low on one thread, whichever weight
             * came first (the Zen 4 VM, 2026-12-04, --only: wkv first 0.53
             * of the bandwidth, 0.98 after a warm-up; wq_a 0.50 and 0.96;
             * in the whole table wq_a 0.50-0.54 first, 0.88 second). */
            {
                const wmat *m = rows[0].m;
                quant_random_act(rows[0].M, m->K, qa[0], sa[0]);
                (void)time_decode(m, copies[m - mats], ncopies[m - mats], qa[0], sa[0], rows[0].M, out, p, clk,
                                  2 * budget);
            }
            double bw_before = measure_read_bw_clock(p, clk, 3);
            for (int r = 0; r < nrows; r++) {
                const wmat *m = rows[r].m;
                const int xi = rows[r].M == 1 ? 0 : rows[r].M == 2 ? 1 : 2;
                /* activations of this K (the buffers hold the largest) */
                quant_random_act(rows[r].M, m->K, qa[xi], sa[xi]);
                double g = time_decode(m, copies[m - mats], ncopies[m - mats], qa[xi], sa[xi], rows[r].M,
                                       out, p, clk, budget);
                const double bw_after = measure_read_bw_clock(p, clk, 3);
                rows[r].gbs[all][round] = g;
                rows[r].ratio[all][round] = g / (0.5 * (bw_before + bw_after));
                bw_before = bw_after;
                /* FP8 codes + scales per code: 1 + 1/1024; MXFP4 rows sum by integers (no FMA lane
                 * per code, kernels.h), so no such ceiling */
                rows[r].ceil_ratio[all][round] =
                    m->fp4 ? NAN : fma[all][round] * 8 / (double)rows[r].M * (1.0 + 1.0 / 1024) / 1e9 / bw[all][round];
            }
        }
        fprintf(stderr, "round %d: read %.1f GB/s (1 thread), %.1f GB/s (%d threads); FMA %.2f G/s, %.2f G/s\n",
                round + 1, bw[0][round], bw[1][round], di_threadpool_size(tp), fma[0][round] / 1e9,
                fma[1][round] / 1e9);
    }
    double bw_med[2], fma_med[2];
    for (int all = 0; all < 2; all++) {
        double t[MAX_ROUNDS];
        memcpy(t, bw[all], sizeof t);
        bw_med[all] = median_of(t, rounds);
        memcpy(t, fma[all], sizeof t);
        fma_med[all] = median_of(t, rounds);
    }
    printf("# CPU kernels, decode rows: path %s%s%s (%s), %d rounds; 1 thread = thread CPU time, %d threads = wall clock\n",
           di_cpu_kernels_path(), di_cpu_kernels_wide() ? " with 512-bit vectors" : "",
           di_cpu_kernels_vnni() ? " and VNNI sums" : "", di_cpu_describe(), rounds,
           di_threadpool_size(tp));
    printf("# FP8 weight codes: %s\n", normal_codes ? "normally distributed values, quantized as a checkpoint's"
                                                    : "uniformly random bytes");
    printf("# weights: %s\n", layout_mapped ? "16 bytes past a 64-byte line on 4 KB pages, as a mapped checkpoint "
                                              "(--layout mapped)"
                                            : "64-byte aligned on 2 MB pages, as the engine holds them on the CPU");
    printf("# read bandwidth, median of the rounds: %.1f GB/s (1 thread), %.1f GB/s (%d threads)\n",
           bw_med[0], bw_med[1], di_threadpool_size(tp));
    printf("# 8-lane FMAs, median of the rounds: %.2f G/s (1 thread), %.2f G/s (%d threads)\n",
           fma_med[0] / 1e9, fma_med[1] / 1e9, di_threadpool_size(tp));
    printf("# GB/s = weight bytes (codes + scales) per call / t, from DRAM; vs_bw = median over the rounds of\n"
           "# GB/s / the mean of the read probes just before and just after it;\n"
           "# ceil = FMA rate x 8 codes / M as weight GB/s over the read bw (kernels.h: one FMA lane per FP8\n"
           "# code and activation row), the most vs_bw can reach (MXFP4: none); hot = 1 thread, weights in L2\n");
    printf("%-14s %-5s %2s %8s %6s %6s %8s %6s %6s %8s\n", "weight", "fmt", "M", "1t_GB/s", "vs_bw",
           "ceil", "nt_GB/s", "vs_bw", "ceil", "hot");
    for (int r = 0; r < nrows; r++) {
        double med[2][3];
        for (int all = 0; all < 2; all++) {
            double t[MAX_ROUNDS];
            memcpy(t, rows[r].gbs[all], sizeof t);
            med[all][0] = median_of(t, rounds);
            memcpy(t, rows[r].ratio[all], sizeof t);
            med[all][1] = median_of(t, rounds);
            memcpy(t, rows[r].ceil_ratio[all], sizeof t);
            med[all][2] = median_of(t, rounds);
        }
        char ceil1[16] = "     -", ceiln[16] = "     -"; /* MXFP4: no FMA ceiling */
        if (!isnan(med[0][2])) snprintf(ceil1, sizeof ceil1, "%6.2f", med[0][2]);
        if (!isnan(med[1][2])) snprintf(ceiln, sizeof ceiln, "%6.2f", med[1][2]);
        printf("%-14s %-5s %2lld %8.1f %6.2f %s %8.1f %6.2f %s %8.1f\n", rows[r].m->name,
               rows[r].m->fp4 ? "mxfp4" : "fp8", (long long)rows[r].M, med[0][0], med[0][1], ceil1,
               med[1][0], med[1][1], ceiln, rows[r].hot);
    }
    print_prefetch_choice();
    for (size_t mi = 0; mi < nmats; mi++) {
        for (int c = 0; c < ncopies[mi]; c++) free(copies[mi][c].wb), free(copies[mi][c].wsb);
        free(copies[mi]);
    }
    for (int xi = 0; xi < NM; xi++) free(qa[xi]), free(sa[xi]);
    free(out);
    return 0;
}

int main(int argc, char **argv) {
    int quick = 0, threads = 0, decode_only = 0, rounds = 3, cold = 0, random_codes = 0;
    const char *only = NULL, *ms_list = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--decode")) decode_only = 1;
        else if (!strcmp(argv[i], "--cputime")) bench_clock = CLOCK_THREAD_CPUTIME_ID;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--half")) di_cpu_kernels_force_fp8_half(1);
        else if (!strcmp(argv[i], "--narrow")) di_cpu_kernels_force_no_avx512(1);
        else if (!strcmp(argv[i], "--no-vnni")) di_cpu_kernels_force_no_vnni(1);
        else if (!strcmp(argv[i], "--no-amx")) di_cpu_kernels_force_no_amx(1);
        else if (!strcmp(argv[i], "--cold")) cold = 1;
        else if (!strcmp(argv[i], "--no-bytes")) di_cpu_kernels_force_no_vnni_bytes(1);
        else if (!strcmp(argv[i], "--no-avx-vnni")) di_cpu_kernels_force_no_avx_vnni(1);
        else if (!strcmp(argv[i], "--no-bias")) di_cpu_kernels_force_no_bias(1);
        else if (!strcmp(argv[i], "--no-seg")) di_cpu_kernels_force_no_seg(1);
        else if (!strcmp(argv[i], "--pf")) di_cpu_kernels_force_dec_prefetch(1);
        else if (!strcmp(argv[i], "--no-pf")) di_cpu_kernels_force_dec_prefetch(-1);
        else if (!strcmp(argv[i], "--ms") && i + 1 < argc) ms_list = argv[++i];
        else if (!strcmp(argv[i], "--layout") && i + 1 < argc && !strcmp(argv[i + 1], "mapped")) layout_mapped = 1, i++;
        else if (!strcmp(argv[i], "--layout") && i + 1 < argc && !strcmp(argv[i + 1], "memory")) layout_mapped = 0, i++;
        else if (!strcmp(argv[i], "--weights") && i + 1 < argc && !strcmp(argv[i + 1], "normal")) random_codes = 0, i++;
        else if (!strcmp(argv[i], "--weights") && i + 1 < argc && !strcmp(argv[i + 1], "random")) random_codes = 1, i++;
        else {
            fprintf(stderr, "bench_gemm: unknown argument %s (see the comment at the top of bench/bench_gemm.c)\n", argv[i]);
            return 1;
        }
    }
    if (!random_codes) normal_codes_init();
    int64_t Ms[MAX_MS] = {1, 4, 8, 16, 24, 64, 512};
    size_t nms = 7;
    if (ms_list) { /* --ms: the batch sizes given instead */
        nms = 0;
        for (const char *q = ms_list; *q;) {
            char *end;
            const long v = strtol(q, &end, 10);
            if (end == q || v < 1 || v > 4096 || (*end && *end != ',') || nms == MAX_MS) {
                fprintf(stderr, "bench_gemm: --ms wants up to %d comma-separated batch sizes 1..4096\n", MAX_MS);
                return 1;
            }
            Ms[nms++] = v;
            q = *end ? end + 1 : end;
        }
    }
    openblas_best_core(argv);
    if (threads <= 0) threads = di_cpu_count();
    if (bench_clock != CLOCK_MONOTONIC && threads != 1) {
        fprintf(stderr, "bench_gemm: --cputime needs --threads 1\n");
        return 1;
    }
    di_err err;
    di_threadpool *tp = NULL;
    if (di_threadpool_create(threads, &tp, &err) != DI_OK) {
        fprintf(stderr, "bench_gemm: %s\n", err.msg);
        return 1;
    }
    openblas_set_num_threads(threads);
    const double budget = quick ? 0.2 : 1.0;
    const wmat mats[] = {
        {"wq_a", 0, 1280, 5120},      {"wkv", 0, 512, 5120},        {"wo_b", 0, 5120, 8192},
        {"shared.w1", 0, 2304, 5120}, {"expert.w1", 1, 2304, 5120}, {"expert.w2", 1, 5120, 2304},
    };
    if (rounds < 1 || rounds > MAX_ROUNDS) rounds = 3;
    if (decode_only) {
        int rc = run_decode_pairs(mats, sizeof mats / sizeof *mats, only, rounds, quick, tp);
        di_threadpool_destroy(tp);
        return rc;
    }

    double bw = measure_read_bw(tp), bw_cpy = measure_memcpy_bw();
    printf("# CPU kernels: path %s%s (%s), %d thread(s), %s; OpenBLAS core %s\n", di_cpu_kernels_path(),
           di_cpu_kernels_wide() ? " with 512-bit vectors" : "", di_cpu_describe(), threads,
           bench_clock == CLOCK_MONOTONIC ? "wall-clock medians" : "thread CPU-time medians",
           openblas_get_corename());
    printf("# memory: read %.1f GB/s (%d threads), memcpy %.1f GB/s (1 thread, read+write)\n", bw,
           threads, bw_cpy);
    printf("# weights: %s; FP8 codes %s\n",
           layout_mapped ? "16 bytes past a 64-byte line on 4 KB pages (--layout mapped)" : "64-byte aligned on 2 MB pages",
           normal_codes ? "as a checkpoint's" : "uniformly random bytes (--weights random)");
    printf("# GFLOP/s = 2MNK/t; vs-sgemm = ours/OpenBLAS sgemm on fp32-dequantized weights;\n"
           "# GB/s = weight bytes per call / t (decode rows: weights from DRAM); vs-bw = GB/s / read bw;\n"
           "# hot = GB/s of decode rows (M <= 4) with their weights in L2\n");
    printf("%-14s %-5s %4s %9s %9s %9s %7s %8s %6s %8s\n", "weight", "fmt", "M", "ours_ms", "GFLOP/s",
           "sgemm", "vs_sg", "GB/s", "vs_bw", "hot");

    for (size_t mi = 0; mi < sizeof mats / sizeof *mats; mi++) {
        const wmat *m = &mats[mi];
        if (only && strcmp(only, m->name) != 0) continue;
        size_t bytes = w_bytes(m) + ws_bytes(m);
        /* enough copies to exceed the last-level cache several times */
        int ncopy = (int)((256u << 20) / bytes) + 1;
        if (ncopy > 64) ncopy = 64;
        if (quick && ncopy > 8) ncopy = 8;
        wcopy *cp = calloc((size_t)ncopy, sizeof *cp);
        for (int c = 0; c < ncopy; c++) wcopy_fill(m, &cp[c]);
        float *wd = dequant(m, &cp[0]);
        for (size_t xi = 0; xi < nms; xi++) {
            int64_t M = Ms[xi], K = m->K, N = m->N;
            if (quick && M == 512 && N * K > 20000000) continue;
            float *x = malloc(sizeof(float) * M * K), *out = malloc(sizeof(float) * M * N);
            float *sa = malloc(sizeof(float) * M * (K / 32));
            uint8_t *qa = malloc((size_t)(M * K));
            for (int64_t i = 0; i < M * K; i++) x[i] = di_round_bf16(((int)(rnd() % 2001) - 1000) * 1e-3f);
            di_act_quant_fp8(x, M, K, qa, sa);
            int rot = 0;
            double t_ours, t_blas, hot = 0;
            if (M <= 4) { /* decode rows */
                /* whole 32-row scale tiles, codes + scales <= 512 KB */
                int64_t nh = (512 << 10) / (m->fp4 ? K / 2 + K / 32 : K + K / 32 / 32) / 32 * 32;
                if (nh > N) nh = N;
                if (nh < 1) nh = N < 32 ? N : 32;
                double t_hot;
                TIME_MEDIAN(t_hot, budget / 2, {
                    if (m->fp4) di_gemm_mxfp4(qa, sa, M, K, cp[0].w, cp[0].ws, nh, out, tp);
                    else di_gemm_fp8(qa, sa, M, K, cp[0].w, cp[0].ws, nh, out, tp);
                });
                wmat mh = *m;
                mh.N = nh;
                hot = (double)(w_bytes(&mh) + ws_bytes(&mh)) / t_hot / 1e9;
            }
            if (M <= 16) {
                TIME_MEDIAN(t_ours, budget, {
                    wcopy *c = &cp[rot++ % ncopy];
                    if (m->fp4) di_gemm_mxfp4(qa, sa, M, K, c->w, c->ws, N, out, tp);
                    else di_gemm_fp8(qa, sa, M, K, c->w, c->ws, N, out, tp);
                });
            }
            /* the peer multiplies the activations the kernel saw (QDQ values) */
            for (int64_t i = 0; i < M * K; i++) x[i] = di_e4m3_to_f32(qa[i]) * sa[i / 32];
            double vs_sg;
            if (M <= 16) {
                TIME_MEDIAN(t_blas, budget,
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K,
                                        1.0f, x, (int)K, wd, (int)K, 0.0f, out, (int)N));
                vs_sg = t_blas / t_ours;
            } else {
                /* prefill: ours and the peer alternate `rounds` times, each
                 * with a share of the budget, and vs_sg is the median of
                 * the rounds' ratios (the machine's speed drifts between
                 * the two timings otherwise) */
                double to[MAX_ROUNDS], tb[MAX_ROUNDS], ratio[MAX_ROUNDS];
                for (int r = 0; r < rounds; r++) {
                    TIME_MEDIAN(to[r], budget / rounds, {
                        wcopy *c = &cp[cold ? rot++ % ncopy : 0];
                        if (m->fp4) di_gemm_mxfp4(qa, sa, M, K, c->w, c->ws, N, out, tp);
                        else di_gemm_fp8(qa, sa, M, K, c->w, c->ws, N, out, tp);
                    });
                    TIME_MEDIAN(tb[r], budget / rounds,
                                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K,
                                            1.0f, x, (int)K, wd, (int)K, 0.0f, out, (int)N));
                    ratio[r] = tb[r] / to[r];
                }
                t_ours = median_of(to, rounds);
                t_blas = median_of(tb, rounds);
                vs_sg = median_of(ratio, rounds);
            }
            double flops = 2.0 * M * N * K;
            double gbs = bytes / t_ours / 1e9;
            printf("%-14s %-5s %4lld %9.3f %9.1f %9.1f %7.2f %8.1f %6.2f", m->name,
                   m->fp4 ? "mxfp4" : "fp8", (long long)M, t_ours * 1e3, flops / t_ours / 1e9,
                   flops / t_blas / 1e9, vs_sg, gbs, gbs / bw);
            if (hot > 0) printf(" %8.1f\n", hot);
            else printf(" %8s\n", "-");
            fflush(stdout);
            free(x), free(out), free(sa), free(qa);
        }
        free(wd);
        for (int c = 0; c < ncopy; c++) free(cp[c].wb), free(cp[c].wsb);
        free(cp);
    }
    print_prefetch_choice();
    di_threadpool_destroy(tp);
    return 0;
}
