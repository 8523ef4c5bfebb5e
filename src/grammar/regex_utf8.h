/* Character sets of the regex front end → byte-level NFA fragments.
 * Spec: ecosystem.md §1.1 (character classes), §1.4 (byte-level lexemes).
 *
 * A set of code points is matched one UTF-8 (or canonical JSON string)
 * encoding at a time. Written as one byte chain per encoded range, a large
 * Unicode class such as \W or [^a-z] is thousands of chains, and every
 * deterministic state that can start such a character then carries all of
 * their heads: subset construction slows down by that factor and keeps
 * many distinct subsets for the same language. So the encodings are built
 * as a byte trie first (equal leading byte ranges shared), and its equal
 * subtrees are emitted once (shared suffixes, e.g. one "[80-BF]{2}" tail for
 * every three-byte lead): the fragment is deterministic and minimal for
 * the set, a few hundred NFA states for the largest classes. */
#ifndef DI_GRAMMAR_REGEX_UTF8_H
#define DI_GRAMMAR_REGEX_UTF8_H

#include <stdint.h>

#include "grammar/dfa.h"

typedef struct di_cp_range { uint32_t lo, hi; } di_cp_range;

#define DI_UTF8_LEAF UINT32_MAX

/* A character set as a small acyclic byte automaton: built once per set,
 * written into the NFA at each use (a counted repeat of a class writes it
 * many times). */
typedef struct di_utf8_class {
    uint32_t n_nodes;        /* nodes in post-order (children first); 0: the empty set */
    uint32_t root;           /* the node where a character starts */
    uint32_t *node_off;      /* [n_nodes + 1] each node's edges in edges[] */
    struct di_utf8_edge {
        uint32_t lohi;       /* byte range lo << 8 | hi */
        uint32_t child;      /* next node, or DI_UTF8_LEAF: the character is complete */
    } *edges;
    uint32_t *entry;         /* [n_nodes] scratch of di_utf8_class_emit */
    uint32_t nfa_states;     /* NFA states one emission adds */
} di_utf8_class;

/* Builds the automaton of the code point ranges r[0..n) (any order,
 * surrogates skipped). json = 1: each character in its one canonical
 * encoding inside a JSON string (short escapes, \u00xx for the other
 * control characters, \" and \\). Deterministic and minimal when the ranges
 * do not overlap. DI_ERR_NOMEM is the only failure. */
di_status di_utf8_class_init(di_utf8_class *c, const di_cp_range *r, uint32_t n, int json, di_err *err);
void di_utf8_class_free(di_utf8_class *c);

/* Writes the class into nfa, going on at next after a character; returns
 * its entry state (one with no way forward for the empty set), or
 * DI_NFA_NONE with err set (DI_ERR_LIMIT) when the NFA is full. */
uint32_t di_utf8_class_emit(di_utf8_class *c, di_nfa *nfa, uint32_t next, di_err *err);

/* Adds a chain matching the bytes s[0..len) then going on at next; DI_NFA_NONE
 * with err set when the NFA is full. */
uint32_t di_utf8_bytes_emit(di_nfa *nfa, const char *s, uint32_t len, uint32_t next, di_err *err);

#endif
