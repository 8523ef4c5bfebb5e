/* Exponentials over a vocabulary row for the sampler: the softmax numerators
 * of temperature sampling and the log-sum-exp behind every reported
 * logprob. A row is 129,280 logits and libm's expf costs ~6 ns a call, so a
 * decode step of 64 sequences spent ~0.1 s of host time here alone; these
 * run 8 values at a time (AVX2 + FMA) and, on other CPUs, a scalar mirror of
 * the very same operations, so both give the same bits.
 *
 * exp(a) is the router's e^a (core/route_score.h: a = n ln 2 + r, a Taylor
 * polynomial of r to r^8, 2^n from the exponent bits; a correctly rounded
 * operation at every step, within ~1 ulp): inputs above 0 are taken as 0
 * (the sampler's are at most 0: logits minus their maximum), -inf and
 * anything below -104 give 0, NaN gives NaN. */
#ifndef DI_CORE_ROW_EXP_H
#define DI_CORE_ROW_EXP_H

#include <stdint.h>

/* The largest value of x[0..n), NaN ignored; -inf when none (or n == 0). */
float di_row_max(const float *x, int64_t n);

/* The first i in [0, n) with x[i] == v (v not NaN), n when there is none:
 * where the row's maximum sits, 8 comparisons at a time. */
int64_t di_row_find(const float *x, int64_t n, float v);

/* The first j in [i, n) with x[j] > t (never for a NaN x[j] or t), n when
 * there is none: the next candidate of a top-k list, 8 comparisons at a
 * time. */
int64_t di_row_next_above(const float *x, int64_t i, int64_t n, float t);

/* out[i] = exp((x[i] - shift) · scale) for i in [0, n). */
void di_row_exp(const float *x, int64_t n, float shift, float scale, float *out);

/* Σ exp(x[i] - shift) in double, summed in DI_ROW_SUM_LANES lanes (element
 * i into lane i mod 32, each lane in increasing i) and the lanes added as a
 * tree of neighbours, ((0+1)+(2+3))+((4+5)+(6+7)) and so on up to 32: a
 * fixed order, which an AVX2 core runs as 8 independent vector chains and
 * a GPU as one warp of 32 chains (a lane's additions cannot be split
 * without changing their roundings, so the lanes' number bounds how
 * parallel a device can make the exact sum); NaN when any x[i] is NaN. A term whose difference is NaN
 * from finite-or-infinite inputs (+inf - +inf: a +inf logit at a +inf
 * maximum) counts as e^0 = 1. */
#define DI_ROW_SUM_LANES 32
double di_row_sum_exp(const float *x, int64_t n, float shift);

/* What greedy sampling needs of a row, and nothing more: where its first
 * maximum sits and the row's log-sum-exp, in the operations above, so that
 * a device can form it next to the logits and send back 24 bytes instead of
 * the row (the sampler reads the row itself otherwise; either way the same
 * bits). The layout is fixed (C and CUDA share it). */
typedef struct di_row_greedy {
    float max;      /* the largest value of x[0..lim) leaving out x[ban]; -inf: none
                       (a zero as +0: which zero a search meets first is no property
                       of the row) */
    int32_t token;  /* the first i with x[i] == max (i != ban, i < lim); -1: none */
    float max_all;  /* the largest value of the whole row (NaN ignored; a zero as +0) */
    int32_t pad;    /* 0 */
    double sum;     /* di_row_sum_exp(x, V, max_all): NaN when any x[i] is NaN */
} di_row_greedy;

/* g for the row x[0..V): the search over ids [0, lim) (lim <= V), skipping
 * ban (-1 or any id outside [0, lim): none). The row's log-sum-exp is then
 * max_all + log(sum) (di_row_greedy_lse), the sampler's. */
void di_row_greedy_of(const float *x, int64_t V, int64_t lim, int32_t ban, di_row_greedy *g);
double di_row_greedy_lse(const di_row_greedy *g);

/* Test aid: 1 runs the scalar mirror even where AVX2 + FMA are there. */
void di_row_exp_force_scalar(int on);

#endif
