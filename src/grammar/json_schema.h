/* Internals shared by the JSON Schema front end's files: the compile
 * context, type bits, and the helpers the logic rewrites (json_schema_logic.c)
 * need from the compiler (json_schema.c). Spec: ecosystem.md §1.1, §1.4. */
#ifndef DI_GRAMMAR_JSON_SCHEMA_H
#define DI_GRAMMAR_JSON_SCHEMA_H

#include <cjson/cJSON.h>

#include "grammar/dfa.h"
#include "grammar/grammar.h"

typedef struct memo_ent {
    const cJSON *node;
    int32_t nt;
} memo_ent;

typedef struct js_ctx {
    di_cfg *g;
    const di_grammar_options *o;
    di_err *err;
    cJSON *doc;
    memo_ent *memo;
    uint32_t n_memo, cap_memo;
    cJSON *owned;          /* array owning merged / rewritten schemas */
    cJSON *true_schema;    /* `true`, for absent subschemas */
    int depth;
    int32_t any_value;     /* -1 until built */
    int int_zero_frac;     /* 1.0 counts as an integer (draft 6 and later) */
    di_sym t_lbrace, t_rbrace, t_lbrack, t_rbrack, t_comma, t_colon;
    char path[512];        /* JSON pointer of the schema being compiled, for messages */
    int nul_marker;        /* JS_NUL_MARKER in strings stands for NUL */
} js_ctx;

/* UTF-8 of U+10FFFF, which stands for NUL inside schema strings when the
 * schema text has "\u0000" escapes (and no U+10FFFF of its own). */
#define JS_NUL_MARKER "\xF4\x8F\xBF\xBF"

/* Instance types as bits; "number" is T_NUM | T_INT. */
enum { T_NULL = 1, T_BOOL = 2, T_OBJ = 4, T_ARR = 8, T_STR = 16, T_INT = 32, T_NUM = 64, T_ALL = 127 };

/* One character of a JSON string in any valid encoding (surrogate pairs as
 * one character, lone surrogates refused). */
#define STR_UNIT "([^\"\\\\\\x00-\\x1f]|\\\\[\"\\\\/bfnrt]|\\\\u([0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})|\\\\u[dD][89abAB][0-9a-fA-F]{2}\\\\u[dD][c-fC-F][0-9a-fA-F]{2})"

/* Sets the error and returns -1. */
int di_js_fail(js_ctx *c, di_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define FAIL di_js_fail
/* Hands x to the context (freed with it); returns x. */
cJSON *di_js_own(js_ctx *c, cJSON *x);
/* Whether keyword k constrains instances (supported or not). */
int di_js_is_constraint(const char *k);
/* Target of a local $ref, or NULL with the error set. */
const cJSON *di_js_resolve_ref(js_ctx *c, const char *ref);
/* Type bits allowed by s's `type` keyword (T_ALL when absent). */
int di_js_types_of(js_ctx *c, const cJSON *s, int *out);
/* Type bit of a JSON value (T_INT for integral numbers). */
int di_js_value_type(const cJSON *v);
/* Types an instance of s may have, following $ref / allOf / anyOf / enum. */
int di_js_possible_types(js_ctx *c, const cJSON *s, int depth);
/* 1 when no instance satisfies both a and b (a sufficient test). */
int di_js_disjoint(js_ctx *c, const cJSON *a, const cJSON *b);
/* Whether format `name` is one the compiler checks. */
int di_js_format_checked(const char *name);
/* di_regex_compile on regex text built from schema strings (NUL marker
 * translated). */
di_status di_js_regex_compile(const js_ctx *c, const char *pattern, size_t len, unsigned flags, uint32_t max_states,
                              di_dfa *out, di_err *err);
/* New nonterminal, or -1 with the error set. */
int32_t di_js_new_nt(js_ctx *c);
/* Symbol of a regex built from schema text (NUL marker translated). */
int di_js_regex_sym(js_ctx *c, const char *pat, unsigned flags, di_sym *out);
/* Adds lhs → s[0..n), -1 with the error set. */
int di_js_add_rule(js_ctx *c, int32_t lhs, const di_sym *s, uint32_t n);
/* Symbol of an exact byte string. */
int di_js_lit_sym(js_ctx *c, const char *s, di_sym *out);
/* Non-negative integer keyword `key` of s into *out (dflt when absent). */
int di_js_get_count(js_ctx *c, const cJSON *s, const char *key, long *out, long dflt);
/* Canonical-encoding automaton of the strings s allows (pattern(s), format,
 * lengths, x-di-not-patterns); *any = 1 when nothing constrains the content
 * (json_schema_string.c). */
int di_js_string_dfa(js_ctx *c, const cJSON *s, di_dfa *out, int *any);
/* Symbol of the strings s allows (json_schema_string.c). */
int di_js_string_sym(js_ctx *c, const cJSON *s, di_sym *out);
/* Symbol of the numbers schema s allows (json_schema_number.c). */
int di_js_number_sym(js_ctx *c, const cJSON *s, int integer_only, di_sym *out);
/* `type` array naming the types of mask t. */
cJSON *di_js_type_array(int t);

/* Returns s with `not`, a oneOf whose branches may overlap, if/then/else,
 * and dependencies / dependentRequired / dependentSchemas rewritten into
 * allOf / anyOf of schemas the compiler handles (s itself when it has none
 * of them), or NULL with an error naming what cannot be rewritten exactly. */
const cJSON *di_js_rewrite_logic(js_ctx *c, const cJSON *s);

#endif
