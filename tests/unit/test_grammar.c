/* Constraint engine: regex / JSON Schema / EBNF / choices front ends,
 * matcher (advance, rollback, accepting, mask), limits and error messages,
 * and a differential test of masks against a brute-force oracle on random
 * regexes over a small vocabulary. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deepinfer.h"
#include "test.h"

/* ------------------------------------------------------------ helpers */

/* A vocabulary of every string over {a, b, c} up to length 3, plus some
 * JSON-ish tokens, plus EOS and an id without bytes. */
#define NV 64
static const char *vt[NV];
static int nv;
static di_vocab *small_vocab(void) {
    static char store[NV][8];
    nv = 0;
    const char *alpha = "abc";
    for (int len = 1; len <= 3; len++) {
        int total = 1;
        for (int i = 0; i < len; i++) total *= 3;
        for (int k = 0; k < total; k++) {
            int x = k;
            for (int i = 0; i < len; i++) { store[nv][i] = alpha[x % 3]; x /= 3; }
            store[nv][len] = 0;
            vt[nv] = store[nv];
            nv++;
        }
    }
    const char *extra[] = {"{", "}", "\"", "\":", ",", "1", "2", "0", "-", ".", " ", "[", "]", "\"a", "a\"", "tr", "ue",
                           "null", "x", "y", NULL};
    for (int i = 0; extra[i] && nv < NV - 2; i++) vt[nv++] = extra[i];
    vt[nv++] = ""; /* EOS */
    vt[nv++] = ""; /* unused id */
    const uint8_t *bs[NV];
    size_t ls[NV];
    for (int i = 0; i < nv; i++) { bs[i] = (const uint8_t *)vt[i]; ls[i] = strlen(vt[i]); }
    di_vocab *v = NULL;
    CHECK(di_vocab_create((size_t)nv, bs, ls, nv - 2, &v) == DI_OK);
    return v;
}

static di_grammar *compile(di_vocab *v, di_constraint_kind k, const char *text, const di_grammar_options *o) {
    di_grammar *g = NULL;
    di_status st = di_grammar_compile(v, k, text, text ? strlen(text) : 0, o, &g);
    CHECKF(st == DI_OK, "compile %s: %s", text ? text : "(null)", di_last_error());
    return g;
}

static int accepts(const di_grammar *g, const char *s) {
    di_matcher *m = NULL;
    if (di_matcher_create(g, &m)) return -1;
    int ok = di_matcher_advance_bytes(m, (const uint8_t *)s, strlen(s)) == DI_OK && di_matcher_is_accepting(m);
    di_matcher_free(m);
    return ok;
}

static void expect(di_vocab *v, di_constraint_kind k, const char *text, const char *const *yes, const char *const *no) {
    di_grammar *g = compile(v, k, text, NULL);
    if (!g) return;
    for (int i = 0; yes && yes[i]; i++) CHECKF(accepts(g, yes[i]) == 1, "%s should accept %s", text, yes[i]);
    for (int i = 0; no && no[i]; i++) CHECKF(accepts(g, no[i]) == 0, "%s should reject %s", text, no[i]);
    di_grammar_free(g);
}

static void expect_error(di_vocab *v, di_constraint_kind k, const char *text, di_status code, const char *needle) {
    di_grammar *g = NULL;
    di_status st = di_grammar_compile(v, k, text, strlen(text), NULL, &g);
    CHECKF(st == code, "%s: status %d, want %d (%s)", text, st, code, di_last_error());
    if (st) CHECK_STR_CONTAINS(di_last_error(), needle);
    di_grammar_free(g);
}

/* -------------------------------------------------------------- tests */

static void test_regex(void) {
    di_vocab *v = small_vocab();
    expect(v, DI_CONSTRAINT_REGEX, "a(b|c)*1{1,2}", (const char *[]){"a1", "abcb11", NULL}, (const char *[]){"a", "a111", "ba1", NULL});
    expect(v, DI_CONSTRAINT_REGEX, "[^a-c]+", (const char *[]){"xyz", "é", "\xe4\xb8\xad", NULL}, (const char *[]){"xa", "", "\xe4\xb8", NULL});
    expect(v, DI_CONSTRAINT_REGEX, "\\d{2,3}-\\w\\s?.", (const char *[]){"12-a b", "123-_x", NULL}, (const char *[]){"1-a b", "12-a \n", NULL});
    expect(v, DI_CONSTRAINT_REGEX, "^(?:ab|c)?$", (const char *[]){"", "ab", "c", NULL}, (const char *[]){"abc", "a", NULL});
    expect(v, DI_CONSTRAINT_REGEX, "\\u00e9\\x41[\\u{1F600}-\\u{1F601}]", (const char *[]){"éA\xf0\x9f\x98\x80", NULL}, (const char *[]){"éA", NULL});
    expect(v, DI_CONSTRAINT_REGEX, "a{2}b{0,}c{1,}", (const char *[]){"aac", "aabbcc", NULL}, (const char *[]){"ac", "aab", NULL});
    expect_error(v, DI_CONSTRAINT_REGEX, "(?=a)b", DI_ERR_UNSUPPORTED, "lookahead");
    expect_error(v, DI_CONSTRAINT_REGEX, "(a)\\1", DI_ERR_UNSUPPORTED, "backreference");
    expect_error(v, DI_CONSTRAINT_REGEX, "a\\bc", DI_ERR_UNSUPPORTED, "word boundary");
    expect_error(v, DI_CONSTRAINT_REGEX, "\\p{L}", DI_ERR_UNSUPPORTED, "\\p{...}");
    expect_error(v, DI_CONSTRAINT_REGEX, "ab(c", DI_ERR_FORMAT, "column 5");
    expect_error(v, DI_CONSTRAINT_REGEX, "a**", DI_ERR_FORMAT, "nothing to repeat");
    expect_error(v, DI_CONSTRAINT_REGEX, "[z-a]", DI_ERR_FORMAT, "out of order");
    expect_error(v, DI_CONSTRAINT_REGEX, "(a{1000}){1000}", DI_ERR_LIMIT, "states");
    di_vocab_free(v);
}

static void test_json_schema(void) {
    di_vocab *v = small_vocab();
    expect(v, DI_CONSTRAINT_JSON_SCHEMA,
           "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":120},"
           "\"b\":{\"type\":\"string\",\"maxLength\":2}},\"required\":[\"a\"],\"additionalProperties\":false}",
           (const char *[]){"{\"a\":-5}", "{\"a\": 120, \"b\": \"xy\"}", "{\"b\":\"\",\"a\":7}", "{ \"a\" : 0 }", NULL},
           (const char *[]){"{}", "{\"a\":121}", "{\"a\":-6}", "{\"a\":1,\"b\":\"xyz\"}", "{\"a\":1,\"c\":1}",
                            "{\"a\":1.5}", "{\"a\":01}", NULL});
    /* additionalProperties defaults to true, with any value */
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"properties\":{\"a\":{\"type\":\"boolean\"}}}",
           (const char *[]){"{\"z\":[1,{\"q\":null}],\"a\":true}", "[]", "\"s\"", "-1.5e3", NULL},
           (const char *[]){"{\"a\":1}", "{\"a\":true,}", NULL});
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"array\",\"prefixItems\":[{\"const\":1}],\"items\":{\"enum\":[\"x\",null]},\"minItems\":2,\"maxItems\":3}",
           (const char *[]){"[1,\"x\"]", "[1,null,\"x\"]", NULL}, (const char *[]){"[1]", "[2,\"x\"]", "[1,\"x\",null,null]", "[1,\"y\"]", NULL});
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"anyOf\":[{\"type\":\"string\",\"pattern\":\"^a+$\"},{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1}]}",
           (const char *[]){"\"aaa\"", "0.5", "1", "1.0", NULL}, (const char *[]){"\"ab\"", "0", "1.5", "-0.5", NULL});
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"c\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}},\"additionalProperties\":false}},\"$ref\":\"#/$defs/n\"}",
           (const char *[]){"{}", "{\"c\":[{},{\"c\":[]}]}", NULL}, (const char *[]){"{\"c\":[1]}", NULL});
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}}},{\"properties\":{\"a\":{\"minimum\":3}},\"required\":[\"a\"]}]}",
           (const char *[]){"{\"a\":3}", NULL}, (const char *[]){"{\"a\":2}", "{}", "{\"a\":3.5}", NULL});
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"date\"}",
           (const char *[]){"\"2024-02-28\"", NULL}, (const char *[]){"\"2024-02-30\"", "\"2024-13-01\"", NULL});
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}",
           (const char *[]){"\"a\"", "3", NULL}, (const char *[]){"null", NULL});
    /* patterns see decoded characters, in their canonical JSON encoding */
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"^[\\\"\\\\n]+$\"}",
           (const char *[]){"\"\\\"\\n\"", NULL}, (const char *[]){"\"n\"", "\"\\u000a\"", NULL});
    /* not {required}: an object without the key */
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"not\":{\"required\":[\"a\"]}}",
           (const char *[]){"{}", "{\"b\":1}", NULL}, (const char *[]){"{\"a\":1}", "1", "\"a\"", NULL});
    expect_error(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"not\":{\"multipleOf\":2}}", DI_ERR_UNSUPPORTED, "'not'");
    expect_error(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"not\":{}}", DI_ERR_INVALID_ARG, "admits no output");
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"type\":[\"string\",\"null\",\"array\"],\"not\":{\"type\":\"array\"}}",
           (const char *[]){"\"x\"", "null", NULL}, (const char *[]){"[]", "1", NULL});
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"string\",\"not\":{\"pattern\":\"^a\"}}",
           (const char *[]){"\"ba\"", "\"\"", NULL}, (const char *[]){"\"ab\"", "\"\\u0061\"", NULL});
    /* overlapping branches: each minus the others */
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"oneOf\":[{\"type\":\"string\"},{\"minLength\":1}]}",
           (const char *[]){"\"\"", "1", "null", NULL}, (const char *[]){"\"a\"", NULL});
    expect_error(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"oneOf\":[{\"multipleOf\":2},{\"multipleOf\":3}]}",
                 DI_ERR_UNSUPPORTED, "oneOf whose branches may overlap");
    /* string-only branches */
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"oneOf\":[{\"enum\":[\"a\",\"b\"]},{\"type\":\"string\",\"pattern\":\"^c\"}]}",
           (const char *[]){"\"a\"", "\"cx\"", NULL}, (const char *[]){"\"d\"", "\"ac\"", NULL});
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"oneOf\":[{\"enum\":[\"a\",\"b\"]},{\"type\":\"string\",\"pattern\":\"^a\"}]}",
           (const char *[]){"\"b\"", "\"ab\"", NULL}, (const char *[]){"\"a\"", "\"c\"", NULL});
    /* objects: a required key the other branch forbids */
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"a\"],\"additionalProperties\":false},"
           "{\"type\":\"object\",\"properties\":{\"b\":{}},\"required\":[\"b\"],\"additionalProperties\":false}]}",
           (const char *[]){"{\"a\":1}", "{\"b\":[]}", NULL}, (const char *[]){"{\"a\":1,\"b\":2}", "{}", NULL});
    expect_error(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"type\":\n  \"string\",,}", DI_ERR_FORMAT, "line 2");
    expect_error(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"$ref\":\"#/$defs/missing\"}", DI_ERR_NOT_FOUND, "missing");
    expect_error(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"(?<=a)b\"}", DI_ERR_UNSUPPORTED, "lookbehind");
    /* lenient skips what it cannot enforce */
    di_grammar_options o;
    di_grammar_options_default(&o);
    o.lenient = 1;
    di_grammar *g = compile(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"integer\",\"not\":{\"multipleOf\":2}}", &o);
    if (g) CHECK(accepts(g, "2") == 1);
    di_grammar_free(g);
    /* const/enum objects in any member order; NUL inside strings */
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"enum\":[{\"a\":1,\"b\":[2]},\"x\"]}",
           (const char *[]){"{\"a\":1,\"b\":[2]}", "{\"b\":[2],\"a\":1.0}", "\"x\"", NULL},
           (const char *[]){"{\"a\":1}", "{\"a\":1,\"b\":[2],\"c\":0}", "{\"b\":[2.5],\"a\":1}", NULL});
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"const\":\"a\\u0000b\"}", (const char *[]){"\"a\\u0000b\"", NULL},
           (const char *[]){"\"ab\"", "\"a\"", "\"a\\u0000\"", NULL});
    expect(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"object\",\"required\":[\"a\\u0000\"]}",
           (const char *[]){"{\"a\\u0000\":1}", NULL}, (const char *[]){"{\"a\":1}", "{}", NULL});
    /* format: checked by default, an annotation or asserted exactly by option */
    di_grammar_options_default(&o);
    o.format_mode = DI_FORMAT_ANNOTATION;
    g = compile(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"date\"}", &o);
    if (g) CHECK(accepts(g, "\"2024-02-30\"") == 1);
    di_grammar_free(g);
    o.format_mode = DI_FORMAT_ASSERT;
    g = compile(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"date\"}", &o);
    if (g) CHECK(accepts(g, "\"2024-02-29\"") == 1 && accepts(g, "\"2100-02-29\"") == 0 && accepts(g, "\"2000-02-29\"") == 1);
    di_grammar_free(g);
    g = compile(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"format\":\"time\"}", &o);
    if (g) CHECK(accepts(g, "\"23:59:60Z\"") == 1 && accepts(g, "\"15:59:60-08:00\"") == 1 && accepts(g, "\"15:59:60Z\"") == 0);
    di_grammar_free(g);
    g = NULL;
    CHECK(di_grammar_compile(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"format\":\"email\"}", 18, &o, &g) == DI_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(di_last_error(), "format 'email'");
    /* forbid additional properties by option; compact whitespace */
    di_grammar_options_default(&o);
    o.forbid_additional_properties = 1;
    o.whitespace = DI_WS_COMPACT;
    g = compile(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"properties\":{\"a\":{}}}", &o);
    if (g) {
        CHECK(accepts(g, "{\"a\":[1,2]}") == 1);
        CHECK(accepts(g, "{\"a\": 1}") == 0);
        CHECK(accepts(g, "{\"b\":1}") == 0);
    }
    di_grammar_free(g);
    /* whitespace is bounded */
    di_grammar_options_default(&o);
    o.max_whitespace = 2;
    g = compile(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"array\"}", &o);
    if (g) {
        CHECK(accepts(g, "[  1  ,  2  ]") == 1);
        CHECK(accepts(g, "[   1]") == 0);
    }
    di_grammar_free(g);
    /* limits */
    di_grammar_options_default(&o);
    o.max_depth = 3;
    g = NULL;
    const char *deep = "{\"items\":{\"items\":{\"items\":{\"items\":{}}}}}";
    CHECK(di_grammar_compile(v, DI_CONSTRAINT_JSON_SCHEMA, deep, strlen(deep), &o, &g) == DI_ERR_LIMIT);
    CHECK_STR_CONTAINS(di_last_error(), "depth");
    di_grammar_options_default(&o);
    o.max_rules = 50;
    CHECK(di_grammar_compile(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"array\",\"minItems\":100}", 32, &o, &g) == DI_ERR_LIMIT);
    CHECK_STR_CONTAINS(di_last_error(), "exceeds");
    di_grammar_options_default(&o);
    o.max_repeat = 10;
    /* string lengths past max_repeat go in chunks of max_repeat characters */
    g = compile(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"string\",\"minLength\":9,\"maxLength\":21}", &o);
    if (g) {
        CHECK(accepts(g, "\"aaaaaaaa\"") == 0 && accepts(g, "\"aaaaaaaaa\"") == 1);
        CHECK(accepts(g, "\"aaaaaaaaaa\"") == 1 && accepts(g, "\"aaaaaaaaaaaaaaaaaaaa\"") == 1);
        CHECK(accepts(g, "\"aaaaaaaaaaaaaaaaaaa\\n\"") == 1 && accepts(g, "\"aaaaaaaaaaaaaaaaaaaaaa\"") == 0);
    }
    di_grammar_free(g);
    g = NULL;
    CHECK(di_grammar_compile(v, DI_CONSTRAINT_JSON_SCHEMA, "{\"maxLength\":41000}", 19, &o, &g) == DI_ERR_LIMIT);
    CHECK_STR_CONTAINS(di_last_error(), "max_repeat");
    di_vocab_free(v);
}

static void test_ebnf_and_choices(void) {
    di_vocab *v = small_vocab();
    const char *gr = "# a list\nroot ::= \"[\" item (\",\" item)* \"]\"\nitem ::= [a-c]+ | num\nnum ::= [0-9]{1,3}\n    | \"-\" num\n";
    expect(v, DI_CONSTRAINT_EBNF, gr, (const char *[]){"[abc,12,-3]", "[a]", "[--1]", NULL},
           (const char *[]){"[]", "[abcd]", "[1234]", "[a,]", NULL});
    expect(v, DI_CONSTRAINT_EBNF, "root ::= x\nx ::= \"(\" x \")\" | \"\"\n", (const char *[]){"", "((()))", NULL},
           (const char *[]){"(()", ")(", NULL});
    expect(v, DI_CONSTRAINT_EBNF, "root ::= 'a' [^a\\n] . \"\\x41\\u00e9\" (\"b\"? \"c\"){2}\n",
           (const char *[]){"abxAécbc", "azzAécc", NULL}, (const char *[]){"aaxAécc", "a\nxAécc", NULL});
    expect_error(v, DI_CONSTRAINT_EBNF, "root ::= \"a\" (\n", DI_ERR_FORMAT, "line 2, column 1");
    expect_error(v, DI_CONSTRAINT_EBNF, "root ::= a\n", DI_ERR_FORMAT, "undefined rule 'a' at line 1, column 10");
    expect_error(v, DI_CONSTRAINT_EBNF, "start ::= \"a\"\n", DI_ERR_FORMAT, "root");
    expect_error(v, DI_CONSTRAINT_EBNF, "root ::= <[12]>\n", DI_ERR_UNSUPPORTED, "token reference");
    expect_error(v, DI_CONSTRAINT_EBNF, "root ::= \"a\n\"", DI_ERR_FORMAT, "unterminated");
    expect(v, DI_CONSTRAINT_CHOICE, "[\"ab\", \"abc\", \"c\\\"\"]", (const char *[]){"ab", "abc", "c\"", NULL},
           (const char *[]){"a", "abcc", "", NULL});
    expect(v, DI_CONSTRAINT_JSON_OBJECT, NULL, (const char *[]){"{}", "{\"a\":[1,\"x\",{}]}", NULL},
           (const char *[]){"[]", "1", NULL});
    di_vocab_free(v);
}

static int has(const uint32_t *mask, int t) { return (mask[t >> 5] >> (t & 31)) & 1; }

static void test_matcher_tokens(void) {
    di_vocab *v = small_vocab();
    int eos = nv - 2, unused = nv - 1;
    di_grammar *g = compile(v, DI_CONSTRAINT_REGEX, "ab(c|cc)", NULL);
    di_matcher *m = NULL;
    if (!g || di_matcher_create(g, &m)) { di_grammar_free(g); di_vocab_free(v); return; }
    uint32_t mask[(NV + 31) / 32];
    CHECK(di_matcher_fill_mask(m, mask, 1) == DI_ERR_INVALID_ARG); /* too small */
    CHECK(di_matcher_fill_mask(m, mask, 2) == DI_OK);
    for (int t = 0; t < nv; t++) {
        int want = (!strcmp(vt[t], "a") || !strcmp(vt[t], "ab") || !strcmp(vt[t], "abc"));
        CHECKF(has(mask, t) == want, "token %d '%s'", t, vt[t]);
    }
    CHECK(!has(mask, eos) && !has(mask, unused));
    int t_ab = -1, t_c = -1, t_cc = -1;
    for (int t = 0; t < nv; t++) {
        if (!strcmp(vt[t], "ab")) t_ab = t;
        if (!strcmp(vt[t], "c")) t_c = t;
        if (!strcmp(vt[t], "cc")) t_cc = t;
    }
    CHECK(di_matcher_advance(m, t_c) == DI_ERR_INVALID_ARG); /* not allowed: unchanged */
    CHECK(di_matcher_advance(m, eos) == DI_ERR_INVALID_ARG);
    CHECK(di_matcher_advance(m, unused) == DI_ERR_INVALID_ARG);
    CHECK(di_matcher_advance(m, NV + 5) == DI_ERR_INVALID_ARG);
    CHECK(di_matcher_advance(m, t_ab) == DI_OK);
    CHECK(!di_matcher_is_accepting(m));
    CHECK(di_matcher_advance(m, t_c) == DI_OK);
    CHECK(di_matcher_is_accepting(m));
    di_matcher_fill_mask(m, mask, 2);
    CHECK(has(mask, eos) && has(mask, t_c) && !has(mask, t_cc));
    CHECK(di_matcher_rollback(m, 3) == DI_ERR_INVALID_ARG);
    CHECK(di_matcher_rollback(m, 1) == DI_OK);
    CHECK(!di_matcher_is_accepting(m));
    CHECK(di_matcher_advance(m, t_cc) == DI_OK);
    CHECK(di_matcher_advance(m, eos) == DI_OK);
    CHECK(di_matcher_is_finished(m));
    CHECK(di_matcher_advance(m, t_c) == DI_ERR_STATE);
    di_matcher_fill_mask(m, mask, 2);
    CHECK(mask[0] == 0 && mask[1] == 0);
    CHECK(di_matcher_rollback(m, 2) == DI_OK); /* undo EOS and cc */
    CHECK(!di_matcher_is_finished(m) && !di_matcher_is_accepting(m));
    CHECK(di_matcher_rollback(m, 1) == DI_OK);
    di_matcher_fill_mask(m, mask, 2);
    CHECK(has(mask, t_ab));
    di_matcher_free(m);
    di_grammar_free(g);
    /* bad vocabularies */
    di_vocab *bad = NULL;
    const uint8_t *bs[1] = {(const uint8_t *)"a"};
    size_t ls[1] = {1};
    CHECK(di_vocab_create(0, bs, ls, -1, &bad) == DI_ERR_INVALID_ARG);
    CHECK(di_vocab_create(1, bs, ls, 5, &bad) == DI_ERR_INVALID_ARG);
    di_vocab_free(v);
}

/* ------------------------------------------- differential: brute force */

/* Random regex over {a, b, c} as a tiny AST, printed for the engine and
 * matched by an independent backtracking matcher. */
typedef struct rnode {
    int kind; /* 0 char class (mask of a/b/c), 1 cat, 2 alt, 3 repeat */
    int mask, a, b, min, max;
} rnode;
static rnode rn[64];
static int n_rn;
static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)rng; }

static int gen(int depth) {
    int id = n_rn++;
    int k = depth >= 3 ? 0 : (int)(rnd() % 4);
    rn[id].kind = k;
    if (k == 0) rn[id].mask = 1 + (int)(rnd() % 7);
    else if (k == 1 || k == 2) { rn[id].a = gen(depth + 1); rn[id].b = gen(depth + 1); }
    else { rn[id].a = gen(depth + 1); rn[id].min = (int)(rnd() % 2); rn[id].max = rn[id].min + (int)(rnd() % 3); }
    return id;
}

static void print_rx(int id, char *out) {
    char buf[512];
    const rnode *x = &rn[id];
    if (x->kind == 0) {
        strcat(out, "[");
        for (int i = 0; i < 3; i++) if (x->mask >> i & 1) { char c[2] = {(char)('a' + i), 0}; strcat(out, c); }
        strcat(out, "]");
    } else if (x->kind == 1) { strcat(out, "(?:"); print_rx(x->a, out); print_rx(x->b, out); strcat(out, ")"); }
    else if (x->kind == 2) { strcat(out, "(?:"); print_rx(x->a, out); strcat(out, "|"); print_rx(x->b, out); strcat(out, ")"); }
    else {
        strcat(out, "(?:"); print_rx(x->a, out);
        snprintf(buf, sizeof buf, "){%d,%d}", x->min, x->max);
        strcat(out, buf);
    }
}

/* Calls k(end) for every end such that node id matches s[pos..end). */
static int match_node(int id, const char *s, int pos, int n, int (*k)(int, void *), void *ctx);
typedef struct cont { int id; int (*k)(int, void *); void *ctx; const char *s; int n; int count; } cont;
static int cat_k(int end, void *p) { cont *c = p; return match_node(rn[c->id].b, c->s, end, c->n, c->k, c->ctx); }
static int rep_k(int end, void *p);
static int rep_from(cont *c, int pos) {
    const rnode *x = &rn[c->id];
    if (c->count >= x->min && c->k(pos, c->ctx)) return 1;
    if (c->count < x->max) {
        cont d = *c;
        d.count++;
        /* guard against empty loops */
        return match_node(x->a, c->s, pos, c->n, rep_k, &d);
    }
    return 0;
}
static int rep_k(int end, void *p) { return rep_from((cont *)p, end); }
static int match_node(int id, const char *s, int pos, int n, int (*k)(int, void *), void *ctx) {
    const rnode *x = &rn[id];
    if (x->kind == 0) return pos < n && s[pos] >= 'a' && s[pos] <= 'c' && (x->mask >> (s[pos] - 'a') & 1) && k(pos + 1, ctx);
    if (x->kind == 1) { cont c = {id, k, ctx, s, n, 0}; return match_node(x->a, s, pos, n, cat_k, &c); }
    if (x->kind == 2) return match_node(x->a, s, pos, n, k, ctx) || match_node(x->b, s, pos, n, k, ctx);
    cont c = {id, k, ctx, s, n, 0};
    return rep_from(&c, pos);
}
static int end_k(int end, void *p) { return end == *(int *)p; }
static int full_match(int root, const char *s, int n) { return match_node(root, s, 0, n, end_k, &n); }

/* prefix p (length n) can be completed: some extension of up to 8 chars
 * over {a,b,c} fully matches */
static int viable(int root, char *buf, int n, int room) {
    if (full_match(root, buf, n)) return 1;
    if (!room) return 0;
    for (int c = 0; c < 3; c++) {
        buf[n] = (char)('a' + c);
        if (viable(root, buf, n + 1, room - 1)) return 1;
    }
    return 0;
}

static void test_mask_differential(void) {
    di_vocab *v = small_vocab();
    int eos = nv - 2;
    int n_checked = 0, mismatches = 0;
    for (int trial = 0; trial < 30; trial++) {
        n_rn = 0;
        int root = gen(0);
        char rx[2048] = "";
        print_rx(root, rx);
        di_grammar *g = NULL;
        if (di_grammar_compile(v, DI_CONSTRAINT_REGEX, rx, strlen(rx), NULL, &g) != DI_OK) {
            /* an empty language is refused; anything else is a failure */
            CHECKF(strstr(di_last_error(), "admits no output") != NULL, "%s: %s", rx, di_last_error());
            continue;
        }
        di_matcher *m = NULL;
        CHECK(di_matcher_create(g, &m) == DI_OK);
        char prefix[64] = "";
        int plen = 0;
        for (int step = 0; step < 6 && m; step++) {
            uint32_t mask[(NV + 31) / 32];
            di_matcher_fill_mask(m, mask, 2);
            int allowed[NV], na = 0;
            for (int t = 0; t < nv; t++) {
                int want;
                if (t == eos) want = full_match(root, prefix, plen);
                else if (!vt[t][0]) want = 0;
                else {
                    char buf[64];
                    int l = (int)strlen(vt[t]);
                    int ok = 1;
                    for (int i = 0; i < l; i++) ok &= vt[t][i] >= 'a' && vt[t][i] <= 'c';
                    memcpy(buf, prefix, (size_t)plen);
                    memcpy(buf + plen, vt[t], (size_t)l);
                    want = ok && viable(root, buf, plen + l, 8);
                }
                n_checked++;
                if (has(mask, t) != want) {
                    mismatches++;
                    if (mismatches < 5) fprintf(stderr, "rx %s prefix '%s' token '%s': mask %d brute %d\n", rx, prefix, vt[t], has(mask, t), want);
                }
                if (want && t != eos) allowed[na++] = t;
            }
            if (!na) break;
            int t = allowed[rnd() % (uint32_t)na];
            CHECK(di_matcher_advance(m, t) == DI_OK);
            memcpy(prefix + plen, vt[t], strlen(vt[t]));
            plen += (int)strlen(vt[t]);
            prefix[plen] = 0;
        }
        di_matcher_free(m);
        di_grammar_free(g);
    }
    CHECK_EQ_INT(mismatches, 0);
    CHECK(n_checked > 1000);
    di_vocab_free(v);
}

/* Masks against per-token advancing (which runs the parser byte by byte,
 * not the memoised lexer walks) at every state of random walks, on
 * grammars where lexemes end inside tokens: JSON, numbers, lists. */
static void test_mask_vs_advance(void) {
    di_vocab *v = small_vocab();
    int eos = nv - 2;
    const char *ebnf[] = {
        "root ::= item (\",\" item)*\nitem ::= [ab]+ | \"1\" [0-9]* | \"\\\"\" [a-c]* \"\\\"\" | \"[\" root? \"]\"\n",
        "root ::= (\"a\" | \"ab\" | \"abc\")+ \"c\"? x\nx ::= \"\" | \"b\" x\n",
    };
    const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"array\",\"items\":{\"type\":\"number\"}}}}",
        "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":\"null\"},{\"type\":\"boolean\"}]}}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":2}},\"required\":[\"a\"],\"additionalProperties\":{\"type\":\"integer\"}}",
        /* memo proxies: "any key but a", bounded strings far from the bound */
        "{\"type\":\"object\",\"properties\":{\"a\":false},\"additionalProperties\":{\"type\":\"integer\"}}",
        "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":10}}",
    };
    int mismatches = 0, checked = 0;
    for (int gi = 0; gi < 7; gi++) {
        di_grammar *g = gi < 2 ? compile(v, DI_CONSTRAINT_EBNF, ebnf[gi], NULL) : compile(v, DI_CONSTRAINT_JSON_SCHEMA, schemas[gi - 2], NULL);
        if (!g) continue;
        for (int walk = 0; walk < 12; walk++) {
            di_matcher *m = NULL;
            if (di_matcher_create(g, &m)) break;
            for (int step = 0; step < 12; step++) {
                uint32_t mask[(NV + 31) / 32];
                di_matcher_fill_mask(m, mask, 2);
                int allowed[NV], na = 0;
                for (int t = 0; t < nv; t++) {
                    int ok = di_matcher_advance(m, t) == DI_OK;
                    if (ok) di_matcher_rollback(m, 1);
                    checked++;
                    if (ok != has(mask, t)) {
                        if (mismatches++ < 5) fprintf(stderr, "grammar %d token '%s': mask %d advance %d\n", gi, vt[t], has(mask, t), ok);
                    }
                    if (ok && t != eos) allowed[na++] = t;
                }
                if (!na) break;
                di_matcher_advance(m, allowed[rnd() % (uint32_t)na]);
            }
            di_matcher_free(m);
        }
        di_grammar_free(g);
    }
    CHECK_EQ_INT(mismatches, 0);
    CHECK(checked > 5000);
    di_vocab_free(v);
}

int main(void) {
    RUN(test_regex);
    RUN(test_json_schema);
    RUN(test_ebnf_and_choices);
    RUN(test_matcher_tokens);
    RUN(test_mask_differential);
    RUN(test_mask_vs_advance);
    return test_summary();
}
