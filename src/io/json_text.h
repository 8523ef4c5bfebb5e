/* Lexical checks on untrusted JSON text before it reaches cJSON
 * (ecosystem.md §3.1: the reference reader's "valid UTF-8 JSON").
 *
 * cJSON is lenient where the reference reader (serde_json) is strict: it
 * accepts any byte <= 0x20 as whitespace, raw control characters inside
 * strings, and an escaped NUL that then silently truncates a key. This scan
 * rejects those, and invalid UTF-8, so that what cJSON parses afterwards
 * means the same thing to every reader. */
#ifndef DI_IO_JSON_TEXT_H
#define DI_IO_JSON_TEXT_H

#include <stddef.h>

#include "core/error.h"
#include "core/utf8.h" /* di_utf8_valid_prefix */

/* Checks text[0..n). `what` names the document in messages ("header").
 * integers_only: also reject number literals with a fraction, an exponent or
 * a leading zero (safetensors headers and indexes hold only integers). */
di_status di_json_text_check(const char *text, size_t n, const char *what, int integers_only,
                             di_err *err);

struct cJSON;

/* di_json_text_check, then cJSON parsing of exactly text[0..n): only JSON
 * whitespace may follow the value. *out is the caller's to cJSON_Delete. */
di_status di_json_parse_strict(const char *text, size_t n, const char *what, int integers_only,
                               struct cJSON **out, di_err *err);

#endif
