/* A checkpoint: the safetensors shards of a model directory, memory-mapped,
 * validated, and indexed by tensor name (architecture.md §8.1, ecosystem.md
 * §3.1). Opening validates every file's header; the tensors are views into
 * the mappings and stay valid until di_checkpoint_close(). */
#ifndef DI_IO_CHECKPOINT_H
#define DI_IO_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

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

/* Tells the kernel this process is done with the shards' pages (their
 * tensors were copied elsewhere): the mappings stay valid, and a later read
 * faults the pages in again from the page cache or the disk. A hint. */
void di_checkpoint_drop_pages(const di_checkpoint *ck);

/* Shard files, in load order (each opened once). */
size_t di_checkpoint_file_count(const di_checkpoint *ck);
const char *di_checkpoint_file_name(const di_checkpoint *ck, size_t i); /* no directory */
uint64_t di_checkpoint_file_size(const di_checkpoint *ck, size_t i);    /* whole file */

/* Tensor bytes of one dtype, and of all tensors. */
uint64_t di_checkpoint_dtype_bytes(const di_checkpoint *ck, di_dtype dtype);
uint64_t di_checkpoint_total_bytes(const di_checkpoint *ck);

typedef struct di_ckpt_read_stats {
    uint64_t bytes;    /* tensor bytes read (every tensor, once) */
    double seconds;    /* wall time of the pass */
    uint64_t checksum; /* wrapping sum of the little-endian 64-bit words of
                          each file's data section (tail bytes zero-padded) */
} di_ckpt_read_stats;

/* Reads every byte of every tensor once, in file order, so that a bad page
 * or a short file shows up now rather than mid-inference, and the page cache
 * holds the weights afterwards. */
di_status di_checkpoint_read_all(const di_checkpoint *ck, di_ckpt_read_stats *out, di_err *err);
/* The same with n_threads threads (0 = one per core, at most 4; the default). */
di_status di_checkpoint_read_all_threads(const di_checkpoint *ck, int n_threads,
                                         di_ckpt_read_stats *out, di_err *err);

#endif
