/* CPU kernels for the quantized and plain linears of the V4.1 forward pass
 * (architecture.md §2 numerics contract, §8.3 formats): FP8 activation
 * quantization per 32, FP8 linear with 32x32 UE8M0 weight scales, MXFP4
 * expert linear, BF16 and FP32 linears. One AVX2+FMA implementation
 * (kernels_avx2.c, kernels_avx2_block.c, kernels_avx2_mxfp4.c; chosen at run
 * time) and a portable scalar one (kernels_scalar.c) that also serves as the
 * executable statement of the summation order below.
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
 *   FP8, per output (m, n), lane(k) = (k mod 32) / 4, i.e. the 4-byte word
 *   of its 32-byte chunk that holds code k:
 *     a(k) = qa[m,k]·sa[m,k/32]                   fp32 product
 *     w(k) = qw[n,k]·sw[n/32][k/32]               fp32 product
 *     L_j = +0 for j = 0..7
 *     for k = 0 .. K-1:                           increasing k
 *         L_lane(k) = fma(a(k), w(k), L_lane(k))  one rounding
 *     out[m,n] = ((L_0+L_1)+(L_2+L_3)) + ((L_4+L_5)+(L_6+L_7))
 *   with qa, qw the E4M3 code values and sw the E8M0 scale. Eight
 *   independent chains, each over the codes of one word position, are what a
 *   SIMD register holds when it loads a weight row as it is stored: a decode
 *   step (M <= 16) then turns 32 bytes into fp32 lanes with a few shifts and
 *   no transpose, and prefill runs the same chains as dot products of rows.
 *
 *   MXFP4, per output (m, n), block by block (32 codes, one scale each),
 *   in two chains, one for the even blocks and one for the odd:
 *     E = +0, O = +0
 *     for kb = 0 .. K/32-1:                       increasing kb
 *         B = Σ qa[m,k]·qw[n,k] over the block's k with |qa[m,k]| >= 2^-3
 *         S = Σ qa[m,k]·qw[n,k] over the rest     (both exact, see below)
 *         s = sa[m,kb]·sw[n,kb]                   fp32 product
 *         C = E if kb is even, else O
 *         C = fma(B, s, C); C = fma(S, s, C)
 *     out[m,n] = E + O
 *   with qw the E2M1 code values and sw = ws[n][kb]. Both block sums are
 *   exact in fp32 whatever the order of their terms: a product of an E4M3
 *   value of at least 2^-3 (a multiple of 2^-6) and an E2M1 value (of 1/2)
 *   is a multiple of 2^-7 below 2^11.4, so 32 of them sum to a multiple of
 *   2^-7 below 2^16.4 (24 significant bits at most); the smaller E4M3
 *   values are multiples of 2^-9 below 2^-3, their 32 products a multiple
 *   of 2^-10 below 24. That freedom is what the kernels use: decode rows sum
 *   a block with 16-bit integer multiply-adds (qa·2^6 and qa·2^9 fit in 16
 *   bits, 2·qw in 8), prefill with fp32 FMAs on decoded weights, with one
 *   fused step per block and output either way instead of one per code. S
 *   is zero unless the activations hold values below 2^-3 of their block's
 *   scale (1/3584 of its largest), and an FMA adding +0 leaves a chain
 *   unchanged (a chain is never -0), so the kernels skip it there. Two
 *   chains rather than one: consecutive blocks' steps do not wait on each
 *   other.
 *
 *   The scale products are by powers of two and exact unless a result
 *   leaves the normal fp32 range; the vector kernels take the scalar code
 *   for row groups whose scales come near that. The reference scales
 *   32-block partials instead; the orders differ only by fp32 rounding.
 *
 *   BF16 / FP32, per output (m, n):
 *     acc = +0; for k = 0 .. K-1: acc = fmaf(x[m,k], w[n,k], acc)
 *   (one rounding per step, as a fused multiply-add).
 *
 * Accuracy against the exact value (u = 2^-24, terms t = the scaled products,
 * exact in fp32 when the scale products are):
 * |out - Σt| <= (K/8 + 6)·u·Σ|t| for FP8 (a product goes through at most
 * K/8 + 3 additions of its lane and 3 of the final tree),
 * <= (K/32 + 4)·u·Σ|t| for MXFP4 (a block's sums through at most K/32 + 1
 * roundings of its chain and the final addition), <= K·u·Σ|t| for BF16 /
 * FP32.
 * tests/unit/test_cpu_kernels.c checks the scalar path against a double
 * reference with these bounds and the AVX2 path against the scalar bits.
 *
 * NaN codes in weights (E4M3 0x7F/0xFF, E8M0 0xFF) are not expected in
 * checkpoints; the AVX2 path's decode rows and prefill tiles read E4M3 0x7F
 * as 480 rather than NaN. */
#ifndef DI_BACKEND_CPU_KERNELS_H
#define DI_BACKEND_CPU_KERNELS_H

#include <stddef.h>
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
/* Several FP4 expert linears of the same K in one pass over the thread
 * pool (the routed experts of a decode step: one hand-off to the pool
 * instead of one a product, and the work of all of them to balance): part
 * i is di_gemm_mxfp4(qa, sa, M, K, w, ws, N, out) with its own operands,
 * and its outputs have that call's bits. Parts may share activations. */
typedef struct di_gemm_part {
    const uint8_t *qa;
    const float *sa;
    int64_t M;
    const uint8_t *w, *ws;
    int64_t N;
    float *out;
} di_gemm_part;
void di_gemm_mxfp4_many(const di_gemm_part *parts, int n, int64_t K, di_threadpool *tp);
/* The same for FP8 linears (di_gemm_fp8's operands); one pass where the
 * parts share their activations (attention's wq_a and wkv, the shared
 * expert's w1 and w3), else one call a part. */
void di_gemm_fp8_many(const di_gemm_part *parts, int n, int64_t K, di_threadpool *tp);
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
void di_gemm_mxfp4_many_avx2(const di_gemm_part *parts, int n, int64_t K, di_threadpool *tp);
void di_gemm_fp8_many_avx2(const di_gemm_part *parts, int n, int64_t K, di_threadpool *tp);
void di_gemm_mxfp4_avx2(const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                        const uint8_t *w, const uint8_t *ws, int64_t N, float *out,
                        di_threadpool *tp);
/* What the MXFP4 kernel files share (kernels_avx2_mxfp4.c): the exponent
 * range of activation scales (0 when one is not a normal positive power
 * of two), the min and max of n bytes (AVX2: call it on the AVX2 path
 * only), and how many pieces `panels` weight panels go to the pool in (at
 * most `most` panels a piece, a multiple of the threads). */
int di_cpu_scale_exps(const float *sa, int64_t n, int *lo, int *hi);
void di_cpu_byte_range(const uint8_t *p, int64_t n, int *lo, int *hi);
int64_t di_cpu_panel_pieces(int64_t panels, int64_t most, int threads);
/* A core's L2 (level 2) or the last-level cache (3) in bytes as sysconf
 * reports it, 0 where it does not (kernels_avx2_block.c). */
int64_t di_cpu_cache_bytes(int level);
/* The decode rows' span at unit u of a range ending at unit u1, of a
 * product with `whole` whole units: the longest of most, most/2, .. 1
 * units that ends by both (most a power of two); 0 where unit u is not
 * whole (kernels_avx2_block.c dec_units, kernels_avx2_mxfp4.c dec4_units). */
int64_t di_cpu_span_units(int64_t u, int64_t u1, int64_t whole, int64_t most);
/* The MXFP4 prefill on AMX tiles (kernels_amx_mxfp4.c; only where
 * di_cpu_kernels_amx()): 1 when it computed out, 0 when it did not take
 * the call (activation scales outside its exact range, a NaN code, out of
 * memory) and left out unwritten for the other kernels. */
int di_gemm_mxfp4_amx(const uint8_t *qa, const float *sa, int64_t M, int64_t K, const uint8_t *w,
                      const uint8_t *ws, int64_t N, float *out, di_threadpool *tp);
void di_gemm_bf16_avx2(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                       float *out, di_threadpool *tp);
void di_gemm_f32_avx2(const float *x, int64_t M, int64_t K, const float *w, int64_t N,
                      float *out, di_threadpool *tp);
/* FP8 weight rows r0 .. r0 + 31 (r0 % 32 == 0: one scale tile; all 32
 * inside the weight) of w [N, K] (ws its E8M0 scales) on m <=
 * DI_FP8_F32ROWS_M (without AVX-512: DI_FP8_F32ROWS_M_NARROW) fp32
 * activation rows x (row i at x + i·ldx), the fused chain of di_gemm_f32:
 * y[i·ldy + j] = fma chain over k = 0 .. K-1 from +0 of x[i][k] and the
 * exact w·sw of row r0 + j (rounded once), for the bf16-numerics products
 * at decode (kernels_avx2_block.c, "FP8 rows on fp32 activations"; call
 * it only on the AVX2 path). Returns -1 and stores nothing where it does
 * not run (K % 64, m out of range, a partial tile, a NaN code in the
 * rows): the caller's panels do those. The count of units it ran is for
 * tests. */
enum { DI_FP8_F32ROWS_M = 4, DI_FP8_F32ROWS_M_NARROW = 2 };
/* BF16 weights at 1-4 activation rows on AVX-512 CPUs: units of 32 weight
 * rows straight from the rows (kernels_avx2.c), the same chains as the
 * tiles; the count of units run, for tests. */
long di_cpu_bf16rows_units(void);
int di_cpu_fp8_f32rows(const uint8_t *w, const uint8_t *ws, int64_t K, int64_t N, int64_t r0, const float *x,
                       int64_t ldx, int64_t m, float *y, int64_t ldy);
long di_cpu_fp8_f32rows_units(void);
/* Forces (1) the FP8 AVX2 route that CPUs with slow subnormal
 * arithmetic take (E4M3 codes decoded through the F16C conversion, no fp32
 * subnormal on the way), forces the shift route of AMD cores (-1: correct
 * anywhere, slow where subnormals are), or restores the choice by CPU
 * vendor (0). Same bits either way; for tests and benchmarks. Set it
 * before running kernels, not while they run. */
void di_cpu_kernels_force_fp8_half(int on);
/* Whether FP8 codes go through F16C right now (every CPU but AMD's, or
 * forced above); the CPU ops that decode FP8 weights follow it too. */
int di_cpu_kernels_fp8_half(void);
#endif

/* Decoding tables shared by both paths: E4M3 and E8M0 byte -> fp32 value
 * (E4M3 NaN codes give NaN, E8M0 0xFF gives NaN). Built on first use. */
const float *di_cpu_e4m3_table(void); /* [256] */
const float *di_cpu_e8m0_table(void); /* [256] */
/* The FP8 block scale s of 32 values (see di_act_quant_fp8), and the same
 * from their max |x| (before the 1e-4 floor). */
float di_act_scale_fp8(const float *x32);
float di_act_scale_fp8_amax(float amax);

/* The prefill kernels' buffers, kept by the calling thread from call to
 * call: a 64-byte aligned buffer of at least `bytes`, the thread's own
 * (*own = 0: do not free it; valid until the thread's next call) or, for
 * calls past its limit or without thread-specific storage, a fresh one
 * (*own = 1: the caller frees it). NULL when out of memory. */
float *di_cpu_kept_buffer(size_t bytes, int *own);
/* Tests: 1 fills every buffer di_cpu_kept_buffer returns with NaN bytes
 * (0xff) first, so that a kernel reading a part it did not write in this
 * call gives NaN outputs instead of a previous call's (often identical)
 * values; 0 (the default) leaves them as they are. */
void di_cpu_kernels_poison_buffers(int on);

/* Forces the scalar path (1) or restores run-time selection (0). Tests
 * compare the AVX2 path against it. Process-wide; set it before running
 * kernels, not while other threads run them. */
void di_cpu_kernels_force_scalar(int on);
/* "avx2" or "scalar": the path the calls above take right now. */
const char *di_cpu_kernels_path(void);
/* Whether the AVX2 path runs its 512-bit forms right now (the FP8 and
 * MXFP4 prefill micro-kernels, the FP8 decode rows on the F16C route's
 * CPUs, the MXFP4 decode rows; CPUs with AVX-512 F, DQ, BW and VL, unless
 * the environment has DI_CPU_AVX512=0); same bits either way. Forcing it off
 * (1) keeps those CPUs on the 256-bit kernels, for tests and benchmarks; 0
 * restores the choice. Set it before running kernels. */
int di_cpu_kernels_wide(void);
void di_cpu_kernels_force_no_avx512(int on);
/* Whether the MXFP4 decode rows on 512-bit vectors add their 16-bit
 * products with AVX-512 VNNI (vpdpwssd: multiply, add pairs and accumulate
 * in one instruction instead of vpmaddwd then vpaddd; integer sums, so the
 * same bits): CPUs with it, on the 512-bit kernels, unless the environment
 * has DI_CPU_VNNI=0. Forcing it off (1) is for tests and benchmarks; set it
 * before running kernels. The count of weight-row units it ran is for
 * tests. */
int di_cpu_kernels_vnni(void);
void di_cpu_kernels_force_no_vnni(int on);
long di_cpu_kernels_vnni_units(void);
/* Weight-row units of the MXFP4 decode rows of one or two activation rows
 * that went in spans (of 8 units, each register slot streaming 32
 * consecutive rows on 512-bit vectors and 64 on 256-bit ones, or of 4, 2
 * or 1 where the pool's chunks taper at the end of a call on several
 * threads; kernels_avx2_mxfp4.c, dec4_units; same bits; tests); those of them that went in spans of whole
 * lines (one activation row in the VNNI byte form: 4 slots of 64 rows, a
 * 64-byte line of each a step); and those in spans shorter than 8 units. */
long di_cpu_kernels_mxfp4_span_units(void);
long di_cpu_kernels_mxfp4_line_units(void);
long di_cpu_kernels_mxfp4_short_span_units(void);
/* Batches past 128 activation rows without AMX go to the integer kernels
 * in pieces of at most 64 rows (kernels_avx2_mxfp4.c, dec4_pieces) where
 * they have VNNI's sums (AVX-512 VNNI on the 512-bit kernels, AVX-VNNI on
 * the 256-bit ones), elsewhere to the FMA tiles. Same bits. The count of
 * pieces cut (a part cut in k pieces counts k - 1) and of calls that ran
 * the tiles are for tests. */
long di_cpu_kernels_mxfp4_pieces(void);
long di_cpu_kernels_mxfp4_tile_calls(void);
/* With VNNI, a call of one or two activation rows meets the weights'
 * decoded bytes with the activations' bytes (vpdpbusd) rather than 16-bit
 * words; same bits. Forcing it off (1) keeps such calls on the 16-bit
 * sums, 0 restores; the count of calls that took it is for tests. */
void di_cpu_kernels_force_no_vnni_bytes(int on);
long di_cpu_kernels_vnni_byte_calls(void);
/* Whether the 256-bit kernels (CPUs without AVX-512, or with it forced
 * off) take that byte form for calls of one or two activation rows too,
 * with AVX-VNNI (vpdpbusd on 256-bit vectors, VEX-encoded: di_cpu_has_avx_vnni):
 * CPUs with it, unless the environment has DI_CPU_AVX_VNNI=0. Same bits;
 * forcing it off (1) is for tests and benchmarks, set before running
 * kernels (di_cpu_kernels_force_no_vnni_bytes turns both forms off). */
int di_cpu_kernels_avx_vnni(void);
void di_cpu_kernels_force_no_avx_vnni(int on);
long di_cpu_kernels_avx_vnni_byte_calls(void);
/* With it the 256-bit kernels' MXFP4 calls of 3-16 activation rows also
 * sum their 16-bit products by vpdpwssd (VEX), and batches past 128 rows
 * go to them in pieces (di_cpu_kernels_mxfp4_pieces); same bits. The
 * count of such calls of 3-16 rows is for tests. */
long di_cpu_kernels_avx_vnni_wide_calls(void);
/* Whether that byte form looks the weights' codes up with AVX-512 VBMI
 * (vpermb: no masking of the nibbles) rather than vpshufb: CPUs with it,
 * on the 512-bit kernels, unless the environment has DI_CPU_VBMI=0. Same
 * bits; forcing it off (1) is for tests and benchmarks, set before running
 * kernels. The count of calls that took it is for tests. */
int di_cpu_kernels_vbmi(void);
void di_cpu_kernels_force_no_vbmi(int on);
long di_cpu_kernels_vbmi_byte_calls(void);
/* Whether the MXFP4 prefill runs on AMX tiles (kernels_amx_mxfp4.c): CPUs
 * with AMX-BF16 (di_cpu_has_amx_bf16), on the 512-bit kernels, unless the
 * environment has DI_CPU_AMX=0. The block sums of kernels.h are exact, so
 * the tiles' bf16 products give the same bits as every other path.
 * Forcing it off (1) is for tests and benchmarks; set it before running
 * kernels. The count of weight panels it ran is for tests. */
int di_cpu_kernels_amx(void);
void di_cpu_kernels_force_no_amx(int on);
long di_cpu_kernels_amx_units(void);
/* The FP8 decode rows on 512-bit vectors decode E4M3 codes by their
 * exponent bias (kernels_avx2_block.c,
 * dec_bias_wide), or through F16C where a product's codes often have
 * exponent 0; forcing it off (1) keeps them on F16C, 0 restores. Same bits
 * either way; for tests and benchmarks, set before running kernels. The
 * count of weight-row units decoded by the bias is for tests. */
void di_cpu_kernels_force_no_bias(int on);
long di_cpu_kernels_bias_units(void);
/* The FP8 decode rows of 3 to 16 activation rows go through K in
 * segments whose activations stay in L1 (kernels_avx2_block.c, seg_units);
 * forcing it off (1) keeps them on blocks of up to 4 rows over all of K,
 * 0 restores. Same bits either way; for tests and benchmarks, set before
 * running kernels. */
void di_cpu_kernels_force_no_seg(int on);
long di_cpu_kernels_seg_units(void); /* weight-row units it ran (tests) */
/* Weight-row units of the FP8 decode rows (outside the segmented form)
 * whose kernel calls took rows spread through the unit, those of them
 * that went in spans (of 4 units, or of 2 or 1 where the range of a
 * kernels_avx2_block.c dec_units call ends sooner: a product's last
 * tiles; without the software prefetches; same bits; tests), and those in
 * spans shorter than 4 units. */
long di_cpu_kernels_spread_units(void);
long di_cpu_kernels_span_units(void);
long di_cpu_kernels_short_span_units(void);
/* Whether the FP8 prefill (on 512-bit vectors from 17 rows on; on 256-bit
 * ones from 32 rows on, past 96 only where a unit's scratch fits the
 * core's L2) runs each group of weight panels and block of rows start to
 * end in one parallel pass (kernels_avx2_block.c,
 * lg_fused_units) rather than in passes per column block and run of
 * steps: yes unless the
 * environment has DI_CPU_LG_FUSED=0. Same bits either way; forcing it off
 * (1) is for tests and benchmarks, set before running kernels. */
int di_cpu_kernels_lg_fused(void);
void di_cpu_kernels_force_no_lg_fused(int on);
/* Whether the FP8 decode rows prefetch their weights into L2 themselves
 * (kernels_avx2_block.c: the row group two ahead, the segmented rows' next
 * segment) or, without those, take long rows spread through their units
 * (at one activation row in spans of units, which prefetch each row's
 * own stream a few lines ahead instead). Which is faster depends on the
 * machine and on the rows'
 * length (bench/RESULTS.md), so unless the environment fixes it
 * (DI_CPU_PREFETCH=1: on, 0: off) each class of batch (1 row, 2 rows,
 * 3-16 rows) and of row (at least DI_DEC_LONG_ROW codes or fewer)
 * measures: its first 24 calls of at least 1 MiB of weights alternate with
 * and without, and it keeps the faster (kernels.c, "the measured choice";
 * the calls are timed by kernels_avx2_block.c's dec_run). Returns 1 (on),
 * 0 (off) or -1 (measured). Forcing it on (1) or off (-1), or back to
 * that (0), is for tests and benchmarks, set before running kernels. Same
 * bits either way: only the speed depends on it. */
int di_cpu_kernels_dec_prefetch(void);
void di_cpu_kernels_force_dec_prefetch(int on);
/* Rows of at least this many codes (1 KB of FP8) are long: without the
 * prefetches their kernel calls take rows spread through a unit
 * (kernels_avx2_block.c, dec_units), and their choice is measured apart
 * from shorter rows'. */
#define DI_DEC_LONG_ROW 1024
/* The measured choice of class c = batch (0: 1 row, 1: 2 rows, 2: 3-16
 * rows) + 3 for rows shorter than DI_DEC_LONG_ROW (DI_PF_CLASSES in all):
 * 1 on, 0 off, -1 still measuring (or never measured). */
#define DI_PF_CLASSES 6
int di_cpu_kernels_dec_prefetch_measured(int c);
/* Forget the measured choices: the next large calls measure again (tests,
 * benchmarks). */
void di_cpu_kernels_reset_dec_prefetch(void);
/* For the decode rows of batch class c: whether this call prefetches, and
 * in *timed whether it is one of the measuring calls (only calls with
 * `large` weights measure), whose time the caller then reports with
 * di_cpu_pf_record (ns per weight byte). */
int di_cpu_pf_for_call(int c, int large, int *timed);
void di_cpu_pf_record(int c, int pf, double ns_per_byte);
/* The decision from n timed calls without (off[]) and with (on[]) the
 * prefetches, each in ns per weight byte: 0 when the median without is
 * lower than the median with by more than DI_PF_MARGIN of it, else 1 (the
 * prefetches, where no clear difference shows). */
#define DI_PF_MARGIN 0.03
int di_cpu_pf_decide(const double *off, const double *on, int n);

#endif
