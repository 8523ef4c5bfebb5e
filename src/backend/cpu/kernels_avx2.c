/* AVX2 + FMA CPU kernels of the BF16 / FP32 linears and the FP8 activation
 * quantization (kernels.h; architecture.md §2, §8.3), compiled with
 * per-function target attributes so the library still runs on any x86-64 and
 * only calls these after di_cpu_has_avx2(). The FP8 / MXFP4 linears are in
 * kernels_avx2_block.c.
 *
 * Layout of the work. The output is cut into panels of NR = 16 columns (16
 * weight rows); threads take chunks of panels from the pool (and, where the
 * panels are too few for the threads, blocks of rows of them), so an output
 * is computed by one thread from start to end (no split-K). Weights are decoded
 * chunk by chunk into a small transposed tile Bp[k][16], and a
 * register-blocked micro-kernel runs MR = 6 activation rows at a time with
 * the 16 columns in the 8-float lanes of two registers. Each lane therefore
 * runs exactly the sequential chain of kernels.h, which is why the results
 * equal the scalar ones bit for bit whatever M or the thread count.
 * - Prefill (M > 16): a chunk of KC = 256 inputs of up to 16 panels is
 *   decoded to fp32 once, then every 6-row block of activations sweeps it:
 *   the decode cost is shared by all rows and the FMAs dominate.
 * - 1 to 4 BF16 rows on CPUs with AVX-512: no tiles, units of 32 weight
 *   rows straight from the rows ("BF16 rows at decode" below).
 * - Small batches (M <= 16): 4 panels × 64 inputs at a time; four panels
 *   side by side give the 8 independent FMA chains one row needs. The rows
 *   of the next chunk are prefetched: 64 rows far apart are too many streams
 *   for the hardware prefetchers. */
#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_words.h"

#ifdef DI_HAVE_AVX2_KERNELS

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")))
#define AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")))

enum { NR = 16, MR = 6, KC = 256, DECODE_ROWS = 16 };
/* Panels per parallel-for chunk at most, and the per-thread scratch. */
enum { MAX_CHUNK = 16, SCRATCH_FLOATS = MAX_CHUNK * KC * NR };
enum { FMT_BF16, FMT_F32 };

typedef struct job {
    int fmt;
    const float *ap;    /* packed activations [ceil(M/MR)][K][MR] */
    const void *w;      /* weights, checkpoint layout */
    int64_t M, K, N;
    float *out;         /* [M, N] */
    float *scratch;     /* [threads][SCRATCH_FLOATS]: decoded tiles */
    float *edge;        /* [M, 16]: the last panel when N % 16 != 0 */
    int64_t rows_unit;  /* rows split: rows a unit (a multiple of MR; 0: all rows) */
} job;

/* ---- micro-kernels: mr rows × np panels of 16 columns ----
 * Every lane is one output's sequential chain, and a chain is a sequence of
 * dependent FMAs, so throughput needs at least ~8 independent accumulators
 * (FMA latency × ports): single rows (mr = 1, 2) therefore run several
 * panels side by side. Bp of panel p is at bp + p·bps; c[p] / ldc[p] is
 * panel p's output tile. */

/* C = fma chain over kc inputs, C loaded first. */
AVX2_INLINE void ukr_plain(const int mr, const int np, int64_t kc, const float *ap,
                           const float *bp, int64_t bps, float *const *c, const int64_t *ldc) {
    __m256 acc[MR][8];
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++)
#pragma GCC unroll 6
        for (int m = 0; m < MR; m++)
            if (p < np && m < mr) {
                acc[m][2 * p] = _mm256_loadu_ps(c[p] + m * ldc[p]);
                acc[m][2 * p + 1] = _mm256_loadu_ps(c[p] + m * ldc[p] + 8);
            }
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k++) {
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
            if (p < np) {
                const float *b = bp + p * bps + k * NR;
                __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
                for (int m = 0; m < MR; m++)
                    if (m < mr) {
                        __m256 a = _mm256_broadcast_ss(ap + k * MR + m);
                        acc[m][2 * p] = _mm256_fmadd_ps(a, b0, acc[m][2 * p]);
                        acc[m][2 * p + 1] = _mm256_fmadd_ps(a, b1, acc[m][2 * p + 1]);
                    }
            }
    }
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++)
#pragma GCC unroll 6
        for (int m = 0; m < MR; m++)
            if (p < np && m < mr) {
                _mm256_storeu_ps(c[p] + m * ldc[p], acc[m][2 * p]);
                _mm256_storeu_ps(c[p] + m * ldc[p] + 8, acc[m][2 * p + 1]);
            }
}

typedef void (*ukr_plain_fn)(int64_t, const float *, const float *, int64_t, float *const *,
                             const int64_t *);

#define UKR_INSTANCES(mr, np)                                                               \
    static AVX2 void ukr_plain_##mr##_##np(int64_t kc, const float *ap, const float *bp,     \
                                           int64_t bps, float *const *c, const int64_t *ldc) { \
        ukr_plain(mr, np, kc, ap, bp, bps, c, ldc);                                           \
    }
UKR_INSTANCES(1, 1)
UKR_INSTANCES(1, 2)
UKR_INSTANCES(1, 4)
UKR_INSTANCES(2, 1)
UKR_INSTANCES(2, 2)
UKR_INSTANCES(3, 1)
UKR_INSTANCES(4, 1)
UKR_INSTANCES(5, 1)
UKR_INSTANCES(6, 1)

/* Panels run side by side for mr rows: enough accumulators, no spills. */
static const int panels_for_rows[MR + 1] = {0, 4, 2, 1, 1, 1, 1};
/* [mr][np], np in {1, 2, 4} */
#define UKR_TABLE(type, name)                                                               \
    static const type name##s[MR + 1][5] = {                                                 \
        {0},                                                                                 \
        {0, name##_1_1, name##_1_2, 0, name##_1_4},                                          \
        {0, name##_2_1, name##_2_2},                                                         \
        {0, name##_3_1}, {0, name##_4_1}, {0, name##_5_1}, {0, name##_6_1}}
UKR_TABLE(ukr_plain_fn, ukr_plain);

/* ---- weight decoding into Bp[k][16] ---- */

/* 8x8 fp32 transpose of r[0..7] (rows) into columns, stored at bp[k][c0..]. */
AVX2_INLINE void transpose8_store(__m256 r[8], float *bp) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    _mm256_store_ps(bp + 0 * NR, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_store_ps(bp + 1 * NR, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_store_ps(bp + 2 * NR, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_store_ps(bp + 3 * NR, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_store_ps(bp + 4 * NR, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_store_ps(bp + 5 * NR, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_store_ps(bp + 6 * NR, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_store_ps(bp + 7 * NR, _mm256_permute2f128_ps(u3, u7, 0x31));
}

/* BF16 / F32: 16 rows × kc values (rows[i] at the chunk start) -> Bp[kc][16]. */
static AVX2 void decode_plain_chunk(int fmt, const void *const rows[16], int64_t kc, float *bp) {
    const int64_t k8 = kc & ~(int64_t)7;
    /* group of 8 rows outermost, as for the codes: their lines stay in L1 */
    for (int half = 0; half < 2; half++)
        for (int64_t k = 0; k < k8; k += 8) {
            __m256 r[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const void *p = rows[half * 8 + i];
                if (fmt == FMT_BF16) {
                    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + k));
                    r[i] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
                } else {
                    r[i] = _mm256_loadu_ps((const float *)p + k);
                }
            }
            transpose8_store(r, bp + k * NR + half * 8);
        }
    for (int64_t k = k8; k < kc; k++)
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            uint32_t bits;
            if (fmt == FMT_BF16) bits = (uint32_t)((const uint16_t *)rows[i])[k] << 16;
            else memcpy(&bits, (const float *)rows[i] + k, 4);
            memcpy(&bp[k * NR + i], &bits, 4);
        }
}

/* ---- the panel loop ---- */

/* Zero codes / values standing in for the missing rows of the last panel. */
static const uint8_t zero_row[KC * 4] __attribute__((aligned(32)));

/* Decodes inputs [k0, k0+kc) of panel p (first column n0, nn valid columns)
 * into bp[kc][16]. */
static AVX2 void decode_panel(const job *j, int64_t n0, int64_t nn, int64_t k0, int64_t kc,
                              float *bp) {
    const int64_t K = j->K;
    const int sh = j->fmt == FMT_BF16 ? 1 : 2;
    /* The rows of a panel are far apart (one stream each, too many for the
     * hardware prefetchers), so ask for the lines of a later chunk now:
     * decode otherwise waits on DRAM latency instead of streaming. */
    {
        const int64_t row = K << sh, start = k0 << sh, len = kc << sh, ahead = len < 128 ? 256 : 2 * len;
        for (int i = 0; i < nn; i++) {
            const char *r = (const char *)j->w + (n0 + i) * row + start + ahead;
            for (int64_t off = 0; off < len; off += 64) _mm_prefetch(r + off, _MM_HINT_T1);
        }
    }
    const void *rows[16];
    for (int i = 0; i < 16; i++)
        rows[i] = i < nn ? (const char *)j->w + (((n0 + i) * K + k0) << sh) : (const void *)zero_row;
    decode_plain_chunk(j->fmt, rows, kc, bp);
}

/* Panels [p0, p1) (at most MAX_CHUNK) for rows [r0, r1) (r0 a multiple
 * of MR): see the top of the file for the prefill and small-batch orders
 * of the loops. */
static AVX2 void panel_chunk(const job *j, int64_t p0, int64_t p1, int64_t r0, int64_t r1, int thread) {
    const int64_t M = j->M, K = j->K, N = j->N, np = p1 - p0;
    /* small batches: per-call tiles small enough for L1 */
    const int small = M <= DECODE_ROWS;
    const int64_t kc_max = small ? 64 : KC;
    float *bp = j->scratch + (int64_t)thread * SCRATCH_FLOATS;
    float *c[MAX_CHUNK];
    int64_t ldc[MAX_CHUNK];
    for (int64_t p = 0; p < np; p++) {
        int64_t n0 = (p0 + p) * NR;
        if (N - n0 >= NR) c[p] = j->out + n0, ldc[p] = N;
        else c[p] = j->edge, ldc[p] = NR; /* the one partial panel */
        for (int64_t m = r0; m < r1; m++) memset(c[p] + m * ldc[p], 0, NR * sizeof(float));
    }
    /* Prefill decodes all panels of the chunk, then sweeps them with every
     * row block; small batches decode only the panels one kernel call uses. */
    const int64_t group = small ? 4 : np;
    for (int64_t k0 = 0; k0 < K; k0 += kc_max) {
        const int64_t kc = K - k0 < kc_max ? K - k0 : kc_max;
        for (int64_t g0 = 0; g0 < np; g0 += group) {
            const int64_t g1 = g0 + group < np ? g0 + group : np;
            for (int64_t p = g0; p < g1; p++) {
                int64_t n0 = (p0 + p) * NR;
                decode_panel(j, n0, N - n0 < NR ? N - n0 : NR, k0, kc, bp + (p - g0) * KC * NR);
            }
            for (int64_t m0 = r0; m0 < r1; m0 += MR) {
                const int mr = r1 - m0 < MR ? (int)(r1 - m0) : MR;
                const float *ap = j->ap + m0 * K + k0 * MR;
                float *cm[MAX_CHUNK];
                for (int64_t p = g0; p < g1; p++) cm[p - g0] = c[p] + m0 * ldc[p];
                for (int64_t p = g0; p < g1;) {
                    int w = panels_for_rows[mr];
                    while (w > g1 - p) w >>= 1;
                    const int64_t i = p - g0;
                    ukr_plains[mr][w](kc, ap, bp + i * KC * NR, KC * NR, cm + i, ldc + p);
                    p += w;
                }
            }
        }
    }
    for (int64_t p = 0; p < np; p++)
        if (c[p] == j->edge) {
            int64_t n0 = (p0 + p) * NR;
            for (int64_t m = r0; m < r1; m++)
                memcpy(j->out + m * N + n0, j->edge + m * NR, (size_t)(N - n0) * sizeof(float));
        }
}

static void panels(void *ctx, int64_t p0, int64_t p1, int thread) {
    const job *j = ctx;
    for (int64_t p = p0; p < p1; p += MAX_CHUNK)
        panel_chunk(j, p, p1 - p < MAX_CHUNK ? p1 : p + MAX_CHUNK, 0, j->M, thread);
}

/* Units of (row block, chunk of MAX_CHUNK panels), for products of few
 * panels and many rows: each output still one thread's chain. */
static void row_units(void *ctx, int64_t u0, int64_t u1, int thread) {
    const job *j = ctx;
    const int64_t np = (j->N + NR - 1) / NR, chunks = (np + MAX_CHUNK - 1) / MAX_CHUNK;
    for (int64_t u = u0; u < u1; u++) {
        const int64_t rb = u / chunks, p0 = (u % chunks) * MAX_CHUNK;
        const int64_t r0 = rb * j->rows_unit, r1 = r0 + j->rows_unit < j->M ? r0 + j->rows_unit : j->M;
        panel_chunk(j, p0, p0 + MAX_CHUNK < np ? p0 + MAX_CHUNK : np, r0, r1, thread);
    }
}

/* Packs rows of activations as [ceil(M/MR)][K][MR] fp32 (missing rows zero). */
typedef struct pack_job {
    const float *x;
    int64_t M, K;
    float *ap;
} pack_job;

static void pack_blocks(void *ctx, int64_t b0, int64_t b1, int thread) {
    const pack_job *p = ctx;
    const int64_t M = p->M, K = p->K;
    for (int64_t b = b0; b < b1; b++) {
        float *dst = p->ap + b * K * MR;
        for (int m = 0; m < MR; m++) {
            int64_t row = b * MR + m;
            if (row >= M) {
                for (int64_t k = 0; k < K; k++) dst[k * MR + m] = 0.0f;
            } else {
                const float *src = p->x + row * K;
                for (int64_t k = 0; k < K; k++) dst[k * MR + m] = src[k];
            }
        }
    }
}

static float *pack_act(const float *x, int64_t M, int64_t K, di_threadpool *tp) {
    int64_t mb = (M + MR - 1) / MR;
    float *ap = aligned_alloc(32, (size_t)((mb * K * MR * sizeof(float) + 31) & ~(size_t)31));
    if (!ap) return NULL;
    pack_job p = {x, M, K, ap};
    /* worth spreading only for prefill-sized inputs */
    di_threadpool_for(M * K >= (1 << 18) ? tp : NULL, mb, 4, pack_blocks, &p);
    return ap;
}

static void run(job *j, di_threadpool *tp, const float *x) {
    if (j->M <= 0 || j->N <= 0) return;
    int threads = di_threadpool_size(tp);
    float *ap = pack_act(x, j->M, j->K, tp);
    float *scratch = aligned_alloc(32, (size_t)threads * SCRATCH_FLOATS * sizeof(float));
    float *edge = aligned_alloc(32, (size_t)((j->M * NR * sizeof(float) + 31) & ~(size_t)31));
    if (!ap || !scratch || !edge) { /* out of memory: the scalar path needs none */
        free(ap), free(scratch), free(edge);
        if (j->fmt == FMT_BF16) di_gemm_bf16_scalar(x, j->M, j->K, j->w, j->N, j->out, tp);
        else di_gemm_f32_scalar(x, j->M, j->K, j->w, j->N, j->out, tp);
        return;
    }
    j->ap = ap, j->scratch = scratch, j->edge = edge;
    int64_t np = (j->N + NR - 1) / NR;
    /* several chunks per thread so a core slowed by other work takes fewer;
     * a multiple of 4 panels so single rows can run 4 panels side by side */
    int64_t grain = np / (4 * threads);
    grain = grain < 4 ? 4 : (grain > MAX_CHUNK ? MAX_CHUNK : grain & ~(int64_t)3);
    const int64_t chunks = (np + MAX_CHUNK - 1) / MAX_CHUNK;
    if (threads > 1 && j->M > DECODE_ROWS && (np + grain - 1) / grain < 2 * threads && j->M >= 4 * MR * threads) {
        /* few panels (an indexer's head weights, a compressor's gates): the
         * panel chunks alone would leave threads idle, so rows split too,
         * ~4 units a thread, whole MR blocks */
        const int64_t want = (4 * threads + chunks - 1) / chunks;
        j->rows_unit = (j->M + want - 1) / want;
        j->rows_unit = (j->rows_unit + MR - 1) / MR * MR;
        di_threadpool_for(tp, chunks * ((j->M + j->rows_unit - 1) / j->rows_unit), 1, row_units, j);
    } else {
        di_threadpool_for(tp, np, grain, panels, j);
    }
    free(ap), free(scratch), free(edge);
}

/* ---- BF16 rows at decode, straight from the weights ----
 * One to four activation rows (the head, the router, the compressor's
 * projections at decode) read every weight once, and the tiles above move
 * each one twice more (decoded into Bp, then loaded by the kernel): the
 * head (129,280 x 5,120, 1.3 GB) ran at ~12 GB/s on one Zen 4 core, half
 * its read rate, and 10.5 GB/s from L2 (this form: 21); on 16 Xeon threads
 * 19.2 ms, this form 11.3 (bench_decode_passes). On CPUs with AVX-512 units of 32 weight rows go from the
 * rows to the FMAs instead: a row's 32 bytes hold 8 words of two values,
 * chunk_words16 gives word j of 16 rows in one register, and its low and
 * high halves moved to the top of each lane are the fp32 values of steps
 * 2j and 2j + 1 of those rows side by side: each output's chain takes
 * k = 0, 1, 2, .. in order, the tiles' FMAs with the tiles' operands, so
 * the same bits. Two halves of 16 rows make two chains an activation row;
 * each row's 64-byte line is read whole (a unit's rows are 2K bytes apart:
 * at K = 5,120 the 32 lines of a step share two L1 sets). Rows past the
 * last whole unit run the same chain one output at a time (fmaf). */
AVX512_INLINE void bf16rows_kernel(const int mr, const uint16_t *w, int64_t K, const float *x, int64_t ldx,
                                   float *y, int64_t ldy) {
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    __m512 acc[4][2];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    __attribute__((aligned(64))) __m512i zb[2][2][8]; /* [16 values][half][word] */
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
        lines_words32((const uint8_t *)(w + k0), 2 * K, zb);
#pragma GCC unroll 1
        for (int t = 0; t < 2; t++) {
            const float *xc = x + k0 + 16 * t;
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const __m512i z0 = _mm512_load_si512(&zb[t][0][j]), z1 = _mm512_load_si512(&zb[t][1][j]);
                const __m512 v[2][2] = {
                    {_mm512_castsi512_ps(_mm512_slli_epi32(z0, 16)), _mm512_castsi512_ps(_mm512_and_si512(z0, top))},
                    {_mm512_castsi512_ps(_mm512_slli_epi32(z1, 16)), _mm512_castsi512_ps(_mm512_and_si512(z1, top))}};
#pragma GCC unroll 2
                for (int e = 0; e < 2; e++)
#pragma GCC unroll 4
                    for (int i = 0; i < 4; i++)
                        if (i < mr) {
                            const __m512 xb = _mm512_set1_ps(xc[i * ldx + 2 * j + e]);
                            acc[i][0] = _mm512_fmadd_ps(xb, v[0][e], acc[i][0]);
                            acc[i][1] = _mm512_fmadd_ps(xb, v[1][e], acc[i][1]);
                        }
            }
        }
    }
    for (int i = 0; i < mr; i++) {
        _mm512_storeu_ps(y + i * ldy, acc[i][0]);
        _mm512_storeu_ps(y + i * ldy + 16, acc[i][1]);
    }
}
#define BF16ROWS(mr)                                                                                        \
    static AVX512 void bf16rows_##mr(const uint16_t *w, int64_t K, const float *x, int64_t ldx, float *y,    \
                                     int64_t ldy) {                                                           \
        bf16rows_kernel(mr, w, K, x, ldx, y, ldy);                                                            \
    }
BF16ROWS(1)
BF16ROWS(2)
BF16ROWS(3)
BF16ROWS(4)

enum { BF16ROWS_M = 4 };
typedef struct bf16rows_job {
    const float *x;
    const uint16_t *w;
    int64_t M, K, N;
    float *out;
} bf16rows_job;

static atomic_long bf16rows_units_run;
long di_cpu_bf16rows_units(void) { return atomic_load(&bf16rows_units_run); }

/* Units [u0, u1) of 32 weight rows; the unit past N / 32 is the rows
 * after the last whole one, one chain at a time. */
static void bf16rows_units(void *ctx, int64_t u0, int64_t u1, int thread) {
    static void (*const fns[BF16ROWS_M])(const uint16_t *, int64_t, const float *, int64_t, float *, int64_t) = {
        bf16rows_1, bf16rows_2, bf16rows_3, bf16rows_4};
    const bf16rows_job *j = ctx;
    const int64_t K = j->K, N = j->N, whole = N / 32;
    for (int64_t u = u0; u < u1; u++) {
        if (u < whole) {
            fns[j->M - 1](j->w + u * 32 * K, K, j->x, K, j->out + u * 32, N);
            continue;
        }
        for (int64_t n = whole * 32; n < N; n++)
            for (int64_t i = 0; i < j->M; i++) {
                float acc = 0.0f;
                for (int64_t k = 0; k < K; k++) {
                    const uint32_t bits = (uint32_t)j->w[n * K + k] << 16;
                    float wv;
                    memcpy(&wv, &bits, 4);
                    acc = fmaf(j->x[i * K + k], wv, acc);
                }
                j->out[i * N + n] = acc;
            }
    }
    atomic_fetch_add_explicit(&bf16rows_units_run, u1 - u0, memory_order_relaxed);
}

void di_gemm_bf16_avx2(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                       float *out, di_threadpool *tp) {
    if (M >= 1 && M <= BF16ROWS_M && N >= 32 && K % 32 == 0 && K > 0 && di_cpu_kernels_wide()) {
        bf16rows_job j = {x, w, M, K, N, out};
        const int64_t units = (N + 31) / 32, threads = di_threadpool_size(tp);
        /* several units a thread's chunk, so a core slowed by other work takes fewer */
        const int64_t grain = units / (8 * threads) < 1 ? 1 : units / (8 * threads);
        di_threadpool_for(tp, units, grain, bf16rows_units, &j);
        return;
    }
    job j = {FMT_BF16, NULL, w, M, K, N, out, NULL, NULL, 0};
    run(&j, tp, x);
}

void di_gemm_f32_avx2(const float *x, int64_t M, int64_t K, const float *w, int64_t N,
                      float *out, di_threadpool *tp) {
    job j = {FMT_F32, NULL, w, M, K, N, out, NULL, NULL, 0};
    run(&j, tp, x);
}

/* ---- FP8 activation quantization ---- */

/* Quantizes one 32-block: the block scale from the vector max, then the same
 * RNE rounding as di_f32_to_e4m3 on |x/s| <= 448 — normal results by adding
 * the rounding bias to the fp32 bits, subnormal ones (below 2^-6) by rounding
 * |x/s|·2^9 to an integer. Returns the scale; codes -> q (if q), exact
 * dequantized values -> out (if out). */
static AVX2 float quant_block(const float *x, uint8_t *q, float *out) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v[4], mx = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        mx = _mm256_max_ps(_mm256_and_ps(v[i], absmask), mx); /* NaN ignored */
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float s = di_act_scale_fp8_amax(_mm_cvtss_f32(m4));
    /* x / s == x · (1/s) exactly: s is a power of two in [2^-22, 2^121] */
    const __m256 inv = _mm256_set1_ps(1.0f / s), sv = _mm256_set1_ps(s);
    const __m256 lim = _mm256_set1_ps(448.0f), tiny = _mm256_set1_ps(0x1p-6f);
    const __m256i bias = _mm256_set1_epi32((int)(0x7ffffu - (120u << 23))), one = _mm256_set1_epi32(1);
    const __m256i keep = _mm256_set1_epi32((int)0xfff00000u);
    __m256i code[4];
    for (int i = 0; i < 4; i++) {
        __m256 y = _mm256_mul_ps(v[i], inv);
        __m256 sign = _mm256_andnot_ps(absmask, y);
        __m256 a = _mm256_min_ps(_mm256_and_ps(y, absmask), lim);
        __m256i ab = _mm256_castps_si256(a);
        /* normal: round the fp32 bits at bit 20, ties to even */
        __m256i rb = _mm256_add_epi32(_mm256_add_epi32(ab, _mm256_set1_epi32(0x7ffff)),
                                      _mm256_and_si256(_mm256_srli_epi32(ab, 20), one));
        __m256i cn = _mm256_srli_epi32(_mm256_add_epi32(ab, _mm256_add_epi32(bias,
                                       _mm256_and_si256(_mm256_srli_epi32(ab, 20), one))), 20);
        __m256 vn = _mm256_castsi256_ps(_mm256_and_si256(rb, keep));
        /* subnormal: multiples of 2^-9 */
        __m256i cs = _mm256_cvtps_epi32(_mm256_mul_ps(a, _mm256_set1_ps(512.0f)));
        __m256 vs = _mm256_mul_ps(_mm256_cvtepi32_ps(cs), _mm256_set1_ps(0x1p-9f));
        __m256 is_sub = _mm256_cmp_ps(a, tiny, _CMP_LT_OQ);
        __m256i c = _mm256_blendv_epi8(cn, cs, _mm256_castps_si256(is_sub));
        code[i] = _mm256_or_si256(c, _mm256_srli_epi32(_mm256_castps_si256(sign), 24));
        if (out) {
            __m256 val = _mm256_or_ps(_mm256_blendv_ps(vn, vs, is_sub), sign);
            _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(val, sv));
        }
    }
    if (q) {
        __m256i w01 = _mm256_packs_epi32(code[0], code[1]), w23 = _mm256_packs_epi32(code[2], code[3]);
        __m256i b = _mm256_packus_epi16(w01, w23);
        b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)q, b);
    }
    return s;
}

void di_act_quant_fp8_avx2(const float *x, int64_t M, int64_t K, uint8_t *q, float *s) {
    for (int64_t b = 0; b < M * (K / 32); b++) s[b] = quant_block(x + b * 32, q + b * 32, NULL);
}

void di_act_qdq_fp8_avx2(const float *x, int64_t n, float *out) {
    for (int64_t b = 0; b < n; b += 32) quant_block(x + b, NULL, out + b);
}

#endif
