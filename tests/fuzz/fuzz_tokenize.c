/* libFuzzer target: arbitrary bytes through the tiny V4.1 tokenizer
 * (tests/data/tokenizer-v41-tiny.json). decode(encode(x)) must give x back
 * in both modes, and the lossy streaming detokenizer must emit valid UTF-8
 * that adds up to the lossy conversion of the whole. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deepinfer.h"
#include "io/json_text.h"
#include "recipe/detokenize.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static di_tokenizer *tok;

static di_tokenizer *tiny(void) {
    if (tok) return tok;
    const char *env = getenv("DEEPINFER_FUZZ_TOKENIZER");
    const char *cands[] = {env, "tests/data/tokenizer-v41-tiny.json",
                           "../tests/data/tokenizer-v41-tiny.json"};
    for (size_t i = 0; i < sizeof cands / sizeof *cands && !tok; i++)
        if (cands[i] && di_tokenizer_load(cands[i], &tok)) tok = NULL;
    if (!tok) {
        fprintf(stderr, "fuzz_tokenize: run from the repository root (tests/data/"
                        "tokenizer-v41-tiny.json) or set DEEPINFER_FUZZ_TOKENIZER\n");
        abort();
    }
    return tok;
}

static int valid_utf8(const uint8_t *s, size_t n) { return di_utf8_valid_prefix(s, n) == n; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    di_tokenizer *t = tiny();
    for (unsigned flags = 0; flags < 2; flags++) {
        int32_t *ids;
        size_t n;
        if (di_tokenizer_encode(t, (const char *)data, size, flags, &ids, &n)) abort();
        char *back;
        size_t bl;
        if (di_tokenizer_decode(t, ids, n, &back, &bl)) abort();
        if (bl != size || (size && memcmp(back, data, size))) abort();
        di_free(back);
        if (flags == 0) {
            uint8_t *want = malloc(3 * size + 1), *got = malloc(3 * size + 1);
            size_t wn = di_utf8_lossy(data, size, want), g = 0;
            di_detokenizer *d;
            if (!want || !got || di_detokenizer_new(t, DI_DETOK_LOSSY, &d)) abort();
            for (size_t i = 0; i <= n; i++) {
                const char *s;
                size_t l;
                if (i < n ? di_detokenizer_push(d, ids[i], &s, &l) : di_detokenizer_flush(d, &s, &l))
                    abort();
                if (!valid_utf8((const uint8_t *)s, l) || g + l > 3 * size) abort();
                memcpy(got + g, s, l);
                g += l;
            }
            if (g != wn || memcmp(got, want, g)) abort();
            di_detokenizer_free(d);
            free(want);
            free(got);
        }
        di_free(ids);
    }
    return 0;
}
