/* Per-sequence state of the V4.1 forward pass (architecture.md §5, §6.2,
 * §10, §13.2): everything a sequence carries from one forward to the next.
 *
 * - window rings of every backbone block: FP8-QDQ'd KV packed as E4M3 codes
 *   + E8M0 scales (backend/kvstore.h), slot = position mod ring_cap;
 * - per kv-source block: the compressed-KV cache (FP4 + E4M3 scales per 16)
 *   and the index-key cache (FP4 + E8M0 scales per 32), entry j standing for
 *   positions j·r .. j·r+r-1, and for ratio > 1 the per-token fp32
 *   projections (a, g) of the last tokens, from which the partial group is
 *   pooled once it completes;
 * - the Engram history: compressed ids of the last positions;
 * - one ring per DSpark stage with the main-model KV of past positions
 *   (packed like the window rings).
 *
 * The packed rows decode to exactly the fp32 values the QDQ steps produce,
 * so the packing changes no result; it makes the caches the size the memory
 * plan counts (planner.h: 890 B/token at the real shapes, not 7x that).
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
    size_t win_bytes;     /* bytes of one packed window row (DI_KVQ_FP8, Dh values) */
    size_t ckv_bytes;     /* ... of one compressed-KV row (DI_KVQ_FP4_E4M3, Dh) */
    size_t ikey_bytes;    /* ... of one index key (DI_KVQ_FP4_E8M0, Di) */
    uint64_t bytes;       /* backend memory held by this state */
    uint8_t **win;        /* [n_layers] -> [ring_cap, win_bytes] */
    uint8_t **ckv;        /* [n_blocks] -> [max_tokens/r, ckv_bytes] (kv sources, else NULL) */
    uint8_t **ikey;       /* [n_blocks] -> [max_tokens/r, ikey_bytes] (kv sources, else NULL) */
    float **ctok;         /* [n_blocks] -> [tok_cap, 2, Dh] fp32 (ratio > 1 sources) */
    int32_t *hist;        /* [hist_cap] compressed ids by position mod hist_cap (host) */
    uint8_t **dsring;     /* [n_mtp] -> [ring_cap, win_bytes] */
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
/* Backend bytes di_seqstate_init allocates for these arguments (st->bytes
 * after it), without allocating: what admission by memory needs. */
uint64_t di_seqstate_bytes(const di_lm *lm, int64_t max_tokens, int max_rollback);

/* Decoded fp32 copies (host) of cache entries [j0, j0+n) of a kv-source
 * block, for tests and dumps: compressed KV out [n, Dh], index keys
 * out [n, Di]. */
di_status di_seqstate_read_ckv(const di_seqstate *st, int block, int64_t j0, int64_t n, float *out,
                               di_err *err);
di_status di_seqstate_read_ikey(const di_seqstate *st, int block, int64_t j0, int64_t n,
                                float *out, di_err *err);

static inline uint8_t *di_seqstate_win_row(const di_seqstate *st, int block, int64_t pos) {
    return st->win[block] + (size_t)(pos % st->ring_cap) * st->win_bytes;
}
static inline uint8_t *di_seqstate_dspark_row(const di_seqstate *st, int stage, int64_t pos) {
    return st->dsring[stage] + (size_t)(pos % st->ring_cap) * st->win_bytes;
}

#endif
