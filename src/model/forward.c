/* The V4.1 forward pass, top level (architecture.md §3, §4): Engram hashes,
 * embedding, the blocks with single-pass mHC, the final collapse, norm and
 * fp32 head, and the DSpark ring update. See forward.h. */
#include "model/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/rope_angles.h"
#include "model/mhc.h"

static void fwd_release(di_fwd *f);

/* The backend has every backend-memory form of the selection path. */
static int has_buf_forms(const di_backend_ops *o) {
    return o->index_scores_kv_buf && o->candidate_blocks_buf && o->restrict_blocks_buf &&
           o->topk_select_buf && o->sparse_attn_rows;
}

/* The score width of a pass with the step metadata: the widest row's
 * visible entries rounded up to c·2^k, c in {4, 5, 6, 7}, at least 64, so
 * decode steps keep one width (one launch shape) for many tokens; the
 * padding costs at most a quarter more. Scores past a row's visible count
 * are -inf, which neither the candidate blocks (unreachable blocks are
 * dropped) nor top-k pick, so the bits are those of the exact width. */
int64_t di_fwd_width_bucket(int64_t w) {
    if (w <= 64) return 64;
    int64_t u = 1;
    while (8 * u <= w) u *= 2; /* 4u <= w < 8u */
    int64_t c = 4;
    while (c * u < w) c++;
    return c * u;
}

/* FNV-1a over the 64-bit words of a step's shape. */
static void key_add(uint64_t *h, int64_t v) {
    for (int i = 0; i < 8; i++) {
        *h ^= (uint64_t)(v >> (8 * i)) & 0xffu;
        *h *= 0x100000001b3ull;
    }
}

/* Positions of the compressed entries block b's compressor completes in
 * this pass (ratio 1: every row's; else each group's first token), in the
 * order di_compressor makes them, and each one's sequence; returns how
 * many (pos, seq may be NULL). */
static int64_t entry_positions(const di_fwd *f, int b, int32_t *pos, int32_t *seq) {
    int ratio = f->lm->cfg->roles[b].ratio;
    int64_t n = 0;
    for (int s = 0; s < f->n_seqs; s++) {
        int64_t start = f->seqs[s].st->n_tokens, end = start + f->seqs[s].n;
        int64_t j0 = ratio == 1 ? start : start / ratio, j1 = ratio == 1 ? end : end / ratio;
        for (int64_t j = j0; j < j1; j++, n++) {
            if (pos) pos[n] = (int32_t)(j * ratio);
            if (seq) seq[n] = s;
        }
    }
    return n;
}

/* The RoPE tables of the pass: one per distinct (frequencies, position
 * set); blocks of one kind share theirs. kind 0: the rows' positions,
 * kind r > 1: entries of ratio r (ratio 1's entries are the rows). */
typedef struct cs_tab {
    const float *freq; /* a block's table with these values */
    int kind;
    int64_t n;         /* positions */
    size_t off;        /* floats from the first table */
} cs_tab;

static int cs_find(cs_tab *t, int *nt, const float *freq, int64_t half, int kind, int64_t n) {
    for (int i = 0; i < *nt; i++)
        if (t[i].kind == kind && !memcmp(t[i].freq, freq, (size_t)half * sizeof(float))) return i;
    size_t off = *nt ? t[*nt - 1].off + (size_t)(t[*nt - 1].n * half * 2) : 0;
    t[*nt] = (cs_tab){freq, kind, n, off};
    return (*nt)++;
}

/* Builds the step metadata on the host (layout: the three pointer tables,
 * then the window codes, the visible counts, the token ids, the head's
 * rows, the embedding's one-hot pre and the RoPE tables) and, with the
 * backend-memory forms, uploads it in one piece. */
static int fwd_meta(di_fwd *f) {
    const di_lm *lm = f->lm;
    const di_config *c = lm->cfg;
    di_backend *be = lm->be;
    int64_t m = f->m, nb = c->n_blocks, W = c->window, half = c->rope_dim / 2;
    int hc = c->hc_mult;
    /* RoPE tables: [n_blocks] row tables and entry tables, deduplicated */
    cs_tab *tabs = calloc((size_t)(2 * nb + 1), sizeof *tabs);
    int *row_tab = malloc((size_t)(2 * nb + 1) * sizeof(int)), *ent_tab = row_tab + nb, nt = 0;
    f->m_cs = calloc((size_t)(2 * nb + 1), sizeof(float *));
    f->m_eng_rows = calloc((size_t)(2 * nb + 1), sizeof(uint8_t *));
    f->m_ent_ckv = calloc((size_t)(3 * nb + 1), sizeof(uint8_t *const *));
    f->m_ent_slot = calloc((size_t)(2 * nb + 1), sizeof(int32_t *));
    if (!tabs || !row_tab || !f->m_cs || !f->m_ent_ckv || !f->m_ent_slot || !f->m_eng_rows) {
        free(tabs);
        free(row_tab);
        return -1;
    }
    f->m_cs_ent = f->m_cs + nb;
    f->m_ent_ikey = f->m_ent_ckv + nb;
    f->m_grp_base = f->m_ent_ckv + 2 * nb;
    f->m_grp_slot = f->m_ent_slot + nb;
    f->m_eng_scales = f->m_eng_rows + nb;
    for (int64_t b = 0; b < nb; b++) {
        const float *fq = lm->blocks[b].freq;
        const di_layer_role *r = &c->roles[b];
        row_tab[b] = ent_tab[b] = -1;
        if (!fq || half <= 0) continue;
        row_tab[b] = cs_find(tabs, &nt, fq, half, 0, m);
        if (r->ratio > 0 && r->owns_compressor && b < c->n_layers)
            ent_tab[b] = r->ratio == 1 ? row_tab[b]
                                       : cs_find(tabs, &nt, fq, half, r->ratio, entry_positions(f, (int)b, NULL, NULL));
    }
    /* compressed entries this pass appends, per compressor: n_ent[b] */
    int64_t *n_ent = calloc((size_t)nb + 1, sizeof *n_ent), e_tot = 0;
    if (!n_ent) {
        free(tabs);
        free(row_tab);
        return -1;
    }
    int64_t g_tot = 0; /* tokens of the groups ratio > 1 compressors complete */
    for (int64_t b = 0; b < c->n_layers; b++)
        if (c->roles[b].ratio > 0 && c->roles[b].owns_compressor) {
            e_tot += n_ent[b] = entry_positions(f, (int)b, NULL, NULL);
            if (c->roles[b].ratio > 1) g_tot += n_ent[b] * c->roles[b].ratio;
        }
    int64_t nmtp = lm->has_dspark ? c->n_mtp : 0;
    /* Engram: the rows this pass looks up, gathered from the host table
     * (engram_rows), within a budget (a long prefill gathers per layer) */
    int ncols = (c->engram_max_ngram - 1) * c->engram_n_heads;
    int64_t eh = c->engram_head_dim, enb = (c->engram_head_dim + 31) / 32, n_eng = 0;
    for (int64_t b = 0; b < c->n_layers; b++)
        if (c->roles[b].engram >= 0) {
            const di_w_engram *w = &lm->w->blocks[b].engram;
            n_eng++;
            if (w->embed.shape[1] != eh || w->embed_scale.shape[1] != enb) ncols = 0; /* host form */
        }
    size_t eng_bytes = (size_t)(n_eng * m * ncols * (eh + enb));
    if (!be->ops->engram_rows || c->n_engram <= 0 || eng_bytes > ((size_t)16 << 20)) eng_bytes = 0;
    size_t n_cs = nt ? tabs[nt - 1].off + (size_t)(tabs[nt - 1].n * half * 2) : 0;
    size_t n_ptr = (size_t)(4 * nb * m + nmtp * m + 2 * e_tot + g_tot),
           n_i32 = (size_t)(m * W + nb * m + m + f->n_seqs + m + 2 * m + e_tot + g_tot) +
                   (size_t)(2 * m * hc) + n_cs;
    size_t bytes = n_ptr * sizeof(void *) + n_i32 * sizeof(int32_t) + eng_bytes;
    /* the step's shape: rows per sequence, the metadata's layout, the
     * compressors' new entries and group paths, the score widths */
    uint64_t key = 0xcbf29ce484222325ull;
    key_add(&key, m);
    key_add(&key, f->n_seqs);
    for (int s = 0; s < f->n_seqs; s++) key_add(&key, f->seqs[s].n);
    key_add(&key, (int64_t)bytes);
    for (int64_t b = 0; b < nb; b++) {
        const di_layer_role *r = &c->roles[b];
        key_add(&key, n_ent[b]);
        if (r->is_index_source && r->kv_src >= 0) {
            int64_t w = 0;
            for (int64_t i = 0; i < m; i++)
                if ((f->pos[i] + 1) / c->roles[r->kv_src].ratio > w) w = (f->pos[i] + 1) / c->roles[r->kv_src].ratio;
            key_add(&key, di_fwd_width_bucket(w));
        }
    }
    uint8_t *h = calloc(1, bytes);
    int32_t *epos = malloc((size_t)(2 * m + 2) * sizeof(int32_t)), *eseq = epos + m + 1;
    if (!h || !epos) {
        free(h);
        free(epos);
        free(tabs);
        free(row_tab);
        free(n_ent);
        return -1;
    }
    f->meta_host = h;
    f->meta_bytes = bytes;
    f->step_key = key;
    const uint8_t **ring = (const uint8_t **)(void *)h, **ckv = ring + nb * m, **ikey = ckv + nb * m;
    const uint8_t **ctok = ikey + nb * m, **dsring = ctok + nb * m, **eckv = dsring + nmtp * m,
                  **eikey = eckv + e_tot, **gbase = eikey + e_tot;
    int32_t *win = (int32_t *)(void *)(gbase + g_tot), *nvis = win + m * W;
    int32_t *ids = nvis + nb * m, *last = ids + m, *all = last + f->n_seqs;
    int32_t *wslot = all + m, *tslot = wslot + m, *eslot = tslot + m, *gslot = eslot + e_tot;
    float *onehot = (float *)(void *)(gslot + g_tot);
    int32_t *spread = (int32_t *)(void *)(onehot + m * hc);
    float *cs = (float *)(void *)(spread + m * hc);
    /* ratio > 1: whether every group token is in the per-token ring once
     * this chunk's rows are written (always at decode; not when a long
     * chunk completes groups older than the ring holds) */
    int *grp_ok = calloc((size_t)nb + 1, sizeof(int));
    if (!grp_ok) {
        free(epos);
        free(tabs);
        free(row_tab);
        free(n_ent);
        return -1;
    }
    for (int64_t i = 0; i < m; i++) {
        const di_seqstate *st = f->seqs[f->seq[i]].st;
        int64_t t = f->pos[i], start = st->n_tokens, r0 = f->row0[f->seq[i]];
        int64_t p0 = t - W + 1 > 0 ? t - W + 1 : 0;
        for (int64_t j = 0; j < W; j++) { /* the slots of attention.c's build_rows */
            int64_t p = p0 + j;
            win[i * W + j] = p > t       ? -1
                             : p >= start ? (int32_t)(-2 - (r0 + p - start))
                                          : (int32_t)(p % st->ring_cap);
        }
        for (int64_t b = 0; b < nb; b++) {
            const di_layer_role *r = &c->roles[b];
            if (b < c->n_layers) ring[b * m + i] = st->win[b];
            if (r->ratio > 0 && r->kv_src >= 0) {
                ckv[b * m + i] = st->ckv[r->kv_src];
                ikey[b * m + i] = st->ikey[r->kv_src];
                /* entries whose group the query has passed */
                nvis[b * m + i] = (int32_t)((t + 1) / c->roles[r->kv_src].ratio);
            }
        }
        for (int64_t b = 0; b < nb; b++)
            if (c->roles[b].ratio > 1 && c->roles[b].owns_compressor && b < c->n_layers)
                ctok[b * m + i] = (const uint8_t *)st->ctok[b];
        for (int64_t k = 0; k < nmtp; k++) dsring[k * m + i] = st->dsring[k];
        /* ring slots of the row's own position; -1 where a chunk longer
         * than the ring leaves the row out (attention.c, compressor.c) */
        int64_t n = f->seqs[f->seq[i]].n, k = t - start;
        wslot[i] = k >= n - st->ring_cap ? (int32_t)(t % st->ring_cap) : -1;
        tslot[i] = k >= n - st->tok_cap ? (int32_t)(t % st->tok_cap) : -1;
        ids[i] = f->ids[i];
        all[i] = (int32_t)i;
        onehot[i * hc] = 1.f;
        for (int k = 0; k < hc; k++) spread[i * hc + k] = (int32_t)i;
    }
    /* each compressor's new entries: the sequence's caches and the entry
     * index; ratio > 1: each group token's ring slot */
    int64_t eo = 0, go = 0;
    for (int64_t b = 0; b < c->n_layers; b++) {
        if (!(c->roles[b].ratio > 0 && c->roles[b].owns_compressor)) continue;
        int ratio = c->roles[b].ratio;
        entry_positions(f, (int)b, epos, eseq);
        grp_ok[b] = ratio > 1; /* (part of the key: which path the groups take) */
        for (int64_t e = 0; e < n_ent[b]; e++) {
            const di_seqstate *st = f->seqs[eseq[e]].st;
            eckv[eo + e] = st->ckv[b];
            eikey[eo + e] = st->ikey[b];
            eslot[eo + e] = epos[e] / ratio;
            int64_t end = st->n_tokens + f->seqs[eseq[e]].n;
            for (int t = 0; ratio > 1 && t < ratio; t++) {
                int64_t p = epos[e] + t;
                if (p < end - st->tok_cap) grp_ok[b] = 0;
                gbase[go + e * ratio + t] = (const uint8_t *)st->ctok[b];
                gslot[go + e * ratio + t] = (int32_t)(p % st->tok_cap);
            }
        }
        eo += n_ent[b];
        if (ratio > 1) go += n_ent[b] * ratio;
    }
    for (int64_t b = 0; b < nb; b++) key_add(&f->step_key, grp_ok[b]);
    for (int s = 0; s < f->n_seqs; s++) last[s] = (int32_t)(f->row0[s] + f->seqs[s].n - 1);
    for (int i = 0; i < nt; i++) {
        const int32_t *pos = f->pos;
        if (tabs[i].kind > 1) { /* any block of this ratio has these entries */
            int64_t b = 0;
            while (ent_tab[b] != i) b++;
            entry_positions(f, (int)b, epos, NULL);
            pos = epos;
        }
        di_rope_angles(pos, tabs[i].n, tabs[i].freq, half, cs + tabs[i].off);
    }
    free(epos);
    uint8_t *eng = (uint8_t *)(cs + n_cs);
    for (int64_t b = 0, o = 0; eng_bytes && b < c->n_layers; b++) {
        int e = c->roles[b].engram;
        if (e < 0) continue;
        const di_w_engram *w = &lm->w->blocks[b].engram;
        const uint8_t *tr = w->embed.data, *ts = w->embed_scale.data;
        int64_t n = m * ncols, tnb = w->embed_scale.shape[1];
        uint8_t *rows = eng + o, *sc = rows + n * eh;
        for (int64_t i = 0; i < m; i++)
            for (int k = 0; k < ncols; k++) {
                int64_t row = f->hash[(i * c->n_engram + e) * ncols + k], q = i * ncols + k;
                memcpy(rows + q * eh, tr + row * eh, (size_t)eh);
                memcpy(sc + q * enb, ts + row * tnb, (size_t)enb);
            }
        o += n * (eh + enb);
    }
    if (has_buf_forms(be->ops)) {
        if (!(f->meta = be->ops->alloc(be, bytes))) {
            free(tabs);
            free(row_tab);
            free(n_ent);
            free(grp_ok);
            return -1;
        }
        be->ops->upload(be, f->meta, h, bytes);
        h = f->meta;
    }
    f->m_ring = (const uint8_t *const *)(void *)h;
    f->m_ckv = f->m_ring + nb * m;
    f->m_ikey = f->m_ckv + nb * m;
    f->m_ctok = f->m_ikey + nb * m;
    f->m_dsring = f->m_ctok + nb * m;
    const uint8_t *const *me_ckv = f->m_dsring + nmtp * m, *const *me_ikey = me_ckv + e_tot,
                         *const *mg_base = me_ikey + e_tot;
    f->m_win = (const int32_t *)(const void *)(mg_base + g_tot);
    f->m_nvis = f->m_win + m * W;
    f->m_ids = f->m_nvis + nb * m;
    f->m_rows_last = f->m_ids + m;
    f->m_rows_all = f->m_rows_last + f->n_seqs;
    f->m_wslot = f->m_rows_all + m;
    f->m_tslot = f->m_wslot + m;
    const int32_t *me_slot = f->m_tslot + m, *mg_slot = me_slot + e_tot;
    f->m_onehot = (const float *)(const void *)(mg_slot + g_tot);
    f->m_spread = (const int32_t *)(const void *)(f->m_onehot + m * hc);
    const float *mcs = (const float *)(const void *)(f->m_spread + m * hc);
    const uint8_t *meng = (const uint8_t *)(mcs + n_cs);
    for (int64_t b = 0, o = 0; eng_bytes && b < c->n_layers; b++)
        if (c->roles[b].engram >= 0) {
            f->m_eng_rows[b] = meng + o;
            f->m_eng_scales[b] = meng + o + m * ncols * eh;
            o += m * ncols * (eh + enb);
        }
    eo = go = 0;
    for (int64_t b = 0; b < nb; b++) {
        f->m_cs[b] = row_tab[b] >= 0 ? mcs + tabs[row_tab[b]].off : NULL;
        f->m_cs_ent[b] = ent_tab[b] >= 0 ? mcs + tabs[ent_tab[b]].off : NULL;
        f->m_ent_ckv[b] = me_ckv + eo;
        f->m_ent_ikey[b] = me_ikey + eo;
        f->m_ent_slot[b] = me_slot + eo;
        f->m_grp_base[b] = grp_ok[b] ? mg_base + go : NULL;
        f->m_grp_slot[b] = grp_ok[b] ? mg_slot + go : NULL;
        eo += n_ent[b];
        if (c->roles[b].ratio > 1 && c->roles[b].owns_compressor && b < c->n_layers)
            go += n_ent[b] * c->roles[b].ratio;
    }
    free(tabs);
    free(row_tab);
    free(n_ent);
    free(grp_ok);
    return 0;
}

/* Points the step metadata's tables at another backend copy of the block
 * (a recording's own buffer) and frees the one fwd_meta uploaded. */
static void meta_move(di_fwd *f, void *to) {
    const char *from = f->meta;
    char *t = to;
    int64_t nb = f->lm->cfg->n_blocks;
#define MV(p)                                                      \
    do {                                                           \
        if (p) (p) = (void *)(t + ((const char *)(p) - from));     \
    } while (0)
    MV(f->m_ring);
    MV(f->m_ckv);
    MV(f->m_ikey);
    MV(f->m_win);
    MV(f->m_nvis);
    MV(f->m_ids);
    MV(f->m_rows_last);
    MV(f->m_rows_all);
    MV(f->m_onehot);
    MV(f->m_spread);
    MV(f->m_ctok);
    MV(f->m_dsring);
    MV(f->m_wslot);
    MV(f->m_tslot);
    for (int64_t b = 0; b < nb; b++) {
        MV(f->m_cs[b]);
        MV(f->m_cs_ent[b]);
        MV(f->m_ent_ckv[b]);
        MV(f->m_ent_ikey[b]);
        MV(f->m_ent_slot[b]);
        MV(f->m_grp_base[b]);
        MV(f->m_grp_slot[b]);
        MV(f->m_eng_rows[b]);
        MV(f->m_eng_scales[b]);
    }
#undef MV
    f->lm->be->ops->free(f->lm->be, f->meta);
    f->meta = to;
}

/* RoPE of m rows of x at the pass's row positions with block b's
 * frequencies: from the step metadata's table where the backend has
 * rope_cs (no host array per call), else from the positions. */
const float *di_fwd_rope_cs(const di_fwd *f, int block, const int32_t *pos) {
    if (f->meta && f->lm->be->ops->rope_cs && f->m_cs && f->m_cs[block] && pos == f->pos)
        return f->m_cs[block];
    return NULL;
}

void di_fwd_rope(di_fwd *f, int block, float *x, int64_t m, int64_t stride, int heads,
                 int64_t hd, const int32_t *pos, int inverse) {
    di_backend *be = f->lm->be;
    int64_t rd = f->lm->cfg->rope_dim;
    const float *cs = di_fwd_rope_cs(f, block, pos);
    if (cs)
        be->ops->rope_cs(be, x, m, stride, heads, hd, rd, cs, inverse);
    else
        be->ops->rope(be, x, m, stride, heads, hd, rd, pos, f->lm->blocks[block].freq, inverse);
}

void di_fwd_matmul_pair(di_backend *be, const di_wmat *wa, const di_wmat *wb, const float *x, int64_t m,
                        float *ya, float *yb, unsigned flags) {
    if (be->ops->matmul_pair && wa->fmt == wb->fmt && wa->n_in == wb->n_in) {
        be->ops->matmul_pair(be, wa, wb, x, m, ya, yb, flags);
        return;
    }
    be->ops->matmul(be, wa, x, m, ya, flags);
    be->ops->matmul(be, wb, x, m, yb, flags);
}

di_status di_fwd_begin(di_fwd *f, const di_lm *lm, const di_fwd_seq *seqs, int n_seqs,
                       di_err *err) {
    memset(f, 0, sizeof *f);
    const di_config *c = lm->cfg;
    f->lm = lm;
    f->seqs = seqs;
    f->n_seqs = n_seqs;
    f->dspark_p = -1;
    if (n_seqs < 1) return di_err_set(err, DI_ERR_INVALID_ARG, "forward: no sequence");
    if (!lm->be->ops->kv_pack || !lm->be->ops->sparse_attn_kv || !lm->be->ops->index_scores_kv)
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "forward: backend %s has no packed-cache ops (kv_pack, sparse_attn_kv, index_scores_kv)",
                          lm->be->ops->name);
    int64_t m = 0;
    for (int s = 0; s < n_seqs; s++) {
        const di_fwd_seq *q = &seqs[s];
        if (!q->st || q->st->lm != lm || q->n < 1 || !q->ids)
            return di_err_set(err, DI_ERR_INVALID_ARG, "forward: sequence %d has no state or no tokens", s);
        if (q->st->n_tokens + q->n > q->st->max_tokens)
            return di_err_set(err, DI_ERR_LIMIT, "forward: sequence %d would reach %lld tokens, capacity %lld",
                              s, (long long)(q->st->n_tokens + q->n), (long long)q->st->max_tokens);
        for (int64_t i = 0; i < q->n; i++)
            if (q->ids[i] < 0 || q->ids[i] >= c->vocab_size)
                return di_err_set(err, DI_ERR_INVALID_ARG, "forward: sequence %d token %lld: id %d outside [0, %lld)",
                                  s, (long long)i, q->ids[i], (long long)c->vocab_size);
        for (int t = 0; t < s; t++)
            if (seqs[t].st == q->st)
                return di_err_set(err, DI_ERR_INVALID_ARG, "forward: sequence state given twice (%d and %d)", t, s);
        m += q->n;
    }
    f->m = m;
    int ncols = (c->engram_max_ngram - 1) * c->engram_n_heads;
    f->pos = malloc((size_t)m * sizeof(int32_t));
    f->seq = malloc((size_t)m * sizeof(int32_t));
    f->ids = malloc((size_t)m * sizeof(int32_t));
    f->row0 = malloc((size_t)n_seqs * sizeof(int64_t));
    f->sel = calloc((size_t)c->n_blocks, sizeof(int32_t *));
    if (c->n_engram > 0) f->hash = malloc((size_t)(m * c->n_engram * ncols) * sizeof(int32_t));
    if (c->n_dspark_taps > 0)
        f->taps = lm->be->ops->alloc(lm->be, (size_t)(m * c->n_dspark_taps * c->dim) * sizeof(float));
    if (!f->pos || !f->seq || !f->ids || !f->row0 || !f->sel || (c->n_engram > 0 && !f->hash) ||
        (c->n_dspark_taps > 0 && !f->taps)) {
        di_fwd_end(f);
        return di_err_set(err, DI_ERR_NOMEM, "forward of %lld rows: out of memory", (long long)m);
    }
    int64_t r = 0;
    for (int s = 0; s < n_seqs; s++) {
        f->row0[s] = r;
        for (int64_t i = 0; i < seqs[s].n; i++, r++) {
            f->pos[r] = (int32_t)(seqs[s].st->n_tokens + i);
            f->seq[r] = s;
            f->ids[r] = seqs[s].ids[i];
        }
        if (c->n_engram > 0)
            di_engram_hash(lm, seqs[s].st, seqs[s].ids, seqs[s].n, seqs[s].st->n_tokens,
                           f->hash + f->row0[s] * c->n_engram * ncols);
    }
    if (fwd_meta(f)) {
        fwd_release(f);
        return di_err_set(err, DI_ERR_NOMEM, "forward of %lld rows: out of memory for the step metadata",
                          (long long)m);
    }
    return DI_OK;
}

static void fwd_release(di_fwd *f) {
    di_backend *be = f->lm->be;
    if (f->sel)
        for (int b = 0; b < f->lm->cfg->n_blocks; b++) {
            if (f->meta) be->ops->free(be, f->sel[b]);
            else free(f->sel[b]);
        }
    if (f->taps) be->ops->free(be, f->taps);
    if (f->meta) {
        be->ops->free(be, f->cand);
        be->ops->free(be, f->meta);
    } else {
        free(f->cand);
    }
    free(f->meta_host);
    free(f->m_cs);
    free(f->m_ent_ckv);
    free(f->m_ent_slot);
    free(f->m_eng_rows);
    free(f->pos);
    free(f->seq);
    free(f->ids);
    free(f->row0);
    free(f->sel);
    free(f->hash);
    memset(f, 0, sizeof *f);
}

void di_fwd_abort(di_fwd *f) {
    if (f->lm) fwd_release(f);
}

void di_fwd_end(di_fwd *f) {
    if (!f->lm) return;
    if (f->pos)
        for (int s = 0; s < f->n_seqs; s++) {
            di_seqstate *st = f->seqs[s].st;
            if (f->lm->cfg->n_engram > 0)
                di_engram_record(f->lm, st, f->seqs[s].ids, f->seqs[s].n, st->n_tokens);
            st->n_tokens += f->seqs[s].n;
        }
    fwd_release(f);
}

di_status di_fwd_block(di_fwd *f, int block, float *s, float *pre, di_err *err) {
    const di_lm *lm = f->lm;
    const di_config *c = lm->cfg;
    di_backend *be = lm->be;
    const di_w_block *wb = &lm->w->blocks[block];
    int64_t m = f->m, d = c->dim;
    int hc = c->hc_mult;
    di_status st = DI_OK;
    /* each written whole by its first op (the mHC site, the sublayer) */
    float *x = di_alloc_raw(be, (size_t)(m * d) * sizeof(float));
    float *y = di_alloc_raw(be, (size_t)(m * d) * sizeof(float));
    float *pre_a = di_alloc_raw(be, (size_t)(m * hc) * sizeof(float));
    float *post = di_alloc_raw(be, (size_t)(m * hc) * sizeof(float));
    float *comb = di_alloc_raw(be, (size_t)(m * hc * hc) * sizeof(float));
    if (!x || !y || !pre_a || !post || !comb) {
        st = di_err_set(err, DI_ERR_NOMEM, "block %d: out of memory", block);
        goto out;
    }
    /* attention site: collapse with the previous site's pre */
    if ((st = di_mhc_site(f, &wb->hc_attn, &wb->attn_norm, s, pre, pre_a, post, comb, x, err)))
        goto out;
    if ((st = di_attention(f, block, x, y, err))) goto out;
    if (f->trace && f->trace->attn_out) be->ops->download(be, f->trace->attn_out, y, (size_t)(m * d) * 4);
    be->ops->hc_expand(be, y, s, post, comb, m, hc, d, s);
    /* FFN site: collapse with the attention site's pre; its own pre goes out */
    if ((st = di_mhc_site(f, &wb->hc_ffn, &wb->ffn_norm, s, pre_a, pre, post, comb, x, err)))
        goto out;
    if ((st = di_moe(f, block, x, y, err))) goto out;
    if (f->trace && f->trace->ffn_out) be->ops->download(be, f->trace->ffn_out, y, (size_t)(m * d) * 4);
    be->ops->hc_expand(be, y, s, post, comb, m, hc, d, s);
out:
    if (st) di_err_prefix(err, "block %d: ", block);
    be->ops->free(be, x);
    be->ops->free(be, y);
    be->ops->free(be, pre_a);
    be->ops->free(be, post);
    be->ops->free(be, comb);
    return st;
}

/* s [m, HC, D] = HC copies of the embedding, pre = one-hot(copy 0). The
 * copies are one row gather from the [m, D] embedding (the row table in the
 * step metadata where there is one, so a step has no per-row host array):
 * row by row they were m · HC backend calls (32,768 at an 8K-token prefill,
 * each a queued copy on a device). Without the gather, or without room for
 * the embedding apart, the rows are spread in place, row by row (the same
 * bytes). */
di_status di_fwd_embed(di_fwd *f, const int32_t *ids, float *s, float *pre) {
    const di_config *c = f->lm->cfg;
    di_backend *be = f->lm->be;
    int64_t m = f->m, d = c->dim;
    int hc = c->hc_mult;
    /* with metadata only the table form (no per-row host array in a step) */
    const int gather = hc > 1 && (f->meta ? be->ops->gather_rows_buf != NULL : be->ops->gather_rows != NULL);
    float *emb = gather ? be->ops->alloc(be, (size_t)(m * d) * sizeof(float)) : NULL;
    int32_t *rows = emb && !f->meta ? malloc((size_t)(m * hc) * sizeof(int32_t)) : NULL;
    float *dst = emb && (f->meta || rows) ? emb : s;
    if (f->meta && ids == f->ids && be->ops->embed_buf)
        be->ops->embed_buf(be, &f->lm->w->embed, f->m_ids, m, dst);
    else
        be->ops->embed(be, &f->lm->w->embed, ids, m, dst);
    if (dst != s && f->meta) {
        be->ops->gather_rows_buf(be, emb, f->m_spread, m * hc, d, s);
    } else if (dst != s) {
        for (int64_t r = 0; r < m * hc; r++) rows[r] = (int32_t)(r / hc);
        be->ops->gather_rows(be, emb, rows, m * hc, d, s);
    } else {
        /* spread row i to copies, back to front so the source row survives */
        for (int64_t i = m - 1; i >= 0; i--)
            for (int k = hc - 1; k >= 0; k--)
                be->ops->copy(be, s + (i * hc + k) * d, s + i * d, (size_t)d * sizeof(float));
    }
    free(rows);
    if (emb) be->ops->free(be, emb);
    if (f->meta) { /* the one-hot rows are in the step metadata */
        be->ops->copy(be, pre, f->m_onehot, (size_t)(m * hc) * sizeof(float));
        return DI_OK;
    }
    float *oh = calloc((size_t)(m * hc), sizeof(float));
    if (!oh) return DI_ERR_NOMEM;
    for (int64_t i = 0; i < m; i++) oh[i * hc] = 1.f;
    be->ops->upload(be, pre, oh, (size_t)(m * hc) * sizeof(float));
    free(oh);
    return DI_OK;
}

/* The head's rows lg [n, V] (backend memory) to the caller: all of them to
 * logits, or (f->out) each sequence's last row as its want says: runs of
 * logits rows in one download each, runs of greedy rows summarised by the
 * backend and only the summaries downloaded, the rest left where they are;
 * with out->all_rows also the target rows' summaries, values and top
 * lists (rows_to_host). Sequence q's last row is lg's row f->out_row[q]. */
static void rows_to_host(const di_fwd *f, const float *lg, int64_t n);
static void logits_to_host(const di_fwd *f, float *logits, const float *lg, int64_t n) {
    di_backend *be = f->lm->be;
    const int64_t V = f->lm->cfg->vocab_size;
    const di_fwd_out *o = f->out;
    if (!o) {
        be->ops->download(be, logits, lg, (size_t)(n * V) * sizeof(float));
        return;
    }
    if (o->all_rows) rows_to_host(f, lg, n);
    /* the delivered sequences in order and their rows: a run is consecutive
     * sequences of one mode on consecutive rows */
    int64_t nd = 0;
    for (int q = 0; q < f->n_seqs; q++)
        if (o->want[q].mode != DI_ROW_NONE && f->out_row[q] >= 0) f->out_seq[nd++] = q;
    const int32_t *seq_at = f->out_seq;
    for (int64_t x = 0, y; x < nd; x = y) {
        const int64_t i = seq_at[x], k = f->out_row[i];
        const int32_t mode = o->want[i].mode;
        for (y = x + 1; y < nd && seq_at[y] == i + (y - x) && f->out_row[seq_at[y]] == k + (y - x) &&
                        o->want[seq_at[y]].mode == mode;
             y++) {
        }
        const int64_t j = k + (y - x); /* lg rows [k, j) are sequences [i, i + j - k) */
        if (mode == DI_ROW_LOGITS) {
            be->ops->download(be, logits + i * V, lg + k * V, (size_t)((j - k) * V) * sizeof(float));
        } else if (mode == DI_ROW_GREEDY) {
            be->ops->logits_greedy(be, lg + k * V, j - k, V, o->lim, f->out_ban + i, f->out_dev + i);
            be->ops->download(be, o->greedy + i, f->out_dev + i, (size_t)(j - k) * sizeof *f->out_dev);
        } else if (mode == DI_ROW_DRAW) {
            be->ops->logits_draw(be, lg + k * V, j - k, V, o->lim, f->out_draw + i, o->edits, f->out_dev + i);
            be->ops->download(be, o->greedy + i, f->out_dev + i, (size_t)(j - k) * sizeof *f->out_dev);
            for (int64_t a = 0, b; a < j - k; a = b) { /* the draws left to the host: their rows, a run a copy */
                for (b = a; b < j - k && o->greedy[i + b].pad; b++) {
                }
                if (b > a)
                    be->ops->download(be, logits + (i + a) * V, lg + (k + a) * V, (size_t)((b - a) * V) * sizeof(float));
                else
                    b++;
            }
        }
        /* the run's top lists where a row wants one (top logprobs): the
         * run's rows at the step's length, top_k entries each */
        int tops = 0;
        for (int64_t a = 0; a < j - k && (mode == DI_ROW_GREEDY || mode == DI_ROW_DRAW); a++) tops |= o->want[i + a].top > 0;
        if (tops) {
            const int64_t K = o->top_k;
            be->ops->logits_top(be, lg + k * V, j - k, V, (int32_t)K, f->out_top + i * K);
            be->ops->download(be, o->top + i * K, f->out_top + i * K, (size_t)((j - k) * K) * sizeof *f->out_top);
        }
    }
}

/* The target rows of an all-rows pass (out->all_rows): runs of consecutive
 * rows summarised, their targets' values picked and their top lists formed
 * by the backend, and only those downloaded. */
static void rows_to_host(const di_fwd *f, const float *lg, int64_t n) {
    di_backend *be = f->lm->be;
    const int64_t V = f->lm->cfg->vocab_size;
    const di_fwd_out *o = f->out;
    const int64_t K = o->row_k;
    for (int64_t k = 0, j; k < n; k = j) {
        if (o->target[k] < 0) {
            j = k + 1;
            continue;
        }
        for (j = k + 1; j < n && o->target[j] >= 0; j++) {
        }
        be->ops->logits_greedy(be, lg + k * V, j - k, V, V, NULL, f->out_rsum + k);
        be->ops->download(be, o->row_sum + k, f->out_rsum + k, (size_t)(j - k) * sizeof *f->out_rsum);
        be->ops->logits_pick(be, lg + k * V, j - k, V, o->target + k, f->out_rx + k);
        be->ops->download(be, o->row_x + k, f->out_rx + k, (size_t)(j - k) * sizeof *f->out_rx);
        if (K > 0) {
            be->ops->logits_top(be, lg + k * V, j - k, V, (int32_t)K, f->out_rtop + k * K);
            be->ops->download(be, o->row_top + k * K, f->out_rtop + k * K, (size_t)((j - k) * K) * sizeof *f->out_rtop);
        }
    }
}

/* logits [n, V] of rows `rows` from the final streams: collapse with the
 * last pre, RMSNorm, fp32 head (§3.6–7). */
di_status di_fwd_head(di_fwd *f, const float *s, const float *pre, const int32_t *rows,
                      const int32_t *drows, int64_t n, float *logits, di_err *err) {
    const di_lm *lm = f->lm;
    const di_config *c = lm->cfg;
    di_backend *be = lm->be;
    int64_t d = c->dim;
    int hc = c->hc_mult;
    float *ss = be->ops->alloc(be, (size_t)(n * hc * d) * sizeof(float));
    float *pp = be->ops->alloc(be, (size_t)(n * hc) * sizeof(float));
    float *h = be->ops->alloc(be, (size_t)(n * d) * sizeof(float));
    float *lg = be->ops->alloc(be, (size_t)(n * c->vocab_size) * sizeof(float));
    di_status st = DI_OK;
    if (!ss || !pp || !h || !lg) {
        st = di_err_set(err, DI_ERR_NOMEM, "head: out of memory");
        goto out;
    }
    if (drows && be->ops->gather_rows_buf) {
        be->ops->gather_rows_buf(be, s, drows, n, hc * d, ss);
        be->ops->gather_rows_buf(be, pre, drows, n, hc, pp);
    } else {
        be->ops->gather_rows(be, s, rows, n, hc * d, ss);
        be->ops->gather_rows(be, pre, rows, n, hc, pp);
    }
    if (be->ops->hc_collapse_norm) {
        be->ops->hc_collapse_norm(be, ss, pp, n, hc, d, &lm->w->norm, c->eps, h);
    } else {
        be->ops->hc_collapse(be, ss, pp, n, hc, d, h);
        be->ops->rmsnorm(be, h, &lm->w->norm, n, d, c->eps, h);
    }
    be->ops->matmul(be, &lm->head, h, n, lg, DI_MM_ACT_BF16); /* h: the norm's bf16 values */
    if (f->recording) {
        f->recording = 0;
        if (be->ops->graph_record_end(be, lg)) { /* nothing ran */
            st = DI_ERR_UNSUPPORTED;
            goto out;
        }
    }
    logits_to_host(f, logits, lg, n);
out:
    be->ops->free(be, ss);
    be->ops->free(be, pp);
    be->ops->free(be, h);
    be->ops->free(be, lg);
    return st;
}

/* Whether a pass is a decode step a recording backend may replay: every
 * sequence one token, the logits wanted, the step metadata in use. */
static int graph_step(const di_fwd *f, const float *logits) {
    const di_backend_ops *o = f->lm->be->ops;
    if (!logits || !f->meta || !o->graph_replay || !o->graph_record_begin || !o->graph_record_end)
        return 0;
    for (int s = 0; s < f->n_seqs; s++)
        if (f->seqs[s].n != 1) return 0;
    return 1;
}

/* The delivery's buffers of a pass by want (f->out): host arrays and
 * backend scratch, whichever were allocated (NULL ones are skipped). */
static void out_bufs_free(di_fwd *f) {
    di_backend *be = f->lm->be;
    free(f->out_ban);
    free(f->out_draw);
    free(f->out_row);
    free(f->out_seq);
    be->ops->free(be, f->out_dev);
    be->ops->free(be, f->out_top);
    be->ops->free(be, f->out_rsum);
    be->ops->free(be, f->out_rx);
    be->ops->free(be, f->out_rtop);
}

/* One pass; graphs = 0 runs every op itself. A recording that failed
 * returns DI_ERR_UNSUPPORTED with nothing run and nothing advanced. */
static di_status forward_pass(const di_lm *lm, const di_fwd_seq *seqs, int n_seqs, float *logits,
                              int all_rows, const di_fwd_out *fo, int graphs, di_err *err) {
    const di_config *c = lm->cfg;
    di_backend *be = lm->be;
    di_fwd f;
    di_status st = di_fwd_begin(&f, lm, seqs, n_seqs, err);
    if (st) return st;
    /* the delivery's buffers before anything runs: once the pass has run,
     * delivering its rows cannot fail */
    int n_mode[DI_ROW_MODES] = {0}; /* sequences by want: DI_ROW_NONE, _LOGITS, _GREEDY, _DRAW */
    for (int q = 0; fo && q < n_seqs; q++) n_mode[fo->want[q].mode]++;
    if (fo) {
        const int greedy = n_mode[DI_ROW_GREEDY] > 0, draw = n_mode[DI_ROW_DRAW] > 0;
        int tops = 0;
        for (int q = 0; q < n_seqs; q++) tops |= fo->want[q].top > 0;
        const int allr = fo->all_rows != 0;
        f.out_row = malloc((size_t)n_seqs * sizeof *f.out_row);
        f.out_seq = malloc((size_t)n_seqs * sizeof *f.out_seq);
        if (allr) {
            f.out_rsum = di_alloc_raw(be, (size_t)f.m * sizeof *f.out_rsum);
            f.out_rx = di_alloc_raw(be, (size_t)f.m * sizeof *f.out_rx);
            if (fo->row_k > 0) f.out_rtop = di_alloc_raw(be, (size_t)f.m * (size_t)fo->row_k * sizeof *f.out_rtop);
        }
        if (greedy) f.out_ban = malloc((size_t)n_seqs * sizeof *f.out_ban);
        if (draw) f.out_draw = malloc((size_t)n_seqs * sizeof *f.out_draw);
        if (greedy || draw) f.out_dev = di_alloc_raw(be, (size_t)n_seqs * sizeof *f.out_dev);
        if (tops) f.out_top = di_alloc_raw(be, (size_t)n_seqs * (size_t)fo->top_k * sizeof *f.out_top);
        if (!f.out_row || !f.out_seq || (greedy && !f.out_ban) || (draw && !f.out_draw) ||
            ((greedy || draw) && !f.out_dev) || (tops && !f.out_top) ||
            (allr && (!f.out_rsum || !f.out_rx || (fo->row_k > 0 && !f.out_rtop)))) {
            out_bufs_free(&f);
            fwd_release(&f);
            return di_err_set(err, DI_ERR_NOMEM, "rows of %d sequences: out of memory", n_seqs);
        }
        for (int j = 0; j < n_seqs; j++) f.out_row[j] = j; /* the head's rows: one a sequence, all kept */
        for (int j = 0; greedy && j < n_seqs; j++) f.out_ban[j] = fo->want[j].ban;
        for (int j = 0; draw && j < n_seqs; j++) f.out_draw[j] = fo->want[j].draw;
    }
    f.out = fo;
    /* a pass whose rows nobody reads (prefill chunks that draw no token)
     * skips the head (the real model's head weights are over a gigabyte) */
    const int head = logits != NULL && (!fo || fo->all_rows || n_mode[DI_ROW_NONE] < n_seqs);
    int64_t m = f.m, d = c->dim;
    int hc = c->hc_mult;
    float *s = NULL, *pre = NULL;
    int32_t *rows = NULL;
    if (fo && fo->all_rows) graphs = 0; /* a recorded step's head reads the last rows */
    if (graphs && graph_step(&f, head ? logits : NULL)) {
        uint64_t key = f.step_key ^ (all_rows ? 0x9e3779b97f4a7c15ull : 0);
        const float *lg = be->ops->graph_replay(be, key, f.meta_host, f.meta_bytes);
        if (lg) { /* the recorded step: only the logits come back */
            logits_to_host(&f, logits, lg, all_rows ? m : n_seqs);
            goto done;
        }
        void *dmeta = be->ops->graph_record_begin(be, key, f.meta_host, f.meta_bytes);
        if (dmeta) { /* from here every buffer of the step belongs to the recording */
            meta_move(&f, dmeta);
            f.recording = 1;
            if (f.taps) {
                be->ops->free(be, f.taps);
                f.taps = be->ops->alloc(be, (size_t)(m * c->n_dspark_taps * d) * sizeof(float));
            }
        }
    }
    s = be->ops->alloc(be, (size_t)(m * hc * d) * sizeof(float));
    pre = be->ops->alloc(be, (size_t)(m * hc) * sizeof(float));
    rows = malloc((size_t)m * sizeof(int32_t));
    if (!s || !pre || !rows || (c->n_dspark_taps > 0 && !f.taps)) {
        st = di_err_set(err, DI_ERR_NOMEM, "forward of %lld rows: out of memory", (long long)m);
        goto out;
    }
    if ((st = di_fwd_embed(&f, f.ids, s, pre))) {
        di_err_set(err, st, "forward: out of memory");
        goto out;
    }
    for (int b = 0; b < c->n_layers; b++) {
        const di_layer_role *r = &c->roles[b];
        if (r->engram >= 0 && (st = di_engram_apply(&f, b, s, err))) goto out;
        if (r->dspark_tap >= 0 && f.taps)
            be->ops->hc_mean(be, s, m, hc, d, f.taps + r->dspark_tap * d, c->n_dspark_taps * d);
        if ((st = di_fwd_block(&f, b, s, pre, err))) goto out;
    }
    /* the DSpark rings before the head: a recorded step ends with the logits */
    if (lm->has_dspark && (st = di_dspark_seed(&f, err))) goto out;
    if (head) {
        /* rows nobody reads are left out of the head (out_row: the head's
         * row of each sequence), except in a recorded step, whose
         * head reads the metadata's rows (a decode step: every row read) */
        f.out_compact = !all_rows && n_mode[DI_ROW_NONE] > 0 && !f.recording;
        int64_t n = 0;
        for (int q = 0; q < n_seqs; q++) {
            if (all_rows) {
                for (int64_t i = 0; i < seqs[q].n; i++) rows[n++] = (int32_t)(f.row0[q] + i);
                if (fo) f.out_row[q] = n - 1;
            } else if (!f.out_compact || fo->want[q].mode != DI_ROW_NONE) {
                if (f.out_compact) f.out_row[q] = n;
                rows[n++] = (int32_t)(f.row0[q] + seqs[q].n - 1);
            } else {
                f.out_row[q] = -1;
            }
        }
        const int32_t *drows = f.meta && !f.out_compact ? (all_rows ? f.m_rows_all : f.m_rows_last) : NULL;
        if ((st = di_fwd_head(&f, s, pre, rows, drows, n, logits, err))) goto out;
    }
done:
    /* a device backend's ops cannot return errors: ask once per pass, before
     * the sequences advance, so a failed pass leaves them where they were */
    if (be->ops->status && (st = be->ops->status(be, err))) di_err_prefix(err, "forward on %s: ", be->ops->name);
out:
    if (f.recording) { /* the step stopped before its end: drop the recording */
        f.recording = 0;
        be->ops->graph_record_end(be, NULL);
        if (!st) st = DI_ERR_UNSUPPORTED;
    }
    be->ops->free(be, s);
    be->ops->free(be, pre);
    free(rows);
    out_bufs_free(&f);
    if (st) fwd_release(&f);
    else di_fwd_end(&f);
    return st;
}

static di_status forward_run(const di_lm *lm, const di_fwd_seq *seqs, int n_seqs, float *logits, int all_rows,
                             const di_fwd_out *fo, di_err *err) {
    di_status st = forward_pass(lm, seqs, n_seqs, logits, all_rows, fo, 1, err);
    if (st == DI_ERR_UNSUPPORTED && lm->be->ops->graph_replay) /* a recording failed: run it */
        st = forward_pass(lm, seqs, n_seqs, logits, all_rows, fo, 0, err);
    return st;
}

di_status di_forward(const di_lm *lm, const di_fwd_seq *seqs, int n_seqs, float *logits,
                     int all_rows, di_err *err) {
    return forward_run(lm, seqs, n_seqs, logits, all_rows, NULL, err);
}

di_status di_forward_rows(const di_lm *lm, const di_fwd_seq *seqs, int n_seqs, float *logits,
                          const di_fwd_out *out, di_err *err) {
    if (!lm->be->ops->logits_greedy)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "forward: backend %s has no greedy summaries (logits_greedy)",
                          lm->be->ops->name);
    if (!logits || !out || !out->want || !out->greedy)
        return di_err_set(err, DI_ERR_INVALID_ARG, "forward: rows wanted without their buffers");
    if (out->top_k < 0 || out->top_k > DI_ROW_TOP_MAX || out->top_k > lm->cfg->vocab_size)
        return di_err_set(err, DI_ERR_INVALID_ARG, "forward: top lists of %d (at most %d, and the vocabulary)",
                          (int)out->top_k, DI_ROW_TOP_MAX);
    if (out->all_rows) { /* every row's targets: ids or -1, with their buffers */
        if (!out->target || !out->row_sum || !out->row_x || out->row_k < 0 || out->row_k > DI_ROW_TOP_MAX ||
            out->row_k > lm->cfg->vocab_size || (out->row_k > 0 && !out->row_top))
            return di_err_set(err, DI_ERR_INVALID_ARG, "forward: all rows wanted without their targets, buffers "
                                                       "or a top list length of 0 .. %d", DI_ROW_TOP_MAX);
        if (!lm->be->ops->logits_pick || (out->row_k > 0 && !lm->be->ops->logits_top))
            return di_err_set(err, DI_ERR_UNSUPPORTED, "forward: backend %s has no row values (logits_pick, logits_top)",
                              lm->be->ops->name);
        int64_t m = 0;
        for (int q = 0; q < n_seqs; q++) m += seqs[q].n > 0 ? seqs[q].n : 0;
        for (int64_t r = 0; r < m; r++)
            if (out->target[r] < -1 || out->target[r] >= lm->cfg->vocab_size)
                return di_err_set(err, DI_ERR_INVALID_ARG, "forward: row %lld: target %d outside the vocabulary",
                                  (long long)r, (int)out->target[r]);
    }
    for (int q = 0; q < n_seqs; q++) {
        if (out->want[q].mode < DI_ROW_NONE || out->want[q].mode >= DI_ROW_MODES)
            return di_err_set(err, DI_ERR_INVALID_ARG, "forward: sequence %d: row mode %d", q, (int)out->want[q].mode);
        if (out->want[q].mode == DI_ROW_DRAW) { /* the row's edited ids: within the list, ascending */
            const di_row_draw *d = &out->want[q].draw;
            if (d->n_edit < 0 || d->e0 < 0 || (d->n_edit > 0 && (!out->edits || d->e0 > out->n_edits - d->n_edit)))
                return di_err_set(err, DI_ERR_INVALID_ARG, "forward: sequence %d: edits %lld + %d outside a list of %lld",
                                  q, (long long)d->e0, (int)d->n_edit, (long long)out->n_edits);
            for (int32_t j = 0; j < d->n_edit; j++) {
                const int32_t id = out->edits[d->e0 + j].id;
                if (id < 0 || id >= lm->cfg->vocab_size || (j > 0 && id <= out->edits[d->e0 + j - 1].id))
                    return di_err_set(err, DI_ERR_INVALID_ARG,
                                      "forward: sequence %d: edited id %d (ids ascending, below %lld)", q, (int)id,
                                      (long long)lm->cfg->vocab_size);
            }
        }
        if (out->want[q].mode == DI_ROW_DRAW && !lm->be->ops->logits_draw)
            return di_err_set(err, DI_ERR_UNSUPPORTED, "forward: backend %s has no draws (logits_draw)",
                              lm->be->ops->name);
        const int32_t top = out->want[q].top, mode = out->want[q].mode;
        if (top < 0 || top > out->top_k || (top > 0 && ((mode != DI_ROW_GREEDY && mode != DI_ROW_DRAW) || !out->top)))
            return di_err_set(err, DI_ERR_INVALID_ARG,
                              "forward: sequence %d: a top list of %d (a greedy or drawn row's, at most %d, and a buffer)",
                              q, (int)top, (int)out->top_k);
        if (top > 0 && !lm->be->ops->logits_top)
            return di_err_set(err, DI_ERR_UNSUPPORTED, "forward: backend %s has no top lists (logits_top)",
                              lm->be->ops->name);
    }
    return forward_run(lm, seqs, n_seqs, logits, out->all_rows != 0, out, err);
}
