/* The engine loop (see engine.h; deepinfer.md §1.2, §4, §5). */
#include "engine/engine.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "core/cpu_features.h"

double di_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------ setup */

/* Constraint vocabulary: every token's bytes; special tokens and the think
 * markers are not text and are never allowed by a grammar. */
static di_status build_vocab(di_engine *e, di_err *err) {
    size_t V = (size_t)e->runner.vocab, nt = di_tokenizer_vocab_size(e->tok);
    const uint8_t **bytes = calloc(V, sizeof *bytes);
    size_t *lens = calloc(V, sizeof *lens);
    if (!bytes || !lens) {
        free(bytes);
        free(lens);
        return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < V && i < nt; i++) {
        const char *b;
        size_t n;
        if ((int32_t)i == e->think_id || (int32_t)i == e->think_end_id || di_tokenizer_is_special(e->tok, (int32_t)i))
            continue;
        if (di_tokenizer_token_bytes(e->tok, (int32_t)i, &b, &n) == DI_OK) {
            bytes[i] = (const uint8_t *)b;
            lens[i] = n;
        }
    }
    di_status st = di_vocab_create(V, bytes, lens, e->cfg.eos_id, &e->vocab);
    free(bytes);
    free(lens);
    if (st) {
        di_err_set(err, st, "constraint vocabulary: %s", di_last_error());
        return st;
    }
    return DI_OK;
}

di_status di_engine_init(di_engine *e, const di_runner *r, const di_tokenizer *tok, const di_engine_cfg *cfg,
                         di_err *err) {
    e->cfg = *cfg;
    e->runner = *r;
    e->tok = tok;
    e->think_id = e->think_end_id = -1;
    e->next_id = 1;
    e->text_vocab = 0;
    if (tok) {
        if (di_tokenizer_token_id(tok, "<think>", &e->think_id)) e->think_id = -1;
        if (di_tokenizer_token_id(tok, "</think>", &e->think_end_id)) e->think_end_id = -1;
        di_status st = build_vocab(e, err);
        if (st) return st;
        /* a vocabulary padded past the tokenizer's ids: those ids have no text */
        if ((int64_t)di_tokenizer_vocab_size(tok) < r->vocab) e->text_vocab = (int64_t)di_tokenizer_vocab_size(tok);
    }
    di_memory_init(&e->mem, &e->runner, cfg->memory_limit);
    di_scheduler_init(&e->sched, &e->mem, cfg->max_batch, cfg->budget, cfg->max_chunk, cfg->max_model_len);
    e->items = calloc((size_t)cfg->max_batch, sizeof *e->items);
    e->failed = calloc((size_t)cfg->max_batch, sizeof *e->failed);
    e->jobs = calloc((size_t)cfg->max_batch, sizeof *e->jobs);
    e->want = calloc((size_t)cfg->max_batch, sizeof *e->want);
    e->greedy = calloc((size_t)cfg->max_batch, sizeof *e->greedy);
    e->top = calloc((size_t)cfg->max_batch * DI_ENGINE_MAX_LOGPROBS, sizeof *e->top);
    if (!e->items || !e->failed || !e->jobs || !e->want || !e->greedy || !e->top)
        return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    /* Rows by need where the runner can (a device's greedy rows then never
     * cross the bus); DI_ENGINE_ROWS=0 takes every row's logits (the same
     * tokens and logprobs, bit for bit: an A/B switch for measurements). */
    const char *rv = getenv("DI_ENGINE_ROWS");
    e->rows_on = r->ops->forward_rows != NULL && !(rv && strcmp(rv, "0") == 0);
    /* and its temperature draws next to the logits where the runner can
     * (the same tokens; DI_ENGINE_DRAW=0 reads those rows instead) */
    const char *dv = getenv("DI_ENGINE_DRAW");
    e->draws_on = e->rows_on && r->draws && !(dv && strcmp(dv, "0") == 0);
    /* and the top logprobs' lists of those rows where the runner forms
     * them (DI_ENGINE_TOPS=0 reads the rows of requests with logprobs) */
    const char *tv = getenv("DI_ENGINE_TOPS");
    e->tops_on = e->rows_on && r->tops && !(tv && strcmp(tv, "0") == 0);
    /* and, the same way, the rows of prompt logprobs (by their targets:
     * only summaries, values and top lists come back) */
    e->prompt_on = e->tops_on && r->rows_all;
    /* Sampling threads: a row costs ~0.1-1 ms of host time (a pass or
     * three over the vocabulary), so a batch of 64 on one thread would
     * outlast a GPU's decode step. */
    int nt = cfg->sample_threads > 0 ? cfg->sample_threads : di_cpu_count();
    if (nt > 16 && cfg->sample_threads <= 0) nt = 16;
    if (nt > cfg->max_batch) nt = cfg->max_batch;
    if (nt < 1) nt = 1;
    if (nt > 1) {
        di_status st = di_threadpool_create(nt, &e->sample_pool, err);
        if (st) return di_err_prefix(err, "sampling threads: ");
        nt = di_threadpool_size(e->sample_pool);
    }
    e->samplers = calloc((size_t)nt, sizeof *e->samplers);
    if (!e->samplers) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nt; i++) {
        if (di_sampler_init(&e->samplers[i], r->vocab))
            return di_err_set(err, DI_ERR_NOMEM, "sampler scratch (%lld floats): out of memory", (long long)r->vocab);
        e->n_samplers = i + 1;
    }
    e->stats.memory_limit = cfg->memory_limit;
    return DI_OK;
}

/* p (NULL allowed) given back through the runner's op free_op, or free() where it has none */
static void runner_free(const di_engine *e, void (*free_op)(void *, void *), void *p) {
    if (!p) return;
    if (free_op) free_op(e->runner.ctx, p);
    else free(p);
}

/* The step's edit list (edits_reserve) given back */
static void edits_release(di_engine *e) {
    runner_free(e, e->runner.ops ? e->runner.ops->host_free : NULL, e->edits);
    e->edits = NULL;
    e->cap_edits = 0;
}

static void logits_release(di_engine *e) {
    runner_free(e, e->runner.ops ? e->runner.ops->logits_free : NULL, e->logits);
    e->logits = NULL;
    e->logits_cap = 0;
}

void di_engine_fini(di_engine *e) {
    di_scheduler_free(&e->sched);
    for (size_t i = 0; i < e->n_reqs; i++) di_request_free(e->reqs[i]);
    free(e->reqs);
    free(e->done_ids);
    free(e->items);
    free(e->failed);
    free(e->want);
    free(e->greedy);
    free(e->top);
    e->top = NULL;
    free(e->target);
    free(e->row_sum);
    free(e->row_x);
    free(e->row_top);
    e->target = NULL, e->row_sum = NULL, e->row_x = NULL, e->row_top = NULL;
    e->cap_rows = 0;
    e->want = NULL;
    edits_release(e);
    e->greedy = NULL;
    logits_release(e);
    di_threadpool_destroy(e->sample_pool);
    e->sample_pool = NULL;
    for (int i = 0; i < e->n_samplers; i++) di_sampler_free(&e->samplers[i]);
    free(e->samplers);
    e->samplers = NULL;
    e->n_samplers = 0;
    free(e->jobs);
    e->jobs = NULL;
    if (e->vocab) di_vocab_free(e->vocab);
    e->reqs = NULL;
    e->n_reqs = 0;
}

di_request *di_engine_find(const di_engine *e, uint64_t id) {
    /* ids grow with submit order and reqs stays sorted: binary search */
    size_t lo = 0, hi = e->n_reqs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (e->reqs[mid]->id < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < e->n_reqs && e->reqs[lo]->id == id ? e->reqs[lo] : NULL;
}

/* ------------------------------------------------------------- validation */

#define BAD(...) di_err_set(err, DI_ERR_INVALID_ARG, __VA_ARGS__)

static di_status check_params(const di_engine *e, const di_sampling_params *p, di_err *err) {
    int64_t V = e->runner.vocab;
    if (p->n < 1 || p->n > 64) return BAD("n must be in 1..64, got %d", p->n);
    if (!isfinite(p->temperature) || p->temperature < 0 || p->temperature > 100)
        return BAD("temperature must be in [0, 100] (0 = greedy), got %g", p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1)) return BAD("top_p must be in (0, 1], got %g", p->top_p);
    if (p->top_k < -1) return BAD("top_k must be -1, 0 (all) or positive, got %d", p->top_k);
    if (!(p->min_p >= 0 && p->min_p <= 1)) return BAD("min_p must be in [0, 1], got %g", p->min_p);
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return BAD("presence_penalty must be in [-2, 2], got %g", p->presence_penalty);
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return BAD("frequency_penalty must be in [-2, 2], got %g", p->frequency_penalty);
    if (!(p->repetition_penalty > 0 && p->repetition_penalty <= 2))
        return BAD("repetition_penalty must be in (0, 2], got %g", p->repetition_penalty);
    if (p->max_tokens < 0 || (p->max_tokens == 0 && p->prompt_logprobs < 0))
        return BAD("max_tokens must be at least 1, got %lld", (long long)p->max_tokens);
    if (p->min_tokens < 0 || p->min_tokens > p->max_tokens)
        return BAD("min_tokens must be in [0, max_tokens=%lld], got %lld", (long long)p->max_tokens,
                   (long long)p->min_tokens);
    if (p->logprobs < -1 || p->logprobs > DI_ENGINE_MAX_LOGPROBS)
        return BAD("logprobs must be in 0..%d (or -1: none), got %d", DI_ENGINE_MAX_LOGPROBS, p->logprobs);
    if (p->prompt_logprobs < -1 || p->prompt_logprobs > DI_ENGINE_MAX_LOGPROBS)
        return BAD("prompt_logprobs must be in 0..%d (or -1: none), got %d", DI_ENGINE_MAX_LOGPROBS,
                   p->prompt_logprobs);
    if (p->thinking_token_budget < -1)
        return BAD("thinking_budget must be >= 0 (or -1: none), got %lld", (long long)p->thinking_token_budget);
    if (p->n_stop && !p->stop) return BAD("stop: %zu strings announced but no array", p->n_stop);
    for (size_t i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0]) return BAD("stop[%zu] is empty", i);
    if (p->n_stop && !e->tok) return BAD("stop strings need a tokenizer (the engine has none)");
    if (p->n_stop_token_ids && !p->stop_token_ids) return BAD("stop_token_ids: array missing");
    for (size_t i = 0; i < p->n_stop_token_ids; i++)
        if (p->stop_token_ids[i] < 0 || p->stop_token_ids[i] >= V)
            return BAD("stop_token_ids[%zu] = %d is out of vocabulary (size %lld)", i, p->stop_token_ids[i],
                       (long long)V);
    if (p->n_logit_bias && (!p->logit_bias_ids || !p->logit_bias_values)) return BAD("logit_bias: arrays missing");
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias_ids[i] < 0 || p->logit_bias_ids[i] >= V)
            return BAD("logit_bias token %d is out of vocabulary (size %lld)", p->logit_bias_ids[i], (long long)V);
        if (!(p->logit_bias_values[i] >= -100 && p->logit_bias_values[i] <= 100))
            return BAD("logit_bias value %g for token %d must be in [-100, 100]", p->logit_bias_values[i],
                       p->logit_bias_ids[i]);
    }
    int nc = !!p->json_schema + !!p->regex + !!p->ebnf + (p->choice != NULL || p->n_choice > 0) + !!p->json_object;
    if (nc > 1)
        return BAD("only one structured-output constraint may be set (json_schema, regex, ebnf, choice, "
                   "json_object); got %d",
                   nc);
    if (nc && !e->vocab) return BAD("structured output needs a tokenizer (the engine has none)");
    if (p->choice || p->n_choice) {
        if (!p->choice || !p->n_choice) return BAD("choice: an empty list");
        for (size_t i = 0; i < p->n_choice; i++)
            if (!p->choice[i]) return BAD("choice[%zu] is NULL", i);
    }
    return DI_OK;
}

static di_status compile_constraint(const di_engine *e, const di_sampling_params *p, di_grammar **g, di_err *err) {
    *g = NULL;
    di_grammar_options go;
    di_grammar_options_default(&go);
    if (p->disable_any_whitespace) go.whitespace = DI_WS_COMPACT;
    if (p->disable_additional_properties) go.forbid_additional_properties = 1;
    di_constraint_kind kind;
    const char *text = NULL;
    char *owned = NULL;
    const char *what;
    if (p->json_schema) kind = DI_CONSTRAINT_JSON_SCHEMA, text = p->json_schema, what = "json_schema";
    else if (p->regex) kind = DI_CONSTRAINT_REGEX, text = p->regex, what = "regex";
    else if (p->ebnf) kind = DI_CONSTRAINT_EBNF, text = p->ebnf, what = "ebnf";
    else if (p->json_object) kind = DI_CONSTRAINT_JSON_OBJECT, text = "", what = "json_object";
    else if (p->choice) {
        cJSON *arr = cJSON_CreateStringArray((const char *const *)p->choice, (int)p->n_choice);
        owned = arr ? cJSON_PrintUnformatted(arr) : NULL;
        cJSON_Delete(arr);
        if (!owned) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
        kind = DI_CONSTRAINT_CHOICE, text = owned, what = "choice";
    } else return DI_OK;
    di_status st = di_grammar_compile(e->vocab, kind, text, strlen(text), &go, g);
    free(owned);
    if (st) { /* named once: the regex and EBNF compilers' messages already start with their kind */
        const char *m = di_last_error();
        const size_t w = strlen(what);
        if (!strncasecmp(m, what, w) && m[w] == ':') return di_err_set(err, st, "%s", m);
        return di_err_set(err, st, "%s: %s", what, m);
    }
    return DI_OK;
}

static int push_req(di_engine *e, di_request *r) {
    if (e->n_reqs == e->cap_reqs) {
        size_t cap = e->cap_reqs * 2 + 16;
        di_request **q = realloc(e->reqs, cap * sizeof *q);
        if (!q) return -1;
        e->reqs = q;
        e->cap_reqs = cap;
    }
    e->reqs[e->n_reqs++] = r;
    return 0;
}

static uint64_t mix_seed(uint64_t a, uint64_t b) { return di_rng_bits(a, b, 0x5eed, 0); }

di_status di_engine_add(di_engine *e, const int32_t *ids, size_t n_ids, const di_sampling_params *p,
                        int is_chat, unsigned parse_flags, uint64_t *id, di_err *err) {
    di_sampling_params defaults;
    if (!p) {
        di_sampling_params_default(&defaults);
        p = &defaults;
    }
    if (!id) return BAD("id: NULL");
    if (n_ids == 0 || !ids) return BAD("Prompt cannot be empty");
    int64_t V = e->runner.vocab;
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return BAD("prompt token id %d at position %zu is out of vocabulary (size %lld)", ids[i], i,
                       (long long)V);
    if ((int64_t)n_ids >= e->cfg.max_model_len)
        return BAD("The decoder prompt (length %zu) is longer than the maximum model length of %lld; "
                   "it must leave room for at least one generated token",
                   n_ids, (long long)e->cfg.max_model_len);
    di_status st = check_params(e, p, err);
    if (st) return st;
    di_request *r = calloc(1, sizeof *r);
    if (!r) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    st = compile_constraint(e, p, &r->grammar, err);
    if (st) {
        free(r);
        return st;
    }
    r->n_prompt = (int64_t)n_ids;
    r->prompt = malloc(n_ids * sizeof *r->prompt);
    r->n = p->n;
    r->seqs = calloc((size_t)p->n, sizeof *r->seqs);
    r->stop_ids = malloc((p->n_stop_token_ids + 1) * sizeof *r->stop_ids);
    r->bias_ids = malloc((p->n_logit_bias + 1) * sizeof *r->bias_ids);
    r->bias_values = malloc((p->n_logit_bias + 1) * sizeof *r->bias_values);
    int bad = !r->prompt || !r->seqs || !r->stop_ids || !r->bias_ids || !r->bias_values;
    if (!bad && di_stop_init(&r->stop, p->stop, p->n_stop)) bad = 1;
    if (!bad && p->prompt_logprobs >= 0) {
        int32_t k = p->prompt_logprobs;
        r->prompt_lp = malloc(n_ids * sizeof *r->prompt_lp);
        r->prompt_top_ids = malloc((n_ids * (size_t)k + 1) * sizeof *r->prompt_top_ids);
        r->prompt_top_lp = malloc((n_ids * (size_t)k + 1) * sizeof *r->prompt_top_lp);
        bad = !r->prompt_lp || !r->prompt_top_ids || !r->prompt_top_lp;
        if (!bad) {
            r->prompt_lp[0] = NAN;
            for (int32_t j = 0; j < k; j++) r->prompt_top_ids[j] = -1, r->prompt_top_lp[j] = NAN;
        }
    }
    if (bad) {
        di_request_free(r);
        return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    }
    memcpy(r->prompt, ids, n_ids * sizeof *ids);
    memcpy(r->stop_ids, p->stop_token_ids ? p->stop_token_ids : ids, p->n_stop_token_ids * sizeof *ids);
    if (p->n_logit_bias) {
        memcpy(r->bias_ids, p->logit_bias_ids, p->n_logit_bias * sizeof *r->bias_ids);
        memcpy(r->bias_values, p->logit_bias_values, p->n_logit_bias * sizeof *r->bias_values);
    }
    r->id = e->next_id++;
    r->sp = (di_sampler_params){
        .temperature = p->temperature, .top_p = p->top_p, .min_p = p->min_p, .top_k = p->top_k,
        .presence_penalty = p->presence_penalty, .frequency_penalty = p->frequency_penalty,
        .repetition_penalty = p->repetition_penalty, .bias_ids = r->bias_ids, .bias_values = r->bias_values,
        .n_bias = p->n_logit_bias, .stop_ids = r->stop_ids, .n_stop_ids = p->n_stop_token_ids,
        .eos_id = e->cfg.eos_id, .ignore_eos = p->ignore_eos, .min_tokens = p->min_tokens,
        .seed = p->has_seq_seed ? p->seq_seed : mix_seed(e->cfg.seed, r->id)};
    r->include_stop = p->include_stop_str_in_output;
    r->skip_special = p->skip_special_tokens;
    r->max_tokens = p->max_tokens;
    r->logprobs = p->logprobs;
    r->prompt_logprobs = p->prompt_logprobs;
    r->thinking_budget = p->thinking_token_budget;
    r->is_chat = is_chat;
    r->parse_flags = parse_flags;
    size_t V32 = (size_t)(V + 31) / 32;
    for (int i = 0; i < r->n; i++) {
        di_seq *s = &r->seqs[i];
        s->req = r;
        s->index = i;
        s->stop_token = -1;
        s->tokens = malloc(n_ids * sizeof *s->tokens);
        s->text = calloc(1, 1);
        s->text_cap = 1;
        bad |= !s->tokens || !s->text;
        if (bad) break;
        memcpy(s->tokens, ids, n_ids * sizeof *ids);
        s->n_tokens = s->cap_tokens = (int64_t)n_ids;
        s->thinking = e->think_id >= 0 && ids[n_ids - 1] == e->think_id;
        if (e->tok && di_detokenizer_new(e->tok, DI_DETOK_LOSSY, &s->detok)) bad = 1;
        if (r->grammar) {
            s->mask = malloc(V32 * sizeof *s->mask);
            bad |= !s->mask;
            if (!bad && !s->thinking && di_matcher_create(r->grammar, &s->matcher)) bad = 1;
        }
    }
    if (bad || push_req(e, r)) {
        di_request_free(r);
        return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < r->n; i++)
        if (di_scheduler_add(&e->sched, &r->seqs[i])) {
            /* keep the engine consistent: the request ends with an error */
            r->seqs[i].phase = DI_SEQ_DONE;
            r->seqs[i].finish = DI_FINISH_ERROR;
            r->seqs[i].error = strdup("out of memory while queueing");
        }
    if (r->max_tokens == 0)
        for (int i = 1; i < r->n; i++) { /* prompt logprobs only: completion 0 computes them */
            di_scheduler_retire(&e->sched, &r->seqs[i]);
            r->seqs[i].phase = DI_SEQ_DONE;
            r->seqs[i].finish = DI_FINISH_LENGTH;
        }
    e->n_total++;
    *id = r->id;
    return DI_OK;
}

/* --------------------------------------------------------- post-processing */

static void seq_fail(di_seq *s, di_finish_reason why, const char *msg) {
    s->phase = DI_SEQ_DONE;
    if (!s->finish) s->finish = why;
    if (msg && !s->error) s->error = strdup(msg);
}

static int is_stop_id(const di_request *r, int32_t t) {
    for (size_t i = 0; i < r->sp.n_stop_ids; i++)
        if (r->sp.stop_ids[i] == t) return 1;
    return 0;
}

/* Text, stop strings, thinking and the matcher for one generated token. */
static void post_token(di_engine *e, di_seq *s, int64_t k) {
    di_request *r = s->req;
    int32_t t = s->tokens[r->n_prompt + k];
    int is_last = k == di_seq_n_output(s) - 1;
    if (s->thinking) {
        if (t == e->think_end_id) {
            s->thinking = 0;
            if (r->grammar && !s->matcher && di_matcher_create(r->grammar, &s->matcher))
                seq_fail(s, DI_FINISH_ERROR, "out of memory creating the constraint matcher");
        } else s->n_think++;
    } else if (s->matcher && !(r->sp.ignore_eos && t == e->cfg.eos_id)) {
        if (di_matcher_advance(s->matcher, t)) {
            char msg[200];
            snprintf(msg, sizeof msg, "token %d rejected by the constraint: %s", t, di_last_error());
            seq_fail(s, DI_FINISH_ERROR, msg);
            return;
        }
    }
    /* the ending EOS / stop id adds no text */
    if (is_last && s->stop_token == t && s->finish == DI_FINISH_STOP) return;
    if (!s->detok) return;
    if (r->skip_special && di_tokenizer_is_special(e->tok, t)) return;
    const char *b;
    size_t n;
    if (di_detokenizer_push(s->detok, t, &b, &n)) {
        seq_fail(s, DI_FINISH_ERROR, di_last_error());
        return;
    }
    size_t from = s->text_len;
    if (di_seq_text_add(s, b, n)) {
        seq_fail(s, DI_FINISH_ERROR, "out of memory");
        return;
    }
    size_t pos;
    /* as vLLM: stop strings count only once min_tokens are generated */
    int hit = k + 1 >= r->sp.min_tokens ? di_stop_find(&r->stop, s->text, s->text_len, from, &pos) : -1;
    if (hit >= 0) {
        s->text_len = pos + (r->include_stop ? r->stop.len[hit] : 0);
        s->text[s->text_len] = 0;
        s->stop_str = r->stop.str[hit];
        s->stop_token = -1;
        s->finish = DI_FINISH_STOP;
        s->phase = DI_SEQ_DONE;
        /* tokens after the one completing the stop string are dropped */
        s->n_tokens = r->n_prompt + k + 1;
    }
}

static char *json_field(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return NULL;
    if (cJSON_IsString(v)) return strdup(v->valuestring);
    return cJSON_PrintUnformatted(v);
}

static void finalize(di_engine *e, di_seq *s) {
    di_request *r = s->req;
    if (s->detok && !s->stop_str) {
        const char *b;
        size_t n;
        if (di_detokenizer_flush(s->detok, &b, &n) == DI_OK && n) di_seq_text_add(s, b, n);
    }
    if (r->is_chat && s->finish != DI_FINISH_ERROR) {
        char *msg = NULL;
        if (di_chat_parse(s->text, s->text_len, r->parse_flags, &msg) == DI_OK) {
            s->msg_json = msg;
            cJSON *o = cJSON_Parse(msg);
            if (o) {
                s->reasoning = json_field(o, "reasoning_content");
                s->content = json_field(o, "content");
                s->tool_calls = json_field(o, "tool_calls");
                cJSON_Delete(o);
            }
        }
    }
    (void)e;
    s->finalized = 1;
}

/* Post-processes every pending token of every live sequence, then fills the
 * masks the next sampling needs, and finalizes finished sequences. */
static void post_all(di_engine *e) {
    size_t V32 = (size_t)(e->runner.vocab + 31) / 32;
    for (size_t i = 0; i < e->n_reqs; i++) {
        di_request *r = e->reqs[i];
        if (r->finished) continue;
        for (int j = 0; j < r->n; j++) {
            di_seq *s = &r->seqs[j];
            if (s->finalized) continue;
            while (s->n_posted < di_seq_n_output(s) && !s->error) {
                post_token(e, s, s->n_posted);
                s->n_posted++;
                if (s->stop_str) break;
            }
            if (s->phase != DI_SEQ_DONE && s->matcher && !s->thinking &&
                di_matcher_fill_mask(s->matcher, s->mask, V32))
                seq_fail(s, DI_FINISH_ERROR, di_last_error());
            if (s->phase == DI_SEQ_DONE && (s->n_posted >= di_seq_n_output(s) || s->stop_str || s->error))
                finalize(e, s);
        }
    }
}

/* ----------------------------------------------------------------- stepping */

typedef struct fwd_job {
    const di_runner *runner;
    di_runner_seq *seqs;
    int n;
    float *logits;
    int all_rows;
    int by_rows;    /* forward_rows with out */
    di_fwd_out out;
    di_status st;
    di_err err;
    double secs;
} fwd_job;

static void *fwd_run(void *arg) {
    fwd_job *j = arg;
    double t0 = di_now_s();
    j->st = j->by_rows ? j->runner->ops->forward_rows(j->runner->ctx, j->seqs, j->n, j->logits, &j->out, &j->err)
                       : j->runner->ops->forward(j->runner->ctx, j->seqs, j->n, j->logits, j->all_rows, &j->err);
    j->secs = di_now_s() - t0;
    return NULL;
}

/* A step's sampling in three parts: the rows' inputs (serial), the draws
 * (in parallel: each reads its sequence and logits and writes only its job
 * and its thread's scratch), then their effects on the sequences, in row
 * order (serial). */
static void sample_prepare(di_engine *e, di_sample_job *j, di_seq *s, const float *logits) {
    di_request *r = s->req;
    j->seq = s;
    j->logits = logits;
    j->in = (di_sample_in){.prompt = r->prompt, .n_prompt = r->n_prompt, .output = s->tokens + r->n_prompt,
                           .n_output = di_seq_n_output(s), .mask = (s->matcher && !s->thinking) ? s->mask : NULL,
                           .forced = -1, .stream = (uint64_t)s->index, .vocab_limit = e->text_vocab};
    if (s->thinking && r->thinking_budget >= 0 && s->n_think >= r->thinking_budget && e->think_end_id >= 0)
        j->in.forced = e->think_end_id;
}

static void sample_rows(void *ctx, int64_t begin, int64_t end, int thread) {
    di_engine *e = ctx;
    for (int64_t i = begin; i < end; i++) {
        di_sample_job *j = &e->jobs[i];
        const di_request *r = j->seq->req;
        if (j->greedy && !j->greedy->pad) { /* no logits: the summary decides (row_want) */
            di_sampler_from_greedy(j->greedy, &j->out);
            /* and its top logprobs from the row's top list (di_logprob_topk's
             * ids and values) under the summary's lse (the sampler's) */
            const int32_t k = r->logprobs > 0 ? r->logprobs : 0;
            for (int32_t t = 0; k && j->top && j->out.token >= 0 && t < k; t++) {
                j->top_ids[t] = j->top[t].id;
                j->top_lp[t] = (float)((double)j->top[t].x - j->out.lse);
            }
            continue;
        }
        /* the logits: read as they came, or a draw the backend left to the host */
        di_sampler_sample(&e->samplers[thread], &r->sp, &j->in, j->logits, &j->out);
        int32_t k = r->logprobs > 0 ? r->logprobs : 0;
        /* the sampler's lse: one pass of exponentials a row, not two */
        if (k && j->out.token >= 0) di_logprob_topk(j->logits, e->runner.vocab, j->out.lse, k, j->top_ids, j->top_lp);
    }
}

/* Prompt logprobs of rows [begin, end) of a chunk: row q of the step's
 * logits (from row0) predicts prompt position start + q + 1. */
typedef struct prompt_lp_ctx {
    di_engine *e;
    di_request *r;
    int64_t row0, start;
} prompt_lp_ctx;

static void prompt_lp_rows(void *ctx, int64_t begin, int64_t end, int thread) {
    prompt_lp_ctx *c = ctx;
    di_request *r = c->r;
    int32_t k = r->prompt_logprobs;
    const int64_t V = c->e->runner.vocab;
    for (int64_t q = begin; q < end; q++) {
        int64_t p = c->start + q + 1;
        const float *lg = c->e->logits + (size_t)(c->row0 + q) * (size_t)V;
        r->prompt_lp[p] = di_logprob_top(lg, V, r->prompt[p], k, r->prompt_top_ids + p * k, r->prompt_top_lp + p * k,
                                         NULL);
    }
}

/* How many of item it's rows predict a prompt id whose logprob its
 * request wants (prompt_logprobs; completion 0 computes them): its first
 * ones, up to the prompt's last id; 0 none. */
static int64_t prompt_lp_count(const di_sched_item *it) {
    const di_request *r = it->seq->req;
    if (it->seq->index != 0 || r->prompt_logprobs < 0 || it->start >= r->n_prompt) return 0;
    const int64_t left = r->n_prompt - 1 - it->start;
    return left < it->n ? left : it->n;
}

/* The same from an all-rows pass's target rows (the runner's summaries,
 * values and top lists): di_logprob_top's bits, each logprob the value
 * less the summary's lse (the sampler's). */
static void prompt_lp_targets(const di_engine *e, di_request *r, int64_t row0, int64_t start, int64_t q1, int32_t K) {
    const int32_t k = r->prompt_logprobs;
    for (int64_t q = 0; q < q1; q++) {
        const int64_t p = start + q + 1, row = row0 + q;
        const double lse = di_row_greedy_lse(&e->row_sum[row]);
        r->prompt_lp[p] = (float)((double)e->row_x[row] - lse);
        const di_row_top *t = e->row_top + row * (int64_t)K; /* the step's list length */
        for (int32_t j = 0; j < k; j++) {
            r->prompt_top_ids[p * k + j] = t[j].id;
            r->prompt_top_lp[p * k + j] = (float)((double)t[j].x - lse);
        }
    }
}

/* Room for a step's target rows (an all-rows pass); 0, or -1 when out of
 * memory (the step then reads every row). */
static int rows_reserve(di_engine *e, int64_t rows) {
    if (rows <= e->cap_rows) return 0;
    const int64_t cap = rows + rows / 2 + 64;
    int32_t *t = realloc(e->target, (size_t)cap * sizeof *t);
    if (t) e->target = t;
    di_row_greedy *g = realloc(e->row_sum, (size_t)cap * sizeof *g);
    if (g) e->row_sum = g;
    float *x = realloc(e->row_x, (size_t)cap * sizeof *x);
    if (x) e->row_x = x;
    di_row_top *tp = realloc(e->row_top, (size_t)cap * DI_ENGINE_MAX_LOGPROBS * sizeof *tp);
    if (tp) e->row_top = tp;
    if (!t || !g || !x || !tp) return -1;
    e->cap_rows = cap;
    return 0;
}

static void sample_apply(di_engine *e, const di_sample_job *j) {
    di_seq *s = j->seq;
    di_request *r = s->req;
    int64_t nout = j->in.n_output;
    const di_sample_out out = j->out;
    if (out.token < 0) {
        if (j->in.mask) { /* the constraint allowed nothing that the model rates finite */
            s->finish = DI_FINISH_CONSTRAINT;
            s->phase = DI_SEQ_DONE;
        } else {
            char msg[160];
            snprintf(msg, sizeof msg, "output position %lld: no token has a finite logit (after bias and masks)",
                     (long long)nout);
            seq_fail(s, DI_FINISH_ERROR, msg);
        }
        return;
    }
    int32_t k = r->logprobs > 0 ? r->logprobs : 0;
    if (di_seq_append(s, out.token, out.logprob, k)) {
        seq_fail(s, DI_FINISH_ERROR, "out of memory");
        return;
    }
    if (k) {
        memcpy(s->top_ids + nout * k, j->top_ids, (size_t)k * sizeof *j->top_ids);
        memcpy(s->top_lp + nout * k, j->top_lp, (size_t)k * sizeof *j->top_lp);
    }
    e->stats.output_tokens++;
    int32_t t = out.token;
    if ((t == e->cfg.eos_id && !r->sp.ignore_eos) || is_stop_id(r, t)) {
        s->finish = DI_FINISH_STOP;
        s->stop_token = t;
        s->phase = DI_SEQ_DONE;
    } else if (nout + 1 >= r->max_tokens || s->n_tokens >= e->cfg.max_model_len) {
        s->finish = DI_FINISH_LENGTH;
        s->phase = DI_SEQ_DONE;
    }
}

static int push_done(di_engine *e, uint64_t id) {
    if (e->n_done == e->cap_done) {
        size_t cap = e->cap_done * 2 + 16;
        uint64_t *q = realloc(e->done_ids, cap * sizeof *q);
        if (!q) return -1;
        e->done_ids = q;
        e->cap_done = cap;
    }
    e->done_ids[e->n_done++] = id;
    return 0;
}

static void retire_and_complete(di_engine *e) {
    for (size_t i = 0; i < e->n_reqs; i++) {
        di_request *r = e->reqs[i];
        if (r->finished) continue;
        int all = 1;
        for (int j = 0; j < r->n; j++) {
            di_seq *s = &r->seqs[j];
            if (s->phase == DI_SEQ_DONE && !s->retired) {
                di_scheduler_retire(&e->sched, s);
                s->retired = 1;
            }
            all &= s->finalized;
        }
        if (all) {
            r->finished = 1;
            e->n_finished++;
            push_done(e, r->id);
        }
    }
}

static size_t active(const di_engine *e) { return (size_t)(e->n_total - e->n_finished); }

/* The sampling input of item i's last row, as far as the row's want and
 * edits need it (no mask or forced token: those rows take the logits) */
static di_sample_in item_in(const di_engine *e, size_t i) {
    const di_seq *s = e->items[i].seq;
    const di_request *r = s->req;
    return (di_sample_in){.prompt = r->prompt, .n_prompt = r->n_prompt, .output = s->tokens + r->n_prompt,
                          .n_output = di_seq_n_output(s), .forced = -1, .stream = (uint64_t)s->index};
}

/* What the step's sampling will need of the item's last row, decided before
 * the forward from what the post-processing running beside it cannot change
 * (it only ends sequences, moves the thinking state and the constraint,
 * which are excluded here): nothing when no token is drawn, the greedy
 * summary for an unconstrained plain-greedy draw with no forced token
 * (di_sampler_greedy_ban says which id its processing would ban), a draw
 * next to the logits for any other unconstrained row (n_edit = -1 where
 * its bias, stop ids or penalties need a list of edited ids: edits_build
 * writes them), either with the row's top list where the request wants
 * top logprobs (top; without tops_on such rows take their logits), the
 * logits otherwise. */
static di_row_want row_want(const di_engine *e, size_t i) {
    const di_sched_item *it = &e->items[i];
    const di_seq *s = it->seq;
    const di_request *r = s->req;
    di_row_want w = {.mode = DI_ROW_NONE, .ban = -1};
    if (!it->sample || s->phase != DI_SEQ_RUNNING || s->finish || r->max_tokens == 0) return w;
    w.mode = DI_ROW_LOGITS;
    if (r->grammar || (r->logprobs > 0 && !e->tops_on) || (r->thinking_budget >= 0 && e->think_end_id >= 0))
        return w;
    const int32_t top = r->logprobs > 0 ? r->logprobs : 0; /* its list with the summary */
    const int32_t ban = di_sampler_greedy_ban(&r->sp, di_seq_n_output(s));
    if (ban >= -1) return (di_row_want){.mode = DI_ROW_GREEDY, .ban = ban, .top = top};
    /* a draw without a mask or forced token (excluded above) */
    const di_sample_in in = item_in(e, i);
    if (!e->draws_on || !di_sampler_draw_spec(&r->sp, &in, &w.draw)) return w;
    if (di_sampler_needs_edits(&r->sp, &in)) w.draw.n_edit = -1; /* its list: edits_build */
    w.mode = DI_ROW_DRAW;
    w.top = top;
    return w;
}

/* The draws' edit lists, on the sampling threads: each sequence's list
 * brought up to its outputs (phase 0; its length, an upper bound of the
 * row's, parked in e0; a row without a list form goes to the host), then
 * the rows' lists written at their offsets (phase 1). */
typedef struct edits_ctx {
    di_engine *e;
    int phase;
} edits_ctx;

/* A draw left to the host: its logits, nothing else from the runner. */
static void want_logits(di_row_want *w) {
    w->mode = DI_ROW_LOGITS;
    w->draw.n_edit = 0;
    w->top = 0;
}

/* A draw whose edit list edits_build still has to make (row_want). */
static int edits_pending(const di_row_want *w) { return w->mode == DI_ROW_DRAW && w->draw.n_edit < 0; }

static void edits_rows(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const edits_ctx *c = ctx;
    di_engine *e = c->e;
    for (int64_t i = begin; i < end; i++) {
        di_row_want *w = &e->want[i];
        if (!edits_pending(w)) continue;
        di_seq *s = e->items[i].seq;
        const di_sample_in in = item_in(e, (size_t)i);
        if (c->phase == 0) {
            if (di_seq_edits_update(&s->edits, &s->req->sp, &in) == 1) w->draw.e0 = s->edits.n;
            else want_logits(w); /* no list form, or no memory: the host's */
        } else {
            w->draw.n_edit = (int32_t)di_seq_edits_emit(&s->edits, &s->req->sp, &in, e->edits + w->draw.e0);
        }
    }
}

/* The step's list in the runner's memory (page-locked where a device
 * backend gives it: its upload then needs no staging copy); 0, or -1 when
 * out of memory (nothing kept) */
static int edits_reserve(di_engine *e, int64_t n) {
    if (n <= e->cap_edits) return 0;
    const di_runner_ops *ro = e->runner.ops;
    edits_release(e);
    const int64_t cap = n + n / 2 + 1024;
    const size_t bytes = (size_t)cap * sizeof *e->edits;
    e->edits = ro->host_alloc ? ro->host_alloc(e->runner.ctx, bytes) : malloc(bytes);
    if (!e->edits) return -1;
    e->cap_edits = cap;
    return 0;
}

static void edits_build(di_engine *e, size_t n) {
    e->n_edits = 0;
    int any = 0;
    for (size_t i = 0; i < n && !any; i++) any = edits_pending(&e->want[i]);
    if (!any) return;
    edits_ctx c = {e, 0};
    di_threadpool_for(e->sample_pool, (int64_t)n, 8, edits_rows, &c);
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        di_row_draw *d = &e->want[i].draw;
        if (!edits_pending(&e->want[i])) continue;
        const int64_t len = d->e0;
        d->e0 = total;
        total += len;
    }
    if (total == 0) { /* none has an edit: no list (there may be no buffer yet) */
        for (size_t i = 0; i < n; i++)
            if (edits_pending(&e->want[i])) e->want[i].draw.n_edit = 0;
        return;
    }
    if (edits_reserve(e, total)) { /* no memory: those rows to the host */
        for (size_t i = 0; i < n; i++)
            if (edits_pending(&e->want[i])) want_logits(&e->want[i]);
        return;
    }
    c.phase = 1;
    di_threadpool_for(e->sample_pool, (int64_t)n, 8, edits_rows, &c);
    e->n_edits = total;
}

di_status di_engine_do_step(di_engine *e, size_t *n_active, di_err *err) {
    double t_step = di_now_s();
    size_t nf = 0;
    size_t n = di_scheduler_plan(&e->sched, e->items, e->failed, &nf);
    e->stats.preemptions = e->sched.preemptions;
    int64_t rows = 0;
    int all_rows = 0;
    for (size_t i = 0; i < n; i++) {
        const di_sched_item *it = &e->items[i];
        rows += it->n;
        if (it->seq->index == 0 && it->seq->req->prompt_logprobs >= 0 && it->start < it->seq->req->n_prompt)
            all_rows = 1;
    }
    /* a step with prompt logprobs by its target rows where the runner can
     * (only the sequences' last rows' logits, where wanted, come whole) */
    const int by_targets = all_rows && e->prompt_on && rows_reserve(e, rows) == 0;
    const int whole = all_rows && !by_targets; /* every row's logits to the host */
    size_t need = (size_t)(whole ? rows : (int64_t)n) * (size_t)e->runner.vocab;
    if (need > e->logits_cap) {
        /* the old rows are not kept: every step writes the rows it reads */
        logits_release(e);
        const di_runner_ops *ro = e->runner.ops;
        float *l = ro->logits_alloc ? ro->logits_alloc(e->runner.ctx, need * sizeof *l) : malloc(need * sizeof *l);
        if (!l) return di_err_set(err, DI_ERR_NOMEM, "logits of %zu floats: out of memory", need);
        e->logits = l;
        e->logits_cap = need;
    }
    di_runner_seq rs[n ? n : 1];
    for (size_t i = 0; i < n; i++) {
        rs[i].state = e->items[i].seq->state;
        rs[i].ids = e->items[i].seq->tokens + e->items[i].start;
        rs[i].n = e->items[i].n;
    }
    const int by_rows = e->rows_on && !whole;
    if (by_rows) {
        for (size_t i = 0; i < n; i++) e->want[i] = row_want(e, i);
        edits_build(e, n);
    }
    double t_plan = di_now_s() - t_step;
    fwd_job job = {.runner = &e->runner, .seqs = rs, .n = (int)n, .logits = e->logits, .all_rows = whole};
    int32_t top_k = 0; /* the step's longest top list: every wanting row's length in e->top */
    for (size_t i = 0; by_rows && i < n; i++) top_k = e->want[i].top > top_k ? e->want[i].top : top_k;
    if (by_rows)
        job.out = (di_fwd_out){e->want, e->text_vocab > 0 ? e->text_vocab : e->runner.vocab, e->greedy, e->edits,
                               e->n_edits, e->top, top_k, 0, 0, NULL, NULL, NULL, NULL};
    int32_t row_k = 0; /* the step's longest prompt top list */
    if (by_targets) { /* the rows of prompt logprobs: each predicts the prompt's next id */
        for (size_t i = 0, row = 0; i < n; row += (size_t)e->items[i].n, i++) {
            const di_sched_item *it = &e->items[i];
            const di_request *r = it->seq->req;
            const int64_t q1 = prompt_lp_count(it);
            if (q1 > 0) row_k = r->prompt_logprobs > row_k ? r->prompt_logprobs : row_k;
            for (int64_t q = 0; q < it->n; q++) e->target[row + q] = q < q1 ? r->prompt[it->start + q + 1] : -1;
        }
        job.out.all_rows = 1;
        job.out.row_k = row_k;
        job.out.target = e->target;
        job.out.row_sum = e->row_sum;
        job.out.row_x = e->row_x;
        job.out.row_top = e->row_top;
    }
    job.by_rows = by_rows;
    pthread_t th;
    int threaded = 0;
    if (n) {
        if (e->cfg.async && pthread_create(&th, NULL, fwd_run, &job) == 0) threaded = 1;
        else fwd_run(&job);
    }
    double t_host = di_now_s();
    post_all(e);
    double host_post = di_now_s() - t_host;
    if (threaded) pthread_join(th, NULL);
    if (n) {
        e->stats.forward_s += job.secs;
        if (threaded) e->stats.overlap_s += host_post < job.secs ? host_post : job.secs;
    }
    if (n && job.st) {
        *err = job.err;
        /* a runner that fails without a message still fails the step */
        if (err->code == DI_OK) di_err_set(err, job.st, "the runner gave no message");
        return di_err_prefix(err, "forward of a %lld-token batch: ", (long long)rows);
    }
    double t_samp = di_now_s();
    int64_t row = 0;
    size_t n_jobs = 0;
    for (size_t i = 0; i < n; i++) {
        di_sched_item *it = &e->items[i];
        di_seq *s = it->seq;
        di_request *r = s->req;
        s->n_computed = it->start + it->n;
        if (it->start < r->n_prompt) e->stats.prompt_tokens += (uint64_t)it->n;
        const float *last = e->logits + (size_t)(whole ? row + it->n - 1 : (int64_t)i) * (size_t)e->runner.vocab;
        const int64_t q1 = all_rows ? prompt_lp_count(it) : 0;
        if (q1 > 0 && by_targets) {
            prompt_lp_targets(e, r, row, it->start, q1, row_k);
        } else if (q1 > 0) { /* each row's log-softmax is a pass over the vocabulary: on the pool */
            prompt_lp_ctx pc = {e, r, row, it->start};
            di_threadpool_for(e->sample_pool, q1, 4, prompt_lp_rows, &pc);
        }
        row += it->n;
        if (!it->sample || s->phase != DI_SEQ_RUNNING || s->finish) continue;
        if (r->max_tokens == 0) { /* prompt logprobs only */
            s->finish = DI_FINISH_LENGTH;
            s->phase = DI_SEQ_DONE;
            continue;
        }
        sample_prepare(e, &e->jobs[n_jobs], s, last);
        const int32_t mode = by_rows ? e->want[i].mode : DI_ROW_LOGITS;
        const int summary = mode == DI_ROW_GREEDY || mode == DI_ROW_DRAW;
        e->jobs[n_jobs].top = summary && e->want[i].top > 0 ? e->top + i * (size_t)top_k : NULL;
        e->jobs[n_jobs++].greedy = summary ? &e->greedy[i] : NULL;
    }
    if (n_jobs) {
        di_threadpool_for(e->sample_pool, (int64_t)n_jobs, 1, sample_rows, e);
        for (size_t j = 0; j < n_jobs; j++) sample_apply(e, &e->jobs[j]);
    }
    if (n == 0) post_all(e); /* nothing ran: finish the text of the last tokens now */
    retire_and_complete(e);
    double t_end = di_now_s();
    e->stats.host_s += host_post + (t_end - t_samp) + t_plan;
    e->stats.wall_s += t_end - t_step;
    e->stats.steps++;
    e->stats.memory_used = e->mem.used;
    e->stats.memory_peak = e->mem.peak;
    if (n == 0 && nf == 0 && active(e) > 0) {
        /* nothing could be scheduled and nothing failed: cannot happen with a
         * consistent queue, but never spin forever */
        for (size_t i = 0; i < e->n_reqs; i++)
            for (int j = 0; j < e->reqs[i]->n; j++) {
                di_seq *s = &e->reqs[i]->seqs[j];
                if (s->phase != DI_SEQ_DONE) seq_fail(s, DI_FINISH_ERROR, "could not be scheduled");
            }
        post_all(e);
        retire_and_complete(e);
    }
    if (n_active) *n_active = active(e);
    return DI_OK;
}
