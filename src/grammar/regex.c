/* Regex parser and NFA emitter. Spec: ecosystem.md §1.1, §1.4. */
#include "grammar/regex.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "grammar/regex_utf8.h"

#define CP_MAX 0x10FFFF

/* ---------------------------------------------------------- code point sets */

typedef di_cp_range cp_range;

typedef struct cp_set {
    cp_range *r;
    uint32_t n, cap;
} cp_set;

static int cps_add(cp_set *s, uint32_t lo, uint32_t hi) {
    if (s->n == s->cap) {
        uint32_t cap = s->cap ? s->cap * 2 : 8;
        cp_range *r = realloc(s->r, cap * sizeof *r);
        if (!r) return -1;
        s->r = r;
        s->cap = cap;
    }
    s->r[s->n].lo = lo;
    s->r[s->n].hi = hi;
    s->n++;
    return 0;
}

static int cmp_range(const void *a, const void *b) {
    const cp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void cps_normalize(cp_set *s) {
    if (!s->n) return;
    qsort(s->r, s->n, sizeof *s->r, cmp_range);
    uint32_t m = 0;
    for (uint32_t i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[m].hi + 1) {
            if (s->r[i].hi > s->r[m].hi) s->r[m].hi = s->r[i].hi;
        } else s->r[++m] = s->r[i];
    }
    s->n = m + 1;
}

static int cps_complement(cp_set *s) {
    cps_normalize(s);
    cp_set c = {0};
    uint32_t next = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        if (s->r[i].lo > next && cps_add(&c, next, s->r[i].lo - 1)) goto fail;
        next = s->r[i].hi + 1;
    }
    if (next <= CP_MAX && cps_add(&c, next, CP_MAX)) goto fail;
    free(s->r);
    *s = c;
    return 0;
fail:
    free(c.r);
    return -1;
}

static int cps_add_set(cp_set *dst, const cp_set *src) {
    for (uint32_t i = 0; i < src->n; i++)
        if (cps_add(dst, src->r[i].lo, src->r[i].hi)) return -1;
    return 0;
}

/* ----------------------------------------- Unicode tables for \d \w \s */

/* The "large" sets: everything either dialect may count as a digit / word
 * character / space. Negated escapes use their complement. */
static cp_set uni_digit, uni_word, uni_space;
static pthread_once_t uni_once = PTHREAD_ONCE_INIT;
static int uni_failed;

static void uni_build(void) {
    uint32_t run_lo[3] = {0}, in_run[3] = {0};
    cp_set *sets[3] = {&uni_digit, &uni_word, &uni_space};
    for (uint32_t c = 0; c <= CP_MAX + 1; c++) {
        int m[3] = {0, 0, 0};
        if (c <= CP_MAX) {
            utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
            m[0] = (c >= '0' && c <= '9') || cat == UTF8PROC_CATEGORY_ND;
            m[1] = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                   (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                   (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO) ||
                   (cat >= UTF8PROC_CATEGORY_MN && cat <= UTF8PROC_CATEGORY_ME);
            m[2] = (c >= 0x09 && c <= 0x0D) || c == ' ' || (c >= 0x1C && c <= 0x1F) || c == 0x85 ||
                   c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
                   c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF ||
                   cat == UTF8PROC_CATEGORY_ZS;
        }
        for (int k = 0; k < 3; k++) {
            if (m[k] && !in_run[k]) { in_run[k] = 1; run_lo[k] = c; }
            if (!m[k] && in_run[k]) {
                in_run[k] = 0;
                if (cps_add(sets[k], run_lo[k], c - 1)) uni_failed = 1;
            }
        }
    }
}

enum { ESC_DIGIT, ESC_WORD, ESC_SPACE };

/* Adds the set of escape kind (d/w/s), negated or not, in its "small" form
 * (safe in a positive class) or "large" form (safe under negation). */
static int add_escape_class(cp_set *dst, int kind, int negated, int large) {
    static const cp_range small_digit[] = {{'0', '9'}};
    static const cp_range small_word[] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    static const cp_range small_space[] = {{0x09, 0x0D}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680},
                                           {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
                                           {0x205F, 0x205F}, {0x3000, 0x3000}};
    const cp_range *sm = kind == ESC_DIGIT ? small_digit : kind == ESC_WORD ? small_word : small_space;
    uint32_t smn = kind == ESC_DIGIT ? 1 : kind == ESC_WORD ? 4 : 9;
    pthread_once(&uni_once, uni_build);
    if (uni_failed) return -1;
    const cp_set *lg = kind == ESC_DIGIT ? &uni_digit : kind == ESC_WORD ? &uni_word : &uni_space;
    cp_set tmp = {0};
    int rc = 0;
    /* positive small → small; positive large → large;
     * negated small → complement(large); negated large → complement(small). */
    int use_large = negated ? !large : large;
    if (use_large) rc = cps_add_set(&tmp, lg);
    else
        for (uint32_t i = 0; i < smn && !rc; i++) rc = cps_add(&tmp, sm[i].lo, sm[i].hi);
    if (!rc && negated) rc = cps_complement(&tmp);
    if (!rc) rc = cps_add_set(dst, &tmp);
    free(tmp.r);
    return rc;
}

/* ------------------------------------------------------------------- AST */

enum { RX_EMPTY, RX_SET, RX_CAT, RX_ALT, RX_REPEAT };

typedef struct rx_node {
    int kind;
    int a, b;          /* children (CAT/ALT: a, b; REPEAT: a) */
    int min, max;      /* REPEAT; max -1 = unbounded */
    uint32_t set;      /* RX_SET: index into sets */
} rx_node;

typedef struct rx_parser {
    const uint8_t *s;
    size_t n, pos;
    rx_node *nodes;
    uint32_t n_nodes, cap_nodes;
    cp_set *sets;
    uint32_t n_sets, cap_sets;
    di_err *err;
    int depth;
    /* top-level branch anchors, parallel to the branch list */
    int branch[256], anch_start[256], anch_end[256];
    int n_branches;
} rx_parser;

#define RX_MAX_DEPTH 200
#define RX_MAX_NODES 200000

static int rx_fail(rx_parser *p, di_status code, const char *what) {
    di_err_set(p->err, code, "regex: %s at column %zu", what, p->pos + 1);
    return -1;
}

static int node_new(rx_parser *p, int kind, int a, int b) {
    if (p->n_nodes >= RX_MAX_NODES) return rx_fail(p, DI_ERR_LIMIT, "pattern too large");
    if (p->n_nodes == p->cap_nodes) {
        uint32_t cap = p->cap_nodes ? p->cap_nodes * 2 : 64;
        rx_node *nn = realloc(p->nodes, cap * sizeof *nn);
        if (!nn) return rx_fail(p, DI_ERR_NOMEM, "out of memory");
        p->nodes = nn;
        p->cap_nodes = cap;
    }
    rx_node *x = &p->nodes[p->n_nodes];
    memset(x, 0, sizeof *x);
    x->kind = kind;
    x->a = a;
    x->b = b;
    return (int)p->n_nodes++;
}

static int set_new(rx_parser *p) {
    if (p->n_sets == p->cap_sets) {
        uint32_t cap = p->cap_sets ? p->cap_sets * 2 : 16;
        cp_set *ns = realloc(p->sets, cap * sizeof *ns);
        if (!ns) return rx_fail(p, DI_ERR_NOMEM, "out of memory");
        p->sets = ns;
        p->cap_sets = cap;
    }
    memset(&p->sets[p->n_sets], 0, sizeof(cp_set));
    int id = node_new(p, RX_SET, -1, -1);
    if (id < 0) return -1;
    p->nodes[id].set = p->n_sets++;
    return id;
}

static int set_node_cp(rx_parser *p, uint32_t lo, uint32_t hi) {
    int id = set_new(p);
    if (id < 0) return -1;
    if (cps_add(&p->sets[p->nodes[id].set], lo, hi)) return rx_fail(p, DI_ERR_NOMEM, "out of memory");
    return id;
}

/* Decodes one UTF-8 code point at p->pos. */
static int next_cp(rx_parser *p, uint32_t *cp) {
    if (p->pos >= p->n) return rx_fail(p, DI_ERR_FORMAT, "unexpected end of pattern");
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate(p->s + p->pos, (utf8proc_ssize_t)(p->n - p->pos), &c);
    if (k <= 0) return rx_fail(p, DI_ERR_FORMAT, "invalid UTF-8");
    p->pos += (size_t)k;
    *cp = (uint32_t)c;
    return 0;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex(rx_parser *p, int ndig, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < ndig; i++) {
        if (p->pos >= p->n || hexval(p->s[p->pos]) < 0) return rx_fail(p, DI_ERR_FORMAT, "bad hex escape");
        v = v * 16 + (uint32_t)hexval(p->s[p->pos++]);
    }
    *out = v;
    return 0;
}

/* Parses an escape after '\'. Either sets *cp (single character, returns 0)
 * or adds a class to cls (returns 1; cls may be NULL outside a class, then
 * a fresh node is made and returned through *node). */
static int parse_escape(rx_parser *p, int in_class, int negated_ctx, cp_set *cls, uint32_t *cp) {
    if (p->pos >= p->n) return rx_fail(p, DI_ERR_FORMAT, "trailing backslash");
    uint8_t c = p->s[p->pos];
    size_t at = p->pos;
    p->pos++;
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': {
        int kind = (c == 'd' || c == 'D') ? ESC_DIGIT : (c == 'w' || c == 'W') ? ESC_WORD : ESC_SPACE;
        int neg = c == 'D' || c == 'W' || c == 'S';
        if (add_escape_class(cls, kind, neg, negated_ctx)) return rx_fail(p, DI_ERR_NOMEM, "out of memory");
        return 1;
    }
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0':
        if (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
            p->pos = at;
            return rx_fail(p, DI_ERR_UNSUPPORTED, "octal escape is not supported");
        }
        *cp = 0;
        return 0;
    case 'x': return read_hex(p, 2, cp);
    case 'u':
        if (p->pos < p->n && p->s[p->pos] == '{') {
            p->pos++;
            uint32_t v = 0;
            int nd = 0;
            while (p->pos < p->n && hexval(p->s[p->pos]) >= 0 && nd < 7) v = v * 16 + (uint32_t)hexval(p->s[p->pos++]), nd++;
            if (!nd || p->pos >= p->n || p->s[p->pos] != '}' || v > CP_MAX) return rx_fail(p, DI_ERR_FORMAT, "bad \\u{...} escape");
            p->pos++;
            *cp = v;
            return 0;
        }
        if (read_hex(p, 4, cp)) return -1;
        /* A surrogate pair written as two escapes is one character. */
        if (*cp >= 0xD800 && *cp <= 0xDBFF && p->pos + 6 <= p->n && p->s[p->pos] == '\\' && p->s[p->pos + 1] == 'u') {
            size_t save = p->pos;
            p->pos += 2;
            uint32_t lo2;
            if (read_hex(p, 4, &lo2) == 0 && lo2 >= 0xDC00 && lo2 <= 0xDFFF) {
                *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo2 - 0xDC00);
                return 0;
            }
            p->pos = save;
        }
        return 0;
    case 'c':
        if (p->pos < p->n && ((p->s[p->pos] | 0x20) >= 'a' && (p->s[p->pos] | 0x20) <= 'z')) {
            *cp = (uint32_t)(p->s[p->pos++] % 32);
            return 0;
        }
        p->pos = at;
        return rx_fail(p, DI_ERR_UNSUPPORTED, "\\c escape without a letter is not supported");
    case 'b':
        if (in_class) { *cp = 8; return 0; }
        p->pos = at;
        return rx_fail(p, DI_ERR_UNSUPPORTED, "word boundary \\b is not supported");
    case 'B':
        p->pos = at;
        return rx_fail(p, DI_ERR_UNSUPPORTED, "word boundary \\B is not supported");
    case 'p': case 'P':
        p->pos = at;
        return rx_fail(p, DI_ERR_UNSUPPORTED, "Unicode property class \\p{...} is not supported");
    case 'k':
        p->pos = at;
        return rx_fail(p, DI_ERR_UNSUPPORTED, "named backreference \\k is not supported");
    case 'A': case 'Z': case 'z': case 'G':
        p->pos = at;
        return rx_fail(p, DI_ERR_UNSUPPORTED, "anchor escape is not supported");
    default:
        if (c >= '1' && c <= '9') {
            p->pos = at;
            return rx_fail(p, DI_ERR_UNSUPPORTED, "backreference is not supported");
        }
        p->pos = at;
        return next_cp(p, cp); /* identity escape */
    }
}

static int parse_class(rx_parser *p) {
    /* p->pos is just after '[' */
    int negated = 0;
    if (p->pos < p->n && p->s[p->pos] == '^') { negated = 1; p->pos++; }
    int id = set_new(p);
    if (id < 0) return -1;
    cp_set *cls = &p->sets[p->nodes[id].set];
    int first = 1;
    for (;;) {
        if (p->pos >= p->n) return rx_fail(p, DI_ERR_FORMAT, "unterminated character class");
        if (p->s[p->pos] == ']' && !first) { p->pos++; break; }
        if (p->s[p->pos] == ']' && first) { p->pos++; break; } /* ECMA: [] matches nothing */
        first = 0;
        uint32_t lo, hi;
        int r;
        if (p->s[p->pos] == '\\') {
            p->pos++;
            cls = &p->sets[p->nodes[id].set];
            r = parse_escape(p, 1, negated, cls, &lo);
            if (r < 0) return -1;
            if (r == 1) continue;
        } else if (next_cp(p, &lo)) return -1;
        hi = lo;
        if (p->pos + 1 < p->n && p->s[p->pos] == '-' && p->s[p->pos + 1] != ']') {
            p->pos++;
            if (p->s[p->pos] == '\\') {
                p->pos++;
                cls = &p->sets[p->nodes[id].set];
                r = parse_escape(p, 1, negated, cls, &hi);
                if (r < 0) return -1;
                if (r == 1) { /* [a-\d]: '-' is literal */
                    if (cps_add(cls, lo, lo) || cps_add(cls, '-', '-')) return rx_fail(p, DI_ERR_NOMEM, "out of memory");
                    continue;
                }
            } else if (next_cp(p, &hi)) return -1;
            if (hi < lo) return rx_fail(p, DI_ERR_FORMAT, "character class range out of order");
        }
        cls = &p->sets[p->nodes[id].set];
        if (cps_add(cls, lo, hi)) return rx_fail(p, DI_ERR_NOMEM, "out of memory");
    }
    cls = &p->sets[p->nodes[id].set];
    if (negated && cps_complement(cls)) return rx_fail(p, DI_ERR_NOMEM, "out of memory");
    cps_normalize(cls);
    return id;
}

static int parse_alt(rx_parser *p);

/* Parses {n}, {n,}, {n,m} at p->pos ('{'). Returns 1 if a quantifier was
 * read, 0 if the brace is a literal. */
static int parse_braces(rx_parser *p, int *mn, int *mx) {
    size_t save = p->pos;
    p->pos++;
    long a = 0, b = -1;
    int nd = 0;
    while (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
        a = a * 10 + (p->s[p->pos++] - '0');
        if (a > 100000) a = 100000;
        nd++;
    }
    if (!nd) { p->pos = save; return 0; }
    if (p->pos < p->n && p->s[p->pos] == ',') {
        p->pos++;
        int nd2 = 0;
        b = 0;
        while (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
            b = b * 10 + (p->s[p->pos++] - '0');
            if (b > 100000) b = 100000;
            nd2++;
        }
        if (!nd2) b = -1;
    } else b = a;
    if (p->pos >= p->n || p->s[p->pos] != '}') { p->pos = save; return 0; }
    p->pos++;
    if (b >= 0 && b < a) return rx_fail(p, DI_ERR_FORMAT, "quantifier {n,m} with m < n");
    *mn = (int)a;
    *mx = (int)b;
    return 1;
}

static int parse_atom(rx_parser *p, int at_branch_start) {
    uint8_t c = p->s[p->pos];
    uint32_t cp;
    switch (c) {
    case '(': {
        p->pos++;
        if (p->pos < p->n && p->s[p->pos] == '?') {
            p->pos++;
            if (p->pos < p->n && p->s[p->pos] == ':') p->pos++;
            else if (p->pos < p->n && (p->s[p->pos] == '=' || p->s[p->pos] == '!'))
                return p->pos -= 2, rx_fail(p, DI_ERR_UNSUPPORTED, "lookahead is not supported");
            else if (p->pos + 1 < p->n && p->s[p->pos] == '<' && (p->s[p->pos + 1] == '=' || p->s[p->pos + 1] == '!'))
                return p->pos -= 2, rx_fail(p, DI_ERR_UNSUPPORTED, "lookbehind is not supported");
            else if (p->pos < p->n && (p->s[p->pos] == '<' || p->s[p->pos] == 'P')) {
                if (p->s[p->pos] == 'P') p->pos++;
                if (p->pos >= p->n || p->s[p->pos] != '<') return rx_fail(p, DI_ERR_UNSUPPORTED, "group syntax is not supported");
                while (p->pos < p->n && p->s[p->pos] != '>') p->pos++;
                if (p->pos >= p->n) return rx_fail(p, DI_ERR_FORMAT, "unterminated group name");
                p->pos++;
            } else return rx_fail(p, DI_ERR_UNSUPPORTED, "group flags are not supported");
        }
        if (++p->depth > RX_MAX_DEPTH) return rx_fail(p, DI_ERR_LIMIT, "groups nested too deeply");
        int inner = parse_alt(p);
        p->depth--;
        if (inner < 0) return -1;
        if (p->pos >= p->n || p->s[p->pos] != ')') return rx_fail(p, DI_ERR_FORMAT, "missing ')'");
        p->pos++;
        return inner;
    }
    case '[':
        p->pos++;
        return parse_class(p);
    case '.': {
        p->pos++;
        int id = set_new(p);
        if (id < 0) return -1;
        cp_set *s = &p->sets[p->nodes[id].set];
        if (cps_add(s, 0, 9) || cps_add(s, 11, 12) || cps_add(s, 14, 0x2027) || cps_add(s, 0x202A, CP_MAX))
            return rx_fail(p, DI_ERR_NOMEM, "out of memory");
        return id;
    }
    case '\\': {
        p->pos++;
        int id = set_new(p);
        if (id < 0) return -1;
        int r = parse_escape(p, 0, 0, &p->sets[p->nodes[id].set], &cp);
        if (r < 0) return -1;
        if (r == 0 && cps_add(&p->sets[p->nodes[id].set], cp, cp)) return rx_fail(p, DI_ERR_NOMEM, "out of memory");
        cps_normalize(&p->sets[p->nodes[id].set]);
        return id;
    }
    case '*': case '+': case '?':
        return rx_fail(p, DI_ERR_FORMAT, "nothing to repeat");
    case ')':
        return rx_fail(p, DI_ERR_FORMAT, "unmatched ')'");
    case '^':
        (void)at_branch_start;
        return rx_fail(p, DI_ERR_UNSUPPORTED, "anchor ^ not at the start of a top-level branch");
    case '$':
        return rx_fail(p, DI_ERR_UNSUPPORTED, "anchor $ not at the end of a top-level branch");
    default:
        if (next_cp(p, &cp)) return -1;
        return set_node_cp(p, cp, cp);
    }
}

static int parse_seq(rx_parser *p) {
    int acc = -1;
    int top = p->depth == 0;
    int bi = top ? p->n_branches : -1;
    if (top) {
        if (p->n_branches >= 256) return rx_fail(p, DI_ERR_LIMIT, "too many top-level alternatives");
        p->anch_start[bi] = p->anch_end[bi] = 0;
        if (p->pos < p->n && p->s[p->pos] == '^') { p->anch_start[bi] = 1; p->pos++; }
    }
    while (p->pos < p->n && p->s[p->pos] != '|' && p->s[p->pos] != ')') {
        if (top && p->s[p->pos] == '$') {
            size_t q = p->pos + 1;
            if (q == p->n || p->s[q] == '|') { p->anch_end[bi] = 1; p->pos++; break; }
        }
        int atom = parse_atom(p, acc < 0);
        if (atom < 0) return -1;
        /* quantifiers */
        for (;;) {
            if (p->pos >= p->n) break;
            uint8_t q = p->s[p->pos];
            int mn = 0, mx = 0; /* set by every branch that goes on (parse_braces when it returns 1) */
            if (q == '*') { mn = 0; mx = -1; p->pos++; }
            else if (q == '+') { mn = 1; mx = -1; p->pos++; }
            else if (q == '?') { mn = 0; mx = 1; p->pos++; }
            else if (q == '{') {
                int r = parse_braces(p, &mn, &mx);
                if (r < 0) return -1;
                if (r == 0) break;
            } else break;
            if (p->pos < p->n && p->s[p->pos] == '?') p->pos++; /* lazy: same language */
            if (p->pos < p->n && (p->s[p->pos] == '*' || p->s[p->pos] == '+' || p->s[p->pos] == '?'))
                return rx_fail(p, DI_ERR_FORMAT, "nothing to repeat");
            int rep = node_new(p, RX_REPEAT, atom, -1);
            if (rep < 0) return -1;
            p->nodes[rep].min = mn;
            p->nodes[rep].max = mx;
            atom = rep;
        }
        if (acc < 0) acc = atom;
        else {
            acc = node_new(p, RX_CAT, acc, atom);
            if (acc < 0) return -1;
        }
    }
    if (acc < 0) acc = node_new(p, RX_EMPTY, -1, -1);
    if (top && acc >= 0) { p->branch[bi] = acc; p->n_branches++; }
    return acc;
}

static int parse_alt(rx_parser *p) {
    int acc = parse_seq(p);
    if (acc < 0) return -1;
    while (p->pos < p->n && p->s[p->pos] == '|') {
        p->pos++;
        int b = parse_seq(p);
        if (b < 0) return -1;
        acc = node_new(p, RX_ALT, acc, b);
        if (acc < 0) return -1;
    }
    return acc;
}

/* ---------------------------------------------------------------- NFA emit */

typedef struct emitter {
    rx_parser *p;
    di_nfa *nfa;
    unsigned flags;
    di_utf8_class *classes; /* [p->n_sets] each set's byte automaton */
    di_err *err;
} emitter;

static uint32_t emit_fail(emitter *e) {
    di_err_set(e->err, DI_ERR_LIMIT, "regex: automaton exceeds %u NFA states", e->nfa->max_states);
    return DI_NFA_NONE;
}

static uint32_t add_alt(emitter *e, uint32_t alts, uint32_t entry) {
    if (entry == DI_NFA_NONE) return DI_NFA_NONE;
    if (alts == DI_NFA_NONE) return entry;
    uint32_t s = di_nfa_add(e->nfa, DI_NFA_EPS, 0, 0, entry, alts);
    return s == DI_NFA_NONE ? emit_fail(e) : s;
}

static uint32_t emit_bytes(emitter *e, const char *s, uint32_t next) {
    return di_utf8_bytes_emit(e->nfa, s, (uint32_t)strlen(s), next, e->err);
}

static uint32_t emit_node(emitter *e, int id, uint32_t next, int depth) {
    const rx_node *x = &e->p->nodes[id];
    if (depth > 10000) return emit_fail(e);
    switch (x->kind) {
    case RX_EMPTY: return next;
    case RX_SET: return di_utf8_class_emit(&e->classes[x->set], e->nfa, next, e->err);
    case RX_CAT: {
        uint32_t b = emit_node(e, x->b, next, depth + 1);
        if (b == DI_NFA_NONE) return b;
        return emit_node(e, x->a, b, depth + 1);
    }
    case RX_ALT: {
        uint32_t a = emit_node(e, x->a, next, depth + 1);
        if (a == DI_NFA_NONE) return a;
        uint32_t b = emit_node(e, x->b, next, depth + 1);
        if (b == DI_NFA_NONE) return b;
        uint32_t s = di_nfa_add(e->nfa, DI_NFA_EPS, 0, 0, a, b);
        return s == DI_NFA_NONE ? emit_fail(e) : s;
    }
    case RX_REPEAT: {
        uint32_t cur = next;
        if (x->max < 0) {
            uint32_t loop = di_nfa_add(e->nfa, DI_NFA_EPS, 0, 0, DI_NFA_NONE, next);
            if (loop == DI_NFA_NONE) return emit_fail(e);
            uint32_t body = emit_node(e, x->a, loop, depth + 1);
            if (body == DI_NFA_NONE) return body;
            e->nfa->states[loop].out = body;
            cur = loop;
        } else {
            for (int k = 0; k < x->max - x->min; k++) {
                uint32_t body = emit_node(e, x->a, cur, depth + 1);
                if (body == DI_NFA_NONE) return body;
                cur = di_nfa_add(e->nfa, DI_NFA_EPS, 0, 0, body, next);
                if (cur == DI_NFA_NONE) return emit_fail(e);
            }
        }
        for (int k = 0; k < x->min; k++) {
            cur = emit_node(e, x->a, cur, depth + 1);
            if (cur == DI_NFA_NONE) return cur;
        }
        return cur;
    }
    }
    return emit_fail(e);
}

/* A lower bound (saturating at 2^40) on the NFA states emit_node adds for
 * node id, from the shape alone: a counted repetition too large for the
 * NFA (e.g. (a{100000}){1000}) is refused before millions of states are
 * written out. */
static uint64_t nfa_size_bound(const rx_parser *p, const di_utf8_class *classes, int id, int depth) {
    const uint64_t cap = (uint64_t)1 << 40;
    const rx_node *x = &p->nodes[id];
    if (depth > 10000) return 0; /* emit_node refuses such depth itself */
    uint64_t a = x->kind == RX_CAT || x->kind == RX_ALT || x->kind == RX_REPEAT ? nfa_size_bound(p, classes, x->a, depth + 1) : 0;
    uint64_t b = x->kind == RX_CAT || x->kind == RX_ALT ? nfa_size_bound(p, classes, x->b, depth + 1) : 0;
    uint64_t n;
    switch (x->kind) {
    case RX_SET: n = classes[x->set].nfa_states; break;
    case RX_CAT: n = a + b; break;
    case RX_ALT: n = a + b + 1; break;
    case RX_REPEAT:
        n = x->max < 0 ? a * (uint64_t)(x->min + 1) + 1 : (a + 1) * (uint64_t)(x->max - x->min) + a * (uint64_t)x->min;
        break;
    default: n = 0;
    }
    return n < cap ? n : cap;
}

static uint32_t emit_any_star(emitter *e, uint32_t next) {
    di_cp_range any = {0, CP_MAX};
    di_utf8_class c;
    if (di_utf8_class_init(&c, &any, 1, (e->flags & DI_RX_JSON_STRING) != 0, e->err)) return DI_NFA_NONE;
    uint32_t loop = di_nfa_add(e->nfa, DI_NFA_EPS, 0, 0, DI_NFA_NONE, next);
    uint32_t body = loop == DI_NFA_NONE ? emit_fail(e) : di_utf8_class_emit(&c, e->nfa, loop, e->err);
    di_utf8_class_free(&c);
    if (body == DI_NFA_NONE) return DI_NFA_NONE;
    e->nfa->states[loop].out = body;
    return loop;
}

di_status di_regex_compile(const char *pattern, size_t len, unsigned flags, uint32_t max_states,
                           di_dfa *out, di_err *err) {
    return di_regex_compile_bounded(pattern, len, flags, max_states, DI_DFA_MAX_WORK, out, err);
}

di_status di_regex_compile_bounded(const char *pattern, size_t len, unsigned flags, uint32_t max_states,
                                   uint64_t max_work, di_dfa *out, di_err *err) {
    memset(out, 0, sizeof *out);
    rx_parser p = {0};
    p.s = (const uint8_t *)pattern;
    p.n = len;
    p.err = err;
    di_status st = DI_OK;
    di_utf8_class *classes = NULL;
    di_nfa nfa;
    uint64_t nfa_cap = (uint64_t)max_states * 8 + 1024;
    di_nfa_init(&nfa, nfa_cap < UINT32_MAX ? (uint32_t)nfa_cap : UINT32_MAX - 1);
    int root = parse_alt(&p);
    if (root >= 0 && p.pos < p.n) root = rx_fail(&p, DI_ERR_FORMAT, "unmatched ')'");
    if (root < 0) { st = err ? err->code : DI_ERR_FORMAT; if (st == DI_OK) st = DI_ERR_FORMAT; goto done; }
    classes = calloc(p.n_sets + 1, sizeof *classes);
    if (!classes) { st = di_err_set(err, DI_ERR_NOMEM, "out of memory"); goto done; }
    for (uint32_t i = 0; i < p.n_sets; i++) {
        st = di_utf8_class_init(&classes[i], p.sets[i].r, p.sets[i].n, (flags & DI_RX_JSON_STRING) != 0, err);
        if (st) goto done;
    }
    uint64_t need = 0;
    for (int i = 0; i < p.n_branches; i++) need += nfa_size_bound(&p, classes, p.branch[i], 0);
    if (need > nfa.max_states) {
        st = di_err_set(err, DI_ERR_LIMIT, "regex: pattern too complex: it expands to at least %llu NFA states (limit %u)",
                        (unsigned long long)need, nfa.max_states);
        goto done;
    }
    emitter e = {&p, &nfa, flags, classes, err};
    uint32_t match = di_nfa_add(&nfa, DI_NFA_MATCH, 0, 0, DI_NFA_NONE, DI_NFA_NONE);
    uint32_t end = match;
    if (flags & DI_RX_JSON_STRING) end = emit_bytes(&e, "\"", match);
    /* One shared "anything" loop before the unanchored-start branches and
     * one after the unanchored-end branches; the latter is universal. */
    int search = (flags & DI_RX_SEARCH) != 0;
    uint32_t tail_any = DI_NFA_NONE;
    if (search && end != DI_NFA_NONE) {
        tail_any = emit_any_star(&e, end);
        if (tail_any != DI_NFA_NONE) nfa.states[tail_any].universal = 1;
    }
    uint32_t free_start = DI_NFA_NONE, anchored = DI_NFA_NONE;
    for (int i = 0; i < p.n_branches && end != DI_NFA_NONE; i++) {
        uint32_t tail = (search && !p.anch_end[i]) ? tail_any : end;
        if (tail == DI_NFA_NONE) { end = DI_NFA_NONE; break; }
        uint32_t body = emit_node(&e, p.branch[i], tail, 0);
        if (body == DI_NFA_NONE) { end = DI_NFA_NONE; break; }
        if (search && !p.anch_start[i]) free_start = add_alt(&e, free_start, body);
        else anchored = add_alt(&e, anchored, body);
        if ((search && !p.anch_start[i] && free_start == DI_NFA_NONE) || (!(search && !p.anch_start[i]) && anchored == DI_NFA_NONE)) {
            end = DI_NFA_NONE;
            break;
        }
    }
    uint32_t alts = DI_NFA_NONE;
    if (end != DI_NFA_NONE) {
        if (free_start != DI_NFA_NONE) alts = emit_any_star(&e, free_start);
        if (anchored != DI_NFA_NONE) alts = alts == DI_NFA_NONE ? anchored : add_alt(&e, alts, anchored);
    }
    if (alts != DI_NFA_NONE && (flags & DI_RX_JSON_STRING)) alts = emit_bytes(&e, "\"", alts);
    if (alts == DI_NFA_NONE) { st = err ? err->code : DI_ERR_LIMIT; goto done; }
    nfa.start = alts;
    st = di_dfa_from_nfa(&nfa, max_states, max_work, out, err);
done:
    for (uint32_t i = 0; classes && i < p.n_sets; i++) di_utf8_class_free(&classes[i]);
    free(classes);
    di_nfa_free(&nfa);
    for (uint32_t i = 0; i < p.n_sets; i++) free(p.sets[i].r);
    free(p.sets);
    free(p.nodes);
    return st;
}

size_t di_regex_escape(const char *s, size_t n, char *buf, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int meta = strchr("\\^$.|?*+()[]{}/-", c) != NULL && c != 0;
        char tmp[8];
        size_t m;
        if (c < 0x20 || c == 0x7f) m = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", c);
        else if (meta) { tmp[0] = '\\'; tmp[1] = (char)c; m = 2; }
        else { tmp[0] = (char)c; m = 1; }
        for (size_t j = 0; j < m; j++) {
            if (k + 1 < cap) buf[k] = tmp[j];
            k++;
        }
    }
    if (cap) buf[k < cap ? k : cap - 1] = '\0';
    return k;
}
