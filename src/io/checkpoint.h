/* A checkpoint: the safetensors shards of a model directory, memory-mapped,
 * validated, and indexed by tensor name (architecture.md §8.1, ecosystem.md
 * §3.1). Opening validates every file's header; the tensors are views into
 * the mappings and stay valid until di_checkpoint_close(). */
#ifndef DI_IO_CHECKPOINT_H
#define DI_IO_CHECKPOINT_H

#include <stddef.h>

#include "core/error.h"
#include "core/tensor.h"

typedef struct di_checkpoint di_checkpoint;

typedef struct di_ckpt_tensor {
    const char *name; /* official tensor name, e.g. "layers.0.attn.wq_a.weight" */
    const char *file; /* shard file name (no directory), for error messages */
    di_tensor t;      /* view into the shard's mapping */
} di_ckpt_tensor;

/* Opens `dir`: model.safetensors.index.json + every shard it names, or a
 * single model.safetensors, or every *.safetensors when there is no index. */
di_status di_checkpoint_open(const char *dir, di_checkpoint **out, di_err *err);
void di_checkpoint_close(di_checkpoint *ck);

size_t di_checkpoint_count(const di_checkpoint *ck);
const di_ckpt_tensor *di_checkpoint_at(const di_checkpoint *ck, size_t i);
/* NULL when absent. O(1) average (hash table). */
const di_ckpt_tensor *di_checkpoint_find(const di_checkpoint *ck, const char *name);

#endif
