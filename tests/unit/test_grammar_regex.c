/* Regex compiler: character classes as byte automata and the bounds on
 * compiling a pattern. Oracles: range membership and a UTF-8 / canonical
 * JSON encoder written here, a Moore minimisation of the produced automaton
 * (a class alone must come out minimal), and hand-checked strings for the
 * slow inputs the fuzzer found. Work budgets are counted steps, not time. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deepinfer.h"
#include "grammar/dfa.h"
#include "grammar/regex.h"
#include "test.h"

/* ------------------------------------------------------------ oracles */

static int enc_utf8(uint32_t c, uint8_t *b) {
    if (c < 0x80) { b[0] = (uint8_t)c; return 1; }
    if (c < 0x800) { b[0] = (uint8_t)(0xC0 | (c >> 6)); b[1] = (uint8_t)(0x80 | (c & 63)); return 2; }
    if (c < 0x10000) {
        b[0] = (uint8_t)(0xE0 | (c >> 12)); b[1] = (uint8_t)(0x80 | ((c >> 6) & 63)); b[2] = (uint8_t)(0x80 | (c & 63));
        return 3;
    }
    b[0] = (uint8_t)(0xF0 | (c >> 18)); b[1] = (uint8_t)(0x80 | ((c >> 12) & 63));
    b[2] = (uint8_t)(0x80 | ((c >> 6) & 63)); b[3] = (uint8_t)(0x80 | (c & 63));
    return 4;
}

/* c inside a JSON string literal, quotes included, in its canonical form
 * (RFC 8259 short escapes, \u00xx for the other controls). */
static int enc_json(uint32_t c, uint8_t *b) {
    int n = 0;
    b[n++] = '"';
    const char *sh = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == 8 ? "\\b" : c == 9 ? "\\t" : c == 10 ? "\\n"
                   : c == 12 ? "\\f" : c == 13 ? "\\r" : NULL;
    char buf[8];
    if (!sh && c < 0x20) { snprintf(buf, sizeof buf, "\\u%04x", c); sh = buf; }
    if (sh) { memcpy(b + n, sh, strlen(sh)); n += (int)strlen(sh); }
    else n += enc_utf8(c, b + n);
    b[n++] = '"';
    return n;
}

typedef struct range { uint32_t lo, hi; } range;

static int in_ranges(const range *r, int n, uint32_t c) {
    for (int i = 0; i < n; i++)
        if (c >= r[i].lo && c <= r[i].hi) return 1;
    return 0;
}

/* Number of states of the minimal automaton equivalent to d (Moore's
 * partition refinement over all states; d is trimmed, so every state is
 * reachable and only state 0 is dead). */
static const di_dfa *cmp_dfa;
static const uint32_t *cmp_block;
static int cmp_sig(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b, nc = cmp_dfa->n_classes;
    if (cmp_block[x] != cmp_block[y]) return cmp_block[x] < cmp_block[y] ? -1 : 1;
    for (uint32_t k = 0; k < nc; k++) {
        uint32_t bx = cmp_block[cmp_dfa->trans[(size_t)x * nc + k]], by = cmp_block[cmp_dfa->trans[(size_t)y * nc + k]];
        if (bx != by) return bx < by ? -1 : 1;
    }
    return 0;
}

static uint32_t minimal_states(const di_dfa *d) {
    uint32_t n = d->n_states;
    uint32_t *block = malloc(n * sizeof *block), *next = malloc(n * sizeof *next), *order = malloc(n * sizeof *order);
    for (uint32_t s = 0; s < n; s++) block[s] = d->accept[s] ? 1 : 0;
    uint32_t count = 0, prev = UINT32_MAX;
    while (count != prev) {
        prev = count;
        for (uint32_t s = 0; s < n; s++) order[s] = s;
        cmp_dfa = d;
        cmp_block = block;
        qsort(order, n, sizeof *order, cmp_sig);
        count = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (i && cmp_sig(&order[i - 1], &order[i])) count++;
            next[order[i]] = count;
        }
        count++;
        memcpy(block, next, n * sizeof *block);
    }
    free(block);
    free(next);
    free(order);
    return count;
}

static di_dfa compile_ok(const char *rx, unsigned flags) {
    di_dfa d;
    di_err err = {0};
    di_status st = di_regex_compile(rx, strlen(rx), flags, 500000, &d, &err);
    CHECKF(st == DI_OK, "%s: %s", rx, err.msg);
    if (st) memset(&d, 0, sizeof d);
    return d;
}

static int matches(const di_dfa *d, const char *s) { return di_dfa_matches(d, (const uint8_t *)s, strlen(s)); }

/* Every code point in [lo, hi] stepping by `step` (plus both ends): the
 * automaton of a class accepts its encoding exactly when the oracle does. */
static int scan_class(const di_dfa *d, const range *r, int nr, int negated, int json, uint32_t lo, uint32_t hi,
                      uint32_t step) {
    int bad = 0;
    for (uint64_t c = lo; c <= hi && bad < 5; c = c + step > hi && c < hi ? hi : c + step) {
        uint8_t b[16];
        int n = json ? enc_json((uint32_t)c, b) : enc_utf8((uint32_t)c, b);
        int surrogate = c >= 0xD800 && c <= 0xDFFF;
        int want = !surrogate && in_ranges(r, nr, (uint32_t)c) != negated;
        if (di_dfa_matches(d, b, (size_t)n) != want) {
            fprintf(stderr, "  U+%04llX: automaton %d, oracle %d\n", (unsigned long long)c, !want, want);
            bad++;
        }
        if (c == hi) break;
    }
    return bad;
}

static void range_pattern(const range *r, int nr, int negated, char *out) {
    char *p = out;
    p += sprintf(p, "[%s", negated ? "^" : "");
    for (int i = 0; i < nr; i++) p += sprintf(p, "\\u{%X}-\\u{%X}", r[i].lo, r[i].hi);
    sprintf(p, "]");
}

/* -------------------------------------------------------------- tests */

/* A class alone compiles to its minimal automaton: encodings that share
 * leading bytes or continuation tails share states. Written as one byte
 * chain per encoded range (the old emitter), \W came out with 433 states
 * where 322 suffice, and every state before it carried thousands of NFA
 * states. */
static void test_classes_minimal(void) {
    const char *rx[] = {"\\W", "\\D", "\\S", "[^a]", ".", "[\\u00e9-\\u4e00]", "[^\\x00-\\x7f\\u0800-\\uffff]", "[😀-🙏]", NULL};
    for (int i = 0; rx[i]; i++)
        for (unsigned flags = 0; flags <= DI_RX_JSON_STRING; flags += DI_RX_JSON_STRING) {
            di_dfa d = compile_ok(rx[i], flags);
            if (!d.n_states) continue;
            uint32_t m = minimal_states(&d);
            CHECKF(d.n_states == m, "%s (flags %u): %u states, minimal %u", rx[i], flags, d.n_states, m);
            di_dfa_free(&d);
        }
}

/* Membership of every code point (or a stride through the code space plus
 * every encoding boundary) against the class's ranges, raw UTF-8 and in
 * JSON strings; random range sets stress the trie's prefix and suffix
 * sharing across the 1-4 byte boundaries and around the surrogates. */
static void test_classes_membership(void) {
    static const range fixed[] = {{0x00, 0x7F}, {0x800, 0xFFFF}};
    for (int neg = 0; neg < 2; neg++)
        for (int json = 0; json < 2; json++) {
            char rx[256];
            range_pattern(fixed, 2, neg, rx);
            di_dfa d = compile_ok(rx, json ? DI_RX_JSON_STRING : 0);
            if (!d.n_states) continue;
            CHECKF(scan_class(&d, fixed, 2, neg, json, 0, 0x10FFFF, 1) == 0, "%s json %d: full scan", rx, json);
            di_dfa_free(&d);
        }
    static const uint32_t edges[] = {0, 0x1F, 0x20, 0x22, 0x5C, 0x7F, 0x80, 0x7FF, 0x800, 0xFFF, 0x1000, 0xD7FF,
                                     0xD800, 0xDFFF, 0xE000, 0xFFFF, 0x10000, 0x3FFFF, 0x40000, 0x10FFFF};
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int trial = 0; trial < 24; trial++) {
        range r[6];
        int nr = 1 + trial % 5;
        for (int i = 0; i < nr; i++) {
            uint32_t a, b;
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
            a = (rng & 1) ? edges[(rng >> 8) % 20] + (uint32_t)((rng >> 16) % 3) : (uint32_t)((rng >> 20) % 0x110000);
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
            b = (rng & 1) ? edges[(rng >> 8) % 20] : a + (uint32_t)((rng >> 20) % 0x3000);
            if (a > 0x10FFFF) a = 0x10FFFF;
            if (b > 0x10FFFF) b = 0x10FFFF;
            if (a > b) { uint32_t t = a; a = b; b = t; }
            if (a >= 0xD800 && a <= 0xDFFF) a = 0xD7FF;   /* keep surrogates out of the pattern text */
            if (b >= 0xD800 && b <= 0xDFFF) b = 0xE000;
            r[i].lo = a;
            r[i].hi = b;
        }
        int neg = trial % 3 == 0, json = trial % 2;
        char rx[512];
        range_pattern(r, nr, neg, rx);
        di_dfa d = compile_ok(rx, json ? DI_RX_JSON_STRING : 0);
        if (!d.n_states) continue;
        int bad = scan_class(&d, r, nr, neg, json, 0, 0x10FFFF, 97);
        for (int i = 0; i < 20; i++) {
            uint32_t e = edges[i];
            bad += scan_class(&d, r, nr, neg, json, e > 2 ? e - 2 : 0, e + 2 > 0x10FFFF ? 0x10FFFF : e + 2, 1);
        }
        for (int i = 0; i < nr; i++) {
            bad += scan_class(&d, r, nr, neg, json, r[i].lo > 1 ? r[i].lo - 1 : 0, r[i].lo + 1, 1);
            bad += scan_class(&d, r, nr, neg, json, r[i].hi > 1 ? r[i].hi - 1 : 0, r[i].hi < 0x10FFFF ? r[i].hi + 1 : r[i].hi, 1);
        }
        CHECKF(bad == 0, "%s json %d: %d mismatches", rx, json, bad);
        uint32_t m = minimal_states(&d);
        CHECKF(d.n_states == m, "%s json %d: %u states, minimal %u", rx, json, d.n_states, m);
        di_dfa_free(&d);
    }
}

/* Byte strings that are not well-formed UTF-8 are never a character, even
 * of a class holding nearly every code point. */
static void test_classes_reject_bad_utf8(void) {
    di_dfa d = compile_ok("[^a]", 0);
    if (!d.n_states) return;
    const char *bad[] = {"\xC0\x80", "\xC1\xBF", "\xE0\x9F\xBF", "\xF0\x8F\xBF\xBF", "\xED\xA0\x80", "\xED\xBF\xBF",
                         "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\x80", "\xE2\x82", "\xFF", NULL};
    for (int i = 0; bad[i]; i++) CHECKF(!matches(&d, bad[i]), "bad UTF-8 #%d accepted", i);
    const char *good[] = {"\xED\x9F\xBF", "\xEE\x80\x80", "\xF4\x8F\xBF\xBF", "\xF0\x90\x80\x80", "\xE2\x82\xAC", "b", NULL};
    for (int i = 0; good[i]; i++) CHECKF(matches(&d, good[i]), "good UTF-8 #%d rejected", i);
    di_dfa_free(&d);
}

/* The inputs the fuzzer found slow (seconds under the sanitizers; the old
 * construction needed about 3 x 10^8 steps for the first): a large class
 * after `.+` or inside a search. They now fit a budget of 2^21 steps. */
static void test_slow_inputs_within_budget(void) {
    static const struct {
        const char *rx;
        unsigned flags;
        const char *yes[4], *no[4];
    } cases[] = {
        {".+\\Ww.w", 0, {"a!wbw", "a\xE2\x82\xAC" "w\xE2\x82\xAC" "w", "a\nwbw", NULL}, {"aawbw", "!wbw", "\n!wbw", NULL}},
        {"^\\|||||.+?\\Ww.w/x", 0, {"|", "", "ab!w w/x", NULL}, {"||", "abcw w/x", "ab!w w/", NULL}},
        {"\\W.\\W.\\W", DI_RX_SEARCH | DI_RX_JSON_STRING,
         {"\"a!b!c!d\"", "\"\\n.\\t.\\\"\"", "\"\xC3\x97" "a\xC3\x97" "b\xC3\x97\"", NULL}, {"\"abcde\"", "\"!a!b\"", "\"a!b!c\"", NULL}},
        {".*\\W.*\\W", DI_RX_SEARCH | DI_RX_JSON_STRING, {"\"!!\"", "\"a b c\"", NULL}, {"\"ab!\"", "\"!\"", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        di_dfa d;
        di_err err = {0};
        di_status st = di_regex_compile_bounded(cases[i].rx, strlen(cases[i].rx), cases[i].flags, 20000, (uint64_t)1 << 21,
                                                &d, &err);
        CHECKF(st == DI_OK, "%s: %s", cases[i].rx, err.msg);
        if (st) continue;
        for (int k = 0; cases[i].yes[k]; k++) CHECKF(matches(&d, cases[i].yes[k]), "%s should accept %s", cases[i].rx, cases[i].yes[k]);
        for (int k = 0; cases[i].no[k]; k++) CHECKF(!matches(&d, cases[i].no[k]), "%s should reject %s", cases[i].rx, cases[i].no[k]);
        di_dfa_free(&d);
    }
}

/* Patterns whose automaton cannot be built cheaply are refused with the
 * named error, after a bounded amount of work: quadratic subsets, a class
 * counted into hundreds of thousands of states, counted repetitions that
 * expand past the NFA limit (refused from the pattern's shape). */
static void test_too_complex_refused(void) {
    static const struct { const char *rx; uint64_t work; const char *needle; } cases[] = {
        {"(x?){5000}", (uint64_t)1 << 20, "pattern too complex"},
        {"\\W{1400}", (uint64_t)1 << 20, "pattern too complex"},
        {"([^a]?){100000}", (uint64_t)1 << 20, "pattern too complex"},
        {"(,{100000}){1000}", DI_DFA_MAX_WORK, "expands to at least"},
        {"((a{100000}){100000}){100000}", DI_DFA_MAX_WORK, "pattern too complex"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        di_dfa d;
        di_err err = {0};
        di_status st = di_regex_compile_bounded(cases[i].rx, strlen(cases[i].rx), 0, 500000, cases[i].work, &d, &err);
        CHECKF(st == DI_ERR_LIMIT, "%s: status %d (%s)", cases[i].rx, st, err.msg);
        if (st == DI_OK) di_dfa_free(&d);
        else CHECK_STR_CONTAINS(err.msg, cases[i].needle);
    }
    /* the default budget, through the public API and a JSON Schema pattern */
    const uint8_t *bs[3] = {(const uint8_t *)"x", (const uint8_t *)"\"", (const uint8_t *)""};
    size_t ls[3] = {1, 1, 0};
    di_vocab *v = NULL;
    CHECK(di_vocab_create(3, bs, ls, 2, &v) == DI_OK);
    const struct { di_constraint_kind kind; const char *text; } api[] = {
        {DI_CONSTRAINT_REGEX, "(x?){6000}"},
        {DI_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"^(x?){6000}$\"}"},
        {DI_CONSTRAINT_REGEX, "(x{100000}){1000}"},
    };
    for (size_t i = 0; v && i < sizeof api / sizeof *api; i++) {
        di_grammar *g = NULL;
        di_status st = di_grammar_compile(v, api[i].kind, api[i].text, strlen(api[i].text), NULL, &g);
        CHECKF(st == DI_ERR_LIMIT, "%s: status %d (%s)", api[i].text, st, di_last_error());
        if (st == DI_ERR_LIMIT) CHECK_STR_CONTAINS(di_last_error(), "pattern too complex");
        di_grammar_free(g);
    }
    di_vocab_free(v);
}

int main(void) {
    RUN(test_classes_minimal);
    RUN(test_classes_membership);
    RUN(test_classes_reject_bad_utf8);
    RUN(test_slow_inputs_within_budget);
    RUN(test_too_complex_refused);
    return test_summary();
}
