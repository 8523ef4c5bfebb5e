/* Per-sequence state budget (see memory.h). */
#include "engine/memory.h"

void di_memory_init(di_memory *m, const di_runner *r, uint64_t limit) {
    m->runner = r;
    m->limit = limit;
    m->used = m->peak = 0;
}

uint64_t di_memory_bytes(const di_memory *m, int64_t capacity) {
    return m->runner->ops->state_bytes(m->runner->ctx, capacity);
}

di_status di_memory_alloc(di_memory *m, int64_t capacity, void **state, uint64_t *bytes, di_err *err) {
    uint64_t b = di_memory_bytes(m, capacity);
    if (m->used + b > m->limit)
        return di_err_set(err, DI_ERR_LIMIT,
                          "sequence state of %lld tokens needs %llu bytes; %llu of the %llu-byte budget are free",
                          (long long)capacity, (unsigned long long)b, (unsigned long long)(m->limit - m->used),
                          (unsigned long long)m->limit);
    di_status st = m->runner->ops->state_new(m->runner->ctx, capacity, state, err);
    if (st) return st;
    m->used += b;
    if (m->used > m->peak) m->peak = m->used;
    *bytes = b;
    return DI_OK;
}

void di_memory_release(di_memory *m, void *state, uint64_t bytes) {
    if (!state) return;
    m->runner->ops->state_free(m->runner->ctx, state);
    m->used -= bytes;
}
