/* One safetensors file, validated (ecosystem.md §3.1).
 *
 * Layout: u64 little-endian header length N, N bytes of UTF-8 JSON, then the
 * data section. Opening checks everything the reference reader checks (header
 * size limit, header inside the file, UTF-8, JSON shape, known dtypes,
 * __metadata__ as a string map, shape × dtype == byte span with checked
 * arithmetic, offsets contiguous and covering the data section exactly) and
 * additionally rejects duplicate tensor names, which the reference silently
 * resolves last-wins. Errors name the file (the `label`) and the tensor.
 *
 * Tensor pointers point into the file's bytes; they are not copied. The data
 * section starts at 8 + N, so a tensor is only as aligned as the writer made
 * it (the reference writer pads N to a multiple of 8): consumers that need
 * aligned loads must check or copy. */
#ifndef DI_IO_SAFETENSORS_H
#define DI_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/tensor.h"

/* Same limit as the reference reader: larger headers are rejected before any
 * allocation sized by them. */
#define DI_ST_HEADER_MAX 100000000ull

typedef struct di_st_entry {
    char *name;                 /* owned, NUL-terminated */
    di_dtype dtype;
    int ndim;
    int64_t shape[DI_MAX_DIMS]; /* [ndim] */
    uint64_t begin, end;        /* byte range inside the data section */
} di_st_entry;

typedef struct di_st_meta {
    char *key, *value; /* owned */
} di_st_meta;

typedef struct di_safetensors {
    char *label;              /* file path (or caller's label) for messages, owned */
    const uint8_t *bytes;     /* the whole file [size] */
    size_t size;
    const uint8_t *data;      /* data section [data_size], = bytes + 8 + header_len */
    size_t data_size;
    size_t header_len;
    di_st_entry *entries;     /* [n_entries], sorted by begin offset */
    size_t n_entries;
    di_st_meta *meta;         /* [n_meta], __metadata__ in header order */
    size_t n_meta;
    int mapped;               /* bytes is our mmap (unmapped on close) */
} di_safetensors;

/* Maps `path` read-only and validates it. On failure *st is left closed. */
di_status di_safetensors_open(const char *path, di_safetensors *st, di_err *err);

/* Validates a file image held by the caller (which must outlive *st); `label`
 * names it in messages. Used by the fuzzer and the tests. */
di_status di_safetensors_parse(const void *bytes, size_t size, const char *label,
                               di_safetensors *st, di_err *err);

void di_safetensors_close(di_safetensors *st);

/* View of entry i (0 <= i < n_entries) as a tensor. */
void di_safetensors_tensor(const di_safetensors *st, size_t i, di_tensor *out);

/* Value of a __metadata__ key, or NULL. */
const char *di_safetensors_meta(const di_safetensors *st, const char *key);

#endif
