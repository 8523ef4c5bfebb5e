/* The DeepSeek V3/V4 pre-tokenizer as hand-written matchers
 * (ecosystem.md §2.1). */
#include "recipe/pretokenize.h"

#include <stdlib.h>

#include "recipe/unicode.h"

static const char *const patterns[DI_PRETOKENIZE_STEPS] = {
    "\\p{N}{1,3}",
    "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
    "[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|"
    "\\s*[\r\n]+|"
    "\\s+(?!\\S)|"
    "\\s+",
};

const char *di_pretokenize_pattern(int step) {
    return step >= 0 && step < DI_PRETOKENIZE_STEPS ? patterns[step] : NULL;
}

void di_pretok_scratch_free(di_pretok_scratch *s) {
    free(s->cls);
    free(s->off);
    s->cls = NULL;
    s->off = NULL;
    s->cap = 0;
}

typedef struct walk {
    const uint16_t *cls; /* [nch] */
    const uint32_t *off; /* [nch + 1] */
    di_piece_fn fn;
    void *ctx;
} walk;

static inline int emit(const walk *w, size_t a, size_t b) {
    return a < b ? w->fn(w->ctx, w->off[a], w->off[b]) : 0;
}

/* Step 3 at character i of the piece [.., e): the end of the match, or i
 * when no alternative matches there. */
static size_t match_main(const uint16_t *cls, size_t i, size_t e) {
    unsigned c = cls[i];
    size_t j;
    /* [!"#...~][A-Za-z]+ */
    if ((c & DI_UC_ASCII_PUNCT) && i + 1 < e && (cls[i + 1] & DI_UC_ASCII_ALPHA)) {
        j = i + 2;
        while (j < e && (cls[j] & DI_UC_ASCII_ALPHA)) j++;
        return j;
    }
    /* [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ : with the optional character
     * first, then (backtracking) without it. */
    if (!(c & (DI_UC_CRLF | DI_UC_L | DI_UC_P | DI_UC_S)) && i + 1 < e &&
        (cls[i + 1] & (DI_UC_L | DI_UC_M))) {
        j = i + 2;
        while (j < e && (cls[j] & (DI_UC_L | DI_UC_M))) j++;
        return j;
    }
    if (c & (DI_UC_L | DI_UC_M)) {
        j = i + 1;
        while (j < e && (cls[j] & (DI_UC_L | DI_UC_M))) j++;
        return j;
    }
    /*  ?[\p{P}\p{S}]+[\r\n]* */
    j = (c & DI_UC_SPACE) ? i + 1 : i;
    if (j < e && (cls[j] & (DI_UC_P | DI_UC_S))) {
        j++;
        while (j < e && (cls[j] & (DI_UC_P | DI_UC_S))) j++;
        while (j < e && (cls[j] & DI_UC_CRLF)) j++;
        return j;
    }
    if (!(c & DI_UC_WS)) return i;
    /* The three whitespace alternatives share the maximal run [i, r). */
    size_t r = i + 1, last_crlf = (c & DI_UC_CRLF) ? i + 1 : 0;
    while (r < e && (cls[r] & DI_UC_WS)) {
        if (cls[r] & DI_UC_CRLF) last_crlf = r + 1;
        r++;
    }
    /* \s*[\r\n]+ : \s* gives back characters until a CR/LF follows, so
     * the match ends after the run's last CR/LF. */
    if (last_crlf) return last_crlf;
    /* \s+(?!\S) : the whole run at the piece's end; otherwise all but the
     * last whitespace character, which must remain to satisfy (?!\S). */
    if (r == e) return r;
    if (r - i >= 2) return r - 1;
    /* \s+ */
    return r;
}

static int split_main(const walk *w, size_t s, size_t e) {
    size_t gap = s, i = s;
    int rc;
    while (i < e) {
        size_t j = match_main(w->cls, i, e);
        if (j == i) { i++; continue; }
        if ((rc = emit(w, gap, i)) || (rc = emit(w, i, j))) return rc;
        i = gap = j;
    }
    return emit(w, gap, e);
}

static int split_cjk(const walk *w, size_t s, size_t e) {
    size_t gap = s, i = s;
    int rc;
    while (i < e) {
        if (!(w->cls[i] & DI_UC_CJK)) { i++; continue; }
        size_t j = i + 1;
        while (j < e && (w->cls[j] & DI_UC_CJK)) j++;
        if (gap < i && (rc = split_main(w, gap, i))) return rc;
        if ((rc = split_main(w, i, j))) return rc;
        i = gap = j;
    }
    return gap < e ? split_main(w, gap, e) : 0;
}

/* Step 1. A run of at most three numbers passes steps 2 and 3 unchanged (no
 * alternative of step 3 matches inside a piece made only of numbers), so it
 * is emitted directly. */
static int split_digits(const walk *w, size_t nch) {
    size_t gap = 0, i = 0;
    int rc;
    while (i < nch) {
        if (!(w->cls[i] & DI_UC_N)) { i++; continue; }
        if (gap < i && (rc = split_cjk(w, gap, i))) return rc;
        size_t j = i + 1;
        while (j < nch && j - i < 3 && (w->cls[j] & DI_UC_N)) j++;
        if ((rc = emit(w, i, j))) return rc;
        i = gap = j;
    }
    return gap < nch ? split_cjk(w, gap, nch) : 0;
}

di_status di_pretokenize(const uint8_t *text, size_t n, di_pretok_scratch *sc,
                         di_piece_fn fn, void *ctx, int *stopped, di_err *err) {
    if (stopped) *stopped = 0;
    if (n >= UINT32_MAX)
        return di_err_set(err, DI_ERR_LIMIT, "text of %zu bytes: the limit is 4 GiB", n);
    if (n == 0) return DI_OK;
    if (sc->cap < n) {
        uint16_t *cls = realloc(sc->cls, n * sizeof *cls);
        if (cls) sc->cls = cls;
        uint32_t *off = realloc(sc->off, (n + 1) * sizeof *off);
        if (off) sc->off = off;
        if (!cls || !off) return di_err_set(err, DI_ERR_NOMEM, "pre-tokenizer: out of memory");
        sc->cap = n;
    }
    const uint16_t *bmp = di_unicode_bmp_classes();
    size_t nch = 0;
    for (size_t p = 0; p < n;) {
        int32_t cp;
        size_t len;
        if (text[p] < 0x80) {
            sc->cls[nch] = bmp[text[p]];
            sc->off[nch++] = (uint32_t)p++;
            continue;
        }
        if (!(len = di_utf8_decode(text + p, n - p, &cp))) {
            cp = -1;
            len = 1;
        }
        sc->cls[nch] = (uint16_t)(cp >= 0 && cp < 0x10000 ? bmp[cp] : di_unicode_class(cp));
        sc->off[nch++] = (uint32_t)p;
        p += len;
    }
    sc->off[nch] = (uint32_t)n;
    walk w = {sc->cls, sc->off, fn, ctx};
    int rc = split_digits(&w, nch);
    if (rc) {
        if (stopped) *stopped = rc;
        return di_err_set(err, DI_ERR_STATE, "pre-tokenizer stopped");
    }
    return DI_OK;
}
