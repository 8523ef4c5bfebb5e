/* Strict UTF-8 (the Unicode standard's §3.9, table 3-7): decoding, encoding and the
 * lengths lossy decoders and streaming readers need. Untrusted text (JSON
 * documents, token bytes, generated text) goes through these only, so that
 * "valid" means the same in every module: no overlong forms, surrogates or
 * code points above U+10FFFF. */
#ifndef DI_CORE_UTF8_H
#define DI_CORE_UTF8_H

#include <stddef.h>
#include <stdint.h>

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

/* Length of the valid UTF-8 prefix of s[0..n) (== n when all valid): strict
 * (no overlong forms, surrogates or code points above U+10FFFF). */
size_t di_utf8_valid_prefix(const unsigned char *s, size_t n);

#endif
