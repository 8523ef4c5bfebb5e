/* Requests and their sequences (one sequence per completion, n per
 * request): prompt, generated tokens, per-sequence state handle, the text
 * and constraint followers, and the outputs handed to the caller. */
#ifndef DI_ENGINE_REQUEST_H
#define DI_ENGINE_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "deepinfer.h"
#include "engine/row_edits.h"
#include "engine/sampler.h"
#include "engine/stop.h"

typedef enum di_seq_phase {
    DI_SEQ_WAITING = 0,  /* no state: queued (new or preempted) */
    DI_SEQ_RUNNING = 1,  /* has state; prefilling or decoding */
    DI_SEQ_DONE = 2      /* no more tokens; text may still be pending */
} di_seq_phase;

struct di_request;

typedef struct di_seq {
    struct di_request *req;
    int index;                 /* completion index */
    di_seq_phase phase;
    uint64_t order;            /* admission order (FCFS; newest is preempted first) */
    int32_t *tokens;           /* [n_tokens] prompt then output */
    int64_t n_tokens, cap_tokens;
    int64_t n_computed;        /* tokens held by the state */
    void *state;
    uint64_t state_bytes;
    int64_t state_cap;         /* positions the state can hold */
    /* outputs, per output position */
    float *lp;                 /* [cap] sampled-token logprobs */
    int32_t *top_ids;          /* [cap, n_top] */
    float *top_lp;             /* [cap, n_top] */
    double cum_lp;
    /* text and constraint followers, advanced by post-processing */
    char *text;
    size_t text_len, text_cap;
    int64_t n_posted;          /* output tokens post-processed */
    di_detokenizer *detok;
    di_matcher *matcher;
    uint32_t *mask;            /* [(V+31)/32] allowed next tokens (matcher active) */
    int thinking;              /* inside the think block */
    di_seq_edits edits;        /* the ids its processing edits (device draws) */
    int64_t n_think;           /* tokens generated inside it */
    /* end */
    di_finish_reason finish;
    const char *stop_str;      /* into the request's stop list */
    int32_t stop_token;
    char *error;
    int finalized;             /* text complete, chat parsed */
    int retired;               /* out of the scheduler, state freed */
    char *msg_json, *reasoning, *content, *tool_calls;
} di_seq;

typedef struct di_request {
    uint64_t id;
    int32_t *prompt;           /* [n_prompt] */
    int64_t n_prompt;
    di_sampler_params sp;      /* its arrays point into the fields below */
    int32_t *stop_ids;
    int32_t *bias_ids;
    float *bias_values;
    di_stop stop;
    int include_stop;
    int skip_special;
    int64_t max_tokens;
    int32_t logprobs;          /* -1 none */
    int32_t prompt_logprobs;   /* -1 none */
    int64_t thinking_budget;   /* -1 none */
    di_grammar *grammar;       /* NULL: unconstrained */
    int is_chat;
    unsigned parse_flags;      /* DI_CHAT_PARSE_* */
    int n;
    di_seq *seqs;              /* [n] */
    float *prompt_lp;          /* [n_prompt] */
    int32_t *prompt_top_ids;   /* [n_prompt, prompt_logprobs] */
    float *prompt_top_lp;
    int finished, reported;
} di_request;

void di_request_free(di_request *r);

/* Appends a generated token to a sequence (growing its arrays). -1: out of memory. */
int di_seq_append(di_seq *s, int32_t token, float logprob, int32_t n_top);
/* Appends bytes to the sequence's text. -1: out of memory. */
int di_seq_text_add(di_seq *s, const char *b, size_t n);

static inline int64_t di_seq_n_output(const di_seq *s) { return s->n_tokens - s->req->n_prompt; }
/* The message of a sequence that ended in error (NULL otherwise). Its copy
 * is made when the error happens; if even that allocation failed, the
 * sequence still reports why. */
static inline const char *di_seq_error(const di_seq *s) {
    if (s->error) return s->error;
    return s->finish == DI_FINISH_ERROR ? "out of memory" : NULL;
}

#endif
