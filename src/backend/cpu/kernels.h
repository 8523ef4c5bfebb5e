/* CPU kernels for the quantized and plain linears of the V4.1 forward pass
 * (architecture.md §2 numerics contract, §8.3 formats): FP8 activation
 * quantization per 32, FP8 linear with 32x32 UE8M0 weight scales, MXFP4
 * expert linear, BF16 and FP32 linears. One AVX2+FMA implementation
 * (kernels_avx2.c, chosen at run time) and a portable scalar one
 * (kernels_scalar.c) that also serves as the executable statement of the
 * summation order below.
 *
 * Activations are fp32 arrays holding values (usually bf16-rounded by the
 * caller). Weights are in checkpoint formats, never dequantized into copies.
 * All matmuls compute out[M,N] = x[M,K]·W[N,K]^T and overwrite out.
 *
 * Summation order (the same on every path, so AVX2 and scalar results are
 * bit-identical, and a row's result never depends on M or the thread count:
 * there is no split-K, every output element is one sequential chain):
 *
 *   FP8 / MXFP4, per output (m, n):
 *     acc = +0
 *     for kb = 0 .. K/32-1:                       increasing k
 *         blk = +0
 *         for k = 32·kb .. 32·kb+31:              increasing k
 *             blk = blk + qa[m,k]·qw[n,k]         product exact in fp32
 *         acc = acc + (blk·sa[m,kb])·sw(n,kb)     fp32, left to right
 *     out[m,n] = acc
 *   with qa, qw the E4M3 / E2M1 code values and sw(n,kb) the E8M0 scale
 *   (FP8: ws[n/32][kb]; MXFP4: ws[n][kb]). An E4M3·E4M3 product has at most
 *   8 significant bits and lies in [2^-18, 2^17.7]; E4M3·E2M1 at most 6 bits:
 *   both are exact fp32 values, so a fused multiply-add gives the very bits
 *   of the separate multiply and add. The scale multiplications are by
 *   powers of two and exact unless a result leaves the normal fp32 range.
 *   This is the reference's structure (block partials scaled and added in K
 *   order); only the order inside one block may differ from a tensor core's.
 *
 *   BF16 / FP32, per output (m, n):
 *     acc = +0; for k = 0 .. K-1: acc = fmaf(x[m,k], w[n,k], acc)
 *   (one rounding per step, as a fused multiply-add).
 *
 * Accuracy against the exact value (u = 2^-24, terms t = the scaled products):
 * |out - Σt| <= (31 + K/32)·u·Σ|t| for FP8 / MXFP4 (a product goes through at
 * most 31 block additions and K/32 outer ones), <= K·u·Σ|t| for BF16 / FP32.
 * tests/unit/test_cpu_kernels.c checks the scalar path against a double
 * reference with these bounds and the AVX2 path against the scalar bits.
 *
 * NaN codes in weights (E4M3 0x7F/0xFF, E8M0 0xFF) are not expected in
 * checkpoints; the AVX2 path reads E4M3 0x7F as 480 rather than NaN. */
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

#endif
