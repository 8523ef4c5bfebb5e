/* JSON values for the V4.1 chat format: strict parser and the reference's
 * printing rules (architecture.md §9.2). See chat_json.h for why this is not
 * cJSON. */
#include "recipe/chat_json.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/utf8.h"

/* ------------------------------------------------------------------ values */

const char *di_jv_type_name(di_jv_type t) {
    switch (t) {
    case DI_JV_NULL: return "null";
    case DI_JV_FALSE: case DI_JV_TRUE: return "boolean";
    case DI_JV_NUMBER: return "number";
    case DI_JV_STRING: return "string";
    case DI_JV_ARRAY: return "array";
    case DI_JV_OBJECT: return "object";
    }
    return "?";
}

di_jv *di_jv_new(di_jv_type t) {
    di_jv *v = calloc(1, sizeof *v);
    if (v) v->type = t;
    return v;
}

di_jv *di_jv_new_string(const char *s, size_t n) {
    di_jv *v = di_jv_new(DI_JV_STRING);
    if (!v) return NULL;
    v->str = malloc(n + 1);
    if (!v->str) { free(v); return NULL; }
    if (n) memcpy(v->str, s, n);
    v->str[n] = '\0';
    v->len = n;
    return v;
}

void di_jv_free(di_jv *v) {
    if (!v) return;
    for (size_t i = 0; i < v->n; i++) {
        di_jv_free(v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->key_lens);
    free(v->str);
    free(v);
}

static int jv_grow(di_jv *v) {
    if (v->n < v->cap) return 0;
    size_t cap = v->cap ? v->cap * 2 : 4;
    di_jv **items = realloc(v->items, cap * sizeof *items);
    if (!items) return -1;
    v->items = items;
    if (v->type == DI_JV_OBJECT) {
        char **keys = realloc(v->keys, cap * sizeof *keys);
        if (!keys) return -1;
        v->keys = keys;
        size_t *lens = realloc(v->key_lens, cap * sizeof *lens);
        if (!lens) return -1;
        v->key_lens = lens;
    }
    v->cap = cap;
    return 0;
}

int di_jv_push(di_jv *arr, di_jv *item) {
    if (!item || jv_grow(arr)) { di_jv_free(item); return -1; }
    arr->items[arr->n++] = item;
    return 0;
}

/* Object insert with the reference's map semantics: a repeated key keeps its
 * first position and takes the new value. Takes ownership of key and item. */
static int jv_set_owned(di_jv *obj, char *key, size_t klen, di_jv *item) {
    for (size_t i = 0; i < obj->n; i++) {
        if (obj->key_lens[i] == klen && !memcmp(obj->keys[i], key, klen)) {
            di_jv_free(obj->items[i]);
            obj->items[i] = item;
            free(key);
            return 0;
        }
    }
    if (jv_grow(obj)) { free(key); di_jv_free(item); return -1; }
    obj->keys[obj->n] = key;
    obj->key_lens[obj->n] = klen;
    obj->items[obj->n++] = item;
    return 0;
}

int di_jv_set(di_jv *obj, const char *key, di_jv *item) {
    if (!item) return -1;
    size_t n = strlen(key);
    char *k = malloc(n + 1);
    if (!k) { di_jv_free(item); return -1; }
    memcpy(k, key, n + 1);
    return jv_set_owned(obj, k, n, item);
}

di_jv *di_jv_clone(const di_jv *v) {
    if (!v) return NULL;
    di_jv *c = di_jv_new(v->type);
    if (!c) return NULL;
    if (v->str) {
        c->str = malloc(v->len + 1);
        if (!c->str) { free(c); return NULL; }
        memcpy(c->str, v->str, v->len + 1);
        c->len = v->len;
    }
    for (size_t i = 0; i < v->n; i++) {
        di_jv *item = di_jv_clone(v->items[i]);
        int rc = v->type == DI_JV_OBJECT ? di_jv_set(c, v->keys[i], item) : di_jv_push(c, item);
        if (rc) { di_jv_free(c); return NULL; }
    }
    return c;
}

const di_jv *di_jv_get(const di_jv *v, const char *key) {
    if (!v || v->type != DI_JV_OBJECT) return NULL;
    size_t n = strlen(key);
    for (size_t i = 0; i < v->n; i++)
        if (v->key_lens[i] == n && !memcmp(v->keys[i], key, n)) return v->items[i];
    return NULL;
}

const char *di_jv_string(const di_jv *v) {
    return v && v->type == DI_JV_STRING ? v->str : NULL;
}

double di_jv_number(const di_jv *v) {
    return v && v->type == DI_JV_NUMBER ? strtod(v->str, NULL) : 0.0;
}

int di_jv_is_integer(const di_jv *v) {
    if (!v || v->type != DI_JV_NUMBER) return 0;
    if (strpbrk(v->str, ".eE")) return 0;
    errno = 0;
    if (v->str[0] == '-') {
        /* "-0" is read as a float by the reference (it prints -0.0). */
        if (!strcmp(v->str, "-0")) return 0;
        (void)strtoll(v->str, NULL, 10);
    } else {
        (void)strtoull(v->str, NULL, 10);
    }
    return errno != ERANGE;
}

/* ------------------------------------------------------------------ parser */

typedef struct jparser {
    const char *s;
    size_t n, i;
    const char *what;
    di_err *err;
} jparser;

static di_status jp_fail(jparser *p, const char *msg) {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < p->i && k < p->n; k++) {
        if (p->s[k] == '\n') { line++; col = 1; }
        else if (((unsigned char)p->s[k] & 0xC0) != 0x80) col++;
    }
    return di_err_set(p->err, DI_ERR_FORMAT, "%s: line %zu column %zu: %s", p->what, line, col,
                      msg);
}

static void jp_ws(jparser *p) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->i++;
    }
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* Reads a string literal at p->i (on the opening quote) into out. */
static di_status jp_string(jparser *p, di_buf *out) {
    p->i++;
    /* Most strings have no escapes: size the buffer once. */
    size_t end = p->i;
    while (end < p->n && p->s[end] != '"' && p->s[end] != '\\' && (unsigned char)p->s[end] >= 0x20)
        end++;
    if (end < p->n && p->s[end] == '"' && !out->p) {
        size_t ok = di_utf8_valid_prefix((const unsigned char *)p->s + p->i, end - p->i);
        if (ok != end - p->i) { p->i += ok; return jp_fail(p, "invalid UTF-8"); }
        if (!(out->p = malloc(end - p->i + 1)))
            return di_err_set(p->err, DI_ERR_NOMEM, "%s: out of memory", p->what);
        out->cap = end - p->i + 1;
        di_buf_put(out, p->s + p->i, end - p->i);
        p->i = end + 1;
        return DI_OK;
    }
    for (;;) {
        if (p->i >= p->n) return jp_fail(p, "unterminated string");
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') { p->i++; break; }
        if (c < 0x20) return jp_fail(p, "control character inside a string");
        if (c == '\\') {
            if (p->i + 1 >= p->n) return jp_fail(p, "unterminated escape");
            char e = p->s[p->i + 1];
            const char *rep = NULL;
            switch (e) {
            case '"': rep = "\""; break;
            case '\\': rep = "\\"; break;
            case '/': rep = "/"; break;
            case 'b': rep = "\b"; break;
            case 'f': rep = "\f"; break;
            case 'n': rep = "\n"; break;
            case 'r': rep = "\r"; break;
            case 't': rep = "\t"; break;
            case 'u': break;
            default: p->i++; return jp_fail(p, "invalid escape");
            }
            if (rep) { di_buf_put(out, rep, 1); p->i += 2; continue; }
            unsigned cp;
            if (p->i + 6 > p->n || hex4(p->s + p->i + 2, &cp)) return jp_fail(p, "invalid \\u escape");
            if (cp >= 0xDC00 && cp <= 0xDFFF) return jp_fail(p, "lone low surrogate in \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (p->i + 12 > p->n || p->s[p->i + 6] != '\\' || p->s[p->i + 7] != 'u' ||
                    hex4(p->s + p->i + 8, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return jp_fail(p, "lone high surrogate in \\u escape");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p->i += 6;
            }
            uint8_t u[4];
            di_buf_put(out, (const char *)u, di_utf8_encode((int32_t)cp, u));
            p->i += 6;
            continue;
        }
        size_t start = p->i;
        while (p->i < p->n && p->s[p->i] != '"' && p->s[p->i] != '\\' &&
               (unsigned char)p->s[p->i] >= 0x20)
            p->i++;
        size_t ok = di_utf8_valid_prefix((const unsigned char *)p->s + start, p->i - start);
        if (ok != p->i - start) { p->i = start + ok; return jp_fail(p, "invalid UTF-8"); }
        di_buf_put(out, p->s + start, p->i - start);
    }
    if (out->oom) return di_err_set(p->err, DI_ERR_NOMEM, "%s: out of memory", p->what);
    return DI_OK;
}

static di_status jp_number(jparser *p, di_jv **out) {
    size_t start = p->i;
    if (p->s[p->i] == '-') p->i++;
    if (p->i >= p->n) return jp_fail(p, "invalid number");
    if (p->s[p->i] == '0') p->i++;
    else if (p->s[p->i] >= '1' && p->s[p->i] <= '9')
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    else return jp_fail(p, "invalid number");
    if (p->i < p->n && p->s[p->i] == '.') {
        p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return jp_fail(p, "invalid number");
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return jp_fail(p, "invalid number");
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    }
    di_jv *v = di_jv_new(DI_JV_NUMBER);
    if (!v || !(v->str = malloc(p->i - start + 1))) {
        free(v);
        return di_err_set(p->err, DI_ERR_NOMEM, "%s: out of memory", p->what);
    }
    memcpy(v->str, p->s + start, p->i - start);
    v->str[p->i - start] = '\0';
    v->len = p->i - start;
    if (!di_jv_is_integer(v) && isinf(strtod(v->str, NULL))) {
        di_jv_free(v);
        p->i = start;
        return jp_fail(p, "number out of range");
    }
    *out = v;
    return DI_OK;
}

static di_status jp_value(jparser *p, int depth, di_jv **out);

static di_status jp_container(jparser *p, int depth, di_jv **out) {
    int is_obj = p->s[p->i] == '{';
    char close = is_obj ? '}' : ']';
    if (depth >= DI_JV_MAX_DEPTH) return jp_fail(p, "nesting too deep");
    di_jv *v = di_jv_new(is_obj ? DI_JV_OBJECT : DI_JV_ARRAY);
    if (!v) return di_err_set(p->err, DI_ERR_NOMEM, "%s: out of memory", p->what);
    p->i++;
    jp_ws(p);
    if (p->i < p->n && p->s[p->i] == close) { p->i++; *out = v; return DI_OK; }
    for (;;) {
        di_buf key = {0};
        if (is_obj) {
            jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != '"') { di_jv_free(v); return jp_fail(p, "expected a string key"); }
            di_status st = jp_string(p, &key);
            if (st) { di_buf_free(&key); di_jv_free(v); return st; }
            jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') { di_buf_free(&key); di_jv_free(v); return jp_fail(p, "expected ':'"); }
            p->i++;
        }
        di_jv *item = NULL;
        di_status st = jp_value(p, depth + 1, &item);
        if (st) { di_buf_free(&key); di_jv_free(v); return st; }
        int rc;
        if (is_obj) {
            size_t klen = key.len;
            char *k = di_buf_take(&key);
            rc = k ? jv_set_owned(v, k, klen, item) : (di_jv_free(item), -1);
        } else {
            rc = di_jv_push(v, item);
        }
        if (rc) { di_jv_free(v); return di_err_set(p->err, DI_ERR_NOMEM, "%s: out of memory", p->what); }
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') { p->i++; continue; }
        if (p->i < p->n && p->s[p->i] == close) { p->i++; break; }
        di_jv_free(v);
        return jp_fail(p, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    *out = v;
    return DI_OK;
}

static di_status jp_value(jparser *p, int depth, di_jv **out) {
    jp_ws(p);
    if (p->i >= p->n) return jp_fail(p, "unexpected end of input");
    char c = p->s[p->i];
    if (c == '{' || c == '[') return jp_container(p, depth, out);
    if (c == '"') {
        di_buf b = {0};
        di_status st = jp_string(p, &b);
        if (st) { di_buf_free(&b); return st; }
        di_jv *v = di_jv_new(DI_JV_STRING);
        size_t len = b.len;
        char *text = di_buf_take(&b); /* the value keeps the buffer */
        if (!v || !text) {
            free(v);
            free(text);
            return di_err_set(p->err, DI_ERR_NOMEM, "%s: out of memory", p->what);
        }
        v->str = text;
        v->len = len;
        *out = v;
        return DI_OK;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return jp_number(p, out);
    static const struct { const char *word; di_jv_type t; } words[] = {
        {"null", DI_JV_NULL}, {"true", DI_JV_TRUE}, {"false", DI_JV_FALSE}};
    for (size_t k = 0; k < 3; k++) {
        size_t wl = strlen(words[k].word);
        if (p->n - p->i >= wl && !memcmp(p->s + p->i, words[k].word, wl)) {
            p->i += wl;
            *out = di_jv_new(words[k].t);
            return *out ? DI_OK : di_err_set(p->err, DI_ERR_NOMEM, "%s: out of memory", p->what);
        }
    }
    return jp_fail(p, "expected a JSON value");
}

di_status di_jv_parse(const char *text, size_t n, const char *what, di_jv **out, di_err *err) {
    *out = NULL;
    jparser p = {text ? text : "", text ? n : 0, 0, what ? what : "JSON", err};
    di_jv *v = NULL;
    di_status st = jp_value(&p, 0, &v);
    if (st) return st;
    jp_ws(&p);
    if (p.i != p.n) { di_jv_free(v); return jp_fail(&p, "trailing characters after the JSON value"); }
    *out = v;
    return DI_OK;
}

/* ----------------------------------------------------------------- printing */

void di_jv_dump_string(const char *s, size_t n, di_buf *b) {
    di_buf_put(b, "\"", 1);
    di_jv_escape(s, n, b);
    di_buf_put(b, "\"", 1);
}

void di_jv_escape(const char *s, size_t n, di_buf *b) {
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) { snprintf(tmp, sizeof tmp, "\\u%04x", c); esc = tmp; }
        }
        if (!esc) continue;
        di_buf_put(b, s + run, i - run);
        di_buf_puts(b, esc);
        run = i + 1;
    }
    di_buf_put(b, s + run, n - run);
}

/* Python's repr of a finite double: the shortest digits that read back to
 * the same value, positional for decimal exponents in [-4, 16), otherwise
 * d.ddde±XX with at least two exponent digits. */
static void dump_float_repr(double d, di_buf *b) {
    char tmp[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d) break;
    }
    /* tmp = [-]D[.DDD]e±XX: split into digits and exponent. */
    const char *q = tmp;
    int neg = 0;
    if (*q == '-') { neg = 1; q++; }
    char digits[24];
    size_t nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9' && nd < sizeof digits - 1) digits[nd++] = *q;
    int exp10 = *q == 'e' ? atoi(q + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    if (neg) di_buf_put(b, "-", 1);
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            di_buf_puts(b, "0.");
            for (int k = 0; k < -exp10 - 1; k++) di_buf_put(b, "0", 1);
            di_buf_put(b, digits, nd);
        } else {
            size_t ip = (size_t)exp10 + 1;
            if (nd <= ip) {
                di_buf_put(b, digits, nd);
                for (size_t k = nd; k < ip; k++) di_buf_put(b, "0", 1);
                di_buf_puts(b, ".0");
            } else {
                di_buf_put(b, digits, ip);
                di_buf_put(b, ".", 1);
                di_buf_put(b, digits + ip, nd - ip);
            }
        }
    } else {
        di_buf_put(b, digits, 1);
        if (nd > 1) {
            di_buf_put(b, ".", 1);
            di_buf_put(b, digits + 1, nd - 1);
        }
        snprintf(tmp, sizeof tmp, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
        di_buf_puts(b, tmp);
    }
}

void di_jv_dump_number(const di_jv *v, di_buf *b) {
    if (di_jv_is_integer(v)) di_buf_put(b, v->str, v->len);
    else dump_float_repr(strtod(v->str, NULL), b);
}

static void dump(const di_jv *v, di_buf *b, int spaced) {
    switch (v->type) {
    case DI_JV_NULL: di_buf_puts(b, "null"); return;
    case DI_JV_TRUE: di_buf_puts(b, "true"); return;
    case DI_JV_FALSE: di_buf_puts(b, "false"); return;
    case DI_JV_NUMBER: di_jv_dump_number(v, b); return;
    case DI_JV_STRING: di_jv_dump_string(v->str, v->len, b); return;
    case DI_JV_ARRAY:
    case DI_JV_OBJECT: {
        int obj = v->type == DI_JV_OBJECT;
        di_buf_put(b, obj ? "{" : "[", 1);
        for (size_t i = 0; i < v->n; i++) {
            if (i) di_buf_puts(b, spaced ? ", " : ",");
            if (obj) {
                di_jv_dump_string(v->keys[i], v->key_lens[i], b);
                di_buf_puts(b, spaced ? ": " : ":");
            }
            dump(v->items[i], b, spaced);
        }
        di_buf_put(b, obj ? "}" : "]", 1);
        return;
    }
    }
}

void di_jv_dump_py(const di_jv *v, di_buf *b) { dump(v, b, 1); }
void di_jv_dump_compact(const di_jv *v, di_buf *b) { dump(v, b, 0); }
