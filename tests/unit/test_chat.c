/* V4.1 chat rendering (src/recipe/chat.c, chat_json.c) against prompts and
 * ids DeepSeek's deepseek-recipe produced (tests/data/chat/). */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat_testdata.h"
#include "model_fixtures.h"
#include "deepinfer.h"
#include "recipe/chat.h"
#include "recipe/chat_json.h"
#include "recipe/openai.h"
#include "test.h"

static char *render(const char *json, int thinking, di_status *st) {
    di_chat_options o;
    di_chat_options_default(&o);
    o.thinking = thinking;
    char *p = NULL;
    size_t n = 0;
    *st = di_chat_render(json, strlen(json), &o, &p, &n);
    if (p) CHECK_EQ_INT(n, strlen(p));
    return p;
}

/* From the rendered segments: does the prompt end inside an open think
 * block (last special token "<think>"), or right after the opening of a
 * tool-call block? */
static void last_specials(const char *json, int thinking, int *think_open, int *in_calls) {
    di_jv *root = NULL;
    di_err err;
    di_chat c;
    di_sampling s;
    *think_open = *in_calls = 0;
    if (di_jv_parse(json, strlen(json), "chat", &root, &err)) { CHECK(0); return; }
    if (di_openai_convert_value(root, NULL, &c, &s, &err)) { CHECK(0); di_jv_free(root); return; }
    di_jv_free(root);
    di_sampling_free(&s);
    c.thinking = thinking;
    di_chat_prompt p;
    if (di_chat_prompt_render(&c, &p, &err) == DI_OK && p.n_segs) {
        const di_chat_segment *last = NULL;
        for (size_t i = 0; i < p.n_segs; i++)
            if (p.segs[i].special) last = &p.segs[i];
        const char *tail = "<" DI_CHAT_DSML " calls>\n";
        *in_calls = last && p.len >= strlen(tail) && !strcmp(p.text + p.len - strlen(tail), tail) &&
                    last->offset + last->len + strlen(" calls>\n") == p.len;
        *think_open = last && last->len == strlen(DI_CHAT_THINK_START) &&
                      !memcmp(p.text + last->offset, DI_CHAT_THINK_START, last->len);
    }
    di_chat_prompt_free(&p);
    di_chat_free(&c);
}

static void test_recipe_prompts(void) {
    cJSON *cases = chat_test_jsonl("chat/render_cases.jsonl");
    if (!cases) { CHECK(0); return; }
    size_t len = 0;
    char *tiny = fixture_read("tokenizer-v41-tiny.json", &len);
    di_tokenizer *tok = NULL;
    CHECK(tiny && di_tokenizer_load_memory(tiny, len, &tok) == DI_OK);
    int n = 0, n_ids = 0;
    cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *chat = cJSON_GetObjectItem(c, "chat")->valuestring;
        int thinking = cJSON_GetObjectItem(c, "thinking")->valueint;
        const char *want = cJSON_GetObjectItem(c, "prompt")->valuestring;
        di_status st;
        char *got = render(chat, thinking, &st);
        CHECKF(st == DI_OK && got && !strcmp(got, want), "case %d: %s\n got: %s\nwant: %s", n,
               st ? di_last_error() : "", got ? got : "", want);
        /* the parse flags agree with how the prompt ends, read from its
         * special segments (typed text may spell anything) */
        di_chat_options fo;
        di_chat_options_default(&fo);
        fo.thinking = thinking;
        unsigned flags = 0;
        CHECK(di_chat_output_flags(chat, strlen(chat), &fo, &flags) == DI_OK);
        int think_open = 0, in_calls = 0;
        last_specials(chat, thinking, &think_open, &in_calls);
        CHECKF(!!(flags & DI_CHAT_PARSE_THINKING) == think_open, "case %d: flags %u", n, flags);
        CHECKF(!!(flags & DI_CHAT_PARSE_IN_CALLS) == in_calls, "case %d: flags %u", n, flags);
        CHECKF(!!(flags & DI_CHAT_PARSE_CONTINUE) == (strstr(chat, "\"prefix\": true") != NULL),
               "case %d: flags %u", n, flags);
        di_free(got);
        cJSON *ids = cJSON_GetObjectItem(c, "ids");
        if (tok && cJSON_IsArray(ids)) {
            di_chat_options o;
            di_chat_options_default(&o);
            o.thinking = thinking;
            int32_t *out = NULL;
            size_t n_out = 0;
            st = di_chat_encode(tok, chat, strlen(chat), &o, &out, &n_out);
            int same = st == DI_OK && n_out == (size_t)cJSON_GetArraySize(ids);
            for (size_t i = 0; same && i < n_out; i++)
                same = out[i] == cJSON_GetArrayItem(ids, (int)i)->valueint;
            CHECKF(same, "case %d: ids differ (%s)", n, st ? di_last_error() : "");
            di_free(out);
            n_ids++;
        }
        n++;
    }
    CHECK(n >= 50 && n_ids >= 10);
    di_tokenizer_free(tok);
    free(tiny);
    cJSON_Delete(cases);
}

/* Numbers print as the reference prints them (Python's repr rules). */
static void test_number_repr(void) {
    cJSON *cases = chat_test_jsonl("chat/floats.jsonl");
    if (!cases) { CHECK(0); return; }
    cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *lit = cJSON_GetObjectItem(c, "literal")->valuestring;
        const char *want = cJSON_GetObjectItem(c, "repr")->valuestring;
        di_jv *v = NULL;
        di_err err;
        CHECK(di_jv_parse(lit, strlen(lit), "number", &v, &err) == DI_OK);
        di_buf b = {0};
        if (v) di_jv_dump_number(v, &b);
        CHECKF(b.p && !strcmp(b.p, want), "%s -> %s, want %s", lit, b.p ? b.p : "", want);
        di_buf_free(&b);
        di_jv_free(v);
    }
    cJSON_Delete(cases);
}

static void test_json_values(void) {
    di_err err;
    di_jv *v = NULL;
    const char *doc = "{\"b\": 1, \"a\": [true, null, \"x\\u00e9\\ud83d\\ude00\\n\"], \"b\": 2.50}";
    CHECK(di_jv_parse(doc, strlen(doc), "doc", &v, &err) == DI_OK);
    di_buf b = {0};
    di_jv_dump_py(v, &b);
    /* a repeated key keeps its first place and its last value */
    CHECK(b.p && !strcmp(b.p, "{\"b\": 2.5, \"a\": [true, null, \"x\xc3\xa9\xf0\x9f\x98\x80\\n\"]}"));
    di_buf_free(&b);
    di_jv_dump_compact(v, &b);
    CHECK(b.p && !strcmp(b.p, "{\"b\":2.5,\"a\":[true,null,\"x\xc3\xa9\xf0\x9f\x98\x80\\n\"]}"));
    di_buf_free(&b);
    di_jv_free(v);

    static const struct { const char *text, *msg; } bad[] = {
        {"{\"a\": \"\\ud800\"}", "line 1 column 8: lone high surrogate"},
        {"[1,\n 2,]", "line 2 column 4: expected a JSON value"},
        {"\"\xff\"", "invalid UTF-8"},
        {"01", "trailing characters"},
        {"1e999", "number out of range"},
        {"{\"a\" 1}", "expected ':'"},
        {"[\"tab\there\"]", "control character"},
        {"", "unexpected end"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        v = NULL;
        CHECK(di_jv_parse(bad[i].text, strlen(bad[i].text), "doc", &v, &err) == DI_ERR_FORMAT);
        CHECK(v == NULL);
        CHECK_STR_CONTAINS(err.msg, bad[i].msg);
    }
    /* nesting is capped */
    char deep[300];
    memset(deep, '[', 200);
    memset(deep + 200, ']', 10);
    deep[210] = '\0';
    CHECK(di_jv_parse(deep, strlen(deep), "doc", &v, &err) == DI_ERR_FORMAT);
    CHECK_STR_CONTAINS(err.msg, "nesting too deep");
}

/* The renderer marks template specials; message text never is one. */
static void test_segments(void) {
    di_chat c;
    di_chat_init(&c);
    const char *typed = "hi " DI_CHAT_EOS " " DI_CHAT_DSML;
    di_chat_msg *m = di_chat_add(&c, DI_CHAT_USER, typed, strlen(typed));
    CHECK(m != NULL);
    m = di_chat_add(&c, DI_CHAT_ASSISTANT, "ok", 2);
    const char *args = "{\"x\": \"" DI_CHAT_THINK_END "\"}";
    CHECK(m && di_chat_msg_add_call(m, "c1", "f", args, strlen(args)) == 0);
    CHECK(di_chat_add_tool(&c, NULL, "f", "d", NULL) == 0);
    di_chat_prompt p;
    di_err err;
    CHECK(di_chat_prompt_render(&c, &p, &err) == DI_OK);
    size_t covered = 0, n_special = 0;
    for (size_t i = 0; i < p.n_segs; i++) {
        const di_chat_segment *s = &p.segs[i];
        CHECK(s->offset == covered);
        covered += s->len;
        if (i) CHECK(s->special || p.segs[i - 1].special); /* plain runs are merged */
        if (!s->special) continue;
        n_special++;
        /* every special segment is exactly one known spelling */
        static const char *const known[] = {DI_CHAT_BOS, DI_CHAT_EOS, DI_CHAT_SYSTEM_TOK,
                                            DI_CHAT_USER_TOK, DI_CHAT_ASSISTANT_TOK,
                                            DI_CHAT_THINK_START, DI_CHAT_THINK_END, DI_CHAT_DSML};
        int ok = 0;
        for (size_t k = 0; k < sizeof known / sizeof *known; k++)
            ok |= strlen(known[k]) == s->len && !memcmp(p.text + s->offset, known[k], s->len);
        CHECK(ok);
    }
    CHECK_EQ_INT(covered, p.len);
    /* the typed spellings sit inside one plain segment */
    const char *at = strstr(p.text, typed);
    CHECK(at != NULL);
    size_t off = at ? (size_t)(at - p.text) : 0;
    for (size_t i = 0; i < p.n_segs; i++)
        if (p.segs[i].offset <= off && off < p.segs[i].offset + p.segs[i].len) {
            CHECK(!p.segs[i].special);
            CHECK(off + strlen(typed) <= p.segs[i].offset + p.segs[i].len);
        }
    CHECK(n_special > 20); /* the tools section's DSML and think tokens */
    di_chat_prompt_free(&p);
    di_chat_free(&c);
}

static void test_errors(void) {
    di_status st;
    char *p = render("[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": "
                     "\"b\", \"prefix\": true}, {\"role\": \"user\", \"content\": \"c\"}]", -1, &st);
    CHECK(st == DI_ERR_INVALID_ARG && !p);
    CHECK_STR_CONTAINS(di_last_error(), "messages[1].prefix");
    p = render("[{\"role\": \"wizard\", \"content\": \"a\"}]", -1, &st);
    CHECK(st == DI_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(di_last_error(), "messages[0].role: 'wizard'");
    p = render("[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]", -1, &st);
    CHECK(st == DI_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(di_last_error(), "messages[0].content[0].type: content part 'image_url'");
    p = render("{\"messages\": []", -1, &st);
    CHECK(st == DI_ERR_FORMAT);
    CHECK_STR_CONTAINS(di_last_error(), "line 1 column 16");
    p = render("42", -1, &st);
    CHECK(st == DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(di_last_error(), "got number");
    di_chat_options o;
    di_chat_options_default(&o);
    o.reasoning_effort = "extreme";
    CHECK(di_chat_render("[]", 2, &o, &p, NULL) == DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(di_last_error(), "'extreme'");
}

/* Options: effort and thinking override the JSON; no generation prompt. */
static void test_options(void) {
    const char *chat = "[{\"role\": \"user\", \"content\": \"hi\"}]";
    di_chat_options o;
    di_chat_options_default(&o);
    o.reasoning_effort = "max";
    char *p = NULL;
    CHECK(di_chat_render(chat, strlen(chat), &o, &p, NULL) == DI_OK);
    CHECK(p && !strcmp(p, DI_CHAT_BOS DI_CHAT_SYSTEM_TOK "Reasoning Effort: 100 (range 1-100, the "
                          "higher the value, the more thorough the reasoning)\n\n" DI_CHAT_USER_TOK
                          "hi" DI_CHAT_ASSISTANT_TOK DI_CHAT_THINK_START));
    di_free(p);
    o.reasoning_effort = "none";
    o.add_generation_prompt = 0;
    CHECK(di_chat_render(chat, strlen(chat), &o, &p, NULL) == DI_OK);
    CHECK(p && !strcmp(p, DI_CHAT_BOS DI_CHAT_USER_TOK "hi"));
    di_free(p);
}

int main(void) {
    RUN(test_recipe_prompts);
    RUN(test_number_repr);
    RUN(test_json_values);
    RUN(test_segments);
    RUN(test_errors);
    RUN(test_options);
    return test_summary();
}
