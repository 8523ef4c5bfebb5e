/* OpenAI Chat Completions request conversion (ecosystem.md §4,
 * deepinfer.md §7.1): messages, tools, tool_choice, response_format,
 * thinking switches and sampling settings. */
#include "recipe/openai.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void di_sampling_init(di_sampling *s) {
    memset(s, 0, sizeof *s);
    s->temperature = 1.0;
    s->top_p = 1.0;
    s->repetition_penalty = 1.0;
    s->max_tokens = -1;
    s->n = 1;
}

void di_sampling_free(di_sampling *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n_stop; i++) free(s->stop[i]);
    free(s->stop);
    free(s->model);
    free(s->tool_name);
    di_sampling_init(s);
}

void di_openai_options_default(di_openai_options *o) { o->default_thinking = 1; }

static di_status nomem(di_err *err) {
    return di_err_set(err, DI_ERR_NOMEM, "request: out of memory");
}

static di_status wrong_type(di_err *err, const char *where, const char *field, const char *want,
                            const di_jv *got) {
    return di_err_set(err, DI_ERR_INVALID_ARG, "%s%s%s: expected %s, got %s", where,
                      *where && *field ? "." : "", field, want, di_jv_type_name(got->type));
}

/* A string without NUL bytes (the conversation stores C strings). */
static di_status get_text(const di_jv *v, const char *where, di_err *err) {
    if (v->type != DI_JV_STRING) return wrong_type(err, where, "", "a string", v);
    if (strlen(v->str) != v->len)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "%s: NUL characters are not supported", where);
    return DI_OK;
}

/* Message content: a string, or an array of text parts joined by blank
 * lines (V4.1 joins parts with "\n\n"); null reads as empty. */
static di_status read_content(const di_jv *v, const char *where, di_buf *out, di_err *err) {
    if (!v || v->type == DI_JV_NULL) return DI_OK;
    if (v->type == DI_JV_STRING) {
        di_status st = get_text(v, where, err);
        if (st) return st;
        di_buf_put(out, v->str, v->len);
        return DI_OK;
    }
    if (v->type != DI_JV_ARRAY) return wrong_type(err, where, "", "a string or an array of parts", v);
    for (size_t i = 0; i < v->n; i++) {
        const di_jv *part = v->items[i];
        char loc[160];
        snprintf(loc, sizeof loc, "%.100s[%zu]", where, i);
        if (part->type != DI_JV_OBJECT) return wrong_type(err, loc, "", "an object", part);
        const char *type = di_jv_string(di_jv_get(part, "type"));
        if (!type) return di_err_set(err, DI_ERR_INVALID_ARG, "%s.type: missing", loc);
        if (strcmp(type, "text"))
            return di_err_set(err, DI_ERR_UNSUPPORTED,
                              "%s.type: content part '%s' is not supported (only 'text')", loc, type);
        const di_jv *text = di_jv_get(part, "text");
        if (!text) return di_err_set(err, DI_ERR_INVALID_ARG, "%s.text: missing", loc);
        snprintf(loc, sizeof loc, "%.100s[%zu].text", where, i);
        di_status st = get_text(text, loc, err);
        if (st) return st;
        if (i) di_buf_puts(out, "\n\n");
        di_buf_put(out, text->str, text->len);
    }
    return DI_OK;
}

static di_status read_calls(const di_jv *calls, const char *where, di_chat_msg *m, di_err *err) {
    if (calls->type == DI_JV_NULL) return DI_OK;
    if (calls->type != DI_JV_ARRAY) return wrong_type(err, where, "", "an array", calls);
    for (size_t i = 0; i < calls->n; i++) {
        const di_jv *tc = calls->items[i];
        char loc[160];
        snprintf(loc, sizeof loc, "%.100s[%zu]", where, i);
        if (tc->type != DI_JV_OBJECT) return wrong_type(err, loc, "", "an object", tc);
        const di_jv *type = di_jv_get(tc, "type");
        if (type && (type->type != DI_JV_STRING || strcmp(type->str, "function")))
            return di_err_set(err, DI_ERR_UNSUPPORTED, "%s.type: only 'function' tool calls are supported", loc);
        const di_jv *id = di_jv_get(tc, "id");
        if (id && id->type != DI_JV_NULL && id->type != DI_JV_STRING) return wrong_type(err, loc, "id", "a string", id);
        const di_jv *fn = di_jv_get(tc, "function");
        if (!fn || fn->type != DI_JV_OBJECT)
            return di_err_set(err, DI_ERR_INVALID_ARG, "%s.function: missing or not an object", loc);
        const char *name = di_jv_string(di_jv_get(fn, "name"));
        if (!name) return di_err_set(err, DI_ERR_INVALID_ARG, "%s.function.name: missing or not a string", loc);
        const di_jv *args = di_jv_get(fn, "arguments");
        di_buf text = {0};
        if (!args || args->type == DI_JV_NULL) di_buf_puts(&text, "{}");
        else if (args->type == DI_JV_STRING) di_buf_put(&text, args->str, args->len);
        else if (args->type == DI_JV_OBJECT) di_jv_dump_compact(args, &text); /* lenient: an object */
        else return wrong_type(err, loc, "function.arguments", "a string", args);
        int rc = di_chat_msg_add_call(m, di_jv_string(id), name, text.p ? text.p : "", text.len);
        int oom = text.oom;
        di_buf_free(&text);
        if (rc || oom) return nomem(err);
    }
    return DI_OK;
}

static const char *const MESSAGE_FIELDS[] = {"role", "content", "name", "reasoning_content",
                                             "tool_calls", "tool_call_id", "prefix", "tools", NULL};

static di_status read_tools(const di_jv *tools, const char *where, di_chat *chat, di_chat_msg *system,
                            di_err *err);

static int known(const char *const *list, const char *key) {
    for (; *list; list++)
        if (!strcmp(*list, key)) return 1;
    return 0;
}

di_status di_openai_messages(const di_jv *messages, const char *where, di_chat *chat, di_err *err) {
    if (messages->type != DI_JV_ARRAY) return wrong_type(err, where, "", "an array", messages);
    for (size_t i = 0; i < messages->n; i++) {
        const di_jv *mv = messages->items[i];
        char loc[128];
        snprintf(loc, sizeof loc, "%.100s[%zu]", where, i);
        if (mv->type != DI_JV_OBJECT) return wrong_type(err, loc, "", "an object", mv);
        for (size_t k = 0; k < mv->n; k++)
            if (!known(MESSAGE_FIELDS, mv->keys[k]))
                return di_err_set(err, DI_ERR_UNSUPPORTED, "%s.%s: unsupported message field", loc,
                                  mv->keys[k]);
        const char *role_s = di_jv_string(di_jv_get(mv, "role"));
        if (!role_s) return di_err_set(err, DI_ERR_INVALID_ARG, "%s.role: missing or not a string", loc);
        di_chat_role role;
        if (!strcmp(role_s, "system") || !strcmp(role_s, "developer")) role = DI_CHAT_SYSTEM;
        else if (!strcmp(role_s, "user")) role = DI_CHAT_USER;
        else if (!strcmp(role_s, "assistant")) role = DI_CHAT_ASSISTANT;
        else if (!strcmp(role_s, "tool")) role = DI_CHAT_TOOL;
        else if (!strcmp(role_s, "latest_reminder")) role = DI_CHAT_LATEST_REMINDER;
        else
            return di_err_set(err, DI_ERR_UNSUPPORTED,
                              "%s.role: '%s' is not supported (system, developer, user, assistant, "
                              "tool, latest_reminder)", loc, role_s);
        char cloc[160];
        snprintf(cloc, sizeof cloc, "%.100s.content", loc);
        const di_jv *content = di_jv_get(mv, "content");
        if (!content && role != DI_CHAT_ASSISTANT)
            return di_err_set(err, DI_ERR_INVALID_ARG, "%s: missing", cloc);
        di_buf text = {0};
        di_status st = read_content(content, cloc, &text, err);
        if (st) { di_buf_free(&text); return st; }
        if (text.oom) { di_buf_free(&text); return nomem(err); }
        const di_jv *tools = di_jv_get(mv, "tools");
        if (role == DI_CHAT_SYSTEM && !text.len && !(tools && tools->type == DI_JV_ARRAY && tools->n)) {
            /* DeepSeek's API drops empty system messages */
            di_buf_free(&text);
            continue;
        }
        di_chat_msg *m = di_chat_add(chat, role, text.p ? text.p : "", text.len);
        di_buf_free(&text);
        if (!m) return nomem(err);

        const di_jv *reasoning = di_jv_get(mv, "reasoning_content");
        const di_jv *calls = di_jv_get(mv, "tool_calls");
        const di_jv *call_id = di_jv_get(mv, "tool_call_id");
        const di_jv *prefix = di_jv_get(mv, "prefix");
        if (tools && tools->type != DI_JV_NULL) {
            /* V4.1 extension: a system message may update the tool schemas. */
            if (role != DI_CHAT_SYSTEM)
                return di_err_set(err, DI_ERR_INVALID_ARG, "%s.tools: only allowed on system messages", loc);
            snprintf(cloc, sizeof cloc, "%.100s.tools", loc);
            if ((st = read_tools(tools, cloc, chat, m, err))) return st;
        }
        if (role != DI_CHAT_ASSISTANT) {
            const char *bad = reasoning && reasoning->type != DI_JV_NULL ? "reasoning_content"
                              : calls && calls->type != DI_JV_NULL       ? "tool_calls"
                              : prefix && prefix->type == DI_JV_TRUE     ? "prefix"
                                                                         : NULL;
            if (bad)
                return di_err_set(err, DI_ERR_INVALID_ARG, "%s.%s: only allowed on assistant messages",
                                  loc, bad);
        }
        if (reasoning && reasoning->type != DI_JV_NULL) {
            snprintf(cloc, sizeof cloc, "%.100s.reasoning_content", loc);
            if ((st = get_text(reasoning, cloc, err))) return st;
            if (di_chat_msg_set_reasoning(m, reasoning->str, reasoning->len)) return nomem(err);
        }
        if (calls) {
            snprintf(cloc, sizeof cloc, "%.100s.tool_calls", loc);
            if ((st = read_calls(calls, cloc, m, err))) return st;
        }
        if (call_id && call_id->type != DI_JV_NULL) {
            if (role != DI_CHAT_TOOL)
                return di_err_set(err, DI_ERR_INVALID_ARG, "%s.tool_call_id: only allowed on tool messages", loc);
            snprintf(cloc, sizeof cloc, "%.100s.tool_call_id", loc);
            if ((st = get_text(call_id, cloc, err))) return st;
            if (di_chat_msg_set_tool_call_id(m, call_id->str)) return nomem(err);
        }
        if (prefix && prefix->type != DI_JV_NULL) {
            if (prefix->type != DI_JV_TRUE && prefix->type != DI_JV_FALSE)
                return wrong_type(err, loc, "prefix", "a boolean", prefix);
            if (prefix->type == DI_JV_TRUE && i + 1 != messages->n)
                return di_err_set(err, DI_ERR_INVALID_ARG,
                                  "%s.prefix: only the final message may be continued", loc);
            m->prefix = prefix->type == DI_JV_TRUE;
        }
    }
    return DI_OK;
}

/* ------------------------------------------------------------------ tools */

/* strict function schemas: every object lists all its properties as
 * required and allows no others. A `required` list that names only some
 * properties cannot be made strict and is an error. */
static di_status strict_schema(di_jv *s, const char *where, int depth, di_err *err) {
    if (!s || depth > DI_JV_MAX_DEPTH) return DI_OK;
    if (s->type == DI_JV_ARRAY) {
        for (size_t i = 0; i < s->n; i++) {
            di_status st = strict_schema(s->items[i], where, depth + 1, err);
            if (st) return st;
        }
        return DI_OK;
    }
    if (s->type != DI_JV_OBJECT) return DI_OK;
    for (size_t i = 0; i < s->n; i++) {
        di_status st = strict_schema(s->items[i], where, depth + 1, err);
        if (st) return st;
    }
    const di_jv *props = di_jv_get(s, "properties");
    if (!props || props->type != DI_JV_OBJECT) return DI_OK;
    const di_jv *req = di_jv_get(s, "required");
    if (req) {
        int same = req->type == DI_JV_ARRAY && req->n == props->n;
        for (size_t i = 0; same && i < req->n; i++) {
            const char *name = di_jv_string(req->items[i]);
            same = name && di_jv_get(props, name) != NULL;
        }
        if (!same)
            return di_err_set(err, DI_ERR_INVALID_ARG,
                              "%s: strict schemas must list every property in 'required'", where);
    }
    if (!di_jv_get(s, "additionalProperties") && di_jv_set(s, "additionalProperties", di_jv_new(DI_JV_FALSE)))
        return nomem(err);
    if (!req) {
        di_jv *list = di_jv_new(DI_JV_ARRAY);
        if (!list) return nomem(err);
        for (size_t i = 0; i < props->n; i++)
            if (di_jv_push(list, di_jv_new_string(props->keys[i], props->key_lens[i]))) {
                di_jv_free(list);
                return nomem(err);
            }
        if (di_jv_set(s, "required", list)) return nomem(err);
    }
    return DI_OK;
}

static di_status read_tools(const di_jv *tools, const char *where, di_chat *chat, di_chat_msg *system,
                            di_err *err) {
    if (tools->type == DI_JV_NULL) return DI_OK;
    if (tools->type != DI_JV_ARRAY) return wrong_type(err, where, "", "an array", tools);
    for (size_t i = 0; i < tools->n; i++) {
        const di_jv *t = tools->items[i];
        char loc[160];
        snprintf(loc, sizeof loc, "%.120s[%zu]", where, i);
        if (t->type != DI_JV_OBJECT) return wrong_type(err, loc, "", "an object", t);
        const char *type = di_jv_string(di_jv_get(t, "type"));
        if (!type || strcmp(type, "function"))
            return di_err_set(err, DI_ERR_UNSUPPORTED, "%s.type: only 'function' tools are supported", loc);
        const di_jv *fn = di_jv_get(t, "function");
        if (!fn || fn->type != DI_JV_OBJECT)
            return di_err_set(err, DI_ERR_INVALID_ARG, "%s.function: missing or not an object", loc);
        const di_jv *name = di_jv_get(fn, "name");
        if (!name || name->type != DI_JV_STRING)
            return di_err_set(err, DI_ERR_INVALID_ARG, "%s.function.name: missing or not a string", loc);
        const di_jv *desc = di_jv_get(fn, "description");
        if (desc && desc->type != DI_JV_NULL && desc->type != DI_JV_STRING)
            return wrong_type(err, loc, "function.description", "a string", desc);
        const di_jv *params = di_jv_get(fn, "parameters");
        const di_jv *strict = di_jv_get(fn, "strict");
        if (params && params->type != DI_JV_NULL) {
            /* function arguments are an object: the schema must say so */
            const char *ptype = di_jv_string(di_jv_get(params, "type"));
            if (params->type != DI_JV_OBJECT || !ptype || strcmp(ptype, "object"))
                return di_err_set(err, DI_ERR_INVALID_ARG,
                                  "%s.function.parameters: must be a JSON Schema with \"type\": \"object\"",
                                  loc);
        }
        /* Missing parameters read as an empty schema, as DeepSeek's API does. */
        di_jv *p = params && params->type != DI_JV_NULL ? di_jv_clone(params) : di_jv_new(DI_JV_OBJECT);
        if (!p) return nomem(err);
        di_status st = DI_OK;
        if (strict && strict->type == DI_JV_TRUE) {
            char sloc[200];
            snprintf(sloc, sizeof sloc, "%.140s.function.parameters", loc);
            st = strict_schema(p, sloc, 0, err);
        }
        if (!st && di_chat_add_tool(chat, system, name->str,
                                    desc && desc->type == DI_JV_STRING ? desc->str : NULL, p))
            st = nomem(err);
        di_jv_free(p);
        if (st) return st;
    }
    return DI_OK;
}

/* ---------------------------------------------------------------- request */

static const char *const IGNORED_FIELDS[] = {
    "user", "metadata", "store", "service_tier", "stream_options", "parallel_tool_calls",
    "prompt_cache_key", "safety_identifier", "modalities", NULL};

static di_status number_in(const di_jv *v, const char *field, double lo, double hi, int lo_open,
                           double *out, di_err *err) {
    if (v->type != DI_JV_NUMBER) return wrong_type(err, "", field, "a number", v);
    double d = di_jv_number(v);
    if (!(lo_open ? d > lo : d >= lo) || !(d <= hi))
        return di_err_set(err, DI_ERR_INVALID_ARG, "%s: %s is out of range %c%g, %g]", field, v->str,
                          lo_open ? '(' : '[', lo, hi);
    *out = d;
    return DI_OK;
}

static di_status integer_in(const di_jv *v, const char *field, double lo, double hi, int64_t *out,
                            di_err *err) {
    if (v->type != DI_JV_NUMBER || !di_jv_is_integer(v))
        return di_err_set(err, DI_ERR_INVALID_ARG, "%s: expected an integer", field);
    double d = di_jv_number(v);
    if (d < lo || d > hi)
        return di_err_set(err, DI_ERR_INVALID_ARG, "%s: %s is out of range [%.0f, %.0f]", field,
                          v->str, lo, hi);
    *out = strtoll(v->str, NULL, 10);
    return DI_OK;
}

static di_status read_effort(const char *s, int *thinking_off, di_chat_effort *e, di_err *err) {
    static const struct { const char *name; di_chat_effort e; } map[] = {
        {"minimal", DI_CHAT_EFFORT_LOW}, {"low", DI_CHAT_EFFORT_LOW},
        {"medium", DI_CHAT_EFFORT_HIGH}, {"high", DI_CHAT_EFFORT_HIGH},
        {"xhigh", DI_CHAT_EFFORT_XHIGH}, {"max", DI_CHAT_EFFORT_MAX}, {"ultra", DI_CHAT_EFFORT_MAX}};
    if (!strcmp(s, "none")) { *thinking_off = 1; return DI_OK; }
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (!strcmp(s, map[i].name)) { *e = map[i].e; return DI_OK; }
    return di_err_set(err, DI_ERR_UNSUPPORTED,
                      "reasoning_effort: '%s' is not supported (none, minimal, low, medium, high, "
                      "xhigh, max, ultra)", s);
}

static di_status read_stop(const di_jv *v, di_sampling *s, di_err *err) {
    if (v->type == DI_JV_NULL) return DI_OK;
    size_t n = v->type == DI_JV_ARRAY ? v->n : 1;
    if (v->type != DI_JV_ARRAY && v->type != DI_JV_STRING)
        return wrong_type(err, "", "stop", "a string or an array of strings", v);
    s->stop = calloc(n ? n : 1, sizeof *s->stop);
    if (!s->stop) return nomem(err);
    for (size_t i = 0; i < n; i++) {
        const di_jv *item = v->type == DI_JV_ARRAY ? v->items[i] : v;
        char loc[48];
        snprintf(loc, sizeof loc, "stop[%zu]", i);
        di_status st = get_text(item, loc, err);
        if (st) return st;
        if (!item->len) return di_err_set(err, DI_ERR_INVALID_ARG, "%s: empty stop string", loc);
        if (!(s->stop[s->n_stop] = strdup(item->str))) return nomem(err);
        s->n_stop++;
    }
    return DI_OK;
}

static di_status read_response_format(const di_jv *v, di_chat *chat, di_err *err) {
    if (v->type == DI_JV_NULL) return DI_OK;
    if (v->type != DI_JV_OBJECT) return wrong_type(err, "", "response_format", "an object", v);
    const char *type = di_jv_string(di_jv_get(v, "type"));
    if (!type) return di_err_set(err, DI_ERR_INVALID_ARG, "response_format.type: missing or not a string");
    if (!strcmp(type, "text")) { chat->format = DI_CHAT_FORMAT_TEXT; return DI_OK; }
    if (!strcmp(type, "json_object")) { chat->format = DI_CHAT_FORMAT_JSON_OBJECT; return DI_OK; }
    if (!strcmp(type, "json_schema")) {
        const di_jv *js = di_jv_get(v, "json_schema");
        if (!js || js->type != DI_JV_OBJECT)
            return di_err_set(err, DI_ERR_INVALID_ARG, "response_format.json_schema: missing or not an object");
        const di_jv *schema = di_jv_get(js, "schema");
        if (!schema) return di_err_set(err, DI_ERR_INVALID_ARG, "response_format.json_schema.schema: missing");
        if (schema->type != DI_JV_OBJECT && schema->type != DI_JV_TRUE && schema->type != DI_JV_FALSE)
            return wrong_type(err, "response_format.json_schema", "schema", "an object", schema);
        chat->format = DI_CHAT_FORMAT_JSON_SCHEMA;
        if (!(chat->response_schema = di_jv_clone(schema))) return nomem(err);
        return DI_OK;
    }
    if (!strcmp(type, "regex")) {
        const char *re = di_jv_string(di_jv_get(v, "regex"));
        if (!re) return di_err_set(err, DI_ERR_INVALID_ARG, "response_format.regex: missing or not a string");
        chat->format = DI_CHAT_FORMAT_REGEX;
        if (!(chat->response_regex = strdup(re))) return nomem(err);
        return DI_OK;
    }
    return di_err_set(err, DI_ERR_UNSUPPORTED,
                      "response_format.type: '%s' is not supported (text, json_object, json_schema, regex)",
                      type);
}

static di_status read_tool_choice(const di_jv *v, di_chat *chat, di_sampling *s, di_err *err) {
    if (v->type == DI_JV_NULL) return DI_OK;
    if (v->type == DI_JV_STRING) {
        if (!strcmp(v->str, "auto")) chat->tool_choice = DI_CHAT_TOOL_AUTO;
        else if (!strcmp(v->str, "none")) chat->tool_choice = DI_CHAT_TOOL_NONE;
        else if (!strcmp(v->str, "required")) chat->tool_choice = DI_CHAT_TOOL_REQUIRED;
        else return di_err_set(err, DI_ERR_UNSUPPORTED,
                               "tool_choice: '%s' is not supported (auto, none, required, or a function)", v->str);
        return DI_OK;
    }
    if (v->type != DI_JV_OBJECT) return wrong_type(err, "", "tool_choice", "a string or an object", v);
    const char *type = di_jv_string(di_jv_get(v, "type"));
    const di_jv *fn = di_jv_get(v, "function");
    const char *name = di_jv_string(di_jv_get(fn, "name"));
    if (!type || strcmp(type, "function") || !name)
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "tool_choice: only {\"type\": \"function\", \"function\": {\"name\": ...}} objects are supported");
    int found = 0;
    for (size_t i = 0; i < chat->n_tools; i++) found |= !strcmp(chat->tools[i].name, name);
    if (!found)
        return di_err_set(err, DI_ERR_INVALID_ARG, "tool_choice: function '%s' is not among the tools", name);
    chat->tool_choice = DI_CHAT_TOOL_REQUIRED;
    if (!(s->tool_name = strdup(name))) return nomem(err);
    return DI_OK;
}

/* Top-level fields in the order they are handled; anything else is an
 * error naming it. */
static const char *const REQUEST_FIELDS[] = {
    "model", "messages", "tools", "tool_choice", "response_format", "reasoning_effort", "thinking",
    "chat_template_kwargs", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "max_tokens", "max_completion_tokens", "stop",
    "seed", "n", "stream", "logprobs", "top_logprobs", "ignore_eos", "logit_bias", NULL};

static di_status convert(const di_jv *req, const di_openai_options *opts, di_chat *chat,
                         di_sampling *s, di_err *err) {
    if (req->type != DI_JV_OBJECT) return wrong_type(err, "request", "", "an object", req);
    for (size_t i = 0; i < req->n; i++)
        if (!known(REQUEST_FIELDS, req->keys[i]) && !known(IGNORED_FIELDS, req->keys[i]))
            return di_err_set(err, DI_ERR_UNSUPPORTED, "%s: unsupported request field", req->keys[i]);
    const di_jv *v;
    di_status st;
    if ((v = di_jv_get(req, "model")) && v->type != DI_JV_NULL) {
        if ((st = get_text(v, "model", err))) return st;
        if (!(s->model = strdup(v->str))) return nomem(err);
    }
    const di_jv *messages = di_jv_get(req, "messages");
    if (!messages) return di_err_set(err, DI_ERR_INVALID_ARG, "messages: missing");
    if ((st = di_openai_messages(messages, "messages", chat, err))) return st;
    if ((v = di_jv_get(req, "tools")) && (st = read_tools(v, "tools", chat, NULL, err))) return st;
    if ((v = di_jv_get(req, "tool_choice")) && (st = read_tool_choice(v, chat, s, err))) return st;
    if ((v = di_jv_get(req, "response_format")) && (st = read_response_format(v, chat, err))) return st;

    /* Thinking: explicit switch, then reasoning_effort "none", then the
     * caller's default. */
    int thinking = opts->default_thinking, effort_off = 0;
    if ((v = di_jv_get(req, "reasoning_effort")) && v->type != DI_JV_NULL) {
        if (v->type != DI_JV_STRING) return wrong_type(err, "", "reasoning_effort", "a string", v);
        if ((st = read_effort(v->str, &effort_off, &chat->effort, err))) return st;
        if (effort_off) thinking = 0;
    }
    if ((v = di_jv_get(req, "chat_template_kwargs")) && v->type != DI_JV_NULL) {
        if (v->type != DI_JV_OBJECT) return wrong_type(err, "", "chat_template_kwargs", "an object", v);
        for (size_t i = 0; i < v->n; i++) {
            const char *k = v->keys[i];
            if (strcmp(k, "thinking") && strcmp(k, "enable_thinking"))
                return di_err_set(err, DI_ERR_UNSUPPORTED,
                                  "chat_template_kwargs.%s: unsupported (thinking, enable_thinking)", k);
            if (v->items[i]->type != DI_JV_TRUE && v->items[i]->type != DI_JV_FALSE)
                return wrong_type(err, "chat_template_kwargs", k, "a boolean", v->items[i]);
            thinking = v->items[i]->type == DI_JV_TRUE;
        }
    }
    if ((v = di_jv_get(req, "thinking")) && v->type != DI_JV_NULL) {
        const char *type = di_jv_string(di_jv_get(v, "type"));
        if (v->type != DI_JV_OBJECT || !type)
            return di_err_set(err, DI_ERR_INVALID_ARG, "thinking: expected {\"type\": \"enabled\"|\"disabled\"}");
        if (!strcmp(type, "enabled") || !strcmp(type, "adaptive")) thinking = !effort_off;
        else if (!strcmp(type, "disabled")) thinking = 0;
        else return di_err_set(err, DI_ERR_UNSUPPORTED,
                               "thinking.type: '%s' is not supported (enabled, disabled, adaptive)", type);
    }
    chat->thinking = thinking;
    if (thinking && chat->tool_choice == DI_CHAT_TOOL_REQUIRED)
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "tool_choice: 'required' or a named function is not supported in thinking "
                          "mode (disable thinking)");

    if ((v = di_jv_get(req, "temperature")) && v->type != DI_JV_NULL &&
        (st = number_in(v, "temperature", 0, 2, 0, &s->temperature, err)))
        return st;
    if ((v = di_jv_get(req, "top_p")) && v->type != DI_JV_NULL &&
        (st = number_in(v, "top_p", 0, 1, 1, &s->top_p, err)))
        return st;
    if ((v = di_jv_get(req, "min_p")) && v->type != DI_JV_NULL &&
        (st = number_in(v, "min_p", 0, 1, 0, &s->min_p, err)))
        return st;
    if ((v = di_jv_get(req, "presence_penalty")) && v->type != DI_JV_NULL &&
        (st = number_in(v, "presence_penalty", -2, 2, 0, &s->presence_penalty, err)))
        return st;
    if ((v = di_jv_get(req, "frequency_penalty")) && v->type != DI_JV_NULL &&
        (st = number_in(v, "frequency_penalty", -2, 2, 0, &s->frequency_penalty, err)))
        return st;
    if ((v = di_jv_get(req, "repetition_penalty")) && v->type != DI_JV_NULL &&
        (st = number_in(v, "repetition_penalty", 0, 2, 1, &s->repetition_penalty, err)))
        return st;
    int64_t iv;
    if ((v = di_jv_get(req, "top_k")) && v->type != DI_JV_NULL) {
        if ((st = integer_in(v, "top_k", -1, 1 << 30, &iv, err))) return st;
        s->top_k = (int32_t)iv;
    }
    /* max_tokens wins over max_completion_tokens when both are present. */
    const char *mt = di_jv_get(req, "max_tokens") && di_jv_get(req, "max_tokens")->type != DI_JV_NULL
                         ? "max_tokens" : "max_completion_tokens";
    if ((v = di_jv_get(req, mt)) && v->type != DI_JV_NULL) {
        if ((st = integer_in(v, mt, 1, 9007199254740991.0, &iv, err))) return st;
        s->max_tokens = iv;
    }
    if ((v = di_jv_get(req, "seed")) && v->type != DI_JV_NULL) {
        if (v->type != DI_JV_NUMBER || !di_jv_is_integer(v) || v->str[0] == '-')
            return di_err_set(err, DI_ERR_INVALID_ARG, "seed: expected an integer in [0, 2^64)");
        s->has_seed = 1;
        s->seed = strtoull(v->str, NULL, 10);
    }
    if ((v = di_jv_get(req, "n")) && v->type != DI_JV_NULL) {
        if ((st = integer_in(v, "n", 1, 128, &iv, err))) return st;
        s->n = (int32_t)iv;
    }
    if ((v = di_jv_get(req, "top_logprobs")) && v->type != DI_JV_NULL) {
        if ((st = integer_in(v, "top_logprobs", 0, 20, &iv, err))) return st;
        s->top_logprobs = (int32_t)iv;
    }
    static const struct { const char *name; size_t off; } flags[] = {
        {"stream", offsetof(di_sampling, stream)},
        {"logprobs", offsetof(di_sampling, logprobs)},
        {"ignore_eos", offsetof(di_sampling, ignore_eos)}};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        if (!(v = di_jv_get(req, flags[i].name)) || v->type == DI_JV_NULL) continue;
        if (v->type != DI_JV_TRUE && v->type != DI_JV_FALSE)
            return wrong_type(err, "", flags[i].name, "a boolean", v);
        *(int *)((char *)s + flags[i].off) = v->type == DI_JV_TRUE;
    }
    if ((v = di_jv_get(req, "stop")) && (st = read_stop(v, s, err))) return st;
    if ((v = di_jv_get(req, "logit_bias")) && v->type != DI_JV_NULL &&
        !(v->type == DI_JV_OBJECT && v->n == 0))
        return di_err_set(err, DI_ERR_UNSUPPORTED, "logit_bias: not supported");
    return di_chat_validate(chat, err);
}

di_status di_openai_convert_value(const di_jv *req, const di_openai_options *opts, di_chat *chat,
                                  di_sampling *sampling, di_err *err) {
    di_openai_options defaults;
    if (!opts) { di_openai_options_default(&defaults); opts = &defaults; }
    di_chat_init(chat);
    di_sampling_init(sampling);
    di_status st = convert(req, opts, chat, sampling, err);
    if (st) {
        di_chat_free(chat);
        di_sampling_free(sampling);
    }
    return st;
}

di_status di_openai_convert(const char *body, size_t len, const di_openai_options *opts,
                            di_chat *chat, di_sampling *sampling, di_err *err) {
    di_chat_init(chat);
    di_sampling_init(sampling);
    di_jv *req = NULL;
    di_status st = di_jv_parse(body, len, "request body", &req, err);
    if (!st) st = di_openai_convert_value(req, opts, chat, sampling, err);
    di_jv_free(req);
    if (!st && !chat->n_msgs) {
        /* a request must ask something (rendering alone accepts an empty chat) */
        di_chat_free(chat);
        di_sampling_free(sampling);
        st = di_err_set(err, DI_ERR_INVALID_ARG, "messages: empty");
    }
    return st;
}
