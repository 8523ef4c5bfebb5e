/* The engine loop (docs/engine.md): requests in, the scheduler's plan for a
 * step, the runner's forward, sampling, and post-processing (text, stop
 * strings, constraint matchers, chat parsing).
 *
 * Async scheduling (on by default): the forward of step N runs on a worker
 * thread while this thread post-processes the tokens sampled at step N-1 —
 * detokenization, stop strings, advancing the grammar matchers and filling
 * the masks step N's sampling needs, chat parsing of finished outputs. A
 * sequence whose stop string is found late has one wasted row in step N,
 * which is dropped; the outputs are identical with async off. */
#ifndef DI_ENGINE_ENGINE_H
#define DI_ENGINE_ENGINE_H

#include <stdint.h>

#include "core/threadpool.h"
#include "deepinfer.h"
#include "engine/env.h"
#include "engine/memory.h"
#include "engine/request.h"
#include "engine/runner.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "model/model.h"

/* What the loop needs besides a runner. */
typedef struct di_engine_cfg {
    int64_t max_model_len;
    int max_batch;
    int64_t budget, max_chunk;
    uint64_t memory_limit;
    int async;
    uint64_t seed;
    int32_t eos_id, bos_id;
    /* threads that sample a step's rows (0: one per online core, at most
     * 16 and max_batch); a row's draw never depends on the thread */
    int sample_threads;
} di_engine_cfg;

/* The most top logprobs a request may ask for (logprobs, prompt_logprobs). */
#define DI_ENGINE_MAX_LOGPROBS 20

/* One row of a step to sample: what the draw reads, and what it gives. */
typedef struct di_sample_job {
    di_seq *seq;
    const float *logits;
    di_sample_in in;
    const di_row_greedy *greedy; /* the row's greedy summary instead of logits, or NULL */
    const di_row_top *top;       /* with greedy: the row's top list (top logprobs), or NULL */
    di_sample_out out;
    int32_t top_ids[DI_ENGINE_MAX_LOGPROBS]; /* logprobs' top k */
    float top_lp[DI_ENGINE_MAX_LOGPROBS];
} di_sample_job;

struct di_engine {
    /* what di_engine_open made (NULL / 0 when the engine runs a given runner) */
    di_model *model;
    di_backend *be;
    di_lm lm;
    int has_lm;
    di_tokenizer *own_tok;
    di_env env;
    char *model_path;
    int batch_invariant, n_threads;
    const char *accel_name;
    /* the loop */
    di_engine_cfg cfg;
    di_runner runner;
    const di_tokenizer *tok;   /* may be NULL */
    di_vocab *vocab;           /* constraint vocabulary (NULL without tokenizer) */
    int32_t think_id, think_end_id;
    int64_t text_vocab;        /* ids the tokenizer has text for, when fewer than the model's (else 0) */
    di_memory mem;
    di_scheduler sched;
    di_sampler *samplers;      /* [n_samplers]: one per sampling thread */
    int n_samplers;
    di_threadpool *sample_pool; /* NULL: the calling thread alone */
    di_sample_job *jobs;       /* [max_batch] */
    di_request **reqs;         /* live requests by submit order */
    size_t n_reqs, cap_reqs;
    uint64_t next_id;
    uint64_t *done_ids;        /* finished, not yet polled */
    size_t n_done, cap_done;
    uint64_t n_total, n_finished;
    di_sched_item *items;      /* [max_batch] */
    int rows_on;               /* the runner delivers rows by want (forward_rows) */
    int draws_on;              /* and draws temperature rows next to the logits (DI_ROW_DRAW) */
    int tops_on;               /* and those rows' top logprobs' lists (want.top) */
    int prompt_on;             /* and a step with prompt logprobs by its target rows (out.all_rows) */
    int32_t *target;           /* [cap_rows] such a step's rows' targets (-1: none) */
    di_row_greedy *row_sum;    /* [cap_rows] their summaries */
    float *row_x;              /* [cap_rows] their targets' values */
    di_row_top *row_top;       /* [cap_rows, DI_ENGINE_MAX_LOGPROBS] their top lists */
    int64_t cap_rows;
    di_row_top *top;           /* [max_batch, DI_ENGINE_MAX_LOGPROBS] a step's top lists (top_k a row) */
    di_row_want *want;         /* [max_batch] a step's rows: what each needs */
    di_row_greedy *greedy;     /* [max_batch] their summaries */
    di_row_edit *edits;        /* [cap_edits] a step's edited ids, the rows' lists end to end */
    int64_t n_edits, cap_edits;
    di_seq **failed;           /* [max_batch] */
    float *logits;
    size_t logits_cap;         /* floats */
    di_engine_stats stats;
    double t_start;
};

/* Sets up the loop over a runner (which must outlive e); tok may be NULL. */
di_status di_engine_init(di_engine *e, const di_runner *r, const di_tokenizer *tok, const di_engine_cfg *cfg,
                         di_err *err);
void di_engine_fini(di_engine *e);

/* Validates and queues a request over prompt ids. is_chat / parse_flags:
 * outputs are parsed as a chat message. */
di_status di_engine_add(di_engine *e, const int32_t *ids, size_t n_ids, const di_sampling_params *p,
                        int is_chat, unsigned parse_flags, uint64_t *id, di_err *err);
di_status di_engine_do_step(di_engine *e, size_t *n_active, di_err *err);
di_request *di_engine_find(const di_engine *e, uint64_t id);

double di_now_s(void);

#endif
