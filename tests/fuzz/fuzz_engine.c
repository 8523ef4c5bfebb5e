/* libFuzzer target: the engine's request path on arbitrary bytes, over a
 * fake runner (logits hashed from each sequence's tokens), so any sampling
 * settings, prompt ids, stop ids, logit biases and memory budgets are
 * tried; with the embedded default tokenizer (first byte odd) also stop
 * strings, constraints, think blocks and thinking budgets; with the first
 * byte's second bit the runner delivers rows by need, drawing rows itself
 * (the plain reference, tests/unit/draw_ref.h) with their edit lists, which
 * must be in range and ascending. A refused request must carry a message; an accepted one must
 * finish within its token limit with a known finish reason, and every
 * byte of state memory must come back. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "model/default_model.h"

#include "../unit/draw_ref.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FV 1024 /* the default tokenizer's vocabulary */

typedef struct fstate {
    int64_t cap, n;
    uint64_t h;
} fstate;

static uint64_t f_bytes(void *ctx, int64_t cap) { return 512 + 8 * (uint64_t)cap; }
static di_status f_new(void *ctx, int64_t cap, void **st, di_err *err) {
    fstate *s = calloc(1, sizeof *s);
    if (!s) return di_err_set(err, DI_ERR_NOMEM, "oom");
    s->cap = cap;
    *st = s;
    return DI_OK;
}
static void f_free(void *ctx, void *st) { free(st); }
static di_status f_forward(void *ctx, const di_runner_seq *seqs, int n, float *logits, int all_rows, di_err *err) {
    int64_t row = 0;
    for (int i = 0; i < n; i++) {
        fstate *s = seqs[i].state;
        for (int64_t j = 0; j < seqs[i].n; j++) {
            if (++s->n > s->cap) abort(); /* the scheduler gave a state too small */
            s->h = di_rng_bits(s->h, (uint64_t)seqs[i].ids[j], 1, 2);
            if (all_rows || j == seqs[i].n - 1) {
                float *o = logits + (all_rows ? row : i) * FV;
                for (int v = 0; v < FV; v++) o[v] = (float)(di_rng_bits(s->h, (uint64_t)v, 3, 4) % 4000) / 500.0f - 4;
            }
            row++;
        }
    }
    return DI_OK;
}
static const di_runner_ops ops = {.state_bytes = f_bytes, .state_new = f_new, .state_free = f_free,
                                  .forward = f_forward};

/* Rows by need over the same logits: the wanted rows' logits, greedy
 * summaries, or draws (near sets wider than 6 left to the host) */
static di_status f_forward_rows(void *ctx, const di_runner_seq *seqs, int n, float *logits, const di_fwd_out *out,
                                di_err *err) {
    int64_t m = 0; /* the pass's rows: one a sequence, or with all_rows every row */
    for (int i = 0; i < n; i++) m += out->all_rows ? seqs[i].n : 1;
    float *all = malloc((size_t)(m ? m : 1) * FV * sizeof *all);
    if (!all) return di_err_set(err, DI_ERR_NOMEM, "oom");
    di_status st = f_forward(ctx, seqs, n, all, out->all_rows, err);
    if (out->all_rows && (!out->target || !out->row_sum || !out->row_x || out->row_k < 0 || out->row_k > 20 ||
                          (out->row_k && !out->row_top)))
        abort();
    for (int64_t r = 0; out->all_rows && r < m && !st; r++) { /* the target rows: ids or -1 */
        const int32_t t = out->target[r];
        if (t < -1 || t >= FV) abort();
        if (t < 0) continue;
        di_row_greedy_of(all + (size_t)r * FV, FV, FV, -1, &out->row_sum[r]);
        out->row_x[r] = all[(size_t)r * FV + (size_t)t];
        if (out->row_k) di_row_top_of(all + (size_t)r * FV, FV, out->row_k, out->row_top + (size_t)r * out->row_k);
    }
    for (int i = 0, end = 0; i < n && !st; i++) {
        const di_row_want *w = &out->want[i];
        end += out->all_rows ? (int)seqs[i].n : 1;
        const float *x = all + (size_t)(end - 1) * FV; /* the sequence's last row */
        if (w->mode == DI_ROW_LOGITS) {
            memcpy(logits + (size_t)i * FV, x, FV * sizeof *x);
        } else if (w->mode == DI_ROW_GREEDY) {
            di_row_greedy_of(x, FV, out->lim, w->ban, &out->greedy[i]);
        } else if (w->mode == DI_ROW_DRAW) {
            const di_row_draw *d = &w->draw;
            if (d->n_edit < 0 || d->e0 < 0 || d->e0 + d->n_edit > out->n_edits || (d->n_edit && !out->edits)) abort();
            for (int32_t j = 0; j < d->n_edit; j++) {
                const int32_t id = out->edits[d->e0 + j].id;
                if (id < 0 || id >= FV || (j && id <= out->edits[d->e0 + j - 1].id)) abort();
            }
            if (!draw_ref(x, FV, out->lim, d, out->edits, 6, &out->greedy[i])) st = DI_ERR_NOMEM;
            if (out->greedy[i].pad) memcpy(logits + (size_t)i * FV, x, FV * sizeof *x);
        }
        /* a top list (top logprobs): only with a summary, within the step's length */
        if (w->top < 0 || w->top > out->top_k || (w->top && (!out->top || (w->mode != DI_ROW_GREEDY && w->mode != DI_ROW_DRAW))))
            abort();
        if (w->top) di_row_top_of(x, FV, out->top_k, out->top + (size_t)i * out->top_k);
    }
    free(all);
    return st;
}
static const di_runner_ops ops_rows = {.state_bytes = f_bytes, .state_new = f_new, .state_free = f_free,
                                       .forward = f_forward, .forward_rows = f_forward_rows};

typedef struct reader {
    const uint8_t *p;
    size_t n;
} reader;

static uint32_t take(reader *r, int bytes) {
    uint32_t v = 0;
    for (int i = 0; i < bytes; i++) {
        v = v << 8 | (r->n ? *r->p : 0);
        if (r->n) r->p++, r->n--;
    }
    return v;
}

static double take_double(reader *r) {
    static const double special[] = {0, 1, -1, 0.5, 2, 1e-9, 1e9, NAN, INFINITY, -INFINITY};
    uint32_t v = take(r, 2);
    if (v < 10) return special[v];
    return (double)(int32_t)(v << 16) / 65536.0 / 8192.0;
}

static const di_tokenizer *default_tokenizer(void) {
    static di_tokenizer *tok;
    static int tried;
    if (!tried) {
        tried = 1;
        for (size_t i = 0; i < di_default_model_asset_count(); i++) {
            const di_asset *a = di_default_model_asset(i);
            if (!strcmp(a->name, "tokenizer.json") &&
                di_tokenizer_load_memory((const char *)a->data, a->size, &tok) != DI_OK)
                abort();
        }
    }
    return tok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    reader rd = {data, size};
    const uint32_t first = take(&rd, 1);
    const di_tokenizer *tok = first & 1 ? default_tokenizer() : NULL;
    const int rows = (first >> 1) & 1; /* rows by need, draws by the runner */
    di_runner runner = {rows ? &ops_rows : &ops, NULL, FV, rows, rows, rows};
    di_engine_cfg cfg = {.max_model_len = 16 + take(&rd, 1), .max_batch = 1 + (int)take(&rd, 1) % 8,
                         .budget = 1 + take(&rd, 1) % 64, .max_chunk = take(&rd, 1) % 16,
                         .memory_limit = 256 + 64 * (uint64_t)take(&rd, 1), .async = (int)take(&rd, 1) & 1,
                         .seed = take(&rd, 4), .eos_id = 1};
    di_engine *e = calloc(1, sizeof *e);
    di_err err = {0};
    if (!e || di_engine_init(e, &runner, tok, &cfg, &err)) abort();
    int n_req = 1 + (int)take(&rd, 1) % 4;
    for (int q = 0; q < n_req; q++) {
        int32_t ids[40], stop_ids[4], bias_ids[4];
        float bias[4];
        size_t n_ids = take(&rd, 1) % 40;
        for (size_t i = 0; i < n_ids; i++) ids[i] = (int32_t)(take(&rd, 2) % 1040) - 4;
        if (n_ids && take(&rd, 1) % 3 == 0) ids[n_ids - 1] = 1019; /* opens a think block */
        di_sampling_params p;
        di_sampling_params_default(&p);
        p.n = (int32_t)(take(&rd, 1) % 5) - 1;
        p.temperature = take_double(&rd);
        p.top_p = take_double(&rd);
        p.top_k = (int32_t)(take(&rd, 1) % 70) - 2;
        p.min_p = take_double(&rd);
        p.presence_penalty = take_double(&rd);
        p.frequency_penalty = take_double(&rd);
        p.repetition_penalty = take_double(&rd);
        p.has_seq_seed = (int)take(&rd, 1) & 1;
        p.seq_seed = take(&rd, 4);
        p.max_tokens = (int64_t)(take(&rd, 1) % 40) - 1;
        p.min_tokens = (int64_t)(take(&rd, 1) % 10) - 1;
        p.ignore_eos = (int)take(&rd, 1) & 1;
        p.logprobs = (int32_t)(take(&rd, 1) % 24) - 2;
        p.prompt_logprobs = (int32_t)(take(&rd, 1) % 24) - 2;
        p.n_stop_token_ids = take(&rd, 1) % 5;
        for (size_t i = 0; i < p.n_stop_token_ids; i++) stop_ids[i] = (int32_t)(take(&rd, 2) % 1040) - 4;
        p.stop_token_ids = stop_ids;
        p.n_logit_bias = take(&rd, 1) % 5;
        for (size_t i = 0; i < p.n_logit_bias; i++) {
            bias_ids[i] = (int32_t)(take(&rd, 2) % 1040) - 4;
            bias[i] = (float)take_double(&rd);
        }
        p.logit_bias_ids = bias_ids;
        p.logit_bias_values = bias;
        p.thinking_token_budget = (int64_t)(take(&rd, 1) % 8) - 2;
        char stops[3][5] = {{0}};
        const char *stop_list[3];
        p.n_stop = take(&rd, 1) % 4;
        for (size_t i = 0; i < p.n_stop; i++) {
            size_t n = take(&rd, 1) % 5;
            for (size_t k = 0; k < n; k++) stops[i][k] = (char)(' ' + take(&rd, 1) % 95);
            stop_list[i] = stops[i];
        }
        p.stop = stop_list;
        p.include_stop_str_in_output = (int)take(&rd, 1) & 1;
        static const char *choices[] = {"ab", "cd", "e"};
        switch (take(&rd, 1) % 6) {
        case 1: p.regex = "[a-c]{1,3}x"; break;
        case 2: p.choice = choices, p.n_choice = 3; break;
        case 3: p.json_object = 1, p.disable_any_whitespace = 1; break;
        case 4: p.ebnf = "root ::= \"x\" [0-9]"; break;
        case 5: p.regex = "[0-9]+", p.json_object = 1; break; /* two: refused */
        }
        uint64_t id;
        di_err e2 = {0};
        if (di_engine_add(e, ids, n_ids, &p, 0, 0, &id, &e2) && !e2.msg[0]) abort();
    }
    size_t active = 1;
    for (int g = 0; active && g < 4000; g++)
        if (di_engine_do_step(e, &active, &err)) abort();
    if (active) abort(); /* every request ends */
    for (size_t i = 0; i < e->n_reqs; i++) {
        const di_request *r = e->reqs[i];
        if (!r->finished) abort();
        for (int j = 0; j < r->n; j++) {
            const di_seq *s = &r->seqs[j];
            int64_t out = s->n_tokens - r->n_prompt;
            if (out > r->max_tokens || s->finish < DI_FINISH_STOP || s->finish > DI_FINISH_ABORT) abort();
            if (s->finish == DI_FINISH_ERROR && !s->error) abort();
            if (s->text && s->text[s->text_len] != 0) abort(); /* NUL-terminated (bytes may hold NULs) */
        }
    }
    if (e->mem.used) abort();
    di_engine_fini(e);
    free(e);
    return 0;
}
