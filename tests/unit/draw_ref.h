/* A plain reference of a row's temperature draw (core/row_exp.h
 * di_row_draw): the sampler's definition written the long way — the whole
 * kept list sorted, running sums from the start — against which the
 * sampler (tests/unit/test_sampler.c) and a backend's logits_draw
 * (test_cuda_backend.c, the fake runner of test_scheduler.c) are checked.
 * near_cap: the widest near set the backend draws itself (the kept
 * candidates above the first cut that holds the top k or the nucleus, or
 * all of them when none does); a wider one gives pad = 1 (the host's). */
#ifndef DI_TESTS_DRAW_REF_H
#define DI_TESTS_DRAW_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/row_exp.h"
#include "engine/sampler.h"
#include "test_rng.h"
#include <string.h>

static const float *draw_ref_w; /* qsort's values (one thread) */

static inline int draw_ref_cmp(const void *a, const void *b) {
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    const float x = draw_ref_w[i], y = draw_ref_w[j];
    return x > y ? -1 : x < y ? 1 : (i > j) - (i < j);
}

/* 0 when out of memory */
static inline int draw_ref(const float *x, int64_t V, int64_t lim, const di_row_draw *d, int64_t near_cap,
                    di_row_greedy *g) {
    float *w = malloc((size_t)V * sizeof *w), *e = malloc((size_t)V * sizeof *e);
    int32_t *list = malloc((size_t)V * sizeof *list);
    int ok = w && e && list;
    if (!ok) goto out;
    g->max_all = di_row_max(x, V) + 0.0f;
    g->sum = di_row_sum_exp(x, V, g->max_all);
    g->token = -1, g->max = -INFINITY, g->pad = 0;
    for (int64_t t = 0; t < V; t++) w[t] = t < lim && t != d->ban ? x[t] : -INFINITY;
    const float wmax = di_row_max(w, V);
    if (wmax == -INFINITY) goto out;
    di_row_exp(w, V, wmax, d->inv_t, e);
    const int f = di_row_sum_frac_bits(V);
    int64_t n = 0;
    uint64_t Q = 0;
    for (int64_t t = 0; t < V; t++)
        if (e[t] >= d->min_p && e[t] > 0.0f) list[n++] = (int32_t)t, Q += (uint64_t)di_row_term_q(e[t], f);
    if (n == 0) goto out;
    const int topk_on = d->top_k > 0 && d->top_k < n;
    uint64_t tot = Q;
    if (topk_on || d->top_p < 1.0) {
        const float cuts[DI_SAMPLER_CUTS] = {DI_SAMPLER_CUT0, DI_SAMPLER_CUT1, DI_SAMPLER_CUT2};
        int c = 0;
        int64_t near = 0;
        for (; c < DI_SAMPLER_CUTS; c++) {
            uint64_t nq = 0;
            near = 0;
            for (int64_t j = 0; j < n; j++)
                if (e[list[j]] > cuts[c]) near++, nq += (uint64_t)di_row_term_q(e[list[j]], f);
            if (topk_on ? d->top_k <= near : (double)nq >= d->top_p * (double)Q) break;
        }
        if (c == DI_SAMPLER_CUTS) near = n; /* no cut holds them: every kept candidate */
        if (near > near_cap) {
            g->pad = 1;
            goto out;
        }
        draw_ref_w = w;
        qsort(list, (size_t)n, sizeof *list, draw_ref_cmp);
        if (topk_on) {
            n = d->top_k;
            tot = 0;
            for (int64_t j = 0; j < n; j++) tot += (uint64_t)di_row_term_q(e[list[j]], f);
        }
        if (d->top_p < 1.0) {
            uint64_t acc = 0;
            for (int64_t j = 0; j < n; j++) {
                acc += (uint64_t)di_row_term_q(e[list[j]], f);
                if ((double)acc >= d->top_p * (double)tot) {
                    n = j + 1;
                    break;
                }
            }
        }
        tot = 0;
        for (int64_t j = 0; j < n; j++) tot += (uint64_t)di_row_term_q(e[list[j]], f);
    }
    int32_t tok = list[n - 1];
    uint64_t acc = 0;
    for (int64_t j = 0; j < n; j++) {
        acc += (uint64_t)di_row_term_q(e[list[j]], f);
        if ((double)acc > d->u * (double)tot) {
            tok = list[j];
            break;
        }
    }
    g->token = tok;
    g->max = x[tok];
out:
    free(w);
    free(e);
    free(list);
    return ok;
}

/* A row and a draw for case k (needs test_rng.h's generator, seeded by the
 * caller): logits shaped like a model's (a normal tail and a few peaks),
 * flat ones (a nucleus of most of the row), few distinct values (ties), a
 * constant row (every term the largest, 2^F), -inf / NaN / +inf entries;
 * temperature, top-k, top-p, min-p, a banned id
 * and the search bound varied. Fills the sampler's settings p / in, which
 * di_sampler_draw_spec turns into the draw. */
static inline void draw_case(int k, float *x, int64_t V, di_sampler_params *p, di_sample_in *in) {
    const int kind = k % 7;
    for (int64_t t = 0; t < V; t++) {
        const float z = rng_normal();
        x[t] = kind == 1 ? 0.1f * z : kind == 2 ? (float)(rng_int(4) - 1) : kind == 6 ? 0.5f : 2.0f * z;
    }
    if (kind == 0 || kind == 3)
        for (int j = 0; j < 12; j++) x[rng_int((int)V)] += 8.0f + (float)(j % 7);
    if (kind == 3) {
        for (int j = 0; j < 5; j++) x[rng_int((int)V)] = -INFINITY;
        x[rng_int((int)V)] = NAN;
    }
    if (kind == 4 && rng_int(2)) x[rng_int((int)V)] = INFINITY;
    if (kind == 5) for (int64_t t = 0; t < V; t++) x[t] = -INFINITY;
    static const double temps[] = {0.05, 0.5, 0.8, 1.0, 1.7}, tops[] = {1.0, 1.0, 0.9, 0.5, 0.999};
    static const int topks[] = {0, 0, 1, 3, 40};
    memset(p, 0, sizeof *p);
    p->temperature = temps[rng_int(5)];
    p->top_p = tops[rng_int(5)];
    p->top_k = topks[rng_int(5)];
    p->min_p = rng_int(3) == 0 ? 0.05 : 0.0;
    p->repetition_penalty = 1.0;
    p->eos_id = rng_int(2) ? rng_int((int)V) : -1;
    p->ignore_eos = rng_int(2);
    p->min_tokens = rng_int(3) == 0 ? 5 : 0;
    p->seed = rng_next();
    memset(in, 0, sizeof *in);
    in->n_output = rng_int(8);
    in->forced = -1;
    in->stream = (uint64_t)rng_int(4);
    in->vocab_limit = rng_int(3) == 0 ? V - 1 - rng_int((int)(V / 4) + 1) : 0;
}

#endif
