/* Per-grammar memo of "lexer-only" mask parts. Spec: ecosystem.md §1.1
 * (xgrammar's adaptive token mask cache, llguidance's slicer) and §1.4.
 *
 * Inside lexemes (a string, a number) a token's fate depends only on the
 * lexer configuration — the (lexeme, DFA state) pairs of the current scan
 * items — as long as no lexeme can end within the token. For each
 * configuration seen, the entry holds the bitset of tokens decided by the
 * lexer alone, and the trie nodes where some lexeme can end, whose subtrees
 * the parser still has to walk. Entries are immutable once published and
 * never evicted (a memory cap stops inserting), so readers need no lock
 * after lookup. */
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
    uint32_t *fallback;    /* [n_fallback] trie nodes the parser must walk */
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
