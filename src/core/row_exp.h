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

#include <math.h>
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

/* Σ exp(x[i] - shift), as a sum of fixed-point terms: each term t (a
 * float in [0, 1]) becomes the integer q = rint(t · 2^F), ties to even,
 * F = di_row_sum_frac_bits(n), the q added as 64-bit integers and the total
 * returned as Q · 2^-F (one rounding, to double). Integer addition does not
 * care about order, so the sum has one value however it is split: an AVX2
 * core adds 4 lanes at a time, a GPU a whole grid of blocks, and both get
 * the same bits (a sum of doubles in chains would tie a device to one warp
 * of chains). Each term is off by at most 2^-(F+1), the sum by n·2^-(F+1)
 * plus the final rounding: at the model's 129,280 logits F = 45, within
 * 2^-28 of a sum that is at least 1 when shift is the row's maximum. NaN
 * when any x[i] is NaN. A term whose difference is NaN from finite-or-
 * infinite inputs (+inf - +inf: a +inf logit at a +inf maximum) counts as
 * e^0 = 1. */
double di_row_sum_exp(const float *x, int64_t n, float shift);

/* F for a sum of n terms: 62 - (bits of n), at most 50 (n terms of at most
 * 2^F stay below 2^62; a term's t · 2^F below 2^51 is rounded to an integer
 * by one double addition on the vector path), at least 0. */
static inline int di_row_sum_frac_bits(int64_t n) {
    int b = 0;
    while (b < 63 && (n >> b) > 0) b++;
    const int f = 62 - b;
    return f > 50 ? 50 : f < 0 ? 0 : f;
}

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

/* An entry of a row's top list: an id and its value as the row holds it. */
typedef struct di_row_top {
    int32_t id;
    float x;
} di_row_top;

/* The row's k largest entries (k <= V), the largest first, in a total
 * order: numbers by value (+0 and -0 alike), NaN below every number, equal
 * ones by lower id. Where the row has no NaN these are the sampler's top
 * logprob ids (di_logprob_topk), which takes this order where it has one;
 * a device forms the same list (the backend's logits_top) so that a row's
 * top logprobs need not bring the row to the host. */
void di_row_top_of(const float *x, int64_t V, int32_t k, di_row_top *out);
/* The longest top list a backend forms (logits_top). */
#define DI_ROW_TOP_MAX 32

/* A term of a fixed-point sum: rint(t · 2^frac), ties to even, for t in
 * [0, 1] (t · 2^frac is exact: a power-of-two scale; below 2^51 for frac
 * <= 50). The sampler's sums of probabilities are such terms added as
 * 64-bit integers, like di_row_sum_exp's, so a device adds them in any
 * order and gets the host's bits. */
static inline int64_t di_row_term_q(float t, int frac) {
    union { double d; int64_t i; } a = {.d = (double)t * (double)(1ll << frac) + 0x1.8p52}, b = {.d = 0x1.8p52};
    return a.i - b.i;
}

/* The sampler's kept candidates of a row of probabilities e[0..n) (e >=
 * cut and e > 0; NaN never): the sum of their terms (frac as above), their
 * number and (idx not NULL) their indices in increasing order; and the
 * first of them, in index order, whose running sum passes lim ((double)sum
 * > lim), -1 when none does. 8 lanes at a time where AVX2 is there; the
 * sums are integers, so every form gives the same result. */
uint64_t di_row_kept_sum(const float *e, int64_t n, float cut, int frac, int64_t *count, int32_t *idx);
int64_t di_row_kept_cross(const float *e, int64_t n, float cut, int frac, double lim);

/* An id of a row whose logit the sampler's processing changes (logit
 * bias, the stop ids banned before min_tokens, the repetition, frequency
 * and presence penalties), with what it does to the logit, in the
 * sampler's order (engine/sampler.c): the bias added, the ban, the
 * repetition penalty (a seen id: a positive logit divided by it, any other
 * multiplied), then sub subtracted (frequency · count + presence, rounded
 * to float as the sampler rounds it). A row's edits come in ascending id
 * order, each id once. The layout is fixed (C and CUDA share it). */
enum { DI_EDIT_BIAS = 1, DI_EDIT_BAN = 2, DI_EDIT_SEEN = 4, DI_EDIT_SUB = 8 };
typedef struct di_row_edit {
    int32_t id;
    uint32_t flags; /* DI_EDIT_* */
    float bias;     /* DI_EDIT_BIAS: added first */
    float sub;      /* DI_EDIT_SUB: subtracted last */
} di_row_edit;

/* The processed logit of an edited id whose raw logit is v (rep: the
 * row's repetition penalty): the sampler's float operations, one at a
 * time (no contraction: each is rounded). */
static inline float di_row_edit_value(const di_row_edit *e, float rep, float v) {
    volatile float w = v; /* one rounding an operation, whatever the compiler contracts */
    if (e->flags & DI_EDIT_BIAS) w = w + e->bias;
    if (e->flags & DI_EDIT_BAN) w = -(float)INFINITY;
    if (e->flags & DI_EDIT_SEEN) w = w > 0 ? w / rep : w * rep;
    if (e->flags & DI_EDIT_SUB) w = w - e->sub;
    return w;
}

/* A draw a device can make next to the logits: the settings of a row
 * whose processing is a banned id and a list of edited ids (no mask or
 * forced token), as the sampler applies them (engine/sampler.h
 * di_sampler_draw_spec): a temperature draw, or the greedy token of the
 * processed row. The layout is fixed (C and CUDA share it). */
typedef struct di_row_draw {
    float inv_t;    /* (float)(1 / temperature); 0 when greedy */
    float min_p;    /* (float)min_p, 0 when off */
    double top_p;   /* 1: off */
    double u;       /* the draw's uniform in [0, 1): 53 bits of di_rng_bits */
    int32_t top_k;  /* 0: off */
    int32_t ban;    /* the one id set to -inf, -1 none */
    float rep;      /* the repetition penalty of DI_EDIT_SEEN ids */
    int32_t n_edit; /* the row's edits: n_edit of the call's list from e0 */
    int64_t e0;
    int32_t greedy; /* 1: no draw, the first maximum of the processed row (temperature 0) */
    int32_t pad_;   /* 0 */
} di_row_draw;

/* The sampler's cuts for top-k / top-p: it first sorts only the kept
 * candidates with e = exp((w - max) / T) above a cut (e^-6, then e^-10,
 * then e^-16), the first that holds the top k or the nucleus's mass. */
#define DI_SAMPLER_CUTS 3
#define DI_SAMPLER_CUT0 2.4787522e-03f /* e^-6 */
#define DI_SAMPLER_CUT1 4.5399930e-05f /* e^-10 */
#define DI_SAMPLER_CUT2 1.1253517e-07f /* e^-16 */

/* Test aid: 1 runs the scalar mirror even where AVX2 + FMA are there. */
void di_row_exp_force_scalar(int on);

#endif
