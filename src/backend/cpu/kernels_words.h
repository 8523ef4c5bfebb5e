/* The word transpose the 512-bit prefill decodings share (FP8 panels in
 * kernels_avx2_block.c, MXFP4 tiles in kernels_avx2_mxfp4.c): the codes of
 * 16 weight rows' 32-byte chunks regrouped by 4-byte word, so that one
 * register holds word j of every row and the decoding of its codes gives
 * the 16 rows' values of one step side by side. Moving the codes (1 or 2
 * bytes a step of a lane, 4 or 8 codes a word) costs a fraction of moving
 * the decoded floats. The helper carries its own AVX-512 target
 * attributes: call it only where di_cpu_kernels_wide() says so. */
#ifndef DI_BACKEND_CPU_KERNELS_WORDS_H
#define DI_BACKEND_CPU_KERNELS_WORDS_H

#include "backend/cpu/kernels.h"

#ifdef DI_HAVE_AVX2_KERNELS
#include <immintrin.h>

/* r[i]: row i's chunk (zeros for a missing row). words[j] lane i: word j
 * of row i. Rows i and i + 8 share a register's halves; an 8 × 8 transpose
 * of words within the halves (32- then 64-bit unpacks) leaves each result
 * spread over the 128-bit lanes of two registers, which one two-register
 * permute joins in row order. 24 shuffles for 512 bytes. */
static inline __attribute__((always_inline, target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c"))) void
chunk_words16(const __m256i r[16], __m512i words[8]) {
    /* 128-bit lanes {0, 2} of a and b interleaved, and lanes {1, 3} */
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    const __m512i hi = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    __m512i a[8], t[8], u[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) a[i] = _mm512_inserti64x4(_mm512_castsi256_si512(r[i]), r[i + 8], 1);
#pragma GCC unroll 4
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm512_unpacklo_epi32(a[i], a[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(a[i], a[i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);         /* words 0 and 4 of rows i .. i + 3 */
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);     /* words 1 and 5 */
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]); /* 2 and 6 */
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]); /* 3 and 7 */
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) words[j] = _mm512_permutex2var_epi32(u[j & 3], j < 4 ? lo : hi, u[4 + (j & 3)]);
}

/* The 32 rows of a unit (row i at p + i·stride bytes), 64 bytes of each:
 * zb[t][h][j] lane i holds word j of row 16h + i's 32-byte chunk t. Each
 * row's line is read whole, in one load: rows a multiple of 4 KB apart
 * (the FP8 wo_a's) put a unit's 32 lines in one L1 set, where reading a
 * chunk at a time lost each line before its second half was read. */
static inline __attribute__((always_inline, target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c"))) void
lines_words32(const uint8_t *p, int64_t stride, __m512i zb[2][2][8]) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m512i l[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) l[i] = _mm512_loadu_si512((const void *)(p + (16 * h + i) * stride));
#pragma GCC unroll 2
        for (int t = 0; t < 2; t++) {
            __m256i r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) r[i] = t ? _mm512_extracti64x4_epi64(l[i], 1) : _mm512_castsi512_si256(l[i]);
            chunk_words16(r, zb[t][h]);
        }
    }
}

#endif
#endif
