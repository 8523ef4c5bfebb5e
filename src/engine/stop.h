/* Stop strings (ecosystem.md §4.1): matched on the detokenized output, so a
 * stop string split over several tokens (or inside one token, or with a
 * multi-byte character cut between tokens) is found as soon as its last
 * byte is produced. The output text is cut before the match (or after it,
 * with include_stop_str_in_output). */
#ifndef DI_ENGINE_STOP_H
#define DI_ENGINE_STOP_H

#include <stddef.h>

typedef struct di_stop {
    char **str;      /* [n] copies */
    size_t *len;     /* [n] */
    size_t n;
    size_t max_len;
} di_stop;

/* Copies the strings; empty strings are refused (-2); -1 out of memory. */
int di_stop_init(di_stop *s, const char *const *strs, size_t n);
void di_stop_free(di_stop *s);

/* The earliest occurrence in text[0..len) of a stop string that ends at or
 * after byte `from` (the first byte added since the last search). Returns
 * the stop string's index (the first listed wins at equal positions) and
 * its start in *pos, or -1 when none. */
int di_stop_find(const di_stop *s, const char *text, size_t len, size_t from, size_t *pos);

#endif
