/* The MoE router's arithmetic (architecture.md §7 steps 1–3) as one fixed
 * sequence of fp32 operations, so that the host and a device compute the
 * same bits: the sqrt-softplus score, the biased top-k pick with its tie
 * and NaN rule, and the weight normalisation.
 *
 * libm's expf / log1pf are not used: their last bits differ between
 * libraries and from a GPU's expf, which kept routing on the host. Here
 * every operation is a correctly rounded IEEE operation (+, -, ×, /, sqrt,
 * fused multiply-add, rint) spelled out explicitly — DI_FMA is one rounding
 * on both sides and the plain products and sums are kept from being fused
 * (__fmul_rn / __fadd_rn on the device, no contraction on the host), so C
 * and CUDA give the same result for every input. Accuracy against the
 * exact function: docs/numerics.md ("Router arithmetic").
 *
 * Usable from C (static inline) and from CUDA (__host__ __device__). */
#ifndef DI_CORE_ROUTE_SCORE_H
#define DI_CORE_ROUTE_SCORE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Always inlined on the host too, so that a caller compiled for FMA
 * (backend_cpu.c) gets DI_FMA as one instruction rather than a libm call. */
#if defined(__CUDACC__)
#define DI_HD __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define DI_HD static inline __attribute__((always_inline))
#else
#define DI_HD static inline
#endif

#if defined(__CUDA_ARCH__)
#define DI_RS_MUL(a, b) __fmul_rn((a), (b))
#define DI_RS_ADD(a, b) __fadd_rn((a), (b))
#define DI_RS_SUB(a, b) __fsub_rn((a), (b))
#define DI_RS_DIV(a, b) __fdiv_rn((a), (b))
#define DI_RS_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#define DI_RS_SQRT(a) __fsqrt_rn(a)
#else
#define DI_RS_MUL(a, b) ((a) * (b))
#define DI_RS_ADD(a, b) ((a) + (b))
#define DI_RS_SUB(a, b) ((a) - (b))
#define DI_RS_DIV(a, b) ((a) / (b))
#define DI_RS_FMA(a, b, c) fmaf((a), (b), (c))
#define DI_RS_SQRT(a) sqrtf(a)
#endif

/* Keeps a host compiler from fusing a product and a sum of one expression
 * into an FMA on targets that have one (clang contracts by default). */
#if defined(__clang__) && !defined(__CUDACC__)
#define DI_RS_NO_CONTRACT _Pragma("STDC FP_CONTRACT OFF")
#else
#define DI_RS_NO_CONTRACT
#endif

DI_HD float di_rs_bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* e^a for a <= 0 (a not NaN): a = n·ln2 + r with n = rint(a·log2 e) and
 * |r| <= ~0.347 (two-part ln2, the first part 16 bits so n·ln2_hi is
 * exact); e^r by its Taylor polynomial to r^8 (truncation below 2^-32
 * relative) in Horner form; then 2^n from the exponent bits, in two steps
 * below 2^-125 so that a subnormal result is rounded once. (The sampler's
 * 8-lane form, core/row_exp.c, repeats these operations.) */
#define DI_RS_EXP_MIN (-104.0f) /* below: e^a < 2^-150 rounds to +0 */
#define DI_RS_LOG2E 1.44269502f
#define DI_RS_LN2_HI 0.693145751953125f
#define DI_RS_LN2_LO 1.42860677e-6f
DI_HD float di_rs_exp_nonpos(float a) {
    DI_RS_NO_CONTRACT
    /* Both ends are computed and one chosen, no branch: a GPU then runs a
     * thread's several exponentials as independent chains side by side
     * (cuda_ops_logits.cu) instead of one branch region after another.
     * Below the range the result is 0 and x only keeps the conversion to
     * int defined. */
    const int zero = a < DI_RS_EXP_MIN;
    const float x = zero ? 0.0f : a;
    float n = rintf(DI_RS_MUL(x, DI_RS_LOG2E));
    float r = DI_RS_FMA(-n, DI_RS_LN2_HI, x);
    r = DI_RS_FMA(-n, DI_RS_LN2_LO, r);
    float p = 1.0f / 40320.0f;
    p = DI_RS_FMA(p, r, 1.0f / 5040.0f);
    p = DI_RS_FMA(p, r, 1.0f / 720.0f);
    p = DI_RS_FMA(p, r, 1.0f / 120.0f);
    p = DI_RS_FMA(p, r, 1.0f / 24.0f);
    p = DI_RS_FMA(p, r, 1.0f / 6.0f);
    p = DI_RS_FMA(p, r, 0.5f);
    p = DI_RS_FMA(p, r, 1.0f);
    p = DI_RS_FMA(p, r, 1.0f);
    int ni = (int)n; /* in [-150, 0] */
    const float hi = DI_RS_MUL(p, di_rs_bits_f32((uint32_t)(ni + 127) << 23));
    const float lo = DI_RS_MUL(DI_RS_MUL(p, di_rs_bits_f32((uint32_t)(ni + 64 + 127) << 23)),
                               di_rs_bits_f32((uint32_t)(127 - 64) << 23));
    return zero ? 0.0f : ni >= -125 ? hi : lo;
}

/* log(1 + t) for 0 <= t <= 1: 1 + t = 2^k·(1 + f) with f exact (f = t for
 * t < 1/2; f = (t - 1)/2, k = 1 above, both exact by Sterbenz), so
 * f ∈ [-1/4, 1/2). With s = f/(2 + f): log(1 + f) = 2·atanh(s)
 *   = f - f²/2 + s·(f²/2 + R),  R = z·(2/3 + 2/5·z + … + 2/11·z⁴), z = s²,
 * which keeps f itself out of every rounded step but the last (the
 * truncation after z⁵ is below 2^-30 relative). */
DI_HD float di_rs_log1p_unit(float t) {
    DI_RS_NO_CONTRACT
    float f = t, k = 0.0f;
    if (t >= 0.5f) {
        f = DI_RS_MUL(DI_RS_SUB(t, 1.0f), 0.5f);
        k = 1.0f;
    }
    float s = DI_RS_DIV(f, DI_RS_ADD(2.0f, f));
    float z = DI_RS_MUL(s, s);
    float R = 2.0f / 11.0f;
    R = DI_RS_FMA(R, z, 2.0f / 9.0f);
    R = DI_RS_FMA(R, z, 2.0f / 7.0f);
    R = DI_RS_FMA(R, z, 2.0f / 5.0f);
    R = DI_RS_FMA(R, z, 2.0f / 3.0f);
    R = DI_RS_MUL(R, z);
    float hfsq = DI_RS_MUL(DI_RS_MUL(0.5f, f), f);
    const float ln2_hi = 0.693145751953125f, ln2_lo = 1.42860677e-6f;
    float corr = DI_RS_FMA(s, DI_RS_ADD(hfsq, R), DI_RS_MUL(k, ln2_lo));
    float r = DI_RS_SUB(f, DI_RS_SUB(hfsq, corr));
    return DI_RS_FMA(k, ln2_hi, r);
}

/* The router score sqrt(softplus(x)), softplus(x) = x above 20 (as the
 * reference's threshold) and max(x, 0) + log1p(e^-|x|) below; a NaN gives
 * the one quiet NaN 0x7fc00000 on every device. */
DI_HD float di_route_score(float x) {
    DI_RS_NO_CONTRACT
    if (x != x) return di_rs_bits_f32(0x7fc00000u);
    if (x > 20.0f) return DI_RS_SQRT(x);
    float l = di_rs_log1p_unit(di_rs_exp_nonpos(-fabsf(x)));
    float sp = x > 0.0f ? DI_RS_ADD(x, l) : l;
    return DI_RS_SQRT(sp);
}

/* Top-k pick, one rank at a time: among the experts not yet taken, the
 * first (lowest id) if its biased score is NaN, else the highest non-NaN
 * biased score, ties to the lower id — exactly what a scan in ascending id
 * that replaces the best on a strictly greater score picks. The state
 * folds any subset of the candidates, in any order, and two states merge,
 * so a device splits the candidates over threads and gets the same pick. */
typedef struct di_route_pick {
    int32_t first;  /* lowest candidate id seen, INT32_MAX: none */
    int32_t fnan;   /* its biased score is NaN */
    int32_t best;   /* id of the best non-NaN score, INT32_MAX: none */
    float bv;       /* that score */
} di_route_pick;

DI_HD di_route_pick di_route_pick_empty(void) {
    di_route_pick p = {INT32_MAX, 0, INT32_MAX, 0.0f};
    return p;
}

DI_HD void di_route_pick_add(di_route_pick *p, int32_t j, float v) {
    if (j < p->first) {
        p->first = j;
        p->fnan = v != v;
    }
    if (v == v && (p->best == INT32_MAX || v > p->bv || (v == p->bv && j < p->best))) {
        p->best = j;
        p->bv = v;
    }
}

DI_HD di_route_pick di_route_pick_merge(di_route_pick a, di_route_pick b) {
    if (b.first < a.first) {
        a.first = b.first;
        a.fnan = b.fnan;
    }
    if (b.best != INT32_MAX &&
        (a.best == INT32_MAX || b.bv > a.bv || (b.bv == a.bv && b.best < a.best))) {
        a.best = b.best;
        a.bv = b.bv;
    }
    return a;
}

/* The picked id, or -1 when no candidate was seen. */
DI_HD int32_t di_route_pick_id(di_route_pick p) {
    if (p.first == INT32_MAX) return -1;
    return p.fnan || p.best == INT32_MAX ? p.first : p.best;
}

/* Routing weights in place: v [k] holds the picked experts' unbiased scores
 * in rank order; they are summed in that order, divided by (sum + 1e-20)
 * when normalising (k > 1), and multiplied by route_scale. */
DI_HD void di_route_weights(float *v, int k, int normalize, float route_scale) {
    DI_RS_NO_CONTRACT
    float sum = 0.0f;
    for (int r = 0; r < k; r++) sum = DI_RS_ADD(sum, v[r]);
    float den = DI_RS_ADD(sum, 1e-20f);
    for (int r = 0; r < k; r++) {
        float x = v[r];
        if (normalize && k > 1) x = DI_RS_DIV(x, den);
        v[r] = DI_RS_MUL(x, route_scale);
    }
}

#endif
