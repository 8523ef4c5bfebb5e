/* MXFP4 linears on AVX2 (kernels.h, "MXFP4"), compiled with per-function
 * target attributes like kernels_avx2.c and called only after
 * di_cpu_has_avx2(). kernels.h sums each 32-code block exactly (two sums:
 * the codes of activations at or above 2^-3 and the rest) and joins it to
 * one of two chains (even and odd blocks) with one FMA; exact sums may be
 * taken in any order and any arithmetic, which both halves of this file use.
 *
 * Decode rows (M <= 16; the same kernels up to DEC_M) read every weight once
 * for a handful of activation rows, so their speed is the number of vector
 * operations per weight byte:
 * - weights: 32 bytes (64 codes, two blocks) -> two byte vectors of 2·qw by
 *   `vpshufb` (low and high nibbles), then four 16-bit vectors holding
 *   256·2·qw, each byte moved to the top of its word (shift or mask): the
 *   sign comes with it;
 * - activations: laid out once per call as 16-bit qa·2^6 (codes of at least
 *   2^-3: at most 448·64 = 28,672) and qa·2^9 (the smaller ones, below 64),
 *   in the order the weight vectors hold their codes;
 * - `vpmaddwd` of each pair: 32-bit lane j of the four results holds 8
 *   products times 2^15 (2^18 for the small codes), lanes 0-3 block 2c and
 *   4-7 block 2c+1, each below 2^30; two lanes added and shifted right by 8
 *   (exact: multiples of 2^8) are below 2^23, so a block's four lanes sum
 *   below 2^24 in int32 and convert to fp32 exactly;
 * - four weight rows at a time: their lanes are summed by a transpose-add
 *   into one vector [rows 0-3 of block 2c | rows 0-3 of block 2c+1], and one
 *   FMA with the scales sa·sw·2^-7 joins all eight to their chains: lanes
 *   0-3 hold the rows' even chains, 4-7 their odd ones. The product inside
 *   an FMA is exact, so B·2^7 times s·2^-7 is the step fma(B, s, C).
 * About 21 operations per 64 codes, against ~36 for decoding the codes to
 * fp32 and an FMA per code. On CPUs with AVX-512 the calls take 8 weight
 * rows, two groups of 4 in the halves of 512-bit vectors ("decode rows on
 * 512-bit vectors": the same lanes, half the instructions, which issue on
 * two ports there rather than three: +10-18 % for one or two activation
 * rows, +40-49 % for 4 to 16 on a Xeon); with AVX-512 VNNI a call of one
 * activation row meets the table's bytes with the activations' bytes
 * instead of 16-bit words (dec8_1b: the same integers, 10 operations a
 * vector against 14, 8 with AVX-512 VBMI; in spans such calls take 4 rows
 * a 64-byte line at a time, dec4_1q_kernel), and so do the 256-bit
 * kernels' calls of one row on CPUs with AVX-VNNI (dec4_1b). The scale
 * vectors come from the E8M0 bytes by integer adds on exponents (4 rows ×
 * 8 blocks at a time, transposed), which gives normal numbers only: row
 * groups whose exponents come near either end of the range, NaN scales,
 * NaN activation codes or activation scales that are not powers of two
 * take the scalar code instead.
 *
 * Prefill (M > DEC_M; where the integer kernels above sum by VNNI and
 * there is no AMX, they instead, in pieces of PIECE_M rows) decodes panels
 * of 16 weight rows to fp32 w·sw (exact) in tiles [k][16] and runs a 6-row ×
 * 16-column FMA kernel over each block of 32 codes from zero (12
 * independent chains; on CPUs with AVX-512, panels of 32 rows, 6 × 32
 * outputs on 512-bit vectors, decoded from the codes by pf4_decode_wide,
 * from DEC_M_WIDE rows on), adding the block's sums to the output's even
 * or odd chain in memory: one load-add-store per 32 FMAs of a chain.
 * Activations (qa·sa, exact) are laid out row by row; the small codes of
 * a row's block, where there are any, apart, and a block where some row
 * of the six has them runs a second pass on them. */
#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_words.h"

#ifdef DI_HAVE_AVX2_KERNELS

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
/* The prefill micro-kernels and the decode rows on 512-bit vectors, run
 * only where di_cpu_kernels_wide() says so. */
#define AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")))

/* The integer kernels take batches up to DEC_M rows: against the prefill
 * tiles they measured 1.2-1.6x faster at 17-128 rows of expert w1 (one
 * thread; the tiles' panel decoding is then a large share), slower at 512.
 * The tiles on 512-bit vectors catch up sooner: equal at 24 rows, 1.05x
 * at 32, 1.3x at 64, 1.5x at 128 (one thread, a Xeon VM with AVX-512,
 * bench/RESULTS.md), so there the integer kernels stop at DEC_M_WIDE;
 * but with the VNNI sums they run ~150 GFLOP/s from 24 to 128 rows against
 * the tiles' 90-135 (one thread, the same VM, the tiles' panels decoded
 * from codes), so on CPUs with VNNI they take every batch up to DEC_M
 * (and past it in pieces, below).
 * Weight rows per kernel call (R, the transpose-add's four), activation
 * rows per call at most (MB), per sweep of a unit's weights (MBLK); weight
 * rows per work unit (UNIT). */
enum { DEC_M = 128, DEC_M_WIDE = 24, R = 4, MB = 2, MBLK = 16, UNIT = 32 };
/* Past DEC_M rows, where the integer kernels sum by VNNI (AVX-512 VNNI,
 * or AVX-VNNI on 256-bit vectors: pieces_route) and there is no AMX, they
 * still take the batch, in pieces of at most PIECE_M rows
 * (dec4_pieces): each piece's 16-bit activations (PIECE_M·K·2 bytes, 640 KB
 * at K 5,120) stay in L2 while every weight unit streams past them, and
 * the weights, read again for each piece, come from the last-level cache.
 * Where the core's L2 is smaller than 4·PIECE_M·K bytes, pieces of fewer
 * rows (down to MBLK) keep them within half of it (piece_rows).
 * vpdpwssd keeps the sums near its issue rate (~145 GFLOP/s a thread on the
 * 2-vCPU Xeon VM) at any M, where the prefill tiles' FMAs ran 117-122
 * (their block sums' chain steps and the tiles' and activations' sourcing,
 * bench/RESULTS.md 2026-12-05): expert w1 against OpenBLAS at 256 / 512 /
 * 1,032 rows on one thread 0.94 / 0.88 / 0.82 -> 1.08-1.15 / 1.01-1.08 /
 * 0.98-1.03, on two 0.96 / 0.87 / 0.84 -> 1.08-1.35 / 0.96-1.06 /
 * 0.95-1.05 (pieces of 32-64 rows alike; 96-256 rows 6-9 % slower: the
 * activations leave L2). Without VNNI (vpmaddwd then vpaddd) the pieces
 * ran as fast as the tiles (117 against 120), and on 256-bit vectors
 * slower (73 against 80): the tiles stay there. With AVX-VNNI the 256-bit
 * integer kernels sum by vpdpwssd too (dec4_wide_v) and ran 94-101
 * against those tiles' 85-90 past 128 rows (one thread, the same VM,
 * OpenBLAS's AVX2 sgemm 89-106): pieces there as well (pieces_route). Same
 * bits (bench/RESULTS.md 2026-12-06). */
enum { PIECE_M = 64 };
/* Decode rows of one or two activation rows go in spans of SPAN units
 * where the range holds them (dec4_units): on 512-bit vectors register
 * slot r of group t reads rows t + r·SPAN·UNIT/8, so each slot streams
 * SPAN·UNIT/8 = 32 consecutive rows (on 256-bit vectors 4 slots of 64:
 * dec4_span), and prefetches its stream SPAN_PF bytes ahead, where
 * groups of 8 consecutive rows prefetched the group two ahead. The
 * hardware prefetchers follow one stream a 4 KB page, and 8 rows of
 * 1-2.5 KB put several in one. One row from DRAM on the 2-vCPU
 * Xeon VM, paired with the tree before: expert w1 (K 5,120) 11.8 -> 14.9
 * GB/s, w2 (K 2,304) 11.5 -> 14.7, two threads +24 %, two activation rows
 * +11-14 %; slots of 4 rows 13.7, 16 rows 14.0, 64-128 rows 14.2-15.0; no
 * prefetch 12.4-13.1; 768 bytes ahead 15.0-15.1 against 512's 14.6-14.9
 * and 1,024's 15.0-15.2 (medians of 4 alternations; bench/RESULTS.md
 * 2026-12-05). Same bits. One activation row in the VNNI byte form goes
 * further: 4 slots of 64 rows, each a whole line a step (dec4q_span). */
enum { SPAN = 8, SPAN_PF = 768 };
/* On CPUs with AMX-BF16 the prefill's tiles (kernels_amx_mxfp4.c) take
 * every batch from AMX_MIN_M rows: with the weights read from DRAM, as a
 * model's experts are, they ran expert w1 (K 5,120, N 2,304) in 2.15 ms
 * at 17 rows against the VNNI integer kernels' 2.60, and 3.38 against
 * 9.82 at 64 rows (one thread of the 2-vCPU Xeon VM, bench/RESULTS.md
 * 2026-12-05); at 16 rows the integer kernels are as fast. */
enum { AMX_MIN_M = 17 };
/* Combined exponent e = E8M0 byte + exponent of sa (s = 2^(e-127)) the
 * decode rows take: s·2^-7 normal at the bottom, s normal at the top (as
 * the scalar code's fp32 product sa·sw must be). */
enum { E_LO = 8, E_HI = 254 };

/* Activation scales: their exponents' range; 0 when one is not a finite
 * positive power of two (normal). (kernels.h: di_cpu_scale_exps) */
int di_cpu_scale_exps(const float *sa, int64_t n, int *lo, int *hi) {
    *lo = 1000, *hi = -1000;
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &sa[i], 4);
        const int be = (int)(bits >> 23);
        if ((bits & 0x7fffff) || be == 0 || be >= 255) return 0;
        *lo = be - 127 < *lo ? be - 127 : *lo, *hi = be - 127 > *hi ? be - 127 : *hi;
    }
    return 1;
}

/* ---- decode rows ---- */

/* The activations of a call, in the weight vectors' order. */
typedef struct act16 {
    int64_t chunks;       /* of 64 codes */
    int16_t *big, *small; /* [M][chunks][4][16] */
    uint8_t *has_small;   /* [M][chunks] */
    int32_t *eaw;         /* [M][chunks][8]: exponent of sa - 7, block 2c in lanes 0-3,
                             2c+1 in 4-7 (0 past K, and 8 zeros after the last row) */
    int ea_min, ea_max;   /* exponents of sa */
    /* The byte form of the big codes (act16_bytes; NULL where not built),
     * by steps of two chunks (128 codes, a 64-byte line of a weight row):
     * bytes [M][steps][4][64], the low bytes of the codes the weights'
     * low nibbles meet (byte b: element 2b of the step), of those the
     * high nibbles meet (element 2b + 1), then the high bytes of both
     * (chunk 2s in bytes 0-31 of each part, 2s + 1 in 32-63, zeros past
     * the last chunk); corr [M][chunks][8] and 8 zeros, the bias's share
     * of each block's sum (see dec8_1b), laid out as eaw. */
    int8_t *bytes;
    int32_t *corr;
    int vbmi;             /* the byte form's lookups by vpermb (dec8_1b_vbmi) */
} act16;

/* E4M3 code -> its value times 2^6 where that is at least 2^-3 (low 16
 * bits), times 2^9 where it is smaller (high 16 bits); NaN codes -> 0
 * (act16_chunk() finds them on the codes). */
static uint32_t code16[256];
static pthread_once_t code16_once = PTHREAD_ONCE_INIT;

static void code16_init(void) {
    const float *e4m3 = di_cpu_e4m3_table();
    for (int b = 0; b < 256; b++) {
        const float v = e4m3[b];
        int16_t big = 0, small = 0;
        if (!isnan(v)) {
            if (fabsf(v) >= 0.125f) big = (int16_t)(v * 64.0f);
            else small = (int16_t)(v * 512.0f);
        }
        code16[b] = (uint16_t)big | (uint32_t)(uint16_t)small << 16;
    }
}

/* Chunk c of a row's codes q (64, or n < 64 with zeros after) into its four
 * 16-bit vectors of each part; returns bit 0: any small code, bit 1: a NaN
 * code. The codes are first sorted by k % 4 (vector 0: k % 4 = 0, 1: 2, 2:
 * 1, 3: 3), then looked up 8 at a time. */
static AVX2 unsigned act16_chunk(const uint8_t *q, int64_t n, int16_t *big, int16_t *small) {
    uint8_t pad[64];
    if (n < 64) {
        memset(pad, 0, sizeof pad);
        memcpy(pad, q, (size_t)n);
        q = pad;
    }
    const __m256i q0 = _mm256_loadu_si256((const __m256i *)q), q1 = _mm256_loadu_si256((const __m256i *)(q + 32));
    const __m256i low7 = _mm256_set1_epi8(0x7f);
    const __m256i nan = _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(q0, low7), low7),
                                        _mm256_cmpeq_epi8(_mm256_and_si256(q1, low7), low7));
    /* per 16 codes: k % 4 = 0, 2, 1, 3, four of each */
    const __m256i by4 = _mm256_setr_epi8(0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15,
                                         0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15);
    const __m256i pairs = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i s0 = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(q0, by4), pairs);
    const __m256i s1 = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(q1, by4), pairs);
    /* bytes of vectors 0 | 2 and 1 | 3, 16 codes each */
    const __m256i v02 = _mm256_unpacklo_epi64(s0, s1), v13 = _mm256_unpackhi_epi64(s0, s1);
    const __m128i vb[4] = {_mm256_castsi256_si128(v02), _mm256_castsi256_si128(v13),
                           _mm256_extracti128_si256(v02, 1), _mm256_extracti128_si256(v13, 1)};
    const __m256i lo16 = _mm256_set1_epi32(0xffff);
    __m256i any = _mm256_setzero_si256();
    for (int t = 0; t < 4; t++) {
        const __m256i a = _mm256_i32gather_epi32((const int *)code16, _mm256_cvtepu8_epi32(vb[t]), 4);
        const __m256i b = _mm256_i32gather_epi32((const int *)code16, _mm256_cvtepu8_epi32(_mm_srli_si128(vb[t], 8)), 4);
        /* packus keeps 0..65535; lanes [a0-3 b0-3 | a4-7 b4-7] back in order */
        const __m256i bg = _mm256_permute4x64_epi64(_mm256_packus_epi32(_mm256_and_si256(a, lo16), _mm256_and_si256(b, lo16)), 0xd8);
        const __m256i sm = _mm256_permute4x64_epi64(_mm256_packus_epi32(_mm256_srli_epi32(a, 16), _mm256_srli_epi32(b, 16)), 0xd8);
        _mm256_store_si256((__m256i *)(big + 16 * t), bg);
        _mm256_store_si256((__m256i *)(small + 16 * t), sm);
        any = _mm256_or_si256(any, sm);
    }
    return (unsigned)!_mm256_testz_si256(any, any) | (unsigned)!_mm256_testz_si256(nan, nan) << 1;
}

/* 0 when the activations have a NaN code or a scale that is not a power of
 * two (the scalar code then runs). */
static int act16_build(const uint8_t *qa, const float *sa, int64_t M, int64_t K, act16 *a) {
    pthread_once(&code16_once, code16_init);
    const int64_t KB = K / 32, chunks = a->chunks;
    if (!di_cpu_scale_exps(sa, M * KB, &a->ea_min, &a->ea_max)) return 0;
    for (int64_t m = 0; m < M; m++) {
        for (int64_t c = 0; c < chunks; c++) {
            int32_t *ew = a->eaw + (m * chunks + c) * 8;
            for (int h = 0; h < 2; h++) {
                int e = 0;
                if (2 * c + h < KB) {
                    uint32_t bits;
                    memcpy(&bits, &sa[m * KB + 2 * c + h], 4);
                    e = (int)(bits >> 23) - 127 - 7;
                }
                for (int l = 0; l < 4; l++) ew[4 * h + l] = e;
            }
            const int64_t n = K - c * 64 < 64 ? K - c * 64 : 64;
            const unsigned f = act16_chunk(qa + m * K + c * 64, n, a->big + (m * chunks + c) * 64,
                                           a->small + (m * chunks + c) * 64);
            if (f & 2) return 0;
            a->has_small[m * chunks + c] = (uint8_t)(f & 1);
        }
    }
    return 1;
}

/* Steps of two chunks in a row (act16's bytes). */
static inline int64_t act16_steps(const act16 *a) { return (a->chunks + 1) / 2; }

/* The byte form of activation row m's big codes (act16's bytes and corr,
 * for dec8_1b): each 16-bit value a = 256·h + l with l its low byte as a
 * signed byte, so h = (a + 128) >> 8 (|h| <= 112 as |a| <= 28,672), in the
 * order the weights' decoded bytes hold their codes: byte b of the first
 * vector the low byte of element 2b of the chunk, which is word b / 2 of
 * big's part k % 4 = 0 for even b and of part k % 4 = 2 for odd b; the
 * second vector the same for elements 2b + 1 (parts 1 and 3). corr: per
 * block twelve times the sum of its values (block 2c: words 0-7 of every
 * part, 2c + 1: words 8-15). */
static AVX2 void act16_bytes(act16 *a, int64_t m) {
    const int64_t chunks = a->chunks;
    const __m256i lo8 = _mm256_set1_epi16(0xff), h128 = _mm256_set1_epi16(128), one = _mm256_set1_epi16(1);
    for (int64_t c = 0; c < chunks; c++) {
        const __m256i *big = (const __m256i *)(a->big + (m * chunks + c) * 64);
        __m256i *by = (__m256i *)(a->bytes + m * act16_steps(a) * 256 + (c >> 1) * 256 + (c & 1) * 32);
        const __m256i p0 = _mm256_load_si256(big), p2 = _mm256_load_si256(big + 1); /* k % 4 = 0, 2 */
        const __m256i p1 = _mm256_load_si256(big + 2), p3 = _mm256_load_si256(big + 3); /* k % 4 = 1, 3 */
#define BYTES2(x, y) _mm256_or_si256(_mm256_and_si256(x, lo8), _mm256_slli_epi16(y, 8))
#define HIGH(x) _mm256_srai_epi16(_mm256_add_epi16(x, h128), 8)
        _mm256_store_si256(by, BYTES2(p0, p2));
        _mm256_store_si256(by + 2, BYTES2(p1, p3));
        _mm256_store_si256(by + 4, BYTES2(HIGH(p0), HIGH(p2)));
        _mm256_store_si256(by + 6, BYTES2(HIGH(p1), HIGH(p3)));
#undef BYTES2
#undef HIGH
        /* lanes 0-3: words 0-7 of the parts (block 2c), 4-7: words 8-15 */
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_madd_epi16(p0, one), _mm256_madd_epi16(p1, one)),
                                     _mm256_add_epi32(_mm256_madd_epi16(p2, one), _mm256_madd_epi16(p3, one)));
        s = _mm256_add_epi32(s, _mm256_shuffle_epi32(s, 0x4e));
        s = _mm256_add_epi32(s, _mm256_shuffle_epi32(s, 0xb1));
        _mm256_store_si256((__m256i *)(a->corr + (m * chunks + c) * 8), _mm256_mullo_epi32(s, _mm256_set1_epi32(12)));
    }
}

/* The arguments of one kernel call: R weight rows, mr activation rows. */
typedef struct dec4_args {
    int64_t chunks, KB;
    int half_last;              /* K % 64 == 32: the last chunk holds one block */
    const uint8_t *rows[R];     /* code rows */
    const uint8_t *srow[R];     /* E8M0 rows */
    const uint8_t *ahead;       /* the row group to prefetch (or NULL) */
    int stream_pf;              /* prefetch each row's stream SPAN_PF bytes ahead (a span) */
    const int16_t *big, *small; /* activation row m0; rows chunks·64 apart */
    const uint8_t *has_small;   /* rows chunks apart */
    const int32_t *eaw;         /* rows chunks·8 apart */
    const int8_t *bytes;        /* act16's byte form of row m0 (or NULL) */
    const int32_t *corr;
    int vbmi;                   /* act16's vbmi */
} dec4_args;

/* 32 bytes of a row (16 for the half chunk, the rest zero codes). */
AVX2_INLINE __m256i load_codes(const uint8_t *row, int64_t c, int half) {
    if (half) return _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_loadu_si128((const __m128i *)(row + c * 32)), 0);
    return _mm256_loadu_si256((const __m256i *)(row + c * 32));
}

/* Group g's 8 E8M0 bytes of a row, even blocks to lanes 0-3, odd to 4-7. */
AVX2_INLINE __m256i load_exps(const uint8_t *srow, int64_t g, int64_t KB) {
    __m128i b;
    if (8 * g + 8 <= KB) {
        b = _mm_loadl_epi64((const __m128i *)(srow + 8 * g));
    } else { /* past the row's end: zero bytes, whose lanes meet zero sums */
        uint8_t tmp[8] = {0};
        memcpy(tmp, srow + 8 * g, (size_t)(KB - 8 * g));
        b = _mm_loadl_epi64((const __m128i *)tmp);
    }
    b = _mm_shuffle_epi8(b, _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, -1, -1, -1, -1, -1, -1, -1, -1));
    return _mm256_cvtepu8_epi32(b);
}

/* Smallest byte of the 16 in x (unsigned). */
AVX2_INLINE int hmin_epu8(__m128i x) {
    x = _mm_min_epu8(x, _mm_srli_si128(x, 8));
    x = _mm_min_epu8(x, _mm_srli_si128(x, 4));
    x = _mm_min_epu8(x, _mm_srli_si128(x, 2));
    x = _mm_min_epu8(x, _mm_srli_si128(x, 1));
    return _mm_cvtsi128_si32(x) & 0xff;
}

/* min and max of n bytes (the max as 255 - the min of the complements).
 * (kernels.h: di_cpu_byte_range) */
AVX2 void di_cpu_byte_range(const uint8_t *p, int64_t n, int *lo, int *hi) {
    __m256i vmin = _mm256_set1_epi8(-1), vmax = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(p + i));
        vmin = _mm256_min_epu8(vmin, v), vmax = _mm256_max_epu8(vmax, v);
    }
    const __m256i ones = _mm256_set1_epi8(-1);
    int mn = hmin_epu8(_mm_min_epu8(_mm256_castsi256_si128(vmin), _mm256_extracti128_si256(vmin, 1)));
    const __m256i cmax = _mm256_xor_si256(vmax, ones);
    int mx = 255 - hmin_epu8(_mm_min_epu8(_mm256_castsi256_si128(cmax), _mm256_extracti128_si256(cmax, 1)));
    for (; i < n; i++) mn = p[i] < mn ? p[i] : mn, mx = p[i] > mx ? p[i] : mx;
    *lo = mn, *hi = mx;
}

/* The four weight vectors times the activation vectors at a: lane j the sum
 * of group j's 8 products. */
AVX2_INLINE __m256i madd4(__m256i v0, __m256i v1, __m256i v2, __m256i v3, const int16_t *a) {
    const __m256i *p = (const __m256i *)a;
    const __m256i s0 = _mm256_madd_epi16(v0, _mm256_load_si256(p + 0));
    const __m256i s1 = _mm256_madd_epi16(v1, _mm256_load_si256(p + 1));
    const __m256i s2 = _mm256_madd_epi16(v2, _mm256_load_si256(p + 2));
    const __m256i s3 = _mm256_madd_epi16(v3, _mm256_load_si256(p + 3));
    return _mm256_add_epi32(_mm256_add_epi32(s0, s1), _mm256_add_epi32(s2, s3));
}
/* vpdpwssd on 256-bit vectors, VEX-encoded (AVX-VNNI): by assembly, as
 * dpwssd_w, so that no function needs the target; registers 0-15 only
 * (VEX), the second factor may be a memory operand. */
AVX2_INLINE __m256i dpwssd_avx(__m256i acc, __m256i a, __m256i b) {
    __asm__("%{vex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(a), "xm"(b));
    return acc;
}
/* madd4 with AVX-VNNI: one vpmaddwd and three vpdpwssd instead of four
 * vpmaddwd and three vpaddd (the same integers: each product pair at most
 * 2^27, their sum below 2^31). */
AVX2_INLINE __m256i madd4_avx_vnni(__m256i v0, __m256i v1, __m256i v2, __m256i v3, const int16_t *a) {
    const __m256i *p = (const __m256i *)a;
    const __m256i s = dpwssd_avx(_mm256_madd_epi16(v0, _mm256_load_si256(p + 0)), v1, _mm256_load_si256(p + 1));
    return dpwssd_avx(dpwssd_avx(s, v2, _mm256_load_si256(p + 2)), v3, _mm256_load_si256(p + 3));
}

/* E2M1 code -> 2·value as a signed byte, in both 128-bit halves (a
 * `vpshufb` table). */
AVX2_INLINE __m256i e2m1_bytes(void) {
    return _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                            0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
}

/* Chunk c of a row: the four 16-bit vectors of 256·2·qw. */
#define DEC4_WEIGHTS(row, half)                                                                  \
    const __m256i x_ = load_codes(row, c, half);                                                 \
    const __m256i wl_ = _mm256_shuffle_epi8(tab, _mm256_and_si256(x_, nib));                      \
    const __m256i wh_ = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(x_, 4), nib)); \
    const __m256i v0 = _mm256_slli_epi16(wl_, 8), v1 = _mm256_and_si256(wl_, top);               \
    const __m256i v2 = _mm256_slli_epi16(wh_, 8), v3 = _mm256_and_si256(wh_, top);

/* [a0+a2, b0+b2, a1+a3, b1+b3 | the same for lanes 4-7]: half of the
 * transpose-add of two rows' lane sums a, b. */
AVX2_INLINE __m256i pair_add(__m256i a, __m256i b) {
    return _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}
/* pair_add() of the big codes' lane sums (each a multiple of 2^8 below
 * 2^30, so two fit in int32), shifted right by 8 (exact). */
AVX2_INLINE __m256i pair_sh(__m256i a, __m256i b) { return _mm256_srai_epi32(pair_add(a, b), 8); }
/* Rows 0-1 (u) and 2-3 (v) -> [block 2c of rows 0-3 | block 2c+1 of rows 0-3]. */
AVX2_INLINE __m256i quad_add(__m256i u, __m256i v) {
    return _mm256_add_epi32(_mm256_unpacklo_epi64(u, v), _mm256_unpackhi_epi64(u, v));
}

/* The small codes' block sums of chunk c for the R rows and activation row
 * at a (int32, exact: below 2^23), the codes decoded again here rather
 * than kept in registers for this rare case. */
static inline __attribute__((always_inline, target("avx2,fma,f16c"))) __m256
small_sums(const dec4_args *g, int64_t c, int half, const int16_t *a) {
    const __m256i tab = e2m1_bytes();
    const __m256i nib = _mm256_set1_epi8(0x0f), top = _mm256_set1_epi16((short)0xff00);
    __m256i s[R];
    for (int r = 0; r < R; r++) {
        DEC4_WEIGHTS(g->rows[r], half)
        s[r] = madd4(v0, v1, v2, v3, a);
    }
    return _mm256_cvtepi32_ps(quad_add(pair_add(s[0], s[1]), pair_add(s[2], s[3])));
}

/* The prefetch of the row group ahead (g->ahead, R rows, contiguous)
 * that goes with chunk c: its lines from c·R·32 on, as many as a chunk of
 * the R rows reads (two), so that the whole group has been asked for when
 * the chunks end. Chunk by chunk rather than a group's 8 lines at the start
 * of every 4 chunks: on the 2-vCPU Xeon VM one MXFP4 row read from DRAM
 * 5-10 % faster so (512-bit kernels 11.4-12.2 -> 12.5-13.0 GB/s, 256-bit
 * 9.4-9.5 -> 10.0-10.1; bench/RESULTS.md, 2026-12-05). */
AVX2_INLINE void chunk_prefetch(const dec4_args *g, int64_t c) {
    if (g->stream_pf) { /* a line a row every other chunk, rows 0-1 and 2-3 in turn */
        _mm_prefetch((const char *)g->rows[2 * (c & 1)] + c * 32 + SPAN_PF, _MM_HINT_T1);
        _mm_prefetch((const char *)g->rows[2 * (c & 1) + 1] + c * 32 + SPAN_PF, _MM_HINT_T1);
    }
    if (g->ahead) {
        const char *p = (const char *)g->ahead + c * (R * 32);
        _mm_prefetch(p, _MM_HINT_T1);
        _mm_prefetch(p + 64, _MM_HINT_T1);
    }
}

/* At the start of group grp (4 chunks): the R = 4 rows' E8M0 bytes of
 * the group's 8 blocks, transposed per chunk: ewb[i] = [rows 0-3 of block
 * 2i | rows 0-3 of block 2i+1]. */
AVX2_INLINE void group_start(const dec4_args *g, int64_t grp, int32_t ewb[4][8]) {
    const __m256i e0 = load_exps(g->srow[0], grp, g->KB), e1 = load_exps(g->srow[1], grp, g->KB);
    const __m256i e2 = load_exps(g->srow[2], grp, g->KB), e3 = load_exps(g->srow[3], grp, g->KB);
    const __m256i x0 = _mm256_unpacklo_epi32(e0, e1), x1 = _mm256_unpackhi_epi32(e0, e1);
    const __m256i x2 = _mm256_unpacklo_epi32(e2, e3), x3 = _mm256_unpackhi_epi32(e2, e3);
    _mm256_store_si256((__m256i *)ewb[0], _mm256_unpacklo_epi64(x0, x2));
    _mm256_store_si256((__m256i *)ewb[1], _mm256_unpackhi_epi64(x0, x2));
    _mm256_store_si256((__m256i *)ewb[2], _mm256_unpacklo_epi64(x1, x3));
    _mm256_store_si256((__m256i *)ewb[3], _mm256_unpackhi_epi64(x1, x3));
}

/* One step of the chains of activation row m (relative to the call's
 * first) at chunk c: the big codes' block sums z (int32, [rows 0-3 of
 * block 2c | of block 2c+1]) times sa·sw·2^-7 (from the rows' E8M0 bytes
 * ew and the row's activation exponents), then the small codes' where the
 * row has them (times sa·sw·2^-18). */
AVX2_INLINE __m256 chain_step(const dec4_args *g, int64_t m, int64_t c, int half, __m256i ew, __m256i z,
                              __m256 L) {
    const int64_t at = m * g->chunks + c;
    const __m256 f = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(ew, _mm256_loadu_si256((const __m256i *)(g->eaw + at * 8))), 23));
    L = _mm256_fmadd_ps(_mm256_cvtepi32_ps(z), f, L);
    if (__builtin_expect(g->has_small[at], 0))
        L = _mm256_fmadd_ps(small_sums(g, c, half, g->small + at * 64), _mm256_mul_ps(f, _mm256_set1_ps(0x1p-11f)), L);
    return L;
}

/* Weight row r's lane sums for activation rows 0 and 1 (the second only if
 * mr == 2). */
#define DEC4_ROW(r, s0, s1)                                                                      \
    __m256i s0, s1 = _mm256_setzero_si256();                                                     \
    {                                                                                            \
        DEC4_WEIGHTS(rows[r], half)                                                              \
        s0 = madd4(v0, v1, v2, v3, big + c * 64);                                                \
        if (mr == 2) s1 = madd4(v0, v1, v2, v3, big + (chunks + c) * 64);                        \
    }

/* R = 4 weight rows × mr (1 or 2) activation rows over all chunks;
 * res[m·R + r]. */
AVX2_INLINE void dec4_kernel(const int mr, const dec4_args *g, float *res) {
    const __m256i tab = e2m1_bytes();
    __m256i nib = _mm256_set1_epi8(0x0f), top = _mm256_set1_epi16((short)0xff00);
    /* opaque from here on: kept in registers, not rebuilt for every row */
    __asm__("" : "+x"(nib), "+x"(top));
    const int64_t chunks = g->chunks;
    const uint8_t *rows[R];
    for (int r = 0; r < R; r++) rows[r] = g->rows[r];
    const int16_t *const big = g->big;
    __attribute__((aligned(32))) int32_t ewb[4][8];
    __m256 L0 = _mm256_setzero_ps(), L1 = _mm256_setzero_ps();
    for (int64_t c = 0; c < chunks; c++) {
        chunk_prefetch(g, c);
        if (c % 4 == 0) group_start(g, c / 4, ewb);
        const int half = g->half_last && c == chunks - 1;
        DEC4_ROW(0, a0, b0)
        DEC4_ROW(1, a1, b1)
        const __m256i ua = pair_sh(a0, a1), ub = pair_sh(b0, b1);
        DEC4_ROW(2, a2, b2)
        DEC4_ROW(3, a3, b3)
        const __m256i ew = _mm256_load_si256((const __m256i *)ewb[c % 4]);
        L0 = chain_step(g, 0, c, half, ew, quad_add(ua, pair_sh(a2, a3)), L0);
        if (mr == 2) L1 = chain_step(g, 1, c, half, ew, quad_add(ub, pair_sh(b2, b3)), L1);
        __asm__ volatile("" ::: "memory"); /* activations as memory operands, not held */
    }
    /* out = E + O: lanes r and r + 4 */
    float l[8];
    _mm256_storeu_ps(l, L0);
    for (int r = 0; r < R; r++) res[r] = l[r] + l[r + 4];
    if (mr == 2) {
        _mm256_storeu_ps(l, L1);
        for (int r = 0; r < R; r++) res[R + r] = l[r] + l[r + 4];
    }
}

/* R = 4 weight rows × mr (up to MBLK) activation rows over all chunks, for
 * batches of 3 and more: a chunk's weights are decoded once into wv and
 * every activation row takes them from there (its four activation vectors
 * in registers, the weights as memory operands); the chains wait in lb.
 * res[m·R + r]. vnni: the sums by madd4_avx_vnni. */
AVX2_INLINE void dec4_wide_kernel(const int vnni, const dec4_args *g, int mr, float *res) {
    const __m256i tab = e2m1_bytes();
    const __m256i nib = _mm256_set1_epi8(0x0f), top = _mm256_set1_epi16((short)0xff00);
    const int64_t chunks = g->chunks;
    __attribute__((aligned(32))) int32_t ewb[4][8];
    __attribute__((aligned(32))) int16_t wv[R][4][16];
    __attribute__((aligned(32))) float lb[MBLK][8];
    memset(lb, 0, sizeof lb);
    for (int64_t c = 0; c < chunks; c++) {
        chunk_prefetch(g, c);
        if (c % 4 == 0) group_start(g, c / 4, ewb);
        const int half = g->half_last && c == chunks - 1;
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            DEC4_WEIGHTS(g->rows[r], half)
            _mm256_store_si256((__m256i *)wv[r][0], v0);
            _mm256_store_si256((__m256i *)wv[r][1], v1);
            _mm256_store_si256((__m256i *)wv[r][2], v2);
            _mm256_store_si256((__m256i *)wv[r][3], v3);
        }
        const __m256i ew = _mm256_load_si256((const __m256i *)ewb[c % 4]);
        for (int m = 0; m < mr; m++) {
            const __m256i *a = (const __m256i *)(g->big + (m * chunks + c) * 64);
            const __m256i a0 = _mm256_load_si256(a), a1 = _mm256_load_si256(a + 1);
            const __m256i a2 = _mm256_load_si256(a + 2), a3 = _mm256_load_si256(a + 3);
            __m256i s[R];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                s[r] = vnni ? madd4_avx_vnni(a0, a1, a2, a3, wv[r][0]) : madd4(a0, a1, a2, a3, wv[r][0]);
            _mm256_store_ps(lb[m], chain_step(g, m, c, half, ew, quad_add(pair_sh(s[0], s[1]), pair_sh(s[2], s[3])),
                                              _mm256_load_ps(lb[m])));
        }
    }
    for (int m = 0; m < mr; m++)
        for (int r = 0; r < R; r++) res[m * R + r] = lb[m][r] + lb[m][r + 4];
}

static AVX2 void dec4_wide(const dec4_args *g, int mr, float *res) { dec4_wide_kernel(0, g, mr, res); }
static atomic_long wide_avx_vnni_calls;
long di_cpu_kernels_avx_vnni_wide_calls(void) { return atomic_load(&wide_avx_vnni_calls); }
static AVX2 void dec4_wide_v(const dec4_args *g, int mr, float *res) {
    atomic_fetch_add_explicit(&wide_avx_vnni_calls, 1, memory_order_relaxed);
    dec4_wide_kernel(1, g, mr, res);
}

static AVX2 void dec4_1(const dec4_args *g, float *res) { dec4_kernel(1, g, res); }
static AVX2 void dec4_2(const dec4_args *g, float *res) { dec4_kernel(2, g, res); }

/* E2M1 code (a nibble) -> 2·value + 12, unsigned, the byte form's weight
 * operand (vpdpbusd); both widths repeat it in every 128-bit lane */
static inline __attribute__((always_inline, target("avx2"))) __m128i byte_table16(void) {
    return _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
}

/* dec4_kernel of one or two activation rows in the byte form, with AVX-VNNI
 * (256-bit vpdpbusd, VEX-encoded): what dec8_1b does for 8 rows on 512-bit
 * vectors, for the R = 4 rows of the 256-bit kernels. The table gives
 * each weight code 2·qw + 12 (unsigned), the activations come as the two
 * signed bytes of each 16-bit value (act16_bytes), and a row's lane sums
 * Σ (2·qw + 12)·(256·h + l) less 12 times the block's activations (corr)
 * are the 16-bit form's Σ 2·qw·a after its shift: the same integers, the
 * same chains. Per 32 bytes of a row 10 vector operations against the
 * 16-bit form's 16 (the weights' bytes need no move to the top of a word,
 * and one instruction multiplies, adds four products and accumulates).
 * On the 2-vCPU Xeon VM with its 512-bit kernels forced off, against the
 * 16-bit form (alternated twice, one row, in spans): weights in L2
 * 13.6-15.2 -> 17.0-18.6 GB/s, from DRAM one thread 12.0-12.8 -> 13.7-14.1,
 * two 23.7-24.5 -> 26.3-27.0; two activation rows (the table's bytes met
 * by both rows' bytes) 8.9-9.5 -> 9.8-10.7 and 17.5-18.2 -> 19.1-20.2
 * (bench/RESULTS.md 2026-12-05). */
#define AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#define AVXVNNI_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c,avxvnni")))
AVXVNNI_INLINE void dec4_b_kernel(const int mr, const dec4_args *g, float *res) {
    const __m256i tab = _mm256_broadcastsi128_si256(byte_table16());
    const __m256i nib = _mm256_set1_epi8(0x0f);
    const int64_t chunks = g->chunks, steps = (chunks + 1) / 2;
    const uint8_t *rows[R];
    for (int r = 0; r < R; r++) rows[r] = g->rows[r];
    __attribute__((aligned(32))) int32_t ewb[4][8];
    __m256 L[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
#pragma GCC unroll 2
    for (int64_t c = 0; c < chunks; c++) {
        chunk_prefetch(g, c);
        if (c % 4 == 0) group_start(g, c / 4, ewb);
        const int half = g->half_last && c == chunks - 1;
        /* activation row m's l0, l1, h0, h1: ab[m] + 0, 2, 4, 6 */
        const __m256i *ab[2];
#pragma GCC unroll 2
        for (int m = 0; m < 2; m++)
            ab[m] = (const __m256i *)(g->bytes + m * steps * 256 + (c >> 1) * 256 + (c & 1) * 32);
        __m256i sr[2][R];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m256i x = load_codes(rows[r], c, half);
            const __m256i wl = _mm256_shuffle_epi8(tab, _mm256_and_si256(x, nib));
            const __m256i wh = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(x, 4), nib));
#pragma GCC unroll 2
            for (int m = 0; m < 2; m++)
                if (m < mr) {
                    const __m256i sh = _mm256_dpbusd_avx_epi32(
                        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), wl, _mm256_load_si256(ab[m] + 4)), wh,
                        _mm256_load_si256(ab[m] + 6));
                    sr[m][r] = _mm256_dpbusd_avx_epi32(
                        _mm256_dpbusd_avx_epi32(_mm256_slli_epi32(sh, 8), wl, _mm256_load_si256(ab[m])), wh,
                        _mm256_load_si256(ab[m] + 2));
                }
        }
        const __m256i ew = _mm256_load_si256((const __m256i *)ewb[c % 4]);
#pragma GCC unroll 2
        for (int m = 0; m < 2; m++)
            if (m < mr) {
                const __m256i corr = _mm256_load_si256((const __m256i *)(g->corr + (m * chunks + c) * 8));
                const __m256i z =
                    _mm256_sub_epi32(quad_add(pair_add(sr[m][0], sr[m][1]), pair_add(sr[m][2], sr[m][3])), corr);
                L[m] = chain_step(g, m, c, half, ew, z, L[m]);
            }
    }
    for (int m = 0; m < mr; m++) {
        float l[8];
        _mm256_storeu_ps(l, L[m]);
        for (int r = 0; r < R; r++) res[m * R + r] = l[r] + l[r + 4];
    }
}
static AVXVNNI void dec4_1b(const dec4_args *g, float *res) { dec4_b_kernel(1, g, res); }
static AVXVNNI void dec4_2b(const dec4_args *g, float *res) { dec4_b_kernel(2, g, res); }
/* The 4-row kernel of mr (1 or 2) activation rows: the byte form where
 * the call's activations have it (bytes), else the 16-bit sums. */
typedef void (*dec4_fn)(const dec4_args *g, float *res);
static dec4_fn dec4_for(int mr, int bytes) {
    return mr == 2 ? (bytes ? dec4_2b : dec4_2) : bytes ? dec4_1b : dec4_1;
}

/* ---- decode rows on 512-bit vectors ----
 * dec4_kernel for two groups of R = 4 rows at once, group lo in the low
 * 256 bits of every vector and hi in the high ones: the weights of rows r
 * and r + 4 decode in one register, the activation vectors are loaded into
 * both halves, and the transpose-add and the chain steps work within each
 * half as dec4_kernel's do on one group, so every lane gets the same
 * integer sums and the same FMAs: the same bits, at half the decoding and
 * summing instructions per code. */
#define DEC8_WEIGHTS(r)                                                                          \
    const __m512i x_ = _mm512_inserti64x4(_mm512_castsi256_si512(load_codes(lo->rows[r], c, half)), \
                                          load_codes(hi->rows[r], c, half), 1);                  \
    const __m512i wl_ = _mm512_shuffle_epi8(tab, _mm512_and_si512(x_, nib));                      \
    const __m512i wh_ = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(x_, 4), nib)); \
    const __m512i v0 = _mm512_slli_epi16(wl_, 8), v1 = _mm512_and_si512(wl_, top);               \
    const __m512i v2 = _mm512_slli_epi16(wh_, 8), v3 = _mm512_and_si512(wh_, top);

AVX512_INLINE __m512i madd4_w(__m512i v0, __m512i v1, __m512i v2, __m512i v3, const __m512i a[4]) {
    const __m512i s0 = _mm512_madd_epi16(v0, a[0]), s1 = _mm512_madd_epi16(v1, a[1]);
    const __m512i s2 = _mm512_madd_epi16(v2, a[2]), s3 = _mm512_madd_epi16(v3, a[3]);
    return _mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(s2, s3));
}
/* madd4_w with AVX-512 VNNI: acc + the pairs' products of a and b in one
 * vpdpwssd (written in assembly so that only the kernels run on CPUs with
 * VNNI need it: no compiler target for the whole file). The four sums
 * are added in another order, but they are integers (each at most 2^27,
 * the total below 2^31): the same lanes. */
AVX512_INLINE __m512i dpwssd_w(__m512i acc, __m512i a, __m512i b) {
    __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}
AVX512_INLINE __m512i madd4_vnni(__m512i v0, __m512i v1, __m512i v2, __m512i v3, const __m512i a[4]) {
    const __m512i s = dpwssd_w(_mm512_madd_epi16(v0, a[0]), v1, a[1]);
    return dpwssd_w(dpwssd_w(s, v2, a[2]), v3, a[3]);
}
/* pair_add and pair_sh on 512-bit vectors */
AVX512_INLINE __m512i pair_add_w(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
AVX512_INLINE __m512i pair_sh_w(__m512i a, __m512i b) { return _mm512_srai_epi32(pair_add_w(a, b), 8); }
AVX512_INLINE __m512i quad_add_w(__m512i u, __m512i v) {
    return _mm512_add_epi32(_mm512_unpacklo_epi64(u, v), _mm512_unpackhi_epi64(u, v));
}
/* chain_step for both groups: their E8M0 lanes ew, the activation row's
 * exponents in both halves; the small codes' sums (rare) by group */
AVX512_INLINE __m512 chain_step_w(const dec4_args *lo, const dec4_args *hi, int64_t m, int64_t c, int half,
                                  __m512i ew, __m512i z, __m512 L) {
    const int64_t at = m * lo->chunks + c;
    const __m512i eaw = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(lo->eaw + at * 8)));
    const __m512 f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(ew, eaw), 23));
    L = _mm512_fmadd_ps(_mm512_cvtepi32_ps(z), f, L);
    if (__builtin_expect(lo->has_small[at], 0)) {
        const __m512 ss = _mm512_insertf32x8(_mm512_castps256_ps512(small_sums(lo, c, half, lo->small + at * 64)),
                                             small_sums(hi, c, half, hi->small + at * 64), 1);
        L = _mm512_fmadd_ps(ss, _mm512_mul_ps(f, _mm512_set1_ps(0x1p-11f)), L);
    }
    return L;
}

/* Both groups' E8M0 lanes for chunk c ([lo's | hi's], as group_start
 * transposes them), their bytes read at the start of each group of 4
 * chunks; and chunk c's prefetch of both groups' rows ahead. */
AVX512_INLINE __m512i dec8_exps(const dec4_args *lo, const dec4_args *hi, int64_t c, int32_t ewb[2][4][8]) {
    chunk_prefetch(lo, c);
    chunk_prefetch(hi, c);
    if (c % 4 == 0) {
        group_start(lo, c / 4, ewb[0]);
        group_start(hi, c / 4, ewb[1]);
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_load_si256((const __m256i *)ewb[0][c % 4])),
                              _mm256_load_si256((const __m256i *)ewb[1][c % 4]), 1);
}
/* An activation row's outputs from its chains l (lanes r, r + 4 of each
 * half: E and O of row r of lo, then of hi): out = E + O, res[r] (lo), res[R + r] (hi). */
static inline void dec8_out(const float l[16], float *res) {
    for (int r = 0; r < R; r++) {
        res[r] = l[r] + l[r + 4];
        res[R + r] = l[8 + r] + l[8 + r + 4];
    }
}

/* Groups lo and hi (the same activation rows) × mr (1 or 2) activation
 * rows; res[m·2R + r] (rows of lo, then of hi). vnni: madd4_vnni for
 * madd4_w (a constant in each instance). */
AVX512_INLINE void dec8_kernel(const int mr, const int vnni, const dec4_args *lo, const dec4_args *hi, float *res) {
    const __m512i tab = _mm512_broadcast_i32x4(_mm256_castsi256_si128(e2m1_bytes()));
    const __m512i nib = _mm512_set1_epi8(0x0f), top = _mm512_set1_epi16((short)0xff00);
    const int64_t chunks = lo->chunks;
    __attribute__((aligned(64))) int32_t ewb[2][4][8];
    __m512 L[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t c = 0; c < chunks; c++) {
        const __m512i ew = dec8_exps(lo, hi, c, ewb);
        const int half = lo->half_last && c == chunks - 1;
        __m512i av[2][4];
#pragma GCC unroll 2
        for (int m = 0; m < 2; m++)
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++)
                if (m < mr)
                    av[m][t] = _mm512_broadcast_i64x4(
                        _mm256_load_si256((const __m256i *)(lo->big + (m * chunks + c) * 64 + 16 * t)));
        __m512i sr[2][R];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            DEC8_WEIGHTS(r)
#pragma GCC unroll 2
            for (int m = 0; m < 2; m++)
                if (m < mr) sr[m][r] = vnni ? madd4_vnni(v0, v1, v2, v3, av[m]) : madd4_w(v0, v1, v2, v3, av[m]);
        }
#pragma GCC unroll 2
        for (int m = 0; m < 2; m++)
            if (m < mr)
                L[m] = chain_step_w(lo, hi, m, c, half, ew,
                                    quad_add_w(pair_sh_w(sr[m][0], sr[m][1]), pair_sh_w(sr[m][2], sr[m][3])), L[m]);
    }
    for (int m = 0; m < mr; m++) {
        float l[16];
        _mm512_storeu_ps(l, L[m]);
        dec8_out(l, res + m * 2 * R);
    }
}

static AVX512 void dec8_1(const dec4_args *lo, const dec4_args *hi, float *res) { dec8_kernel(1, 0, lo, hi, res); }
static AVX512 void dec8_2(const dec4_args *lo, const dec4_args *hi, float *res) { dec8_kernel(2, 0, lo, hi, res); }
static AVX512 void dec8_1v(const dec4_args *lo, const dec4_args *hi, float *res) { dec8_kernel(1, 1, lo, hi, res); }
static AVX512 void dec8_2v(const dec4_args *lo, const dec4_args *hi, float *res) { dec8_kernel(2, 1, lo, hi, res); }

/* One activation row with AVX-512 VNNI: the weights' bytes meet the
 * activations' bytes in vpdpbusd (unsigned by signed bytes, four products
 * a lane), which takes them as they come out of the table, where the 16-bit
 * form must first move each to the top of a word (four more operations a
 * vector). vpdpbusd wants one side unsigned: the table gives 2·qw + 12
 * (0 .. 24), and each 16-bit activation value a = 256·h + l is met as its
 * two signed bytes (act16_bytes), so a row's lane sums are
 * Σ (2·qw + 12)·l + 256·Σ (2·qw + 12)·h = Σ 2·qw·a + 12·Σ a, exactly (in
 * int32: at most 8·24·128 + 256·8·24·112 a lane, below 2^25 for a block's
 * four). After the transpose-add,
 * a block's sum less 12 times its activations' sum (corr) is Σ 2·qw·a, the
 * integer dec8_kernel's pair_sh_w gives: the same chains, the same bits.
 * One zmm a weight-row pair takes 10 operations here against 14 (the
 * high bytes' sum, shifted, is where the low bytes' products start: no
 * zeroed register, no add), 8 where vpermb looks the nibbles up without
 * their masks: 1.11-1.17x the 16-bit sums' rate against the first byte
 * form's 1.01-1.05x (bench_fp4_rows, a Zen 4 core, bench/RESULTS.md). */
AVX512_INLINE __m512i dpbusd_w(__m512i acc, __m512i u, __m512i s) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
}
/* vpermb: the bytes of t picked by the low six bits of x's bytes */
AVX512_INLINE __m512i permb_w(__m512i x, __m512i t) {
    __m512i r;
    __asm__("vpermb %2, %1, %0" : "=v"(r) : "v"(x), "v"(t));
    return r;
}
/* E2M1 code -> 2·value + 12 (unsigned, for vpdpbusd), in every 128-bit
 * lane: byte_sums's table. */
AVX512_INLINE __m512i byte_table(void) {
    return _mm512_broadcast_i32x4(byte_table16());
}
/* The lane sums of the weight bytes x (two codes a byte) with the
 * activations' byte form: low nibbles meet l0 (low bytes) and h0 (high),
 * high nibbles l1 and h1; the high bytes' sum, shifted, is where the low
 * bytes' products start. vbmi: the nibbles looked up by vpermb. */
AVX512_INLINE void byte_codes(const int vbmi, __m512i x, __m512i tab, __m512i nib, __m512i *wl, __m512i *wh) {
    const __m512i xh = _mm512_srli_epi16(x, 4);
    *wl = vbmi ? permb_w(x, tab) : _mm512_shuffle_epi8(tab, _mm512_and_si512(x, nib));
    *wh = vbmi ? permb_w(xh, tab) : _mm512_shuffle_epi8(tab, _mm512_and_si512(xh, nib));
}
AVX512_INLINE __m512i byte_dot(__m512i wl, __m512i wh, __m512i l0, __m512i l1, __m512i h0, __m512i h1) {
    const __m512i sh = dpbusd_w(dpbusd_w(_mm512_setzero_si512(), wl, h0), wh, h1);
    return dpbusd_w(dpbusd_w(_mm512_slli_epi32(sh, 8), wl, l0), wh, l1);
}
AVX512_INLINE __m512i byte_sums(const int vbmi, __m512i x, __m512i tab, __m512i nib, __m512i l0, __m512i l1,
                                __m512i h0, __m512i h1) {
    __m512i wl, wh;
    byte_codes(vbmi, x, tab, nib, &wl, &wh);
    return byte_dot(wl, wh, l0, l1, h0, h1);
}
/* One chunk of dec8_1b for mr (1 or 2) activation rows: row r's sums
 * start from its high bytes' (times 256), which the low bytes' products
 * then join in the same register: Σ (2·qw + 12)·(256·h + l) lane by lane,
 * as the two separate sums gave; the weights' bytes looked up once for
 * both activation rows. vbmi: the nibbles looked up by vpermb in a table
 * repeated four times (bits 4-5 of the index pick a copy), which needs no
 * mask. */
AVX512_INLINE void dec8_1b_chunk(const int mr, const int half, const int vbmi, const dec4_args *lo,
                                 const dec4_args *hi, const uint8_t *const rl[R], const uint8_t *const rh[R],
                                 int64_t c, __m512i tab, __m512i nib, __m512i ew, __m512 L[2]) {
    const int64_t chunks = lo->chunks, steps = (chunks + 1) / 2;
    __m512i a[2][4]; /* per activation row: l0, l1, h0, h1 */
#pragma GCC unroll 2
    for (int m = 0; m < 2; m++)
        if (m < mr) {
            const int8_t *ab = lo->bytes + m * steps * 256 + (c >> 1) * 256 + (c & 1) * 32;
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++)
                a[m][t] = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)(ab + 64 * t)));
        }
    __m512i sr[2][R];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(load_codes(rl[r], c, half)),
                                             load_codes(rh[r], c, half), 1);
        __m512i wl, wh;
        byte_codes(vbmi, x, tab, nib, &wl, &wh);
#pragma GCC unroll 2
        for (int m = 0; m < 2; m++)
            if (m < mr) sr[m][r] = byte_dot(wl, wh, a[m][0], a[m][1], a[m][2], a[m][3]);
    }
#pragma GCC unroll 2
    for (int m = 0; m < 2; m++)
        if (m < mr) {
            const __m512i corr =
                _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)(lo->corr + (m * chunks + c) * 8)));
            const __m512i z =
                _mm512_sub_epi32(quad_add_w(pair_add_w(sr[m][0], sr[m][1]), pair_add_w(sr[m][2], sr[m][3])), corr);
            L[m] = chain_step_w(lo, hi, m, c, half, ew, z, L[m]);
        }
}
AVX512_INLINE void dec8_1b_kernel(const int mr, const int vbmi, const dec4_args *lo, const dec4_args *hi,
                                  float *res) {
    const __m512i tab = byte_table();
    const __m512i nib = _mm512_set1_epi8(0x0f);
    const int64_t chunks = lo->chunks, full = chunks - (lo->half_last ? 1 : 0);
    const uint8_t *rl[R], *rh[R];
    for (int r = 0; r < R; r++) rl[r] = lo->rows[r], rh[r] = hi->rows[r];
    __attribute__((aligned(64))) int32_t ewb[2][4][8];
    __m512 L[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t c = 0; c < full; c++)
        dec8_1b_chunk(mr, 0, vbmi, lo, hi, rl, rh, c, tab, nib, dec8_exps(lo, hi, c, ewb), L);
    if (full < chunks) dec8_1b_chunk(mr, 1, vbmi, lo, hi, rl, rh, full, tab, nib, dec8_exps(lo, hi, full, ewb), L);
    for (int m = 0; m < mr; m++) {
        float l[16];
        _mm512_storeu_ps(l, L[m]);
        dec8_out(l, res + m * 2 * R);
    }
}
static AVX512 void dec8_1b(const dec4_args *lo, const dec4_args *hi, float *res) { dec8_1b_kernel(1, 0, lo, hi, res); }
static AVX512 void dec8_1b_vbmi(const dec4_args *lo, const dec4_args *hi, float *res) {
    dec8_1b_kernel(1, 1, lo, hi, res);
}
/* two activation rows in the byte form (act16 built with bytes for both;
 * the weights' bytes looked up once for both): against the 16-bit VNNI
 * sums of dec8_2v, one thread of the 2-vCPU Xeon VM read 11.3-12.0 ->
 * 12.4-13.0 GB/s from DRAM, two threads 22.2-22.9 -> 24.2-24.4
 * (bench/RESULTS.md 2026-12-05) */
static AVX512 void dec8_2b(const dec4_args *lo, const dec4_args *hi, float *res) { dec8_1b_kernel(2, 0, lo, hi, res); }
static AVX512 void dec8_2b_vbmi(const dec4_args *lo, const dec4_args *hi, float *res) {
    dec8_1b_kernel(2, 1, lo, hi, res);
}

/* vpermb with zeroing: the bytes of t picked by x's where k's bit is set, else 0 */
AVX512_INLINE __m512i permb_z(__mmask64 k, __m512i x, __m512i t) {
    __m512i r;
    __asm__("vpermb %2, %1, %0%{%3%}%{z%}" : "=v"(r) : "v"(x), "v"(t), "Yk"(k));
    return r;
}
/* One activation row, R weight rows, a whole 64-byte line of each row a
 * step (128 codes, blocks 4s .. 4s + 3): where dec8_1b reads half a line
 * of 8 rows, here 4 streams read whole lines (dec4q_span). While a loop
 * computes, the 2-vCPU Xeon VM's memory serves few streams much better
 * than many: a synthetic loop with this kernel's compute a byte read 8
 * half-line streams at 14.4-14.8 GB/s, 8 whole-line streams 13.4-14.1, 4
 * whole-line streams 16.7-18.6 (one thread's read probe ~18). Expert w1
 * (K 5,120) one row from DRAM, paired in one process with dec8_1b's spans:
 * 14.0-14.1 -> 16.8-16.9 GB/s, w2 (K 2,304) 14.1-14.3 -> 15.5-15.7; the
 * whole row of 4 slots in one call (nt) rather than a call a row: w2 13.2
 * -> 15.5 (bench/RESULTS.md, 2026-12-05). A row's lane j sums codes 8j ..
 * 8j + 7 (block j / 4 of the step); the transpose-add gives lane 4b + r
 * the sum of row r's block b, so lanes 0-7 are chunk 2s's [rows of block
 * 4s | rows of 4s + 1] and 8-15 chunk 2s + 1's, in the order dec4_kernel's
 * chains take them: the same chains, the same bits.
 * g->rows: the R rows (any places), g->srow their E8M0 rows; each row is
 * followed by nt - 1 more (so a slot's stream goes on from call to call),
 * res[t·R + r] row t after g->rows[r]. Each row's stream is prefetched QPF
 * bytes ahead into L1: T1 read 14.0-15.4 GB/s where T0 read 14.7-16.9,
 * 1,536-3,072 bytes ahead the same within the spread, 4,096 and more
 * slower, none 13.6. */
enum { QPF = 2048 };
AVX512_INLINE void dec4_1q_kernel(const int vbmi, const dec4_args *g0, int64_t nt, float *res) {
    const __m512i tab = byte_table();
    const __m512i nib = _mm512_set1_epi8(0x0f);
    const int64_t KB = g0->KB, rb = KB * 16, chunks = g0->chunks, steps = (chunks + 1) / 2;
    /* step i of a group of 4: E holds row r's 16 E8M0 bytes in its 128-bit
     * lane r; lane 4b + r of the step's exponents is byte 16r + 4i + b
     * (e0 + 4i; without vpermb dword 4r + i, then its byte b: e0 + i) */
    const __m512i e0 = vbmi ? _mm512_set_epi32(51, 35, 19, 3, 50, 34, 18, 2, 49, 33, 17, 1, 48, 32, 16, 0)
                            : _mm512_set_epi32(12, 8, 4, 0, 12, 8, 4, 0, 12, 8, 4, 0, 12, 8, 4, 0);
    const __m512i bsh = _mm512_set_epi32(24, 24, 24, 24, 16, 16, 16, 16, 8, 8, 8, 8, 0, 0, 0, 0);
    const __mmask64 lowb = 0x1111111111111111ull;
    dec4_args q = *g0, *const g = &q;
    for (int64_t t = 0; t < nt; t++) {
        __m512i E = _mm512_setzero_si512();
        __m256 L = _mm256_setzero_ps(); /* [rows 0-3 of the even blocks | of the odd] */
        for (int64_t s = 0; s < steps; s++) {
            if (s % 4 == 0) { /* the group's 16 E8M0 bytes a row (zeros past the row's end) */
                const int64_t b0 = 16 * (s / 4);
                const __mmask16 k = b0 + 16 <= KB ? (__mmask16)0xffff : (__mmask16)((1u << (KB - b0)) - 1);
                E = _mm512_castsi128_si512(_mm_maskz_loadu_epi8(k, g->srow[0] + b0));
                E = _mm512_inserti32x4(E, _mm_maskz_loadu_epi8(k, g->srow[1] + b0), 1);
                E = _mm512_inserti32x4(E, _mm_maskz_loadu_epi8(k, g->srow[2] + b0), 2);
                E = _mm512_inserti32x4(E, _mm_maskz_loadu_epi8(k, g->srow[3] + b0), 3);
            }
            const int64_t n = rb - 64 * s; /* the step's bytes a row: 64, or 16-48 at the end */
            __m512i x[R];
    #pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                _mm_prefetch((const char *)g->rows[r] + 64 * s + QPF, _MM_HINT_T0);
                x[r] = n >= 64 ? _mm512_loadu_si512(g->rows[r] + 64 * s)
                               : _mm512_maskz_loadu_epi8((__mmask64)((1ull << n) - 1), g->rows[r] + 64 * s);
            }
            const int8_t *ab = g->bytes + s * 256;
            const __m512i l0 = _mm512_load_si512(ab), l1 = _mm512_load_si512(ab + 64);
            const __m512i h0 = _mm512_load_si512(ab + 128), h1 = _mm512_load_si512(ab + 192);
            __m512i sr[R];
    #pragma GCC unroll 4
            for (int r = 0; r < R; r++) sr[r] = byte_sums(vbmi, x[r], tab, nib, l0, l1, h0, h1);
            const __m512i z = _mm512_sub_epi32(quad_add_w(pair_add_w(sr[0], sr[1]), pair_add_w(sr[2], sr[3])),
                                               _mm512_loadu_si512(g->corr + 16 * s));
            const __m512i ei = _mm512_add_epi32(e0, _mm512_set1_epi32(vbmi ? 4 * (int)(s % 4) : (int)(s % 4)));
            const __m512i ew = vbmi ? permb_z(lowb, ei, E)
                                    : _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(ei, E), bsh),
                                                       _mm512_set1_epi32(0xff));
            const __m512 f = _mm512_castsi512_ps(
                _mm512_slli_epi32(_mm512_add_epi32(ew, _mm512_loadu_si512(g->eaw + 16 * s)), 23));
            const __m512 zf = _mm512_cvtepi32_ps(z);
    #pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const int64_t c = 2 * s + h;
                if (c >= chunks) break;
                const __m256 fh = h ? _mm512_extractf32x8_ps(f, 1) : _mm512_castps512_ps256(f);
                L = _mm256_fmadd_ps(h ? _mm512_extractf32x8_ps(zf, 1) : _mm512_castps512_ps256(zf), fh, L);
                if (__builtin_expect(g->has_small[c], 0))
                    L = _mm256_fmadd_ps(small_sums(g, c, g->half_last && c == chunks - 1, g->small + c * 64),
                                        _mm256_mul_ps(fh, _mm256_set1_ps(0x1p-11f)), L);
            }
        }
        float l[8];
        _mm256_storeu_ps(l, L);
        for (int r = 0; r < R; r++) res[t * R + r] = l[r] + l[r + 4];
        for (int r = 0; r < R; r++) q.rows[r] += rb, q.srow[r] += KB;
    }
}
static AVX512 void dec4_1q(const dec4_args *g, int64_t nt, float *res) { dec4_1q_kernel(0, g, nt, res); }
static AVX512 void dec4_1q_vbmi(const dec4_args *g, int64_t nt, float *res) { dec4_1q_kernel(1, g, nt, res); }

/* dec4_wide for groups lo and hi at once (mr up to MBLK activation rows):
 * a chunk's weights of both groups decoded once into wv, every activation
 * row's chains stepped from there; res[m·2R + r] (rows of lo, then hi). */
AVX512_INLINE void dec8_wide_kernel(const int vnni, const dec4_args *lo, const dec4_args *hi, int mr, float *res) {
    const __m512i tab = _mm512_broadcast_i32x4(_mm256_castsi256_si128(e2m1_bytes()));
    const __m512i nib = _mm512_set1_epi8(0x0f), top = _mm512_set1_epi16((short)0xff00);
    const int64_t chunks = lo->chunks;
    __attribute__((aligned(64))) int32_t ewb[2][4][8];
    __attribute__((aligned(64))) int16_t wv[R][4][32];
    __attribute__((aligned(64))) float lb[MBLK][16];
    memset(lb, 0, sizeof lb);
    for (int64_t c = 0; c < chunks; c++) {
        const __m512i ew = dec8_exps(lo, hi, c, ewb);
        const int half = lo->half_last && c == chunks - 1;
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            DEC8_WEIGHTS(r)
            _mm512_store_si512(wv[r][0], v0);
            _mm512_store_si512(wv[r][1], v1);
            _mm512_store_si512(wv[r][2], v2);
            _mm512_store_si512(wv[r][3], v3);
        }
        for (int m = 0; m < mr; m++) {
            __m512i av[4];
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++)
                av[t] = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)(lo->big + (m * chunks + c) * 64 + 16 * t)));
            __m512i sr[R];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                sr[r] = vnni ? madd4_vnni(_mm512_load_si512(wv[r][0]), _mm512_load_si512(wv[r][1]),
                                          _mm512_load_si512(wv[r][2]), _mm512_load_si512(wv[r][3]), av)
                             : madd4_w(_mm512_load_si512(wv[r][0]), _mm512_load_si512(wv[r][1]),
                                       _mm512_load_si512(wv[r][2]), _mm512_load_si512(wv[r][3]), av);
            _mm512_store_ps(lb[m], chain_step_w(lo, hi, m, c, half, ew,
                                                quad_add_w(pair_sh_w(sr[0], sr[1]), pair_sh_w(sr[2], sr[3])),
                                                _mm512_load_ps(lb[m])));
        }
    }
    for (int m = 0; m < mr; m++) dec8_out(lb[m], res + m * 2 * R);
}
static AVX512 void dec8_wide(const dec4_args *lo, const dec4_args *hi, int mr, float *res) {
    dec8_wide_kernel(0, lo, hi, mr, res);
}
static AVX512 void dec8_wide_v(const dec4_args *lo, const dec4_args *hi, int mr, float *res) {
    dec8_wide_kernel(1, lo, hi, mr, res);
}

typedef struct dec4_job {
    const uint8_t *qa;
    const float *sa;
    const act16 *act;
    const uint8_t *w, *ws;
    int64_t M, K, N;
    float *out;
} dec4_job;

/* Whether rows g0 .. g1-1 take the decode rows (else the scalar code):
 * their scales' exponents with the activations' inside the range. */
static AVX2 int dec4_scales_ok(const dec4_job *j, int64_t g0, int64_t g1) {
    const int64_t KB = j->K / 32;
    int lo, hi;
    di_cpu_byte_range(j->ws + g0 * KB, (g1 - g0) * KB, &lo, &hi); /* the rows' scales are contiguous */
    return !(hi == 255 || lo + j->act->ea_min < E_LO || hi + j->act->ea_max > E_HI);
}

/* The weight side of a kernel call for rows g0, g0 + step, .. (nn of
 * them, 1 to R): the missing rows of the last group repeat its last row
 * (results dropped); ahead: the rows to prefetch (or NULL). */
static dec4_args dec4_rows(const dec4_job *j, int64_t g0, int64_t nn, int64_t step, const uint8_t *ahead) {
    const int64_t K = j->K, KB = K / 32, rb = K / 2;
    dec4_args g = {.chunks = j->act->chunks, .KB = KB, .half_last = K % 64 != 0, .ahead = ahead};
    for (int r = 0; r < R; r++) {
        const int64_t n = g0 + (r < nn ? r : nn - 1) * step;
        g.rows[r] = j->w + n * rb;
        g.srow[r] = j->ws + n * KB;
    }
    return g;
}

/* The activation side: rows from m0 on. */
static void dec4_act(const act16 *a, int64_t m0, dec4_args *g) {
    g->big = a->big + m0 * a->chunks * 64;
    g->small = a->small + m0 * a->chunks * 64;
    g->has_small = a->has_small + m0 * a->chunks;
    g->eaw = a->eaw + m0 * a->chunks * 8;
    g->bytes = a->bytes ? a->bytes + m0 * act16_steps(a) * 256 : NULL;
    g->corr = a->corr ? a->corr + m0 * a->chunks * 8 : NULL;
    g->vbmi = a->vbmi;
}

/* Weight rows g0 .. g1-1 (at most R) for activation rows mlo .. mhi-1. */
static AVX2 void dec4_group(const dec4_job *j, int64_t g0, int64_t g1, int64_t mlo, int64_t mhi) {
    const act16 *a = j->act;
    const int64_t K = j->K, N = j->N, KB = K / 32, rb = K / 2, nn = g1 - g0;
    if (!dec4_scales_ok(j, g0, g1)) {
        di_gemm_block_rows_scalar(1, j->qa + mlo * K, j->sa + mlo * KB, mhi - mlo, K, j->w, j->ws, N, g0,
                                  g1, j->out + mlo * N);
        return;
    }
    /* the group two ahead, while it lies inside the weights */
    const uint8_t *ahead = g0 + 3 * R > N ? NULL : j->w + (g0 + 2 * R) * rb;
    dec4_args g = dec4_rows(j, g0, nn, 1, NULL);
    if (mhi - mlo > MB) { /* every row of the sweep at once */
        float res[MBLK * R];
        g.ahead = mlo ? NULL : ahead;
        dec4_act(a, mlo, &g);
        (di_cpu_kernels_avx_vnni() ? dec4_wide_v : dec4_wide)(&g, (int)(mhi - mlo), res);
        for (int64_t m = 0; m < mhi - mlo; m++)
            for (int64_t r = 0; r < nn; r++) j->out[(mlo + m) * N + g0 + r] = res[m * R + r];
        return;
    }
    for (int64_t m0 = mlo; m0 < mhi; m0 += MB) {
        const int mr = mhi - m0 < MB ? (int)(mhi - m0) : MB;
        float res[MB * R];
        g.ahead = m0 ? NULL : ahead;
        dec4_act(a, m0, &g);
        /* the byte form on 256-bit vectors (a wide call's last rows keep the 16-bit sums) */
        dec4_for(mr, g.bytes && !di_cpu_kernels_wide())(&g, res);
        for (int64_t m = 0; m < mr; m++)
            for (int64_t r = 0; r < nn; r++) j->out[(m0 + m) * N + g0 + r] = res[m * R + r];
    }
}

/* The 8-row kernel of mr (1 or 2) activation rows: without VNNI the
 * 16-bit sums, with it the byte form where the call's activations have it
 * (by vpermb where they say so), else the VNNI 16-bit sums. */
typedef void (*dec8_fn)(const dec4_args *lo, const dec4_args *hi, float *res);
static dec8_fn dec8_for(int mr, int vnni, const dec4_args *lo) {
    static const dec8_fn forms[2][4] = {{dec8_1, dec8_1v, dec8_1b, dec8_1b_vbmi},
                                        {dec8_2, dec8_2v, dec8_2b, dec8_2b_vbmi}};
    return forms[mr == 2][!vnni ? 0 : !lo->bytes ? 1 : lo->vbmi ? 3 : 2];
}

/* The 8-row kernel call of groups lo and hi (rows g0 + r·step, r < nn:
 * lo's first R, hi's the rest) for activation rows mlo .. mhi-1 (at most
 * MBLK), and its outputs stored. */
static void dec8_call(const dec4_job *j, dec4_args *lo, dec4_args *hi, int64_t g0, int64_t nn, int64_t step,
                      int64_t mlo, int64_t mhi, int vnni) {
    const int64_t N = j->N;
    dec4_act(j->act, mlo, lo);
    dec4_act(j->act, mlo, hi);
    float res[MBLK * 2 * R];
    if (mhi - mlo > MB) (vnni ? dec8_wide_v : dec8_wide)(lo, hi, (int)(mhi - mlo), res);
    else dec8_for((int)(mhi - mlo), vnni, lo)(lo, hi, res);
    for (int64_t m = 0; m < mhi - mlo; m++)
        for (int64_t r = 0; r < nn; r++) j->out[(mlo + m) * N + g0 + r * step] = res[m * 2 * R + r];
}

/* Weight rows g0 .. g1-1 (at most 2R) for activation rows mlo .. mhi-1
 * (at most MBLK) on 512-bit vectors: the first R rows as group lo, the
 * rest as group hi (each prefetching its rows two such pairs ahead). */
static void dec8_group(const dec4_job *j, int64_t g0, int64_t g1, int64_t mlo, int64_t mhi, int vnni) {
    const int64_t N = j->N, rb = j->K / 2;
    if (g1 - g0 <= R || !dec4_scales_ok(j, g0, g1)) {
        for (int64_t g = g0; g < g1; g += R) dec4_group(j, g, g + R < g1 ? g + R : g1, mlo, mhi);
        return;
    }
    /* the pair of groups two ahead, while inside the weights, on the first sweep */
    const int64_t ah = g0 + 2 * 2 * R;
    const int pf = mlo == 0 && ah + 2 * R <= N;
    dec4_args lo = dec4_rows(j, g0, R, 1, pf ? j->w + ah * rb : NULL);
    dec4_args hi = dec4_rows(j, g0 + R, g1 - g0 - R, 1, pf ? j->w + (ah + R) * rb : NULL);
    dec8_call(j, &lo, &hi, g0, g1 - g0, 1, mlo, mhi, vnni);
}

/* Group t of a span (dec4_units: x units from g0 - t on, every
 * activation row, M <= MB): rows g0 + r·S for r < 2R, S = x·UNIT/8,
 * each prefetching its stream; the span's scales checked by the caller. */
static void dec8_span(const dec4_job *j, int64_t g0, int64_t x, int vnni) {
    const int64_t S = x * UNIT / (2 * R);
    dec4_args lo = dec4_rows(j, g0, R, S, NULL), hi = dec4_rows(j, g0 + R * S, R, S, NULL);
    lo.stream_pf = hi.stream_pf = 1;
    dec8_call(j, &lo, &hi, g0, 2 * R, S, 0, j->M, vnni);
}

/* Group t of a span on 256-bit vectors (dec4_units: x units from g0 - t
 * on, every activation row, M <= MB): rows g0 + r·S for r < R, S =
 * x·UNIT/R, so each of the kernel's 4 slots streams 64 consecutive rows,
 * prefetched SPAN_PF bytes ahead; the span's scales checked by the
 * caller. What CPUs without AVX-512 run; on the 2-vCPU Xeon VM with the
 * 512-bit kernels forced off, against groups of 4 consecutive rows
 * (alternated twice), one row from DRAM read 9.8-10.0 -> 11.8-12.6 GB/s on
 * one thread and 18.2-18.7 -> 23.2-24.4 on two, two rows 7.9-8.3 -> 8.4-9.1
 * and 14.8-15.7 -> 16.8-17.3 (bench/RESULTS.md 2026-12-05). Same bits. */
static void dec4_span(const dec4_job *j, int64_t g0, int64_t x) {
    const int64_t S = x * UNIT / R, N = j->N, M = j->M;
    dec4_args g = dec4_rows(j, g0, R, S, NULL);
    g.stream_pf = 1;
    dec4_act(j->act, 0, &g);
    float res[MB * R];
    dec4_for((int)M, g.bytes != NULL)(&g, res);
    for (int64_t m = 0; m < M; m++)
        for (int64_t r = 0; r < R; r++) j->out[m * N + g0 + r * S] = res[m * R + r];
}

/* A span of whole lines (dec4_units: x units from n0 on, one activation
 * row in the byte form): slot r reads rows n0 + r·S .. + S - 1, S =
 * x·UNIT/R, one stream a line at a time, all R in one call; the span's
 * scales checked by the caller. */
static void dec4q_span(const dec4_job *j, int64_t n0, int64_t x) {
    const int64_t S = x * UNIT / R;
    dec4_args g = dec4_rows(j, n0, R, S, NULL);
    dec4_act(j->act, 0, &g);
    float res[SPAN * UNIT];
    (g.vbmi ? dec4_1q_vbmi : dec4_1q)(&g, S, res);
    for (int t = 0; t < S; t++)
        for (int r = 0; r < R; r++) j->out[n0 + t + r * S] = res[t * R + r];
}

/* Units that went in spans (di_cpu_kernels_mxfp4_span_units), those of
 * them in spans of whole lines (di_cpu_kernels_mxfp4_line_units) and in
 * spans shorter than SPAN (di_cpu_kernels_mxfp4_short_span_units; tests). */
static atomic_long span_units, line_units, short_units;
long di_cpu_kernels_mxfp4_span_units(void) { return atomic_load(&span_units); }
long di_cpu_kernels_mxfp4_line_units(void) { return atomic_load(&line_units); }
long di_cpu_kernels_mxfp4_short_span_units(void) { return atomic_load(&short_units); }

/* Weight-row units decoded with the VNNI sums chosen (di_cpu_kernels_vnni_units;
 * a unit's groups of up to 4 rows, or with scales outside the 512-bit route,
 * still take dec4_group). */
static atomic_long vnni_units;
long di_cpu_kernels_vnni_units(void) { return atomic_load(&vnni_units); }

/* Units [u0, u1) of UNIT weight rows: activation rows MBLK at a time (their
 * 16-bit lanes stay in L2 while the unit's weights stream past them). */
static void dec4_units(void *ctx, int64_t u0, int64_t u1, int thread) {
    const dec4_job *j = ctx;
    const int64_t M = j->M, N = j->N;
    const int wide = di_cpu_kernels_wide(); /* 8 weight rows a call */
    const int vnni = wide && di_cpu_kernels_vnni();
    if (vnni) atomic_fetch_add_explicit(&vnni_units, u1 - u0, memory_order_relaxed);
    for (int64_t u = u0; u < u1; u++) {
        const int64_t n0 = u * UNIT, n1 = n0 + UNIT < N ? n0 + UNIT : N;
        /* the longest span (SPAN, SPAN/2, .. 1 units) the range holds: the
         * pool's chunks taper to single units at the end (dec4_run) */
        const int64_t x = M <= MB ? di_cpu_span_units(u, u1, N / UNIT, SPAN) : 0;
        if (x && dec4_scales_ok(j, n0, n0 + x * UNIT)) {
            atomic_fetch_add_explicit(&span_units, x, memory_order_relaxed);
            if (x < SPAN) atomic_fetch_add_explicit(&short_units, x, memory_order_relaxed);
            if (M == 1 && j->act->bytes && wide) {
                atomic_fetch_add_explicit(&line_units, x, memory_order_relaxed);
                dec4q_span(j, n0, x);
            } else if (!wide)
                for (int64_t t = 0; t < x * UNIT / R; t++) dec4_span(j, n0 + t, x);
            else
                for (int64_t t = 0; t < x * UNIT / (2 * R); t++) dec8_span(j, n0 + t, x, vnni);
            u += x - 1;
            continue;
        }
        for (int64_t m0 = 0; m0 < M; m0 += MBLK) {
            const int64_t m1 = m0 + MBLK < M ? m0 + MBLK : M;
            if (wide)
                for (int64_t g0 = n0; g0 < n1; g0 += 2 * R)
                    dec8_group(j, g0, g0 + 2 * R < n1 ? g0 + 2 * R : n1, m0, m1, vnni);
            else
                for (int64_t g0 = n0; g0 < n1; g0 += R) dec4_group(j, g0, g0 + R < n1 ? g0 + R : n1, m0, m1);
        }
    }
}

/* dec8_1b switched off (di_cpu_kernels_force_no_vnni_bytes), and the calls
 * that took it (di_cpu_kernels_vnni_byte_calls), those by vpermb among them
 * (di_cpu_kernels_vbmi_byte_calls) */
static atomic_int dec8_1b_forced_off;
static atomic_long dec8_1b_calls, dec8_1b_vbmi_calls, dec4_1b_calls;
long di_cpu_kernels_avx_vnni_byte_calls(void) { return atomic_load(&dec4_1b_calls); }
void di_cpu_kernels_force_no_vnni_bytes(int on) { atomic_store(&dec8_1b_forced_off, on != 0); }
long di_cpu_kernels_vnni_byte_calls(void) { return atomic_load(&dec8_1b_calls); }
long di_cpu_kernels_vbmi_byte_calls(void) { return atomic_load(&dec8_1b_vbmi_calls); }

static void act16_free(act16 *a) {
    free(a->big), free(a->small), free(a->has_small), free(a->eaw), free(a->bytes), free(a->corr);
}

/* The activations of a call as the decode rows read them: 1 built, 0 out
 * of memory, -1 where they hold what the kernels cannot (a NaN code, a
 * scale that is not a power of two: the scalar code runs). Freed by
 * act16_free in every case. */
static int act16_make(const uint8_t *qa, const float *sa, int64_t M, int64_t K, act16 *a) {
    a->chunks = (K + 63) / 64;
    const size_t nact = (size_t)(M * a->chunks * 64);
    a->big = aligned_alloc(32, nact * sizeof(int16_t));
    a->small = aligned_alloc(32, nact * sizeof(int16_t));
    a->has_small = malloc((size_t)(M * a->chunks));
    a->eaw = aligned_alloc(32, sizeof(int32_t) * (size_t)(M * a->chunks * 8 + 8));
    /* the byte form where calls run dec8_1b (one or two rows, VNNI on
     * 512-bit vectors) or dec4_1b (one or two rows, AVX-VNNI on 256-bit
     * ones) */
    const int bytes = M <= MB && !atomic_load(&dec8_1b_forced_off) &&
                      (di_cpu_kernels_wide() ? di_cpu_kernels_vnni() : di_cpu_kernels_avx_vnni());
    a->vbmi = 0;
    a->bytes = bytes ? aligned_alloc(64, (size_t)(M * act16_steps(a) * 256)) : NULL;
    a->corr = bytes ? aligned_alloc(32, sizeof(int32_t) * (size_t)(M * a->chunks * 8 + 8)) : NULL;
    if (!a->big || !a->small || !a->has_small || !a->eaw || (bytes && (!a->bytes || !a->corr))) return 0;
    memset(a->eaw + M * a->chunks * 8, 0, 8 * sizeof(int32_t));
    if (bytes) { /* what a last step reads past the last chunk (lanes it leaves unused): defined, zero */
        if (a->chunks & 1)
            for (int64_t m = 0; m < M; m++)
                for (int part = 0; part < 4; part++)
                    memset(a->bytes + (m * act16_steps(a) + a->chunks / 2) * 256 + part * 64 + 32, 0, 32);
        memset(a->corr + M * a->chunks * 8, 0, 8 * sizeof(int32_t));
    }
    if (!act16_build(qa, sa, M, K, a)) return -1;
    if (bytes) {
        for (int64_t m = 0; m < M; m++) act16_bytes(a, m);
        a->vbmi = di_cpu_kernels_vbmi();
        atomic_fetch_add_explicit(di_cpu_kernels_wide() ? &dec8_1b_calls : &dec4_1b_calls, 1, memory_order_relaxed);
        if (a->vbmi) atomic_fetch_add_explicit(&dec8_1b_vbmi_calls, 1, memory_order_relaxed);
    }
    return 1;
}

/* The activation layouts of dec4_run, built by the pool's threads:
 * part i's where own[i] (res[i] act16_make's result). */
typedef struct act16_set {
    const di_gemm_part *parts;
    int64_t K;
    const int *own;
    act16 *acts;
    int *res;
} act16_set;

static void act16_make_parts(void *ctx, int64_t i0, int64_t i1, int thread) {
    const act16_set *c = ctx;
    (void)thread;
    for (int64_t i = i0; i < i1; i++)
        if (c->own[i]) c->res[i] = act16_make(c->parts[i].qa, c->parts[i].sa, c->parts[i].M, c->K, &c->acts[i]);
}

/* Decode rows of n products (parts) in one pass over the pool
 * (di_gemm_mxfp4_many; one part: di_gemm_mxfp4), the units of all the
 * parts dealt together; 0 when out of memory (nothing written). Parts whose
 * activations the kernels cannot hold run the scalar code first. Parts with
 * the same activations share one layout of them; the layouts are built in
 * parallel (at one row a w2 pass has six, each a few microseconds). */
static int dec4_run(const di_gemm_part *parts, int n, int64_t K, di_threadpool *tp) {
    act16 *acts = calloc((size_t)n, sizeof *acts);
    int *src = malloc(sizeof(int) * (size_t)n); /* the part whose layout part i reads */
    int *own = calloc((size_t)n, sizeof(int)), *res = calloc((size_t)n, sizeof(int));
    dec4_job *jobs = malloc(sizeof *jobs * (size_t)n);
    int64_t *first = malloc(sizeof(int64_t) * (size_t)(n + 1));
    int ok = acts && src && own && res && jobs && first;
    for (int i = 0; ok && i < n; i++) {
        src[i] = i;
        for (int j = 0; j < i; j++)
            if (parts[j].qa == parts[i].qa && parts[j].sa == parts[i].sa && parts[j].M == parts[i].M) {
                src[i] = src[j];
                break;
            }
        own[i] = src[i] == i;
    }
    if (ok) {
        act16_set set = {parts, K, own, acts, res};
        di_threadpool_for(tp, n, 1, act16_make_parts, &set);
        for (int i = 0; i < n; i++) ok &= !own[i] || res[i] != 0;
    }
    if (ok) {
        int64_t units = 0;
        for (int i = 0; i < n; i++) {
            const di_gemm_part *q = &parts[i];
            first[i] = units;
            if (res[src[i]] < 0) { /* the scalar code, now (a part sharing such activations too) */
                di_gemm_block_rows_scalar(1, q->qa, q->sa, q->M, K, q->w, q->ws, q->N, 0, q->N, q->out);
                jobs[i] = (dec4_job){0};
                continue;
            }
            jobs[i] = (dec4_job){q->qa, q->sa, &acts[src[i]], q->w, q->ws, q->M, K, q->N, q->out};
            units += (q->N + UNIT - 1) / UNIT;
        }
        first[n] = units;
        /* whole spans where dec4_units takes them, a stretch of the range
         * for each thread (di_threadpool_for_stretches: its spans follow
         * one another in memory, the threads' streams lie far apart, the
         * last chunks get shorter so the threads finish together). Two
         * threads of the 2-vCPU Xeon VM, one row from DRAM, alternated call
         * by call with chunks of whole spans dealt from one cursor: expert
         * w1 27.2-27.5 -> 29.5-29.9 GB/s, w2 27.4-27.9 -> 28.4-28.6; on
         * 16 threads of the H100 host's Xeon w1 75-77 -> 95-101, w2 93-95
         * -> 106 (its 9 and 20 spans had left most threads idle at the
         * end; bench/RESULTS.md 2026-12-05). */
        const int64_t grain = units / (8 * di_threadpool_size(tp));
        if (parts[0].M <= MB)
            di_threadpool_for_stretches(tp, n, first, SPAN, 1, dec4_units, jobs, sizeof *jobs);
        else
            di_threadpool_for_parts(tp, n, first, grain < 1 ? 1 : grain, dec4_units, jobs, sizeof *jobs);
    }
    for (int i = 0; acts && own && i < n; i++)
        if (own[i]) act16_free(&acts[i]);
    free(acts), free(src), free(own), free(res), free(jobs), free(first);
    return ok;
}

/* Pieces cut from parts past DEC_M rows (di_cpu_kernels_mxfp4_pieces), and
 * calls that ran the FMA tiles (pf4_run); for tests. */
static atomic_long piece_count, tile_calls;
long di_cpu_kernels_mxfp4_pieces(void) { return atomic_load(&piece_count); }
long di_cpu_kernels_mxfp4_tile_calls(void) { return atomic_load(&tile_calls); }

/* Whether batches past DEC_M rows go to dec4_pieces (without AMX): the
 * integer kernels with VNNI's sums at either width. */
static int pieces_route(void) { return di_cpu_kernels_wide() ? di_cpu_kernels_vnni() : di_cpu_kernels_avx_vnni(); }
/* Rows of a part the integer kernels take where AMX does not: any number
 * on the pieces route (dec4_pieces cuts those past DEC_M), else DEC_M, or
 * DEC_M_WIDE on 512-bit vectors without VNNI; the FMA tiles take more. */
static int64_t dec4_rows_max(void) {
    return pieces_route() ? INT64_MAX : di_cpu_kernels_wide() && !di_cpu_kernels_vnni() ? DEC_M_WIDE : DEC_M;
}

/* Rows a piece at most: PIECE_M, or fewer where a core's L2 (sysconf)
 * would not keep their 16-bit activations in half of it. */
static int64_t piece_rows(int64_t K) {
    const int64_t l2 = di_cpu_cache_bytes(2), fit = l2 / (4 * ((K + 63) / 64 * 64));
    return l2 <= 0 || fit >= PIECE_M ? PIECE_M : fit < MBLK ? MBLK : fit;
}

/* dec4_run over the parts with every part of more than DEC_M rows cut
 * into pieces of at most piece_rows consecutive rows (near-equal; pieces
 * of parts sharing activations share their layout, as whole parts do):
 * one pool call for all of them; parts of at most DEC_M rows go straight
 * to dec4_run. 0 when out of memory. */
static int dec4_pieces(const di_gemm_part *parts, int n, int64_t K, di_threadpool *tp) {
    const int64_t pr = piece_rows(K);
    int64_t np = 0;
    for (int i = 0; i < n; i++) np += parts[i].M > DEC_M ? (parts[i].M + pr - 1) / pr : 1;
    if (np == n) return dec4_run(parts, n, K, tp); /* nothing to cut (a decode step's experts) */
    if (np > INT32_MAX) return 0;
    di_gemm_part *pc = malloc(sizeof *pc * (size_t)np);
    if (!pc) return 0;
    int64_t c = 0;
    for (int i = 0; i < n; i++) {
        const di_gemm_part *q = &parts[i];
        const int64_t k = q->M > DEC_M ? (q->M + pr - 1) / pr : 1;
        for (int64_t t = 0; t < k; t++) {
            const int64_t m0 = t * q->M / k, m1 = (t + 1) * q->M / k;
            pc[c++] = (di_gemm_part){q->qa + m0 * K, q->sa + m0 * (K / 32), m1 - m0, q->w, q->ws, q->N,
                                     q->out + m0 * q->N};
        }
    }
    const int ok = dec4_run(pc, (int)np, K, tp);
    free(pc);
    if (ok) atomic_fetch_add_explicit(&piece_count, np - n, memory_order_relaxed);
    return ok;
}

/* ---- prefill ---- */

/* Activation rows per micro-kernel (PM), weight rows per panel (PN), codes
 * per k-chunk (PK: 8 blocks; the panels' tiles of a chunk stay in L2),
 * panels per thread's chunk at most (PP). On 512-bit vectors a panel is
 * PN_WIDE rows (6 × 32 outputs a micro-kernel, two zmm a row) and a chunk
 * PP·PN / PN_WIDE panels, the same rows; a block's sum is exact in any
 * order, so the width changes no bit. */
enum { PM = 6, PN = 16, PK = 256, PP = 16, PN_WIDE = 32 };

typedef struct pf4_job {
    const uint8_t *qa;
    const float *sa;
    const uint8_t *w, *ws;
    int64_t M, K, Kp, N;
    const float *ap;     /* [ceil(M/PM)][Kp][PM]: qa·sa, the small codes zeroed, in panels of PM rows */
    const int32_t *sidx; /* [M][Kp/32]: slot of a row's block's small codes, or -1 */
    const float *sp;     /* [slots][32]: the small codes (the others zero) */
    int ea_min, ea_max;
    float *out;          /* [M, N] */
    int pn, pp;          /* weight rows a panel (PN or PN_WIDE), panels a chunk at most */
    float *scratch;      /* [threads][scratch_floats]: tiles [pp][PK][pn], chains [2][pp][M][pn] */
    int64_t scratch_floats;
    int64_t panels, chunks; /* the weight's panels, dealt in `chunks` runs of near-equal length */
} pf4_job;

/* Activation row m into column m % PM of panel m / PM of ap ([Kp][PM]) as
 * qa·sa (exact: sa is a normal power of two) with its small codes moved to
 * slots of sp (sidx[m][kb]). Panels rather than rows: a micro-kernel step's
 * broadcasts then come from one pointer a row block instead of one a row
 * (with twelve row pointers beside 24 accumulators the compiler spilled
 * and reloaded registers around every block of 32 steps; with the panels,
 * and the small codes' pass in a call of its own, the MXFP4 prefill ran
 * 3-12 % faster on a Xeon, bench/RESULTS.md 2026-12-05). The codes are
 * decoded 8 at a time: shifted to the top byte and arithmetically back by 4,
 * an E4M3 code's sign lands at bit 31 and its 7 magnitude bits at 26..20,
 * i.e. the fp32 of value·2^-120; times sa·2^120 (exact when sa <= 2^7,
 * else two steps). A NaN code (which reads as 480 this way) sets *nan: the
 * call then runs the scalar code. */
static AVX2 void pf4_pack_row(const uint8_t *qa, const float *sa, int64_t K, int64_t Kp, int64_t m,
                              float *ap, int32_t *sidx, float *sp, int32_t *slots, int *nan) {
    const int64_t KB = K / 32, KBp = Kp / 32;
    const __m256i mask = _mm256_set1_epi32((int)0x87f00000u), low7 = _mm256_set1_epi8(0x7f);
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    float *dst = ap + (m / PM) * Kp * PM + m % PM; /* code k at dst[k·PM] */
    _Alignas(32) float vals[32];
    /* blocks past K (the padding to Kp) are never read: pf4_panels stops
     * at K's last block */
    for (int64_t kb = 0; kb < KB; kb++) {
        sidx[m * KBp + kb] = -1;
        const float s = sa[m * KB + kb];
        const int big = s > 0x1p7f;
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qa + m * K + kb * 32));
        const __m256i qn = _mm256_cmpeq_epi8(_mm256_and_si256(q, low7), low7);
        if (!_mm256_testz_si256(qn, qn)) __atomic_store_n(nan, 1, __ATOMIC_RELAXED); /* read as 480 here */
        const __m256 f = _mm256_set1_ps(big ? s : s * 0x1p120f), thr = _mm256_set1_ps(0.125f * s);
        __m256 v[4], sm[4], any = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qa + m * K + kb * 32 + 8 * i)));
            __m256 x = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(_mm256_slli_epi32(c, 24), 4), mask));
            if (big) x = _mm256_mul_ps(x, _mm256_set1_ps(0x1p120f));
            v[i] = _mm256_mul_ps(x, f);
            sm[i] = _mm256_and_ps(_mm256_cmp_ps(_mm256_and_ps(v[i], absm), thr, _CMP_LT_OQ),
                                  _mm256_cmp_ps(v[i], _mm256_setzero_ps(), _CMP_NEQ_UQ));
            any = _mm256_or_ps(any, sm[i]);
        }
        if (_mm256_testz_ps(any, any)) {
            for (int i = 0; i < 4; i++) _mm256_store_ps(vals + 8 * i, v[i]);
        } else {
            const int32_t slot = __atomic_fetch_add(slots, 1, __ATOMIC_RELAXED);
            sidx[m * KBp + kb] = slot;
            for (int i = 0; i < 4; i++) {
                _mm256_store_ps(vals + 8 * i, _mm256_andnot_ps(sm[i], v[i]));
                _mm256_store_ps(sp + (int64_t)slot * 32 + 8 * i, _mm256_and_ps(sm[i], v[i]));
            }
        }
        for (int t = 0; t < 32; t++) dst[(kb * 32 + t) * PM] = vals[t];
    }
}

/* Weight rows n0 .. n0+pn-1 (zeros past N), codes [k0, k0+kc) -> bp[kc][pn],
 * each value w·sw exact (E2M1 magnitudes by a lane permute, the sign bit
 * moved up, times the block's scale: a power of two). A row's 64 codes
 * decode to 8 vectors of its word positions (lane l: code 8l + p), kept in
 * lane order in tmp; 8 rows of those are then transposed into bp. */
static AVX2 void pf4_decode(const pf4_job *j, int64_t n0, int64_t k0, int64_t kc, float *bp) {
    const int64_t K = j->K, KB = K / 32, rb = K / 2;
    const float *e8m0 = di_cpu_e8m0_table();
    const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
    __attribute__((aligned(32))) float tmp[8][8][8]; /* [row][position][lane] */
    const int pn = j->pn;
    for (int half = 0; half < pn / 8; half++)
        for (int64_t c = k0 / 64; c < (k0 + kc) / 64; c++) {
            for (int i = 0; i < 8; i++) {
                const int64_t n = n0 + half * 8 + i;
                if (n >= j->N) {
                    memset(tmp[i], 0, sizeof tmp[i]);
                    continue;
                }
                const uint8_t *row = j->w + n * rb, *st = j->ws + n * KB;
                const int h = 2 * c + 1 >= KB; /* the half chunk: 16 bytes */
                const __m256i x = h ? _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_loadu_si128((const __m128i *)(row + c * 32)), 0)
                                    : _mm256_loadu_si256((const __m256i *)(row + c * 32));
                const float s0 = e8m0[st[2 * c]], s1 = h ? s0 : e8m0[st[2 * c + 1]];
                const __m256 f = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
#pragma GCC unroll 8
                for (int p = 0; p < 8; p++) {
                    const __m256 v = _mm256_or_ps(_mm256_permutevar8x32_ps(mag, _mm256_srli_epi32(x, 4 * p)),
                                                  _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(x, 28 - 4 * p), sign)));
                    _mm256_store_ps(tmp[i][p], _mm256_mul_ps(v, f));
                }
            }
#pragma GCC unroll 1
            for (int p = 0; p < 8; p++) {
                /* transpose: row l of the result is code 64c + 8l + p of the 8 rows */
                const __m256 t0 = _mm256_unpacklo_ps(_mm256_load_ps(tmp[0][p]), _mm256_load_ps(tmp[1][p]));
                const __m256 t1 = _mm256_unpackhi_ps(_mm256_load_ps(tmp[0][p]), _mm256_load_ps(tmp[1][p]));
                const __m256 t2 = _mm256_unpacklo_ps(_mm256_load_ps(tmp[2][p]), _mm256_load_ps(tmp[3][p]));
                const __m256 t3 = _mm256_unpackhi_ps(_mm256_load_ps(tmp[2][p]), _mm256_load_ps(tmp[3][p]));
                const __m256 t4 = _mm256_unpacklo_ps(_mm256_load_ps(tmp[4][p]), _mm256_load_ps(tmp[5][p]));
                const __m256 t5 = _mm256_unpackhi_ps(_mm256_load_ps(tmp[4][p]), _mm256_load_ps(tmp[5][p]));
                const __m256 t6 = _mm256_unpacklo_ps(_mm256_load_ps(tmp[6][p]), _mm256_load_ps(tmp[7][p]));
                const __m256 t7 = _mm256_unpackhi_ps(_mm256_load_ps(tmp[6][p]), _mm256_load_ps(tmp[7][p]));
                const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
                const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
                const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
                const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
                float *d = bp + (c * 64 - k0 + p) * pn + half * 8;
                _mm256_store_ps(d + 0 * 8 * pn, _mm256_permute2f128_ps(u0, u4, 0x20));
                _mm256_store_ps(d + 1 * 8 * pn, _mm256_permute2f128_ps(u1, u5, 0x20));
                _mm256_store_ps(d + 2 * 8 * pn, _mm256_permute2f128_ps(u2, u6, 0x20));
                _mm256_store_ps(d + 3 * 8 * pn, _mm256_permute2f128_ps(u3, u7, 0x20));
                _mm256_store_ps(d + 4 * 8 * pn, _mm256_permute2f128_ps(u0, u4, 0x31));
                _mm256_store_ps(d + 5 * 8 * pn, _mm256_permute2f128_ps(u1, u5, 0x31));
                _mm256_store_ps(d + 6 * 8 * pn, _mm256_permute2f128_ps(u2, u6, 0x31));
                _mm256_store_ps(d + 7 * 8 * pn, _mm256_permute2f128_ps(u3, u7, 0x31));
            }
        }
}

/* pf4_decode on 512-bit vectors, 16 rows at a time (n0 + 16h .. n0 + 16h +
 * 15 of a panel of PN_WIDE rows): a step k of the tile needs code k of
 * every row side by side, which pf4_decode gets by decoding each row and
 * transposing the floats through memory (~1.5 instructions a code, a third
 * of a product of 64 rows). Here the packed codes move instead, eight to a
 * word: chunk_words16 (kernels_words.h) gives word j of the 16 rows in
 * one register (codes 8j .. 8j + 7 of the chunk), and each of its nibbles
 * is one shift and one lane permute of a 16-entry table (the permute reads
 * the index's low four bits: the E2M1 code with its sign) away from its
 * 16 values:
 * ~0.3 instructions a code. Each value is pf4_decode's, w times the row's
 * block scale (exact). Rows past N get the scale 0: zeros. */
static AVX512 void pf4_decode_wide(const pf4_job *j, int64_t n0, int h, int64_t k0, int64_t kc, float *bp) {
    const int64_t K = j->K, KB = K / 32, rb = K / 2;
    const float *e8m0 = di_cpu_e8m0_table();
    const __m512 tab = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                      -2.0f, -3.0f, -4.0f, -6.0f);
    const uint8_t *rows[16];
    for (int i = 0; i < 16; i++) rows[i] = n0 + 16 * h + i < j->N ? j->w + (n0 + 16 * h + i) * rb : NULL;
    for (int64_t c = k0 / 64; c < (k0 + kc) / 64; c++) {
        const int half = 2 * c + 1 >= KB; /* the half chunk: 16 bytes */
        _Alignas(64) float sc[2][16];
        for (int i = 0; i < 16; i++) {
            const int64_t n = n0 + 16 * h + i;
            const uint8_t *st = j->ws + (n < j->N ? n : 0) * KB;
            sc[0][i] = n < j->N ? e8m0[st[2 * c]] : 0.0f;
            sc[1][i] = n < j->N && !half ? e8m0[st[2 * c + 1]] : sc[0][i];
        }
        __m256i r[16];
        __m512i z[8];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++)
            r[i] = !rows[i] ? _mm256_setzero_si256()
                   : half   ? _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(rows[i] + c * 32)))
                            : _mm256_loadu_si256((const __m256i *)(rows[i] + c * 32));
        chunk_words16(r, z);
        const __m512 f0 = _mm512_load_ps(sc[0]), f1 = _mm512_load_ps(sc[1]);
        float *o = bp + (c * 64 - k0) * PN_WIDE + 16 * h;
#pragma GCC unroll 8
        for (int w = 0; w < 8; w++) { /* word w: codes 8w .. 8w + 7, block 2c + (w >= 4) */
            if (half && w >= 4) break;
#pragma GCC unroll 8
            for (int q = 0; q < 8; q++)
                _mm512_storeu_ps(o + (8 * w + q) * PN_WIDE,
                                 _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(z[w], 4 * q), tab), w < 4 ? f0 : f1));
        }
    }
}

/* Block b of a k-chunk: whether one of the mr rows has small codes there
 * (sidx, rows KBp apart). */
static inline int pf4_small(const int mr, const int32_t *sidx, int64_t KBp, int64_t b) {
    int small = 0;
#pragma GCC unroll 12
    for (int m = 0; m < 2 * PM; m++)
        if (m < mr && sidx[m * KBp + b] >= 0) small = 1;
    return small;
}

/* The rows' small codes of block b: their slot, or zeros. */
static inline void pf4_sources(const int mr, int64_t b, int64_t KBp, const int32_t *sidx, const float *sp,
                               const float *src[2 * PM]) {
    static const float zero32[32] __attribute__((aligned(64)));
#pragma GCC unroll 12
    for (int m = 0; m < 2 * PM; m++)
        if (m < mr) {
            const int32_t slot = sidx[m * KBp + b];
            src[m] = slot >= 0 ? sp + (int64_t)slot * 32 : zero32;
        }
}

/* One block of pf4_ukr: its sums from zero over the panel (pk; from_src =
 * 0) or the small codes' rows (src; from_src = 1), added to the chains c. */
AVX2_INLINE void pf4_block(const int mr, const int from_src, const float *pk, const float *const *src,
                           const float *bb, float *c) {
    __m256 acc[PM][2];
#pragma GCC unroll 6
    for (int m = 0; m < PM; m++)
        if (m < mr) acc[m][0] = _mm256_setzero_ps(), acc[m][1] = _mm256_setzero_ps();
#pragma GCC unroll 2
    for (int k = 0; k < 32; k++) {
        const __m256 b0 = _mm256_load_ps(bb + k * PN), b1 = _mm256_load_ps(bb + k * PN + 8);
#pragma GCC unroll 6
        for (int m = 0; m < PM; m++)
            if (m < mr) {
                const __m256 av = _mm256_broadcast_ss(from_src ? src[m] + k : pk + k * PM + m);
                acc[m][0] = _mm256_fmadd_ps(av, b0, acc[m][0]);
                acc[m][1] = _mm256_fmadd_ps(av, b1, acc[m][1]);
            }
    }
#pragma GCC unroll 6
    for (int m = 0; m < PM; m++)
        if (m < mr) {
            _mm256_store_ps(c + m * PN, _mm256_add_ps(_mm256_load_ps(c + m * PN), acc[m][0]));
            _mm256_store_ps(c + m * PN + 8, _mm256_add_ps(_mm256_load_ps(c + m * PN + 8), acc[m][1]));
        }
}

/* mr (<= PM) activation rows (pa: their panel from the k-chunk's first
 * code, [k][PM]) × 16 columns over the nb blocks of a k-chunk (first block
 * kb0): each block's sums from zero in 12 chains, then added to the
 * output's chain of the block's parity (ch[kb % 2], rows PN apart); a
 * block where a row has small codes runs again on them (sp, slots per row
 * in sidx, rows KBp apart; zeros for the others). */
AVX2_INLINE void pf4_ukr(const int mr, int64_t nb, int64_t kb0, const float *pa, int64_t ps, int64_t KBp,
                         const int32_t *sidx, const float *sp, const float *bp, float *const ch[2]) {
    (void)ps; /* one row block */
    for (int64_t b = 0; b < nb; b++) {
        const float *bb = bp + b * 32 * PN;
        float *c = ch[(kb0 + b) % 2];
        pf4_block(mr, 0, pa + b * 32 * PM, NULL, bb, c);
        if (pf4_small(mr, sidx, KBp, b)) {
            const float *src[2 * PM];
            pf4_sources(mr, b, KBp, sidx, sp, src);
            pf4_block(mr, 1, NULL, src, bb, c);
        }
    }
}

typedef void (*pf4_ukr_fn)(int64_t, int64_t, const float *, int64_t, int64_t, const int32_t *, const float *,
                           const float *, float *const[2]);
#define PF4_UKR_FN(mr)                                                                             \
    static AVX2 void pf4_ukr_##mr(int64_t nb, int64_t kb0, const float *pa, int64_t ps, int64_t KBp, \
                                  const int32_t *sidx, const float *sp, const float *bp,            \
                                  float *const ch[2]) {                                             \
        pf4_ukr(mr, nb, kb0, pa, ps, KBp, sidx, sp, bp, ch);                                        \
    }
PF4_UKR_FN(1)
PF4_UKR_FN(2)
PF4_UKR_FN(3)
PF4_UKR_FN(4)
PF4_UKR_FN(5)
PF4_UKR_FN(6)
static const pf4_ukr_fn pf4_ukrs[PM + 1] = {0, pf4_ukr_1, pf4_ukr_2, pf4_ukr_3, pf4_ukr_4, pf4_ukr_5, pf4_ukr_6};

/* One block of pf4_ukr_w: its sums from zero over the panels (pk, the
 * second row block's ps floats further; from_src = 0) or the small codes'
 * rows (src; from_src = 1), added to the chains c. */
AVX512_INLINE void pf4_block_w(const int mr, const int from_src, const float *pk, int64_t ps,
                               const float *const *src, const float *bb, float *c) {
    __m512 acc[2 * PM][2];
#pragma GCC unroll 12
    for (int m = 0; m < 2 * PM; m++)
        if (m < mr) acc[m][0] = _mm512_setzero_ps(), acc[m][1] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int k = 0; k < 32; k++) {
        const __m512 b0 = _mm512_loadu_ps(bb + k * PN_WIDE), b1 = _mm512_loadu_ps(bb + k * PN_WIDE + 16);
#pragma GCC unroll 12
        for (int m = 0; m < 2 * PM; m++)
            if (m < mr) {
                const __m512 av =
                    _mm512_set1_ps(from_src ? src[m][k] : m < PM ? pk[k * PM + m] : pk[ps + k * PM + m - PM]);
                acc[m][0] = _mm512_fmadd_ps(av, b0, acc[m][0]);
                acc[m][1] = _mm512_fmadd_ps(av, b1, acc[m][1]);
            }
    }
#pragma GCC unroll 12
    for (int m = 0; m < 2 * PM; m++)
        if (m < mr) {
            _mm512_storeu_ps(c + m * PN_WIDE, _mm512_add_ps(_mm512_loadu_ps(c + m * PN_WIDE), acc[m][0]));
            _mm512_storeu_ps(c + m * PN_WIDE + 16, _mm512_add_ps(_mm512_loadu_ps(c + m * PN_WIDE + 16), acc[m][1]));
        }
}

/* The small codes' pass of a block (rare: a call of its own keeps the
 * common path's registers free; rows one at a time below 2·PM, so that
 * one form serves every mr, each row's sums unchanged). */
static AVX512 __attribute__((noinline)) void pf4_small_w(const int mr, int64_t b, int64_t KBp, const int32_t *sidx,
                                                        const float *sp, const float *bb, float *c) {
    const float *src[2 * PM];
    pf4_sources(mr, b, KBp, sidx, sp, src);
    if (mr == 2 * PM) pf4_block_w(2 * PM, 1, NULL, 0, src, bb, c);
    else
        for (int m = 0; m < mr; m++) pf4_block_w(1, 1, NULL, 0, src + m, bb, c + m * PN_WIDE);
}

/* pf4_ukr on 512-bit vectors: 32 columns (bp [k][32], chains PN_WIDE
 * apart), and up to 2·PM rows: two row blocks at once where both are
 * whole (24 accumulators, each step's two weight loads for 24 FMAs rather
 * than 12; the second block's panel ps floats after the first), as the
 * FP8 prefill's lg_ukr_wide. */
AVX512_INLINE void pf4_ukr_w(const int mr, int64_t nb, int64_t kb0, const float *pa, int64_t ps, int64_t KBp,
                             const int32_t *sidx, const float *sp, const float *bp, float *const ch[2]) {
    for (int64_t b = 0; b < nb; b++) {
        const float *bb = bp + b * 32 * PN_WIDE;
        float *c = ch[(kb0 + b) % 2];
        pf4_block_w(mr, 0, pa + b * 32 * PM, ps, NULL, bb, c);
        if (pf4_small(mr, sidx, KBp, b)) pf4_small_w(mr, b, KBp, sidx, sp, bb, c);
    }
}

#define PF4_UKR_W_FN(mr)                                                                           \
    static AVX512 void pf4_ukr_w_##mr(int64_t nb, int64_t kb0, const float *pa, int64_t ps, int64_t KBp, \
                                      const int32_t *sidx, const float *sp, const float *bp,        \
                                      float *const ch[2]) {                                         \
        pf4_ukr_w(mr, nb, kb0, pa, ps, KBp, sidx, sp, bp, ch);                                      \
    }
PF4_UKR_W_FN(1)
PF4_UKR_W_FN(2)
PF4_UKR_W_FN(3)
PF4_UKR_W_FN(4)
PF4_UKR_W_FN(5)
PF4_UKR_W_FN(6)
PF4_UKR_W_FN(12)
static const pf4_ukr_fn pf4_ukrs_w[PM + 1] = {0,           pf4_ukr_w_1, pf4_ukr_w_2, pf4_ukr_w_3,
                                              pf4_ukr_w_4, pf4_ukr_w_5, pf4_ukr_w_6};

/* Weight rows [n0, n1) take the fast route when every scale product sa·sw
 * is at least 2^-139 (a block sum of the small codes, a multiple of
 * 2^-10·s, then stays exact in fp32) and at most 2^100, and every sw at
 * most 2^100 (w·sw finite: |w| <= 6). */
static int pf4_scales_ok(const pf4_job *j, int64_t n0, int64_t n1) {
    int lo, hi;
    di_cpu_byte_range(j->ws + n0 * (j->K / 32), (n1 - n0) * (j->K / 32), &lo, &hi);
    return hi <= 227 && lo + j->ea_min - 127 >= -139 && hi + j->ea_max - 127 <= 100;
}

/* Panels [p0, p1) of pn weight rows (at most pp): every activation row, all
 * of K, k-chunk by k-chunk (the chunk's tiles of all the panels, then every
 * row block across them). */
static AVX2 void pf4_panels(void *ctx, int64_t p0, int64_t p1, int thread) {
    const pf4_job *j = ctx;
    const int64_t M = j->M, N = j->N, Kp = j->Kp, KBp = Kp / 32, np = p1 - p0, mb = (M + PM - 1) / PM;
    const int pn = j->pn;
    const pf4_ukr_fn *ukrs = pn == PN_WIDE ? pf4_ukrs_w : pf4_ukrs;
    float *tiles = j->scratch + thread * j->scratch_floats;
    float *chains = tiles + j->pp * PK * pn; /* [2][np][mb·PM][pn] */
    const int64_t cs = mb * PM * pn;         /* one panel's chain */
    int ok[PP];
    for (int64_t p = 0; p < np; p++) {
        const int64_t n0 = (p0 + p) * pn, n1 = n0 + pn < N ? n0 + pn : N;
        ok[p] = pf4_scales_ok(j, n0, n1);
        if (!ok[p]) di_gemm_block_rows_scalar(1, j->qa, j->sa, M, j->K, j->w, j->ws, N, n0, n1, j->out);
    }
    memset(chains, 0, sizeof(float) * (size_t)(2 * np * cs));
    for (int64_t k0 = 0; k0 < Kp; k0 += PK) {
        const int64_t kc = Kp - k0 < PK ? Kp - k0 : PK;
        /* the chunk's blocks inside K: the padding block past an odd K / 32
         * adds nothing (zero codes; a chain plus +0 is the chain), and
         * pf4_decode_wide leaves its tile unwritten */
        const int64_t nbk = (kc < j->K - k0 ? kc : j->K - k0) / 32;
        for (int64_t p = 0; p < np; p++)
            if (ok[p] && pn == PN_WIDE) {
                pf4_decode_wide(j, (p0 + p) * pn, 0, k0, kc, tiles + p * PK * pn);
                pf4_decode_wide(j, (p0 + p) * pn, 1, k0, kc, tiles + p * PK * pn);
            } else if (ok[p]) pf4_decode(j, (p0 + p) * pn, k0, kc, tiles + p * PK * pn);
        for (int64_t b = 0, nblk; b < mb; b += nblk) {
            const int mr = M - b * PM < PM ? (int)(M - b * PM) : PM;
            /* two whole row blocks at once on 512-bit vectors (pf4_ukr_w) */
            const int two = pn == PN_WIDE && (b + 2) * PM <= M;
            nblk = two ? 2 : 1;
            for (int64_t p = 0; p < np; p++) {
                if (!ok[p]) continue;
                float *const ch[2] = {chains + p * cs + b * PM * pn, chains + (np + p) * cs + b * PM * pn};
                (two ? pf4_ukr_w_12 : ukrs[mr])(nbk, k0 / 32, j->ap + (b * Kp + k0) * PM, Kp * PM, KBp,
                                                j->sidx + b * PM * KBp + k0 / 32, j->sp, tiles + p * PK * pn, ch);
            }
        }
    }
    for (int64_t p = 0; p < np; p++) {
        if (!ok[p]) continue;
        const int64_t n0 = (p0 + p) * pn;
        const float *e = chains + p * cs, *o = chains + (np + p) * cs;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < pn && n0 + n < N; n++) j->out[m * N + n0 + n] = e[m * pn + n] + o[m * pn + n];
    }
}

/* Panels [p0, p1) pp at a time. */
/* Chunks [c0, c1): chunk c is panels [c·P/C, (c+1)·P/C), at most pp. */
static void pf4_chunks(void *ctx, int64_t c0, int64_t c1, int thread) {
    const pf4_job *j = ctx;
    for (int64_t c = c0; c < c1; c++)
        pf4_panels(ctx, c * j->panels / j->chunks, (c + 1) * j->panels / j->chunks, thread);
}

typedef struct pf4_pack_job {
    const uint8_t *qa;
    const float *sa;
    int64_t M, K, Kp;
    float *ap;
    int32_t *sidx;
    float *sp;
    int32_t *slots;
    int *nan;
} pf4_pack_job;

/* Row blocks [b0, b1): a panel is written by one thread. */
static void pf4_pack_rows(void *ctx, int64_t b0, int64_t b1, int thread) {
    const pf4_pack_job *p = ctx;
    for (int64_t m = b0 * PM; m < b1 * PM && m < p->M; m++)
        pf4_pack_row(p->qa, p->sa, p->K, p->Kp, m, p->ap, p->sidx, p->sp, p->slots, p->nan);
}

/* Prefill; 0 when out of memory. */
static int pf4_run(const uint8_t *qa, const float *sa, int64_t M, int64_t K, const uint8_t *w,
                   const uint8_t *ws, int64_t N, float *out, di_threadpool *tp) {
    int ea_min, ea_max;
    /* qa·sa must stay finite (|qa| <= 448): sa <= 2^100 */
    if (!di_cpu_scale_exps(sa, M * (K / 32), &ea_min, &ea_max) || ea_max > 100) {
        di_gemm_block_rows_scalar(1, qa, sa, M, K, w, ws, N, 0, N, out);
        return 1;
    }
    const int threads = di_threadpool_size(tp);
    const int64_t Kp = (K + 63) / 64 * 64, KBp = Kp / 32, mb = (M + PM - 1) / PM;
    const int pn = di_cpu_kernels_wide() ? PN_WIDE : PN, pp = PP * PN / pn;
    const int64_t sf = (int64_t)pp * PK * pn + 2 * (int64_t)pp * mb * PM * pn;
    /* one buffer the calling thread keeps (kernels.h): ap, sp (at most every
     * block of every row holds small codes), the threads' scratch, sidx;
     * each part a whole number of vectors */
    const int64_t nap = (mb * PM * Kp + 15) / 16 * 16, nsp = M * KBp * 32, nsc = (int64_t)threads * sf;
    int own = 0;
    float *buf = di_cpu_kept_buffer(sizeof(float) * (size_t)(nap + nsp + nsc + M * KBp), &own);
    if (!buf) return 0;
    float *ap = buf, *sp = buf + nap, *scratch = sp + nsp;
    int32_t *sidx = (int32_t *)(scratch + nsc);
    int32_t slots = 0;
    int nan = 0;
    pf4_pack_job pk = {qa, sa, M, K, Kp, ap, sidx, sp, &slots, &nan};
    di_threadpool_for(M * K >= (1 << 18) ? tp : NULL, mb, 1, pf4_pack_rows, &pk);
    if (nan) {
        if (own) free(buf);
        di_gemm_block_rows_scalar(1, qa, sa, M, K, w, ws, N, 0, N, out);
        return 1;
    }
    pf4_job j = {.qa = qa, .sa = sa, .w = w, .ws = ws, .M = M, .K = K, .Kp = Kp, .N = N, .ap = ap,
                 .sidx = sidx, .sp = sp, .ea_min = ea_min, .ea_max = ea_max, .out = out, .pn = pn, .pp = pp,
                 .scratch = scratch, .scratch_floats = sf};
    j.panels = (N + pn - 1) / pn;
    j.chunks = di_cpu_panel_pieces(j.panels, pp, threads);
    di_threadpool_for(tp, j.chunks, 1, pf4_chunks, &j);
    atomic_fetch_add_explicit(&tile_calls, 1, memory_order_relaxed);
    if (own) free(buf);
    return 1;
}

/* Pieces of at most `most` panels, several a thread where the panels
 * allow (a core slowed by other work then takes fewer), their count a
 * multiple of the threads and their lengths within one panel of each
 * other: pieces of `most` panels and a remainder left a thread alone with
 * the last one (72 panels on 2 threads: 9 pieces of 8, 5 against 4).
 * (kernels.h) */
int64_t di_cpu_panel_pieces(int64_t panels, int64_t most, int threads) {
    int64_t pieces = (panels + most - 1) / most;
    const int64_t want = panels < 4 * threads ? panels : 4 * threads;
    if (pieces < want) pieces = want;
    pieces = (pieces + threads - 1) / threads * threads;
    return pieces > panels ? panels : pieces;
}

void di_gemm_mxfp4_many_avx2(const di_gemm_part *parts, int n, int64_t K, di_threadpool *tp) {
    const int64_t dec_m = di_cpu_kernels_amx() ? AMX_MIN_M - 1 : dec4_rows_max();
    int all_dec = n > 1;
    for (int i = 0; i < n; i++) all_dec &= parts[i].M >= 1 && parts[i].M <= dec_m && parts[i].N >= 1;
    if (all_dec && dec4_pieces(parts, n, K, tp)) return;
    for (int i = 0; i < n; i++)
        di_gemm_mxfp4_avx2(parts[i].qa, parts[i].sa, parts[i].M, K, parts[i].w, parts[i].ws, parts[i].N,
                           parts[i].out, tp);
}

void di_gemm_mxfp4_avx2(const uint8_t *qa, const float *sa, int64_t M, int64_t K, const uint8_t *w,
                        const uint8_t *ws, int64_t N, float *out, di_threadpool *tp) {
    if (M <= 0 || N <= 0) return;
    const di_gemm_part part = {qa, sa, M, w, ws, N, out};
    if (M >= AMX_MIN_M && di_cpu_kernels_amx() && di_gemm_mxfp4_amx(qa, sa, M, K, w, ws, N, out, tp)) return;
    const int done = M <= dec4_rows_max() ? dec4_pieces(&part, 1, K, tp) : pf4_run(qa, sa, M, K, w, ws, N, out, tp);
    if (!done) di_gemm_mxfp4_scalar(qa, sa, M, K, w, ws, N, out, tp); /* out of memory: it needs none */
}

#endif
