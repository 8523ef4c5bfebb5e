/* Memo of the lexer-only part of masks, per grammar and per vocabulary.
 * Spec: ecosystem.md §1.1 (xgrammar's adaptive token mask cache,
 * llguidance's slicer) and §1.4.
 *
 * For one lexer item (a lexeme in a DFA state), whether a token is allowed
 * depends on the lexeme alone as long as the lexeme does not end inside
 * the token. An entry holds the tokens the lexeme allows alone (alive or
 * complete after them) and the split nodes: trie nodes where the lexeme
 * can end with more bytes below, where the parser decides the rest.
 * Entries are immutable once published and never evicted (a memory cap
 * stops inserting), so readers need no lock after lookup. */
#ifndef DI_GRAMMAR_MASK_CACHE_H
#define DI_GRAMMAR_MASK_CACHE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct di_mask_entry {
    uint64_t hash;
    uint32_t *key;         /* [key_n] (terminal, state) pairs flattened */
    uint32_t key_n;
    uint32_t *bits;        /* [words] tokens allowed by the lexer alone, or NULL: */
    uint32_t *toks;        /* [n_toks] the same as a list when short */
    uint32_t n_toks;
    uint32_t *fallback;    /* [n_fallback] split nodes (for a proxy: subtrees to re-check) */
    uint32_t n_fallback;
} di_mask_entry;

typedef struct di_mask_cache {
    pthread_mutex_t lock;
    di_mask_entry **e;     /* [n] */
    uint32_t n, cap;
    uint32_t *slots;       /* [n_slots] open addressing by hash: entry index + 1, 0 empty */
    uint32_t n_slots;
    size_t bytes, max_bytes;
} di_mask_cache;

void di_mask_cache_init(di_mask_cache *c, size_t max_bytes);
void di_mask_cache_free(di_mask_cache *c);
const di_mask_entry *di_mask_cache_find(di_mask_cache *c, const uint32_t *key, uint32_t key_n, uint64_t hash);
/* Publishes e (takes ownership; frees it when over the cap or a duplicate)
 * and returns the published entry for key, or NULL if not kept. */
const di_mask_entry *di_mask_cache_put(di_mask_cache *c, di_mask_entry *e, size_t words);
void di_mask_entry_free(di_mask_entry *e);

#endif
