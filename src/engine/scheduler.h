/* The scheduling policy (continuous batching): each step gets a plan of at
 * most max_batch sequences and max_tokens_per_step tokens — one token for
 * every decoding sequence first, then prefill chunks (at most
 * max_prefill_chunk each) for sequences still reading their prompt, then
 * newly admitted sequences in arrival order while their state fits the
 * memory budget.
 *
 * Memory: a sequence is admitted with room for its tokens plus a margin
 * (min(remaining outputs, margin));
 * when it needs more it gets a larger state and recomputes into it. When
 * the budget is short, the newest running sequences are preempted (state
 * freed, requeued at the front, recomputed later — their tokens are kept,
 * so nothing is lost and outputs do not change). A sequence that cannot
 * fit even alone ends with an error naming the sizes. */
#ifndef DI_ENGINE_SCHEDULER_H
#define DI_ENGINE_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/memory.h"
#include "engine/request.h"

typedef struct di_sched_item {
    di_seq *seq;
    int64_t start, n;   /* tokens[start .. start+n) go through the forward */
    int sample;         /* 1: the chunk ends at the last known token: sample after it */
} di_sched_item;

typedef struct di_scheduler {
    di_memory *mem;
    int max_batch;
    int64_t budget;       /* tokens per step */
    int64_t max_chunk;    /* longest prefill chunk */
    int64_t max_len;      /* positions per sequence */
    int64_t margin;       /* room for outputs given at admission (default 128) */
    di_seq **queue;       /* [n_queue] sequences not DONE, in admission order */
    size_t n_queue, cap_queue;
    uint64_t next_order;
    uint64_t preemptions;
} di_scheduler;

void di_scheduler_init(di_scheduler *s, di_memory *mem, int max_batch, int64_t budget, int64_t max_chunk,
                       int64_t max_len);
void di_scheduler_free(di_scheduler *s);
/* Queues a new sequence (phase WAITING). -1: out of memory. */
int di_scheduler_add(di_scheduler *s, di_seq *seq);
/* Frees a DONE or aborted sequence's state and drops it from the queue. */
void di_scheduler_retire(di_scheduler *s, di_seq *seq);
/* Plans one step into items (room for max_batch). Sequences that cannot
 * ever fit are marked DONE with DI_FINISH_ERROR; *n_failed counts them and
 * the first max_batch are listed in failed. */
size_t di_scheduler_plan(di_scheduler *s, di_sched_item *items, di_seq **failed, size_t *n_failed);

#endif
