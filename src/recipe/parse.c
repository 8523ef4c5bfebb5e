/* V4.1 output parsing, incremental (architecture.md §9.2, deepinfer.md §7.1).
 * See parse.h for the rules. */
#include "recipe/parse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/chat.h" /* special spellings */

enum {
    ST_REASONING,
    ST_CONTENT,
    ST_CALLS,      /* tool-call block, outside any invoke */
    ST_INVOKE,     /* inside an invoke, between parameters (sub: see parse.h) */
    ST_VALUE,      /* inside a parameter value */
    ST_DONE
};

static const char M_THINK_END[] = DI_CHAT_THINK_END;
static const char M_DSML[] = "<" DI_CHAT_DSML;
static const char M_DSML_CLOSE[] = "</" DI_CHAT_DSML;
static const char M_CALLS[] = "<" DI_CHAT_DSML " calls>";
static const char M_INVOKE[] = "<" DI_CHAT_DSML " invoke name=\"";
static const char M_CALLS_END[] = "</" DI_CHAT_DSML " calls>";
static const char M_PARAM[] = "<" DI_CHAT_DSML " parameter name=";
static const char M_INVOKE_END[] = "</" DI_CHAT_DSML " invoke>";
static const char M_PARAM_END[] = "</" DI_CHAT_DSML " parameter>";
/* bytes of "</｜DSML｜": the shortest closing-tag tail that counts as a tag */
#define DSML_TAG_MIN (sizeof(DI_CHAT_DSML) + 1)
static const char M_ATTR_TRUE[] = "string=\"true\">";
static const char M_ATTR_FALSE[] = "string=\"false\">";

di_status di_parser_init(di_parser *p, di_parse_start start, int parse_tools,
                         const char *const *stop, size_t n_stop, di_err *err) {
    memset(p, 0, sizeof *p);
    p->parse_tools = parse_tools;
    switch (start) {
    case DI_PARSE_REASONING: p->state = ST_REASONING; p->leading = 1; p->has_reasoning = 1; break;
    case DI_PARSE_REASONING_CONTINUE: p->state = ST_REASONING; p->has_reasoning = 1; break;
    case DI_PARSE_CONTENT: p->state = ST_CONTENT; p->leading = 1; break;
    case DI_PARSE_CONTENT_CONTINUE: p->state = ST_CONTENT; break;
    case DI_PARSE_TOOL_CALLS: p->state = ST_CALLS; break;
    default: return di_err_set(err, DI_ERR_INVALID_ARG, "parser: unknown start state %d", (int)start);
    }
    if (n_stop) {
        p->stop = calloc(n_stop, sizeof *p->stop);
        if (!p->stop) return di_err_set(err, DI_ERR_NOMEM, "parser: out of memory");
        for (size_t i = 0; i < n_stop; i++) {
            if (!stop[i] || !stop[i][0]) {
                di_parser_free(p);
                return di_err_set(err, DI_ERR_INVALID_ARG, "parser: stop string %zu is empty", i);
            }
            if (!(p->stop[i] = strdup(stop[i]))) {
                di_parser_free(p);
                return di_err_set(err, DI_ERR_NOMEM, "parser: out of memory");
            }
            p->n_stop = i + 1;
        }
    }
    return DI_OK;
}

void di_parser_free(di_parser *p) {
    if (!p) return;
    di_buf_free(&p->reasoning);
    di_buf_free(&p->content);
    for (size_t i = 0; i < p->n_calls; i++) {
        di_buf_free(&p->calls[i].name);
        di_buf_free(&p->calls[i].arguments);
    }
    free(p->calls);
    di_buf_free(&p->pending);
    for (size_t i = 0; i < p->n_stop; i++) free(p->stop[i]);
    free(p->stop);
    memset(p, 0, sizeof *p);
}

/* Longest proper suffix of s[0..n) that begins `marker`. */
static size_t partial(const char *s, size_t n, const char *marker) {
    size_t m = strlen(marker);
    for (size_t k = (n < m - 1 ? n : m - 1); k > 0; k--)
        if (!memcmp(s + n - k, marker, k)) return k;
    return 0;
}

static const char *find(const char *s, size_t n, const char *marker) {
    size_t m = strlen(marker);
    if (m > n) return NULL;
    return memmem(s, n, marker, m);
}

/* Is s[0..n) a proper prefix of marker (more text could complete it)? */
static int is_prefix_of(const char *s, size_t n, const char *marker) {
    size_t m = strlen(marker);
    return n < m && !memcmp(s, marker, n);
}

static int starts(const char *s, size_t n, const char *marker) {
    size_t m = strlen(marker);
    return n >= m && !memcmp(s, marker, m);
}

/* Appends text to a reasoning/content buffer, dropping leading newlines
 * while `leading` and holding back trailing ones (they are dropped before a
 * tool-call block and at the end of reasoning). */
static void put_text(di_parser *p, di_buf *b, const char *s, size_t n) {
    if (p->leading) {
        while (n && *s == '\n') { s++; n--; }
        if (!n) return;
        p->leading = 0;
    }
    size_t end = n;
    while (end && s[end - 1] == '\n') end--;
    if (!end) { p->held_newlines += n; return; }
    for (; p->held_newlines; p->held_newlines--) di_buf_put(b, "\n", 1);
    di_buf_put(b, s, end);
    p->held_newlines = n - end;
}

static void flush_newlines(di_parser *p, di_buf *b) {
    for (; p->held_newlines; p->held_newlines--) di_buf_put(b, "\n", 1);
}

static void consume(di_parser *p, size_t n) {
    p->pending_off += n; /* compacted on the next push: no quadratic moves */
}

static di_parse_call *current_call(di_parser *p) { return &p->calls[p->n_calls - 1]; }

/* One step on pending text; returns 1 when it made progress, 0 when it
 * needs more text. `final`: no more text will come. */
static int step(di_parser *p, int final) {
    size_t n = p->pending.len - p->pending_off;
    if (!n) return 0;
    const char *s = p->pending.p + p->pending_off;
    switch (p->state) {
    case ST_REASONING: {
        /* "</think>" ends the reasoning; a tool-call block may also start
         * right inside it (the reference ends the reasoning there too) */
        const char *hit = find(s, n, M_THINK_END);
        const char *calls = p->parse_tools ? find(s, n, M_DSML) : NULL;
        if (calls && (!hit || calls < hit)) {
            put_text(p, &p->reasoning, s, (size_t)(calls - s));
            p->held_newlines = 0;
            p->state = ST_CALLS;
            consume(p, (size_t)(calls - s));
            return 1;
        }
        if (hit) {
            put_text(p, &p->reasoning, s, (size_t)(hit - s));
            p->held_newlines = 0;
            p->leading = 1;
            p->state = ST_CONTENT;
            consume(p, (size_t)(hit - s) + strlen(M_THINK_END));
            return 1;
        }
        size_t keep = final ? 0 : partial(s, n, M_THINK_END);
        if (p->parse_tools && !final) {
            size_t k = partial(s, n, M_DSML);
            if (k > keep) keep = k;
        }
        if (keep == n) return 0;
        put_text(p, &p->reasoning, s, n - keep);
        consume(p, n - keep);
        return 1;
    }
    case ST_CONTENT: {
        /* earliest marker: "</think>" (removed), "<｜DSML｜" (calls), stops */
        const char *hit = find(s, n, M_THINK_END);
        int kind = hit ? 0 : -1;
        size_t hit_len = strlen(M_THINK_END);
        if (p->parse_tools) {
            const char *h = find(s, n, M_DSML);
            if (h && (!hit || h < hit)) { hit = h; kind = 1; hit_len = strlen(M_DSML); }
        }
        for (size_t i = 0; i < p->n_stop; i++) {
            const char *h = find(s, n, p->stop[i]);
            if (h && (!hit || h < hit)) { hit = h; kind = 2; hit_len = strlen(p->stop[i]); }
        }
        if (hit) {
            put_text(p, &p->content, s, (size_t)(hit - s));
            /* newlines are dropped only right before a call block: a
             * removed "</think>" settles the ones before it */
            if (kind == 0) { flush_newlines(p, &p->content); p->leading = 0; }
            if (kind == 1) { p->held_newlines = 0; p->state = ST_CALLS; hit_len = 0; }
            if (kind == 2) { flush_newlines(p, &p->content); p->stopped = 1; p->state = ST_DONE; }
            consume(p, (size_t)(hit - s) + hit_len);
            return 1;
        }
        size_t keep = 0;
        if (!final) {
            keep = partial(s, n, M_THINK_END);
            if (p->parse_tools) { size_t k = partial(s, n, M_DSML); if (k > keep) keep = k; }
            for (size_t i = 0; i < p->n_stop; i++) {
                size_t k = partial(s, n, p->stop[i]);
                if (k > keep) keep = k;
            }
        }
        if (keep == n) return 0;
        put_text(p, &p->content, s, n - keep);
        consume(p, n - keep);
        return 1;
    }
    case ST_CALLS:
    case ST_INVOKE: {
        if (p->state == ST_INVOKE && p->sub == 1) {
            /* inside a parameter name: streamed as a JSON string up to '"' */
            di_buf *a = &current_call(p)->arguments;
            const char *q = memchr(s, '"', n);
            size_t take = q ? (size_t)(q - s) : n;
            di_jv_escape(s, take, a);
            if (q) { di_buf_put(a, "\"", 1); p->sub = 2; }
            consume(p, q ? take + 1 : take);
            return 1;
        }
        if (p->state == ST_INVOKE && p->sub == 2) {
            /* name written; whatever follows it separates the value */
            di_buf_puts(&current_call(p)->arguments, ": ");
            p->sub = 3;
            return 1;
        }
        if (p->state == ST_INVOKE && p->sub == 4) {
            /* "name=" seen: the name's opening quote */
            if (s[0] != '"') { p->state = ST_DONE; return 1; }
            di_buf_put(&current_call(p)->arguments, "\"", 1);
            consume(p, 1);
            p->sub = 1;
            return 1;
        }
        if (p->state == ST_INVOKE && p->sub == 3) {
            /* expecting the string attribute after blanks; anything else
             * ends parsing */
            size_t ws = 0;
            while (ws < n && (s[ws] == ' ' || s[ws] == '\t' || s[ws] == '\n' || s[ws] == '\r')) ws++;
            if (ws) { consume(p, ws); return 1; }
            int is_true = starts(s, n, M_ATTR_TRUE), is_false = starts(s, n, M_ATTR_FALSE);
            if (is_true || is_false) {
                p->value_is_string = is_true;
                if (is_true) di_buf_put(&current_call(p)->arguments, "\"", 1);
                consume(p, strlen(is_true ? M_ATTR_TRUE : M_ATTR_FALSE));
                p->sub = 0;
                p->state = ST_VALUE;
                return 1;
            }
            if (!final && (is_prefix_of(s, n, M_ATTR_TRUE) || is_prefix_of(s, n, M_ATTR_FALSE))) return 0;
            p->state = ST_DONE;
            return 1;
        }
        /* Text between tags is skipped: only DSML tags mean something. */
        const char *open = find(s, n, M_DSML), *close = find(s, n, M_DSML_CLOSE);
        const char *tag = open && (!close || open < close) ? open : close;
        if (!tag) {
            size_t keep = 0;
            if (!final) {
                keep = partial(s, n, M_DSML);
                size_t k = partial(s, n, M_DSML_CLOSE);
                if (k > keep) keep = k;
            } else if (p->state == ST_INVOKE && is_prefix_of(s, n, M_INVOKE_END) &&
                       n >= DSML_TAG_MIN) {
                /* output cut inside "</｜DSML｜ invoke>" still closes the invoke */
                di_buf *a = &current_call(p)->arguments;
                di_buf_puts(a, a->len ? "}" : "{}");
                p->state = ST_CALLS;
            }
            if (keep == n) return 0;
            consume(p, n - keep);
            return 1;
        }
        if (tag > s) { consume(p, (size_t)(tag - s)); return 1; }
        if (starts(s, n, M_CALLS)) { consume(p, strlen(M_CALLS)); return 1; }
        if (starts(s, n, M_CALLS_END)) { consume(p, n); p->state = ST_DONE; return 1; }
        if (starts(s, n, M_INVOKE_END)) {
            if (p->state == ST_INVOKE) {
                di_buf *a = &current_call(p)->arguments;
                di_buf_puts(a, a->len ? "}" : "{}");
                p->state = ST_CALLS;
            }
            consume(p, strlen(M_INVOKE_END));
            return 1;
        }
        if (p->state == ST_INVOKE && starts(s, n, M_PARAM)) {
            di_buf *a = &current_call(p)->arguments;
            di_buf_puts(a, p->params_in_call || a->len ? ", " : "{");
            p->sub = 4;
            consume(p, strlen(M_PARAM));
            return 1;
        }
        if (starts(s, n, M_INVOKE)) {
            /* the name runs to the next quote; what follows it up to the
             * next tag (normally just ">") is skipped */
            size_t ol = strlen(M_INVOKE);
            const char *quote = memchr(s + ol, '"', n - ol);
            if (!quote && !final) return 0;
            if (!quote) { p->state = ST_DONE; return 1; }
            size_t nl = (size_t)(quote - (s + ol));
            if (p->n_calls == p->cap_calls) {
                size_t cap = p->cap_calls ? p->cap_calls * 2 : 4;
                di_parse_call *c = realloc(p->calls, cap * sizeof *c);
                if (!c) { p->oom = 1; p->state = ST_DONE; return 1; }
                p->calls = c;
                p->cap_calls = cap;
            }
            di_parse_call *c = &p->calls[p->n_calls++];
            memset(c, 0, sizeof *c);
            di_buf_put(&c->name, s + ol, nl);
            p->params_in_call = 0;
            p->state = ST_INVOKE;
            consume(p, ol + nl + 1);
            return 1;
        }
        /* a tag still arriving, or one that means nothing here (skipped) */
        static const char *const tags[] = {M_CALLS, M_CALLS_END, M_INVOKE_END, M_PARAM, M_INVOKE};
        for (size_t k = 0; k < sizeof tags / sizeof *tags; k++)
            if (!final && is_prefix_of(s, n, tags[k])) return 0;
        if (final && p->state == ST_INVOKE && is_prefix_of(s, n, M_INVOKE_END)) {
            di_buf *a = &current_call(p)->arguments;
            di_buf_puts(a, a->len ? "}" : "{}");
            consume(p, n);
            p->state = ST_DONE;
            return 1;
        }
        consume(p, tag == open ? strlen(M_DSML) : strlen(M_DSML_CLOSE));
        return 1;
    }
    case ST_VALUE: {
        di_buf *a = &current_call(p)->arguments;
        /* At the end a partial closing tag is dropped once its DSML token is
         * there; a shorter tail is value text. */
        const char *hit = find(s, n, M_PARAM_END);
        size_t keep = hit ? 0 : partial(s, n, M_PARAM_END);
        if (final && keep < DSML_TAG_MIN) keep = 0;
        size_t take = hit ? (size_t)(hit - s) : n - keep;
        if (final && !hit && !take) {
            /* a cut closing tag still closes the parameter */
            if (p->value_is_string) di_buf_put(a, "\"", 1);
            consume(p, n);
            p->state = ST_DONE;
            return 0;
        }
        if (!hit && !take) return 0;
        if (p->value_is_string) di_jv_escape(s, take, a);
        else di_buf_put(a, s, take);
        if (hit) {
            if (p->value_is_string) di_buf_put(a, "\"", 1);
            p->params_in_call++;
            p->state = ST_INVOKE;
            consume(p, take + strlen(M_PARAM_END));
        } else {
            consume(p, take);
        }
        return 1;
    }
    default: /* ST_DONE: the rest of the output is not part of the message */
        consume(p, n);
        return 0;
    }
}

di_status di_parser_push(di_parser *p, const char *text, size_t len, di_err *err) {
    if (p->finished) return di_err_set(err, DI_ERR_STATE, "parser: push after finish");
    if (p->state == ST_DONE) return DI_OK;
    if (p->pending_off) {
        memmove(p->pending.p, p->pending.p + p->pending_off, p->pending.len - p->pending_off);
        p->pending.len -= p->pending_off;
        p->pending_off = 0;
    }
    di_buf_put(&p->pending, text, len);
    while (step(p, 0)) {}
    if (p->oom || p->pending.oom || p->reasoning.oom || p->content.oom)
        return di_err_set(err, DI_ERR_NOMEM, "parser: out of memory");
    return DI_OK;
}

di_status di_parser_finish(di_parser *p, di_err *err) {
    if (p->finished) return DI_OK;
    while (step(p, 1)) {}
    /* Newlines at the very end are kept (only "</think>" and a call block
     * drop the ones before them). */
    if (p->state == ST_CONTENT || p->stopped) flush_newlines(p, &p->content);
    if (p->state == ST_REASONING) flush_newlines(p, &p->reasoning);
    p->held_newlines = 0;
    p->finished = 1;
    if (p->oom || p->reasoning.oom || p->content.oom)
        return di_err_set(err, DI_ERR_NOMEM, "parser: out of memory");
    return DI_OK;
}

char *di_parser_message_json(const di_parser *p) {
    di_buf b = {0};
    di_buf_puts(&b, "{\"role\": \"assistant\", \"content\": ");
    di_jv_dump_string(p->content.p ? p->content.p : "", p->content.len, &b);
    if (p->has_reasoning) {
        di_buf_puts(&b, ", \"reasoning_content\": ");
        di_jv_dump_string(p->reasoning.p ? p->reasoning.p : "", p->reasoning.len, &b);
    }
    if (p->n_calls) {
        di_buf_puts(&b, ", \"tool_calls\": [");
        for (size_t i = 0; i < p->n_calls; i++) {
            const di_parse_call *c = &p->calls[i];
            char head[128];
            snprintf(head, sizeof head, "%s{\"index\": %zu, \"type\": \"function\", \"function\": {\"name\": ",
                     i ? ", " : "", i);
            di_buf_puts(&b, head);
            di_jv_dump_string(c->name.p ? c->name.p : "", c->name.len, &b);
            di_buf_puts(&b, ", \"arguments\": ");
            di_jv_dump_string(c->arguments.p ? c->arguments.p : "", c->arguments.len, &b);
            di_buf_puts(&b, "}}");
        }
        di_buf_puts(&b, "]");
    }
    di_buf_puts(&b, "}");
    return di_buf_take(&b);
}
