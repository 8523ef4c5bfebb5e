/* Stop-string matching over growing text (see stop.h). */
#include "engine/stop.h"

#include <stdlib.h>
#include <string.h>

int di_stop_init(di_stop *s, const char *const *strs, size_t n) {
    memset(s, 0, sizeof *s);
    if (n == 0) return 0;
    s->str = calloc(n, sizeof *s->str);
    s->len = calloc(n, sizeof *s->len);
    if (!s->str || !s->len) { di_stop_free(s); return -1; }
    s->n = n;
    for (size_t i = 0; i < n; i++) {
        if (!strs[i] || !strs[i][0]) { di_stop_free(s); return -2; }
        s->len[i] = strlen(strs[i]);
        s->str[i] = strdup(strs[i]);
        if (!s->str[i]) { di_stop_free(s); return -1; }
        if (s->len[i] > s->max_len) s->max_len = s->len[i];
    }
    return 0;
}

void di_stop_free(di_stop *s) {
    for (size_t i = 0; i < s->n && s->str; i++) free(s->str[i]);
    free(s->str);
    free(s->len);
    memset(s, 0, sizeof *s);
}

int di_stop_find(const di_stop *s, const char *text, size_t len, size_t from, size_t *pos) {
    if (s->n == 0 || len == 0) return -1;
    /* A match ending at or after `from` starts at or after from - max_len + 1. */
    size_t start = from + 1 > s->max_len ? from + 1 - s->max_len : 0;
    for (size_t p = start; p < len; p++)
        for (size_t i = 0; i < s->n; i++)
            if (p + s->len[i] <= len && p + s->len[i] > from && !memcmp(text + p, s->str[i], s->len[i])) {
                *pos = p;
                return (int)i;
            }
    return -1;
}
