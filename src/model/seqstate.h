/* Per-sequence state of the V4.1 forward pass (architecture.md §5, §6.2,
 * §10, §13.2): everything a sequence carries from one forward to the next.
 *
 * - window rings of every backbone block: FP8-QDQ'd KV (exact in fp32),
 *   slot = position mod ring_cap;
 * - per kv-source block: the compressed-KV cache and the index-key cache
 *   (entry j stands for positions j·r .. j·r+r-1), and for ratio > 1 the
 *   per-token projections (a, g) of the last tokens, from which the partial
 *   group is pooled once it completes;
 * - the Engram history: compressed ids of the last positions;
 * - one ring per DSpark stage with the main-model KV of past positions.
 *
 * Rings hold window + max_rollback slots, so rolling back by up to
 * max_rollback tokens (speculative decoding) restores an exact earlier state:
 * nothing a shorter sequence needs has been overwritten. Memory comes from
 * the model's backend. */
#ifndef DI_MODEL_SEQSTATE_H
#define DI_MODEL_SEQSTATE_H

#include <stdint.h>

#include "model/model.h"

typedef struct di_seqstate {
    const di_lm *lm;
    int64_t n_tokens;     /* positions processed so far */
    int64_t max_tokens;   /* capacity (positions) */
    int max_rollback;
    int ring_cap;         /* window + max_rollback */
    int tok_cap;          /* per-token compressor ring: max ratio + max_rollback */
    int hist_cap;         /* Engram history ring: max_ngram - 1 + max_rollback */
    float **win;          /* [n_layers] -> [ring_cap, Dh] */
    float **ckv;          /* [n_blocks] -> [max_tokens/r, Dh] (kv sources, else NULL) */
    float **ikey;         /* [n_blocks] -> [max_tokens/r, Di] (kv sources, else NULL) */
    float **ctok;         /* [n_blocks] -> [tok_cap, 2, Dh] (ratio > 1 sources) */
    int32_t *hist;        /* [hist_cap] compressed ids by position mod hist_cap (host) */
    float **dsring;       /* [n_mtp] -> [ring_cap, Dh] */
} di_seqstate;

/* Allocates the state of one sequence of up to max_tokens positions that can
 * roll back by up to max_rollback tokens. */
di_status di_seqstate_init(di_seqstate *st, const di_lm *lm, int64_t max_tokens, int max_rollback,
                           di_err *err);
void di_seqstate_free(di_seqstate *st);
/* Empties the sequence (position 0); buffers are kept. */
void di_seqstate_reset(di_seqstate *st);
/* Returns to an earlier length n (n_tokens - max_rollback <= n <= n_tokens). */
di_status di_seqstate_rollback(di_seqstate *st, int64_t n, di_err *err);

static inline float *di_seqstate_win_row(const di_seqstate *st, int block, int64_t pos) {
    return st->win[block] + (pos % st->ring_cap) * st->lm->cfg->head_dim;
}

#endif
