/* AVX2 forms of the CPU backend's mHC projections and decoded-panel
 * products (cpu_ops_avx2.h; architecture.md §4, §5.6). Vector lanes are
 * independent outputs; every lane walks its reduction in the scalar op's
 * order. Scalar arithmetic inside these functions is written with
 * intrinsics too: a compiler may fuse a plain `a + b*c` in code built for
 * FMA, which would change the bits. */
#include "backend/cpu/cpu_ops_avx2.h"

#if defined(DI_HAVE_AVX2_OPS)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_quant.h"
#include "backend/cpu/kernels.h"

#define AVX2 __attribute__((target("avx2,fma")))

/* r[t] (lane j) <- r[j] (lane t): an 8x8 transpose in registers. */
AVX2 static inline __attribute__((always_inline)) void transpose8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* Up to 24 outputs (3 vectors) of up to 4 rows per pass: the weights of a
 * block of up to 64 consecutive k are transposed once into a [k, 24 o] tile
 * and read by every row, so 3·R independent chains hide the add latency.
 * The first pass also runs each row's sum of squares (ss) beside them, a
 * scalar chain in k order: on its own loop that chain's adds waited on one
 * another (and on the stack: R is a run-time count there), a third of the
 * op's time at one row (16 us a call at hc·d = 2,048 on a Zen 4 core).
 * The tile is built 8 weight rows at a time, each row's 64 k (4 cache lines)
 * read together: fn's rows lie n floats apart, so at n = 2,048 and beyond
 * they share L1 sets, and a row read 8 k at a time across all 24 rows lost
 * its line before the next 8 k; and the chains are kept in registers by
 * an instance per row count (42-91 cycles a k at one row before). */
AVX2 static inline __attribute__((always_inline)) void hc_project_rows(const int R, const float *u,
                                                                      int64_t ldu, int64_t n,
                                                                      const float *fn, int nmix,
                                                                      float *mix, float *ss) {
    enum { OB = 24, NV = OB / 8, KB = 64 };
    _Alignas(32) float tile[KB][OB];
    _Alignas(32) float part[4][OB];
    const int64_t n8 = n & ~(int64_t)7;
    for (int o0 = 0; o0 < nmix; o0 += OB) {
        int no = nmix - o0 < OB ? nmix - o0 : OB;
        __m256 acc[4][NV]; /* R is a constant here: the chains stay in registers */
        __m128 sq[4];      /* the sums of squares, in the first pass */
        const int with_ss = ss && o0 == 0;
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            sq[r] = _mm_setzero_ps();
#pragma GCC unroll 3
            for (int v = 0; v < NV; v++) acc[r][v] = _mm256_setzero_ps();
        }
        for (int64_t k0 = 0; k0 < n8; k0 += KB) {
            const int kb = n8 - k0 < KB ? (int)(n8 - k0) : KB;
            for (int v = 0; v < NV; v++)
                for (int j = 0; j < kb; j += 8) {
                    __m256 rr[8];
#pragma GCC unroll 8
                    for (int t = 0; t < 8; t++) {
                        int o = 8 * v + t;
                        rr[t] = o < no ? _mm256_loadu_ps(fn + (int64_t)(o0 + o) * n + k0 + j)
                                       : _mm256_setzero_ps();
                    }
                    transpose8(rr);
#pragma GCC unroll 8
                    for (int t = 0; t < 8; t++) _mm256_store_ps(&tile[j + t][8 * v], rr[t]);
                }
            for (int t = 0; t < kb; t++)
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++)
                    if (r < R) {
                        const __m256 ub = _mm256_broadcast_ss(u + r * ldu + k0 + t);
#pragma GCC unroll 3
                        for (int v = 0; v < NV; v++)
                            acc[r][v] = _mm256_add_ps(acc[r][v], _mm256_mul_ps(ub, _mm256_load_ps(&tile[t][8 * v])));
                        if (with_ss) {
                            const __m128 u1 = _mm256_castps256_ps128(ub);
                            sq[r] = _mm_add_ss(sq[r], _mm_mul_ss(u1, u1));
                        }
                    }
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 3
            for (int v = 0; v < NV; v++)
                if (r < R) _mm256_store_ps(&part[r][8 * v], acc[r][v]);
        if (with_ss)
            for (int r = 0; r < R; r++) {
                __m128 a = sq[r];
                for (int64_t kk = n8; kk < n; kk++) {
                    const __m128 u1 = _mm_set_ss(u[r * ldu + kk]);
                    a = _mm_add_ss(a, _mm_mul_ss(u1, u1));
                }
                ss[r] = _mm_cvtss_f32(a);
            }
        for (int r = 0; r < R; r++)
            for (int o = 0; o < no; o++) {
                __m128 a = _mm_set_ss(part[r][o]);
                for (int64_t kk = n8; kk < n; kk++) /* the chain goes on past the last 8 */
                    a = _mm_add_ss(a, _mm_mul_ss(_mm_set_ss(u[r * ldu + kk]),
                                                 _mm_set_ss(fn[(int64_t)(o0 + o) * n + kk])));
                mix[r * nmix + o0 + o] = _mm_cvtss_f32(a);
            }
    }
}

#define HC_PROJECT_ROWS(R)                                                                     \
    AVX2 static void hc_project_##R(const float *u, int64_t ldu, int64_t n, const float *fn,  \
                                    int nmix, float *mix, float *ss) {                        \
        hc_project_rows(R, u, ldu, n, fn, nmix, mix, ss);                                      \
    }
HC_PROJECT_ROWS(1)
HC_PROJECT_ROWS(2)
HC_PROJECT_ROWS(3)
HC_PROJECT_ROWS(4)

AVX2 void di_cpu_hc_project_avx2(const float *u, int64_t ldu, int R, int64_t n, const float *fn,
                                 int nmix, float *mix, float *ss) {
    switch (R) {
    case 1: hc_project_1(u, ldu, n, fn, nmix, mix, ss); break;
    case 2: hc_project_2(u, ldu, n, fn, nmix, mix, ss); break;
    case 3: hc_project_3(u, ldu, n, fn, nmix, mix, ss); break;
    default: hc_project_4(u, ldu, n, fn, nmix, mix, ss); break;
    }
}

#define F16C_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* 8 codes (b8, one row) times their scale sc as fp32, through F16C: a
 * code's byte at the top of a 16-bit half, shifted right by one with its
 * sign and masked (0xbf80), is the fp16 of its value times 2^-8 (E4M3
 * subnormals become fp16 subnormals), which vcvtph2ps turns into a normal
 * fp32 exactly; then one rounding multiply by the scale (times 2^8 folded
 * into it where that is exact, else applied first), the single rounding of
 * the scalar decoding's e4m3·e8m0. The NaN codes give NaN with their sign. */
F16C_INLINE __m256 fp8x8_half(uint64_t b8, float sc) {
    const __m128i b = _mm_cvtsi64_si128((long long)b8);
    const __m256 v = _mm256_cvtph_ps(
        _mm_and_si128(_mm_srai_epi16(_mm_unpacklo_epi8(_mm_setzero_si128(), b), 1), _mm_set1_epi16((short)0xbf80)));
    const __m256 y = sc <= 0x1p119f ? _mm256_mul_ps(v, _mm256_set1_ps(sc * 0x1p8f))
                                    : _mm256_mul_ps(_mm256_mul_ps(v, _mm256_set1_ps(0x1p8f)), _mm256_set1_ps(sc));
    const __m256i c = _mm256_cvtepu8_epi32(b), m7f = _mm256_set1_epi32(0x7f);
    const __m256i nan = _mm256_or_si256(_mm256_set1_epi32(0x7fc00000), _mm256_slli_epi32(_mm256_srli_epi32(c, 7), 31));
    return _mm256_castsi256_ps(
        _mm256_blendv_epi8(_mm256_castps_si256(y), nan, _mm256_cmpeq_epi32(_mm256_and_si256(c, m7f), m7f)));
}

/* The same arithmetically, for AMD cores, which take fp32 subnormals at
 * full speed (0.33 against 0.42 ns a value through F16C): the 7 magnitude
 * bits placed at fp32 bit 20 make exponent and mantissa fields whose value
 * times 2^120 is the E4M3 value exactly, the sign goes to bit 31, the NaN
 * codes give NaN; then the scale. On Intel cores this hands fp32
 * subnormals (7 codes in 128) to a multiply, a microcode assist: the panel
 * ran 7x slower on random codes than on codes without subnormals (2.4
 * against 0.33 ns a value), hence the F16C form there. */
F16C_INLINE __m256 fp8x8_shift(uint64_t b8, float sc) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)b8)), m7f = _mm256_set1_epi32(0x7f);
    const __m256i mag = _mm256_and_si256(b, m7f);
    const __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, 20)),
                                   _mm256_castsi256_ps(_mm256_set1_epi32((127 + 120) << 23)));
    __m256i bits = _mm256_blendv_epi8(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fc00000), _mm256_cmpeq_epi32(mag, m7f));
    bits = _mm256_or_si256(bits, _mm256_slli_epi32(_mm256_srli_epi32(b, 7), 31));
    return _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(sc));
}

/* Codes of 8 rows x 8 k decoded (the FP8 kernels' choice of form,
 * di_cpu_kernels_fp8_half) and transposed in registers. */
__attribute__((target("avx2,fma,f16c"))) void di_cpu_fp8_panel8_avx2(const uint8_t *w, const uint8_t *s, int64_t K,
                                                                     int64_t r0, int nb, float *pt) {
    const float *e8m0 = di_cpu_e8m0_table();
    const int half = di_cpu_kernels_fp8_half();
    int64_t kb = K / 32;
    for (int64_t k = 0; k < K; k += 8) {
        __m256 rr[8];
        for (int j = 0; j < 8; j++) {
            if (j >= nb) {
                rr[j] = _mm256_setzero_ps();
                continue;
            }
            int64_t n = r0 + j;
            uint64_t b8;
            memcpy(&b8, w + n * K + k, 8);
            const float sc = e8m0[s[(n / 32) * kb + k / 32]];
            rr[j] = half ? fp8x8_half(b8, sc) : fp8x8_shift(b8, sc);
        }
        transpose8(rr);
        for (int t = 0; t < 8; t++) _mm256_store_ps(pt + (k + t) * 8, rr[t]);
    }
}

/* Packed cache rows (backend/kvstore.h): an attention query decodes its
 * 640 rows once for all heads, an index-score call every key it scores;
 * the scalar loop's table reads and per-value multiply were ~12 % of a
 * small model's prefill (the tiny fixture's few heads share each row less).
 * FP8 rows take the panels' E4M3 decoding (fp8x8_*: e4m3 · scale with the
 * scalar product's one rounding); FP4 rows pick each value's nibble with a
 * variable shift and its E2M1 magnitude from an 8-entry table, the sign
 * from the nibble's top bit, then times the block's scale (exact: at most 6
 * significant bits), as di_e2m1_to_f32(c) · s. */
AVX2 static inline __attribute__((always_inline)) __m256 e2m1x8(uint32_t codes, __m256 mag, __m256 sc) {
    const __m256i nib = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)codes),
                                                           _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                         _mm256_set1_epi32(15));
    const __m256 v = _mm256_permutevar8x32_ps(mag, nib); /* the low 3 bits index */
    const __m256 sgn = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(nib, 3), 31));
    return _mm256_mul_ps(_mm256_xor_ps(v, sgn), sc);
}

__attribute__((target("avx2,fma,f16c"))) void di_cpu_kvq_unpack_avx2(di_kvq f, const uint8_t *row, int64_t n,
                                                                     float *x) {
    const float *e4m3 = di_cpu_e4m3_table(), *e8m0 = di_cpu_e8m0_table();
    if (f == DI_KVQ_FP8) {
        const int half = di_cpu_kernels_fp8_half();
        const uint8_t *sc = row + n;
        for (int64_t b = 0; b < n; b += 32) {
            const float s = e8m0[sc[b / 32]];
            for (int64_t k = b; k < b + 32; k += 8) {
                uint64_t b8;
                memcpy(&b8, row + k, 8);
                _mm256_storeu_ps(x + k, half ? fp8x8_half(b8, s) : fp8x8_shift(b8, s));
            }
        }
        return;
    }
    const int64_t bl = di_kvq_block(f);
    const uint8_t *sc = row + n / 2;
    const float *stab = f == DI_KVQ_FP4_E4M3 ? e4m3 : e8m0;
    const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    for (int64_t b = 0; b < n; b += bl) {
        const __m256 s = _mm256_set1_ps(stab[sc[b / bl]]);
        for (int64_t k = b; k < b + bl; k += 8) {
            uint32_t c4;
            memcpy(&c4, row + k / 2, 4);
            _mm256_storeu_ps(x + k, e2m1x8(c4, mag, s));
        }
    }
}

/* di_round_bf16 on 8 lanes: round to nearest even at bit 16, NaN kept
 * quiet (bit 22 set) and truncated, as di_f32_to_bf16 does. */
AVX2 static inline __attribute__((always_inline)) __m256 round_bf16(__m256 x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), hi);
    __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));
    __m256i q = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), hi);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(r, q, nan));
}

/* Lanes k .. k+7 below n: a full load, or the tail through a zeroed
 * buffer (masked loads and stores are slow on some cores). */
AVX2 static inline __attribute__((always_inline)) __m256 load8(const float *p, int64_t k, int64_t n) {
    if (k + 8 <= n) return _mm256_loadu_ps(p + k);
    _Alignas(32) float b[8] = {0};
    memcpy(b, p + k, (size_t)(n - k) * sizeof(float));
    return _mm256_load_ps(b);
}

AVX2 static inline __attribute__((always_inline)) void store8(float *p, int64_t k, int64_t n, __m256 v) {
    if (k + 8 <= n) {
        _mm256_storeu_ps(p + k, v);
        return;
    }
    _Alignas(32) float b[8];
    _mm256_store_ps(b, v);
    memcpy(p + k, b, (size_t)(n - k) * sizeof(float));
}

AVX2 void di_cpu_sumsq_rows8_avx2(const float *x, int64_t ldx, int64_t n, float ss[8]) {
    __m256 acc = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) { /* 8 values of each row, transposed: column j is step k + j of every chain */
        __m256 c[8];
        for (int r = 0; r < 8; r++) c[r] = _mm256_loadu_ps(x + r * ldx + k);
        transpose8(c);
        for (int j = 0; j < 8; j++) acc = _mm256_add_ps(acc, _mm256_mul_ps(c[j], c[j]));
    }
    _mm256_storeu_ps(ss, acc);
    for (int r = 0; r < 8; r++) /* the tail, each chain on */
        for (int64_t t = k; t < n; t++) {
            const float q = x[r * ldx + t] * x[r * ldx + t];
            ss[r] = ss[r] + q;
        }
}

AVX2 void di_cpu_norm_scale_avx2(const float *x, const float *w, int64_t n, float r, float *y) {
    const __m256 rv = _mm256_set1_ps(r);
    for (int64_t k = 0; k < n; k += 8)
        store8(y, k, n, round_bf16(_mm256_mul_ps(load8(w, k, n), _mm256_mul_ps(load8(x, k, n), rv))));
}

AVX2 void di_cpu_swiglu_out_avx2(const float *g, const float *t, const float *u, int64_t n, float limit, int clamp,
                                 const float *wi, float *o) {
    const __m256 one = _mm256_set1_ps(1.0f), hi = _mm256_set1_ps(limit), lo = _mm256_set1_ps(-limit);
    const __m256 zero = _mm256_setzero_ps(), wv = _mm256_set1_ps(wi ? *wi : 1.0f);
    for (int64_t k = 0; k < n; k += 8) {
        const __m256 gv = load8(g, k, n), tv = load8(t, k, n);
        __m256 uv = load8(u, k, n);
        if (clamp) /* max / min return their second operand on a NaN first: uv > -limit ? uv : -limit */
            uv = _mm256_min_ps(_mm256_max_ps(uv, lo), hi);
        const __m256 num = _mm256_blendv_ps(tv, one, _mm256_cmp_ps(gv, zero, _CMP_GE_OQ));
        __m256 v = _mm256_mul_ps(_mm256_mul_ps(gv, _mm256_div_ps(num, _mm256_add_ps(one, tv))), uv);
        if (wi) v = _mm256_mul_ps(wv, v);
        store8(o, k, n, round_bf16(v));
    }
}

AVX2 void di_cpu_hc_collapse_avx2(const float *s, const float *w, int hc, int64_t d, float *y) {
    for (int64_t k = 0; k < d; k += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int c = 0; c < hc; c++)
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(w[c]), load8(s + c * d, k, d)));
        store8(y, k, d, round_bf16(acc));
    }
}

AVX2 void di_cpu_hc_expand_avx2(const float *y, const float *s, const float *post, const float *comb,
                                int hc, int64_t d, float *out) {
    for (int64_t k = 0; k < d; k += 8) {
        const __m256 yk = load8(y, k, d);
        __m256 sv[DI_HC_EXPAND_MAX]; /* every stream's 8 channels held, so out may be s */
        for (int a = 0; a < hc; a++) sv[a] = load8(s + a * d, k, d);
        for (int b = 0; b < hc; b++) {
            __m256 acc = _mm256_setzero_ps();
            for (int a = 0; a < hc; a++)
                acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(comb[a * hc + b]), sv[a]));
            const __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(post[b]), yk), acc);
            store8(out + b * d, k, d, round_bf16(v));
        }
    }
}

AVX2 void di_cpu_hc_mean_avx2(const float *s, int hc, int64_t d, float *out) {
    __m256 n = _mm256_set1_ps((float)hc);
    for (int64_t k = 0; k < d; k += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int c = 0; c < hc; c++) acc = _mm256_add_ps(acc, load8(s + c * d, k, d));
        store8(out, k, d, round_bf16(_mm256_div_ps(acc, n)));
    }
}

/* Each 8x8 tile of the rows is transposed once and read by every q. The
 * accumulators must stay in registers: with the count of q vectors a
 * run-time bound they went through memory, each add waiting on the last
 * one's store (one head-pair task of a decode row's attention ~4x slower),
 * so every count from 1 to QB is its own instance. */
enum { DOTS_QB = 8 }; /* q vectors per pass */
AVX2 static inline __attribute__((always_inline)) void dots8_pass(const int nv, const float *q, int64_t n,
                                                                const float *const rows[8], float *out) {
    __m256 acc[DOTS_QB];
#pragma GCC unroll 8
    for (int v = 0; v < DOTS_QB; v++) acc[v] = _mm256_setzero_ps();
    for (int64_t t = 0; t < n; t += 8) {
        __m256 col[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) col[j] = _mm256_loadu_ps(rows[j] + t);
        transpose8(col);
#pragma GCC unroll 8
        for (int v = 0; v < DOTS_QB; v++)
            if (v < nv) {
                const float *qv = q + (int64_t)v * n + t;
#pragma GCC unroll 8
                for (int u = 0; u < 8; u++)
                    acc[v] = _mm256_add_ps(acc[v], _mm256_mul_ps(_mm256_broadcast_ss(qv + u), col[u]));
            }
    }
#pragma GCC unroll 8
    for (int v = 0; v < DOTS_QB; v++)
        if (v < nv) _mm256_storeu_ps(out + (int64_t)v * 8, acc[v]);
}
#define DOTS8_PASS(nv) \
    AVX2 static void dots8_pass_##nv(const float *q, int64_t n, const float *const rows[8], float *out) { \
        dots8_pass(nv, q, n, rows, out);                                                              \
    }
DOTS8_PASS(1)
DOTS8_PASS(2)
DOTS8_PASS(3)
DOTS8_PASS(4)
DOTS8_PASS(5)
DOTS8_PASS(6)
DOTS8_PASS(7)
DOTS8_PASS(8)

AVX2 void di_cpu_dots8_avx2(const float *q, int nq, int64_t n, const float *const rows[8], float *out) {
    static void (*const pass[DOTS_QB + 1])(const float *, int64_t, const float *const[8], float *) = {
        NULL, dots8_pass_1, dots8_pass_2, dots8_pass_3, dots8_pass_4,
        dots8_pass_5, dots8_pass_6, dots8_pass_7, dots8_pass_8};
    for (int v0 = 0; v0 < nq; v0 += DOTS_QB) {
        const int nv = nq - v0 < DOTS_QB ? nq - v0 : DOTS_QB;
        pass[nv](q + (int64_t)v0 * n, n, rows, out + (int64_t)v0 * 8);
    }
}

AVX2 void di_cpu_index_combine8_avx2(const float *dots, const float *w, int hi, float *out) {
    __m256 total = _mm256_setzero_ps(), zero = _mm256_setzero_ps();
    for (int h = 0; h < hi; h++) {
        __m256 d = round_bf16(_mm256_loadu_ps(dots + h * 8));
        d = _mm256_blendv_ps(d, zero, _mm256_cmp_ps(d, zero, _CMP_LT_OQ));
        total = _mm256_add_ps(total, round_bf16(_mm256_mul_ps(d, _mm256_set1_ps(w[h]))));
    }
    _mm256_storeu_ps(out, round_bf16(total));
}

/* acc = acc·rescale, then acc += p[j]·rows[j] for j < nj with rows[j]
 * set, in j order (multiply, then add), with 64 channels of acc held in
 * registers across the rows: loaded and stored for every row as before
 * (one call a slot), that step was a third of a decode row's attention.
 * n % 8 == 0. */
AVX2 void di_cpu_pv_avx2(float *acc, float rescale, const float *p, const float *const *rows, int nj, int64_t n) {
    enum { V = 8 };
    const __m256 rs = _mm256_set1_ps(rescale);
    int64_t k0 = 0;
    for (; k0 + 8 * V <= n; k0 += 8 * V) {
        __m256 a[V];
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) a[v] = _mm256_mul_ps(_mm256_loadu_ps(acc + k0 + 8 * v), rs);
        for (int j = 0; j < nj; j++) {
            if (!rows[j]) continue;
            const __m256 pj = _mm256_set1_ps(p[j]);
            const float *r = rows[j] + k0;
#pragma GCC unroll 8
            for (int v = 0; v < V; v++) a[v] = _mm256_add_ps(a[v], _mm256_mul_ps(pj, _mm256_loadu_ps(r + 8 * v)));
        }
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) _mm256_storeu_ps(acc + k0 + 8 * v, a[v]);
    }
    for (; k0 < n; k0 += 8) {
        __m256 a = _mm256_mul_ps(_mm256_loadu_ps(acc + k0), rs);
        for (int j = 0; j < nj; j++)
            if (rows[j]) a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(rows[j] + k0)));
        _mm256_storeu_ps(acc + k0, a);
    }
}

AVX2 void di_cpu_round_bf16_avx2(float *x, int64_t n) {
    for (int64_t k = 0; k < n; k += 8) store8(x, k, n, round_bf16(load8(x, k, n)));
}

AVX2 void di_cpu_add_avx2(float *y, const float *x, int64_t n) {
    for (int64_t k = 0; k < n; k += 8) store8(y, k, n, _mm256_add_ps(load8(y, k, n), load8(x, k, n)));
}

AVX2 void di_cpu_scale_bf16_avx2(float *x, int64_t n, float c) {
    const __m256 vc = _mm256_set1_ps(c);
    for (int64_t k = 0; k < n; k += 8) store8(x, k, n, round_bf16(_mm256_mul_ps(load8(x, k, n), vc)));
}

AVX2 void di_cpu_div_bf16_avx2(const float *acc, float sum, int64_t n, float *out) {
    __m256 vs = _mm256_set1_ps(sum);
    for (int64_t k = 0; k < n; k += 8) store8(out, k, n, round_bf16(_mm256_div_ps(load8(acc, k, n), vs)));
}

/* Lane r holds matrix r; every step is the scalar step, lane by lane
 * (additions and divisions are correctly rounded in both forms). */
AVX2 void di_cpu_hc_sinkhorn_avx2(float *c, int R, int hc, float eps, int iters) {
    __m256 v[16 * 16];
    _Alignas(32) float lane[8];
    int e = hc * hc;
    for (int j = 0; j < e; j++) {
        for (int r = 0; r < 8; r++) lane[r] = r < R ? c[r * e + j] : 1.0f;
        v[j] = _mm256_load_ps(lane);
    }
    __m256 ve = _mm256_set1_ps(eps);
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int a = 0; a < hc; a++) {
                __m256 sum = _mm256_setzero_ps();
                for (int b = 0; b < hc; b++) sum = _mm256_add_ps(sum, v[a * hc + b]);
                sum = _mm256_add_ps(sum, ve);
                for (int b = 0; b < hc; b++) v[a * hc + b] = _mm256_div_ps(v[a * hc + b], sum);
            }
        for (int b = 0; b < hc; b++) {
            __m256 sum = _mm256_setzero_ps();
            for (int a = 0; a < hc; a++) sum = _mm256_add_ps(sum, v[a * hc + b]);
            sum = _mm256_add_ps(sum, ve);
            for (int a = 0; a < hc; a++) v[a * hc + b] = _mm256_div_ps(v[a * hc + b], sum);
        }
    }
    for (int j = 0; j < e; j++) {
        _mm256_store_ps(lane, v[j]);
        for (int r = 0; r < R; r++) c[r * e + j] = lane[r];
    }
}

/* Four rows at a time share each panel load; every (row, lane) is its own
 * fused chain over k. */
AVX2 void di_cpu_panel8_f32_avx2(const float *pt, int64_t K, const float *x, int64_t ldx, int64_t m,
                                 float *y, int64_t ldy, int nb) {
    _Alignas(32) float out[8];
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
        const float *x0 = x + i * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t k = 0; k < K; k++) {
            __m256 w = _mm256_load_ps(pt + 8 * k);
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(x0 + k), w, a0);
            a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(x1 + k), w, a1);
            a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(x2 + k), w, a2);
            a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(x3 + k), w, a3);
        }
        __m256 a[4] = {a0, a1, a2, a3};
        for (int r = 0; r < 4; r++) {
            _mm256_store_ps(out, a[r]);
            memcpy(y + (i + r) * ldy, out, (size_t)nb * sizeof(float));
        }
    }
    for (; i < m; i++) {
        const float *xi = x + i * ldx;
        __m256 a0 = _mm256_setzero_ps();
        for (int64_t k = 0; k < K; k++)
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(xi + k), _mm256_load_ps(pt + 8 * k), a0);
        _mm256_store_ps(out, a0);
        memcpy(y + i * ldy, out, (size_t)nb * sizeof(float));
    }
}

AVX2 static inline __attribute__((always_inline)) void panels8_rows(const int np, const float *const *pt, int64_t K,
                                                                  const float *const *x, int64_t ldx, int64_t m,
                                                                  float *const *y, int64_t ldy, const int *nb) {
    _Alignas(32) float out[8];
    for (int64_t i = 0; i < m; i++) {
        __m256 a[4];
        const float *xi[4];
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
            if (q < np) a[q] = _mm256_setzero_ps(), xi[q] = x[q] + i * ldx;
        for (int64_t k = 0; k < K; k++)
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
                if (q < np) a[q] = _mm256_fmadd_ps(_mm256_broadcast_ss(xi[q] + k), _mm256_load_ps(pt[q] + 8 * k), a[q]);
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
            if (q < np) {
                _mm256_store_ps(out, a[q]);
                memcpy(y[q] + i * ldy, out, (size_t)nb[q] * sizeof(float));
            }
    }
}

AVX2 void di_cpu_panels8_f32_avx2(int np, const float *const *pt, int64_t K, const float *const *x, int64_t ldx,
                                  int64_t m, float *const *y, int64_t ldy, const int *nb) {
    if (np >= 4) panels8_rows(4, pt, K, x, ldx, m, y, ldy, nb);
    else if (np == 3) panels8_rows(3, pt, K, x, ldx, m, y, ldy, nb);
    else if (np == 2) panels8_rows(2, pt, K, x, ldx, m, y, ldy, nb);
    else if (np == 1) di_cpu_panel8_f32_avx2(pt[0], K, x[0], ldx, m, y[0], ldy, nb[0]);
}

/* The E2M1 grid value of |v| <= 6 (v not NaN) with v's sign: the scalar
 * di_f32_to_e2m1's midpoints, ties to the even code (<= at 0.25, 1.25,
 * 2.5, 5; < at 0.75, 1.75, 3.5), then its table's value. */
AVX2 static inline __attribute__((always_inline)) __m256 e2m1_grid(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f), a = _mm256_andnot_ps(sign, v);
    __m256 r = _mm256_setzero_ps();
    r = _mm256_blendv_ps(r, _mm256_set1_ps(0.5f), _mm256_cmp_ps(a, _mm256_set1_ps(0.25f), _CMP_GT_OQ));
    r = _mm256_blendv_ps(r, _mm256_set1_ps(1.0f), _mm256_cmp_ps(a, _mm256_set1_ps(0.75f), _CMP_GE_OQ));
    r = _mm256_blendv_ps(r, _mm256_set1_ps(1.5f), _mm256_cmp_ps(a, _mm256_set1_ps(1.25f), _CMP_GT_OQ));
    r = _mm256_blendv_ps(r, _mm256_set1_ps(2.0f), _mm256_cmp_ps(a, _mm256_set1_ps(1.75f), _CMP_GE_OQ));
    r = _mm256_blendv_ps(r, _mm256_set1_ps(3.0f), _mm256_cmp_ps(a, _mm256_set1_ps(2.5f), _CMP_GT_OQ));
    r = _mm256_blendv_ps(r, _mm256_set1_ps(4.0f), _mm256_cmp_ps(a, _mm256_set1_ps(3.5f), _CMP_GE_OQ));
    r = _mm256_blendv_ps(r, _mm256_set1_ps(6.0f), _mm256_cmp_ps(a, _mm256_set1_ps(5.0f), _CMP_GT_OQ));
    return _mm256_or_ps(r, _mm256_and_ps(v, sign));
}

AVX2 void di_cpu_qdq_fp4_avx2(float *x, int64_t nb, int bl, int e4m3) {
    const __m256 lo = _mm256_set1_ps(-6.0f), hi = _mm256_set1_ps(6.0f);
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < nb; b++) {
        float *xb = x + b * bl;
        /* the scale from the block's max |x|: max_ps keeps its second
         * operand where the first is NaN, as fmaxf skips a NaN; the lanes'
         * maxima then hold no NaN, so their order does not matter */
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < bl; i += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + i), absm), m);
        _Alignas(32) float lane[8];
        _mm256_store_ps(lane, m);
        float amax = lane[0];
        for (int i = 1; i < 8; i++) amax = lane[i] > amax ? lane[i] : amax;
        uint8_t code;
        const float s = di_cpu_fp4_scale_amax(amax, e4m3, &code);
        if (!(s < INFINITY)) {
            di_cpu_qdq_fp4(xb, bl, e4m3);
            continue;
        }
        const __m256 vs = _mm256_set1_ps(s);
        for (int i = 0; i < bl; i += 8) {
            /* fmaxf(NaN, -6) is -6: max_ps returns its second operand on a NaN */
            const __m256 q = _mm256_min_ps(_mm256_max_ps(_mm256_div_ps(_mm256_loadu_ps(xb + i), vs), lo), hi);
            /* grid × s has at most 6 significant bits (E4M3 scale) or is a
             * power-of-two multiple of the grid: exact in fp32 and in bf16,
             * so the scalar code's bf16 rounding leaves it as it is */
            _mm256_storeu_ps(xb + i, _mm256_mul_ps(e2m1_grid(q), vs));
        }
    }
}
#endif
