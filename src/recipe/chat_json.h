/* JSON values as the V4.1 chat format needs them (architecture.md §9.2).
 *
 * The prompt embeds tool schemas, response schemas and tool-call arguments
 * as JSON text, and the reference renderer prints them in one particular way
 * (Python's json.dumps spacing, non-ASCII kept, integers kept as written,
 * other numbers as Python's float repr). Matching it byte for byte needs what
 * a general-purpose parser throws away: whether a number was written as an
 * integer, and object members in their written order with a repeated key
 * keeping its first position and its last value. This small tree keeps both.
 * Parsing is strict RFC 8259 (valid UTF-8, no lone surrogates) with a depth
 * cap, so any untrusted text either parses or gets a line:column error. */
#ifndef DI_RECIPE_CHAT_JSON_H
#define DI_RECIPE_CHAT_JSON_H

#include <stddef.h>

#include "core/buf.h"
#include "core/error.h"

typedef enum di_jv_type {
    DI_JV_NULL,
    DI_JV_FALSE,
    DI_JV_TRUE,
    DI_JV_NUMBER,
    DI_JV_STRING,
    DI_JV_ARRAY,
    DI_JV_OBJECT
} di_jv_type;

typedef struct di_jv di_jv;
struct di_jv {
    di_jv_type type;
    char *str;      /* STRING: decoded UTF-8 (may hold NUL); NUMBER: the literal */
    size_t len;     /* bytes in str */
    di_jv **items;  /* ARRAY / OBJECT: [n] values */
    char **keys;    /* OBJECT: [n] decoded keys (NUL-terminated) */
    size_t *key_lens; /* OBJECT: [n] */
    size_t n, cap;
};

/* Nesting deeper than this is an error (the reference parser's limit). */
#define DI_JV_MAX_DEPTH 128

/* Parses exactly text[0..n) (surrounding whitespace allowed). `what` names
 * the document in messages. */
di_status di_jv_parse(const char *text, size_t n, const char *what, di_jv **out, di_err *err);
void di_jv_free(di_jv *v);

/* Member of an object by key (NULL when absent or v is not an object). */
const di_jv *di_jv_get(const di_jv *v, const char *key);
/* NUL-terminated string value, or NULL when v is not a string. */
const char *di_jv_string(const di_jv *v);
/* Numeric value of a NUMBER (as strtod reads its literal). */
double di_jv_number(const di_jv *v);
/* 1 when a NUMBER literal is an integer that fits int64/uint64. */
int di_jv_is_integer(const di_jv *v);
const char *di_jv_type_name(di_jv_type t);

/* Deep copy (NULL on allocation failure). */
di_jv *di_jv_clone(const di_jv *v);
/* Builders used when normalising: all return NULL on allocation failure. */
di_jv *di_jv_new(di_jv_type t);
di_jv *di_jv_new_string(const char *s, size_t n);
/* Appends (array) or sets (object; replaces in place when the key exists).
 * Takes ownership of item. Returns 0 on success, -1 on allocation failure. */
int di_jv_push(di_jv *arr, di_jv *item);
int di_jv_set(di_jv *obj, const char *key, di_jv *item);

/* Python json.dumps(v, ensure_ascii=False) text: ", " and ": " separators,
 * integers as written, other numbers as Python's float repr. */
void di_jv_dump_py(const di_jv *v, di_buf *b);
/* Compact text (no spaces), numbers as in di_jv_dump_py. */
void di_jv_dump_compact(const di_jv *v, di_buf *b);
/* A JSON string literal of s[0..n) with the escapes json.dumps uses. */
void di_jv_dump_string(const char *s, size_t n, di_buf *b);
/* The same escapes without the quotes (for text arriving in pieces). */
void di_jv_escape(const char *s, size_t n, di_buf *b);
/* One number as the reference prints it. */
void di_jv_dump_number(const di_jv *v, di_buf *b);

#endif
