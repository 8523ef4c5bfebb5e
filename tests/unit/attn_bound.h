/* cmp_attn_tc: the check of the tensor-core sparse attention against the
 * CPU op, shared by the CUDA op-table and step tests. Include after test.h
 * (it counts through CHECKF). */
#ifndef DI_ATTN_BOUND_H
#define DI_ATTN_BOUND_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Both sides see the same exact inputs (q bf16, decoded cache values
 * code·scale with at most 6 significant bits) and the same 64-slot blocks;
 * every product is exact in fp32, including bf16(p)·v. What differs:
 * - the order of the fp32 sums: q·k over d (CPU in sequence or by 8 lanes,
 *   GPU in mma steps of 16), so |Δs_j| <= 2·(d + 2)·2^-24·scale·Σ_k|q_k v_jk|;
 *   p·v over the slots and the denominator, (n_slots + d)·2^-23 relative;
 * - expf (CUDA's within 2 ulps, glibc's within 1) on p, the block rescales
 *   and the sink: (blocks + 2)·2^-21 relative;
 * - the split-slot form (cuda_op_sparse_attn_kv_tc_split: S blocks per row,
 *   each with its own running maximum, combined with w_c = exp(M_c − M)):
 *   each p's chain of factors gains one expf (w_c) and one fp32 product
 *   (O_c·w_c or l_c·w_c), (1 + 2^-2)·2^-21 < 2^-20 relative, and the sums
 *   gain S ≤ blocks terms in rank order, S·2^-23; the unsplit kernel is
 *   bounded by the same (larger) ε, so one bound serves both;
 * so each p and the denominator differ by at most a relative
 * ε = 4·max|Δs| + (blocks + 3)·2^-21 + (n_slots + d + blocks)·2^-23, and a
 * bf16(p) by ε plus one bf16 ulp when the two sides' p straddle a rounding
 * point (2^-7 relative at most). In the split form a block c > 0 rounds
 * exp(s − M_c) where the CPU rounds exp(s − its running max): two
 * roundings of the same p at different scales, each within 2^-8 of it, so
 * again within 2^-7 of each other. With A_k = Σ_j p_j·|v_jk| / Z (exact p, Z with
 * the sink) the unrounded outputs differ by at most (2^-7 + ε)·A_k + ε·|o|,
 * and the final bf16 rounding of each side adds 2^-8 of each, 2^-7·|o| in
 * all. Those straddles are rare and of either sign, so on average the
 * difference must also stay far below the per-element worst case: the mean
 * |gpu − cpu| is held to 2^-9 of the mean A_k. In the split form the p of
 * blocks whose maximum is not the CPU's are rounded independently (not
 * rarely) but with zero mean: their errors, each at most 2^-8·p, cancel as
 * the square root of the slots that carry the weight, and a slot carrying
 * all of it is the row's maximum, exp(0) = 1 on both sides; the 2^-9 of
 * the mean A_k still holds. Rows with no slot must be exactly 0. */
static inline void cmp_attn_tc(const char *what, const float *og, const float *oc,
                               const float *q, int64_t m, int h, int64_t d,
                               const float *const *rows, int ns, const float *sink, float sc) {
    double *p = malloc((size_t)(ns ? ns : 1) * sizeof *p);
    int64_t bad = 0, first = -1;
    double worst = 0, sum_diff = 0, sum_a = 0;
    int nblk = (ns + 63) / 64;
    for (int64_t i = 0; i < m; i++)
        for (int hh = 0; hh < h; hh++) {
            const float *qi = q + (i * h + hh) * d;
            const float *const *ri = rows + i * ns;
            double M = -1e30, dsmax = 0;
            for (int j = 0; j < ns; j++) {
                if (!ri[j]) continue;
                double s = 0, sa = 0;
                for (int64_t k = 0; k < d; k++) {
                    s += (double)qi[k] * ri[j][k];
                    sa += fabs((double)qi[k] * ri[j][k]);
                }
                p[j] = s * sc;
                if (p[j] > M) M = p[j];
                double ds = 2.0 * (double)(d + 2) * 0x1p-24 * sa * sc;
                if (ds > dsmax) dsmax = ds;
            }
            double Z = exp((double)sink[hh] - M);
            for (int j = 0; j < ns; j++)
                if (ri[j]) {
                    p[j] = exp(p[j] - M);
                    Z += p[j];
                }
            double eps = 4 * dsmax + (nblk + 3) * 0x1p-21 + (double)(ns + d + nblk) * 0x1p-23;
            for (int64_t k = 0; k < d; k++) {
                double a = 0;
                for (int j = 0; j < ns; j++)
                    if (ri[j]) a += p[j] * fabs((double)ri[j][k]);
                a /= Z;
                int64_t e = (i * h + hh) * d + k;
                double c = oc[e], diff = fabs((double)og[e] - c);
                double lim = 0x1p-7 * fabs(c) * (1 + 0x1p-7) + 1.01 * ((0x1p-7 + eps) * a + eps * fabs(c));
                if (!(diff <= lim)) { /* NaN fails */
                    if (first < 0) first = e;
                    bad++;
                } else if (lim > 0 && diff / lim > worst) {
                    worst = diff / lim;
                }
                sum_diff += diff;
                sum_a += a;
            }
        }
    CHECKF(bad == 0, "%s: %lld of %lld out of bound, first at %lld: gpu %.9g cpu %.9g", what,
           (long long)bad, (long long)(m * h * d), (long long)first, first >= 0 ? og[first] : 0.0,
           first >= 0 ? oc[first] : 0.0);
    CHECKF(sum_diff <= 0x1p-9 * sum_a, "%s: mean |gpu - cpu| %.3g above 2^-9 of mean A %.3g", what,
           sum_diff / (double)(m * h * d), sum_a / (double)(m * h * d));
    if (getenv("DI_TEST_VERBOSE"))
        fprintf(stderr, "  %-40s worst %.3f of bound, mean diff / mean A %.2e\n", what, worst,
                sum_a > 0 ? sum_diff / sum_a : 0.0);
    free(p);
}

#endif
