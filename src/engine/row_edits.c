/* A sequence's edited ids (see row_edits.h). */
#include "engine/row_edits.h"

#include <stdlib.h>
#include <string.h>

void di_seq_edits_free(di_seq_edits *c) {
    free(c->v);
    memset(c, 0, sizeof *c);
}

static int cmp_entry(const void *a, const void *b) {
    const int32_t x = ((const di_edit_entry *)a)->id, y = ((const di_edit_entry *)b)->id;
    return (x > y) - (x < y);
}

static int reserve(di_seq_edits *c, int64_t n) {
    if (n <= c->cap) return 0;
    int64_t cap = c->cap * 2 > n ? c->cap * 2 : n;
    di_edit_entry *v = realloc(c->v, (size_t)cap * sizeof *v);
    if (!v) return -1;
    c->v = v;
    c->cap = cap;
    return 0;
}

/* The first place with id >= t. */
static int64_t lower(const di_seq_edits *c, int32_t t) {
    int64_t lo = 0, hi = c->n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (c->v[mid].id < t) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Whether the outputs count for the penalties at all */
static int outputs_count(const di_sampler_params *p) {
    return p->repetition_penalty != 1.0 || p->frequency_penalty != 0.0 || p->presence_penalty != 0.0;
}

/* From the request alone: bias ids, stop ids (while min_tokens can still
 * ban them), the prompt's ids (repetition penalty): collected, sorted, the
 * same ids merged into one entry. */
static int build(di_seq_edits *c, const di_sampler_params *p, const di_sample_in *in) {
    const int rep = p->repetition_penalty != 1.0;
    const size_t n_stop = p->min_tokens > 0 ? p->n_stop_ids : 0;
    const int64_t n = (int64_t)p->n_bias + (int64_t)n_stop + (rep ? in->n_prompt : 0);
    c->n = 0;
    c->n_out = 0;
    if (reserve(c, n > 0 ? n : 1)) return -1;
    di_edit_entry *v = c->v;
    int64_t k = 0;
    for (size_t i = 0; i < p->n_bias; i++)
        v[k++] = (di_edit_entry){.id = p->bias_ids[i], .bias = p->bias_values[i], .has_bias = 1};
    for (size_t i = 0; i < n_stop; i++) v[k++] = (di_edit_entry){.id = p->stop_ids[i], .stop = 1};
    for (int64_t i = 0; rep && i < in->n_prompt; i++) v[k++] = (di_edit_entry){.id = in->prompt[i], .prompt = 1};
    qsort(v, (size_t)k, sizeof *v, cmp_entry);
    int64_t m = 0;
    for (int64_t i = 0; i < k; i++) {
        if (m > 0 && v[m - 1].id == v[i].id) {
            di_edit_entry *d = &v[m - 1];
            if (d->has_bias && v[i].has_bias) return 0; /* two biases of one id: added in turn, no list form */
            if (v[i].has_bias) d->has_bias = 1, d->bias = v[i].bias;
            d->prompt |= v[i].prompt;
            d->stop |= v[i].stop;
        } else {
            v[m++] = v[i];
        }
    }
    c->n = m;
    return 1;
}

int di_seq_edits_update(di_seq_edits *c, const di_sampler_params *p, const di_sample_in *in) {
    if (c->state == 0 || in->n_output < c->n_out) {
        const int rc = build(c, p, in);
        c->state = rc > 0 ? 1 : rc == 0 ? -1 : 0; /* out of memory: built again next time */
        if (rc <= 0) return rc;
    }
    if (c->state < 0) return 0;
    if (!outputs_count(p)) {
        c->n_out = in->n_output;
        return 1;
    }
    for (; c->n_out < in->n_output; c->n_out++) {
        const int32_t t = in->output[c->n_out];
        const int64_t j = lower(c, t);
        if (j < c->n && c->v[j].id == t) {
            c->v[j].count++;
            continue;
        }
        if (reserve(c, c->n + 1)) return -1;
        memmove(c->v + j + 1, c->v + j, (size_t)(c->n - j) * sizeof *c->v);
        c->v[j] = (di_edit_entry){.id = t, .count = 1};
        c->n++;
    }
    return 1;
}

int64_t di_seq_edits_emit(const di_seq_edits *c, const di_sampler_params *p, const di_sample_in *in,
                          di_row_edit *out) {
    const int early = in->n_output < p->min_tokens, rep = p->repetition_penalty != 1.0;
    const int pen = p->frequency_penalty != 0.0 || p->presence_penalty != 0.0;
    int64_t k = 0;
    for (int64_t i = 0; i < c->n; i++) {
        const di_edit_entry *e = &c->v[i];
        uint32_t f = 0;
        if (e->has_bias) f |= DI_EDIT_BIAS;
        if (e->stop && early) f |= DI_EDIT_BAN;
        if (rep && (e->prompt || e->count > 0)) f |= DI_EDIT_SEEN;
        if (pen && e->count > 0) f |= DI_EDIT_SUB;
        if (!f) continue;
        out[k++] = (di_row_edit){.id = e->id,
                                 .flags = f,
                                 .bias = e->has_bias ? e->bias : 0.0f,
                                 .sub = pen && e->count > 0
                                            ? (float)(p->frequency_penalty * e->count + p->presence_penalty)
                                            : 0.0f};
    }
    return k;
}
