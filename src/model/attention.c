/* Attention sublayer (architecture.md §5.2, §5.5, §5.6): query path, window
 * KV quantized to FP8 and packed into the ring, the compressed entries chosen by the
 * indexer (§5.3/§5.4 in compressor.c / indexer.c), sparse attention with
 * sink, inverse RoPE and the grouped output projection. DSpark stages attend
 * to their ring of main-model KV plus the whole draft block (§10.3). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"

/* Host form (backends without the backend-memory forms, see forward.h's
 * step metadata, whose window codes follow the same layout).
 * Attention list of each row: W window slots (positions max(0, t-W+1) + k,
 * empty beyond t), then the selected compressed entries. Rows are packed:
 * the chunk's own window KV from kvp [m, win_bytes], older positions from
 * the ring, compressed entries from the kv source's cache. */
typedef const uint8_t *kvrow;

static void build_rows(di_fwd *f, int block, const uint8_t *kvp, kvrow *rows, int n_slots) {
    const di_config *c = f->lm->cfg;
    const di_layer_role *r = &c->roles[block];
    int W = c->window, k = c->index_topk;
    for (int64_t i = 0; i < f->m; i++) {
        const di_seqstate *st = f->seqs[f->seq[i]].st;
        int64_t t = f->pos[i], start = st->n_tokens, r0 = f->row0[f->seq[i]];
        kvrow *o = rows + i * n_slots;
        int64_t p0 = t - W + 1 > 0 ? t - W + 1 : 0;
        for (int j = 0; j < W; j++) {
            int64_t p = p0 + j;
            if (p > t) o[j] = NULL;
            else if (p >= start) o[j] = kvp + (size_t)(r0 + p - start) * st->win_bytes;
            else o[j] = di_seqstate_win_row(st, block, p);
        }
        if (r->ratio > 0) {
            const int32_t *sel = f->sel[r->isrc] + i * k;
            const uint8_t *cache = st->ckv[r->kv_src];
            for (int j = 0; j < k; j++)
                o[W + j] = sel[j] >= 0 ? cache + (size_t)sel[j] * st->ckv_bytes : NULL;
        }
    }
}

/* DSpark stage: ring slots 0 .. min(W, p+1)-1 in slot order (slot j holds
 * the position ≡ j mod W in (p-W, p]), then the B block entries. */
static void build_rows_dspark(di_fwd *f, int block, const uint8_t *kvp, kvrow *rows,
                              int n_slots) {
    const di_config *c = f->lm->cfg;
    int stage = block - c->n_layers, W = c->window;
    int64_t p = f->dspark_p;
    const di_seqstate *st = f->seqs[0].st;
    int nr = p + 1 < W ? (int)p + 1 : W;
    for (int64_t i = 0; i < f->m; i++) {
        kvrow *o = rows + i * n_slots;
        for (int j = 0; j < nr; j++) {
            int64_t q = p - ((p - j) % W + W) % W;
            o[j] = di_seqstate_dspark_row(st, stage, q);
        }
        for (int64_t j = 0; j < f->m; j++) o[nr + j] = kvp + (size_t)j * st->win_bytes;
    }
}

di_status di_attention(di_fwd *f, int block, const float *x, float *y, di_err *err) {
    const di_lm *lm = f->lm;
    const di_config *c = lm->cfg;
    const di_layer_role *r = &c->roles[block];
    const di_lm_block *lb = &lm->blocks[block];
    di_backend *be = lm->be;
    int64_t m = f->m, dh = c->head_dim;
    int H = c->n_heads, W = c->window;
    int dspark = r->is_dspark_stage;
    int n_slots, n_win;
    if (dspark) {
        int64_t p = f->dspark_p;
        n_slots = n_win = (int)((p + 1 < W ? p + 1 : W) + m);
    } else {
        n_win = W;
        n_slots = W + (r->ratio > 0 ? c->index_topk : 0);
    }
    size_t wb = di_kvq_row_bytes(DI_KVQ_FP8, dh);
    di_status st = DI_OK;
    int32_t *pos = f->pos, *dpos = NULL;
    /* each written whole by the product, attention or packing that fills it */
    float *qr = di_alloc_raw(be, (size_t)(m * c->q_lora_rank) * sizeof(float));
    float *q = di_alloc_raw(be, (size_t)(m * H * dh) * sizeof(float));
    float *kv = di_alloc_raw(be, (size_t)(m * dh) * sizeof(float));
    float *o = di_alloc_raw(be, (size_t)(m * H * dh) * sizeof(float));
    uint8_t *kvp = di_alloc_raw(be, (size_t)m * wb);
    float *z = di_alloc_raw(be, (size_t)(m * lb->wo_a.n_out) * sizeof(float));
    int host_rows = dspark || !f->meta; /* else the tables are in the step metadata */
    kvrow *rows = host_rows ? calloc((size_t)(m * n_slots), sizeof(kvrow)) : NULL;
    if (!qr || !q || !kv || !kvp || !o || !z || (host_rows && !rows)) {
        st = di_err_set(err, DI_ERR_NOMEM, "attention: out of memory");
        goto out;
    }
    if (lb->wq_b.n_out != H * dh || lb->wo_a.n_in * c->o_groups != H * dh) {
        st = di_err_set(err, DI_ERR_FORMAT, "attention: wq_b / wo_a shapes do not match heads x head_dim");
        goto out;
    }
    /* the query path's first product and the window KV's, both of x: one
     * pass where the backend pairs them (at decode one launch less a layer) */
    di_fwd_matmul_pair(be, &lb->wq_a, &lb->wkv, x, m, qr, kv, lm->mm_q);
    /* query path (§5.2) */
    be->ops->rmsnorm(be, qr, &lm->w->blocks[block].attn.q_norm, m, c->q_lora_rank, c->eps, qr);
    be->ops->matmul(be, &lb->wq_b, qr, m, q, lm->mm_q);
    /* window KV: RMSNorm, RoPE, FP8 over all dims (packed: codes + scales) */
    const float *cs = dspark ? NULL : di_fwd_rope_cs(f, block, pos);
    if (cs && be->ops->qkv_rope_pack) { /* the rmsnorm, ropes and packing below in one op */
        be->ops->qkv_rope_pack(be, q, H, kv, m, dh, c->rope_dim, &lm->w->blocks[block].attn.kv_norm,
                               c->eps, cs, kvp);
        goto packed;
    }
    be->ops->rmsnorm(be, kv, &lm->w->blocks[block].attn.kv_norm, m, dh, c->eps, kv);
    if (dspark) { /* block slot i sits at position p + 1 + i */
        dpos = malloc((size_t)m * sizeof(int32_t));
        if (!dpos) {
            st = di_err_set(err, DI_ERR_NOMEM, "attention: out of memory");
            goto out;
        }
        for (int64_t i = 0; i < m; i++) dpos[i] = (int32_t)(f->dspark_p + 1 + i);
        pos = dpos;
    }
    di_fwd_rope(f, block, q, m, H * dh, H, dh, pos, 0);
    di_fwd_rope(f, block, kv, m, dh, 1, dh, pos, 0);
    be->ops->kv_pack(be, DI_KVQ_FP8, kv, m, dh, kvp);
packed:
    if (dspark) {
        build_rows_dspark(f, block, kvp, rows, n_slots);
    } else {
        if (r->ratio > 0) {
            if (r->owns_compressor && (st = di_compressor(f, block, x, err))) goto out;
            if (r->is_index_source && (st = di_indexer(f, block, x, qr, err))) goto out;
            if (r->isrc < 0 || !f->sel[r->isrc]) {
                st = di_err_set(err, DI_ERR_STATE, "no selection of block %d to reuse", r->isrc);
                goto out;
            }
        }
        if (host_rows) build_rows(f, block, kvp, rows, n_slots);
    }
    const float *sink = lm->w->blocks[block].attn.sink.data;
    float scale = (float)(1.0 / sqrt((double)dh));
    if (!host_rows) { /* row tables and selection in backend memory */
        int sel = r->ratio > 0;
        di_attn_rows t = {W,
                          f->m_win,
                          f->m_ring + (int64_t)block * m,
                          kvp,
                          wb,
                          sel ? c->index_topk : 0,
                          sel ? f->sel[r->isrc] : NULL,
                          sel ? f->m_ckv + (int64_t)block * m : NULL,
                          di_kvq_row_bytes(DI_KVQ_FP4_E4M3, dh)};
        be->ops->sparse_attn_rows(be, q, m, H, dh, &t, sink, scale, o);
    } else {
        be->ops->sparse_attn_kv(be, q, m, H, dh, rows, n_slots, n_win, sink, scale, o);
    }
    di_fwd_rope(f, block, o, m, H * dh, H, dh, pos, 1);
    /* grouped low-rank output projection (§5.6) */
    be->ops->matmul_grouped(be, &lb->wo_a, c->o_groups, o, m, z);
    be->ops->matmul(be, &lb->wo_b, z, m, y, lm->mm_q);

    if (!dspark && f->meta && be->ops->scatter_rows_to) /* the same, to the metadata's slots */
        be->ops->scatter_rows_to(be, kvp, wb, m, f->m_ring + (int64_t)block * m, f->m_wslot, 0, wb,
                                 wb);
    else if (!dspark) /* the chunk's window KV into the ring, after every read */
        for (int s = 0; s < f->n_seqs; s++) {
            di_seqstate *sq = f->seqs[s].st;
            int64_t n = f->seqs[s].n, first = n > sq->ring_cap ? n - sq->ring_cap : 0;
            for (int64_t i = first; i < n; i++)
                be->ops->copy(be, di_seqstate_win_row(sq, block, sq->n_tokens + i),
                              kvp + (size_t)(f->row0[s] + i) * wb, wb);
        }
out:
    free(dpos);
    be->ops->free(be, qr);
    be->ops->free(be, q);
    be->ops->free(be, kv);
    be->ops->free(be, kvp);
    be->ops->free(be, o);
    be->ops->free(be, z);
    free(rows);
    return st;
}
