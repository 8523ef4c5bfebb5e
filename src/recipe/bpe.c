/* Byte-level BPE merging (ecosystem.md §2.1). */
#include "recipe/bpe.h"

#include <stdlib.h>
#include <string.h>

#define NO_RANK UINT32_MAX
#define LINEAR_MAX 48 /* words up to this many bytes use the linear scan */

static inline size_t pair_slot(uint64_t key, size_t mask) {
    key ^= key >> 29;
    key *= 0x9E3779B97F4A7C15ull;
    return (size_t)(key >> 17) & mask;
}

static inline uint64_t pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

di_status di_bpe_init(di_bpe *bpe, size_t n_merges, di_err *err) {
    memset(bpe, 0, sizeof *bpe);
    for (int i = 0; i < 256; i++) bpe->byte_id[i] = -1;
    size_t cap = 64;
    while (cap < n_merges * 2 + 1) cap *= 2;
    bpe->keys = malloc(cap * sizeof *bpe->keys);
    bpe->rank = malloc(cap * sizeof *bpe->rank);
    bpe->merged = malloc(cap * sizeof *bpe->merged);
    if (!bpe->keys || !bpe->rank || !bpe->merged) {
        di_bpe_free(bpe);
        return di_err_set(err, DI_ERR_NOMEM, "BPE merge table of %zu merges: out of memory",
                          n_merges);
    }
    memset(bpe->keys, 0xFF, cap * sizeof *bpe->keys);
    bpe->cap = cap;
    return DI_OK;
}

void di_bpe_free(di_bpe *bpe) {
    free(bpe->keys);
    free(bpe->rank);
    free(bpe->merged);
    bpe->keys = NULL;
    bpe->rank = NULL;
    bpe->merged = NULL;
    bpe->cap = bpe->count = 0;
}

void di_bpe_add(di_bpe *bpe, int32_t left, int32_t right, int32_t merged, uint32_t rank) {
    uint64_t key = pair_key(left, right);
    size_t mask = bpe->cap - 1, s = pair_slot(key, mask);
    while (bpe->keys[s] != UINT64_MAX && bpe->keys[s] != key) s = (s + 1) & mask;
    if (bpe->keys[s] == UINT64_MAX) bpe->count++;
    bpe->keys[s] = key;
    bpe->rank[s] = rank;
    bpe->merged[s] = merged;
}

/* Rank of merging (a, b), NO_RANK when no merge exists; *merged gets the id. */
static inline uint32_t pair_rank(const di_bpe *bpe, int32_t a, int32_t b, int32_t *merged) {
    uint64_t key = pair_key(a, b);
    size_t mask = bpe->cap - 1, s = pair_slot(key, mask);
    for (;;) {
        uint64_t k = bpe->keys[s];
        if (k == key) {
            *merged = bpe->merged[s];
            return bpe->rank[s];
        }
        if (k == UINT64_MAX) return NO_RANK;
        s = (s + 1) & mask;
    }
}

void di_bpe_scratch_free(di_bpe_scratch *s) {
    free(s->mem);
    s->mem = NULL;
    s->cap = 0;
}

static size_t merge_linear(const di_bpe *bpe, int32_t *ids, size_t m) {
    uint32_t ranks[LINEAR_MAX];
    int32_t news[LINEAR_MAX];
    for (size_t k = 0; k + 1 < m; k++) ranks[k] = pair_rank(bpe, ids[k], ids[k + 1], &news[k]);
    while (m > 1) {
        size_t best = 0;
        for (size_t k = 1; k + 1 < m; k++)
            if (ranks[k] < ranks[best]) best = k;
        if (ranks[best] == NO_RANK) break;
        ids[best] = news[best];
        memmove(ids + best + 1, ids + best + 2, (m - best - 2) * sizeof *ids);
        memmove(ranks + best, ranks + best + 1, (m - best - 2) * sizeof *ranks);
        memmove(news + best, news + best + 1, (m - best - 2) * sizeof *news);
        m--;
        if (best + 1 < m) ranks[best] = pair_rank(bpe, ids[best], ids[best + 1], &news[best]);
        if (best > 0) ranks[best - 1] = pair_rank(bpe, ids[best - 1], ids[best], &news[best - 1]);
    }
    return m;
}

/* Heap of candidate merges keyed by (rank, position). */
typedef struct cand {
    uint32_t rank;
    uint32_t pos;
    int32_t merged;
} cand;

static inline int cand_less(const cand *a, const cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(cand *h, size_t *n, cand c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n) {
    cand top = h[0], last = h[--*n];
    size_t i = 0, len = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= len) break;
        if (c + 1 < len && cand_less(&h[c + 1], &h[c])) c++;
        if (!cand_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (len) h[i] = last;
    return top;
}

/* The same merge order with a heap over a linked list of symbols: a popped
 * candidate is used only if its left symbol is alive, has a right neighbour,
 * and that pair still merges into the candidate's token. */
static size_t merge_heap(const di_bpe *bpe, int32_t *ids, size_t m, di_bpe_scratch *sc) {
    /* Each merge pushes at most two candidates: m - 1 initial + 2 (m - 1). */
    size_t need = m * (2 * sizeof(int32_t)) + 3 * m * sizeof(cand);
    if (sc->cap < need) {
        void *p = realloc(sc->mem, need);
        if (!p) return (size_t)-1;
        sc->mem = p;
        sc->cap = need;
    }
    cand *heap = sc->mem;
    int32_t *prev = (int32_t *)(heap + 3 * m), *next = prev + m;
    size_t nh = 0;
    for (size_t k = 0; k < m; k++) {
        prev[k] = (int32_t)k - 1;
        next[k] = k + 1 < m ? (int32_t)k + 1 : -1;
    }
    for (size_t k = 0; k + 1 < m; k++) {
        int32_t mg;
        uint32_t r = pair_rank(bpe, ids[k], ids[k + 1], &mg);
        if (r != NO_RANK) heap_push(heap, &nh, (cand){r, (uint32_t)k, mg});
    }
    while (nh) {
        cand c = heap_pop(heap, &nh);
        size_t pos = c.pos;
        if (ids[pos] < 0 || next[pos] < 0) continue;
        int32_t right = next[pos], mg;
        if (pair_rank(bpe, ids[pos], ids[right], &mg) == NO_RANK || mg != c.merged) continue;
        ids[pos] = mg;
        ids[right] = -1;
        next[pos] = next[right];
        if (next[pos] >= 0) prev[next[pos]] = (int32_t)pos;
        uint32_t r;
        if (prev[pos] >= 0 && (r = pair_rank(bpe, ids[prev[pos]], mg, &c.merged)) != NO_RANK)
            heap_push(heap, &nh, (cand){r, (uint32_t)prev[pos], c.merged});
        if (next[pos] >= 0 && (r = pair_rank(bpe, mg, ids[next[pos]], &c.merged)) != NO_RANK)
            heap_push(heap, &nh, (cand){r, (uint32_t)pos, c.merged});
    }
    size_t out = 0;
    for (size_t k = 0; k < m; k++)
        if (ids[k] >= 0) ids[out++] = ids[k];
    return out;
}

size_t di_bpe_word(const di_bpe *bpe, const uint8_t *bytes, size_t n, int32_t *out,
                   di_bpe_scratch *scratch) {
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        int32_t id = bpe->byte_id[bytes[k]];
        if (id >= 0) out[m++] = id;
    }
    if (m < 2) return m;
    return m <= LINEAR_MAX ? merge_linear(bpe, out, m) : merge_heap(bpe, out, m, scratch);
}
