/* Unicode helpers for the tokenizer: strict UTF-8 decoding and the
 * character classes the DeepSeek pre-tokenizer regexes use
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

/* Decodes one code point from s[0..n) (n >= 1). Returns its length in bytes
 * (1-4) and stores it in *cp, or returns 0 when s does not start a valid
 * sequence (overlong, surrogate, > U+10FFFF, truncated, stray continuation). */
static inline size_t di_utf8_decode(const uint8_t *s, size_t n, int32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    if (c < 0xC2) return 0;
    if (c < 0xE0) {
        if (n < 2 || (s[1] & 0xC0) != 0x80) return 0;
        *cp = ((int32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (c < 0xF0) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && s[1] < 0xA0) return 0;  /* overlong */
        if (c == 0xED && s[1] >= 0xA0) return 0; /* surrogate */
        *cp = ((int32_t)(c & 0x0F) << 12) | ((int32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    if (c < 0xF5) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        if (c == 0xF0 && s[1] < 0x90) return 0; /* overlong */
        if (c == 0xF4 && s[1] >= 0x90) return 0; /* > U+10FFFF */
        *cp = ((int32_t)(c & 0x07) << 18) | ((int32_t)(s[1] & 0x3F) << 12) |
              ((int32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
        return 4;
    }
    return 0;
}

/* Length of the maximal subpart of an ill-formed sequence at s[0..n) (the
 * bytes one U+FFFD replaces, as Python's and Rust's lossy decoders do). Only
 * meaningful when di_utf8_decode(s, n) == 0; always >= 1. */
size_t di_utf8_invalid_len(const uint8_t *s, size_t n);

/* How many bytes at the end of s[0..n) form the start of a valid sequence
 * that is not complete yet (0-3). */
size_t di_utf8_incomplete_tail(const uint8_t *s, size_t n);

/* Encodes cp (a Unicode scalar value) into out[0..4); returns the length. */
size_t di_utf8_encode(int32_t cp, uint8_t out[4]);

/* DI_UC_* class bits of a code point (-1 = an invalid byte). */
unsigned di_unicode_class(int32_t cp);

/* The classes of U+0000..U+FFFF, for loops that classify many characters:
 * bmp[cp] == di_unicode_class(cp). Thread-safe; computed on first use. */
const uint16_t *di_unicode_bmp_classes(void);

#endif
