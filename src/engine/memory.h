/* The memory manager: per-sequence state (compressed KV and index caches,
 * window rings, compressor and Engram state) is allocated only through it,
 * against a byte budget. A request that does not fit is refused with
 * DI_ERR_LIMIT, which the scheduler answers by waiting or preempting —
 * running out is never a crash. Sizes come from the runner (the model's
 * per-sequence state). */
#ifndef DI_ENGINE_MEMORY_H
#define DI_ENGINE_MEMORY_H

#include <stdint.h>

#include "engine/runner.h"

typedef struct di_memory {
    const di_runner *runner;
    uint64_t limit, used, peak;
} di_memory;

void di_memory_init(di_memory *m, const di_runner *r, uint64_t limit);
uint64_t di_memory_bytes(const di_memory *m, int64_t capacity);
/* Allocates a state for up to `capacity` tokens. DI_ERR_LIMIT (message
 * with the sizes) when the budget is short. */
di_status di_memory_alloc(di_memory *m, int64_t capacity, void **state, uint64_t *bytes, di_err *err);
void di_memory_release(di_memory *m, void *state, uint64_t bytes);

#endif
