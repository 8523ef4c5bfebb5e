/* Memo of lexer-only mask parts. Spec: ecosystem.md §1.1, §1.4. */
#include "grammar/mask_cache.h"

#include <stdlib.h>
#include <string.h>

void di_mask_cache_init(di_mask_cache *c, size_t max_bytes) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    c->max_bytes = max_bytes;
}

void di_mask_entry_free(di_mask_entry *e) {
    if (!e) return;
    free(e->key);
    free(e->bits);
    free(e->toks);
    free(e->fallback);
    free(e);
}

void di_mask_cache_free(di_mask_cache *c) {
    for (uint32_t i = 0; i < c->n; i++) di_mask_entry_free(c->e[i]);
    free(c->e);
    free(c->slots);
    pthread_mutex_destroy(&c->lock);
    memset(c, 0, sizeof *c);
}

static const di_mask_entry *find_locked(di_mask_cache *c, const uint32_t *key, uint32_t key_n, uint64_t hash) {
    if (!c->n_slots) return NULL;
    for (uint32_t h = (uint32_t)(hash ^ (hash >> 32)) & (c->n_slots - 1);; h = (h + 1) & (c->n_slots - 1)) {
        uint32_t s = c->slots[h];
        if (!s) return NULL;
        const di_mask_entry *e = c->e[s - 1];
        if (e->hash == hash && e->key_n == key_n && !memcmp(e->key, key, key_n * sizeof *key)) return e;
    }
}

static int grow_slots(di_mask_cache *c) {
    uint32_t ns = c->n_slots ? c->n_slots * 2 : 256;
    uint32_t *sl = calloc(ns, sizeof *sl);
    if (!sl) return -1;
    for (uint32_t i = 0; i < c->n; i++) {
        uint64_t hash = c->e[i]->hash;
        uint32_t h = (uint32_t)(hash ^ (hash >> 32)) & (ns - 1);
        while (sl[h]) h = (h + 1) & (ns - 1);
        sl[h] = i + 1;
    }
    free(c->slots);
    c->slots = sl;
    c->n_slots = ns;
    return 0;
}

const di_mask_entry *di_mask_cache_find(di_mask_cache *c, const uint32_t *key, uint32_t key_n, uint64_t hash) {
    pthread_mutex_lock(&c->lock);
    const di_mask_entry *e = find_locked(c, key, key_n, hash);
    pthread_mutex_unlock(&c->lock);
    return e;
}

const di_mask_entry *di_mask_cache_put(di_mask_cache *c, di_mask_entry *e, size_t words) {
    size_t sz = (e->bits ? words * 4 : e->n_toks * 4) + e->n_fallback * 4 + e->key_n * 4 + sizeof *e;
    pthread_mutex_lock(&c->lock);
    const di_mask_entry *old = find_locked(c, e->key, e->key_n, e->hash);
    const di_mask_entry *res = old;
    if (!old && c->bytes + sz <= c->max_bytes) {
        if (c->n == c->cap) {
            uint32_t cap = c->cap ? c->cap * 2 : 64;
            di_mask_entry **ne = realloc(c->e, cap * sizeof *ne);
            if (ne) { c->e = ne; c->cap = cap; }
        }
        int room = c->n < c->cap && ((c->n + 1) * 2 <= c->n_slots || grow_slots(c) == 0);
        if (room) {
            uint32_t h = (uint32_t)(e->hash ^ (e->hash >> 32)) & (c->n_slots - 1);
            while (c->slots[h]) h = (h + 1) & (c->n_slots - 1);
            c->slots[h] = c->n + 1;
            c->e[c->n++] = e;
            c->bytes += sz;
            res = e;
            e = NULL;
        }
    }
    pthread_mutex_unlock(&c->lock);
    di_mask_entry_free(e);
    return res;
}
