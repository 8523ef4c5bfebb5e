/* Token sampling (deepinfer.md §4; ecosystem.md §4.1): logit processing in
 * vLLM's order — logit bias, min_tokens masking of EOS / stop ids,
 * repetition / frequency / presence penalties, the constraint mask —
 * then greedy argmax (temperature 0) or, for temperature > 0, min-p, top-k
 * and top-p filtering and an inverse-CDF draw over the kept candidates.
 *
 * Deterministic sampling: the draw's uniform comes from a counter-based
 * generator keyed on (seed, stream, position) — no state carried between
 * calls — so a token depends only on its logits, its request's seed, its
 * completion index and its output position: never on the batch, the order
 * of requests or the number of threads. One uniform per token (rather than
 * the reference's Exp(1) noise per vocabulary entry, argmax(p/E), which is
 * the same distribution) keeps a 129k-entry vocabulary cheap. */
#ifndef DI_ENGINE_SAMPLER_H
#define DI_ENGINE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "core/row_exp.h"

/* A 64-bit counter-based hash of (key, a, b, c) (SplitMix64 finaliser over
 * a Weyl-sequence mix); uniformly distributed bits. */
uint64_t di_rng_bits(uint64_t key, uint64_t a, uint64_t b, uint64_t c);
/* Exp(1) draw for (key, a, b, c): -log(u) with u in (0, 1]. */
double di_rng_exp(uint64_t key, uint64_t a, uint64_t b, uint64_t c);

/* Settings that stay fixed for a whole request. */
typedef struct di_sampler_params {
    double temperature, top_p, min_p;
    int32_t top_k;
    double presence_penalty, frequency_penalty, repetition_penalty;
    const int32_t *bias_ids;     /* [n_bias] */
    const float *bias_values;    /* [n_bias] */
    size_t n_bias;
    const int32_t *stop_ids;     /* [n_stop_ids]: masked while min_tokens is not reached */
    size_t n_stop_ids;
    int32_t eos_id;              /* -1 none; masked like stop ids (unless ignore_eos: always) */
    int ignore_eos;
    int64_t min_tokens;
    uint64_t seed;
} di_sampler_params;

/* One sampling call. */
typedef struct di_sample_in {
    const int32_t *prompt;       /* [n_prompt] (repetition penalty) */
    int64_t n_prompt;
    const int32_t *output;       /* [n_output] tokens generated so far */
    int64_t n_output;
    const uint32_t *mask;        /* allowed-token bitset [(V+31)/32], NULL = all */
    int32_t forced;              /* >= 0: this token, no draw (thinking budget) */
    uint64_t stream;             /* completion index */
    int64_t vocab_limit;         /* > 0: ids from here on are never drawn (ids the
                                    tokenizer has no text for, in a padded vocabulary) */
} di_sample_in;

typedef struct di_sample_out {
    int32_t token;               /* -1: no token allowed (dead end) */
    float logprob;               /* of token under the model's distribution */
    double lse;                  /* the row's log-sum-exp behind it (NaN without a token) */
    int32_t rank;                /* 1-based rank of token in that distribution */
} di_sample_out;

/* Scratch memory of a sampler, reusable across calls of one thread. */
typedef struct di_sampler {
    int64_t V;
    float *work;                 /* [V] processed logits */
    uint8_t *seen;               /* [V] penalty marks */
    int32_t *count;              /* [V] output counts */
    int32_t *idx;                /* [V] candidate ids */
    float *prob;                 /* [V] unnormalised probabilities */
    int32_t *idx2;               /* [V] sorting scratch */
    uint32_t *key, *key2;        /* [V] sorting keys */
} di_sampler;

/* Greedy without any processing of the row (temperature 0, no bias, no
 * penalties): what a constraint mask aside decides the token by the row's
 * first maximum alone. */
int di_sampler_plain_greedy(const di_sampler_params *p);
/* For a plain-greedy request at output position n_output without a mask:
 * the one id the processing would set to -inf (EOS under ignore_eos or
 * before min_tokens), -1 none; -2 when the token needs more than the row's
 * greedy summary (not plain greedy, or stop ids banned before min_tokens).
 * With ban >= -1, di_sampler_from_greedy of di_row_greedy_of(row, V,
 * vocab_limit, ban) is what di_sampler_sample returns for the row. */
int32_t di_sampler_greedy_ban(const di_sampler_params *p, int64_t n_output);
/* The draw's uniform for in's position: 53 bits of di_rng_bits(seed,
 * stream, n_output, ·) as a double in [0, 1). */
double di_sampler_uniform(const di_sampler_params *p, const di_sample_in *in);
/* For a row whose processing needs no mask and no forced token: fills d
 * (d->n_edit = 0, d->e0 = 0) and returns 1; 0 when the row needs more (the
 * row on the host). d covers the temperature and its filters, or greedy
 * (temperature 0), the EOS ban (ignore_eos or before min_tokens) and the
 * repetition penalty's factor; the rest of the processing — bias, the stop
 * ids before min_tokens, the penalties — is the row's list of edited ids
 * (engine/row_edits.h), needed where di_sampler_needs_edits says. A backend
 * that draws d with those edits on the row (logits_draw) gives the token
 * di_sampler_sample gives, and the summary of di_sampler_from_greedy's
 * logprob. */
int di_sampler_draw_spec(const di_sampler_params *p, const di_sample_in *in, di_row_draw *d);
/* Whether the row at in's position has edited ids (bias, penalties, stop
 * ids banned before min_tokens). */
int di_sampler_needs_edits(const di_sampler_params *p, const di_sample_in *in);
/* The greedy token and its logprob from a row's summary (token -1 when
 * the summary has none); a drawn row's summary the same way (its max is
 * the drawn token's logit). */
void di_sampler_from_greedy(const di_row_greedy *g, di_sample_out *out);

int di_sampler_init(di_sampler *s, int64_t V); /* -1 when out of memory */
void di_sampler_free(di_sampler *s);

/* ids[0..n) (distinct, below V) ordered by value descending, then id
 * ascending (exposed for its test; the top-p path's sort). */
void di_sampler_sort_desc(di_sampler *s, const float *vals, int32_t *ids, int64_t n);

/* Samples from logits [V] (not modified). */
void di_sampler_sample(di_sampler *s, const di_sampler_params *p, const di_sample_in *in,
                       const float *logits, di_sample_out *out);

/* Log-softmax of logits [V] at `token`, and the k most likely ids with
 * their logprobs (descending, ties by lower id) when k > 0. */
float di_logprob_top(const float *logits, int64_t V, int32_t token, int32_t k, int32_t *top_ids,
                     float *top_lp, int32_t *rank);
/* The row's log-sum-exp as di_logprob_top forms it: max + log Σ exp(x - max),
 * in double. */
double di_logprob_lse(const float *logits, int64_t V);
/* di_logprob_top's k most likely ids and logprobs, given the row's lse (a
 * sampled row's di_sample_out.lse: the same bits without a second pass of
 * exponentials). */
void di_logprob_topk(const float *logits, int64_t V, double lse, int32_t k, int32_t *top_ids, float *top_lp);

#endif
