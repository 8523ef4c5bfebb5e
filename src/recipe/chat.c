/* V4.1 chat encoding (architecture.md §9.2): conversation model and the
 * exact prompt renderer. The layout below was established by rendering many
 * conversations with DeepSeek's deepseek-recipe V4.1 encoder; the
 * differential test tests/python/test_chat_recipe.py keeps it honest. */
#include "recipe/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ model */

static char *dup_n(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

static char *dup_opt(const char *s) { return s ? dup_n(s, strlen(s)) : NULL; }

void di_chat_init(di_chat *c) {
    memset(c, 0, sizeof *c);
    c->thinking = 1;
    c->add_generation_prompt = 1;
}

static void tool_free(di_chat_tool *t) {
    free(t->name);
    free(t->description);
    di_jv_free(t->parameters);
}

static void msg_free(di_chat_msg *m) {
    free(m->content);
    free(m->reasoning);
    for (size_t i = 0; i < m->n_calls; i++) {
        free(m->calls[i].id);
        free(m->calls[i].name);
        free(m->calls[i].arguments);
    }
    free(m->calls);
    free(m->tool_call_id);
    for (size_t i = 0; i < m->n_tools; i++) tool_free(&m->tools[i]);
    free(m->tools);
}

void di_chat_free(di_chat *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n_msgs; i++) msg_free(&c->msgs[i]);
    free(c->msgs);
    for (size_t i = 0; i < c->n_tools; i++) tool_free(&c->tools[i]);
    free(c->tools);
    di_jv_free(c->response_schema);
    free(c->response_regex);
    di_chat_init(c);
}

di_chat_msg *di_chat_add(di_chat *c, di_chat_role role, const char *content, size_t n) {
    if (c->n_msgs == c->cap_msgs) {
        size_t cap = c->cap_msgs ? c->cap_msgs * 2 : 8;
        di_chat_msg *m = realloc(c->msgs, cap * sizeof *m);
        if (!m) return NULL;
        c->msgs = m;
        c->cap_msgs = cap;
    }
    di_chat_msg *m = &c->msgs[c->n_msgs];
    memset(m, 0, sizeof *m);
    m->role = role;
    m->content = dup_n(content ? content : "", content ? n : 0);
    if (!m->content) return NULL;
    c->n_msgs++;
    return m;
}

int di_chat_msg_set_reasoning(di_chat_msg *m, const char *s, size_t n) {
    char *p = dup_n(s, n);
    if (!p) return -1;
    free(m->reasoning);
    m->reasoning = p;
    return 0;
}

int di_chat_msg_set_tool_call_id(di_chat_msg *m, const char *s) {
    char *p = dup_opt(s);
    if (s && !p) return -1;
    free(m->tool_call_id);
    m->tool_call_id = p;
    return 0;
}

int di_chat_msg_add_call(di_chat_msg *m, const char *id, const char *name, const char *args,
                         size_t args_len) {
    di_chat_tool_call *calls = realloc(m->calls, (m->n_calls + 1) * sizeof *calls);
    if (!calls) return -1;
    m->calls = calls;
    di_chat_tool_call *tc = &calls[m->n_calls];
    tc->id = dup_opt(id);
    tc->name = dup_opt(name ? name : "");
    tc->arguments = dup_n(args ? args : "", args ? args_len : 0);
    if ((id && !tc->id) || !tc->name || !tc->arguments) {
        free(tc->id); free(tc->name); free(tc->arguments);
        return -1;
    }
    m->n_calls++;
    return 0;
}

int di_chat_add_tool(di_chat *c, di_chat_msg *system, const char *name, const char *description,
                     const di_jv *parameters) {
    di_chat_tool **list = system ? &system->tools : &c->tools;
    size_t *n = system ? &system->n_tools : &c->n_tools;
    di_chat_tool *t = realloc(*list, (*n + 1) * sizeof *t);
    if (!t) return -1;
    *list = t;
    t += *n;
    memset(t, 0, sizeof *t);
    t->name = dup_opt(name ? name : "");
    t->description = dup_opt(description);
    t->parameters = parameters ? di_jv_clone(parameters) : NULL;
    if (!t->name || (description && !t->description) || (parameters && !t->parameters)) {
        tool_free(t);
        return -1;
    }
    (*n)++;
    return 0;
}

di_status di_chat_validate(const di_chat *c, di_err *err) {
    for (size_t i = 0; i < c->n_msgs; i++) {
        const di_chat_msg *m = &c->msgs[i];
        if (m->prefix && (m->role != DI_CHAT_ASSISTANT || i + 1 != c->n_msgs))
            return di_err_set(err, DI_ERR_INVALID_ARG,
                              "messages[%zu]: prefix is only allowed on the final assistant message", i);
        if (m->n_calls && m->role != DI_CHAT_ASSISTANT)
            return di_err_set(err, DI_ERR_INVALID_ARG,
                              "messages[%zu]: tool_calls are only allowed on assistant messages", i);
        if (m->reasoning && m->role != DI_CHAT_ASSISTANT)
            return di_err_set(err, DI_ERR_INVALID_ARG,
                              "messages[%zu]: reasoning_content is only allowed on assistant messages", i);
        if (m->n_tools && m->role != DI_CHAT_SYSTEM)
            return di_err_set(err, DI_ERR_INVALID_ARG,
                              "messages[%zu]: tools are only allowed on system messages", i);
    }
    if (c->format == DI_CHAT_FORMAT_JSON_SCHEMA && !c->response_schema)
        return di_err_set(err, DI_ERR_INVALID_ARG, "response format json_schema needs a schema");
    if (c->format == DI_CHAT_FORMAT_REGEX && !c->response_regex)
        return di_err_set(err, DI_ERR_INVALID_ARG, "response format regex needs a pattern");
    return DI_OK;
}

/* ----------------------------------------------------------------- writer */

typedef struct writer {
    di_buf text;
    di_chat_segment *segs;
    size_t n_segs, cap_segs;
    int oom;
} writer;

static void w_seg(writer *w, const char *s, size_t n, int special) {
    if (!n || w->oom) return;
    size_t off = w->text.len;
    di_buf_put(&w->text, s, n);
    if (w->text.oom) { w->oom = 1; return; }
    if (!special && w->n_segs && !w->segs[w->n_segs - 1].special) {
        w->segs[w->n_segs - 1].len += n;
        return;
    }
    if (w->n_segs == w->cap_segs) {
        size_t cap = w->cap_segs ? w->cap_segs * 2 : 32;
        di_chat_segment *p = realloc(w->segs, cap * sizeof *p);
        if (!p) { w->oom = 1; return; }
        w->segs = p;
        w->cap_segs = cap;
    }
    w->segs[w->n_segs++] = (di_chat_segment){off, n, special};
}

static void w_text(writer *w, const char *s, size_t n) { w_seg(w, s, n, 0); }
static void w_texts(writer *w, const char *s) { w_seg(w, s, strlen(s), 0); }
static void w_special(writer *w, const char *s) { w_seg(w, s, strlen(s), 1); }

/* Template text: every special spelling in it is the special token. */
static void w_template(writer *w, const char *s) {
    static const char *const specials[] = {DI_CHAT_DSML, DI_CHAT_THINK_START, DI_CHAT_THINK_END};
    while (*s) {
        const char *best = NULL;
        size_t best_len = 0;
        for (size_t k = 0; k < sizeof specials / sizeof *specials; k++) {
            const char *hit = strstr(s, specials[k]);
            if (hit && (!best || hit < best)) { best = hit; best_len = strlen(specials[k]); }
        }
        if (!best) { w_texts(w, s); return; }
        w_text(w, s, (size_t)(best - s));
        w_seg(w, best, best_len, 1);
        s = best + best_len;
    }
}

static void w_json_string(writer *w, const char *s) {
    di_buf b = {0};
    di_jv_dump_string(s, strlen(s), &b);
    if (b.oom) w->oom = 1;
    else w_text(w, b.p, b.len);
    di_buf_free(&b);
}

static void w_json(writer *w, const di_jv *v) {
    di_buf b = {0};
    di_jv_dump_py(v, &b);
    if (b.oom) w->oom = 1;
    else w_text(w, b.p, b.len);
    di_buf_free(&b);
}

/* ---------------------------------------------------------------- pieces */

static const char TOOLS_INTRO[] =
    "\n\n## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools "
    "by writing a \"<" DI_CHAT_DSML " calls>\" block like the following:\n\n"
    "<" DI_CHAT_DSML " calls>\n"
    "<" DI_CHAT_DSML " invoke name=\"$TOOL_NAME\">\n"
    "<" DI_CHAT_DSML " parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</"
    DI_CHAT_DSML " parameter>\n"
    "...\n"
    "</" DI_CHAT_DSML " invoke>\n"
    "<" DI_CHAT_DSML " invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" DI_CHAT_DSML " invoke>\n"
    "</" DI_CHAT_DSML " calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
    "inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
static const char TOOLS_OUTRO[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
    "tool calls.\n";
static const char FORMAT_INTRO[] =
    "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";
static const char UPDATED_TOOLS[] = "\n\n### Updated Tool Schemas\n\n";
static const char CALLS_OPEN[] = "\n\n<" DI_CHAT_DSML " calls>\n";

static void w_tool_lines(writer *w, const di_chat_tool *tools, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (i) w_texts(w, "\n");
        w_texts(w, "{\"name\": ");
        w_json_string(w, tools[i].name);
        w_texts(w, ", \"description\": ");
        w_json_string(w, tools[i].description ? tools[i].description : "");
        w_texts(w, ", \"parameters\": ");
        if (tools[i].parameters) w_json(w, tools[i].parameters);
        else w_texts(w, "null");
        w_texts(w, "}");
    }
}

static int effort_value(di_chat_effort e) {
    switch (e) {
    case DI_CHAT_EFFORT_LOW: return 50;
    case DI_CHAT_EFFORT_MAX: return 100;
    default: return 75;
    }
}

static void w_param(writer *w, const char *key, size_t klen, int is_string, const char *val,
                    size_t vlen) {
    w_template(w, "<" DI_CHAT_DSML " parameter name=\"");
    w_text(w, key, klen);
    w_texts(w, is_string ? "\" string=\"true\">" : "\" string=\"false\">");
    w_text(w, val, vlen);
    w_template(w, "</" DI_CHAT_DSML " parameter>");
}

/* One invoke: arguments that parse as a JSON object become one parameter
 * per member; anything else is passed whole as a string "arguments". */
static void w_invoke(writer *w, const di_chat_tool_call *tc) {
    w_template(w, "<" DI_CHAT_DSML " invoke name=\"");
    w_texts(w, tc->name);
    w_texts(w, "\">\n");
    di_jv *args = NULL;
    di_err ignored;
    if (di_jv_parse(tc->arguments, strlen(tc->arguments), "arguments", &args, &ignored) == DI_OK &&
        args->type == DI_JV_OBJECT) {
        for (size_t i = 0; i < args->n; i++) {
            if (i) w_texts(w, "\n");
            const di_jv *v = args->items[i];
            if (v->type == DI_JV_STRING) {
                w_param(w, args->keys[i], args->key_lens[i], 1, v->str, v->len);
            } else {
                di_buf b = {0};
                di_jv_dump_py(v, &b);
                if (b.oom) w->oom = 1;
                else w_param(w, args->keys[i], args->key_lens[i], 0, b.p, b.len);
                di_buf_free(&b);
            }
        }
    } else {
        w_param(w, "arguments", 9, 1, tc->arguments, strlen(tc->arguments));
    }
    di_jv_free(args);
    w_texts(w, "\n");
    w_template(w, "</" DI_CHAT_DSML " invoke>");
}

static void w_calls(writer *w, const di_chat_msg *m) {
    if (!m->n_calls) return;
    w_template(w, CALLS_OPEN);
    for (size_t i = 0; i < m->n_calls; i++) {
        if (i) w_texts(w, "\n");
        w_invoke(w, &m->calls[i]);
    }
    w_texts(w, "\n");
    w_template(w, "</" DI_CHAT_DSML " calls>");
}

/* Position of a tool result among the latest assistant calls: the index of
 * the first call with its id, 0 when none matches. */
static size_t result_rank(const di_chat_msg *calls_msg, const di_chat_msg *tool) {
    if (!calls_msg || !tool->tool_call_id) return 0;
    for (size_t k = 0; k < calls_msg->n_calls; k++)
        if (calls_msg->calls[k].id && !strcmp(calls_msg->calls[k].id, tool->tool_call_id)) return k;
    return 0;
}

/* One user turn from the run msgs[lo..hi) of user and tool messages: parts
 * joined by blank lines, tool results stably sorted into the order of the
 * calls they answer while user texts keep their places. */
static void w_user_turn(writer *w, const di_chat *c, size_t lo, size_t hi,
                        const di_chat_msg *calls_msg) {
    size_t n = hi - lo, n_tools = 0;
    const di_chat_msg **tools = malloc((n ? n : 1) * sizeof *tools);
    if (!tools) { w->oom = 1; return; }
    for (size_t i = lo; i < hi; i++)
        if (c->msgs[i].role == DI_CHAT_TOOL) {
            /* insertion sort keeps equal ranks in input order */
            const di_chat_msg *t = &c->msgs[i];
            size_t r = result_rank(calls_msg, t), j = n_tools++;
            while (j > 0 && result_rank(calls_msg, tools[j - 1]) > r) { tools[j] = tools[j - 1]; j--; }
            tools[j] = t;
        }
    w_special(w, DI_CHAT_USER_TOK);
    size_t next_tool = 0;
    for (size_t i = lo; i < hi; i++) {
        if (i > lo) w_texts(w, "\n\n");
        if (c->msgs[i].role == DI_CHAT_TOOL) {
            w_texts(w, "<tool_result>");
            w_texts(w, tools[next_tool++]->content);
            w_texts(w, "</tool_result>");
        } else {
            w_texts(w, c->msgs[i].content);
        }
    }
    free(tools);
}

static void w_assistant(writer *w, const di_chat *c, const di_chat_msg *m, int keep_reasoning,
                        int has_system) {
    w_special(w, DI_CHAT_ASSISTANT_TOK);
    if (m->prefix) {
        /* A continued final turn: its reasoning is shown even when earlier
         * ones are dropped, and the think block stays open until there is
         * something after it. A turn with nothing before it (not even
         * tools or a response format in the header) is continued as an
         * answer. */
        if (c->thinking && (m != &c->msgs[0] || has_system)) {
            w_special(w, DI_CHAT_THINK_START);
            if (m->reasoning) w_texts(w, m->reasoning);
            if (!m->content[0] && !m->n_calls) return;
        }
        w_special(w, DI_CHAT_THINK_END);
        w_texts(w, m->content);
        w_calls(w, m);
        return;
    }
    if (keep_reasoning) {
        w_special(w, DI_CHAT_THINK_START);
        if (m->reasoning) w_texts(w, m->reasoning);
    }
    w_special(w, DI_CHAT_THINK_END);
    w_texts(w, m->content);
    w_calls(w, m);
    w_special(w, DI_CHAT_EOS);
}

di_status di_chat_prompt_render(const di_chat *c, di_chat_prompt *out, di_err *err) {
    memset(out, 0, sizeof *out);
    di_status st = di_chat_validate(c, err);
    if (st) return st;
    writer w = {0};
    int tools_active = c->n_tools > 0 && c->tool_choice != DI_CHAT_TOOL_NONE;
    int format_section = c->format == DI_CHAT_FORMAT_JSON_OBJECT ||
                         c->format == DI_CHAT_FORMAT_JSON_SCHEMA;
    const di_chat_msg *sys0 = c->n_msgs && c->msgs[0].role == DI_CHAT_SYSTEM ? &c->msgs[0] : NULL;

    w_special(&w, DI_CHAT_BOS);
    /* The header: thinking alone opens it only when there is a turn. */
    if (sys0 || tools_active || format_section || (c->thinking && c->n_msgs)) {
        w_special(&w, DI_CHAT_SYSTEM_TOK);
        if (c->thinking) {
            char line[160];
            snprintf(line, sizeof line,
                     "Reasoning Effort: %d (range 1-100, the higher the value, the more thorough "
                     "the reasoning)\n\n",
                     effort_value(c->effort));
            w_texts(&w, line);
        }
        if (sys0) w_texts(&w, sys0->content);
        if (tools_active) {
            w_template(&w, TOOLS_INTRO);
            w_tool_lines(&w, c->tools, c->n_tools);
            w_texts(&w, TOOLS_OUTRO);
        }
        if (format_section) {
            w_texts(&w, FORMAT_INTRO);
            if (c->format == DI_CHAT_FORMAT_JSON_SCHEMA) w_json(&w, c->response_schema);
            else w_texts(&w, "{\"type\": \"json_object\"}");
        }
        if (sys0 && sys0->n_tools) {
            w_texts(&w, UPDATED_TOOLS);
            w_tool_lines(&w, sys0->tools, sys0->n_tools);
        }
    }

    /* Earlier turns' reasoning is kept only in agentic (tools) thinking
     * conversations; otherwise every finished turn shows an empty answer
     * prefix "</think>". */
    int keep_reasoning = c->thinking && tools_active;
    const di_chat_msg *calls_msg = NULL;
    size_t i = sys0 ? 1 : 0;
    while (i < c->n_msgs) {
        const di_chat_msg *m = &c->msgs[i];
        switch (m->role) {
        case DI_CHAT_SYSTEM:
            w_special(&w, DI_CHAT_SYSTEM_TOK);
            w_texts(&w, m->content);
            if (m->n_tools) {
                w_texts(&w, UPDATED_TOOLS);
                w_tool_lines(&w, m->tools, m->n_tools);
            }
            i++;
            break;
        case DI_CHAT_LATEST_REMINDER:
            /* of a run of reminders only the first is shown */
            if (i == 0 || c->msgs[i - 1].role != DI_CHAT_LATEST_REMINDER) {
                w_special(&w, DI_CHAT_REMINDER_TOK);
                w_texts(&w, m->content);
            }
            i++;
            break;
        case DI_CHAT_USER:
        case DI_CHAT_TOOL: {
            size_t j = i;
            while (j < c->n_msgs &&
                   (c->msgs[j].role == DI_CHAT_USER || c->msgs[j].role == DI_CHAT_TOOL))
                j++;
            w_user_turn(&w, c, i, j, calls_msg);
            i = j;
            break;
        }
        case DI_CHAT_ASSISTANT:
            w_assistant(&w, c, m, keep_reasoning, tools_active || format_section);
            if (m->n_calls) calls_msg = m;
            i++;
            break;
        }
    }
    int continued = c->n_msgs && c->msgs[c->n_msgs - 1].prefix;
    if (c->add_generation_prompt && !continued) {
        w_special(&w, DI_CHAT_ASSISTANT_TOK);
        w_special(&w, c->thinking ? DI_CHAT_THINK_START : DI_CHAT_THINK_END);
    }
    /* A required tool call opens the call block, after a continued message too. */
    if ((c->add_generation_prompt || continued) && c->tool_choice == DI_CHAT_TOOL_REQUIRED &&
        tools_active)
        w_template(&w, CALLS_OPEN);
    if (w.oom || w.text.oom) {
        di_buf_free(&w.text);
        free(w.segs);
        return di_err_set(err, DI_ERR_NOMEM, "chat render: out of memory");
    }
    out->len = w.text.len;
    out->text = di_buf_take(&w.text);
    out->segs = w.segs;
    out->n_segs = w.n_segs;
    if (!out->text) {
        free(w.segs);
        memset(out, 0, sizeof *out);
        return di_err_set(err, DI_ERR_NOMEM, "chat render: out of memory");
    }
    return DI_OK;
}

unsigned di_chat_parse_flags(const di_chat *c) {
    int tools_active = c->n_tools > 0 && c->tool_choice != DI_CHAT_TOOL_NONE;
    int format_section = c->format == DI_CHAT_FORMAT_JSON_OBJECT ||
                         c->format == DI_CHAT_FORMAT_JSON_SCHEMA;
    int any_tools = tools_active;
    for (size_t i = 0; i < c->n_msgs; i++) any_tools |= c->msgs[i].n_tools > 0;
    const di_chat_msg *last = c->n_msgs ? &c->msgs[c->n_msgs - 1] : NULL;
    int continued = last && last->prefix;
    unsigned f = any_tools ? DI_CHAT_PARSE_TOOLS : 0;
    if (c->tool_choice == DI_CHAT_TOOL_REQUIRED && tools_active && (continued || c->add_generation_prompt))
        return f | DI_CHAT_PARSE_TOOLS | DI_CHAT_PARSE_IN_CALLS | (continued ? DI_CHAT_PARSE_CONTINUE : 0);
    if (continued) {
        /* the think block is still open only when w_assistant left it so */
        int thinks = c->thinking && (c->n_msgs > 1 || tools_active || format_section);
        if (thinks && !last->content[0] && !last->n_calls) f |= DI_CHAT_PARSE_THINKING;
        return f | DI_CHAT_PARSE_CONTINUE;
    }
    if (c->add_generation_prompt && c->thinking) f |= DI_CHAT_PARSE_THINKING;
    return f;
}

void di_chat_prompt_free(di_chat_prompt *p) {
    if (!p) return;
    free(p->text);
    free(p->segs);
    memset(p, 0, sizeof *p);
}

di_status di_chat_prompt_ids(const di_chat_prompt *p, di_chat_special_fn special,
                             di_chat_plain_fn plain, void *ctx, int32_t **ids, size_t *n_ids,
                             di_err *err) {
    *ids = NULL;
    *n_ids = 0;
    size_t cap = 0;
    for (size_t i = 0; i < p->n_segs; i++) {
        const di_chat_segment *s = &p->segs[i];
        di_status st;
        if (s->special) {
            int32_t id;
            st = special(ctx, p->text + s->offset, s->len, &id, err);
            if (!st && *n_ids == cap) {
                size_t nc = cap ? cap * 2 : 256;
                int32_t *q = realloc(*ids, nc * sizeof *q);
                if (!q) st = di_err_set(err, DI_ERR_NOMEM, "chat encode: out of memory");
                else { *ids = q; cap = nc; }
            }
            if (!st) (*ids)[(*n_ids)++] = id;
        } else {
            st = plain(ctx, p->text + s->offset, s->len, ids, n_ids, &cap, err);
        }
        if (st) {
            free(*ids);
            *ids = NULL;
            *n_ids = 0;
            return st;
        }
    }
    return DI_OK;
}
