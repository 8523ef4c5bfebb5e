/* Lightning indexer of an index-source block (architecture.md §5.4): FP4
 * index queries against the kv source's index keys, scores with the
 * reference's bf16 rounding points, the candidate blocks of the candidate
 * source, the block restriction of re-index layers, and the top-k selection
 * that this block and the following reuse layers attend to.
 *
 * Scores are materialised for a slice of rows at a time (at most
 * SCORE_BUDGET values), so long contexts do not need rows × entries memory. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"

#define SCORE_BUDGET (1 << 24)

di_status di_indexer(di_fwd *f, int block, const float *x, const float *qr, di_err *err) {
    const di_lm *lm = f->lm;
    const di_config *c = lm->cfg;
    const di_layer_role *r = &c->roles[block];
    const di_lm_block *lb = &lm->blocks[block];
    di_backend *be = lm->be;
    int64_t m = f->m, di = c->index_head_dim;
    int hi = c->index_n_heads, k = c->index_topk, ratio = c->roles[r->kv_src].ratio;
    int nbk = c->candidate_topk_blocks, bs = c->candidate_block_size;
    di_status st = DI_OK;
    if (!lb->idx_wq_b.w || !lb->idx_wp.w || lb->idx_wq_b.n_out != hi * di || lb->idx_wp.n_out != hi)
        return di_err_set(err, DI_ERR_FORMAT, "indexer weights missing or of the wrong shape");
    if (r->indexer == DI_INDEXER_POOL && !r->is_candidate_source && !f->cand)
        return di_err_set(err, DI_ERR_STATE, "re-index block %d: no candidate pool in this forward", block);
    /* visible entries and key caches per row: the step metadata (backend
     * memory when the backend has the backend-memory forms, which then also
     * keep the selections there; host arrays otherwise) */
    int buf = f->meta != NULL;
    const di_backend_ops *o = be->ops;
    void (*scores)(di_backend *, const float *, const float *, int64_t, int, int64_t,
                   const uint8_t *const *, const int32_t *, int64_t, float *) =
        buf ? o->index_scores_kv_buf : o->index_scores_kv;
    void (*cands)(di_backend *, const float *, const int32_t *, int64_t, int64_t, int, int,
                  int32_t *) = buf ? o->candidate_blocks_buf : o->candidate_blocks;
    void (*restrict_)(di_backend *, float *, const int32_t *, int64_t, int64_t, int, int) =
        buf ? o->restrict_blocks_buf : o->restrict_blocks;
    void (*topk)(di_backend *, const float *, const int32_t *, int64_t, int64_t, int, int32_t *) =
        buf ? o->topk_select_buf : o->topk_select;
    const int32_t *nvis = f->m_nvis + block * m;
    const uint8_t *const *keys = f->m_ikey + block * m;
    size_t sel_bytes = (size_t)(m * k + 1) * sizeof(int32_t);
    f->sel[block] = buf ? be->ops->alloc(be, sel_bytes) : malloc(sel_bytes);
    float *q = be->ops->alloc(be, (size_t)(m * hi * di) * sizeof(float));
    float *w = be->ops->alloc(be, (size_t)(m * hi) * sizeof(float));
    float *sc = NULL;
    if (!f->sel[block] || !q || !w) goto nomem;
    if (r->is_candidate_source) {
        size_t cand_bytes = (size_t)(m * (nbk > 0 ? nbk : 1)) * sizeof(int32_t);
        if (buf) be->ops->free(be, f->cand);
        else free(f->cand);
        f->cand = buf ? be->ops->alloc(be, cand_bytes) : malloc(cand_bytes);
        if (!f->cand) goto nomem;
    }
    int64_t width = 0; /* the widest row's visible entries (host positions, not a backend read) */
    for (int64_t i = 0; i < m; i++) {
        int64_t nv = (f->pos[i] + 1) / ratio;
        if (nv > width) width = nv;
    }
    if (buf) width = di_fwd_width_bucket(width);
    /* FP4 index queries */
    be->ops->matmul(be, &lb->idx_wq_b, qr, m, q, lm->mm_q);
    di_fwd_rope(f, block, q, m, hi * di, hi, di, f->pos, 0);
    be->ops->qdq_fp4_e8m0(be, q, m * hi * di);
    /* head weights: bf16 projection times 1/sqrt(Di·Hi), rounded to bf16 */
    be->ops->matmul(be, &lb->idx_wp, x, m, w, DI_MM_OUT_BF16);
    be->ops->scale_bf16(be, w, m * hi, (float)(pow((double)di, -0.5) * pow((double)hi, -0.5)));
    if (width == 0 && !buf) { /* nothing visible yet */
        for (int64_t i = 0; i < m * k; i++) f->sel[block][i] = -1;
        if (r->is_candidate_source)
            for (int64_t i = 0; i < m * nbk; i++) f->cand[i] = -1;
        goto out;
    }
    /* (backend memory: the width is never 0; rows with nothing visible get -1 everywhere) */
    int64_t rows = width > 0 && SCORE_BUDGET / width > 0 ? SCORE_BUDGET / width : 1;
    if (width == 0 || rows > m) rows = m;
    sc = be->ops->alloc(be, (size_t)(rows * (width > 0 ? width : 1)) * sizeof(float));
    if (!sc) goto nomem;
    for (int64_t i0 = 0; i0 < m; i0 += rows) {
        int64_t n = m - i0 < rows ? m - i0 : rows;
        scores(be, q + i0 * hi * di, w + i0 * hi, n, hi, di, keys + i0, nvis + i0, width, sc);
        if (r->is_candidate_source)
            cands(be, sc, nvis + i0, n, width, nbk, bs, f->cand + i0 * nbk);
        else if (r->indexer == DI_INDEXER_POOL)
            restrict_(be, sc, f->cand + i0 * nbk, n, width, nbk, bs);
        topk(be, sc, nvis + i0, n, width, k, f->sel[block] + i0 * k);
    }
    goto out;
nomem:
    st = di_err_set(err, DI_ERR_NOMEM, "indexer: out of memory");
out:
    be->ops->free(be, q);
    be->ops->free(be, w);
    be->ops->free(be, sc);
    return st;
}
