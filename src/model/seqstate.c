/* Per-sequence state: allocation, reset and rollback (see seqstate.h). */
#include "model/seqstate.h"

#include <stdlib.h>
#include <string.h>

/* Sizes of every buffer of a state, shared by init and di_seqstate_bytes so
 * the two cannot disagree. */
typedef struct layout {
    int ring_cap, tok_cap, hist_cap;
    size_t win, ckv, ikey; /* packed row bytes */
} layout;

static void layout_of(const di_config *c, int max_rollback, layout *l) {
    int maxr = 1;
    for (int b = 0; b < c->n_blocks; b++)
        if (c->compress_ratios[b] > maxr) maxr = c->compress_ratios[b];
    l->ring_cap = c->window + max_rollback;
    l->tok_cap = maxr + max_rollback;
    l->hist_cap = (c->engram_max_ngram > 1 ? c->engram_max_ngram - 1 : 1) + max_rollback;
    l->win = di_kvq_row_bytes(DI_KVQ_FP8, c->head_dim);
    l->ckv = di_kvq_row_bytes(DI_KVQ_FP4_E4M3, c->head_dim);
    l->ikey = di_kvq_row_bytes(DI_KVQ_FP4_E8M0, c->index_head_dim);
}

/* Entries of a kv source's caches: entry j is written once its group
 * j·r .. j·r+r-1 is complete, so j < max_tokens / r (at least one row, so
 * no backend is asked for zero bytes). */
static size_t cache_entries(int64_t max_tokens, int ratio) {
    int64_t n = max_tokens / ratio;
    return (size_t)(n > 0 ? n : 1);
}

static size_t ctok_bytes(const di_config *c, const layout *l) {
    return (size_t)l->tok_cap * 2 * (size_t)c->head_dim * sizeof(float);
}

uint64_t di_seqstate_bytes(const di_lm *lm, int64_t max_tokens, int max_rollback) {
    const di_config *c = lm->cfg;
    layout l;
    layout_of(c, max_rollback, &l);
    uint64_t total = 0;
    for (int b = 0; b < c->n_layers; b++) {
        const di_layer_role *r = &c->roles[b];
        total += (uint64_t)l.ring_cap * l.win;
        if (r->owns_compressor && r->ratio > 0) {
            total += (uint64_t)cache_entries(max_tokens, r->ratio) * (l.ckv + l.ikey);
            if (r->ratio > 1) total += ctok_bytes(c, &l);
        }
    }
    if (lm->has_dspark) total += (uint64_t)c->n_mtp * l.ring_cap * l.win;
    return total;
}

static void *alloc_table(int n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(void *)); }

/* A backend buffer counted in st->bytes. */
static void *st_alloc(di_seqstate *st, size_t bytes) {
    void *p = st->lm->be->ops->alloc(st->lm->be, bytes);
    if (p) st->bytes += bytes;
    return p;
}

di_status di_seqstate_init(di_seqstate *st, const di_lm *lm, int64_t max_tokens, int max_rollback,
                           di_err *err) {
    memset(st, 0, sizeof *st);
    const di_config *c = lm->cfg;
    if (max_tokens < 1 || max_rollback < 0 || max_rollback > 1 << 20)
        return di_err_set(err, DI_ERR_INVALID_ARG,
                          "sequence state: max_tokens %lld / max_rollback %d out of range",
                          (long long)max_tokens, max_rollback);
    layout l;
    layout_of(c, max_rollback, &l);
    st->lm = lm;
    st->max_tokens = max_tokens;
    st->max_rollback = max_rollback;
    st->ring_cap = l.ring_cap;
    st->tok_cap = l.tok_cap;
    st->hist_cap = l.hist_cap;
    st->win_bytes = l.win;
    st->ckv_bytes = l.ckv;
    st->ikey_bytes = l.ikey;
    st->win = alloc_table(c->n_blocks);
    st->ckv = alloc_table(c->n_blocks);
    st->ikey = alloc_table(c->n_blocks);
    st->ctok = alloc_table(c->n_blocks);
    st->dsring = alloc_table(c->n_mtp);
    st->hist = calloc((size_t)st->hist_cap, sizeof(int32_t));
    if (!st->win || !st->ckv || !st->ikey || !st->ctok || !st->dsring || !st->hist) goto nomem;
    for (int b = 0; b < c->n_layers; b++) {
        const di_layer_role *r = &c->roles[b];
        if (!(st->win[b] = st_alloc(st, (size_t)st->ring_cap * l.win))) goto nomem;
        if (r->owns_compressor && r->ratio > 0) {
            size_t n = cache_entries(max_tokens, r->ratio);
            st->ckv[b] = st_alloc(st, n * l.ckv);
            st->ikey[b] = st_alloc(st, n * l.ikey);
            if (!st->ckv[b] || !st->ikey[b]) goto nomem;
            if (r->ratio > 1 && !(st->ctok[b] = st_alloc(st, ctok_bytes(c, &l)))) goto nomem;
        }
    }
    if (lm->has_dspark)
        for (int s = 0; s < c->n_mtp; s++)
            if (!(st->dsring[s] = st_alloc(st, (size_t)st->ring_cap * l.win))) goto nomem;
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

/* Downloads and decodes entries [j0, j0+n) of one packed cache. */
static di_status read_cache(const di_seqstate *st, uint8_t *const *cache, const char *what,
                            int block, di_kvq fmt, size_t rb, int64_t dim, int64_t j0, int64_t n,
                            float *out, di_err *err) {
    const di_config *c = st->lm->cfg;
    if (block < 0 || block >= c->n_blocks || !cache[block])
        return di_err_set(err, DI_ERR_INVALID_ARG, "%s of block %d: not a kv source", what, block);
    int ratio = c->roles[block].ratio;
    if (j0 < 0 || n < 0 || j0 + n > st->max_tokens / ratio)
        return di_err_set(err, DI_ERR_INVALID_ARG, "%s of block %d: entries [%lld, %lld) outside [0, %lld)",
                          what, block, (long long)j0, (long long)(j0 + n),
                          (long long)(st->max_tokens / ratio));
    uint8_t *buf = malloc(rb * (size_t)(n > 0 ? n : 1));
    if (!buf) return di_err_set(err, DI_ERR_NOMEM, "%s: out of memory", what);
    di_backend *be = st->lm->be;
    be->ops->download(be, buf, cache[block] + (size_t)j0 * rb, rb * (size_t)n);
    for (int64_t j = 0; j < n; j++) di_kvq_unpack(fmt, buf + (size_t)j * rb, dim, out + j * dim);
    free(buf);
    return DI_OK;
}

di_status di_seqstate_read_ckv(const di_seqstate *st, int block, int64_t j0, int64_t n, float *out,
                               di_err *err) {
    return read_cache(st, st->ckv, "compressed KV", block, DI_KVQ_FP4_E4M3, st->ckv_bytes,
                      st->lm->cfg->head_dim, j0, n, out, err);
}

di_status di_seqstate_read_ikey(const di_seqstate *st, int block, int64_t j0, int64_t n,
                                float *out, di_err *err) {
    return read_cache(st, st->ikey, "index keys", block, DI_KVQ_FP4_E8M0, st->ikey_bytes,
                      st->lm->cfg->index_head_dim, j0, n, out, err);
}
