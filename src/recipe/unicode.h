/* Unicode helpers for the tokenizer: the character classes the DeepSeek pre-tokenizer regexes use
 * (ecosystem.md §2.1), taken from utf8proc's Unicode tables.
 *
 * Classes follow Oniguruma's meaning, because HF tokenizers runs the regexes
 * with Oniguruma: \p{L} = Lu|Ll|Lt|Lm|Lo, \p{M} = Mn|Mc|Me, \p{N} = Nd|Nl|No,
 * \p{P} = Pc|Pd|Ps|Pe|Pi|Pf|Po, \p{S} = Sm|Sc|Sk|So, \s = the White_Space
 * property. A byte that does not start a valid UTF-8 sequence is classed as
 * U+FFFD (a symbol), which is what a caller that decodes the bytes with
 * replacement would hand to HF tokenizers. */
#ifndef DI_RECIPE_UNICODE_H
#define DI_RECIPE_UNICODE_H

#include <stddef.h>
#include <stdint.h>

#include "core/utf8.h" /* di_utf8_decode and the other codec helpers */

enum {
    DI_UC_L = 1 << 0,          /* letter */
    DI_UC_M = 1 << 1,          /* mark */
    DI_UC_N = 1 << 2,          /* number */
    DI_UC_P = 1 << 3,          /* punctuation */
    DI_UC_S = 1 << 4,          /* symbol */
    DI_UC_WS = 1 << 5,         /* White_Space */
    DI_UC_CRLF = 1 << 6,       /* '\r' or '\n' */
    DI_UC_CJK = 1 << 7,        /* U+4E00-9FA5, U+3040-309F, U+30A0-30FF */
    DI_UC_ASCII_PUNCT = 1 << 8,/* the 32 ASCII punctuation and symbol characters */
    DI_UC_ASCII_ALPHA = 1 << 9,/* A-Z a-z */
    DI_UC_SPACE = 1 << 10      /* U+0020 exactly */
};

/* DI_UC_* class bits of a code point (-1 = an invalid byte). */
unsigned di_unicode_class(int32_t cp);

/* The classes of U+0000..U+FFFF, for loops that classify many characters:
 * bmp[cp] == di_unicode_class(cp). Thread-safe; computed on first use. */
const uint16_t *di_unicode_bmp_classes(void);

#endif
