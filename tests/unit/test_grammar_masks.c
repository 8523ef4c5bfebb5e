/* Grammar masks against a brute-force oracle on a vocabulary shaped like a
 * real one: text tokens (ASCII words, multi-byte characters), tokens
 * outside the text slice (quotes, escapes, control bytes, split UTF-8) and
 * tokens longer than the room left in bounded strings. The oracle is the
 * matcher's own advance + rollback, token by token; the walks behind the
 * mask (text slice, rest trie, whole-subtree skips, bounded memo proxies)
 * are all different code. Also: duplicate object keys. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deepinfer.h"
#include "test.h"

static const char *const toks[] = {
    /* ASCII text */
    "a", "b", "c", "x", "ab", "abc", "ba", "hello", " world", " ", "  ", "_", "a_b", "/", "a/b", "/c", ":", "::",
    "a:", "1", "12", "2024", "-", "0", ".", "e", "E", "+", "true", "false", "null", "tr", "ue", "~", "\x7f",
    /* non-ASCII text */
    "\xc3\xa9", "\xe4\xb8\xad", "\xe4\xb8\xad\xe6\x96\x87", "a\xc3\xa9", "\xf0\x9f\x98\x80", " \xe6\x97\xa5",
    /* outside the text slice: JSON punctuation, quotes, escapes, controls, split UTF-8 */
    "{", "}", "[", "]", ",", ", ", "\"", "\":", "\": ", "\",", "\"}", "\"a", "a\"", "a\":", "ab\"", "\"\"", "\"b\":",
    "\",\"", "\":\"", "\\", "\\n", "\\\"", "\\u", "\\u00", "00e9", "e9", "\\u0061", "\\ud83d", "\\ude00", "\n", "\t",
    "\x01", "\xe4\xb8", "\xad", "a\xc3", "\xc3", "\xa9\"", "}}", "]}", "\"]",
    /* long tokens (bounded strings must re-check them near the bound) */
    "aaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", "hello world hello world",
    "\xe4\xb8\xad\xe4\xb8\xad\xe4\xb8\xad\xe4\xb8\xad\xe4\xb8\xad\xe4\xb8\xad", "aaaaaaaaaaaaaaaaaaaa\"",
};
#define N_TOKS (sizeof toks / sizeof toks[0])
#define NV (N_TOKS + 2) /* + EOS + an id without bytes */
#define EOS ((int)N_TOKS)
#define WORDS ((NV + 31) / 32)

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)rng;
}

static di_vocab *rich_vocab(void) {
    const uint8_t *bs[NV];
    size_t ls[NV];
    for (size_t i = 0; i < N_TOKS; i++) { bs[i] = (const uint8_t *)toks[i]; ls[i] = strlen(toks[i]); }
    bs[EOS] = (const uint8_t *)"";
    ls[EOS] = 0;
    bs[EOS + 1] = NULL;
    ls[EOS + 1] = 0;
    di_vocab *v = NULL;
    CHECKF(di_vocab_create(NV, bs, ls, EOS, &v) == DI_OK, "%s", di_last_error());
    return v;
}

static int has(const uint32_t *mask, int t) { return (int)(mask[t >> 5] >> (t & 31) & 1); }

static di_grammar *compile(di_vocab *v, di_constraint_kind k, const char *text) {
    di_grammar *g = NULL;
    di_status st = di_grammar_compile(v, k, text, strlen(text), NULL, &g);
    CHECKF(st == DI_OK, "compile %s: %s", text, di_last_error());
    return g;
}

/* Random walks under the mask; at every step the mask must equal the set
 * of tokens advance accepts. Returns the number of tokens checked. */
static long walk_and_compare(di_grammar *g, const char *name, int walks, int steps, int *mismatches) {
    long checked = 0;
    for (int w = 0; w < walks; w++) {
        di_matcher *m = NULL;
        if (di_matcher_create(g, &m)) break;
        for (int step = 0; step < steps; step++) {
            uint32_t mask[WORDS];
            CHECK(di_matcher_fill_mask(m, mask, WORDS) == DI_OK);
            int allowed[NV], na = 0;
            for (int t = 0; t < (int)NV; t++) {
                int ok = t == EOS ? di_matcher_is_accepting(m) : di_matcher_advance(m, t) == DI_OK;
                if (ok && t != EOS) di_matcher_rollback(m, 1);
                checked++;
                if (ok != has(mask, t) && (*mismatches)++ < 8)
                    fprintf(stderr, "%s, walk %d step %d, token %d: mask %d, advance %d\n", name, w, step, t, has(mask, t), ok);
                if (ok && t != EOS) allowed[na++] = t;
            }
            if (!na) break;
            CHECK(di_matcher_advance(m, allowed[rnd() % (uint32_t)na]) == DI_OK);
        }
        di_matcher_free(m);
    }
    return checked;
}

static void test_masks_rich_vocab(void) {
    di_vocab *v = rich_vocab();
    const char *schemas[] = {
        "{\"type\":\"string\"}",
        "{\"type\":\"string\",\"maxLength\":5}",
        "{\"type\":\"string\",\"minLength\":2,\"maxLength\":12}",
        "{\"type\":\"string\",\"maxLength\":30}",
        "{\"type\":\"string\",\"minLength\":3}",
        "{\"type\":\"string\",\"pattern\":\"^[^/]+$\"}",
        "{\"type\":\"string\",\"pattern\":\"^[a-z]+$\"}",
        "{\"type\":\"string\",\"pattern\":\"b\"}",
        "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":\"^[^:]*:\"}}",
        "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\",\"maxLength\":8}}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":\"boolean\"}}",
        "{\"type\":\"array\",\"items\":{\"enum\":[\"ab\",\"a/b\",\"\\u00e9\"]}}",
    };
    /* top-level regexes: lexemes that end inside text tokens */
    const char *regexes[] = {"[^x]*x", "(a|b|\\u00e9)+:?", ".*c", "[^\"]{0,25}"};
    int mismatches = 0;
    long checked = 0;
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        di_grammar *g = compile(v, DI_CONSTRAINT_JSON_SCHEMA, schemas[i]);
        if (!g) continue;
        checked += walk_and_compare(g, schemas[i], 6, 14, &mismatches);
        di_grammar_free(g);
    }
    for (size_t i = 0; i < sizeof regexes / sizeof regexes[0]; i++) {
        di_grammar *g = compile(v, DI_CONSTRAINT_REGEX, regexes[i]);
        if (!g) continue;
        checked += walk_and_compare(g, regexes[i], 6, 14, &mismatches);
        di_grammar_free(g);
    }
    CHECK_EQ_INT(mismatches, 0);
    CHECK(checked > 50000);
    di_vocab_free(v);
}

int main(void) {
    RUN(test_masks_rich_vocab);
    return test_summary();
}
