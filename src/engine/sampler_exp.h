/* Exponentials over a vocabulary row for the sampler: the softmax numerators
 * of temperature sampling and the log-sum-exp behind every reported
 * logprob. A row is 129,280 logits and libm's expf costs ~6 ns a call, so a
 * decode step of 64 sequences spent ~0.1 s of host time here alone; these
 * run 8 lanes at a time (AVX2 + FMA) and, on other CPUs, a scalar mirror of
 * the very same operations, so both give the same bits.
 *
 * exp(a) is the router's e^a (core/route_score.h: a = n ln 2 + r, a Taylor
 * polynomial of r to r^8, 2^n from the exponent bits; a correctly rounded
 * operation at every step, within ~1 ulp): inputs above 0 are taken as 0
 * (the sampler's are at most 0: logits minus their maximum), -inf and
 * anything below -104 give 0, NaN gives NaN. */
#ifndef DI_ENGINE_SAMPLER_EXP_H
#define DI_ENGINE_SAMPLER_EXP_H

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

/* Σ exp(x[i] - shift) in double, summed in 8 lanes (element i into lane
 * i mod 8, each lane in increasing i) and the lanes added as ((0+1)+(2+3)) +
 * ((4+5)+(6+7)); NaN when any x[i] is NaN. */
double di_row_sum_exp(const float *x, int64_t n, float shift);

/* Test aid: 1 runs the scalar mirror even where AVX2 + FMA are there. */
void di_row_exp_force_scalar(int on);

#endif
