/* The vocabulary as a byte trie laid out flat in depth-first order, which
 * the mask computation walks, skipping whole subtrees whose common prefix
 * the grammar rejects, plus the summaries that let a walk take whole
 * subtrees or the text slice without visiting them.
 * Spec: ecosystem.md §1.1 (token trie, slicer) and §1.4. */
#ifndef DI_GRAMMAR_VOCAB_H
#define DI_GRAMMAR_VOCAB_H

#include <stdint.h>

#include "deepinfer.h"
#include "grammar/dfa.h"
#include "grammar/mask_cache.h"

/* A byte trie in preorder, one array per field (the mask walks stream
 * through them). */
typedef struct di_trie {
    uint32_t n_nodes;
    uint8_t *byte;         /* [n_nodes] */
    uint16_t *depth;       /* [n_nodes] 1-based */
    uint32_t *end;         /* [n_nodes] the subtree of node i is [i, end[i]) */
    int32_t *tok;          /* [n_nodes] first token ending here (more: tok_next), -1 none */
    uint32_t *below;       /* [n_nodes] full trie: id of the byte set strictly below (sets) */
    uint32_t *full;        /* [n_nodes] rest trie: the same node in the full trie */
} di_trie;

struct di_vocab {
    uint32_t n_vocab;      /* logits-sized: ids without bytes are never allowed */
    int32_t eos_id;        /* -1 if none */
    uint8_t *bytes;        /* [off[n_vocab]] concatenated token bytes */
    uint32_t *off;         /* [n_vocab + 1] */
    int32_t *tok_next;     /* [n_vocab] next token with the same bytes, -1 none */
    di_trie trie;          /* every token with bytes */
    uint32_t root_child[256]; /* the trie's first-level node for each byte (n_nodes: none) */
    /* Every token of the subtree of trie node i, in preorder:
     * pre_toks[tok_lo[i] .. tok_lo[trie.end[i]]). Lets a walk allow a whole
     * subtree without visiting it. */
    uint32_t *pre_toks;    /* [tok_lo[n_nodes]] */
    uint32_t *tok_lo;      /* [trie.n_nodes + 1] */
    /* Distinct byte sets found below a node (256 bits each, set 0 empty):
     * when every byte below a node keeps the lexer in its state, the walk
     * takes the subtree whole. */
    uint64_t (*sets)[4];   /* [n_sets] */
    uint32_t n_sets;
    /* Tokens by length, longest first: the len_start[l] tokens longer than
     * l bytes are len_order[0 .. len_start[l]). */
    uint32_t max_len;
    uint32_t *len_order;   /* [tokens with bytes] */
    uint32_t *len_start;   /* [max_len + 2] */
    /* The text slice: tokens made of whole string-body characters (valid
     * UTF-8, U+0020 and up, neither '"' nor '\'), about 97 % of a real
     * vocabulary. A lexer state that every such character loops back to
     * allows all of them at once; only the rest trie (the other tokens) is
     * walked. with_tok lists, per ASCII byte b, the text tokens holding b
     * (re-checked one by one when the state does not loop on b). */
    uint32_t *text_bits;   /* [(n_vocab + 31) / 32] */
    di_trie rest;          /* tokens outside the text slice */
    uint32_t *with_off;    /* [129] */
    uint32_t *with_tok;    /* [with_off[128]] */
    /* Tokens holding '"', most quotes first: the quote_start[c] tokens with
     * at least c quotes (c < 8; 7 counts "7 or more") are
     * quote_toks[0 .. quote_start[c]). Only these can complete an object
     * key, which the repeated-key check re-reads. */
    uint32_t *quote_toks;
    uint32_t quote_start[8];
    /* Tokens without '"' that may end where an object key is due (a ','
     * then whitespace only), which the dead-end check of repeated keys
     * re-reads. */
    uint32_t *sep_toks, n_sep;
    uint32_t *qc_toks, n_qc; /* tokens with a ',' after a '"' (from inside a string value, only these reach a key) */
    /* [n_vocab] DI_TOK_*: tokens that end a value and put a ',' in the same
     * container, whatever else they hold, so share one dead-end verdict */
    uint8_t *tok_flags;
    uint16_t *quote_at;    /* [n_vocab] offset of the first '"' (UINT16_MAX: none) */
    /* Lexer-only mask parts keyed by lexeme text (the same string or
     * number lexeme in any grammar compiled against this vocabulary). */
    di_mask_cache cache;
};

enum {
    DI_TOK_COMMA = 1,       /* no '"', '\\', brackets or braces; one ',' then whitespace only */
    DI_TOK_QUOTE_COMMA = 2, /* no '\\', brackets or braces; one '"', right before one ',' then whitespace */
    DI_TOK_ESC_HEAD = 4,    /* a '\\' before the first '"' */
    DI_TOK_OPEN_KEY = 8,    /* whitespace and ',' only, one '"', then neither '"' nor '\\' */
    DI_TOK_HAS_COMMA = 16,  /* holds a ',' */
    DI_TOK_QUOTE_FIRST = 32, /* the first byte that is not whitespace is '"' */
};

/* Walks the whole trie with one lexeme alone (automaton d from state st):
 * a token is allowed when the lexeme is alive or complete after it. Nodes
 * where the lexeme can end and that have children are recorded as split
 * nodes (the parser decides what may follow there). For a proxy
 * (exact = 0), whose lexeme ends may differ from the real one's, every node
 * where it can end is recorded instead and its subtree left out. Returns a
 * new entry (key and hash unset) or NULL when out of memory. */
di_mask_entry *di_vocab_lexer_walk(const di_vocab *v, const di_dfa *d, uint32_t st, int exact);
/* 1 when automaton d from state st is still alive after token tok's bytes. */
int di_vocab_token_alive(const di_vocab *v, const di_dfa *d, uint32_t st, uint32_t tok);

#endif
