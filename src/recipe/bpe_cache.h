/* Per-thread cache of short pre-tokens and their BPE ids, kept across
 * encode calls (HF tokenizers keeps a word cache for the same reason: most
 * words of a text were seen before). Direct-mapped and owned by one thread,
 * so it needs no lock; a tokenizer tags its entries with its serial number,
 * and a thread switching tokenizers starts its cache afresh. */
#ifndef DI_RECIPE_BPE_CACHE_H
#define DI_RECIPE_BPE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#define DI_BPE_CACHE_BYTES 22 /* longest piece kept */
#define DI_BPE_CACHE_IDS 8    /* most ids kept for one piece */

typedef struct di_bpe_cache_slot {
    uint32_t hash;
    uint8_t len;                       /* 0 = empty */
    uint8_t n_ids;
    uint8_t bytes[DI_BPE_CACHE_BYTES]; /* [len] */
    int32_t ids[DI_BPE_CACHE_IDS];     /* [n_ids] */
} di_bpe_cache_slot;

typedef struct di_bpe_cache di_bpe_cache;

/* A new serial number for a tokenizer (never 0). */
uint64_t di_bpe_cache_serial(void);

/* The calling thread's cache, emptied if it last served another tokenizer;
 * NULL when it cannot be allocated (encoding then runs without it). */
di_bpe_cache *di_bpe_cache_get(uint64_t serial);

/* The slot a piece with this hash maps to. */
di_bpe_cache_slot *di_bpe_cache_slot_of(di_bpe_cache *c, uint32_t hash);

#endif
