/* AVX2 + FMA CPU kernels (kernels.h), compiled with per-function target
 * attributes so the library still runs on any x86-64 and only calls these
 * after di_cpu_has_avx2().
 *
 * Layout of the work. The output is cut into panels of NR = 16 columns (16
 * weight rows); threads take panels from the pool, so a column is computed by
 * one thread from start to end (no split-K). For each panel and each chunk of
 * KC inputs the weights are decoded once into a small transposed buffer
 * Bp[k][16] (fp32, L1-resident), then a register-blocked micro-kernel sweeps
 * all rows of the activations, MR = 6 rows at a time, with 12 accumulators of
 * 8 lanes (lanes = output columns). Each lane therefore runs exactly the
 * sequential chain of kernels.h: for decode the one row reuses Bp once, for
 * prefill Bp is reused by every 6-row block, which is what makes it
 * compute-bound rather than decode-bound.
 *
 * Decoding tricks (all exact):
 * - E4M3 -> fp32 goes through IEEE half: placing the 7 magnitude bits of the
 *   code at bits 13..7 of a half gives the half value w·2^-8 (subnormals
 *   included); F16C widens 8 halves at once. The activations are packed
 *   multiplied by 2^8 so that every product (a·2^8)·(w·2^-8) equals a·w
 *   exactly: the chain sees the same fp32 values as the scalar one.
 * - E2M1 codes map to the high byte of the half of e2m1·2^-8 (low bytes are
 *   all zero) with one pshufb.
 * - The 16x32 code tile is transposed as bytes (4 rounds of unpack on 16
 *   registers: two 16x16 transposes, one per 128-bit lane). */
#include "backend/cpu/kernels.h"

#ifdef DI_HAVE_AVX2_KERNELS

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

enum { NR = 16, MR = 6, KC = 256 };
enum { FMT_FP8, FMT_FP4, FMT_BF16, FMT_F32 };

typedef struct job {
    int fmt;
    const float *ap;    /* packed activations [ceil(M/MR)][K][MR] */
    const float *sa;    /* [M, K/32] (block formats) */
    const void *w;      /* weights, checkpoint layout */
    const uint8_t *ws;  /* weight scales (block formats) */
    int64_t M, K, N;
    float *out;         /* [M, N] */
} job;

/* ---- micro-kernels: C[mr][16] (row stride ldc) ---- */

/* Block formats: for each 32-block, 12 (or 2·mr) fresh block sums, then
 * C += (blk·sa)·sw. swv holds the 16 column scales of each block. */
AVX2_INLINE void ukr_block(const int mr, int64_t nkb, const float *ap, const float *bp,
                           const float *sa, int64_t sa_stride, const float *swv, float *c,
                           int64_t ldc) {
    for (int64_t kb = 0; kb < nkb; kb++) {
        __m256 acc[MR][2];
#pragma GCC unroll 6
        for (int m = 0; m < MR; m++)
            if (m < mr) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int k = 0; k < 32; k++) {
            __m256 b0 = _mm256_load_ps(bp), b1 = _mm256_load_ps(bp + 8);
#pragma GCC unroll 6
            for (int m = 0; m < MR; m++)
                if (m < mr) {
                    __m256 a = _mm256_broadcast_ss(ap + m);
                    acc[m][0] = _mm256_fmadd_ps(a, b0, acc[m][0]);
                    acc[m][1] = _mm256_fmadd_ps(a, b1, acc[m][1]);
                }
            ap += MR;
            bp += NR;
        }
        __m256 sw0 = _mm256_load_ps(swv), sw1 = _mm256_load_ps(swv + 8);
        swv += NR;
#pragma GCC unroll 6
        for (int m = 0; m < MR; m++)
            if (m < mr) {
                __m256 s = _mm256_broadcast_ss(sa + m * sa_stride + kb);
                float *cm = c + m * ldc;
                __m256 t0 = _mm256_mul_ps(_mm256_mul_ps(acc[m][0], s), sw0);
                __m256 t1 = _mm256_mul_ps(_mm256_mul_ps(acc[m][1], s), sw1);
                _mm256_storeu_ps(cm, _mm256_add_ps(_mm256_loadu_ps(cm), t0));
                _mm256_storeu_ps(cm + 8, _mm256_add_ps(_mm256_loadu_ps(cm + 8), t1));
            }
    }
}

/* Plain formats: C = fma chain over kc inputs, C loaded first. */
AVX2_INLINE void ukr_plain(const int mr, int64_t kc, const float *ap, const float *bp, float *c,
                           int64_t ldc) {
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int m = 0; m < MR; m++)
        if (m < mr) {
            acc[m][0] = _mm256_loadu_ps(c + m * ldc);
            acc[m][1] = _mm256_loadu_ps(c + m * ldc + 8);
        }
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(bp), b1 = _mm256_load_ps(bp + 8);
#pragma GCC unroll 6
        for (int m = 0; m < MR; m++)
            if (m < mr) {
                __m256 a = _mm256_broadcast_ss(ap + m);
                acc[m][0] = _mm256_fmadd_ps(a, b0, acc[m][0]);
                acc[m][1] = _mm256_fmadd_ps(a, b1, acc[m][1]);
            }
        ap += MR;
        bp += NR;
    }
#pragma GCC unroll 6
    for (int m = 0; m < MR; m++)
        if (m < mr) {
            _mm256_storeu_ps(c + m * ldc, acc[m][0]);
            _mm256_storeu_ps(c + m * ldc + 8, acc[m][1]);
        }
}

#define UKR_INSTANCES(mr)                                                                   \
    static AVX2 void ukr_block_##mr(int64_t nkb, const float *ap, const float *bp,          \
                                    const float *sa, int64_t sas, const float *swv,          \
                                    float *c, int64_t ldc) {                                 \
        ukr_block(mr, nkb, ap, bp, sa, sas, swv, c, ldc);                                    \
    }                                                                                        \
    static AVX2 void ukr_plain_##mr(int64_t kc, const float *ap, const float *bp, float *c, \
                                    int64_t ldc) {                                           \
        ukr_plain(mr, kc, ap, bp, c, ldc);                                                   \
    }
UKR_INSTANCES(1)
UKR_INSTANCES(2)
UKR_INSTANCES(3)
UKR_INSTANCES(4)
UKR_INSTANCES(5)
UKR_INSTANCES(6)

typedef void (*ukr_block_fn)(int64_t, const float *, const float *, const float *, int64_t,
                             const float *, float *, int64_t);
typedef void (*ukr_plain_fn)(int64_t, const float *, const float *, float *, int64_t);
static const ukr_block_fn ukr_blocks[MR + 1] = {NULL, ukr_block_1, ukr_block_2, ukr_block_3,
                                                ukr_block_4, ukr_block_5, ukr_block_6};
static const ukr_plain_fn ukr_plains[MR + 1] = {NULL, ukr_plain_1, ukr_plain_2, ukr_plain_3,
                                                ukr_plain_4, ukr_plain_5, ukr_plain_6};

/* ---- weight decoding into Bp[k][16] ---- */

/* Two 16x16 byte transposes at once, one per 128-bit lane: afterwards r[j]
 * holds in lane L the bytes that were at position j of lane L of r[0..15]. */
AVX2_INLINE void transpose_16x16_bytes(__m256i r[16]) {
    for (int round = 0; round < 4; round++) {
        __m256i t[16];
        for (int i = 0; i < 8; i++) {
            t[2 * i] = _mm256_unpacklo_epi8(r[i], r[i + 8]);
            t[2 * i + 1] = _mm256_unpackhi_epi8(r[i], r[i + 8]);
        }
        for (int i = 0; i < 16; i++) r[i] = t[i];
    }
}

/* Halves in 16-bit lanes (lo lane -> row k0, hi lane -> row k1 of Bp, columns
 * c0..c0+7) widened to fp32 and stored. */
AVX2_INLINE void store_halves(__m256i h, float *bp_k0, float *bp_k1) {
    _mm256_store_ps(bp_k0, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
    _mm256_store_ps(bp_k1, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
}

/* FP8: 16 rows × 32 codes (rows[i] points at the block) -> Bp[32][16] = w·2^-8. */
AVX2_INLINE void decode_fp8_block(const uint8_t *const rows[16], float *bp) {
    __m256i r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm256_loadu_si256((const __m256i *)rows[i]);
    transpose_16x16_bytes(r);
    const __m256i zero = _mm256_setzero_si256(), mask = _mm256_set1_epi16((short)0xbf80);
    for (int j = 0; j < 16; j++) {
        /* code b in the high byte, shifted right once (arithmetic): sign at
         * bit 15, magnitude at 13..7; bit 14 (a sign copy) cleared. */
        __m256i lo = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(zero, r[j]), 1), mask);
        __m256i hi = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(zero, r[j]), 1), mask);
        store_halves(lo, bp + j * NR, bp + (16 + j) * NR);
        store_halves(hi, bp + j * NR + 8, bp + (16 + j) * NR + 8);
    }
}

/* MXFP4: 16 rows × 16 bytes (32 codes) -> Bp[32][16] = e2m1·2^-8. */
AVX2_INLINE void decode_fp4_block(const uint8_t *const rows[16], float *bp) {
    /* high byte of the half e2m1(code)·2^-8 */
    const __m256i lut = _mm256_setr_epi8(0, 0x18, 0x1c, 0x1e, 0x20, 0x22, 0x24, 0x26, (char)0x80,
                                         (char)0x98, (char)0x9c, (char)0x9e, (char)0xa0,
                                         (char)0xa2, (char)0xa4, (char)0xa6, 0, 0x18, 0x1c, 0x1e,
                                         0x20, 0x22, 0x24, 0x26, (char)0x80, (char)0x98,
                                         (char)0x9c, (char)0x9e, (char)0xa0, (char)0xa2,
                                         (char)0xa4, (char)0xa6);
    const __m256i nib = _mm256_set1_epi8(0x0f), zero = _mm256_setzero_si256();
    __m256i r[16];
    for (int i = 0; i < 16; i++) {
        __m128i x = _mm_loadu_si128((const __m128i *)rows[i]);
        /* lo lane: even k (low nibbles), hi lane: odd k (high nibbles) */
        __m256i xx = _mm256_inserti128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1);
        r[i] = _mm256_shuffle_epi8(lut, _mm256_and_si256(xx, nib));
    }
    transpose_16x16_bytes(r);
    for (int j = 0; j < 16; j++) {
        __m256i lo = _mm256_unpacklo_epi8(zero, r[j]), hi = _mm256_unpackhi_epi8(zero, r[j]);
        store_halves(lo, bp + (2 * j) * NR, bp + (2 * j + 1) * NR);
        store_halves(hi, bp + (2 * j) * NR + 8, bp + (2 * j + 1) * NR + 8);
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
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8) {
        for (int half = 0; half < 2; half++) {
            __m256 r[8];
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
    }
    for (; k < kc; k++)
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

static AVX2 void panels(void *ctx, int64_t p0, int64_t p1, int thread) {
    const job *j = ctx;
    const int64_t M = j->M, K = j->K, N = j->N, KB = K / 32;
    const int block = j->fmt == FMT_FP8 || j->fmt == FMT_FP4;
    const float *e8m0 = di_cpu_e8m0_table();
    float bp[KC * NR] __attribute__((aligned(32)));
    float swv[(KC / 32) * NR] __attribute__((aligned(32)));
    float *edge = NULL; /* [M][16] result of a panel narrower than 16 */

    for (int64_t p = p0; p < p1; p++) {
        const int64_t n0 = p * NR, nn = N - n0 < NR ? N - n0 : NR;
        float *c;
        int64_t ldc;
        if (nn == NR) {
            c = j->out + n0;
            ldc = N;
        } else {
            if (!edge) edge = aligned_alloc(32, (size_t)((M * NR * sizeof(float) + 31) & ~(size_t)31));
            if (!edge) return; /* cannot happen in practice; leaves the panel unwritten */
            c = edge;
            ldc = NR;
        }
        for (int64_t m = 0; m < M; m++) memset(c + m * ldc, 0, NR * sizeof(float));

        for (int64_t k0 = 0; k0 < K; k0 += KC) {
            const int64_t kc = K - k0 < KC ? K - k0 : KC;
            const int64_t kb0 = k0 / 32, nkb = kc / 32;
            if (j->fmt == FMT_FP8) {
                const uint8_t *w = j->w;
                for (int64_t b = 0; b < nkb; b++) {
                    const uint8_t *rows[16];
                    for (int i = 0; i < 16; i++)
                        rows[i] = i < nn ? w + (n0 + i) * K + k0 + b * 32 : zero_row;
                    decode_fp8_block(rows, bp + b * 32 * NR);
                    /* a 16-column panel lies inside one 32-row scale tile */
                    __m256 s = _mm256_set1_ps(e8m0[j->ws[(n0 / 32) * KB + kb0 + b]]);
                    _mm256_store_ps(swv + b * NR, s);
                    _mm256_store_ps(swv + b * NR + 8, s);
                }
            } else if (j->fmt == FMT_FP4) {
                const uint8_t *w = j->w;
                for (int64_t b = 0; b < nkb; b++) {
                    const uint8_t *rows[16];
                    for (int i = 0; i < 16; i++) {
                        rows[i] = i < nn ? w + (n0 + i) * (K / 2) + (k0 + b * 32) / 2 : zero_row;
                        swv[b * NR + i] = i < nn ? e8m0[j->ws[(n0 + i) * KB + kb0 + b]] : 0.0f;
                    }
                    decode_fp4_block(rows, bp + b * 32 * NR);
                }
            } else {
                const void *rows[16];
                size_t esz = j->fmt == FMT_BF16 ? 2 : 4;
                for (int i = 0; i < 16; i++)
                    rows[i] = i < nn ? (const char *)j->w + ((n0 + i) * K + k0) * esz
                                     : (const void *)zero_row;
                decode_plain_chunk(j->fmt, rows, kc, bp);
            }
            for (int64_t m0 = 0; m0 < M; m0 += MR) {
                const int mr = M - m0 < MR ? (int)(M - m0) : MR;
                const float *ap = j->ap + m0 * K + k0 * MR;
                if (block)
                    ukr_blocks[mr](nkb, ap, bp, j->sa + m0 * KB + kb0, KB, swv, c + m0 * ldc, ldc);
                else
                    ukr_plains[mr](kc, ap, bp, c + m0 * ldc, ldc);
            }
        }
        if (c == edge)
            for (int64_t m = 0; m < M; m++) memcpy(j->out + m * N + n0, edge + m * NR, nn * sizeof(float));
    }
    free(edge);
}

/* Packs rows of activations as [ceil(M/MR)][K][MR] fp32 (missing rows zero);
 * codes are decoded and multiplied by 2^8 (see the top of the file). */
static float *pack_act(const uint8_t *qa, const float *x, int64_t M, int64_t K) {
    int64_t mb = (M + MR - 1) / MR;
    float *ap = aligned_alloc(32, (size_t)((mb * K * MR * sizeof(float) + 31) & ~(size_t)31));
    if (!ap) return NULL;
    const float *e4m3 = di_cpu_e4m3_table();
    for (int64_t b = 0; b < mb; b++) {
        float *dst = ap + b * K * MR;
        for (int m = 0; m < MR; m++) {
            int64_t row = b * MR + m;
            if (row >= M) {
                for (int64_t k = 0; k < K; k++) dst[k * MR + m] = 0.0f;
            } else if (qa) {
                const uint8_t *src = qa + row * K;
                for (int64_t k = 0; k < K; k++) dst[k * MR + m] = e4m3[src[k]] * 256.0f;
            } else {
                const float *src = x + row * K;
                for (int64_t k = 0; k < K; k++) dst[k * MR + m] = src[k];
            }
        }
    }
    return ap;
}

static void run(job *j, const uint8_t *qa, const float *x, di_threadpool *tp) {
    if (j->M <= 0 || j->N <= 0) return;
    float *ap = pack_act(qa, x, j->M, j->K);
    if (!ap) { /* out of memory: the scalar path needs none */
        switch (j->fmt) {
        case FMT_FP8: di_gemm_fp8_scalar(qa, j->sa, j->M, j->K, j->w, j->ws, j->N, j->out, tp); break;
        case FMT_FP4: di_gemm_mxfp4_scalar(qa, j->sa, j->M, j->K, j->w, j->ws, j->N, j->out, tp); break;
        case FMT_BF16: di_gemm_bf16_scalar(x, j->M, j->K, j->w, j->N, j->out, tp); break;
        default: di_gemm_f32_scalar(x, j->M, j->K, j->w, j->N, j->out, tp); break;
        }
        return;
    }
    j->ap = ap;
    int64_t np = (j->N + NR - 1) / NR;
    /* a few panels per hand-out: small enough to balance two busy cores */
    int64_t grain = np / (8 * di_threadpool_size(tp));
    if (grain < 1) grain = 1;
    if (grain > 16) grain = 16;
    di_threadpool_for(tp, np, grain, panels, j);
    free(ap);
}

void di_gemm_fp8_avx2(const uint8_t *qa, const float *sa, int64_t M, int64_t K, const uint8_t *w,
                      const uint8_t *ws, int64_t N, float *out, di_threadpool *tp) {
    job j = {FMT_FP8, NULL, sa, w, ws, M, K, N, out};
    run(&j, qa, NULL, tp);
}

void di_gemm_mxfp4_avx2(const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                        const uint8_t *w, const uint8_t *ws, int64_t N, float *out,
                        di_threadpool *tp) {
    job j = {FMT_FP4, NULL, sa, w, ws, M, K, N, out};
    run(&j, qa, NULL, tp);
}

void di_gemm_bf16_avx2(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                       float *out, di_threadpool *tp) {
    job j = {FMT_BF16, NULL, NULL, w, NULL, M, K, N, out};
    run(&j, NULL, x, tp);
}

void di_gemm_f32_avx2(const float *x, int64_t M, int64_t K, const float *w, int64_t N,
                      float *out, di_threadpool *tp) {
    job j = {FMT_F32, NULL, NULL, w, NULL, M, K, N, out};
    run(&j, NULL, x, tp);
}

void di_act_quant_fp8_avx2(const float *x, int64_t M, int64_t K, uint8_t *q, float *s) {
    di_act_quant_fp8_scalar(x, M, K, q, s);
}

void di_act_qdq_fp8_avx2(const float *x, int64_t n, float *out) { di_act_qdq_fp8_scalar(x, n, out); }

#endif
