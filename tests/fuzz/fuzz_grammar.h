/* Shared body of the grammar front-end fuzz targets (fuzz_regex.c,
 * fuzz_json_schema.c, fuzz_ebnf.c): a tiny vocabulary, small limits, and a
 * matcher run over whatever grammar the input compiles to. Any crash,
 * sanitizer report or leak is a bug; compile errors are expected. */
#ifndef DI_FUZZ_GRAMMAR_H
#define DI_FUZZ_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "deepinfer.h"

static di_vocab *fuzz_vocab(void) {
    static di_vocab *v;
    if (!v) {
        static const char *toks[] = {"a", "b", "{", "}", "\"", ":", ",", "1", "0", " ", "[", "]", "ab", "\":", "-", ".", "e", "x", "\\", "", "null", "true"};
        enum { N = sizeof toks / sizeof *toks };
        const uint8_t *b[N];
        size_t l[N];
        for (int i = 0; i < N; i++) { b[i] = (const uint8_t *)toks[i]; l[i] = strlen(toks[i]); }
        di_vocab_create(N, b, l, N - 3, &v);
    }
    return v;
}

/* Compiles `data` as a constraint of `kind` and, when it compiles, walks a
 * matcher over tokens derived from the input, checking each advance against
 * the mask it was offered. */
static int fuzz_constraint(di_constraint_kind kind, const uint8_t *data, size_t size) {
    di_vocab *v = fuzz_vocab();
    if (!v || size > 4096) return 0;
    di_grammar_options o;
    di_grammar_options_default(&o);
    o.max_rules = 20000;
    o.max_lexer_states = 20000;
    o.max_repeat = 64;
    o.max_compile_ms = 2000;
    o.lenient = size & 1;
    di_grammar *g = NULL;
    if (di_grammar_compile(v, kind, (const char *)data, size, &o, &g) != DI_OK) return 0;
    di_matcher *m = NULL;
    if (di_matcher_create(g, &m) == DI_OK) {
        uint32_t mask[1];
        for (size_t i = 0; i < size && i < 24; i++) {
            di_matcher_fill_mask(m, mask, 1);
            int32_t t = (int32_t)(data[i] % di_vocab_size(v));
            if (di_matcher_advance(m, t) != DI_OK && (mask[0] >> t & 1)) __builtin_trap(); /* mask said yes */
            if (data[i] == 'r') di_matcher_rollback(m, 1);
        }
        di_matcher_is_accepting(m);
        di_matcher_free(m);
    }
    di_grammar_free(g);
    return 0;
}

#endif
