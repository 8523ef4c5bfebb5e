/* EBNF in the GBNF dialect → grammar IR. Spec: ecosystem.md §1.1 (GBNF),
 * §1.4 (one EBNF dialect).
 *
 *   root ::= item ("," item)*        # comments run to the end of the line
 *   item ::= [a-z]+ | "lit\n" | 'x' | (a | b)? | c{2,5} | .
 *
 * Parts made only of literals, classes and groups of them become one regex
 * lexeme (the matcher works on bytes, so merging adjacent terminals changes
 * nothing but speed); rule references and recursion become nonterminals.
 * Token references (<...>) are refused with an error naming them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/regex.h"

#define EBNF_MAX_RULES 4096

typedef struct piece {
    char *rx;     /* regex text when the part is terminal-only, else NULL */
    di_sym sym;   /* symbol otherwise */
} piece;

typedef struct ebnf {
    const char *s;
    size_t n, pos;
    di_cfg *g;
    di_err *err;
    char *names[EBNF_MAX_RULES];
    int32_t nts[EBNF_MAX_RULES];
    size_t ref_pos[EBNF_MAX_RULES]; /* first reference, for "undefined rule" */
    int defined[EBNF_MAX_RULES];
    int n_names;
    int depth;
} ebnf;

static int efail(ebnf *e, di_status code, size_t pos, const char *what) {
    int line, col;
    di_text_position(e->s, e->n, pos, &line, &col);
    di_err_set(e->err, code, "EBNF: %s at line %d, column %d", what, line, col);
    return -1;
}

static void skip_ws(ebnf *e, int newlines) {
    while (e->pos < e->n) {
        char c = e->s[e->pos];
        if (c == '#') {
            while (e->pos < e->n && e->s[e->pos] != '\n') e->pos++;
        } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) e->pos++;
        else break;
    }
}

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
}

static int32_t name_nt(ebnf *e, const char *name, size_t len, size_t at) {
    for (int i = 0; i < e->n_names; i++)
        if (strlen(e->names[i]) == len && !memcmp(e->names[i], name, len)) return i;
    if (e->n_names >= EBNF_MAX_RULES) return efail(e, DI_ERR_LIMIT, at, "too many rules");
    int32_t nt = di_cfg_nt(e->g, e->err);
    if (nt < 0) return -1;
    char *copy = strndup(name, len);
    if (!copy) return efail(e, DI_ERR_NOMEM, at, "out of memory");
    e->names[e->n_names] = copy;
    e->nts[e->n_names] = nt;
    e->ref_pos[e->n_names] = at;
    e->defined[e->n_names] = 0;
    return e->n_names++;
}

/* growable string */
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static int sb_add(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static int sb_str(sbuf *b, const char *s) { return sb_add(b, s, strlen(s)); }

static int hexv(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Reads one (possibly escaped) character of a literal or class as a code
 * point; raw UTF-8 is decoded. */
static int read_char(ebnf *e, uint32_t *cp) {
    size_t at = e->pos;
    if (e->pos >= e->n) return efail(e, DI_ERR_FORMAT, at, "unexpected end of grammar");
    unsigned char c = (unsigned char)e->s[e->pos];
    if (c == '\\') {
        e->pos++;
        if (e->pos >= e->n) return efail(e, DI_ERR_FORMAT, at, "trailing backslash");
        char x = e->s[e->pos++];
        int nd = 0;
        switch (x) {
        case 'n': *cp = '\n'; return 0;
        case 'r': *cp = '\r'; return 0;
        case 't': *cp = '\t'; return 0;
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': *cp = (uint32_t)x; return 0;
        case 'x': nd = 2; break;
        case 'u': nd = 4; break;
        case 'U': nd = 8; break;
        default: return efail(e, DI_ERR_FORMAT, at, "unknown escape");
        }
        uint32_t v = 0;
        for (int i = 0; i < nd; i++) {
            if (e->pos >= e->n || hexv(e->s[e->pos]) < 0) return efail(e, DI_ERR_FORMAT, at, "bad hex escape");
            v = v * 16 + (uint32_t)hexv(e->s[e->pos++]);
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return efail(e, DI_ERR_FORMAT, at, "escape is not a Unicode scalar value");
        *cp = v;
        return 0;
    }
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || e->pos + (size_t)len > e->n) return efail(e, DI_ERR_FORMAT, at, "invalid UTF-8");
    uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (int i = 1; i < len; i++) {
        unsigned char d = (unsigned char)e->s[e->pos + (size_t)i];
        if ((d & 0xC0) != 0x80) return efail(e, DI_ERR_FORMAT, at, "invalid UTF-8");
        v = (v << 6) | (d & 0x3F);
    }
    e->pos += (size_t)len;
    *cp = v;
    return 0;
}

/* Appends code point cp as a regex atom usable inside or outside a class. */
static int rx_cp(sbuf *b, uint32_t cp) {
    char tmp[16];
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') || cp == ' ' || cp == '_')
        snprintf(tmp, sizeof tmp, "%c", (char)cp);
    else snprintf(tmp, sizeof tmp, "\\u{%X}", cp);
    return sb_str(b, tmp);
}

static int parse_alts(ebnf *e, piece *out);

static void piece_free(piece *p) {
    free(p->rx);
    p->rx = NULL;
}

/* Symbol for a piece (compiles its regex). */
static int piece_sym(ebnf *e, piece *p, di_sym *out) {
    if (!p->rx) { *out = p->sym; return 0; }
    di_status st = di_cfg_regex_sym(e->g, p->rx, 0, out, e->err);
    if (st) {
        di_err_prefix(e->err, "EBNF: ");
        return -1;
    }
    return 0;
}

static int parse_atom(ebnf *e, piece *out) {
    size_t at = e->pos;
    char c = e->s[e->pos];
    sbuf b = {0};
    out->rx = NULL;
    if (c == '"' || c == '\'') {
        char q = c;
        e->pos++;
        if (sb_str(&b, "(")) goto nomem;
        for (;;) {
            if (e->pos >= e->n || e->s[e->pos] == '\n') { free(b.p); return efail(e, DI_ERR_FORMAT, at, "unterminated string literal"); }
            if (e->s[e->pos] == q) { e->pos++; break; }
            uint32_t cp;
            if (read_char(e, &cp)) { free(b.p); return -1; }
            if (rx_cp(&b, cp)) goto nomem;
        }
        if (sb_str(&b, ")")) goto nomem;
        out->rx = b.p;
        return 0;
    }
    if (c == '[') {
        e->pos++;
        if (sb_str(&b, "[")) goto nomem;
        if (e->pos < e->n && e->s[e->pos] == '^') { e->pos++; if (sb_str(&b, "^")) goto nomem; }
        int any = 0;
        for (;;) {
            if (e->pos >= e->n || e->s[e->pos] == '\n') { free(b.p); return efail(e, DI_ERR_FORMAT, at, "unterminated character class"); }
            if (e->s[e->pos] == ']') { e->pos++; break; }
            uint32_t lo, hi;
            if (read_char(e, &lo)) { free(b.p); return -1; }
            hi = lo;
            if (e->pos + 1 < e->n && e->s[e->pos] == '-' && e->s[e->pos + 1] != ']') {
                e->pos++;
                if (read_char(e, &hi)) { free(b.p); return -1; }
                if (hi < lo) { free(b.p); return efail(e, DI_ERR_FORMAT, at, "character range out of order"); }
            }
            if (rx_cp(&b, lo)) goto nomem;
            if (hi != lo && (sb_str(&b, "-") || rx_cp(&b, hi))) goto nomem;
            any = 1;
        }
        if (!any) { free(b.p); return efail(e, DI_ERR_FORMAT, at, "empty character class"); }
        if (sb_str(&b, "]")) goto nomem;
        out->rx = b.p;
        return 0;
    }
    if (c == '.') {
        e->pos++;
        out->rx = strdup("[\\u{0}-\\u{10FFFF}]");
        return out->rx ? 0 : efail(e, DI_ERR_NOMEM, at, "out of memory");
    }
    if (c == '(') {
        e->pos++;
        if (++e->depth > (int)e->g->limits.max_depth) return efail(e, DI_ERR_LIMIT, at, "groups nested too deeply");
        if (parse_alts(e, out)) return -1;
        e->depth--;
        skip_ws(e, 1);
        if (e->pos >= e->n || e->s[e->pos] != ')') { piece_free(out); return efail(e, DI_ERR_FORMAT, e->pos, "expected ')'"); }
        e->pos++;
        return 0;
    }
    if (c == '<') return efail(e, DI_ERR_UNSUPPORTED, at, "token reference <...> is not supported");
    if (c == '!') return efail(e, DI_ERR_UNSUPPORTED, at, "negated token reference is not supported");
    if (is_name_char(c)) {
        size_t s0 = e->pos;
        while (e->pos < e->n && is_name_char(e->s[e->pos])) e->pos++;
        int idx = name_nt(e, e->s + s0, e->pos - s0, s0);
        if (idx < 0) return -1;
        out->sym = e->nts[idx];
        return 0;
    }
    return efail(e, DI_ERR_FORMAT, at, "unexpected character");
nomem:
    free(b.p);
    return efail(e, DI_ERR_NOMEM, at, "out of memory");
}

/* Applies a quantifier to a piece. */
static int quantify(ebnf *e, piece *p, long mn, long mx, size_t at) {
    if (mn > (long)10000 || mx > 10000) return efail(e, DI_ERR_LIMIT, at, "repetition count above 10000");
    if (p->rx) {
        char q[64];
        if (mx < 0) snprintf(q, sizeof q, "{%ld,}", mn);
        else snprintf(q, sizeof q, "{%ld,%ld}", mn, mx);
        size_t n = strlen(p->rx) + strlen(q) + 3;
        char *r = malloc(n);
        if (!r) return efail(e, DI_ERR_NOMEM, at, "out of memory");
        snprintf(r, n, "(%s)%s", p->rx, q);
        free(p->rx);
        p->rx = r;
        return 0;
    }
    di_sym x = p->sym;
    /* tail: (n - m) optional copies, or X* by right recursion */
    int32_t tail = di_cfg_nt(e->g, e->err);
    if (tail < 0) return -1;
    if (di_cfg_rule_add(e->g, (uint32_t)tail, NULL, 0, e->err)) return -1;
    if (mx < 0) {
        di_sym seq[2] = {x, tail};
        if (di_cfg_rule_add(e->g, (uint32_t)tail, seq, 2, e->err)) return -1;
    } else {
        int32_t cur = tail;
        for (long k = 1; k <= mx - mn; k++) {
            int32_t nt = k == 1 ? tail : di_cfg_nt(e->g, e->err);
            if (nt < 0) return -1;
            if (k > 1 && di_cfg_rule_add(e->g, (uint32_t)nt, NULL, 0, e->err)) return -1;
            di_sym seq[2] = {x, cur};
            if (di_cfg_rule_add(e->g, (uint32_t)nt, seq, k == 1 ? 1 : 2, e->err)) return -1;
            cur = nt;
        }
        tail = cur;
    }
    int32_t head = tail;
    for (long k = 0; k < mn; k++) {
        int32_t nt = di_cfg_nt(e->g, e->err);
        if (nt < 0) return -1;
        di_sym seq[2] = {x, head};
        if (di_cfg_rule_add(e->g, (uint32_t)nt, seq, 2, e->err)) return -1;
        head = nt;
    }
    p->sym = head;
    return 0;
}

/* A sequence: pieces, adjacent regex pieces concatenated. */
static int parse_seq(ebnf *e, piece *out) {
    di_sym syms[256];
    uint32_t ns = 0;
    sbuf cur = {0};
    int have_cur = 0;
    out->rx = NULL;
    for (;;) {
        skip_ws(e, 0);
        /* a newline ends the sequence unless the next line continues it */
        if (e->pos < e->n && e->s[e->pos] == '\n') {
            size_t save = e->pos;
            skip_ws(e, 1);
            size_t p = e->pos;
            int new_rule = 0;
            if (p < e->n && is_name_char(e->s[p])) {
                size_t q = p;
                while (q < e->n && is_name_char(e->s[q])) q++;
                while (q < e->n && (e->s[q] == ' ' || e->s[q] == '\t')) q++;
                new_rule = q + 3 <= e->n && !memcmp(e->s + q, "::=", 3);
            }
            if (new_rule || p >= e->n) { e->pos = save; break; }
        }
        if (e->pos >= e->n) break;
        char c = e->s[e->pos];
        if (c == '|' || c == ')' || c == '\n') break;
        size_t at = e->pos;
        piece p;
        if (parse_atom(e, &p)) { free(cur.p); return -1; }
        /* quantifiers */
        for (;;) {
            if (e->pos >= e->n) break;
            char q = e->s[e->pos];
            long mn, mx;
            if (q == '*') { mn = 0; mx = -1; e->pos++; }
            else if (q == '+') { mn = 1; mx = -1; e->pos++; }
            else if (q == '?') { mn = 0; mx = 1; e->pos++; }
            else if (q == '{') {
                size_t qa = e->pos;
                e->pos++;
                long nd = 0;
                mn = 0;
                while (e->pos < e->n && e->s[e->pos] >= '0' && e->s[e->pos] <= '9' && nd < 9)
                    mn = mn * 10 + (e->s[e->pos++] - '0'), nd++;
                if (!nd) { piece_free(&p); free(cur.p); return efail(e, DI_ERR_FORMAT, qa, "bad repetition"); }
                mx = mn;
                if (e->pos < e->n && e->s[e->pos] == ',') {
                    e->pos++;
                    nd = 0;
                    mx = 0;
                    while (e->pos < e->n && e->s[e->pos] >= '0' && e->s[e->pos] <= '9' && nd < 9)
                        mx = mx * 10 + (e->s[e->pos++] - '0'), nd++;
                    if (!nd) mx = -1;
                }
                if (e->pos >= e->n || e->s[e->pos] != '}' || (mx >= 0 && mx < mn)) {
                    piece_free(&p); free(cur.p);
                    return efail(e, DI_ERR_FORMAT, qa, "bad repetition");
                }
                e->pos++;
            } else break;
            if (quantify(e, &p, mn, mx, at)) { piece_free(&p); free(cur.p); return -1; }
        }
        if (p.rx) {
            if (sb_str(&cur, "(") || sb_str(&cur, p.rx) || sb_str(&cur, ")")) { piece_free(&p); free(cur.p); return efail(e, DI_ERR_NOMEM, at, "out of memory"); }
            have_cur = 1;
            piece_free(&p);
            continue;
        }
        if (ns + 2 > 256) { free(cur.p); return efail(e, DI_ERR_LIMIT, at, "sequence longer than 254 items"); }
        if (have_cur) {
            piece rp = {cur.p, 0};
            if (piece_sym(e, &rp, &syms[ns])) { free(cur.p); return -1; }
            ns++;
            free(cur.p);
            memset(&cur, 0, sizeof cur);
            have_cur = 0;
        }
        syms[ns++] = p.sym;
    }
    if (ns == 0) {
        if (!have_cur) { out->rx = strdup(""); return out->rx ? 0 : -1; }
        out->rx = cur.p;
        return 0;
    }
    if (have_cur) {
        piece rp = {cur.p, 0};
        if (piece_sym(e, &rp, &syms[ns])) { free(cur.p); return -1; }
        ns++;
        free(cur.p);
    }
    int32_t nt = di_cfg_nt(e->g, e->err);
    if (nt < 0 || di_cfg_rule_add(e->g, (uint32_t)nt, syms, ns, e->err)) return -1;
    out->sym = nt;
    return 0;
}

static int parse_alts(ebnf *e, piece *out) {
    piece alts[256];
    int na = 0;
    int all_rx = 1;
    for (;;) {
        if (na == 256) {
            for (int i = 0; i < na; i++) piece_free(&alts[i]);
            return efail(e, DI_ERR_LIMIT, e->pos, "more than 256 alternatives");
        }
        if (parse_seq(e, &alts[na])) {
            for (int i = 0; i < na; i++) piece_free(&alts[i]);
            return -1;
        }
        if (!alts[na].rx) all_rx = 0;
        na++;
        skip_ws(e, 0);
        if (e->pos < e->n && e->s[e->pos] == '|') { e->pos++; skip_ws(e, 1); continue; }
        break;
    }
    if (all_rx) {
        sbuf b = {0};
        int bad = 0;
        for (int i = 0; i < na; i++) {
            bad |= sb_str(&b, i ? "|(" : "(") || sb_str(&b, alts[i].rx) || sb_str(&b, ")");
            piece_free(&alts[i]);
        }
        if (bad) { free(b.p); return efail(e, DI_ERR_NOMEM, e->pos, "out of memory"); }
        out->rx = b.p;
        return 0;
    }
    int32_t nt = di_cfg_nt(e->g, e->err);
    int rc = nt < 0 ? -1 : 0;
    for (int i = 0; i < na; i++) {
        if (!rc) {
            di_sym s;
            if (alts[i].rx && !alts[i].rx[0]) rc = di_cfg_rule_add(e->g, (uint32_t)nt, NULL, 0, e->err) ? -1 : 0;
            else {
                rc = piece_sym(e, &alts[i], &s);
                if (!rc) rc = di_cfg_rule_add(e->g, (uint32_t)nt, &s, 1, e->err) ? -1 : 0;
            }
        }
        piece_free(&alts[i]);
    }
    if (rc) return -1;
    out->rx = NULL;
    out->sym = nt;
    return 0;
}

di_status di_ebnf_build(di_cfg *g, const char *text, size_t len, uint32_t *root, di_err *err) {
    ebnf *e = calloc(1, sizeof *e);
    if (!e) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    e->s = text;
    e->n = len;
    e->g = g;
    e->err = err;
    di_status st = DI_OK;
    for (;;) {
        skip_ws(e, 1);
        if (e->pos >= e->n) break;
        size_t at = e->pos;
        if (!is_name_char(e->s[e->pos])) { efail(e, DI_ERR_FORMAT, at, "expected a rule name"); goto fail; }
        while (e->pos < e->n && is_name_char(e->s[e->pos])) e->pos++;
        int idx = name_nt(e, e->s + at, e->pos - at, at);
        if (idx < 0) goto fail;
        skip_ws(e, 1);
        if (e->pos + 3 > e->n || memcmp(e->s + e->pos, "::=", 3)) { efail(e, DI_ERR_FORMAT, e->pos, "expected '::='"); goto fail; }
        e->pos += 3;
        if (e->defined[idx]) { efail(e, DI_ERR_FORMAT, at, "rule defined twice"); goto fail; }
        e->defined[idx] = 1;
        skip_ws(e, 1);
        piece body;
        if (parse_alts(e, &body)) goto fail;
        di_sym s;
        if (body.rx && !body.rx[0]) {
            piece_free(&body);
            if (di_cfg_rule_add(g, (uint32_t)e->nts[idx], NULL, 0, err)) goto fail;
        } else {
            int r = piece_sym(e, &body, &s);
            piece_free(&body);
            if (r || di_cfg_rule_add(g, (uint32_t)e->nts[idx], &s, 1, err)) goto fail;
        }
        skip_ws(e, 0);
        if (e->pos < e->n && e->s[e->pos] != '\n') { efail(e, DI_ERR_FORMAT, e->pos, "unexpected character"); goto fail; }
        if (di_cfg_check_time(g, err)) goto fail;
    }
    int root_idx = -1;
    for (int i = 0; i < e->n_names; i++) {
        if (!e->defined[i]) {
            char what[160];
            snprintf(what, sizeof what, "undefined rule '%.100s'", e->names[i]);
            efail(e, DI_ERR_FORMAT, e->ref_pos[i], what);
            goto fail;
        }
        if (!strcmp(e->names[i], "root")) root_idx = i;
    }
    if (root_idx < 0) { di_err_set(err, DI_ERR_FORMAT, "EBNF: no 'root' rule"); goto fail; }
    *root = (uint32_t)e->nts[root_idx];
    goto done;
fail:
    st = err->code ? err->code : DI_ERR_FORMAT;
done:
    for (int i = 0; i < e->n_names; i++) free(e->names[i]);
    free(e);
    return st;
}
