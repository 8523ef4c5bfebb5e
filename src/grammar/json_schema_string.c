/* JSON Schema strings → lexemes: patterns, formats (checked / annotation /
 * exact assertion), length bounds (counted automata; past max_repeat, chunks
 * of 256 characters), in one canonical encoding per character whenever the
 * content is constrained. Spec: ecosystem.md §1.1 (keyword coverage), §1.4
 * (refuse what cannot be enforced). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/json_schema.h"
#include "grammar/regex.h"

/* RFC 3339 full-date, February 29 in leap years only (divisible by 4, and
 * centuries by 400). */
#define FULL_DATE_RX                                                                                              \
    "([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))" \
    "|([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29)"

/* RFC 4291 / RFC 3986 IPv6address: the last 32 bits as two groups or an
 * IPv4 address. */
#define H16 "[0-9a-fA-F]{1,4}"
#define LS32 "(" H16 ":" H16 "|" IPV4_RX ")"
#define IPV4_RX "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}"
#define IPV6_RX                                                                                             \
    "((" H16 ":){6}" LS32 "|::(" H16 ":){5}" LS32 "|(" H16 ")?::(" H16 ":){4}" LS32                         \
    "|((" H16 ":){0,1}" H16 ")?::(" H16 ":){3}" LS32 "|((" H16 ":){0,2}" H16 ")?::(" H16 ":){2}" LS32        \
    "|((" H16 ":){0,3}" H16 ")?::" H16 ":" LS32 "|((" H16 ":){0,4}" H16 ")?::" LS32                         \
    "|((" H16 ":){0,5}" H16 ")?::" H16 "|((" H16 ":){0,6}" H16 ")?::)"
/* RFC 3339 partial-time without leap seconds, and time-offset. */
#define TIME_RX "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?"
#define OFFSET_RX "([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"

static const char *format_regex(const char *f) {
    if (!strcmp(f, "date")) return FULL_DATE_RX;
    if (!strcmp(f, "time")) return TIME_RX OFFSET_RX;
    if (!strcmp(f, "date-time")) return FULL_DATE_RX "[Tt]" TIME_RX OFFSET_RX;
    if (!strcmp(f, "duration"))
        return "P([0-9]+W|([0-9]+Y([0-9]+M([0-9]+D)?)?|[0-9]+M([0-9]+D)?|[0-9]+D)"
               "(T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S))?"
               "|T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S))";
    if (!strcmp(f, "email"))
        return "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]{1,64}(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]{1,64}){0,8}@"
               "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?){0,8}";
    if (!strcmp(f, "hostname"))
        return "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?){0,3}";
    if (!strcmp(f, "ipv4")) return IPV4_RX;
    if (!strcmp(f, "ipv6")) return IPV6_RX;
    if (!strcmp(f, "uuid"))
        return "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
    if (!strcmp(f, "uri"))
        return "[A-Za-z][A-Za-z0-9+.-]*:([A-Za-z0-9._~:/?#@!$&'()*+,;=-]|%[0-9A-Fa-f]{2})*";
    return NULL;
}

/* Formats whose regex is exactly the format's definition (the others
 * accept a subset: bounded label counts, no quoted e-mail local parts...);
 * time and date-time are exact with leap_second_rx. */
static int format_exact(const char *f) {
    return !strcmp(f, "date") || !strcmp(f, "ipv4") || !strcmp(f, "ipv6") || !strcmp(f, "uuid") ||
           !strcmp(f, "duration") || !strcmp(f, "time") || !strcmp(f, "date-time");
}

/* RFC 3339 full-time including leap seconds: second 60 exists only at 23:59
 * UTC, that is at local time 23:59 + offset: one alternative per offset.
 * Large (about 2,900 alternatives), so only used when asserting formats
 * exactly; the default leaves leap seconds out. */
static char *exact_time_rx(int with_date) {
    size_t cap = 2 * 1440 * 48 + 1024, k = 0;
    char *b = malloc(cap);
    if (!b) return NULL;
    k += (size_t)snprintf(b + k, cap - k, "%s(" TIME_RX OFFSET_RX "|23:59:60(\\.[0-9]+)?([Zz]|[+-]00:00)",
                          with_date ? FULL_DATE_RX "[Tt]" : "");
    for (int neg = 0; neg < 2; neg++)
        for (int off = 1; off < 1440; off++) {
            int local = neg ? (1439 - off + 1440) % 1440 : (1439 + off) % 1440;
            k += (size_t)snprintf(b + k, cap - k, "|%02d:%02d:60(\\.[0-9]+)?\\%c%02d:%02d", local / 60, local % 60,
                                  neg ? '-' : '+', off / 60, off % 60);
        }
    snprintf(b + k, cap - k, ")");
    return b;
}

int di_js_format_checked(const char *name) { return format_regex(name) != NULL; }

/* The regex (new string) of the format s asserts into *rx (NULL: none, or
 * an annotation under the options); -1 with the error set when every format
 * must be asserted and this one cannot be exactly. */
static int format_rx(js_ctx *c, const cJSON *s, char **rx) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    *rx = NULL;
    if (c->o->format_mode == DI_FORMAT_ANNOTATION || !fmt || !cJSON_IsString(fmt)) return 0;
    const char *f = fmt->valuestring, *r = format_regex(f);
    if (!r) {
        if (c->o->format_mode == DI_FORMAT_CHECKED) return 0;
        return FAIL(c, DI_ERR_UNSUPPORTED, "format '%s' cannot be asserted exactly (format_mode assert)", f);
    }
    if (c->o->format_mode == DI_FORMAT_ASSERT && !format_exact(f))
        return FAIL(c, DI_ERR_UNSUPPORTED, "format '%s' cannot be asserted exactly (format_mode assert)", f);
    if (c->o->format_mode == DI_FORMAT_ASSERT && (!strcmp(f, "time") || !strcmp(f, "date-time")))
        *rx = exact_time_rx(!strcmp(f, "date-time"));
    else *rx = strdup(r);
    return *rx ? 0 : FAIL(c, DI_ERR_NOMEM, "out of memory");
}

/* DFA of unit_rx repeated between mn and mx times (mx >= 0) inside JSON
 * quotes, by counting over the DFA of the unbounded repetition; flags as
 * for di_regex_compile (the pattern is the unbounded one, e.g. "U*"). */
static int counted_dfa(js_ctx *c, const char *unbounded_rx, unsigned flags, long mn, long mx, di_dfa *out) {
    di_dfa u;
    if (di_js_regex_compile(c, unbounded_rx, strlen(unbounded_rx), flags, c->o->max_lexer_states, &u, c->err)) return -1;
    uint32_t boundary = u.start ? di_dfa_step(&u, u.start, '"') : 0;
    di_status st = boundary ? di_dfa_count_units(&u, boundary, (uint32_t)mn, (uint32_t)mx, c->o->max_lexer_states, out, c->err)
                            : di_err_set(c->err, DI_ERR_INTERNAL, "string automaton without an opening quote");
    di_dfa_free(&u);
    return st ? -1 : 0;
}

int di_js_get_count(js_ctx *c, const cJSON *s, const char *key, long *out, long dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    *out = dflt;
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
        return FAIL(c, DI_ERR_FORMAT, "'%s' must be a non-negative integer", key);
    *out = v->valuedouble > 1e9 ? 1000000000L : (long)v->valuedouble;
    return 0;
}

static int dfa_and(js_ctx *c, di_dfa *acc, int *have, di_dfa *x) {
    if (!*have) { *acc = *x; *have = 1; return 0; }
    di_dfa r;
    di_status st = di_dfa_product(acc, x, 0, c->o->max_lexer_states, &r, c->err);
    di_dfa_free(acc);
    di_dfa_free(x);
    if (st) return -1;
    *acc = r;
    return 0;
}

/* Canonical-encoding DFA of the strings a schema allows (pattern(s),
 * format, lengths). *any = 1 when nothing constrains the content. */
int di_js_string_dfa(js_ctx *c, const cJSON *s, di_dfa *out, int *any) {
    int have = 0;
    di_dfa d;
    long mn, mx;
    if (di_js_get_count(c, s, "minLength", &mn, 0) || di_js_get_count(c, s, "maxLength", &mx, -1)) return -1;
    *any = 0;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *pats = cJSON_GetObjectItemCaseSensitive(s, "x-di-patterns");
    const cJSON *plist[64];
    int np = 0;
    if (pat) plist[np++] = pat;
    if (pats) for (const cJSON *x = pats->child; x && np < 64; x = x->next) plist[np++] = x;
    for (int i = 0; i < np; i++) {
        if (!cJSON_IsString(plist[i])) return FAIL(c, DI_ERR_FORMAT, "'pattern' must be a string");
        const char *p = plist[i]->valuestring;
        if (di_js_regex_compile(c, p, strlen(p), DI_RX_SEARCH | DI_RX_JSON_STRING, c->o->max_lexer_states, &d, c->err)) {
            di_err_prefix(c->err, "pattern /%s/: ", p);
            if (have) di_dfa_free(out);
            return -1;
        }
        if (dfa_and(c, out, &have, &d)) return -1;
    }
    {
        char *fr;
        if (format_rx(c, s, &fr)) {
            if (have) di_dfa_free(out);
            return -1;
        }
        if (fr) {
            di_status st = di_js_regex_compile(c, fr, strlen(fr), DI_RX_JSON_STRING, c->o->max_lexer_states, &d, c->err);
            free(fr);
            if (st) {
                if (have) di_dfa_free(out);
                return -1;
            }
            if (dfa_and(c, out, &have, &d)) return -1;
        }
    }
    if (mn > 0 || mx >= 0) {
        if (mn > (long)c->o->max_repeat || mx > (long)c->o->max_repeat) {
            if (have) di_dfa_free(out);
            return FAIL(c, DI_ERR_LIMIT, "string length bound %ld exceeds the limit of %u (max_repeat)",
                        mx > mn ? mx : mn, c->o->max_repeat);
        }
        char buf[96];
        int r;
        if (mx >= 0) r = counted_dfa(c, "[\\u{0}-\\u{10FFFF}]*", DI_RX_JSON_STRING, mn, mx, &d);
        else {
            snprintf(buf, sizeof buf, "[\\u{0}-\\u{10FFFF}]{%ld,}", mn);
            r = di_js_regex_compile(c, buf, strlen(buf), DI_RX_JSON_STRING, c->o->max_lexer_states, &d, c->err) ? -1 : 0;
        }
        if (r) {
            if (have) di_dfa_free(out);
            return -1;
        }
        if (dfa_and(c, out, &have, &d)) return -1;
    }
    if (!have) {
        *any = 1;
        const char *all = "[\\u{0}-\\u{10FFFF}]*";
        if (di_js_regex_compile(c, all, strlen(all), DI_RX_JSON_STRING, c->o->max_lexer_states, out, c->err)) return -1;
    }
    const cJSON *nots = cJSON_GetObjectItemCaseSensitive(s, "x-di-not-patterns");
    if (nots)
        for (const cJSON *x = nots->child; x; x = x->next) {
            if (!cJSON_IsString(x)) continue;
            if (di_js_regex_compile(c, x->valuestring, strlen(x->valuestring), DI_RX_SEARCH | DI_RX_JSON_STRING,
                                 c->o->max_lexer_states, &d, c->err)) {
                di_dfa_free(out);
                return -1;
            }
            di_dfa r;
            di_status st = di_dfa_product(out, &d, 1, c->o->max_lexer_states, &r, c->err);
            di_dfa_free(&d);
            di_dfa_free(out);
            if (st) return -1;
            *out = r;
            *any = 0;
        }
    return 0;
}

#define JS_CHUNK 256            /* characters per chunk of a long string (at most max_repeat) */
#define JS_MAX_CHUNKS 4096      /* chunks a length bound may span */

/* A plain string whose length bounds exceed max_repeat: the body is cut
 * into chunks of exactly JS_CHUNK characters and a last one of fewer, so
 * that each split is unique and every lexeme stays small; nonterminal B(k)
 * follows k chunks:
 *   string → " B(0);  B(k) → F B(k+1) | R(lo_k, hi_k)"
 * with F exactly JS_CHUNK characters and R(lo, hi)" between lo and hi < JS_CHUNK
 * characters and the closing quote (one lexeme, so that it ends only at the
 * quote)
 * (lo_k = mn - k·JS_CHUNK, hi_k = mx - k·JS_CHUNK, clipped). Without mx,
 * B(k) loops on itself once mn is reached. */
static int long_string_sym(js_ctx *c, long mn, long mx, di_sym *out) {
    const long C = c->o->max_repeat < JS_CHUNK ? (c->o->max_repeat ? (long)c->o->max_repeat : 1) : JS_CHUNK;
    long last = mx >= 0 ? mx / C : (mn + C - 1) / C;
    if (last > JS_MAX_CHUNKS || mn / C > JS_MAX_CHUNKS)
        return FAIL(c, DI_ERR_LIMIT, "string length bound %ld exceeds the limit of %ld (%d chunks of min(max_repeat, %d))",
                    mx > mn ? mx : mn, C * JS_MAX_CHUNKS, JS_MAX_CHUNKS, JS_CHUNK);
    char buf[512];
    di_sym quote, chunk, rest_any;
    snprintf(buf, sizeof buf, "%s{%ld}", STR_UNIT, C);
    if (di_js_lit_sym(c, "\"", &quote) || di_js_regex_sym(c, buf, 0, &chunk)) return -1;
    /* mask memo proxy, as for bounded strings: a rest without a lower
     * bound steps like any string body and quote */
    snprintf(buf, sizeof buf, "%s*\"", STR_UNIT);
    if (di_js_regex_sym(c, buf, 0, &rest_any)) return -1;
    int32_t *B = malloc(((size_t)last + 1) * sizeof *B);
    if (!B) return FAIL(c, DI_ERR_NOMEM, "out of memory");
    int r = 0;
    for (long k = 0; k <= last && !r; k++) r = (B[k] = di_js_new_nt(c)) < 0;
    long proxied_hi = -1;
    for (long k = 0; k <= last && !r; k++) {
        long lo = mn - k * C, hi = mx >= 0 ? mx - k * C : C - 1;
        if (lo < 0) lo = 0;
        if (hi > C - 1) hi = C - 1;
        if (lo <= hi) {
            /* the rest carries the closing quote: its lexeme ends only there */
            di_sym rest;
            snprintf(buf, sizeof buf, "%s{%ld,%ld}\"", STR_UNIT, lo, hi);
            if ((r = di_js_regex_sym(c, buf, 0, &rest)) || (r = di_js_add_rule(c, B[k], &rest, 1))) break;
            if (lo == 0 && hi != proxied_hi && DI_SYM_IS_TERM(rest) && DI_SYM_IS_TERM(rest_any)) {
                if ((r = di_cfg_set_proxy(c->g, DI_SYM_TERM_ID(rest), DI_SYM_TERM_ID(rest_any), 'a', c->err) ? -1 : 0))
                    break;
                proxied_hi = hi;
            }
        }
        int32_t next = k < last ? B[k + 1] : (mx < 0 ? B[k] : -1);
        if (next >= 0) {
            di_sym seq[2] = {chunk, next};
            r = di_js_add_rule(c, B[k], seq, 2);
        }
    }
    int32_t nt = r ? -1 : di_js_new_nt(c);
    if (nt >= 0) {
        di_sym seq[2] = {quote, B[0]};
        r = di_js_add_rule(c, nt, seq, 2);
        *out = nt;
    }
    free(B);
    return r || nt < 0 ? -1 : 0;
}

int di_js_string_sym(js_ctx *c, const cJSON *s, di_sym *out) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *pats = cJSON_GetObjectItemCaseSensitive(s, "x-di-patterns");
    char *fmt_rx;
    if (format_rx(c, s, &fmt_rx)) return -1;
    int fmt_known = fmt_rx != NULL;
    free(fmt_rx);
    if (!pat && !pats && !fmt_known && !cJSON_GetObjectItemCaseSensitive(s, "x-di-not-patterns")) {
        long mn, mx;
        if (di_js_get_count(c, s, "minLength", &mn, 0) || di_js_get_count(c, s, "maxLength", &mx, -1)) return -1;
        if (mn > (long)c->o->max_repeat || mx > (long)c->o->max_repeat) return long_string_sym(c, mn, mx, out);
        char buf[512];
        if (mx >= 0) {
            /* counted, interned by a key of its own construction */
            snprintf(buf, sizeof buf, "C:%ld,%ld", mn, mx);
            int32_t found = di_cfg_find_term(c->g, buf);
            if (found >= 0) *out = DI_SYM_TERM((uint32_t)found);
            else {
                di_dfa d;
                char ub[512];
                snprintf(ub, sizeof ub, "\"%s*\"", STR_UNIT);
                if (counted_dfa(c, ub, 0, mn, mx, &d)) return -1;
                if (di_cfg_dfa_sym(c->g, &d, buf, out, c->err)) return -1;
            }
        } else {
            if (mn > 0) snprintf(buf, sizeof buf, "\"%s{%ld,}\"", STR_UNIT, mn);
            else snprintf(buf, sizeof buf, "\"%s*\"", STR_UNIT);
            if (di_js_regex_sym(c, buf, 0, out)) return -1;
        }
        if (mx >= 0 && DI_SYM_IS_TERM(*out)) {
            /* far from the bound, a bounded string's lexer walk is the
             * unbounded one's: share its memo */
            di_sym any;
            snprintf(buf, sizeof buf, "\"%s*\"", STR_UNIT);
            if (di_js_regex_sym(c, buf, 0, &any)) return -1;
            if (DI_SYM_IS_TERM(any) && di_cfg_set_proxy(c->g, DI_SYM_TERM_ID(*out), DI_SYM_TERM_ID(any), 'a', c->err))
                return -1;
        }
        return 0;
    }
    di_dfa d;
    int any;
    if (di_js_string_dfa(c, s, &d, &any)) return -1;
    /* key: the keywords the automaton is built from, so that the same
     * string lexeme shares mask memos across grammars */
    cJSON *k = cJSON_CreateObject();
    const char *kw[] = {"pattern", "x-di-patterns", "format", "minLength", "maxLength", "x-di-not-patterns"};
    for (int i = 0; k && i < 6; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, kw[i]);
        if (i == 2 && !fmt_known) continue; /* an annotation */
        if (x) cJSON_AddItemToObject(k, kw[i], cJSON_Duplicate(x, 1));
    }
    char *txt = k ? cJSON_PrintUnformatted(k) : NULL;
    cJSON_Delete(k);
    /* the regexes behind the keywords depend on the format mode and on
     * whether U+10FFFF stands for NUL */
    char *key = txt ? malloc(strlen(txt) + 8) : NULL;
    if (key) sprintf(key, "S%d%d:%s", (int)c->o->format_mode, c->nul_marker, txt);
    free(txt);
    int r = di_cfg_dfa_sym(c->g, &d, key, out, c->err) ? -1 : 0;
    free(key);
    return r;
}
