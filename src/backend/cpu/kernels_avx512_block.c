/* AVX-512 kernels of the MXFP4 decode rows (kernels.h; architecture.md §2,
 * §8.3): the inner loop of kernels_avx2_block.c's decode rows and the chain
 * factors it reads; that file keeps everything else (activation lanes, the
 * scale-domain limits, the scalar fallback, the work split). Compiled with
 * per-function target attributes and called only after di_cpu_has_avx512().
 *
 * Why: the AVX2 loops spend 2.375 vector operations per 8 E2M1 codes on
 * shifts and masks next to the one FMA, and they bound the decode rows
 * (bench/RESULTS.md). Two AVX-512 permutes decode a 16-entry table with a
 * 4-bit index in one instruction, and one 16-bit shift feeds both:
 * - the lane contract of kernels.h has lane j = 4-byte word j of each
 *   32-byte chunk, code p of the word at bits 4p..4p+3; after a 16-bit
 *   shift right by 4p, bits 0-3 of each word hold code p and bits 16-19
 *   code p + 4;
 * - vpermps reads bits 0-3 of each 32-bit index: the fp32 table entry of
 *   code p;
 * - vpermw reads bits 0-4 of each 16-bit index (a 32-entry table, the 16
 *   entries twice, so the stray bit 4 does not matter); zero-masked to the
 *   upper words, its entries are the upper halves of the same fp32 table
 *   (whose lower halves are zero): the fp32 of code p + 4 in place.
 * That is 1.5 operations per 8 codes. The table entries are the bit patterns
 * the AVX2 shift decoding gives (sign at bit 31, the 3 magnitude bits at
 * 24..22: w·2^-126), so the lanes are fed the very same values and the scale
 * domains and limits of kernels_avx2_block.c apply unchanged.
 * On Zen 4 the FMAs take two of the four vector pipes, the permutes two
 * (one shared with the FMAs), the shifts two others, and masks run on any
 * (measured, bench/RESULTS.md): so positions 3 and 7 (the top nibble of
 * each 16-bit half) are decoded by the shift pair and masks of the AVX2
 * loops instead, which moves work off the permute pipes (-4 % time).
 *
 * One 512-bit register holds the same chunk of two weight rows (row r in
 * lanes 0-7, row r + 1 in 8-15): the eight chains of each row stay whole,
 * and each FMA runs 16 chains. The activations come duplicated into both
 * halves ([M][2·Kp], see di_dec_lanes_dup()), so every load feeds the FMAs
 * directly (a broadcast load per position measured slower). Positions p + 4
 * are held until positions 0-3 have gone through the chains, in order. */
#include "backend/cpu/kernels.h"

#ifdef DI_HAVE_AVX2_KERNELS

#include <immintrin.h>
#include <stdatomic.h>

#include "backend/cpu/kernels_avx512_pair.h"
#include "core/cpu_features.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#define AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx2,fma")))

/* Activation rows and weight row pairs per kernel call at most. */
enum { DEC_MB = 2, NPMAX = 4 };

/* ---- when to use them ---- */

static atomic_int avx512_forced = -1; /* -1: by the CPU; 0: off; 1: on where the CPU has it */
static atomic_int avx512_cpu = -1;

void di_cpu_kernels_force_avx512(int mode) { atomic_store(&avx512_forced, mode < 0 ? -1 : mode != 0); }

int di_cpu_kernels_avx512(void) {
    int c = atomic_load_explicit(&avx512_cpu, memory_order_relaxed);
    if (c < 0) {
        c = di_cpu_has_avx512();
        atomic_store(&avx512_cpu, c);
    }
    return c && atomic_load_explicit(&avx512_forced, memory_order_relaxed) != 0;
}

/* ---- the kernel ---- */



/* One chunk: R/2 row pairs × mr activation rows (a: stride lda, 16 floats
 * per position); the chains enter the chunk's scale domain first. */
AVX512_INLINE void dec512_chunk(const int mr, const int R, int64_t chunks, int64_t c, const int half,
                                const uint8_t *const *rows, const float *a, int64_t lda,
                                const float *sv, __m512 tf, __m512i tw, __m512 acc[DEC_MB][NPMAX]) {
    const int NP = R / 2;
    const __mmask32 upper = 0xaaaaaaaau;
    __m512i x[NPMAX];
    __m512 hold[4][NPMAX];
#pragma GCC unroll 8
    for (int q = 0; q < NPMAX; q++)
        if (q < NP) {
            x[q] = pair_load(rows[2 * q], rows[2 * q + 1], c, half);
            const __m512 f = pair_factors(sv + (q * (chunks + 1) + c) * 4);
#pragma GCC unroll 4
            for (int m = 0; m < DEC_MB; m++)
                if (m < mr) acc[m][q] = _mm512_mul_ps(acc[m][q], f);
        }
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++)
#pragma GCC unroll 8
        for (int q = 0; q < NPMAX; q++)
            if (q < NP) {
                __m512 v;
                if (p < 3) {
                    const __m512i t = p ? _mm512_srli_epi16(x[q], 4 * p) : x[q];
                    v = _mm512_permutexvar_ps(t, tf);
                    hold[p][q] = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(upper, t, tw));
                } else { /* the shift pair of kernels_avx2_block.c's dec_pair() */
                    const __m512i mask = _mm512_set1_epi32((int)0x81c00000u);
                    const __m512i y = _mm512_srai_epi16(x[q], 6);
                    v = _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(y, 16), mask));
                    hold[p][q] = _mm512_castsi512_ps(_mm512_and_si512(y, mask));
                }
#pragma GCC unroll 4
                for (int m = 0; m < DEC_MB; m++)
                    if (m < mr) acc[m][q] = _mm512_fmadd_ps(_mm512_load_ps(a + m * lda + c * 128 + 16 * p), v, acc[m][q]);
            }
#pragma GCC unroll 4
    for (int p = 4; p < 8; p++)
#pragma GCC unroll 8
        for (int q = 0; q < NPMAX; q++)
            if (q < NP)
#pragma GCC unroll 4
                for (int m = 0; m < DEC_MB; m++)
                    if (m < mr)
                        acc[m][q] = _mm512_fmadd_ps(_mm512_load_ps(a + m * lda + c * 128 + 16 * p), hold[p - 4][q], acc[m][q]);
}

/* The contract of kernels_avx2_block.c's dec_kernel for MXFP4 (R weight rows
 * rowp[r] × mr activation rows, chains multiplied by sv[c][r] on entering
 * chunk c and by sv[chunks][r] at the end, res[m·8 + r] the outputs, ahead
 * the group to prefetch), with the activations duplicated (a, stride lda
 * = 2·Kp). */
AVX512_INLINE void dec512_kernel(const int mr, const int R, int64_t chunks, int half_last,
                                 const uint8_t *const *rowp, const uint8_t *ahead, const float *a,
                                 int64_t lda, const float *sv, float *res) {
    /* E2M1 code i -> the fp32 bits of the shift decoding: sign i & 8 at bit
     * 31, magnitude i & 7 at 24..22; tw: the upper 16 bits, twice */
    const __m512i bits = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(8)), 28),
                                         _mm512_slli_epi32(_mm512_and_si512(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(7)), 22));
    const __m512 tf = _mm512_castsi512_ps(bits);
    const __m512i hi16 = _mm512_srli_epi32(bits, 16); /* entry i in word 2i */
    const __m512i tw = _mm512_permutexvar_epi16(_mm512_setr_epi32(0x00020000, 0x00060004, 0x000a0008, 0x000e000c, 0x00120010,
                                                                  0x00160014, 0x001a0018, 0x001e001c, 0x00020000, 0x00060004,
                                                                  0x000a0008, 0x000e000c, 0x00120010, 0x00160014, 0x001a0018,
                                                                  0x001e001c),
                                                hi16);
    __m512 acc[DEC_MB][NPMAX];
    const uint8_t *rows[2 * NPMAX];
#pragma GCC unroll 8
    for (int r = 0; r < 2 * NPMAX; r++) rows[r] = r < R ? rowp[r] : NULL;
#pragma GCC unroll 4
    for (int m = 0; m < DEC_MB; m++)
#pragma GCC unroll 8
        for (int q = 0; q < NPMAX; q++)
            if (m < mr && q < R / 2) acc[m][q] = _mm512_setzero_ps();
    if (ahead)
        for (int64_t c = 0; c < chunks - half_last; c++) {
            pair_prefetch(ahead, c, R);
            dec512_chunk(mr, R, chunks, c, 0, rows, a, lda, sv, tf, tw, acc);
        }
    else
        for (int64_t c = 0; c < chunks - half_last; c++) dec512_chunk(mr, R, chunks, c, 0, rows, a, lda, sv, tf, tw, acc);
    if (half_last) dec512_chunk(mr, R, chunks, chunks - 1, 1, rows, a, lda, sv, tf, tw, acc);
#pragma GCC unroll 4
    for (int m = 0; m < DEC_MB; m++)
#pragma GCC unroll 8
        for (int q = 0; q < NPMAX; q++)
            if (m < mr && q < R / 2)
                pair_finish(acc[m][q], sv + (q * (chunks + 1) + chunks) * 4, &res[m * 8 + 2 * q], &res[m * 8 + 2 * q + 1]);
}

#define DEC512_FN(mr, R)                                                                           \
    static AVX512 void dec512_##mr##_##R(int64_t chunks, int half_last, const uint8_t *const *rows, \
                                         const uint8_t *ahead, const float *a, int64_t lda,         \
                                         const float *sv, float *res) {                             \
        dec512_kernel(mr, R, chunks, half_last, rows, ahead, a, lda, sv, res);                      \
    }
DEC512_FN(1, 8)
DEC512_FN(2, 8)

/* 8 weight rows for M = 1 (4 row pairs) and M = 2 (4 pairs × 2 activation
 * rows: 8 accumulators, each chain 8 dependent FMAs per chunk); 16 rows for
 * M = 1 spill the held positions (1.25x slower), 4 for M = 2 cover too
 * little of the FMA latency (1.1x slower). M >= 3 stays on the AVX2 loops:
 * the FMAs bound it there, and the doubled activations of 4 rows no longer
 * fit the L1 cache (1.4x slower at K = 5120; bench/RESULTS.md). */
int di_dec_rows_avx512(int64_t M) { return M <= 2 ? 8 : 0; }

di_dec_kernel_fn di_dec_kernel_mxfp4_avx512(int64_t M, int mr) {
    if (M == 1 && mr == 1) return dec512_1_8;
    if (M == 2 && mr == 2) return dec512_2_8;
    return 0;
}

/* ---- the chain factors ----
 * The factors of kernels_avx2_block.c's dec_scales() (chunk 0: 1; chunk c:
 * 2^(e(2c-2) - e(2c)) for lanes 0-3, 2^(e(2c-1) - e(2c+1)) for 4-7, the
 * missing block of a last half chunk repeating its neighbour; after the last
 * chunk 2^(e - 64) of its blocks), stored per row pair and block, not per
 * lane: [R/2][chunks + 1][4], a quarter of the stores, which cost that
 * function 18 % of an M = 1 call. The kernel spreads them with one permute. */

/* 2^d as fp32 bits, |d| <= 126 */
static inline float pow2f(int d) {
    union { uint32_t u; float f; } v = {(uint32_t)(d + 127) << 23};
    return v.f;
}

/* (prev - cur + 127) << 23 for 16 blocks: the bits of 2^(prev - cur) */
AVX512_INLINE __m512i ratio_bits(__m128i cur, __m128i prev) {
    const __m512i d = _mm512_sub_epi32(_mm512_cvtepu8_epi32(prev), _mm512_cvtepu8_epi32(cur));
    return _mm512_slli_epi32(_mm512_add_epi32(d, _mm512_set1_epi32(127)), 23);
}

/* The ratio bits of blocks 2c .. 2c+15 of row e (KB blocks), up to the
 * last; for a last half chunk (KB odd) block KB repeats block KB - 1. */
AVX512_INLINE __m512i ratio_bits_at(const uint8_t *e, int64_t c, int64_t KB) {
    if (2 * c + 16 <= KB)
        return ratio_bits(_mm_loadu_si128((const __m128i *)(e + 2 * c)), _mm_loadu_si128((const __m128i *)(e + 2 * c - 2)));
    const int64_t nc = KB - 2 * c, np = nc + 2 < 16 ? nc + 2 : 16; /* bytes there, nc < 16 */
    __m128i cur = _mm_maskz_loadu_epi8((__mmask16)((1u << nc) - 1), e + 2 * c);
    cur = _mm_mask_set1_epi8(cur, (__mmask16)(1u << nc), (char)e[KB - 1]);
    const __m128i prev = _mm_maskz_loadu_epi8((__mmask16)((1u << np) - 1), e + 2 * c - 2);
    return ratio_bits(cur, prev);
}

AVX512 int di_dec_factors_avx512(const uint8_t *const *srow, int R, int64_t KB, int lo, int hi, int spread,
                                 float *sv) {
    const int64_t chunks = (KB + 1) / 2;
    /* the group's exponent range first: every factor is then a normal power of two */
    __m512i vmin = _mm512_set1_epi8((char)0xff), vmax = _mm512_setzero_si512();
    for (int r = 0; r < R; r++)
        for (int64_t b = 0; b < KB; b += 64) {
            const __mmask64 k = KB - b >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (KB - b)) - 1;
            const __m512i x = _mm512_maskz_loadu_epi8(k, srow[r] + b);
            vmin = _mm512_mask_min_epu8(vmin, k, vmin, x), vmax = _mm512_max_epu8(vmax, x);
        }
    __m256i m = _mm256_min_epu8(_mm512_castsi512_si256(vmin), _mm512_extracti64x4_epi64(vmin, 1));
    __m256i x = _mm256_max_epu8(_mm512_castsi512_si256(vmax), _mm512_extracti64x4_epi64(vmax, 1));
    __m128i m1 = _mm_min_epu8(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    __m128i x1 = _mm_max_epu8(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    /* all 16 bytes into byte 0 */
    m1 = _mm_min_epu8(m1, _mm_srli_si128(m1, 8)), x1 = _mm_max_epu8(x1, _mm_srli_si128(x1, 8));
    m1 = _mm_min_epu8(m1, _mm_srli_si128(m1, 4)), x1 = _mm_max_epu8(x1, _mm_srli_si128(x1, 4));
    m1 = _mm_min_epu8(m1, _mm_srli_si128(m1, 2)), x1 = _mm_max_epu8(x1, _mm_srli_si128(x1, 2));
    m1 = _mm_min_epu8(m1, _mm_srli_si128(m1, 1)), x1 = _mm_max_epu8(x1, _mm_srli_si128(x1, 1));
    const int emin = _mm_cvtsi128_si32(m1) & 0xff, emax = _mm_cvtsi128_si32(x1) & 0xff;
    if (emin < lo || emax > hi || emax - emin > spread) return 0;
    /* chunk i of the 8 in two rows' ratio bits: qword i of each */
    const __m512i lo4 = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11), hi4 = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
    for (int q = 0; q < R / 2; q++) {
        const uint8_t *ea = srow[2 * q], *eb = srow[2 * q + 1];
        float *o = sv + q * (chunks + 1) * 4;
        o[0] = o[1] = o[2] = o[3] = 1.0f;
        /* 8 chunks at a time, the last ones by masked loads and stores
         * (a scalar tail cost as much as the vectors) */
        for (int64_t c = 1; c < chunks; c += 8) {
            const __m512i fa = ratio_bits_at(ea, c, KB), fb = ratio_bits_at(eb, c, KB);
            const __m512i f0 = _mm512_permutex2var_epi64(fa, lo4, fb), f1 = _mm512_permutex2var_epi64(fa, hi4, fb);
            if (chunks - c >= 8) { /* plain stores: masked ones cost more on Zen 4 */
                _mm512_storeu_si512((void *)(o + c * 4), f0);
                _mm512_storeu_si512((void *)(o + c * 4 + 16), f1);
                continue;
            }
            const int64_t nf = (chunks - c) * 4; /* factors to store, < 32 */
            const __mmask16 k0 = nf >= 16 ? 0xffff : (__mmask16)((1u << nf) - 1);
            const __mmask16 k1 = nf > 16 ? (__mmask16)((1u << (nf - 16)) - 1) : 0;
            _mm512_mask_storeu_epi32((void *)(o + c * 4), k0, f0);
            _mm512_mask_storeu_epi32((void *)(o + c * 4 + 16), k1, f1);
        }
        const int64_t l0 = 2 * (chunks - 1), l1 = l0 + 1 < KB ? l0 + 1 : l0;
        o[chunks * 4 + 0] = pow2f(ea[l0] - 64);
        o[chunks * 4 + 1] = pow2f(ea[l1] - 64);
        o[chunks * 4 + 2] = pow2f(eb[l0] - 64);
        o[chunks * 4 + 3] = pow2f(eb[l1] - 64);
    }
    return 1;
}

/* Activation lanes [M][Kp] -> [M][2·Kp], each 8 floats twice (both 32-byte
 * aligned, Kp a multiple of 64). */
AVX512 void di_dec_lanes_dup(const float *ap, int64_t M, int64_t Kp, float *dup) {
    for (int64_t i = 0; i < M * Kp; i += 8) {
        const __m256d v = _mm256_castps_pd(_mm256_load_ps(ap + i));
        _mm512_store_pd((double *)(dup + 2 * i), _mm512_insertf64x4(_mm512_castpd256_pd512(v), v, 1));
    }
}

#endif
