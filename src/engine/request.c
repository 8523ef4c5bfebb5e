/* Request and sequence storage (see request.h). */
#include "engine/request.h"

#include <stdlib.h>
#include <string.h>

static void seq_free(di_seq *s) {
    free(s->tokens);
    free(s->lp);
    free(s->top_ids);
    free(s->top_lp);
    free(s->text);
    free(s->mask);
    free(s->error);
    free(s->msg_json);
    free(s->reasoning);
    free(s->content);
    free(s->tool_calls);
    if (s->detok) di_detokenizer_free(s->detok);
    if (s->matcher) di_matcher_free(s->matcher);
    di_seq_edits_free(&s->edits);
}

void di_request_free(di_request *r) {
    if (!r) return;
    for (int i = 0; r->seqs && i < r->n; i++) seq_free(&r->seqs[i]);
    free(r->seqs);
    free(r->prompt);
    free(r->stop_ids);
    free(r->bias_ids);
    free(r->bias_values);
    di_stop_free(&r->stop);
    if (r->grammar) di_grammar_free(r->grammar);
    free(r->prompt_lp);
    free(r->prompt_top_ids);
    free(r->prompt_top_lp);
    free(r);
}

int di_seq_append(di_seq *s, int32_t token, float logprob, int32_t n_top) {
    if (s->n_tokens == s->cap_tokens) {
        int64_t cap = s->cap_tokens * 2 + 16;
        int32_t *t = realloc(s->tokens, (size_t)cap * sizeof *t);
        if (!t) return -1;
        s->tokens = t;
        int64_t ocap = cap - s->req->n_prompt;
        float *lp = realloc(s->lp, (size_t)ocap * sizeof *lp);
        if (!lp) return -1;
        s->lp = lp;
        if (n_top > 0) {
            int32_t *ti = realloc(s->top_ids, (size_t)(ocap * n_top) * sizeof *ti);
            if (!ti) return -1;
            s->top_ids = ti;
            float *tl = realloc(s->top_lp, (size_t)(ocap * n_top) * sizeof *tl);
            if (!tl) return -1;
            s->top_lp = tl;
        }
        s->cap_tokens = cap;
    }
    s->lp[s->n_tokens - s->req->n_prompt] = logprob;
    s->tokens[s->n_tokens++] = token;
    s->cum_lp += logprob;
    return 0;
}

int di_seq_text_add(di_seq *s, const char *b, size_t n) {
    if (s->text_len + n + 1 > s->text_cap) {
        size_t cap = (s->text_len + n + 1) * 2;
        char *t = realloc(s->text, cap);
        if (!t) return -1;
        s->text = t;
        s->text_cap = cap;
    }
    if (n) memcpy(s->text + s->text_len, b, n);
    s->text_len += n;
    s->text[s->text_len] = 0;
    return 0;
}
