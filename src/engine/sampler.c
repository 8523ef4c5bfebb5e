/* Sampling and the counter-based generator (see sampler.h; deepinfer.md §4). */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/row_exp.h"

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t di_rng_bits(uint64_t key, uint64_t a, uint64_t b, uint64_t c) {
    /* Each input passes the finaliser before the next is mixed in, so
     * nearby counters give unrelated outputs. */
    uint64_t h = mix64(key + 0x9e3779b97f4a7c15ull);
    h = mix64(h ^ (a + 0x632be59bd9b4e019ull));
    h = mix64(h ^ (b + 0x8cb92ba72f3d8dd7ull));
    return mix64(h ^ (c + 0xd1b54a32d192ed03ull));
}

double di_rng_exp(uint64_t key, uint64_t a, uint64_t b, uint64_t c) {
    /* u in (0, 1]: 53 random bits, +1 so log never sees 0. */
    double u = ((double)(di_rng_bits(key, a, b, c) >> 11) + 1.0) * 0x1.0p-53;
    return -log(u);
}

int di_sampler_init(di_sampler *s, int64_t V) {
    memset(s, 0, sizeof *s);
    s->V = V;
    s->work = malloc((size_t)V * sizeof *s->work);
    s->seen = calloc((size_t)V, 1);
    s->count = calloc((size_t)V, sizeof *s->count);
    s->idx = malloc((size_t)V * sizeof *s->idx);
    s->prob = malloc((size_t)V * sizeof *s->prob);
    s->idx2 = malloc((size_t)V * sizeof *s->idx2);
    s->key = malloc((size_t)V * sizeof *s->key);
    s->key2 = malloc((size_t)V * sizeof *s->key2);
    if (!s->work || !s->seen || !s->count || !s->idx || !s->prob || !s->idx2 || !s->key || !s->key2) {
        di_sampler_free(s);
        return -1;
    }
    return 0;
}

void di_sampler_free(di_sampler *s) {
    free(s->work);
    free(s->seen);
    free(s->count);
    free(s->idx);
    free(s->prob);
    free(s->idx2);
    free(s->key);
    free(s->key2);
    memset(s, 0, sizeof *s);
}

/* Descending value, then ascending id: a total order, so results never
 * depend on the sort algorithm. */
static int cmp_desc(const void *a, const void *b, void *ctx) {
    const float *vals = ctx;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float x = vals[i], y = vals[j];
    if (x > y) return -1;
    if (x < y) return 1;
    return (i > j) - (i < j);
}

/* ids[0..n) sorted by cmp_desc. */
static void top_sorted(const float *vals, int32_t *ids, int64_t n) {
    qsort_r(ids, (size_t)n, sizeof *ids, cmp_desc, (void *)vals);
}

/* ids[0..n) (distinct ids below s->V) sorted by cmp_desc. A long list (the
 * nucleus of a flat distribution is most of the vocabulary: ~20 ms of
 * comparisons) goes by radix: the ids first in ascending order (marks in
 * s->seen), then four stable passes over the bytes of a key that orders the
 * values descending (-0 keyed as +0: the comparison has them equal), so
 * equal values stay in ascending id order: cmp_desc's order exactly. */
enum { RADIX_MIN = 2048 };

void di_sampler_sort_desc(di_sampler *s, const float *vals, int32_t *ids, int64_t n) {
    if (n < RADIX_MIN) {
        top_sorted(vals, ids, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) s->seen[ids[i]] = 1;
    int64_t m = 0;
    for (int64_t v = 0; v < s->V; v++)
        if (s->seen[v]) {
            s->seen[v] = 0;
            ids[m++] = (int32_t)v;
        }
    uint32_t *key = s->key, *k2 = s->key2;
    int32_t *id = ids, *i2 = s->idx2;
    for (int64_t i = 0; i < n; i++) {
        float f = vals[id[i]];
        uint32_t u;
        if (f == 0.0f) f = 0.0f;
        memcpy(&u, &f, sizeof u);
        u = u >> 31 ? ~u : u | 0x80000000u; /* ascending with the value */
        key[i] = ~u;                          /* descending */
    }
    for (int sh = 0; sh < 32; sh += 8) {
        int64_t cnt[257] = {0};
        for (int64_t i = 0; i < n; i++) cnt[((key[i] >> sh) & 255u) + 1]++;
        for (int b = 0; b < 256; b++) cnt[b + 1] += cnt[b];
        for (int64_t i = 0; i < n; i++) {
            int64_t d = cnt[(key[i] >> sh) & 255u]++;
            k2[d] = key[i];
            i2[d] = id[i];
        }
        uint32_t *tk = key;
        key = k2, k2 = tk;
        int32_t *ti = id;
        id = i2, i2 = ti;
    }
    /* four passes: the sorted ids are back in ids[] */
}

/* a before b in cmp_desc's order */
static int before(const float *vals, int32_t a, int32_t b) {
    return vals[a] > vals[b] || (vals[a] == vals[b] && a < b);
}

/* Moves ids[j] down the heap ids[0..k) whose every parent comes after its
 * children in cmp_desc's order (the root: the last of them). */
static void sift_down(const float *vals, int32_t *ids, int64_t k, int64_t j) {
    for (;;) {
        int64_t c = 2 * j + 1;
        if (c >= k) return;
        if (c + 1 < k && before(vals, ids[c], ids[c + 1])) c++;
        if (!before(vals, ids[j], ids[c])) return;
        int32_t t = ids[j];
        ids[j] = ids[c];
        ids[c] = t;
        j = c;
    }
}

/* The k first of ids[0..n) in cmp_desc's order, sorted, in ids[0..k): what
 * sorting all n and keeping k gives (the order is total), by a heap of k
 * whose root is the last of them, so a wide tail costs a comparison each. */
static void top_k_sorted(const float *vals, int32_t *ids, int64_t n, int64_t k) {
    if (k >= n) {
        top_sorted(vals, ids, n);
        return;
    }
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(vals, ids, k, i);
    for (int64_t i = k; i < n; i++)
        if (before(vals, ids[i], ids[0])) {
            ids[0] = ids[i];
            sift_down(vals, ids, k, 0);
        }
    top_sorted(vals, ids, k);
}

/* 1 + the ids ranked above token: larger logits, or equal ones with lower ids */
static int32_t row_rank(const float *logits, int64_t V, int32_t token) {
    int32_t r = 1;
    for (int64_t i = 0; i < V; i++)
        if (logits[i] > logits[token] || (logits[i] == logits[token] && i < token)) r++;
    return r;
}

/* max + log Σ exp(x - max) in double, max the row's maximum */
static double lse_at(const float *logits, int64_t V, float mx) { return mx + log(di_row_sum_exp(logits, V, mx)); }

double di_logprob_lse(const float *logits, int64_t V) { return lse_at(logits, V, di_row_max(logits, V)); }

float di_logprob_top(const float *logits, int64_t V, int32_t token, int32_t k, int32_t *top_ids,
                     float *top_lp, int32_t *rank) {
    const double lse = di_logprob_lse(logits, V);
    di_logprob_topk(logits, V, lse, k, top_ids, top_lp);
    if (rank && token >= 0) *rank = row_rank(logits, V, token);
    return token >= 0 ? (float)((double)logits[token] - lse) : NAN;
}

void di_logprob_topk(const float *logits, int64_t V, double lse, int32_t k, int32_t *top_ids, float *top_lp) {
    if (k > V) k = (int32_t)V;
    di_row_top *t = k > 0 && isnan(lse) ? malloc((size_t)k * sizeof *t) : NULL;
    if (t) {
        /* a NaN or +inf in the row: di_row_top_of's total order (NaN last),
         * which the comparisons below do not give with NaN; the list the
         * devices form (the loop below gives it for every other row) */
        di_row_top_of(logits, V, k, t);
        for (int32_t j = 0; j < k; j++) {
            top_ids[j] = t[j].id;
            top_lp[j] = (float)((double)t[j].x - lse);
        }
        free(t);
    } else if (k > 0) {
        /* insertion into a sorted list of k: one pass, O(V) when most
         * logits fall below the k-th; once the list is full the next logit
         * above its last is searched 8 at a time (the same insertions) */
        int32_t n = 0;
        for (int64_t i = 0; i < V; i++) {
            if (n == k && (i = di_row_next_above(logits, i, V, logits[top_ids[k - 1]])) == V) break;
            float x = logits[i];
            int32_t j = n < k ? n++ : k - 1;
            while (j > 0 && x > logits[top_ids[j - 1]]) {
                top_ids[j] = top_ids[j - 1];
                j--;
            }
            top_ids[j] = (int32_t)i;
        }
        for (int32_t j = 0; j < k; j++) top_lp[j] = (float)((double)logits[top_ids[j]] - lse);
    }
}

/* out->token's logprob under the row's lse */
static void token_logprob_at(const float *logits, double lse, di_sample_out *out) {
    out->lse = lse;
    out->logprob = (float)((double)logits[out->token] - lse);
}

static void token_logprob(const float *logits, int64_t V, di_sample_out *out) {
    token_logprob_at(logits, di_logprob_lse(logits, V), out);
}

static int allowed(const uint32_t *mask, int64_t i) { return !mask || ((mask[i >> 5] >> (i & 31)) & 1u); }

/* Whether the processing below sets token t to -inf: EOS under ignore_eos,
 * EOS and the stop ids while min_tokens is not reached. */
static int is_banned(const di_sampler_params *p, const di_sample_in *in, int64_t t) {
    if (p->eos_id >= 0 && t == p->eos_id && (p->ignore_eos || in->n_output < p->min_tokens)) return 1;
    if (in->n_output < p->min_tokens)
        for (size_t i = 0; i < p->n_stop_ids; i++)
            if (p->stop_ids[i] == t) return 1;
    return 0;
}

double di_sampler_uniform(const di_sampler_params *p, const di_sample_in *in) {
    return (double)(di_rng_bits(p->seed, in->stream, (uint64_t)in->n_output, 0x5a3d) >> 11) * 0x1.0p-53;
}

int di_sampler_draw_spec(const di_sampler_params *p, const di_sample_in *in, di_row_draw *d) {
    if (!(p->temperature >= 0.0) || in->mask || in->forced >= 0) return 0;
    if (p->repetition_penalty != 1.0 && !(p->repetition_penalty > 0.0)) return 0; /* the edits' sign rule needs r > 0 */
    const int early = in->n_output < p->min_tokens;
    memset(d, 0, sizeof *d);
    d->greedy = p->temperature == 0.0;
    d->inv_t = d->greedy ? 0.0f : (float)(1.0 / p->temperature);
    d->min_p = p->min_p > 0.0 ? (float)p->min_p : 0.0f;
    d->top_p = p->top_p;
    d->u = di_sampler_uniform(p, in);
    d->top_k = p->top_k > 0 ? p->top_k : 0;
    d->ban = p->eos_id >= 0 && (p->ignore_eos || early) ? p->eos_id : -1;
    d->rep = (float)p->repetition_penalty;
    return 1;
}

int di_sampler_needs_edits(const di_sampler_params *p, const di_sample_in *in) {
    return p->n_bias || p->repetition_penalty != 1.0 || p->frequency_penalty != 0.0 || p->presence_penalty != 0.0 ||
           (in->n_output < p->min_tokens && p->n_stop_ids);
}

int di_sampler_plain_greedy(const di_sampler_params *p) {
    return p->temperature == 0.0 && !p->n_bias && p->repetition_penalty == 1.0 && p->frequency_penalty == 0.0 &&
           p->presence_penalty == 0.0;
}

int32_t di_sampler_greedy_ban(const di_sampler_params *p, int64_t n_output) {
    if (!di_sampler_plain_greedy(p) || (n_output < p->min_tokens && p->n_stop_ids)) return -2;
    return p->eos_id >= 0 && (p->ignore_eos || n_output < p->min_tokens) ? p->eos_id : -1;
}

void di_sampler_from_greedy(const di_row_greedy *g, di_sample_out *out) {
    out->token = -1;
    out->logprob = NAN;
    out->lse = NAN;
    out->rank = 0;
    if (g->token < 0) return;
    out->token = g->token;
    out->lse = di_row_greedy_lse(g);
    out->logprob = (float)((double)g->max - out->lse); /* g->max is x[token] */
}

void di_sampler_sample(di_sampler *s, const di_sampler_params *p, const di_sample_in *in,
                       const float *logits, di_sample_out *out) {
    const int64_t V = s->V;
    float *w = s->work;
    out->token = -1;
    out->logprob = NAN;
    out->lse = NAN;
    out->rank = 0;
    if (in->forced >= 0) {
        out->token = in->forced;
        token_logprob(logits, V, out);
        out->rank = row_rank(logits, V, in->forced);
        return;
    }
    /* Greedy on the row as it came (no bias, penalty or mask; a vocabulary
     * limit only bounds the search): its maximum is also the one of the
     * logprob's log-sum-exp, so a row costs a pass for the maximum, a search
     * for its first place and a pass of exponentials (before: a copy, the
     * maximum of the copy and of the row, and a scalar search; the same
     * results bit for bit: a maximum does not depend on the order it is
     * taken in but for the sign of a zero, which neither the differences
     * below nor the sum sees). Banned tokens (EOS under ignore_eos, EOS and
     * stop ids before min_tokens) change nothing unless the first maximum is
     * one of them, when the copy below takes the row. */
    const int64_t lim = in->vocab_limit > 0 && in->vocab_limit < V ? in->vocab_limit : V;
    if (di_sampler_plain_greedy(p) && !in->mask) {
        di_row_greedy g;
        di_row_greedy_of(logits, V, lim, -1, &g);
        if (g.token >= 0 && is_banned(p, in, g.token)) goto processed;
        di_sampler_from_greedy(&g, out);
        return;
    }
processed:
    memcpy(w, logits, (size_t)V * sizeof *w);
    for (size_t i = 0; i < p->n_bias; i++) w[p->bias_ids[i]] += p->bias_values[i];
    if (in->n_output < p->min_tokens) {
        for (size_t i = 0; i < p->n_stop_ids; i++) w[p->stop_ids[i]] = -INFINITY;
        if (p->eos_id >= 0) w[p->eos_id] = -INFINITY;
    }
    if (p->ignore_eos && p->eos_id >= 0) w[p->eos_id] = -INFINITY;
    /* Penalties (vLLM): repetition over prompt and output, divides positive
     * logits and multiplies negative ones; frequency by output count;
     * presence once per output token seen. */
    if (p->repetition_penalty != 1.0) {
        for (int64_t i = 0; i < in->n_prompt; i++) s->seen[in->prompt[i]] = 1;
        for (int64_t i = 0; i < in->n_output; i++) s->seen[in->output[i]] = 1;
        float r = (float)p->repetition_penalty;
        for (int64_t i = 0; i < in->n_prompt; i++) {
            int32_t t = in->prompt[i];
            if (s->seen[t]) { w[t] = w[t] > 0 ? w[t] / r : w[t] * r; s->seen[t] = 0; }
        }
        for (int64_t i = 0; i < in->n_output; i++) {
            int32_t t = in->output[i];
            if (s->seen[t]) { w[t] = w[t] > 0 ? w[t] / r : w[t] * r; s->seen[t] = 0; }
        }
    }
    if (p->frequency_penalty != 0.0 || p->presence_penalty != 0.0) {
        for (int64_t i = 0; i < in->n_output; i++) s->count[in->output[i]]++;
        for (int64_t i = 0; i < in->n_output; i++) {
            int32_t t = in->output[i];
            if (s->count[t]) {
                w[t] -= (float)(p->frequency_penalty * s->count[t] + p->presence_penalty);
                s->count[t] = 0;
            }
        }
    }
    for (int64_t i = in->vocab_limit > 0 ? in->vocab_limit : V; i < V; i++) w[i] = -INFINITY;
    /* Greedy without a mask: the first of the largest finite values (a NaN
     * is never a candidate, -inf never wins), found without the candidate
     * list below. */
    if (p->temperature == 0.0 && !in->mask) {
        float m = di_row_max(w, V);
        if (m == -INFINITY) return;
        out->token = (int32_t)di_row_find(w, V, m);
        token_logprob(logits, V, out);
        return;
    }
    /* Candidates: allowed by the mask and not -inf. Without a mask they are
     * the row's finite values, which the pass below over e (0 for -inf, NaN
     * for NaN: neither kept) finds by itself, in the same order. */
    int64_t n = 0;
    float wmax = -INFINITY;
    const int whole_row = !in->mask && p->temperature != 0.0;
    if (whole_row) {
        wmax = di_row_max(w, V);
        if (wmax == -INFINITY) return;
    } else {
        for (int64_t i = 0; i < V; i++)
            if (allowed(in->mask, i) && w[i] > -INFINITY && !isnan(w[i])) {
                s->idx[n++] = (int32_t)i;
                if (w[i] > wmax) wmax = w[i];
            }
        if (n == 0) return;
    }
    int32_t tok = whole_row ? -1 : s->idx[0];
    if (p->temperature == 0.0) {
        for (int64_t j = 1; j < n; j++)
            if (w[s->idx[j]] > w[tok]) tok = s->idx[j];
    } else {
        /* e[t] = exp((w - max) / T), the unnormalised probabilities. Their
         * sums are of fixed-point terms q(e) = rint(e · 2^F) (di_row_term_q,
         * F as the log-sum-exp's) added as integers: exact, so a device
         * drawing the row adds them in its own order and gets these bits. */
        float inv_t = (float)(1.0 / p->temperature), *e = s->prob;
        const int fq = di_row_sum_frac_bits(V);
        uint64_t sum = 0;
        int64_t keep = 0;
        /* min-p: p_t >= min_p * p_max  <=>  e[t] >= min_p */
        float cut = p->min_p > 0.0 ? (float)p->min_p : 0.0f;
        di_row_exp(w, V, wmax, inv_t, e); /* the whole row: 8 lanes at a time beat a gather */
        if (whole_row) {
            const int plain = !(p->top_k > 0) && !(p->top_p < 1.0); /* no list needed */
            sum = di_row_kept_sum(e, V, cut, fq, &keep, plain ? NULL : s->idx);
            if (keep == 0) return;
            if (plain || (!(p->top_k < keep) && !(p->top_p < 1.0))) {
                /* no top-k / top-p: the draw over the kept in id order, found
                 * from the sums of 8 at a time (no list); without a crossing
                 * (u · sum rounded up to sum) the last kept, as below */
                const double u = di_sampler_uniform(p, in);
                int64_t t = di_row_kept_cross(e, V, cut, fq, u * (double)sum);
                if (t < 0)
                    for (t = V - 1; !(e[t] >= cut && e[t] > 0.0f); t--) {
                    }
                out->token = (int32_t)t;
                token_logprob(logits, V, out);
                return;
            }
        } else {
            for (int64_t j = 0; j < n; j++) {
                int32_t t = s->idx[j];
                if (e[t] >= cut && e[t] > 0.0f) {
                    s->idx[keep++] = t;
                    sum += (uint64_t)di_row_term_q(e[t], fq);
                }
            }
        }
        /* keep >= 1: the best candidate has e = 1 >= min_p, unless it is
         * +inf (inf - inf: NaN): no draw then, as for no finite logit */
        if (keep == 0) return;
        int filtered = 0; /* top-k / top-p changed the kept list */
        int topk_on = p->top_k > 0 && p->top_k < keep;
        if (topk_on || p->top_p < 1.0) {
            /* Sorting all V candidates is the cost of top-p / top-k; first
             * sort only those within a cut of the best. When they hold the
             * top k, or the nucleus mass, the rest cannot enter: exact. */
            /* tighter cuts first: realistic distributions are peaked. The
             * middle one serves a top k that the first leaves short (top_k
             * 50 on bench_sampler's rows: ~100K candidates to the heap at
             * e^-16, a few thousand at e^-10; 1.6 -> 0.8-1.2 ms a row) */
            for (int c = 0; c < DI_SAMPLER_CUTS; c++) {
                int64_t near = 0;
                uint64_t near_sum = 0;
                const float cut_c = c == 0 ? DI_SAMPLER_CUT0 : c == 1 ? DI_SAMPLER_CUT1 : DI_SAMPLER_CUT2;
                for (int64_t j = 0; j < keep; j++) {
                    int32_t t = s->idx[j];
                    if (e[t] > cut_c) {
                        s->idx[j] = s->idx[near];
                        s->idx[near++] = t;
                        near_sum += (uint64_t)di_row_term_q(e[t], fq);
                    }
                }
                if (topk_on ? p->top_k <= near : (double)near_sum >= p->top_p * (double)sum) {
                    keep = near;
                    break;
                }
            }
            filtered = 1;
            if (topk_on) {
                top_k_sorted(w, s->idx, keep, p->top_k);
                keep = p->top_k;
            } else {
                di_sampler_sort_desc(s, w, s->idx, keep);
            }
            if (p->top_p < 1.0) {
                /* the nucleus is a share of the mass of every kept candidate
                 * (of the top k where top-k applies first), not of the near
                 * ones alone: those only bound where it ends */
                uint64_t tot = 0, acc = 0;
                if (topk_on)
                    for (int64_t j = 0; j < keep; j++) tot += (uint64_t)di_row_term_q(e[s->idx[j]], fq);
                else
                    tot = sum;
                const double lim = p->top_p * (double)tot;
                int64_t j = 0;
                while (j < keep) {
                    acc += (uint64_t)di_row_term_q(e[s->idx[j]], fq);
                    j++;
                    if ((double)acc >= lim) break;
                }
                keep = j;
            }
        }
        /* Inverse CDF with one counter-based uniform per (seed, completion,
         * position): the first kept candidate whose running sum passes
         * u * total. The sums are integers: the last running sum is the
         * total, which passes u * total unless that product rounds up to
         * it (then the last candidate, below). */
        const double u = di_sampler_uniform(p, in);
        uint64_t tot = 0, acc = 0;
        if (filtered)
            for (int64_t j = 0; j < keep; j++) tot += (uint64_t)di_row_term_q(e[s->idx[j]], fq);
        else
            tot = sum;
        const double lim = u * (double)tot;
        tok = s->idx[keep - 1];
        for (int64_t j = 0; j < keep; j++) {
            acc += (uint64_t)di_row_term_q(e[s->idx[j]], fq);
            if ((double)acc > lim) {
                tok = s->idx[j];
                break;
            }
        }
    }
    out->token = tok;
    token_logprob(logits, V, out);
}
