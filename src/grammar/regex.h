/* Regular expressions (the ECMA-262 subset JSON Schema `pattern` uses) →
 * byte automata. Spec: ecosystem.md §1.1 (regex features) and §1.4.
 *
 * Supported: literals (UTF-8), `.`, classes with ranges and negation,
 * \d \w \s \D \W \S, \xHH \uHHHH \u{H…} \cX \0 \n \r \t \f \v, groups
 * (capturing, (?:…), (?<name>…)), alternation, * + ? {n} {n,} {n,m} (lazy
 * forms too: same language), and ^ / $ at the edges of top-level branches.
 * Refused with an error naming the construct: backreferences, lookaround,
 * word boundaries, \p{…} classes, anchors elsewhere.
 *
 * Character classes are chosen so that the accepted language is a subset of
 * what both ECMA-262 and Python's `re` accept: \d is [0-9], \w is ASCII, and
 * the negated forms exclude every character either dialect counts as a
 * digit / word / space character. */
#ifndef DI_GRAMMAR_REGEX_H
#define DI_GRAMMAR_REGEX_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/dfa.h"

enum {
    /* Search semantics (as JSON Schema `pattern`): a branch not anchored
     * with ^ / $ may be preceded / followed by anything. Without it the
     * whole input must match and anchors are no-ops. */
    DI_RX_SEARCH = 1,
    /* The pattern constrains the *decoded* content of a JSON string: the
     * automaton matches the quoted literal, each character in its one
     * canonical JSON encoding (raw UTF-8, short escapes, \u00xx for the
     * other control characters). */
    DI_RX_JSON_STRING = 2,
};

/* Compiles pattern (UTF-8, len bytes) into a trimmed DFA. Errors name the
 * construct and its 1-based column. Every pattern is bounded the same way
 * (DI_ERR_LIMIT): at most max_states DFA states, 8 × max_states + 1024 NFA states
 * (checked from the pattern's shape before anything is built, so a counted
 * repetition such as (a{1000}){1000} is refused at once), and
 * DI_DFA_MAX_WORK steps of subset construction ("pattern too complex"). */
di_status di_regex_compile(const char *pattern, size_t len, unsigned flags, uint32_t max_states,
                           di_dfa *out, di_err *err);
/* The same with a smaller work bound (steps as in DI_DFA_MAX_WORK). */
di_status di_regex_compile_bounded(const char *pattern, size_t len, unsigned flags, uint32_t max_states,
                                   uint64_t max_work, di_dfa *out, di_err *err);

/* Writes s (n bytes) as a regex matching exactly s (metacharacters
 * escaped) into buf, NUL-terminated; returns the length needed
 * (snprintf-style). */
size_t di_regex_escape(const char *s, size_t n, char *buf, size_t cap);

#endif
