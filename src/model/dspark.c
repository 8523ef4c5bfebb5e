/* DSpark drafter (architecture.md §10): the main-model KV rings of the three
 * stages, written for every position the main model processes, and one
 * draft round: the block [x_{p+1}, noise × (B-1)] through the stages
 * (window-only attention over the ring plus the whole block), the shared
 * head, the Markov bias of the previous token, greedy drafting and the
 * confidence head. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"

void di_sample_exp_noise(const float *logits, const float *e, int64_t V, float temperature,
                         int32_t *out) {
    int64_t best = 0;
    if (temperature == 0.f || !e) {
        for (int64_t v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        *out = (int32_t)best;
        return;
    }
    float t = temperature > 1e-5f ? temperature : 1e-5f, mx = -INFINITY, sum = 0.f;
    for (int64_t v = 0; v < V; v++) mx = fmaxf(mx, logits[v] / t);
    for (int64_t v = 0; v < V; v++) sum += expf(logits[v] / t - mx);
    float bv = -1.f;
    for (int64_t v = 0; v < V; v++) {
        float q = (expf(logits[v] / t - mx) / sum) / e[v];
        if (q > bv) {
            bv = q;
            best = v;
        }
    }
    *out = (int32_t)best;
}

di_status di_dspark_seed(di_fwd *f, di_err *err) {
    const di_lm *lm = f->lm;
    const di_config *c = lm->cfg;
    di_backend *be = lm->be;
    int64_t m = f->m, d = c->dim, dh = c->head_dim;
    di_status st = DI_OK;
    float *mx = be->ops->alloc(be, (size_t)(m * d) * sizeof(float));
    float *kv = be->ops->alloc(be, (size_t)(m * dh) * sizeof(float));
    size_t wb = di_kvq_row_bytes(DI_KVQ_FP8, dh);
    uint8_t *kvp = be->ops->alloc(be, (size_t)m * wb);
    if (!mx || !kv || !kvp) {
        st = di_err_set(err, DI_ERR_NOMEM, "dspark: out of memory");
        goto out;
    }
    if (lm->main_proj.n_in != c->n_dspark_taps * d) {
        st = di_err_set(err, DI_ERR_FORMAT, "mtp main_proj input is not n_taps x dim");
        goto out;
    }
    /* main_x = RMSNorm(main_hidden · Wmpᵀ; main_norm) */
    be->ops->matmul(be, &lm->main_proj, f->taps, m, mx, lm->mm_q);
    be->ops->rmsnorm(be, mx, &lm->w->dspark.main_norm, m, d, c->eps, mx);
    for (int k = 0; k < c->n_mtp; k++) {
        int b = c->n_layers + k;
        const di_lm_block *lb = &lm->blocks[b];
        be->ops->matmul(be, &lb->wkv, mx, m, kv, lm->mm_q);
        be->ops->rmsnorm(be, kv, &lm->w->blocks[b].attn.kv_norm, m, dh, c->eps, kv);
        di_fwd_rope(f, b, kv, m, dh, 1, dh, f->pos, 0);
        be->ops->kv_pack(be, DI_KVQ_FP8, kv, m, dh, kvp);
        if (f->meta && be->ops->scatter_rows_to) { /* to the step metadata's ring slots */
            be->ops->scatter_rows_to(be, kvp, wb, m, f->m_dsring + (int64_t)k * m, f->m_wslot, 0,
                                     wb, wb);
            continue;
        }
        for (int s = 0; s < f->n_seqs; s++) {
            di_seqstate *sq = f->seqs[s].st;
            int64_t n = f->seqs[s].n, first = n > sq->ring_cap ? n - sq->ring_cap : 0;
            for (int64_t i = first; i < n; i++)
                be->ops->copy(be, di_seqstate_dspark_row(sq, k, sq->n_tokens + i),
                              kvp + (size_t)(f->row0[s] + i) * wb, wb);
        }
    }
out:
    be->ops->free(be, mx);
    be->ops->free(be, kv);
    be->ops->free(be, kvp);
    return st;
}

di_status di_dspark_draft(const di_lm *lm, di_seqstate *st, int32_t input_id, float *logits,
                          float *markov_bias, float *confidence, int32_t *ids, di_err *err) {
    return di_dspark_draft_sampled(lm, st, input_id, 0.f, NULL, logits, markov_bias, confidence,
                                   ids, err);
}

di_status di_dspark_draft_sampled(const di_lm *lm, di_seqstate *st, int32_t input_id,
                                  float temperature, const float *noise, float *logits,
                                  float *markov_bias, float *confidence, int32_t *ids,
                                  di_err *err) {
    const di_config *c = lm->cfg;
    di_backend *be = lm->be;
    int B = c->dspark_block_size, hc = c->hc_mult;
    int64_t d = c->dim, V = c->vocab_size, rm = c->dspark_markov_rank;
    if (!lm->has_dspark || B < 1 || c->n_mtp < 1)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "the model has no DSpark drafter");
    if (B > 64)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "dspark_block_size %d: at most 64 is supported", B);
    if (st->n_tokens < 1)
        return di_err_set(err, DI_ERR_STATE, "DSpark draft needs at least one processed token");
    if (input_id < 0 || input_id >= V)
        return di_err_set(err, DI_ERR_INVALID_ARG, "DSpark input id %d outside the vocabulary", input_id);
    if (lm->confidence.n_in != d + rm || lm->markov_head.n_in != rm)
        return di_err_set(err, DI_ERR_FORMAT, "DSpark heads do not match dim + markov rank");
    int32_t *bid = malloc((size_t)B * sizeof(int32_t));
    di_fwd_seq seq = {st, NULL, B};
    di_fwd f;
    memset(&f, 0, sizeof f);
    f.lm = lm;
    f.seqs = &seq;
    f.n_seqs = 1;
    f.m = B;
    f.dspark_p = (int)(st->n_tokens - 1);
    float *s = be->ops->alloc(be, (size_t)(B * hc * d) * sizeof(float));
    float *pre = be->ops->alloc(be, (size_t)(B * hc) * sizeof(float));
    float *h = be->ops->alloc(be, (size_t)(B * d) * sizeof(float));
    float *cin = be->ops->alloc(be, (size_t)(B * (d + rm)) * sizeof(float));
    float *emb = be->ops->alloc(be, (size_t)rm * sizeof(float));
    float *bias = be->ops->alloc(be, (size_t)V * sizeof(float));
    float *conf = be->ops->alloc(be, (size_t)B * sizeof(float));
    float *hb = malloc((size_t)V * sizeof(float));
    int32_t *pos = malloc((size_t)B * sizeof(int32_t));
    int32_t *seqi = calloc((size_t)B, sizeof(int32_t));
    int64_t row0 = 0;
    di_status rc = DI_OK;
    if (!bid || !s || !pre || !h || !cin || !emb || !bias || !conf || !hb || !pos || !seqi) {
        rc = di_err_set(err, DI_ERR_NOMEM, "dspark draft: out of memory");
        goto out;
    }
    f.pos = pos;
    f.seq = seqi;
    f.row0 = &row0;
    f.ids = bid;
    bid[0] = input_id;
    for (int i = 1; i < B; i++) bid[i] = c->dspark_noise_id;
    for (int i = 0; i < B; i++) pos[i] = (int32_t)(st->n_tokens + i);
    if ((rc = di_fwd_embed(&f, bid, s, pre))) {
        di_err_set(err, rc, "dspark draft: out of memory");
        goto out;
    }
    for (int k = 0; k < c->n_mtp; k++)
        if ((rc = di_fwd_block(&f, c->n_layers + k, s, pre, err))) goto out;
    /* head: collapse with the last stage's pre; keep the collapsed hidden
     * (before the norm) for the confidence head */
    be->ops->hc_collapse(be, s, pre, B, hc, d, h);
    for (int i = 0; i < B; i++) {
        be->ops->copy(be, cin + i * (d + rm), h + i * d, (size_t)d * sizeof(float));
    }
    be->ops->rmsnorm(be, h, &lm->w->dspark.norm, B, d, c->eps, h);
    int32_t prev = input_id;
    for (int i = 0; i < B; i++) {
        float *lg = logits + (int64_t)i * V;
        be->ops->matmul(be, &lm->head, h + i * d, 1, bias, 0);
        be->ops->download(be, lg, bias, (size_t)V * sizeof(float));
        /* Markov bias of the previous token */
        be->ops->embed(be, &lm->w->dspark.markov_embed, &prev, 1, emb);
        be->ops->copy(be, cin + i * (d + rm) + d, emb, (size_t)rm * sizeof(float));
        be->ops->matmul(be, &lm->markov_head, emb, 1, bias, 0);
        be->ops->download(be, hb, bias, (size_t)V * sizeof(float));
        if (markov_bias) memcpy(markov_bias + (int64_t)i * V, hb, (size_t)V * sizeof(float));
        for (int64_t v = 0; v < V; v++) lg[v] += hb[v];
        int32_t best = 0;
        di_sample_exp_noise(lg, noise ? noise + (int64_t)i * V : NULL, V, noise ? temperature : 0.f,
                            &best);
        ids[i] = best;
        prev = best;
    }
    be->ops->matmul(be, &lm->confidence, cin, B, conf, 0);
    be->ops->download(be, confidence, conf, (size_t)B * sizeof(float));
out:
    free(bid);
    be->ops->free(be, s);
    be->ops->free(be, pre);
    be->ops->free(be, h);
    be->ops->free(be, cin);
    be->ops->free(be, emb);
    be->ops->free(be, bias);
    be->ops->free(be, conf);
    free(hb);
    free(pos);
    free(seqi);
    return rc;
}
