/* AVX2 + FMA kernels of the FP8 and MXFP4 linears (kernels.h; architecture.md
 * §2, §8.3), compiled with per-function target attributes like
 * kernels_avx2.c and called only after di_cpu_has_avx2().
 *
 * kernels.h gives every output eight chains, lane j running through the codes
 * that sit in 4-byte word j of each 32-byte chunk of the weight row. A
 * register loaded from a row therefore already holds the eight chains'
 * codes, one per 32-bit lane, and one shift pair per word position brings
 * them to fp32 bits without a transpose:
 * - E4M3: the code shifted to the top byte and arithmetically back by 4 has
 *   its sign at bit 31 and its 7 magnitude bits at 26..20: masked, that is
 *   the fp32 whose value is w·2^-120 (E4M3 subnormals become fp32
 *   subnormals, exactly; the NaN codes read as 480·2^-120).
 * - E2M1: the nibble shifted to the top and arithmetically back by 6 has its
 *   3 magnitude bits at 24..22: the fp32 w·2^-126 (the code 0.5 is the
 *   subnormal 2^-127).
 * The activations a(k) = qa·sa of kernels.h are laid out once per call in
 * the same lane order (chunk, word position, lane), so every product is a
 * plain vertical FMA and the chains are exactly the scalar ones.
 *
 * Decode rows (M <= 16) read each weight once for few activation rows, so
 * the cost per weight must stay below what the memory delivers. They go
 * straight from the codes to FMAs, R weight rows × up to 4 activation rows
 * at a time (8 accumulators: M = 1 runs 8 weight rows, M = 2 four, larger
 * batches blocks of 4 activation rows over 2 weight rows), the scale folded
 * in where it costs nothing:
 * - FP8: a whole 32-row tile shares its block scales, so the activations
 *   are multiplied once per tile by sw·2^120; the decoded w·2^-120 then
 *   times a·sw·2^120 is the real product a·(w·sw) of the scalar chain, and
 *   the FMA rounds it the same way. This needs every such factor exact:
 *   sw in [2^-117, 2^7] and |a|·sw < 2^7 per block (all real checkpoints
 *   and activations); a tile outside runs the scalar code.
 * - MXFP4: scales differ per row and per 32 codes (two blocks per 32 bytes:
 *   lanes 0-3 and 4-7), so instead the chains themselves change scale: the
 *   activations are laid out ×2^63, the lanes accumulate w·2^-126 times
 *   them, i.e. the terms divided by sv = sw·2^63, and each chain is
 *   multiplied by sv(c-1)/sv(c) on entering chunk c and by the last sv at
 *   the end: one multiply per 64 codes and chain rather than one per 8 codes
 *   (see dec_scales() for when that is exact; else the row group runs the
 *   scalar code).
 * The R rows of a group stream side by side, each only K (or K/2) bytes
 * long, which the hardware prefetchers follow poorly from DRAM; the groups
 * are contiguous, though, so each chunk prefetches into L2 the next R·32
 * bytes of the group two ahead, one linear stream at the rate the kernel
 * reads (FP8 +15-65 % from DRAM, MXFP4 at M = 4 +20 %, bench/RESULTS.md).
 * Where the CPU has AVX-512, MXFP4 rows of batches of 1 and 2 run the inner
 * loops of kernels_avx512_block.c instead (the same chains and factors, the
 * codes decoded by table permutes), or where it also has AVX512_BF16 those
 * of kernels_avx512_bf16.c (two steps of a chain per vdpbf16ps lane, for
 * row groups whose exponent spread keeps every chain value normal; the
 * others run the AVX2 loops), everything around them being this file's.
 * Per-row prefetches a fixed distance ahead measured neutral to 25 % slower;
 * 8 rows spaced by a multiple of 4 KB (wo_b at M = 1) measured no faster
 * with it, so they go without.
 * The shift decoding hands fp32 subnormals to the FMAs, which only AMD cores
 * take at full speed (see "CPUs with slow subnormals"); even Zen 4 slows
 * down on subnormal inputs to a plain multiply (MXFP4 decode rows ran 5-30 %
 * slower when each decoded vector was multiplied by its scale), so the
 * decoded weights go only into FMAs.
 * Prefill (M > 16) decodes chunks of 128 weight rows × 512 codes once into
 * fp32 tiles w·sw (the very products of the scalar code) and runs a
 * register-blocked dot-product kernel over them: 3 activation rows × 4
 * weight rows, 12 accumulators of 8 lanes, the lanes carried across chunks
 * in a per-thread buffer and reduced by the tree of kernels.h at the end. */
#include "backend/cpu/kernels.h"

#ifdef DI_HAVE_AVX2_KERNELS

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#ifdef __clang__
/* The exactness arguments above need every multiply and add rounded where
 * written: no silent fusion. */
#pragma STDC FP_CONTRACT OFF
#endif

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* Prefill blocking: BM activation rows × BN weight rows per micro-kernel,
 * chunks of ROWS weight rows × KC codes. Decode rows: up to DEC_M rows, in
 * blocks of at most DEC_MB, and work units of 32 weight rows (one FP8 scale
 * tile). */
enum { BM = 3, BN = 4, ROWS = 128, KC = 512, DEC_M = 16, DEC_MB = 4, UNIT = 32 };
/* MXFP4 decode rows of batches up to DEC512_M take the AVX-512 loops where
 * the CPU has them (kernels_avx512_block.c). */
enum { DEC512_M = 2 };

/* Codes per 32-byte chunk of a row. */
static inline int64_t chunk_codes(int fp4) { return fp4 ? 64 : 32; }

/* Word position p of the 8 words x (one chunk of a row) as fp32 bits of
 * code·2^-120 (FP8) or code·2^-126 (MXFP4). */
AVX2_INLINE __m256 dec_pos(const int fp4, __m256i x, const int p) {
    if (!fp4) {
        __m256i v = p == 3 ? x : _mm256_slli_epi32(x, 24 - 8 * p);
        return _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(v, 4), _mm256_set1_epi32((int)0x87f00000u)));
    }
    __m256i v = p == 7 ? x : _mm256_slli_epi32(x, 28 - 4 * p);
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(v, 6), _mm256_set1_epi32((int)0x81c00000u)));
}

/* Word positions p and p + P/2 (P = 4 or 8 codes per word) at once, with
 * 16-bit shifts: the code of position p + P/2 sits in the upper half of each
 * word at the same offset as position p in the lower half, so one shift pair
 * decodes both, the upper one in place (-> *hi) and the lower one after a
 * shift by 16 (returned). 5 shifts instead of 7 per FP8 chunk, 11 instead
 * of 15 per MXFP4 chunk. With the masks that is 2.375 vector operations per
 * 8 E2M1 codes; decode rows are bound by these operations, and a vpermps of
 * the 8 magnitudes (index shift, permute, sign by shift, and, or: 5) ran
 * 1.5x slower (bench/RESULTS.md). */
AVX2_INLINE __m256 dec_pair(const int fp4, __m256i x, const int p, __m256 *hi) {
    const __m256i mask = _mm256_set1_epi32(fp4 ? (int)0x81c00000u : (int)0x87f00000u);
    const int top = fp4 ? 12 - 4 * p : 8 - 8 * p; /* the code to bits 15.. of its half */
    const __m256i v = _mm256_srai_epi16(top ? _mm256_slli_epi16(x, top) : x, fp4 ? 6 : 4);
    *hi = _mm256_castsi256_ps(_mm256_and_si256(v, mask));
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 16), mask));
}

/* Chunk c of a row: 32 bytes, or for MXFP4 rows with K % 64 = 32 the last 16
 * (the missing lanes read zero codes). */
AVX2_INLINE __m256i load_chunk(const uint8_t *row, int64_t c, int half) {
    if (half) return _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_loadu_si128((const __m128i *)(row + c * 32)), 0);
    return _mm256_loadu_si256((const __m256i *)(row + c * 32));
}

/* The kernels.h tree of 4 outputs' lane vectors: out[i] = tree(v[i]). */
AVX2_INLINE __m128 tree4(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
    __m256 g = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
    return _mm_add_ps(_mm256_castps256_ps128(g), _mm256_extractf128_ps(g, 1));
}

static float tree1(const float *l) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); }

/* ---- activations in lane order ---- */

typedef struct pack_job {
    int fp4;
    const uint8_t *qa;
    const float *sa;
    int64_t K, Kp;
    float factor; /* a power of two the lanes are multiplied by (exact) */
    float *ap;    /* [M][Kp] */
    float *bmax;  /* [M][K/32]: max |a| per block, +inf for NaN (or NULL) */
    int tables;   /* decode through the tables only (see use_tables()) */
} pack_job;

/* Chunk c0 of row m, code by code from the tables (the plain statement of
 * the vector version below, which falls back to it for NaN codes or scales
 * its shortcut does not cover). */
static void pack_chunk_scalar(const pack_job *p, int64_t m, int64_t c0) {
    const float *e4m3 = di_cpu_e4m3_table();
    const int64_t K = p->K, KB = K / 32, C = chunk_codes(p->fp4), g = C / 8;
    const uint8_t *q = p->qa + m * K;
    float *dst = p->ap + m * p->Kp;
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
            if (j % (32 / g) == 0 || mx > *bm) *bm = mx;
        }
    }
}

/* Max of 8 lanes. */
AVX2_INLINE float hmax8(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_shuffle_ps(x, x, 1)));
}

/* The E4M3 activation codes decode with the weights' shift pair (dec_pos):
 * a code's bits give e4m3·2^-120 exactly, and times sa·2^120 (exact when
 * sa <= 2^7) that is e4m3·sa rounded once, as the table route gives. */
static AVX2 void pack_rows(void *ctx, int64_t m0, int64_t m1, int thread) {
    const pack_job *p = ctx;
    const int fp4 = p->fp4;
    const int64_t K = p->K, Kp = p->Kp, KB = K / 32, C = chunk_codes(fp4);
    const __m256i low7 = _mm256_set1_epi8(0x7f), absm = _mm256_set1_epi32(0x7fffffff);
    const __m256 f = _mm256_set1_ps(p->factor);
    for (int64_t m = m0; m < m1; m++) {
        const uint8_t *q = p->qa + m * K;
        const float *sa = p->sa + m * KB;
        float *dst = p->ap + m * Kp;
        for (int64_t c0 = 0; c0 < Kp; c0 += C) {
            const int64_t kb = c0 / 32;
            const int half = fp4 && c0 + 32 >= K; /* MXFP4: only the first 32 codes exist */
            const float s0 = sa[kb], s1 = fp4 && !half ? sa[kb + 1] : s0;
            __m256i x0 = _mm256_loadu_si256((const __m256i *)(q + c0));
            __m256i x1 = fp4 && !half ? _mm256_loadu_si256((const __m256i *)(q + c0 + 32)) : _mm256_setzero_si256();
            __m256i nan = _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(x0, low7), low7),
                                          _mm256_cmpeq_epi8(_mm256_and_si256(x1, low7), low7));
            if (p->tables || !(s0 >= 0.0f && s0 <= 0x1p7f && s1 >= 0.0f && s1 <= 0x1p7f) ||
                !_mm256_testz_si256(nan, nan)) {
                pack_chunk_scalar(p, m, c0);
                continue;
            }
            const __m256 sv = _mm256_setr_ps(s0 * 0x1p120f, s0 * 0x1p120f, s0 * 0x1p120f, s0 * 0x1p120f,
                                             s1 * 0x1p120f, s1 * 0x1p120f, s1 * 0x1p120f, s1 * 0x1p120f);
            __m256 mx = _mm256_setzero_ps();
            if (!fp4) {
#pragma GCC unroll 4
                for (int pos = 0; pos < 4; pos++) {
                    __m256 a = _mm256_mul_ps(dec_pos(0, x0, pos), sv);
                    mx = _mm256_max_ps(mx, _mm256_and_ps(a, _mm256_castsi256_ps(absm)));
                    _mm256_store_ps(dst + c0 + 8 * pos, _mm256_mul_ps(a, f));
                }
                if (p->bmax) p->bmax[m * KB + kb] = hmax8(mx);
                continue;
            }
            /* MXFP4 lane j holds bytes 8j..8j+7: words 2j (positions 0-3) and
             * 2j+1 (positions 4-7) of the 64 codes */
            const __m256i idx = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
            const __m256i e0 = _mm256_permutevar8x32_epi32(x0, idx), e1 = _mm256_permutevar8x32_epi32(x1, idx);
            const __m256i o0 = _mm256_permutevar8x32_epi32(x0, _mm256_add_epi32(idx, _mm256_set1_epi32(1)));
            const __m256i o1 = _mm256_permutevar8x32_epi32(x1, _mm256_add_epi32(idx, _mm256_set1_epi32(1)));
            const __m256i ev = _mm256_blend_epi32(e0, e1, 0xf0), od = _mm256_blend_epi32(o0, o1, 0xf0);
#pragma GCC unroll 8
            for (int pos = 0; pos < 8; pos++) {
                __m256 a = _mm256_mul_ps(dec_pos(0, pos < 4 ? ev : od, pos & 3), sv);
                mx = _mm256_max_ps(mx, _mm256_and_ps(a, _mm256_castsi256_ps(absm)));
                _mm256_store_ps(dst + c0 + 8 * pos, _mm256_mul_ps(a, f));
            }
            if (p->bmax) {
                p->bmax[m * KB + kb] = hmax8(_mm256_permute2f128_ps(mx, mx, 0x00));
                if (!half) p->bmax[m * KB + kb + 1] = hmax8(_mm256_permute2f128_ps(mx, mx, 0x11));
            }
        }
    }
}

/* Returns NULL when out of memory. */
static float *pack_lanes(int fp4, const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                         int64_t Kp, float factor, float *bmax, int tables, di_threadpool *tp) {
    float *ap = aligned_alloc(32, (size_t)((M * Kp * sizeof(float) + 31) & ~(size_t)31));
    if (!ap) return NULL;
    pack_job p = {fp4, qa, sa, K, Kp, factor, ap, bmax, tables};
    /* worth spreading only for prefill-sized inputs */
    di_threadpool_for(M * K >= (1 << 18) ? tp : NULL, M, 4, pack_rows, &p);
    return ap;
}

/* ---- CPUs with slow subnormals ----
 * The shift decoding above hands fp32 subnormals to the multiplies and FMAs
 * (E4M3 subnormal codes, the E2M1 code 0.5). AMD Zen cores take them at full
 * speed; Intel cores go through microcode assists (measured 0.1-0.5 GB/s for
 * decode rows, bench/RESULTS.md). Elsewhere than on AMD, every batch
 * therefore runs the prefill kernels with the activations laid out from the
 * E4M3 table and the weight tiles decoded to exact values (E4M3 gathered
 * from the table, E2M1 by a lane permute of its 8 magnitudes), then times
 * the scale: the products of the scalar code, no subnormal on the way. */

static atomic_int tables_mode = -1; /* -1: not decided; 0: shifts; 1: tables */
static atomic_int tables_forced;

static int use_tables(void) {
    int v = atomic_load_explicit(&tables_mode, memory_order_relaxed);
    if (v < 0) {
        __builtin_cpu_init();
        v = !__builtin_cpu_is("amd");
        atomic_store(&tables_mode, v);
    }
    return v || atomic_load_explicit(&tables_forced, memory_order_relaxed);
}

void di_cpu_kernels_force_tables(int on) { atomic_store(&tables_forced, on != 0); }

/* ---- prefill ---- */

typedef struct pf_job {
    int fp4;
    int tables;             /* decode through the tables only (see use_tables()) */
    const float *ap;        /* [M][Kp] */
    const uint8_t *w, *ws;
    int64_t M, K, Kp, N;
    float *out;             /* [M, N] */
    float *scratch;         /* [threads][scratch_floats]: tile [ROWS][KC], lanes [M][ROWS][8] */
    int64_t scratch_floats;
} pf_job;

/* Rows n0 .. n0+ROWS-1 (zeros past N), codes [k0, k0+kc) -> t[r][kc] in lane
 * order, each value w·sw rounded once as in the scalar code: the decoded
 * w·2^-120 (2^-126) times sw·2^120 (2^126) when that factor is exact, else
 * times 2^120 (2^126) first, which gives w exactly. */
static AVX2 void pf_decode(const pf_job *j, int64_t n0, int64_t k0, int64_t kc, float *t) {
    const int fp4 = j->fp4;
    const int64_t K = j->K, KB = K / 32, C = chunk_codes(fp4), rb = fp4 ? K / 2 : K;
    const int64_t c0 = k0 / C, c1 = (k0 + kc) / C;
    const float *e8m0 = di_cpu_e8m0_table();
    const float up = fp4 ? 0x1p126f : 0x1p120f, lim = fp4 ? 2.0f : 0x1p7f;
    const __m256 u = _mm256_set1_ps(up);
    for (int64_t r = 0; r < ROWS; r++) {
        float *tr = t + r * KC - c0 * C;
        const int64_t n = n0 + r;
        if (n >= j->N) {
            memset(tr + c0 * C, 0, (size_t)kc * sizeof(float));
            continue;
        }
        const uint8_t *row = j->w + n * rb;
        if (j->tables) { /* exact code values from the tables, times the scale */
            const __m256i byte = _mm256_set1_epi32(0xff), sign = _mm256_set1_epi32((int)0x80000000u);
            const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
            const float *e4m3 = di_cpu_e4m3_table();
            for (int64_t c = c0; c < c1; c++) {
                const int64_t kb = c * C / 32;
                const int half = fp4 && kb + 1 >= KB;
                const float s0 = e8m0[fp4 ? j->ws[n * KB + kb] : j->ws[(n / 32) * KB + kb]];
                const float s1 = fp4 && !half ? e8m0[j->ws[n * KB + kb + 1]] : s0;
                const __m256 f = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
                const __m256i x = load_chunk(row, c, half);
                for (int p = 0; p < 8 * C / 64; p++) {
                    __m256 v;
                    if (fp4) /* E2M1: magnitude by a lane permute (3 low bits), sign bit moved up */
                        v = _mm256_or_ps(_mm256_permutevar8x32_ps(mag, _mm256_srli_epi32(x, 4 * p)),
                                         _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(x, 28 - 4 * p), sign)));
                    else
                        v = _mm256_i32gather_ps(e4m3, _mm256_and_si256(_mm256_srli_epi32(x, 8 * p), byte), 4);
                    _mm256_store_ps(tr + c * C + 8 * p, _mm256_mul_ps(v, f));
                }
            }
            continue;
        }
        if (!fp4) {
            const uint8_t *st = j->ws + (n / 32) * KB; /* chunk c is block c */
            for (int64_t c = c0; c < c1; c++) {
                const float s = e8m0[st[c]];
                const __m256i x = load_chunk(row, c, 0);
                if (s <= lim) {
                    const __m256 f = _mm256_set1_ps(s * up);
#pragma GCC unroll 4
                    for (int p = 0; p < 4; p++) _mm256_store_ps(tr + c * 32 + 8 * p, _mm256_mul_ps(dec_pos(0, x, p), f));
                } else {
                    const __m256 f = _mm256_set1_ps(s);
#pragma GCC unroll 4
                    for (int p = 0; p < 4; p++)
                        _mm256_store_ps(tr + c * 32 + 8 * p, _mm256_mul_ps(_mm256_mul_ps(dec_pos(0, x, p), u), f));
                }
            }
            continue;
        }
        const uint8_t *st = j->ws + n * KB; /* chunk c holds blocks 2c, 2c+1 */
        for (int64_t c = c0; c < c1; c++) {
            const int half = 2 * c + 1 >= KB;
            const float s0 = e8m0[st[2 * c]], s1 = half ? s0 : e8m0[st[2 * c + 1]];
            const __m256i x = load_chunk(row, c, half);
            if (s0 <= lim && s1 <= lim) {
                const __m256 f = _mm256_set_m128(_mm_set1_ps(s1 * up), _mm_set1_ps(s0 * up));
#pragma GCC unroll 8
                for (int p = 0; p < 8; p++) _mm256_store_ps(tr + c * 64 + 8 * p, _mm256_mul_ps(dec_pos(1, x, p), f));
            } else {
                const __m256 f = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
#pragma GCC unroll 8
                for (int p = 0; p < 8; p++)
                    _mm256_store_ps(tr + c * 64 + 8 * p, _mm256_mul_ps(_mm256_mul_ps(dec_pos(1, x, p), u), f));
            }
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

static int pf_run(int fp4, int tables, const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                  const uint8_t *w, const uint8_t *ws, int64_t N, float *out, di_threadpool *tp) {
    const int threads = di_threadpool_size(tp);
    const int64_t C = chunk_codes(fp4), Kp = (K + C - 1) / C * C;
    const int64_t sf = ROWS * KC + M * ROWS * 8;
    float *ap = pack_lanes(fp4, qa, sa, M, K, Kp, 1.0f, NULL, tables, tp);
    float *scratch = aligned_alloc(32, (size_t)threads * (size_t)sf * sizeof(float));
    if (!ap || !scratch) {
        free(ap), free(scratch);
        return 0;
    }
    pf_job j = {fp4, tables, ap, w, ws, M, K, Kp, N, out, scratch, sf};
    const int64_t units = (N + ROWS - 1) / ROWS;
    /* several chunks per thread so a core slowed by other work takes fewer */
    const int64_t grain = units / (4 * threads);
    di_threadpool_for(tp, units, grain < 1 ? 1 : grain, pf_units, &j);
    free(ap), free(scratch);
    return 1;
}

/* ---- decode rows ---- */

typedef struct fp4_lim fp4_lim;

typedef struct dec_job {
    int fp4;
    const uint8_t *qa;      /* for the scalar fallback */
    const float *sa;
    const float *ap;        /* [M][lda]: a(k) (FP8) or a(k)·2^63 (MXFP4) */
    int64_t lda;            /* Kp, or 2·Kp for the AVX-512 loops' doubled lanes */
    int avx512;             /* MXFP4 rows through the AVX-512 loops */
    const float *abf;       /* MXFP4 rows through the BF16 loops (else NULL): their
                               activations [M][Kp]; ap then holds the AVX2 loops' */
    int bf_spread;          /* the BF16 loops' limit on a group's exponent spread */
    const float *bmax;      /* FP8: [K/32] max |a| over the rows per block */
    const uint8_t *w, *ws;
    int64_t M, K, Kp, N;
    float *out;             /* [M, N] */
    float *scratch;         /* [threads][scratch_floats]: FP8 folded activations
                               [M][Kp], MXFP4 scale factors [Kp/64 + 1][R][8] */
    int64_t scratch_floats;
    const fp4_lim *lim;     /* MXFP4: see dec_scales() */
} dec_job;

/* Weight rows at a time for M activation rows: R·mr accumulators for blocks
 * of mr <= DEC_MB activation rows. Every activation load feeds R FMAs (the
 * activations of a few rows already exceed L1), every decoded weight vector
 * mr FMAs; R·mr <= 8 leaves registers for the decoding (12 spilled). */
static int dec_rows_for(int64_t M, int avx512) {
    if (avx512) return di_dec_rows_avx512(M); /* 8 */
    return M == 1 ? 8 : M == 2 ? 4 : 2;
}
static int dec_block_rows(int64_t M) { return M <= 2 ? (int)M : 4; }

/* One chunk of dec_kernel(). */
AVX2_INLINE void dec_chunk(const int fp4, const int mr, const int R, int64_t c, const int half,
                           const uint8_t *const *rows, const float *a, int64_t lda,
                           const float *sv, __m256 acc[DEC_MB][8]) {
    const int P = fp4 ? 8 : 4;
    __m256i xr[2];
#pragma GCC unroll 2
    for (int r = 0; r < 2; r++)
        if (R <= 2 && r < R) xr[r] = load_chunk(rows[r], c, half);
    if (fp4) /* the chains into this chunk's scale domain */
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
            if (r < R) {
                const __m256 f = _mm256_load_ps(sv + (c * R + r) * 8);
#pragma GCC unroll 4
                for (int m = 0; m < DEC_MB; m++)
                    if (m < mr) acc[m][r] = _mm256_mul_ps(acc[m][r], f);
            }
    if (R >= 4) { /* see dec_pair() */
        __m256 hold[4][8];
#pragma GCC unroll 8
        for (int p = 0; p < P / 2; p++) {
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                if (r < R) {
                    const __m256 v = dec_pair(fp4, load_chunk(rows[r], c, half), p, &hold[p][r]);
#pragma GCC unroll 8
                    for (int m = 0; m < DEC_MB; m++)
                        if (m < mr)
                            acc[m][r] = _mm256_fmadd_ps(_mm256_load_ps(a + m * lda + c * 8 * P + 8 * p), v, acc[m][r]);
                }
            __asm__ volatile("" ::: "memory"); /* reload the chunks, see below */
        }
#pragma GCC unroll 8
        for (int p = P / 2; p < P; p++)
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                if (r < R)
#pragma GCC unroll 8
                    for (int m = 0; m < DEC_MB; m++)
                        if (m < mr)
                            acc[m][r] = _mm256_fmadd_ps(_mm256_load_ps(a + m * lda + c * 8 * P + 8 * p),
                                                        hold[p - P / 2][r], acc[m][r]);
        return;
    }
#pragma GCC unroll 8
    for (int p = 0; p < P; p++) {
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
            if (r < R) {
                const __m256 v = dec_pos(fp4, R >= 4 ? load_chunk(rows[r], c, half) : xr[r], p);
#pragma GCC unroll 8
                for (int m = 0; m < DEC_MB; m++)
                    if (m < mr)
                        acc[m][r] = _mm256_fmadd_ps(_mm256_load_ps(a + m * lda + c * 8 * P + 8 * p), v, acc[m][r]);
            }
        if (R >= 4) __asm__ volatile("" ::: "memory"); /* reload the chunks, see below */
    }
}

/* R weight rows (rowp[r]) × mr activation rows (a, stride lda) over all
 * chunks; FP8 lanes times a (folded), MXFP4 lanes times sv[c][r] first.
 * res[m][r] gets the outputs. ahead (or NULL): the R rows to prefetch
 * alongside, R·32 bytes per chunk. R >= 4 reloads each chunk (from L1) for
 * every position rather than keeping it in R registers next to the R·mr
 * accumulators, which would spill them (copying the chunks to an aligned
 * buffer first, against loads that split cache lines on misaligned rows,
 * measured slower); R <= 2 keeps them in registers. */
AVX2_INLINE void dec_kernel(const int fp4, const int mr, const int R, int64_t chunks, int half_last,
                            const uint8_t *const *rowp, const uint8_t *ahead, const float *a,
                            int64_t lda, const float *sv, float *res) {
    __m256 acc[DEC_MB][8];
    const uint8_t *rows[8]; /* in registers: not reloaded after each barrier */
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) rows[r] = r < R ? rowp[r] : NULL;
#pragma GCC unroll 8
    for (int m = 0; m < DEC_MB; m++)
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
            if (m < mr && r < R) acc[m][r] = _mm256_setzero_ps();
    if (ahead)
        for (int64_t c = 0; c < chunks - half_last; c++) {
#pragma GCC unroll 4
            for (int r = 0; r < R; r += 2) _mm_prefetch((const char *)ahead + (c * R + r) * 32, _MM_HINT_T1);
            dec_chunk(fp4, mr, R, c, 0, rows, a, lda, sv, acc);
        }
    else
        for (int64_t c = 0; c < chunks - half_last; c++) dec_chunk(fp4, mr, R, c, 0, rows, a, lda, sv, acc);
    if (half_last) dec_chunk(fp4, mr, R, chunks - 1, 1, rows, a, lda, sv, acc);
#pragma GCC unroll 8
    for (int m = 0; m < DEC_MB; m++)
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
            if (m < mr && r < R) {
                float l[8];
                if (fp4) acc[m][r] = _mm256_mul_ps(acc[m][r], _mm256_load_ps(sv + (chunks * R + r) * 8));
                _mm256_storeu_ps(l, acc[m][r]);
                res[m * 8 + r] = tree1(l);
            }
}

typedef di_dec_kernel_fn dec_kernel_fn;
#define DEC_KERNEL_FN(fp4, mr, R)                                                              \
    static AVX2 void dec_kernel_##fp4##_##mr##_##R(int64_t chunks, int half_last,              \
                                                   const uint8_t *const *rows,                 \
                                                   const uint8_t *ahead, const float *a,       \
                                                   int64_t lda, const float *sv, float *res) { \
        dec_kernel(fp4, mr, R, chunks, half_last, rows, ahead, a, lda, sv, res);               \
    }
#define DEC_KERNEL_FNS(fp4)                                                                    \
    DEC_KERNEL_FN(fp4, 1, 8) DEC_KERNEL_FN(fp4, 2, 4) DEC_KERNEL_FN(fp4, 1, 2)                 \
    DEC_KERNEL_FN(fp4, 2, 2) DEC_KERNEL_FN(fp4, 3, 2) DEC_KERNEL_FN(fp4, 4, 2)
DEC_KERNEL_FNS(0)
DEC_KERNEL_FNS(1)
/* The kernel for a block of mr rows of a batch of M (R = dec_rows_for(M, avx512)). */
static dec_kernel_fn dec_kernel_for(int fp4, int avx512, int64_t M, int mr) {
    if (avx512) return di_dec_kernel_mxfp4_avx512(M, mr);
    static const dec_kernel_fn r2[2][5] = {
        {0, dec_kernel_0_1_2, dec_kernel_0_2_2, dec_kernel_0_3_2, dec_kernel_0_4_2},
        {0, dec_kernel_1_1_2, dec_kernel_1_2_2, dec_kernel_1_3_2, dec_kernel_1_4_2}};
    if (M == 1) return fp4 ? dec_kernel_1_1_8 : dec_kernel_0_1_8;
    if (M == 2) return fp4 ? dec_kernel_1_2_4 : dec_kernel_0_2_4;
    return r2[fp4][mr];
}

/* MXFP4 decode rows keep each chain in the scale domain of the chunk it is
 * in: the lanes accumulate the decoded w·2^-126 times a·2^63, i.e. the terms
 * a·w·sw of kernels.h divided by sv = sw·2^63, and on entering chunk c the
 * chains are multiplied by sv(c-1)/sv(c) (lanes 0-3: blocks 2c-2 / 2c, lanes
 * 4-7: 2c-1 / 2c+1), at the end by the last sv. One multiply per chunk and
 * chain instead of one per decoded vector. The products are by powers of two
 * and every chain value is the scalar one times 2^t (t <= -1): the same
 * roundings, given
 * - no overflow: K·max|a|·6·max sw < 2^127 (the scalar sums stay finite, the
 *   scaled ones are smaller);
 * - no rounding below the normal range: every term is a multiple of
 *   Q = qa·2^(e_min-128), qa the quantum of the activations (2^-9·sa), so
 *   every chain value is too; where Q·2^t >= 2^-149 a value too small to be
 *   normal is exact in either domain (fewer than 24 significant bits). */
struct fp4_lim {
    int lo, hi;   /* E8M0 exponents allowed */
    int spread;   /* largest e_max - e_min of a row group */
    int q;        /* exponent of the activations' quantum */
};

/* The limits of the domain change above for activations ap = a·2^63
 * ([M][Kp]) with scales sa ([M][K/32]); 0 when the activations leave no
 * room (non-finite, too large, or scales that are not powers of two). */
static AVX2 int fp4_limits(const float *ap, int64_t n, const float *sa, int64_t nsa, int64_t K,
                           fp4_lim *lim) {
    /* max |ap| (n % 8 == 0, ap aligned): four vector maxima, not one scalar
     * chain of dependent maxss, which cost 7-9 % of a 192-row call */
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), big = _mm256_set1_ps(0x1p127f);
    __m256 mx[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 bad = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 32) /* n is a multiple of Kp, of 64 */
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            const __m256 v = _mm256_and_ps(_mm256_load_ps(ap + i + 8 * u), absm);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, big, _CMP_NLT_UQ)); /* NaN or >= 2^127 */
            mx[u] = _mm256_max_ps(mx[u], v);
        }
    /* a·2^63 must stay finite: |a| < 2^64 */
    if (!_mm256_testz_ps(bad, bad)) return 0;
    const float amax = hmax8(_mm256_max_ps(_mm256_max_ps(mx[0], mx[1]), _mm256_max_ps(mx[2], mx[3])));
    int q = 1000; /* exponent of the activations' quantum */
    for (int64_t i = 0; i < nsa; i++) {
        int e;
        if (!(sa[i] > 0.0f) || frexpf(sa[i], &e) != 0.5f) return 0;
        e = e - 1 - 9;
        q = e < q ? e : q;
    }
    q = q < -149 ? -149 : q;
    int amax_e = -200, l6k = 0;
    if (amax > 0.0f) {
        (void)frexpf(amax, &amax_e);
        amax_e -= 63; /* max|a| < 2^amax_e */
    }
    while (((int64_t)1 << l6k) < 6 * K) l6k++;
    lim->lo = -21 - q > 65 ? -21 - q : 65;
    lim->hi = 254 - amax_e - l6k < 191 ? 254 - amax_e - l6k : 191;
    lim->spread = q + 85 < 126 ? q + 85 : 126;
    lim->q = q;
    return lim->lo <= lim->hi && lim->spread >= 0;
}

/* dst[0..3] = 2^t0, dst[4..7] = 2^t1 (|t| <= 126). */
AVX2_INLINE void store_pow2(float *dst, int t0, int t1) {
    const __m256i t = _mm256_setr_epi32(t0, t0, t0, t0, t1, t1, t1, t1);
    _mm256_store_si256((__m256i *)dst, _mm256_slli_epi32(_mm256_add_epi32(t, _mm256_set1_epi32(127)), 23));
}

/* The R rows' factors: sv[c][r] = sv(c-1)/sv(c) for chunks c >= 1 (1 for
 * c = 0, entered from zero), sv[chunks][r] = sv(last) (E8M0 e: sv = 2^(e-64),
 * the ratio's bits (e_prev - e + 127) << 23). 0 when a scale is outside the
 * limits (the caller then runs the scalar code). */
static AVX2 int dec_scales(const uint8_t *const *srow, int R, int64_t KB, const fp4_lim *lim,
                           float *sv) {
    const int64_t chunks = (KB + 1) / 2;
    const __m256i bias = _mm256_set1_epi32(127);
    __m256i vmin = _mm256_set1_epi32(255), vmax = _mm256_setzero_si256();
    int emin = 255, emax = 0;
    for (int r = 0; r < R; r++) {
        const uint8_t *e = srow[r];
        _mm256_store_ps(sv + r * 8, _mm256_set1_ps(1.0f));
        int64_t c = 1;
        for (; 2 * c + 8 <= KB; c += 4) {
            const __m256i cur = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(e + 2 * c)));
            const __m256i prev = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(e + 2 * c - 2)));
            vmin = _mm256_min_epu32(vmin, cur), vmax = _mm256_max_epu32(vmax, cur);
            const __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(prev, cur), bias), 23));
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                __m256i idx = _mm256_setr_epi32(2 * i, 2 * i, 2 * i, 2 * i, 2 * i + 1, 2 * i + 1, 2 * i + 1, 2 * i + 1);
                _mm256_store_ps(sv + ((c + i) * R + r) * 8, _mm256_permutevar8x32_ps(f, idx));
            }
        }
        /* chunk 0, the tail and the last chunk's own factor (a last chunk of
         * one block repeats its scale in lanes 4-7, which read zero codes) */
        for (int64_t b = 0; b < 2; b++) {
            const int v = e[b < KB ? b : 0];
            emin = v < emin ? v : emin, emax = v > emax ? v : emax;
        }
        int p0 = e[0], p1 = KB > 1 ? e[1] : e[0];
        if (c > 1) p0 = e[2 * c - 2], p1 = e[2 * c - 1];
        for (; c <= chunks; c++) {
            if (c == chunks) {
                store_pow2(sv + (c * R + r) * 8, p0 - 64, p1 - 64);
                break;
            }
            const int e0 = e[2 * c], e1 = 2 * c + 1 < KB ? e[2 * c + 1] : e0;
            emin = e0 < emin ? e0 : emin, emax = e0 > emax ? e0 : emax;
            emin = e1 < emin ? e1 : emin, emax = e1 > emax ? e1 : emax;
            if (emax - emin > lim->spread) return 0; /* also keeps the ratio normal */
            store_pow2(sv + (c * R + r) * 8, p0 - e0, p1 - e1);
            p0 = e0, p1 = e1;
        }
    }
    int32_t mn[8], mx[8];
    _mm256_storeu_si256((__m256i *)mn, vmin), _mm256_storeu_si256((__m256i *)mx, vmax);
    for (int i = 0; i < 8; i++) {
        emin = mn[i] < emin ? mn[i] : emin;
        emax = mx[i] > emax ? mx[i] : emax;
    }
    return emin >= lim->lo && emax <= lim->hi && emax - emin <= lim->spread;
}

/* The paths of a group of decode rows. */
enum { DEC_AVX2, DEC_AVX512, DEC_BF16 };

/* Weight rows g0 .. g1-1 (at most one group of the path's R) for every
 * activation row; a: FP8 folded activations, else NULL. sc: the thread's
 * scratch for the factors. */
static AVX2 void dec_group(const dec_job *j, int path, int64_t g0, int64_t g1, const float *a, float *sc) {
    const int fp4 = j->fp4;
    const int64_t M = j->M, K = j->K, Kp = j->Kp, N = j->N, KB = K / 32, rb = fp4 ? K / 2 : K;
    const int64_t chunks = Kp / chunk_codes(fp4);
    const int half_last = fp4 && (K % 64) != 0;
    const int R = path == DEC_BF16 ? di_dec_rows_bf16(M) : dec_rows_for(M, path == DEC_AVX512);
    const int64_t nn = g1 - g0;
    /* the missing rows of the last group repeat its last row (results dropped) */
    const uint8_t *rows[16], *srow[16];
    for (int r = 0; r < R; r++) {
        const int64_t n = g0 + (r < nn ? r : nn - 1);
        rows[r] = j->w + n * rb;
        srow[r] = j->ws + n * KB;
    }
    int scaled = 1;
    int64_t lda = j->lda;
    if (path == DEC_BF16) {
        const int spread = j->bf_spread < j->lim->spread ? j->bf_spread : j->lim->spread;
        if (!di_dec_factors_avx512(srow, R, KB, j->lim->lo, j->lim->hi, spread, sc)) {
            /* beyond the BF16 loops' exponent range: the AVX2 loops */
            const int R2 = dec_rows_for(M, 0);
            for (int64_t h = g0; h < g1; h += R2) dec_group(j, DEC_AVX2, h, h + R2 < g1 ? h + R2 : g1, a, sc);
            return;
        }
        a = j->abf, lda = Kp;
    } else if (fp4) {
        scaled = path == DEC_AVX512 ? di_dec_factors_avx512(srow, R, KB, j->lim->lo, j->lim->hi, j->lim->spread, sc)
                                    : dec_scales(srow, R, KB, j->lim, sc);
        a = j->ap;
    }
    if (!scaled) {
        di_gemm_block_rows_scalar(1, j->qa, j->sa, M, K, j->w, j->ws, N, g0, g1, j->out);
        return;
    }
    /* the group two ahead, while it lies inside the weights (not for 8
     * rows or more a multiple of 4 KB apart: measured slower) */
    const uint8_t *ahead = (R >= 8 && rb % 4096 == 0) || g0 + 3 * R > N ? NULL : j->w + (g0 + 2 * R) * rb;
    const int mb = dec_block_rows(M);
    for (int64_t m0 = 0; m0 < M; m0 += mb) {
        const int mr = M - m0 < mb ? (int)(M - m0) : mb;
        float res[DEC_MB * 8];
        const dec_kernel_fn kern = path == DEC_BF16 ? di_dec_kernel_mxfp4_bf16(M, mr)
                                                    : dec_kernel_for(fp4, path == DEC_AVX512, M, mr);
        kern(chunks, half_last, rows, m0 ? NULL : ahead, a + m0 * lda, lda, sc, res);
        for (int64_t m = 0; m < mr; m++)
            for (int64_t r = 0; r < nn; r++) j->out[(m0 + m) * N + g0 + r] = res[m * 8 + r];
    }
}

/* Units [u0, u1) of UNIT weight rows: every activation row, all of K. */
static AVX2 void dec_units(void *ctx, int64_t u0, int64_t u1, int thread) {
    const dec_job *j = ctx;
    const int fp4 = j->fp4;
    const int64_t M = j->M, K = j->K, Kp = j->Kp, N = j->N, KB = K / 32;
    const int64_t chunks = Kp / chunk_codes(fp4);
    const int path = j->abf ? DEC_BF16 : j->avx512 ? DEC_AVX512 : DEC_AVX2;
    const int R = path == DEC_BF16 ? di_dec_rows_bf16(M) : dec_rows_for(M, j->avx512);
    const float *e8m0 = di_cpu_e8m0_table();
    float *sc = j->scratch + thread * j->scratch_floats;
    for (int64_t u = u0; u < u1; u++) {
        const int64_t n0 = u * UNIT, n1 = n0 + UNIT < N ? n0 + UNIT : N;
        const float *a = NULL;
        if (!fp4) {
            /* fold the tile's scales into the activations, if exact */
            const uint8_t *st = j->ws + (n0 / 32) * KB;
            int ok = 1;
            for (int64_t kb = 0; kb < KB && ok; kb++) {
                const float s = e8m0[st[kb]];
                ok = s >= 0x1p-117f && s <= 0x1p7f && j->bmax[kb] * s < 0x1p7f;
            }
            if (!ok) {
                di_gemm_block_rows_scalar(0, j->qa, j->sa, M, K, j->w, j->ws, N, n0, n1, j->out);
                continue;
            }
            for (int64_t m = 0; m < M; m++)
                for (int64_t c = 0; c < chunks; c++) {
                    const __m256 f = _mm256_set1_ps(e8m0[st[c]] * 0x1p120f);
#pragma GCC unroll 4
                    for (int p = 0; p < 4; p++) {
                        const int64_t i = m * Kp + c * 32 + 8 * p;
                        _mm256_store_ps(sc + i, _mm256_mul_ps(_mm256_load_ps(j->ap + i), f));
                    }
                }
            a = sc;
        }
        for (int64_t g0 = n0; g0 < n1; g0 += R) dec_group(j, path, g0, n1 - g0 < R ? n1 : g0 + R, a, sc);
    }
}

static int dec_run(int fp4, const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                   const uint8_t *w, const uint8_t *ws, int64_t N, float *out, di_threadpool *tp) {
    const int threads = di_threadpool_size(tp);
    const int64_t C = chunk_codes(fp4), Kp = (K + C - 1) / C * C, KB = K / 32;
    const int64_t sf = fp4 ? (Kp / 64 + 1) * 8 * 8 : M * Kp;
    float *bmax = fp4 ? NULL : malloc(sizeof(float) * (size_t)(M * KB));
    float *ap = pack_lanes(fp4, qa, sa, M, K, Kp, fp4 ? 0x1p63f : 1.0f, bmax, 0, NULL);
    /* 64-byte rows of factors for the AVX-512 loops' row pairs */
    float *scratch = aligned_alloc(64, (size_t)threads * (size_t)sf * sizeof(float));
    int avx512 = fp4 && M <= DEC512_M && di_cpu_kernels_avx512(), bf = 0;
    float *dup = NULL; /* the AVX-512 loops' activations: doubled fp32 lanes or bf16 pairs */
    if (!ap || !scratch || (!fp4 && !bmax)) {
        free(ap), free(scratch), free(bmax);
        return 0;
    }
    int ok = 1;
    fp4_lim lim = {0, 0, 0, 0};
    if (fp4) {
        ok = fp4_limits(ap, M * Kp, sa, M * KB, K, &lim);
        if (ok && avx512) {
            /* the BF16 loops where the activations' quantum leaves them a
             * range (kernels_avx512_bf16.c), else the fp32 ones */
            bf = di_cpu_kernels_bf16() && di_dec_bf16_spread(lim.q) >= 0;
            dup = aligned_alloc(64, (size_t)((bf ? 1 : 2) * M * Kp) * sizeof(float));
            if (!dup) {
                free(ap), free(scratch), free(bmax);
                return 0;
            }
            if (bf) di_dec_lanes_bf16(ap, M, Kp, dup), avx512 = 0;
            else di_dec_lanes_dup(ap, M, Kp, dup);
        }
    } else { /* max over the rows, per block */
        for (int64_t m = 1; m < M; m++)
            for (int64_t kb = 0; kb < KB; kb++)
                if (bmax[m * KB + kb] > bmax[kb]) bmax[kb] = bmax[m * KB + kb];
    }
    if (ok) {
        dec_job j = {.fp4 = fp4, .qa = qa, .sa = sa, .ap = avx512 ? dup : ap, .lda = avx512 ? 2 * Kp : Kp,
                     .avx512 = avx512, .abf = bf ? dup : NULL, .bf_spread = bf ? di_dec_bf16_spread(lim.q) : 0,
                     .bmax = bmax, .w = w, .ws = ws, .M = M, .K = K, .Kp = Kp, .N = N, .out = out,
                     .scratch = scratch, .scratch_floats = sf, .lim = &lim};
        const int64_t units = (N + UNIT - 1) / UNIT;
        /* several chunks per thread so a core slowed by other work takes fewer */
        const int64_t grain = units / (8 * threads);
        di_threadpool_for(tp, units, grain < 1 ? 1 : grain, dec_units, &j);
    }
    free(ap), free(scratch), free(bmax), free(dup);
    if (!ok) di_gemm_block_rows_scalar(fp4, qa, sa, M, K, w, ws, N, 0, N, out);
    return 1;
}

static void block_linear(int fp4, const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                         const uint8_t *w, const uint8_t *ws, int64_t N, float *out,
                         di_threadpool *tp) {
    if (M <= 0 || N <= 0) return;
    const int tables = use_tables();
    const int done = M <= DEC_M && !tables ? dec_run(fp4, qa, sa, M, K, w, ws, N, out, tp)
                                           : pf_run(fp4, tables, qa, sa, M, K, w, ws, N, out, tp);
    if (!done) { /* out of memory: the scalar path needs none */
        if (fp4) di_gemm_mxfp4_scalar(qa, sa, M, K, w, ws, N, out, tp);
        else di_gemm_fp8_scalar(qa, sa, M, K, w, ws, N, out, tp);
    }
}

void di_gemm_fp8_avx2(const uint8_t *qa, const float *sa, int64_t M, int64_t K, const uint8_t *w,
                      const uint8_t *ws, int64_t N, float *out, di_threadpool *tp) {
    block_linear(0, qa, sa, M, K, w, ws, N, out, tp);
}

void di_gemm_mxfp4_avx2(const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                        const uint8_t *w, const uint8_t *ws, int64_t N, float *out,
                        di_threadpool *tp) {
    block_linear(1, qa, sa, M, K, w, ws, N, out, tp);
}

#endif
