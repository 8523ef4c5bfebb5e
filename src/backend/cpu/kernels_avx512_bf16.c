/* AVX-512 BF16 kernels of the MXFP4 decode rows (kernels.h; architecture.md
 * §2, §8.3): the chains of kernels.h run through vdpbf16ps, two codes of a
 * chain per lane and instruction, with the same bits as the scalar path.
 * Compiled with per-function target attributes and called only after
 * di_cpu_kernels_bf16() says so; kernels_avx2_block.c keeps everything
 * around the inner loop (activation lanes, scale-domain limits, fallbacks,
 * the work split).
 *
 * Why: the fp32 loops of kernels_avx512_block.c spend one 16-lane FMA per 16
 * codes of a row pair next to their decoding, and bound the decode rows at
 * about half the memory's rate (bench/RESULTS.md). vdpbf16ps does two
 * multiply-adds per fp32 lane, and E2M1 codes decode to bf16 by one
 * vpermw (a 16-entry table of bf16 words): per 32 codes an index op that
 * places two codes' nibbles (pair_index()), a vpermw and a vdpbf16ps. The
 * decoding, not the arithmetic, now takes most of the loop: 1.2x the fp32
 * loops, not 2x (bench/RESULTS.md).
 *
 * Exactness. vdpbf16ps computes per fp32 lane i, in this order,
 *     acc = RNE(acc + a[2i+1]·b[2i+1]);  acc = RNE(acc + a[2i]·b[2i])
 * (two fused steps, round to nearest even, inputs and results that are
 * subnormal read and written as zero; the odd slot first). kernels.h's
 * chain of lane j runs through the codes of word j of each chunk, position
 * p = 0..7 (bits 4p..4p+3) in order, one rounding per step. So each lane
 * gets code p in its odd (upper) bf16 slot and code p + 1 in its even
 * (lower) one, for p = 0, 2, 4, 6, with the activations laid out the same
 * way: one instruction performs the chain's steps p and p + 1, rounded as
 * the fp32 FMAs round them, provided that
 * (a) every operand is exact in bf16: the codes' values {0, ±0.5 .. ±6}
 *     are, and the activations a·2^-63 = e4m3·sa·2^-63 (4 significant
 *     bits, sa a power of two: fp4_limits() returns 0 otherwise) are while
 *     normal;
 * (b) the products are exact: at most 4 + 2 significant bits;
 * (c) nothing subnormal meets the flush: the lanes hold the chains of
 *     kernels_avx512_block.c's loops in the very same scale domains (their
 *     weights w·2^-126 times activations a·2^63 are these products), whose
 *     values are multiples of the quantum 2^(q - 64 - spread) with q the
 *     exponent of the activations' quantum (fp4_limits()) and spread the
 *     row group's e_max - e_min: each term of a chain in chunk c is
 *     a·w·2^(e' - e_c - 63) for a block exponent e' >= e_c - spread, a
 *     multiple of 2^q · 2^-1 · 2^(-63 - spread); sums of multiples of a
 *     power of two, rounded to a coarser or equal precision, stay multiples
 *     of it. So with spread <= q + 62 (di_dec_bf16_spread()) every nonzero
 *     chain value, product and activation is at least 2^-126: normal, and
 *     the flush never applies. Groups beyond that run the AVX2 loops.
 * The domain changes (vmulps by powers of two), the final factor and the
 * tree are those of the fp32 loops, so the outputs are theirs, which are the
 * scalar path's (kernels_avx2_block.c). Zero signs: the chains start at +0,
 * and x + (-0) = x, (+0) + (-0) = +0 under RNE, as for the FMAs. NaN and
 * overflow cannot reach these loops (fp4_limits(), dec_scales() limits).
 * Whether an implementation rounds the two steps separately and in this
 * order is not left to the documentation: di_cpu_kernels_bf16() probes it
 * once on operands where a fused sum, the other order or a flush-free
 * implementation would each give a different result. */
#include "backend/cpu/kernels.h"

#ifdef DI_HAVE_AVX2_KERNELS

#include <immintrin.h>
#include <stdatomic.h>
#include <string.h>

#include "backend/cpu/kernels_avx512_pair.h"
#include "core/cpu_features.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define BF16_TARGET "avx512f,avx512bw,avx512vl,avx512vbmi,avx512bf16,avx2,fma"
#define BF16 __attribute__((target(BF16_TARGET)))
#define BF16_INLINE static inline __attribute__((always_inline, target(BF16_TARGET)))

/* Activation rows and weight row pairs per kernel call at most. */
enum { BF_MB = 2, BF_NP = 8 };

/* ---- when to use them ---- */

/* The bf16 bits of an fp32 that is exact in bf16. */
static uint16_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

/* One vdpbf16ps lane: acc + (a1·b1 in the odd slot, a0·b0 in the even). */
static BF16 float dp_lane(float acc, float a1, float b1, float a0, float b0) {
    const uint32_t a = (uint32_t)bf16_bits(a1) << 16 | bf16_bits(a0);
    const uint32_t b = (uint32_t)bf16_bits(b1) << 16 | bf16_bits(b0);
    const __m512 r = _mm512_dpbf16_ps(_mm512_set1_ps(acc), (__m512bh)_mm512_set1_epi32((int)a),
                                      (__m512bh)_mm512_set1_epi32((int)b));
    return _mm512_cvtss_f32(r);
}

/* 1 when vdpbf16ps rounds as the proof above needs. Each probe tells the
 * sequential odd-then-even form from another:
 * - 1 + 2^-24 + 2^-24: ties to 1 twice; one rounding of the sum gives
 *   1 + 2^-23;
 * - 1 + 3·2^-24 (odd) - 1 (even): 2^-22 odd first; even first 3·2^-24;
 * - 2^-130 (a subnormal accumulator) + 1 - 1: 0 when flushed (the proof
 *   then keeps every value normal; an implementation without the flush
 *   would give 2^-130 and needs no such care, but is not what was
 *   measured, so it is not taken either). */
static BF16 int bf16_probe(void) {
    return dp_lane(1.0f, 0x1p-24f, 1.0f, 0x1p-24f, 1.0f) == 1.0f &&
           dp_lane(1.0f, 3 * 0x1p-24f, 1.0f, -1.0f, 1.0f) == 0x1p-22f &&
           dp_lane(1.0f, -1.0f, 1.0f, 3 * 0x1p-24f, 1.0f) == 3 * 0x1p-24f &&
           dp_lane(0x1p-130f, 1.0f, 1.0f, -1.0f, 1.0f) == 0.0f;
}

static atomic_int bf16_forced = -1; /* -1: by the CPU; 0: off; 1: on where the CPU has it */
static atomic_int bf16_cpu = -1;

void di_cpu_kernels_force_bf16(int mode) { atomic_store(&bf16_forced, mode < 0 ? -1 : mode != 0); }

int di_cpu_kernels_bf16(void) {
    int c = atomic_load_explicit(&bf16_cpu, memory_order_relaxed);
    if (c < 0) {
        c = di_cpu_has_avx512_bf16() && bf16_probe();
        atomic_store(&bf16_cpu, c);
    }
    return c && di_cpu_kernels_avx512() && atomic_load_explicit(&bf16_forced, memory_order_relaxed) != 0;
}

int di_dec_bf16_spread(int q) { return q + 62; }

/* ---- the kernel ---- */

/* The vpermw indices of pair s (positions p = 2s, p + 1) of the words x:
 * in each dword, code p + 1 in bits 0-3 of the lower word (the even slot)
 * and code p in bits 0-3 of the upper one (vpermw reads bits 0-4 of each
 * word; the table repeats, so bit 4 does not matter). Both codes sit in
 * one 16-bit half of the dword (p < 4: the lower), so one of them has to
 * cross to the other half:
 * - pairs 0 and 1: the lower half copied into both (vpshufb, lo2, shared)
 *   and shifted per word (vpsrlvw: 4 and 0, 12 and 8);
 * - pairs 2 and 3: vpmultishiftqb, which picks any 8 bits of the qword per
 *   byte: byte 0 of dword d from bit 32d + 4(p + 1), byte 2 from 32d + 4p.
 * On Zen 4 vpmultishiftqb issues on the pipes of vdpbf16ps and vpshufb on
 * the permute pipes, the word shifts on neither; this split of the two
 * routes measured fastest (all four by vpshufb 4 % slower, by
 * vpmultishiftqb 14 %). */
BF16_INLINE __m512i pair_index(const int s, __m512i x, __m512i lo2) {
    if (s < 2) return _mm512_srlv_epi16(lo2, _mm512_set1_epi32(s ? 0x0008000c : 0x00000004));
    const uint64_t p = (uint64_t)(2 * s);
    const uint64_t d0 = (4 * p + 4) | (4 * p) << 16, d1 = (32 + 4 * p + 4) | (32 + 4 * p) << 16;
    return _mm512_multishift_epi64_epi8(_mm512_set1_epi64((long long)(d0 | d1 << 32)), x);
}


/* One chunk: R/2 row pairs × mr activation rows (a: stride lda words, 64
 * words per chunk: 4 pairs of positions × 16 lanes). */
BF16_INLINE void bf_chunk(const int mr, const int R, int64_t chunks, int64_t c, const int half,
                          const uint8_t *const *rows, const float *a, int64_t lda, const float *sv,
                          __m512i tab, __m512 acc[BF_MB][BF_NP]) {
    const int NP = R / 2;
    /* the lower 16 bits of each dword, twice */
    const __m512i dup = _mm512_set4_epi32(0x0d0c0d0c, 0x09080908, 0x05040504, 0x01000100);
    __m512bh av[BF_MB][4];
#pragma GCC unroll 2
    for (int m = 0; m < BF_MB; m++)
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++)
            if (m < mr) av[m][s] = (__m512bh)_mm512_load_si512((const void *)(a + m * lda + c * 64 + 16 * s));
    /* row pair by row pair: the pair's 4 steps depend on each other, the
     * pairs do not, and only one pair's codes are live at a time */
#pragma GCC unroll 8
    for (int q = 0; q < BF_NP; q++)
        if (q < NP) {
            const __m512i x = pair_load(rows[2 * q], rows[2 * q + 1], c, half);
            const __m512i lo2 = _mm512_shuffle_epi8(x, dup);
            const __m512 f = pair_factors(sv + (q * (chunks + 1) + c) * 4);
#pragma GCC unroll 2
            for (int m = 0; m < BF_MB; m++)
                if (m < mr) acc[m][q] = _mm512_mul_ps(acc[m][q], f);
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++) {
                const __m512bh w = (__m512bh)_mm512_permutexvar_epi16(pair_index(s, x, lo2), tab);
#pragma GCC unroll 2
                for (int m = 0; m < BF_MB; m++)
                    if (m < mr) acc[m][q] = _mm512_dpbf16_ps(acc[m][q], av[m][s], w);
            }
        }
}

/* The contract of di_dec_kernel_fn with the activations as bf16 pairs
 * (di_dec_lanes_bf16(), stride lda words). */
BF16_INLINE void bf_kernel(const int mr, const int R, int64_t chunks, int half_last,
                           const uint8_t *const *rowp, const uint8_t *ahead, const float *a,
                           int64_t lda, const float *sv, float *res) {
    /* E2M1 code i -> bf16 of its value (sign i & 8), entries 16-31 repeat
     * 0-15 (vpermw's index bit 4 is the next code's lowest bit) */
    const __m512i mag = _mm512_set4_epi32(0x40c04080, 0x40404000, 0x3fc03f80, 0x3f000000);
    const long long s = (long long)0x8000800080008000ull;
    const __m512i sign = _mm512_set_epi64(s, s, 0, 0, s, s, 0, 0);
    const __m512i tab = _mm512_or_si512(mag, sign);
    __m512 acc[BF_MB][BF_NP];
    const uint8_t *rows[2 * BF_NP];
#pragma GCC unroll 16
    for (int r = 0; r < 2 * BF_NP; r++) rows[r] = r < R ? rowp[r] : NULL;
#pragma GCC unroll 2
    for (int m = 0; m < BF_MB; m++)
#pragma GCC unroll 8
        for (int q = 0; q < BF_NP; q++)
            if (m < mr && q < R / 2) acc[m][q] = _mm512_setzero_ps();
    if (ahead)
        for (int64_t c = 0; c < chunks - half_last; c++) {
            pair_prefetch(ahead, c, R);
            bf_chunk(mr, R, chunks, c, 0, rows, a, lda, sv, tab, acc);
        }
    else
        for (int64_t c = 0; c < chunks - half_last; c++) bf_chunk(mr, R, chunks, c, 0, rows, a, lda, sv, tab, acc);
    if (half_last) bf_chunk(mr, R, chunks, chunks - 1, 1, rows, a, lda, sv, tab, acc);
#pragma GCC unroll 2
    for (int m = 0; m < BF_MB; m++)
#pragma GCC unroll 8
        for (int q = 0; q < BF_NP; q++)
            if (m < mr && q < R / 2)
                pair_finish(acc[m][q], sv + (q * (chunks + 1) + chunks) * 4, &res[m * 8 + 2 * q], &res[m * 8 + 2 * q + 1]);
}

#define BF_FN(mr, R)                                                                               \
    static BF16 void bf_##mr##_##R(int64_t chunks, int half_last, const uint8_t *const *rows,      \
                                   const uint8_t *ahead, const float *a, int64_t lda,             \
                                   const float *sv, float *res) {                                 \
        bf_kernel(mr, R, chunks, half_last, rows, ahead, a, lda, sv, res);                        \
    }
BF_FN(1, 16)
BF_FN(2, 8)

/* 16 weight rows for M = 1: each chain has 4 dependent vdpbf16ps (about 6
 * cycles each) and a multiply per chunk, and 8 row pairs cover that
 * latency; M = 2 gets its 8 accumulators from 4 pairs × 2 rows. */
int di_dec_rows_bf16(int64_t M) { return M == 1 ? 16 : M == 2 ? 8 : 0; }

di_dec_kernel_fn di_dec_kernel_mxfp4_bf16(int64_t M, int mr) {
    if (M == 1 && mr == 1) return bf_1_16;
    if (M == 2 && mr == 2) return bf_2_8;
    return 0;
}

/* Activation lanes ap = a·2^63 ([M][Kp], the lane order of kernels.h:
 * chunk, position, lane) -> [M][Kp] 32-bit words: per chunk and pair of
 * positions (2s, 2s + 1), 16 lanes (lanes 8-15 repeat 0-7, for the second
 * row of a pair), each the bf16 of a·2^-63 at position 2s in its upper half
 * and at 2s + 1 in its lower one. a·2^-63 = ap·2^-126 is exact where normal
 * (see above), and exact in bf16: its low 16 bits are zero. */
BF16 void di_dec_lanes_bf16(const float *ap, int64_t M, int64_t Kp, float *out) {
    const __m512 f = _mm512_set1_ps(0x1p-126f);
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    for (int64_t i = 0; i < M * Kp; i += 16) { /* two positions of 8 lanes */
        const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(ap + i), f); /* ap: 32-byte aligned */
        const __m256i e = _mm256_castps_si256(_mm512_castps512_ps256(v));
        const __m256i o = _mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1);
        const __m256i w = _mm256_or_si256(_mm256_and_si256(e, _mm512_castsi512_si256(hi)), _mm256_srli_epi32(o, 16));
        _mm512_store_si512((void *)(out + i), _mm512_inserti64x4(_mm512_castsi256_si512(w), w, 1));
    }
}

#endif
