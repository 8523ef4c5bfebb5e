/* Row pairs in 512-bit registers, for the AVX-512 loops of the MXFP4 decode
 * rows (kernels_avx512_block.c: fp32 FMAs, kernels_avx512_bf16.c:
 * vdpbf16ps; kernels.h, architecture.md §2): one register holds the same
 * 32-byte chunk of two weight rows (row r in lanes 0-7, row r + 1 in 8-15),
 * so each row's eight chains of kernels.h stay whole. Include only from
 * files compiled for x86-64 (DI_HAVE_AVX2_KERNELS); callers need these
 * target features or more. */
#ifndef DI_BACKEND_CPU_KERNELS_AVX512_PAIR_H
#define DI_BACKEND_CPU_KERNELS_AVX512_PAIR_H

#include <immintrin.h>
#include <stdint.h>

#define PAIR_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx2,fma")))

/* Chunk c of rows a and b side by side; for MXFP4 rows with K % 64 = 32
 * the last chunk is 16 bytes, the rest read zero codes. Row b comes by a
 * merge-masked broadcast load rather than an insert, which keeps it off
 * the permute pipes. */
PAIR_INLINE __m512i pair_load(const uint8_t *ra, const uint8_t *rb, int64_t c, int half) {
    if (half) {
        const __m256i z = _mm256_setzero_si256();
        const __m256i lo = _mm256_inserti128_si256(z, _mm_loadu_si128((const __m128i *)(ra + c * 32)), 0);
        const __m256i hi = _mm256_inserti128_si256(z, _mm_loadu_si128((const __m128i *)(rb + c * 32)), 0);
        return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    return _mm512_mask_broadcast_i64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(ra + c * 32))),
                                       0xf0, _mm256_loadu_si256((const __m256i *)(rb + c * 32)));
}

/* A row pair's chain factors at one chunk, f[0..3] = (row r: lanes 0-3,
 * 4-7; row r + 1: lanes 0-3, 4-7), each spread over its 4 lanes. */
PAIR_INLINE __m512 pair_factors(const float *f) {
    const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_loadu_ps(f)));
}

/* The two outputs of a row pair's chains acc: times the last factors f,
 * then each row's 8 lanes through the tree of kernels.h. */
PAIR_INLINE void pair_finish(__m512 acc, const float *f, float *out0, float *out1) {
    float l[16];
    _mm512_storeu_ps(l, _mm512_mul_ps(acc, pair_factors(f)));
    *out0 = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    *out1 = ((l[8] + l[9]) + (l[10] + l[11])) + ((l[12] + l[13]) + (l[14] + l[15]));
}

/* The R rows of the group two ahead, R·32 bytes at chunk c (into L2). */
PAIR_INLINE void pair_prefetch(const uint8_t *ahead, int64_t c, const int R) {
#pragma GCC unroll 8
    for (int r = 0; r < R; r += 2) _mm_prefetch((const char *)ahead + (c * R + r) * 32, _MM_HINT_T1);
}

#endif
