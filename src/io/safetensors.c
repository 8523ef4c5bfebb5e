/* safetensors reader: ecosystem.md §3.1 (format and the reference reader's
 * checks), §3.2 (bugs other readers had, each guarded against here). */
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/json_text.h"

/* Names in messages are clipped so that a hostile megabyte-long name cannot
 * push the file name out of the fixed-size message. */
#define NAME_FMT "'%.160s'"

/* Integers in a header must be exact in a double (cJSON's number type). */
#define JSON_INT_MAX 9007199254740991.0 /* 2^53 - 1 */

/* Reads a JSON number that must be a non-negative integer. */
static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0.0 && d <= JSON_INT_MAX) || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

/* Dtypes the format defines that this build has no element type for: named
 * separately so that the message says "unsupported", not "unknown". */
static int dtype_known_unsupported(const char *s) {
    static const char *const names[] = {"F4", "F6_E2M3", "F6_E3M2", "F8_E4M3FNUZ",
                                        "F8_E5M2FNUZ", "C64"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(s, names[i])) return 1;
    return 0;
}

/* Fills e from one header entry `{dtype, shape, data_offsets}`. Unknown
 * fields are ignored (as the reference does); repeated fields are not. */
static di_status entry_parse(const cJSON *obj, di_st_entry *e, di_err *err) {
    const char *name = obj->string;
    if (!cJSON_IsObject(obj))
        return di_err_set(err, DI_ERR_FORMAT, "tensor " NAME_FMT ": entry is not a JSON object",
                          name);
    const cJSON *dtype = NULL, *shape = NULL, *offs = NULL;
    for (const cJSON *f = obj->child; f; f = f->next) {
        const cJSON **slot = !strcmp(f->string, "dtype")          ? &dtype
                             : !strcmp(f->string, "shape")        ? &shape
                             : !strcmp(f->string, "data_offsets") ? &offs
                                                                  : NULL;
        if (!slot) continue;
        if (*slot)
            return di_err_set(err, DI_ERR_FORMAT, "tensor " NAME_FMT ": duplicate field \"%s\"",
                              name, f->string);
        *slot = f;
    }
    if (!dtype || !shape || !offs)
        return di_err_set(err, DI_ERR_FORMAT, "tensor " NAME_FMT ": missing field \"%s\"", name,
                          !dtype ? "dtype" : !shape ? "shape" : "data_offsets");

    if (!cJSON_IsString(dtype))
        return di_err_set(err, DI_ERR_FORMAT, "tensor " NAME_FMT ": dtype is not a string", name);
    e->dtype = di_dtype_from_name(dtype->valuestring, strlen(dtype->valuestring));
    if (e->dtype == DI_DTYPE_INVALID) {
        if (dtype_known_unsupported(dtype->valuestring))
            return di_err_set(err, DI_ERR_UNSUPPORTED,
                              "tensor " NAME_FMT ": dtype \"%.32s\" is not supported", name,
                              dtype->valuestring);
        return di_err_set(err, DI_ERR_FORMAT, "tensor " NAME_FMT ": unknown dtype \"%.32s\"",
                          name, dtype->valuestring);
    }

    if (!cJSON_IsArray(shape))
        return di_err_set(err, DI_ERR_FORMAT, "tensor " NAME_FMT ": shape is not an array", name);
    int rank = cJSON_GetArraySize(shape);
    if (rank > DI_MAX_DIMS)
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "tensor " NAME_FMT ": rank %d exceeds the supported %d dimensions", name,
                          rank, DI_MAX_DIMS);
    e->ndim = rank;
    /* Element count with checked multiplication. Zero dimensions are skipped
     * in the overflow check so that no later numel() product can overflow
     * either, whatever order it multiplies in. */
    uint64_t numel = 1, nonzero = 1;
    int d = 0, zero = 0;
    for (const cJSON *v = shape->child; v; v = v->next, d++) {
        uint64_t dim;
        if (!json_uint(v, &dim))
            return di_err_set(err, DI_ERR_FORMAT,
                              "tensor " NAME_FMT ": shape[%d] is not a non-negative integer", name,
                              d);
        e->shape[d] = (int64_t)dim;
        if (dim == 0) zero = 1;
        else if (__builtin_mul_overflow(nonzero, dim, &nonzero))
            return di_err_set(err, DI_ERR_FORMAT,
                              "tensor " NAME_FMT ": shape overflows 64-bit element count", name);
    }
    numel = zero ? 0 : nonzero;
    uint64_t nbytes, nonzero_bytes;
    if (__builtin_mul_overflow(nonzero, (uint64_t)di_dtype_size(e->dtype), &nonzero_bytes))
        return di_err_set(err, DI_ERR_FORMAT,
                          "tensor " NAME_FMT ": shape x %s size overflows 64-bit byte count", name,
                          di_dtype_name(e->dtype));
    nbytes = numel * di_dtype_size(e->dtype);

    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !json_uint(offs->child, &e->begin) || !json_uint(offs->child->next, &e->end))
        return di_err_set(err, DI_ERR_FORMAT,
                          "tensor " NAME_FMT
                          ": data_offsets is not a pair [begin, end] of non-negative integers",
                          name);
    if (e->begin > e->end)
        return di_err_set(err, DI_ERR_FORMAT,
                          "tensor " NAME_FMT ": data_offsets [%llu, %llu] has begin > end", name,
                          (unsigned long long)e->begin, (unsigned long long)e->end);
    if (e->end - e->begin != nbytes)
        return di_err_set(err, DI_ERR_FORMAT,
                          "tensor " NAME_FMT
                          ": size mismatch: data_offsets [%llu, %llu] span %llu bytes but "
                          "shape x %s is %llu bytes",
                          name, (unsigned long long)e->begin, (unsigned long long)e->end,
                          (unsigned long long)(e->end - e->begin), di_dtype_name(e->dtype),
                          (unsigned long long)nbytes);
    return DI_OK;
}

static di_status meta_parse(const cJSON *obj, di_safetensors *st, di_err *err) {
    if (!cJSON_IsObject(obj))
        return di_err_set(err, DI_ERR_FORMAT, "__metadata__ is not a JSON object");
    size_t n = (size_t)cJSON_GetArraySize(obj);
    st->meta = calloc(n ? n : 1, sizeof *st->meta);
    if (!st->meta) return di_err_set(err, DI_ERR_NOMEM, "out of memory for __metadata__");
    for (const cJSON *v = obj->child; v; v = v->next) {
        if (!cJSON_IsString(v))
            return di_err_set(err, DI_ERR_FORMAT, "__metadata__ value of " NAME_FMT
                              " is not a string", v->string);
        if (di_safetensors_meta(st, v->string))
            return di_err_set(err, DI_ERR_FORMAT, "__metadata__ has duplicate key " NAME_FMT,
                              v->string);
        di_st_meta *m = &st->meta[st->n_meta];
        m->key = strdup(v->string);
        m->value = strdup(v->valuestring);
        st->n_meta++; /* counted before the check so close() frees a half-made pair */
        if (!m->key || !m->value) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    }
    return DI_OK;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const di_st_entry *const *)a)->name, (*(const di_st_entry *const *)b)->name);
}

static int cmp_offset(const void *a, const void *b) {
    const di_st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static di_status check_unique_names(const di_safetensors *st, di_err *err) {
    if (st->n_entries < 2) return DI_OK;
    const di_st_entry **by_name = malloc(st->n_entries * sizeof *by_name);
    if (!by_name) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < st->n_entries; i++) by_name[i] = &st->entries[i];
    qsort(by_name, st->n_entries, sizeof *by_name, cmp_name);
    di_status s = DI_OK;
    for (size_t i = 1; i < st->n_entries && !s; i++)
        if (!strcmp(by_name[i]->name, by_name[i - 1]->name))
            s = di_err_set(err, DI_ERR_FORMAT, "duplicate tensor name " NAME_FMT,
                           by_name[i]->name);
    free(by_name);
    return s;
}

/* The reference's offset rule: sorted by offset, every tensor starts exactly
 * where the previous one ended, and the last one ends at the end of the file.
 * One rule that rejects overlaps, aliasing, holes and trailing data. */
static di_status check_layout(di_safetensors *st, di_err *err) {
    qsort(st->entries, st->n_entries, sizeof *st->entries, cmp_offset);
    uint64_t pos = 0;
    const di_st_entry *prev = NULL;
    for (size_t i = 0; i < st->n_entries; i++) {
        const di_st_entry *e = &st->entries[i];
        if (e->begin < pos)
            return di_err_set(err, DI_ERR_FORMAT,
                              "tensor " NAME_FMT ": data_offsets [%llu, %llu] overlap tensor "
                              NAME_FMT " [%llu, %llu]",
                              e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                              prev->name, (unsigned long long)prev->begin,
                              (unsigned long long)prev->end);
        if (e->begin > pos) {
            if (!prev)
                return di_err_set(err, DI_ERR_FORMAT,
                                  "tensor " NAME_FMT ": gap of %llu bytes at the start of the "
                                  "data section (first tensor begins at %llu)",
                                  e->name, (unsigned long long)e->begin,
                                  (unsigned long long)e->begin);
            return di_err_set(err, DI_ERR_FORMAT,
                              "tensor " NAME_FMT ": gap of %llu bytes before data_offsets "
                              "[%llu, %llu] (tensor " NAME_FMT " ends at %llu)",
                              e->name, (unsigned long long)(e->begin - pos),
                              (unsigned long long)e->begin, (unsigned long long)e->end,
                              prev->name, (unsigned long long)pos);
        }
        pos = e->end;
        prev = e;
    }
    if (pos > st->data_size)
        return di_err_set(err, DI_ERR_FORMAT,
                          "truncated data: tensors end at byte %llu of the data section but it "
                          "holds only %llu bytes%s" NAME_FMT,
                          (unsigned long long)pos, (unsigned long long)st->data_size,
                          prev ? ", last tensor " : "", prev ? prev->name : "");
    if (pos < st->data_size)
        return di_err_set(err, DI_ERR_FORMAT,
                          "%llu trailing bytes after the last tensor (tensors cover %llu of "
                          "%llu data bytes)",
                          (unsigned long long)(st->data_size - pos), (unsigned long long)pos,
                          (unsigned long long)st->data_size);
    return DI_OK;
}

static di_status header_parse(di_safetensors *st, di_err *err) {
    if (st->size < 8)
        return di_err_set(err, DI_ERR_FORMAT,
                          st->size == 0 ? "empty file (0 bytes)"
                                        : "file too short (%zu bytes) for the 8-byte header length",
                          st->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | st->bytes[i];
    if (n > DI_ST_HEADER_MAX)
        return di_err_set(err, DI_ERR_LIMIT, "header length %llu exceeds the limit of %llu bytes",
                          (unsigned long long)n, DI_ST_HEADER_MAX);
    if (n > st->size - 8)
        return di_err_set(err, DI_ERR_FORMAT,
                          "header length %llu runs past the end of the file (%zu bytes)",
                          (unsigned long long)n, st->size);
    st->header_len = (size_t)n;
    st->data = st->bytes + 8 + n;
    st->data_size = st->size - 8 - (size_t)n;

    cJSON *root;
    di_status s = di_json_parse_strict((const char *)st->bytes + 8, st->header_len, "header", 1,
                                       &root, err);
    if (s) return s;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return di_err_set(err, DI_ERR_FORMAT, "header is not a JSON object");
    }

    size_t count = 0;
    const cJSON *meta = NULL;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (strcmp(c->string, "__metadata__")) count++;
        else if (meta) s = di_err_set(err, DI_ERR_FORMAT, "header has two __metadata__ entries");
        else meta = c;
    }
    if (!s && meta) s = meta_parse(meta, st, err);
    if (!s) {
        st->entries = calloc(count ? count : 1, sizeof *st->entries);
        if (!st->entries) s = di_err_set(err, DI_ERR_NOMEM, "out of memory for %zu tensors", count);
    }
    for (const cJSON *c = root->child; c && !s; c = c->next) {
        if (c == meta) continue;
        di_st_entry *e = &st->entries[st->n_entries];
        s = entry_parse(c, e, err);
        if (s) break;
        e->name = strdup(c->string);
        if (!e->name) s = di_err_set(err, DI_ERR_NOMEM, "out of memory");
        else st->n_entries++;
    }
    cJSON_Delete(root);
    if (!s) s = check_unique_names(st, err);
    if (!s) s = check_layout(st, err);
    return s;
}

static void st_free(di_safetensors *st) {
    for (size_t i = 0; i < st->n_entries; i++) free(st->entries[i].name);
    free(st->entries);
    for (size_t i = 0; i < st->n_meta; i++) {
        free(st->meta[i].key);
        free(st->meta[i].value);
    }
    free(st->meta);
    if (st->mapped && st->size) munmap((void *)st->bytes, st->size);
    free(st->label);
    memset(st, 0, sizeof *st);
}

static di_status st_validate(di_safetensors *st, di_err *err) {
    di_status s = header_parse(st, err);
    if (s) {
        di_err_prefix(err, "%s: ", st->label);
        st_free(st);
    }
    return s;
}

di_status di_safetensors_parse(const void *bytes, size_t size, const char *label,
                               di_safetensors *st, di_err *err) {
    memset(st, 0, sizeof *st);
    if (!bytes && size) return di_err_set(err, DI_ERR_INVALID_ARG, "NULL buffer");
    st->label = strdup(label ? label : "(buffer)");
    if (!st->label) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    st->bytes = bytes;
    st->size = size;
    return st_validate(st, err);
}

di_status di_safetensors_open(const char *path, di_safetensors *st, di_err *err) {
    memset(st, 0, sizeof *st);
    /* O_NONBLOCK: a FIFO or device in place of a file must fail the
     * regular-file check below, not block the open. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return di_err_set(err, DI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return di_err_set(err, DI_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return di_err_set(err, DI_ERR_IO, "%s: not a regular file", path);
    }
    st->label = strdup(path);
    if (!st->label) {
        close(fd);
        return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    }
    st->size = (size_t)sb.st_size;
    if (st->size > 0) {
        void *p = mmap(NULL, st->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            di_err_set(err, DI_ERR_IO, "%s: mmap of %zu bytes failed: %s", path, st->size,
                       strerror(e));
            st->size = 0;
            st_free(st);
            return DI_ERR_IO;
        }
        st->bytes = p;
        st->mapped = 1;
    }
    close(fd);
    return st_validate(st, err);
}

void di_safetensors_close(di_safetensors *st) {
    if (st) st_free(st);
}

void di_safetensors_tensor(const di_safetensors *st, size_t i, di_tensor *out) {
    const di_st_entry *e = &st->entries[i];
    memset(out, 0, sizeof *out);
    out->dtype = e->dtype;
    out->ndim = e->ndim;
    memcpy(out->shape, e->shape, sizeof out->shape);
    out->data = (void *)(st->data + e->begin);
    out->nbytes = (size_t)(e->end - e->begin);
}

const char *di_safetensors_meta(const di_safetensors *st, const char *key) {
    for (size_t i = 0; i < st->n_meta; i++)
        if (!strcmp(st->meta[i].key, key)) return st->meta[i].value;
    return NULL;
}
