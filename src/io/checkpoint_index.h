/* model.safetensors.index.json: which shard holds each tensor
 * (ecosystem.md §3.1, architecture.md §8.1). */
#ifndef DI_IO_CHECKPOINT_INDEX_H
#define DI_IO_CHECKPOINT_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "io/name_table.h"

#define DI_CKPT_INDEX_NAME "model.safetensors.index.json"

typedef struct di_ckpt_index {
    char **files;         /* [n_files] distinct shard names, first-appearance order */
    size_t n_files;
    char **names;         /* [n_names] tensor names in document order */
    uint32_t *file_of;    /* [n_names] index into files */
    size_t n_names;
    di_name_table lookup; /* name -> position in names */
    int has_total_size;
    uint64_t total_size;  /* metadata.total_size: bytes of all tensors */
} di_ckpt_index;

/* Parses the index text[0..n). Requires a "weight_map" object of name ->
 * shard file name (a plain name inside the model directory: no '/', not "."
 * or ".."), no duplicate names; "metadata.total_size", when present, must be
 * a non-negative integer. Messages do not carry the file name: the caller
 * prefixes it. */
di_status di_ckpt_index_parse(const char *text, size_t n, di_ckpt_index *ix, di_err *err);
void di_ckpt_index_free(di_ckpt_index *ix);

#endif
