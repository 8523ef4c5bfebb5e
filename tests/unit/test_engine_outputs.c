/* Engine outputs on the golden tiny model: structured output (regex full
 * match, JSON Schema checked field by field, EBNF, choice) with and without
 * a thinking block and its budget, stop strings across token boundaries,
 * n > 1 with logprobs, chat parsing, and every bad request refused at
 * submit with its message while the other requests complete. */
#include <cjson/cJSON.h>
#include <math.h>
#include <regex.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deepinfer.h"
#include "backend/cpu/kernels.h"
#include "test.h"

static char g_model[4200];
static int g_have;

static di_engine *open_engine(int64_t max_len) {
    di_engine_options o;
    di_engine_options_default(&o);
    o.model = g_model;
    o.max_model_len = max_len;
    di_engine *e = NULL;
    CHECKF(di_engine_open(&o, &e) == DI_OK, "open: %s", di_last_error());
    return e;
}

static const char *PROMPT = "<｜begin▁of▁sentence｜><｜User｜>Give me the answer.<｜Assistant｜></think>";
static const char *THINK_PROMPT = "<｜begin▁of▁sentence｜><｜User｜>Think, then answer.<｜Assistant｜><think>";

static int full_match(const char *re, const char *s) {
    char anchored[512];
    snprintf(anchored, sizeof anchored, "^(%s)$", re);
    regex_t rx;
    if (regcomp(&rx, anchored, REG_EXTENDED | REG_NOSUB)) return 0;
    int ok = regexec(&rx, s, 0, NULL, 0) == 0;
    regfree(&rx);
    return ok;
}

/* JSON Schema string lengths count characters. */
static size_t utf8_len(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static void test_structured(void) {
    if (!g_have) SKIP("../shared (golden fixtures) not found");
    di_engine *e = open_engine(0);
    if (!e) return;
    const char *re = "[0-9]{3}-[a-z]{2,5}";
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},"
                         "\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"ok\"],\"additionalProperties\":false}";
    const char *ebnf = "root ::= \"(\" [0-9] \",\" [0-9] \")\"";
    const char *choices[] = {"red", "green", "blue"};
    enum { NSEED = 3 };
    uint64_t id[4][NSEED], tid;
    for (int k = 0; k < 4; k++)
        for (int s = 0; s < NSEED; s++) {
            di_sampling_params p;
            di_sampling_params_default(&p);
            p.max_tokens = 60;
            p.has_seq_seed = 1;
            p.seq_seed = (uint64_t)(s * 11 + k);
            p.temperature = s == 0 ? 0 : 1.0;
            if (k == 0) p.regex = re;
            if (k == 1) p.json_schema = schema, p.disable_any_whitespace = 1;
            if (k == 2) p.ebnf = ebnf;
            if (k == 3) p.choice = choices, p.n_choice = 3;
            CHECKF(di_engine_submit_text(e, PROMPT, strlen(PROMPT), &p, &id[k][s]) == DI_OK, "%d: %s", k,
                   di_last_error());
        }
    /* thinking: a budget of 4 tokens, then `</think>` is forced and the
     * regex applies to the answer */
    di_sampling_params tp;
    di_sampling_params_default(&tp);
    tp.max_tokens = 40;
    tp.regex = re;
    tp.thinking_token_budget = 4;
    tp.has_seq_seed = 1;
    tp.seq_seed = 9;
    CHECK(di_engine_submit_text(e, THINK_PROMPT, strlen(THINK_PROMPT), &tp, &tid) == DI_OK);
    CHECK(di_engine_run(e, NULL, NULL) == DI_OK);
    for (int k = 0; k < 4; k++)
        for (int s = 0; s < NSEED; s++) {
            di_completion c;
            CHECK(di_engine_get_completion(e, id[k][s], 0, &c) == DI_OK);
            CHECKF(c.finish_reason == DI_FINISH_STOP, "kind %d seed %d: finish %s (%s)", k, s,
                   di_finish_reason_name(c.finish_reason), c.text);
            if (k == 0) CHECKF(full_match(re, c.text), "regex output \"%s\"", c.text);
            if (k == 1) {
                cJSON *o = cJSON_Parse(c.text);
                CHECKF(o != NULL, "JSON output \"%s\"", c.text);
                const cJSON *nm = cJSON_GetObjectItemCaseSensitive(o, "name");
                const cJSON *ok = cJSON_GetObjectItemCaseSensitive(o, "ok");
                CHECKF(cJSON_IsString(nm) && utf8_len(nm->valuestring) <= 6 && cJSON_IsBool(ok) &&
                           cJSON_GetArraySize(o) == 2,
                       "schema violated by \"%s\"", c.text);
                cJSON_Delete(o);
            }
            if (k == 2) CHECKF(full_match("\\([0-9],[0-9]\\)", c.text), "EBNF output \"%s\"", c.text);
            if (k == 3)
                CHECKF(!strcmp(c.text, "red") || !strcmp(c.text, "green") || !strcmp(c.text, "blue"),
                       "choice output \"%s\"", c.text);
        }
    di_completion c;
    CHECK(di_engine_get_completion(e, tid, 0, &c) == DI_OK);
    const char *end = strstr(c.text, "</think>");
    CHECKF(end != NULL, "no </think> in \"%s\"", c.text);
    int think_tokens = 0;
    while (think_tokens < (int)c.n_tokens && c.token_ids[think_tokens] != 1020) think_tokens++;
    CHECKF(think_tokens <= 4, "%d thinking tokens", think_tokens);
    if (end) CHECKF(full_match(re, end + 8), "answer after </think>: \"%s\"", end + 8);
    CHECK_EQ_INT(c.finish_reason, DI_FINISH_STOP);
    di_engine_close(e);
}

static void test_stop_strings(void) {
    if (!g_have) SKIP("../shared (golden fixtures) not found");
    di_engine *e = open_engine(0);
    if (!e) return;
    const di_tokenizer *tok = di_engine_tokenizer(e);
    di_sampling_params p;
    di_sampling_params_default(&p);
    p.temperature = 0;
    p.max_tokens = 24;
    p.ignore_eos = 1;
    uint64_t id;
    CHECK(di_engine_submit_text(e, PROMPT, strlen(PROMPT), &p, &id) == DI_OK);
    CHECK(di_engine_run(e, NULL, NULL) == DI_OK);
    di_completion c;
    CHECK(di_engine_get_completion(e, id, 0, &c) == DI_OK);
    char full[1024];
    snprintf(full, sizeof full, "%s", c.text);
    /* a stop string made of the last byte of token k and the first byte of
     * token k+1 (both plain ASCII) spans the boundary */
    char stop[3] = {0};
    for (size_t k = 0; k + 1 < c.n_tokens && !stop[0]; k++) {
        const char *a, *b;
        size_t na, nb;
        di_tokenizer_token_bytes(tok, c.token_ids[k], &a, &na);
        di_tokenizer_token_bytes(tok, c.token_ids[k + 1], &b, &nb);
        if (k > 2 && na && nb && (unsigned char)a[na - 1] < 128 && (unsigned char)b[0] < 128 && a[na - 1] > ' ' &&
            b[0] > ' ') {
            stop[0] = a[na - 1];
            stop[1] = b[0];
        }
    }
    CHECK(stop[0] != 0);
    if (!stop[0]) { di_engine_close(e); return; }
    const char *first = strstr(full, stop);
    CHECK(first != NULL);
    size_t cut = (size_t)(first - full);
    const char *stops[] = {"never-appears", stop};
    for (int inc = 0; inc < 2; inc++) {
        p.stop = stops;
        p.n_stop = 2;
        p.include_stop_str_in_output = inc;
        CHECK(di_engine_submit_text(e, PROMPT, strlen(PROMPT), &p, &id) == DI_OK);
        CHECK(di_engine_run(e, NULL, NULL) == DI_OK);
        CHECK(di_engine_get_completion(e, id, 0, &c) == DI_OK);
        CHECK_EQ_INT(c.finish_reason, DI_FINISH_STOP);
        CHECK(c.stop_str && !strcmp(c.stop_str, stop));
        CHECK_EQ_INT(c.text_len, cut + (inc ? 2 : 0));
        CHECK(!strncmp(c.text, full, c.text_len));
        CHECK(c.n_tokens < 24);
    }
    /* stop strings count only once min_tokens are generated */
    p.include_stop_str_in_output = 0;
    p.min_tokens = 24;
    CHECK(di_engine_submit_text(e, PROMPT, strlen(PROMPT), &p, &id) == DI_OK);
    CHECK(di_engine_run(e, NULL, NULL) == DI_OK);
    CHECK(di_engine_get_completion(e, id, 0, &c) == DI_OK);
    CHECK_EQ_INT(c.finish_reason, DI_FINISH_LENGTH);
    CHECK(!strcmp(c.text, full));
    di_engine_close(e);
}

static void test_n_logprobs_chat(void) {
    if (!g_have) SKIP("../shared (golden fixtures) not found");
    di_engine *e = open_engine(0);
    if (!e) return;
    di_sampling_params p;
    di_sampling_params_default(&p);
    p.n = 3;
    p.max_tokens = 6;
    p.logprobs = 2;
    p.ignore_eos = 1;
    p.has_seq_seed = 1;
    p.seq_seed = 77;
    uint64_t id, cid;
    CHECK(di_engine_submit_text(e, PROMPT, strlen(PROMPT), &p, &id) == DI_OK);
    const char *chat = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 12, "
                       "\"seed\": 5, \"thinking\": {\"type\": \"enabled\"}}";
    di_sampling_params cp;
    di_sampling_params_default(&cp);
    cp.max_tokens = 12;
    cp.thinking_token_budget = 3;
    cp.has_seq_seed = 1;
    cp.seq_seed = 5;
    CHECKF(di_engine_submit_chat(e, chat, strlen(chat), NULL, &cp, &cid) == DI_OK, "%s", di_last_error());
    CHECK(di_engine_run(e, NULL, NULL) == DI_OK);
    di_request_output o;
    CHECK(di_engine_get_output(e, id, &o) == DI_OK);
    CHECK_EQ_INT(o.n_completions, 3);
    int differ = 0;
    di_completion c0, c;
    di_engine_get_completion(e, id, 0, &c0);
    for (size_t j = 0; j < 3; j++) {
        CHECK(di_engine_get_completion(e, id, j, &c) == DI_OK);
        CHECK_EQ_INT(c.n_tokens, 6);
        CHECK(c.logprobs != NULL && c.n_top == 2);
        double sum = 0;
        for (size_t i = 0; c.logprobs && i < c.n_tokens; i++) {
            sum += c.logprobs[i];
            CHECK(c.logprobs[i] <= 0 && c.top_logprobs[i * 2] >= c.top_logprobs[i * 2 + 1]);
            CHECK(c.logprobs[i] <= c.top_logprobs[i * 2] + 1e-6f);
        }
        CHECKF(fabs(sum - c.cumulative_logprob) < 1e-3, "%f vs %f", sum, c.cumulative_logprob);
        differ += memcmp(c.token_ids, c0.token_ids, 6 * sizeof(int32_t)) != 0;
    }
    CHECK(differ > 0);
    /* chat: the output is parsed; reasoning ends at the forced </think> */
    CHECK(di_engine_get_completion(e, cid, 0, &c) == DI_OK);
    CHECK(c.message_json != NULL);
    CHECK(c.reasoning_content != NULL);
    const char *end = strstr(c.text, "</think>");
    CHECKF(end != NULL, "no </think> in %s", c.text);
    if (end && c.reasoning_content) CHECK(!strncmp(c.text, c.reasoning_content, strlen(c.reasoning_content)));
    if (end && c.content) CHECK(!strcmp(c.content, end + 8) || strstr(end + 8, c.content));
    di_engine_close(e);
}

/* Opens an engine with o and checks the budgets it reports. */
static void check_budgets(const di_engine_options *o, int max_batch, int64_t step_tokens, uint64_t memory_limit) {
    di_engine *e = NULL;
    di_engine_info in;
    CHECKF(di_engine_open(o, &e) == DI_OK, "%s", di_last_error());
    if (!e) return;
    CHECK(di_engine_get_info(e, &in) == DI_OK);
    CHECK_EQ_INT(in.max_batch, max_batch);
    CHECK_EQ_INT(in.max_tokens_per_step, step_tokens);
    CHECK(in.memory_limit == memory_limit);
    di_engine_close(e);
}

static void test_bad_inputs(void) {
    if (!g_have) SKIP("../shared (golden fixtures) not found");
    di_engine *e = open_engine(256);
    if (!e) return;
    di_sampling_params good;
    di_sampling_params_default(&good);
    good.temperature = 0;
    good.max_tokens = 3;
    good.ignore_eos = 1;
    uint64_t a, b, x;
    int32_t ids[4] = {0, 1017, 300, 1018};
    CHECK(di_engine_submit_tokens(e, ids, 4, &good, &a) == DI_OK);
    int32_t oov[3] = {5, 5000, 6}, neg[2] = {5, -3}, longp[300];
    for (int i = 0; i < 300; i++) longp[i] = 40 + i % 100;
    CHECK(di_engine_submit_tokens(e, ids, 0, &good, &x) == DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(di_last_error(), "Prompt cannot be empty");
    CHECK(di_engine_submit_text(e, "", 0, &good, &x) == DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(di_last_error(), "Prompt cannot be empty");
    CHECK(di_engine_submit_tokens(e, oov, 3, &good, &x) == DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(di_last_error(), "out of vocabulary");
    CHECK(di_engine_submit_tokens(e, neg, 2, &good, &x) == DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(di_last_error(), "out of vocabulary");
    CHECK(di_engine_submit_tokens(e, longp, 300, &good, &x) == DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(di_last_error(), "longer than the maximum model length of 256");
    struct {
        const char *what;
        di_sampling_params p;
    } bad[16];
    int nb = 0;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) bad[i].p = good;
    bad[nb].what = "temperature", bad[nb++].p.temperature = -0.5;
    bad[nb].what = "temperature", bad[nb++].p.temperature = NAN;
    bad[nb].what = "top_p", bad[nb++].p.top_p = 0;
    bad[nb].what = "top_p", bad[nb++].p.top_p = 1.5;
    bad[nb].what = "top_k", bad[nb++].p.top_k = -2;
    bad[nb].what = "min_p", bad[nb++].p.min_p = 1.5;
    bad[nb].what = "n must", bad[nb++].p.n = 0;
    bad[nb].what = "max_tokens", bad[nb++].p.max_tokens = 0;
    bad[nb].what = "logprobs", bad[nb++].p.logprobs = 21;
    bad[nb].what = "repetition_penalty", bad[nb++].p.repetition_penalty = 0;
    bad[nb].what = "only one structured-output constraint", bad[nb].p.regex = "a+";
    bad[nb++].p.json_object = 1;
    bad[nb].what = "regex", bad[nb++].p.regex = "(ab";
    bad[nb].what = "EBNF", bad[nb++].p.ebnf = "root ::= \"a";
    bad[nb].what = "json_schema", bad[nb++].p.json_schema = "{\"type\": \"wat\"}";
    bad[nb].what = "min_tokens", bad[nb++].p.min_tokens = 9;
    for (int i = 0; i < nb; i++) {
        di_status st = di_engine_submit_tokens(e, ids, 4, &bad[i].p, &x);
        CHECKF(st != DI_OK, "bad %s accepted", bad[i].what);
        CHECK_STR_CONTAINS(di_last_error(), bad[i].what);
    }
    /* each constraint's error names it once: the regex and EBNF compilers'
     * messages start with their kind, the JSON Schema one's gets the field */
    for (int i = 0; i < nb; i++) {
        const char *want = !strcmp(bad[i].what, "regex") ? "regex: missing ')'"
                           : !strcmp(bad[i].what, "EBNF") ? "EBNF: unterminated"
                           : !strcmp(bad[i].what, "json_schema") ? "json_schema: JSON Schema: "
                                                                  : NULL;
        if (!want) continue;
        CHECK(di_engine_submit_tokens(e, ids, 4, &bad[i].p, &x) != DI_OK);
        CHECKF(!strncmp(di_last_error(), want, strlen(want)), "%s", di_last_error());
    }
    CHECK(di_engine_submit_chat(e, "[{\"role\": \"wizard\"}]", 20, NULL, &good, &x) != DI_OK);
    CHECK(di_engine_submit_tokens(e, ids + 1, 3, &good, &b) == DI_OK);
    CHECK(di_engine_run(e, NULL, NULL) == DI_OK);
    di_completion ca, cb;
    CHECK(di_engine_get_completion(e, a, 0, &ca) == DI_OK);
    CHECK(di_engine_get_completion(e, b, 0, &cb) == DI_OK);
    CHECK_EQ_INT(ca.n_tokens, 3);
    CHECK_EQ_INT(cb.n_tokens, 3);
    CHECK_EQ_INT(ca.finish_reason, DI_FINISH_LENGTH);
    uint64_t done[8];
    size_t nd = 0;
    CHECK(di_engine_poll_finished(e, done, 8, &nd) == DI_OK);
    CHECK_EQ_INT(nd, 2);
    CHECK(di_engine_get_completion(e, 999, 0, &ca) == DI_ERR_NOT_FOUND);
    di_engine_close(e);
    /* engine options */
    di_engine_options o;
    di_engine_options_default(&o);
    o.model = g_model;
    o.accelerator = DI_ACCEL_CPU;
    di_engine *e2 = NULL;
    /* budgets left at 0 are the backend's (the CPU's: 64, 512, 2 GiB);
     * set ones are kept */
    CHECK_EQ_INT(o.max_batch, 0);
    CHECK_EQ_INT(o.max_tokens_per_step, 0);
    CHECK_EQ_INT(o.memory_limit, 0);
    check_budgets(&o, 64, 512, 2ull << 30);
    o.max_batch = 3, o.max_tokens_per_step = 77, o.memory_limit = 5u << 20;
    check_budgets(&o, 3, 77, 5u << 20);
    o.max_tokens_per_step = o.memory_limit = 0;
    o.max_batch = -1;
    CHECK(di_engine_open(&o, &e2) == DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(di_last_error(), "max_batch");
    o.max_batch = 4097;
    CHECK(di_engine_open(&o, &e2) == DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(di_last_error(), "max_batch");
    o.max_batch = 4;
    o.max_tokens_per_step = -5;
    CHECK(di_engine_open(&o, &e2) == DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(di_last_error(), "max_tokens_per_step");
    o.max_tokens_per_step = 0;
    o.accelerator = DI_ACCEL_NVIDIA; /* no GPU here: a CUDA error, never a silent CPU run */
    di_status nv = di_engine_open(&o, &e2);
    if (nv == DI_OK) di_engine_close(e2);
    else {
        CHECK(nv == DI_ERR_UNSUPPORTED || nv == DI_ERR_BACKEND);
        CHECK_STR_CONTAINS(di_last_error(), "CUDA");
    }
    e2 = NULL;
    o.accelerator = DI_ACCEL_CPU;
    o.model = "/nonexistent/model";
    CHECK(di_engine_open(&o, &e2) != DI_OK);
    CHECK_STR_CONTAINS(di_last_error(), "/nonexistent/model");
}

typedef struct progress_log {
    int calls;
    uint64_t last_done, total;
    int monotonic;
} progress_log;

static int on_progress(void *user, const di_engine_progress *p) {
    progress_log *l = user;
    l->monotonic &= p->requests_done >= l->last_done && p->elapsed_s >= 0 && p->output_tps >= 0;
    l->last_done = p->requests_done;
    l->total = p->requests_total;
    l->calls++;
    return 0;
}

/* A chat body's own settings (params NULL): max_tokens, seed and a
 * response_format that becomes the constraint; progress reports; a memory
 * budget that holds one sequence at a time still completes every request
 * with the same tokens. */
static void test_body_progress_memory(void) {
    if (!g_have) SKIP("../shared (golden fixtures) not found");
    di_engine *e = open_engine(0);
    if (!e) return;
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"JSON please\"}], \"max_tokens\": 7, "
                       "\"seed\": 3, \"thinking\": {\"type\": \"disabled\"}, "
                       "\"response_format\": {\"type\": \"json_object\"}}";
    uint64_t id, ids[4];
    CHECKF(di_engine_submit_chat(e, body, strlen(body), NULL, NULL, &id) == DI_OK, "%s", di_last_error());
    di_sampling_params p;
    di_sampling_params_default(&p);
    p.temperature = 0.8;
    p.max_tokens = 12;
    p.ignore_eos = 1;
    p.has_seq_seed = 1;
    p.seq_seed = 31;
    int32_t pr[4][6] = {{0, 1017, 300, 301, 302, 1018}, {0, 1017, 500, 1018}, {0, 1017, 77, 78, 1018}, {0, 5, 6}};
    size_t pl[4] = {6, 4, 5, 3};
    for (int i = 0; i < 4; i++) CHECK(di_engine_submit_tokens(e, pr[i], pl[i], &p, &ids[i]) == DI_OK);
    progress_log log = {0, 0, 0, 1};
    CHECK(di_engine_run(e, on_progress, &log) == DI_OK);
    CHECK(log.calls > 0 && log.monotonic);
    CHECK_EQ_INT(log.last_done, 5);
    CHECK_EQ_INT(log.total, 5);
    di_completion c;
    CHECK(di_engine_get_completion(e, id, 0, &c) == DI_OK);
    CHECK(c.n_tokens <= 7);
    CHECKF(c.text_len > 0 && c.text[0] == '{', "json_object output \"%s\"", c.text);
    int32_t ref[4][12];
    for (int i = 0; i < 4; i++) {
        CHECK(di_engine_get_completion(e, ids[i], 0, &c) == DI_OK);
        CHECK_EQ_INT(c.n_tokens, 12);
        memcpy(ref[i], c.token_ids, sizeof ref[i]);
    }
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    uint64_t five = st.memory_peak; /* the five sequences held at once */
    di_engine_close(e);
    /* memory for about one and a half sequences */
    di_engine_options o;
    di_engine_options_default(&o);
    o.model = g_model;
    o.memory_limit = five * 3 / 10;
    CHECK(di_engine_open(&o, &e) == DI_OK);
    if (!e) return;
    for (int i = 0; i < 4; i++) CHECK(di_engine_submit_tokens(e, pr[i], pl[i], &p, &ids[i]) == DI_OK);
    CHECK(di_engine_run(e, NULL, NULL) == DI_OK);
    di_engine_get_stats(e, &st);
    CHECKF(st.memory_peak <= o.memory_limit && st.memory_peak > 0, "peak %llu", (unsigned long long)st.memory_peak);
    CHECKF(st.memory_peak < five / 2, "peak %llu of %llu: not one at a time", (unsigned long long)st.memory_peak,
           (unsigned long long)five);
    for (int i = 0; i < 4; i++) {
        CHECK(di_engine_get_completion(e, ids[i], 0, &c) == DI_OK);
        CHECK_EQ_INT(c.n_tokens, 12);
        CHECK(!memcmp(ref[i], c.token_ids, sizeof ref[i]));
    }
    di_engine_close(e);
}

/* Environment variables at open, abort. */
static void test_env_and_abort(void) {
    if (!g_have) SKIP("../shared (golden fixtures) not found");
    di_engine_options o;
    di_engine_options_default(&o);
    di_engine *e = NULL;
    setenv("DEEPINFER_ACCELERATOR", "ascend", 1);
    o.model = g_model;
    CHECK(di_engine_open(&o, &e) == DI_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(di_last_error(), "not supported in this build");
    setenv("DEEPINFER_ACCELERATOR", "cpu", 1);
    setenv("DEEPINFER_USE_NEXTN_DECODE", "many", 1);
    CHECK(di_engine_open(&o, &e) == DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(di_last_error(), "DEEPINFER_USE_NEXTN_DECODE");
    unsetenv("DEEPINFER_USE_NEXTN_DECODE");
    /* the model folder from DEEPINFER_HF_MODEL_DIR, batch invariance recorded */
    setenv("DEEPINFER_HF_MODEL_DIR", g_model, 1);
    setenv("DEEPINFER_BATCH_INVARIANT", "1", 1);
    o.model = NULL;
    CHECKF(di_engine_open(&o, &e) == DI_OK, "%s", di_last_error());
    unsetenv("DEEPINFER_HF_MODEL_DIR");
    unsetenv("DEEPINFER_BATCH_INVARIANT");
    unsetenv("DEEPINFER_ACCELERATOR");
    if (!e) return;
    di_engine_info info;
    CHECK(di_engine_get_info(e, &info) == DI_OK);
    CHECK(!strcmp(info.model_path, g_model));
    CHECK_EQ_INT(info.batch_invariant, 1);
    CHECK_EQ_INT(info.vocab_size, 1024);
    CHECK(!strcmp(info.accelerator, "cpu"));
    di_sampling_params p;
    di_sampling_params_default(&p);
    p.max_tokens = 50;
    p.ignore_eos = 1;
    uint64_t a, b;
    CHECK(di_engine_submit_text(e, PROMPT, strlen(PROMPT), &p, &a) == DI_OK);
    p.max_tokens = 4;
    CHECK(di_engine_submit_text(e, PROMPT, strlen(PROMPT), &p, &b) == DI_OK);
    size_t active = 0;
    CHECK(di_engine_step(e, &active) == DI_OK);
    CHECK(di_engine_step(e, &active) == DI_OK);
    CHECK(di_engine_abort(e, a) == DI_OK);
    CHECK(di_engine_release(e, b) == DI_ERR_STATE);
    CHECK(di_engine_run(e, NULL, NULL) == DI_OK);
    di_completion c;
    CHECK(di_engine_get_completion(e, a, 0, &c) == DI_OK);
    CHECK_EQ_INT(c.finish_reason, DI_FINISH_ABORT);
    CHECK(c.n_tokens < 50);
    CHECK(di_engine_get_completion(e, b, 0, &c) == DI_OK);
    CHECK_EQ_INT(c.n_tokens, 4);
    CHECK(di_engine_release(e, b) == DI_OK);
    CHECK(di_engine_get_completion(e, b, 0, &c) == DI_ERR_NOT_FOUND);
    di_engine_stats st;
    CHECK(di_engine_get_stats(e, &st) == DI_OK);
    CHECK_EQ_INT(st.memory_used, 0);
    di_engine_close(e);
}

int main(void) {
    /* the CPU kernels' kept scratch filled with NaN before every use: a read
     * of a part a call did not write shows as NaN, not as a previous call's
     * values */
    di_cpu_kernels_poison_buffers(1);
    const char *shared = test_shared_dir();
    if (shared) {
        snprintf(g_model, sizeof g_model, "%s/golden/v41-tiny", shared);
        g_have = 1;
    }
    RUN(test_structured);
    RUN(test_stop_strings);
    RUN(test_n_logprobs_chat);
    RUN(test_bad_inputs);
    RUN(test_body_progress_memory);
    RUN(test_env_and_abort);
    return test_summary();
}
