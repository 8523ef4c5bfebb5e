#include "core/buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int buf_reserve(di_buf *b, size_t extra) {
    if (b->oom) return -1;
    if (extra > SIZE_MAX - 1 - b->len) { b->oom = 1; return -1; }
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) {
        if (cap > SIZE_MAX / 2) { b->oom = 1; return -1; }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) { b->oom = 1; return -1; }
    b->p = p;
    b->cap = cap;
    return 0;
}

void di_buf_put(di_buf *b, const char *s, size_t n) {
    if (buf_reserve(b, n)) return;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void di_buf_puts(di_buf *b, const char *s) { di_buf_put(b, s, strlen(s)); }

void di_buf_printf(di_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0 || buf_reserve(b, (size_t)k)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)k;
}

void di_buf_free(di_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

char *di_buf_take(di_buf *b) {
    if (b->oom) { di_buf_free(b); return NULL; }
    if (buf_reserve(b, 0)) { di_buf_free(b); return NULL; }
    b->p[b->len] = '\0'; /* a buffer nothing was written to has no terminator yet */
    char *p = b->p;
    memset(b, 0, sizeof *b);
    return p;
}
