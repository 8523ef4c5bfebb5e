/* Byte-level BPE tokenizer of the DeepSeek V3/V4 family, loaded from a
 * Hugging Face tokenizer.json (ecosystem.md §2.1-2.2, architecture.md §9.1).
 *
 * Internal view shared by the tokenizer's files (detokenizer, Engram map);
 * other modules use the public API in deepinfer.h. */
#ifndef DI_RECIPE_TOKENIZER_H
#define DI_RECIPE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "deepinfer.h"
#include "recipe/bpe.h"

/* Largest token id accepted from a file (the real vocabularies are ~2^17). */
#define DI_TOKENIZER_MAX_ID DI_BPE_MAX_ID

enum {
    DI_TOK_PRESENT = 1, /* the id names a token (ids may have holes) */
    DI_TOK_ADDED = 2,   /* listed in added_tokens */
    DI_TOK_SPECIAL = 4  /* added token with "special": true */
};

/* Trie over added-token spellings for leftmost-longest matching. */
typedef struct di_added_trie {
    struct di_trie_node *nodes; /* [n_nodes], node 0 = root */
    size_t n_nodes, cap;
    uint8_t first[256];         /* [256] 1 when some spelling starts with the byte */
    size_t n_tokens;
} di_added_trie;

struct di_tokenizer {
    uint64_t serial;       /* tags this tokenizer's entries in the piece caches */
    size_t n_ids;          /* largest id + 1 */
    uint8_t *flags;        /* [n_ids] DI_TOK_* */
    uint32_t *str_off;     /* [n_ids + 1] spelling of each id in tokenizer.json, in strs */
    char *strs;            /* spellings, each NUL-terminated */
    uint32_t *bytes_off;   /* [n_ids + 1] decoded bytes of each id, in bytes */
    uint8_t *bytes;        /* each NUL-terminated too */
    int32_t *str_index;    /* [str_cap] open-addressed spelling -> id, -1 = empty */
    size_t str_cap;
    di_bpe bpe;
    di_added_trie added[2]; /* [0] added tokens with normalized=false, [1] with true:
                               HF matches the first set before the second */
};

/* Loads from JSON text; `what` names the source in messages. */
di_status di_tokenizer_parse(const char *json, size_t len, const char *what, di_tokenizer **out,
                             di_err *err);

/* Spelling and decoded bytes of an id (id < n_ids and present). */
static inline const char *di_tokenizer_spelling(const di_tokenizer *t, int32_t id) {
    return t->strs + t->str_off[id];
}

/* Id of a spelling of n bytes, -1 when absent. */
int32_t di_tokenizer_lookup(const di_tokenizer *t, const char *s, size_t n);

#endif
