/* Character sets → shared byte tries in the NFA. Spec: ecosystem.md §1.1,
 * §1.4. See regex_utf8.h for why the encodings are shared. */
#include "grammar/regex_utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grow.h"

#define TRIE_LEAF UINT32_MAX
#define TRIE_NONE UINT32_MAX

/* One edge of the byte trie: a byte range to a child node, or to the leaf
 * (the character is complete). A node's edges form a sibling list. */
typedef struct trie_edge {
    uint8_t lo, hi;
    uint32_t to;       /* child node or TRIE_LEAF */
    uint32_t sibling;  /* next edge of the same node or TRIE_NONE */
} trie_edge;

typedef struct byte_trie {
    trie_edge *e;
    uint32_t n_e, cap_e;
    uint32_t *first;   /* [n_nodes] first edge of each node; node 0 is the root */
    uint32_t n_nodes, cap_nodes;
} byte_trie;

static uint32_t trie_node_new(byte_trie *t) {
    if (di_grow((void **)&t->first, &t->cap_nodes, t->n_nodes + 1, sizeof *t->first)) return TRIE_NONE;
    t->first[t->n_nodes] = TRIE_NONE;
    return t->n_nodes++;
}

/* Adds the byte-range sequence lo[i]..hi[i], i < len. Sequences that begin
 * with the same ranges share those edges. Returns -1 when out of memory. */
static int trie_insert(byte_trie *t, const uint8_t *lo, const uint8_t *hi, int len) {
    uint32_t node = 0;
    for (int i = 0; i < len; i++) {
        int last = i == len - 1;
        uint32_t e = t->first[node];
        while (e != TRIE_NONE && !(t->e[e].lo == lo[i] && t->e[e].hi == hi[i] && (t->e[e].to == TRIE_LEAF) == last))
            e = t->e[e].sibling;
        if (e == TRIE_NONE) {
            uint32_t to = TRIE_LEAF;
            if (!last && (to = trie_node_new(t)) == TRIE_NONE) return -1;
            if (di_grow((void **)&t->e, &t->cap_e, t->n_e + 1, sizeof *t->e)) return -1;
            e = t->n_e++;
            t->e[e] = (trie_edge){lo[i], hi[i], to, t->first[node]};
            t->first[node] = e;
        }
        node = t->e[e].to;
    }
    return 0;
}

static int utf8_len(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

static void utf8_put(uint32_t c, uint8_t *b) {
    switch (utf8_len(c)) {
    case 1: b[0] = (uint8_t)c; break;
    case 2: b[0] = (uint8_t)(0xC0 | c >> 6); b[1] = (uint8_t)(0x80 | (c & 0x3F)); break;
    case 3: b[0] = (uint8_t)(0xE0 | c >> 12); b[1] = (uint8_t)(0x80 | (c >> 6 & 0x3F)); b[2] = (uint8_t)(0x80 | (c & 0x3F)); break;
    default:
        b[0] = (uint8_t)(0xF0 | c >> 18); b[1] = (uint8_t)(0x80 | (c >> 12 & 0x3F));
        b[2] = (uint8_t)(0x80 | (c >> 6 & 0x3F)); b[3] = (uint8_t)(0x80 | (c & 0x3F));
    }
}

/* Inserts the UTF-8 encodings of [lo, hi] (no surrogates) as byte-range
 * sequences: the range is cut where the encoded length changes and where a
 * continuation byte would not run over its full 80-BF span, until each
 * piece is a product of per-position byte ranges. */
static int trie_insert_utf8(byte_trie *t, uint32_t lo, uint32_t hi) {
    int n = utf8_len(lo);
    if (n != utf8_len(hi)) {
        uint32_t top = n == 1 ? 0x7F : n == 2 ? 0x7FF : 0xFFFF;
        return trie_insert_utf8(t, lo, top) || trie_insert_utf8(t, top + 1, hi);
    }
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1; /* the low i continuation bytes */
        if ((lo & ~m) == (hi & ~m)) continue;
        if (lo & m) return trie_insert_utf8(t, lo, lo | m) || trie_insert_utf8(t, (lo | m) + 1, hi);
        if ((hi & m) != m) return trie_insert_utf8(t, lo, (hi & ~m) - 1) || trie_insert_utf8(t, hi & ~m, hi);
    }
    uint8_t a[4], b[4];
    utf8_put(lo, a);
    utf8_put(hi, b);
    return trie_insert(t, a, b, n);
}

static int trie_insert_bytes(byte_trie *t, const char *s) {
    int n = (int)strlen(s);
    return trie_insert(t, (const uint8_t *)s, (const uint8_t *)s, n);
}

/* Inserts [lo, hi] (no surrogates) in the canonical JSON string encoding. */
static int trie_insert_json(byte_trie *t, uint32_t lo, uint32_t hi) {
    for (uint32_t c = lo; c <= hi && c < 0x20; c++) {
        char buf[8];
        const char *sh = c == 8 ? "\\b" : c == 9 ? "\\t" : c == 10 ? "\\n" : c == 12 ? "\\f" : c == 13 ? "\\r" : NULL;
        if (!sh) { snprintf(buf, sizeof buf, "\\u%04x", c); sh = buf; }
        if (trie_insert_bytes(t, sh)) return -1;
    }
    if (lo < 0x20) lo = 0x20;
    static const uint32_t specials[2] = {'"', '\\'};
    for (int q = 0; q < 2 && lo <= hi; q++) {
        uint32_t c = specials[q];
        if (c < lo || c > hi) continue;
        if (trie_insert_bytes(t, c == '"' ? "\\\"" : "\\\\")) return -1;
        if (c > lo && trie_insert_utf8(t, lo, c - 1)) return -1;
        lo = c + 1;
    }
    return lo <= hi ? trie_insert_utf8(t, lo, hi) : 0;
}

/* ------------------------------------------------- shared automaton */

typedef struct canon_ctx {
    const byte_trie *t;
    di_utf8_class *c;
    uint32_t cap_nodes, cap_edges;
    di_key_table seen;   /* canonical nodes by their edge list (lo << 8 | hi, child) */
} canon_ctx;

typedef struct di_utf8_edge class_edge;

static int cmp_class_edge(const void *a, const void *b) {
    const class_edge *x = a, *y = b;
    if (x->lohi != y->lohi) return x->lohi < y->lohi ? -1 : 1;
    return x->child < y->child ? -1 : x->child > y->child;
}

/* Canonical node of trie node `node`, made after its children (so the
 * class's nodes are in post-order): a node whose sorted edge list (ranges
 * and canonical children) exists already is that node, so equal subtrees
 * become one. Sets *out; -1 when out of memory. Recursion depth is the
 * longest encoding (6 bytes, \u00xx). */
static int canon_node(canon_ctx *x, uint32_t node, uint32_t *out) {
    const byte_trie *t = x->t;
    uint32_t k = 0;
    for (uint32_t e = t->first[node]; e != TRIE_NONE; e = t->e[e].sibling) k++;
    class_edge *ce = malloc((size_t)k * sizeof *ce);
    if (!ce) return -1;
    uint32_t i = 0;
    for (uint32_t e = t->first[node]; e != TRIE_NONE; e = t->e[e].sibling, i++) {
        uint32_t child = DI_UTF8_LEAF;
        if (t->e[e].to != TRIE_LEAF && canon_node(x, t->e[e].to, &child)) { free(ce); return -1; }
        ce[i] = (class_edge){(uint32_t)t->e[e].lo << 8 | t->e[e].hi, child};
    }
    qsort(ce, k, sizeof *ce, cmp_class_edge);
    /* Adjacent ranges to the same child are one edge: fewer states, and
     * fewer byte classes in the automaton. */
    uint32_t m = 0;
    for (i = 0; i < k; i++) {
        if (m && ce[m - 1].child == ce[i].child && (ce[m - 1].lohi & 0xFF) + 1 == ce[i].lohi >> 8)
            ce[m - 1].lohi = (ce[m - 1].lohi & 0xFF00) | (ce[i].lohi & 0xFF);
        else ce[m++] = ce[i];
    }
    int fresh;
    di_utf8_class *c = x->c;
    uint32_t id = di_key_table_intern(&x->seen, (const uint32_t *)ce, (size_t)m * 2, &fresh);
    if (id != UINT32_MAX && fresh) {
        if (di_grow((void **)&c->node_off, &x->cap_nodes, id + 2, sizeof *c->node_off) ||
            di_grow((void **)&c->edges, &x->cap_edges, c->node_off[id] + m, sizeof *c->edges)) {
            id = UINT32_MAX;
        } else {
            memcpy(c->edges + c->node_off[id], ce, (size_t)m * sizeof *ce);
            c->node_off[id + 1] = c->node_off[id] + m;
            c->n_nodes = id + 1;
            c->nfa_states += 2 * m - 1;
        }
    }
    free(ce);
    *out = id;
    return id == UINT32_MAX ? -1 : 0;
}

/* Inserts r[0..n) into the trie, surrogates cut out. */
static int trie_insert_set(byte_trie *t, const di_cp_range *r, uint32_t n, int json) {
    for (uint32_t i = 0; i < n; i++) {
        uint32_t piece[2][2], np = 0, lo = r[i].lo, hi = r[i].hi;
        if (hi < 0xD800 || lo > 0xDFFF) { piece[np][0] = lo; piece[np][1] = hi; np++; }
        else {
            if (lo < 0xD800) { piece[np][0] = lo; piece[np][1] = 0xD7FF; np++; }
            if (hi > 0xDFFF) { piece[np][0] = 0xE000; piece[np][1] = hi; np++; }
        }
        for (uint32_t k = 0; k < np; k++)
            if (json ? trie_insert_json(t, piece[k][0], piece[k][1]) : trie_insert_utf8(t, piece[k][0], piece[k][1]))
                return -1;
    }
    return 0;
}

di_status di_utf8_class_init(di_utf8_class *c, const di_cp_range *r, uint32_t n, int json, di_err *err) {
    memset(c, 0, sizeof *c);
    byte_trie t = {0};
    canon_ctx x = {&t, c, 0, 0, {0}};
    di_status st = DI_OK;
    if (trie_node_new(&t) == TRIE_NONE || trie_insert_set(&t, r, n, json)) st = DI_ERR_NOMEM;
    else if (di_grow((void **)&c->node_off, &x.cap_nodes, 1, sizeof *c->node_off)) st = DI_ERR_NOMEM;
    else {
        c->node_off[0] = 0;
        if (t.first[0] == TRIE_NONE) c->nfa_states = 1; /* empty set: one state with no way forward */
        else if (canon_node(&x, 0, &c->root)) st = DI_ERR_NOMEM;
    }
    if (!st) {
        c->entry = malloc(((size_t)c->n_nodes + 1) * sizeof *c->entry);
        if (!c->entry) st = DI_ERR_NOMEM;
    }
    free(t.e);
    free(t.first);
    di_key_table_free(&x.seen);
    if (st) {
        di_utf8_class_free(c);
        return di_err_set(err, st, "regex: out of memory building a character class");
    }
    return DI_OK;
}

void di_utf8_class_free(di_utf8_class *c) {
    free(c->node_off);
    free(c->edges);
    free(c->entry);
    memset(c, 0, sizeof *c);
}

static uint32_t nfa_full(const di_nfa *nfa, di_err *err) {
    di_err_set(err, DI_ERR_LIMIT, "regex: automaton exceeds %u NFA states", nfa->max_states);
    return DI_NFA_NONE;
}

uint32_t di_utf8_class_emit(di_utf8_class *c, di_nfa *nfa, uint32_t next, di_err *err) {
    if (!c->n_nodes) {
        uint32_t s = di_nfa_add(nfa, DI_NFA_EPS, 0, 0, DI_NFA_NONE, DI_NFA_NONE);
        return s == DI_NFA_NONE ? nfa_full(nfa, err) : s;
    }
    /* children before parents; each node is one range state per edge,
     * joined by a chain of epsilon splits */
    for (uint32_t id = 0; id < c->n_nodes; id++) {
        uint32_t s = DI_NFA_NONE;
        for (uint32_t i = c->node_off[id + 1]; i-- > c->node_off[id];) {
            uint32_t lohi = c->edges[i].lohi, child = c->edges[i].child;
            uint32_t r = di_nfa_add(nfa, DI_NFA_RANGE, (uint8_t)(lohi >> 8), (uint8_t)lohi,
                                    child == DI_UTF8_LEAF ? next : c->entry[child], DI_NFA_NONE);
            if (r != DI_NFA_NONE && s != DI_NFA_NONE) r = di_nfa_add(nfa, DI_NFA_EPS, 0, 0, r, s);
            if (r == DI_NFA_NONE) return nfa_full(nfa, err);
            s = r;
        }
        c->entry[id] = s;
    }
    return c->entry[c->root];
}

uint32_t di_utf8_bytes_emit(di_nfa *nfa, const char *s, uint32_t len, uint32_t next, di_err *err) {
    uint32_t cur = next;
    for (uint32_t i = len; i-- > 0;) {
        cur = di_nfa_add(nfa, DI_NFA_RANGE, (uint8_t)s[i], (uint8_t)s[i], cur, DI_NFA_NONE);
        if (cur == DI_NFA_NONE) return nfa_full(nfa, err);
    }
    return cur;
}
