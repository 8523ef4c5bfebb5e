/* The vocabulary as a byte trie laid out flat in depth-first order, which
 * the mask computation walks, skipping whole subtrees whose common prefix
 * the grammar rejects. Spec: ecosystem.md §1.1 (token trie) and §1.4. */
#ifndef DI_GRAMMAR_VOCAB_H
#define DI_GRAMMAR_VOCAB_H

#include <stdint.h>

#include "deepinfer.h"
#include "grammar/mask_cache.h"

struct di_vocab {
    uint32_t n_vocab;      /* logits-sized: ids without bytes are never allowed */
    int32_t eos_id;        /* -1 if none */
    uint8_t *bytes;        /* [off[n_vocab]] concatenated token bytes */
    uint32_t *off;         /* [n_vocab + 1] */
    /* trie, preorder; node i's subtree is [i, node_end[i]) */
    uint32_t n_nodes;
    uint8_t *node_byte;    /* [n_nodes] */
    uint16_t *node_depth;  /* [n_nodes] 1-based depth */
    uint32_t *node_end;    /* [n_nodes] */
    int32_t *node_tok;     /* [n_nodes] first token ending here, -1 none */
    int32_t *tok_next;     /* [n_vocab] next token with the same bytes, -1 none */
    /* Lexer-only mask parts keyed by lexeme text (the same string or
     * number lexeme in any grammar compiled against this vocabulary). */
    di_mask_cache cache;
};

#endif
