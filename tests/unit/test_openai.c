/* OpenAI Chat Completions request conversion (src/recipe/openai.c): values
 * reach the conversation and the sampling settings as the request states
 * them, defaults are vLLM's (ecosystem.md §4.1), and every rejection names
 * the field and what is supported. */
#include <string.h>

#include "recipe/openai.h"
#include "test.h"

static di_status convert(const char *body, di_chat *chat, di_sampling *s, di_err *err) {
    return di_openai_convert(body, strlen(body), NULL, chat, s, err);
}

static void test_full_request(void) {
    const char *body =
        "{\"model\": \"DeepSeek-V4.1-Flash\", \"messages\": ["
        "{\"role\": \"developer\", \"content\": \"be terse\"},"
        "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]},"
        "{\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"r\", \"tool_calls\": ["
        "  {\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}}]},"
        "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"42\"}],"
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\","
        "  \"parameters\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"integer\"}}}, \"strict\": true}}],"
        "\"reasoning_effort\": \"max\", \"temperature\": 0.25, \"top_p\": 0.5, \"top_k\": 40, \"min_p\": 0.05,"
        "\"presence_penalty\": 0.5, \"frequency_penalty\": -0.5, \"repetition_penalty\": 1.1,"
        "\"max_completion_tokens\": 77, \"stop\": [\"END\", \"STOP\"], \"seed\": 18446744073709551615,"
        "\"n\": 2, \"stream\": true, \"logprobs\": true, \"top_logprobs\": 5, \"user\": \"u1\","
        "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"s\", \"schema\": {\"type\": \"object\"}}}}";
    di_chat c;
    di_sampling s;
    di_err err;
    CHECKF(convert(body, &c, &s, &err) == DI_OK, "%s", err.msg);
    CHECK_EQ_INT(c.n_msgs, 4);
    CHECK(c.msgs[0].role == DI_CHAT_SYSTEM && !strcmp(c.msgs[0].content, "be terse"));
    CHECK(!strcmp(c.msgs[1].content, "a\n\nb")); /* V4.1 joins text parts with a blank line */
    CHECK(c.msgs[2].role == DI_CHAT_ASSISTANT && !strcmp(c.msgs[2].content, "") &&
          !strcmp(c.msgs[2].reasoning, "r") && c.msgs[2].n_calls == 1);
    CHECK(!strcmp(c.msgs[2].calls[0].id, "c1") && !strcmp(c.msgs[2].calls[0].arguments, "{\"x\": 1}"));
    CHECK(c.msgs[3].role == DI_CHAT_TOOL && !strcmp(c.msgs[3].tool_call_id, "c1"));
    CHECK(c.thinking == 1 && c.effort == DI_CHAT_EFFORT_MAX);
    CHECK(c.format == DI_CHAT_FORMAT_JSON_SCHEMA && c.response_schema);
    CHECK_EQ_INT(c.n_tools, 1);
    /* strict: every property required, no others allowed */
    di_buf b = {0};
    di_jv_dump_compact(c.tools[0].parameters, &b);
    CHECKF(b.p && !strcmp(b.p, "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},"
                               "\"additionalProperties\":false,\"required\":[\"x\"]}"), "%s", b.p);
    di_buf_free(&b);
    CHECK(s.temperature == 0.25 && s.top_p == 0.5 && s.top_k == 40 && s.min_p == 0.05);
    CHECK(s.presence_penalty == 0.5 && s.frequency_penalty == -0.5 && s.repetition_penalty == 1.1);
    CHECK_EQ_INT(s.max_tokens, 77);
    CHECK(s.n_stop == 2 && !strcmp(s.stop[0], "END") && !strcmp(s.stop[1], "STOP"));
    CHECK(s.has_seed && s.seed == 18446744073709551615ull);
    CHECK(s.n == 2 && s.stream && s.logprobs && s.top_logprobs == 5);
    CHECK(s.model && !strcmp(s.model, "DeepSeek-V4.1-Flash"));
    di_chat_free(&c);
    di_sampling_free(&s);
}

static void test_defaults_and_switches(void) {
    di_chat c;
    di_sampling s;
    di_err err;
    CHECK(convert("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", &c, &s, &err) == DI_OK);
    CHECK(c.thinking == 1 && c.effort == DI_CHAT_EFFORT_DEFAULT && c.tool_choice == DI_CHAT_TOOL_AUTO);
    CHECK(s.temperature == 1.0 && s.top_p == 1.0 && s.top_k == 0 && s.n == 1 && s.max_tokens == -1);
    CHECK(!s.has_seed && !s.n_stop && !s.stream);
    di_chat_free(&c);
    di_sampling_free(&s);
    static const struct { const char *extra; int thinking; di_chat_effort effort; } sw[] = {
        {"\"thinking\": {\"type\": \"disabled\"}", 0, DI_CHAT_EFFORT_DEFAULT},
        {"\"thinking\": {\"type\": \"enabled\"}", 1, DI_CHAT_EFFORT_DEFAULT},
        {"\"reasoning_effort\": \"none\"", 0, DI_CHAT_EFFORT_DEFAULT},
        {"\"reasoning_effort\": \"none\", \"thinking\": {\"type\": \"enabled\"}", 0, DI_CHAT_EFFORT_DEFAULT},
        {"\"reasoning_effort\": \"max\", \"thinking\": {\"type\": \"disabled\"}", 0, DI_CHAT_EFFORT_MAX},
        {"\"reasoning_effort\": \"minimal\"", 1, DI_CHAT_EFFORT_LOW},
        {"\"reasoning_effort\": \"medium\"", 1, DI_CHAT_EFFORT_HIGH},
        {"\"reasoning_effort\": \"xhigh\"", 1, DI_CHAT_EFFORT_XHIGH},
        {"\"chat_template_kwargs\": {\"thinking\": false}", 0, DI_CHAT_EFFORT_DEFAULT},
        {"\"chat_template_kwargs\": {\"enable_thinking\": false}, \"thinking\": {\"type\": \"enabled\"}", 1,
         DI_CHAT_EFFORT_DEFAULT},
    };
    for (size_t i = 0; i < sizeof sw / sizeof *sw; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], %s}",
                 sw[i].extra);
        CHECKF(convert(body, &c, &s, &err) == DI_OK, "%s: %s", sw[i].extra, err.msg);
        CHECKF(c.thinking == sw[i].thinking && c.effort == sw[i].effort, "%s", sw[i].extra);
        di_chat_free(&c);
        di_sampling_free(&s);
    }
    /* max_tokens wins over max_completion_tokens; a named tool forces a call */
    CHECK(convert("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 5,"
                  " \"max_completion_tokens\": 9, \"thinking\": {\"type\": \"disabled\"},"
                  " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"g\"}}],"
                  " \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"g\"}},"
                  " \"stop\": \"X\"}", &c, &s, &err) == DI_OK);
    CHECK(s.max_tokens == 5 && s.tool_name && !strcmp(s.tool_name, "g"));
    CHECK(c.tool_choice == DI_CHAT_TOOL_REQUIRED && s.n_stop == 1 && !strcmp(s.stop[0], "X"));
    CHECK(c.tools[0].parameters && c.tools[0].parameters->type == DI_JV_OBJECT); /* missing → {} */
    di_chat_free(&c);
    di_sampling_free(&s);
}

static void test_rejections(void) {
    static const struct { const char *body; di_status st; const char *msg; } bad[] = {
        {"[]", DI_ERR_INVALID_ARG, "request: expected an object, got array"},
        {"{\"model\": \"m\"}", DI_ERR_INVALID_ARG, "messages: missing"},
        {"{\"messages\": []}", DI_ERR_INVALID_ARG, "messages: empty"},
        {"{\"messages\": [{\"role\": \"user\"}]}", DI_ERR_INVALID_ARG, "messages[0].content: missing"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": 3}]}", DI_ERR_INVALID_ARG,
         "messages[0].content: expected a string or an array of parts, got number"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\\u0000b\"}]}", DI_ERR_UNSUPPORTED,
         "messages[0].content: NUL characters"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\", \"audio\": 1}]}", DI_ERR_UNSUPPORTED,
         "messages[0].audio: unsupported message field"},
        {"{\"messages\": [{\"\": 1}]}", DI_ERR_UNSUPPORTED, "messages[0].: unsupported message field"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\", \"tool_calls\": []}]}", DI_ERR_INVALID_ARG,
         "messages[0].tool_calls: only allowed on assistant messages"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"logit_bias\": {\"1\": 5}}",
         DI_ERR_UNSUPPORTED, "logit_bias: not supported"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"functions\": []}", DI_ERR_UNSUPPORTED,
         "functions: unsupported request field"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"temperature\": 2.5}", DI_ERR_INVALID_ARG,
         "temperature: 2.5 is out of range [0, 2]"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"top_p\": 0}", DI_ERR_INVALID_ARG,
         "top_p: 0 is out of range (0, 1]"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"max_tokens\": 0}", DI_ERR_INVALID_ARG,
         "max_tokens: 0 is out of range"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"max_tokens\": 1.5}", DI_ERR_INVALID_ARG,
         "max_tokens: expected an integer"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"n\": 0}", DI_ERR_INVALID_ARG,
         "n: 0 is out of range"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"seed\": -1}", DI_ERR_INVALID_ARG,
         "seed: expected an integer in [0, 2^64)"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"stop\": [\"\"]}", DI_ERR_INVALID_ARG,
         "stop[0]: empty stop string"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"stream\": 1}", DI_ERR_INVALID_ARG,
         "stream: expected a boolean, got number"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"reasoning_effort\": \"huge\"}",
         DI_ERR_UNSUPPORTED, "reasoning_effort: 'huge' is not supported"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"thinking\": {\"type\": \"auto\"}}",
         DI_ERR_UNSUPPORTED, "thinking.type: 'auto' is not supported"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"response_format\": {\"type\": \"xml\"}}",
         DI_ERR_UNSUPPORTED, "response_format.type: 'xml' is not supported"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"response_format\": {\"type\": \"json_schema\"}}",
         DI_ERR_INVALID_ARG, "response_format.json_schema: missing"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": [{\"type\": \"function\", "
         "\"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"string\"}}}]}",
         DI_ERR_INVALID_ARG, "tools[0].function.parameters: must be a JSON Schema with \"type\": \"object\""},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": [{\"type\": \"web_search\"}]}",
         DI_ERR_UNSUPPORTED, "tools[0].type: only 'function' tools"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": [{\"type\": \"function\", "
         "\"function\": {\"name\": \"f\", \"strict\": true, \"parameters\": {\"type\": \"object\", "
         "\"properties\": {\"a\": {}, \"b\": {}}, \"required\": [\"a\"]}}}]}",
         DI_ERR_INVALID_ARG, "tools[0].function.parameters: strict schemas must list every property"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tool_choice\": \"required\", "
         "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}",
         DI_ERR_UNSUPPORTED, "not supported in thinking mode"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tool_choice\": {\"type\": \"function\", "
         "\"function\": {\"name\": \"nope\"}}, \"thinking\": {\"type\": \"disabled\"}}",
         DI_ERR_INVALID_ARG, "tool_choice: function 'nope' is not among the tools"},
        {"{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\", \"prefix\": true}, "
         "{\"role\": \"user\", \"content\": \"b\"}]}",
         DI_ERR_INVALID_ARG, "messages[0].prefix: only the final message"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}],}", DI_ERR_FORMAT,
         "request body: line 1 column 49: expected a string key"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        di_chat c;
        di_sampling s;
        di_err err = {0};
        di_status st = convert(bad[i].body, &c, &s, &err);
        CHECKF(st == bad[i].st, "case %zu: status %d (%s)", i, (int)st, err.msg);
        CHECK_STR_CONTAINS(err.msg, bad[i].msg);
        /* nothing is left allocated after a failure */
        CHECK(c.n_msgs == 0 && c.msgs == NULL && s.stop == NULL && s.model == NULL);
    }
}

int main(void) {
    RUN(test_full_request);
    RUN(test_defaults_and_switches);
    RUN(test_rejections);
    return test_summary();
}
