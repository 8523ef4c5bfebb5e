/* Writing safetensors files (ecosystem.md §3.1) the way the reference
 * writer lays them out: tensors ordered by element size (largest first) then
 * name, header = {"__metadata__":{"format":"pt"}, tensors in data order},
 * padded with spaces to a multiple of 8 bytes; and sharded checkpoints with
 * a model.safetensors.index.json (total_size + weight_map sorted by name).
 *
 * Tensors whose view has data == NULL are produced by a fill callback in
 * bounded chunks, so a checkpoint larger than memory (dummy weights) can be
 * written. Files are written in place; callers wanting atomicity write into a
 * temporary folder and rename it. */
#ifndef DI_IO_SAFETENSORS_WRITER_H
#define DI_IO_SAFETENSORS_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/tensor.h"

typedef struct di_st_named {
    const char *name;
    const di_tensor *t; /* dtype, shape, nbytes; data may be NULL (see fill) */
} di_st_named;

/* Produces bytes [offset, offset+n) of tensor `index` (into the caller's
 * array) into dst. */
typedef void (*di_st_fill_fn)(void *ctx, size_t index, uint64_t offset, void *dst, size_t n);

/* Writes tensors[0..n) to `path` as one file. Duplicate names, invalid
 * dtypes, nbytes != numel × size, or a NULL data without fill are errors. */
di_status di_safetensors_write(const char *path, const di_st_named *tensors, size_t n, di_st_fill_fn fill,
                               void *fill_ctx, di_err *err);

/* Writes tensors into `dir` (which must exist) as n_shards files
 * model-0000K-of-0000N.safetensors, split in name order into parts of about
 * equal bytes, plus model.safetensors.index.json. n_shards == 1 still uses
 * the sharded names and writes the index. */
di_status di_safetensors_write_sharded(const char *dir, const di_st_named *tensors, size_t n, int n_shards,
                                       di_st_fill_fn fill, void *fill_ctx, di_err *err);

#endif
