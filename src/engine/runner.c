/* The real model runner over the V4.1 forward pass (see runner.h). */
#include "engine/runner.h"

#include <stdlib.h>

#include "model/forward.h"
#include "model/seqstate.h"

/* What di_seqstate_init allocates with no rollback room (backend memory:
 * packed window rings and caches, compressor ring, DSpark rings), plus the
 * host Engram history and the struct. */
static uint64_t lm_state_bytes(void *ctx, int64_t max_tokens) {
    const di_lm *lm = ctx;
    const di_config *c = lm->cfg;
    uint64_t hist = (uint64_t)(c->engram_max_ngram > 1 ? c->engram_max_ngram - 1 : 1) * sizeof(int32_t);
    return di_seqstate_bytes(lm, max_tokens, 0) + hist + sizeof(di_seqstate);
}

static di_status lm_state_new(void *ctx, int64_t max_tokens, void **state, di_err *err) {
    di_seqstate *st = calloc(1, sizeof *st);
    if (!st) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    di_status s = di_seqstate_init(st, ctx, max_tokens, 0, err);
    if (s) { free(st); return s; }
    *state = st;
    return DI_OK;
}

static void lm_state_free(void *ctx, void *state) {
    (void)ctx;
    if (!state) return;
    di_seqstate_free(state);
    free(state);
}

/* di_forward or, with out, di_forward_rows */
static di_status lm_pass(void *ctx, const di_runner_seq *seqs, int n_seqs, float *logits, int all_rows,
                         const di_fwd_out *out, di_err *err) {
    di_fwd_seq *fs = malloc((size_t)(n_seqs > 0 ? n_seqs : 1) * sizeof *fs);
    if (!fs) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n_seqs; i++) {
        fs[i].st = seqs[i].state;
        fs[i].ids = seqs[i].ids;
        fs[i].n = seqs[i].n;
    }
    di_status st = out ? di_forward_rows(ctx, fs, n_seqs, logits, out, err)
                       : di_forward(ctx, fs, n_seqs, logits, all_rows, err);
    free(fs);
    return st;
}

static di_status lm_forward(void *ctx, const di_runner_seq *seqs, int n_seqs, float *logits, int all_rows,
                            di_err *err) {
    return lm_pass(ctx, seqs, n_seqs, logits, all_rows, NULL, err);
}

static di_status lm_forward_rows(void *ctx, const di_runner_seq *seqs, int n_seqs, float *logits,
                                 const di_fwd_out *out, di_err *err) {
    return lm_pass(ctx, seqs, n_seqs, logits, 0, out, err);
}

static void *lm_logits_alloc(void *ctx, size_t bytes) {
    const di_lm *lm = ctx;
    return di_host_alloc(lm->be, bytes);
}

static void lm_logits_free(void *ctx, void *p) {
    const di_lm *lm = ctx;
    di_host_free(lm->be, p);
}

static const di_runner_ops lm_ops = {.state_bytes = lm_state_bytes,
                                     .state_new = lm_state_new,
                                     .state_free = lm_state_free,
                                     .forward = lm_forward,
                                     .logits_alloc = lm_logits_alloc,
                                     .logits_free = lm_logits_free,
                                     .host_alloc = lm_logits_alloc,
                                     .host_free = lm_logits_free};
static const di_runner_ops lm_ops_rows = {.state_bytes = lm_state_bytes,
                                          .state_new = lm_state_new,
                                          .state_free = lm_state_free,
                                          .forward = lm_forward,
                                          .forward_rows = lm_forward_rows,
                                          .logits_alloc = lm_logits_alloc,
                                          .logits_free = lm_logits_free,
                                          .host_alloc = lm_logits_alloc,
                                          .host_free = lm_logits_free};

void di_runner_lm_init(di_runner *r, const di_lm *lm) {
    r->ops = lm->be->ops->logits_greedy ? &lm_ops_rows : &lm_ops;
    r->ctx = (void *)lm;
    r->vocab = lm->cfg->vocab_size;
    r->draws = lm->be->ops->logits_greedy && lm->be->ops->logits_draw;
    r->tops = lm->be->ops->logits_greedy && lm->be->ops->logits_top;
    r->rows_all = r->tops && lm->be->ops->logits_pick;
}
