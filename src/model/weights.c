/* Binding checkpoint tensors to the model's weight structs, with every
 * name, dtype and shape checked against the config's manifest
 * (architecture.md §8.2). */
#include "model/weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "model/manifest.h"

di_status di_weights_init(di_weights *w, const di_config *cfg, di_err *err) {
    memset(w, 0, sizeof *w);
    w->blocks = calloc((size_t)cfg->n_blocks, sizeof *w->blocks);
    if (!w->blocks) return di_err_set(err, DI_ERR_NOMEM, "weights: out of memory");
    w->n_blocks = cfg->n_blocks;
    for (int b = 0; b < cfg->n_blocks; b++) {
        di_w_block *k = &w->blocks[b];
        k->has_engram = cfg->roles[b].engram >= 0;
        k->ffn.n_experts = cfg->roles[b].n_experts;
        k->ffn.experts = calloc((size_t)k->ffn.n_experts, sizeof *k->ffn.experts);
        if (!k->ffn.experts) {
            di_weights_free(w);
            return di_err_set(err, DI_ERR_NOMEM, "weights: out of memory");
        }
    }
    return DI_OK;
}

void di_weights_free(di_weights *w) {
    if (!w) return;
    for (int b = 0; w->blocks && b < w->n_blocks; b++) free(w->blocks[b].ffn.experts);
    free(w->blocks);
    memset(w, 0, sizeof *w);
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* Checks one found tensor against its manifest entry. */
static di_status check_entry(const di_manifest_entry *e, const di_tensor *t, const char *file, di_err *err) {
    char want[64], got[64];
    shape_str(want, sizeof want, e->ndim, e->shape);
    if (t->dtype != e->dtype)
        return di_err_set(err, DI_ERR_FORMAT, "tensor %s in %s: dtype %s, expected %s %s", e->name,
                          file ? file : "?", di_dtype_name(t->dtype), di_dtype_name(e->dtype), want);
    int same = t->ndim == e->ndim;
    for (int i = 0; same && i < e->ndim; i++) same = t->shape[i] == e->shape[i];
    if (!same) {
        shape_str(got, sizeof got, t->ndim, t->shape);
        return di_err_set(err, DI_ERR_FORMAT, "tensor %s in %s: shape %s, expected %s (%s)", e->name,
                          file ? file : "?", got, want, di_dtype_name(e->dtype));
    }
    return DI_OK;
}

di_status di_weights_bind(di_weights *w, const di_config *cfg, const di_tensor_source *src, di_err *err) {
    di_manifest m;
    di_status st = di_manifest_build(&m, cfg, w, err);
    if (st) return st;
    for (size_t i = 0; i < m.n && !st; i++) {
        const di_manifest_entry *e = &m.v[i];
        const char *file = NULL;
        const di_tensor *t = src->find(src->ctx, e->name, &file);
        if (!t) {
            if (e->optional) continue;
            char want[64];
            shape_str(want, sizeof want, e->ndim, e->shape);
            st = di_err_set(err, DI_ERR_NOT_FOUND, "tensor %s (%s %s) is missing from the checkpoint", e->name,
                            di_dtype_name(e->dtype), want);
            break;
        }
        st = check_entry(e, t, file, err);
        if (!st && e->slot) *e->slot = *t;
    }
    size_t n = src->count ? src->count(src->ctx) : 0;
    for (size_t i = 0; i < n && !st; i++) {
        const char *file = NULL;
        const char *name = src->name_at(src->ctx, i, &file);
        if (!di_manifest_find(&m, name) && !di_manifest_tolerated(name))
            st = di_err_set(err, DI_ERR_FORMAT, "tensor %s in %s is not part of this model's config (unknown tensor)",
                            name, file ? file : "?");
    }
    di_manifest_free(&m);
    return st;
}

/* ---- checkpoint as a tensor source ---- */

static const di_tensor *ck_find(void *ctx, const char *name, const char **file) {
    const di_ckpt_tensor *t = di_checkpoint_find(ctx, name);
    if (!t) return NULL;
    if (file) *file = t->file;
    return &t->t;
}

static size_t ck_count(void *ctx) { return di_checkpoint_count(ctx); }

static const char *ck_name_at(void *ctx, size_t i, const char **file) {
    const di_ckpt_tensor *t = di_checkpoint_at(ctx, i);
    if (file) *file = t->file;
    return t->name;
}

void di_weights_source_checkpoint(di_tensor_source *src, struct di_checkpoint *ck) {
    src->ctx = ck;
    src->find = ck_find;
    src->count = ck_count;
    src->name_at = ck_name_at;
}
