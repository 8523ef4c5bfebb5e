/* The grammar IR every front end (regex, JSON Schema, EBNF, choices)
 * compiles to: a context-free grammar whose terminals are byte-level DFA
 * lexemes. Spec: ecosystem.md §1.4.
 *
 * Terminals never match the empty string (a nullable regex becomes a
 * nonterminal `X → ε | T`), so the Earley matcher only has to handle
 * nullable nonterminals, which it does by the Aycock–Horspool rule. */
#ifndef DI_GRAMMAR_CFG_H
#define DI_GRAMMAR_CFG_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "grammar/dfa.h"

/* A symbol: >= 0 nonterminal id, < 0 terminal -(id + 1). */
typedef int32_t di_sym;
#define DI_SYM_TERM(t) (-(di_sym)(t) - 1)
#define DI_SYM_IS_TERM(s) ((s) < 0)
#define DI_SYM_TERM_ID(s) ((uint32_t)(-(s) - 1))

typedef struct di_cfg_limits {
    uint32_t max_rules;         /* rules in the grammar */
    uint32_t max_symbols;       /* total right-hand-side length */
    uint32_t max_lexer_states;  /* DFA states over all terminals */
    uint32_t max_depth;         /* nesting depth the front ends may recurse into */
    double max_compile_ms;      /* wall-clock budget for compiling */
    uint32_t max_token_bytes;   /* longest vocabulary token (mask memo proxies) */
} di_cfg_limits;

typedef struct di_cfg_rule {
    uint32_t lhs;
    uint32_t off;   /* into rhs */
    uint32_t len;
} di_cfg_rule;

typedef struct di_cfg_term {
    di_dfa dfa;
    char *key;      /* interning key (pattern + flags), may be NULL */
    /* Mask memo proxy (-1: none): a terminal whose lexer-only walk from
     * proxy_state[s] gives the same token bitset as this one's from s, and
     * a superset of its lexeme-end nodes (which the parser re-checks). Used
     * for "any string except these keys", proxied by "any string". */
    int32_t proxy;
    uint32_t *proxy_state;  /* [dfa.n_states] UINT32_MAX: no proxy in that state */
    /* Bounded repetitions (NULL otherwise): how many more units state s may
     * take, capped at max_token_bytes + 1. A token of at most that many
     * bytes cannot reach the bound, so the proxy's verdict holds for it;
     * longer tokens are re-checked with this terminal's automaton. */
    uint32_t *proxy_room;   /* [dfa.n_states] */
} di_cfg_term;

typedef struct di_cfg {
    di_cfg_limits limits;
    uint32_t n_nts;
    di_cfg_rule *rules;     /* [n_rules] */
    uint32_t n_rules, cap_rules;
    di_sym *rhs;            /* [n_rhs] */
    uint32_t n_rhs, cap_rhs;
    di_cfg_term *terms;     /* [n_terms] */
    uint32_t n_terms, cap_terms;
    uint64_t lexer_states;  /* sum over terminals */
    /* after di_cfg_finalize: */
    uint32_t root;          /* user's start symbol */
    uint32_t start_rule;    /* the augmented rule S' → root */
    uint32_t *nt_rule_off;  /* [n_nts + 1] CSR of rules per lhs */
    uint32_t *nt_rules;     /* [n_rules] */
    uint8_t *nullable;      /* [n_nts] */
    double t0_ms;           /* compile start, for the time budget */
} di_cfg;

void di_cfg_init(di_cfg *g, const di_cfg_limits *limits);
void di_cfg_free(di_cfg *g);
/* New nonterminal id, or -1 (error set) past the rule limit. */
int32_t di_cfg_nt(di_cfg *g, di_err *err);
di_status di_cfg_rule_add(di_cfg *g, uint32_t lhs, const di_sym *syms, uint32_t n, di_err *err);
/* Adds a terminal (takes ownership of dfa) and returns a symbol for its
 * language: the terminal itself, or a nonterminal ε | T when the language
 * holds the empty string. An empty language gives a nonterminal with no
 * rules (pruned as unproductive by di_cfg_finalize). */
di_status di_cfg_dfa_sym(di_cfg *g, di_dfa *dfa, const char *key, di_sym *out, di_err *err);
/* Compiles a regex (interned by pattern + flags) and returns its symbol. */
di_status di_cfg_regex_sym(di_cfg *g, const char *pattern, unsigned flags, di_sym *out, di_err *err);
/* Terminal whose interning key is key, or -1. */
int32_t di_cfg_find_term(const di_cfg *g, const char *key);
/* Symbol for an exact byte string. */
di_status di_cfg_literal_sym(di_cfg *g, const char *s, size_t n, di_sym *out, di_err *err);
/* Makes terminal `proxy` the mask memo proxy of terminal `t`; t's DFA must
 * step like proxy's wherever t is alive (t's language a subset, with the
 * same liveness away from lexeme ends). With count_byte >= 0, t is a
 * bounded repetition of proxy's unit and proxy_room records how many times
 * count_byte can still be stepped from each state. */
di_status di_cfg_set_proxy(di_cfg *g, uint32_t t, uint32_t proxy, int count_byte, di_err *err);
/* Fails with DI_ERR_LIMIT when the compile-time budget is spent. */
di_status di_cfg_check_time(di_cfg *g, di_err *err);
/* Prunes unproductive rules, computes nullability and the rule index, and
 * adds the augmented start rule. Fails when root derives nothing. */
di_status di_cfg_finalize(di_cfg *g, uint32_t root, di_err *err);

double di_now_ms(void);

#endif
