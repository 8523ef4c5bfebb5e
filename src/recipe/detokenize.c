/* Streaming detokenizer (deepinfer.h, di_detokenizer_*). */
#include "recipe/detokenize.h"

#include <stdlib.h>
#include <string.h>

#include "recipe/tokenizer.h"
#include "recipe/unicode.h"

struct di_detokenizer {
    const di_tokenizer *tok;
    unsigned flags;
    uint8_t held[4];  /* [n_held] start of an unfinished UTF-8 sequence */
    size_t n_held;
    uint8_t *buf;     /* [cap] the text returned by the last call */
    size_t cap;
};

size_t di_utf8_lossy(const uint8_t *s, size_t n, uint8_t *out) {
    size_t k = 0, m = 0;
    while (k < n) {
        int32_t cp;
        size_t len = s[k] < 0x80 ? 1 : di_utf8_decode(s + k, n - k, &cp);
        if (len) {
            memcpy(out + m, s + k, len);
            m += len;
            k += len;
        } else {
            memcpy(out + m, "\xEF\xBF\xBD", 3);
            m += 3;
            k += di_utf8_invalid_len(s + k, n - k);
        }
    }
    return m;
}

di_status di_detokenizer_new(const di_tokenizer *tok, unsigned flags, di_detokenizer **out) {
    if (!tok || !out || (flags & ~(unsigned)DI_DETOK_LOSSY))
        return di_err_publish_msg(DI_ERR_INVALID_ARG, "detokenizer: bad argument");
    *out = calloc(1, sizeof **out);
    if (!*out) return di_err_publish_msg(DI_ERR_NOMEM, "detokenizer: out of memory");
    (*out)->tok = tok;
    (*out)->flags = flags;
    return DI_OK;
}

void di_detokenizer_free(di_detokenizer *d) {
    if (!d) return;
    free(d->buf);
    free(d);
}

/* Sets *text to held + src minus the unfinished tail (held back again). */
static di_status emit(di_detokenizer *d, const uint8_t *src, size_t n, int final,
                      const char **text, size_t *len) {
    size_t total = d->n_held + n;
    size_t need = 3 * total + 1;
    if (need > d->cap) {
        uint8_t *p = realloc(d->buf, need);
        if (!p) return di_err_publish_msg(DI_ERR_NOMEM, "detokenizer: out of memory");
        d->buf = p;
        d->cap = need;
    }
    /* Assemble at the end of the buffer so the lossy rewrite can run
     * front to back into the same allocation. */
    uint8_t *in = d->buf + d->cap - total;
    memcpy(in, d->held, d->n_held);
    if (n) memcpy(in + d->n_held, src, n);
    size_t tail = final ? 0 : di_utf8_incomplete_tail(in, total);
    size_t body = total - tail;
    uint8_t held[4];
    memcpy(held, in + body, tail);
    size_t m;
    if (d->flags & DI_DETOK_LOSSY) {
        m = di_utf8_lossy(in, body, d->buf);
    } else {
        memmove(d->buf, in, body);
        m = body;
    }
    memcpy(d->held, held, tail);
    d->n_held = tail;
    d->buf[m] = '\0';
    *text = (const char *)d->buf;
    *len = m;
    return DI_OK;
}

di_status di_detokenizer_push(di_detokenizer *d, int32_t id, const char **text, size_t *len) {
    if (!d || !text || !len)
        return di_err_publish_msg(DI_ERR_INVALID_ARG, "detokenizer: NULL argument");
    const char *bytes;
    size_t n;
    di_status rc = di_tokenizer_token_bytes(d->tok, id, &bytes, &n);
    if (rc) return rc;
    return emit(d, (const uint8_t *)bytes, n, 0, text, len);
}

di_status di_detokenizer_flush(di_detokenizer *d, const char **text, size_t *len) {
    if (!d || !text || !len)
        return di_err_publish_msg(DI_ERR_INVALID_ARG, "detokenizer: NULL argument");
    return emit(d, NULL, 0, 1, text, len);
}
