/* Growable arrays of the grammar module: doubling capacity. */
#ifndef DI_GRAMMAR_GROW_H
#define DI_GRAMMAR_GROW_H

#include <stdint.h>
#include <stdlib.h>

/* Makes *p (of *cap elements of elem bytes) hold at least need elements;
 * 0, or -1 when out of memory (then *p is unchanged). */
static inline int di_grow(void **p, uint32_t *cap, uint32_t need, size_t elem) {
    if (need <= *cap) return 0;
    uint32_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

#endif
