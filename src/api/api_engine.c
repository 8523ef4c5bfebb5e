/* Public API: the generation engine (include/deepinfer.h, "engine"). Opens
 * the model, tokenizer and backend, turns text and chat prompts into ids
 * and hands everything else to src/engine/. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/api_model.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "recipe/chat.h"
#include "recipe/openai.h"

void di_engine_options_default(di_engine_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->load_format = DI_LOAD_AUTO;
    o->dummy_seed = 0x7e57c0deull;
    o->accelerator = DI_ACCEL_ENV;
    o->batch_invariant = -1;
    o->async_scheduling = 1;
}

void di_sampling_params_default(di_sampling_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->n = 1;
    p->temperature = 1.0;
    p->top_p = 1.0;
    p->repetition_penalty = 1.0;
    p->max_tokens = 16;
    p->logprobs = -1;
    p->prompt_logprobs = -1;
    p->skip_special_tokens = 1;
    p->thinking_token_budget = -1;
}

const char *di_finish_reason_name(di_finish_reason r) {
    static const char *names[] = {"none", "stop", "length", "constraint", "error", "abort"};
    return (unsigned)r < sizeof names / sizeof *names ? names[r] : "unknown";
}

di_status di_engine_env_describe(char **out) {
    di_err err = {0};
    di_env env;
    if (!out) return di_err_publish_msg(DI_ERR_INVALID_ARG, "di_engine_env_describe: out is NULL");
    if (di_env_read(&env, NULL, NULL, &err)) return di_err_publish(&err);
    *out = di_env_describe(&env);
    di_env_free(&env);
    return *out ? DI_OK : di_err_publish_msg(DI_ERR_NOMEM, "out of memory");
}

static int file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static di_status open_engine(di_engine *e, const di_engine_options *o, di_err *err) {
    di_status st = di_env_read(&e->env, NULL, NULL, err);
    if (st) return st;
    int accel = o->accelerator == DI_ACCEL_ENV ? (e->env.accelerator ? e->env.accelerator : DI_ACCEL_CPU)
                                               : (int)o->accelerator;
    if (accel != DI_ACCEL_CPU && accel != DI_ACCEL_NVIDIA)
        return di_err_set(err, DI_ERR_INVALID_ARG, "accelerator %d (0 env, 1 cpu, 2 nvidia)", accel);
    e->accel_name = accel == DI_ACCEL_NVIDIA ? "nvidia" : "cpu";
    if (o->max_batch < 0 || o->max_batch > 4096)
        return di_err_set(err, DI_ERR_INVALID_ARG, "max_batch must be in 1..4096 (0: the backend's default), got %d",
                          o->max_batch);
    if (o->max_tokens_per_step < 0)
        return di_err_set(err, DI_ERR_INVALID_ARG,
                          "max_tokens_per_step must be >= 1 (0: the backend's default), got %lld",
                          (long long)o->max_tokens_per_step);
    if (o->max_prefill_chunk < 0 || o->max_model_len < 0 || o->n_threads < 0)
        return di_err_set(err, DI_ERR_INVALID_ARG, "max_prefill_chunk, max_model_len and n_threads must be >= 0");
    /* model folder */
    char path[4096];
    const char *model = o->model ? o->model : e->env.hf_model_dir;
    if (!model) {
        if (o->load_format == DI_LOAD_DUMMY)
            return di_err_set(err, DI_ERR_INVALID_ARG, "dummy weights need a config (model = config.json or its folder)");
        if (di_default_model_path(path, sizeof path)) return di_err_set(err, di_last_status(), "%s", di_last_error());
        model = path;
    }
    e->model_path = strdup(model);
    if (!e->model_path) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    di_model_options mo;
    di_model_options_default(&mo);
    mo.load_format = o->load_format;
    mo.seed = o->dummy_seed;
    /* the CPU kernels read weights copied into memory faster than the
     * files' rows (model/weights_memory.h); a device backend uploads them */
    mo.weights_in_memory = accel == DI_ACCEL_CPU ? -1 : 0;
    if (di_model_open(model, &mo, &e->model)) return di_err_set(err, di_last_status(), "%s", di_last_error());
    const di_config *c = &e->model->cfg;
    /* tokenizer */
    char tpath[4300];
    if (o->tokenizer) snprintf(tpath, sizeof tpath, "%s", o->tokenizer);
    else snprintf(tpath, sizeof tpath, "%s/tokenizer.json", e->model->dir);
    if (o->tokenizer || file_exists(tpath)) {
        if (di_tokenizer_load(tpath, &e->own_tok))
            return di_err_set(err, di_last_status(), "tokenizer: %s", di_last_error());
        if ((int64_t)di_tokenizer_vocab_size(e->own_tok) > c->vocab_size)
            return di_err_set(err, DI_ERR_FORMAT, "%s: %zu token ids but the model's vocab_size is %lld", tpath,
                              di_tokenizer_vocab_size(e->own_tok), (long long)c->vocab_size);
    }
    int32_t *map = NULL;
    if (c->n_engram > 0) {
        if (!e->own_tok)
            return di_err_set(err, DI_ERR_NOT_FOUND,
                              "%s: the model has Engram layers, whose token map comes from tokenizer.json; none found",
                              tpath);
        map = calloc((size_t)c->vocab_size, sizeof *map);
        int ncls = 0;
        if (!map) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
        if (di_tokenizer_engram_map(e->own_tok, map, &ncls)) {
            free(map);
            return di_err_set(err, di_last_status(), "Engram map: %s", di_last_error());
        }
    }
    /* Without CUDA in the build, or without a visible GPU, the CUDA backend
     * refuses with a message saying which. */
    st = accel == DI_ACCEL_NVIDIA ? di_backend_cuda_create(0, &e->be, err)
                                  : di_backend_cpu_create(o->n_threads, &e->be, err);
    /* The CPU kernels use a fixed reduction order per row whatever the
     * batch, so the CPU backend always is batch-invariant; a device backend
     * is told, and then chooses no kernel by the number of rows. */
    e->batch_invariant = o->batch_invariant >= 0 ? o->batch_invariant : e->env.batch_invariant > 0;
    if (!st && e->be->ops->set_batch_invariant) e->be->ops->set_batch_invariant(e->be, e->batch_invariant);
    if (!st) st = di_lm_init(&e->lm, c, &e->model->weights, e->be, o->bf16_numerics ? DI_NUMERICS_BF16 : DI_NUMERICS_FP8,
                             map, err);
    free(map);
    if (st) return st;
    e->has_lm = 1;
    e->n_threads = e->be->n_threads;
    di_runner r;
    di_runner_lm_init(&r, &e->lm);
    int64_t max_len = o->max_model_len ? o->max_model_len : (c->max_position < 65536 ? c->max_position : 65536);
    if (max_len > c->max_position)
        return di_err_set(err, DI_ERR_INVALID_ARG, "max_model_len %lld exceeds the model's max_position_embeddings %lld",
                          (long long)max_len, (long long)c->max_position);
    /* what the options leave at 0 comes from the backend, told what the
     * weights will take of its memory (the Engram tables stay on the host) */
    di_backend_defaults d;
    di_backend_engine_defaults(e->be, e->model->weight_bytes - e->model->engram_table_bytes, &d);
    di_engine_cfg ec = {.max_model_len = max_len, .max_batch = o->max_batch ? o->max_batch : d.max_batch,
                        .budget = o->max_tokens_per_step ? o->max_tokens_per_step : d.step_tokens,
                        .max_chunk = o->max_prefill_chunk, .memory_limit = o->memory_limit ? o->memory_limit : d.state_bytes,
                        .async = o->async_scheduling != 0, .seed = o->seed, .eos_id = c->eos_id, .bos_id = c->bos_id};
    return di_engine_init(e, &r, e->own_tok, &ec, err);
}

static void close_engine(di_engine *e) {
    di_engine_fini(e);
    if (e->has_lm) di_lm_free(&e->lm);
    if (e->be) di_backend_destroy(e->be);
    if (e->model) di_model_close(e->model);
    if (e->own_tok) di_tokenizer_free(e->own_tok);
    di_env_free(&e->env);
    free(e->model_path);
    free(e);
}

di_status di_engine_open(const di_engine_options *opts, di_engine **out) {
    di_err err = {0};
    di_engine_options def;
    if (!out) return di_err_publish_msg(DI_ERR_INVALID_ARG, "di_engine_open: out is NULL");
    *out = NULL;
    if (!opts) {
        di_engine_options_default(&def);
        opts = &def;
    }
    di_engine *e = calloc(1, sizeof *e);
    if (!e) return di_err_publish_msg(DI_ERR_NOMEM, "out of memory");
    if (open_engine(e, opts, &err)) {
        close_engine(e);
        return di_err_publish(&err);
    }
    e->t_start = di_now_s();
    *out = e;
    return DI_OK;
}

void di_engine_close(di_engine *e) {
    if (e) close_engine(e);
}

di_status di_engine_get_info(const di_engine *e, di_engine_info *o) {
    if (!e || !o) return di_err_publish_msg(DI_ERR_INVALID_ARG, "di_engine_get_info: NULL argument");
    memset(o, 0, sizeof *o);
    o->vocab_size = e->runner.vocab;
    o->max_model_len = e->cfg.max_model_len;
    o->bos_id = e->cfg.bos_id;
    o->eos_id = e->cfg.eos_id;
    o->has_tokenizer = e->tok != NULL;
    o->batch_invariant = e->batch_invariant;
    o->async_scheduling = e->cfg.async;
    o->n_threads = e->n_threads;
    o->accelerator = e->accel_name ? e->accel_name : "cpu";
    o->model_path = e->model_path ? e->model_path : "";
    o->max_batch = e->cfg.max_batch;
    o->max_tokens_per_step = e->cfg.budget;
    o->memory_limit = e->cfg.memory_limit;
    o->weights_in_memory = e->model && e->model->weights_mem ? e->model->weights_mem_bytes : 0;
    return DI_OK;
}

const di_tokenizer *di_engine_tokenizer(const di_engine *e) { return e ? e->tok : NULL; }

di_status di_engine_submit_tokens(di_engine *e, const int32_t *ids, size_t n_ids, const di_sampling_params *params,
                                  uint64_t *id) {
    di_err err = {0};
    if (!e) return di_err_publish_msg(DI_ERR_INVALID_ARG, "engine is NULL");
    if (di_engine_add(e, ids, n_ids, params, 0, 0, id, &err)) return di_err_publish(&err);
    return DI_OK;
}

di_status di_engine_submit_text(di_engine *e, const char *text, size_t len, const di_sampling_params *params,
                                uint64_t *id) {
    if (!e) return di_err_publish_msg(DI_ERR_INVALID_ARG, "engine is NULL");
    if (!e->tok) return di_err_publish_msg(DI_ERR_STATE, "text prompts need a tokenizer (the engine has none)");
    if (!text || len == 0) return di_err_publish_msg(DI_ERR_INVALID_ARG, "Prompt cannot be empty");
    int32_t *ids = NULL;
    size_t n = 0;
    if (di_tokenizer_encode(e->tok, text, len, DI_TOKENIZE_PARSE_SPECIAL, &ids, &n)) return di_last_status();
    di_status st = di_engine_submit_tokens(e, ids, n, params, id);
    di_free(ids);
    return st;
}

/* Chat → conversation (for the parse flags and the request's own settings). */
static di_status chat_load(const char *json, size_t len, di_chat *chat, di_sampling *samp, int *is_body, di_err *err) {
    size_t i = 0;
    while (i < len && (json[i] == ' ' || json[i] == '\n' || json[i] == '\t' || json[i] == '\r')) i++;
    di_sampling_init(samp);
    *is_body = i < len && json[i] == '{';
    if (*is_body) {
        di_openai_options oo;
        di_openai_options_default(&oo);
        return di_openai_convert(json, len, &oo, chat, samp, err);
    }
    di_jv *root = NULL;
    di_status st = di_jv_parse(json, len, "chat", &root, err);
    if (st) return st;
    di_chat_init(chat);
    st = di_openai_messages(root, "messages", chat, err);
    di_jv_free(root);
    if (st) di_chat_free(chat);
    return st;
}

di_status di_engine_submit_chat(di_engine *e, const char *json, size_t len, const di_chat_options *chat_opts,
                                const di_sampling_params *params, uint64_t *id) {
    di_err err = {0};
    if (!e) return di_err_publish_msg(DI_ERR_INVALID_ARG, "engine is NULL");
    if (!e->tok) return di_err_publish_msg(DI_ERR_STATE, "chat prompts need a tokenizer (the engine has none)");
    if (!json || !len) return di_err_publish_msg(DI_ERR_INVALID_ARG, "chat: empty JSON");
    di_chat chat;
    di_sampling samp;
    int is_body = 0;
    if (chat_load(json, len, &chat, &samp, &is_body, &err)) {
        di_sampling_free(&samp);
        return di_err_publish(&err);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    di_status st = di_chat_encode(e->tok, json, len, chat_opts, &ids, &n);
    if (st) {
        di_chat_free(&chat);
        di_sampling_free(&samp);
        return st;
    }
    di_sampling_params p;
    char *schema = NULL;
    if (params) p = *params;
    else {
        di_sampling_params_default(&p);
        p.temperature = samp.temperature;
        p.top_p = samp.top_p;
        p.top_k = samp.top_k;
        p.min_p = samp.min_p;
        p.presence_penalty = samp.presence_penalty;
        p.frequency_penalty = samp.frequency_penalty;
        p.repetition_penalty = samp.repetition_penalty;
        p.max_tokens = samp.max_tokens > 0 ? samp.max_tokens : e->cfg.max_model_len - (int64_t)n;
        if (p.max_tokens < 1) p.max_tokens = 1;
        p.has_seq_seed = samp.has_seed;
        p.seq_seed = samp.seed;
        p.stop = (const char *const *)samp.stop;
        p.n_stop = samp.n_stop;
        p.n = samp.n;
        p.logprobs = samp.logprobs ? samp.top_logprobs : -1;
        p.ignore_eos = samp.ignore_eos;
    }
    int has_constraint = p.json_schema || p.regex || p.ebnf || p.choice || p.json_object;
    if (!has_constraint) {
        if (chat.format == DI_CHAT_FORMAT_JSON_OBJECT) p.json_object = 1;
        else if (chat.format == DI_CHAT_FORMAT_JSON_SCHEMA && chat.response_schema) {
            di_buf b = {0};
            di_jv_dump_compact(chat.response_schema, &b);
            schema = di_buf_take(&b);
            p.json_schema = schema;
        } else if (chat.format == DI_CHAT_FORMAT_REGEX && chat.response_regex) p.regex = chat.response_regex;
    }
    /* How to parse the output follows from the same rules the renderer used
     * (open think block, tools, a continued assistant message). */
    unsigned flags = 0;
    if (di_chat_output_flags(json, len, chat_opts, &flags))
        st = di_err_set(&err, di_last_status(), "%s", di_last_error());
    else
        st = di_engine_add(e, ids, n, &p, 1, flags, id, &err);
    free(schema);
    di_free(ids);
    di_chat_free(&chat);
    di_sampling_free(&samp);
    return st ? di_err_publish(&err) : DI_OK;
}

di_status di_engine_abort(di_engine *e, uint64_t id) {
    di_request *r = e ? di_engine_find(e, id) : NULL;
    if (!r) return di_err_publish_msg(DI_ERR_NOT_FOUND, "no request with this id");
    for (int j = 0; j < r->n; j++) {
        di_seq *s = &r->seqs[j];
        if (s->phase != DI_SEQ_DONE) {
            s->phase = DI_SEQ_DONE;
            s->finish = DI_FINISH_ABORT;
        }
    }
    return DI_OK;
}

di_status di_engine_step(di_engine *e, size_t *n_active) {
    di_err err = {0};
    if (!e) return di_err_publish_msg(DI_ERR_INVALID_ARG, "engine is NULL");
    if (di_engine_do_step(e, n_active, &err)) return di_err_publish(&err);
    return DI_OK;
}

di_status di_engine_run(di_engine *e, di_engine_progress_fn progress, void *user) {
    if (!e) return di_err_publish_msg(DI_ERR_INVALID_ARG, "engine is NULL");
    double t0 = di_now_s();
    uint64_t p0 = e->stats.prompt_tokens, o0 = e->stats.output_tokens;
    size_t n_active = 1;
    while (n_active) {
        di_status st = di_engine_step(e, &n_active);
        if (st) return st;
        if (progress) {
            di_engine_progress p = {.requests_done = e->n_finished, .requests_total = e->n_total,
                                    .prompt_tokens = e->stats.prompt_tokens - p0,
                                    .output_tokens = e->stats.output_tokens - o0, .elapsed_s = di_now_s() - t0};
            if (p.elapsed_s > 0) {
                p.prompt_tps = (double)p.prompt_tokens / p.elapsed_s;
                p.output_tps = (double)p.output_tokens / p.elapsed_s;
            }
            if (progress(user, &p)) break;
        }
    }
    return DI_OK;
}

di_status di_engine_poll_finished(di_engine *e, uint64_t *ids, size_t cap, size_t *n) {
    if (!e || !n || (cap && !ids)) return di_err_publish_msg(DI_ERR_INVALID_ARG, "di_engine_poll_finished: NULL argument");
    size_t k = e->n_done < cap ? e->n_done : cap;
    if (k) { /* done_ids may still be NULL: no memcpy from NULL, even of 0 bytes */
        memcpy(ids, e->done_ids, k * sizeof *ids);
        memmove(e->done_ids, e->done_ids + k, (e->n_done - k) * sizeof *ids);
    }
    e->n_done -= k;
    *n = k;
    return DI_OK;
}

di_status di_engine_get_output(const di_engine *e, uint64_t id, di_request_output *o) {
    const di_request *r = e && o ? di_engine_find(e, id) : NULL;
    if (!r) return di_err_publish_msg(DI_ERR_NOT_FOUND, "no request with this id");
    memset(o, 0, sizeof *o);
    o->id = r->id;
    o->finished = r->finished;
    o->prompt_ids = r->prompt;
    o->n_prompt = (size_t)r->n_prompt;
    o->prompt_logprobs = r->prompt_lp;
    o->n_prompt_top = r->prompt_logprobs > 0 ? r->prompt_logprobs : 0;
    o->prompt_top_ids = r->prompt_top_ids;
    o->prompt_top_logprobs = r->prompt_top_lp;
    o->n_completions = (size_t)r->n;
    for (int j = 0; j < r->n && !o->error; j++) o->error = di_seq_error(&r->seqs[j]);
    return DI_OK;
}

di_status di_engine_get_completion(const di_engine *e, uint64_t id, size_t index, di_completion *o) {
    const di_request *r = e && o ? di_engine_find(e, id) : NULL;
    if (!r) return di_err_publish_msg(DI_ERR_NOT_FOUND, "no request with this id");
    if (index >= (size_t)r->n) return di_err_publish_msg(DI_ERR_INVALID_ARG, "completion index out of range");
    const di_seq *s = &r->seqs[index];
    memset(o, 0, sizeof *o);
    o->index = (int32_t)index;
    o->token_ids = s->tokens + r->n_prompt;
    o->n_tokens = (size_t)(s->n_tokens - r->n_prompt);
    o->text = s->text ? s->text : "";
    o->text_len = s->text_len;
    o->finish_reason = s->finalized ? s->finish : DI_FINISH_NONE;
    o->stop_str = s->stop_str;
    o->stop_token = s->stop_token;
    o->error = di_seq_error(s);
    o->cumulative_logprob = s->cum_lp;
    if (r->logprobs >= 0) {
        o->logprobs = s->lp;
        o->n_top = r->logprobs;
        o->top_ids = s->top_ids;
        o->top_logprobs = s->top_lp;
    }
    o->reasoning_content = s->reasoning;
    o->content = s->content;
    o->tool_calls_json = s->tool_calls;
    o->message_json = s->msg_json;
    return DI_OK;
}

di_status di_engine_release(di_engine *e, uint64_t id) {
    di_request *r = e ? di_engine_find(e, id) : NULL;
    if (!r) return di_err_publish_msg(DI_ERR_NOT_FOUND, "no request with this id");
    if (!r->finished) return di_err_publish_msg(DI_ERR_STATE, "request still running (abort it first)");
    for (size_t i = 0; i < e->n_reqs; i++)
        if (e->reqs[i] == r) {
            memmove(e->reqs + i, e->reqs + i + 1, (e->n_reqs - i - 1) * sizeof *e->reqs);
            e->n_reqs--;
            break;
        }
    di_request_free(r);
    return DI_OK;
}

di_status di_engine_get_stats(const di_engine *e, di_engine_stats *o) {
    if (!e || !o) return di_err_publish_msg(DI_ERR_INVALID_ARG, "di_engine_get_stats: NULL argument");
    *o = e->stats;
    return DI_OK;
}
