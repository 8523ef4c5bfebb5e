/* Strict UTF-8 codec: see utf8.h. */
#include "core/utf8.h"

/* Expected length of a sequence starting with lead byte c (0 = not a lead),
 * and the allowed range of its second byte. */
static int utf8_lead(uint8_t c, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) {
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

/* Number of bytes of s[0..n) that are a valid prefix of one sequence
 * (the lead included), capped at the sequence's length. */
static size_t utf8_prefix_len(const uint8_t *s, size_t n, int *want) {
    uint8_t lo, hi;
    *want = utf8_lead(s[0], &lo, &hi);
    if (!*want) return 0;
    size_t k = 1;
    while (k < n && k < (size_t)*want) {
        uint8_t b = s[k];
        if (k == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) break;
        k++;
    }
    return k;
}

size_t di_utf8_invalid_len(const uint8_t *s, size_t n) {
    int want;
    size_t k = utf8_prefix_len(s, n, &want);
    return k ? k : 1;
}

size_t di_utf8_incomplete_tail(const uint8_t *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        const uint8_t *p = s + n - k;
        if ((*p & 0xC0) == 0x80) continue; /* a continuation: look further back */
        int want;
        size_t got = utf8_prefix_len(p, k, &want);
        return (want > (int)k && got == k) ? k : 0;
    }
    return 0;
}

size_t di_utf8_encode(int32_t cp, uint8_t out[4]) {
    if (cp < 0x80) { out[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

size_t di_utf8_valid_prefix(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        int32_t cp;
        size_t len = di_utf8_decode(s + i, n - i, &cp);
        if (!len) return i;
        i += len;
    }
    return n;
}
