/* AVX2 forms of the CPU backend's own ops (backend_cpu.c): the mHC mixing
 * projections (architecture.md §4) and the products over decoded weight
 * panels (grouped wo_a, §5.6). Each one vectorizes across independent
 * outputs and keeps every output's reduction the sequential chain the
 * scalar op computes, with the same rounding per step, so both forms give
 * the same bits (docs/numerics.md). Call them only when the kernels' path
 * is "avx2" (kernels.h); they exist on x86-64 only. */
#ifndef DI_BACKEND_CPU_CPU_OPS_AVX2_H
#define DI_BACKEND_CPU_CPU_OPS_AVX2_H

#include <stdint.h>

#include "backend/kvstore.h"

#if defined(__x86_64__)
#define DI_HAVE_AVX2_OPS 1
/* mix[r, o] = Σ_k u[r, k]·fn[o, k] for rows r < R (R <= 4, row stride ldu)
 * and outputs o < nmix, each a chain acc = acc + u·f (separate multiply and
 * add, fp32) in increasing k from +0. fn is [nmix, n]; mix is [R, nmix].
 * ss (NULL: not wanted) gets each row's Σ_k u[r, k]·u[r, k], the same kind
 * of chain. */
void di_cpu_hc_project_avx2(const float *u, int64_t ldu, int R, int64_t n, const float *fn,
                            int nmix, float *mix, float *ss);
/* Sinkhorn rounds of R <= 8 comb matrices c [R, hc, hc] (hc <= 16), one
 * per lane: a column normalisation, then iters-1 rounds of row + column
 * normalisation, each sum sequential from +0 and each value divided by
 * sum + eps, as backend_cpu.c's scalar loop does. */
void di_cpu_hc_sinkhorn_avx2(float *c, int R, int hc, float eps, int iters);
/* One row of the mHC stream ops, vectorized across the d channels (each
 * output's sum over the hc copies sequential from +0, separate multiply
 * and add, then bf16 rounding; backend_cpu.c's loops state the order):
 *   collapse: y[k] = bf16(Σ_c w[c]·s[c, k])
 *   expand:   out[b, k] = bf16(post[b]·y[k] + Σ_a comb[a, b]·s[a, k])
 *   mean:     out[k] = bf16((Σ_c s[c, k]) / hc)
 * s is [hc, d]. expand takes hc <= DI_HC_EXPAND_MAX, and its out may be s
 * itself: each group of 8 channels of every stream is read before any is
 * written. */
enum { DI_HC_EXPAND_MAX = 16 };
void di_cpu_hc_collapse_avx2(const float *s, const float *w, int hc, int64_t d, float *y);
void di_cpu_hc_expand_avx2(const float *y, const float *s, const float *post, const float *comb,
                           int hc, int64_t d, float *out);
void di_cpu_hc_mean_avx2(const float *s, int hc, int64_t d, float *out);
/* Dot products of 8 rows (lanes) with nq vectors q [nq, n]:
 * out[v, j] = Σ_t q[v, t]·rows[j][t], each a chain acc = acc + q·r
 * (separate multiply and add) in increasing t from +0, as the scalar
 * attention and index-score loops compute them. n % 8 == 0; every rows[j]
 * must be readable (callers pass a stand-in row for empty lanes). */
void di_cpu_dots8_avx2(const float *q, int nq, int64_t n, const float *const rows[8], float *out);
/* The P·V step of one head over a block of nj slots: acc [n] times
 * rescale, then acc += p[j]·rows[j] (separate multiply and add) for every
 * j < nj whose rows[j] is set, in j order. n % 8 == 0. */
void di_cpu_pv_avx2(float *acc, float rescale, const float *p, const float *const *rows, int nj, int64_t n);
/* Index scores of 8 keys from their per-head dots [hi, 8] (above) and head
 * weights w [hi]: out[j] = bf16(Σ_h bf16(relu(bf16(dot[h, j]))·w[h])),
 * the sum sequential in h from +0 (relu keeps -0 and NaN, as `x < 0`). */
void di_cpu_index_combine8_avx2(const float *dots, const float *w, int hi, float *out);
/* RMSNorm's pieces (backend_cpu.c's norm_range states them): ss[r] = the
 * sum of squares of row r < 8 (x + r·ldx, n values), each one sequential
 * chain ss = ss + x[k]·x[k] (separate multiply and add) in increasing k
 * from +0, the 8 rows' chains side by side in the lanes; and y[k] =
 * bf16(w[k]·(x[k]·r)) for k < n (y may be x). */
void di_cpu_sumsq_rows8_avx2(const float *x, int64_t ldx, int64_t n, float ss[8]);
void di_cpu_norm_scale_avx2(const float *x, const float *w, int64_t n, float r, float *y);
/* SwiGLU's last step for k < n (backend_cpu.c's swiglu_range states it):
 * u clamped to [-limit, limit] where clamp (a NaN u gives -limit), s =
 * (g >= 0 ? 1 : t) / (1 + t), o[k] = bf16(wi·((g·s)·u)) with wi, else
 * bf16((g·s)·u). g is the clamped gate, t = e^-|g|. */
void di_cpu_swiglu_out_avx2(const float *g, const float *t, const float *u, int64_t n, float limit, int clamp,
                            const float *wi, float *o);
/* x[k] = bf16(x[k]) and x[k] = bf16(x[k]·c), k < n (di_round_bf16's
 * rounding: nearest even, NaN kept and quieted), in place. */
void di_cpu_round_bf16_avx2(float *x, int64_t n);
void di_cpu_scale_bf16_avx2(float *x, int64_t n, float c);
/* y[k] = y[k] + x[k], k < n (x may equal y). */
void di_cpu_add_avx2(float *y, const float *x, int64_t n);
/* out[k] = bf16(acc[k] / sum), k < n. */
void di_cpu_div_bf16_avx2(const float *acc, float sum, int64_t n, float *out);
/* y[i, j] (row stride ldy) = Σ_k x[i, k]·pt[k, j] for j < nb <= 8 and rows
 * i < m (stride ldx), each a chain acc = fmaf(x, w, acc) in increasing k
 * from +0 — the order of di_gemm_f32. pt is a transposed panel [K, 8]. */
void di_cpu_panel8_f32_avx2(const float *pt, int64_t K, const float *x, int64_t ldx, int64_t m,
                            float *y, int64_t ldy, int nb);
/* The same for np (2..4) panels at once, panel q with its own x[q] and
 * y[q] (strides ldx, ldy) and nb[q] columns: for fewer than 4 rows, where
 * one panel's single chain waits on each FMA's latency, the np chains run
 * side by side; each keeps its order, so the bits are those of np calls
 * above. */
void di_cpu_panels8_f32_avx2(int np, const float *const *pt, int64_t K, const float *const *x, int64_t ldx,
                             int64_t m, float *const *y, int64_t ldy, const int *nb);
/* The transposed panel of FP8 weight rows r0 .. r0+nb-1 (nb <= 8):
 * pt[k, j] = e4m3(w[r0+j, k])·e8m0(s[(r0+j)/32, k/32]), the exact values
 * (0 for j >= nb). w [*, K] E4M3 codes, s [*, K/32] E8M0; K % 32 == 0. */
void di_cpu_fp8_panel8_avx2(const uint8_t *w, const uint8_t *s, int64_t K, int64_t r0, int nb,
                            float *pt);
/* di_kvq_unpack (backend/kvstore.h) on 8 lanes: the same values, bit for
 * bit (code · scale, one rounding), but for a NaN code under a NaN scale,
 * NaN either way, whose sign may differ. */
void di_cpu_kvq_unpack_avx2(di_kvq f, const uint8_t *row, int64_t n, float *x);
/* di_cpu_qdq_fp4 (cpu_quant.h) over the nb blocks of bl values (16 or 32)
 * at x, in place, with its bits: the same divisions by the block's scale,
 * the same clamps (a NaN becomes -6, as fmaxf makes it), the E2M1 grid by
 * the same midpoints and ties; a block whose scale is not finite (an
 * infinite value in it) takes the scalar code. */
void di_cpu_qdq_fp4_avx2(float *x, int64_t nb, int bl, int e4m3);
#endif

#endif
