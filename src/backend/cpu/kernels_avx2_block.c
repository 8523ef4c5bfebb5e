/* AVX2 + FMA kernels of the FP8 linears (kernels.h; architecture.md §2,
 * §8.3), compiled with per-function target attributes like kernels_avx2.c
 * and called only after di_cpu_has_avx2(). (MXFP4: kernels_avx2_mxfp4.c.)
 *
 * kernels.h gives every output eight chains, lane j running through the codes
 * that sit in 4-byte word j of each 32-byte chunk of the weight row. A
 * register loaded from a row therefore already holds the eight chains'
 * codes, one per 32-bit lane, and one shift pair per word position brings
 * them to fp32 bits without a transpose: the E4M3 code shifted to the top
 * byte and arithmetically back by 4 has its sign at bit 31 and its 7
 * magnitude bits at 26..20: masked, that is the fp32 whose value is
 * w·2^-120 (E4M3 subnormals become fp32 subnormals, exactly; the NaN codes
 * read as 480·2^-120). The activations a(k) = qa·sa of kernels.h are laid
 * out once per call in the same lane order (chunk, word position, lane), so
 * every product is a plain vertical FMA and the chains are exactly the
 * scalar ones.
 *
 * Decode rows (M <= 16) read each weight once for few activation rows, so
 * the cost per weight must stay below what the memory delivers. They go
 * straight from the codes to FMAs, R weight rows × up to 4 activation rows
 * at a time (8 accumulators: M = 1 runs 8 weight rows, M = 2 four, larger
 * batches blocks of 4 activation rows over 2 weight rows, or of up to 8
 * over 4 on 512-bit vectors, and through K in segments whose activations
 * stay in L1: "decode rows ... in segments" below). A whole 32-row
 * tile shares its block scales, so the activations are multiplied once per
 * tile by sw·2^120; the decoded w·2^-120 then times a·sw·2^120 is the real
 * product a·(w·sw) of the scalar chain, and the FMA rounds it the same way.
 * This needs every such factor exact: sw in [2^-117, 2^7] and |a|·sw < 2^7
 * per block (all real checkpoints and activations); a tile outside runs the
 * scalar code.
 * The R rows of a group stream side by side, each only K bytes long, which
 * the hardware prefetchers of AMD cores follow poorly from DRAM; the groups
 * are contiguous, though, so each chunk prefetches into L2 the next
 * R·32 bytes of the group two ahead, one linear stream at the rate the
 * kernel reads (+15-65 % from DRAM, bench/RESULTS.md); some Intel machines
 * follow the rows by themselves and read 16-28 % faster without it, so
 * each batch class measures which is faster on its first calls (dec_run;
 * DI_CPU_PREFETCH=1 / 0 fix it). Per-row prefetches a fixed
 * distance ahead measured neutral to 25 % slower; 8 rows spaced by a
 * multiple of 4 KB (wo_b at M = 1) measured no faster with it, so they
 * go without (but for the shift route's 512-bit kernels: dec_group).
 * The shift decoding hands fp32 subnormals to the FMAs, which only AMD cores
 * take at full speed; other CPUs decode through the F16C conversion (see
 * "CPUs with slow subnormals").
 * Prefill (M > 16) decodes the weights once into fp32 values w·sw (the very
 * products of the scalar code). From lg_min_m() rows on it takes each of the
 * eight lanes as a product of its own and runs an outer-product kernel
 * over it ("prefill, lane by lane"; on CPUs with AVX-512 that kernel runs
 * on 512-bit vectors, twice the outputs a step, and the decoding moves
 * codes rather than floats into the panels' order, lg_decode_wide);
 * below, where decoding weighs more than the products, chunks of 128
 * weight rows × 512 codes go through a register-blocked dot-product
 * kernel: 3 activation rows × 4 weight rows, 12 accumulators of 8 lanes,
 * the lanes carried across chunks in a per-thread buffer and reduced by the
 * tree of kernels.h at the end. Decode rows on the F16C route also run on
 * 512-bit vectors there (two weight rows a register, 8 rows for one
 * activation row and 4 for blocks of up to 4, "decode rows on 512-bit
 * vectors"), their codes decoded by the exponent bias rather than F16C;
 * on the shift route (AMD cores with AVX-512) the decode rows of one or
 * two rows and the segmented form of 3-16 rows do, by shifts
 * (dec_shift_wide). */
#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_words.h"

#ifdef DI_HAVE_AVX2_KERNELS

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef __clang__
/* The exactness arguments above need every multiply and add rounded where
 * written: no silent fusion. */
#pragma STDC FP_CONTRACT OFF
#endif

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
/* The 512-bit kernels (prefill lane by lane, decode rows on the F16C
 * route), run only where di_cpu_kernels_wide() says so. */
#define AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")))
#define AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")))

/* Prefill blocking: BM activation rows × BN weight rows per micro-kernel,
 * chunks of ROWS weight rows × KC codes. Decode rows: up to DEC_M rows, in
 * blocks of at most DEC_MB, and work units of 32 weight rows (one FP8 scale
 * tile). */
enum { BM = 3, BN = 4, ROWS = 128, KC = 512, DEC_M = 16, DEC_MB = 4, UNIT = 32, DEC_SPAN = 4, DEC_SPAN_PF = 512 };
/* Word position p of the 8 words x (one chunk of a row) as fp32 bits of
 * code·2^-120. */
AVX2_INLINE __m256 dec_pos(__m256i x, const int p) {
    __m256i v = p == 3 ? x : _mm256_slli_epi32(x, 24 - 8 * p);
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(v, 4), _mm256_set1_epi32((int)0x87f00000u)));
}

/* The route of CPUs with slow subnormals: the 32 codes of chunk x as fp32
 * w·2^-8, word position p in out[p] (lane j = word j, as dec_pos). A code's
 * byte at the top of a 16-bit half, shifted right by one with its sign and
 * the copy of the sign masked off, is the fp16 with sign s, exponent 0eeee
 * and mantissa mmm0000000: (1 + m/8)·2^(e-15) = w·2^-8 for e >= 1, and for
 * the subnormal codes the fp16 subnormal (m/8)·2^-14 = w·2^-8. vcvtph2ps
 * converts it exactly into a normal fp32 (the smallest code gives 2^-17),
 * so no subnormal reaches the arithmetic. The bytes are first sorted by
 * position (a byte shuffle within each 128-bit lane, then a dword permute
 * across them: [p = 0 of words 0-7, p = 1 | p = 2, p = 3]), so that one
 * unpack against zero per two positions makes the halves. The NaN codes
 * read as 480, as in dec_pos. */
AVX2_INLINE void dec_half(__m256i x, __m256 out[4]) {
    const __m256i bypos = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8,
                                           12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i mask = _mm256_set1_epi16((short)0xbf80), zero = _mm256_setzero_si256();
    const __m256i v = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(x, bypos),
                                                  _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    const __m256i lo = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(zero, v), 1), mask);
    const __m256i hi = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(zero, v), 1), mask);
    /* The conversions read their halves from memory (two stores, four
     * loads, forwarded inside the core): from registers the high lanes need
     * extracting, and on Intel cores the extractions, the permute and the
     * register form's second micro-op all go to one port (one thread in L2
     * on a Xeon: 11.5-12.8 GB/s this way, 7.4-9.2 from registers). */
    __m256i buf[2];
    _mm256_storeu_si256(buf, lo), _mm256_storeu_si256(buf + 1, hi);
    const __m128i *h = (const __m128i *)buf; /* positions 0, 2, 1, 3 */
    __asm__("vcvtph2ps %1, %0" : "=x"(out[0]) : "m"(h[0]));
    __asm__("vcvtph2ps %1, %0" : "=x"(out[2]) : "m"(h[1]));
    __asm__("vcvtph2ps %1, %0" : "=x"(out[1]) : "m"(h[2]));
    __asm__("vcvtph2ps %1, %0" : "=x"(out[3]) : "m"(h[3]));
}

/* Word positions p and p + 2 at once, with 16-bit shifts: the code of
 * position p + 2 sits in the upper half of each word at the same offset as
 * position p in the lower half, so one shift pair decodes both, the upper
 * one in place (-> *hi) and the lower one after a shift by 16 (returned):
 * 5 shifts instead of 7 per chunk. */
AVX2_INLINE __m256 dec_pair(__m256i x, const int p, __m256 *hi) {
    const __m256i mask = _mm256_set1_epi32((int)0x87f00000u);
    const int top = 8 - 8 * p; /* the code to bits 15.. of its half */
    const __m256i v = _mm256_srai_epi16(top ? _mm256_slli_epi16(x, top) : x, 4);
    *hi = _mm256_castsi256_ps(_mm256_and_si256(v, mask));
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 16), mask));
}

/* Chunk c of a row: 32 bytes. */
AVX2_INLINE __m256i load_chunk(const uint8_t *row, int64_t c) {
    return _mm256_loadu_si256((const __m256i *)(row + c * 32));
}

/* The kernels.h tree of 4 outputs' lane vectors: out[i] = tree(v[i]). */
AVX2_INLINE __m128 tree4(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
    __m256 g = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
    return _mm_add_ps(_mm256_castps256_ps128(g), _mm256_extractf128_ps(g, 1));
}

static float tree1(const float *l) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); }



/* E4M3 codes by the exponent bias, without F16C: out[p] lane l is the code
 * in byte p of x's word l (the decode rows pass two rows' chunks, row 2i's
 * code 4l + p for l < 8, row 2i + 1's for the rest: dec_half_wide's
 * vectors; the wide prefill decoding words of 16 rows). Each code goes to
 * the top byte of its lane (shifts, below), arithmetically back by 4 (sign
 * at bit 31, the exponent's 4 bits at 23-26, the mantissa's 3 at 20-22),
 * masked, and the exponent field raised
 * by 112 (bits 27-29 set: e + 112 <= 127 carries into nothing): the fp32 of
 * w·2^-8 for every code of exponent e >= 1, a normal number, as F16C gives
 * it. A code of exponent 0 (its value m·2^-9) would read 2^-15·(1 + m/8):
 * where the 64 codes hold one (6 in 1,000 chunk pairs of weights
 * quantized as a checkpoint's, bench_gemm --weights normal), those lanes
 * take m·2^-17 from a table, sign restored. ~2.3 instructions a vector of
 * 16 codes instead of dec_half_wide's ~5 (its conversions take two each);
 * returns whether the table was used. */
static const float bias_sub_tab[16] = {0.0f, 0x1p-17f, 0x1p-16f, 0x1.8p-16f, 0x1p-15f, 0x1.4p-15f, 0x1.8p-15f, 0x1.cp-15f};
/* The codes of exponent e >= 1 (every lane right but those of exponent 0). */
AVX512_INLINE void dec_bias_normal(__m512i x, __m512i w[4]) {
    const __m512i keep = _mm512_set1_epi32((int)0x87f00000), bias = _mm512_set1_epi32(0x38000000);
    /* positions 1 and 3 are the top bytes of their 16-bit halves, 0 and 2
     * after a 16-bit shift by 8: one arithmetic 16-bit shift by 4 brings
     * the upper half's code to bits 27..20 with its sign above, and the
     * lower half's there after a 32-bit shift by 16 (9 instructions for the
     * four positions instead of 12 with a byte shuffle each) */
    const __m512i h13 = _mm512_srai_epi16(x, 4), h02 = _mm512_srai_epi16(_mm512_slli_epi16(x, 8), 4);
    w[0] = _mm512_ternarylogic_epi32(_mm512_slli_epi32(h02, 16), keep, bias, 0xea); /* (a & b) | c */
    w[1] = _mm512_ternarylogic_epi32(_mm512_slli_epi32(h13, 16), keep, bias, 0xea);
    w[2] = _mm512_ternarylogic_epi32(h02, keep, bias, 0xea);
    w[3] = _mm512_ternarylogic_epi32(h13, keep, bias, 0xea);
}
/* The lanes of exponent 0 from the table, sign restored. */
AVX512_INLINE void dec_bias_sub(__m512i x, __m512i w[4]) {
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        /* dword t of each 16-byte lane <- its byte 4t + p, in the top byte */
        const __m512i pick = _mm512_broadcast_i32x4(_mm_setr_epi8(-1, -1, -1, (char)p, -1, -1, -1, (char)(4 + p),
                                                                  -1, -1, -1, (char)(8 + p), -1, -1, -1, (char)(12 + p)));
        const __m512i s = _mm512_shuffle_epi8(x, pick);
        const __mmask16 z = _mm512_testn_epi32_mask(s, _mm512_set1_epi32(0x78000000));
        const __m512 tab = _mm512_loadu_ps(bias_sub_tab); /* index: the code's bits 0-3, its mantissa here */
        w[p] = _mm512_castps_si512(
            _mm512_mask_permutexvar_ps(_mm512_castsi512_ps(w[p]), z, _mm512_srli_epi32(s, 24), tab));
        w[p] = _mm512_ternarylogic_epi32(w[p], s, _mm512_set1_epi32((int)0x80000000), 0xf8); /* a | (b & c): the sign */
    }
}
/* Whether any of x's 64 codes has exponent 0. */
AVX512_INLINE __mmask64 dec_bias_subs(__m512i x) { return _mm512_testn_epi8_mask(x, _mm512_set1_epi8(0x78)); }
AVX512_INLINE int dec_bias_wide(__m512i x, __m512 out[4]) {
    __m512i w[4];
    dec_bias_normal(x, w);
    const int sub = dec_bias_subs(x) != 0;
    if (__builtin_expect(sub, 0)) dec_bias_sub(x, w);
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) out[p] = _mm512_castsi512_ps(w[p]);
    return sub;
}

/* ---- activations in lane order ---- */

typedef struct pack_job {
    const uint8_t *qa;
    const float *sa;
    int64_t K, Kp;
    float factor; /* a power of two the lanes are multiplied by (exact) */
    float *ap;    /* [M][Kp] */
    float *bmax;  /* [M][K/32]: max |a| per block, +inf for NaN (or NULL) */
    int half;     /* decode through F16C (see use_half()) */
    int64_t seg;  /* 0: lane order; else S = K/8: lane by lane for lg_run */
    int64_t Mp;   /* seg: rows in whole panels of LG_MR */
    int64_t run;  /* seg: lg_run_steps(S) */
    float *rows;  /* seg: [threads][6][K], a panel's rows in lane order */
    int64_t M;
} pack_job;

enum { LG_MR = 6, LG_STEPS_MAX = 256 };

/* Steps of a lane in one run: S split into equal runs of at most
 * LG_STEPS_MAX, a multiple of 4 (whole 32-code chunks). A run's weight
 * panel (16 rows × its steps, 16 KB at most) is what a micro-kernel reads
 * at every step, from L1: runs of 512 (32 KB, all of a Zen 3 core's L1)
 * measured 15 % slower at K = 8192. */
static inline int64_t lg_run_steps(int64_t S) {
    const int64_t n = S > 0 ? (S + LG_STEPS_MAX - 1) / LG_STEPS_MAX : 1;
    return S > 0 ? (S + 4 * n - 1) / (4 * n) * 4 : 4;
}

/* Where step s of lane j of row m goes in lg_run's layout: lane by lane,
 * each lane in runs of lg_run_steps(S) steps, and a run [Mp/6][steps][6]:
 * panels of 6 rows with their steps interleaved, the panels in order, so
 * that a micro-kernel's rows are one contiguous stream and the panels of
 * one run follow each other. */
static inline int64_t seg_at(const pack_job *p, int64_t m, int64_t j, int64_t s) {
    const int64_t S = p->seg, L = p->run, h0 = s / L * L, ns = S - h0 < L ? S - h0 : L;
    return (j * S + h0) * p->Mp + (m / LG_MR * ns + (s - h0)) * LG_MR + m % LG_MR;
}

/* Chunk c0 of row m, code by code from the tables (the plain statement of
 * the vector version below, which falls back to it for NaN codes or scales
 * its shortcut does not cover). */
static void pack_chunk_scalar(const pack_job *p, int64_t m, int64_t c0, float *dst) {
    const float *e4m3 = di_cpu_e4m3_table();
    const int64_t K = p->K, KB = K / 32, g = 4;
    const uint8_t *q = p->qa + m * K;
    /* lane j holds codes c0 + j·g .. c0 + j·g + g-1, position by position */
    for (int64_t j = 0; j < 8; j++) {
        const int64_t k0 = c0 + j * g;
        if (k0 >= K) {
            for (int64_t pos = 0; pos < g; pos++) dst[c0 + 8 * pos + j] = 0.0f;
            continue;
        }
        const float s = p->sa[m * KB + k0 / 32];
        float mx = 0.0f;
        for (int64_t pos = 0; pos < g; pos++) {
            const float a = e4m3[q[k0 + pos]] * s;
            dst[c0 + 8 * pos + j] = a * p->factor;
            const float v = isnan(a) ? INFINITY : fabsf(a);
            mx = v > mx ? v : mx;
        }
        if (p->bmax) { /* the first lane of a block sets its max */
            float *bm = &p->bmax[m * KB + k0 / 32];
            if (j == 0 || mx > *bm) *bm = mx;
        }
    }
}

/* Max of 8 lanes. */
AVX2_INLINE float hmax8(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_shuffle_ps(x, x, 1)));
}

/* The E4M3 activation codes decode as the weights do: by the shift pair
 * (dec_pos) a code's bits give e4m3·2^-120 exactly, and times sa·2^120
 * (exact when sa <= 2^7) that is e4m3·sa rounded once, as the scalar code
 * gives; through F16C (dec_half) e4m3·2^-8 times sa·2^8. */
static AVX2 void pack_row(const pack_job *p, int64_t m, float *dst) {
    const int64_t K = p->K, Kp = p->Kp, KB = K / 32;
    const __m256i low7 = _mm256_set1_epi8(0x7f), absm = _mm256_set1_epi32(0x7fffffff);
    const __m256 f = _mm256_set1_ps(p->factor);
    const uint8_t *q = p->qa + m * K;
    const float *sa = p->sa + m * KB;
    for (int64_t c0 = 0; c0 < Kp; c0 += 32) {
        const int64_t kb = c0 / 32;
        const float s0 = sa[kb];
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(q + c0));
        const __m256i nan = _mm256_cmpeq_epi8(_mm256_and_si256(x0, low7), low7);
        if (!(s0 >= 0.0f && s0 <= 0x1p7f) || !_mm256_testz_si256(nan, nan)) {
            pack_chunk_scalar(p, m, c0, dst);
            continue;
        }
        const __m256 sv = _mm256_set1_ps(s0 * (p->half ? 0x1p8f : 0x1p120f));
        __m256 d[4], mx = _mm256_setzero_ps();
        if (p->half) dec_half(x0, d);
        else
#pragma GCC unroll 4
            for (int pos = 0; pos < 4; pos++) d[pos] = dec_pos(x0, pos);
#pragma GCC unroll 4
        for (int pos = 0; pos < 4; pos++) {
            __m256 a = _mm256_mul_ps(d[pos], sv);
            mx = _mm256_max_ps(mx, _mm256_and_ps(a, _mm256_castsi256_ps(absm)));
            _mm256_store_ps(dst + c0 + 8 * pos, _mm256_mul_ps(a, f));
        }
        if (p->bmax) p->bmax[m * KB + kb] = hmax8(mx);
    }
}

static void pack_rows(void *ctx, int64_t m0, int64_t m1, int thread) {
    const pack_job *p = ctx;
    for (int64_t m = m0; m < m1; m++) pack_row(p, m, p->ap + m * p->Kp);
}

/* v[r] (row r, lane j in element j) -> v[j] (lane j, row r in element r) */
AVX2_INLINE void transpose8(__m256 v[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
    const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
    const __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
    const __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    v[0] = _mm256_permute2f128_ps(u0, u4, 0x20), v[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    v[1] = _mm256_permute2f128_ps(u1, u5, 0x20), v[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    v[2] = _mm256_permute2f128_ps(u2, u6, 0x20), v[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    v[3] = _mm256_permute2f128_ps(u3, u7, 0x20), v[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* seg: panels [q0, q1) of 6 rows. The rows go to a per-thread buffer in
 * lane order (pack_row: position pos of a chunk's 32 codes is a vector of
 * the 8 lanes), rows past M as zeros; then each position's 6 row vectors
 * (and two spare) are transposed into one vector a lane, whose first 6
 * values, the panel's rows at that step, are the 6 floats seg_at puts
 * together: two stores a lane and step instead of six scattered ones. */
static AVX2 void pack_panels(void *ctx, int64_t q0, int64_t q1, int thread) {
    const pack_job *p = ctx;
    const int64_t K = p->K, S = p->seg, lane = S * p->Mp; /* seg_at(m, j + 1, s) - seg_at(m, j, s) */
    float *rows = p->rows + (int64_t)thread * LG_MR * K;
    for (int64_t q = q0; q < q1; q++) {
        for (int r = 0; r < LG_MR; r++) {
            if (q * LG_MR + r < p->M) pack_row(p, q * LG_MR + r, rows + r * K);
            else memset(rows + r * K, 0, (size_t)K * sizeof(float));
        }
        int64_t h0 = 0, hn = 0; /* the current run of steps [h0, h0 + hn) */
        float *ob = NULL;       /* seg_at(p, 6q, 0, h0) */
        for (int64_t c0 = 0; c0 < K; c0 += 32) {
            if (c0 / 8 >= h0 + hn) { /* the next run (no division a chunk) */
                h0 += hn;
                hn = S - h0 < p->run ? S - h0 : p->run;
                ob = p->ap + seg_at(p, q * LG_MR, 0, h0);
            }
            float *o = ob + (c0 / 8 - h0) * LG_MR; /* seg_at(p, 6q, 0, c0 / 8) */
#pragma GCC unroll 4
            for (int pos = 0; pos < 4; pos++, o += LG_MR) {
                __m256 v[8];
#pragma GCC unroll 6
                for (int r = 0; r < LG_MR; r++) v[r] = _mm256_load_ps(rows + r * K + c0 + 8 * pos);
                v[6] = v[7] = _mm256_setzero_ps();
                transpose8(v);
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {
                    _mm_storeu_ps(o + j * lane, _mm256_castps256_ps128(v[j]));
                    _mm_storel_pi((__m64 *)(o + j * lane + 4), _mm256_extractf128_ps(v[j], 1));
                }
            }
        }
    }
}

/* The activations' layout into `into` (Mp·Kp floats the caller owns) or,
 * when NULL, a buffer it allocates. Returns NULL when out of memory. */
static float *pack_lanes(const uint8_t *qa, const float *sa, int64_t M, int64_t K, int64_t Kp,
                         float factor, float *bmax, int half, int seg, float *into, di_threadpool *tp) {
    const int64_t Mp = seg ? (M + LG_MR - 1) / LG_MR * LG_MR : M; /* seg: whole panels */
    di_threadpool *pool = M * K >= (1 << 18) ? tp : NULL; /* worth spreading only for prefill sizes */
    float *ap = into ? into : aligned_alloc(32, (size_t)((Mp * Kp * sizeof(float) + 31) & ~(size_t)31));
    float *rows = seg ? aligned_alloc(32, (size_t)di_threadpool_size(pool) * LG_MR * (size_t)K * sizeof(float)) : NULL;
    if (!ap || (seg && !rows)) {
        if (ap != into) free(ap);
        free(rows);
        return NULL;
    }
    pack_job p = {qa, sa, K, Kp, factor, ap, bmax, half, seg ? K / 8 : 0, Mp, lg_run_steps(K / 8), rows, M};
    if (seg) di_threadpool_for(pool, Mp / LG_MR, 1, pack_panels, &p);
    else di_threadpool_for(pool, M, 4, pack_rows, &p);
    free(rows);
    return ap;
}

/* ---- CPUs with slow subnormals ----
 * The shift decoding above hands fp32 subnormals to the multiplies and FMAs
 * (E4M3 subnormal codes, 7 in 128). AMD Zen cores take them at full speed;
 * Intel cores go through microcode assists (0.4-0.5 GB/s for decode rows of
 * uniformly random codes, bench/RESULTS.md). Elsewhere than on AMD every
 * code therefore goes through dec_half(): weights decode to w·2^-8 and the
 * activations carry sw·2^8 instead of sw·2^120, the same products. (The
 * route before it, E4M3 values gathered from the table into the prefill
 * kernels, read 1.1 GB/s at M = 1 on a Xeon.) */

static atomic_int half_mode = -1; /* -1: not decided; 0: shifts; 1: F16C */
static atomic_int half_forced;

static int use_half(void) {
    const int f = atomic_load_explicit(&half_forced, memory_order_relaxed);
    if (f) return f > 0;
    int v = atomic_load_explicit(&half_mode, memory_order_relaxed);
    if (v < 0) {
        __builtin_cpu_init();
        v = !__builtin_cpu_is("amd");
        atomic_store(&half_mode, v);
    }
    return v;
}

void di_cpu_kernels_force_fp8_half(int on) { atomic_store(&half_forced, on > 0 ? 1 : on < 0 ? -1 : 0); }
int di_cpu_kernels_fp8_half(void) { return use_half(); }


/* ---- prefill, dot products (M < lg_min_m()) ---- */

typedef struct pf_job {
    int half;               /* decode through F16C (see use_half()) */
    const float *ap;        /* [M][Kp] */
    const uint8_t *w, *ws;
    int64_t M, K, Kp, N;
    float *out;             /* [M, N] */
    float *scratch;         /* [threads][scratch_floats]: tile [ROWS][KC], lanes [M][ROWS][8] */
    int64_t scratch_floats;
} pf_job;

/* The 32 values w·sw of chunk c of a weight row (s = sw), word position p
 * in d[p] (lane j = word j), each rounded once as in the scalar code: the
 * decoded w·2^-120 times sw·2^120 when that factor is exact, else times
 * 2^120 first, which gives w exactly. Through F16C: w·2^-8 times sw·2^8
 * (exact for every E8M0 scale up to 2^119), else times 2^8 first (NaN
 * scales too: the product is NaN either way). */
AVX2_INLINE void dec_chunk_ws(const uint8_t *row, int64_t c, float s, int half, __m256 d[4]) {
    if (half) {
        dec_half(load_chunk(row, c), d);
        const int big = !(s <= 0x1p100f);
        const __m256 f = _mm256_set1_ps(big ? s : s * 0x1p8f), u8 = _mm256_set1_ps(0x1p8f);
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) d[p] = _mm256_mul_ps(big ? _mm256_mul_ps(d[p], u8) : d[p], f);
        return;
    }
    const __m256i x = load_chunk(row, c);
    if (s <= 0x1p7f) {
        const __m256 f = _mm256_set1_ps(s * 0x1p120f);
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) d[p] = _mm256_mul_ps(dec_pos(x, p), f);
    } else {
        const __m256 f = _mm256_set1_ps(s), u = _mm256_set1_ps(0x1p120f);
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) d[p] = _mm256_mul_ps(_mm256_mul_ps(dec_pos(x, p), u), f);
    }
}

/* Rows n0 .. n0+ROWS-1 (zeros past N), codes [k0, k0+kc) -> t[r][kc] in lane
 * order (dec_chunk_ws). */
static AVX2 void pf_decode(const pf_job *j, int64_t n0, int64_t k0, int64_t kc, float *t) {
    const int64_t K = j->K, KB = K / 32;
    const int64_t c0 = k0 / 32, c1 = (k0 + kc) / 32;
    const float *e8m0 = di_cpu_e8m0_table();
    for (int64_t r = 0; r < ROWS; r++) {
        float *tr = t + r * KC - c0 * 32;
        const int64_t n = n0 + r;
        if (n >= j->N) {
            memset(tr + c0 * 32, 0, (size_t)kc * sizeof(float));
            continue;
        }
        const uint8_t *row = j->w + n * K, *st = j->ws + (n / 32) * KB; /* chunk c is block c */
        for (int64_t c = c0; c < c1; c++) {
            __m256 d[4];
            dec_chunk_ws(row, c, e8m0[st[c]], j->half, d);
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) _mm256_store_ps(tr + c * 32 + 8 * p, d[p]);
        }
    }
}

/* mr activation rows (a, stride lda) × BN weight rows (t, stride KC), steps
 * of 8 codes: lane vectors start at zero (first) or from lanes[mr][BN][8],
 * and end there or, on the last chunk, reduced into res[mr][BN]. */
AVX2_INLINE void pf_ukr(const int mr, int64_t steps, const float *a, int64_t lda, const float *t,
                        float *lanes, int first, int last, float *res) {
    __m256 acc[BM][BN];
#pragma GCC unroll 3
    for (int m = 0; m < BM; m++)
#pragma GCC unroll 4
        for (int n = 0; n < BN; n++)
            if (m < mr) acc[m][n] = first ? _mm256_setzero_ps() : _mm256_load_ps(lanes + (m * BN + n) * 8);
    for (int64_t s = 0; s < steps; s++) {
        __m256 av[BM];
#pragma GCC unroll 3
        for (int m = 0; m < BM; m++)
            if (m < mr) av[m] = _mm256_load_ps(a + m * lda + s * 8);
#pragma GCC unroll 4
        for (int n = 0; n < BN; n++) {
            __m256 b = _mm256_load_ps(t + n * KC + s * 8);
#pragma GCC unroll 3
            for (int m = 0; m < BM; m++)
                if (m < mr) acc[m][n] = _mm256_fmadd_ps(av[m], b, acc[m][n]);
        }
    }
#pragma GCC unroll 3
    for (int m = 0; m < BM; m++)
        if (m < mr) {
            if (last) {
                _mm_storeu_ps(res + m * BN, tree4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]));
            } else {
#pragma GCC unroll 4
                for (int n = 0; n < BN; n++) _mm256_store_ps(lanes + (m * BN + n) * 8, acc[m][n]);
            }
        }
}

typedef void (*pf_ukr_fn)(int64_t, const float *, int64_t, const float *, float *, int, int, float *);
#define PF_UKR_FN(mr)                                                                          \
    static AVX2 void pf_ukr_##mr(int64_t steps, const float *a, int64_t lda, const float *t,  \
                                 float *lanes, int first, int last, float *res) {             \
        pf_ukr(mr, steps, a, lda, t, lanes, first, last, res);                                 \
    }
PF_UKR_FN(1)
PF_UKR_FN(2)
PF_UKR_FN(3)
static const pf_ukr_fn pf_ukrs[BM + 1] = {0, pf_ukr_1, pf_ukr_2, pf_ukr_3};

/* Chunks [u0, u1) of ROWS weight rows: every activation row, all of K. */
static AVX2 void pf_units(void *ctx, int64_t u0, int64_t u1, int thread) {
    const pf_job *j = ctx;
    const int64_t M = j->M, N = j->N, Kp = j->Kp;
    float *t = j->scratch + thread * j->scratch_floats, *lanes = t + ROWS * KC;
    for (int64_t u = u0; u < u1; u++) {
        const int64_t n0 = u * ROWS;
        for (int64_t k0 = 0; k0 < Kp; k0 += KC) {
            const int64_t kc = Kp - k0 < KC ? Kp - k0 : KC;
            const int first = k0 == 0, last = k0 + kc == Kp;
            pf_decode(j, n0, k0, kc, t);
            for (int64_t m0 = 0; m0 < M; m0 += BM) {
                const int mr = M - m0 < BM ? (int)(M - m0) : BM;
                for (int64_t nb = 0; nb < ROWS && n0 + nb < N; nb += BN) {
                    float res[BM * BN];
                    pf_ukrs[mr](kc / 8, j->ap + m0 * Kp + k0, Kp, t + nb * KC,
                                lanes + (m0 * ROWS + nb * mr) * 8, first, last, res);
                    if (last)
                        for (int m = 0; m < mr; m++)
                            for (int64_t n = 0; n < BN && n0 + nb + n < N; n++)
                                j->out[(m0 + m) * N + n0 + nb + n] = res[m * BN + n];
                }
            }
        }
    }
}

static int pf_run(int half, const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                  const uint8_t *w, const uint8_t *ws, int64_t N, float *out, di_threadpool *tp) {
    const int threads = di_threadpool_size(tp);
    const int64_t Kp = K;
    const int64_t sf = ROWS * KC + M * ROWS * 8;
    float *ap = pack_lanes(qa, sa, M, K, Kp, 1.0f, NULL, half, 0, NULL, tp);
    float *scratch = aligned_alloc(32, (size_t)threads * (size_t)sf * sizeof(float));
    if (!ap || !scratch) {
        free(ap), free(scratch);
        return 0;
    }
    pf_job j = {half, ap, w, ws, M, K, Kp, N, out, scratch, sf};
    const int64_t units = (N + ROWS - 1) / ROWS;
    /* several chunks per thread so a core slowed by other work takes fewer */
    const int64_t grain = units / (4 * threads);
    di_threadpool_for(tp, units, grain < 1 ? 1 : grain, pf_units, &j);
    free(ap), free(scratch);
    return 1;
}

/* ---- prefill, lane by lane (M >= lg_min_m()) ----
 * kernels.h gives an output eight chains: lane j runs through the codes k =
 * 32c + 4j + p (p = 0..3) in increasing k, that is through its steps s = 4c
 * + p in order. Each lane is therefore a product of its own, over S = K/8
 * steps, and an output's lane is the sequential chain that an
 * outer-product kernel computes for every output of its tile at once, as
 * BLAS kernels do: the activations laid out lane by lane in panels of 6
 * rows (seg_at, pack_lanes with seg), the weights decoded into panels
 * P_j[s][n] of 16 rows (w(k)·sw, the products of the scalar code), and a
 * step is one broadcast activation times two weight vectors for each of 6
 * rows: 12 FMAs for 8 loads, the two weight vectors from L1. A lane's
 * steps go in runs (lg_run_steps); its chains continue from run to run in
 * a buffer of lanes and meet in the tree of kernels.h as the last lane of
 * a tile ends, so the bits are the scalar code's. The dot-product form (8
 * lanes of one output in a register, 3 × 4 outputs a step) needs 7 loads
 * of 32 bytes per 12 FMAs, half of them from L2: 0.6-0.8 of OpenBLAS
 * sgemm's rate on a Zen 3 core at M = 512, this form 0.8-1.0
 * (bench/RESULTS.md). */
enum { LG_MIN_M = 32 }; /* below, the dot products: the decoding here costs more */
/* Rows from which the lane-by-lane form runs. On 512-bit vectors its
 * panels are decoded from the codes (lg_decode_wide), ~3x cheaper, and it
 * beats the dot products from the first row past the decode rows: 1.5-2.2x
 * at 17 and 24 rows (K 5,120-8,192, N 512-5,120, one and two threads on a
 * Xeon with AVX-512, bench/RESULTS.md); on 256-bit vectors the dot products
 * stay ahead below LG_MIN_M (0.8-0.9x there). */
static int64_t lg_min_m(void) { return di_cpu_kernels_wide() ? DEC_M + 1 : LG_MIN_M; }
/* Blocking: LG_NR weight rows a panel (two vectors), LG_MC activation rows
 * a block (its run of one lane, LG_MC × run steps, <= 96 KB, stays in L2
 * while the block meets one panel after another), LG_NC weight rows a
 * column block (its decoded runs, 8 lanes × run × LG_NC floats, <= 4 MB,
 * and the lanes of its outputs live in L3), LG_MO activation rows a pass
 * (its lanes, 8 × LG_MO × LG_NC floats, <= 8.5 MB). Each (column block,
 * run) is a decoding pass and a pass of units over the thread pool: column
 * blocks of 512 rows rather than 256 halve those passes and double the
 * units a pass; on the 16-core Xeon of docs/gpu-notes.md (run 139) the FP8
 * products of 512 rows went from 0.73-0.76 to 0.96-1.09 of OpenBLAS on 16
 * threads, one thread and a Zen 4 core's two the same within their spread
 * (bench/RESULTS.md). */
enum { LG_NR = 16, LG_MC = 96, LG_NC = 512, LG_MO = 516 };
/* With 512-bit vectors a panel is LG_NR_WIDE rows (two zmm: 6 × 32 outputs,
 * 12 FMAs of 16 lanes a step, the same 8 loads; a run's panel, 32 KB at
 * most, still fits the 48 KB L1 of the cores that have them). Each output's
 * chain is the same sequence of FMAs whatever the vector width: same bits. */
enum { LG_NR_WIDE = 32 };

typedef struct lg_job {
    int half;           /* decode through F16C (see use_half()) */
    int nr;             /* weight rows a panel: LG_NR, or LG_NR_WIDE on 512-bit vectors */
    const float *ap;    /* the activations in seg_at's layout (pack_lanes with seg) */
    const uint8_t *w, *ws;
    int64_t M, K, N, Mp;
    float *out;         /* [M, N] */
    int64_t run;        /* lg_run_steps(K / 8) */
    float *bp;          /* decoded runs of the column block: [panel][lane][run][nr] */
    float *lb;          /* lanes of the pass × column block: [lane][lbr][LG_NC] */
    int64_t lbr;        /* rows of a lane in lb: min(Mp, LG_MO) */
    /* the current step: column block n0 .. n0 + nc, pass rows m0 .. m0 + mo, run s0 .. s0 + ns;
     * rows a row block (mc <= LG_MC, a multiple of LG_MR), panels a unit (pg) */
    int64_t n0, nc, m0, mo, s0, ns, mc, pg;
} lg_job;

/* Rows n0 + 8g .. n0 + 8g + 7 for g in [g0, g1) of the panel at n0 (one
 * scale row: n0 % nr == 0; zeros past N), steps s0 .. s0 + ns of every lane
 * (ns % 4 == 0) -> pt[j][s - s0][nr], lane j at j·run·nr. Panels of
 * LG_NR_WIDE rows go to lg_decode_wide a half at a time (their callers
 * pass whole halves: g0 and g1 even, lg_item_rows). */
static AVX512 void lg_decode_wide(const lg_job *jb, int64_t n0, int h, int64_t s0, int64_t ns, float *pt);
static AVX2 void lg_decode(const lg_job *jb, int64_t n0, int g0, int g1, int64_t s0, int64_t ns, float *pt) {
    const int nr = jb->nr;
    if (nr == LG_NR_WIDE) {
        for (int g = g0; g < g1; g += 2) lg_decode_wide(jb, n0, g / 2, s0, ns, pt);
        return;
    }
    const int64_t K = jb->K, KB = K / 32, c0 = s0 / 4, c1 = (s0 + ns) / 4;
    const float *e8m0 = di_cpu_e8m0_table();
    const uint8_t *st = jb->ws + (n0 / 32) * KB;
    _Alignas(32) float tmp[8][4][8]; /* row r's position p, lanes */
    for (int g = g0; g < g1; g++)
        for (int64_t c = c0; c < c1; c++) {
            const float s = e8m0[st[c]];
            for (int r = 0; r < 8; r++) {
                const int64_t n = n0 + 8 * g + r;
                __m256 d[4];
                if (n < jb->N) dec_chunk_ws(jb->w + n * K, c, s, jb->half, d);
                else d[0] = d[1] = d[2] = d[3] = _mm256_setzero_ps();
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++) _mm256_store_ps(tmp[r][p], d[p]);
            }
            float *o = pt + (4 * (c - c0)) * nr + 8 * g;
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) {
                __m256 v[8];
#pragma GCC unroll 8
                for (int r = 0; r < 8; r++) v[r] = _mm256_load_ps(tmp[r][p]);
                transpose8(v);
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) _mm256_store_ps(o + (j * jb->run + p) * nr, v[j]);
            }
        }
}

/* lg_decode on 512-bit vectors, 16 rows at a time (n0 + 16h .. n0 + 16h +
 * 15 of the panel at n0, nr = LG_NR_WIDE): a panel's step of lane j needs
 * word j of every row's chunk side by side, which lg_decode gets by
 * decoding each row and transposing the floats (8 × 8 a position, through
 * memory: ~1.3 instructions a code, a third of the time of a product of 64
 * rows). Here the codes move instead, four to a word: chunk_words16
 * (kernels_words.h) gives word j of the 16 rows in one register, which
 * dec_bias_wide turns into its four positions, the steps 4c .. 4c + 3 of
 * lane j: ~0.4 instructions a code. The values are lg_decode's, w·sw
 * rounded once by the half route's factors (w·2^-8 times sw·2^8, or
 * times 2^8 and then sw where that factor would not be exact). Rows past
 * N read zero codes (their outputs are never stored). */
static AVX512 void lg_decode_wide(const lg_job *jb, int64_t n0, int h, int64_t s0, int64_t ns, float *pt) {
    const int64_t K = jb->K, KB = K / 32, c0 = s0 / 4, c1 = (s0 + ns) / 4, run = jb->run;
    const float *e8m0 = di_cpu_e8m0_table();
    const uint8_t *st = jb->ws + (n0 / 32) * KB;
    const uint8_t *rows[16];
    for (int i = 0; i < 16; i++) rows[i] = n0 + 16 * h + i < jb->N ? jb->w + (n0 + 16 * h + i) * K : NULL;
    const __m512 u8 = _mm512_set1_ps(0x1p8f);
    float *o = pt + 16 * h;
    for (int64_t c = c0; c < c1; c++, o += 4 * LG_NR_WIDE) {
        const float s = e8m0[st[c]];
        const int big = !(s <= 0x1p100f);
        const __m512 f = _mm512_set1_ps(big ? s : s * 0x1p8f);
        __m256i r[16];
        __m512i z[8];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) r[i] = rows[i] ? load_chunk(rows[i], c) : _mm256_setzero_si256();
        chunk_words16(r, z);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m512 d[4];
            dec_bias_wide(z[j], d);
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++)
                _mm512_storeu_ps(o + (j * run + p) * LG_NR_WIDE, _mm512_mul_ps(big ? _mm512_mul_ps(d[p], u8) : d[p], f));
        }
    }
}

/* 6 activation rows (a: a panel's [steps][6], one lane) × 16 weight rows
 * (b: [steps][16]): the lanes l [6][16] (rows ldl apart) start at zero
 * (first) or from l, and end in l. Rows past M are zeros in the panel (never
 * stored). The next panel's lanes (6 rows further) are prefetched: they sit
 * in L3 between runs. */
static AVX2 void lg_ukr(int64_t steps, const float *a, const float *b, float *l, int64_t ldl, int first) {
    __m256 c0[LG_MR], c1[LG_MR];
#pragma GCC unroll 6
    for (int m = 0; m < LG_MR; m++) _mm_prefetch((const char *)(l + (LG_MR + m) * ldl), _MM_HINT_T0);
#pragma GCC unroll 6
    for (int m = 0; m < LG_MR; m++) {
        c0[m] = first ? _mm256_setzero_ps() : _mm256_load_ps(l + m * ldl);
        c1[m] = first ? _mm256_setzero_ps() : _mm256_load_ps(l + m * ldl + 8);
    }
    for (int64_t s = 0; s < steps; s++) {
        const __m256 b0 = _mm256_load_ps(b + s * LG_NR), b1 = _mm256_load_ps(b + s * LG_NR + 8);
#pragma GCC unroll 6
        for (int m = 0; m < LG_MR; m++) {
            const __m256 av = _mm256_broadcast_ss(a + s * LG_MR + m);
            c0[m] = _mm256_fmadd_ps(av, b0, c0[m]);
            c1[m] = _mm256_fmadd_ps(av, b1, c1[m]);
        }
    }
#pragma GCC unroll 6
    for (int m = 0; m < LG_MR; m++) {
        _mm256_store_ps(l + m * ldl, c0[m]);
        _mm256_store_ps(l + m * ldl + 8, c1[m]);
    }
}

/* lg_ukr on 512-bit vectors: 6·np rows (np panels of 6, a[i]: [steps][6]
 * each, contiguous: a[1] = a[0] + 6·steps; their lanes 6·i·ldl further) ×
 * 32 weight rows (b: [steps][32]). The next call's panels, which follow,
 * are prefetched into L2 step by step: a block's activations (8 lanes ×
 * its rows × K/8 floats, megabytes) stream from the last-level cache, and
 * the kernel alone read them at 175-179 GFLOP/s against 197-207 from L2
 * (one thread of the 2-vCPU Xeon VM); prefetched one call ahead, whole FP8
 * products of 2,064 rows ran 3-9 % faster (medians, alternated in one
 * process: wq_a 165 -> 175, wkv 154 -> 168, wo_b 152 -> 157; 1,032 rows of
 * shared.w1 165 -> 172; bench/RESULTS.md, 2026-12-05). Same bits.
 * Two panels at once (24 accumulators; 12 broadcasts and the same two
 * weight loads a step for 24 FMAs rather than 6 and two for 12) measured
 * 2-13 % faster at 512 rows on one thread of a Xeon with AVX-512, 5-16 % on
 * two (bench/RESULTS.md, 2026-12-04); a row block's odd panel takes one. */
AVX512_INLINE void lg_ukr_wide(const int np, int64_t steps, const float *const *a, const float *b, float *l,
                               int64_t ldl, int first) {
    __m512 c0[2 * LG_MR], c1[2 * LG_MR];
#pragma GCC unroll 12
    for (int m = 0; m < np * LG_MR; m++) {
        _mm_prefetch((const char *)(l + (np * LG_MR + m) * ldl), _MM_HINT_T0);
        _mm_prefetch((const char *)(l + (np * LG_MR + m) * ldl + 16), _MM_HINT_T0);
    }
#pragma GCC unroll 12
    for (int m = 0; m < np * LG_MR; m++) {
        c0[m] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(l + m * ldl);
        c1[m] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(l + m * ldl + 16);
    }
    /* the next call's panels (they follow these: np·6 rows further) */
    const float *const next = a[0] + np * LG_MR * steps;
#pragma GCC unroll 2
    for (int64_t s = 0; s < steps; s++) {
        const __m512 b0 = _mm512_loadu_ps(b + s * LG_NR_WIDE), b1 = _mm512_loadu_ps(b + s * LG_NR_WIDE + 16);
        if (!(s & 1)) /* 48 bytes of each panel every other step: every line */
#pragma GCC unroll 2
            for (int i = 0; i < np; i++) _mm_prefetch((const char *)(next + i * LG_MR * steps + s * LG_MR), _MM_HINT_T1);
#pragma GCC unroll 12
        for (int m = 0; m < np * LG_MR; m++) {
            const __m512 av = _mm512_set1_ps(a[m / LG_MR][s * LG_MR + m % LG_MR]);
            c0[m] = _mm512_fmadd_ps(av, b0, c0[m]);
            c1[m] = _mm512_fmadd_ps(av, b1, c1[m]);
        }
    }
#pragma GCC unroll 12
    for (int m = 0; m < np * LG_MR; m++) {
        _mm512_storeu_ps(l + m * ldl, c0[m]);
        _mm512_storeu_ps(l + m * ldl + 16, c1[m]);
    }
}
static AVX512 void lg_ukr_wide1(int64_t steps, const float *const *a, const float *b, float *l, int64_t ldl,
                                int first) {
    lg_ukr_wide(1, steps, a, b, l, ldl, first);
}
static AVX512 void lg_ukr_wide2(int64_t steps, const float *const *a, const float *b, float *l, int64_t ldl,
                                int first) {
    lg_ukr_wide(2, steps, a, b, l, ldl, first);
}

/* The micro-kernels over rows [m, m1) of a row block (a panel of 6 at
 * am + i·ns for rows m + 6i; lanes at l, ldl apart): two panels at a time
 * on 512-bit vectors. Returns the rows taken (6 or 12). */
static int lg_ukr_rows(const lg_job *jb, int64_t m, int64_t m1, int64_t ns, const float *am, const float *b,
                       float *l, int64_t ldl, int first) {
    if (jb->nr != LG_NR_WIDE) {
        lg_ukr(ns, am, b, l, ldl, first);
        return LG_MR;
    }
    const float *a[2] = {am, am + LG_MR * ns};
    if (m + 2 * LG_MR <= m1) {
        lg_ukr_wide2(ns, a, b, l, ldl, first);
        return 2 * LG_MR;
    }
    lg_ukr_wide1(ns, a, b, l, ldl, first);
    return LG_MR;
}

/* Weight rows a decoding item: 8, or 16 where lg_decode_wide takes them. */
static int lg_item_rows(const lg_job *jb) { return jb->nr == LG_NR_WIDE ? 16 : 8; }

/* The current run of the column block's panels, decoded: items [i0, i1)
 * of lg_item_rows() weight rows each (panel i / per), so that many threads
 * share a column block's few panels. */
static void lg_decode_panels(void *ctx, int64_t i0, int64_t i1, int thread) {
    const lg_job *jb = ctx;
    const int gi = lg_item_rows(jb) / 8, per = jb->nr / 8 / gi;
    for (int64_t i = i0; i < i1; i++) {
        const int64_t q = i / per;
        const int g = (int)(i - q * per) * gi;
        lg_decode(jb, jb->n0 + q * jb->nr, g, g + gi, jb->s0, jb->ns, jb->bp + q * 8 * jb->run * jb->nr);
    }
}

/* The tree of kernels.h over 8 lanes of 8 outputs (lane j at p + j·ld, 32-byte
 * aligned) into o[0 .. n) (n <= 8). */
static AVX2 void lanes_tree8(const float *p, int64_t ld, float *o, int64_t n) {
    __m256 v[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) v[j] = _mm256_load_ps(p + j * ld);
    const __m256 t = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])),
                                   _mm256_add_ps(_mm256_add_ps(v[4], v[5]), _mm256_add_ps(v[6], v[7])));
    if (n >= 8) {
        _mm256_storeu_ps(o, t);
    } else {
        _Alignas(32) float tv[8];
        _mm256_store_ps(tv, t);
        for (int64_t i = 0; i < n; i++) o[i] = tv[i];
    }
}

/* Rows m .. m + 5 of the pass (those below M) × panel q: the tree of
 * kernels.h over the 8 lanes, 8 outputs at a time, into out. Called right
 * after a tile's last lane is final: the others were finished by the same
 * unit just before, and all sit in its cache. */
static AVX2 void lg_tree(const lg_job *jb, int64_t m, int64_t q) {
    const int64_t N = jb->N, n1 = jb->n0 + jb->nc;
    for (int64_t r = m; r < m + LG_MR && jb->m0 + r < jb->M; r++)
        for (int64_t c = q * jb->nr; c < (q + 1) * jb->nr && jb->n0 + c < n1; c += 8)
            lanes_tree8(jb->lb + r * LG_NC + c, jb->lbr * LG_NC, jb->out + (jb->m0 + r) * N + jb->n0 + c,
                        n1 - jb->n0 - c);
}

/* Units [u0, u1) of the current run: unit u = (row block, group of pg
 * panels). Lane by lane, the row block's run of that lane (from L2) meets
 * each panel of the group (from L1) in micro-kernels of 6 rows. */
static void lg_units(void *ctx, int64_t u0, int64_t u1, int thread) {
    const lg_job *jb = ctx;
    const int nr = jb->nr;
    const int64_t panels = (jb->nc + nr - 1) / nr, groups = (panels + jb->pg - 1) / jb->pg;
    const int64_t S = jb->K / 8, ns = jb->ns, L = jb->run;
    for (int64_t u = u0; u < u1; u++) {
        const int64_t rb = u / groups, g = u - rb * groups;
        const int64_t r0 = jb->m0 + rb * jb->mc, r1 = r0 + jb->mc < jb->m0 + jb->mo ? r0 + jb->mc : jb->m0 + jb->mo;
        const int64_t q0 = g * jb->pg, q1 = q0 + jb->pg < panels ? q0 + jb->pg : panels;
        const int last = jb->s0 + ns == S; /* the lanes' last run: lane 7 ends each tile */
        for (int j = 0; j < 8; j++) {
            const float *a = jb->ap + (j * S + jb->s0) * jb->Mp;
            float *lj = jb->lb + j * jb->lbr * LG_NC;
            for (int64_t q = q0; q < q1; q++) {
                const float *b = jb->bp + (q * 8 + j) * L * nr;
                for (int64_t m = r0, took; m < r1; m += took) {
                    float *l = lj + (m - jb->m0) * LG_NC + q * nr;
                    took = lg_ukr_rows(jb, m, r1, ns, a + m * ns, b, l, LG_NC, jb->s0 == 0);
                    if (last && j == 7)
                        for (int64_t t = m; t < m + took; t += LG_MR) lg_tree(jb, t - jb->m0, q);
                }
            }
        }
    }
}

/* ---- the same, one unit a group of panels and a block of rows ----
 * lg_run's passes each end in a barrier of the pool: a decoding pass and a
 * pass of units for every (column block, run), 30 of them for wq_a (5
 * column blocks × 3 runs), ~50 µs of work apiece at 64 rows on 16 cores,
 * where a barrier on a shared host can wait for a core that another
 * process holds (the 16-core Xeon of docs/gpu-notes.md run 104: FP8 at 64
 * rows 0.35-0.55 of OpenBLAS against MXFP4's 2.2-2.6, whose tiles take
 * one pass). Here a unit is a group of pg panels and a block of rows, from
 * the first step to the tree: it decodes its own runs into its thread's
 * scratch, runs the same micro-kernels over the block's rows, lane by
 * lane, run after run, and adds the lanes by the same tree: each output
 * the same chain of the same FMAs, so the same bits, in one pass of the
 * pool. The unit's decoded runs (<= 0.5 MB a panel) and lanes (8 × the
 * block's rows × pg·nr floats, <= 1 MB) stay in L2 from run to run, where
 * the passes' lanes and decoded column blocks go out to L3 between
 * passes: at 512 rows on the 2-vCPU Xeon VM this form ran the FP8
 * products at 1.05-1.06 of OpenBLAS on one thread and 1.00-1.04 on two,
 * the passes at 0.95-0.96 and 0.85-0.94 (bench/RESULTS.md, 2026-12-05).
 * A unit's lanes hold at most LG_FUSED_LANES rows × panels (at 2,048
 * rows in one block of two panels, its lanes out of L2, it ran at 0.76).
 * Up to LG_FUSED_LANES / 2 rows a unit takes two panels (the block's run
 * of a lane then meets the second from L2); past that, one panel, in one
 * block of up to LG_FUSED_LANES rows where all the activations fit
 * lg_act_budget() bytes (every unit streams its block's activations again:
 * from the last-level cache, which the 2-vCPU Xeon VM reads at 29-32
 * GB/s up to 32 MB, against 14 from DRAM), else in blocks of
 * LG_FUSED_LANES / 2. Each extra block decodes its panels' runs again,
 * and two panels a unit gain nothing once the block is not alone: at
 * 780-2,064 rows on one thread of that VM, these blocks of one panel ran
 * the four FP8 shapes up to 17 % faster than two panels and blocks of
 * 516 rows, the same within the spread on two (bench/RESULTS.md,
 * 2026-12-05). Where the panel groups are too few for the threads (~4
 * units a thread), rows are split into more blocks, down to blocks of
 * LG_MC rows. Past LG_MC rows only on 512-bit vectors (lg_run). */
enum {
    LG_FUSED_PG = 2,       /* panels a unit at most */
    LG_FUSED_LANES = 1032, /* a unit's rows × panels at most (a multiple of LG_MR) */
};
/* A core's L2 (level 2) or the last-level cache (3) in bytes, as sysconf
 * reports it, 0 where it does not; read once. (kernels.h) */
int64_t di_cpu_cache_bytes(int level) {
    static _Atomic int64_t memo[2] = {-1, -1};
    int64_t b = atomic_load_explicit(&memo[level - 2], memory_order_relaxed);
    if (b < 0) {
        long v = 0;
#if defined(_SC_LEVEL2_CACHE_SIZE) && defined(_SC_LEVEL3_CACHE_SIZE)
        v = sysconf(level == 2 ? _SC_LEVEL2_CACHE_SIZE : _SC_LEVEL3_CACHE_SIZE);
#endif
        b = v > 0 ? v : 0;
        atomic_store_explicit(&memo[level - 2], b, memory_order_relaxed);
    }
    return b;
}
/* Activation bytes for one block of more than LG_FUSED_LANES / 2 rows:
 * 24 MB (measured on that VM, whose cores see far less of the 480 MB its
 * CPUID reports), or half the last-level cache where that is smaller. */
static int64_t lg_act_budget(void) {
    const int64_t llc = di_cpu_cache_bytes(3), b = (int64_t)24 << 20;
    return llc > 0 && llc / 2 < b ? llc / 2 : b;
}

typedef struct lg_fused_job {
    lg_job jb;          /* half, nr, ap, w, ws, M, K, N, Mp, out, run (n0 = m0 = 0) */
    int64_t pg;         /* panels a unit */
    int64_t fr;         /* rows a block (a multiple of LG_MR) */
    int64_t groups;     /* panel groups: unit u is row block u / groups, group u % groups */
    float *scratch;     /* [threads][sf]: the unit's decoded runs [pg][8][run][nr], then its lanes [8][fr][pg·nr] */
    int64_t sf;
} lg_fused_job;

static void lg_fused_units(void *ctx, int64_t u0, int64_t u1, int thread) {
    const lg_fused_job *fj = ctx;
    const lg_job *jb = &fj->jb;
    const int nr = jb->nr;
    const int64_t S = jb->K / 8, L = jb->run, Mp = jb->Mp, N = jb->N, panels = (N + nr - 1) / nr;
    const int64_t ldl = fj->pg * nr;
    float *bp = fj->scratch + thread * fj->sf, *lb = bp + fj->pg * 8 * L * nr;
    for (int64_t u = u0; u < u1; u++) {
        const int64_t rb = u / fj->groups, q0 = (u % fj->groups) * fj->pg;
        const int64_t q1 = q0 + fj->pg < panels ? q0 + fj->pg : panels;
        const int64_t r0 = rb * fj->fr, r1 = r0 + fj->fr < Mp ? r0 + fj->fr : Mp, nrows = r1 - r0;
        for (int64_t s0 = 0; s0 < S; s0 += L) {
            const int64_t ns = S - s0 < L ? S - s0 : L;
            for (int64_t q = q0; q < q1; q++) lg_decode(jb, q * nr, 0, nr / 8, s0, ns, bp + (q - q0) * 8 * L * nr);
            for (int j = 0; j < 8; j++) {
                const float *a = jb->ap + (j * S + s0) * Mp;
                for (int64_t q = q0; q < q1; q++) {
                    const float *b = bp + ((q - q0) * 8 + j) * L * nr;
                    for (int64_t m = r0; m < r1;)
                        m += lg_ukr_rows(jb, m, r1, ns, a + m * ns, b,
                                         lb + (j * nrows + m - r0) * ldl + (q - q0) * nr, ldl, s0 == 0);
                }
            }
        }
        /* lg_tree's sums, from this unit's lanes */
        const int64_t c1 = q1 * nr < N ? q1 * nr : N;
        for (int64_t r = r0; r < r1 && r < jb->M; r++)
            for (int64_t c = q0 * nr; c < c1; c += 8)
                lanes_tree8(lb + (r - r0) * ldl + (c - q0 * nr), nrows * ldl, jb->out + r * N + c, c1 - c);
    }
}

static int lg_run(int half, const uint8_t *qa, const float *sa, int64_t M, int64_t K, const uint8_t *w,
                  const uint8_t *ws, int64_t N, float *out, di_threadpool *tp) {
    const int threads = di_threadpool_size(tp);
    const int64_t S = K / 8, L = lg_run_steps(S), Mp = (M + LG_MR - 1) / LG_MR * LG_MR;
    const int nr = di_cpu_kernels_wide() ? LG_NR_WIDE : LG_NR;
    /* the one-pass form: panels a unit (~4 units a thread where the panels
     * allow; one past LG_FUSED_LANES / 2 rows), rows a block (as few blocks
     * as the lanes and the activations' bytes allow, more where the units
     * would be fewer than ~4 a thread, none below LG_MC rows), each
     * thread's scratch */
    const int64_t panels = (N + nr - 1) / nr;
    int64_t pg = panels / (4 * threads);
    pg = pg < 1 || Mp > LG_FUSED_LANES / LG_FUSED_PG ? 1 : pg > LG_FUSED_PG ? LG_FUSED_PG : pg;
    const int64_t groups = (panels + pg - 1) / pg;
    const int64_t act = Mp * K * (int64_t)sizeof(float);
    const int64_t rows_max = pg == 1 && act <= lg_act_budget() ? LG_FUSED_LANES : LG_FUSED_LANES / LG_FUSED_PG;
    int64_t nrb = (Mp + rows_max - 1) / rows_max;
    if (nrb * groups < 4 * threads) {
        const int64_t most = Mp / LG_MC > 1 ? Mp / LG_MC : 1, want = (4 * threads + groups - 1) / groups;
        const int64_t more = want < most ? want : most;
        if (more > nrb) nrb = more;
    }
    const int64_t fr = ((Mp + nrb - 1) / nrb + LG_MR - 1) / LG_MR * LG_MR;
    const int64_t sf = (pg * 8 * L * nr + 8 * fr * pg * nr + 15) / 16 * 16;
    /* the one-pass form up to LG_MC rows, at every size on 512-bit
     * vectors, and on 256-bit ones where a unit's scratch (sf floats: its
     * decoded runs and its lanes, ~0.8 MB at 512 rows) fits the core's L2;
     * the passes elsewhere (AMD Zen 2-3 cores have 512 KB). On the 2-vCPU
     * Xeon VM (2 MB of L2) with its 512-bit kernels forced off, against
     * the passes, ours / OpenBLAS sgemm (Haswell kernels) alternated twice:
     * one thread wq_a at 512 rows 0.91-0.92 -> 0.96-0.97, wkv 0.90-0.92 ->
     * 0.97-0.99, 1,032 rows the same (0.90-0.91); two threads wq_a 256
     * rows 0.86 -> 0.99-1.05, 512 rows 0.89-0.90 -> 0.97-1.00, 780 rows
     * 0.86-0.88 -> 0.91-0.93, shared.w1 0.87-0.93 -> 0.96-0.98
     * (bench/RESULTS.md, 2026-12-05). */
    const int fused = (Mp <= LG_MC || nr == LG_NR_WIDE || sf * (int64_t)sizeof(float) <= di_cpu_cache_bytes(2)) &&
                      di_cpu_kernels_lg_fused();
    /* the passes: a column block's decoded runs, the lanes of a pass */
    const int64_t lbr = Mp < LG_MO ? Mp : LG_MO, bpf = (int64_t)LG_NC * 8 * L, lbf = 8 * lbr * LG_NC;
    const int64_t apf = (Mp * K + 15) / 16 * 16; /* whole 64-byte lines: what follows stays aligned */
    int own = 0;
    float *buf = di_cpu_kept_buffer((size_t)(apf + (fused ? threads * sf : bpf + lbf)) * sizeof(float), &own);
    float *ap = buf ? pack_lanes(qa, sa, M, K, K, 1.0f, NULL, half, 1, buf, tp) : NULL;
    if (!ap) {
        if (own) free(buf);
        return 0;
    }
    lg_job jb = {.half = half, .nr = nr, .ap = ap, .w = w, .ws = ws, .M = M, .K = K, .N = N, .Mp = Mp,
                 .out = out, .run = L};
    if (fused) {
        lg_fused_job fj = {.jb = jb, .pg = pg, .fr = fr, .groups = groups, .scratch = buf + apf, .sf = sf};
        di_threadpool_for(tp, (Mp + fr - 1) / fr * groups, 1, lg_fused_units, &fj);
        if (own) free(buf);
        return 1;
    }
    jb.bp = buf + apf;
    jb.lb = jb.bp + bpf;
    jb.lbr = lbr;
    for (jb.m0 = 0; jb.m0 < Mp; jb.m0 += LG_MO) {
        jb.mo = Mp - jb.m0 < LG_MO ? Mp - jb.m0 : LG_MO;
        /* row blocks of LG_MC rows, or fewer where many threads would
         * otherwise share a few (row block, panel) units */
        const int64_t full = LG_NC / jb.nr, want = 2 * threads;
        jb.mc = LG_MC;
        if ((jb.mo + LG_MC - 1) / LG_MC * full < want) {
            const int64_t blocks = (want + full - 1) / full, mc = (jb.mo / LG_MR + blocks - 1) / blocks * LG_MR;
            jb.mc = mc < LG_MR ? LG_MR : mc;
        }
        const int64_t rblocks = (jb.mo + jb.mc - 1) / jb.mc;
        for (jb.n0 = 0; jb.n0 < N; jb.n0 += LG_NC) {
            jb.nc = N - jb.n0 < LG_NC ? N - jb.n0 : LG_NC;
            const int64_t panels = (jb.nc + jb.nr - 1) / jb.nr;
            /* panels a unit: as many as keep ~4 units a thread, so the A
             * block is reused across several panels yet no thread idles */
            int64_t pg = rblocks * panels / (4 * threads);
            pg = pg < 1 ? 1 : pg > panels ? panels : pg;
            /* groups of equal size (16 panels in groups of at most 12: two
             * of 8, not 12 and 4), so that no pass ends on a thread alone
             * with a large unit */
            const int64_t groups = (panels + pg - 1) / pg;
            jb.pg = (panels + groups - 1) / groups;
            const int64_t units = rblocks * groups;
            /* decoding items: whole panels unless threads outnumber them */
            const int64_t per = jb.nr / lg_item_rows(&jb), dgrain = panels >= threads ? per : 1;
            for (jb.s0 = 0; jb.s0 < S; jb.s0 += L) {
                jb.ns = S - jb.s0 < L ? S - jb.s0 : L;
                di_threadpool_for(tp, panels * per, dgrain, lg_decode_panels, &jb);
                di_threadpool_for(tp, units, 1, lg_units, &jb);
            }
        }
    }
    if (own) free(buf);
    return 1;
}

/* ---- decode rows ---- */

typedef struct dec_job {
    const uint8_t *qa;      /* for the scalar fallback */
    const float *sa;
    const float *ap;        /* [M][Kp]: a(k) */
    const float *bmax;      /* [K/32] max |a| over the rows per block */
    const float *smin;      /* [K/32] min sa over the rows per block */
    int half;               /* decode through F16C (see use_half()) */
    int R;                  /* weight rows a group: dec_rows(M, half, ks > 0) */
    int bias;               /* on 512-bit vectors, codes by the exponent bias (dec_bias_wide) */
    int pf;                 /* software prefetches: the group two ahead, the next segment (dec_group) */
    atomic_int *bias_heavy; /* set once a unit's codes took its table often: F16C for the rest */
    const uint8_t *w, *ws;
    int64_t M, K, Kp, N;
    float *out;             /* [M, N] */
    float *scratch;         /* [threads][scratch_floats]: folded activations [M][Kp] (seg_units: see there) */
    int64_t scratch_floats;
    int64_t ks;             /* the segmented form (seg_units): chunks a segment; else 0 */
} dec_job;

/* Weight rows at a time for M activation rows: R·mr accumulators for blocks
 * of mr <= DEC_MB activation rows. Every activation load feeds R FMAs (the
 * activations of a few rows already exceed L1), every decoded weight vector
 * mr FMAs; R·mr <= 8 leaves registers for the decoding (12 spilled). */
static int dec_rows_for(int64_t M) { return M == 1 ? 8 : M == 2 ? 4 : 2; }
/* On 512-bit vectors two rows share a register: 8 rows for one or two
 * activation rows on every route (at two rows 8 streams read 16-20 %
 * faster from DRAM than 4 on the 2-vCPU Xeon VM, bench/RESULTS.md
 * 2026-12-05), 4 for blocks of up to 4 on the F16C route and in the
 * segmented form (seg: it runs), 2 a block on the shift route (AMD cores
 * with AVX-512) otherwise. */
static int dec_rows(int64_t M, int half, int seg) {
    if (!di_cpu_kernels_wide()) return dec_rows_for(M);
    if (M <= 2) return 8;
    return half || seg ? 4 : dec_rows_for(M);
}
static int dec_block_rows(int64_t M) { return M <= 2 ? (int)M : 4; }

/* One chunk of dec_kernel(). X: 0, or a span of X scale tiles (dec_span:
 * row r lies in tile r·X/8, whose folded activations start ta floats
 * after the previous tile's). */
#define DEC_TA(r) ((X) ? (r) * (X) / 8 * ta : 0)
AVX2_INLINE void dec_chunk(const int mr, const int R, const int half, const int X, int64_t c,
                           const uint8_t *const *rows, const float *a, int64_t lda, int64_t ta,
                           __m256 acc[DEC_MB][8]) {
    if (half) { /* a row's four positions at once (dec_half) */
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
            if (r < R) {
                __m256 d[4];
                dec_half(load_chunk(rows[r], c), d);
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++)
#pragma GCC unroll 8
                    for (int m = 0; m < DEC_MB; m++)
                        if (m < mr)
                            acc[m][r] = _mm256_fmadd_ps(_mm256_load_ps(a + DEC_TA(r) + m * lda + c * 32 + 8 * p),
                                                        d[p], acc[m][r]);
            }
        return;
    }
    __m256i xr[2];
#pragma GCC unroll 2
    for (int r = 0; r < 2; r++)
        if (R <= 2 && r < R) xr[r] = load_chunk(rows[r], c);
    if (R >= 4) { /* see dec_pair() */
        __m256 hold[2][8];
#pragma GCC unroll 2
        for (int p = 0; p < 2; p++) {
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                if (r < R) {
                    const __m256 v = dec_pair(load_chunk(rows[r], c), p, &hold[p][r]);
#pragma GCC unroll 8
                    for (int m = 0; m < DEC_MB; m++)
                        if (m < mr)
                            acc[m][r] = _mm256_fmadd_ps(_mm256_load_ps(a + DEC_TA(r) + m * lda + c * 32 + 8 * p), v,
                                                        acc[m][r]);
                }
            __asm__ volatile("" ::: "memory"); /* reload the chunks, see below */
        }
#pragma GCC unroll 2
        for (int p = 2; p < 4; p++)
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                if (r < R)
#pragma GCC unroll 8
                    for (int m = 0; m < DEC_MB; m++)
                        if (m < mr)
                            acc[m][r] = _mm256_fmadd_ps(_mm256_load_ps(a + DEC_TA(r) + m * lda + c * 32 + 8 * p),
                                                        hold[p - 2][r], acc[m][r]);
        return;
    }
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++)
#pragma GCC unroll 2
        for (int r = 0; r < 2; r++)
            if (r < R) {
                const __m256 v = dec_pos(xr[r], p);
#pragma GCC unroll 8
                for (int m = 0; m < DEC_MB; m++)
                    if (m < mr)
                        acc[m][r] = _mm256_fmadd_ps(_mm256_load_ps(a + DEC_TA(r) + m * lda + c * 32 + 8 * p), v,
                                                    acc[m][r]);
            }
}
#undef DEC_TA

/* R weight rows (rowp[r]) × mr activation rows (a, stride lda, the tile's
 * scales folded in) over all chunks; res[m·8 + r] gets the outputs. ahead
 * (or NULL): the R rows to prefetch alongside, R·32 bytes per chunk. R >= 4
 * reloads each chunk (from L1) for every position rather than keeping it in
 * R registers next to the R·mr accumulators, which would spill them
 * (copying the chunks to an aligned buffer first, against loads that split
 * cache lines on misaligned rows, measured slower); R <= 2 keeps them in
 * registers. */
AVX2_INLINE void dec_kernel(const int mr, const int R, const int half, const int X, int64_t chunks,
                            const uint8_t *const *rowp, const uint8_t *ahead, const float *a,
                            int64_t lda, int64_t ta, float *res) {
    __m256 acc[DEC_MB][8];
    const uint8_t *rows[8]; /* in registers: not reloaded after each barrier */
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) rows[r] = r < R ? rowp[r] : NULL;
#pragma GCC unroll 8
    for (int m = 0; m < DEC_MB; m++)
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
            if (m < mr && r < R) acc[m][r] = _mm256_setzero_ps();
    if (X) /* a span (dec_kernel_wide): each row's stream DEC_SPAN_PF bytes ahead, a line a row every other chunk */
        for (int64_t c0 = 0; c0 < chunks; c0 += 2)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const int64_t c = c0 + h;
                if (h && c >= chunks) break;
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++)
                    _mm_prefetch((const char *)rows[r + 4 * !h] + c * 32 + DEC_SPAN_PF, _MM_HINT_T1);
                dec_chunk(mr, R, half, X, c, rows, a, lda, ta, acc);
            }
    else if (ahead)
        for (int64_t c = 0; c < chunks; c++) {
#pragma GCC unroll 4
            for (int r = 0; r < R; r += 2) _mm_prefetch((const char *)ahead + (c * R + r) * 32, _MM_HINT_T1);
            dec_chunk(mr, R, half, 0, c, rows, a, lda, 0, acc);
        }
    else
        for (int64_t c = 0; c < chunks; c++) dec_chunk(mr, R, half, 0, c, rows, a, lda, 0, acc);
#pragma GCC unroll 8
    for (int m = 0; m < DEC_MB; m++)
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
            if (m < mr && r < R) {
                float l[8];
                _mm256_storeu_ps(l, acc[m][r]);
                res[m * 8 + r] = tree1(l);
            }
}

typedef void (*dec_kernel_fn)(int64_t chunks, const uint8_t *const *rows, const uint8_t *ahead,
                              const float *a, int64_t lda, float *res);
#define DEC_KERNEL_FN(mr, R, half, name)                                                       \
    static AVX2 void name(int64_t chunks, const uint8_t *const *rows, const uint8_t *ahead,    \
                          const float *a, int64_t lda, float *res) {                          \
        dec_kernel(mr, R, half, 0, chunks, rows, ahead, a, lda, 0, res);                       \
    }
/* both decodings: dec_kernel_<mr>_<R> (shifts) and dec_kernel_<mr>_<R>h (F16C) */
#define DEC_KERNEL_FNS(mr, R)                                                                  \
    DEC_KERNEL_FN(mr, R, 0, dec_kernel_##mr##_##R)                                             \
    DEC_KERNEL_FN(mr, R, 1, dec_kernel_##mr##_##R##h)
DEC_KERNEL_FNS(1, 8)
DEC_KERNEL_FNS(2, 4)
DEC_KERNEL_FNS(1, 2)
DEC_KERNEL_FNS(2, 2)
DEC_KERNEL_FNS(3, 2)
DEC_KERNEL_FNS(4, 2)
/* ---- decode rows on 512-bit vectors (the F16C route) ----
 * Two weight rows a register: row 2i's chunk in the low 256 bits, row
 * 2i+1's in the high ones, so lanes 0-7 carry row 2i's eight chains and
 * 8-15 row 2i+1's, each through the same FMAs in the same order as
 * dec_kernel (same bits), at half the instructions per code (~10 % faster
 * in L2 on a Xeon: 512-bit vector work has two ports where 256-bit work
 * has three; AMD cores take the shift route, unchanged). The bytes are
 * sorted as dec_half sorts them, but the dword permute crosses the whole
 * register so that each 256-bit half of the unpacked words holds one word
 * position of both rows: [row 2i | row 2i+1] of positions 0 and 2 (low
 * unpack), 1 and 3 (high), one conversion each from memory. */
AVX512_INLINE void dec_half_wide(__m512i x, __m512 out[4]) {
    const __m512i bypos = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    const __m512i perm = _mm512_setr_epi32(0, 4, 1, 5, 8, 12, 9, 13, 2, 6, 3, 7, 10, 14, 11, 15);
    const __m512i mask = _mm512_set1_epi16((short)0xbf80), zero = _mm512_setzero_si512();
    const __m512i v = _mm512_permutexvar_epi32(perm, _mm512_shuffle_epi8(x, bypos));
    const __m512i lo = _mm512_and_si512(_mm512_srai_epi16(_mm512_unpacklo_epi8(zero, v), 1), mask);
    const __m512i hi = _mm512_and_si512(_mm512_srai_epi16(_mm512_unpackhi_epi8(zero, v), 1), mask);
    __m512i buf[2];
    _mm512_storeu_si512(buf, lo), _mm512_storeu_si512(buf + 1, hi);
    const __m256i *h = (const __m256i *)buf; /* positions 0, 2, 1, 3 */
    __asm__("vcvtph2ps %1, %0" : "=v"(out[0]) : "m"(h[0]));
    __asm__("vcvtph2ps %1, %0" : "=v"(out[2]) : "m"(h[1]));
    __asm__("vcvtph2ps %1, %0" : "=v"(out[1]) : "m"(h[2]));
    __asm__("vcvtph2ps %1, %0" : "=v"(out[3]) : "m"(h[3]));
}

/* The shift decoding (dec_pair) of two rows' chunks at once, x = [row 2i |
 * row 2i+1]: out[p] holds position p of both, as dec_half_wide's, as fp32
 * w·2^-120 (the 512-bit decode rows of AMD cores with AVX-512). */
AVX512_INLINE void dec_shift_wide(__m512i x, __m512 out[4]) {
    const __m512i mask = _mm512_set1_epi32((int)0x87f00000u);
#pragma GCC unroll 2
    for (int p = 0; p < 2; p++) {
        const __m512i v = _mm512_srai_epi16(p ? x : _mm512_slli_epi16(x, 8), 4);
        out[p + 2] = _mm512_castsi512_ps(_mm512_and_si512(v, mask));
        out[p] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(v, 16), mask));
    }
}

/* The decode rows on 512-bit vectors (dec_kernel_wide):
 * the row pointers in registers and the accumulators [m][row pair] at zero;
 * at the end each row's eight chains (a register's half) through the tree. */
AVX512_INLINE void dec_wide_begin(const int mr, const int R, const uint8_t *const *rowp, const uint8_t *rows[8],
                                  __m512 acc[DEC_MB][4]) {
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) rows[r] = r < R ? rowp[r] : NULL;
#pragma GCC unroll 4
    for (int m = 0; m < DEC_MB; m++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            if (m < mr && 2 * i < R) acc[m][i] = _mm512_setzero_ps();
}
AVX512_INLINE void dec_wide_end(const int mr, const int R, __m512 acc[DEC_MB][4], float *res) {
#pragma GCC unroll 4
    for (int m = 0; m < DEC_MB; m++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            if (m < mr && 2 * i < R) {
                float l[16];
                _mm512_storeu_ps(l, acc[m][i]);
                res[m * 8 + 2 * i] = tree1(l);
                res[m * 8 + 2 * i + 1] = tree1(l + 8);
            }
}

/* how the 512-bit kernels decode E4M3 codes (see dec_kernel_wide) */
enum { DEC_F16C, DEC_BIAS, DEC_SHIFT };
/* dec_kernel on 512-bit vectors for R = 8 weight rows and one or two
 * activation rows or R = 4 (two registers) and mr <= 4 activation rows;
 * the activations of a chunk are loaded once for all the row pairs, each
 * 8-lane vector into both halves. The codes decode by the exponent bias
 * (dm DEC_BIAS, dec_bias_wide), through F16C (DEC_F16C, dec_half_wide) or
 * by shifts (DEC_SHIFT, dec_shift_wide: the activations carry sw·2^120,
 * the others sw·2^8): the same products. Returns the row pairs' chunks
 * that took dec_bias_wide's table. On a Zen 4 core the shift form at one
 * and two rows runs 5-15 % ahead of the 256-bit dec_kernel, 20-23 GB/s
 * at one row with the weights in L2 (wo_b's rows 8 KB apart too). */
/* Pair i's chunk c: row 2i's codes in the low half, row 2i + 1's in the high. */
AVX512_INLINE __m512i load_pair(const uint8_t *const *rows, int i, int64_t c) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(load_chunk(rows[2 * i], c)), load_chunk(rows[2 * i + 1], c), 1);
}
AVX512_INLINE int dec_kernel_wide(const int mr, const int R, const int dm, const int X, int64_t chunks,
                                  const uint8_t *const *rowp, const uint8_t *ahead, const float *a, int64_t lda,
                                  int64_t ta, float *res) {
    const int T = X ? X : 1; /* the tiles the rows lie in */
    int nsub = 0;
    __m512 acc[DEC_MB][4];
    const uint8_t *rows[8];
    dec_wide_begin(mr, R, rowp, rows, acc);
    /* two chunks a turn, so a span's prefetches (a line a row every other
     * chunk) name their rows without arithmetic; at one activation row by
     * the bias, one test of all the row pairs' codes for exponent 0 a chunk
     * (the table's fix then pair by pair), not a test and a branch a pair:
     * a span's 8 rows in L2 read 21.9-24.8 -> 24.9-26.0 GB/s, 8 rows of one
     * activation row outside spans 2-3 % faster, 4 rows of 4 activation
     * rows 5-9 % (bench/RESULTS.md 2026-12-05); two activation rows keep
     * the test a pair (the early loads measured 2-3 % slower there) */
    for (int64_t c0 = 0; c0 < chunks; c0 += 2)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const int64_t c = c0 + h;
            if (h && c >= chunks) break;
            if (ahead)
#pragma GCC unroll 4
                for (int r = 0; r < R; r += 2) _mm_prefetch((const char *)ahead + (c * R + r) * 32, _MM_HINT_T1);
            if (X) /* a span: each row's stream DEC_SPAN_PF bytes ahead, a line a row every other chunk */
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) _mm_prefetch((const char *)rows[r + 4 * !h] + c * 32 + DEC_SPAN_PF, _MM_HINT_T1);
            /* one activation row: every pair's codes loaded first, one test */
            const int early = mr == 1;
            __m512i x[4];
            __mmask64 sub = 0;
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                if (early && 2 * i < R) {
                    x[i] = load_pair(rows, i, c);
                    if (dm == DEC_BIAS) sub = _kor_mask64(sub, dec_bias_subs(x[i]));
                }
            __m512 av[DEC_MB][4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                if (2 * i < R) {
                    if (!early) {
                        x[i] = load_pair(rows, i, c);
                        if (dm == DEC_BIAS) sub = dec_bias_subs(x[i]);
                    }
                    if (i % (4 / T) == 0) /* a span of T tiles: pair i's rows lie in tile i·T/4 */
#pragma GCC unroll 4
                        for (int m = 0; m < DEC_MB; m++)
#pragma GCC unroll 4
                            for (int p = 0; p < 4; p++)
                                if (m < mr)
                                    av[m][p] = _mm512_broadcast_f32x8(
                                        _mm256_load_ps(a + i * T / 4 * ta + m * lda + c * 32 + 8 * p));
                    __m512 d[4];
                    if (dm == DEC_BIAS) {
                        if (__builtin_expect(sub != 0, 0)) nsub += dec_bias_wide(x[i], d);
                        else {
                            __m512i w[4];
                            dec_bias_normal(x[i], w);
#pragma GCC unroll 4
                            for (int p = 0; p < 4; p++) d[p] = _mm512_castsi512_ps(w[p]);
                        }
                    } else if (dm == DEC_SHIFT) dec_shift_wide(x[i], d);
                    else dec_half_wide(x[i], d);
#pragma GCC unroll 4
                    for (int p = 0; p < 4; p++)
#pragma GCC unroll 4
                        for (int m = 0; m < DEC_MB; m++)
                            if (m < mr) acc[m][i] = _mm512_fmadd_ps(av[m][p], d[p], acc[m][i]);
                }
        }
    dec_wide_end(mr, R, acc, res);
    return nsub;
}

/* the F16C forms (w) and the exponent-bias forms (x, the count of chunks
 * that took the table): R = 8 rows for one or two activation rows, 4 rows
 * for blocks of 1 to 4 of a larger batch */
#define DEC_WIDE_FNS(mr, R)                                                                              \
    static AVX512 void dec_kernel_##mr##_##R##w(int64_t chunks, const uint8_t *const *rows,             \
                                                const uint8_t *ahead, const float *a, int64_t lda,       \
                                                float *res) {                                            \
        dec_kernel_wide(mr, R, DEC_F16C, 0, chunks, rows, ahead, a, lda, 0, res);                       \
    }                                                                                                    \
    static AVX512 int dec_kernel_##mr##_##R##x(int64_t chunks, const uint8_t *const *rows,              \
                                               const uint8_t *ahead, const float *a, int64_t lda,        \
                                               float *res) {                                             \
        return dec_kernel_wide(mr, R, DEC_BIAS, 0, chunks, rows, ahead, a, lda, 0, res);                \
    }
DEC_WIDE_FNS(1, 8)
DEC_WIDE_FNS(2, 8)
/* the shift forms (s) of AMD cores with AVX-512: 8 rows for one or two
 * activation rows (two: 8 accumulators of 16 chains, where the 256-bit
 * kernel's 4 rows had 8 of 8) */
#define DEC_SHIFT_WIDE_FN(mr)                                                                            \
    static AVX512 void dec_kernel_##mr##_8s(int64_t chunks, const uint8_t *const *rows,                 \
                                            const uint8_t *ahead, const float *a, int64_t lda,           \
                                            float *res) {                                                \
        dec_kernel_wide(mr, 8, DEC_SHIFT, 0, chunks, rows, ahead, a, lda, 0, res);                      \
    }
DEC_SHIFT_WIDE_FN(1)
DEC_SHIFT_WIDE_FN(2)
DEC_WIDE_FNS(1, 4)
DEC_WIDE_FNS(2, 4)
DEC_WIDE_FNS(3, 4)
DEC_WIDE_FNS(4, 4)
/* The 8-row kernels for one activation row over a span of X = DEC_SPAN
 * scale tiles (dec_span): pair i's rows lie in tile i·X/4, whose folded
 * activations start ta floats after the previous tile's; by the exponent
 * bias (x, returning dec_bias_wide's table count), through F16C (w) or by
 * shifts (s). */
typedef int (*dec_span_fn)(int64_t chunks, const uint8_t *const *rows, const float *a, int64_t lda, int64_t ta,
                           float *res);
#define DEC_SPAN_FNS(mr, X)                                                                                  \
    static AVX512 int dec_span_##mr##x##X(int64_t chunks, const uint8_t *const *rows, const float *a,       \
                                          int64_t lda, int64_t ta, float *res) {                            \
        return dec_kernel_wide(mr, 8, DEC_BIAS, X, chunks, rows, NULL, a, lda, ta, res);                    \
    }                                                                                                        \
    static AVX512 int dec_span_##mr##w##X(int64_t chunks, const uint8_t *const *rows, const float *a,       \
                                          int64_t lda, int64_t ta, float *res) {                            \
        dec_kernel_wide(mr, 8, DEC_F16C, X, chunks, rows, NULL, a, lda, ta, res);                           \
        return 0;                                                                                            \
    }                                                                                                        \
    static AVX512 int dec_span_##mr##s##X(int64_t chunks, const uint8_t *const *rows, const float *a,       \
                                          int64_t lda, int64_t ta, float *res) {                            \
        dec_kernel_wide(mr, 8, DEC_SHIFT, X, chunks, rows, NULL, a, lda, ta, res);                          \
        return 0;                                                                                            \
    }
DEC_SPAN_FNS(1, 4)
DEC_SPAN_FNS(1, 2)
DEC_SPAN_FNS(1, 1)
/* The same on 256-bit vectors (dec_kernel's span form: 8 rows of one
 * activation row, row r in tile r·X/8), through F16C (h) or by shifts
 * (p): what CPUs without AVX-512 run. One row from DRAM on the 2-vCPU
 * Xeon VM with the 512-bit kernels forced off, against the rows spread
 * within each unit (alternated twice): one thread 12.2-13.3 -> 13.3-13.9
 * GB/s, two 23.2-24.9 -> 25.0-27.2 (bench/RESULTS.md 2026-12-05). */
#define DEC_SPAN_NARROW_FNS(X)                                                                               \
    static AVX2 int dec_span_1h##X(int64_t chunks, const uint8_t *const *rows, const float *a, int64_t lda,   \
                                   int64_t ta, float *res) {                                                 \
        dec_kernel(1, 8, 1, X, chunks, rows, NULL, a, lda, ta, res);                                         \
        return 0;                                                                                            \
    }                                                                                                        \
    static AVX2 int dec_span_1p##X(int64_t chunks, const uint8_t *const *rows, const float *a, int64_t lda,   \
                                   int64_t ta, float *res) {                                                 \
        dec_kernel(1, 8, 0, X, chunks, rows, NULL, a, lda, ta, res);                                         \
        return 0;                                                                                            \
    }
DEC_SPAN_NARROW_FNS(4)
DEC_SPAN_NARROW_FNS(2)
DEC_SPAN_NARROW_FNS(1)
/* spans of x = 4, 2 or 1 tiles, by the bias, F16C or shifts, as
 * dec_kernel_for picks the routes */
static dec_span_fn dec_span_for(int bias, int half, int64_t x) {
    if (!di_cpu_kernels_wide()) {
        static const dec_span_fn narrow[2][3] = {{dec_span_1p1, dec_span_1p2, dec_span_1p4},
                                                 {dec_span_1h1, dec_span_1h2, dec_span_1h4}};
        return narrow[half != 0][x == 4 ? 2 : x == 2 ? 1 : 0];
    }
    static const dec_span_fn fns[3][3] = {{dec_span_1x1, dec_span_1x2, dec_span_1x4},
                                          {dec_span_1w1, dec_span_1w2, dec_span_1w4},
                                          {dec_span_1s1, dec_span_1s2, dec_span_1s4}};
    return fns[bias ? 0 : half ? 1 : 2][x == 4 ? 2 : x == 2 ? 1 : 0];
}

typedef int (*dec_bias_fn)(int64_t chunks, const uint8_t *const *rows, const uint8_t *ahead, const float *a,
                           int64_t lda, float *res);
static dec_bias_fn dec_bias_for(int64_t M, int mr) {
    static const dec_bias_fn r4[5] = {0, dec_kernel_1_4x, dec_kernel_2_4x, dec_kernel_3_4x, dec_kernel_4_4x};
    return M == 1 ? dec_kernel_1_8x : M == 2 ? dec_kernel_2_8x : r4[mr];
}

/* ---- decode rows of 3 to 16 activation rows, in segments ----
 * dec_kernel and dec_kernel_wide read a chunk's activations for every
 * weight group: at 4 rows of K = 5,120 that is 80 KB, more than L1 holds,
 * so each group of 2 or 4 weight rows streamed its activations from L2
 * again (4 rows, weights in L2, one thread of the 2-vCPU Xeon: 9.1 GB/s at
 * K 1,024, whose 16 KB stay in L1; 6.2 at K 5,120). Here a unit of 32
 * weight rows goes through K in segments whose folded activations (all M
 * rows, <= SEG_ACT floats) stay in L1 while the unit's groups meet them;
 * each group's chains pause in a buffer between segments, so every output
 * is the same sequence of FMAs (same bits). On 512-bit vectors blocks of
 * up to SEG_MB rows share each decoded chunk (dec_kernel_wide: up to 4):
 * the decoding, about a third of a chunk's vector work at 4 rows, weighs
 * half as much at 8. AMD cores with AVX-512 (Zen 4: 512-bit work on 256-bit
 * units) take these kernels too, decoding by shifts: their 16 chains an
 * activation row pair, against the 256-bit kernels' 8, keep both FMA
 * pipes fed (one Zen 4 core, shared.w1 and wq_a / wo_b: 3 rows 51-59
 * GFLOP/s against 37-50, 6 rows 69-77 against 43-56, 8 rows 68-81 against
 * 52-69, 16 rows the same). A unit's rows are read in pieces of a
 * segment, which the hardware prefetchers follow poorly: each group
 * prefetches its next segment into L2 (the unit's own rows: with many
 * threads the next unit is usually another thread's). */
enum { SEG_FROM = 3, SEG_MB = 8, SEG_ACT = 4096, SEG_MIN = 4 };
/* The decode calls that measure the prefetch choice (dec_run): at least
 * this many weight bytes, so that a call's time is mostly its reads. */
enum { PF_MIN_BYTES = 1 << 20 };
/* 1: the decode rows keep to blocks over all of K (tests, benchmarks) */
static atomic_int seg_forced_off;
void di_cpu_kernels_force_no_seg(int on) { atomic_store(&seg_forced_off, on != 0); }
static atomic_long seg_units_run;
long di_cpu_kernels_seg_units(void) { return atomic_load(&seg_units_run); }

/* Chunks a segment for M rows: activations <= SEG_ACT floats, at least
 * SEG_MIN chunks, the segments of a row as equal as whole chunks allow
 * (the last may be shorter). */
static int64_t seg_chunks(int64_t M, int64_t chunks) {
    int64_t ks = SEG_ACT / (32 * M);
    ks = ks < SEG_MIN ? SEG_MIN : ks;
    const int64_t nseg = (chunks + ks - 1) / ks;
    return (chunks + nseg - 1) / nseg;
}

/* Chunk c of a segment of nr weight rows: every other chunk, a line of each
 * row ahead bytes on into L2 (the next segment, which the hardware
 * prefetchers do not foresee; ahead 0: none). */
AVX2_INLINE void seg_prefetch(const uint8_t *const *rows, const int nr, int64_t ahead, int64_t c) {
    if (ahead && !(c & 1))
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) _mm_prefetch((const char *)rows[r] + ahead + c * 32, _MM_HINT_T1);
}

/* Weight rows rows[0..3] (two pairs; chunk 0 = the segment's first) ×
 * mr <= SEG_MB activation rows (a, stride lda, the unit's scales folded
 * in) over n chunks, the codes decoded by F16C (dm DEC_F16C), the exponent
 * bias (DEC_BIAS) or shifts (DEC_SHIFT: the activations then carry
 * sw·2^120); the chains come from and go back to lanes ([mr][2] vectors of
 * 16; first: from zero); ahead as seg_prefetch. Returns the pair chunks
 * that took dec_bias_wide's table. */
AVX512_INLINE int seg_kernel(const int mr, const int dm, int64_t n, const uint8_t *const *rowp,
                             int64_t ahead, const float *a, int64_t lda, float *lanes, int first) {
    __m512 acc[SEG_MB][2];
    const uint8_t *rows[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) rows[r] = rowp[r];
#pragma GCC unroll 8
    for (int m = 0; m < SEG_MB; m++)
#pragma GCC unroll 2
        for (int i = 0; i < 2; i++)
            if (m < mr) acc[m][i] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(lanes + (2 * m + i) * 16);
    int nsub = 0;
    for (int64_t c = 0; c < n; c++) {
        seg_prefetch(rows, 4, ahead, c);
        __m512 d[2][4];
#pragma GCC unroll 2
        for (int i = 0; i < 2; i++) {
            const __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(load_chunk(rows[2 * i], c)),
                                                 load_chunk(rows[2 * i + 1], c), 1);
            if (dm == DEC_BIAS) nsub += dec_bias_wide(x, d[i]);
            else if (dm == DEC_SHIFT) dec_shift_wide(x, d[i]);
            else dec_half_wide(x, d[i]);
        }
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
#pragma GCC unroll 8
            for (int m = 0; m < SEG_MB; m++)
                if (m < mr) {
                    const __m512 av = _mm512_broadcast_f32x8(_mm256_load_ps(a + m * lda + c * 32 + 8 * p));
                    acc[m][0] = _mm512_fmadd_ps(av, d[0][p], acc[m][0]);
                    acc[m][1] = _mm512_fmadd_ps(av, d[1][p], acc[m][1]);
                }
    }
#pragma GCC unroll 8
    for (int m = 0; m < SEG_MB; m++)
#pragma GCC unroll 2
        for (int i = 0; i < 2; i++)
            if (m < mr) _mm512_storeu_ps(lanes + (2 * m + i) * 16, acc[m][i]);
    return nsub;
}

typedef int (*seg_kernel_fn)(int64_t n, const uint8_t *const *rows, int64_t ahead, const float *a, int64_t lda,
                             float *lanes, int first);
#define SEG_KERNEL_FNS(mr)                                                                                \
    static AVX512 int seg_kernel_##mr##x(int64_t n, const uint8_t *const *rows, int64_t ahead,            \
                                         const float *a, int64_t lda, float *lanes, int first) {         \
        return seg_kernel(mr, DEC_BIAS, n, rows, ahead, a, lda, lanes, first);                           \
    }                                                                                                     \
    static AVX512 int seg_kernel_##mr##w(int64_t n, const uint8_t *const *rows, int64_t ahead,            \
                                         const float *a, int64_t lda, float *lanes, int first) {         \
        return seg_kernel(mr, DEC_F16C, n, rows, ahead, a, lda, lanes, first);                           \
    }                                                                                                     \
    static AVX512 int seg_kernel_##mr##s(int64_t n, const uint8_t *const *rows, int64_t ahead,            \
                                         const float *a, int64_t lda, float *lanes, int first) {         \
        return seg_kernel(mr, DEC_SHIFT, n, rows, ahead, a, lda, lanes, first);                          \
    }
SEG_KERNEL_FNS(1)
SEG_KERNEL_FNS(2)
SEG_KERNEL_FNS(3)
SEG_KERNEL_FNS(4)
SEG_KERNEL_FNS(5)
SEG_KERNEL_FNS(6)
SEG_KERNEL_FNS(7)
SEG_KERNEL_FNS(8)
static seg_kernel_fn seg_kernel_for(int mr, int dm) {
    static const seg_kernel_fn k[3][SEG_MB + 1] = {
        {0, seg_kernel_1w, seg_kernel_2w, seg_kernel_3w, seg_kernel_4w, seg_kernel_5w, seg_kernel_6w, seg_kernel_7w,
         seg_kernel_8w},
        {0, seg_kernel_1x, seg_kernel_2x, seg_kernel_3x, seg_kernel_4x, seg_kernel_5x, seg_kernel_6x, seg_kernel_7x,
         seg_kernel_8x},
        {0, seg_kernel_1s, seg_kernel_2s, seg_kernel_3s, seg_kernel_4s, seg_kernel_5s, seg_kernel_6s, seg_kernel_7s,
         seg_kernel_8s}};
    return k[dm][mr];
}
/* Rows of a block for M <= DEC_M activation rows: M up to SEG_MB, else
 * even halves. */
_Static_assert(DEC_M <= 2 * SEG_MB, "two blocks of at most SEG_MB rows cover a batch of decode rows");
static int seg_block_rows(int64_t M) { return M <= SEG_MB ? (int)M : (int)((M + 1) / 2); }

/* The same on 256-bit vectors (dec_kernel's blocks: 2 weight rows × mr <=
 * DEC_MB activation rows, either decoding; ahead as seg_prefetch); the lanes
 * [mr][2][8]. */
AVX2_INLINE void seg_kernel_narrow(const int mr, const int half, int64_t n, const uint8_t *const *rowp,
                                   int64_t ahead, const float *a, int64_t lda, float *lanes, int first) {
    __m256 acc[DEC_MB][8];
    const uint8_t *rows[8] = {rowp[0], rowp[1]};
#pragma GCC unroll 4
    for (int m = 0; m < DEC_MB; m++)
#pragma GCC unroll 2
        for (int r = 0; r < 2; r++)
            if (m < mr) acc[m][r] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(lanes + (2 * m + r) * 8);
    for (int64_t c = 0; c < n; c++) {
        seg_prefetch(rows, 2, ahead, c);
        dec_chunk(mr, 2, half, 0, c, rows, a, lda, 0, acc);
    }
#pragma GCC unroll 4
    for (int m = 0; m < DEC_MB; m++)
#pragma GCC unroll 2
        for (int r = 0; r < 2; r++)
            if (m < mr) _mm256_storeu_ps(lanes + (2 * m + r) * 8, acc[m][r]);
}
#define SEG_NARROW_FNS(mr)                                                                                \
    static AVX2 int seg_narrow_##mr(int64_t n, const uint8_t *const *rows, int64_t ahead,                  \
                                    const float *a, int64_t lda, float *lanes, int first) {              \
        seg_kernel_narrow(mr, 0, n, rows, ahead, a, lda, lanes, first);                                   \
        return 0;                                                                                         \
    }                                                                                                     \
    static AVX2 int seg_narrow_##mr##h(int64_t n, const uint8_t *const *rows, int64_t ahead,               \
                                       const float *a, int64_t lda, float *lanes, int first) {           \
        seg_kernel_narrow(mr, 1, n, rows, ahead, a, lda, lanes, first);                                   \
        return 0;                                                                                         \
    }
SEG_NARROW_FNS(1)
SEG_NARROW_FNS(2)
SEG_NARROW_FNS(3)
SEG_NARROW_FNS(4)
static seg_kernel_fn seg_narrow_for(int mr, int half) {
    static const seg_kernel_fn k[2][DEC_MB + 1] = {{0, seg_narrow_1, seg_narrow_2, seg_narrow_3, seg_narrow_4},
                                                   {0, seg_narrow_1h, seg_narrow_2h, seg_narrow_3h, seg_narrow_4h}};
    return k[half][mr];
}

/* Units the exponent-bias decoding ran (di_cpu_kernels_bias_units). */
static atomic_long bias_units;
long di_cpu_kernels_bias_units(void) { return atomic_load(&bias_units); }
/* 1: the decode rows on 512-bit vectors keep to F16C (tests, benchmarks) */
static atomic_int bias_forced_off;
void di_cpu_kernels_force_no_bias(int on) { atomic_store(&bias_forced_off, on != 0); }

/* The kernel for a block of mr rows of a batch of M (R = dec_job.R). */
static dec_kernel_fn dec_kernel_for(int64_t M, int mr, int half) {
    static const dec_kernel_fn w4[5] = {0, dec_kernel_1_4w, dec_kernel_2_4w, dec_kernel_3_4w, dec_kernel_4_4w};
    if (half && di_cpu_kernels_wide()) return M == 1 ? dec_kernel_1_8w : M == 2 ? dec_kernel_2_8w : w4[mr];
    static const dec_kernel_fn r2[2][5] = {
        {0, dec_kernel_1_2, dec_kernel_2_2, dec_kernel_3_2, dec_kernel_4_2},
        {0, dec_kernel_1_2h, dec_kernel_2_2h, dec_kernel_3_2h, dec_kernel_4_2h}};
    if (!half && di_cpu_kernels_wide() && M <= 2) return M == 1 ? dec_kernel_1_8s : dec_kernel_2_8s;
    if (M == 1) return half ? dec_kernel_1_8h : dec_kernel_1_8;
    if (M == 2) return half ? dec_kernel_2_4h : dec_kernel_2_4;
    return r2[half][mr];
}

/* Weight rows g0, g0 + step, .. (nn of them, at most one group of R) for
 * every activation row, a: the unit's folded activations; bias: by the
 * exponent bias (returns the chunks that took its table). */
static AVX2 int dec_group(const dec_job *j, int64_t g0, int64_t nn, int64_t step, const float *a, int bias) {
    const int64_t M = j->M, K = j->K, Kp = j->Kp, N = j->N;
    const int64_t chunks = Kp / 32;
    const int R = j->R;
    /* the missing rows of the last group repeat its last row (results dropped) */
    const uint8_t *rows[8];
    for (int r = 0; r < R; r++) rows[r] = j->w + (g0 + (r < nn ? r : nn - 1) * step) * K;
    /* The software prefetches (j->pf) are a choice, measured or fixed by
     * DI_CPU_PREFETCH, because which is faster depends on the machine, not
     * only its vendor
     * (bench/RESULTS.md, 2026-12-04): on AMD cores they made one row's
     * product read 15-65 % faster from DRAM (Zen 2-4: the hardware
     * prefetchers follow R rows side by side poorly); on the 2-vCPU Intel
     * Xeon VM one row read 16-28 % faster without them (vs_bw 0.70-0.77
     * against 0.57-0.60), wo_b's two rows 24-31 %, the segments' four rows
     * 3-29 %; on the 16-vCPU Intel Xeon host of the GPU machine they were as
     * fast at one row and 8-48 % faster at two. So measured (dec_run): a
     * batch class's first calls alternate with and without, and it keeps
     * the faster; the prefetches where the two are within a few percent.
     * The group two ahead, while it lies inside the weights (not for 8
     * rows or more a multiple of 4 KB apart: measured slower with the
     * 256-bit kernels; but the shift route's 512-bit kernels on a Zen 4
     * read such rows, wo_b's, at 0.81-0.84 of the bandwidth with it and
     * 0.62-0.64 without) */
    const int aliased = R >= 8 && K % 4096 == 0 && (j->half || !di_cpu_kernels_wide());
    const uint8_t *ahead = aliased || step > 1 || g0 + 3 * R > N || !j->pf ? NULL : j->w + (g0 + 2 * R) * K;
    const int mb = dec_block_rows(M);
    int nsub = 0;
    for (int64_t m0 = 0; m0 < M; m0 += mb) {
        const int mr = M - m0 < mb ? (int)(M - m0) : mb;
        float res[DEC_MB * 8];
        if (bias) { /* the table's count of the first block (each block decodes the same codes) */
            const int n = dec_bias_for(M, mr)(chunks, rows, m0 ? NULL : ahead, a + m0 * Kp, Kp, res);
            nsub += m0 ? 0 : n;
        }
        else dec_kernel_for(M, mr, j->half)(chunks, rows, m0 ? NULL : ahead, a + m0 * Kp, Kp, res);
        for (int64_t m = 0; m < mr; m++)
            for (int64_t r = 0; r < nn; r++) j->out[(m0 + m) * N + g0 + r * step] = res[m * 8 + r];
    }
    return nsub;
}

/* Group t of a span of x = 4, 2 or 1 scale tiles (dec_units: 8 weight
 * rows, one activation row): rows g0 + r·S for r < 8, S = x·UNIT/8, so
 * pair i's two rows lie in tile i·x/4; a: the span's folded activations,
 * tile after tile (Kp floats each). Returns the chunks that took the
 * exponent bias's table. */
static AVX2 int dec_span(const dec_job *j, int64_t g0, int64_t x, const float *a, int bias) {
    const int64_t K = j->K, Kp = j->Kp, S = x * UNIT / 8;
    const uint8_t *rows[8];
    for (int r = 0; r < 8; r++) rows[r] = j->w + (g0 + r * S) * K;
    float res[8];
    const int nsub = dec_span_for(bias, j->half, x)(Kp / 32, rows, a, Kp, Kp, res);
    for (int64_t r = 0; r < 8; r++) j->out[g0 + r * S] = res[r];
    return nsub;
}

/* Whether a unit's scale tile (st: its K/32 scales) can be folded into
 * the activations exactly: sw·2^120 (shifts) or sw·2^8 (F16C, where a
 * nonzero a·sw·2^8 must also stay a normal number: a >= 2^-9·sa, so sa·sw
 * >= 2^-124 suffices) for every block; otherwise the unit runs the scalar
 * code. If so, f[kb] gets the block's factor sw·fold. Eight blocks at a
 * time: an E8M0 byte e inside the range (2^-117 .. 2^7: e in 10 .. 134)
 * is the fp32 whose exponent field is e, so the factor is e << 23 times
 * fold (a power of two: exact, the table's value times fold). Block by
 * block through the table the check took ~3 % of a one-row product on a
 * Zen 4 core (now ~0.6 %), and the fold looked each factor up again. */
static AVX2 int dec_fold_scales(const dec_job *j, const uint8_t *st, float *f) {
    const int64_t KB = j->K / 32;
    const float fold = j->half ? 0x1p8f : 0x1p120f;
    const __m256 vfold = _mm256_set1_ps(fold), top = _mm256_set1_ps(0x1p7f), low = _mm256_set1_ps(0x1p-124f);
    const __m256i emin = _mm256_set1_epi32(9), emax = _mm256_set1_epi32(135);
    int64_t kb = 0;
    for (; kb + 8 <= KB; kb += 8) {
        const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(st + kb)));
        const __m256i in = _mm256_and_si256(_mm256_cmpgt_epi32(e, emin), _mm256_cmpgt_epi32(emax, e));
        const __m256 sv = _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
        __m256 ok = _mm256_and_ps(_mm256_castsi256_ps(in),
                                  _mm256_cmp_ps(_mm256_mul_ps(_mm256_loadu_ps(j->bmax + kb), sv), top, _CMP_LT_OQ));
        if (j->half)
            ok = _mm256_and_ps(ok, _mm256_cmp_ps(_mm256_mul_ps(_mm256_loadu_ps(j->smin + kb), sv), low, _CMP_GE_OQ));
        if (_mm256_movemask_ps(ok) != 0xff) return 0;
        _mm256_storeu_ps(f + kb, _mm256_mul_ps(sv, vfold));
    }
    const float *e8m0 = di_cpu_e8m0_table();
    for (; kb < KB; kb++) {
        const float s = e8m0[st[kb]];
        if (!(s >= 0x1p-117f && s <= 0x1p7f && j->bmax[kb] * s < 0x1p7f &&
              (!j->half || j->smin[kb] * s >= 0x1p-124f)))
            return 0;
        f[kb] = s * fold;
    }
    return 1;
}

/* n chunks of one activation row (src, 32-byte aligned) times their
 * blocks' factors f (dec_fold_scales) into dst: the folded activations the
 * decode kernels read. */
AVX2_INLINE void dec_fold(const float *src, const float *f, int64_t n, float *dst) {
    for (int64_t c = 0; c < n; c++) {
        const __m256 fc = _mm256_broadcast_ss(f + c);
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
            _mm256_store_ps(dst + c * 32 + 8 * p, _mm256_mul_ps(_mm256_load_ps(src + c * 32 + 8 * p), fc));
    }
}

/* A unit of rows weight rows decoded by the exponent bias, nsub of its
 * groups' chunk pairs through the table: weights with codes of exponent 0
 * in an eighth of the chunk pairs or more (uniformly random bytes: 19 in
 * 20; a checkpoint's: 6 in 1,000) decode faster through F16C, so the rest
 * of the product takes it (the same bits either way). */
static void dec_bias_done(const dec_job *j, int64_t rows, int64_t nsub) {
    atomic_fetch_add_explicit(&bias_units, 1, memory_order_relaxed);
    if (8 * nsub > (rows + j->R - 1) / j->R * j->R * (j->Kp / 32))
        atomic_store_explicit(j->bias_heavy, 1, memory_order_relaxed);
}

/* Whether dec_units spreads a whole unit's rows over its groups (no
 * prefetches, long rows), and whether it takes spans of DEC_SPAN scale
 * tiles (spread, and the 8-row kernels of one activation row: on 512-bit
 * vectors, or on 256-bit ones, dec_kernel's span form). */
static int dec_spread(const dec_job *j) { return !j->pf && j->K >= DI_DEC_LONG_ROW; }
static int dec_spans(const dec_job *j) {
    return dec_spread(j) && j->M == 1 && j->R == 8;
}

/* The folded activations of the span's tiles from u on into sc, tile
 * after tile (Kp floats each; fs: scratch for the factors); 0 where a
 * tile's scales cannot be folded exactly (the tiles then go one by one). */
static AVX2 int dec_fold_span(const dec_job *j, int64_t u, int64_t nx, float *fs, float *sc) {
    const int64_t Kp = j->Kp, KB = j->K / 32, chunks = Kp / 32;
    for (int64_t x = 0; x < nx; x++) {
        if (!dec_fold_scales(j, j->ws + (u + x) * (UNIT / 32) * KB, fs)) return 0;
        dec_fold(j->ap, fs, chunks, sc + x * Kp);
    }
    return 1;
}

/* Units whose groups took rows spread through the unit, and those of them
 * in spans of several (dec_units). */
static atomic_long spread_units, span_units, short_span_units;
long di_cpu_kernels_spread_units(void) { return atomic_load(&spread_units); }
long di_cpu_kernels_span_units(void) { return atomic_load(&span_units); }
long di_cpu_kernels_short_span_units(void) { return atomic_load(&short_span_units); }

/* Units [u0, u1) of UNIT weight rows (one scale tile): every activation row,
 * all of K. Without the software prefetches a whole unit of long rows
 * (DI_DEC_LONG_ROW) has its groups take their rows spread through it:
 * group t of the unit's R·S rows (S = UNIT / R) has rows t, t + S,
 * t + 2S, .., so register slot r reads rows r·S .. r·S + S - 1 one after
 * the other, S·K contiguous bytes, rather than a new row every K bytes.
 * The hardware prefetchers follow streams within 4 KB pages, and rows
 * shorter than two pages put two or three of the group's streams in one
 * page: on the 2-vCPU Xeon VM one row of K = 2,048 read 10.7 GB/s from
 * DRAM in groups of 8 consecutive rows and 13.1 spread (K 1,024: 10.4 ->
 * 13.5; 3,072: 10.7 -> 13.8; 5,120: 13.2 -> 14.1; two threads at K 2,048:
 * 18.5 -> 23.0). Shorter rows read slower spread (K 512: 11.9 -> 10.1),
 * and faster still with the prefetches, which is why their choice is
 * measured apart (bench/RESULTS.md 2026-12-05). Each output's chain is
 * unchanged (same bits); only which rows share a kernel call moves. With
 * the prefetches (the group two ahead, contiguous rows) the groups stay
 * consecutive.
 * At one activation row the streams go further: where DEC_SPAN whole
 * units follow in the range, their 16 groups each take rows t + 16r, so
 * a slot reads 16 rows (a pair's two slots lie in one unit, pair i in
 * unit i of the span, and read that unit's folded activations: dec_span).
 * One row from DRAM on the VM: K 2,048 13.1 -> 14.7 GB/s, 5,120 14.1 ->
 * 14.2-14.5, 8,192 14.0 -> 14.5; spans of 2 units were no faster than
 * none, and two activation rows read slower in spans (K 5,120 13.3 ->
 * 12.4: the four units' activations, 160 KB, leave L1). A span's kernel
 * also prefetches each row's stream DEC_SPAN_PF bytes ahead (a line a row
 * every other chunk; it runs on into the slot's next row): K 5,120 14.1 ->
 * 15.4-16.8, 2,048 14.1 -> 15.7-16.5 (256 bytes ahead 14.9-15.4, 768
 * 14.6-15.2, every row every chunk 14.0-14.5); K 8,192 unchanged. Where
 * the range ends sooner (a product's last tiles) spans of 2 tiles (slots
 * of 8 rows) and 1 (slots of 4) take the rest, the same kernel with its
 * pairs' tiles mapped accordingly. */
static AVX2 void dec_units(void *ctx, int64_t u0, int64_t u1, int thread) {
    const dec_job *j = ctx;
    const int64_t M = j->M, K = j->K, Kp = j->Kp, N = j->N, KB = K / 32, chunks = Kp / 32;
    const int R = j->R;
    const int spans = dec_spans(j);
    float *sc = j->scratch + thread * j->scratch_floats;
    float *fs = sc + (spans ? DEC_SPAN : 1) * M * Kp; /* [K/32] the factors */
    for (int64_t u = u0; u < u1; u++) {
        /* the longest span of whole tiles (DEC_SPAN, DEC_SPAN/2, 1) the
         * range holds */
        const int64_t x = spans ? di_cpu_span_units(u, u1, N / UNIT, DEC_SPAN) : 0;
        if (x && dec_fold_span(j, u, x, fs, sc)) {
            const int bias = j->bias && !atomic_load_explicit(j->bias_heavy, memory_order_relaxed);
            int64_t nsub = 0;
            atomic_fetch_add_explicit(&spread_units, x, memory_order_relaxed);
            atomic_fetch_add_explicit(&span_units, x, memory_order_relaxed);
            if (x < DEC_SPAN) atomic_fetch_add_explicit(&short_span_units, x, memory_order_relaxed);
            for (int64_t t = 0; t < x * UNIT / 8; t++) nsub += dec_span(j, u * UNIT + t, x, sc, bias);
            if (bias) dec_bias_done(j, x * UNIT, nsub);
            u += x - 1;
            continue;
        }
        const int64_t n0 = u * UNIT, n1 = n0 + UNIT < N ? n0 + UNIT : N;
        /* fold the tile's scales into the activations, if exact (dec_fold_scales) */
        const uint8_t *st = j->ws + (n0 / 32) * KB;
        if (!dec_fold_scales(j, st, fs)) {
            di_gemm_block_rows_scalar(0, j->qa, j->sa, M, K, j->w, j->ws, N, n0, n1, j->out);
            continue;
        }
        for (int64_t m = 0; m < M; m++) dec_fold(j->ap + m * Kp, fs, chunks, sc + m * Kp);
        const int bias = j->bias && !atomic_load_explicit(j->bias_heavy, memory_order_relaxed);
        int64_t nsub = 0;
        const int64_t S = UNIT / R;
        if (dec_spread(j) && n1 - n0 == UNIT && S > 1 && S * R == UNIT) {
            atomic_fetch_add_explicit(&spread_units, 1, memory_order_relaxed);
            for (int64_t t = 0; t < S; t++) nsub += dec_group(j, n0 + t, R, S, sc, bias);
        } else
            for (int64_t g0 = n0; g0 < n1; g0 += R) nsub += dec_group(j, g0, n1 - g0 < R ? n1 - g0 : R, 1, sc, bias);
        if (bias) dec_bias_done(j, n1 - n0, nsub);
    }
}

/* dec_units for the segmented form (M >= SEG_FROM, j->ks chunks a
 * segment): per unit, segment after segment, the scales folded into the
 * segment's activations, then each group of R weight rows in blocks of
 * rows (on 512-bit vectors seg_kernel: R = 4, blocks of seg_block_rows(M);
 * else seg_kernel_narrow: R = 2, blocks of DEC_MB); the trees at the
 * unit's end. */
static AVX2 void seg_units(void *ctx, int64_t u0, int64_t u1, int thread) {
    const dec_job *j = ctx;
    const int64_t M = j->M, K = j->K, Kp = j->Kp, N = j->N, KB = K / 32, chunks = Kp / 32, ks = j->ks;
    /* dec_rows gives 4 weight rows a group from 3 rows on only to the 512-bit kernels */
    const int R = j->R, wide = R == 4, mb = wide ? seg_block_rows(M) : dec_block_rows(M);
    float *sc = j->scratch + thread * j->scratch_floats; /* [M][ks·32] */
    float *lanes = sc + M * ks * 32;                    /* [UNIT / R groups][M][R][8] */
    float *fs = lanes + UNIT * M * 8;                   /* [K/32] the factors */
    for (int64_t u = u0; u < u1; u++) {
        const int64_t n0 = u * UNIT, n1 = n0 + UNIT < N ? n0 + UNIT : N;
        const uint8_t *st = j->ws + (n0 / 32) * KB;
        if (!dec_fold_scales(j, st, fs)) {
            di_gemm_block_rows_scalar(0, j->qa, j->sa, M, K, j->w, j->ws, N, n0, n1, j->out);
            continue;
        }
        const int bias = wide && j->bias && !atomic_load_explicit(j->bias_heavy, memory_order_relaxed);
        int64_t nsub = 0;
        for (int64_t c0 = 0; c0 < chunks; c0 += ks) {
            const int64_t n = chunks - c0 < ks ? chunks - c0 : ks;
            for (int64_t m = 0; m < M; m++) dec_fold(j->ap + m * Kp + c0 * 32, fs + c0, n, sc + m * ks * 32);
            for (int64_t g0 = n0; g0 < n1; g0 += R) {
                /* the missing rows of the last group repeat its last row (results dropped) */
                const int64_t nn = n1 - g0 < R ? n1 - g0 : R;
                const uint8_t *rows[4];
                for (int r = 0; r < R; r++) rows[r] = j->w + (g0 + (r < nn ? r : nn - 1)) * K + c0 * 32;
                float *gl = lanes + (g0 - n0) / R * M * R * 8;
                for (int64_t m0 = 0; m0 < M; m0 += mb) {
                    const int mr = M - m0 < mb ? (int)(M - m0) : mb;
                    const seg_kernel_fn kf = !wide       ? seg_narrow_for(mr, j->half)
                                             : j->half ? seg_kernel_for(mr, bias ? DEC_BIAS : DEC_F16C)
                                                       : seg_kernel_for(mr, DEC_SHIFT);
                    /* the first block prefetches the group's next segment */
                    const int64_t ahead = m0 || c0 + n >= chunks || !j->pf ? 0 : n * 32;
                    const int t = kf(n, rows, ahead, sc + m0 * ks * 32, ks * 32, gl + m0 * R * 8, c0 == 0);
                    nsub += m0 ? 0 : t;
                }
            }
        }
        atomic_fetch_add_explicit(&seg_units_run, 1, memory_order_relaxed);
        /* kernels.h's tree over each output's eight lanes ([m][row pair][16] on
         * 512-bit vectors: the same as [m][row][8]) */
        for (int64_t g0 = n0; g0 < n1; g0 += R) {
            const float *gl = lanes + (g0 - n0) / R * M * R * 8;
            for (int64_t m = 0; m < M; m++)
                for (int64_t r = 0; r < R && g0 + r < n1; r++) j->out[m * N + g0 + r] = tree1(gl + (m * R + r) * 8);
        }
        if (bias) dec_bias_done(j, n1 - n0, nsub);
    }
}

/* FP8 decode rows of n products (parts) on the same activations (the
 * first part's qa, sa, M), in one pass over the pool: one layout of the
 * activations, one scratch, the units of all the parts dealt together
 * (each part's outputs the bits of its own call). 0 when out of memory. */
static int dec_run(int half, const di_gemm_part *parts, int n, int64_t K, di_threadpool *tp) {
    const uint8_t *qa = parts[0].qa;
    const float *sa = parts[0].sa;
    const int64_t M = parts[0].M;
    const int threads = di_threadpool_size(tp);
    const int64_t Kp = K, KB = K / 32;
    /* the segmented form where it runs (seg_units: a segment's activations and the unit's lanes) */
    const int64_t ks = M >= SEG_FROM && !atomic_load(&seg_forced_off) ? seg_chunks(M, Kp / 32) : 0;
    /* + the factors (dec_fold_scales), rounded so each thread's part stays 32-byte aligned */
    const int64_t sf = (ks ? M * ks * 32 + UNIT * M * 8 : (M == 1 ? DEC_SPAN : 1) * M * Kp) + (KB + 7) / 8 * 8;
    float *bmax = malloc(sizeof(float) * (size_t)(M * KB + KB));
    float *ap = bmax ? pack_lanes(qa, sa, M, K, Kp, 1.0f, bmax, half, 0, NULL, NULL) : NULL;
    float *scratch = aligned_alloc(32, (size_t)threads * (size_t)sf * sizeof(float));
    dec_job *jobs = malloc(sizeof *jobs * (size_t)n);
    atomic_int *heavy = malloc(sizeof *heavy * (size_t)n);
    int64_t *first = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!ap || !scratch || !bmax || !jobs || !heavy || !first) {
        free(ap), free(scratch), free(bmax), free(jobs), free(heavy), free(first);
        return 0;
    }
    float *smin = bmax + M * KB; /* (a NaN scale makes its block's bmax infinite) */
    for (int64_t kb = 0; kb < KB; kb++) smin[kb] = sa[kb];
    for (int64_t m = 1; m < M; m++) /* max |a| and min sa over the rows, per block */
        for (int64_t kb = 0; kb < KB; kb++) {
            if (bmax[m * KB + kb] > bmax[kb]) bmax[kb] = bmax[m * KB + kb];
            if (!(sa[m * KB + kb] >= smin[kb])) smin[kb] = sa[m * KB + kb];
        }
    /* the software prefetches: fixed, or measured per batch class on its
     * first calls of at least PF_MIN_BYTES (kernels.h) */
    int64_t bytes = 0;
    for (int i = 0; i < n; i++) bytes += parts[i].N * K;
    int timed;
    const int pf_class = (M == 1 ? 0 : M == 2 ? 1 : 2) + (K < DI_DEC_LONG_ROW ? 3 : 0);
    const int pf = di_cpu_pf_for_call(pf_class, bytes >= PF_MIN_BYTES, &timed);
    int64_t units = 0;
    for (int i = 0; i < n; i++) {
        atomic_init(&heavy[i], 0);
        jobs[i] = (dec_job){.qa = qa, .sa = sa, .ap = ap, .bmax = bmax, .smin = smin, .half = half,
                            .R = dec_rows(M, half, ks > 0),
                            .bias = half && di_cpu_kernels_wide() && !atomic_load(&bias_forced_off),
                            .pf = pf,
                            .bias_heavy = &heavy[i], .w = parts[i].w, .ws = parts[i].ws, .M = M, .K = K,
                            .Kp = Kp, .N = parts[i].N, .out = parts[i].out, .scratch = scratch,
                            .scratch_floats = sf, .ks = ks};
        first[i] = units;
        units += (parts[i].N + UNIT - 1) / UNIT;
    }
    first[n] = units;
    /* several chunks per thread so a core slowed by other work takes fewer;
     * whole spans where dec_units takes them, dealt from one cursor. Not
     * a stretch of the range for each thread as the MXFP4 rows take
     * (di_threadpool_for_stretches): on two threads of the 2-vCPU Xeon VM
     * that read as fast, but on 16 threads of the H100 host's Xeon wq_a
     * and shared.w1 (10 and 18 spans) read 79-94 and 100-107 GB/s in
     * stretches of whole spans against 114-127 and 99-146 from the cursor
     * (interleaved runs; runs 193-196 of docs/gpu-notes.md), wkv 38-59
     * against 70-80; why, those runs did not tell. */
    int64_t grain = units / (8 * threads);
    if (dec_spans(&jobs[0])) grain = (grain + DEC_SPAN - 1) / DEC_SPAN * DEC_SPAN;
    struct timespec t0, t1;
    if (timed) clock_gettime(CLOCK_MONOTONIC, &t0);
    di_threadpool_for_parts(tp, n, first, grain < 1 ? 1 : grain, ks ? seg_units : dec_units, jobs, sizeof *jobs);
    if (timed) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        di_cpu_pf_record(pf_class, pf, ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) /
                                           (double)bytes);
    }
    free(ap), free(scratch), free(bmax), free(jobs), free(heavy), free(first);
    return 1;
}

/* ---- FP8 rows on fp32 activations, the fused chain ----
 * The bf16-numerics products (wo_a's grouped projection, architecture.md
 * §5.6; every FP8 weight where the numerics are bf16) multiply the
 * dequantized weights w·sw with fp32 activations as di_gemm_f32's chain:
 * output j of activation row i is acc = fma(x[k], w[j][k]·sw, acc) for
 * k = 0, 1, .., K - 1 from +0. The backend forms that from fp32 panels,
 * each code decoded and transposed through memory (cpu_ops_avx2.c: ~2
 * instructions a code, ~1 GB/s a core at one row, wo_a's 33.5 MB ~30 ms on
 * one Zen 4 core; 1.7 ms on 16 Xeon cores, where this form takes 0.40:
 * bench_decode_passes). A decode step reads each weight once, so here the codes
 * go straight to the FMAs: chunk_words16 gives word j of 16 rows' chunks
 * in one register, and dec_bias_wide's four positions of it are the steps
 * k = 32c + 4j + p of those 16 rows side by side, which is the chain's own
 * order; each value is w·sw formed as lg_decode_wide forms it (rounded
 * once from the exact product, as the panels' w × sw), so every FMA takes
 * the panels' operands in the panels' order: the same bits. 32 rows (one
 * scale tile: one scale a chunk for all of them) in two chains an
 * activation row, which keeps the FMAs' latency under the decoding's
 * work. The NaN codes, which dec_bias_wide reads as numbers, are looked
 * for on the way (~ANDN, then a byte minimum a word register): a unit with
 * one returns -1 before storing anything, for the panels to redo it. */
/* The factor a chunk's decoded w·2^-8 is multiplied by to give w·sw,
 * rounded once: sw·2^8, or where that would not be exact (*big) 2^8 first
 * and then sw (as lg_decode_wide forms the values). */
static inline float chunk_factor(float sw, int *big) {
    *big = !(sw <= 0x1p100f);
    return *big ? sw : sw * 0x1p8f;
}
AVX512_INLINE int f32rows_kernel(const int mr, const uint8_t *w, const uint8_t *ws, int64_t K, const float *x,
                                 int64_t ldx, float *y, int64_t ldy) {
    const int64_t KB = K / 32;
    const float *e8m0 = di_cpu_e8m0_table();
    const __m512 u8 = _mm512_set1_ps(0x1p8f);
    const __m512i low7 = _mm512_set1_epi8(0x7f);
    __m512i nanmin = _mm512_set1_epi8(-1); /* a byte 0 where some code is a NaN */
    __m512 acc[4][2];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    /* two chunks a step, each row's line in one load (lines_words32: wo_a's
     * rows are 4,096 bytes apart; 0.09 against 0.06 ms for 512 KB from L2
     * a chunk at a time; software prefetches of the next lines measured
     * no faster from DRAM); the words through L1 */
    __attribute__((aligned(64))) __m512i zb[2][2][8]; /* [chunk][half][word] */
    for (int64_t c = 0; c < KB; c += 2) {
        lines_words32(w + 32 * c, K, zb);
#pragma GCC unroll 2
        for (int t = 0; t < 2; t++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++)
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) nanmin = _mm512_min_epu8(nanmin, _mm512_andnot_si512(zb[t][h][j], low7));
#pragma GCC unroll 1
        for (int t = 0; t < 2; t++) {
            int big;
            const __m512 f = _mm512_set1_ps(chunk_factor(e8m0[ws[c + t]], &big));
            const float *xc = x + 32 * (c + t);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                __m512 d0[4], d1[4];
                dec_bias_wide(_mm512_load_si512(&zb[t][0][j]), d0);
                dec_bias_wide(_mm512_load_si512(&zb[t][1][j]), d1);
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    const __m512 v0 = _mm512_mul_ps(big ? _mm512_mul_ps(d0[q], u8) : d0[q], f);
                    const __m512 v1 = _mm512_mul_ps(big ? _mm512_mul_ps(d1[q], u8) : d1[q], f);
#pragma GCC unroll 4
                    for (int i = 0; i < 4; i++)
                        if (i < mr) {
                            const __m512 xb = _mm512_set1_ps(xc[i * ldx + 4 * j + q]);
                            acc[i][0] = _mm512_fmadd_ps(xb, v0, acc[i][0]);
                            acc[i][1] = _mm512_fmadd_ps(xb, v1, acc[i][1]);
                        }
                }
            }
        }
    }
    if (_mm512_cmpeq_epi8_mask(nanmin, _mm512_setzero_si512())) return -1;
    for (int i = 0; i < mr; i++) {
        _mm512_storeu_ps(y + i * ldy, acc[i][0]);
        _mm512_storeu_ps(y + i * ldy + 16, acc[i][1]);
    }
    return 0;
}
/* An instance of a units kernel for mr activation rows (both widths) */
#define F32ROWS_INST(target, kernel, mr)                                                                     \
    static target int kernel##_##mr(const uint8_t *w, const uint8_t *ws, int64_t K, const float *x, int64_t ldx, \
                                    float *y, int64_t ldy) {                                                 \
        return kernel##_kernel(mr, w, ws, K, x, ldx, y, ldy);                                                \
    }
F32ROWS_INST(AVX512, f32rows, 1)
F32ROWS_INST(AVX512, f32rows, 2)
F32ROWS_INST(AVX512, f32rows, 3)
F32ROWS_INST(AVX512, f32rows, 4)

/* The same on 256-bit vectors (CPUs without AVX-512): the unit's 32 rows
 * as four groups of 8, each row's line in two loads back to back, a
 * group's 32-byte chunks transposed by words (transpose8 on the code
 * words: word j of the 8 rows in one register), the codes decoded through
 * F16C (dec_half: w·2^-8, no subnormal reaches the arithmetic on any
 * vendor's core) and scaled as above; four chains an activation row, so
 * one or two rows only (16 registers). */
AVX2_INLINE int f32rows8_kernel(const int mr, const uint8_t *w, const uint8_t *ws, int64_t K, const float *x,
                                int64_t ldx, float *y, int64_t ldy) {
    const int64_t KB = K / 32;
    const float *e8m0 = di_cpu_e8m0_table();
    const __m256 u8 = _mm256_set1_ps(0x1p8f);
    const __m256i low7 = _mm256_set1_epi8(0x7f);
    __m256i nan = _mm256_setzero_si256(); /* a byte set where some code is a NaN */
    __m256 acc[DI_FP8_F32ROWS_M_NARROW][4];
#pragma GCC unroll 2
    for (int i = 0; i < DI_FP8_F32ROWS_M_NARROW; i++)
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) acc[i][g] = _mm256_setzero_ps();
    __attribute__((aligned(32))) __m256i zb[2][4][8]; /* [chunk][group][word] */
    for (int64_t c = 0; c < KB; c += 2) {
        const uint8_t *p = w + 32 * c;
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            __m256 lo[8], hi[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const uint8_t *r = p + (8 * g + i) * K;
                lo[i] = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)r));
                hi[i] = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(r + 32)));
            }
            transpose8(lo);
            transpose8(hi);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const __m256i a = _mm256_castps_si256(lo[j]), b = _mm256_castps_si256(hi[j]);
                nan = _mm256_or_si256(nan, _mm256_cmpeq_epi8(_mm256_and_si256(a, low7), low7));
                nan = _mm256_or_si256(nan, _mm256_cmpeq_epi8(_mm256_and_si256(b, low7), low7));
                _mm256_store_si256(&zb[0][g][j], a);
                _mm256_store_si256(&zb[1][g][j], b);
            }
        }
#pragma GCC unroll 1
        for (int t = 0; t < 2; t++) {
            int big;
            const __m256 f = _mm256_set1_ps(chunk_factor(e8m0[ws[c + t]], &big));
            const float *xc = x + 32 * (c + t);
#pragma GCC unroll 1
            for (int j = 0; j < 8; j++)
#pragma GCC unroll 4
                for (int g = 0; g < 4; g++) {
                    __m256 d[4];
                    dec_half(_mm256_load_si256(&zb[t][g][j]), d);
#pragma GCC unroll 4
                    for (int q = 0; q < 4; q++) {
                        const __m256 v = _mm256_mul_ps(big ? _mm256_mul_ps(d[q], u8) : d[q], f);
#pragma GCC unroll 2
                        for (int i = 0; i < DI_FP8_F32ROWS_M_NARROW; i++)
                            if (i < mr)
                                acc[i][g] = _mm256_fmadd_ps(_mm256_set1_ps(xc[i * ldx + 4 * j + q]), v, acc[i][g]);
                    }
                }
        }
    }
    if (!_mm256_testz_si256(nan, nan)) return -1;
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) _mm256_storeu_ps(y + i * ldy + 8 * g, acc[i][g]);
    return 0;
}
F32ROWS_INST(AVX2, f32rows8, 1)
F32ROWS_INST(AVX2, f32rows8, 2)

static atomic_long f32rows_units_run;
long di_cpu_fp8_f32rows_units(void) { return atomic_load(&f32rows_units_run); }

int di_cpu_fp8_f32rows(const uint8_t *w, const uint8_t *ws, int64_t K, int64_t N, int64_t r0, const float *x,
                       int64_t ldx, int64_t m, float *y, int64_t ldy) {
    typedef int (*unit_fn)(const uint8_t *, const uint8_t *, int64_t, const float *, int64_t, float *, int64_t);
    static const unit_fn wide_fns[DI_FP8_F32ROWS_M] = {f32rows_1, f32rows_2, f32rows_3, f32rows_4};
    static const unit_fn narrow_fns[DI_FP8_F32ROWS_M_NARROW] = {f32rows8_1, f32rows8_2};
    const int wide = di_cpu_kernels_wide();
    if (m < 1 || m > (wide ? DI_FP8_F32ROWS_M : DI_FP8_F32ROWS_M_NARROW) || K % 64 || r0 % 32 || r0 + 32 > N) return -1;
    const int rc = (wide ? wide_fns : narrow_fns)[m - 1](w + r0 * K, ws + (r0 / 32) * (K / 32), K, x, ldx, y, ldy);
    if (!rc) atomic_fetch_add_explicit(&f32rows_units_run, 1, memory_order_relaxed);
    return rc;
}

/* Decode rows or prefill tiles. */
static void fp8_linear(const uint8_t *qa, const float *sa, int64_t M, int64_t K, const uint8_t *w,
                       const uint8_t *ws, int64_t N, float *out, di_threadpool *tp) {
    if (M <= 0 || N <= 0) return;
    const int half = use_half();
    const di_gemm_part part = {qa, sa, M, w, ws, N, out};
    const int done = M <= DEC_M ? dec_run(half, &part, 1, K, tp)
                   : M < lg_min_m() ? pf_run(half, qa, sa, M, K, w, ws, N, out, tp)
                                  : lg_run(half, qa, sa, M, K, w, ws, N, out, tp);
    if (!done) di_gemm_fp8_scalar(qa, sa, M, K, w, ws, N, out, tp); /* out of memory: it needs none */
}

void di_gemm_fp8_avx2(const uint8_t *qa, const float *sa, int64_t M, int64_t K, const uint8_t *w,
                      const uint8_t *ws, int64_t N, float *out, di_threadpool *tp) {
    fp8_linear(qa, sa, M, K, w, ws, N, out, tp);
}

void di_gemm_fp8_many_avx2(const di_gemm_part *parts, int n, int64_t K, di_threadpool *tp) {
    /* one pass where every part is a decode-rows product of the same activations */
    int one = n > 1;
    for (int i = 0; i < n; i++)
        one &= parts[i].qa == parts[0].qa && parts[i].sa == parts[0].sa && parts[i].M == parts[0].M &&
               parts[i].M >= 1 && parts[i].M <= DEC_M && parts[i].N >= 1;
    if (one && dec_run(use_half(), parts, n, K, tp)) return;
    for (int i = 0; i < n; i++)
        fp8_linear(parts[i].qa, parts[i].sa, parts[i].M, K, parts[i].w, parts[i].ws, parts[i].N, parts[i].out, tp);
}

#endif
