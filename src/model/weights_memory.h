/* The bound weights of a checkpoint copied out of the shard mappings into one
 * block of memory that the model owns (used by the CPU backend).
 *
 * Why: a safetensors file puts its tensors right after a JSON header whose
 * length is only padded to 8 bytes, so a weight's rows start wherever the
 * header left them; the golden fixtures' start 16 and 56 bytes past a cache
 * line. The CPU kernels stream FP8 and MXFP4 rows in 64-byte vectors, and on
 * such rows every load straddles two lines; a mapped file also sits on 4 KB
 * pages. Copied, each tensor starts on a 64-byte line and the block is on 2 MB
 * pages where the kernel grants them (core/huge_alloc.h). Measured
 * (bench/RESULTS.md, 2026-12-05): on one thread of the 2-vCPU Xeon VM a
 * one-row FP8 product read 11.5 GB/s from rows 16 bytes off a line on 4 KB
 * pages, 12.4 aligned, 12.6 aligned on 2 MB pages, and an engine's decode
 * of a 1.3 GB checkpoint ran 12 % faster copied; on the 16-vCPU Xeon of the
 * GPU host both were the same within its noise (page walks cost less
 * there). The bytes are the same, so are the results. */
#ifndef DI_MODEL_WEIGHTS_MEMORY_H
#define DI_MODEL_WEIGHTS_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "model/config.h"
#include "model/weights.h"

/* Bytes the copy of w's bound tensors takes (each rounded up to 64). */
uint64_t di_weights_memory_bytes(di_weights *w, const di_config *cfg);

/* Copies every bound tensor of w (data != NULL) into a new block, n_threads
 * threads (0: one per core, at most 8) reading the old bytes, and points w's
 * views at the copies. *block receives the block (free() releases it, after
 * the last use of w), *bytes its size. On failure (DI_ERR_NOMEM when the
 * block cannot be had) w is unchanged and *block NULL. */
di_status di_weights_copy_to_memory(di_weights *w, const di_config *cfg, int n_threads, void **block, size_t *bytes,
                                    di_err *err);

#endif
