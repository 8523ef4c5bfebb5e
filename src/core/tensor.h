/* A tensor view: element type, shape and a pointer to bytes owned elsewhere
 * (an mmap'd checkpoint shard, a dummy-weight arena, a backend buffer).
 * Shapes are row-major, outermost first, as in safetensors: a Linear weight
 * [out, in] has shape {out, in}. */
#ifndef DI_CORE_TENSOR_H
#define DI_CORE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

#define DI_MAX_DIMS 8

typedef struct di_tensor {
    di_dtype dtype;
    int ndim;                   /* 0..DI_MAX_DIMS (0 = scalar) */
    int64_t shape[DI_MAX_DIMS];
    void *data;                 /* not owned */
    size_t nbytes;              /* numel * dtype size */
} di_tensor;

static inline int64_t di_tensor_numel(const di_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

#endif
