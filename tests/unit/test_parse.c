/* V4.1 output parsing (src/recipe/parse.c) against results of DeepSeek's
 * deepseek-recipe stream parser stored in tests/data/chat/parse_cases.jsonl,
 * whole and fed in pieces. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "chat_testdata.h"
#include "deepinfer.h"
#include "recipe/parse.h"
#include "test.h"

static int buf_is(const di_buf *b, const char *want) {
    size_t n = strlen(want);
    return b->len == n && (!n || !memcmp(b->p, want, n));
}

/* Feeds text in pieces of `step` bytes (0: whole) and compares with c. */
static void check_case(const cJSON *c, size_t step, int idx) {
    const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
    int flags = cJSON_GetObjectItem(c, "flags")->valueint;
    const cJSON *stop = cJSON_GetObjectItem(c, "stop");
    const char *stops[8];
    size_t n_stop = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, stop) if (n_stop < 8) stops[n_stop++] = s->valuestring;
    di_parse_start start = (flags & 1) ? DI_PARSE_REASONING : DI_PARSE_CONTENT;
    di_parser p;
    di_err err;
    CHECK(di_parser_init(&p, start, (flags & 2) != 0, stops, n_stop, &err) == DI_OK);
    size_t len = strlen(text);
    if (!step) step = len ? len : 1;
    for (size_t off = 0; off < len; off += step)
        CHECK(di_parser_push(&p, text + off, off + step > len ? len - off : step, &err) == DI_OK);
    CHECK(di_parser_finish(&p, &err) == DI_OK);
    const cJSON *reasoning = cJSON_GetObjectItem(c, "reasoning");
    const char *content = cJSON_GetObjectItem(c, "content")->valuestring;
    if (cJSON_IsString(reasoning))
        CHECKF(p.has_reasoning && buf_is(&p.reasoning, reasoning->valuestring),
               "case %d step %zu: reasoning '%.*s' != '%s'", idx, step, (int)p.reasoning.len,
               p.reasoning.p ? p.reasoning.p : "", reasoning->valuestring);
    else
        CHECK(!p.has_reasoning);
    CHECKF(buf_is(&p.content, content), "case %d step %zu: content '%.*s' != '%s'", idx, step,
           (int)p.content.len, p.content.p ? p.content.p : "", content);
    const cJSON *calls = cJSON_GetObjectItem(c, "tool_calls");
    CHECKF((int)p.n_calls == cJSON_GetArraySize(calls), "case %d step %zu: %zu calls", idx, step,
           p.n_calls);
    for (size_t i = 0; i < p.n_calls && (int)i < cJSON_GetArraySize(calls); i++) {
        const cJSON *call = cJSON_GetArrayItem(calls, (int)i);
        const char *args = cJSON_GetArrayItem(call, 1)->valuestring;
        CHECK(buf_is(&p.calls[i].name, cJSON_GetArrayItem(call, 0)->valuestring));
        CHECKF(buf_is(&p.calls[i].arguments, args), "case %d step %zu: args '%.*s' != '%s'", idx,
               step, (int)p.calls[i].arguments.len, p.calls[i].arguments.p, args);
    }
    di_parser_free(&p);
}

static void test_recipe_cases(void) {
    cJSON *cases = chat_test_jsonl("chat/parse_cases.jsonl");
    if (!cases) { CHECK(0); return; }
    int idx = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        check_case(c, 0, idx);
        check_case(c, 1, idx); /* byte by byte: nothing may depend on the split */
        check_case(c, 7, idx);
        idx++;
    }
    CHECK(idx >= 100);
    cJSON_Delete(cases);
}

/* The public stream: deltas add up to the message; parse == stream. */
static void test_public_stream(void) {
    const char *text = "\n\nweighing options</think>\n\nCalling.\n\n<\xef\xbd\x9c" "DSML\xef\xbd\x9c calls>\n"
                       "<\xef\xbd\x9c" "DSML\xef\xbd\x9c invoke name=\"get\">\n"
                       "<\xef\xbd\x9c" "DSML\xef\xbd\x9c parameter name=\"q\" string=\"true\">a \"b\"</"
                       "\xef\xbd\x9c" "DSML\xef\xbd\x9c parameter>\n"
                       "<\xef\xbd\x9c" "DSML\xef\xbd\x9c parameter name=\"n\" string=\"false\">3</"
                       "\xef\xbd\x9c" "DSML\xef\xbd\x9c parameter>\n"
                       "</\xef\xbd\x9c" "DSML\xef\xbd\x9c invoke>\n</\xef\xbd\x9c" "DSML\xef\xbd\x9c calls>";
    const char *want = "{\"role\": \"assistant\", \"content\": \"Calling.\", \"reasoning_content\": "
                       "\"weighing options\", \"tool_calls\": [{\"index\": 0, \"type\": \"function\", "
                       "\"function\": {\"name\": \"get\", \"arguments\": \"{\\\"q\\\": \\\"a \\\\\\\"b\\\\\\\"\\\", "
                       "\\\"n\\\": 3}\"}}]}";
    unsigned flags = DI_CHAT_PARSE_THINKING | DI_CHAT_PARSE_TOOLS;
    char *whole = NULL;
    CHECK(di_chat_parse(text, strlen(text), flags, &whole) == DI_OK);
    CHECKF(whole && !strcmp(whole, want), "%s", whole ? whole : "");
    di_chat_stream *s = NULL;
    CHECK(di_chat_stream_new(flags, NULL, 0, &s) == DI_OK);
    char reasoning[256] = "", content[256] = "", args[256] = "", name[64] = "";
    for (size_t i = 0; i <= strlen(text); i++) {
        char *delta = NULL, *msg = NULL;
        if (i < strlen(text)) CHECK(di_chat_stream_push(s, text + i, 1, &delta) == DI_OK);
        else CHECK(di_chat_stream_finish(s, &delta, &msg) == DI_OK);
        cJSON *d = delta ? cJSON_Parse(delta) : NULL;
        CHECK(d != NULL);
        const cJSON *v;
        if ((v = cJSON_GetObjectItem(d, "reasoning_content"))) strncat(reasoning, v->valuestring, 200);
        if ((v = cJSON_GetObjectItem(d, "content"))) strncat(content, v->valuestring, 200);
        const cJSON *tcs = cJSON_GetObjectItem(d, "tool_calls"), *tc;
        cJSON_ArrayForEach(tc, tcs) {
            CHECK(cJSON_GetObjectItem(tc, "index")->valueint == 0);
            const cJSON *fn = cJSON_GetObjectItem(tc, "function");
            if ((v = cJSON_GetObjectItem(fn, "name"))) strncat(name, v->valuestring, 60);
            if ((v = cJSON_GetObjectItem(fn, "arguments"))) strncat(args, v->valuestring, 200);
        }
        cJSON_Delete(d);
        if (msg) CHECK(whole && !strcmp(msg, whole));
        di_free(msg);
        di_free(delta);
    }
    CHECK(!strcmp(reasoning, "weighing options"));
    CHECK(!strcmp(content, "Calling."));
    CHECK(!strcmp(name, "get"));
    CHECK(!strcmp(args, "{\"q\": \"a \\\"b\\\"\", \"n\": 3}"));
    di_chat_stream_free(s);
    di_free(whole);
}

static void test_misuse(void) {
    di_parser p;
    di_err err;
    const char *empty[] = {""};
    CHECK(di_parser_init(&p, DI_PARSE_CONTENT, 0, empty, 1, &err) == DI_ERR_INVALID_ARG);
    CHECK(di_parser_init(&p, DI_PARSE_CONTENT, 0, NULL, 0, &err) == DI_OK);
    CHECK(di_parser_finish(&p, &err) == DI_OK);
    CHECK(di_parser_push(&p, "x", 1, &err) == DI_ERR_STATE);
    di_parser_free(&p);
    char *out = NULL;
    CHECK(di_chat_parse(NULL, 3, 0, &out) == DI_ERR_INVALID_ARG);
    /* a stop string splits nothing it should not: held back, then released */
    di_chat_stream *s = NULL;
    const char *stop[] = {"END"};
    CHECK(di_chat_stream_new(0, stop, 1, &s) == DI_OK);
    char *d = NULL, *m = NULL;
    CHECK(di_chat_stream_push(s, "abc EN", 6, &d) == DI_OK);
    CHECK(d && !strcmp(d, "{\"content\": \"abc \"}"));
    di_free(d);
    CHECK(di_chat_stream_push(s, "X", 1, &d) == DI_OK);
    CHECK(d && !strcmp(d, "{\"content\": \"ENX\"}"));
    di_free(d);
    CHECK(di_chat_stream_finish(s, &d, &m) == DI_OK);
    CHECK(d && !strcmp(d, "{}"));
    CHECK(m && !strcmp(m, "{\"role\": \"assistant\", \"content\": \"abc ENX\"}"));
    di_free(d);
    di_free(m);
    di_chat_stream_free(s);
}

int main(void) {
    RUN(test_recipe_cases);
    RUN(test_public_stream);
    RUN(test_misuse);
    return test_summary();
}
