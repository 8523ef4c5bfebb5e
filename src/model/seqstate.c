/* Per-sequence state: allocation, reset and rollback (see seqstate.h). */
#include "model/seqstate.h"

#include <stdlib.h>
#include <string.h>

static float **alloc_table(int n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float *)); }

di_status di_seqstate_init(di_seqstate *st, const di_lm *lm, int64_t max_tokens, int max_rollback,
                           di_err *err) {
    memset(st, 0, sizeof *st);
    const di_config *c = lm->cfg;
    di_backend *be = lm->be;
    if (max_tokens < 1 || max_rollback < 0 || max_rollback > 1 << 20)
        return di_err_set(err, DI_ERR_INVALID_ARG,
                          "sequence state: max_tokens %lld / max_rollback %d out of range",
                          (long long)max_tokens, max_rollback);
    st->lm = lm;
    st->max_tokens = max_tokens;
    st->max_rollback = max_rollback;
    st->ring_cap = c->window + max_rollback;
    int maxr = 1;
    for (int b = 0; b < c->n_blocks; b++)
        if (c->compress_ratios[b] > maxr) maxr = c->compress_ratios[b];
    st->tok_cap = maxr + max_rollback;
    st->hist_cap = (c->engram_max_ngram > 1 ? c->engram_max_ngram - 1 : 1) + max_rollback;
    st->win = alloc_table(c->n_blocks);
    st->ckv = alloc_table(c->n_blocks);
    st->ikey = alloc_table(c->n_blocks);
    st->ctok = alloc_table(c->n_blocks);
    st->dsring = alloc_table(c->n_mtp);
    st->hist = calloc((size_t)st->hist_cap, sizeof(int32_t));
    if (!st->win || !st->ckv || !st->ikey || !st->ctok || !st->dsring || !st->hist) goto nomem;
    size_t dh = (size_t)c->head_dim;
    for (int b = 0; b < c->n_layers; b++) {
        const di_layer_role *r = &c->roles[b];
        st->win[b] = be->ops->alloc(be, (size_t)st->ring_cap * dh * sizeof(float));
        if (!st->win[b]) goto nomem;
        if (r->owns_compressor && r->ratio > 0) {
            size_t n = (size_t)(max_tokens / r->ratio + 1);
            st->ckv[b] = be->ops->alloc(be, n * dh * sizeof(float));
            st->ikey[b] = be->ops->alloc(be, n * (size_t)c->index_head_dim * sizeof(float));
            if (!st->ckv[b] || !st->ikey[b]) goto nomem;
            if (r->ratio > 1) {
                st->ctok[b] = be->ops->alloc(be, (size_t)st->tok_cap * 2 * dh * sizeof(float));
                if (!st->ctok[b]) goto nomem;
            }
        }
    }
    if (lm->has_dspark)
        for (int s = 0; s < c->n_mtp; s++) {
            st->dsring[s] = be->ops->alloc(be, (size_t)st->ring_cap * dh * sizeof(float));
            if (!st->dsring[s]) goto nomem;
        }
    return DI_OK;
nomem:
    di_seqstate_free(st);
    return di_err_set(err, DI_ERR_NOMEM, "sequence state of %lld tokens: out of memory",
                      (long long)max_tokens);
}

void di_seqstate_free(di_seqstate *st) {
    if (!st->lm) return;
    const di_config *c = st->lm->cfg;
    di_backend *be = st->lm->be;
    for (int b = 0; b < c->n_blocks; b++) {
        if (st->win && st->win[b]) be->ops->free(be, st->win[b]);
        if (st->ckv && st->ckv[b]) be->ops->free(be, st->ckv[b]);
        if (st->ikey && st->ikey[b]) be->ops->free(be, st->ikey[b]);
        if (st->ctok && st->ctok[b]) be->ops->free(be, st->ctok[b]);
    }
    for (int s = 0; s < c->n_mtp; s++)
        if (st->dsring && st->dsring[s]) be->ops->free(be, st->dsring[s]);
    free(st->win);
    free(st->ckv);
    free(st->ikey);
    free(st->ctok);
    free(st->dsring);
    free(st->hist);
    memset(st, 0, sizeof *st);
}

void di_seqstate_reset(di_seqstate *st) { st->n_tokens = 0; }

di_status di_seqstate_rollback(di_seqstate *st, int64_t n, di_err *err) {
    if (n < 0 || n > st->n_tokens || st->n_tokens - n > st->max_rollback)
        return di_err_set(err, DI_ERR_INVALID_ARG,
                          "rollback to %lld tokens: must be within %d of the current %lld",
                          (long long)n, st->max_rollback, (long long)st->n_tokens);
    /* Caches are indexed by position and entries past n are simply ignored;
     * rings were sized so the positions before n are still in place. */
    st->n_tokens = n;
    return DI_OK;
}
