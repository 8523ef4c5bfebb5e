/* Output lines of `deepinfer batch` (see batch_response.h). */
#include "cli/batch_response.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t batch_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static cJSON *line_head(const char *custom_id) {
    char id[64];
    snprintf(id, sizeof id, "batch_req_%016llx", (unsigned long long)batch_hash(custom_id));
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "custom_id", custom_id);
    return o;
}

static char *finish(cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

char *batch_error_line(const char *custom_id, const char *code, const char *message) {
    cJSON *o = line_head(custom_id);
    cJSON_AddNullToObject(o, "response");
    cJSON *err = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(err, "code", code);
    cJSON_AddStringToObject(err, "message", message);
    return finish(o);
}

/* choices[i].message: role, content, reasoning_content, tool_calls (null
 * when absent), each call given an id derived from the request. */
static cJSON *message(const di_completion *c, const char *custom_id) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    if (c->content) cJSON_AddStringToObject(m, "content", c->content);
    else if (c->message_json) cJSON_AddNullToObject(m, "content");
    else cJSON_AddStringToObject(m, "content", c->text);
    if (c->reasoning_content) cJSON_AddStringToObject(m, "reasoning_content", c->reasoning_content);
    else cJSON_AddNullToObject(m, "reasoning_content");
    cJSON *calls = c->tool_calls_json ? cJSON_Parse(c->tool_calls_json) : NULL;
    if (cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0) {
        int k = 0;
        cJSON *call;
        cJSON_ArrayForEach(call, calls) {
            char id[96];
            snprintf(id, sizeof id, "call_%016llx_%d_%d", (unsigned long long)batch_hash(custom_id), c->index, k++);
            cJSON_DeleteItemFromObjectCaseSensitive(call, "index");
            cJSON_AddStringToObject(call, "id", id);
        }
        cJSON_AddItemToObject(m, "tool_calls", calls);
    } else {
        cJSON_Delete(calls);
        cJSON_AddNullToObject(m, "tool_calls");
    }
    return m;
}

/* Valid UTF-8 text of a token's bytes (each byte of an ill-formed
 * sequence becomes U+FFFD); the exact bytes go in "bytes". */
static char *token_text(const char *b, size_t n) {
    char *out = malloc(3 * n + 1), *o = out;
    if (!out) return NULL;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)b[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = len && i + len <= n;
        for (size_t k = 1; ok && k < len; k++) ok = ((unsigned char)b[i + k] >> 6) == 2;
        if (ok && len > 1) { /* no overlong forms, surrogates or values past U+10FFFF */
            unsigned v = c & (0xff >> (len + 1));
            for (size_t k = 1; k < len; k++) v = (v << 6) | ((unsigned char)b[i + k] & 0x3f);
            ok = v >= (len == 2 ? 0x80u : len == 3 ? 0x800u : 0x10000u) && v <= 0x10ffff && (v < 0xd800 || v > 0xdfff);
        }
        if (ok && c != 0) {
            memcpy(o, b + i, len);
            o += len, i += len;
        } else {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3, i++;
        }
    }
    *o = '\0';
    return out;
}

/* {"token", "logprob", "bytes"} of one token id. */
static cJSON *token_entry(const di_tokenizer *tok, int32_t id, double lp) {
    const char *b = "";
    size_t n = 0;
    if (tok) di_tokenizer_token_bytes(tok, id, &b, &n);
    cJSON *o = cJSON_CreateObject();
    char *t = token_text(b, n);
    cJSON_AddStringToObject(o, "token", t ? t : "");
    free(t);
    cJSON_AddNumberToObject(o, "logprob", lp);
    cJSON *bytes = cJSON_AddArrayToObject(o, "bytes");
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)b[i]));
    return o;
}

/* choices[i].logprobs in the Chat Completions form: {"content": [{token,
 * logprob, bytes, top_logprobs: [...]}]}, one entry per generated token. */
static cJSON *logprobs(const di_engine *e, const di_completion *c) {
    if (!c->logprobs) return cJSON_CreateNull();
    const di_tokenizer *tok = di_engine_tokenizer(e);
    cJSON *o = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(o, "content");
    for (size_t i = 0; i < c->n_tokens; i++) {
        cJSON *t = token_entry(tok, c->token_ids[i], c->logprobs[i]);
        cJSON *top = cJSON_AddArrayToObject(t, "top_logprobs");
        for (int32_t k = 0; k < c->n_top; k++) {
            int32_t id = c->top_ids[i * (size_t)c->n_top + (size_t)k];
            if (id >= 0) cJSON_AddItemToArray(top, token_entry(tok, id, c->top_logprobs[i * (size_t)c->n_top + (size_t)k]));
        }
        cJSON_AddItemToArray(content, t);
    }
    return o;
}

static const char *openai_finish(const di_completion *c) {
    if (c->finish_reason == DI_FINISH_STOP && c->tool_calls_json && strcmp(c->tool_calls_json, "[]"))
        return "tool_calls";
    return di_finish_reason_name(c->finish_reason);
}

char *batch_response_line(const di_engine *e, uint64_t id, const char *custom_id, const char *model) {
    di_request_output ro;
    if (di_engine_get_output(e, id, &ro)) return batch_error_line(custom_id, "engine_error", di_last_error());
    uint64_t h = batch_hash(custom_id);
    cJSON *choices = cJSON_CreateArray();
    uint64_t completion_tokens = 0;
    for (size_t j = 0; j < ro.n_completions; j++) {
        di_completion c;
        if (di_engine_get_completion(e, id, j, &c)) {
            cJSON_Delete(choices);
            return batch_error_line(custom_id, "engine_error", di_last_error());
        }
        if (c.finish_reason == DI_FINISH_ERROR) {
            cJSON_Delete(choices);
            return batch_error_line(custom_id, "generation_error", c.error ? c.error : "generation failed");
        }
        completion_tokens += c.n_tokens;
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddNumberToObject(ch, "index", (double)j);
        cJSON_AddItemToObject(ch, "message", message(&c, custom_id));
        cJSON_AddItemToObject(ch, "logprobs", logprobs(e, &c));
        cJSON_AddStringToObject(ch, "finish_reason", openai_finish(&c));
        cJSON_AddItemToArray(choices, ch);
    }
    char rid[64], cid[64];
    snprintf(rid, sizeof rid, "req_%016llx", (unsigned long long)h);
    snprintf(cid, sizeof cid, "chatcmpl-%016llx", (unsigned long long)h);
    cJSON *body = cJSON_CreateObject();
    cJSON_AddStringToObject(body, "id", cid);
    cJSON_AddStringToObject(body, "object", "chat.completion");
    cJSON_AddNumberToObject(body, "created", (double)time(NULL));
    cJSON_AddStringToObject(body, "model", model ? model : "deepinfer");
    cJSON_AddItemToObject(body, "choices", choices);
    cJSON *usage = cJSON_AddObjectToObject(body, "usage");
    cJSON_AddNumberToObject(usage, "prompt_tokens", (double)ro.n_prompt);
    cJSON_AddNumberToObject(usage, "completion_tokens", (double)completion_tokens);
    cJSON_AddNumberToObject(usage, "total_tokens", (double)(ro.n_prompt + completion_tokens));
    cJSON *o = line_head(custom_id);
    cJSON *resp = cJSON_AddObjectToObject(o, "response");
    cJSON_AddNumberToObject(resp, "status_code", 200);
    cJSON_AddStringToObject(resp, "request_id", rid);
    cJSON_AddItemToObject(resp, "body", body);
    cJSON_AddNullToObject(o, "error");
    return finish(o);
}
