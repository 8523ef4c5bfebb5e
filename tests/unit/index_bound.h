/* idx_admissible: the interval an fp32 form of the index scores may give
 * a score in (architecture.md §5.4 step 3's rounding points, the CPU
 * backend's idx_score), shared by the CPU op test and the CUDA op-table
 * test. */
#ifndef DI_INDEX_BOUND_H
#define DI_INDEX_BOUND_H

#include <math.h>
#include <stdint.h>

#include "core/dtype.h"

/* The scores an fp32 form of index_scores_kv may give for query row q [hi,
 * di] (weights w [hi]) and key k [di], as an interval: a dot computed in
 * fp32 in any order lies within (di - 1) fp32 units of rounding of the sum
 * of its terms' magnitudes from the exact one (the CPU's 8 lanes and the
 * tensor cores' 24 steps a head stay well inside that); the window is
 * 2^-17 of that sum, or di units past di = 128. Every later step of
 * idx_score (the CPU backend's
 * rounding points: bf16 of the dot, ReLU, bf16 of its product with w, the
 * heads summed in order from +0 in fp32, bf16 of the sum) is monotone in
 * each head's dot, so the ends of the dots' windows give the ends of the
 * score's: [*lo, *hi]. */
static inline void idx_admissible(const float *q, const float *w, int hi, int64_t di, const float *k, float *lo, float *hi_s) {
    float tl = 0.f, th = 0.f;
    for (int h = 0; h < hi; h++) {
        double d = 0, a = 0;
        for (int64_t t = 0; t < di; t++) {
            const double p = (double)q[h * di + t] * k[t];
            d += p;
            a += fabs(p);
        }
        const double del = a * fmax(0x1p-17, (double)di * 0x1p-24);
        float dl = di_round_bf16(nextafterf((float)(d - del), -INFINITY));
        float dh = di_round_bf16(nextafterf((float)(d + del), INFINITY));
        dl = dl < 0.f ? 0.f : dl;
        dh = dh < 0.f ? 0.f : dh;
        float el = di_round_bf16(dl * w[h]), eh = di_round_bf16(dh * w[h]);
        if (el > eh) {
            const float x = el;
            el = eh;
            eh = x;
        }
        tl += el;
        th += eh;
    }
    *lo = di_round_bf16(tl);
    *hi_s = di_round_bf16(th);
}

#endif
