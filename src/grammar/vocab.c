/* Vocabulary byte trie and its walk summaries. Spec: ecosystem.md §1.1, §1.4. */
#include "grammar/vocab.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/utf8.h"

#define VOCAB_MAX_TOKEN_BYTES 1024

static int cmp_tok(const void *a, const void *b, void *arg) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    const struct di_vocab *v = arg;
    uint32_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    uint32_t l = lx < ly ? lx : ly;
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], l);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static void trie_free(di_trie *t) {
    free(t->byte);
    free(t->depth);
    free(t->end);
    free(t->tok);
    free(t->below);
    free(t->full);
    memset(t, 0, sizeof *t);
}

void di_vocab_free(di_vocab *v) {
    if (!v) return;
    if (v->cache.max_bytes) di_mask_cache_free(&v->cache);
    free(v->bytes);
    free(v->off);
    free(v->tok_next);
    trie_free(&v->trie);
    trie_free(&v->rest);
    free(v->pre_toks);
    free(v->tok_lo);
    free(v->sets);
    free(v->len_order);
    free(v->len_start);
    free(v->text_bits);
    free(v->with_off);
    free(v->with_tok);
    free(v->quote_toks);
    free(v->sep_toks);
    free(v->qc_toks);
    free(v->tok_flags);
    free(v->quote_at);
    free(v);
}

/* Lays out the trie of the tokens ids[0..n) (sorted by bytes, then id) in
 * preorder. With link, tokens with the same bytes are chained in tok_next
 * (done once, for the full trie). */
static int trie_build(di_vocab *v, const uint32_t *ids, size_t n_ids, int link, di_trie *tr) {
    size_t cap = 1;
    for (size_t k = 0; k < n_ids; k++) cap += v->off[ids[k] + 1] - v->off[ids[k]];
    tr->byte = malloc(cap);
    tr->depth = malloc(cap * sizeof *tr->depth);
    tr->end = malloc(cap * sizeof *tr->end);
    tr->tok = malloc(cap * sizeof *tr->tok);
    if (!tr->byte || !tr->depth || !tr->end || !tr->tok) return -1;
    uint32_t stack[VOCAB_MAX_TOKEN_BYTES + 1];
    uint32_t n = 0, sp = 0, prev = UINT32_MAX;
    for (size_t k = 0; k < n_ids; k++) {
        uint32_t t = ids[k];
        const uint8_t *b = v->bytes + v->off[t];
        uint32_t l = v->off[t + 1] - v->off[t], lcp = 0;
        if (prev != UINT32_MAX) {
            const uint8_t *pb = v->bytes + v->off[prev];
            uint32_t pl = v->off[prev + 1] - v->off[prev];
            while (lcp < l && lcp < pl && pb[lcp] == b[lcp]) lcp++;
            if (lcp == l && lcp == pl) { /* same bytes as the previous token */
                if (link) {
                    int32_t first = tr->tok[stack[sp - 1]];
                    while (v->tok_next[first] >= 0) first = v->tok_next[first];
                    v->tok_next[first] = (int32_t)t;
                }
                continue;
            }
        }
        while (sp > lcp) tr->end[stack[--sp]] = n;
        for (uint32_t d = lcp; d < l; d++) {
            tr->byte[n] = b[d];
            tr->depth[n] = (uint16_t)(d + 1);
            tr->tok[n] = -1;
            stack[sp++] = n++;
        }
        tr->tok[stack[sp - 1]] = (int32_t)t;
        prev = t;
    }
    while (sp) tr->end[stack[--sp]] = n;
    tr->n_nodes = n;
    return 0;
}

/* The node of the full trie reached by the same path as each rest node. */
static int rest_map(di_vocab *v) {
    const di_trie *f = &v->trie;
    di_trie *r = &v->rest;
    r->full = malloc(((size_t)r->n_nodes + 1) * sizeof *r->full);
    if (!r->full) return -1;
    uint32_t at[VOCAB_MAX_TOKEN_BYTES + 1]; /* full node of the rest path at each depth */
    for (uint32_t i = 0; i < r->n_nodes; i++) {
        uint32_t d = r->depth[i];
        uint32_t c = d == 1 ? 0 : at[d - 1] + 1, e = d == 1 ? f->n_nodes : f->end[at[d - 1]];
        while (c < e && f->byte[c] != r->byte[i]) c = f->end[c];
        if (c >= e) return -1; /* cannot happen: every rest path is a full path */
        at[d] = c;
        r->full[i] = c;
    }
    return 0;
}

/* 1 when the token is whole string-body characters (see vocab.h); fills
 * the ASCII bytes it holds. */
static int text_token(const uint8_t *s, size_t n, uint8_t ascii[128]) {
    for (size_t k = 0; k < n;) {
        int32_t cp;
        size_t l = di_utf8_decode(s + k, n - k, &cp);
        if (!l || cp < 0x20 || cp == '"' || cp == '\\') return 0;
        if (cp < 0x80) ascii[cp] = 1;
        k += l;
    }
    return 1;
}

/* Splits the vocabulary into the text slice and the rest trie. */
static int text_slice(di_vocab *v, const uint32_t *ids, size_t n_ids) {
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    v->text_bits = calloc(words, sizeof *v->text_bits);
    v->with_off = calloc(129, sizeof *v->with_off);
    uint32_t *rest = malloc((n_ids + 1) * sizeof *rest);
    int rc = v->text_bits && v->with_off && rest ? 0 : -1;
    size_t n_rest = 0;
    uint8_t ascii[128];
    /* two passes over the tokens: count, then fill the per-byte lists */
    for (int pass = 0; pass < 2 && !rc; pass++) {
        if (pass == 1) {
            for (int b = 0; b < 128; b++) v->with_off[b + 1] += v->with_off[b];
            v->with_tok = malloc(((size_t)v->with_off[128] + 1) * sizeof *v->with_tok);
            if (!v->with_tok) { rc = -1; break; }
        }
        uint32_t fill[128];
        memcpy(fill, v->with_off, sizeof fill);
        for (size_t k = 0; k < n_ids; k++) {
            uint32_t t = ids[k];
            memset(ascii, 0, sizeof ascii);
            if (!text_token(v->bytes + v->off[t], v->off[t + 1] - v->off[t], ascii)) {
                if (pass == 0) rest[n_rest++] = t;
                continue;
            }
            if (pass == 0) v->text_bits[t >> 5] |= 1u << (t & 31);
            for (int b = 0; b < 128; b++)
                if (ascii[b]) {
                    if (pass == 0) v->with_off[b + 1]++;
                    else v->with_tok[fill[b]++] = t;
                }
        }
    }
    if (!rc) rc = trie_build(v, rest, n_rest, 0, &v->rest);
    if (!rc) rc = rest_map(v);
    free(rest);
    return rc;
}

/* Lists the tokens holding '"' by quote count (see vocab.h). */
static int quote_tokens(di_vocab *v) {
    uint32_t count[8] = {0};
    for (uint32_t t = 0; t < v->n_vocab; t++) {
        uint32_t q = 0;
        for (uint32_t k = v->off[t]; k < v->off[t + 1]; k++) q += v->bytes[k] == '"';
        count[q > 7 ? 7 : q]++;
    }
    /* quote_start[c] = tokens with >= c quotes */
    memset(v->quote_start, 0, sizeof v->quote_start);
    for (int c = 7, acc = 0; c >= 1; c--) {
        acc += (int)count[c];
        v->quote_start[c] = (uint32_t)acc;
    }
    v->quote_start[0] = v->quote_start[1];
    v->quote_toks = malloc(((size_t)v->quote_start[1] + 1) * sizeof *v->quote_toks);
    if (!v->quote_toks) return -1;
    v->sep_toks = malloc(((size_t)v->n_vocab + 1) * sizeof *v->sep_toks);
    v->qc_toks = malloc(((size_t)v->n_vocab + 1) * sizeof *v->qc_toks);
    v->tok_flags = calloc(v->n_vocab, 1);
    v->quote_at = malloc((size_t)v->n_vocab * sizeof *v->quote_at);
    if (!v->sep_toks || !v->qc_toks || !v->tok_flags || !v->quote_at) return -1;
    for (uint32_t t = 0; t < v->n_vocab; t++) {
        const uint8_t *b = v->bytes + v->off[t];
        uint32_t n = v->off[t + 1] - v->off[t], tail = 0, quote = 0, qc = 0;
        for (uint32_t k = 0; k < n; k++) {
            qc |= quote && b[k] == ',';
            quote |= b[k] == '"';
            if (b[k] == ',') tail = 0;
            else if (b[k] != ' ' && b[k] != '\t' && b[k] != '\n' && b[k] != '\r') tail = 1;
        }
        if (qc) v->qc_toks[v->n_qc++] = t;
        /* one-comma shapes: [^"\\{}[]]* ("")? , ws* */
        uint32_t commas = 0, quotes = 0, structural = 0, k = 0, comma_at = 0;
        for (uint32_t j = 0; j < n; j++) {
            if (b[j] == ',') { commas++; comma_at = j; }
            quotes += b[j] == '"';
            structural |= b[j] == '\\' || b[j] == '{' || b[j] == '}' || b[j] == '[' || b[j] == ']';
        }
        for (k = comma_at + 1; k < n && (b[k] == ' ' || b[k] == '\t' || b[k] == '\n' || b[k] == '\r'); k++) {}
        v->quote_at[t] = UINT16_MAX;
        for (uint32_t j = 0; j < n && v->quote_at[t] == UINT16_MAX; j++)
            if (b[j] == '"') v->quote_at[t] = (uint16_t)j;
            else if (b[j] == '\\') v->tok_flags[t] |= DI_TOK_ESC_HEAD;
        if (commas) v->tok_flags[t] |= DI_TOK_HAS_COMMA;
        {
            uint32_t j = 0;
            while (j < n && (b[j] == ' ' || b[j] == '\t' || b[j] == '\n' || b[j] == '\r')) j++;
            if (j < n && b[j] == '"') v->tok_flags[t] |= DI_TOK_QUOTE_FIRST;
        }
        if (quotes == 1) {
            uint32_t j = 0, ok = 1;
            while (j < n && (b[j] == ' ' || b[j] == '\t' || b[j] == '\n' || b[j] == '\r' || b[j] == ',')) j++;
            for (uint32_t i = j + 1; i < n && ok; i++) ok = b[i] != '"' && b[i] != '\\';
            if (j < n && b[j] == '"' && ok) v->tok_flags[t] |= DI_TOK_OPEN_KEY;
        }
        if (commas == 1 && !structural && k == n) {
            if (!quotes) v->tok_flags[t] |= DI_TOK_COMMA;
            else if (quotes == 1 && comma_at > 0 && b[comma_at - 1] == '"') v->tok_flags[t] |= DI_TOK_QUOTE_COMMA;
        }
        if (!n || quote) continue;
        if (!tail && memchr(b, ',', n)) v->sep_toks[v->n_sep++] = t; /* a comma then whitespace only */
    }
    uint32_t fill[8] = {0};
    for (uint32_t t = 0; t < v->n_vocab; t++) {
        uint32_t q = 0;
        for (uint32_t k = v->off[t]; k < v->off[t + 1]; k++) q += v->bytes[k] == '"';
        if (!q) continue;
        q = q > 7 ? 7 : q;
        /* count q: [quote_start[q + 1], quote_start[q]) with quote_start[8] = 0 */
        uint32_t lo = q == 7 ? 0 : v->quote_start[q + 1];
        v->quote_toks[lo + fill[q]++] = t;
    }
    return 0;
}

/* Fills pre_toks / tok_lo, the length order and the byte set below each
 * node (interned). */
static int subtree_summaries(di_vocab *v) {
    const di_trie *tr = &v->trie;
    uint32_t n = tr->n_nodes;
    v->tok_lo = malloc(((size_t)n + 1) * sizeof *v->tok_lo);
    v->pre_toks = malloc(((size_t)v->n_vocab + 1) * sizeof *v->pre_toks);
    if (!v->tok_lo || !v->pre_toks) return -1;
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        v->tok_lo[i] = k;
        for (int32_t t = tr->tok[i]; t >= 0; t = v->tok_next[t]) v->pre_toks[k++] = (uint32_t)t;
    }
    v->tok_lo[n] = k;
    /* tokens by length, longest first (counting sort) */
    uint32_t max_len = 0;
    for (uint32_t t = 0; t < v->n_vocab; t++)
        if (v->off[t + 1] - v->off[t] > max_len) max_len = v->off[t + 1] - v->off[t];
    v->max_len = max_len;
    v->len_start = calloc((size_t)max_len + 2, sizeof *v->len_start);
    v->len_order = malloc(((size_t)k + 1) * sizeof *v->len_order);
    uint32_t *fill = calloc((size_t)max_len + 2, sizeof *fill);
    if (!v->len_start || !v->len_order || !fill) { free(fill); return -1; }
    for (uint32_t t = 0; t < v->n_vocab; t++) {
        uint32_t l = v->off[t + 1] - v->off[t];
        if (l) v->len_start[l - 1]++; /* for now: tokens of exactly l bytes */
    }
    for (uint32_t l = max_len + 1, acc = 0; l-- > 0;) { /* now: tokens longer than l */
        acc += v->len_start[l];
        v->len_start[l] = acc;
    }
    for (uint32_t t = 0; t < v->n_vocab; t++) {
        uint32_t l = v->off[t + 1] - v->off[t];
        if (l) v->len_order[v->len_start[l] + fill[l]++] = t; /* length l: [len_start[l], len_start[l - 1]) */
    }
    free(fill);
    /* Byte sets bottom-up (reverse preorder visits children first), then
     * interned by open addressing. */
    uint32_t *below = malloc(((size_t)n + 1) * sizeof *below);
    uint64_t (*set)[4] = calloc((size_t)n + 1, sizeof *set);
    uint32_t n_slots = 1024;
    while (n_slots < 2 * n + 2) n_slots *= 2;
    uint32_t *slots = calloc(n_slots, sizeof *slots);
    v->sets = malloc(sizeof *v->sets);
    int rc = below && set && slots && v->sets ? 0 : -1;
    if (!rc) {
        memset(v->sets[0], 0, sizeof v->sets[0]);
        v->n_sets = 1;
    }
    for (uint32_t i = n; i-- > 0 && !rc;)
        for (uint32_t c = i + 1; c < tr->end[i]; c = tr->end[c]) {
            uint8_t b = tr->byte[c];
            set[i][b >> 6] |= 1ull << (b & 63);
            for (int w = 0; w < 4; w++) set[i][w] |= set[c][w];
        }
    for (uint32_t i = 0; i < n && !rc; i++) {
        const uint64_t *x = set[i];
        below[i] = 0;
        if (!(x[0] | x[1] | x[2] | x[3])) continue;
        uint64_t h = (x[0] * 0x9E3779B97F4A7C15ull) ^ (x[1] * 0xC2B2AE3D27D4EB4Full) ^ (x[2] * 0x165667B19E3779F9ull) ^ x[3];
        h ^= h >> 29;
        uint32_t slot = (uint32_t)(h * 0xBF58476D1CE4E5B9ull >> 32) & (n_slots - 1);
        while (slots[slot] && memcmp(v->sets[slots[slot]], x, sizeof v->sets[0])) slot = (slot + 1) & (n_slots - 1);
        if (!slots[slot]) {
            if ((v->n_sets & (v->n_sets - 1)) == 0) { /* grow at powers of two */
                void *q = realloc(v->sets, (size_t)v->n_sets * 2 * sizeof *v->sets);
                if (!q) { rc = -1; break; }
                v->sets = q;
            }
            memcpy(v->sets[v->n_sets], x, sizeof v->sets[0]);
            slots[slot] = v->n_sets++;
        }
        below[i] = slots[slot];
    }
    free(set);
    free(slots);
    v->trie.below = below;
    return rc;
}

static di_status vocab_build(size_t n_vocab, const uint8_t *const *bytes, const size_t *lens,
                             int32_t eos_id, di_vocab **out, di_err *err) {
    *out = NULL;
    if (n_vocab == 0 || n_vocab > (1u << 24))
        return di_err_set(err, DI_ERR_INVALID_ARG, "vocabulary size %zu out of range [1, %u]", n_vocab, 1u << 24);
    if (eos_id >= (int64_t)n_vocab)
        return di_err_set(err, DI_ERR_INVALID_ARG, "eos id %d outside the vocabulary of %zu", eos_id, n_vocab);
    di_vocab *v = calloc(1, sizeof *v);
    if (!v) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    v->n_vocab = (uint32_t)n_vocab;
    v->eos_id = eos_id < 0 ? -1 : eos_id;
    v->off = calloc(n_vocab + 1, sizeof *v->off);
    v->tok_next = malloc(n_vocab * sizeof *v->tok_next);
    if (!v->off || !v->tok_next) goto nomem;
    size_t total = 0;
    for (size_t i = 0; i < n_vocab; i++) {
        size_t l = (bytes && bytes[i] && lens) ? lens[i] : 0;
        if ((int32_t)i == eos_id) l = 0; /* EOS is never text */
        if (l > VOCAB_MAX_TOKEN_BYTES) {
            di_vocab_free(v);
            return di_err_set(err, DI_ERR_INVALID_ARG, "token %zu has %zu bytes (limit %d)", i, l, VOCAB_MAX_TOKEN_BYTES);
        }
        total += l;
        v->off[i + 1] = (uint32_t)total;
        v->tok_next[i] = -1;
    }
    v->bytes = malloc(total ? total : 1);
    if (!v->bytes) goto nomem;
    for (size_t i = 0; i < n_vocab; i++)
        if (v->off[i + 1] > v->off[i]) memcpy(v->bytes + v->off[i], bytes[i], v->off[i + 1] - v->off[i]);
    /* Sort the tokens that have bytes, then lay the tries out in preorder. */
    uint32_t *ids = malloc(n_vocab * sizeof *ids);
    size_t n_ids = 0;
    if (!ids) goto nomem;
    for (size_t i = 0; i < n_vocab; i++)
        if (v->off[i + 1] > v->off[i]) ids[n_ids++] = (uint32_t)i;
    qsort_r(ids, n_ids, sizeof *ids, cmp_tok, v);
    int rc = trie_build(v, ids, n_ids, 1, &v->trie);
    for (int b = 0; b < 256; b++) v->root_child[b] = v->trie.n_nodes;
    for (uint32_t c = 0; !rc && c < v->trie.n_nodes; c = v->trie.end[c]) v->root_child[v->trie.byte[c]] = c;
    if (!rc) rc = text_slice(v, ids, n_ids);
    free(ids);
    if (rc || subtree_summaries(v) || quote_tokens(v)) goto nomem;
    di_mask_cache_init(&v->cache, (size_t)128 << 20);
    *out = v;
    return DI_OK;
nomem:
    di_vocab_free(v);
    return di_err_set(err, DI_ERR_NOMEM, "out of memory building the vocabulary trie");
}

di_status di_vocab_create(size_t n_vocab, const uint8_t *const *bytes, const size_t *lens,
                          int32_t eos_id, di_vocab **out) {
    di_err err = {0};
    di_status st = vocab_build(n_vocab, bytes, lens, eos_id, out, &err);
    return st ? di_err_publish(&err) : DI_OK;
}

size_t di_vocab_size(const di_vocab *v) { return v ? v->n_vocab : 0; }
