/* The lexer-only walk of the vocabulary trie: the part of a mask that one
 * lexeme decides alone, memoised per lexer item by the matcher.
 * Spec: ecosystem.md §1.1 (token trie, lexer-state token sets) and §1.4.
 *
 * This walk is the cost of the first mask at a lexer state not seen yet, so
 * it is kept tight: one table lookup per node, whole subtrees skipped when
 * the lexeme dies on their first byte, and whole subtrees taken without a
 * visit when every byte below a node loops the lexeme in a non-accepting
 * state (the body of a string or a character-class run: no node below can
 * die or end the lexeme). */
#include <stdlib.h>
#include <string.h>

#include "grammar/vocab.h"

typedef struct walk_ctx {
    const di_vocab *v;
    const di_dfa *d;
    di_mask_entry *e;
    uint32_t cap_fb;
    uint32_t n_allowed;
    uint64_t (*loop)[4];  /* [n_states] bytes on which a state loops to itself */
    uint8_t *loop_done;   /* [n_states] 0 unknown, 1 loops on some byte, 2 on none */
    uint64_t (*cbytes)[4]; /* [n_classes] bytes of each class */
} walk_ctx;

static int fallback_push(walk_ctx *w, uint32_t node) {
    di_mask_entry *e = w->e;
    if (e->n_fallback == w->cap_fb) {
        uint32_t cap = w->cap_fb * 2;
        uint32_t *nf = realloc(e->fallback, cap * sizeof *nf);
        if (!nf) return -1;
        e->fallback = nf;
        w->cap_fb = cap;
    }
    e->fallback[e->n_fallback++] = node;
    return 0;
}

/* Computes loop[s]; returns 1 when s loops on some byte. */
static int loop_of(walk_ctx *w, uint32_t s) {
    if (!w->loop_done[s]) {
        const di_dfa *d = w->d;
        uint64_t *ls = w->loop[s];
        memset(ls, 0, sizeof w->loop[s]);
        const uint32_t *row = d->trans + (size_t)s * d->n_classes;
        for (uint32_t c = 0; c < d->n_classes; c++)
            if (row[c] == s)
                for (int k = 0; k < 4; k++) ls[k] |= w->cbytes[c][k];
        w->loop_done[s] = (ls[0] | ls[1] | ls[2] | ls[3]) ? 1 : 2;
    }
    return w->loop_done[s] == 1;
}

/* The walk over trie tr (the full trie, or the rest trie whose nodes map
 * to the full trie's through tr->full); `skip` is a compile-time constant
 * at every call site, so an automaton without self-loops runs the plain
 * loop. */
static inline int walk(walk_ctx *w, const di_trie *tr, uint32_t st0, int exact, const int skip) {
    const di_vocab *v = w->v;
    const di_dfa *d = w->d;
    const uint32_t *trans = d->trans;
    const uint8_t *cls = d->byte_class, *acc = d->accept;
    const uint32_t nc = d->n_classes;
    const uint8_t *nb = tr->byte;
    const uint16_t *ndp = tr->depth;
    const uint32_t *ne = tr->end, *nbl = tr->below, *full = tr->full;
    const int32_t *nt = tr->tok;
    uint32_t *bits = w->e->bits;
    uint32_t st[1026]; /* automaton state per trie depth */
    st[0] = st0;
    uint32_t i = 0, n = tr->n_nodes, n_allowed = 0;
    while (i < n) {
        uint32_t dp = ndp[i];
        uint32_t s2 = trans[(size_t)st[dp - 1] * nc + cls[nb[i]]];
        if (!s2) { i = ne[i]; continue; }
        if (acc[s2]) {
            /* The lexeme can end here: tokens ending here are allowed (the
             * completed item is viable), it may go on below, and the parser
             * decides what may follow its end in the children. */
            if ((!exact || i + 1 < ne[i]) && fallback_push(w, full ? full[i] : i)) return -1;
            if (!exact) { i = ne[i]; continue; }
        } else if (skip && nbl[i] && loop_of(w, s2)) {
            const uint64_t *bs = v->sets[nbl[i]], *ls = w->loop[s2];
            if (!((bs[0] & ~ls[0]) | (bs[1] & ~ls[1]) | (bs[2] & ~ls[2]) | (bs[3] & ~ls[3]))) {
                uint32_t k0 = v->tok_lo[i], k1 = v->tok_lo[ne[i]];
                for (uint32_t k = k0; k < k1; k++) {
                    uint32_t tk = v->pre_toks[k];
                    bits[tk >> 5] |= 1u << (tk & 31);
                }
                n_allowed += k1 - k0;
                i = ne[i];
                continue;
            }
        }
        st[dp] = s2;
        for (int32_t tk = nt[i]; tk >= 0; tk = v->tok_next[tk]) {
            bits[tk >> 5] |= 1u << (tk & 31);
            n_allowed++;
        }
        i++;
    }
    w->n_allowed += n_allowed;
    return 0;
}

/* ------------------------------------------------------------ text slice */

/* Continuation bytes lo..hi then k - 1 more in 80..BF from state q must
 * bring the automaton back to s, through live non-accepting states.
 * memo[(k - 1) * n_states + q] caches the 80..BF cases: 1 yes, 2 no. */
static int cont_loop(const di_dfa *d, uint32_t s, uint32_t q, uint32_t k, int lo, int hi, uint8_t *memo) {
    int std = lo == 0x80 && hi == 0xBF;
    uint8_t *m = std ? &memo[(size_t)(k - 1) * d->n_states + q] : NULL;
    if (m && *m) return *m == 1;
    uint8_t seen[256 / 8] = {0};
    int ok = 1;
    for (int c = lo; c <= hi && ok; c++) {
        uint8_t cl = d->byte_class[c];
        if (seen[cl >> 3] & (1u << (cl & 7))) continue;
        seen[cl >> 3] |= (uint8_t)(1u << (cl & 7));
        uint32_t q2 = di_dfa_step(d, q, (uint8_t)c);
        if (k == 1) ok = q2 == s;
        else ok = q2 && !d->accept[q2] && cont_loop(d, s, q2, k - 1, 0x80, 0xBF, memo);
    }
    if (m) *m = ok ? 1 : 2;
    return ok;
}

/* 1 when every non-ASCII character (strict UTF-8) brings s back to s
 * through live non-accepting states; then excl gets the ASCII text bytes
 * (U+0020..U+007F but '"' and '\\') on which s does not loop. */
static int text_loop(const di_dfa *d, uint32_t s, uint8_t excl[128]) {
    static const struct { uint8_t lead_lo, lead_hi, lo, hi, k; } forms[] = {
        {0xC2, 0xDF, 0x80, 0xBF, 1}, {0xE0, 0xE0, 0xA0, 0xBF, 2}, {0xE1, 0xEC, 0x80, 0xBF, 2},
        {0xED, 0xED, 0x80, 0x9F, 2}, {0xEE, 0xEF, 0x80, 0xBF, 2}, {0xF0, 0xF0, 0x90, 0xBF, 3},
        {0xF1, 0xF3, 0x80, 0xBF, 3}, {0xF4, 0xF4, 0x80, 0x8F, 3},
    };
    uint8_t *memo = calloc((size_t)d->n_states * 3, 1);
    if (!memo) return 0;
    int ok = 1;
    for (size_t f = 0; f < sizeof forms / sizeof forms[0] && ok; f++)
        for (int b = forms[f].lead_lo; b <= forms[f].lead_hi && ok; b++) {
            uint32_t q1 = di_dfa_step(d, s, (uint8_t)b);
            ok = q1 && !d->accept[q1] && cont_loop(d, s, q1, forms[f].k, forms[f].lo, forms[f].hi, memo);
        }
    free(memo);
    if (!ok) return 0;
    for (int b = 0; b < 128; b++) excl[b] = b >= 0x20 && b != '"' && b != '\\' && di_dfa_step(d, s, (uint8_t)b) != s;
    return 1;
}

/* The text tokens holding an excluded byte, re-checked one by one from
 * state s: dead ones are dropped. A lexeme end on the way (which would
 * need a split node) gives up the slice: returns 1. */
static int recheck_excluded(walk_ctx *w, uint32_t s, const uint8_t excl[128]) {
    const di_vocab *v = w->v;
    const di_dfa *d = w->d;
    uint32_t *bits = w->e->bits;
    for (int b = 0; b < 128; b++)
        if (excl[b])
            for (uint32_t k = v->with_off[b]; k < v->with_off[b + 1]; k++) {
                uint32_t t = v->with_tok[k];
                bits[t >> 5] &= ~(1u << (t & 31));
            }
    for (int b = 0; b < 128; b++)
        if (excl[b])
            for (uint32_t k = v->with_off[b]; k < v->with_off[b + 1]; k++) {
                uint32_t t = v->with_tok[k], q = s;
                for (uint32_t j = v->off[t]; j < v->off[t + 1] && q; j++) {
                    q = di_dfa_step(d, q, v->bytes[j]);
                    if (q && d->accept[q]) return 1;
                }
                if (q) bits[t >> 5] |= 1u << (t & 31);
            }
    return 0;
}

/* Text tokens to re-check one by one at most; past it the full walk is
 * cheaper. */
#define TEXT_RECHECK_MAX 16384

/* The walk through the text slice: 1 done, 0 not applicable (nothing
 * changed), -1 out of memory. */
static int text_walk(walk_ctx *w, uint32_t st0, int exact) {
    const di_vocab *v = w->v;
    const di_dfa *d = w->d;
    uint8_t excl[128];
    if (d->accept[st0] || !text_loop(d, st0, excl)) return 0;
    uint32_t n_recheck = 0;
    for (int b = 0; b < 128; b++)
        if (excl[b]) n_recheck += v->with_off[b + 1] - v->with_off[b];
    if (n_recheck > TEXT_RECHECK_MAX) return 0;
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    memcpy(w->e->bits, v->text_bits, words * sizeof *w->e->bits);
    if (recheck_excluded(w, st0, excl)) {
        memset(w->e->bits, 0, words * sizeof *w->e->bits);
        return 0;
    }
    int rc = walk(w, &v->rest, st0, exact, 0);
    w->n_allowed = UINT32_MAX; /* many: keep the bitset */
    return rc ? -1 : 1;
}

di_mask_entry *di_vocab_lexer_walk(const di_vocab *v, const di_dfa *d, uint32_t st, int exact) {
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    walk_ctx w = {.v = v, .d = d, .cap_fb = 64};
    di_mask_entry *e = calloc(1, sizeof *e);
    w.e = e;
    if (e) {
        e->bits = calloc(words, sizeof *e->bits);
        e->fallback = malloc(w.cap_fb * sizeof *e->fallback);
    }
    /* does any state loop on a byte? (then subtrees may be taken whole;
     * large automata are assumed to, rather than scanned on every walk) */
    int any_loop = d->n_states > 4096;
    for (uint32_t s = 1; s < d->n_states && !any_loop; s++)
        for (uint32_t c = 0; c < d->n_classes && !any_loop; c++) any_loop = d->trans[(size_t)s * d->n_classes + c] == s;
    if (any_loop) {
        w.loop = malloc((size_t)d->n_states * sizeof *w.loop);
        w.loop_done = calloc(d->n_states, 1);
        w.cbytes = calloc(d->n_classes, sizeof *w.cbytes);
        if (w.cbytes)
            for (int b = 0; b < 256; b++) w.cbytes[d->byte_class[b]][b >> 6] |= 1ull << (b & 63);
    }
    int rc = !e || !e->bits || !e->fallback || (any_loop && (!w.loop || !w.loop_done || !w.cbytes));
    int done = rc ? 0 : text_walk(&w, st, exact);
    if (done < 0) rc = -1;
    if (!rc && !done) rc = any_loop ? walk(&w, &v->trie, st, exact, 1) : walk(&w, &v->trie, st, exact, 0);
    free(w.loop);
    free(w.loop_done);
    free(w.cbytes);
    if (rc) {
        di_mask_entry_free(e);
        return NULL;
    }
    /* few tokens: keep them as a list (cheaper to merge than a bitset) */
    if (w.n_allowed != UINT32_MAX && w.n_allowed <= 4096) {
        e->toks = malloc((w.n_allowed ? w.n_allowed : 1) * sizeof *e->toks);
        if (e->toks) {
            for (size_t k = 0; k < words && e->n_toks < w.n_allowed; k++)
                for (uint32_t b = e->bits[k]; b; b &= b - 1) e->toks[e->n_toks++] = (uint32_t)(k * 32 + (uint32_t)__builtin_ctz(b));
            free(e->bits);
            e->bits = NULL;
        }
    }
    return e;
}

int di_vocab_token_alive(const di_vocab *v, const di_dfa *d, uint32_t st, uint32_t tok) {
    for (uint32_t k = v->off[tok]; k < v->off[tok + 1] && st; k++) st = di_dfa_step(d, st, v->bytes[k]);
    return st != 0;
}
