/* Byte-level automata for lexemes: a Thompson NFA builder (what the regex
 * front end emits into) and deterministic automata built from it by subset
 * construction, plus products (intersection, difference) and trimming.
 *
 * Spec: ecosystem.md §1.4 (byte-level lexemes over the vocabulary's raw
 * token bytes). Every DFA is trimmed: a state that cannot reach an accepting
 * state is merged into state 0, the dead state, so "next state != 0" means
 * "this prefix can still be completed" — the matcher relies on that. */
#ifndef DI_GRAMMAR_DFA_H
#define DI_GRAMMAR_DFA_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* ------------------------------------------------------ key interning */

/* Interns variable-length uint32 keys (sorted NFA state sets, state pairs,
 * trie nodes) to dense ids 0, 1, ... with an open-addressing hash table. */
typedef struct di_key_table {
    uint32_t *pool;      /* concatenated keys */
    size_t pool_n, pool_cap;
    size_t *off;         /* [n + 1] key offsets into pool */
    uint32_t n, cap_ids;
    uint32_t *slots;     /* hash slots: id + 1, 0 = empty */
    uint32_t n_slots;
} di_key_table;

/* Returns the id of key k (kn entries), inserting it (*fresh = 1) when new;
 * UINT32_MAX when out of memory. A zeroed table is empty. */
uint32_t di_key_table_intern(di_key_table *t, const uint32_t *k, size_t kn, int *fresh);
void di_key_table_free(di_key_table *t);

/* ------------------------------------------------------------------ NFA */

enum { DI_NFA_EPS = 0, DI_NFA_RANGE = 1, DI_NFA_MATCH = 2 };

typedef struct di_nfa_state {
    uint8_t kind;      /* DI_NFA_EPS / DI_NFA_RANGE / DI_NFA_MATCH */
    uint8_t lo, hi;    /* byte range for DI_NFA_RANGE */
    /* 1: the language from this state contains every continuation any
     * other state could take (a trailing "anything" loop), so a DFA state
     * holding it is reduced to it — keeps unanchored searches small. */
    uint8_t universal;
    uint32_t out;      /* next state (UINT32_MAX = none) */
    uint32_t out2;     /* second epsilon edge (UINT32_MAX = none) */
} di_nfa_state;

typedef struct di_nfa {
    di_nfa_state *states; /* [n] */
    uint32_t n, cap;
    uint32_t max_states;  /* limit: exceeding it is DI_ERR_LIMIT */
    uint32_t start;
} di_nfa;

#define DI_NFA_NONE UINT32_MAX

void di_nfa_init(di_nfa *nfa, uint32_t max_states);
void di_nfa_free(di_nfa *nfa);
/* Appends a state; returns its index or DI_NFA_NONE when the limit is hit. */
uint32_t di_nfa_add(di_nfa *nfa, uint8_t kind, uint8_t lo, uint8_t hi, uint32_t out, uint32_t out2);

/* ------------------------------------------------------------------ DFA */

typedef struct di_dfa {
    uint32_t n_states;     /* state 0 is the dead state */
    uint32_t n_classes;    /* byte equivalence classes */
    uint8_t byte_class[256];
    uint32_t *trans;       /* [n_states, n_classes] next state */
    uint8_t *accept;       /* [n_states] 1 = accepting */
    uint32_t start;        /* 0 when the language is empty */
} di_dfa;

static inline uint32_t di_dfa_step(const di_dfa *d, uint32_t s, uint8_t b) {
    return d->trans[(size_t)s * d->n_classes + d->byte_class[b]];
}

/* Work bound of building one automaton, whatever its state limit. A step is
 * one cell of the transition table (a state times a byte class) or, in
 * subset construction, one NFA state read or reached. It bounds the time
 * (about half a second at most here) and the memory (the table and the
 * interned subsets hold at most 4 bytes per step each) that one pattern can
 * take: without it a small pattern such as (x?){10000} (quadratic subsets)
 * or \W{1400} (448,000 states of 113 classes) compiles for seconds into
 * hundreds of MB. Past it a build fails with DI_ERR_LIMIT, "pattern too
 * complex". The largest automata of the MaskBench and JSON-Schema-Test-Suite
 * schemas take 1.0 M steps (subsets) and 5.3 M (products). */
#define DI_DFA_MAX_WORK ((uint64_t)1 << 24)

/* Subset construction; fails with DI_ERR_LIMIT past max_states states or
 * max_work steps (DI_DFA_MAX_WORK at most). */
di_status di_dfa_from_nfa(const di_nfa *nfa, uint32_t max_states, uint64_t max_work, di_dfa *out, di_err *err);
/* out = a ∩ b (diff = 0) or a \ b (diff = 1), trimmed; DI_ERR_LIMIT past
 * max_states or DI_DFA_MAX_WORK. */
di_status di_dfa_product(const di_dfa *a, const di_dfa *b, int diff, uint32_t max_states,
                         di_dfa *out, di_err *err);
/* Bounded repetition by counting: u is the DFA of open (unit)* close, with
 * `boundary` the state between units (entered once per completed unit);
 * out accepts the strings of u with between min and max units.
 * Much cheaper than unrolling {min,max} through subset construction. */
di_status di_dfa_count_units(const di_dfa *u, uint32_t boundary, uint32_t min, uint32_t max, uint32_t max_states,
                             di_dfa *out, di_err *err);
/* Makes the empty string not accepted (a fresh non-accepting start state). */
di_status di_dfa_drop_empty(di_dfa *d, di_err *err);
/* Full match of a byte string. */
int di_dfa_matches(const di_dfa *d, const uint8_t *s, size_t n);
int di_dfa_is_empty(const di_dfa *d);
/* 1 when a and b accept a common string. */
int di_dfa_intersects(const di_dfa *a, const di_dfa *b);
void di_dfa_free(di_dfa *d);

#endif
