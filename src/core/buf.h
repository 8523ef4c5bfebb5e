/* Growable byte buffer for building text (JSON, rendered prompts, headers).
 *
 * `oom` latches the first allocation failure, so writers append freely and
 * check once at the end; the contents are always NUL-terminated once
 * anything has been written. */
#ifndef DI_CORE_BUF_H
#define DI_CORE_BUF_H

#include <stddef.h>

typedef struct di_buf {
    char *p;
    size_t len, cap;
    int oom;
} di_buf;

void di_buf_put(di_buf *b, const char *s, size_t n);
void di_buf_puts(di_buf *b, const char *s);
void di_buf_printf(di_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void di_buf_free(di_buf *b);
/* Hands the NUL-terminated contents to the caller (NULL after oom). */
char *di_buf_take(di_buf *b);

#endif
