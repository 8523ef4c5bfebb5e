/* Expected checkpoint tensors of a config (architecture.md §8.2). */
#include "model/manifest.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QBLOCK 32 /* FP8 tile edge and FP4 / Engram scale group (quantization_config) */

typedef struct mbuilder {
    di_manifest *m;
    di_err *err;
    di_status st;
    char prefix[32];
    int block;
} mbuilder;

static di_manifest_entry *add(mbuilder *b, di_tensor *slot, di_dtype dt, di_tensor_role role, int ndim, int64_t d0,
                              int64_t d1, const char *fmt, ...) __attribute__((format(printf, 8, 9)));

static di_manifest_entry *add(mbuilder *b, di_tensor *slot, di_dtype dt, di_tensor_role role, int ndim, int64_t d0,
                              int64_t d1, const char *fmt, ...) {
    if (b->st) return NULL;
    di_manifest *m = b->m;
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 1024;
        di_manifest_entry *nv = realloc(m->v, cap * sizeof *nv);
        if (!nv) {
            b->st = di_err_set(b->err, DI_ERR_NOMEM, "manifest: out of memory");
            return NULL;
        }
        m->v = nv;
        m->cap = cap;
    }
    di_manifest_entry *e = &m->v[m->n++];
    memset(e, 0, sizeof *e);
    size_t k = (size_t)snprintf(e->name, sizeof e->name, "%s", b->prefix);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->name + k, sizeof e->name - k, fmt, ap);
    va_end(ap);
    e->dtype = dt;
    e->role = role;
    e->ndim = ndim;
    e->shape[0] = d0;
    e->shape[1] = d1;
    e->block = b->block;
    e->slot = slot;
    return e;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* FP8 Linear `name` [out, in]: weight + 32x32-tile scale. */
static void add_fp8(mbuilder *b, di_w_fp8 *w, int64_t out, int64_t in, const char *name) {
    di_manifest_entry *e = add(b, w ? &w->weight : NULL, DI_DTYPE_F8_E4M3, DI_TR_FP8_WEIGHT, 2, out, in,
                               "%s.weight", name);
    if (e) e->fan_in = in;
    e = add(b, w ? &w->scale : NULL, DI_DTYPE_F8_E8M0, DI_TR_FP8_SCALE, 2, cdiv(out, QBLOCK), cdiv(in, QBLOCK),
            "%s.scale", name);
    if (e) e->fan_in = in;
}

/* MXFP4 Linear [out, in]: packed codes [out, in/2] + scale [out, in/32]. */
static void add_fp4(mbuilder *b, di_w_fp4 *w, int64_t out, int64_t in, const char *name) {
    di_manifest_entry *e = add(b, w ? &w->weight : NULL, DI_DTYPE_I8, DI_TR_FP4_WEIGHT, 2, out, in / 2,
                               "%s.weight", name);
    if (e) e->fan_in = in;
    e = add(b, w ? &w->scale : NULL, DI_DTYPE_F8_E8M0, DI_TR_FP4_SCALE, 2, out, in / QBLOCK, "%s.scale", name);
    if (e) e->fan_in = in;
}

static void add_dense(mbuilder *b, di_tensor *slot, int64_t out, int64_t in, const char *name) {
    di_manifest_entry *e = add(b, slot, DI_DTYPE_BF16, DI_TR_DENSE, 2, out, in, "%s", name);
    if (e) e->fan_in = in;
}

static void add_norm(mbuilder *b, di_tensor *slot, int64_t n, const char *name) {
    add(b, slot, DI_DTYPE_BF16, DI_TR_NORM, 1, n, 0, "%s", name);
}

static void add_hc(mbuilder *b, di_w_hc *w, const di_config *c, const char *site) {
    int64_t mix = (int64_t)(2 + c->hc_mult) * c->hc_mult;
    di_manifest_entry *e = add(b, w ? &w->fn : NULL, DI_DTYPE_F32, DI_TR_HC_FN, 2, mix, c->hc_mult * c->dim,
                               "hc_%s_fn", site);
    if (e) e->fan_in = c->hc_mult * c->dim;
    add(b, w ? &w->base : NULL, DI_DTYPE_F32, DI_TR_HC_BASE, 1, mix, 0, "hc_%s_base", site);
    add(b, w ? &w->scale : NULL, DI_DTYPE_F32, DI_TR_HC_SCALE, 1, 3, 0, "hc_%s_scale", site);
}

static void add_attn(mbuilder *b, di_w_attn *a, const di_config *c, const di_layer_role *r) {
    const int64_t D = c->dim, Dh = c->head_dim, Rq = c->q_lora_rank, H = c->n_heads, G = c->o_groups;
    add_fp8(b, a ? &a->wq_a : NULL, Rq, D, "attn.wq_a");
    add_norm(b, a ? &a->q_norm : NULL, Rq, "attn.q_norm.weight");
    add_fp8(b, a ? &a->wq_b : NULL, H * Dh, Rq, "attn.wq_b");
    add_fp8(b, a ? &a->wkv : NULL, Dh, D, "attn.wkv");
    add_norm(b, a ? &a->kv_norm : NULL, Dh, "attn.kv_norm.weight");
    add_fp8(b, a ? &a->wo_a : NULL, G * c->o_lora_rank, H * Dh / G, "attn.wo_a");
    add_fp8(b, a ? &a->wo_b : NULL, D, G * c->o_lora_rank, "attn.wo_b");
    add(b, a ? &a->sink : NULL, DI_DTYPE_F32, DI_TR_SINK, 1, H, 0, "attn.attn_sink");
    if (r->owns_compressor) {
        add_dense(b, a ? &a->cmp_wkv : NULL, Dh, D, "attn.compressor.wkv.weight");
        if (r->ratio > 1) add_dense(b, a ? &a->cmp_wgate : NULL, Dh, D, "attn.compressor.wgate.weight");
        add_norm(b, a ? &a->cmp_norm : NULL, Dh, "attn.compressor.norm.weight");
    }
    if (r->is_index_source) {
        add_fp8(b, a ? &a->idx_wq_b : NULL, (int64_t)c->index_n_heads * c->index_head_dim, Rq,
                "attn.indexer.wq_b");
        add_dense(b, a ? &a->idx_weights : NULL, c->index_n_heads, D, "attn.indexer.weights_proj.weight");
        if (r->owns_compressor) {
            add_dense(b, a ? &a->idx_wk : NULL, c->index_head_dim, Dh, "attn.indexer.wk.weight");
            add_norm(b, a ? &a->idx_k_norm : NULL, c->index_head_dim, "attn.indexer.k_norm.weight");
        }
    }
}

static void add_moe(mbuilder *b, di_w_moe *f, const di_config *c, const di_layer_role *r) {
    const int64_t D = c->dim, I = c->moe_inter, E = r->n_experts;
    add_dense(b, f ? &f->gate : NULL, E, D, "ffn.gate.weight");
    add(b, f ? &f->gate_bias : NULL, DI_DTYPE_F32, DI_TR_GATE_BIAS, 1, E, 0, "ffn.gate.bias");
    di_manifest_entry *e =
        add(b, f ? &f->gate_bias_vl : NULL, DI_DTYPE_F32, DI_TR_GATE_BIAS, 1, E, 0, "ffn.gate.bias_vl");
    /* The image-span bias only matters with a vision tower; text-only files may omit it. */
    if (e) e->optional = c->vision_layers == 0;
    char name[64];
    for (int64_t x = 0; x < E; x++) {
        di_w_expert *w = f && f->experts ? &f->experts[x] : NULL;
        snprintf(name, sizeof name, "ffn.experts.%lld.w1", (long long)x);
        add_fp4(b, w ? &w->w1 : NULL, I, D, name);
        snprintf(name, sizeof name, "ffn.experts.%lld.w2", (long long)x);
        add_fp4(b, w ? &w->w2 : NULL, D, I, name);
        snprintf(name, sizeof name, "ffn.experts.%lld.w3", (long long)x);
        add_fp4(b, w ? &w->w3 : NULL, I, D, name);
    }
    add_fp8(b, f ? &f->shared.w1 : NULL, I, D, "ffn.shared_experts.w1");
    add_fp8(b, f ? &f->shared.w2 : NULL, D, I, "ffn.shared_experts.w2");
    add_fp8(b, f ? &f->shared.w3 : NULL, I, D, "ffn.shared_experts.w3");
}

static void add_engram(mbuilder *b, di_w_engram *g, const di_config *c, int idx) {
    const int64_t Eh = c->engram_head_dim, R = c->engram_rows[idx];
    add(b, g ? &g->embed : NULL, DI_DTYPE_F8_E4M3, DI_TR_ENGRAM_TABLE, 2, R, Eh, "engram.embed.weight");
    add(b, g ? &g->embed_scale : NULL, DI_DTYPE_F8_E8M0, DI_TR_ENGRAM_SCALE, 2, R, Eh / QBLOCK,
        "engram.embed.scale");
    add_fp8(b, g ? &g->wkv : NULL, (int64_t)(c->hc_mult + 1) * c->dim,
            (int64_t)(c->engram_max_ngram - 1) * c->engram_n_heads * Eh, "engram.wkv");
    add(b, g ? &g->q_weight : NULL, DI_DTYPE_BF16, DI_TR_ENGRAM_QK, 2, c->hc_mult, c->dim, "engram.q_weight");
    add(b, g ? &g->k_weight : NULL, DI_DTYPE_BF16, DI_TR_ENGRAM_QK, 2, c->hc_mult, c->dim, "engram.k_weight");
}

static void add_block(mbuilder *b, di_weights *w, const di_config *c, int blk) {
    const di_layer_role *r = &c->roles[blk];
    di_w_block *k = w ? &w->blocks[blk] : NULL;
    b->block = blk;
    di_config_block_prefix(c, blk, b->prefix, sizeof b->prefix);
    add_attn(b, k ? &k->attn : NULL, c, r);
    add_norm(b, k ? &k->attn_norm : NULL, c->dim, "attn_norm.weight");
    add_norm(b, k ? &k->ffn_norm : NULL, c->dim, "ffn_norm.weight");
    add_hc(b, k ? &k->hc_attn : NULL, c, "attn");
    add_hc(b, k ? &k->hc_ffn : NULL, c, "ffn");
    add_moe(b, k ? &k->ffn : NULL, c, r);
    if (r->engram >= 0) add_engram(b, k ? &k->engram : NULL, c, r->engram);
    if (!r->is_dspark_stage) return;
    int stage = blk - c->n_layers;
    di_w_dspark *d = w ? &w->dspark : NULL;
    const int64_t D = c->dim, Rm = c->dspark_markov_rank;
    if (stage == 0) {
        add_fp8(b, d ? &d->main_proj : NULL, D, (int64_t)c->n_dspark_taps * D, "main_proj");
        add_norm(b, d ? &d->main_norm : NULL, D, "main_norm.weight");
    }
    if (stage == c->n_mtp - 1) {
        add_norm(b, d ? &d->norm : NULL, D, "norm.weight");
        add(b, d ? &d->markov_embed : NULL, DI_DTYPE_BF16, DI_TR_EMBED, 2, c->vocab_size, Rm,
            "markov_head.embed.weight");
        add_dense(b, d ? &d->markov_head : NULL, c->vocab_size, Rm, "markov_head.head.weight");
        add_dense(b, d ? &d->confidence : NULL, 1, D + Rm, "confidence_head.proj.weight");
    }
}

static int cmp_entry(const void *a, const void *b) {
    const di_manifest_entry *x = *(const di_manifest_entry *const *)a;
    const di_manifest_entry *y = *(const di_manifest_entry *const *)b;
    return strcmp(x->name, y->name);
}

di_status di_manifest_build(di_manifest *m, const di_config *c, di_weights *w, di_err *err) {
    memset(m, 0, sizeof *m);
    if (w && w->n_blocks != c->n_blocks)
        return di_err_set(err, DI_ERR_INVALID_ARG, "manifest: weights were initialised for another config");
    mbuilder b = {m, err, DI_OK, "", -1};
    add(&b, w ? &w->embed : NULL, DI_DTYPE_BF16, DI_TR_EMBED, 2, c->vocab_size, c->dim, "embed.weight");
    di_manifest_entry *e = add(&b, w ? &w->head : NULL, DI_DTYPE_BF16, DI_TR_DENSE, 2, c->vocab_size, c->dim,
                               "head.weight");
    if (e) e->fan_in = c->dim;
    add_norm(&b, w ? &w->norm : NULL, c->dim, "norm.weight");
    for (int blk = 0; blk < c->n_blocks && !b.st; blk++) add_block(&b, w, c, blk);
    if (b.st) {
        di_manifest_free(m);
        return b.st;
    }
    m->sorted = malloc(m->n * sizeof *m->sorted);
    if (!m->sorted) {
        di_manifest_free(m);
        return di_err_set(err, DI_ERR_NOMEM, "manifest: out of memory");
    }
    for (size_t i = 0; i < m->n; i++) m->sorted[i] = &m->v[i];
    qsort(m->sorted, m->n, sizeof *m->sorted, cmp_entry);
    for (size_t i = 1; i < m->n; i++)
        if (!strcmp(m->sorted[i - 1]->name, m->sorted[i]->name)) {
            di_status st = di_err_set(err, DI_ERR_INTERNAL, "manifest: tensor %s listed twice", m->sorted[i]->name);
            di_manifest_free(m);
            return st;
        }
    return DI_OK;
}

void di_manifest_free(di_manifest *m) {
    if (!m) return;
    free(m->v);
    free(m->sorted);
    memset(m, 0, sizeof *m);
}

const di_manifest_entry *di_manifest_find(const di_manifest *m, const char *name) {
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(m->sorted[mid]->name, name);
        if (c == 0) return m->sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

uint64_t di_manifest_entry_bytes(const di_manifest_entry *e) {
    uint64_t n = di_dtype_size(e->dtype);
    for (int i = 0; i < e->ndim; i++) n *= (uint64_t)e->shape[i];
    return n;
}

int di_manifest_tolerated(const char *name) {
    static const char *const prefixes[] = {"vision.", "aligner.", "image_start", "image_end", "image_newline"};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (!strncmp(name, prefixes[i], strlen(prefixes[i]))) return 1;
    return 0;
}
