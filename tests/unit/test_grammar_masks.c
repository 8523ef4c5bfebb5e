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

#include <cjson/cJSON.h>

#include "deepinfer.h"
#include "grammar/json_keys.h"
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

static int blank(const char *s) {
    for (; *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r') return 0;
    return 1;
}

/* 1 when the matcher can go on: EOS or some token allowed that is not
 * only whitespace (after which the place is the same), or else whitespace
 * that can go on (a few steps deep). */
static int can_go_on(di_matcher *m, int depth) {
    uint32_t mask[WORDS];
    if (di_matcher_fill_mask(m, mask, WORDS)) return 0;
    int ws = -1;
    for (int t = 0; t < (int)NV; t++) {
        if (!has(mask, t)) continue;
        if (t >= (int)N_TOKS || !blank(toks[t])) return 1;
        if (ws < 0) ws = t;
    }
    if (ws < 0 || depth == 0 || di_matcher_advance(m, ws) != DI_OK) return 0;
    int r = can_go_on(m, depth - 1);
    di_matcher_rollback(m, 1);
    return r;
}

/* Random walks under the mask; at every step the mask must equal the set
 * of tokens advance accepts and after which the matcher can go on (a token
 * that only leads to a repeated key is a dead end the mask leaves out).
 * Returns the number of tokens checked. */
static long walk_and_compare(di_grammar *g, const char *name, int walks, int steps, int strict, int *mismatches) {
    long checked = 0;
    for (int w = 0; w < walks; w++) {
        di_matcher *m = NULL;
        if (di_matcher_create(g, &m)) break;
        char out[2048] = "";
        for (int step = 0; step < steps; step++) {
            uint32_t mask[WORDS];
            CHECK(di_matcher_fill_mask(m, mask, WORDS) == DI_OK);
            int allowed[NV], na = 0;
            for (int t = 0; t < (int)NV; t++) {
                int ok = t == EOS ? di_matcher_is_accepting(m) : di_matcher_advance(m, t) == DI_OK;
                int on = ok;
                if (ok && t != EOS) {
                    on = can_go_on(m, 3);
                    di_matcher_rollback(m, 1);
                }
                checked++;
                /* masked: refused, or (strict) no way on; allowed: taken,
                 * and a way on unless the vocabulary has no token for the
                 * next byte (a dead end the grammar cannot see either) */
                int bad = has(mask, t) ? !ok || (strict && !on) : on;
                if (bad && (*mismatches)++ < 8)
                    fprintf(stderr, "%s, walk %d step %d after '%s', token %d '%s': mask %d, advance %d, goes on %d\n", name, w,
                            step, out, t, t < (int)N_TOKS ? toks[t] : "", has(mask, t), ok, on);
                if (has(mask, t) && t != EOS) allowed[na++] = t; /* walk under the mask */
            }
            if (!na) break;
            int t = allowed[rnd() % (uint32_t)na];
            CHECK(di_matcher_advance(m, t) == DI_OK);
            if (strlen(out) + strlen(toks[t]) < sizeof out) strcat(out, toks[t]);
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
        checked += walk_and_compare(g, schemas[i], 6, 14, 0, &mismatches);
        di_grammar_free(g);
    }
    for (size_t i = 0; i < sizeof regexes / sizeof regexes[0]; i++) {
        di_grammar *g = compile(v, DI_CONSTRAINT_REGEX, regexes[i]);
        if (!g) continue;
        checked += walk_and_compare(g, regexes[i], 6, 14, 0, &mismatches);
        di_grammar_free(g);
    }
    CHECK_EQ_INT(mismatches, 0);
    CHECK(checked > 50000);
    di_vocab_free(v);
}

/* ------------------------------------------------ repeated object keys */

static int accepts(const di_grammar *g, const char *s) {
    di_matcher *m = NULL;
    if (di_matcher_create(g, &m)) return -1;
    int ok = di_matcher_advance_bytes(m, (const uint8_t *)s, strlen(s)) == DI_OK && di_matcher_is_accepting(m);
    di_matcher_free(m);
    return ok;
}

static int token_id(const char *s) {
    for (size_t i = 0; i < N_TOKS; i++)
        if (!strcmp(toks[i], s)) return (int)i;
    return -1;
}

static void test_repeated_keys_refused(void) {
    di_vocab *v = rich_vocab();
    di_grammar *g = compile(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"object\",\"additionalProperties\":{}}");
    di_grammar *decl = compile(v, DI_CONSTRAINT_JSON_SCHEMA,
                               "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"t\":{}},"
                               "\"additionalProperties\":false}");
    di_grammar *any = NULL;
    CHECK(di_grammar_compile(v, DI_CONSTRAINT_JSON_OBJECT, NULL, 0, NULL, &any) == DI_OK);
    di_grammar *rx = compile(v, DI_CONSTRAINT_REGEX, "\\{(\"a\":1,?)*\\}");
    if (!g || !decl || !any || !rx) goto done;
    struct { const char *text; int ok; } cases[] = {
        {"{\"a\":1,\"b\":2}", 1},
        {"{\"a\":1,\"a\":2}", 0},
        {"{\"a\":1, \"b\":{\"a\":1,\"b\":[{\"a\":2},{\"a\":3}]}, \"c\":{}}", 1}, /* same key, other objects */
        {"{\"a\":{\"b\":1,\"b\":2}}", 0},
        {"{\"a\":{\"b\":1},\"a\":2}", 0},
        {"{\"l\":[{\"k\":\"\\\"k\\\"\"},{\"k\":\"}\"}]}", 1}, /* quotes and braces inside values */
        {"{\"\":1,\"\":2}", 0},
        {"{\"a\\\"\":1,\"a\\\"b\":2,\"a\\\"\":3}", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECKF(accepts(g, cases[i].text) == cases[i].ok, "additionalProperties: %s", cases[i].text);
        CHECKF(accepts(any, cases[i].text) == cases[i].ok, "any object: %s", cases[i].text);
    }
    /* escaped keys (the any-object grammar takes the canonical escapes) */
    CHECK(accepts(any, "{\"\\n\":1,\"\\b\":2,\"\\u001f\":3,\"\\\"\":4}") == 1);
    CHECK(accepts(any, "{\"\\n\":1,\"\\b\":2,\"\\n\":3}") == 0);
    CHECK(accepts(any, "{\"\\u001f\":1,\"x\":{},\"\\u001f\":3}") == 0);
    CHECK(accepts(decl, "{\"id\":1,\"t\":2}") == 1);
    CHECK(accepts(decl, "{\"id\":1,\"id\":2}") == 0);
    CHECK(accepts(decl, "{\"t\":1,\"id\":2,\"t\":3}") == 0);
    /* only JSON output is read as JSON: a regex may repeat what it likes */
    CHECK(accepts(rx, "{\"a\":1,\"a\":1}") == 1);

    /* the mask: the token that would close the repeated key is masked, the
     * same token closing a new key is not, and rollback forgets keys */
    di_matcher *m = NULL;
    CHECK(di_matcher_create(g, &m) == DI_OK);
    int t_open = token_id("{"), t_qa = token_id("\"a"), t_colon = token_id("\":"), t_1 = token_id("1"),
        t_comma = token_id(","), t_q = token_id("\""), t_a_close = token_id("a\":"), t_ab_close = token_id("ab\""),
        t_close = token_id("}"), t_b_close = token_id("\"b\":"), t_a_end = token_id("a\"");
    CHECK(t_open >= 0 && t_qa >= 0 && t_colon >= 0 && t_1 >= 0 && t_comma >= 0 && t_q >= 0 && t_a_close >= 0 &&
          t_ab_close >= 0 && t_close >= 0 && t_b_close >= 0 && t_a_end >= 0);
    uint32_t mask[WORDS];
    int seq[] = {t_open, t_qa, t_colon, t_1, t_comma, t_q};
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) CHECK(di_matcher_advance(m, seq[i]) == DI_OK);
    /* {"a":1," */
    CHECK(di_matcher_fill_mask(m, mask, WORDS) == DI_OK);
    CHECK(!has(mask, t_a_close) && !has(mask, t_a_end));
    CHECK(has(mask, t_ab_close));
    CHECK(di_matcher_advance(m, t_a_close) != DI_OK);
    CHECK(di_matcher_advance(m, t_a_end) != DI_OK);
    /* back to {"a":1 then on: "b": is fine, and a second "b": is masked */
    CHECK(di_matcher_rollback(m, 2) == DI_OK);
    CHECK(di_matcher_fill_mask(m, mask, WORDS) == DI_OK);
    CHECK(has(mask, t_comma) && has(mask, t_close));
    CHECK(di_matcher_advance(m, t_comma) == DI_OK);
    CHECK(di_matcher_advance(m, t_b_close) == DI_OK);
    CHECK(di_matcher_advance(m, t_1) == DI_OK);
    CHECK(di_matcher_advance(m, t_comma) == DI_OK);
    CHECK(di_matcher_fill_mask(m, mask, WORDS) == DI_OK);
    CHECK(!has(mask, t_b_close));
    CHECK(di_matcher_advance(m, t_b_close) != DI_OK);
    /* roll back past the key "a": now "a" may come (once) */
    CHECK(di_matcher_rollback(m, 7) == DI_OK); /* back to { */
    CHECK(di_matcher_advance(m, t_b_close) == DI_OK);
    CHECK(di_matcher_advance(m, t_1) == DI_OK);
    CHECK(di_matcher_advance(m, t_comma) == DI_OK);
    CHECK(di_matcher_advance(m, t_q) == DI_OK);
    CHECK(di_matcher_fill_mask(m, mask, WORDS) == DI_OK);
    CHECK(has(mask, t_a_close) && has(mask, t_a_end));
    CHECK(di_matcher_advance(m, t_a_close) == DI_OK);
    di_matcher_free(m);
done:
    di_grammar_free(g);
    di_grammar_free(decl);
    di_grammar_free(any);
    di_grammar_free(rx);
    di_vocab_free(v);
}

/* Byte offset where the tracker refuses s (a repeated key), or -1. */
static long tracker_refuses(const char *s) {
    di_json_keys k;
    di_jk_state st, next;
    if (di_json_keys_init(&k, &st)) return -2;
    long at = -1;
    for (size_t i = 0; s[i]; i++) {
        int r = di_json_keys_step(&k, &st, (uint8_t)s[i], &next);
        if (r) { at = r == DI_JK_DUPLICATE ? (long)i : -2; break; }
        st = next;
    }
    di_json_keys_free(&k);
    return at;
}

/* The tracker on its own, with escapes the grammars do not produce today:
 * keys compare as a JSON parser decodes them (the offsets are those where
 * Python's json with an object_pairs_hook first sees the repeated key). */
static void test_key_tracker_decodes(void) {
    struct { const char *text; long at; } cases[] = {
        {"{\"a\":1,\"\\u0061\":2}", 14},
        {"{\"\xc3\xa9\":1,\"\\u00E9\":2}", 15},
        {"{\"\xc3\xa9\":1,\"\\u00e9x\":2}", -1},
        {"{\"\xf0\x9f\x98\x80\":1,\"\\ud83d\\ude00\":2}", 23},       /* a surrogate pair is one character */
        {"{\"\\ud83d\":1,\"\\ud83d\\u0041\":2}", -1},                /* a lone surrogate stays itself */
        {"{\"\\ud83d\":1,\"\\ud83d\\u0041\":2,\"\\ud83dA\":3}", 37},
        {"{\"\\ud83d\":1,\"\\ud83d\\ude00\":2,\"\xf0\x9f\x98\x80\":3}", 34},
        {"{\"\\/\\n\":1,\"/\\u000A\":2}", 18},
        {"{\"a\":{\"a\":{\"a\":1}},\"b\":[{\"a\":1,\"b\":2}],\"c\":\"\\\"a\\\"\"}", -1},
        {"[{\"a\":1},{\"a\":1,\"b\":[1,{\"a\":{}}],\"a\":2}]", 35},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECKF(tracker_refuses(cases[i].text) == cases[i].at, "%s: refused at %ld, want %ld", cases[i].text,
               tracker_refuses(cases[i].text), cases[i].at);
}

/* 1 when some object in the tree has two members with the same name
 * (cJSON keeps both and decodes escapes, surrogate pairs included). */
static int has_repeated_key(const cJSON *x) {
    for (const cJSON *a = x ? x->child : NULL; a; a = a->next) {
        if (cJSON_IsObject(x))
            for (const cJSON *b = a->next; b; b = b->next)
                if (a->string && b->string && !strcmp(a->string, b->string)) return 1;
        if (has_repeated_key(a)) return 1;
    }
    return 0;
}

/* Random walks under the mask to the end: the output never repeats a key
 * (before the fix, "additionalProperties" let a walk repeat keys until the
 * step limit). Masks are also checked against advance on the way. */
static void test_random_walks_no_repeated_keys(void) {
    di_vocab *v = rich_vocab();
    const char *schemas[] = {
        "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
        "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"null\"}}}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},\"additionalProperties\":false}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":\"boolean\"}}",
        "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}}",
    };
    int mismatches = 0, repeated = 0, finished = 0, walks = 0;
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        di_grammar *g = compile(v, DI_CONSTRAINT_JSON_SCHEMA, schemas[i]);
        if (!g) continue;
        walk_and_compare(g, schemas[i], 4, 24, 1, &mismatches);
        for (int w = 0; w < 40; w++, walks++) {
            di_matcher *m = NULL;
            if (di_matcher_create(g, &m)) break;
            char out[4096];
            size_t n = 0;
            for (int step = 0; step < 200; step++) {
                uint32_t mask[WORDS];
                CHECK(di_matcher_fill_mask(m, mask, WORDS) == DI_OK);
                if (has(mask, EOS) && rnd() % 4 == 0) { finished++; break; }
                int allowed[NV], na = 0;
                for (int t = 0; t < (int)N_TOKS; t++)
                    if (has(mask, t)) allowed[na++] = t;
                if (!na) { finished += has(mask, EOS); break; }
                int t = allowed[rnd() % (uint32_t)na];
                size_t l = strlen(toks[t]);
                if (n + l >= sizeof out) break;
                CHECK(di_matcher_advance(m, t) == DI_OK);
                memcpy(out + n, toks[t], l);
                n += l;
            }
            out[n] = 0;
            if (di_matcher_is_accepting(m)) {
                cJSON *j = cJSON_ParseWithLength(out, n);
                CHECKF(j != NULL, "walk output is not JSON: %s", out);
                if (j && has_repeated_key(j) && repeated++ < 4) fprintf(stderr, "repeated key: %s\n", out);
                cJSON_Delete(j);
            }
            di_matcher_free(m);
        }
        di_grammar_free(g);
    }
    CHECK_EQ_INT(mismatches, 0);
    CHECK_EQ_INT(repeated, 0);
    CHECKF(finished > walks / 2, "%d of %d walks finished", finished, walks);
    di_vocab_free(v);
}

int main(void) {
    RUN(test_masks_rich_vocab);
    RUN(test_repeated_keys_refused);
    RUN(test_key_tracker_decodes);
    RUN(test_random_walks_no_repeated_keys);
    return test_summary();
}
