/* Public API glue for the chat section of deepinfer.h: JSON chat → prompt
 * text and ids, and output parsing (architecture.md §9.2). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "deepinfer.h"
#include "recipe/chat.h"
#include "recipe/openai.h"
#include "recipe/parse.h"

void di_chat_options_default(di_chat_options *opts) {
    opts->thinking = -1;
    opts->reasoning_effort = NULL;
    opts->add_generation_prompt = 1;
}

/* JSON chat (messages array or request object) + options → conversation. */
static di_status chat_from_json(const char *json, size_t len, const di_chat_options *opts,
                                di_chat *chat, di_err *err) {
    di_chat_options defaults;
    if (!opts) { di_chat_options_default(&defaults); opts = &defaults; }
    di_chat_init(chat);
    if (!json) return di_err_set(err, DI_ERR_INVALID_ARG, "chat: json is NULL");
    di_jv *root = NULL;
    di_status st = di_jv_parse(json, len, "chat JSON", &root, err);
    if (st) return st;
    if (root->type == DI_JV_ARRAY) {
        st = di_openai_messages(root, "messages", chat, err);
    } else if (root->type == DI_JV_OBJECT) {
        /* Options decide thinking; a request that asks for a tool choice the
         * defaults would reject still renders when the options turn thinking off. */
        di_openai_options oo;
        di_openai_options_default(&oo);
        if (opts->thinking == 0) oo.default_thinking = 0;
        di_sampling sampling;
        st = di_openai_convert_value(root, &oo, chat, &sampling, err);
        di_sampling_free(&sampling);
    } else {
        st = di_err_set(err, DI_ERR_INVALID_ARG,
                        "chat JSON: expected an array of messages or a request object, got %s",
                        di_jv_type_name(root->type));
    }
    di_jv_free(root);
    if (st) { di_chat_free(chat); return st; }
    if (opts->thinking >= 0) chat->thinking = opts->thinking != 0;
    if (opts->reasoning_effort) {
        static const struct { const char *name; di_chat_effort e; } map[] = {
            {"minimal", DI_CHAT_EFFORT_LOW}, {"low", DI_CHAT_EFFORT_LOW},
            {"medium", DI_CHAT_EFFORT_HIGH}, {"high", DI_CHAT_EFFORT_HIGH},
            {"xhigh", DI_CHAT_EFFORT_XHIGH}, {"max", DI_CHAT_EFFORT_MAX}};
        int found = 0;
        if (!strcmp(opts->reasoning_effort, "none")) { chat->thinking = 0; found = 1; }
        for (size_t i = 0; !found && i < sizeof map / sizeof *map; i++)
            if (!strcmp(opts->reasoning_effort, map[i].name)) { chat->effort = map[i].e; found = 1; }
        if (!found) {
            di_chat_free(chat);
            return di_err_set(err, DI_ERR_INVALID_ARG,
                              "reasoning effort '%s' is not one of none, minimal, low, medium, high, "
                              "xhigh, max", opts->reasoning_effort);
        }
    }
    chat->add_generation_prompt = opts->add_generation_prompt != 0;
    return DI_OK;
}

/* JSON chat → rendered prompt (text + segments). */
static di_status render_json(const char *json, size_t len, const di_chat_options *opts,
                             di_chat_prompt *p, di_err *err) {
    di_chat chat;
    di_status st = chat_from_json(json, len, opts, &chat, err);
    if (st) return st;
    st = di_chat_prompt_render(&chat, p, err);
    di_chat_free(&chat);
    return st;
}

di_status di_chat_render(const char *json, size_t len, const di_chat_options *opts, char **prompt,
                         size_t *prompt_len) {
    di_err err = {0};
    if (!prompt) return di_err_publish_msg(DI_ERR_INVALID_ARG, "di_chat_render: prompt is NULL");
    *prompt = NULL;
    di_chat_prompt p;
    if (render_json(json, len, opts, &p, &err)) return di_err_publish(&err);
    *prompt = p.text;
    if (prompt_len) *prompt_len = p.len;
    p.text = NULL;
    di_chat_prompt_free(&p);
    return DI_OK;
}

static di_status special_id(void *ctx, const char *s, size_t n, int32_t *id, di_err *err) {
    char name[64];
    if (n >= sizeof name) return di_err_set(err, DI_ERR_INTERNAL, "chat encode: special too long");
    memcpy(name, s, n);
    name[n] = '\0';
    if (di_tokenizer_token_id(ctx, name, id))
        return di_err_set(err, DI_ERR_NOT_FOUND,
                          "chat encode: the tokenizer has no special token \"%s\" (V4.1 added "
                          "<｜System｜>; a V4 tokenizer.json lacks it)",
                          name);
    return DI_OK;
}

static di_status plain_ids(void *ctx, const char *s, size_t n, int32_t **ids, size_t *n_ids,
                           size_t *cap, di_err *err) {
    int32_t *part = NULL;
    size_t n_part = 0;
    if (di_tokenizer_encode(ctx, s, n, 0, &part, &n_part))
        return di_err_set(err, di_last_status(), "chat encode: %s", di_last_error());
    if (*n_ids + n_part > *cap) {
        size_t nc = *cap ? *cap : 256;
        while (nc < *n_ids + n_part) nc *= 2;
        int32_t *q = realloc(*ids, nc * sizeof *q);
        if (!q) { di_free(part); return di_err_set(err, DI_ERR_NOMEM, "chat encode: out of memory"); }
        *ids = q;
        *cap = nc;
    }
    if (n_part) memcpy(*ids + *n_ids, part, n_part * sizeof *part);
    *n_ids += n_part;
    di_free(part);
    return DI_OK;
}

di_status di_chat_encode(const di_tokenizer *tok, const char *json, size_t len,
                         const di_chat_options *opts, int32_t **ids, size_t *n_ids) {
    di_err err = {0};
    if (!tok || !ids || !n_ids)
        return di_err_publish_msg(DI_ERR_INVALID_ARG, "di_chat_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    di_chat_prompt p;
    if (render_json(json, len, opts, &p, &err)) return di_err_publish(&err);
    di_status st = di_chat_prompt_ids(&p, special_id, plain_ids, (void *)tok, ids, n_ids, &err);
    di_chat_prompt_free(&p);
    return st ? di_err_publish(&err) : DI_OK;
}

di_status di_chat_output_flags(const char *json, size_t len, const di_chat_options *opts,
                               unsigned *flags) {
    di_err err = {0};
    if (!flags) return di_err_publish_msg(DI_ERR_INVALID_ARG, "di_chat_output_flags: flags is NULL");
    *flags = 0;
    di_chat chat;
    if (chat_from_json(json, len, opts, &chat, &err)) return di_err_publish(&err);
    *flags = di_chat_parse_flags(&chat);
    di_chat_free(&chat);
    return DI_OK;
}

/* ---------------------------------------------------------------- parsing */

struct di_chat_stream {
    di_parser parser;
    /* delta bookkeeping: bytes already reported, calls already announced,
     * the call whose arguments are still growing and how much of them */
    size_t seen_reasoning, seen_content, announced, cur_call, seen_args;
};

static di_parse_start start_of(unsigned flags) {
    if (flags & DI_CHAT_PARSE_IN_CALLS) return DI_PARSE_TOOL_CALLS;
    if (flags & DI_CHAT_PARSE_THINKING)
        return flags & DI_CHAT_PARSE_CONTINUE ? DI_PARSE_REASONING_CONTINUE : DI_PARSE_REASONING;
    return flags & DI_CHAT_PARSE_CONTINUE ? DI_PARSE_CONTENT_CONTINUE : DI_PARSE_CONTENT;
}

di_status di_chat_stream_new(unsigned flags, const char *const *stop, size_t n_stop,
                             di_chat_stream **out) {
    di_err err = {0};
    if (!out) return di_err_publish_msg(DI_ERR_INVALID_ARG, "di_chat_stream_new: out is NULL");
    *out = NULL;
    di_chat_stream *s = calloc(1, sizeof *s);
    if (!s) return di_err_publish_msg(DI_ERR_NOMEM, "di_chat_stream_new: out of memory");
    unsigned tools = flags & (DI_CHAT_PARSE_TOOLS | DI_CHAT_PARSE_IN_CALLS);
    if (di_parser_init(&s->parser, start_of(flags), tools != 0, stop, n_stop, &err)) {
        free(s);
        return di_err_publish(&err);
    }
    if (flags & DI_CHAT_PARSE_THINKING) s->parser.has_reasoning = 1;
    *out = s;
    return DI_OK;
}

/* What grew since the last delta, as a JSON object. */
static char *stream_delta(di_chat_stream *s) {
    di_parser *p = &s->parser;
    di_buf b = {0};
    const char *sep = "";
    di_buf_puts(&b, "{");
    if (p->reasoning.len > s->seen_reasoning) {
        di_buf_puts(&b, "\"reasoning_content\": ");
        di_jv_dump_string(p->reasoning.p + s->seen_reasoning, p->reasoning.len - s->seen_reasoning, &b);
        s->seen_reasoning = p->reasoning.len;
        sep = ", ";
    }
    if (p->content.len > s->seen_content) {
        di_buf_puts(&b, sep);
        di_buf_puts(&b, "\"content\": ");
        di_jv_dump_string(p->content.p + s->seen_content, p->content.len - s->seen_content, &b);
        s->seen_content = p->content.len;
        sep = ", ";
    }
    int opened = 0;
    for (size_t i = s->cur_call; i < p->n_calls; i++) {
        const di_parse_call *c = &p->calls[i];
        int is_new = i >= s->announced;
        size_t from = i == s->cur_call ? s->seen_args : 0;
        if (is_new || c->arguments.len > from) {
            if (!opened) { di_buf_puts(&b, sep); di_buf_puts(&b, "\"tool_calls\": ["); opened = 1; }
            else di_buf_puts(&b, ", ");
            char head[48];
            snprintf(head, sizeof head, "{\"index\": %zu, \"function\": {", i);
            di_buf_puts(&b, head);
            if (is_new) {
                di_buf_puts(&b, "\"name\": ");
                di_jv_dump_string(c->name.p ? c->name.p : "", c->name.len, &b);
                di_buf_puts(&b, ", ");
            }
            di_buf_puts(&b, "\"arguments\": ");
            di_jv_dump_string(c->arguments.p ? c->arguments.p + from : "", c->arguments.len - from, &b);
            di_buf_puts(&b, "}}");
        }
        s->announced = i + 1;
        s->cur_call = i;
        s->seen_args = c->arguments.len;
    }
    if (opened) di_buf_puts(&b, "]");
    di_buf_puts(&b, "}");
    return di_buf_take(&b);
}

di_status di_chat_stream_push(di_chat_stream *s, const char *text, size_t len, char **delta_json) {
    di_err err = {0};
    if (!s || (!text && len))
        return di_err_publish_msg(DI_ERR_INVALID_ARG, "di_chat_stream_push: NULL argument");
    if (di_parser_push(&s->parser, text, len, &err)) return di_err_publish(&err);
    if (delta_json && !(*delta_json = stream_delta(s)))
        return di_err_publish_msg(DI_ERR_NOMEM, "di_chat_stream_push: out of memory");
    return DI_OK;
}

di_status di_chat_stream_finish(di_chat_stream *s, char **delta_json, char **message_json) {
    di_err err = {0};
    if (!s) return di_err_publish_msg(DI_ERR_INVALID_ARG, "di_chat_stream_finish: NULL stream");
    if (di_parser_finish(&s->parser, &err)) return di_err_publish(&err);
    if (delta_json && !(*delta_json = stream_delta(s)))
        return di_err_publish_msg(DI_ERR_NOMEM, "di_chat_stream_finish: out of memory");
    if (message_json && !(*message_json = di_parser_message_json(&s->parser)))
        return di_err_publish_msg(DI_ERR_NOMEM, "di_chat_stream_finish: out of memory");
    return DI_OK;
}

void di_chat_stream_free(di_chat_stream *s) {
    if (!s) return;
    di_parser_free(&s->parser);
    free(s);
}

di_status di_chat_parse(const char *text, size_t len, unsigned flags, char **message_json) {
    if (!message_json)
        return di_err_publish_msg(DI_ERR_INVALID_ARG, "di_chat_parse: message_json is NULL");
    *message_json = NULL;
    di_chat_stream *s = NULL;
    di_status st = di_chat_stream_new(flags, NULL, 0, &s);
    if (!st) st = di_chat_stream_push(s, text, len, NULL);
    if (!st) st = di_chat_stream_finish(s, NULL, message_json);
    di_chat_stream_free(s);
    return st;
}
