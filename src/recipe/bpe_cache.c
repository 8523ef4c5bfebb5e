/* Per-thread BPE piece cache (see bpe_cache.h). */
#include "recipe/bpe_cache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 16384 /* 1 MiB per thread */

struct di_bpe_cache {
    uint64_t serial;
    di_bpe_cache_slot slots[SLOTS];
};

static atomic_uint_fast64_t next_serial = 1;
static pthread_key_t key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static int key_ok;

static void key_init(void) { key_ok = pthread_key_create(&key, free) == 0; }

uint64_t di_bpe_cache_serial(void) { return atomic_fetch_add(&next_serial, 1); }

di_bpe_cache *di_bpe_cache_get(uint64_t serial) {
    pthread_once(&key_once, key_init);
    if (!key_ok) return NULL;
    di_bpe_cache *c = pthread_getspecific(key);
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) return NULL;
        if (pthread_setspecific(key, c)) {
            free(c);
            return NULL;
        }
    }
    if (c->serial != serial) {
        memset(c->slots, 0, sizeof c->slots);
        c->serial = serial;
    }
    return c;
}

di_bpe_cache_slot *di_bpe_cache_slot_of(di_bpe_cache *c, uint32_t hash) {
    return &c->slots[hash & (SLOTS - 1)];
}
