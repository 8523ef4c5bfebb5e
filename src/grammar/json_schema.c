/* JSON Schema (draft 2020-12, with draft-07 tuple items) → grammar IR.
 * Spec: ecosystem.md §1.1 (keyword coverage of the other engines), §1.4
 * (policies: refuse what we cannot enforce, explicit whitespace, property
 * order, additionalProperties default true).
 *
 * Policies, each chosen so that an accepted output always validates:
 * - strings, keys and patterns use one canonical JSON encoding per character
 *   when a pattern, format or key set is involved (plain strings accept any
 *   escape);
 * - objects accept members in any order, tracking required members (and
 *   member counts) in the grammar state when that stays small, else in the
 *   order written in `properties`;
 * - numbers with bounds are written without exponent; unbounded integers
 *   may carry a zero fraction (1.0 is an integer from draft 6 on);
 * - oneOf, not, if/then/else and dependencies are rewritten exactly into
 *   allOf / anyOf (json_schema_logic.c), or refused;
 * - keywords we cannot enforce are errors naming them, unless lenient.
 * This file: types, enum/const, objects, arrays, allOf merging and the
 * dispatch; strings and formats are in json_schema_string.c, numbers in
 * json_schema_number.c, the rewrites of not / oneOf / if / dependencies in
 * json_schema_logic.c. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

#define JS_MAX_UNROLL_STATES 4096
#define JS_MAX_DISTRIBUTE 64     /* non-empty combinations of distributed anyOf/oneOf branches */
#define JS_MAX_ENUMERATE 65536    /* combinations looked at */
#define JS_MAX_BRANCHES 256       /* branches over all distributed disjunctions */


int di_js_fail(js_ctx *c, di_status code, const char *fmt, ...) {
    char buf[DI_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    di_err_set(c->err, code, "%s", buf);
    return -1;
}

static int32_t js_value(js_ctx *c, const cJSON *s);

/* ------------------------------------------------------------ helpers */

int32_t di_js_new_nt(js_ctx *c) { return di_cfg_nt(c->g, c->err); }

int di_js_add_rule(js_ctx *c, int32_t lhs, const di_sym *s, uint32_t n) {
    return di_cfg_rule_add(c->g, (uint32_t)lhs, s, n, c->err) ? -1 : 0;
}

/* The schema text's "\u0000" escapes are parsed as U+10FFFF (cJSON strings
 * end at NUL; see di_json_schema_build); regex text built from schema
 * strings turns that character back into \x00. Returns pat itself when
 * there is nothing to translate, else a new string (NULL: out of memory). */
static const char *nul_translate(const js_ctx *c, const char *pat, size_t len, size_t *out_len) {
    *out_len = len;
    if (!c->nul_marker || !memmem(pat, len, JS_NUL_MARKER, 4)) return pat;
    char *t = malloc(len + 1);
    if (!t) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < len;) {
        if (i + 4 <= len && !memcmp(pat + i, JS_NUL_MARKER, 4)) {
            memcpy(t + k, "\\x00", 4);
            k += 4;
            i += 4;
        } else t[k++] = pat[i++];
    }
    t[k] = 0;
    *out_len = k;
    return t;
}

di_status di_js_regex_compile(const js_ctx *c, const char *pattern, size_t len, unsigned flags, uint32_t max_states,
                              di_dfa *out, di_err *err) {
    size_t n;
    const char *p = nul_translate(c, pattern, len, &n);
    if (!p) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    di_status st = di_regex_compile(p, n, flags, max_states, out, err);
    if (p != pattern) free((char *)p);
    return st;
}

int di_js_regex_sym(js_ctx *c, const char *pat, unsigned flags, di_sym *out) {
    size_t n;
    const char *p = nul_translate(c, pat, strlen(pat), &n);
    if (!p) return FAIL(c, DI_ERR_NOMEM, "out of memory");
    int r = di_cfg_regex_sym(c->g, p, flags, out, c->err) ? -1 : 0;
    if (p != pat) free((char *)p);
    return r;
}

int di_js_lit_sym(js_ctx *c, const char *s, di_sym *out) {
    return di_cfg_literal_sym(c->g, s, strlen(s), out, c->err) ? -1 : 0;
}

cJSON *di_js_own(js_ctx *c, cJSON *x) {
    if (x) cJSON_AddItemToArray(c->owned, x);
    return x;
}

static const char *unsupported_keywords[] = {
    "minContains", "maxContains", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef",
    "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor", "$anchor", "$vocabulary", "extends",
    "disallow", "divisibleBy", NULL};

static const char *constraint_keywords[] = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties",
    "propertyNames", "minProperties", "maxProperties", "items", "prefixItems", "additionalItems",
    "minItems", "maxItems", "uniqueItems", "minLength", "maxLength", "pattern", "format", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "anyOf", "oneOf", "allOf", "$ref",
    "x-di-patterns", "x-di-not-patterns", "x-di-not-values", "x-di-non-integer", "x-di-contains", "x-di-some-key", "contains", "not",
    "if", "then", "else", "dependentRequired",
    "dependentSchemas", "dependencies", NULL};

static int in_list(const char *k, const char **l) {
    for (int i = 0; l[i]; i++)
        if (!strcmp(k, l[i])) return 1;
    return 0;
}

/* Keywords that constrain instances (supported or not); everything else is
 * an annotation. */
int di_js_is_constraint(const char *k) {
    return in_list(k, constraint_keywords) || in_list(k, unsupported_keywords);
}

/* Checks keywords of one schema object: an unsupported one is an error
 * (unless lenient); unknown ones are annotations. */
static int check_keywords(js_ctx *c, const cJSON *s) {
    for (const cJSON *k = s->child; k; k = k->next) {
        if (in_list(k->string, unsupported_keywords)) {
            if (c->o->lenient) continue;
            return FAIL(c, DI_ERR_UNSUPPORTED, "JSON Schema keyword '%s' is not supported (at %s)", k->string,
                        c->path[0] ? c->path : "#");
        }
        /* next to enum / const the values are checked one by one */
        if (!strcmp(k->string, "uniqueItems") && cJSON_IsTrue(k) && !c->o->lenient &&
            !cJSON_GetObjectItemCaseSensitive(s, "enum") && !cJSON_GetObjectItemCaseSensitive(s, "const"))
            return FAIL(c, DI_ERR_UNSUPPORTED, "JSON Schema keyword 'uniqueItems' is not supported (at %s)",
                        c->path[0] ? c->path : "#");
    }
    return 0;
}

/* Resolves a local $ref ("#", "#/a/b", "#/$defs/x"). */
const cJSON *di_js_resolve_ref(js_ctx *c, const char *ref) {
    if (ref[0] != '#') {
        FAIL(c, DI_ERR_UNSUPPORTED, "$ref '%s': only local references (#/...) are supported", ref);
        return NULL;
    }
    const cJSON *cur = c->doc;
    const char *p = ref + 1;
    if (*p && *p != '/') {
        FAIL(c, DI_ERR_UNSUPPORTED, "$ref '%s': anchors are not supported", ref);
        return NULL;
    }
    char tok[256];
    while (*p == '/') {
        p++;
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            if (*p == '~' && p[1] == '0') { tok[n++] = '~'; p += 2; }
            else if (*p == '~' && p[1] == '1') { tok[n++] = '/'; p += 2; }
            else if (*p == '%' && p[1] && p[2]) {
                char h[3] = {p[1], p[2], 0};
                tok[n++] = (char)strtol(h, NULL, 16);
                p += 3;
            } else tok[n++] = *p++;
        }
        tok[n] = 0;
        if (cJSON_IsArray(cur)) {
            char *end;
            long idx = strtol(tok, &end, 10);
            cur = (*end || idx < 0) ? NULL : cJSON_GetArrayItem(cur, (int)idx);
        } else if (cJSON_IsObject(cur)) cur = cJSON_GetObjectItemCaseSensitive(cur, tok);
        else cur = NULL;
        if (!cur) {
            FAIL(c, DI_ERR_NOT_FOUND, "$ref '%s' does not resolve", ref);
            return NULL;
        }
    }
    return cur;
}

/* ------------------------------------------------------------- types */


static int type_bit(const char *t) {
    if (!strcmp(t, "null")) return T_NULL;
    if (!strcmp(t, "boolean")) return T_BOOL;
    if (!strcmp(t, "object")) return T_OBJ;
    if (!strcmp(t, "array")) return T_ARR;
    if (!strcmp(t, "string")) return T_STR;
    if (!strcmp(t, "integer")) return T_INT;
    if (!strcmp(t, "number")) return T_NUM | T_INT;
    return 0;
}

int di_js_types_of(js_ctx *c, const cJSON *s, int *out) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (!t) { *out = T_ALL; return 0; }
    int m = 0;
    if (cJSON_IsString(t)) {
        m = type_bit(t->valuestring);
        if (!m) return FAIL(c, DI_ERR_FORMAT, "unknown type '%s'", t->valuestring);
    } else if (cJSON_IsArray(t)) {
        for (const cJSON *x = t->child; x; x = x->next) {
            int b = cJSON_IsString(x) ? type_bit(x->valuestring) : 0;
            if (!b) return FAIL(c, DI_ERR_FORMAT, "bad entry in 'type'");
            m |= b;
        }
    } else return FAIL(c, DI_ERR_FORMAT, "'type' must be a string or an array");
    *out = m;
    return 0;
}

int di_js_value_type(const cJSON *v) {
    if (cJSON_IsNull(v)) return T_NULL;
    if (cJSON_IsBool(v)) return T_BOOL;
    if (cJSON_IsObject(v)) return T_OBJ;
    if (cJSON_IsArray(v)) return T_ARR;
    if (cJSON_IsString(v)) return T_STR;
    if (cJSON_IsNumber(v)) return (v->valuedouble == floor(v->valuedouble) && fabs(v->valuedouble) < 9e15) ? T_INT : T_NUM;
    return 0;
}

cJSON *di_js_type_array(int t) {
    cJSON *arr = cJSON_CreateArray();
    const char *names[] = {"null", "boolean", "object", "array", "string", "integer", "number"};
    for (int i = 0; i < 7; i++)
        if ((t & (1 << i)) && !(i == 5 && (t & T_NUM))) cJSON_AddItemToArray(arr, cJSON_CreateString(names[i]));
    return arr;
}

/* --------------------------------------------------------- punctuation */

static int punct(js_ctx *c) {
    char ws[64];
    if (c->o->whitespace == DI_WS_COMPACT) ws[0] = 0;
    else snprintf(ws, sizeof ws, "[ \\t\\n\\r]{0,%u}", c->o->max_whitespace);
    char buf[256];
    struct { di_sym *out; const char *fmt; } ps[] = {
        {&c->t_lbrace, "\\{%s"}, {&c->t_rbrace, "%s\\}"}, {&c->t_lbrack, "\\[%s"},
        {&c->t_rbrack, "%s\\]"}, {&c->t_comma, "%s,%s"}, {&c->t_colon, "%s:%s"}};
    for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) {
        snprintf(buf, sizeof buf, ps[i].fmt, ws, ws);
        if (di_js_regex_sym(c, buf, 0, ps[i].out)) return -1;
    }
    return 0;
}

/* ------------------------------------------------------ enum / const */

/* Writes a JSON value as a grammar: arrays element by element with the
 * configured whitespace, objects as an object schema whose every member is
 * required with its value as const (members in any order, as equality of
 * JSON objects ignores it), scalars as literals (integers also as x.0). */
static int const_value(js_ctx *c, const cJSON *v, int32_t lhs, int depth) {
    if (depth > (int)c->o->max_depth) return FAIL(c, DI_ERR_LIMIT, "const/enum value nested deeper than %u", c->o->max_depth);
    di_sym syms[4];
    if (cJSON_IsObject(v)) {
        cJSON *o = di_js_own(c, cJSON_CreateObject());
        cJSON *props = cJSON_CreateObject(), *req = cJSON_CreateArray();
        if (!o || !props || !req) {
            cJSON_Delete(props);
            cJSON_Delete(req);
            return FAIL(c, DI_ERR_NOMEM, "out of memory");
        }
        cJSON_AddItemToObject(o, "type", cJSON_CreateString("object"));
        for (const cJSON *x = v->child; x; x = x->next) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddItemReferenceToObject(m, "const", (cJSON *)x);
            cJSON_AddItemToObject(props, x->string, m);
            cJSON_AddItemToArray(req, cJSON_CreateString(x->string));
        }
        cJSON_AddItemToObject(o, "properties", props);
        cJSON_AddItemToObject(o, "required", req);
        cJSON_AddItemToObject(o, "additionalProperties", cJSON_CreateFalse());
        int32_t sub = js_value(c, o);
        return sub < 0 ? -1 : di_js_add_rule(c, lhs, &sub, 1);
    }
    if (cJSON_IsArray(v)) {
        int obj = 0;
        int n = cJSON_GetArraySize(v);
        di_sym *seq = malloc(((size_t)n * 4 + 2) * sizeof *seq);
        if (!seq) return FAIL(c, DI_ERR_NOMEM, "out of memory");
        uint32_t k = 0;
        seq[k++] = obj ? c->t_lbrace : c->t_lbrack;
        int i = 0;
        for (const cJSON *x = v->child; x; x = x->next, i++) {
            if (i) seq[k++] = c->t_comma;
            if (obj) {
                cJSON *ks = cJSON_CreateString(x->string);
                char *enc = ks ? cJSON_PrintUnformatted(ks) : NULL;
                cJSON_Delete(ks);
                if (!enc) { free(seq); return FAIL(c, DI_ERR_NOMEM, "out of memory"); }
                int r = di_js_lit_sym(c, enc, &seq[k]);
                free(enc);
                if (r) { free(seq); return -1; }
                k++;
                seq[k++] = c->t_colon;
            }
            int32_t sub = di_js_new_nt(c);
            if (sub < 0 || const_value(c, x, sub, depth + 1)) { free(seq); return -1; }
            seq[k++] = sub;
        }
        seq[k++] = obj ? c->t_rbrace : c->t_rbrack;
        int r = di_js_add_rule(c, lhs, seq, k);
        free(seq);
        return r;
    }
    char *txt = NULL;
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        char buf[64];
        if (d == floor(d) && fabs(d) <= 9007199254740992.0) {
            snprintf(buf, sizeof buf, "%s%.0f(\\.0+)?", d < 0 ? "\\-" : "", fabs(d));
            if (di_js_regex_sym(c, buf, 0, &syms[0])) return -1;
            return di_js_add_rule(c, lhs, syms, 1);
        }
        txt = cJSON_PrintUnformatted(v);
    } else if (cJSON_IsString(v)) {
        /* canonical encoding, as for keys */
        size_t need = di_regex_escape(v->valuestring, strlen(v->valuestring), NULL, 0) + 1;
        char *pat = malloc(need);
        if (!pat) return FAIL(c, DI_ERR_NOMEM, "out of memory");
        di_regex_escape(v->valuestring, strlen(v->valuestring), pat, need);
        int r = di_js_regex_sym(c, pat, DI_RX_JSON_STRING, &syms[0]);
        free(pat);
        if (r) return -1;
        return di_js_add_rule(c, lhs, syms, 1);
    } else txt = cJSON_PrintUnformatted(v);
    if (!txt) return FAIL(c, DI_ERR_NOMEM, "out of memory");
    int r = di_js_lit_sym(c, txt, &syms[0]);
    free(txt);
    if (r) return -1;
    return di_js_add_rule(c, lhs, syms, 1);
}

/* Whether value v satisfies the scalar keywords of s we can check here
 * (type, string length / pattern / format, numeric bounds). Returns 1 yes,
 * 0 no, -1 error (e.g. a keyword we cannot check: refused). */
static int value_ok(js_ctx *c, const cJSON *s, const cJSON *v, int depth);

/* 1 when the string str (its canonical encoding) matches search pattern
 * pat, 0 when not, -1 on error. */
static int pattern_matches(js_ctx *c, const char *pat, const char *str) {
    di_dfa d, lit;
    if (di_js_regex_compile(c, pat, strlen(pat), DI_RX_SEARCH | DI_RX_JSON_STRING, c->o->max_lexer_states, &d, c->err))
        return -1;
    size_t need = di_regex_escape(str, strlen(str), NULL, 0) + 1;
    char *rx = malloc(need);
    int ok = -1;
    if (rx) {
        di_regex_escape(str, strlen(str), rx, need);
        if (!di_js_regex_compile(c, rx, strlen(rx), DI_RX_JSON_STRING, c->o->max_lexer_states, &lit, c->err)) {
            ok = di_dfa_intersects(&d, &lit);
            di_dfa_free(&lit);
        }
        free(rx);
    } else FAIL(c, DI_ERR_NOMEM, "out of memory");
    di_dfa_free(&d);
    return ok;
}

/* Object and array keywords checked on a constant: 1 / 0 / -1 (error),
 * or 2 when n is not one of them. */
static int container_keyword_ok(js_ctx *c, const cJSON *s, const cJSON *k, const cJSON *v, int vt, int depth) {
    const char *n = k->string;
    if (!strcmp(n, "properties") || !strcmp(n, "patternProperties") || !strcmp(n, "additionalProperties") ||
        !strcmp(n, "propertyNames")) {
        if (vt != T_OBJ) return 1;
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
        const cJSON *pp = cJSON_GetObjectItemCaseSensitive(s, "patternProperties");
        for (const cJSON *m = v->child; m; m = m->next) {
            int r = 1;
            if (!strcmp(n, "properties")) {
                const cJSON *ps = cJSON_IsObject(k) ? cJSON_GetObjectItemCaseSensitive(k, m->string) : NULL;
                if (ps) r = value_ok(c, ps, m, depth + 1);
            } else if (!strcmp(n, "patternProperties")) {
                for (const cJSON *p = k->child; p && r == 1; p = p->next) {
                    int hit = pattern_matches(c, p->string, m->string);
                    r = hit <= 0 ? (hit < 0 ? -1 : 1) : value_ok(c, p, m, depth + 1);
                }
            } else if (!strcmp(n, "additionalProperties")) {
                int declared = props && cJSON_GetObjectItemCaseSensitive(props, m->string);
                for (const cJSON *p = pp ? pp->child : NULL; p && !declared && r >= 0; p = p->next) {
                    int hit = pattern_matches(c, p->string, m->string);
                    if (hit < 0) r = -1;
                    declared |= hit > 0;
                }
                if (r == 1 && !declared) r = value_ok(c, k, m, depth + 1);
            } else {
                cJSON *key = cJSON_CreateString(m->string);
                r = key ? value_ok(c, k, key, depth + 1) : FAIL(c, DI_ERR_NOMEM, "out of memory");
                cJSON_Delete(key);
            }
            if (r != 1) return r;
        }
        return 1;
    }
    if (!strcmp(n, "x-di-some-key")) { /* see some_key_variant */
        if (vt != T_OBJ) return 1;
        const cJSON *names = cJSON_GetObjectItemCaseSensitive(k, "names");
        const cJSON *pats = cJSON_GetObjectItemCaseSensitive(k, "patterns");
        const cJSON *must = cJSON_GetObjectItemCaseSensitive(k, "pattern");
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(k, "value");
        for (const cJSON *m = v->child; m; m = m->next) {
            int skip = 0;
            for (const cJSON *x = names ? names->child : NULL; x && !skip; x = x->next)
                skip = cJSON_IsString(x) && !strcmp(x->valuestring, m->string);
            for (const cJSON *x = pats ? pats->child : NULL; x && !skip; x = x->next)
                if (cJSON_IsString(x) && (skip = pattern_matches(c, x->valuestring, m->string)) < 0) return -1;
            if (!skip && must && cJSON_IsString(must)) {
                int hit = pattern_matches(c, must->valuestring, m->string);
                if (hit < 0) return -1;
                skip = !hit;
            }
            if (skip) continue;
            int r = want ? value_ok(c, want, m, depth + 1) : 1;
            if (r != 0) return r;
        }
        return 0;
    }
    if (!strcmp(n, "items") || !strcmp(n, "prefixItems") || !strcmp(n, "additionalItems") || !strcmp(n, "contains") ||
        !strcmp(n, "x-di-contains") || !strcmp(n, "uniqueItems")) {
        if (vt != T_ARR) return 1;
        const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        if (cJSON_IsArray(items)) prefix = items; /* draft-07 tuple */
        int np = cJSON_IsArray(prefix) ? cJSON_GetArraySize(prefix) : 0, i = 0, seen = 0;
        for (const cJSON *e = v->child; e; e = e->next, i++) {
            int r = 1;
            if (!strcmp(n, "prefixItems") || (!strcmp(n, "items") && cJSON_IsArray(k))) {
                if (i < np) r = value_ok(c, cJSON_GetArrayItem(prefix, i), e, depth + 1);
            } else if (!strcmp(n, "items") || (!strcmp(n, "additionalItems") && cJSON_IsArray(items))) {
                if (i >= np) r = value_ok(c, k, e, depth + 1);
            } else if (!strcmp(n, "contains") || !strcmp(n, "x-di-contains")) {
                r = value_ok(c, k, e, depth + 1);
                if (r == 1) seen = 1;
                if (r == 0) r = 1;
            } else if (!strcmp(n, "uniqueItems") && cJSON_IsTrue(k)) {
                for (const cJSON *f = e->next; f && r == 1; f = f->next)
                    if (cJSON_Compare(e, f, 1) && di_js_value_type(e) == di_js_value_type(f)) r = 0;
            }
            if (r != 1) return r;
        }
        return strcmp(n, "contains") && strcmp(n, "x-di-contains") ? 1 : seen;
    }
    return 2;
}

static int enum_value_ok_at(js_ctx *c, const cJSON *s, const cJSON *v, int types, int depth);
static int enum_value_ok(js_ctx *c, const cJSON *s, const cJSON *v, int types) {
    return enum_value_ok_at(c, s, v, types, 0);
}

/* Whether constant v is valid under schema s (all keywords), for enum and
 * const values next to keywords on their members: 1, 0, or -1 (error, e.g.
 * a keyword we cannot check). */
static int value_ok(js_ctx *c, const cJSON *s, const cJSON *v, int depth) {
    if (depth > (int)c->o->max_depth) return FAIL(c, DI_ERR_LIMIT, "enum/const value checked deeper than %u", c->o->max_depth);
    if (cJSON_IsTrue(s)) return 1;
    if (cJSON_IsFalse(s)) return 0;
    if (!cJSON_IsObject(s)) return FAIL(c, DI_ERR_FORMAT, "schema must be an object or a boolean");
    int types;
    if (di_js_types_of(c, s, &types)) return -1;
    for (const cJSON *k = s->child; k; k = k->next) {
        const char *n = k->string;
        int r = 1;
        if (!strcmp(n, "enum") || !strcmp(n, "const")) {
            r = 0;
            for (const cJSON *x = !strcmp(n, "const") ? k : k->child; x && !r; x = !strcmp(n, "const") ? NULL : x->next)
                r = cJSON_Compare(x, v, 1);
        } else if (!strcmp(n, "$ref")) {
            const cJSON *t = cJSON_IsString(k) ? di_js_resolve_ref(c, k->valuestring) : NULL;
            r = t ? value_ok(c, t, v, depth + 1) : -1;
        } else if (!strcmp(n, "allOf") || !strcmp(n, "anyOf") || !strcmp(n, "oneOf")) {
            int hits = 0, all = 1;
            for (const cJSON *x = k->child; x; x = x->next) {
                int h = value_ok(c, x, v, depth + 1);
                if (h < 0) return -1;
                hits += h;
                all &= h;
            }
            r = n[1] == 'l' ? all : n[1] == 'n' ? hits > 0 : hits == 1;
        } else if (!strcmp(n, "not")) {
            r = value_ok(c, k, v, depth + 1);
            if (r >= 0) r = !r;
        }
        if (r != 1) return r;
    }
    return enum_value_ok_at(c, s, v, types, depth);
}

static int enum_value_ok_at(js_ctx *c, const cJSON *s, const cJSON *v, int types, int depth) {
    int vt = di_js_value_type(v);
    if (!(types & vt) && !(vt == T_INT && (types & T_NUM))) return 0;
    for (const cJSON *k = s->child; k; k = k->next) {
        const char *n = k->string;
        if (!di_js_is_constraint(n) || !strcmp(n, "type") || !strcmp(n, "enum") || !strcmp(n, "const")) continue;
        if (!strcmp(n, "$ref") || !strcmp(n, "allOf") || !strcmp(n, "anyOf") || !strcmp(n, "oneOf") || !strcmp(n, "not"))
            continue; /* value_ok's */
        int cr = container_keyword_ok(c, s, k, v, vt, depth);
        if (cr != 2) {
            if (cr != 1) return cr;
            continue;
        }
        if (!strcmp(n, "minLength") || !strcmp(n, "maxLength") || !strcmp(n, "pattern") || !strcmp(n, "format") ||
            !strcmp(n, "x-di-patterns") || !strcmp(n, "x-di-not-patterns")) {
            if (vt != T_STR) continue;
            di_dfa d;
            int any;
            if (di_js_string_dfa(c, s, &d, &any)) return -1;
            size_t need = di_regex_escape(v->valuestring, strlen(v->valuestring), NULL, 0) + 1;
            char *pat = malloc(need);
            di_dfa lit;
            int ok = 0;
            if (pat) {
                di_regex_escape(v->valuestring, strlen(v->valuestring), pat, need);
                if (!di_js_regex_compile(c, pat, strlen(pat), DI_RX_JSON_STRING, c->o->max_lexer_states, &lit, c->err)) {
                    ok = di_dfa_intersects(&d, &lit);
                    di_dfa_free(&lit);
                }
                free(pat);
            }
            di_dfa_free(&d);
            if (!ok) return 0;
            continue;
        }
        if (!strcmp(n, "minimum") || !strcmp(n, "maximum") || !strcmp(n, "exclusiveMinimum") ||
            !strcmp(n, "exclusiveMaximum")) {
            if (!(vt & (T_INT | T_NUM))) continue;
            if (!cJSON_IsNumber(k)) return FAIL(c, DI_ERR_FORMAT, "'%s' must be a number", n);
            double x = v->valuedouble, b = k->valuedouble;
            if ((!strcmp(n, "minimum") && x < b) || (!strcmp(n, "maximum") && x > b) ||
                (!strcmp(n, "exclusiveMinimum") && x <= b) || (!strcmp(n, "exclusiveMaximum") && x >= b))
                return 0;
            continue;
        }
        if (!strcmp(n, "minItems") || !strcmp(n, "maxItems") || !strcmp(n, "minProperties") ||
            !strcmp(n, "maxProperties")) {
            int size_kind = (n[3] == 'I') ? T_ARR : T_OBJ;
            if (vt != size_kind) continue;
            double cnt = cJSON_GetArraySize(v), b = cJSON_IsNumber(k) ? k->valuedouble : 0;
            if ((n[1] == 'i' && cnt < b) || (n[1] == 'a' && cnt > b)) return 0;
            continue;
        }
        if (!strcmp(n, "x-di-not-values") || !strcmp(n, "x-di-non-integer")) {
            if (!(vt & (T_INT | T_NUM))) continue;
            if (!strcmp(n, "x-di-non-integer") && vt == T_INT) return 0;
            if (!strcmp(n, "x-di-not-values"))
                for (const cJSON *x = k->child; x; x = x->next)
                    if (cJSON_IsNumber(x) && x->valuedouble == v->valuedouble) return 0;
            continue;
        }
        if (!strcmp(n, "required")) {
            if (vt != T_OBJ) continue;
            for (const cJSON *r = k->child; r; r = r->next)
                if (cJSON_IsString(r) && !cJSON_GetObjectItemCaseSensitive(v, r->valuestring)) return 0;
            continue;
        }
        if (c->o->lenient) continue;
        return FAIL(c, DI_ERR_UNSUPPORTED, "'%s' next to enum/const is not supported", n);
    }
    return 1;
}

static int32_t enum_nt(js_ctx *c, const cJSON *s, int types) {
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *co = cJSON_GetObjectItemCaseSensitive(s, "const");
    int32_t nt = di_js_new_nt(c);
    if (nt < 0) return -1;
    if (en && !cJSON_IsArray(en)) return FAIL(c, DI_ERR_FORMAT, "'enum' must be an array");
    const cJSON *vals[2] = {en ? en->child : NULL, co};
    for (int pass = 0; pass < 2; pass++) {
        const cJSON *v = vals[pass];
        if (!v) continue;
        for (; v; v = pass == 0 ? v->next : NULL) {
            /* const restricts enum: a value must equal the const too */
            if (en && co && pass == 0 && !cJSON_Compare(v, co, 1)) continue;
            if (en && co && pass == 1) break;
            int ok = enum_value_ok(c, s, v, types);
            if (ok < 0) return -1;
            if (ok && const_value(c, v, nt, 0)) return -1;
        }
    }
    return nt;
}

/* ------------------------------------------------------------ objects */

typedef struct member {
    di_sym key;
    int32_t val;
    int req;         /* index into required, -1 if optional */
    int found;       /* 1: this member is the one x-di-some-key asks for */
    int32_t nt;      /* key : value */
} member;

typedef struct obj_build {
    member *m;
    int n, cap;
    int n_req;
    long minp, maxp;
    int32_t *state_nt; /* [2^n_req * (cap+1)] */
    int cap_count;
    int found_bit;     /* required-set bit of x-di-some-key, -1 without */
} obj_build;

static int member_add(js_ctx *c, obj_build *ob, di_sym key, int32_t val, int req) {
    if (ob->n == ob->cap) {
        int cap = ob->cap ? ob->cap * 2 : 16;
        member *m = realloc(ob->m, (size_t)cap * sizeof *m);
        if (!m) return FAIL(c, DI_ERR_NOMEM, "out of memory");
        ob->m = m;
        ob->cap = cap;
    }
    int32_t nt = di_js_new_nt(c);
    if (nt < 0) return -1;
    di_sym seq[3] = {key, c->t_colon, val};
    if (di_js_add_rule(c, nt, seq, 3)) return -1;
    ob->m[ob->n++] = (member){key, val, req, 0, nt};
    return 0;
}

static int key_dfa(js_ctx *c, const char *name, di_dfa *out);
static int dfa_minus(js_ctx *c, di_dfa *acc, const di_dfa *x);

/* The required-set bits member m adds. */
static uint32_t member_bits(const obj_build *ob, const member *m) {
    return (m->req >= 0 ? 1u << m->req : 0) | (m->found ? 1u << ob->found_bit : 0);
}

/* x-di-some-key {"names": [...], "patterns": [...], "pattern": p, "value": V}
 * (negated additionalProperties: names and patterns excluded; negated
 * patternProperties: pattern p required): the object has a member whose
 * key is none of names, matches none of patterns, matches p when given, and
 * whose value also satisfies V. For a member with key symbol ks (a declared
 * name) or key automaton kd, value schema vs, adds the variant that
 * satisfies V and sets the found bit. */
static int some_key_variant(js_ctx *c, obj_build *ob, const cJSON *X, di_sym ks, const char *name, const di_dfa *kd,
                            const cJSON *vs, int req) {
    const cJSON *names = cJSON_GetObjectItemCaseSensitive(X, "names");
    const cJSON *pats = cJSON_GetObjectItemCaseSensitive(X, "patterns");
    const cJSON *must = cJSON_GetObjectItemCaseSensitive(X, "pattern");
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(X, "value");
    if ((names && !cJSON_IsArray(names)) || (pats && !cJSON_IsArray(pats)) || (must && !cJSON_IsString(must)) || !want)
        return FAIL(c, DI_ERR_INTERNAL, "x-di-some-key");
    if (name) {
        for (const cJSON *n = names ? names->child : NULL; n; n = n->next)
            if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return 0;
        for (const cJSON *p = pats ? pats->child : NULL; p; p = p->next) {
            int hit = cJSON_IsString(p) ? pattern_matches(c, p->valuestring, name) : 0;
            if (hit) return hit < 0 ? -1 : 0;
        }
        if (must) {
            int hit = pattern_matches(c, must->valuestring, name);
            if (hit <= 0) return hit;
        }
    } else {
        di_dfa d;
        if (di_dfa_product(kd, kd, 0, c->o->max_lexer_states, &d, c->err)) return -1;
        for (const cJSON *n = names ? names->child : NULL; n; n = n->next) {
            di_dfa x;
            if (!cJSON_IsString(n)) continue;
            if (key_dfa(c, n->valuestring, &x)) { di_dfa_free(&d); return -1; }
            int r = dfa_minus(c, &d, &x);
            di_dfa_free(&x);
            if (r) { di_dfa_free(&d); return -1; }
        }
        const cJSON *pl[2] = {pats ? pats->child : NULL, must};
        for (int w = 0; w < 2; w++)
            for (const cJSON *p = pl[w]; p; p = w ? NULL : p->next) {
                di_dfa x, y;
                if (!cJSON_IsString(p)) continue;
                if (di_js_regex_compile(c, p->valuestring, strlen(p->valuestring), DI_RX_SEARCH | DI_RX_JSON_STRING,
                                        c->o->max_lexer_states, &x, c->err)) {
                    di_dfa_free(&d);
                    return -1;
                }
                di_status st = di_dfa_product(&d, &x, w == 0, c->o->max_lexer_states, &y, c->err);
                di_dfa_free(&x);
                di_dfa_free(&d);
                if (st) return -1;
                d = y;
            }
        if (di_dfa_is_empty(&d)) { di_dfa_free(&d); return 0; }
        if (di_cfg_dfa_sym(c->g, &d, NULL, &ks, c->err)) return -1;
    }
    cJSON *o = di_js_own(c, cJSON_CreateObject()), *all = cJSON_CreateArray();
    if (!o || !all) { cJSON_Delete(all); return FAIL(c, DI_ERR_NOMEM, "out of memory"); }
    cJSON_AddItemReferenceToArray(all, (cJSON *)vs);
    cJSON_AddItemReferenceToArray(all, (cJSON *)want);
    cJSON_AddItemToObject(o, "allOf", all);
    int32_t val = js_value(c, o);
    if (val < 0 || member_add(c, ob, ks, val, req)) return -1;
    ob->m[ob->n - 1].found = 1;
    return 0;
}

/* Any-order object: state (set of required members seen, count). */
static int32_t obj_state(js_ctx *c, obj_build *ob, uint32_t set, int cnt);

static int32_t obj_state(js_ctx *c, obj_build *ob, uint32_t set, int cnt) {
    size_t idx = (size_t)set * (size_t)(ob->cap_count + 1) + (size_t)cnt;
    if (ob->state_nt[idx] >= 0) return ob->state_nt[idx];
    int32_t nt = di_js_new_nt(c);
    if (nt < 0) return -1;
    ob->state_nt[idx] = nt;
    uint32_t all = ob->n_req ? (uint32_t)((1ull << ob->n_req) - 1) : 0;
    if (set == all && cnt >= ob->minp) {
        if (di_js_add_rule(c, nt, &c->t_rbrace, 1)) return -1;
    }
    if (ob->maxp < 0 || cnt + 1 <= ob->maxp) {
        int nc = cnt + 1 > ob->cap_count ? ob->cap_count : cnt + 1;
        for (int i = 0; i < ob->n; i++) {
            uint32_t s2 = set | member_bits(ob, &ob->m[i]);
            int32_t next = obj_state(c, ob, s2, nc);
            if (next < 0) return -1;
            di_sym seq[3] = {c->t_comma, ob->m[i].nt, next};
            if (di_js_add_rule(c, nt, seq, 3)) return -1;
        }
    }
    return nt;
}

/* Fixed-order object: declared members in order, then extra ones. */
static int32_t obj_seq(js_ctx *c, obj_build *ob, int n_decl, int i, int cnt, int32_t *memo) {
    size_t idx = (size_t)i * (size_t)(ob->cap_count + 1) + (size_t)cnt;
    if (memo[idx] >= 0) return memo[idx];
    int32_t nt = di_js_new_nt(c);
    if (nt < 0) return -1;
    memo[idx] = nt;
    int can_add = ob->maxp < 0 || cnt + 1 <= ob->maxp;
    int nc = cnt + 1 > ob->cap_count ? ob->cap_count : cnt + 1;
    if (i < n_decl) {
        const member *m = &ob->m[i];
        if (can_add) {
            int32_t next = obj_seq(c, ob, n_decl, i + 1, nc, memo);
            if (next < 0) return -1;
            di_sym seq[3];
            uint32_t k = 0;
            if (cnt > 0) seq[k++] = c->t_comma;
            seq[k++] = m->nt;
            seq[k++] = next;
            if (di_js_add_rule(c, nt, seq, k)) return -1;
        }
        if (m->req < 0) {
            int32_t next = obj_seq(c, ob, n_decl, i + 1, cnt, memo);
            if (next < 0) return -1;
            if (di_js_add_rule(c, nt, &next, 1)) return -1;
        }
        return nt;
    }
    if (cnt >= ob->minp && di_js_add_rule(c, nt, &c->t_rbrace, 1)) return -1;
    if (can_add)
        for (int e = n_decl; e < ob->n; e++) {
            int32_t next = obj_seq(c, ob, n_decl, i, nc, memo);
            if (next < 0) return -1;
            di_sym seq[3];
            uint32_t k = 0;
            if (cnt > 0) seq[k++] = c->t_comma;
            seq[k++] = ob->m[e].nt;
            seq[k++] = next;
            if (di_js_add_rule(c, nt, seq, k)) return -1;
        }
    return nt;
}

static int key_dfa(js_ctx *c, const char *name, di_dfa *out) {
    size_t need = di_regex_escape(name, strlen(name), NULL, 0) + 1;
    char *pat = malloc(need);
    if (!pat) return FAIL(c, DI_ERR_NOMEM, "out of memory");
    di_regex_escape(name, strlen(name), pat, need);
    di_status st = di_js_regex_compile(c, pat, strlen(pat), DI_RX_JSON_STRING, c->o->max_lexer_states, out, c->err);
    free(pat);
    return st ? -1 : 0;
}

static int dfa_minus(js_ctx *c, di_dfa *acc, const di_dfa *x) {
    di_dfa r;
    if (di_dfa_product(acc, x, 1, c->o->max_lexer_states, &r, c->err)) return -1;
    di_dfa_free(acc);
    *acc = r;
    return 0;
}

static int32_t object_nt(js_ctx *c, const cJSON *s) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    const cJSON *pprops = cJSON_GetObjectItemCaseSensitive(s, "patternProperties");
    const cJSON *pnames = cJSON_GetObjectItemCaseSensitive(s, "propertyNames");
    const cJSON *some = cJSON_GetObjectItemCaseSensitive(s, "x-di-some-key");
    if (props && !cJSON_IsObject(props)) return FAIL(c, DI_ERR_FORMAT, "'properties' must be an object");
    if (req && !cJSON_IsArray(req)) return FAIL(c, DI_ERR_FORMAT, "'required' must be an array");
    if (pprops && !cJSON_IsObject(pprops)) return FAIL(c, DI_ERR_FORMAT, "'patternProperties' must be an object");
    obj_build ob = {0};
    int32_t result = -1;
    di_dfa names = {0}, extra = {0};
    int have_names = 0, have_extra = 0;
    di_dfa *pdfa = NULL;
    int n_pp = pprops ? cJSON_GetArraySize(pprops) : 0;
    if (di_js_get_count(c, s, "minProperties", &ob.minp, 0) || di_js_get_count(c, s, "maxProperties", &ob.maxp, -1)) goto done;
    /* propertyNames: a string schema every key must satisfy */
    if (pnames) {
        if (cJSON_IsFalse(pnames)) { memset(&names, 0, sizeof names); have_names = 1; }
        else if (cJSON_IsObject(pnames)) {
            for (const cJSON *k = pnames->child; k; k = k->next)
                if (di_js_is_constraint(k->string) && strcmp(k->string, "pattern") && strcmp(k->string, "minLength") &&
                    strcmp(k->string, "maxLength") && strcmp(k->string, "format") && strcmp(k->string, "type") &&
                    !c->o->lenient) {
                    FAIL(c, DI_ERR_UNSUPPORTED, "'propertyNames' with '%s' is not supported", k->string);
                    goto done;
                }
            int any;
            if (di_js_string_dfa(c, pnames, &names, &any)) goto done;
            have_names = 1;
        }
    }
    /* required names, deduplicated, that are declared or not */
    const char *rnames[64];
    int n_rn = 0;
    if (req)
        for (const cJSON *r = req->child; r; r = r->next) {
            if (!cJSON_IsString(r)) { FAIL(c, DI_ERR_FORMAT, "'required' entries must be strings"); goto done; }
            int dup = 0;
            for (int i = 0; i < n_rn; i++) dup |= !strcmp(rnames[i], r->valuestring);
            if (dup) continue;
            if (n_rn == 64) { FAIL(c, DI_ERR_LIMIT, "more than 64 required properties"); goto done; }
            rnames[n_rn++] = r->valuestring;
        }
    /* pattern DFAs */
    if (n_pp) {
        pdfa = calloc((size_t)n_pp, sizeof *pdfa);
        if (!pdfa) { FAIL(c, DI_ERR_NOMEM, "out of memory"); goto done; }
        int i = 0;
        for (const cJSON *p = pprops->child; p; p = p->next, i++)
            if (di_js_regex_compile(c, p->string, strlen(p->string), DI_RX_SEARCH | DI_RX_JSON_STRING, c->o->max_lexer_states,
                                 &pdfa[i], c->err)) {
                di_err_prefix(c->err, "patternProperties /%s/: ", p->string);
                goto done;
            }
        for (int a = 0; a < n_pp; a++)
            for (int b = a + 1; b < n_pp; b++)
                if (di_dfa_intersects(&pdfa[a], &pdfa[b])) {
                    FAIL(c, DI_ERR_UNSUPPORTED, "overlapping patternProperties are not supported");
                    goto done;
                }
    }
    /* the names every key is checked against: declared + required */
    const char *decl[1024];
    int n_decl = 0;
    if (props)
        for (const cJSON *p = props->child; p; p = p->next) {
            if (n_decl == 1024) { FAIL(c, DI_ERR_LIMIT, "more than 1024 properties"); goto done; }
            decl[n_decl++] = p->string;
        }
    for (int i = 0; i < n_rn; i++) {
        int found = 0;
        for (int k = 0; k < n_decl; k++) found |= !strcmp(decl[k], rnames[i]);
        if (!found) {
            if (n_decl == 1024) { FAIL(c, DI_ERR_LIMIT, "more than 1024 properties"); goto done; }
            decl[n_decl++] = rnames[i];
        }
    }
    int addl_false = addl ? cJSON_IsFalse(addl) : c->o->forbid_additional_properties;
    int32_t addl_val = -1;
    if (!addl_false) {
        addl_val = addl ? js_value(c, addl) : js_value(c, c->true_schema);
        if (addl_val < 0) goto done;
    }
    int n_req_members = 0;
    for (int k = 0; k < n_decl; k++) {
        const char *name = decl[k];
        int ridx = -1;
        for (int i = 0; i < n_rn; i++)
            if (!strcmp(rnames[i], name)) ridx = i;
        di_dfa kd;
        if (key_dfa(c, name, &kd)) goto done;
        int name_ok = !have_names || di_dfa_intersects(&names, &kd);
        /* value schema: the property's, plus matching patternProperties,
         * or additionalProperties when undeclared */
        const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, name) : NULL;
        cJSON *conj = cJSON_CreateArray();
        di_js_own(c, conj);
        if (ps) cJSON_AddItemReferenceToArray(conj, (cJSON *)ps);
        int matched_pp = 0;
        if (pprops) {
            int i = 0;
            for (const cJSON *p = pprops->child; p; p = p->next, i++)
                if (di_dfa_intersects(&pdfa[i], &kd)) { cJSON_AddItemReferenceToArray(conj, (cJSON *)p); matched_pp = 1; }
        }
        di_dfa_free(&kd);
        int32_t val;
        const cJSON *vs;
        if (!ps && !matched_pp) {
            val = addl_false ? -2 : addl_val;
            vs = addl ? addl : c->true_schema;
        } else if (cJSON_GetArraySize(conj) == 1) {
            val = js_value(c, vs = conj->child);
        } else {
            cJSON *all = cJSON_CreateObject();
            cJSON_AddItemReferenceToObject(all, "allOf", conj);
            di_js_own(c, all);
            val = js_value(c, vs = all);
        }
        if (val == -1) goto done;
        if (val == -2 || !name_ok) {
            if (ridx >= 0) { /* a required key that may not appear: nothing is valid */
                result = di_js_new_nt(c);
                goto done;
            }
            continue;
        }
        if (ridx >= 0) ridx = n_req_members++;
        size_t need = di_regex_escape(name, strlen(name), NULL, 0) + 1;
        char *pat = malloc(need);
        if (!pat) { FAIL(c, DI_ERR_NOMEM, "out of memory"); goto done; }
        di_regex_escape(name, strlen(name), pat, need);
        di_sym ks;
        int r = di_js_regex_sym(c, pat, DI_RX_JSON_STRING, &ks);
        free(pat);
        if (r || member_add(c, &ob, ks, val, ridx)) goto done;
        if (some && some_key_variant(c, &ob, some, ks, name, NULL, vs, ridx)) goto done;
    }
    ob.found_bit = -1;
    if (some) ob.found_bit = n_req_members++;
    ob.n_req = n_req_members;
    int n_decl_members = ob.n;
    /* pattern members: keys matching pattern i, not declared */
    for (int i = 0; i < n_pp; i++) {
        di_dfa kd;
        if (di_dfa_product(&pdfa[i], &pdfa[i], 0, c->o->max_lexer_states, &kd, c->err)) goto done;
        for (int k = 0; k < n_decl; k++) {
            di_dfa x;
            if (key_dfa(c, decl[k], &x)) { di_dfa_free(&kd); goto done; }
            int r = dfa_minus(c, &kd, &x);
            di_dfa_free(&x);
            if (r) { di_dfa_free(&kd); goto done; }
        }
        if (have_names) {
            di_dfa r;
            if (di_dfa_product(&kd, &names, 0, c->o->max_lexer_states, &r, c->err)) { di_dfa_free(&kd); goto done; }
            di_dfa_free(&kd);
            kd = r;
        }
        const cJSON *ps = cJSON_GetArrayItem(pprops, i);
        int32_t val = js_value(c, ps);
        if (val < 0) { di_dfa_free(&kd); goto done; }
        if (some && some_key_variant(c, &ob, some, 0, NULL, &kd, ps, -1)) { di_dfa_free(&kd); goto done; }
        di_sym ks;
        if (di_cfg_dfa_sym(c->g, &kd, NULL, &ks, c->err) || member_add(c, &ob, ks, val, -1)) goto done;
    }
    /* additional members: any other key */
    if (!addl_false) {
        const char *all = "[\\u{0}-\\u{10FFFF}]*";
        if (di_js_regex_compile(c, all, strlen(all), DI_RX_JSON_STRING, c->o->max_lexer_states, &extra, c->err)) goto done;
        have_extra = 1;
        for (int k = 0; k < n_decl; k++) {
            di_dfa x;
            if (key_dfa(c, decl[k], &x)) goto done;
            int r = dfa_minus(c, &extra, &x);
            di_dfa_free(&x);
            if (r) goto done;
        }
        for (int i = 0; i < n_pp; i++)
            if (dfa_minus(c, &extra, &pdfa[i])) goto done;
        if (have_names) {
            di_dfa r;
            if (di_dfa_product(&extra, &names, 0, c->o->max_lexer_states, &r, c->err)) goto done;
            di_dfa_free(&extra);
            extra = r;
        }
        di_sym ks;
        if (some && some_key_variant(c, &ob, some, 0, NULL, &extra, addl ? addl : c->true_schema, -1)) goto done;
        have_extra = 0;
        if (di_cfg_dfa_sym(c->g, &extra, NULL, &ks, c->err) || member_add(c, &ob, ks, addl_val, -1)) goto done;
        /* "any key but the declared ones" stays alive wherever "any key"
         * does (a finite set is excluded), so the latter can stand in for
         * it in the mask memo */
        di_sym anys;
        if (n_pp == 0 && !have_names && DI_SYM_IS_TERM(ks)) {
            if (di_js_regex_sym(c, all, DI_RX_JSON_STRING, &anys)) goto done;
            if (DI_SYM_IS_TERM(anys) &&
                di_cfg_set_proxy(c->g, DI_SYM_TERM_ID(ks), DI_SYM_TERM_ID(anys), -1, c->err))
                goto done;
        }
    }
    /* states */
    ob.cap_count = (int)(ob.maxp >= 0 ? ob.maxp : 0);
    if (ob.minp > ob.cap_count) ob.cap_count = (int)ob.minp;
    if (ob.cap_count < 1) ob.cap_count = 1;
    if (ob.cap_count > (int)c->o->max_repeat) {
        if (ob.maxp > (long)c->o->max_repeat || ob.minp > (long)c->o->max_repeat) {
            FAIL(c, DI_ERR_LIMIT, "min/maxProperties beyond %u", c->o->max_repeat);
            goto done;
        }
    }
    double any_order_cost = (double)(1ull << (ob.n_req < 40 ? ob.n_req : 40)) * (ob.cap_count + 1) * (ob.n + 1);
    int32_t open_nt = di_js_new_nt(c);
    if (open_nt < 0) goto done;
    if (ob.n_req <= 16 && any_order_cost <= JS_MAX_UNROLL_STATES * 4) {
        size_t ns = ((size_t)1 << ob.n_req) * (size_t)(ob.cap_count + 1);
        ob.state_nt = malloc(ns * sizeof *ob.state_nt);
        if (!ob.state_nt) { FAIL(c, DI_ERR_NOMEM, "out of memory"); goto done; }
        for (size_t i = 0; i < ns; i++) ob.state_nt[i] = -1;
        if (ob.n_req == 0 && ob.minp == 0) {
            di_sym seq[2] = {c->t_lbrace, c->t_rbrace};
            if (di_js_add_rule(c, open_nt, seq, 2)) goto done;
        }
        if (ob.maxp != 0)
            for (int i = 0; i < ob.n; i++) {
                uint32_t s2 = member_bits(&ob, &ob.m[i]);
                int32_t next = obj_state(c, &ob, s2, 1 > ob.cap_count ? ob.cap_count : 1);
                if (next < 0) goto done;
                di_sym seq[3] = {c->t_lbrace, ob.m[i].nt, next};
                if (di_js_add_rule(c, open_nt, seq, 3)) goto done;
            }
    } else if (some) {
        FAIL(c, DI_ERR_LIMIT, "negated additionalProperties on an object with %d required members is beyond the "
             "limit of tracked members", ob.n_req);
        goto done;
    } else {
        size_t ns = (size_t)(ob.n + 1) * (size_t)(ob.cap_count + 1);
        int32_t *memo = malloc(ns * sizeof *memo);
        if (!memo) { FAIL(c, DI_ERR_NOMEM, "out of memory"); goto done; }
        for (size_t i = 0; i < ns; i++) memo[i] = -1;
        int32_t first = obj_seq(c, &ob, n_decl_members, 0, 0, memo);
        free(memo);
        if (first < 0) goto done;
        di_sym seq[2] = {c->t_lbrace, first};
        if (di_js_add_rule(c, open_nt, seq, 2)) goto done;
    }
    result = open_nt;
done:
    if (have_names) di_dfa_free(&names);
    if (have_extra) di_dfa_free(&extra);
    for (int i = 0; i < n_pp && pdfa; i++) di_dfa_free(&pdfa[i]);
    free(pdfa);
    free(ob.m);
    free(ob.state_nt);
    return result;
}

/* ------------------------------------------------------------- arrays */

/* Element schema `v` that also satisfies `cont` (owned by the context). */
static const cJSON *with_contains(js_ctx *c, const cJSON *v, const cJSON *cont) {
    cJSON *o = di_js_own(c, cJSON_CreateObject()), *all = cJSON_CreateArray();
    if (!o || !all) {
        cJSON_Delete(all);
        FAIL(c, DI_ERR_NOMEM, "out of memory");
        return NULL;
    }
    cJSON_AddItemReferenceToArray(all, (cJSON *)v);
    cJSON_AddItemReferenceToArray(all, (cJSON *)cont);
    cJSON_AddItemToObject(o, "allOf", all);
    return o;
}

/* Arrays: A(i, f) after i elements, f = 1 once an element satisfied
 * `contains` (or x-di-contains, which negating `items` produces); without
 * it, f starts at 1. An element may take the plain or the contains form. */
static int32_t array_nt(js_ctx *c, const cJSON *s) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    const cJSON *addi = cJSON_GetObjectItemCaseSensitive(s, "additionalItems");
    const cJSON *cont = cJSON_GetObjectItemCaseSensitive(s, "contains");
    const cJSON *xcont = cJSON_GetObjectItemCaseSensitive(s, "x-di-contains");
    if (cont && xcont) /* two different elements may satisfy the two */
        return FAIL(c, DI_ERR_UNSUPPORTED, "'contains' together with a negated 'items' is not supported");
    if (xcont) cont = xcont;
    long mn, mx;
    if (di_js_get_count(c, s, "minItems", &mn, 0) || di_js_get_count(c, s, "maxItems", &mx, -1)) return -1;
    const cJSON *rest = items;
    if (items && cJSON_IsArray(items)) { /* draft-07 tuple form */
        if (prefix) return FAIL(c, DI_ERR_FORMAT, "both array-valued 'items' and 'prefixItems'");
        prefix = items;
        rest = addi;
    }
    if (prefix && !cJSON_IsArray(prefix)) return FAIL(c, DI_ERR_FORMAT, "'prefixItems' must be an array");
    int np = prefix ? cJSON_GetArraySize(prefix) : 0;
    int rest_false = rest && cJSON_IsFalse(rest);
    long hard_max = mx;
    if (rest_false && (hard_max < 0 || hard_max > np)) hard_max = np;
    long unroll = np > mn ? np : mn;
    if (unroll < 1) unroll = 1;
    if (hard_max >= 0) unroll = hard_max;
    if (unroll > (long)c->o->max_repeat)
        return FAIL(c, DI_ERR_LIMIT, "array bound %ld exceeds the limit of %u (max_repeat)", unroll, c->o->max_repeat);
    if (hard_max >= 0 && hard_max < mn) return di_js_new_nt(c);
    const cJSON *rest_schema = rest ? rest : c->true_schema;
    int32_t rest_val = -1, rest_cval = -1;
    if (!rest_false && (hard_max < 0 || hard_max > np)) {
        rest_val = js_value(c, rest_schema);
        if (rest_val < 0) return -1;
        if (cont) {
            const cJSON *rc = with_contains(c, rest_schema, cont);
            if (!rc || (rest_cval = js_value(c, rc)) < 0) return -1;
        }
    }
    /* A[f * (unroll + 1) + i] */
    int layers = cont ? 2 : 1;
    int32_t *A = malloc(((size_t)unroll + 1) * (size_t)layers * sizeof *A);
    if (!A) return FAIL(c, DI_ERR_NOMEM, "out of memory");
    for (long i = 0; i < (unroll + 1) * layers; i++) {
        A[i] = di_js_new_nt(c);
        if (A[i] < 0) { free(A); return -1; }
    }
    int32_t result = -1;
    for (int f = 0; f < layers; f++) {
        int done = !cont || f == 1; /* the contains condition holds */
        int32_t *Af = A + (size_t)f * (size_t)(unroll + 1);
        int32_t *A1 = A + (size_t)(layers - 1) * (size_t)(unroll + 1);
        for (long i = unroll; i >= 0; i--) {
            if (done && i >= mn && i > 0 && di_js_add_rule(c, Af[i], &c->t_rbrack, 1)) goto out;
            if (hard_max >= 0 && i + 1 > hard_max) continue;
            int32_t v = i < np ? js_value(c, cJSON_GetArrayItem(prefix, (int)i)) : rest_val;
            if (v < 0) goto out;
            long nx = i + 1 <= unroll ? i + 1 : unroll; /* loop past the unrolled part */
            di_sym seq[3] = {i > 0 ? c->t_comma : c->t_lbrack, v, Af[nx]};
            if (di_js_add_rule(c, Af[i], seq, 3)) goto out;
            if (cont && !done) {
                int32_t cv = rest_cval;
                if (i < np) {
                    const cJSON *pc = with_contains(c, cJSON_GetArrayItem(prefix, (int)i), cont);
                    if (!pc || (cv = js_value(c, pc)) < 0) goto out;
                }
                di_sym sc[3] = {seq[0], cv, A1[nx]};
                if (di_js_add_rule(c, Af[i], sc, 3)) goto out;
            }
        }
    }
    /* empty array */
    if (mn == 0 && !cont) {
        di_sym seq[2] = {c->t_lbrack, c->t_rbrack};
        if (di_js_add_rule(c, A[0], seq, 2)) goto out;
    }
    result = A[0];
out:
    free(A);
    return result;
}

/* ------------------------------------------------------ allOf merging */

static cJSON *dup(const cJSON *x) { return cJSON_Duplicate(x, 1); }

static void put(cJSON *m, const char *k, cJSON *v) {
    cJSON_DeleteItemFromObjectCaseSensitive(m, k);
    cJSON_AddItemToObject(m, k, v);
}

static cJSON *all_of2(const cJSON *a, const cJSON *b) {
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    cJSON_AddItemToArray(arr, dup(a));
    cJSON_AddItemToArray(arr, dup(b));
    cJSON_AddItemToObject(o, "allOf", arr);
    return o;
}

/* Merges plain schema b into m (both objects without allOf/anyOf/oneOf/$ref). */
static int merge_into(js_ctx *c, cJSON *m, const cJSON *b) {
    /* object keywords: a property only one side declares is governed by the
     * other side's additionalProperties */
    const cJSON *pa = cJSON_GetObjectItemCaseSensitive(m, "properties");
    const cJSON *pb = cJSON_GetObjectItemCaseSensitive(b, "properties");
    const cJSON *aa = cJSON_GetObjectItemCaseSensitive(m, "additionalProperties");
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(b, "additionalProperties");
    int ppa = cJSON_GetObjectItemCaseSensitive(m, "patternProperties") != NULL;
    int ppb = cJSON_GetObjectItemCaseSensitive(b, "patternProperties") != NULL;
    if ((pa || pb || aa || ab) && (ppa || ppb) && !(ppa && !pb && !ab) && !(ppb && !pa && !aa))
        return FAIL(c, DI_ERR_UNSUPPORTED, "allOf combining patternProperties with properties is not supported");
    /* array keywords: `items` of one side also governs the other side's
     * prefixItems positions */
    const cJSON *xa = cJSON_GetObjectItemCaseSensitive(m, "prefixItems");
    const cJSON *xb = cJSON_GetObjectItemCaseSensitive(b, "prefixItems");
    const cJSON *ia = cJSON_GetObjectItemCaseSensitive(m, "items");
    const cJSON *ib = cJSON_GetObjectItemCaseSensitive(b, "items");
    int arrays_done = 0;
    if ((xa && xb && !cJSON_Compare(xa, xb, 1)) || (ia && cJSON_IsArray(ia)) || (ib && cJSON_IsArray(ib)))
        return FAIL(c, DI_ERR_UNSUPPORTED, "allOf combining two tuple (prefixItems) schemas is not supported");
    if ((xa && !xb && ib) || (xb && !xa && ia)) {
        const cJSON *pre = xa ? xa : xb, *other = xa ? ib : ia;
        cJSON *np = cJSON_CreateArray();
        for (const cJSON *x = pre->child; x; x = x->next) cJSON_AddItemToArray(np, all_of2(x, other));
        put(m, "prefixItems", np);
        if (ia && ib) put(m, "items", all_of2(ia, ib));
        else if (ib) put(m, "items", dup(ib));
        arrays_done = 1;
    }
    if (pa || pb) {
        cJSON *np = cJSON_CreateObject();
        const cJSON *sides[2] = {pa, pb}, *others_addl[2] = {ab, aa}, *others_props[2] = {pb, pa};
        for (int s = 0; s < 2; s++) {
            if (!sides[s]) continue;
            for (const cJSON *p = sides[s]->child; p; p = p->next) {
                if (cJSON_GetObjectItemCaseSensitive(np, p->string)) continue;
                const cJSON *q = others_props[s] ? cJSON_GetObjectItemCaseSensitive(others_props[s], p->string) : NULL;
                const cJSON *other = q ? q : others_addl[s];
                cJSON_AddItemToObject(np, p->string, other ? all_of2(p, other) : dup(p));
            }
        }
        put(m, "properties", np);
    }
    for (const cJSON *k = b->child; k; k = k->next) {
        const char *n = k->string;
        if (!di_js_is_constraint(n) || !strcmp(n, "properties")) continue;
        if (arrays_done && (!strcmp(n, "prefixItems") || !strcmp(n, "items"))) continue; /* handled above */
        cJSON *mine = cJSON_GetObjectItemCaseSensitive(m, n);
        if (!mine) { cJSON_AddItemToObject(m, n, dup(k)); continue; }
        if (!strcmp(n, "type")) {
            int ta, tb;
            if (di_js_types_of(c, m, &ta) || di_js_types_of(c, b, &tb)) return -1;
            int t = ta & tb;
            if ((ta & T_NUM) && !(tb & T_NUM) && (tb & T_INT)) t &= ~T_NUM;
            put(m, "type", di_js_type_array(t));
        } else if (!strcmp(n, "required")) {
            for (const cJSON *r = k->child; r; r = r->next) cJSON_AddItemToArray(mine, dup(r));
        } else if (!strcmp(n, "minLength") || !strcmp(n, "minItems") || !strcmp(n, "minProperties") ||
                   !strcmp(n, "minimum") || !strcmp(n, "exclusiveMinimum")) {
            if (cJSON_IsNumber(k) && cJSON_IsNumber(mine) && k->valuedouble > mine->valuedouble) put(m, n, dup(k));
        } else if (!strcmp(n, "maxLength") || !strcmp(n, "maxItems") || !strcmp(n, "maxProperties") ||
                   !strcmp(n, "maximum") || !strcmp(n, "exclusiveMaximum")) {
            if (cJSON_IsNumber(k) && cJSON_IsNumber(mine) && k->valuedouble < mine->valuedouble) put(m, n, dup(k));
        } else if (!strcmp(n, "pattern")) {
            if (strcmp(mine->valuestring ? mine->valuestring : "", k->valuestring ? k->valuestring : "")) {
                cJSON *pl = cJSON_GetObjectItemCaseSensitive(m, "x-di-patterns");
                if (!pl) { pl = cJSON_CreateArray(); cJSON_AddItemToObject(m, "x-di-patterns", pl); }
                cJSON_AddItemToArray(pl, dup(k));
            }
        } else if (!strcmp(n, "additionalProperties") || !strcmp(n, "items") || !strcmp(n, "propertyNames") ||
                   !strcmp(n, "additionalItems")) {
            if (cJSON_IsArray(k) || cJSON_IsArray(mine))
                return FAIL(c, DI_ERR_UNSUPPORTED, "allOf combining tuple 'items' is not supported");
            put(m, n, all_of2(mine, k));
        } else if (!strcmp(n, "enum")) {
            cJSON *ne = cJSON_CreateArray();
            for (const cJSON *x = mine->child; x; x = x->next)
                for (const cJSON *y = k->child; y; y = y->next)
                    if (cJSON_Compare(x, y, 1) && di_js_value_type(x) == di_js_value_type(y)) { cJSON_AddItemToArray(ne, dup(x)); break; }
            put(m, "enum", ne);
        } else if (!strcmp(n, "const")) {
            if (!cJSON_Compare(mine, k, 1)) put(m, "enum", cJSON_CreateArray());
        } else if (cJSON_Compare(mine, k, 1)) {
            /* identical: nothing to do */
        } else if (!strcmp(n, "uniqueItems")) {
            if (cJSON_IsTrue(k)) put(m, n, dup(k));
        } else if (!strcmp(n, "x-di-patterns") || !strcmp(n, "x-di-not-patterns") || !strcmp(n, "x-di-not-values")) {
            for (const cJSON *r = k->child; r; r = r->next) cJSON_AddItemToArray(mine, dup(r));
        } else {
            if (c->o->lenient) continue;
            return FAIL(c, DI_ERR_UNSUPPORTED, "allOf with two different '%s' is not supported", n);
        }
    }
    return 0;
}

/* Flattens s into plain conjuncts (copies without allOf / $ref) and
 * disjunctions (anyOf / oneOf arrays). */
static int flatten(js_ctx *c, const cJSON *s, cJSON *plain, cJSON *disj, int depth) {
    if (depth > 32) return FAIL(c, DI_ERR_UNSUPPORTED, "recursive $ref inside allOf is not supported");
    if (cJSON_IsTrue(s)) return 0;
    if (cJSON_IsFalse(s)) {
        cJSON *f = cJSON_CreateObject();
        cJSON_AddItemToObject(f, "enum", cJSON_CreateArray());
        cJSON_AddItemToArray(plain, f);
        return 0;
    }
    if (!cJSON_IsObject(s)) return FAIL(c, DI_ERR_FORMAT, "schema must be an object or a boolean");
    s = di_js_rewrite_logic(c, s);
    if (!s) return -1;
    if (check_keywords(c, s)) return -1;
    cJSON *rest = cJSON_CreateObject();
    for (const cJSON *k = s->child; k; k = k->next) {
        if (!strcmp(k->string, "allOf") || !strcmp(k->string, "$ref") || !strcmp(k->string, "anyOf") ||
            !strcmp(k->string, "oneOf") || !di_js_is_constraint(k->string))
            continue;
        if (in_list(k->string, unsupported_keywords)) continue; /* lenient */
        cJSON_AddItemToObject(rest, k->string, dup(k));
    }
    cJSON_AddItemToArray(plain, rest);
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref)) return FAIL(c, DI_ERR_FORMAT, "'$ref' must be a string");
        const cJSON *t = di_js_resolve_ref(c, ref->valuestring);
        if (!t || flatten(c, t, plain, disj, depth + 1)) return -1;
    }
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (all) {
        if (!cJSON_IsArray(all) || !cJSON_GetArraySize(all)) return FAIL(c, DI_ERR_FORMAT, "'allOf' must be a non-empty array");
        for (const cJSON *x = all->child; x; x = x->next)
            if (flatten(c, x, plain, disj, depth + 1)) return -1;
    }
    const char *dk[2] = {"anyOf", "oneOf"};
    for (int i = 0; i < 2; i++) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(s, dk[i]);
        if (!d) continue;
        if (!cJSON_IsArray(d) || !cJSON_GetArraySize(d)) return FAIL(c, DI_ERR_FORMAT, "'%s' must be a non-empty array", dk[i]);
        cJSON *w = cJSON_CreateObject();
        cJSON_AddItemToObject(w, dk[i], dup(d));
        cJSON_AddItemToArray(disj, w);
    }
    return 0;
}

/* Possible instance types of a schema, following $ref / allOf / anyOf. */
int di_js_possible_types(js_ctx *c, const cJSON *s, int depth) {
    if (depth > 16 || cJSON_IsTrue(s)) return T_ALL;
    if (cJSON_IsFalse(s)) return 0;
    if (!cJSON_IsObject(s)) return T_ALL;
    int t = T_ALL;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (ty && di_js_types_of(c, s, &t)) { di_err_clear(c->err); t = T_ALL; }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (en && cJSON_IsArray(en)) {
        int e = 0;
        for (const cJSON *v = en->child; v; v = v->next) e |= di_js_value_type(v) == T_INT ? (T_INT | T_NUM) : di_js_value_type(v);
        t &= e;
    }
    const cJSON *co = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (co) t &= di_js_value_type(co) == T_INT ? (T_INT | T_NUM) : di_js_value_type(co);
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref && cJSON_IsString(ref)) {
        di_err save = *c->err;
        const cJSON *r = di_js_resolve_ref(c, ref->valuestring);
        *c->err = save;
        if (r) t &= di_js_possible_types(c, r, depth + 1);
    }
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (all) for (const cJSON *x = all->child; x; x = x->next) t &= di_js_possible_types(c, x, depth + 1);
    const char *dk[2] = {"anyOf", "oneOf"};
    for (int i = 0; i < 2; i++) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(s, dk[i]);
        if (!d) continue;
        int u = 0;
        for (const cJSON *x = d->child; x; x = x->next) u |= di_js_possible_types(c, x, depth + 1);
        t &= u;
    }
    return t;
}

/* A property that s requires with a fixed set of values (const / enum). */
static const cJSON *discriminator(js_ctx *c, const cJSON *s, const char *name, int depth) {
    if (depth > 8 || !cJSON_IsObject(s)) return NULL;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref && cJSON_IsString(ref)) {
        di_err save = *c->err;
        const cJSON *r = di_js_resolve_ref(c, ref->valuestring);
        *c->err = save;
        if (r) {
            const cJSON *d = discriminator(c, r, name, depth + 1);
            if (d) return d;
        }
    }
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    int required = 0;
    if (req) for (const cJSON *r = req->child; r; r = r->next) required |= cJSON_IsString(r) && !strcmp(r->valuestring, name);
    if (!required || !props) return NULL;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(props, name);
    if (!p || !cJSON_IsObject(p)) return NULL;
    const cJSON *co = cJSON_GetObjectItemCaseSensitive(p, "const");
    if (co) return co;
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(p, "enum");
    return (en && cJSON_IsArray(en)) ? en : NULL;
}

static int values_overlap(const cJSON *a, const cJSON *b) {
    const cJSON *as = cJSON_IsArray(a) ? a->child : a;
    for (const cJSON *x = as; x; x = cJSON_IsArray(a) ? x->next : NULL) {
        const cJSON *bs = cJSON_IsArray(b) ? b->child : b;
        for (const cJSON *y = bs; y; y = cJSON_IsArray(b) ? y->next : NULL)
            if (cJSON_Compare(x, y, 1)) return 1;
        if (!cJSON_IsArray(a)) break;
    }
    return 0;
}

/* The schema a $ref chain leads to (a schema with $ref implies its target,
 * which is enough for disjointness proofs). */
static const cJSON *deref(js_ctx *c, const cJSON *s) {
    for (int hop = 0; hop < 8 && cJSON_IsObject(s); hop++) {
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
        if (!ref || !cJSON_IsString(ref)) break;
        di_err save = *c->err;
        const cJSON *t = di_js_resolve_ref(c, ref->valuestring);
        *c->err = save;
        if (!t) break;
        s = t;
    }
    return s;
}

/* 1 when every object valid under a has a key that b forbids (a required
 * key of a that b's properties do not declare while b forbids other keys,
 * or that b declares as false). */
static int required_forbidden(js_ctx *c, const cJSON *a, const cJSON *b) {
    a = deref(c, a);
    b = deref(c, b);
    if (!cJSON_IsObject(a) || !cJSON_IsObject(b)) return 0;
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(a, "required");
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(b, "properties");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(b, "additionalProperties");
    int closed = addl && cJSON_IsFalse(addl) && !cJSON_GetObjectItemCaseSensitive(b, "patternProperties");
    if (!cJSON_IsArray(req)) return 0;
    for (const cJSON *r = req->child; r; r = r->next) {
        if (!cJSON_IsString(r)) continue;
        const cJSON *p = props ? cJSON_GetObjectItemCaseSensitive(props, r->valuestring) : NULL;
        if ((closed && !p) || (p && cJSON_IsFalse(p))) return 1;
    }
    return 0;
}

/* Canonical-encoding DFA of a string-only schema (type string, or enum /
 * const of strings, with pattern / format / lengths), for disjointness
 * proofs. Returns 0 and fills out, or -1 when the schema is not of that
 * form (err untouched). */
static int string_only_dfa(js_ctx *c, const cJSON *s, di_dfa *out) {
    s = deref(c, s);
    if (!cJSON_IsObject(s)) return -1;
    for (const cJSON *k = s->child; k; k = k->next) {
        const char *n = k->string;
        if (!di_js_is_constraint(n)) continue;
        if (strcmp(n, "type") && strcmp(n, "enum") && strcmp(n, "const") && strcmp(n, "pattern") &&
            strcmp(n, "format") && strcmp(n, "minLength") && strcmp(n, "maxLength"))
            return -1;
    }
    int t = di_js_possible_types(c, s, 0);
    if (t != T_STR) return -1;
    di_err save = *c->err;
    di_dfa d;
    int any;
    if (di_js_string_dfa(c, s, &d, &any)) { *c->err = save; return -1; }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *co = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (en || co) {
        /* union of the literals, as one regex */
        size_t cap = 64, len = 0;
        char *rx = malloc(cap);
        int first = 1, ok = rx != NULL;
        const cJSON *vals[2] = {en ? en->child : NULL, co};
        for (int pass = 0; pass < 2 && ok; pass++)
            for (const cJSON *v = vals[pass]; v && ok; v = pass == 0 ? v->next : NULL) {
                if (!cJSON_IsString(v)) continue;
                size_t need = di_regex_escape(v->valuestring, strlen(v->valuestring), NULL, 0) + 8;
                if (len + need >= cap) {
                    while (len + need >= cap) cap *= 2;
                    char *nr = realloc(rx, cap);
                    if (!nr) { ok = 0; break; }
                    rx = nr;
                }
                if (!first) rx[len++] = '|';
                first = 0;
                rx[len++] = '(';
                len += di_regex_escape(v->valuestring, strlen(v->valuestring), rx + len, cap - len);
                rx[len++] = ')';
                rx[len] = 0;
            }
        di_dfa lits;
        if (!ok || first || di_js_regex_compile(c, rx, len, DI_RX_JSON_STRING, c->o->max_lexer_states, &lits, c->err)) {
            free(rx);
            di_dfa_free(&d);
            *c->err = save;
            return -1;
        }
        free(rx);
        di_dfa r;
        di_status st = di_dfa_product(&d, &lits, 0, c->o->max_lexer_states, &r, c->err);
        di_dfa_free(&d);
        di_dfa_free(&lits);
        if (st) { *c->err = save; return -1; }
        d = r;
    }
    *out = d;
    return 0;
}

/* 1 when no instance can satisfy both a and b (a sufficient test). */
int di_js_disjoint(js_ctx *c, const cJSON *a, const cJSON *b) {
    if (required_forbidden(c, a, b) || required_forbidden(c, b, a)) return 1;
    di_dfa da, db;
    if (string_only_dfa(c, a, &da) == 0) {
        if (string_only_dfa(c, b, &db) == 0) {
            int meet = di_dfa_intersects(&da, &db);
            di_dfa_free(&db);
            di_dfa_free(&da);
            if (!meet) return 1;
        } else di_dfa_free(&da);
    }
    int ta = di_js_possible_types(c, a, 0), tb = di_js_possible_types(c, b, 0);
    int ua = ta, ub = tb;
    if (ua & T_NUM) ua |= T_INT;
    if (ub & T_NUM) ub |= T_INT;
    if (!(ua & ub)) return 1;
    /* enum / const value sets */
    const cJSON *ea = cJSON_IsObject(a) ? cJSON_GetObjectItemCaseSensitive(a, "enum") : NULL;
    const cJSON *eb = cJSON_IsObject(b) ? cJSON_GetObjectItemCaseSensitive(b, "enum") : NULL;
    const cJSON *ca = cJSON_IsObject(a) ? cJSON_GetObjectItemCaseSensitive(a, "const") : NULL;
    const cJSON *cb = cJSON_IsObject(b) ? cJSON_GetObjectItemCaseSensitive(b, "const") : NULL;
    const cJSON *va = ca ? ca : ea, *vb = cb ? cb : eb;
    if (va && vb && !values_overlap(va, vb)) return 1;
    /* object discriminator: a required property with disjoint constants */
    if ((ua & ub) == T_OBJ) {
        const cJSON *sa = a;
        for (int hop = 0; hop < 4 && cJSON_IsObject(sa); hop++) {
            const cJSON *props = cJSON_GetObjectItemCaseSensitive(sa, "properties");
            if (props)
                for (const cJSON *p = props->child; p; p = p->next) {
                    const cJSON *da = discriminator(c, a, p->string, 0), *db = discriminator(c, b, p->string, 0);
                    if (da && db && !values_overlap(da, db)) return 1;
                }
            const cJSON *ref = cJSON_GetObjectItemCaseSensitive(sa, "$ref");
            if (!ref || !cJSON_IsString(ref)) break;
            di_err save = *c->err;
            sa = di_js_resolve_ref(c, ref->valuestring);
            *c->err = save;
        }
    }
    return 0;
}

static int32_t alternatives(js_ctx *c, cJSON *const *branches, int n) {
    int32_t nt = di_js_new_nt(c);
    if (nt < 0) return -1;
    for (int i = 0; i < n; i++) {
        int32_t v = js_value(c, branches[i]);
        if (v < 0) return -1;
        if (di_js_add_rule(c, nt, &v, 1)) return -1;
    }
    return nt;
}

static int check_one_of(js_ctx *c, const cJSON *arr) {
    for (const cJSON *a = arr->child; a; a = a->next)
        for (const cJSON *b = a->next; b; b = b->next)
            if (!di_js_disjoint(c, a, b)) {
                if (c->o->lenient) return 0;
                return FAIL(c, DI_ERR_UNSUPPORTED, "oneOf whose branches may overlap is not supported (at %s)",
                            c->path[0] ? c->path : "#");
            }
    return 0;
}

/* Schema with allOf / $ref+siblings / anyOf+siblings: normalise to plain
 * schemas, distributing disjunctions. */
static int32_t combined(js_ctx *c, const cJSON *s) {
    cJSON *plain = di_js_own(c, cJSON_CreateArray()), *disj = di_js_own(c, cJSON_CreateArray());
    if (flatten(c, s, plain, disj, 0)) return -1;
    cJSON *base = cJSON_CreateObject();
    di_js_own(c, base);
    for (const cJSON *p = plain->child; p; p = p->next)
        if (merge_into(c, base, p)) return -1;
    int nd = cJSON_GetArraySize(disj);
    if (!nd) {
        /* plain schema now: compile it directly */
        return js_value(c, base);
    }
    /* product of the disjunctions' branches, each merged into base;
     * combinations with two provably disjoint parts are empty and dropped */
    double total = 1;
    int nbr = 0, ndj = 0;
    for (const cJSON *d = disj->child; d; d = d->next, ndj++) {
        const cJSON *arr = d->child;
        if (!strcmp(arr->string, "oneOf") && check_one_of(c, arr)) return -1;
        total *= cJSON_GetArraySize(arr);
        nbr += cJSON_GetArraySize(arr);
    }
    if (total > JS_MAX_ENUMERATE || nbr > JS_MAX_BRANCHES)
        return FAIL(c, DI_ERR_LIMIT, "anyOf/oneOf combinations exceed %d", JS_MAX_DISTRIBUTE);
    const cJSON *bl[JS_MAX_BRANCHES];
    int off[JS_MAX_BRANCHES + 1], cnt[JS_MAX_BRANCHES];
    signed char *dis = malloc((size_t)nbr * (size_t)nbr + (size_t)nbr);
    if (!dis) return FAIL(c, DI_ERR_NOMEM, "out of memory");
    memset(dis, -1, (size_t)nbr * (size_t)nbr + (size_t)nbr);
    signed char *base_dis = dis + (size_t)nbr * (size_t)nbr;
    int k = 0, di = 0;
    for (const cJSON *d = disj->child; d; d = d->next, di++) {
        off[di] = k;
        cnt[di] = cJSON_GetArraySize(d->child);
        for (const cJSON *x = d->child->child; x; x = x->next) bl[k++] = x;
    }
    int pick[JS_MAX_BRANCHES];
    cJSON *br[JS_MAX_DISTRIBUTE];
    int nb = 0;
    for (long idx = 0; idx < (long)total; idx++) {
        long r = idx;
        int empty = 0;
        for (int i = 0; i < ndj; i++) {
            pick[i] = off[i] + (int)(r % cnt[i]);
            r /= cnt[i];
        }
        for (int i = 0; i < ndj && !empty; i++) {
            int a = pick[i];
            if (base_dis[a] < 0) base_dis[a] = (signed char)di_js_disjoint(c, base, bl[a]);
            empty = base_dis[a];
            for (int j = 0; j < i && !empty; j++) {
                signed char *e = &dis[(size_t)a * (size_t)nbr + (size_t)pick[j]];
                if (*e < 0) *e = (signed char)di_js_disjoint(c, bl[a], bl[pick[j]]);
                empty = *e;
            }
        }
        if (empty) continue;
        if (nb == JS_MAX_DISTRIBUTE) {
            free(dis);
            return FAIL(c, DI_ERR_LIMIT, "anyOf/oneOf combinations exceed %d", JS_MAX_DISTRIBUTE);
        }
        cJSON *conj = cJSON_CreateArray();
        di_js_own(c, conj);
        cJSON_AddItemToArray(conj, dup(base));
        for (int i = 0; i < ndj; i++) cJSON_AddItemToArray(conj, dup(bl[pick[i]]));
        cJSON *w = cJSON_CreateObject();
        cJSON_AddItemToObject(w, "allOf", cJSON_Duplicate(conj, 1));
        di_js_own(c, w);
        br[nb++] = w;
    }
    free(dis);
    if (!nb) return di_js_new_nt(c); /* every combination is empty */
    return alternatives(c, br, nb);
}

/* ---------------------------------------------------------- the value */

static int32_t any_value(js_ctx *c) {
    if (c->any_value >= 0) return c->any_value;
    /* value → object | array | string | number | true | false | null */
    int32_t v = di_js_new_nt(c), obj = di_js_new_nt(c), arr = di_js_new_nt(c), members = di_js_new_nt(c), elems = di_js_new_nt(c);
    if (v < 0 || obj < 0 || arr < 0 || members < 0 || elems < 0) return -1;
    c->any_value = v;
    di_sym str, num, lit, key;
    char buf[512];
    snprintf(buf, sizeof buf, "\"%s*\"", STR_UNIT);
    if (di_js_regex_sym(c, buf, 0, &str) || di_js_regex_sym(c, buf, 0, &key) ||
        di_js_regex_sym(c, "-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?", 0, &num) ||
        di_js_regex_sym(c, "true|false|null", 0, &lit))
        return -1;
    di_sym alts[5] = {obj, arr, str, num, lit};
    for (int i = 0; i < 5; i++)
        if (di_js_add_rule(c, v, &alts[i], 1)) return -1;
    /* obj → { } | { key : value members ;  members → ε | , key : value members */
    di_sym e1[2] = {c->t_lbrace, c->t_rbrace};
    di_sym e2[5] = {c->t_lbrace, key, c->t_colon, v, members};
    di_sym m1[4] = {c->t_comma, key, c->t_colon, v};
    int32_t mm = di_js_new_nt(c);
    if (mm < 0) return -1;
    di_sym m2[2] = {mm, members};
    (void)m2;
    if (di_js_add_rule(c, obj, e1, 2) || di_js_add_rule(c, obj, e2, 5)) return -1;
    /* members → } | , key : value members */
    di_sym mend = c->t_rbrace;
    di_sym mrec[5] = {m1[0], m1[1], m1[2], m1[3], members};
    if (di_js_add_rule(c, members, &mend, 1) || di_js_add_rule(c, members, mrec, 5)) return -1;
    di_sym a1[2] = {c->t_lbrack, c->t_rbrack};
    di_sym a2[3] = {c->t_lbrack, v, elems};
    di_sym erec[3] = {c->t_comma, v, elems};
    if (di_js_add_rule(c, arr, a1, 2) || di_js_add_rule(c, arr, a2, 3) || di_js_add_rule(c, elems, &c->t_rbrack, 1) ||
        di_js_add_rule(c, elems, erec, 3))
        return -1;
    return v;
}

static int32_t js_value_body(js_ctx *c, const cJSON *s, int32_t nt) {
    const cJSON *r = di_js_rewrite_logic(c, s);
    if (!r) return -1;
    if (r != s) {
        int32_t v = js_value(c, r);
        return v < 0 || di_js_add_rule(c, nt, &v, 1) ? -1 : nt;
    }
    if (cJSON_IsTrue(s)) {
        int32_t v = any_value(c);
        return v < 0 || di_js_add_rule(c, nt, &v, 1) ? -1 : nt;
    }
    if (cJSON_IsFalse(s)) return nt; /* no rules */
    if (!cJSON_IsObject(s)) return FAIL(c, DI_ERR_FORMAT, "schema must be an object or a boolean");
    if (check_keywords(c, s)) return -1;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    int n_comb = !!any + !!one;
    int others = 0;
    for (const cJSON *k = s->child; k; k = k->next)
        if (di_js_is_constraint(k->string) && strcmp(k->string, "$ref") && strcmp(k->string, "anyOf") &&
            strcmp(k->string, "oneOf") && strcmp(k->string, "allOf") && !in_list(k->string, unsupported_keywords))
            others = 1;
    if (all || (ref && (others || n_comb)) || n_comb > 1 || (n_comb && others)) {
        int32_t v = combined(c, s);
        return v < 0 || di_js_add_rule(c, nt, &v, 1) ? -1 : nt;
    }
    if (ref) {
        if (!cJSON_IsString(ref)) return FAIL(c, DI_ERR_FORMAT, "'$ref' must be a string");
        const cJSON *t = di_js_resolve_ref(c, ref->valuestring);
        if (!t) return -1;
        int32_t v = js_value(c, t);
        return v < 0 || di_js_add_rule(c, nt, &v, 1) ? -1 : nt;
    }
    if (n_comb) {
        const cJSON *arr = any ? any : one;
        if (!cJSON_IsArray(arr) || !cJSON_GetArraySize(arr))
            return FAIL(c, DI_ERR_FORMAT, "'%s' must be a non-empty array", any ? "anyOf" : "oneOf");
        if (one && check_one_of(c, one)) return -1;
        for (const cJSON *b = arr->child; b; b = b->next) {
            int32_t v = js_value(c, b);
            if (v < 0 || di_js_add_rule(c, nt, &v, 1)) return -1;
        }
        return nt;
    }
    int types;
    if (di_js_types_of(c, s, &types)) return -1;
    if (cJSON_GetObjectItemCaseSensitive(s, "enum") || cJSON_GetObjectItemCaseSensitive(s, "const")) {
        int32_t v = enum_nt(c, s, types);
        return v < 0 || di_js_add_rule(c, nt, &v, 1) ? -1 : nt;
    }
    di_sym sym;
    if (types & T_NULL) {
        if (di_js_lit_sym(c, "null", &sym) || di_js_add_rule(c, nt, &sym, 1)) return -1;
    }
    if (types & T_BOOL) {
        if (di_js_regex_sym(c, "true|false", 0, &sym) || di_js_add_rule(c, nt, &sym, 1)) return -1;
    }
    if (types & T_STR) {
        if (di_js_string_sym(c, s, &sym) || di_js_add_rule(c, nt, &sym, 1)) return -1;
    }
    if (types & (T_INT | T_NUM)) {
        if (di_js_number_sym(c, s, !(types & T_NUM), &sym) || di_js_add_rule(c, nt, &sym, 1)) return -1;
    }
    if (types & T_OBJ) {
        int32_t v = object_nt(c, s);
        if (v < 0 || di_js_add_rule(c, nt, &v, 1)) return -1;
    }
    if (types & T_ARR) {
        int32_t v = array_nt(c, s);
        if (v < 0 || di_js_add_rule(c, nt, &v, 1)) return -1;
    }
    return nt;
}

static int32_t js_value(js_ctx *c, const cJSON *s) {
    if (!s) return FAIL(c, DI_ERR_INTERNAL, "missing schema");
    for (uint32_t i = 0; i < c->n_memo; i++)
        if (c->memo[i].node == s) return c->memo[i].nt;
    if (di_cfg_check_time(c->g, c->err)) return -1;
    if (c->depth >= (int)c->o->max_depth)
        return FAIL(c, DI_ERR_LIMIT, "schema nesting exceeds the depth limit of %u", c->o->max_depth);
    int32_t nt = di_js_new_nt(c);
    if (nt < 0) return -1;
    if (c->n_memo == c->cap_memo) {
        uint32_t cap = c->cap_memo ? c->cap_memo * 2 : 64;
        memo_ent *m = realloc(c->memo, cap * sizeof *m);
        if (!m) return FAIL(c, DI_ERR_NOMEM, "out of memory");
        c->memo = m;
        c->cap_memo = cap;
    }
    c->memo[c->n_memo++] = (memo_ent){s, nt};
    c->depth++;
    int32_t r = js_value_body(c, s, nt);
    c->depth--;
    return r;
}

static int ctx_init(js_ctx *c, di_cfg *g, const di_grammar_options *o, di_err *err) {
    memset(c, 0, sizeof *c);
    c->g = g;
    c->o = o;
    c->err = err;
    c->any_value = -1;
    c->owned = cJSON_CreateArray();
    if (!c->owned) return FAIL(c, DI_ERR_NOMEM, "out of memory");
    c->int_zero_frac = 1;
    c->true_schema = cJSON_CreateTrue();
    if (!c->true_schema) return FAIL(c, DI_ERR_NOMEM, "out of memory");
    cJSON_AddItemToArray(c->owned, c->true_schema);
    return punct(c);
}

static void ctx_free(js_ctx *c) {
    cJSON_Delete(c->owned);
    free(c->memo);
}

/* Copy of the JSON text with every "\u0000" escape inside a string written
 * as U+10FFFF ("\uDBFF\uDFFF"), so that cJSON keeps the string whole; NULL
 * when there is none. *clash: the text already holds U+10FFFF. */
static char *nul_escapes_marked(const char *text, size_t len, size_t *out_len, int *clash) {
    size_t n_nul = 0;
    int in_str = 0;
    *clash = memmem(text, len, JS_NUL_MARKER, 4) != NULL;
    for (size_t i = 0; i < len; i++) {
        if (!in_str) { in_str = text[i] == '"'; continue; }
        if (text[i] == '"') in_str = 0;
        else if (text[i] == '\\' && i + 1 < len) {
            if (text[i + 1] == 'u' && i + 6 <= len) {
                if (!memcmp(text + i + 2, "0000", 4)) n_nul++;
                if (!strncasecmp(text + i + 2, "dbff", 4) && i + 12 <= len && !strncasecmp(text + i + 6, "\\udfff", 6))
                    *clash = 1;
            }
            i++;
        }
    }
    if (!n_nul) return NULL;
    char *t = malloc(len + n_nul * 6 + 1);
    if (!t) return NULL;
    size_t k = 0;
    in_str = 0;
    for (size_t i = 0; i < len; i++) {
        if (!in_str) { in_str = text[i] == '"'; t[k++] = text[i]; continue; }
        if (text[i] == '"') in_str = 0;
        else if (text[i] == '\\' && i + 1 < len) {
            if (text[i + 1] == 'u' && i + 6 <= len && !memcmp(text + i + 2, "0000", 4)) {
                memcpy(t + k, "\\uDBFF\\uDFFF", 12);
                k += 12;
                i += 5;
                continue;
            }
            t[k++] = text[i++];
        }
        t[k++] = text[i];
    }
    t[k] = 0;
    *out_len = k;
    return t;
}

di_status di_json_schema_build(di_cfg *g, const char *text, size_t len, const di_grammar_options *opts,
                               uint32_t *root, di_err *err) {
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!doc) {
        size_t pos = end && end >= text ? (size_t)(end - text) : 0;
        int line, col;
        di_text_position(text, len, pos, &line, &col);
        return di_err_set(err, DI_ERR_FORMAT, "JSON Schema: syntax error at line %d, column %d", line, col);
    }
    size_t mlen = 0;
    int clash = 0;
    char *marked = nul_escapes_marked(text, len, &mlen, &clash);
    int nul_marker = marked != NULL;
    if (marked) {
        cJSON_Delete(doc);
        doc = clash ? NULL : cJSON_ParseWithLengthOpts(marked, mlen, &end, 0);
        free(marked);
        if (!doc)
            return di_err_set(err, clash ? DI_ERR_UNSUPPORTED : DI_ERR_NOMEM,
                              clash ? "JSON Schema: strings with both NUL and U+10FFFF are not supported" : "out of memory");
    }
    if ((unsigned)opts->format_mode > DI_FORMAT_ASSERT) {
        cJSON_Delete(doc);
        return di_err_set(err, DI_ERR_INVALID_ARG, "grammar option format_mode %d out of range (0..2)",
                          (int)opts->format_mode);
    }
    js_ctx c;
    di_status st = DI_OK;
    if (ctx_init(&c, g, opts, err)) st = err->code;
    else {
        c.doc = doc;
        c.nul_marker = nul_marker;
        /* draft 4 and earlier: an integer is written without a fraction */
        const cJSON *sv = cJSON_GetObjectItemCaseSensitive(doc, "$schema");
        if (sv && cJSON_IsString(sv) && (strstr(sv->valuestring, "draft-04") || strstr(sv->valuestring, "draft-03")))
            c.int_zero_frac = 0;
        /* another meta-schema may choose other vocabularies (even none that
         * validates): we only know the published drafts' */
        int32_t r = -1;
        if (sv && cJSON_IsString(sv) && strncmp(sv->valuestring, "http://json-schema.org/", 23) &&
            strncmp(sv->valuestring, "https://json-schema.org/", 24))
            FAIL(&c, DI_ERR_UNSUPPORTED, "$schema '%.200s': only the json-schema.org meta-schemas are supported",
                 sv->valuestring);
        else r = js_value(&c, doc);
        if (r < 0) st = err->code ? err->code : DI_ERR_INTERNAL;
        else *root = (uint32_t)r;
    }
    ctx_free(&c);
    cJSON_Delete(doc);
    if (st && err->msg[0] && strncmp(err->msg, "JSON Schema", 11)) di_err_prefix(err, "JSON Schema: ");
    return st;
}

di_status di_json_any_object_build(di_cfg *g, const di_grammar_options *opts, uint32_t *root, di_err *err) {
    js_ctx c;
    di_status st = DI_OK;
    cJSON *doc = cJSON_Parse("{\"type\":\"object\"}");
    if (!doc) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    if (ctx_init(&c, g, opts, err)) st = err->code;
    else {
        c.doc = doc;
        int32_t r = js_value(&c, doc);
        if (r < 0) st = err->code;
        else *root = (uint32_t)r;
    }
    ctx_free(&c);
    cJSON_Delete(doc);
    return st;
}
