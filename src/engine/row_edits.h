/* A sequence's edited ids: the ids whose logits its sampling processing
 * changes (logit bias, stop ids banned before min_tokens, repetition /
 * frequency / presence penalties; engine/sampler.c), kept sorted across
 * steps so that a device drawing the row (backend.h logits_draw) gets the
 * row's list (core/row_exp.h di_row_edit) without the host touching the
 * logits. Built once from the request and the prompt (a sort), then each
 * step's new output tokens are merged in (a search and an insertion each),
 * and a step's list is one pass over it: a long prompt costs its sort
 * once, not at every token. */
#ifndef DI_ENGINE_ROW_EDITS_H
#define DI_ENGINE_ROW_EDITS_H

#include <stdint.h>

#include "core/row_exp.h"
#include "engine/sampler.h"

typedef struct di_edit_entry {
    int32_t id;
    int32_t count;   /* output tokens equal to id so far */
    float bias;      /* has_bias: the request's logit bias */
    uint8_t has_bias, prompt, stop;
    uint8_t pad_;
} di_edit_entry;

typedef struct di_seq_edits {
    di_edit_entry *v; /* [n] ascending ids */
    int64_t n, cap;
    int64_t n_out;    /* output tokens merged in */
    int state;        /* 0 not built; 1 built; -1 the processing has no list form (a
                         biased id given twice: the sampler adds both in turn) */
} di_seq_edits;

void di_seq_edits_free(di_seq_edits *c);

/* Brings c up to in's outputs (in->output[0 .. n_output)), building it
 * from p and in->prompt first. Returns 1 when c holds the row's ids, 0
 * when the processing has no list form (the row then goes to the host),
 * -1 out of memory. Outputs already merged are never read again (a
 * sequence's tokens only grow); fewer outputs than merged rebuilds. */
int di_seq_edits_update(di_seq_edits *c, const di_sampler_params *p, const di_sample_in *in);

/* The row's edits at in's position, ascending ids, into out (room for
 * c->n): returns their number. */
int64_t di_seq_edits_emit(const di_seq_edits *c, const di_sampler_params *p, const di_sample_in *in,
                          di_row_edit *out);

#endif
