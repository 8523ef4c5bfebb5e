/* Internals shared by the constraint front ends and the matcher.
 * Spec: ecosystem.md §1.4. */
#ifndef DI_GRAMMAR_GRAMMAR_H
#define DI_GRAMMAR_GRAMMAR_H

#include "deepinfer.h"
#include "grammar/cfg.h"
#include "grammar/mask_cache.h"
#include "grammar/vocab.h"

struct di_grammar {
    di_cfg cfg;
    const di_vocab *vocab;
    di_grammar_options opts;
    di_mask_cache cache;    /* mutable memo behind a lock; see mask_cache.h */
    int json_keys;          /* JSON output: the matcher refuses repeated object keys (json_keys.h) */
};

/* Front ends: each fills g (already initialised with the limits) and
 * returns the start nonterminal in *root. */
di_status di_json_schema_build(di_cfg *g, const char *text, size_t len, const di_grammar_options *opts,
                               uint32_t *root, di_err *err);
di_status di_json_any_object_build(di_cfg *g, const di_grammar_options *opts, uint32_t *root, di_err *err);
di_status di_ebnf_build(di_cfg *g, const char *text, size_t len, uint32_t *root, di_err *err);

/* Line:column (1-based) of byte offset pos in text. */
void di_text_position(const char *text, size_t len, size_t pos, int *line, int *col);

#endif
