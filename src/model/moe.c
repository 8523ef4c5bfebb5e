/* MoE sublayer (architecture.md §7): sqrt-softplus router in fp32, biased
 * top-k selection, renormalised weights × route scale, clamped SwiGLU
 * experts with the routing weight applied before the down projection, and
 * the shared expert. Expert outputs are accumulated in fp32 in ascending
 * expert order, the shared expert last, as the reference does.
 *
 * A backend with the grouped op (moe_experts) gets the routed experts in
 * one call with the routing left in backend memory (moe_route_buf, or the
 * host routing uploaded); otherwise the loop below runs one matmul /
 * SwiGLU / gather / scatter per expert. Both give the same bits. */
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"

/* y = W2·swiglu(W1x, W3x) for the n rows of x; w (per row) or NULL. With
 * acc (and w NULL: the shared expert, on a backend with swiglu_matmul_add)
 * y = bf16(acc + that) instead: the SwiGLU, the down product and the MoE's
 * final add_bf16 as one backend op, the same values in the same order. */
static di_status expert_run(const di_lm *lm, const di_lm_expert *ex, const float *x, int64_t n,
                            const float *w, const float *acc, float *y, di_err *err) {
    di_backend *be = lm->be;
    int64_t I = ex->w1.n_out;
    const float limit = (float)lm->cfg->swiglu_limit;
    float *g = di_alloc_raw(be, (size_t)(n * I) * sizeof(float));
    float *u = di_alloc_raw(be, (size_t)(n * I) * sizeof(float));
    if (!g || !u) {
        be->ops->free(be, g);
        be->ops->free(be, u);
        return di_err_set(err, DI_ERR_NOMEM, "expert: out of memory");
    }
    di_fwd_matmul_pair(be, &ex->w1, &ex->w3, x, n, g, u, lm->mm_q);
    if (acc) {
        be->ops->swiglu_matmul_add(be, &ex->w2, g, u, n, limit, acc, y, lm->mm_q);
    } else {
        be->ops->swiglu(be, g, u, w, n, I, limit, g);
        be->ops->matmul(be, &ex->w2, g, n, y, lm->mm_q);
    }
    be->ops->free(be, g);
    be->ops->free(be, u);
    return DI_OK;
}

/* acc [m, D] = the routed experts' sum through the backend's grouped op,
 * the routing kept in backend memory. */
static di_status routed_grouped(const di_lm *lm, int block, const float *logits, int64_t m,
                                const float *x, float *acc, di_err *err) {
    const di_config *c = lm->cfg;
    const di_lm_block *lb = &lm->blocks[block];
    const float *bias = lm->w->blocks[block].ffn.gate_bias.data;
    di_backend *be = lm->be;
    int E = c->roles[block].n_experts, K = c->roles[block].n_active;
    size_t n = (size_t)(m * K);
    int32_t *didx = di_alloc_raw(be, n * sizeof(int32_t)); /* routed or uploaded whole */
    float *dw = di_alloc_raw(be, n * sizeof(float));
    int32_t *idx = be->ops->moe_route_buf ? NULL : malloc(n * sizeof(int32_t));
    float *wt = be->ops->moe_route_buf ? NULL : malloc(n * sizeof(float));
    di_status st = DI_OK;
    if (!didx || !dw || (!be->ops->moe_route_buf && (!idx || !wt))) {
        st = di_err_set(err, DI_ERR_NOMEM, "moe: out of memory");
        goto out;
    }
    if (be->ops->moe_route_buf) {
        be->ops->moe_route_buf(be, logits, bias, m, E, K, c->norm_topk_prob,
                               (float)c->route_scale, didx, dw);
    } else {
        be->ops->moe_route(be, logits, bias, m, E, K, c->norm_topk_prob, (float)c->route_scale,
                           idx, wt);
        be->ops->upload(be, didx, idx, n * sizeof(int32_t));
        be->ops->upload(be, dw, wt, n * sizeof(float));
    }
    const di_lm_expert *e0 = &lb->experts[0];
    di_moe_experts ex = {E, &e0->w1, &e0->w3, &e0->w2, sizeof *e0};
    be->ops->moe_experts(be, &ex, x, m, didx, dw, K, lm->mm_q, (float)c->swiglu_limit, acc);
out:
    be->ops->free(be, didx);
    be->ops->free(be, dw);
    free(idx);
    free(wt);
    return st;
}

/* acc [m, D] = the routed experts' sum, one expert at a time: host routing,
 * then gather / w1 / w3 / SwiGLU / w2 / scatter-add per expert with rows. */
static di_status routed_loop(const di_lm *lm, int block, const float *logits, int64_t m,
                             const float *x, float *acc, di_err *err) {
    const di_config *c = lm->cfg;
    const di_lm_block *lb = &lm->blocks[block];
    di_backend *be = lm->be;
    int64_t d = c->dim;
    int E = c->roles[block].n_experts, K = c->roles[block].n_active;
    di_status st = DI_OK;
    int32_t *idx = malloc((size_t)(m * K) * sizeof(int32_t));
    float *wt = malloc((size_t)(m * K) * sizeof(float));
    int32_t *rows = malloc((size_t)m * sizeof(int32_t));
    float *rw = malloc((size_t)m * sizeof(float));
    float *xe = be->ops->alloc(be, (size_t)(m * d) * sizeof(float));
    float *ye = be->ops->alloc(be, (size_t)(m * d) * sizeof(float));
    float *dw = be->ops->alloc(be, (size_t)m * sizeof(float));
    if (!idx || !wt || !rows || !rw || !xe || !ye || !dw) {
        st = di_err_set(err, DI_ERR_NOMEM, "moe: out of memory");
        goto out;
    }
    be->ops->moe_route(be, logits, lm->w->blocks[block].ffn.gate_bias.data, m, E, K,
                       c->norm_topk_prob, (float)c->route_scale, idx, wt);
    for (int e = 0; e < E; e++) {
        int64_t n = 0;
        for (int64_t i = 0; i < m; i++)
            for (int k = 0; k < K; k++)
                if (idx[i * K + k] == e) {
                    rows[n] = (int32_t)i;
                    rw[n++] = wt[i * K + k];
                }
        if (n == 0) continue;
        be->ops->gather_rows(be, x, rows, n, d, xe);
        be->ops->upload(be, dw, rw, (size_t)n * sizeof(float));
        if ((st = expert_run(lm, &lb->experts[e], xe, n, dw, NULL, ye, err))) goto out;
        be->ops->scatter_add_rows(be, acc, rows, ye, n, d);
    }
out:
    free(idx);
    free(wt);
    free(rows);
    free(rw);
    be->ops->free(be, xe);
    be->ops->free(be, ye);
    be->ops->free(be, dw);
    return st;
}

di_status di_moe(di_fwd *f, int block, const float *x, float *y, di_err *err) {
    const di_lm *lm = f->lm;
    const di_config *c = lm->cfg;
    const di_lm_block *lb = &lm->blocks[block];
    di_backend *be = lm->be;
    int64_t m = f->m, d = c->dim;
    int E = c->roles[block].n_experts;
    di_status st = DI_OK;
    if (lb->gate.n_out != E || !lm->w->blocks[block].ffn.gate_bias.data)
        return di_err_set(err, DI_ERR_FORMAT, "router of %d experts missing", E);
    float *logits = di_alloc_raw(be, (size_t)(m * E) * sizeof(float));
    float *ye = di_alloc_raw(be, (size_t)(m * d) * sizeof(float));
    /* the grouped op writes acc whole; the loop adds into it (zeroed) */
    float *acc = be->ops->moe_experts ? di_alloc_raw(be, (size_t)(m * d) * sizeof(float))
                                      : be->ops->alloc(be, (size_t)(m * d) * sizeof(float));
    if (!logits || !ye || !acc) {
        st = di_err_set(err, DI_ERR_NOMEM, "moe: out of memory");
        goto out;
    }
    be->ops->matmul(be, &lb->gate, x, m, logits, 0); /* fp32 router */
    if (c->gate_temp != 1.0) {
        float *h = malloc((size_t)(m * E) * sizeof(float));
        if (!h) {
            st = di_err_set(err, DI_ERR_NOMEM, "moe: out of memory");
            goto out;
        }
        be->ops->download(be, h, logits, (size_t)(m * E) * 4);
        for (int64_t i = 0; i < m * E; i++) h[i] = (float)(h[i] / c->gate_temp);
        be->ops->upload(be, logits, h, (size_t)(m * E) * 4);
        free(h);
    }
    st = be->ops->moe_experts ? routed_grouped(lm, block, logits, m, x, acc, err)
                              : routed_loop(lm, block, logits, m, x, acc, err);
    if (st) goto out;
    if (be->ops->swiglu_matmul_add) { /* the shared expert's down product, the sum and its rounding in one */
        st = expert_run(lm, &lb->shared, x, m, NULL, acc, y, err);
        goto out;
    }
    if ((st = expert_run(lm, &lb->shared, x, m, NULL, NULL, ye, err))) goto out;
    if (be->ops->add_bf16) { /* the three below in one op */
        be->ops->add_bf16(be, y, acc, ye, m * d);
    } else {
        be->ops->add(be, acc, ye, m * d);
        be->ops->round_bf16(be, acc, m * d);
        be->ops->copy(be, y, acc, (size_t)(m * d) * sizeof(float));
    }
out:
    be->ops->free(be, logits);
    be->ops->free(be, ye);
    be->ops->free(be, acc);
    return st;
}
