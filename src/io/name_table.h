/* Open-addressing hash table from a name to a small index, for tensor lookup
 * by name (architecture.md §8.2: tensors are bound by their official names).
 * Keys are borrowed: the caller keeps them alive while the table is used. */
#ifndef DI_IO_NAME_TABLE_H
#define DI_IO_NAME_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct di_name_table {
    const char **keys; /* [cap], NULL = empty slot */
    uint32_t *values;  /* [cap] */
    size_t cap;        /* power of two, >= 2 * max entries */
    size_t count;
} di_name_table;

/* Sizes the table for up to `max_entries` names. */
di_status di_name_table_init(di_name_table *t, size_t max_entries, di_err *err);
void di_name_table_free(di_name_table *t);

/* Inserts key -> value. If key is already present, returns 0 and stores the
 * existing value in *existing (when non-NULL); returns 1 when inserted, -1
 * when more names arrive than init was sized for. */
int di_name_table_insert(di_name_table *t, const char *key, uint32_t value, uint32_t *existing);

/* 1 and *value when present, else 0. */
int di_name_table_find(const di_name_table *t, const char *key, uint32_t *value);

#endif
