/* CPU kernels for the quantized and plain linears of the V4.1 forward pass
 * (architecture.md §2 numerics contract, §8.3 formats): FP8 activation
 * quantization per 32, FP8 linear with 32x32 UE8M0 weight scales, MXFP4
 * expert linear, BF16 and FP32 linears. One AVX2+FMA implementation
 * (kernels_avx2.c, chosen at run time; MXFP4 decode rows with AVX-512 inner
 * loops where the CPU has them, through vdpbf16ps where it has AVX512_BF16)
 * and a portable scalar one
 * (kernels_scalar.c) that also serves as the executable statement of the
 * summation order below.
 *
 * Activations are fp32 arrays holding values (usually bf16-rounded by the
 * caller). Weights are in checkpoint formats, never dequantized into copies.
 * All matmuls compute out[M,N] = x[M,K]·W[N,K]^T and overwrite out.
 *
 * Summation order (the same on every path, so AVX2 and scalar results are
 * bit-identical, and a row's result never depends on M or the thread count:
 * there is no split-K, every output element is computed by one thread from
 * fixed chains):
 *
 *   FP8 / MXFP4, per output (m, n), with g = 4 (FP8) or 8 (MXFP4) codes per
 *   4-byte word of the weight row and lane(k) = (k mod 8g) / g, i.e. the word
 *   of its 32-byte chunk that holds code k:
 *     a(k) = qa[m,k]·sa[m,k/32]                   fp32 product
 *     w(k) = qw[n,k]·sw(n,k/32)                   fp32 product
 *     L_j = +0 for j = 0..7
 *     for k = 0 .. K-1:                           increasing k
 *         L_lane(k) = fma(a(k), w(k), L_lane(k))  one rounding
 *     out[m,n] = ((L_0+L_1)+(L_2+L_3)) + ((L_4+L_5)+(L_6+L_7))
 *   with qa, qw the E4M3 / E2M1 code values and sw(n,kb) the E8M0 scale
 *   (FP8: ws[n/32][kb]; MXFP4: ws[n][kb]). The scale products are by powers
 *   of two and exact unless a result leaves the normal fp32 range. Eight
 *   independent chains, each over the codes of one word position, are what a
 *   SIMD register holds when it loads a weight row as it is stored: a decode
 *   step (M <= 4) then turns 32 bytes into fp32 lanes with a few shifts and
 *   no transpose, and prefill runs the same chains as dot products of rows.
 *   The reference scales 32-block partials instead; the two differ only by
 *   fp32 rounding.
 *
 *   BF16 / FP32, per output (m, n):
 *     acc = +0; for k = 0 .. K-1: acc = fmaf(x[m,k], w[n,k], acc)
 *   (one rounding per step, as a fused multiply-add).
 *
 * Accuracy against the exact value (u = 2^-24, terms t = the scaled products,
 * exact in fp32 when the scale products are):
 * |out - Σt| <= (K/8 + 6)·u·Σ|t| for FP8 / MXFP4 (a product goes through at
 * most K/8 + 3 additions of its lane, MXFP4 rows with K % 64 = 32 included,
 * and 3 of the final tree), <= K·u·Σ|t| for BF16 / FP32.
 * tests/unit/test_cpu_kernels.c checks the scalar path against a double
 * reference with these bounds and the AVX2 path against the scalar bits.
 *
 * NaN codes in weights (E4M3 0x7F/0xFF, E8M0 0xFF) are not expected in
 * checkpoints; the AVX2 path on AMD CPUs reads E4M3 0x7F as 480 rather than
 * NaN. */
#ifndef DI_BACKEND_CPU_KERNELS_H
#define DI_BACKEND_CPU_KERNELS_H

#include <stdint.h>

#include "core/threadpool.h" /* di_threadpool; NULL = run on the caller's thread */

/* FP8 activation quantization, per row and per 32-block along K (K % 32 == 0):
 *   amax = max |x| over the block, floored at 1e-4f
 *   t    = amax · fp32(1/448)
 *   s    = 2^(ceil(log2 t)) from t's exponent bits (+1 when its mantissa is not 0)
 *   q    = e4m3_rne(clamp(x / s, -448, 448))
 * exactly as the reference's fast_round_scale + satfinite cast. Blocks that
 * hold NaN or infinity give unspecified codes (memory-safe). */
void di_act_quant_fp8(const float *x, int64_t M, int64_t K, uint8_t *q /*[M,K]*/,
                      float *s /*[M,K/32]*/);
/* The same quantization of n values (n % 32 == 0) followed by dequantization:
 * out[i] = e4m3(q[i])·s (exact in bf16). out may equal x. */
void di_act_qdq_fp8(const float *x, int64_t n, float *out);

/* FP8 linear: w e4m3 [N,K], ws e8m0 [ceil(N/32), K/32], qa/sa from
 * di_act_quant_fp8 ([M,K], [M,K/32]). K % 32 == 0; any N >= 0. */
void di_gemm_fp8(const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                 const uint8_t *w, const uint8_t *ws, int64_t N, float *out, di_threadpool *tp);
/* FP4 expert linear: w packed [N, K/2] (two E2M1 codes per byte, low nibble =
 * even k), ws e8m0 [N, K/32]. K % 32 == 0. */
void di_gemm_mxfp4(const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                   const uint8_t *w, const uint8_t *ws, int64_t N, float *out, di_threadpool *tp);
/* BF16 weights [N,K] (uint16 bits), fp32 activations, fp32 accumulate. Any K. */
void di_gemm_bf16(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N, float *out,
                  di_threadpool *tp);
/* FP32 weights [N,K] (e.g. widened bf16 tensors the reference keeps in fp32). Any K. */
void di_gemm_f32(const float *x, int64_t M, int64_t K, const float *w, int64_t N, float *out,
                 di_threadpool *tp);

/* ---- the two implementations behind the calls above ----
 * Same contracts; the *_avx2 ones exist on x86-64 only and must be called
 * only when di_cpu_has_avx2() (src/core/cpu_features.h) says so. Tests and
 * benchmarks call them directly to compare the paths. */
void di_act_quant_fp8_scalar(const float *x, int64_t M, int64_t K, uint8_t *q, float *s);
void di_act_qdq_fp8_scalar(const float *x, int64_t n, float *out);
void di_gemm_fp8_scalar(const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                        const uint8_t *w, const uint8_t *ws, int64_t N, float *out,
                        di_threadpool *tp);
void di_gemm_mxfp4_scalar(const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                          const uint8_t *w, const uint8_t *ws, int64_t N, float *out,
                          di_threadpool *tp);
void di_gemm_bf16_scalar(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                         float *out, di_threadpool *tp);
/* Outputs n0 .. n1-1 of every row of an FP8 (fp4 = 0) or MXFP4 (fp4 = 1)
 * linear, on the calling thread: what the AVX2 kernels fall back to for
 * weight rows whose scales their exact shortcuts do not cover. */
void di_gemm_block_rows_scalar(int fp4, const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                               const uint8_t *w, const uint8_t *ws, int64_t N, int64_t n0,
                               int64_t n1, float *out);
void di_gemm_f32_scalar(const float *x, int64_t M, int64_t K, const float *w, int64_t N,
                        float *out, di_threadpool *tp);
#if defined(__x86_64__)
#define DI_HAVE_AVX2_KERNELS 1
void di_act_quant_fp8_avx2(const float *x, int64_t M, int64_t K, uint8_t *q, float *s);
void di_act_qdq_fp8_avx2(const float *x, int64_t n, float *out);
void di_gemm_fp8_avx2(const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                      const uint8_t *w, const uint8_t *ws, int64_t N, float *out,
                      di_threadpool *tp);
void di_gemm_mxfp4_avx2(const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                        const uint8_t *w, const uint8_t *ws, int64_t N, float *out,
                        di_threadpool *tp);
void di_gemm_bf16_avx2(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                       float *out, di_threadpool *tp);
void di_gemm_f32_avx2(const float *x, int64_t M, int64_t K, const float *w, int64_t N,
                      float *out, di_threadpool *tp);
/* Forces (1) the FP8 / MXFP4 AVX2 route that CPUs with slow subnormal
 * arithmetic take (every batch through the prefill kernels, codes decoded
 * from tables), or restores the choice by CPU vendor (0). Same bits either
 * way; for tests. Set it before running kernels, not while they run. */
void di_cpu_kernels_force_tables(int on);
/* AVX-512 inner loops of the MXFP4 decode rows (kernels_avx512_block.c),
 * taken where di_cpu_has_avx512() says so. Forces them off (0), on where the
 * CPU has them (1) or restores the choice by CPU (-1); same bits either way.
 * For tests and benchmarks; set it before running kernels. */
void di_cpu_kernels_force_avx512(int mode);
/* 1 when MXFP4 decode rows take the AVX-512 loops right now. */
int di_cpu_kernels_avx512(void);
/* The decode-row kernel both files share: R weight rows (rows[r]) × mr
 * activation rows (a, stride lda) over all chunks, with the MXFP4 chain
 * factors sv (AVX2 loops: [chunks + 1][R][8], one per lane; AVX-512 loops:
 * [R/2][chunks + 1][4], one per block of a row pair); res[m·8 + r] gets the
 * outputs, ahead (or NULL) is the row group to prefetch. */
typedef void (*di_dec_kernel_fn)(int64_t chunks, int half_last, const uint8_t *const *rows,
                                 const uint8_t *ahead, const float *a, int64_t lda, const float *sv,
                                 float *res);
/* The AVX-512 MXFP4 kernel for a block of mr rows of a batch of M (M <= 2,
 * the whole batch: mr = M), over R = di_dec_rows_avx512(M) weight rows
 * (8); NULL for other shapes. It reads the activation lanes doubled:
 * di_dec_lanes_dup() of [M][Kp] into [M][2·Kp] (64-byte aligned). */
di_dec_kernel_fn di_dec_kernel_mxfp4_avx512(int64_t M, int mr);
int di_dec_rows_avx512(int64_t M);
/* The AVX-512 loops' chain factors of R weight rows (scale rows srow[r], KB
 * E8M0 bytes each) into sv, as kernels_avx2_block.c's dec_scales() defines
 * them; 0 (the rows then run the scalar code) when an exponent is outside
 * [lo, hi] or the group's exponents span more than spread. */
int di_dec_factors_avx512(const uint8_t *const *srow, int R, int64_t KB, int lo, int hi, int spread,
                          float *sv);
void di_dec_lanes_dup(const float *ap, int64_t M, int64_t Kp, float *dup);
/* AVX-512 BF16 inner loops of the MXFP4 decode rows for M <= 2
 * (kernels_avx512_bf16.c): the same chains through vdpbf16ps, same bits.
 * Taken where di_cpu_has_avx512_bf16(), a probe of vdpbf16ps's rounding and
 * di_cpu_kernels_avx512() agree; force them off (0), on where possible (1)
 * or back to that choice (-1). For tests and benchmarks; set it before
 * running kernels. */
void di_cpu_kernels_force_bf16(int mode);
/* 1 when MXFP4 decode rows of M <= 2 take the BF16 loops right now. */
int di_cpu_kernels_bf16(void);
/* Their kernel for a block of mr rows of a batch of M (mr = M <= 2) over R =
 * di_dec_rows_bf16(M) weight rows (16 for M = 1, 8 for M = 2), with the
 * factors of di_dec_factors_avx512() and the activations of
 * di_dec_lanes_bf16() ([M][Kp] 32-bit words, 64-byte aligned, lda = Kp);
 * NULL for other shapes. */
di_dec_kernel_fn di_dec_kernel_mxfp4_bf16(int64_t M, int mr);
int di_dec_rows_bf16(int64_t M);
/* Activation lanes a·2^63 ([M][Kp], any 4-byte alignment) -> those words
 * (out 64-byte aligned). */
void di_dec_lanes_bf16(const float *ap, int64_t M, int64_t Kp, float *out);
/* The largest exponent spread of a row group the BF16 loops take for
 * activations whose quantum is 2^q (beyond it a chain value could be
 * subnormal, which vdpbf16ps flushes). */
int di_dec_bf16_spread(int q);
#endif

/* Decoding tables shared by both paths: E4M3 and E8M0 byte -> fp32 value
 * (E4M3 NaN codes give NaN, E8M0 0xFF gives NaN). Built on first use. */
const float *di_cpu_e4m3_table(void); /* [256] */
const float *di_cpu_e8m0_table(void); /* [256] */
/* The FP8 block scale s of 32 values (see di_act_quant_fp8), and the same
 * from their max |x| (before the 1e-4 floor). */
float di_act_scale_fp8(const float *x32);
float di_act_scale_fp8_amax(float amax);

/* Forces the scalar path (1) or restores run-time selection (0). Tests
 * compare the AVX2 path against it. Process-wide; set it before running
 * kernels, not while other threads run them. */
void di_cpu_kernels_force_scalar(int on);
/* "avx2" or "scalar": the path the calls above take right now. */
const char *di_cpu_kernels_path(void);
/* The same for the FP8 / MXFP4 decode rows (M <= 16): "avx512-bf16" or
 * "avx512" where MXFP4 rows take the AVX-512 loops, else as
 * di_cpu_kernels_path(). */
const char *di_cpu_kernels_decode_path(void);

#endif
