/* AVX2 + FMA CPU kernels (kernels.h; architecture.md §2, §8.3), compiled with
 * per-function target attributes so the library still runs on any x86-64 and
 * only calls these after di_cpu_has_avx2().
 *
 * Layout of the work. The output is cut into panels of NR = 16 columns (16
 * weight rows); threads take chunks of panels from the pool, so a column is
 * computed by one thread from start to end (no split-K). Weights are decoded
 * chunk by chunk into a small transposed tile Bp[k][16], and a
 * register-blocked micro-kernel runs MR = 6 activation rows at a time with
 * the 16 columns in the 8-float lanes of two registers. Each lane therefore
 * runs exactly the sequential chain of kernels.h, which is why the results
 * equal the scalar ones bit for bit whatever M or the thread count.
 * - Prefill (M > 16): a chunk of KC = 256 inputs of up to 16 panels is
 *   decoded to fp32 once, then every 6-row block of activations sweeps it:
 *   the decode cost is shared by all rows and the FMAs dominate.
 * - Small batches (5 <= M <= 16): 4 panels × 64 inputs at a time, kept as
 *   halves (each is used by at most three row blocks) and widened by the
 *   micro-kernel; four panels side by side give the 8 independent FMA chains
 *   one row needs. The rows of the next chunk are prefetched: 64 rows far
 *   apart are too many streams for the hardware prefetchers.
 * - Decode rows of FP8 / MXFP4 (M <= 4) skip the tiles altogether: codes go
 *   from a byte transpose straight to fp32 lanes (see "decode rows" below),
 *   which needs fewer operations per weight than the tiles when few
 *   activation rows share the decoding.
 *
 * Decoding tricks (all exact):
 * - E4M3 -> fp32 goes through IEEE half: placing the 7 magnitude bits of the
 *   code at bits 13..7 of a half gives the half value w·2^-8 (subnormals
 *   included); F16C widens 8 halves at once. The activations are packed
 *   multiplied by 2^8 so that every product (a·2^8)·(w·2^-8) equals a·w
 *   exactly: the chain sees the same fp32 values as the scalar one.
 * - E2M1 codes map to the high byte of the half of e2m1·2^-8 (low bytes are
 *   all zero) with one pshufb.
 * - 8 rows × 32 codes are transposed as bytes in 3 rounds of unpacks per
 *   128-bit lane, which leaves 8 rows of one input side by side. */
#include "backend/cpu/kernels.h"

#ifdef DI_HAVE_AVX2_KERNELS

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

enum { NR = 16, MR = 6, KC = 256, DECODE_ROWS = 16 };
/* Panels per parallel-for chunk at most, and the per-thread scratch. */
enum { MAX_CHUNK = 16, SCRATCH_FLOATS = MAX_CHUNK * KC * NR + MAX_CHUNK * (KC / 32) * NR };
enum { FMT_FP8, FMT_FP4, FMT_BF16, FMT_F32 };
/* How a block kernel applies the scales: MODE_EXACT and MODE_HALF multiply
 * each block sum by sa then sw as kernels.h states; MODE_FOLDED (prefill)
 * has them multiplied into the operands already (see fold_ok()). */
enum { MODE_EXACT, MODE_HALF, MODE_FOLDED };

typedef struct job {
    int fmt;
    const float *ap;    /* packed activations [ceil(M/MR)][K][MR] */
    const float *sa;    /* [M, K/32] (block formats) */
    const void *w;      /* weights, checkpoint layout */
    const uint8_t *ws;  /* weight scales (block formats) */
    int64_t M, K, N;
    float *out;         /* [M, N] */
    float *scratch;     /* [threads][SCRATCH_FLOATS]: decoded tiles and scales */
    float *edge;        /* [M, 16]: the last panel when N % 16 != 0 */
    int folded;         /* prefill with the scales folded into the operands */
} job;

/* ---- micro-kernels: mr rows × np panels of 16 columns ----
 * Every lane is one output's sequential chain, and a chain is a sequence of
 * dependent FMAs, so throughput needs at least ~8 independent accumulators
 * (FMA latency × ports): decode rows (mr = 1, 2) therefore run several
 * panels side by side. Bp of panel p is at bp + p·bps, its column scales at
 * swv + p·sws; c[p] / ldc[p] is panel p's output tile. */

/* Block formats: per 32-block, fresh block sums, then C += (blk·sa)·sw. */
AVX2_INLINE void ukr_block(const int mr, const int np, const int mode, int64_t nkb,
                           const float *ap, const void *bpv, int64_t bps, const float *sa, int64_t sa_stride,
                           const float *swv, int64_t sws, float *const *c, const int64_t *ldc) {
    for (int64_t kb = 0; kb < nkb; kb++) {
        __m256 acc[MR][8];
#pragma GCC unroll 6
        for (int m = 0; m < MR; m++)
#pragma GCC unroll 8
            for (int h = 0; h < 8; h++)
                if (m < mr && h < 2 * np) acc[m][h] = _mm256_setzero_ps();
#pragma GCC unroll 2
        for (int k = 0; k < 32; k++) {
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++)
                if (p < np) {
                    __m256 b0, b1;
                    /* panel p starts at float offset p·bps in either form */
                    const float *panel = (const float *)bpv + p * bps;
                    if (mode == MODE_HALF) {
                        const uint16_t *h = (const uint16_t *)panel + (kb * 32 + k) * NR;
                        b0 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)h));
                        b1 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(h + 8)));
                    } else {
                        const float *b = panel + (kb * 32 + k) * NR;
                        b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
                    }
#pragma GCC unroll 6
                    for (int m = 0; m < MR; m++)
                        if (m < mr) {
                            __m256 a = _mm256_broadcast_ss(ap + k * MR + m);
                            acc[m][2 * p] = _mm256_fmadd_ps(a, b0, acc[m][2 * p]);
                            acc[m][2 * p + 1] = _mm256_fmadd_ps(a, b1, acc[m][2 * p + 1]);
                        }
                }
        }
        if (mode == MODE_FOLDED) { /* the scales are inside the operands already */
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++)
#pragma GCC unroll 6
                for (int m = 0; m < MR; m++)
                    if (p < np && m < mr) {
                        float *cm = c[p] + m * ldc[p];
                        _mm256_storeu_ps(cm, _mm256_add_ps(_mm256_loadu_ps(cm), acc[m][2 * p]));
                        _mm256_storeu_ps(cm + 8, _mm256_add_ps(_mm256_loadu_ps(cm + 8), acc[m][2 * p + 1]));
                    }
            ap += 32 * MR;
            continue;
        }
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
            if (p < np) {
                const float *sw = swv + p * sws + kb * NR;
                __m256 sw0 = _mm256_load_ps(sw), sw1 = _mm256_load_ps(sw + 8);
#pragma GCC unroll 6
                for (int m = 0; m < MR; m++)
                    if (m < mr) {
                        __m256 s = _mm256_broadcast_ss(sa + m * sa_stride + kb);
                        float *cm = c[p] + m * ldc[p];
                        __m256 t0 = _mm256_mul_ps(_mm256_mul_ps(acc[m][2 * p], s), sw0);
                        __m256 t1 = _mm256_mul_ps(_mm256_mul_ps(acc[m][2 * p + 1], s), sw1);
                        _mm256_storeu_ps(cm, _mm256_add_ps(_mm256_loadu_ps(cm), t0));
                        _mm256_storeu_ps(cm + 8, _mm256_add_ps(_mm256_loadu_ps(cm + 8), t1));
                    }
            }
        ap += 32 * MR;
    }
}

/* Plain formats: C = fma chain over kc inputs, C loaded first. */
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

typedef void (*ukr_block_fn)(int64_t, const float *, const void *, int64_t, const float *,
                             int64_t, const float *, int64_t, float *const *, const int64_t *);
typedef void (*ukr_plain_fn)(int64_t, const float *, const float *, int64_t, float *const *,
                             const int64_t *);

#define UKR_BLOCK_FN(name, mode, mr, np)                                                    \
    static AVX2 void name##_##mr##_##np(int64_t nkb, const float *ap, const void *bp,        \
                                        int64_t bps, const float *sa, int64_t sas,           \
                                        const float *swv, int64_t sws, float *const *c,      \
                                        const int64_t *ldc) {                                \
        ukr_block(mr, np, mode, nkb, ap, bp, bps, sa, sas, swv, sws, c, ldc);                 \
    }
#define UKR_INSTANCES(mr, np)                                                               \
    UKR_BLOCK_FN(ukr_block, MODE_EXACT, mr, np)                                              \
    UKR_BLOCK_FN(ukr_half, MODE_HALF, mr, np)                                                \
    UKR_BLOCK_FN(ukr_fold, MODE_FOLDED, mr, np)                                              \
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
UKR_TABLE(ukr_block_fn, ukr_block);
UKR_TABLE(ukr_block_fn, ukr_half);
UKR_TABLE(ukr_block_fn, ukr_fold);
UKR_TABLE(ukr_plain_fn, ukr_plain);

/* ---- weight decoding into Bp[k][16] ---- */

/* Transposes 8 rows of 32 bytes in 3 rounds of unpacks, within each 128-bit
 * lane: afterwards r[q] holds, in lane L, bytes 0..7 = rows 0..7 at position
 * 16L + 2q and bytes 8..15 = rows 0..7 at position 16L + 2q + 1. Eight
 * registers plus temporaries: no spills. */
AVX2_INLINE void transpose_8x32_bytes(__m256i r[8]) {
#pragma GCC unroll 16
    for (int d = 4; d >= 1; d >>= 1)
#pragma GCC unroll 16
        for (int q = 0; q < 8; q++)
            if (!(q & d)) {
                __m256i lo = _mm256_unpacklo_epi8(r[q], r[q + d]);
                r[q + d] = _mm256_unpackhi_epi8(r[q], r[q + d]);
                r[q] = lo;
            }
}

/* Halves in 16-bit lanes (lo lane -> element i0 of Bp, hi lane -> i1; 8
 * columns each) stored as they are (half = 1: decode rows widen them when
 * loading, each is used once) or widened to fp32 (prefill reuses them). */
AVX2_INLINE void store_halves(__m256i h, void *bp, int64_t i0, int64_t i1, const int half,
                              __m256 scale) {
    if (half) {
        _mm_store_si128((__m128i *)((uint16_t *)bp + i0), _mm256_castsi256_si128(h));
        _mm_store_si128((__m128i *)((uint16_t *)bp + i1), _mm256_extracti128_si256(h, 1));
    } else {
        __m256 v0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
        __m256 v1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
        _mm256_store_ps((float *)bp + i0, _mm256_mul_ps(v0, scale));
        _mm256_store_ps((float *)bp + i1, _mm256_mul_ps(v1, scale));
    }
}

/* FP8: rows g·8 .. g·8+7 of a panel, 32 codes from byte off of each ->
 * columns g·8 .. g·8+7 of Bp[32][16] = w·2^-8. */
AVX2_INLINE void decode_fp8_block(const uint8_t *const rows[16], int64_t off, void *bp,
                                  const int half, const int g, __m256 scale) {
    const __m256i zero = _mm256_setzero_si256(), mask = _mm256_set1_epi16((short)0xbf80);
    {
        __m256i r[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_si256((const __m256i *)(rows[g * 8 + i] + off));
        transpose_8x32_bytes(r);
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++) {
            /* code in the high byte, shifted right once (arithmetic): sign at
             * bit 15, magnitude at 13..7; bit 14 (a sign copy) cleared. */
            __m256i lo = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(zero, r[q]), 1), mask);
            __m256i hi = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(zero, r[q]), 1), mask);
            store_halves(lo, bp, (2 * q) * NR + g * 8, (16 + 2 * q) * NR + g * 8, half, scale);
            store_halves(hi, bp, (2 * q + 1) * NR + g * 8, (17 + 2 * q) * NR + g * 8, half, scale);
        }
    }
}

/* MXFP4: rows g·8 .. g·8+7, 16 bytes (32 codes) from byte off of each ->
 * columns g·8 .. g·8+7 of Bp[32][16] = e2m1·2^-8. */
AVX2_INLINE void decode_fp4_block(const uint8_t *const rows[16], int64_t off, void *bp,
                                  const int half, const int g, __m256 scale) {
    /* high byte of the half e2m1(code)·2^-8; its low byte is always 0 */
    const __m256i lut = _mm256_setr_epi8(0, 0x18, 0x1c, 0x1e, 0x20, 0x22, 0x24, 0x26, (char)0x80,
                                         (char)0x98, (char)0x9c, (char)0x9e, (char)0xa0,
                                         (char)0xa2, (char)0xa4, (char)0xa6, 0, 0x18, 0x1c, 0x1e,
                                         0x20, 0x22, 0x24, 0x26, (char)0x80, (char)0x98,
                                         (char)0x9c, (char)0x9e, (char)0xa0, (char)0xa2,
                                         (char)0xa4, (char)0xa6);
    const __m256i nib = _mm256_set1_epi8(0x0f), zero = _mm256_setzero_si256();
    {
        __m256i r[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            __m128i x = _mm_loadu_si128((const __m128i *)(rows[g * 8 + i] + off));
            /* lane 0: even k (low nibbles), lane 1: odd k (high nibbles) */
            __m256i xx = _mm256_inserti128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1);
            r[i] = _mm256_shuffle_epi8(lut, _mm256_and_si256(xx, nib));
        }
        transpose_8x32_bytes(r);
        /* r[q]: lane L bytes 0..7 = k 4q+L, bytes 8..15 = k 4q+2+L */
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++) {
            store_halves(_mm256_unpacklo_epi8(zero, r[q]), bp, (4 * q) * NR + g * 8,
                         (4 * q + 1) * NR + g * 8, half, scale);
            store_halves(_mm256_unpackhi_epi8(zero, r[q]), bp, (4 * q + 2) * NR + g * 8,
                         (4 * q + 3) * NR + g * 8, half, scale);
        }
    }
}

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
 * into bp[kc][16] and, for block formats, the column scales swv[kc/32][16]. */
static AVX2 void decode_panel(const job *j, int64_t n0, int64_t nn, int64_t k0, int64_t kc,
                              float *bp, float *swv, int half) {
    const int fold = j->folded; /* fp32 tiles carry the weight scales */
    const int64_t K = j->K, KB = K / 32, kb0 = k0 / 32;
    const float *e8m0 = di_cpu_e8m0_table();
    /* The rows of a panel are far apart (one stream each, too many for the
     * hardware prefetchers), so ask for the lines of a later chunk now:
     * decode otherwise waits on DRAM latency instead of streaming. */
    {
        const int sh = j->fmt == FMT_FP4 ? -1 : j->fmt == FMT_FP8 ? 0 : j->fmt == FMT_BF16 ? 1 : 2;
        const int64_t row = sh < 0 ? K / 2 : K << sh, start = sh < 0 ? k0 / 2 : k0 << sh;
        const int64_t len = sh < 0 ? kc / 2 : kc << sh, ahead = len < 128 ? 256 : 2 * len;
        for (int i = 0; i < nn; i++) {
            const char *r = (const char *)j->w + (n0 + i) * row + start + ahead;
            for (int64_t off = 0; off < len; off += 64) _mm_prefetch(r + off, _MM_HINT_T1);
        }
    }
    /* Group by group of 8 rows, every block of the chunk: the 8 rows' lines
     * are reused while still in L1 even when rows alias in the cache (a row
     * length of 8 KiB puts every row in the same L1 set). */
    if (j->fmt == FMT_FP8) {
        const uint8_t *w = j->w, *rows[16];
        for (int i = 0; i < 16; i++) rows[i] = i < nn ? w + (n0 + i) * K + k0 : zero_row;
        for (int g = 0; g < 2; g++)
            for (int64_t b = 0; b < kc / 32; b++) {
                __m256 sc = _mm256_set1_ps(fold ? e8m0[j->ws[(n0 / 32) * KB + kb0 + b]] : 1.0f);
                if (half) decode_fp8_block(rows, b * 32, (uint16_t *)bp + b * 32 * NR, 1, g, sc);
                else decode_fp8_block(rows, b * 32, bp + b * 32 * NR, 0, g, sc);
            }
        for (int64_t b = 0; b < kc / 32; b++) {
            /* a 16-column panel lies inside one 32-row scale tile */
            __m256 s = _mm256_set1_ps(e8m0[j->ws[(n0 / 32) * KB + kb0 + b]]);
            _mm256_store_ps(swv + b * NR, s);
            _mm256_store_ps(swv + b * NR + 8, s);
        }
    } else if (j->fmt == FMT_FP4) {
        const uint8_t *w = j->w, *rows[16];
        for (int i = 0; i < 16; i++) rows[i] = i < nn ? w + (n0 + i) * (K / 2) + k0 / 2 : zero_row;
        for (int64_t b = 0; b < kc / 32; b++)
            for (int i = 0; i < 16; i++)
                swv[b * NR + i] = i < nn ? e8m0[j->ws[(n0 + i) * KB + kb0 + b]] : 0.0f;
        for (int g = 0; g < 2; g++)
            for (int64_t b = 0; b < kc / 32; b++) {
                __m256 sc = fold ? _mm256_load_ps(swv + b * NR + g * 8) : _mm256_set1_ps(1.0f);
                if (half) decode_fp4_block(rows, b * 16, (uint16_t *)bp + b * 32 * NR, 1, g, sc);
                else decode_fp4_block(rows, b * 16, bp + b * 32 * NR, 0, g, sc);
            }
    } else {
        const void *rows[16];
        size_t esz = j->fmt == FMT_BF16 ? 2 : 4;
        for (int i = 0; i < 16; i++)
            rows[i] = i < nn ? (const char *)j->w + ((n0 + i) * K + k0) * esz : (const void *)zero_row;
        decode_plain_chunk(j->fmt, rows, kc, bp);
    }
}

/* Panels [p0, p1) (at most MAX_CHUNK): see the top of the file for the
 * prefill and decode orders of the loops. */
static AVX2 void panel_chunk(const job *j, int64_t p0, int64_t p1, int thread) {
    const int64_t M = j->M, K = j->K, N = j->N, KB = K / 32, np = p1 - p0;
    const int block = j->fmt == FMT_FP8 || j->fmt == FMT_FP4;
    /* decode-sized batches: per-call tiles small enough for L1, kept as halves */
    const int small = M <= DECODE_ROWS;
    const int half = small && block;
    const int64_t kc_max = small ? 64 : KC;
    float *bp = j->scratch + (int64_t)thread * SCRATCH_FLOATS;
    float *swv = bp + MAX_CHUNK * KC * NR;
    float *c[MAX_CHUNK];
    int64_t ldc[MAX_CHUNK];
    for (int64_t p = 0; p < np; p++) {
        int64_t n0 = (p0 + p) * NR;
        if (N - n0 >= NR) c[p] = j->out + n0, ldc[p] = N;
        else c[p] = j->edge, ldc[p] = NR; /* the one partial panel */
        for (int64_t m = 0; m < M; m++) memset(c[p] + m * ldc[p], 0, NR * sizeof(float));
    }
    /* Prefill decodes all panels of the chunk, then sweeps them with every
     * row block; decode rows decode only the panels one kernel call uses. */
    const int64_t group = small ? 4 : np;
    for (int64_t k0 = 0; k0 < K; k0 += kc_max) {
        const int64_t kc = K - k0 < kc_max ? K - k0 : kc_max;
        for (int64_t g0 = 0; g0 < np; g0 += group) {
            const int64_t g1 = g0 + group < np ? g0 + group : np;
            for (int64_t p = g0; p < g1; p++) {
                int64_t n0 = (p0 + p) * NR;
                decode_panel(j, n0, N - n0 < NR ? N - n0 : NR, k0, kc, bp + (p - g0) * KC * NR,
                             swv + (p - g0) * (KC / 32) * NR, half);
            }
            for (int64_t m0 = 0; m0 < M; m0 += MR) {
                const int mr = M - m0 < MR ? (int)(M - m0) : MR;
                const float *ap = j->ap + m0 * K + k0 * MR;
                float *cm[MAX_CHUNK];
                for (int64_t p = g0; p < g1; p++) cm[p - g0] = c[p] + m0 * ldc[p];
                for (int64_t p = g0; p < g1;) {
                    int w = panels_for_rows[mr];
                    while (w > g1 - p) w >>= 1;
                    const int64_t i = p - g0;
                    if (block)
                        (half ? ukr_halfs : j->folded ? ukr_folds : ukr_blocks)[mr][w](kc / 32, ap, bp + i * KC * NR, KC * NR,
                                          j->sa + m0 * KB + k0 / 32, KB, swv + i * (KC / 32) * NR,
                                          (KC / 32) * NR, cm + i, ldc + p);
                    else
                        ukr_plains[mr][w](kc, ap, bp + i * KC * NR, KC * NR, cm + i, ldc + p);
                    p += w;
                }
            }
        }
    }
    for (int64_t p = 0; p < np; p++)
        if (c[p] == j->edge) {
            int64_t n0 = (p0 + p) * NR;
            for (int64_t m = 0; m < M; m++)
                memcpy(j->out + m * N + n0, j->edge + m * NR, (size_t)(N - n0) * sizeof(float));
        }
}

static void panels(void *ctx, int64_t p0, int64_t p1, int thread) {
    for (int64_t p = p0; p < p1; p += MAX_CHUNK)
        panel_chunk(ctx, p, p1 - p < MAX_CHUNK ? p1 : p + MAX_CHUNK, thread);
}

/* Packs rows of activations as [ceil(M/MR)][K][MR] fp32 (missing rows zero);
 * codes are decoded and multiplied by 2^8 (see the top of the file). */
typedef struct pack_job {
    const uint8_t *qa;
    const float *x;
    const float *sa; /* [M, K/32]: multiplied in when the scales are folded, else NULL */
    int64_t M, K;
    float *ap;
} pack_job;

static void pack_blocks(void *ctx, int64_t b0, int64_t b1, int thread) {
    const pack_job *p = ctx;
    const int64_t M = p->M, K = p->K;
    const float *e4m3 = di_cpu_e4m3_table();
    for (int64_t b = b0; b < b1; b++) {
        float *dst = p->ap + b * K * MR;
        for (int m = 0; m < MR; m++) {
            int64_t row = b * MR + m;
            if (row >= M) {
                for (int64_t k = 0; k < K; k++) dst[k * MR + m] = 0.0f;
            } else if (p->qa) {
                const uint8_t *src = p->qa + row * K;
                if (p->sa) {
                    const float *sa = p->sa + row * (K / 32);
                    for (int64_t k = 0; k < K; k++) dst[k * MR + m] = e4m3[src[k]] * 256.0f * sa[k / 32];
                } else {
                    for (int64_t k = 0; k < K; k++) dst[k * MR + m] = e4m3[src[k]] * 256.0f;
                }
            } else {
                const float *src = p->x + row * K;
                for (int64_t k = 0; k < K; k++) dst[k * MR + m] = src[k];
            }
        }
    }
}

static float *pack_act(const uint8_t *qa, const float *x, const float *sa, int64_t M, int64_t K,
                       di_threadpool *tp) {
    int64_t mb = (M + MR - 1) / MR;
    float *ap = aligned_alloc(32, (size_t)((mb * K * MR * sizeof(float) + 31) & ~(size_t)31));
    if (!ap) return NULL;
    pack_job p = {qa, x, sa, M, K, ap};
    /* worth spreading only for prefill-sized inputs */
    di_threadpool_for(M * K >= (1 << 18) ? tp : NULL, mb, 4, pack_blocks, &p);
    return ap;
}

/* Whether prefill may fold the scales into the operands: A·2^8·sa and
 * W·2^-8·sw. Every product and partial block sum is then the scalar one
 * times sa·sw exactly, so blk·sa·sw comes out with the very same roundings,
 * provided nothing leaves the normal fp32 range: all products and partial
 * sums are multiples of 2^-18·sa·sw and below 2^23·sa·sw. With sa in
 * [2^-60, 2^50] and sw in [2^-48, 2^50] (every real checkpoint and
 * activation) that holds with room; otherwise the exact-order kernels run.
 * Folding spares the two multiplications per block and accumulator that
 * would otherwise compete with the FMAs. */
static int fold_ok(const job *j) {
    if (!(j->fmt == FMT_FP8 || j->fmt == FMT_FP4) || j->M <= DECODE_ROWS) return 0;
    const int64_t KB = j->K / 32;
    for (int64_t i = 0; i < j->M * KB; i++)
        if (!(j->sa[i] >= 0x1p-60f && j->sa[i] <= 0x1p50f)) return 0;
    const int64_t nws = j->fmt == FMT_FP8 ? ((j->N + 31) / 32) * KB : j->N * KB;
    for (int64_t i = 0; i < nws; i++)
        if (j->ws[i] < 127 - 48 || j->ws[i] > 127 + 50) return 0;
    return 1;
}

/* ---- decode rows (M <= DEC_MAX_ROWS) of the block formats ----
 * A decode step reads every weight once for one to a few activation rows, so
 * the cost per weight must stay below what the memory delivers: about one
 * byte per 0.05 ns on one core. Here the lanes of a register are 8 weight
 * rows (8 outputs: every lane is one output's sequential chain of kernels.h)
 * and the weights go straight from their codes to fp32 lanes:
 * - the 8 rows × 32 codes of a block are transposed as bytes (3 rounds of
 *   unpacks) and stored to a small L1 buffer, from which one sign-extending
 *   vpmovsxbd load per input k gives the 8 rows' codes in 32-bit lanes;
 * - E4M3: shifting the code left by 20 and keeping the sign and the 7
 *   magnitude bits gives the fp32 whose bits are those of w·2^-120 (E4M3
 *   subnormals become fp32 subnormals, exactly). The activations are stored
 *   multiplied by 2^64, so every product is a·w·2^-56: exact, normal, and
 *   each partial block sum is the scalar one times 2^-56 with the same
 *   rounding (all are multiples of 2^-74 below 2^-33, far from the
 *   subnormal range). The block sum times 2^56 is then the scalar one
 *   exactly;
 * - E2M1: one pshufb maps the nibbles to the integers 2·e2m1 (-0 becomes
 *   +0: a block sum starts at +0 and is never -0, so the sign of a zero
 *   product cannot show), converted to fp32 with vcvtdq2ps; the activations
 *   are stored halved, so each product is a·w exactly.
 * One row multiplies by 8 rows per FMA, so several blocks of the same 8 rows
 * run side by side (independent block sums; the outer sums still add them in
 * K order): enough chains to cover the FMA latency while the memory sees
 * only 8 streams, few enough for the hardware prefetchers (software
 * prefetches, tried at several distances and levels, were no better). The
 * next blocks' codes are loaded before the current ones are multiplied. */
enum { DEC_LANES = 8, DEC_MAX_ROWS = 4, DEC_MAX_BLOCKS = 4 };

typedef struct dec_job {
    int fp4;
    const float *a;      /* [M, K]: E4M3 activations ×2^64 (FP8) or ×1/2 (MXFP4) */
    const float *sa;     /* [M, K/32] */
    const uint8_t *w;    /* FP8 [N, K] codes, MXFP4 [N, K/2] */
    const uint8_t *ws;   /* FP8 [ceil(N/32), K/32], MXFP4 [N, K/32] */
    int64_t M, K, N;
    float *out;          /* [M, N] */
    uint8_t *scratch;    /* [threads][scratch_bytes] */
    size_t scratch_bytes;
} dec_job;

/* Byte offset, in a transposed block, of the 8 rows' codes at position p of
 * the loaded registers (see transpose_8x32_bytes). */
#define DEC_POS_OFF(p) ((((p) & 15) >> 1) * 32 + ((p) >> 4) * 16 + ((p) & 1) * 8)

/* nb blocks from kb on, rows m0.. (mr of them) of the activations: block sums
 * into the 8-lane outer sums acc[m]. t: 256 bytes of L1 scratch per block;
 * ws_tile (FP8): the scale row of the rows' 32-row tile [K/32]; swv (MXFP4):
 * the rows' scales [K/32][8]. */
AVX2_INLINE void dec_load(const int fp4, const int nb, const uint8_t *const rows[DEC_LANES],
                          int64_t kb, uint8_t *t) {
    if (!fp4) {
#pragma GCC unroll 4
        for (int b = 0; b < nb; b++) {
            __m256i r[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_si256((const __m256i *)(rows[i] + (kb + b) * 32));
            transpose_8x32_bytes(r);
#pragma GCC unroll 8
            for (int q = 0; q < 8; q++) _mm256_store_si256((__m256i *)(t + b * 256 + q * 32), r[q]);
        }
    } else {
        const __m256i lut = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                                             0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
        const __m256i nib = _mm256_set1_epi8(0x0f);
        if (nb % 2 == 0) {
            /* two blocks per 32-byte load: low nibbles (even k) of both
             * blocks in one set of registers, high nibbles in another */
#pragma GCC unroll 2
            for (int b = 0; b < nb; b += 2)
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    __m256i r[8];
#pragma GCC unroll 8
                    for (int i = 0; i < 8; i++) {
                        __m256i x = _mm256_loadu_si256((const __m256i *)(rows[i] + (kb + b) * 16));
                        if (h) x = _mm256_srli_epi16(x, 4);
                        r[i] = _mm256_shuffle_epi8(lut, _mm256_and_si256(x, nib));
                    }
                    transpose_8x32_bytes(r);
#pragma GCC unroll 8
                    for (int q = 0; q < 8; q++)
                        _mm256_store_si256((__m256i *)(t + b * 256 + h * 256 + q * 32), r[q]);
                }
            return;
        }
#pragma GCC unroll 4
        for (int b = 0; b < nb; b++) {
            __m256i r[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                __m128i x = _mm_loadu_si128((const __m128i *)(rows[i] + (kb + b) * 16));
                /* lane 0: even k (low nibbles), lane 1: odd k (high nibbles) */
                __m256i xx = _mm256_inserti128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1);
                r[i] = _mm256_shuffle_epi8(lut, _mm256_and_si256(xx, nib));
            }
            transpose_8x32_bytes(r);
#pragma GCC unroll 8
            for (int q = 0; q < 8; q++) _mm256_store_si256((__m256i *)(t + b * 256 + q * 32), r[q]);
        }
    }
}

/* The block sums of the nb blocks transposed at t, added to acc[m]. */
AVX2_INLINE void dec_chain(const int fp4, const int mr, const int nb, const dec_job *j,
                           int64_t kb, int64_t m0, const uint8_t *ws_tile, const float *swv,
                           const uint8_t *t, __m256 *acc) {
    const int64_t K = j->K, KB = K / 32;
    __m256 blk[DEC_MAX_ROWS][DEC_MAX_BLOCKS];
#pragma GCC unroll 8
    for (int m = 0; m < DEC_MAX_ROWS; m++)
#pragma GCC unroll 4
        for (int b = 0; b < DEC_MAX_BLOCKS; b++)
            if (m < mr && b < nb) blk[m][b] = _mm256_setzero_ps();
    const __m256i keep = _mm256_set1_epi32((int)0x87f00000u);
    const float *a = j->a + m0 * K + kb * 32;
#pragma GCC unroll 32
    for (int k = 0; k < 32; k++) {
#pragma GCC unroll 4
        for (int b = 0; b < nb; b++) {
            /* where dec_load put the 8 rows' code k of block b */
            const int off = !fp4 ? b * 256 + DEC_POS_OFF(k)
                            : nb % 2 == 0 ? (b >> 1) * 512 + (k & 1) * 256 + DEC_POS_OFF((b & 1) * 16 + k / 2)
                                          : b * 256 + DEC_POS_OFF((k & 1) * 16 + k / 2);
            __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(t + off)));
            __m256 wv = fp4 ? _mm256_cvtepi32_ps(v)
                            : _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 20), keep));
#pragma GCC unroll 8
            for (int m = 0; m < DEC_MAX_ROWS; m++)
                if (m < mr)
                    blk[m][b] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + m * K + b * 32 + k), wv, blk[m][b]);
        }
    }
    const float *e8m0 = di_cpu_e8m0_table();
#pragma GCC unroll 4
    for (int b = 0; b < nb; b++) {
        /* FP8: the 8 rows lie in one 32-row scale tile (groups start at multiples of 8) */
        __m256 sw = fp4 ? _mm256_load_ps(swv + (kb + b) * 8) : _mm256_set1_ps(e8m0[ws_tile[kb + b]]);
#pragma GCC unroll 8
        for (int m = 0; m < DEC_MAX_ROWS; m++)
            if (m < mr) {
                __m256 x = blk[m][b];
                if (!fp4) x = _mm256_mul_ps(x, _mm256_set1_ps(0x1p56f));
                x = _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(j->sa[(m0 + m) * KB + kb + b])), sw);
                acc[m] = _mm256_add_ps(acc[m], x);
            }
    }
}

/* All of K for one group of 8 weight rows and mr activation rows from m0:
 * nb blocks at a time, then single blocks; res[m][8] gets the outputs. */
AVX2_INLINE void dec_rows(const int fp4, const int mr, const int nb, const dec_job *j,
                          const uint8_t *const rows[DEC_LANES], int64_t m0,
                          const uint8_t *ws_tile, const float *swv, uint8_t *t, float *res) {
    const int64_t KB = j->K / 32;
    __m256 acc[DEC_MAX_ROWS];
#pragma GCC unroll 8
    for (int m = 0; m < DEC_MAX_ROWS; m++) acc[m] = _mm256_setzero_ps();
    /* the codes of the next blocks are loaded and transposed before the
     * current ones are multiplied: their loads start one step earlier */
    const int64_t steps = KB / nb;
    uint8_t *tb[2] = {t, t + DEC_MAX_BLOCKS * 256};
    if (steps) dec_load(fp4, nb, rows, 0, tb[0]);
    for (int64_t st = 0; st < steps; st++) {
        if (st + 1 < steps) dec_load(fp4, nb, rows, (st + 1) * nb, tb[(st + 1) & 1]);
        dec_chain(fp4, mr, nb, j, st * nb, m0, ws_tile, swv, tb[st & 1], acc);
    }
    for (int64_t kb = steps * nb; kb < KB; kb++) {
        dec_load(fp4, 1, rows, kb, t);
        dec_chain(fp4, mr, 1, j, kb, m0, ws_tile, swv, t, acc);
    }
#pragma GCC unroll 8
    for (int m = 0; m < DEC_MAX_ROWS; m++)
        if (m < mr) _mm256_storeu_ps(res + m * DEC_LANES, acc[m]);
}

typedef void (*dec_rows_fn)(const dec_job *, const uint8_t *const *, int64_t, const uint8_t *,
                            const float *, uint8_t *, float *);
/* Blocks side by side per row count: about 4-8 chains without spills. */
#define DEC_ROWS_FN(fp4, mr, nb)                                                              \
    static AVX2 void dec_rows_##fp4##_##mr(const dec_job *j, const uint8_t *const *rows,       \
                                           int64_t m0, const uint8_t *ws_tile,               \
                                           const float *swv, uint8_t *t, float *res) {       \
        dec_rows(fp4, mr, nb, j, rows, m0, ws_tile, swv, t, res);                            \
    }
#define DEC_ROWS_FNS(fp4)                                                                     \
    DEC_ROWS_FN(fp4, 1, 4) DEC_ROWS_FN(fp4, 2, 4) DEC_ROWS_FN(fp4, 3, 2) DEC_ROWS_FN(fp4, 4, 2)
DEC_ROWS_FNS(0)
DEC_ROWS_FNS(1)
static const dec_rows_fn dec_rows_fns[2][DEC_MAX_ROWS + 1] = {
    {0, dec_rows_0_1, dec_rows_0_2, dec_rows_0_3, dec_rows_0_4},
    {0, dec_rows_1_1, dec_rows_1_2, dec_rows_1_3, dec_rows_1_4}};

/* MXFP4 scales of 8 rows (srow[i]: K/32 E8M0 bytes each) as fp32 lanes
 * swv[kb][8], 32 blocks at a time through the byte transpose (tmp: 256 bytes
 * of scratch); returns the blocks done, the rest is left to the caller.
 * 2^(e-127) has the bits e<<23, except e = 0 (2^-127, a subnormal: 1<<22)
 * and e = 255 (NaN): both get bit 22 added. */
static AVX2 int64_t dec_scales(const uint8_t *const srow[DEC_LANES], int64_t KB, uint8_t *tmp,
                               float *swv) {
    const __m256i zero = _mm256_setzero_si256(), ones = _mm256_set1_epi32(255);
    const __m256i bit22 = _mm256_set1_epi32(1 << 22);
    int64_t kb = 0;
    for (; kb + 32 <= KB; kb += 32) {
        __m256i r[8];
        for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_si256((const __m256i *)(srow[i] + kb));
        transpose_8x32_bytes(r);
        for (int q = 0; q < 8; q++) _mm256_store_si256((__m256i *)(tmp + q * 32), r[q]);
#pragma GCC unroll 32
        for (int p = 0; p < 32; p++) {
            __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(tmp + DEC_POS_OFF(p))));
            __m256i odd = _mm256_or_si256(_mm256_cmpeq_epi32(e, zero), _mm256_cmpeq_epi32(e, ones));
            __m256i bits = _mm256_or_si256(_mm256_slli_epi32(e, 23), _mm256_and_si256(odd, bit22));
            _mm256_store_ps(swv + (kb + p) * DEC_LANES, _mm256_castsi256_ps(bits));
        }
    }
    return kb;
}

/* Groups [g0, g1) of 8 weight rows: every activation row, all of K. */
static void dec_groups(void *ctx, int64_t g0, int64_t g1, int thread) {
    const dec_job *j = ctx;
    const int64_t M = j->M, K = j->K, N = j->N, KB = K / 32, row_bytes = j->fp4 ? K / 2 : K;
    const float *e8m0 = di_cpu_e8m0_table();
    uint8_t *t = j->scratch + (size_t)thread * j->scratch_bytes;
    float *swv = (float *)(t + 2 * DEC_MAX_BLOCKS * 256); /* MXFP4 [KB][8] */
    float res[DEC_MAX_ROWS * DEC_LANES];
    for (int64_t g = g0; g < g1; g++) {
        const int64_t n0 = g * DEC_LANES, nn = N - n0 < DEC_LANES ? N - n0 : DEC_LANES;
        /* the missing rows of the last group repeat the last row (results dropped) */
        const uint8_t *rows[DEC_LANES];
        for (int i = 0; i < DEC_LANES; i++) rows[i] = j->w + (n0 + (i < nn ? i : nn - 1)) * row_bytes;
        if (j->fp4) {
            const uint8_t *srow[DEC_LANES];
            for (int i = 0; i < DEC_LANES; i++) srow[i] = j->ws + (n0 + (i < nn ? i : nn - 1)) * KB;
            int64_t kb = dec_scales(srow, KB, t, swv);
            for (; kb < KB; kb++)
                for (int i = 0; i < DEC_LANES; i++) swv[kb * DEC_LANES + i] = e8m0[srow[i][kb]];
        }
        const uint8_t *ws_tile = j->fp4 ? NULL : j->ws + (n0 / 32) * KB;
        for (int64_t m0 = 0; m0 < M; m0 += DEC_MAX_ROWS) {
            const int mr = M - m0 < DEC_MAX_ROWS ? (int)(M - m0) : DEC_MAX_ROWS;
            dec_rows_fns[j->fp4][mr](j, rows, m0, ws_tile, swv, t, res);
            for (int m = 0; m < mr; m++)
                memcpy(j->out + (m0 + m) * N + n0, res + m * DEC_LANES, (size_t)nn * sizeof(float));
        }
    }
}

/* Decode rows of FP8 / MXFP4: activations prepared once per call (the same
 * for every weight row), then groups of 8 weight rows spread over the pool.
 * Returns 0 when out of memory (the caller falls back). */
static int dec_run(int fp4, const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                   const uint8_t *w, const uint8_t *ws, int64_t N, float *out, di_threadpool *tp) {
    const int threads = di_threadpool_size(tp);
    const size_t scratch_bytes = 2 * DEC_MAX_BLOCKS * 256 + (size_t)(K / 32) * DEC_LANES * sizeof(float);
    float *a = aligned_alloc(32, (size_t)((M * K * sizeof(float) + 31) & ~(size_t)31));
    uint8_t *scratch = aligned_alloc(32, (size_t)threads * ((scratch_bytes + 31) & ~(size_t)31));
    if (!a || !scratch) {
        free(a), free(scratch);
        return 0;
    }
    const float *e4m3 = di_cpu_e4m3_table();
    const float f = fp4 ? 0.5f : 0x1p64f;
    for (int64_t i = 0; i < M * K; i++) a[i] = e4m3[qa[i]] * f;
    dec_job j = {fp4, a, sa, w, ws, M, K, N, out, scratch, (scratch_bytes + 31) & ~(size_t)31};
    const int64_t groups = (N + DEC_LANES - 1) / DEC_LANES;
    /* several chunks per thread so a core slowed by other work takes fewer */
    int64_t grain = groups / (8 * threads);
    di_threadpool_for(tp, groups, grain < 1 ? 1 : grain, dec_groups, &j);
    free(a), free(scratch);
    return 1;
}

static void run(job *j, const uint8_t *qa, const float *x, di_threadpool *tp) {
    if (j->M <= 0 || j->N <= 0) return;
    if ((j->fmt == FMT_FP8 || j->fmt == FMT_FP4) && j->M <= DEC_MAX_ROWS &&
        dec_run(j->fmt == FMT_FP4, qa, j->sa, j->M, j->K, j->w, j->ws, j->N, j->out, tp))
        return;
    int threads = di_threadpool_size(tp);
    j->folded = fold_ok(j);
    float *ap = pack_act(qa, x, j->folded ? j->sa : NULL, j->M, j->K, tp);
    float *scratch = aligned_alloc(32, (size_t)threads * SCRATCH_FLOATS * sizeof(float));
    float *edge = aligned_alloc(32, (size_t)((j->M * NR * sizeof(float) + 31) & ~(size_t)31));
    if (!ap || !scratch || !edge) { /* out of memory: the scalar path needs none */
        free(ap), free(scratch), free(edge);
        switch (j->fmt) {
        case FMT_FP8: di_gemm_fp8_scalar(qa, j->sa, j->M, j->K, j->w, j->ws, j->N, j->out, tp); break;
        case FMT_FP4: di_gemm_mxfp4_scalar(qa, j->sa, j->M, j->K, j->w, j->ws, j->N, j->out, tp); break;
        case FMT_BF16: di_gemm_bf16_scalar(x, j->M, j->K, j->w, j->N, j->out, tp); break;
        default: di_gemm_f32_scalar(x, j->M, j->K, j->w, j->N, j->out, tp); break;
        }
        return;
    }
    j->ap = ap, j->scratch = scratch, j->edge = edge;
    int64_t np = (j->N + NR - 1) / NR;
    /* several chunks per thread so a core slowed by other work takes fewer;
     * a multiple of 4 panels so decode rows can run 4 panels side by side */
    int64_t grain = np / (4 * threads);
    grain = grain < 4 ? 4 : (grain > MAX_CHUNK ? MAX_CHUNK : grain & ~(int64_t)3);
    di_threadpool_for(tp, np, grain, panels, j);
    free(ap), free(scratch), free(edge);
}

void di_gemm_fp8_avx2(const uint8_t *qa, const float *sa, int64_t M, int64_t K, const uint8_t *w,
                      const uint8_t *ws, int64_t N, float *out, di_threadpool *tp) {
    job j = {FMT_FP8, NULL, sa, w, ws, M, K, N, out, NULL, NULL, 0};
    run(&j, qa, NULL, tp);
}

void di_gemm_mxfp4_avx2(const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                        const uint8_t *w, const uint8_t *ws, int64_t N, float *out,
                        di_threadpool *tp) {
    job j = {FMT_FP4, NULL, sa, w, ws, M, K, N, out, NULL, NULL, 0};
    run(&j, qa, NULL, tp);
}

void di_gemm_bf16_avx2(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                       float *out, di_threadpool *tp) {
    job j = {FMT_BF16, NULL, NULL, w, NULL, M, K, N, out, NULL, NULL, 0};
    run(&j, NULL, x, tp);
}

void di_gemm_f32_avx2(const float *x, int64_t M, int64_t K, const float *w, int64_t N,
                      float *out, di_threadpool *tp) {
    job j = {FMT_F32, NULL, NULL, w, NULL, M, K, N, out, NULL, NULL, 0};
    run(&j, NULL, x, tp);
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
