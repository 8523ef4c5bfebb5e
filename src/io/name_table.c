/* Name -> index hash table: see name_table.h. */
#include "io/name_table.h"

#include <stdlib.h>
#include <string.h>

/* FNV-1a: tensor names share long prefixes ("layers.12.ffn.experts.7."), and
 * a byte-at-a-time hash spreads them well enough at this size. */
static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

di_status di_name_table_init(di_name_table *t, size_t max_entries, di_err *err) {
    memset(t, 0, sizeof *t);
    size_t cap = 16;
    while (cap < 2 * max_entries) {
        if (cap > SIZE_MAX / 4) return di_err_set(err, DI_ERR_LIMIT, "too many names: %zu", max_entries);
        cap *= 2;
    }
    t->keys = calloc(cap, sizeof *t->keys);
    t->values = calloc(cap, sizeof *t->values);
    if (!t->keys || !t->values) {
        di_name_table_free(t);
        return di_err_set(err, DI_ERR_NOMEM, "out of memory for a table of %zu names", max_entries);
    }
    t->cap = cap;
    return DI_OK;
}

void di_name_table_free(di_name_table *t) {
    free(t->keys);
    free(t->values);
    memset(t, 0, sizeof *t);
}

static size_t slot_of(const di_name_table *t, const char *key) {
    size_t mask = t->cap - 1, i = (size_t)name_hash(key) & mask;
    while (t->keys[i] && strcmp(t->keys[i], key)) i = (i + 1) & mask;
    return i;
}

int di_name_table_insert(di_name_table *t, const char *key, uint32_t value, uint32_t *existing) {
    if (t->count >= t->cap / 2) return -1; /* keeps probing short and finite */
    size_t i = slot_of(t, key);
    if (t->keys[i]) {
        if (existing) *existing = t->values[i];
        return 0;
    }
    t->keys[i] = key;
    t->values[i] = value;
    t->count++;
    return 1;
}

int di_name_table_find(const di_name_table *t, const char *key, uint32_t *value) {
    if (!t->cap) return 0;
    size_t i = slot_of(t, key);
    if (!t->keys[i]) return 0;
    if (value) *value = t->values[i];
    return 1;
}
