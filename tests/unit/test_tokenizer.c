/* Tokenizer tests on the tiny V4.1 tokenizer (tests/data): ids of HF
 * tokenizers for edge cases (tests/data/tokenizer_cases.json, produced by
 * tests/python/gen_tokenizer_cases.py), the golden prompts and Engram map of
 * ../shared/golden/v41-tiny, round trips of arbitrary bytes, the streaming
 * detokenizer, and malformed tokenizer.json files. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdint.h>

#include "deepinfer.h"
#include "io/safetensors.h"
#include "io/json_text.h"
#include "recipe/detokenize.h"
#include "test.h"

#define TINY "tests/data/tokenizer-v41-tiny.json"
#define CASES "tests/data/tokenizer_cases.json"

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = '\0';
    if (len) *len = (size_t)n;
    return b;
}

static di_tokenizer *tiny(void) {
    di_tokenizer *t = NULL;
    di_status rc = di_tokenizer_load(TINY, &t);
    CHECKF(rc == DI_OK, "%s", di_last_error());
    return t;
}

static int ids_equal_json(const int32_t *ids, size_t n, const cJSON *arr) {
    if (!cJSON_IsArray(arr) || (size_t)cJSON_GetArraySize(arr) != n) return 0;
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) if (ids[i++] != (int32_t)v->valuedouble) return 0;
    return 1;
}

static void test_hf_cases(void) {
    size_t len;
    char *json = slurp(CASES, &len);
    CHECKF(json != NULL, "%s missing", CASES);
    di_tokenizer *t = tiny();
    if (!json || !t) goto out;
    cJSON *root = cJSON_ParseWithLength(json, len);
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        /* "hex" carries the exact bytes (JSON strings here cannot hold NUL). */
        const char *hex = cJSON_GetObjectItem(c, "hex")->valuestring;
        size_t tl = strlen(hex) / 2;
        char *text = malloc(tl + 1);
        for (size_t i = 0; i < tl; i++) {
            unsigned v;
            sscanf(hex + 2 * i, "%2x", &v);
            text[i] = (char)v;
        }
        text[tl] = '\0';
        for (int mode = 0; mode < 2; mode++) {
            int32_t *ids;
            size_t nids;
            CHECK_EQ_INT(di_tokenizer_encode(t, text, tl, mode ? DI_TOKENIZE_PARSE_SPECIAL : 0, &ids,
                                             &nids), DI_OK);
            const cJSON *want = cJSON_GetObjectItem(c, mode ? "ids_special" : "ids_plain");
            CHECKF(ids_equal_json(ids, nids, want), "case %d (%s): ids differ from HF for \"%.60s\"",
                   n, mode ? "special" : "plain", text);
            char *back;
            size_t bl;
            CHECK_EQ_INT(di_tokenizer_decode(t, ids, nids, &back, &bl), DI_OK);
            CHECKF(bl == tl && !memcmp(back, text, tl), "case %d: decode(encode(x)) != x", n);
            di_free(back);
            di_free(ids);
        }
        free(text);
        n++;
    }
    CHECKF(n > 150, "only %d cases", n);
    cJSON_Delete(root);
out:
    free(json);
    di_tokenizer_free(t);
}

static const char *const special_names[][2] = {
    {"bos", "<｜begin▁of▁sentence｜>"}, {"eos", "<｜end▁of▁sentence｜>"},
    {"pad", "<｜▁pad▁｜>"},             {"user", "<｜User｜>"},
    {"assistant", "<｜Assistant｜>"},   {"think", "<think>"},
    {"end_think", "</think>"},          {"system", "<｜System｜>"},
    {"dspark_noise", "<｜dspark_noise｜>"}, {"image", "<｜deepseek_image｜>"},
};

static void test_golden_prompts(void) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found (golden prompts)");
    char path[4096];
    snprintf(path, sizeof path, "%s/golden/v41-tiny/golden.json", shared);
    size_t len;
    char *json = slurp(path, &len);
    CHECKF(json != NULL, "%s unreadable", path);
    di_tokenizer *t = tiny();
    if (!json || !t) goto out;
    cJSON *root = cJSON_ParseWithLength(json, len);
    const cJSON *p;
    int n = 0;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(root, "prompts")) {
        const char *text = cJSON_GetObjectItem(p, "text")->valuestring;
        int32_t *ids;
        size_t nids;
        CHECK_EQ_INT(di_tokenizer_encode(t, text, strlen(text), DI_TOKENIZE_PARSE_SPECIAL, &ids,
                                         &nids), DI_OK);
        CHECKF(ids_equal_json(ids, nids, cJSON_GetObjectItem(p, "ids")), "prompt %s", p->string);
        di_free(ids);
        n++;
    }
    CHECK_EQ_INT(n, 2);
    const cJSON *tk = cJSON_GetObjectItem(root, "tokenizer");
    CHECK_EQ_INT(di_tokenizer_vocab_size(t),
                 (size_t)cJSON_GetObjectItem(tk, "vocab_size")->valuedouble);
    const cJSON *sp = cJSON_GetObjectItem(tk, "special_ids");
    for (size_t i = 0; i < sizeof special_names / sizeof *special_names; i++) {
        int32_t id = -1;
        CHECK_EQ_INT(di_tokenizer_token_id(t, special_names[i][1], &id), DI_OK);
        CHECK_EQ_INT(id, (int)cJSON_GetObjectItem(sp, special_names[i][0])->valuedouble);
    }
    int32_t id;
    CHECK_EQ_INT(di_tokenizer_token_id(t, "<｜no such token｜>", &id), DI_ERR_NOT_FOUND);
    CHECK(di_tokenizer_is_special(t, 0) && di_tokenizer_is_special(t, 1023));
    CHECK(!di_tokenizer_is_special(t, 1017) && !di_tokenizer_is_special(t, 100));
    cJSON_Delete(root);
out:
    free(json);
    di_tokenizer_free(t);
}

static void test_engram_map(void) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found (golden Engram map)");
    char path[4096];
    snprintf(path, sizeof path, "%s/golden/v41-tiny/golden.safetensors", shared);
    di_safetensors st;
    di_err err = {0};
    if (di_safetensors_open(path, &st, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    di_tokenizer *t = tiny();
    const di_st_entry *e = NULL;
    for (size_t i = 0; i < st.n_entries; i++)
        if (!strcmp(st.entries[i].name, "tokenizer.compressed_map")) e = &st.entries[i];
    CHECK(e != NULL);
    if (e && t) {
        size_t n = di_tokenizer_vocab_size(t);
        CHECK_EQ_INT((e->end - e->begin) / 4, n);
        int32_t *map = malloc(n * sizeof *map);
        int classes = 0;
        CHECK_EQ_INT(di_tokenizer_engram_map(t, map, &classes), DI_OK);
        CHECK_EQ_INT(classes, 893); /* golden.json: engram_compressed_vocab_size */
        int mism = 0;
        for (size_t i = 0; i < n; i++) {
            int32_t want;
            memcpy(&want, st.data + e->begin + 4 * i, 4);
            if (map[i] != want && mism++ < 5) fprintf(stderr, "id %zu: %d != %d\n", i, map[i], want);
        }
        CHECK_EQ_INT(mism, 0);
        free(map);
    }
    di_tokenizer_free(t);
    di_safetensors_close(&st);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* Random bytes, biased towards UTF-8 lead and continuation bytes, spaces
 * and digits so that every pre-tokenizer path sees invalid sequences. */
static size_t random_bytes(uint8_t *b, size_t cap) {
    static const uint8_t pool[] = {' ', '\n', '\r', '\t', '1', 'a', 'Z', '<', '!', 0x80, 0xBF,
                                   0xC2, 0xE4, 0xB8, 0xED, 0xA0, 0xF0, 0x9F, 0xF4, 0xFF, 0xEF,
                                   0xBD, 0x9C, 0x00};
    size_t n = rnd() % cap;
    for (size_t i = 0; i < n; i++)
        b[i] = (rnd() & 1) ? pool[rnd() % sizeof pool] : (uint8_t)rnd();
    return n;
}

static void test_roundtrip_bytes(void) {
    di_tokenizer *t = tiny();
    if (!t) return;
    uint8_t buf[300];
    int bad = 0;
    for (int it = 0; it < 3000; it++) {
        size_t n = random_bytes(buf, sizeof buf);
        for (unsigned mode = 0; mode < 2; mode++) {
            int32_t *ids;
            size_t nids;
            char *back;
            size_t bl;
            if (di_tokenizer_encode(t, (const char *)buf, n, mode, &ids, &nids) ||
                di_tokenizer_decode(t, ids, nids, &back, &bl)) {
                bad++;
                continue;
            }
            if (bl != n || memcmp(back, buf, n)) bad++;
            di_free(back);
            di_free(ids);
        }
    }
    CHECK_EQ_INT(bad, 0);
    di_tokenizer_free(t);
}

static int valid_utf8(const uint8_t *s, size_t n) { return di_utf8_valid_prefix(s, n) == n; }

static void test_streaming(void) {
    di_tokenizer *t = tiny();
    if (!t) return;
    /* Multi-byte characters split across byte tokens. */
    const char *text = "héllo wörld 毕老师！😀👨‍👩‍👧 ok";
    int32_t *ids;
    size_t nids;
    CHECK_EQ_INT(di_tokenizer_encode(t, text, strlen(text), 0, &ids, &nids), DI_OK);
    CHECK(nids > 20);
    di_detokenizer *d;
    CHECK_EQ_INT(di_detokenizer_new(t, 0, &d), DI_OK);
    char out[256];
    size_t o = 0;
    int all_valid = 1, held_back = 0;
    for (size_t i = 0; i < nids; i++) {
        const char *s;
        size_t l;
        CHECK_EQ_INT(di_detokenizer_push(d, ids[i], &s, &l), DI_OK);
        if (!valid_utf8((const uint8_t *)s, l)) all_valid = 0;
        if (l == 0) held_back++;
        memcpy(out + o, s, l);
        o += l;
    }
    const char *s;
    size_t l;
    CHECK_EQ_INT(di_detokenizer_flush(d, &s, &l), DI_OK);
    CHECK_EQ_INT(l, 0);
    CHECK(all_valid);
    CHECK(held_back > 0);
    CHECKF(o == strlen(text) && !memcmp(out, text, o), "stream != text");
    /* An unfinished character at the end: raw mode returns its bytes at the
     * flush, lossy mode one U+FFFD (the maximal subpart). */
    int32_t e4, b8, a;
    CHECK_EQ_INT(di_tokenizer_token_id(t, "ä", &e4), DI_OK);  /* byte 0xE4 */
    CHECK_EQ_INT(di_tokenizer_token_id(t, "¸", &b8), DI_OK);  /* byte 0xB8 */
    CHECK_EQ_INT(di_tokenizer_token_id(t, "A", &a), DI_OK);
    di_detokenizer_push(d, e4, &s, &l);
    CHECK_EQ_INT(l, 0);
    di_detokenizer_push(d, b8, &s, &l);
    CHECK_EQ_INT(l, 0);
    CHECK_EQ_INT(di_detokenizer_flush(d, &s, &l), DI_OK);
    CHECK(l == 2 && !memcmp(s, "\xE4\xB8", 2));
    di_detokenizer_free(d);
    CHECK_EQ_INT(di_detokenizer_new(t, DI_DETOK_LOSSY, &d), DI_OK);
    di_detokenizer_push(d, e4, &s, &l);
    di_detokenizer_push(d, b8, &s, &l);
    CHECK_EQ_INT(di_detokenizer_push(d, a, &s, &l), DI_OK);
    CHECK(l == 4 && !memcmp(s, "\xEF\xBF\xBD" "A", 4));
    di_detokenizer_push(d, e4, &s, &l);
    CHECK_EQ_INT(di_detokenizer_flush(d, &s, &l), DI_OK);
    CHECK(l == 3 && !memcmp(s, "\xEF\xBF\xBD", 3));
    CHECK_EQ_INT(di_detokenizer_push(d, 5000, &s, &l), DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(di_last_error(), "5000");
    di_detokenizer_free(d);
    /* Lossy mode on random byte tokens: every chunk valid, and the whole
     * equals the lossy conversion of the decoded bytes. */
    int bad = 0;
    for (int it = 0; it < 300; it++) {
        uint8_t buf[200], want[600], got[600];
        size_t n = random_bytes(buf, sizeof buf), g = 0;
        int32_t *rids;
        size_t nr;
        di_tokenizer_encode(t, (const char *)buf, n, 0, &rids, &nr);
        size_t wn = di_utf8_lossy(buf, n, want);
        di_detokenizer_new(t, DI_DETOK_LOSSY, &d);
        for (size_t i = 0; i <= nr; i++) {
            if (i < nr) di_detokenizer_push(d, rids[i], &s, &l);
            else di_detokenizer_flush(d, &s, &l);
            if (!valid_utf8((const uint8_t *)s, l)) bad++;
            memcpy(got + g, s, l);
            g += l;
        }
        if (g != wn || memcmp(got, want, g)) bad++;
        di_detokenizer_free(d);
        di_free(rids);
    }
    CHECK_EQ_INT(bad, 0);
    di_free(ids);
    di_tokenizer_free(t);
}

static void test_decode_errors(void) {
    di_tokenizer *t = tiny();
    if (!t) return;
    int32_t ids[] = {100, 1024};
    char *s;
    size_t l;
    CHECK_EQ_INT(di_tokenizer_decode(t, ids, 2, &s, &l), DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(di_last_error(), "1024");
    ids[1] = -1;
    CHECK_EQ_INT(di_tokenizer_decode(t, ids, 2, &s, &l), DI_ERR_INVALID_ARG);
    const char *b;
    CHECK_EQ_INT(di_tokenizer_token_bytes(t, 1024, &b, &l), DI_ERR_INVALID_ARG);
    CHECK_EQ_INT(di_tokenizer_token_bytes(t, 1017, &b, &l), DI_OK);
    CHECK(l == strlen("<｜User｜>") && !memcmp(b, "<｜User｜>", l));
    di_tokenizer_free(t);
}

/* Loads the tiny tokenizer with `from` replaced by `to` (first occurrence)
 * and checks the status and that the message names the problem. */
static void expect_bad(const char *base, const char *from, const char *to, di_status want,
                       const char *needle) {
    const char *at = strstr(base, from);
    CHECKF(at != NULL, "fixture lacks \"%s\"", from);
    if (!at) return;
    size_t nb = strlen(base), nf = strlen(from), nt = strlen(to);
    char *j = malloc(nb - nf + nt + 1);
    memcpy(j, base, (size_t)(at - base));
    memcpy(j + (at - base), to, nt);
    memcpy(j + (at - base) + nt, at + nf, nb - (size_t)(at - base) - nf + 1);
    di_tokenizer *t = NULL;
    di_status rc = di_tokenizer_load_memory(j, strlen(j), &t);
    CHECKF(rc == want, "replacing \"%s\": status %d, want %d (%s)", from, rc, want, di_last_error());
    CHECK(t == NULL);
    if (rc != DI_OK) CHECK_STR_CONTAINS(di_last_error(), needle);
    di_tokenizer_free(t);
    free(j);
}

static void test_malformed(void) {
    size_t len;
    char *base = slurp(TINY, &len);
    CHECK(base != NULL);
    if (!base) return;
    di_tokenizer *t = NULL;
    CHECK_EQ_INT(di_tokenizer_load_memory(base, len / 2, &t), DI_ERR_FORMAT);
    CHECK_STR_CONTAINS(di_last_error(), "invalid JSON");
    CHECK_EQ_INT(di_tokenizer_load("tests/data/no-such-tokenizer.json", &t), DI_ERR_IO);
    CHECK_STR_CONTAINS(di_last_error(), "no-such-tokenizer.json");
    /* merges naming unknown tokens, or merging into one that is missing */
    expect_bad(base, "\"merges\": [\n   \"Ġ t\"", "\"merges\": [\n   \"Ġ QQQ\"", DI_ERR_FORMAT,
               "\"QQQ\" is not in the vocabulary");
    expect_bad(base, "\"merges\": [\n   \"Ġ t\"", "\"merges\": [\n   \"Ġ t x\"", DI_ERR_FORMAT,
               "merges[0]");
    expect_bad(base, "\"merges\": [\n   \"Ġ t\"", "\"merges\": [\n   \"t Ġ\"", DI_ERR_FORMAT,
               "merged token \"tĠ\"");
    expect_bad(base, "\"merges\": [\n   \"Ġ t\"", "\"merges\": [\n   17", DI_ERR_FORMAT,
               "merges[0]");
    /* duplicate ids, ids beyond the limit, wrong types */
    expect_bad(base, "\"ā\": 4", "\"ā\": 3", DI_ERR_FORMAT, "id 3 is used by");
    expect_bad(base, "\"ā\": 4", "\"ā\": 4000000000", DI_ERR_LIMIT, "exceeds");
    expect_bad(base, "\"ā\": 4", "\"ā\": \"4\"", DI_ERR_FORMAT, "model.vocab[\"ā\"]");
    expect_bad(base, "\"ā\": 4", "\"ā\": 4.5", DI_ERR_FORMAT, "4.5");
    expect_bad(base, "\"id\": 1017", "\"id\": 5", DI_ERR_FORMAT, "already token");
    expect_bad(base, "\"id\": 1017", "\"id\": \"x\"", DI_ERR_FORMAT, "added_tokens[3].id");
    expect_bad(base, "\"content\": \"<｜User｜>\"", "\"content\": \"\"", DI_ERR_FORMAT,
               "added_tokens[3]");
    expect_bad(base, "\"content\": \"<｜User｜>\"", "\"content\": \"ā\"", DI_ERR_FORMAT,
               "already token");
    expect_bad(base, "\"ā\": 4", "\"ā\": 4, \"ā\": 1500", DI_ERR_FORMAT, "has two ids");
    expect_bad(base, "\"vocab\": {", "\"vocab\": [], \"x\": {", DI_ERR_FORMAT, "model.vocab");
    /* unsupported pipelines are named */
    expect_bad(base, "\\\\p{N}{1,3}", "\\\\p{N}{1,4}", DI_ERR_UNSUPPORTED, "\\p{N}{1,4}");
    expect_bad(base, "\"behavior\": \"Isolated\"", "\"behavior\": \"Removed\"",
               DI_ERR_UNSUPPORTED, "Removed");
    expect_bad(base, "\"type\": \"Split\"", "\"type\": \"Whitespace\"", DI_ERR_UNSUPPORTED,
               "Whitespace");
    expect_bad(base, "\"normalizer\": null", "\"normalizer\": {\"type\": \"NFC\"}",
               DI_ERR_UNSUPPORTED, "NFC");
    expect_bad(base, "\"type\": \"BPE\"", "\"type\": \"WordPiece\"", DI_ERR_UNSUPPORTED,
               "WordPiece");
    expect_bad(base, "\"use_regex\": false", "\"use_regex\": true", DI_ERR_UNSUPPORTED,
               "use_regex");
    expect_bad(base, "\"lstrip\": false", "\"lstrip\": true", DI_ERR_UNSUPPORTED, "lstrip");
    free(base);
}

/* The ["a", "b"] form of merges gives the same tokenizer as "a b". */
static void test_merge_array_form(void) {
    size_t len;
    char *base = slurp(TINY, &len);
    cJSON *root = base ? cJSON_ParseWithLength(base, len) : NULL;
    CHECK(root != NULL);
    if (!root) goto out;
    cJSON *merges = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "model"), "merges");
    cJSON *arr = cJSON_CreateArray();
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        char *sp = strchr(m->valuestring, ' ');
        *sp = '\0';
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateString(m->valuestring));
        cJSON_AddItemToArray(pair, cJSON_CreateString(sp + 1));
        cJSON_AddItemToArray(arr, pair);
    }
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(root, "model"), "merges", arr);
    char *text = cJSON_PrintUnformatted(root);
    di_tokenizer *a = tiny(), *b = NULL;
    CHECKF(di_tokenizer_load_memory(text, strlen(text), &b) == DI_OK, "%s", di_last_error());
    const char *s = "The quick brown fox, 1234 jumps!\n  over\tthe 中文 lazy dog's back.";
    int32_t *ia = NULL, *ib = NULL;
    size_t na = 0, nb = 0;
    if (a && b) {
        di_tokenizer_encode(a, s, strlen(s), 0, &ia, &na);
        di_tokenizer_encode(b, s, strlen(s), 0, &ib, &nb);
        CHECK(na == nb && na > 10 && !memcmp(ia, ib, na * sizeof *ia));
    }
    di_free(ia);
    di_free(ib);
    di_tokenizer_free(a);
    di_tokenizer_free(b);
    free(text);
    cJSON_Delete(root);
out:
    free(base);
}

/* Several threads encoding with one tokenizer (each has its own piece cache)
 * get the ids one thread gets. */
typedef struct thread_job {
    const di_tokenizer *t;
    const char *text;
    size_t len;
    const int32_t *want;
    size_t n_want;
    int bad;
} thread_job;

static void *encode_many(void *arg) {
    thread_job *j = arg;
    for (int it = 0; it < 20; it++) {
        int32_t *ids;
        size_t n;
        if (di_tokenizer_encode(j->t, j->text, j->len, 0, &ids, &n) || n != j->n_want ||
            memcmp(ids, j->want, n * sizeof *ids))
            j->bad++;
        else
            di_free(ids);
    }
    return NULL;
}

static void test_threads(void) {
    di_tokenizer *t = tiny();
    if (!t) return;
    static const char part[] = "The quick 毕老师 fox, 12345 jumps\n\t  over ";
    char text[6000];
    size_t len = 0;
    while (len + sizeof part < sizeof text) {
        memcpy(text + len, part, sizeof part - 1);
        len += sizeof part - 1;
        text[len] = (char)('a' + len % 26);
        len++;
    }
    int32_t *want;
    size_t n_want;
    CHECK_EQ_INT(di_tokenizer_encode(t, text, len, 0, &want, &n_want), DI_OK);
    thread_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (thread_job){t, text, len, want, n_want, 0};
        CHECK_EQ_INT(pthread_create(&th[i], NULL, encode_many, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(jobs[i].bad, 0);
    }
    di_free(want);
    di_tokenizer_free(t);
}

int main(void) {
    RUN(test_hf_cases);
    RUN(test_golden_prompts);
    RUN(test_engram_map);
    RUN(test_roundtrip_bytes);
    RUN(test_streaming);
    RUN(test_decode_errors);
    RUN(test_malformed);
    RUN(test_merge_array_form);
    RUN(test_threads);
    return test_summary();
}
