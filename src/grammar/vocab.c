/* Vocabulary byte trie. Spec: ecosystem.md §1.1, §1.4. */
#include "grammar/vocab.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

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

void di_vocab_free(di_vocab *v) {
    if (!v) return;
    if (v->cache.max_bytes) di_mask_cache_free(&v->cache);
    free(v->bytes);
    free(v->off);
    free(v->node_byte);
    free(v->node_depth);
    free(v->node_end);
    free(v->node_tok);
    free(v->tok_next);
    free(v);
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
    /* Sort the tokens that have bytes, then lay the trie out in preorder. */
    uint32_t *ids = malloc(n_vocab * sizeof *ids);
    size_t n_ids = 0;
    if (!ids) goto nomem;
    for (size_t i = 0; i < n_vocab; i++)
        if (v->off[i + 1] > v->off[i]) ids[n_ids++] = (uint32_t)i;
    qsort_r(ids, n_ids, sizeof *ids, cmp_tok, v);
    size_t cap = total + 1;
    v->node_byte = malloc(cap);
    v->node_depth = malloc(cap * sizeof *v->node_depth);
    v->node_end = malloc(cap * sizeof *v->node_end);
    v->node_tok = malloc(cap * sizeof *v->node_tok);
    uint32_t stack[VOCAB_MAX_TOKEN_BYTES + 1];
    if (!v->node_byte || !v->node_depth || !v->node_end || !v->node_tok) { free(ids); goto nomem; }
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
                int32_t first = v->node_tok[stack[sp - 1]];
                while (v->tok_next[first] >= 0) first = v->tok_next[first];
                v->tok_next[first] = (int32_t)t;
                continue;
            }
        }
        while (sp > lcp) v->node_end[stack[--sp]] = n;
        for (uint32_t d = lcp; d < l; d++) {
            v->node_byte[n] = b[d];
            v->node_depth[n] = (uint16_t)(d + 1);
            v->node_tok[n] = -1;
            stack[sp++] = n++;
        }
        v->node_tok[stack[sp - 1]] = (int32_t)t;
        prev = t;
    }
    while (sp) v->node_end[stack[--sp]] = n;
    v->n_nodes = n;
    di_mask_cache_init(&v->cache, (size_t)128 << 20);
    free(ids);
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
