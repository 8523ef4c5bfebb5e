/* safetensors writer and sharded checkpoint index (ecosystem.md §3.1). */
#include "io/safetensors_writer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/buf.h"

#define FILL_CHUNK (1u << 20)

/* A JSON string literal. */
static void json_str(di_buf *b, const char *s) {
    di_buf_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            di_buf_put(b, e, 2);
        } else if (c < 0x20) {
            di_buf_printf(b, "\\u%04x", c);
        } else {
            di_buf_put(b, (const char *)&c, 1);
        }
    }
    di_buf_put(b, "\"", 1);
}

/* ---- ordering ---- */

typedef struct item {
    const di_st_named *t;
    size_t index; /* in the caller's array, for fill */
} item;

static int by_name(const void *a, const void *b) {
    return strcmp(((const item *)a)->t->name, ((const item *)b)->t->name);
}

/* Data order of the reference writer: larger elements first, then name. */
static int by_size_name(const void *a, const void *b) {
    const item *x = a, *y = b;
    size_t sx = di_dtype_size(x->t->t->dtype), sy = di_dtype_size(y->t->t->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->t->name, y->t->name);
}

static di_status check_tensor(const di_st_named *t, di_st_fill_fn fill, di_err *err) {
    const di_tensor *v = t->t;
    if (!t->name || !*t->name) return di_err_set(err, DI_ERR_INVALID_ARG, "safetensors writer: empty tensor name");
    if (!di_dtype_size(v->dtype))
        return di_err_set(err, DI_ERR_INVALID_ARG, "safetensors writer: tensor %s has no valid dtype", t->name);
    if (v->ndim < 0 || v->ndim > DI_MAX_DIMS)
        return di_err_set(err, DI_ERR_INVALID_ARG, "safetensors writer: tensor %s has %d dims", t->name, v->ndim);
    uint64_t n = di_dtype_size(v->dtype);
    for (int i = 0; i < v->ndim; i++) {
        if (v->shape[i] < 0 || (v->shape[i] && n > UINT64_MAX / (uint64_t)v->shape[i]))
            return di_err_set(err, DI_ERR_INVALID_ARG, "safetensors writer: tensor %s: bad shape", t->name);
        n *= (uint64_t)v->shape[i];
    }
    if (n != v->nbytes)
        return di_err_set(err, DI_ERR_INVALID_ARG, "safetensors writer: tensor %s: %zu bytes for a shape of %llu",
                          t->name, v->nbytes, (unsigned long long)n);
    if (!v->data && !fill && n)
        return di_err_set(err, DI_ERR_INVALID_ARG, "safetensors writer: tensor %s has no data", t->name);
    return DI_OK;
}

/* Writes items[0..m) (any order; sorted here) to path. */
static di_status write_items(const char *path, item *items, size_t m, di_st_fill_fn fill, void *ctx, di_err *err) {
    qsort(items, m, sizeof *items, by_size_name);
    di_buf h = {0};
    static const char meta[] = "{\"__metadata__\":{\"format\":\"pt\"}";
    di_buf_put(&h, meta, sizeof meta - 1);
    uint64_t off = 0;
    for (size_t i = 0; i < m; i++) {
        const di_tensor *v = items[i].t->t;
        di_buf_put(&h, ",", 1);
        json_str(&h, items[i].t->name);
        di_buf_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", di_dtype_name(v->dtype));
        for (int d = 0; d < v->ndim; d++) di_buf_printf(&h, "%s%lld", d ? "," : "", (long long)v->shape[d]);
        di_buf_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                  (unsigned long long)(off + v->nbytes));
        off += v->nbytes;
    }
    di_buf_put(&h, "}", 1);
    while (!h.oom && h.len % 8) di_buf_put(&h, " ", 1); /* oom: put adds nothing */
    if (h.oom) {
        free(h.p);
        return di_err_set(err, DI_ERR_NOMEM, "%s: out of memory building the header", path);
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(h.p);
        return di_err_set(err, DI_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    int ok = fwrite(len, 1, 8, f) == 8 && fwrite(h.p, 1, h.len, f) == h.len;
    free(h.p);
    uint8_t *chunk = NULL;
    for (size_t i = 0; ok && i < m; i++) {
        const di_tensor *v = items[i].t->t;
        if (v->data) {
            ok = fwrite(v->data, 1, v->nbytes, f) == v->nbytes;
            continue;
        }
        if (!chunk && !(chunk = malloc(FILL_CHUNK))) {
            fclose(f);
            return di_err_set(err, DI_ERR_NOMEM, "%s: out of memory", path);
        }
        for (uint64_t o = 0; ok && o < v->nbytes; o += FILL_CHUNK) {
            size_t k = v->nbytes - o < FILL_CHUNK ? (size_t)(v->nbytes - o) : FILL_CHUNK;
            fill(ctx, items[i].index, o, chunk, k);
            ok = fwrite(chunk, 1, k, f) == k;
        }
    }
    free(chunk);
    int errnum = errno;
    if (fclose(f) != 0 && ok) ok = 0, errnum = errno;
    if (!ok) return di_err_set(err, DI_ERR_IO, "%s: write failed: %s", path, strerror(errnum));
    return DI_OK;
}

/* Validates every tensor and the uniqueness of names; returns items sorted
 * by name. */
static di_status prepare(const di_st_named *tensors, size_t n, di_st_fill_fn fill, item **out, di_err *err) {
    item *items = malloc((n ? n : 1) * sizeof *items);
    if (!items) return di_err_set(err, DI_ERR_NOMEM, "safetensors writer: out of memory");
    for (size_t i = 0; i < n; i++) {
        di_status st = check_tensor(&tensors[i], fill, err);
        if (st) {
            free(items);
            return st;
        }
        items[i].t = &tensors[i];
        items[i].index = i;
    }
    qsort(items, n, sizeof *items, by_name);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(items[i - 1].t->name, items[i].t->name)) {
            di_status st = di_err_set(err, DI_ERR_INVALID_ARG, "safetensors writer: tensor %s given twice",
                                      items[i].t->name);
            free(items);
            return st;
        }
    *out = items;
    return DI_OK;
}

di_status di_safetensors_write(const char *path, const di_st_named *tensors, size_t n, di_st_fill_fn fill,
                               void *fill_ctx, di_err *err) {
    item *items;
    di_status st = prepare(tensors, n, fill, &items, err);
    if (st) return st;
    st = write_items(path, items, n, fill, fill_ctx, err);
    free(items);
    return st;
}

di_status di_safetensors_write_sharded(const char *dir, const di_st_named *tensors, size_t n, int n_shards,
                                       di_st_fill_fn fill, void *fill_ctx, di_err *err) {
    if (n_shards < 1 || n_shards > 99999)
        return di_err_set(err, DI_ERR_INVALID_ARG, "safetensors writer: %d shards (supported: 1 to 99999)", n_shards);
    item *items;
    di_status st = prepare(tensors, n, fill, &items, err);
    if (st) return st;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += items[i].t->t->nbytes;
    /* Shard k closes once the running total reaches (k+1)/N of all bytes. */
    int *shard = malloc((n ? n : 1) * sizeof *shard);
    item *part = malloc((n ? n : 1) * sizeof *part);
    if (!shard || !part) {
        free(items);
        free(shard);
        free(part);
        return di_err_set(err, DI_ERR_NOMEM, "safetensors writer: out of memory");
    }
    uint64_t cum = 0;
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        shard[i] = k;
        cum += items[i].t->t->nbytes;
        while (k < n_shards - 1 && (long double)cum >= (long double)total * (k + 1) / n_shards) k++;
    }
    char path[4096];
    for (int s = 0; s < n_shards && !st; s++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (shard[i] == s) part[m++] = items[i];
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, s + 1, n_shards);
        st = write_items(path, part, m, fill, fill_ctx, err);
    }
    if (!st) {
        di_buf j = {0};
        di_buf_printf(&j, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {",
                  (unsigned long long)total);
        for (size_t i = 0; i < n; i++) {
            char file[64];
            snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", shard[i] + 1, n_shards);
            di_buf_put(&j, i ? ",\n    " : "\n    ", i ? 6 : 5);
            json_str(&j, items[i].t->name);
            di_buf_put(&j, ": ", 2);
            json_str(&j, file);
        }
        di_buf_put(&j, "\n  }\n}\n", 7);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        FILE *f = j.oom ? NULL : fopen(path, "wb");
        if (j.oom) st = di_err_set(err, DI_ERR_NOMEM, "%s: out of memory", path);
        else if (!f) st = di_err_set(err, DI_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        else {
            int ok = fwrite(j.p, 1, j.len, f) == j.len;
            if (fclose(f) != 0) ok = 0;
            if (!ok) st = di_err_set(err, DI_ERR_IO, "%s: write failed", path);
        }
        free(j.p);
    }
    free(items);
    free(shard);
    free(part);
    return st;
}
