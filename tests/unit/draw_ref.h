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
#include "engine/row_edits.h"
#include "engine/sampler.h"
#include "test_rng.h"
#include <string.h>

static const float *draw_ref_w; /* qsort's values (one thread) */

static inline int draw_ref_cmp(const void *a, const void *b) {
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    const float x = draw_ref_w[i], y = draw_ref_w[j];
    return x > y ? -1 : x < y ? 1 : (i > j) - (i < j);
}

/* 0 when out of memory. edits: the call's list (d->e0 indexes it; NULL
 * where no row has any) */
static inline int draw_ref(const float *x, int64_t V, int64_t lim, const di_row_draw *d, const di_row_edit *edits,
                           int64_t near_cap, di_row_greedy *g) {
    float *w = malloc((size_t)V * sizeof *w), *e = malloc((size_t)V * sizeof *e);
    int32_t *list = malloc((size_t)V * sizeof *list);
    int ok = w && e && list;
    if (!ok) goto out;
    g->max_all = di_row_max(x, V) + 0.0f;
    g->sum = di_row_sum_exp(x, V, g->max_all);
    g->token = -1, g->max = -INFINITY, g->pad = 0;
    for (int64_t t = 0; t < V; t++) w[t] = x[t];
    for (int32_t j = 0; j < d->n_edit; j++) { /* the processing: bias, bans, penalties (sampler.c's order) */
        const di_row_edit *ed = &edits[d->e0 + j];
        if (ed->id >= 0 && ed->id < V) w[ed->id] = di_row_edit_value(ed, d->rep, x[ed->id]);
    }
    for (int64_t t = 0; t < V; t++)
        if (!(t < lim && t != d->ban)) w[t] = -INFINITY;
    const float wmax = di_row_max(w, V);
    if (wmax == -INFINITY) goto out;
    if (d->greedy) { /* the first largest processed value */
        g->token = (int32_t)di_row_find(w, V, wmax);
        g->max = x[g->token];
        goto out;
    }
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
 * temperature (0: greedy), top-k, top-p, min-p, a banned id and the search
 * bound varied; in a share of the cases the processing that edits ids: a
 * prompt and outputs under repetition, frequency and presence penalties,
 * logit bias (now and then one id biased twice, which has no list form),
 * stop ids before min_tokens. Fills the sampler's settings p / in (their
 * arrays in static storage: one case at a time), which
 * di_sampler_draw_spec and draw_edits turn into the draw. */
static inline void draw_case(int k, float *x, int64_t V, di_sampler_params *p, di_sample_in *in) {
    static int32_t prompt[48], out[16], bias_ids[5], stop[3];
    static float bias_v[5];
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
    static const double temps[] = {0.05, 0.5, 0.8, 1.0, 1.7, 0.0}, tops[] = {1.0, 1.0, 0.9, 0.5, 0.999};
    static const int topks[] = {0, 0, 1, 3, 40};
    memset(p, 0, sizeof *p);
    p->temperature = temps[rng_int(6)];
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
    const int proc = rng_int(4); /* 0 none; bit 0 penalties; bit 1 bias and stop ids */
    if (!proc) return;
    /* the ids the processing touches: the row's peaks and its top a share
     * of the time (so that edits move the draw), else anywhere */
    const int near = (int)(V < 24 ? V : 24);
    in->n_prompt = rng_int(48);
    for (int64_t i = 0; i < in->n_prompt; i++) prompt[i] = rng_int(2) ? rng_int(near) : rng_int((int)V);
    in->prompt = prompt;
    in->n_output = rng_int(16);
    for (int64_t i = 0; i < in->n_output; i++) out[i] = rng_int(3) ? rng_int(near) : rng_int((int)V);
    in->output = out;
    if (proc & 1) {
        static const double reps[] = {1.0, 1.1, 0.7, 1.5}, freqs[] = {0.0, 0.3, -0.2}, pres[] = {0.0, 0.5, 1.25};
        p->repetition_penalty = reps[rng_int(4)];
        p->frequency_penalty = freqs[rng_int(3)];
        p->presence_penalty = pres[rng_int(3)];
    }
    if (proc & 2) {
        static const float bv[] = {5.0f, -3.0f, -INFINITY, 0.25f, 12.0f};
        p->n_bias = 1 + (size_t)rng_int(5);
        for (size_t i = 0; i < p->n_bias; i++) bias_ids[i] = rng_int(near), bias_v[i] = bv[rng_int(5)];
        if (rng_int(8) == 0) bias_ids[p->n_bias - 1] = bias_ids[0]; /* one id twice: no list form */
        p->bias_ids = bias_ids;
        p->bias_values = bias_v;
        p->n_stop_ids = (size_t)rng_int(4);
        for (size_t i = 0; i < p->n_stop_ids; i++) stop[i] = rng_int(near);
        p->stop_ids = stop;
        if (p->n_stop_ids && rng_int(2)) p->min_tokens = 20;
    }
}

/* The edited ids of the row at in's position (engine/row_edits.h: a
 * sequence's list built and brought up to in's outputs in one step), at
 * most cap: their number, -1 when the processing has no list form (or cap
 * is short). */
static inline int64_t draw_edits(const di_sampler_params *p, const di_sample_in *in, di_row_edit *out, int64_t cap) {
    di_seq_edits c = {0};
    int64_t n = -1;
    if (di_seq_edits_update(&c, p, in) == 1 && c.n <= cap) n = di_seq_edits_emit(&c, p, in, out);
    di_seq_edits_free(&c);
    return n;
}

#endif
