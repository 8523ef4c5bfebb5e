#include "core/file_read.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

di_status di_file_read_stream(FILE *f, const char *name, size_t max_bytes, char **buf, size_t *len, di_err *err) {
    char *p = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            if (max_bytes && n > max_bytes) {
                free(p);
                return di_err_set(err, DI_ERR_LIMIT, "%s: larger than %zu bytes", name, max_bytes);
            }
            /* One byte past the limit is enough to tell "too large". */
            size_t next = cap ? cap * 2 : 1 << 16;
            if (max_bytes && next > max_bytes + 1) next = max_bytes + 1;
            char *q = realloc(p, next + 1); /* + 1: the NUL */
            if (!q) {
                free(p);
                return di_err_set(err, DI_ERR_NOMEM, "%s: out of memory", name);
            }
            p = q;
            cap = next;
        }
        size_t got = fread(p + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        free(p);
        return di_err_set(err, DI_ERR_IO, "%s: read error", name);
    }
    p[n] = '\0';
    *buf = p;
    if (len) *len = n;
    return DI_OK;
}

di_status di_file_read(const char *path, size_t max_bytes, char **buf, size_t *len, di_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return di_err_set(err, DI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    di_status st = di_file_read_stream(f, path, max_bytes, buf, len, err);
    fclose(f);
    return st;
}
