/* Compressor of a kv-source block (architecture.md §5.3): ratio r > 1 pools
 * each complete group of r tokens with a per-channel softmax gate (fp32),
 * ratio 1 is a plain bf16 projection. Each new entry j (positioned at its
 * group's first token j·r) gives an index key (RMSNorm, RoPE, FP4 per 32
 * with E8M0 scales) and a compressed-KV row (RoPE, FP4 per 16 with E4M3
 * scales), stored packed (backend/kvstore.h). A group split across chunks is completed from the per-token
 * projections kept in the sequence state. */
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"

/* Consecutive row copies that continue each other on both sides, merged
 * into one backend call: a prefill's groups lie in the chunk back to back,
 * so their gather is a few copies instead of two a token. */
typedef struct {
    di_backend *be;
    char *dst;
    const char *src;
    size_t bytes;
} copy_run;

static void run_flush(copy_run *r) {
    if (r->bytes) r->be->ops->copy(r->be, r->dst, r->src, r->bytes);
    r->bytes = 0;
}

static void run_add(copy_run *r, void *dst, const void *src, size_t bytes) {
    if (r->bytes && (char *)dst == r->dst + r->bytes && (const char *)src == r->src + r->bytes) {
        r->bytes += bytes;
        return;
    }
    run_flush(r);
    r->dst = dst;
    r->src = src;
    r->bytes = bytes;
}

/* Groups of sequence s completed by this chunk: j in [*j0, *j1). */
static void new_groups(const di_fwd *f, int s, int ratio, int64_t *j0, int64_t *j1) {
    int64_t start = f->seqs[s].st->n_tokens, end = start + f->seqs[s].n;
    *j0 = start / ratio; /* first group not yet emitted */
    *j1 = end / ratio;
}

/* RoPE of the n new entries (rows of width hd, positions epos): from the
 * step metadata's table of these entries where the backend has rope_cs. */
static void entries_rope(di_fwd *f, int block, float *x, int64_t n, int64_t hd,
                         const int32_t *epos) {
    di_backend *be = f->lm->be;
    int64_t rd = f->lm->cfg->rope_dim;
    if (f->meta && be->ops->rope_cs && f->m_cs_ent && f->m_cs_ent[block])
        be->ops->rope_cs(be, x, n, hd, 1, hd, rd, f->m_cs_ent[block], 0);
    else
        be->ops->rope(be, x, n, hd, 1, hd, rd, epos, f->lm->blocks[block].freq, 0);
}

di_status di_compressor(di_fwd *f, int block, const float *x, di_err *err) {
    const di_lm *lm = f->lm;
    const di_config *c = lm->cfg;
    const di_layer_role *r = &c->roles[block];
    const di_lm_block *lb = &lm->blocks[block];
    const di_w_attn *wa = &lm->w->blocks[block].attn;
    di_backend *be = lm->be;
    int ratio = r->ratio;
    int64_t m = f->m, dh = c->head_dim, di = c->index_head_dim;
    int64_t n_new = 0;
    for (int s = 0; s < f->n_seqs; s++) {
        int64_t j0, j1;
        new_groups(f, s, ratio, &j0, &j1);
        n_new += j1 - j0;
    }
    int keys = r->is_index_source && lb->idx_wk.w;
    /* writes into the sequences' rings and caches to the step metadata's slots */
    int scatter = f->meta && be->ops->scatter_rows_to;
    di_status st = DI_OK;
    float *a = NULL, *g = NULL, *ga = NULL, *gg = NULL;
    int64_t nb = n_new > 0 ? n_new : 1;
    size_t cb = di_kvq_row_bytes(DI_KVQ_FP4_E4M3, dh), kb = di_kvq_row_bytes(DI_KVQ_FP4_E8M0, di);
    float *lat = be->ops->alloc(be, (size_t)(nb * dh) * sizeof(float));
    float *key = be->ops->alloc(be, (size_t)(nb * di) * sizeof(float));
    uint8_t *latp = be->ops->alloc(be, (size_t)nb * cb), *keyp = be->ops->alloc(be, (size_t)nb * kb);
    int32_t *epos = malloc((size_t)(n_new + 1) * sizeof(int32_t));
    if (!lat || !key || !latp || !keyp || !epos) goto nomem;
    if (!lb->cmp_wkv.w || lb->cmp_wkv.n_out != dh || (ratio > 1 && lb->cmp_wgate.n_out != dh)) {
        st = di_err_set(err, DI_ERR_FORMAT, "compressor weights missing or not [head_dim, dim]");
        goto out;
    }
    if (ratio == 1) {
        /* one entry per token: latent = RMSNorm(x·Wkvᵀ), bf16 GEMM */
        be->ops->matmul(be, &lb->cmp_wkv, x, m, lat, DI_MM_OUT_BF16);
        for (int64_t i = 0; i < m; i++) epos[i] = f->pos[i];
    } else {
        a = be->ops->alloc(be, (size_t)(m * dh) * sizeof(float));
        g = be->ops->alloc(be, (size_t)(m * dh) * sizeof(float));
        ga = be->ops->alloc(be, (size_t)((n_new + 1) * ratio * dh) * sizeof(float));
        gg = be->ops->alloc(be, (size_t)((n_new + 1) * ratio * dh) * sizeof(float));
        if (!a || !g || !ga || !gg) goto nomem;
        di_fwd_matmul_pair(be, &lb->cmp_wkv, &lb->cmp_wgate, x, m, a, g, 0); /* fp32 projections */
        size_t rb = (size_t)dh * sizeof(float);
        const uint8_t *const *tok = scatter ? f->m_ctok + (int64_t)block * m : NULL;
        /* with the step metadata's ring slots of every group token (decode):
         * this chunk's rows into the per-token rings first, then the groups
         * from the rings, so no copy has a per-step address */
        int ring = scatter && be->ops->gather_rows_from && f->m_grp_base[block];
        if (ring) {
            be->ops->scatter_rows_to(be, a, rb, m, tok, f->m_tslot, 0, 2 * rb, rb);
            be->ops->scatter_rows_to(be, g, rb, m, tok, f->m_tslot, rb, 2 * rb, rb);
            be->ops->gather_rows_from(be, ga, rb, n_new * ratio, f->m_grp_base[block],
                                      f->m_grp_slot[block], 0, 2 * rb, rb);
            be->ops->gather_rows_from(be, gg, rb, n_new * ratio, f->m_grp_base[block],
                                      f->m_grp_slot[block], rb, 2 * rb, rb);
        }
        int64_t e = 0;
        copy_run run_a = {be, NULL, NULL, 0}, run_g = {be, NULL, NULL, 0};
        for (int s = 0; s < f->n_seqs; s++) {
            di_seqstate *sq = f->seqs[s].st;
            int64_t j0, j1, start = sq->n_tokens, r0 = f->row0[s];
            new_groups(f, s, ratio, &j0, &j1);
            for (int64_t j = j0; j < j1; j++, e++) {
                for (int t = 0; t < ratio && !ring; t++) {
                    int64_t p = j * ratio + t;
                    const float *sa, *sg;
                    if (p >= start) {
                        sa = a + (r0 + p - start) * dh;
                        sg = g + (r0 + p - start) * dh;
                    } else { /* earlier chunk: from the per-token ring */
                        sa = sq->ctok[block] + ((p % sq->tok_cap) * 2) * dh;
                        sg = sa + dh;
                    }
                    run_add(&run_a, ga + (e * ratio + t) * dh, sa, (size_t)dh * 4);
                    run_add(&run_g, gg + (e * ratio + t) * dh, sg, (size_t)dh * 4);
                }
                epos[e] = (int32_t)(j * ratio);
            }
            /* the groups' reads of the ring happen before it is written below */
            run_flush(&run_a);
            run_flush(&run_g);
            /* keep this chunk's last projections for groups that finish later */
            int64_t n = f->seqs[s].n, first = n > sq->tok_cap ? n - sq->tok_cap : 0;
            if (scatter) continue; /* below, for every sequence at once */
            for (int64_t i = first; i < n; i++) {
                float *dst = sq->ctok[block] + (((start + i) % sq->tok_cap) * 2) * dh;
                be->ops->copy(be, dst, a + (r0 + i) * dh, (size_t)dh * 4);
                be->ops->copy(be, dst + dh, g + (r0 + i) * dh, (size_t)dh * 4);
            }
        }
        if (scatter && !ring) { /* after the groups' reads of the rings */
            be->ops->scatter_rows_to(be, a, rb, m, tok, f->m_tslot, 0, 2 * rb, rb);
            be->ops->scatter_rows_to(be, g, rb, m, tok, f->m_tslot, rb, 2 * rb, rb);
        }
        if (n_new > 0) be->ops->compress_pool(be, ga, gg, n_new, ratio, dh, lat);
    }
    if (n_new == 0) goto out;
    be->ops->rmsnorm(be, lat, &wa->cmp_norm, n_new, dh, c->eps, lat);
    /* index keys from the RoPE-free latent, at the group's first position */
    if (keys) {
        if (lb->idx_wk.n_in != dh || lb->idx_wk.n_out != di) {
            st = di_err_set(err, DI_ERR_FORMAT, "indexer.wk is not [index_head_dim, head_dim]");
            goto out;
        }
        be->ops->matmul(be, &lb->idx_wk, lat, n_new, key, DI_MM_OUT_BF16);
        be->ops->rmsnorm(be, key, &wa->idx_k_norm, n_new, di, c->eps, key);
        entries_rope(f, block, key, n_new, di, epos);
        be->ops->kv_pack(be, DI_KVQ_FP4_E8M0, key, n_new, di, keyp);
    }
    entries_rope(f, block, lat, n_new, dh, epos);
    be->ops->kv_pack(be, DI_KVQ_FP4_E4M3, lat, n_new, dh, latp);
    /* append to each sequence's caches */
    if (scatter) {
        be->ops->scatter_rows_to(be, latp, cb, n_new, f->m_ent_ckv[block], f->m_ent_slot[block], 0,
                                 cb, cb);
        if (keys)
            be->ops->scatter_rows_to(be, keyp, kb, n_new, f->m_ent_ikey[block],
                                     f->m_ent_slot[block], 0, kb, kb);
        goto out;
    }
    int64_t e = 0;
    for (int s = 0; s < f->n_seqs; s++) {
        di_seqstate *sq = f->seqs[s].st;
        int64_t j0, j1;
        new_groups(f, s, ratio, &j0, &j1);
        copy_run run_c = {be, NULL, NULL, 0}, run_k = {be, NULL, NULL, 0};
        for (int64_t j = j0; j < j1; j++, e++) {
            run_add(&run_c, sq->ckv[block] + (size_t)j * cb, latp + (size_t)e * cb, cb);
            if (keys) run_add(&run_k, sq->ikey[block] + (size_t)j * kb, keyp + (size_t)e * kb, kb);
        }
        run_flush(&run_c);
        run_flush(&run_k);
    }
    goto out;
nomem:
    st = di_err_set(err, DI_ERR_NOMEM, "compressor: out of memory");
out:
    be->ops->free(be, lat);
    be->ops->free(be, key);
    be->ops->free(be, latp);
    be->ops->free(be, keyp);
    be->ops->free(be, a);
    be->ops->free(be, g);
    be->ops->free(be, ga);
    be->ops->free(be, gg);
    free(epos);
    return st;
}
