/* The model runner: runs one forward over a batch plan (a chunk of tokens
 * per sequence, each continuing its own state) and returns logits. It also
 * owns how per-sequence state is created and what it costs, so the memory
 * manager and the scheduler never look inside it.
 *
 * The runner is a small table of functions: the real one drives the V4.1
 * forward pass (src/model/forward.h); tests plug in a fake one. */
#ifndef DI_ENGINE_RUNNER_H
#define DI_ENGINE_RUNNER_H

#include <stdint.h>

#include "core/error.h"
#include "model/forward.h"
#include "model/model.h"

typedef struct di_runner_seq {
    void *state;          /* from state_new; the chunk continues it */
    const int32_t *ids;   /* [n] */
    int64_t n;
} di_runner_seq;

typedef struct di_runner_ops {
    /* Bytes a state of capacity max_tokens occupies. */
    uint64_t (*state_bytes)(void *ctx, int64_t max_tokens);
    di_status (*state_new)(void *ctx, int64_t max_tokens, void **state, di_err *err);
    void (*state_free)(void *ctx, void *state);
    /* Logits: all_rows = 0: [n_seqs, V] of each chunk's last row;
     * all_rows = 1: [sum n, V] of every row. Advances every state. */
    di_status (*forward)(void *ctx, const di_runner_seq *seqs, int n_seqs, float *logits,
                         int all_rows, di_err *err);
    /* Optional: forward with all_rows = 0, sequence i's last row delivered
     * as out->want[i] says (model/forward.h, di_forward_rows): its logits
     * at logits + i·V, only its greedy summary, or nothing. NULL: forward
     * alone (every row's logits). */
    di_status (*forward_rows)(void *ctx, const di_runner_seq *seqs, int n_seqs, float *logits,
                              const di_fwd_out *out, di_err *err);
    /* Host memory for the logits buffer: a device runner's is page-locked,
     * so the logits come back in one transfer at the bus's speed. Optional
     * (NULL: malloc / free); NULL on failure. */
    void *(*logits_alloc)(void *ctx, size_t bytes);
    void (*logits_free)(void *ctx, void *p);
    /* Host memory for what a step sends up in bulk (the draws' edit
     * lists): page-locked on a device. Optional (NULL: malloc / free). */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
} di_runner_ops;

typedef struct di_runner {
    const di_runner_ops *ops;
    void *ctx;
    int64_t vocab;        /* V */
    int draws;            /* forward_rows also takes DI_ROW_DRAW rows */
    int tops;             /* and top lists of DI_ROW_GREEDY / _DRAW rows (want.top) */
    int rows_all;         /* and all-rows passes with targets (di_fwd_out.all_rows: prompt logprobs) */
} di_runner;

/* The real runner over a runtime model (lm must outlive it). */
void di_runner_lm_init(di_runner *r, const di_lm *lm);

#endif
