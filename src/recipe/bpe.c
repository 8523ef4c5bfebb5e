/* Byte-level BPE merging (ecosystem.md §2.1). */
#include "recipe/bpe.h"

#include <stdlib.h>
#include <string.h>

#define NO_RANK UINT32_MAX
#define LINEAR_MAX 24 /* words up to this many bytes use the linear scan */

#define EMPTY UINT64_MAX

static inline uint64_t pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 20) | (uint32_t)b; /* 40 bits */
}

static inline size_t pair_slot(uint64_t key, size_t mask) {
    key *= 0x9E3779B97F4A7C15ull;
    return (size_t)(key >> 24) & mask;
}

#define FILTER_BITS (1u << 21)

static inline uint32_t filter_bit(uint64_t key) {
    return (uint32_t)((key * 0xD6E8FEB86659FD93ull) >> 43); /* 21 bits */
}

di_status di_bpe_init(di_bpe *bpe, size_t n_merges, di_err *err) {
    memset(bpe, 0, sizeof *bpe);
    for (int i = 0; i < 256; i++) bpe->byte_id[i] = -1;
    if (n_merges > DI_BPE_MAX_MERGES)
        return di_err_set(err, DI_ERR_LIMIT, "%zu merges: at most %d are supported", n_merges,
                          DI_BPE_MAX_MERGES);
    size_t cap = 64;
    while (cap < n_merges + n_merges / 3 + 1) cap *= 2;
    bpe->slots = malloc(cap * sizeof *bpe->slots);
    bpe->merged = malloc((n_merges ? n_merges : 1) * sizeof *bpe->merged);
    bpe->filter = calloc(FILTER_BITS / 64, sizeof *bpe->filter);
    if (!bpe->slots || !bpe->merged || !bpe->filter) {
        di_bpe_free(bpe);
        return di_err_set(err, DI_ERR_NOMEM, "BPE merge table of %zu merges: out of memory",
                          n_merges);
    }
    memset(bpe->slots, 0xFF, cap * sizeof *bpe->slots);
    bpe->cap = cap;
    bpe->n_ranks = n_merges;
    return DI_OK;
}

void di_bpe_free(di_bpe *bpe) {
    free(bpe->slots);
    free(bpe->merged);
    free(bpe->filter);
    free(bpe->byte_rank);
    bpe->slots = NULL;
    bpe->merged = NULL;
    bpe->filter = NULL;
    bpe->byte_rank = NULL;
    bpe->cap = bpe->n_ranks = 0;
}

void di_bpe_add(di_bpe *bpe, int32_t left, int32_t right, int32_t merged, uint32_t rank) {
    uint64_t key = pair_key(left, right);
    size_t mask = bpe->cap - 1, s = pair_slot(key, mask);
    while (bpe->slots[s] != EMPTY && (bpe->slots[s] >> 24) != key) s = (s + 1) & mask;
    bpe->slots[s] = key << 24 | rank;
    bpe->merged[rank] = merged;
    uint32_t f = filter_bit(key);
    bpe->filter[f >> 6] |= 1ull << (f & 63);
}

/* Rank of merging (a, b), NO_RANK when no merge exists. */
static inline uint32_t pair_rank(const di_bpe *bpe, int32_t a, int32_t b) {
    uint64_t key = pair_key(a, b);
    uint32_t f = filter_bit(key);
    if (!(bpe->filter[f >> 6] >> (f & 63) & 1)) return NO_RANK;
    size_t mask = bpe->cap - 1, s = pair_slot(key, mask);
    for (;;) {
        uint64_t v = bpe->slots[s];
        if ((v >> 24) == key) return (uint32_t)(v & 0xFFFFFF);
        if (v == EMPTY) return NO_RANK;
        s = (s + 1) & mask;
    }
}

static inline void prefetch_pair(const di_bpe *bpe, int32_t a, int32_t b) {
    uint64_t key = pair_key(a, b);
    uint32_t f = filter_bit(key);
    if (bpe->filter[f >> 6] >> (f & 63) & 1)
        __builtin_prefetch(&bpe->slots[pair_slot(key, bpe->cap - 1)]);
}

di_status di_bpe_finish(di_bpe *bpe, di_err *err) {
    bpe->byte_rank = malloc(256 * 256 * sizeof *bpe->byte_rank);
    if (!bpe->byte_rank) return di_err_set(err, DI_ERR_NOMEM, "BPE byte pairs: out of memory");
    for (int x = 0; x < 256; x++)
        for (int y = 0; y < 256; y++)
            bpe->byte_rank[x * 256 + y] = bpe->byte_id[x] < 0 || bpe->byte_id[y] < 0
                                              ? NO_RANK
                                              : pair_rank(bpe, bpe->byte_id[x], bpe->byte_id[y]);
    return DI_OK;
}

void di_bpe_scratch_free(di_bpe_scratch *s) {
    free(s->mem);
    s->mem = NULL;
    s->cap = 0;
}

static size_t merge_linear(const di_bpe *bpe, int32_t *ids, const uint8_t *kb, size_t m) {
    uint32_t ranks[LINEAR_MAX];
    for (size_t k = 0; k + 1 < m; k++) ranks[k] = bpe->byte_rank[kb[k] * 256 + kb[k + 1]];
    while (m > 1) {
        size_t best = 0;
        for (size_t k = 1; k + 1 < m; k++)
            if (ranks[k] < ranks[best]) best = k;
        if (ranks[best] == NO_RANK) break;
        ids[best] = bpe->merged[ranks[best]];
        for (size_t k = best + 1; k + 1 < m; k++) {
            ids[k] = ids[k + 1];
            ranks[k - 1] = ranks[k];
        }
        m--;
        /* Start both probes' loads before waiting on either. */
        if (best + 1 < m) prefetch_pair(bpe, ids[best], ids[best + 1]);
        if (best > 0) prefetch_pair(bpe, ids[best - 1], ids[best]);
        if (best + 1 < m) ranks[best] = pair_rank(bpe, ids[best], ids[best + 1]);
        if (best > 0) ranks[best - 1] = pair_rank(bpe, ids[best - 1], ids[best]);
        /* The merged id is read only when a pair wins; fetch it meanwhile. */
        if (best + 1 < m && ranks[best] != NO_RANK) __builtin_prefetch(&bpe->merged[ranks[best]]);
        if (best > 0 && ranks[best - 1] != NO_RANK)
            __builtin_prefetch(&bpe->merged[ranks[best - 1]]);
    }
    return m;
}

/* Heap of candidate merges keyed by (rank, position). */
typedef struct cand {
    uint32_t rank;
    uint32_t pos;
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
 * and that pair still has the candidate's rank. (HF compares the merged ids;
 * for a fixed left position the two tests agree, because symbols only grow:
 * an equal merged token over the same span implies the same pair.) */
static size_t merge_heap(const di_bpe *bpe, int32_t *ids, const uint8_t *kb, size_t m,
                         di_bpe_scratch *sc) {
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
        uint32_t r = bpe->byte_rank[kb[k] * 256 + kb[k + 1]];
        if (r != NO_RANK) heap_push(heap, &nh, (cand){r, (uint32_t)k});
    }
    while (nh) {
        cand c = heap_pop(heap, &nh);
        size_t pos = c.pos;
        if (ids[pos] < 0 || next[pos] < 0) continue;
        int32_t right = next[pos];
        if (pair_rank(bpe, ids[pos], ids[right]) != c.rank) continue;
        int32_t mg = bpe->merged[c.rank];
        ids[pos] = mg;
        ids[right] = -1;
        next[pos] = next[right];
        if (next[pos] >= 0) prev[next[pos]] = (int32_t)pos;
        uint32_t r;
        if (prev[pos] >= 0 && (r = pair_rank(bpe, ids[prev[pos]], mg)) != NO_RANK)
            heap_push(heap, &nh, (cand){r, (uint32_t)prev[pos]});
        if (next[pos] >= 0 && (r = pair_rank(bpe, mg, ids[next[pos]])) != NO_RANK)
            heap_push(heap, &nh, (cand){r, (uint32_t)pos});
    }
    size_t out = 0;
    for (size_t k = 0; k < m; k++)
        if (ids[k] >= 0) ids[out++] = ids[k];
    return out;
}

size_t di_bpe_word(const di_bpe *bpe, const uint8_t *bytes, size_t n, int32_t *out,
                   di_bpe_scratch *scratch) {
    /* Bytes without a token are dropped (HF without an unk token); the
     * common case keeps them all and needs no copy. */
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        int32_t id = bpe->byte_id[bytes[k]];
        if (id >= 0) out[m++] = id;
    }
    const uint8_t *kb = bytes;
    uint8_t small[LINEAR_MAX], *kept = NULL;
    if (m < n) {
        kept = m <= LINEAR_MAX ? small : malloc(m);
        if (!kept) return (size_t)-1;
        for (size_t k = 0, j = 0; k < n; k++)
            if (bpe->byte_id[bytes[k]] >= 0) kept[j++] = bytes[k];
        kb = kept;
    }
    size_t r = m < 2 ? m
               : m <= LINEAR_MAX ? merge_linear(bpe, out, kb, m)
                                 : merge_heap(bpe, out, kb, m, scratch);
    if (kept != small) free(kept);
    return r;
}
