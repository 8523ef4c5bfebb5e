/* Engram compressed-token map (architecture.md §6.2).
 *
 * The reference builds it with HF tokenizers' normalizers (NFKC, NFD,
 * StripAccents, Lowercase, Replace, Strip) applied to each token's decoded
 * text. Their meaning, checked against that library: StripAccents drops
 * every general-category Mark (Mn, Mc and Me), Lowercase maps each character
 * by its full lowercase mapping (U+0130 becomes "i" + U+0307), and Strip trims
 * White_Space characters. The key of a token whose text is not valid UTF-8
 * (or contains U+FFFD) is its tokenizer.json spelling instead. */
#include "recipe/engram_map.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "recipe/tokenizer.h"
#include "recipe/unicode.h"

#define SENTINEL 0xE000 /* protects a text that is exactly one space from Strip */

/* One utf8proc normalization; *out_len counts the bytes (the text may hold
 * U+0000, so the terminator utf8proc adds is no guide). */
static di_status nf(const uint8_t *s, size_t n, int options, uint8_t **out, size_t *out_len,
                    di_err *err) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t m = utf8proc_map(s, (utf8proc_ssize_t)n, &dst, options);
    if (m < 0)
        return di_err_set(err, DI_ERR_INTERNAL, "Unicode normalization failed: %s",
                          utf8proc_errmsg(m));
    *out = dst;
    *out_len = (size_t)m;
    return DI_OK;
}

di_status di_engram_normalize(const uint8_t *s, size_t n, uint8_t **out, size_t *out_len,
                              di_err *err) {
    *out = NULL;
    *out_len = 0;
    uint8_t *nfkc = NULL, *nfd = NULL;
    di_status rc;
    if (n == 0) {
        *out = calloc(1, 1);
        return *out ? DI_OK : di_err_set(err, DI_ERR_NOMEM, "out of memory");
    }
    size_t kl = 0, len = 0;
    if ((rc = nf(s, n, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, &nfkc, &kl, err)))
        return rc;
    rc = kl ? nf(nfkc, kl, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, &nfd, &len, err) : DI_OK;
    free(nfkc);
    if (rc) return rc;
    /* At most two code points per input code point (U+0130 lowercases to
     * "i" + U+0307), and there are at most len input code points. */
    int32_t *cps = malloc((len * 2 + 1) * sizeof *cps);
    if (!cps) {
        free(nfd);
        return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    }
    size_t m = 0;
    int in_ws_run = 0;
    for (size_t k = 0; k < len;) {
        int32_t cp;
        size_t l = di_utf8_decode(nfd + k, len - k, &cp);
        if (!l) { cp = 0xFFFD; l = 1; } /* not reached: utf8proc output is valid */
        k += l;
        utf8proc_category_t cat = utf8proc_category(cp);
        if (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC ||
            cat == UTF8PROC_CATEGORY_ME)
            continue;
        if (cp == 0x130) {
            cps[m++] = 'i';
            cps[m++] = 0x307;
            in_ws_run = 0;
            continue;
        }
        cp = utf8proc_tolower(cp);
        if (cp == ' ' || cp == '\t' || cp == '\r' || cp == '\n') {
            if (!in_ws_run) cps[m++] = ' ';
            in_ws_run = 1;
            continue;
        }
        in_ws_run = 0;
        cps[m++] = cp;
    }
    free(nfd);
    size_t a = 0, b = m;
    if (m == 1 && cps[0] == ' ') {
        cps[0] = SENTINEL;
    } else {
        while (a < b && (di_unicode_class(cps[a]) & DI_UC_WS)) a++;
        while (b > a && (di_unicode_class(cps[b - 1]) & DI_UC_WS)) b--;
    }
    uint8_t *res = malloc((b - a) * 4 + 1);
    if (!res) {
        free(cps);
        return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    }
    size_t o = 0;
    for (size_t k = a; k < b; k++)
        o += cps[k] == SENTINEL ? (res[o] = ' ', 1) : di_utf8_encode(cps[k], res + o);
    res[o] = '\0';
    free(cps);
    *out = res;
    *out_len = o;
    return DI_OK;
}

/* Set of keys -> class, open addressing over an arena of NUL-free-safe keys. */
typedef struct keyset {
    uint32_t *slot_key;  /* [cap] offset+1 of the key in arena, 0 = empty */
    int32_t *slot_class; /* [cap] */
    size_t cap, n;
    uint8_t *arena;      /* keys as (uint32 length, bytes) */
    size_t arena_n, arena_cap;
} keyset;

static uint64_t key_hash(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h ^ (h >> 31);
}

/* Class of key p[0..n), a new one (next_class) if unseen; -1 on NOMEM. */
static int32_t keyset_get(keyset *ks, const uint8_t *p, size_t n, int32_t next_class) {
    size_t mask = ks->cap - 1, s = key_hash(p, n) & mask;
    while (ks->slot_key[s]) {
        const uint8_t *k = ks->arena + ks->slot_key[s] - 1;
        uint32_t kl;
        memcpy(&kl, k, 4);
        if (kl == n && !memcmp(k + 4, p, n)) return ks->slot_class[s];
        s = (s + 1) & mask;
    }
    if (ks->arena_n + n + 4 >= UINT32_MAX) return -1;
    if (ks->arena_n + n + 4 > ks->arena_cap) {
        size_t cap = ks->arena_cap ? ks->arena_cap * 2 : 1 << 20;
        while (cap < ks->arena_n + n + 4) cap *= 2;
        uint8_t *a = realloc(ks->arena, cap);
        if (!a) return -1;
        ks->arena = a;
        ks->arena_cap = cap;
    }
    uint32_t kl = (uint32_t)n;
    memcpy(ks->arena + ks->arena_n, &kl, 4);
    memcpy(ks->arena + ks->arena_n + 4, p, n);
    ks->slot_key[s] = (uint32_t)ks->arena_n + 1;
    ks->slot_class[s] = next_class;
    ks->arena_n += n + 4;
    ks->n++;
    return next_class;
}

static int has_fffd_or_invalid(const uint8_t *s, size_t n) {
    for (size_t k = 0; k < n;) {
        int32_t cp;
        size_t l = di_utf8_decode(s + k, n - k, &cp);
        if (!l || cp == 0xFFFD) return 1;
        k += l;
    }
    return 0;
}

static di_status build_map(const di_tokenizer *t, int32_t *map, int *n_classes, di_err *err) {
    keyset ks = {0};
    ks.cap = 16;
    while (ks.cap < t->n_ids * 2) ks.cap *= 2;
    ks.slot_key = calloc(ks.cap, sizeof *ks.slot_key);
    ks.slot_class = malloc(ks.cap * sizeof *ks.slot_class);
    di_status rc = ks.slot_key && ks.slot_class ? DI_OK
                                                : di_err_set(err, DI_ERR_NOMEM, "out of memory");
    int32_t classes = 0;
    for (size_t id = 0; !rc && id < t->n_ids; id++) {
        /* An id without a token decodes to nothing in HF tokenizers. */
        int present = t->flags[id] & DI_TOK_PRESENT;
        const uint8_t *text = present ? t->bytes + t->bytes_off[id] : (const uint8_t *)"";
        size_t n = present ? t->bytes_off[id + 1] - t->bytes_off[id] - 1 : 0;
        const uint8_t *key = text;
        size_t kn = n;
        uint8_t *norm = NULL;
        if (has_fffd_or_invalid(text, n)) {
            key = (const uint8_t *)di_tokenizer_spelling(t, (int32_t)id);
            kn = t->str_off[id + 1] - t->str_off[id] - 1;
        } else {
            size_t nl;
            if ((rc = di_engram_normalize(text, n, &norm, &nl, err))) {
                di_err_prefix(err, "token %zu: ", id);
                break;
            }
            if (nl) {
                key = norm;
                kn = nl;
            }
        }
        int32_t c = keyset_get(&ks, key, kn, classes);
        free(norm);
        if (c < 0) {
            rc = di_err_set(err, DI_ERR_NOMEM, "out of memory");
            break;
        }
        if (c == classes) classes++;
        map[id] = c;
    }
    free(ks.slot_key);
    free(ks.slot_class);
    free(ks.arena);
    if (!rc) *n_classes = classes;
    return rc;
}

di_status di_tokenizer_engram_map(const di_tokenizer *tok, int32_t *map_out, int *n_classes) {
    di_err err = {0};
    if (!tok || !map_out || !n_classes)
        return di_err_publish_msg(DI_ERR_INVALID_ARG, "engram map: NULL argument");
    di_status rc = build_map(tok, map_out, n_classes, &err);
    if (rc) {
        di_err_prefix(&err, "engram map: ");
        return di_err_publish(&err);
    }
    return DI_OK;
}
